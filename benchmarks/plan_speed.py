#!/usr/bin/env python3
"""Planning time over the full catalog (target: under 100 ms per job on a 2-core machine).

    python benchmarks/plan_speed.py [--repeats 20]

Plans the example jobs and a spread of generated ones against every instance type, capacity type,
node count and precision in the catalog, and prints the median and p95 planning time per job with
the number of configurations evaluated.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import yaml

from gpuscaler.api import TrainingJob, TrainingJobSpec
from gpuscaler.catalog import load_catalog
from gpuscaler.planner import plan

ROOT = Path(__file__).resolve().parents[1]


def jobs() -> list[tuple[str, TrainingJobSpec]]:
    out = []
    for f in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "TrainingJob":
            out.append((f.name, TrainingJob.model_validate(doc).spec))
    for model, batch in [("resnet50", 1024), ("bert-large-seq512", 4096), ("llama-7b", 512), ("gpt2-small", 256)]:
        spec = TrainingJobSpec.model_validate(
            {"workload": {"model": model}, "globalBatch": batch, "training": {"steps": 10000}, "maxDuration": "2d"}
        )
        out.append((f"{model}-b{batch}", spec))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    cat = load_catalog()
    plan(jobs()[0][1], cat)  # warm caches (catalog, constants)
    print(f"{'job':28s} {'configs':>8s} {'median ms':>10s} {'p95 ms':>8s}")
    all_times = []
    for name, spec in jobs():
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            r = plan(spec, cat)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        all_times += times
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        print(f"{name:28s} {r.candidates_evaluated:8d} {statistics.median(times):10.1f} {p95:8.1f}")
    all_times.sort()
    print(f"\nall jobs: median {statistics.median(all_times):.1f} ms, "
          f"p95 {all_times[int(0.95 * len(all_times))]:.1f} ms per job "
          f"({len(cat.instances)} instance types x 2 capacity types)")


if __name__ == "__main__":
    main()
