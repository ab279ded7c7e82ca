"""Compare the strategies on the shipped traces and print the tables (the numbers in docs/simulator.md).

    python benchmarks/simulator_compare.py [--seed 0] [--scales 1,50] [--markdown]

For each trace in ``examples/traces/`` and each interruption scale (1 = the Spot Advisor rates as
published; larger = a stress test), runs every strategy with the same seed and prints the table
``gpuscaler simulate`` prints. Add ``--seeds N`` to average the totals over N seeds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuscaler.catalog import load_catalog
from gpuscaler.simulator import CloudModel, compare, load_trace, summarize
from gpuscaler.simulator.report import format_markdown, format_table

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"


def main() -> None:
    """Run the comparison on every shipped trace."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scales", default="1,50", help="interruption-rate multipliers, comma-separated")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--traces", nargs="*", help="trace files (default: examples/traces/*)")
    args = ap.parse_args()
    catalog = load_catalog()
    paths = [Path(p) for p in args.traces] if args.traces else sorted(TRACES.glob("*.*"))
    for path in paths:
        trace = load_trace(path)
        for scale in (float(s) for s in args.scales.split(",")):
            t0 = time.perf_counter()
            cloud = CloudModel.from_mapping(trace.cloud, interruption_scale=scale)
            cmp = compare(trace, catalog, cloud=cloud, seed=args.seed, keep_segments=False)
            rows = [summarize(r) for r in cmp.results]
            print(f"\n### {trace.name} ({len(trace.jobs)} jobs), seed {args.seed}, interruption rates x{scale:g}\n")
            print(format_markdown(rows) if args.markdown else format_table(rows))
            print(f"\n({cmp.planner.misses} planner runs for {cmp.planner.calls} plans, "
                  f"{time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
