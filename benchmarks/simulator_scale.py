"""Scale run: plan and simulate 10,000 jobs under every strategy; jobs planned per second, peak memory.

    python benchmarks/simulator_scale.py [--jobs 10000] [--seed 0] [--throughput-error SIGMA] [--tracemalloc]
        [--uncached-sample 100]

The jobs are drawn from the specs of the shipped traces with sizes scaled by 0.5, 1 or 2 and
arrivals spread over 30 days, so the trace repeats itself as real queues do (the nightly retrain,
the sweep): plans are memoised by spec signature (:class:`gpuscaler.simulator.CachedPlanner`).
The script also times the planner uncached on a sample of jobs, which is the rate for a trace in
which no two jobs are alike. The world's throughput is off the model by the model's own
cross-validated error unless ``--throughput-error`` says otherwise (corrections and moves then
add planner calls that the cache cannot answer).
"""

from __future__ import annotations

import argparse
import random
import resource
import time
import tracemalloc
from pathlib import Path

from gpuscaler.api import TrainingAmount
from gpuscaler.catalog import load_catalog
from gpuscaler.simulator import CachedPlanner, CloudModel, Trace, TraceJob, compare, load_trace, summarize
from gpuscaler.simulator.report import format_table
from gpuscaler.simulator.truth import default_scaling_error, default_throughput_error

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"


def synthetic_trace(n: int, seed: int) -> Trace:
    """``n`` jobs drawn from the shipped traces' specs, sizes x0.5/1/2, arrivals over 30 days."""
    templates = [j.spec for p in sorted(TRACES.glob("*.*")) for j in load_trace(p).jobs]
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        spec = rng.choice(templates)
        factor = rng.choice([0.5, 1.0, 2.0])
        t = spec.training
        amount = TrainingAmount(
            samples=t.samples * factor if t.samples else None,
            epochs=t.epochs * factor if t.epochs else None,
            steps=round(t.steps * factor) if t.steps else None,
            samples_per_epoch=t.samples_per_epoch,
        )
        jobs.append(TraceJob(f"job-{i:05d}", rng.uniform(0, 720), spec.model_copy(update={"training": amount})))
    return Trace("synthetic", tuple(sorted(jobs, key=lambda j: j.arrival_h)))


def main() -> None:
    """Run the scale benchmark and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interruption-scale", type=float, default=1.0)
    ap.add_argument("--throughput-error", type=float, default=None,
                    help="sigma of ln(true / model throughput), no scaling error; default the model's cross-validated errors "
                    "(throughput and scaling)")
    ap.add_argument("--tracemalloc", action="store_true", help="measure peak Python heap (slower)")
    ap.add_argument("--uncached-sample", type=int, default=100, help="jobs planned without the cache")
    args = ap.parse_args()
    catalog = load_catalog()
    trace = synthetic_trace(args.jobs, args.seed)
    distinct = len({j.spec.model_dump_json() for j in trace.jobs})
    if args.tracemalloc:
        tracemalloc.start()
    sigma = default_throughput_error().sigma if args.throughput_error is None else args.throughput_error
    scaling = default_scaling_error().sigma if args.throughput_error is None else 0.0
    t0 = time.perf_counter()
    cmp = compare(trace, catalog, cloud=CloudModel(interruption_scale=args.interruption_scale), seed=args.seed,
                  keep_segments=False, throughput_error=sigma, scaling_error=scaling)
    elapsed = time.perf_counter() - t0
    peak_heap = tracemalloc.get_traced_memory()[1] if args.tracemalloc else None
    if args.tracemalloc:
        tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows = [summarize(r) for r in cmp.results]
    print(format_table(rows))
    n_strat = len(cmp.results)
    events = sum(r.events for r in cmp.results)
    print(f"\nthroughput error {sigma:g}, scaling error {scaling:g}; {args.jobs:,} jobs ({distinct} distinct specs) x {n_strat} strategies = {args.jobs * n_strat:,} job runs "
          f"in {elapsed:.1f} s: {args.jobs * n_strat / elapsed:,.0f} jobs planned and simulated per second; "
          f"{events:,} events")
    print(f"planner: {cmp.planner.calls:,} plans asked, {cmp.planner.misses:,} computed "
          f"(cache hit rate {cmp.planner.hit_rate:.1%}), {cmp.planner.planning_s:.1f} s inside the planner")
    print(f"peak RSS {rss_mb:,.0f} MB" + (f"; peak traced Python heap {peak_heap / 2**20:,.0f} MB" if peak_heap else ""))

    if args.uncached_sample:
        sample = trace.jobs[: args.uncached_sample]
        planner = CachedPlanner(catalog, cache=False)
        t1 = time.perf_counter()
        for j in sample:
            planner.choose(j.spec, j.deadline_h(trace.start), name=j.name)
        dt = time.perf_counter() - t1
        print(f"uncached planner: {len(sample)} jobs in {dt:.2f} s = {len(sample) / dt:,.0f} jobs planned per second "
              f"({dt / len(sample) * 1000:.1f} ms per job); 10,000 jobs x {n_strat} strategies uncached would take "
              f"about {10_000 * n_strat * dt / len(sample) / 60:.0f} min")


if __name__ == "__main__":
    main()
