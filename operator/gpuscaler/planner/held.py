"""Held capacity in plans: reservations, capacity blocks and flex-start (docs/capacity.md).

The policy's ``capacity`` (:class:`gpuscaler.policy.capacity.HeldCapacity`) declares what the team
holds; :func:`held_offers` turns each pool with free nodes into an offering at **what the team pays
at the margin** (0 for capacity paid whether used or not), so the cheapest-plan rule uses free
held capacity first whenever it meets the job; :func:`held_candidate` evaluates one configuration
on it. With ``o`` the hours until the pool opens, ``e`` the hours until it closes (a block's end,
a reservation's expiry), ``T`` the run's hours, ``C`` one checkpoint's write seconds, ``D`` the
hours to the deadline:

* **reserved** (no expiry, or ``T`` ends before it) and a **capacity block** the job fits in: the
  plan as on on-demand capacity (no interruptions) with the deadline moved by the wait,
  ``D' = D - o``, and the hours ``o + T``. It fits when ``o + T_P90 + margin <= e``.
* a window the job does not fit in: a **segmented plan** (:func:`segmented`). The job runs in the
  window and checkpoints ``margin = 2 C + 60 s`` before it closes (one write to finish, a second
  as room for a slower write, a minute for the request to reach the workers: from the measured
  write time, not a fixed drain lead); it trained ``s1 = S min(1, (e - o - margin - startup) / W')``
  samples by then (``W'`` the work hours with checkpoint writes); the rest, ``S - s1``, is planned
  again without this pool, from ``e`` on, with the deadline ``D - e``: the next cheapest capacity
  that meets the deadline risk (which may be another block). The plan's ``P(miss)`` is the rest's.
  Of a pool's configurations the one with the highest throughput runs in the window (prepaid
  time: the most work done in it), so one re-plan per pool.
* **flex-start**: the start waits a log-normal delay ``d`` (P50, P90 of the declaration); the plan
  is chosen only when ``P(miss) = E_d[P(miss | D - d)]`` (``K`` quantiles of ``d``) still meets
  the deadline risk; else it is refused with that reason. A run longer than the pool's
  ``maxRunHours`` (GKE: 7 days) is refused too.

Pure: the re-plan of the rest is a callable the planner passes in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import PlanSegment
from gpuscaler.api.trainingjob import TrainingAmount
from gpuscaler.catalog import CapacityType, Catalog, UnknownIdError
from gpuscaler.catalog.prices import HELD_CAPACITY_SOURCE
from gpuscaler.planner.candidate import Candidate, Reason, Refusal, Rejection, Segment
from gpuscaler.planner.evaluate import STARTUP_S, Run, evaluate
from gpuscaler.planner.job import ResolvedJob
from gpuscaler.planner.offerings import Offering
from gpuscaler.policy import Policy
from gpuscaler.policy.capacity import HeldCapacity

if TYPE_CHECKING:
    from gpuscaler.planner.planner import PlanResult

HELD_PRICE_SOURCE = HELD_CAPACITY_SOURCE
"""Price source of held capacity: the price the policy declares the team pays at the margin."""
MARGIN_WRITES = 2.0
"""The checkpoint before a window closes is asked for this many write times before the end."""
MARGIN_SLACK_S = 60.0
"""Plus this: the request reaching the workers (the operator's handshake) and the step in flight."""
FLEX_DELAY_QUANTILES = 8
"""Quantiles of the flex-start delay the deadline risk is averaged over."""

RestPlanner = Callable[[TrainingJobSpec, float | None, Policy], tuple[Candidate | None, str]]
"""``(spec of the rest, hours to the deadline, policy) -> (chosen plan or None, why)``."""


@dataclass(frozen=True)
class HeldOffer:
    """A held pool with free nodes, as an offering."""

    pool: HeldCapacity
    offer: Offering
    free: int
    """Nodes free now (the pool's count less those other jobs hold)."""
    opens_h: float
    """Hours from now until it can be used (a block's start; 0: now)."""
    closes_h: float | None
    """Hours from now until it closes (a block's end, a reservation's expiry; None: never)."""


def _hours(t: datetime, now: datetime) -> float:
    return (t - now).total_seconds() / 3600.0


def held_offers(
    spec: TrainingJobSpec,
    catalog: Catalog,
    policy: Policy,
    allowed: set[str],
    now: datetime,
    in_use: Mapping[str, int] | None = None,
) -> tuple[list[HeldOffer], list[Rejection]]:
    """The policy's held pools as offerings, and why the others are not.

    Args:
        spec: the job's spec (its zones).
        catalog: the catalog (the pools' instance types).
        policy: the policy in force (its ``capacity``).
        allowed: instance type names the job's constraints and the policy's allow lists allow
            (those with an allowed on-demand or spot offering).
        now: the time windows are measured from.
        in_use: nodes of each pool other jobs hold (pool name -> nodes; none when absent).

    Returns:
        The usable pools and the rejections of the rest.
    """
    used = in_use or {}
    out: list[HeldOffer] = []
    rejected: list[Rejection] = []
    for pool in policy.capacity:
        cap = pool.capacity

        def reject(reason: Reason, text: str, pool: HeldCapacity = pool, cap: CapacityType = cap) -> None:
            rejected.append(Rejection(pool.instance_type, cap.value, reason, f"capacity {pool.name}: {text}", pool.zone))

        try:
            inst = catalog.instance(pool.instance_type)
        except UnknownIdError as err:
            reject(Reason.POLICY, f"{err}")
            continue
        free = pool.count - used.get(pool.name, 0)
        closes = _hours(pool.end, now) if pool.end is not None else None
        if inst.name not in allowed:
            reject(Reason.CONSTRAINT, f"{inst.name} is left out by the job's constraints or the policy's allow lists")
        elif pool.zone and spec.constraints.zones and pool.zone not in spec.constraints.zones:
            reject(Reason.CONSTRAINT, f"zone {pool.zone} not in constraints.zones")
        elif pool.zone and policy.zones and pool.zone not in policy.zones:
            reject(Reason.POLICY, f"zone {pool.zone} not in the policy's zones")
        elif free <= 0:
            reject(Reason.CAPACITY, f"all {pool.count} node(s) in use by other jobs")
        elif closes is not None and closes <= 0:
            reject(Reason.CAPACITY, f"closed at {pool.end:%Y-%m-%d %H:%M} UTC" if pool.end else "closed")
        else:
            price = pool.usd_per_hour
            if price is None:  # flexStart: the catalog's on-demand price (assumption); the rest: prepaid
                price = (policy.price(inst, CapacityType.ON_DEMAND) or 0.0) if cap is CapacityType.FLEX_START else 0.0
            opens = max(_hours(pool.start, now), 0.0) if pool.start is not None else 0.0
            offer = Offering(inst, cap, price, zone=pool.zone, price_source=HELD_PRICE_SOURCE)
            out.append(HeldOffer(pool, offer, free, opens, closes))
    return out, rejected


def margin_s(write_s: float) -> float:
    """Seconds before a window closes that its checkpoint is asked for: ``2 C + 60``."""
    return MARGIN_WRITES * write_s + MARGIN_SLACK_S


def _shifted(job: ResolvedJob, hours: float) -> ResolvedJob:
    return job if job.deadline_h is None else replace(job, deadline_h=job.deadline_h - hours)


def _pooled(c: Candidate, h: HeldOffer, **outlook: float) -> Candidate:
    return c._replace(pool=h.pool.name, outlook=c.outlook._replace(**outlook))


def held_candidate(
    job: ResolvedJob, spec: TrainingJobSpec, policy: Policy, h: HeldOffer, run: Run
) -> Candidate | Refusal | None:
    """One configuration on a held pool: the candidate, why it cannot run, or None when it does
    not fit in the pool's window (then :func:`segmented` plans it in pieces).

    Args:
        job: the resolved job.
        spec: its spec.
        policy: the policy (checkpoint interval bounds).
        h: the held pool.
        run: the configuration and its prediction.
    """
    if h.pool.type == "flexStart":
        return _flex(job, spec, policy, h, run)
    c = evaluate(_shifted(job, h.opens_h), spec, policy, h.offer, run, "")
    out = c.outlook
    if h.closes_h is not None:
        slow = out.p90_hours or out.expected_hours
        if h.opens_h + slow + margin_s(run.write_s) / 3600.0 > h.closes_h:
            return None
    return _pooled(
        c, h, expected_hours=h.opens_h + out.expected_hours, p90_hours=h.opens_h + (out.p90_hours or out.expected_hours)
    )


def _flex(job: ResolvedJob, spec: TrainingJobSpec, policy: Policy, h: HeldOffer, run: Run) -> Candidate | Refusal:
    pool = h.pool
    delay = pool.start_delay
    assert delay is not None  # the model requires it for flexStart
    c = evaluate(job, spec, policy, h.offer, run, "")
    if c.outlook.base_hours > pool.max_run_hours:
        return Refusal(
            Reason.CAPACITY,
            f"capacity {pool.name}: runs {c.outlook.base_hours:.1f} h > flex-start's {pool.max_run_hours:g} h limit",
        )
    k = FLEX_DELAY_QUANTILES
    delays = [delay.quantile_hours((i + 0.5) / k) for i in range(k)]
    miss = sum(evaluate(_shifted(job, d), spec, policy, h.offer, run, "").outlook.deadline_miss_probability for d in delays) / k
    mean = delay.mean_hours
    return _pooled(
        c, h, expected_hours=mean + c.outlook.expected_hours, p90_hours=delay.quantile_hours(0.9) + (c.outlook.p90_hours or c.outlook.expected_hours),
        deadline_miss_probability=miss if job.deadline_h is not None else 0.0,
    )  # fmt: skip


def flex_delay_reason(c: Candidate, h: HeldOffer, risk: float, undelayed_miss: float) -> str | None:
    """Why a flex-start plan is refused for its delay: the deadline would be met without it, not with it."""
    delay = h.pool.start_delay
    miss = c.outlook.deadline_miss_probability
    if delay is None or miss <= risk or undelayed_miss > risk:
        return None
    return (
        f"capacity {h.pool.name}: flex-start's start delay (P50 {delay.p50_minutes:g} min, P90 "
        f"{delay.p90_minutes:g} min) puts P(miss deadline) at {miss:.0%} > maxDeadlineRisk {risk:.0%} "
        f"({undelayed_miss:.0%} if it started now)"
    )


def segmented(
    job: ResolvedJob,
    spec: TrainingJobSpec,
    policy: Policy,
    h: HeldOffer,
    run: Run,
    rest_planner: RestPlanner,
) -> Candidate | Refusal:
    """Run in the window, checkpoint ``margin`` before it closes, continue on the next cheapest capacity.

    Args:
        job: the resolved job.
        spec: its spec.
        policy: the policy (its other pools stay plannable for the rest).
        h: the pool whose window is shorter than the job.
        run: the configuration to run in the window (the pool's fastest).
        rest_planner: plans what is left.

    Returns:
        The segmented candidate (its cost the sum of its segments', its ``P(miss)`` the rest's),
        or why there is none.
    """
    assert h.closes_h is not None
    margin = margin_s(run.write_s)
    c = evaluate(_shifted(job, h.opens_h), spec, policy, h.offer, run, "")
    startup_h = STARTUP_S / 3600.0
    in_window_h = h.closes_h - h.opens_h - margin / 3600.0
    train_h = in_window_h - startup_h
    work_with_writes_h = c.outlook.base_hours - startup_h
    if train_h <= 0 or work_with_writes_h <= 0:
        return Refusal(Reason.CAPACITY, f"capacity {h.pool.name}: {in_window_h * 60:.0f} min left in its window, too short to start")
    steps_in = int(job.total_samples * min(1.0, train_h / work_with_writes_h) // job.global_batch)
    s1 = float(steps_in * job.global_batch)
    if s1 <= 0:
        return Refusal(Reason.CAPACITY, f"capacity {h.pool.name}: not one step fits in its window")
    left = job.total_samples - s1
    if left <= 0:  # it fits at its expected speed, not at its P90 (held_candidate): no rest to plan
        return Refusal(Reason.CAPACITY, f"capacity {h.pool.name}: the job fits its window only at its expected speed, not at P90")
    rest_spec = spec.model_copy(update={"training": TrainingAmount(samples=left)})
    others = policy.model_copy(update={"capacity": [p for p in policy.capacity if p.name != h.pool.name]})
    rest_deadline = None if job.deadline_h is None else job.deadline_h - h.closes_h
    if rest_deadline is not None and rest_deadline <= 0:
        return Refusal(Reason.DEADLINE, f"capacity {h.pool.name}: its window closes after the deadline and the job does not fit in it")
    rest, why = rest_planner(rest_spec, rest_deadline, others)
    if rest is None:
        return Refusal(Reason.DEADLINE, f"capacity {h.pool.name}: the {left:,.0f} samples left after its window have no plan ({why})")
    checkpoint_at = h.closes_h - margin / 3600.0
    block = Segment(
        label=f"{c.nodes} x {c.instance.name} {h.offer.capacity.value} {h.pool.name}",
        capacity=h.offer.capacity, pool=h.pool.name, start_h=h.opens_h, hours=in_window_h,
        samples=s1, cost_usd=in_window_h * c.usd_per_hour, checkpoint_at_h=checkpoint_at, margin_s=margin,
    )  # fmt: skip
    after = rest.segments or (
        Segment(
            label=f"{rest.nodes} x {rest.instance.name} {rest.capacity.value}{f' {rest.pool}' if rest.pool else ''}",
            capacity=rest.capacity, pool=rest.pool, start_h=0.0, hours=rest.expected_hours,
            samples=left, cost_usd=rest.expected_cost_usd,
        ),
    )  # fmt: skip
    moved = tuple(replace(seg, start_h=seg.start_h + h.closes_h) for seg in after)
    return c._replace(
        pool=h.pool.name,
        segments=(block, *moved),
        outlook=c.outlook._replace(
            expected_hours=h.closes_h + rest.expected_hours,
            p90_hours=h.closes_h + rest.p90_hours,
            deadline_miss_probability=rest.outlook.deadline_miss_probability,
            interruptions=rest.outlook.interruptions,
        ),
    )


def held_note(c: Candidate, h: HeldOffer) -> str:
    """What the chosen plan's held capacity costs and why: the ``why`` of a plan on a held pool."""
    pool = h.pool
    paid = " (paid whether used or not)" if h.offer.usd_per_hour == 0 else ""
    text = (
        f"on {pool.type} capacity {pool.name} ({h.free} of {pool.count} node(s) free) at "
        f"${h.offer.usd_per_hour:,.2f}/node-hour, what the team pays at the margin{paid}"
    )
    if c.segments:
        first, rest = c.segments[0], c.segments[1:]
        assert first.checkpoint_at_h is not None
        text += (
            f"; its window closes in {h.closes_h:.1f} h: {first.samples:,.0f} samples in it, checkpoint "
            f"{first.margin_s / 60:.0f} min before its end (2 x {c.checkpoint_write_s:.0f} s write + "
            f"{MARGIN_SLACK_S:.0f} s), then " + ", then ".join(s.label for s in rest)
        )
    return text


def held_placement(result: PlanResult, c: Candidate) -> dict[str, Any]:
    """``status.plan``'s reservation id and window of the chosen plan's held pool (empty: none).

    Args:
        result: the :class:`~gpuscaler.planner.PlanResult` (its ``held`` pools).
        c: its chosen plan.
    """
    h = result.held.get(c.pool) if c.pool else None
    if h is None:
        return {}
    return {"reservation_id": h.pool.reservation_id, "window_start": h.pool.start, "window_end": h.pool.end}


def plan_segments(c: Candidate, now: datetime) -> list[PlanSegment]:
    """A candidate's segments as ``status.plan.segments`` (times from ``now``, when it was planned)."""
    return [
        PlanSegment(
            offering=seg.label, capacity_type=seg.capacity.value, held_capacity=seg.pool,
            start=now + timedelta(hours=seg.start_h), samples=round(seg.samples), cost_usd=round(seg.cost_usd, 2),
            checkpoint_at=None if seg.checkpoint_at_h is None else now + timedelta(hours=seg.checkpoint_at_h),
        )
        for seg in c.segments
    ]
