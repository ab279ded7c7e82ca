"""``gpuscaler simulate TRACE``: replay a workload trace under each strategy and compare them.

Registered by the main CLI through ``register(subparsers)``. Runs every strategy on the same seeds
(``--seeds``, 5 by default) and prints one table whose figures are ranges over the seeds (or JSON
with ``--json``); writes figures with ``--plot DIR`` (first seed) and per-job outcomes with
``--jobs-out FILE``. Exit codes: 0 success, 2 invalid input or usage (raised as
:class:`gpuscaler.inputs.InputError`, naming the option or field, the value and what to do, and
printed by the CLI's ``main``, as a JSON error object under ``--json``).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuscaler.catalog import load_catalog
from gpuscaler.errors import ErrorKind, GpuscalerError
from gpuscaler.inputs import (
    InputError,
    non_negative_float,
    output_file,
    positive_float,
    positive_int,
    to_json,
    validation_error,
    write_output,
)
from gpuscaler.policy import load_policy
from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.compare import Comparison, compare
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.pools import held_policy
from gpuscaler.simulator.registry import ALL_STRATEGIES, STRATEGIES
from gpuscaler.simulator.report import format_markdown, format_table, plot, ranges, summarize
from gpuscaler.simulator.spot_prices import SpotPriceHistory, describe
from gpuscaler.simulator.trace import TraceError, load_trace, scale_deadlines
from gpuscaler.simulator.truth import default_scaling_error, default_throughput_error

EXIT_USAGE = 2
DEFAULT_SEEDS = 5


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand to the main CLI's subparsers."""
    default = default_throughput_error()
    scaling = default_scaling_error()
    sp = subparsers.add_parser(
        "simulate",
        help="replay a workload trace under several strategies: cost, deadline misses, completion, losses",
        description="Replay a workload trace (YAML or JSONL) against a seeded cloud model under each "
        "strategy, with the same draws for all, and print the comparison (ranges over the seeds). "
        "Exit codes: 0 ok, 2 invalid input or usage.",
    )
    sp.add_argument("trace", help="trace file (examples/traces/*.yaml or *.jsonl)")
    sp.add_argument("--seed", type=int, default=0, help="first random seed (default 0); same seeds, same result")
    sp.add_argument("--seeds", type=positive_int, default=DEFAULT_SEEDS,
                    help=f"how many seeds, from --seed on (default {DEFAULT_SEEDS}); tables show each figure's range")
    sp.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"comma-separated, first is the baseline (default {','.join(STRATEGIES)}; "
                    f"also {', '.join(s for s in ALL_STRATEGIES if s not in STRATEGIES)})")
    sp.add_argument("--policy", help="platform policy YAML")
    sp.add_argument("--throughput-error", type=non_negative_float, default=None, metavar="SIGMA",
                    help="true throughput = the model's x exp(SIGMA x N(0,1)), one draw per workload family, GPU "
                    f"type, precision and seed; 0 = none (default {default.sigma:g}: {default.source})")
    sp.add_argument("--scaling-error", type=non_negative_float, default=None, metavar="SIGMA",
                    help="and x exp(SIGMA x N(0,1)) on more than one GPU, one draw per family, GPU type, GPU count, "
                    f"node count and seed; 0 = none; both 0 = the world is the model (default {scaling.sigma:g}: "
                    f"{scaling.source})")
    sp.add_argument("--deadline-scale", type=positive_float, default=1.0, metavar="X",
                    help="multiply every job's hours to its deadline by X (0.7 = tight deadlines; default 1)")
    sp.add_argument("--interruption-scale", type=non_negative_float,
                    help="multiply the Spot Advisor interruption rates (default: the trace's, else 1)")
    sp.add_argument("--shortage-scale", type=non_negative_float,
                    help="multiply capacity-shortage probabilities (default: the trace's, else 1)")
    sp.add_argument("--checkpoint-interval", type=positive_float, default=3600.0,
                    help="seconds between checkpoints of deadline-blind-spot-checkpoint (default 3600)")
    sp.add_argument("--spot-prices", metavar="FILE",
                    help="spot price history to replay (describe_spot_price_history JSON; docs/prices.md): spot "
                         "prices per zone move over time and allocations are billed at the prices in force")
    sp.add_argument("--no-cache", action="store_true", help="do not memoise planner calls")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    sp.add_argument("--plot", metavar="DIR", help="write cost_vs_misses.png and completion_cdf.png into DIR")
    sp.add_argument("--jobs-out", metavar="FILE", type=output_file, help="write one JSON line per job, strategy and seed")
    sp.set_defaults(func=cmd_simulate)


def _check_args(args: argparse.Namespace) -> tuple[list[str], float, str, float]:
    """The strategy names, the throughput error with its source and the scaling error.

    Raises:
        InputError: an option is out of range (the message names it).
    """
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [n for n in names if n not in ALL_STRATEGIES]
    if unknown or not names:
        raise InputError(f"--strategies: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(ALL_STRATEGIES)}", field="--strategies")
    if args.seeds < 1:
        raise InputError(f"--seeds must be at least 1, got {args.seeds}", field="--seeds")
    if not (math.isfinite(args.checkpoint_interval) and args.checkpoint_interval > 0):
        raise InputError(f"--checkpoint-interval must be a number of seconds > 0, got {args.checkpoint_interval}",
                         field="--checkpoint-interval")
    for flag, value in (("--interruption-scale", args.interruption_scale), ("--shortage-scale", args.shortage_scale)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"{flag} must be a number >= 0 (0 turns it off, 1 = as published), got {value}",
                             field=flag)
    if args.throughput_error is None:
        default = default_throughput_error()
        sigma, source = default.sigma, default.source
    else:
        sigma, source = args.throughput_error, "--throughput-error"
    if not (math.isfinite(sigma) and sigma >= 0):
        raise InputError(f"--throughput-error must be a number >= 0 (0 = the world is the model), got {sigma}",
                         field="--throughput-error")
    scaling = default_scaling_error().sigma if args.scaling_error is None else args.scaling_error
    if not (math.isfinite(scaling) and scaling >= 0):
        raise InputError(f"--scaling-error must be a number >= 0 (0 = the model's scaling is right), got {scaling}",
                         field="--scaling-error")
    if not (math.isfinite(args.deadline_scale) and args.deadline_scale > 0):
        raise InputError(f"--deadline-scale must be a number > 0 (1 = as in the trace), got {args.deadline_scale}",
                         field="--deadline-scale")
    if args.jobs_out and not Path(args.jobs_out).resolve().parent.is_dir():
        raise InputError(f"--jobs-out {args.jobs_out}: directory {Path(args.jobs_out).resolve().parent} does not exist",
                         field="--jobs-out")
    return names, sigma, source, scaling


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run the ``simulate`` subcommand."""
    try:
        names, sigma, source, scaling = _check_args(args)
        trace = scale_deadlines(load_trace(args.trace), args.deadline_scale)
        policy = held_policy(load_policy(args.policy) if args.policy else None, trace)  # the trace's pools too
        history = SpotPriceHistory.read(args.spot_prices) if args.spot_prices else None
        cloud = CloudModel.from_mapping(trace.cloud, interruption_scale=args.interruption_scale,
                                        shortage_scale=args.shortage_scale, spot_prices=history)
    except ValidationError as err:
        raise validation_error(err, f"simulate: policy {args.policy}") from None
    except GpuscalerError as err:  # options, a policy file or cloud keys: named after the command
        if err.kind is not ErrorKind.INVALID_INPUT or isinstance(err, TraceError):
            raise  # a trace error names its file already; anything else is not the user's
        raise InputError(f"simulate: {err}", field=err.field) from None
    catalog = load_catalog()
    planner = CachedPlanner(catalog, policy, cache=not args.no_cache)
    t0 = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.seeds))
    runs: list[Comparison] = [
        compare(trace, catalog, policy=policy, cloud=cloud, seed=s, strategies=names,
                checkpoint_interval_s=args.checkpoint_interval, keep_segments=False, throughput_error=sigma,
                planner=planner, scaling_error=scaling)
        for s in seeds
    ]
    elapsed = time.perf_counter() - t0
    table = ranges([[summarize(r) for r in cmp.results] for cmp in runs])
    if args.jobs_out:
        _write_jobs(args.jobs_out, runs)
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
    if args.json:
        print(to_json({
            "trace": trace.name, "jobs": len(trace.jobs), "seeds": seeds,
            "throughputError": sigma, "throughputErrorSource": source, "scalingError": scaling,
            "deadlineScale": args.deadline_scale,
            "interruptionScale": cloud.interruption_scale, "shortageScale": cloud.shortage_scale,
            "spotPrices": describe(history) if history else None,
            "strategies": [r.to_dict() for r in table],
            "planner": {"calls": planner.calls, "runs": planner.misses, "seconds": round(planner.planning_s, 3)},
            "seconds": round(elapsed, 3),
        }))
    else:
        print(f"trace {trace.name}: {len(trace.jobs)} jobs over {trace.jobs[-1].arrival_h:.0f} h; {seed_text}; "
              f"interruption rates x{cloud.interruption_scale:g}, shortages x{cloud.shortage_scale:g}; "
              f"throughput error {sigma:g} ({source}), scaling error {scaling:g}"
              + (f"; deadlines x{args.deadline_scale:g}" if args.deadline_scale != 1 else "")
              + (f"; spot prices replayed from {history.source}" if history else ""))
        print(format_markdown(table) if args.markdown else format_table(table))
        print(f"ranges over {len(seeds)} seed(s); cost and deadline misses summed over all jobs; mean/p95 h = "
              f"arrival to finish; GPU-h lost = compute thrown away by interruptions. {planner.misses} planner "
              f"runs for {planner.calls} plans; {elapsed:.1f} s.")
    if args.plot:
        try:
            for p in plot(runs[0].results, args.plot, trace.name):
                print(f"wrote {p}", file=sys.stderr)
        except OSError as err:
            raise InputError(f"simulate: --plot {args.plot}: {err}", field="--plot") from None
    return 0


def _write_jobs(path: str, runs: list[Comparison]) -> None:
    fh = io.StringIO()  # then one checked write (inputs.write_output): a full device is an error, not "written"
    for cmp in runs:
        for res in cmp.results:
            for o in res.outcomes:
                fh.write(to_json({
                    "strategy": res.strategy, "seed": cmp.seed, "job": o.name, "status": o.status,
                    "plan": o.plan_label, "arrivalHours": o.arrival_h, "completionHours": o.completion_h,
                    "deadlineHours": o.deadline_h, "missedDeadline": o.missed_deadline,
                    "costUsd": round(o.cost_usd, 4), "predictedCostUsd": round(o.predicted_cost_usd, 4),
                    "predictedHours": round(o.predicted_hours, 4), "gpuHours": round(o.gpu_hours, 4),
                    "gpuHoursLost": round(o.gpu_hours_lost, 4), "interruptions": o.interruptions,
                    "shortages": o.shortages, "moves": o.moves, "corrections": o.corrections,
                    "throughputSource": o.throughput_source, "profiled": o.profiled, "note": o.note,
                }, indent=None) + "\n")
    write_output(path, fh.getvalue(), "--jobs-out")
