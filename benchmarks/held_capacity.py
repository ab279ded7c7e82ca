"""What planning into held capacity saves on a trace, against using it only when a job happens to fit it.

    python benchmarks/held_capacity.py [--trace examples/traces/research-week.yaml]
                                       [--policy examples/policies/research-week-held.yaml] [--seeds 5]

Replays the trace in the simulator's world (:mod:`gpuscaler.simulator.engine`, held capacity in
:mod:`gpuscaler.simulator.pools`) with the policy's pools, the same pools and the same random draws
(reclaims, shortages, flex-start delays, the hidden throughput factors at the model's own
cross-validated error) for two strategies, over ``--seeds`` seeds:

* ``gpuscaler``: plans every job, re-plan and planned move into the pools others leave free
  (reservations first when they meet the job, segmented plans across a block's end, flex-start when
  its delay still meets the deadline risk);
* ``when-it-fits`` (Karpenter's behaviour): the same planner, operator loop and handshake, but its
  plans are bought by the hour; a job lands on a pool only when its plan's instance type has a
  reservation or an open block with the nodes free, at the pool's marginal price.

Prints each seed's cost, deadline misses and jobs run on held capacity, and what planning into the
pools saves (mean and range over the seeds). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from gpuscaler.catalog import load_catalog
from gpuscaler.policy import Policy, load_policy
from gpuscaler.simulator import default_scaling_error, default_throughput_error
from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.compare import compare
from gpuscaler.simulator.engine import SimulationResult
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.pools import held_policy
from gpuscaler.simulator.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("when-it-fits", "gpuscaler")


def _row(r: SimulationResult) -> tuple[float, int, int]:
    """(cost, deadline misses, jobs with a segment on held capacity)."""
    held = sum(1 for o in r.outcomes if any(s.pool for s in o.segments))
    return sum(o.cost_usd for o in r.outcomes), sum(o.missed_deadline for o in r.outcomes), held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(ROOT / "examples" / "traces" / "research-week.yaml"))
    ap.add_argument("--policy", default=str(ROOT / "examples" / "policies" / "research-week-held.yaml"),
                    help="policy YAML with the pools ('' = none: the trace's own capacity only)")
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    trace, catalog = load_trace(args.trace), load_catalog()
    policy = held_policy(load_policy(args.policy) if args.policy else None, trace) or Policy()
    sigma, scaling = default_throughput_error().sigma, default_scaling_error().sigma
    planner = CachedPlanner(catalog, policy)
    cloud = CloudModel.from_mapping(trace.cloud)
    pools = ", ".join(f"{p.name} ({p.type}, {p.count} x {p.instance_type})" for p in policy.capacity)
    print(f"{trace.name}: {len(trace.jobs)} jobs; pools: {pools}; throughput error {sigma:.4f}, scaling error {scaling:.4f}")
    savings: list[float] = []
    for seed in range(args.seeds):
        cmp = compare(trace, catalog, policy=policy, cloud=cloud, seed=seed, strategies=WAYS, keep_segments=True,
                      throughput_error=sigma, planner=planner, scaling_error=scaling)  # fmt: skip
        rows = {r.strategy: _row(r) for r in cmp.results}
        text = "  ".join(f"{w} ${c:>9,.2f} misses {m} on held {h:2d}" for w, (c, m, h) in rows.items())
        savings.append(rows["when-it-fits"][0] - rows["gpuscaler"][0])
        base = rows["when-it-fits"][0]
        print(f"  seed {seed}: {text}  saves ${savings[-1]:,.2f} ({savings[-1] / base:.0%})" if base else f"  seed {seed}: {text}")
    print(f"planning into the pools saves ${statistics.fmean(savings):,.2f} a run on average "
          f"(${min(savings):,.2f} to ${max(savings):,.2f} over {args.seeds} seeds)")


if __name__ == "__main__":
    main()
