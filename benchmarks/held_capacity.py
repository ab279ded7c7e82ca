"""What planning into held capacity saves on a trace, against using it only when a job happens to fit it.

    python benchmarks/held_capacity.py [--trace examples/traces/research-week.yaml] [--policy FILE]

Replays the trace's jobs in arrival order twice with the same pools (``--policy``'s ``capacity``;
by default the team of :data:`DEFAULT_POOLS`: two reserved p4d.24xlarge for the whole trace and a
24-hour capacity block of two p5.48xlarge on its second day) and prints each way's expected cost
and the jobs it ran on held capacity (:func:`gpuscaler.simulator.held.compare_held`): ``planned``
(gpuscaler plans every job with the pools its predecessors left free) and ``when-it-fits``
(Karpenter's behaviour: a job's plan lands on a pool only when its instance type matches and it
ends inside the window). The figures are the planner's expected costs, not a replay in a world off
the model. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpuscaler.catalog import load_catalog
from gpuscaler.policy import Policy, load_policy
from gpuscaler.simulator.held import compare_held
from gpuscaler.simulator.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]


def default_pools(start: Any) -> Policy:
    """Two reserved p4d.24xlarge and a day-two 24-hour block of two p5.48xlarge, from ``start``."""
    return Policy.model_validate({"name": "team", "capacity": [
        {"name": "team-a100", "type": "reserved", "instanceType": "p4d.24xlarge", "count": 2},
        {"name": "day2-h100", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 2,
         "start": (start + timedelta(hours=24)).isoformat(), "end": (start + timedelta(hours=48)).isoformat()},
    ]})  # fmt: skip


DEFAULT_POOLS = "two reserved p4d.24xlarge; a 24 h block of two p5.48xlarge from hour 24"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(ROOT / "examples" / "traces" / "research-week.yaml"))
    ap.add_argument("--policy", help=f"policy YAML with the pools (default: {DEFAULT_POOLS})")
    args = ap.parse_args()
    trace = load_trace(args.trace)
    policy = load_policy(args.policy) if args.policy else default_pools(trace.start)
    cmp = compare_held(trace, load_catalog(), policy)
    jobs = len(trace.jobs)
    print(f"{trace.name}: {jobs} jobs; pools: {', '.join(f'{p.name} ({p.type}, {p.count} x {p.instance_type})' for p in policy.capacity)}")
    for way in ("planned", "when-it-fits"):
        print(f"  {way:13s} ${cmp.total(way):>10,.2f}  {cmp.on_held(way):3d} of {jobs} jobs on held capacity")
    base = cmp.total("when-it-fits")
    share = f" ({cmp.saving_usd / base:.0%})" if base > 0 else ""
    print(f"  planning into the pools saves ${cmp.saving_usd:,.2f}{share}")


if __name__ == "__main__":
    main()
