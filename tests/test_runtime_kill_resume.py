"""The real thing without Kubernetes: a training process killed many times must end bit-identical.

``tests/fixtures/train_loop.py`` (numpy SGD on a data stream keyed by step, checkpointing through
``gpuscaler.runtime.TrainingGuard`` configured from ``GPUSCALER_*`` env) runs as a subprocess. The
tests kill it with SIGTERM and SIGKILL at seeded random points, resume it each time, and check:

* the final weights equal an uninterrupted run's, bit for bit;
* after SIGTERM no step is lost (the next run resumes at the step the process had reached);
* after SIGKILL at most one checkpoint interval of steps is lost;
* a checkpoint torn by SIGKILL during the write, or truncated afterwards, is never loaded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest

from gpuscaler.runtime import EXIT_PREEMPTED
from gpuscaler.runtime.checkpoint import CheckpointStore
from gpuscaler.runtime.constants import ANNOTATION_CHECKPOINT_REQUESTED

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FIXTURE = Path(__file__).parent / "fixtures" / "train_loop.py"
EVERY = 25
"""Checkpoint every N steps: the most a SIGKILL may cost."""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCALER_")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@dataclass
class Worker:
    """One run of the fixture, read event by event."""

    ckpt_dir: Path
    total: int
    out: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[str] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    done: int = 0
    """Steps completed as last seen on stdout (a lower bound of the truth)."""

    def start(self) -> int:
        """Start the process; return the step it resumed at."""
        cmd = [
            sys.executable,
            str(FIXTURE),
            "--total-steps",
            str(self.total),
            "--out",
            str(self.out),
            *self.args,
        ]
        env = clean_env(
            GPUSCALER_CHECKPOINT_DIR=str(self.ckpt_dir),
            GPUSCALER_CHECKPOINT_EVERY_STEPS=str(EVERY),
            GPUSCALER_CHECKPOINT_INTERVAL_S="0",
            **self.env,
        )
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        event = self.next_event()
        assert event["e"] == "resume", event
        self.done = int(event["start"])
        return self.done

    @property
    def stdout(self) -> IO[str]:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout

    def next_event(self) -> dict[str, Any]:
        line = self.stdout.readline()
        if not line:
            return {"e": "eof"}
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        if event["e"] == "step":
            self.done = int(event["done"])
        return event

    def until(self, predicate: Any) -> dict[str, Any]:
        """Read events until one satisfies ``predicate`` (or the process ends)."""
        while True:
            event = self.next_event()
            if event["e"] in ("eof", "finished") or predicate(event):
                return event

    def rest(self) -> Iterator[dict[str, Any]]:
        while (event := self.next_event())["e"] != "eof":
            yield event

    def finish(self) -> int:
        """Drain stdout and wait; return the exit code."""
        list(self.rest())
        assert self.proc is not None
        return self.proc.wait(timeout=30)


_REFERENCE: dict[int, np.ndarray] = {}


def reference(tmp_path_factory: pytest.TempPathFactory, total: int) -> np.ndarray:
    """Weights of an uninterrupted run of ``total`` steps (cached per total)."""
    if total not in _REFERENCE:
        base = tmp_path_factory.mktemp(f"reference-{total}")
        worker = Worker(base / "ck", total, base / "w.npy", ["--quiet"])
        assert worker.start() == 0
        assert worker.finish() == 0
        _REFERENCE[total] = np.load(base / "w.npy")
    return _REFERENCE[total]


def assert_bitwise_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b) and a.tobytes() == b.tobytes(), np.max(np.abs(a - b))


def test_random_sigterm_and_sigkill_resume_bitwise_identical(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    total, kills_wanted = 1500, 24
    expected = reference(tmp_path_factory, total)
    rng = random.Random(20240531)
    worker = Worker(tmp_path / "ck", total, tmp_path / "w.npy", ["--step-sleep", "0.001"])
    history: list[tuple[str, int, int]] = []  # (signal, observed step at signal, resumed step after)
    previous: tuple[str, int, int | None] | None = None  # (signal, observed, checkpoint at exit)
    while True:
        start = worker.start()
        if previous is not None:
            kind, observed, at_exit = previous
            if kind == "TERM":
                assert at_exit is not None and start == at_exit >= observed, (previous, start)
            else:
                assert observed - start <= EVERY, f"SIGKILL lost {observed - start} steps (> {EVERY})"
            history.append((kind, observed, start))
        if len(history) >= kills_wanted:
            break
        target = start + rng.randint(1, 3 * EVERY)
        event = worker.until(lambda e, t=target: e["e"] == "step" and e["done"] >= t)
        if event["e"] == "finished":
            break
        if rng.random() < 0.5:
            worker.until(lambda e: rng.random() < 0.3)  # a little further, to land at odd moments
        kind = rng.choice(["TERM", "KILL"])
        observed = worker.done
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGTERM if kind == "TERM" else signal.SIGKILL)
        at_exit = None
        for event in worker.rest():
            if event["e"] == "preempted":
                assert event["checkpoint"] == event["step"], event
                at_exit = int(event["step"])
        code = worker.proc.wait(timeout=30)
        assert code == (EXIT_PREEMPTED if kind == "TERM" else -signal.SIGKILL), (kind, code)
        previous = (kind, observed, at_exit)
    if worker.proc is not None and worker.proc.poll() is None:
        assert worker.finish() == 0
    print("signal, observed step, resumed step:", history)
    kinds = [k for k, _, _ in history]
    assert len(history) >= 20 and kinds.count("TERM") >= 5 and kinds.count("KILL") >= 5, history
    assert_bitwise_equal(np.load(tmp_path / "w.npy"), expected)
    assert len(CheckpointStore(tmp_path / "ck").list_steps()) == 3  # keep-last-K held throughout


def test_sigkill_during_save_leaves_torn_write_that_is_never_loaded(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    total = 200
    ckpt_dir = tmp_path / "ck"
    slow = Worker(
        ckpt_dir,
        total,
        tmp_path / "w.npy",
        ["--slow-save", "5", "--slow-save-from", str(2 * EVERY), "--step-sleep", "0.001"],
    )
    slow.start()
    event = slow.until(lambda e: e["e"] == "save" and e["phase"] == "mid" and e["step"] == 2 * EVERY)
    assert event["e"] == "save"
    assert slow.proc is not None
    slow.proc.send_signal(signal.SIGKILL)
    assert slow.finish() == -signal.SIGKILL
    torn = [p for p in ckpt_dir.iterdir() if p.name.startswith(f".step-{2 * EVERY:012d}.staging-")]
    assert len(torn) == 1 and (torn[0] / "payload").stat().st_size > 0, list(ckpt_dir.iterdir())
    assert not (torn[0] / "MANIFEST.json").exists()
    assert [s for s, _ in CheckpointStore(ckpt_dir, writer=False).list_steps()] == [EVERY]

    # SIGTERM in the middle of a (slow) save: the save completes, then the worker stops there.
    term = Worker(ckpt_dir, total, tmp_path / "w.npy", ["--slow-save", "1", "--step-sleep", "0.001"])
    assert term.start() == EVERY  # the torn step-50 was ignored ...
    assert not any(p.name.startswith(".step-") for p in ckpt_dir.iterdir())  # ... and cleaned up
    term.until(lambda e: e["e"] == "save" and e["phase"] == "mid")
    assert term.proc is not None
    term.proc.send_signal(signal.SIGTERM)
    events = list(term.rest())
    assert term.proc.wait(timeout=30) == EXIT_PREEMPTED
    assert events[-1] == {"e": "preempted", "step": 2 * EVERY, "checkpoint": 2 * EVERY}
    assert [e for e in events if e["e"] == "save"] == []  # no second save of the same step

    final = Worker(ckpt_dir, total, tmp_path / "w.npy", ["--quiet"])
    assert final.start() == 2 * EVERY
    assert final.finish() == 0
    assert_bitwise_equal(np.load(tmp_path / "w.npy"), reference(tmp_path_factory, total))


def test_truncated_newest_checkpoint_falls_back_to_previous(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    total = 200
    ckpt_dir = tmp_path / "ck"
    first = Worker(ckpt_dir, total, tmp_path / "w.npy", ["--step-sleep", "0.001"])
    first.start()
    first.until(lambda e: e["e"] == "step" and e["done"] >= 2 * EVERY + 7)
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish() == EXIT_PREEMPTED
    steps = [s for s, _ in CheckpointStore(ckpt_dir, writer=False).list_steps()]
    newest, previous = steps[0], steps[1]
    assert newest >= 2 * EVERY + 7 and previous == 2 * EVERY
    payload = ckpt_dir / f"step-{newest:012d}" / "payload"
    with open(payload, "r+b") as f:  # a torn file that nevertheless got its name (a lying disk)
        f.truncate(payload.stat().st_size // 2)

    second = Worker(ckpt_dir, total, tmp_path / "w.npy", ["--quiet"])
    assert second.start() == previous
    # Set aside for inspection (pruned later, once it is older than every kept checkpoint).
    assert any(p.name.startswith(f"corrupt-step-{newest:012d}-") for p in ckpt_dir.iterdir())
    assert second.finish() == 0
    assert_bitwise_equal(np.load(tmp_path / "w.npy"), reference(tmp_path_factory, total))


def test_annotation_request_is_checkpointed_and_acknowledged(tmp_path: Path) -> None:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "annotations").write_text('kubernetes.io/config.source="api"')
    progress = tmp_path / "progress.json"
    worker = Worker(
        tmp_path / "ck",
        100_000,
        tmp_path / "w.npy",
        ["--step-sleep", "0.001", "--quiet"],
        env={"GPUSCALER_PODINFO_DIR": str(podinfo), "GPUSCALER_PROGRESS_FILE": str(progress)},
    )
    worker.start()
    tmp = podinfo / "annotations.tmp"
    tmp.write_text(
        f'{ANNOTATION_CHECKPOINT_REQUESTED}="spot-itn-\\"42\\""\nkubernetes.io/config.source="api"'
    )
    os.replace(tmp, podinfo / "annotations")
    event = worker.until(lambda e: e["e"] == "save")
    assert event["e"] == "save"
    deadline = time.monotonic() + 20
    status: dict[str, Any] = {}
    while status.get("checkpoint_ack") != 'spot-itn-"42"':
        assert time.monotonic() < deadline, status
        time.sleep(0.01)
        status = json.loads(progress.read_text())  # written atomically: never torn
    assert status["annotations"]["gpuscaler.io/checkpoint-ack"] == 'spot-itn-"42"'
    step = status["last_checkpoint"]["step"]
    assert status["annotations"]["gpuscaler.io/checkpoint-step"] == str(step)
    info = CheckpointStore(tmp_path / "ck", writer=False).verify(tmp_path / "ck" / f"step-{step:012d}")
    assert (info.reason, info.request_id) == ("notice", 'spot-itn-"42"')
    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.finish() == EXIT_PREEMPTED
    final = json.loads(progress.read_text())
    assert final["phase"] == "preempted" and final["last_checkpoint"]["reason"] == "sigterm"
