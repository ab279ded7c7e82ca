"""The baselines a careful team would run without gpuscaler, on the same model, prices and draws.

Each is a :class:`~gpuscaler.simulator.strategies.Strategy`; each plans with the same performance
model and catalog as gpuscaler and meets the same cloud, but none corrects the model from what it
observes (the gpuscaler strategy does, through the operator's code), and none has a checkpoint
handshake on a reclaim notice (nothing else in the field does one).

``ondemand-best``
    Right-sized on-demand: the cheapest on-demand plan that meets the deadline (any GPU type and
    count, AMP allowed), the planner's own choice with spot off. On a capacity error it takes the
    next cheapest on-demand offering. When no plan meets the deadline, the fastest on-demand plan
    costing at most twice the cheapest.

    Events: job arrives, due in 12 h -> 1 x g5.12xlarge on-demand amp (say) -> finishes at 9 h.

``managed-spot``
    SkyPilot-style managed spot: the spot plan with the lowest uninterrupted cost whose
    uninterrupted time fits the hours left (an optimizer that prices time x $/h and does not model
    reclaims), Young/Daly checkpoints at the planner's interval, no handshake. On a reclaim it
    relaunches the rest from the last checkpoint by the same rule; on a capacity error it fails
    over to the next offering (the failed one is avoided for an hour); when no spot plan's
    uninterrupted time fits, the cheapest on-demand plan that meets the deadline.

    Events: due in 24 h, spot plan takes 10 h uninterrupted -> reclaimed at 6 h, 20 min since the
    last checkpoint lost -> relaunched on the same offering (or the next, if it is short) with
    18 h left -> ... -> with 5 h left and 6 h to go, on-demand for the rest.

``managed-spot-padded``
    The same, with the pad a careful team adds to an optimizer that believes the model: a plan's
    uninterrupted time counts x the model's P90 factor for that offering (``P50 / P10`` of its
    throughput band, :func:`~gpuscaler.simulator.planning.p90_factor`, about 1.4 at the model's
    cross-validated error), applied once to the time of the work it plans (after a reclaim, to the
    time of the rest). When no padded spot plan fits, the cheapest on-demand plan whose padded time
    fits; when none does, the planner's on-demand plan.

    Events: due in 12 h; 4 x V100 spot, 9 h uninterrupted, x 1.4 = 12.6 h: does not fit; 8 x V100
    spot, 5 h x 1.4 = 7 h: fits, cheapest such -> runs it.

``managed-spot-padded+correction``
    ``managed-spot-padded`` plus gpuscaler's own observe-and-correct loop
    (:mod:`gpuscaler.simulator.observing`, the operator's :mod:`gpuscaler.planner.correction`):
    it measures the running plan's throughput, re-plans the rest with the corrected factor by the
    padded rule and moves when the operator's ``should_replan`` says so (for the deadline from a
    checkpoint asked for at once, for cost at the next periodic one). No handshake on a notice. The
    ablation: what gpuscaler adds beyond it is the planner's own risk model (and the handshake).

``uniform-progress``
    Can't Be Late (Z. Wu, W.-L. Chiang, Z. Mao, Z. Yang, E. Friedman, S. Shenker, I. Stoica,
    "Can't Be Late: Optimizing Spot Instance Savings under Deadlines", NSDI 2024, section 5), for
    one configuration that runs on spot or on its on-demand twin. With ``C(t)`` the compute left,
    ``R(t)`` the time left, ``d`` the changeover delay (:func:`~gpuscaler.simulator.planning.
    changeover_s`: the longest restart, one checkpoint interval of lost work and a checkpoint
    write), progress ``cp(t)`` and the uniform line ``ep(t) = C(0) t / R(0)`` (in samples: the
    total x the share of the deadline elapsed), its rules are:

    1. *Uniform progress*: idle and behind the line (``cp < ep``) -> on-demand.
    2. *Taking risks*: otherwise take spot whenever it is available (a request succeeds), and stay
       on it until reclaimed (exploitation). A spot request that fails moves to the next spot
       offering (the failed one avoided for an hour), as managed spot fails over; with none left,
       wait and ask again.
    3. *Hysteresis*: on on-demand, stay until ``cp(t) >= ep(t + 2d)``, then leave it (a checkpoint,
       then spot).
    4. *Safety net*: when the slack left ``R(t) - C(t)`` reaches ``d`` -> on-demand to the end:
       idle, or running (a checkpoint, then on-demand; looked at 15 minutes into each allocation,
       when its progress shows the rate, and again no sooner than the slack could reach ``d``). The paper's rule reads ``R(t) < C(t) + 2d``
       when idle; its authors' simulator checks ``C(t) + d`` at every step, and the audit of issue
       36 asked for the latter. Nothing is subtracted up front. The paper's job has one known
       ``C``; ours learns it from its progress, so when the net fires and the twin itself can no
       longer finish in time (the model was optimistic), it takes the planner's on-demand plan for
       the rest instead (the cheapest meeting the deadline, else the fastest sensible), once.

    The configuration is the spot plan with the lowest uninterrupted cost whose uninterrupted time
    plus ``d`` fits the deadline (else on-demand from the start); ``C(t)`` is at the rate the job's
    own progress shows on it (the model's prediction before it has run), checkpoint writes included. Jobs without a deadline
    have no line and no net: spot, failing over, waiting when there is none.

    Events: due in 20 h, 10 h of work -> spot; reclaimed at 4 h with 3.5 h done (line: 2 h) -> spot
    again; spot short at 9 h with 5 h done (line 4.5 h) -> the next spot offering; all short at
    11 h, 5 h done < line 5.5 h -> on-demand until 5 h + 2d is ahead of the line, then spot; at 17
    h with 2.6 h of work left and d = 0.4 h: the slack reached d -> on-demand to the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuscaler.api import PrecisionName, SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType
from gpuscaler.planner import Candidate
from gpuscaler.planner.recovery import LATE_H, fastest_sensible
from gpuscaler.simulator.allocation import Allocation, Review
from gpuscaler.simulator.planning import (
    CachedPlanner,
    Choice,
    Fit,
    PlanKey,
    changeover_s,
    config_key,
    plan_key,
    with_remaining,
)
from gpuscaler.simulator.strategies import Decision, JobState, Replan, Strategy

MIN_REVIEW_H = 60.0 / 3600
"""Shortest wait between two reviews of one allocation (a minute)."""
LOOK_H = 0.25
"""Uniform progress reads its job's progress bar this long after an allocation starts training."""
RESTART_MARGIN = 1.5
"""The longest restart as a multiple of ``checkpoint.restartSeconds`` (the cloud draws U(0.5, 1.5))."""
PADDED = Fit(p90_pad=True)
"""``managed-spot-padded``'s rule: the uninterrupted time x the model's P90 factor fits."""


def _samples(st: JobState) -> float | None:
    """The samples to plan: None (the spec's own, cache-friendly) before any progress."""
    return None if st.remaining_samples >= st.total_samples else st.remaining_samples


def _hours_left(st: JobState, now_h: float) -> float | None:
    left = st.deadline_left_h(now_h)
    return None if left is not None and left <= LATE_H else left


def on_demand_plan(st: JobState, planner: CachedPlanner, now_h: float, spec: TrainingJobSpec | None = None,
                   avoid: frozenset[tuple[str, ...]] | None = None) -> Candidate | None:
    """The cheapest on-demand plan that meets the deadline left, else the fastest sensible one.

    Args:
        st: the job.
        planner: the planner.
        now_h: the simulated hour.
        spec: the spec to plan (default: the job's, with the samples left).
        avoid: offerings to leave out (default: those the job saw short recently).

    Returns:
        The candidate, or None when no on-demand plan exists at all.
    """
    base = spec if spec is not None else with_remaining(st.spec, _samples(st))
    od = with_remaining(base, spot=SpotPolicy.NEVER)
    avoided = st.avoided(now_h) if avoid is None else avoid
    left = _hours_left(st, now_h)
    if left is not None or st.deadline_h is None:
        chosen = planner.choose(od, left, avoided, st.name).chosen
        if chosen is not None:
            return chosen
    fallback = with_remaining(od, budget_usd=None)
    for offerings in (avoided, frozenset()):
        choice = planner.choose(fallback, None, offerings, st.name)
        chosen = fastest_sensible(choice.pareto) if choice.chosen is not None else None
        if chosen is not None:
            return chosen
    return None


def _decision(c: Candidate | None) -> Decision | None:
    return None if c is None else Decision(c, c.outlook.interval_s, handshake=False)


class OnDemandBest(Strategy):
    """Right-sized on-demand: the cheapest on-demand plan meeting the deadline (module docstring)."""

    name = "ondemand-best"
    label = "cheapest on-demand plan meeting the deadline"
    replans_on_shortage = True

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return _decision(on_demand_plan(st, planner, now_h))

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return _decision(on_demand_plan(st, planner, now_h))


class ManagedSpot(Strategy):
    """SkyPilot-style managed spot with failover (module docstring)."""

    name = "managed-spot"
    label = "managed spot (uninterrupted time fits), failover"
    replans_on_shortage = True
    fit: Fit | None = None
    """What fits the hours left (None: the uninterrupted time; the on-demand fallback is then the planner's)."""

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h)

    def after_interruption(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h)

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h)

    def replan(self, st: JobState, planner: CachedPlanner, now_h: float) -> Replan:
        key = None if st.current is None else plan_key(st.current.candidate)
        return Replan(self._decide(st, planner, now_h), self._pick(st, planner, now_h, CapacityType.SPOT, key).current)

    def _pick(self, st: JobState, planner: CachedPlanner, now_h: float, capacity: CapacityType,
              current: PlanKey | None = None) -> Choice:
        spec = with_remaining(st.spec, _samples(st), spot=SpotPolicy.PREFERRED)
        return planner.choose(spec, _hours_left(st, now_h), st.avoided(now_h), st.name, rule="uninterrupted",
                              capacity=capacity, fit=self.fit, efficiency=st.efficiency or None, current=current)

    def _decide(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        if _hours_left(st, now_h) is None and st.deadline_h is not None:
            return _decision(on_demand_plan(st, planner, now_h))  # late: the fastest sensible finish
        chosen = self._pick(st, planner, now_h, CapacityType.SPOT).chosen
        if chosen is None and self.fit is not None:
            chosen = self._pick(st, planner, now_h, CapacityType.ON_DEMAND).chosen
        if chosen is None:
            chosen = on_demand_plan(st, planner, now_h)
        return None if chosen is None else Decision(chosen, chosen.outlook.interval_s, handshake=False,
                                                    efficiency=st.efficiency.get(chosen.instance.gpu_id, 1.0))


class ManagedSpotPadded(ManagedSpot):
    """Managed spot whose uninterrupted time is padded by the model's P90 factor (module docstring)."""

    name = "managed-spot-padded"
    label = "managed spot, time x the model's P90 factor"
    fit = PADDED


class ManagedSpotPaddedCorrection(ManagedSpotPadded):
    """``managed-spot-padded`` with the operator's observe-and-correct loop (module docstring)."""

    name = "managed-spot-padded+correction"
    label = "managed spot padded + the operator's correction"
    corrects = True


@dataclass
class Twins:
    """Uniform Progress's view of one job: its two twins and whether the safety net has fired."""

    spot: Decision | None
    on_demand: Decision | None
    changeover_h: float
    """``d``: the longest restart, one checkpoint interval of lost work and a write, hours."""
    latched: bool = False
    """The safety net fired: on-demand until the end."""
    rescued: bool = False
    """The net found the twin too slow for the hours left and took the planner's on-demand plan."""


class UniformProgress(Strategy):
    """Can't Be Late's Uniform Progress with its safety net and spot failover (module docstring)."""

    name = "uniform-progress"
    label = "uniform progress (Can't Be Late)"
    replans_on_shortage = True

    def __init__(self) -> None:
        self.jobs: dict[str, Twins] = {}
        """Per job (by name): its spot and on-demand twins and whether the safety net fired."""

    # ------------------------------------------------------------------ the line and the rules

    @staticmethod
    def done(st: JobState) -> float:
        """Samples in the job's newest checkpoint."""
        return st.total_samples - st.remaining_samples

    @staticmethod
    def expected(st: JobState, at_h: float) -> float:
        """``ep(t)``: samples the uniform line asks for at hour ``at_h`` (0 without a deadline)."""
        if not st.deadline_h:
            return 0.0
        return st.total_samples * min(max((at_h - st.arrival_h) / st.deadline_h, 0.0), 1.0)

    def rate(self, st: JobState, d: Decision) -> float:
        """Samples per second of ``d``'s configuration: as the job's progress showed it, else the model's."""
        seen = st.progress_rate.get(config_key(d.candidate))
        return seen if seen else d.candidate.estimate.throughput / d.efficiency

    def compute_h(self, st: JobState, d: Decision, done: float | None = None) -> float:
        """``C(t)``: hours ``d`` needs for the samples left after ``done`` (default: the newest
        checkpoint's), at the rate the job's progress shows, with its checkpoint writes."""
        remaining = st.remaining_samples if done is None else st.total_samples - done
        work_s = remaining / self.rate(st, d)
        writes = work_s / d.interval_s * d.candidate.checkpoint_write_s if d.interval_s else 0.0
        return (work_s + writes) / 3600.0

    def slack_h(self, st: JobState, p: Twins, now_h: float, done: float | None = None) -> float | None:
        """``R(t) - C(t)`` on the on-demand twin (None: no deadline)."""
        left = st.deadline_left_h(now_h)
        if left is None or p.on_demand is None:
            return None
        return left - self.compute_h(st, p.on_demand, done)

    def safety_net(self, st: JobState, p: Twins, now_h: float, done: float | None = None) -> bool:
        """The slack left has reached ``d``: ``R(t) - C(t) <= d`` (latches)."""
        if not p.latched:
            slack = self.slack_h(st, p, now_h, done)
            p.latched = slack is not None and slack <= p.changeover_h + 1e-9  # rounding, not policy
        return p.latched

    def _idle(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        p = self.jobs[st.name]
        if p.spot is None:
            return p.on_demand
        if self.safety_net(st, p, now_h):
            return self._net(st, planner, p, now_h)
        return p.spot

    def _net(self, st: JobState, planner: CachedPlanner, p: Twins, now_h: float, done: float | None = None,
             ) -> Decision | None:
        """Where the safety net goes: the on-demand twin, unless the job's own progress shows the twin
        cannot finish in the hours left (the model was optimistic): then the planner's on-demand plan
        for the rest (the cheapest meeting the deadline, else the fastest sensible), once."""
        left = st.deadline_left_h(now_h)
        if (not p.rescued and p.on_demand is not None and left is not None
                and self.compute_h(st, p.on_demand, done) + self._restart_s(st) / 3600.0 > left):
            p.rescued = True
            p.on_demand = _decision(on_demand_plan(st, planner, now_h)) or p.on_demand
        return p.on_demand

    # -------------------------------------------------------------------- the configuration

    def _restart_s(self, st: JobState) -> float:
        return st.spec.checkpoint.restart_seconds * RESTART_MARGIN

    def _spot(self, st: JobState, planner: CachedPlanner, now_h: float) -> Candidate | None:
        """The cheapest uninterrupted spot plan whose time plus ``d`` fits, short offerings avoided."""
        left = st.deadline_left_h(now_h)
        if left is not None and left <= LATE_H:
            return None
        spec = with_remaining(st.spec, _samples(st), spot=SpotPolicy.PREFERRED)
        return planner.choose(spec, left, st.avoided(now_h), st.name, rule="uninterrupted",
                              capacity=CapacityType.SPOT, fit=Fit(changeover_restart_s=self._restart_s(st))).chosen

    def _twins(self, st: JobState, planner: CachedPlanner, spot: Candidate) -> Twins:
        return Twins(_decision(spot), _decision(_twin(st, planner, spot)),
                     changeover_s(spot, self._restart_s(st)) / 3600.0)

    # ------------------------------------------------------------------------- strategy hooks

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        spot = self._spot(st, planner, now_h)
        if spot is None:
            od = _decision(on_demand_plan(st, planner, now_h))
            self.jobs[st.name] = Twins(None, od, self._restart_s(st) / 3600.0, latched=True)
            return od
        self.jobs[st.name] = self._twins(st, planner, spot)
        return self._idle(st, planner, now_h)

    def after_interruption(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._idle(st, planner, now_h)

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        p = self.jobs[st.name]
        if st.current is p.on_demand or p.on_demand is None:
            return st.current  # on-demand short: ask again after the back-off
        if self.safety_net(st, p, now_h):
            return self._net(st, planner, p, now_h)
        if self.done(st) < self.expected(st, now_h):
            return p.on_demand
        spot = self._spot(st, planner, now_h)  # ahead: fail over to the next spot offering
        if spot is None or p.spot is None or plan_key(spot) == plan_key(p.spot.candidate):
            return st.current  # none other: wait, then ask again
        nxt = self._twins(st, planner, spot)
        if nxt.on_demand is None:
            return st.current
        self.jobs[st.name] = nxt
        return self._idle(st, planner, now_h)

    def review_at_h(self, st: JobState, alloc: Allocation) -> float | None:
        p = self.jobs.get(st.name)
        if p is None or p.latched or p.spot is None or not st.deadline_h:
            return None
        look = alloc.start_h + alloc.provisioning_s / 3600.0 + LOOK_H  # its progress shows the rate
        if alloc.decision is p.spot:
            slack = self.slack_h(st, p, alloc.start_h, alloc.samples_done)
            return look if slack is None else min(look, alloc.start_h + max(slack - p.changeover_h, 0.0))
        if alloc.decision is not p.on_demand:
            return None
        start_h = alloc.start_h + alloc.provisioning_s / 3600.0
        again = self._catch_up_h(st, p, start_h, alloc.samples_saved)
        return look if again is None else min(look, again)

    def review(self, st: JobState, planner: CachedPlanner, now_h: float, alloc: Allocation) -> Review | None:
        p = self.jobs[st.name]
        if p.latched or p.spot is None:
            return None
        if self.safety_net(st, p, now_h, alloc.samples_done):
            target = self._net(st, planner, p, now_h, alloc.samples_done)
            return None if target is None or target is alloc.decision else Review(move=target)
        # The slack falls at most one hour per hour (writes, provisioning, a slower rate than thought):
        # look again no sooner than it could reach d.
        slack = self.slack_h(st, p, now_h, alloc.samples_done)
        assert slack is not None
        net_h = now_h + max(slack - p.changeover_h, MIN_REVIEW_H)
        if alloc.decision is p.spot:
            return Review(again_h=net_h)
        if alloc.samples_done >= self.expected(st, now_h + 2 * p.changeover_h):
            return Review(move=p.spot)
        again = self._catch_up_h(st, p, now_h, alloc.samples_done)
        return Review(again_h=net_h if again is None else min(net_h, max(again, now_h + MIN_REVIEW_H)))

    def _catch_up_h(self, st: JobState, p: Twins, from_h: float, samples: float) -> float | None:
        """The hour at which on-demand progress from ``samples`` at ``from_h`` reaches ``ep(t + 2d)``."""
        assert p.on_demand is not None and st.deadline_h
        rate_h = self.rate(st, p.on_demand) * 3600.0
        slope_h = st.total_samples / st.deadline_h
        if rate_h <= slope_h:
            return None
        # samples + rate (t - from) = slope (t + 2d - arrival)
        t = (slope_h * (2 * p.changeover_h - st.arrival_h) - samples + rate_h * from_h) / (rate_h - slope_h)
        finish = from_h + (st.total_samples - samples) / rate_h
        return max(t, from_h) if t < finish and math.isfinite(t) else None


def _twin(st: JobState, planner: CachedPlanner, spot: Candidate) -> Candidate | None:
    """The same configuration as ``spot`` on on-demand capacity."""
    spec = with_remaining(st.spec, spot=SpotPolicy.NEVER, budget_usd=None, constraints={
        "instance_types": [spot.instance.name], "gpu_types": [], "providers": [], "regions": [],
        "min_gpus": spot.gpus, "max_gpus": spot.gpus, "max_nodes": spot.nodes,
        "precisions": [PrecisionName(spot.precision.value)],
    })
    return planner.choose(spec, None, frozenset(), st.name).chosen
