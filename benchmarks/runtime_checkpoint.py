"""Benchmark of gpuscaler.runtime: checkpoint write/verify time, SIGTERM latency, per-step agreement cost.

1. ``CheckpointStore.save_bytes`` (write, fsync, sha256, manifest, rename, dir fsync) and
   ``CheckpointStore.verify`` (re-hash on load) for each payload size, repeated.
2. SIGTERM to checkpoint committed: the toy training job ``tests/fixtures/train_loop.py`` (10 ms
   steps, checkpoint padded to the payload size) is started, sent SIGTERM at a random moment, and
   the time is taken two ways: inside the process, from the signal handler to the commit (the
   ``notice_latency_s`` the guard reports; includes waiting for the step boundary), and outside,
   from ``kill`` to process exit.
3. The per-step cost of the ranks' agreement (needs torch): ``torchrun --nproc-per-node 2`` (gloo,
   CPU) times ``TorchAgreement.max`` (one all-reduce of three int64) and ``guard.completed`` with
   and without ``agree=`` on steps where no checkpoint is due, so the difference is what the
   agreement adds to every training step.

The numbers depend on the disk: pass ``--dir`` on the volume the checkpoints will live on
(``/tmp`` is often tmpfs, where fsync is free). The spot notice is 30 s on GKE and 2 min on AWS;
the SIGTERM p95 must stay well under the pod's ``terminationGracePeriodSeconds``.

Run: ``python benchmarks/runtime_checkpoint.py --sizes-mb 1 100 --repeats 7`` (all three), or
``--what agreement --agreement-steps 2000`` for the agreement alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuscaler.runtime import EXIT_PREEMPTED
from gpuscaler.runtime.checkpoint import CheckpointStore

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "train_loop.py"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: list[float]) -> str:
    """``median / p95`` in milliseconds."""
    return f"{statistics.median(values) * 1e3:9.3f} ms  {percentile(values, 95) * 1e3:9.3f} ms"


def bench_write(base: Path, size_mb: float, repeats: int) -> tuple[list[float], list[float]]:
    """Time save_bytes and verify of an incompressible payload of ``size_mb`` MB."""
    payload = os.urandom(int(size_mb * 1e6))
    store = CheckpointStore(base / f"write-{size_mb:g}", keep=2)
    saves, verifies = [], []
    for step in range(1, repeats + 1):
        t0 = time.perf_counter()
        info = store.save_bytes(step, payload)
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.verify(info.path)
        verifies.append(time.perf_counter() - t0)
    shutil.rmtree(store.directory)
    return saves, verifies


def bench_sigterm(
    base: Path, size_mb: float, repeats: int, rng: random.Random
) -> tuple[list[float], list[float]]:
    """Time SIGTERM -> checkpoint committed (in-process) and SIGTERM -> exit (outside)."""
    inside, outside = [], []
    for run in range(repeats):
        ckpt_dir = base / f"term-{size_mb:g}-{run}"
        progress = base / f"progress-{size_mb:g}-{run}.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCALER_")}
        env.update(
            GPUSCALER_CHECKPOINT_DIR=str(ckpt_dir),
            GPUSCALER_CHECKPOINT_INTERVAL_S="0",
            GPUSCALER_PROGRESS_FILE=str(progress),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            str(FIXTURE),
            "--total-steps",
            "1000000",
            "--out",
            str(base / "w.npy"),
            "--step-sleep",
            "0.01",
            "--padding-mb",
            str(size_mb),
            "--quiet",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["e"] == "resume", first
        time.sleep(rng.uniform(0.2, 0.5))
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.stdout.read()
        code = proc.wait(timeout=600)
        outside.append(time.perf_counter() - t0)
        if code != EXIT_PREEMPTED:
            raise SystemExit(f"worker exited {code}, expected {EXIT_PREEMPTED}")
        event = json.loads(progress.read_text())["last_checkpoint"]
        assert event["reason"] == "sigterm", event
        inside.append(float(event["notice_latency_s"]))
        shutil.rmtree(ckpt_dir)
    return inside, outside


def agreement_worker(steps: int, directory: Path) -> None:
    """One rank under torchrun: time the agreement and guard steps; rank 0 prints JSON."""
    import torch.distributed as dist

    from gpuscaler.runtime import TrainingGuard
    from gpuscaler.runtime.distributed import TorchAgreement

    dist.init_process_group("gloo")
    agree = TorchAgreement()
    for _ in range(50):
        agree.max([0, 0, 0])
    reduce_s = []
    for _ in range(steps):
        t0 = time.perf_counter()
        agree.max([0, 0, 0])
        reduce_s.append(time.perf_counter() - t0)

    def guard_steps(guard: TrainingGuard[dict[str, int]]) -> list[float]:
        out = []
        guard.resume({})
        for step in guard.steps(0, steps):
            t0 = time.perf_counter()
            guard.completed(step, {})
            out.append(time.perf_counter() - t0)
        return out

    agreed = guard_steps(TrainingGuard(directory / "agreed", agree=agree, interval_s=None, handle_signals=False))
    solo = guard_steps(
        TrainingGuard(directory / f"solo-{agree.rank}", interval_s=None, handle_signals=False)
    )
    if agree.rank == 0:
        print(json.dumps({"reduce": reduce_s, "agreed": agreed, "solo": solo}))
    dist.destroy_process_group()


def bench_agreement(base: Path, steps: int) -> dict[str, list[float]]:
    """Run :func:`agreement_worker` on 2 ranks with torchrun; return its timings."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, "--agreement-worker", "--agreement-steps", str(steps), "--dir", str(base),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"agreement benchmark failed (exit {done.returncode}): {done.stderr[-2000:]}")
    timings: dict[str, list[float]] = json.loads(lines[-1])
    return timings


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print a table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 100.0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--what", choices=["all", "write", "sigterm", "agreement"], default="all")
    parser.add_argument("--agreement-steps", type=int, default=2000)
    parser.add_argument("--agreement-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.agreement_worker:
        agreement_worker(args.agreement_steps, args.dir)
        return 0
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="gpuscaler-bench-", dir=args.dir))
    try:
        print(f"# gpuscaler.runtime checkpoint benchmark: dir={base} repeats={args.repeats}")
        print(f"{'payload':>10}  {'what':<34}{'median':>12}  {'p95':>12}")
        for size in args.sizes_mb if args.what in ("all", "write") else []:
            saves, verifies = bench_write(base, size, args.repeats)
            mb_s = size / statistics.median(saves)
            print(f"{size:>7g} MB  {'save (write+fsync+hash+rename)':<34}{summary(saves)}  ({mb_s:.0f} MB/s)")
            print(f"{size:>7g} MB  {'verify on load (re-hash)':<34}{summary(verifies)}")
        for size in args.sizes_mb if args.what in ("all", "sigterm") else []:
            inside, outside = bench_sigterm(base, size, args.repeats, rng)
            print(f"{size:>7g} MB  {'SIGTERM -> checkpoint committed':<34}{summary(inside)}")
            print(f"{size:>7g} MB  {'SIGTERM -> process exited':<34}{summary(outside)}")
        if args.what in ("all", "agreement"):
            t = bench_agreement(base, args.agreement_steps)
            extra = statistics.median(t["agreed"]) - statistics.median(t["solo"])
            print(f"{'2 ranks':>10}  {'agreement all-reduce (gloo, CPU)':<34}{summary(t['reduce'])}")
            print(f"{'2 ranks':>10}  {'guard.completed with agree=':<34}{summary(t['agreed'])}")
            print(f"{'1 rank':>10}  {'guard.completed without':<34}{summary(t['solo'])}")
            print(f"{'':>10}  {'agreement per step (median diff)':<34}{extra * 1e3:9.3f} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
