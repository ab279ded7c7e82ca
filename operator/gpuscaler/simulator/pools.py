"""Held capacity in the simulated world: pools of nodes that jobs occupy and free over simulated time.

The policy's ``capacity`` (:class:`gpuscaler.policy.capacity.HeldCapacity`, docs/capacity.md) is
replayed by :mod:`gpuscaler.simulator.engine`, the same pools for every strategy, each strategy's
run keeping its own :class:`HeldPools` (who holds which nodes when). A pool's windows are read
against the trace's start: simulated hour ``t`` is ``trace.start + t``.

* ``reserved``: ``count`` nodes, usable from the start until ``end`` (its expiry; none: always);
* ``capacityBlock``: ``count`` nodes that exist only inside ``[start, end)``; a job on it gets its
  checkpoint asked for :func:`gpuscaler.planner.held.margin_s` before the end (``2 C + 60 s``)
  and moves on when it is written (a planned move, nothing lost);
* ``flexStart``: a request waits a delay drawn from the pool's log-normal (``P50 exp(sigma z)``,
  ``z`` standard normal) before its nodes come; the ``k``-th flex-start request of a job on a
  pool draws the same ``z`` under every strategy (a stream seeded by seed, job and pool); a run
  stops (as at a block's end) after ``maxRunHours``.

A held allocation is neither reclaimed nor short of capacity (the nodes are the team's); it costs
``wall hours x marginal price x nodes`` (the pool's ``usdPerHour``; 0 for capacity paid whether
used or not; flex-start default: the catalog's on-demand price).

Two ways to use the pools: a strategy that plans into them (``gpuscaler``: the planner with
``held_in_use`` and the simulated ``now``, :mod:`gpuscaler.simulator.planning`) and the rest,
which use a pool only when their own plan happens to fit it (Karpenter's behaviour): a job whose
chosen instance type has a reserved pool or open block with the nodes free lands there at the pool's
marginal price (:meth:`HeldPools.landing`). Pure.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime

from gpuscaler.catalog import CapacityType
from gpuscaler.planner import Candidate
from gpuscaler.planner.held import margin_s
from gpuscaler.planner.planner import STARTUP_S
from gpuscaler.policy import Policy
from gpuscaler.policy.capacity import HeldCapacity
from gpuscaler.simulator.trace import Trace, TraceError

HELD_CAPACITY = frozenset({CapacityType.RESERVED, CapacityType.CAPACITY_BLOCK, CapacityType.FLEX_START})


def flex_delay_h(pool: HeldCapacity, z: float) -> float:
    """A flex-start delay in hours for the standard normal draw ``z``: ``P50 exp(sigma z) / 60``."""
    delay = pool.start_delay
    assert delay is not None  # the model requires it for flexStart
    return delay.p50_minutes * math.exp(delay.log_sigma * z) / 60.0


@dataclass
class HeldPools:
    """The policy's pools over one simulated run: who holds which nodes, and the flex-start draws.

    Attributes:
        pools: the pools by name.
        start: the trace's start (simulated hour 0).
        seed: the run's seed (flex-start draws).
        held: job index -> (pool name, nodes) it holds now.
    """

    pools: dict[str, HeldCapacity]
    start: datetime
    seed: int
    held: dict[int, tuple[str, int]] = field(default_factory=dict)
    _flex: dict[tuple[str, str], random.Random] = field(default_factory=dict)

    @classmethod
    def of(cls, policy: Policy | None, start: datetime, seed: int) -> HeldPools:
        """The pools of ``policy`` (none without one)."""
        return cls({p.name: p for p in (policy.capacity if policy is not None else [])}, start, seed)

    def __bool__(self) -> bool:
        return bool(self.pools)

    def hour(self, t: datetime | None) -> float | None:
        """Simulated hour of ``t`` (None stays None)."""
        return None if t is None else (t - self.start).total_seconds() / 3600.0

    def opens_h(self, pool: HeldCapacity) -> float:
        """Simulated hour the pool opens (0 when open from the start)."""
        h = self.hour(pool.start) if pool.type == "capacityBlock" else None
        return max(h or 0.0, 0.0)

    def closes_h(self, pool: HeldCapacity, granted_h: float) -> float | None:
        """Simulated hour the nodes go: a block's end, a reservation's expiry, flex-start's run limit."""
        if pool.type == "flexStart":
            return granted_h + pool.max_run_hours
        return self.hour(pool.end)

    def in_use(self, exclude: int | None = None) -> dict[str, int]:
        """Nodes held per pool, leaving out job ``exclude``'s own (it plans with what it holds freed)."""
        out: dict[str, int] = {}
        for i, (name, nodes) in self.held.items():
            if i != exclude:
                out[name] = out.get(name, 0) + nodes
        return out

    def free(self, pool: HeldCapacity, exclude: int | None = None) -> int:
        """Nodes of ``pool`` nobody else holds."""
        return pool.count - self.in_use(exclude).get(pool.name, 0)

    def take(self, i: int, pool: HeldCapacity, nodes: int) -> None:
        """Job ``i`` holds ``nodes`` of ``pool``."""
        self.held[i] = (pool.name, nodes)

    def release(self, i: int) -> None:
        """Job ``i`` leaves its pool (if any)."""
        self.held.pop(i, None)

    def flex_z(self, job: str, pool: HeldCapacity) -> float:
        """The next standard normal draw of ``job``'s flex-start requests on ``pool`` (the same
        sequence under every strategy: a stream seeded by (seed, job, pool))."""
        key = (job, pool.name)
        rng = self._flex.get(key)
        if rng is None:
            rng = self._flex[key] = random.Random(f"{self.seed}|{job}|flex|{pool.name}")
        return rng.gauss(0.0, 1.0)

    def landing(self, i: int, cand: Candidate, t: float) -> Candidate | None:
        """Where a plan bought by the hour lands when a pool happens to fit it (Karpenter's behaviour).

        A reserved pool or a capacity block of the plan's instance type, open at ``t`` with the
        plan's nodes free and more than a start-up and the checkpoint margin left in its window,
        takes the job at the pool's marginal price; flex-start is never landed on (it is queued,
        asked for by name). None: it runs as bought.
        """
        for pool in self.pools.values():
            if pool.type == "flexStart" or pool.instance_type != cand.instance.name:
                continue
            if pool.zone and cand.zone and pool.zone != cand.zone:
                continue
            closes = self.closes_h(pool, t)
            room_h = (STARTUP_S + margin_s(cand.checkpoint_write_s)) / 3600.0
            if self.opens_h(pool) > t or (closes is not None and closes - t <= room_h):
                continue
            if self.free(pool, exclude=i) < cand.nodes:
                continue
            return on_pool(cand, pool)
        return None


def held_policy(policy: Policy | None, trace: Trace) -> Policy | None:
    """``policy`` with the trace's own held capacity added (unchanged when it adds none).

    Raises:
        TraceError: a trace pool named as one of the policy's.
    """
    base = policy or Policy()
    have = {p.name: p for p in base.capacity}
    new = [p for p in trace.capacity if have.get(p.name) != p]  # idempotent: the same pool is added once
    if not new:
        return policy
    clash = sorted(p.name for p in new if p.name in have)
    if clash:
        raise TraceError(f"{trace.name}: capacity {', '.join(clash)} is declared differently by the trace and the "
                         "policy; rename one", field="capacity")
    return base.model_copy(update={"capacity": [*base.capacity, *new]})


def on_pool(cand: Candidate, pool: HeldCapacity) -> Candidate:
    """``cand`` run on ``pool``: its capacity type, and the pool's marginal price for its nodes."""
    price = pool.usd_per_hour
    if price is None:  # as the planner prices it (planner/held.py): prepaid 0, flex-start on-demand
        price = cand.usd_per_hour / cand.nodes if pool.type == "flexStart" else 0.0
    return cand._replace(capacity=pool.capacity, pool=pool.name, usd_per_hour=price * cand.nodes)
