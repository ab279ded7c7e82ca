"""``gpuscaler simulate TRACE``: replay a workload trace under each strategy and compare them.

Registered by the main CLI through ``register(subparsers)``. Prints the comparison table (or JSON
with ``--json``), writes figures with ``--plot DIR`` and per-job outcomes with ``--jobs-out FILE``.
Exit codes: 0 success, 2 bad input (raised as :class:`gpuscaler.inputs.InputError` and printed by the
CLI's ``main``, as a JSON error object under ``--json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuscaler.catalog import load_catalog
from gpuscaler.inputs import (
    InputError,
    non_negative_float,
    output_file,
    positive_float,
    to_json,
    validation_error,
)
from gpuscaler.policy import load_policy
from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.compare import compare
from gpuscaler.simulator.report import format_markdown, format_table, plot, summarize
from gpuscaler.simulator.strategies import STRATEGIES
from gpuscaler.simulator.trace import TraceError, load_trace

EXIT_USAGE = 2


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand to the main CLI's subparsers."""
    sp = subparsers.add_parser(
        "simulate",
        help="replay a workload trace under several strategies: cost, deadline misses, completion, losses",
        description="Replay a workload trace (YAML or JSONL) against a seeded cloud model under each "
        "strategy, with the same draws for all, and print the comparison.",
    )
    sp.add_argument("trace", help="trace file (examples/traces/*.yaml or *.jsonl)")
    sp.add_argument("--seed", type=int, default=0, help="random seed (default 0); same seed, same result")
    sp.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"comma-separated, first is the baseline (default {','.join(STRATEGIES)})")
    sp.add_argument("--policy", help="platform policy YAML")
    sp.add_argument("--interruption-scale", type=non_negative_float,
                    help="multiply the Spot Advisor interruption rates (default: the trace's, else 1)")
    sp.add_argument("--shortage-scale", type=non_negative_float,
                    help="multiply capacity-shortage probabilities (default: the trace's, else 1)")
    sp.add_argument("--checkpoint-interval", type=positive_float, default=3600.0,
                    help="seconds between checkpoints of spot-checkpoint (default 3600)")
    sp.add_argument("--no-cache", action="store_true", help="do not memoise planner calls")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    sp.add_argument("--plot", metavar="DIR", help="write cost_vs_misses.png and completion_cdf.png into DIR")
    sp.add_argument("--jobs-out", metavar="FILE", type=output_file, help="write one JSON line per job and strategy")
    sp.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run the ``simulate`` subcommand."""
    try:
        trace = load_trace(args.trace)
        policy = load_policy(args.policy) if args.policy else None
        cloud = CloudModel.from_mapping(trace.cloud, interruption_scale=args.interruption_scale,
                                        shortage_scale=args.shortage_scale)
        names = [s.strip() for s in args.strategies.split(",") if s.strip()]
        unknown = [n for n in names if n not in STRATEGIES]
        if unknown or not names:
            raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    except TraceError:
        raise
    except ValidationError as err:
        raise validation_error(err, f"simulate: policy {args.policy}") from None
    except (InputError, ValueError) as err:  # a policy file, unknown strategies or cloud keys
        raise InputError(f"simulate: {err}", field=getattr(err, "field", None)) from None
    t0 = time.perf_counter()
    cmp = compare(trace, load_catalog(), policy=policy, cloud=cloud, seed=args.seed, strategies=names,
                  checkpoint_interval_s=args.checkpoint_interval, cache=not args.no_cache,
                  keep_segments=False)
    elapsed = time.perf_counter() - t0
    rows = [summarize(r) for r in cmp.results]
    if args.jobs_out:
        with Path(args.jobs_out).open("w", encoding="utf-8") as fh:
            for res in cmp.results:
                for o in res.outcomes:
                    fh.write(to_json({
                        "strategy": res.strategy, "job": o.name, "status": o.status, "plan": o.plan_label,
                        "arrivalHours": o.arrival_h, "completionHours": o.completion_h,
                        "deadlineHours": o.deadline_h, "missedDeadline": o.missed_deadline,
                        "costUsd": round(o.cost_usd, 4), "predictedCostUsd": round(o.predicted_cost_usd, 4),
                        "predictedHours": round(o.predicted_hours, 4), "gpuHours": round(o.gpu_hours, 4),
                        "gpuHoursLost": round(o.gpu_hours_lost, 4), "interruptions": o.interruptions,
                        "shortages": o.shortages, "note": o.note,
                    }, indent=None) + "\n")
    if args.json:
        print(to_json({
            "trace": trace.name, "jobs": len(trace.jobs), "seed": args.seed,
            "interruptionScale": cloud.interruption_scale, "shortageScale": cloud.shortage_scale,
            "strategies": [r.to_dict() for r in rows],
            "planner": {"calls": cmp.planner.calls, "runs": cmp.planner.misses,
                        "seconds": round(cmp.planner.planning_s, 3)},
            "seconds": round(elapsed, 3),
        }))
    else:
        print(f"trace {trace.name}: {len(trace.jobs)} jobs over {trace.jobs[-1].arrival_h:.0f} h; seed {args.seed}; "
              f"interruption rates x{cloud.interruption_scale:g}, shortages x{cloud.shortage_scale:g}")
        print(format_markdown(rows) if args.markdown else format_table(rows))
        print(f"cost and deadline misses summed over all jobs; mean/p95 h = arrival to finish; "
              f"GPU-h lost = compute thrown away by interruptions. {cmp.planner.misses} planner runs for "
              f"{cmp.planner.calls} plans; {elapsed:.1f} s.")
    if args.plot:
        try:
            for p in plot(cmp.results, args.plot, trace.name):
                print(f"wrote {p}", file=sys.stderr)
        except ImportError:
            print("gpuscaler simulate: --plot needs matplotlib (pip install gpuscaler[plot])", file=sys.stderr)
            return EXIT_USAGE
    return 0
