"""What planning into held capacity saves, against using it only when a job happens to fit it.

Two ways of treating the capacity a team holds (a policy's ``capacity``: reservations, capacity
blocks; docs/capacity.md), replayed over a trace's jobs in arrival order, each seeing the same
pools and keeping its own record of which nodes of each pool are taken when:

* ``planned`` (gpuscaler): every job is planned with the pools its predecessors left free
  (:func:`gpuscaler.planner.plan` with ``held_in_use``); a plan into a pool takes its nodes for the
  plan's hours in it (a segmented plan's first segment);
* ``when-it-fits`` (Karpenter's behaviour: it launches into a reservation or block when the
  instance type a pod asks for matches, pricing it at $0, and drains a block before its end): every
  job is planned as if the team held nothing; its plan lands on a pool only when the pool has its
  instance type, is open at the job's arrival, has the nodes free, and the run ends inside the
  window; then it pays the pool's marginal price, else the plan's.

The figure is each way's expected cost (the planner's, at the predicted throughput, interruptions
at their expectation), not a replay in a world off the model (:mod:`gpuscaler.simulator.engine`
does not model held capacity yet). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from gpuscaler.catalog import Catalog
from gpuscaler.planner import plan
from gpuscaler.policy import Policy
from gpuscaler.policy.capacity import HeldCapacity
from gpuscaler.simulator.trace import Trace

Taken = dict[str, list[tuple[float, float, int]]]
"""Per pool: (from hour, to hour, nodes) of what each job holds, hours from the trace's start."""


@dataclass(frozen=True)
class HeldRow:
    """One job under one way."""

    job: str
    way: str
    plan: str
    pool: str
    """The pool it ran on ('' for none)."""
    cost_usd: float


@dataclass
class HeldComparison:
    """Both ways' expected cost over a trace."""

    rows: list[HeldRow] = field(default_factory=list)

    def total(self, way: str) -> float:
        return sum(r.cost_usd for r in self.rows if r.way == way)

    def on_held(self, way: str) -> int:
        return sum(1 for r in self.rows if r.way == way and r.pool)

    @property
    def saving_usd(self) -> float:
        """What planning into the pools saves against using them when a job happens to fit."""
        return self.total("when-it-fits") - self.total("planned")


def _in_use(taken: Taken, at_h: float) -> dict[str, int]:
    return {p: sum(n for a, b, n in spans if a <= at_h < b) for p, spans in taken.items()}


def _fits(pool: HeldCapacity, trace: Trace, at_h: float, hours: float, nodes: int, taken: Taken) -> bool:
    now = trace.start + timedelta(hours=at_h)
    if pool.type == "flexStart" or (pool.start is not None and pool.start > now):
        return False
    if pool.end is not None and now + timedelta(hours=hours) > pool.end:
        return False
    return pool.count - _in_use(taken, at_h).get(pool.name, 0) >= nodes


def compare_held(trace: Trace, catalog: Catalog, policy: Policy) -> HeldComparison:
    """Both ways over ``trace`` (see the module docstring).

    Args:
        trace: The jobs and the time they arrive (the pools' windows are read against its start).
        catalog: The catalog.
        policy: The policy in force, its ``capacity`` the pools.

    Returns:
        One row per job and way.
    """
    out = HeldComparison()
    bought = policy.model_copy(update={"capacity": []})
    taken: dict[str, Taken] = {"planned": {}, "when-it-fits": {}}
    for job in sorted(trace.jobs, key=lambda j: j.arrival_h):
        t = job.arrival_h
        now = trace.start + timedelta(hours=t)
        deadline = job.deadline_h(trace.start)
        r = plan(job.spec, catalog, policy, name=job.name, now=now, deadline_h=deadline,
                 held_in_use=_in_use(taken["planned"], t))  # fmt: skip
        c = r.chosen
        if c is not None and c.pool:
            hours = c.segments[0].hours if c.segments else c.expected_hours
            taken["planned"].setdefault(c.pool, []).append((t, t + hours, c.nodes))
        out.rows.append(HeldRow(job.name, "planned", c.label if c else "-", c.pool if c else "", c.expected_cost_usd if c else 0.0))
        b = plan(job.spec, catalog, bought, name=job.name, now=now, deadline_h=deadline).chosen
        pool = next(
            (p for p in policy.capacity if b is not None and p.instance_type == b.instance.name
             and _fits(p, trace, t, b.expected_hours, b.nodes, taken["when-it-fits"])),
            None,
        )  # fmt: skip
        if b is not None and pool is not None:
            cost = b.expected_hours * (pool.usd_per_hour or 0.0) * b.nodes
            taken["when-it-fits"].setdefault(pool.name, []).append((t, t + b.expected_hours, b.nodes))
            out.rows.append(HeldRow(job.name, "when-it-fits", b.label, pool.name, cost))
        else:
            out.rows.append(HeldRow(job.name, "when-it-fits", b.label if b else "-", "", b.expected_cost_usd if b else 0.0))
    return out
