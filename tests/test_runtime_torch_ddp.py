"""Real torchrun, real DDP and FSDP2 (gloo on CPU): interrupted runs end bit-identical, ranks agree.

``examples/train/train_ddp.py`` runs under ``torchrun --standalone --nproc-per-node 2``. Each test
interrupts it at seeded random steps — SIGTERM to the torchrun agent, SIGTERM to one rank,
SIGKILL to the whole process group (the node is gone) — and restarts it each time, then checks:

* on SIGTERM every rank stopped at the same step, the checkpoint is at that step, and the next
  run resumes there (no work lost); torchrun exits 1 (the operator cannot go by its exit code);
* on SIGKILL at most one checkpoint interval of steps is lost;
* the final parameters equal an uninterrupted run's, bit for bit;
* nothing hangs (every wait is bounded; pytest-timeout bounds the test).

The same for ``--sharded``: FSDP2 ``fully_shard``, every rank writing its shard with
``torch.distributed.checkpoint``, committed by the manifest written last. The per-step cost of the
agreement is measured by ``benchmarks/runtime_checkpoint.py --what agreement``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime_torch_support import need

need("torch")

from gpuscaler.runtime.checkpoint import CheckpointStore  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train" / "train_ddp.py"
EVERY = 10
"""Checkpoint every N steps: the most a SIGKILL may cost."""
TOTAL = 100
STEP_SLEEP = 0.03
"""Per-step sleep so that a signal lands at a step picked in advance, not after the run ended."""
RUN_TIMEOUT_S = 240.0


def env(ckpt: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCALER_", "POD_"))}
    out.update(
        GPUSCALER_CHECKPOINT_DIR=str(ckpt),
        GPUSCALER_CHECKPOINT_EVERY_STEPS=str(EVERY),
        GPUSCALER_CHECKPOINT_INTERVAL_S="0",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return out


@dataclass
class Launch:
    """One torchrun of the example; its ranks' events are read from per-rank JSON-lines files."""

    work: Path
    sharded: bool
    index: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def events_dir(self) -> Path:
        return self.work / f"events-{self.index}"

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0", str(EXAMPLE), "--total-steps", str(TOTAL), "--step-sleep", str(STEP_SLEEP),
            "--out", str(self.work / "weights.bin"), "--events", str(self.events_dir),
        ]
        if self.sharded:
            cmd.append("--sharded")
        log = (self.work / f"torchrun-{self.index}.log").open("wb")
        self.proc = subprocess.Popen(
            cmd, env=env(self.work / "ck"), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def events(self, rank: int) -> list[dict[str, Any]]:
        path = self.events_dir / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def worker_pids(self) -> list[int]:
        return [next(e["pid"] for e in self.events(rank) if e["e"] == "resume") for rank in (0, 1)]

    def resumed_at(self, rank: int) -> int | None:
        return next((e["start"] for e in self.events(rank) if e["e"] == "resume"), None)

    def done(self, rank: int) -> int:
        """Steps completed as rank ``rank`` logged them (after each guard.completed)."""
        return max((e["done"] for e in self.events(rank) if e["e"] == "step"), default=0)

    def wait_for_step(self, step: int) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while min(self.done(0), self.done(1)) < step:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"torchrun ended (exit {self.proc.returncode}) before step {step}: {self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no step {step} within {RUN_TIMEOUT_S:g}s: {self.log_tail()}")
            time.sleep(0.02)

    def wait(self) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pid in [self.proc.pid, *self.worker_pids()]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            pytest.fail(f"torchrun did not end within {RUN_TIMEOUT_S:g}s (a hang): {self.log_tail()}")

    def log_tail(self) -> str:
        return (self.work / f"torchrun-{self.index}.log").read_text(errors="replace")[-3000:]


_REFERENCE: dict[bool, bytes] = {}


def reference(tmp_path_factory: pytest.TempPathFactory, sharded: bool) -> bytes:
    """Final parameters of an uninterrupted run (cached per mode)."""
    if sharded not in _REFERENCE:
        work = tmp_path_factory.mktemp(f"reference-{'sharded' if sharded else 'ddp'}")
        run = Launch(work, sharded, 0)
        run.start()
        assert run.wait() == 0, run.log_tail()
        _REFERENCE[sharded] = (work / "weights.bin").read_bytes()
    return _REFERENCE[sharded]


def interrupted_run(work: Path, sharded: bool, plan: list[str], seed: int) -> list[dict[str, Any]]:
    """Run to the end, interrupting as ``plan`` says; check every restart; return what happened."""
    rng = random.Random(seed)
    history: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for index in range(len(plan) + 1):
        run = Launch(work, sharded, index)
        run.start()
        last = index == len(plan)
        if last:
            assert run.wait() == 0, run.log_tail()
        else:
            run.wait_for_step(1)
        if previous is not None:
            start = run.resumed_at(0)
            assert start is not None and start == run.resumed_at(1), "the ranks resumed at different steps"
            if previous["kind"] == "KILL":
                lost = previous["reached"] - start
                assert 0 <= lost <= EVERY, (previous, start)
            else:
                assert start == previous["stopped"], (previous, start)
            previous["resumed"] = start
        if last:
            break
        kind = plan[index]
        target = (run.resumed_at(0) or 0) + rng.randint(2, 12)
        run.wait_for_step(target)
        assert run.proc is not None
        if kind == "TERM-agent":
            os.kill(run.proc.pid, signal.SIGTERM)
        elif kind == "TERM-rank":
            os.kill(run.worker_pids()[rng.randint(0, 1)], signal.SIGTERM)
        else:  # the node is gone: the agent and every worker (torchrun starts each in its own session)
            for pid in [run.proc.pid, *run.worker_pids()]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        code = run.wait()
        reached = max(run.done(0), run.done(1))
        record: dict[str, Any] = {"kind": kind, "target": target, "reached": reached, "exit": code}
        if kind != "KILL":
            # Each rank stopped in completed() at step done+1: the same step on every rank.
            stops = {rank: run.done(rank) + 1 for rank in (0, 1)}
            assert stops[0] == stops[1], f"ranks stopped at different steps {stops}: {run.log_tail()}"
            newest = CheckpointStore(work / "ck", writer=False).list_steps()[0][0]
            assert newest == stops[0], (newest, stops)
            assert code == 1, f"torchrun exited {code}, expected 1 (its workers exited 75)"
            record["stopped"] = stops[0]
        history.append(record)
        previous = record
    return history


PLAN_DDP = ["TERM-agent", "TERM-rank", "KILL", "TERM-rank", "KILL", "TERM-agent"]
PLAN_SHARDED = ["TERM-rank", "KILL", "TERM-agent"]


def test_ddp_interrupted_by_sigterm_and_sigkill_ends_bitwise_identical(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected = reference(tmp_path_factory, sharded=False)
    history = interrupted_run(tmp_path, False, PLAN_DDP, seed=20261201)
    assert [h["kind"] for h in history] == PLAN_DDP
    assert (tmp_path / "weights.bin").read_bytes() == expected, history
    assert len(expected) == 4 * (16 * 32 + 32 + 32 + 1)  # every float32 parameter of the MLP


def test_sharded_fsdp_interrupted_ends_bitwise_identical(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    expected = reference(tmp_path_factory, sharded=True)
    history = interrupted_run(tmp_path, True, PLAN_SHARDED, seed=7)
    assert (tmp_path / "weights.bin").read_bytes() == expected, history
    store = CheckpointStore(tmp_path / "ck", writer=False)
    newest = store.verify(store.list_steps()[0][1])
    assert newest.step == TOTAL
    shards = sorted(f.path for f in newest.files if f.path.endswith(".distcp"))
    assert len(shards) == 2, newest.files  # one shard file per rank, both in the manifest
