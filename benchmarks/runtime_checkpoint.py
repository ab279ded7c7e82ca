"""Benchmark of gpuscaler.runtime: checkpoint write/verify time by size, SIGTERM-to-checkpoint latency.

1. ``CheckpointStore.save_bytes`` (write, fsync, sha256, manifest, rename, dir fsync) and
   ``CheckpointStore.verify`` (re-hash on load) for each payload size, repeated.
2. SIGTERM to checkpoint committed: the toy training job ``tests/fixtures/train_loop.py`` (10 ms
   steps, checkpoint padded to the payload size) is started, sent SIGTERM at a random moment, and
   the time is taken two ways: inside the process, from the signal handler to the commit (the
   ``notice_latency_s`` the guard reports; includes waiting for the step boundary), and outside,
   from ``kill`` to process exit.

The numbers depend on the disk: pass ``--dir`` on the volume the checkpoints will live on
(``/tmp`` is often tmpfs, where fsync is free). The spot notice is 30 s on GKE and 2 min on AWS;
the SIGTERM p95 must stay well under the pod's ``terminationGracePeriodSeconds``.

Run: ``python benchmarks/runtime_checkpoint.py --sizes-mb 1 100 --repeats 7``
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

from gpuscaler.runtime import EXIT_PREEMPTED, CheckpointStore

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "train_loop.py"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: list[float]) -> str:
    """``median / p95`` in milliseconds."""
    return f"{statistics.median(values) * 1e3:9.1f} ms  {percentile(values, 95) * 1e3:9.1f} ms"


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


def main(argv: list[str] | None = None) -> int:
    """Run both benchmarks and print a table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 100.0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="gpuscaler-bench-", dir=args.dir))
    try:
        print(f"# gpuscaler.runtime checkpoint benchmark: dir={base} repeats={args.repeats}")
        print(f"{'payload':>10}  {'what':<34}{'median':>12}  {'p95':>12}")
        for size in args.sizes_mb:
            saves, verifies = bench_write(base, size, args.repeats)
            mb_s = size / statistics.median(saves)
            print(f"{size:>7g} MB  {'save (write+fsync+hash+rename)':<34}{summary(saves)}  ({mb_s:.0f} MB/s)")
            print(f"{size:>7g} MB  {'verify on load (re-hash)':<34}{summary(verifies)}")
        for size in args.sizes_mb:
            inside, outside = bench_sigterm(base, size, args.repeats, rng)
            print(f"{size:>7g} MB  {'SIGTERM -> checkpoint committed':<34}{summary(inside)}")
            print(f"{size:>7g} MB  {'SIGTERM -> process exited':<34}{summary(outside)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
