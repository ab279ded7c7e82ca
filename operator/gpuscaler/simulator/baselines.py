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

``uniform-progress``
    Can't Be Late (Wu et al., NSDI 2024, section 5.2), for one configuration that runs either on
    spot or on its on-demand twin. With ``C(t)`` the compute left, ``R(t)`` the time left,
    ``d`` the changeover delay (restart + one checkpoint interval of lost work), progress
    ``cp(t)`` and the uniform line ``ep(t) = C(0) t / R(0)`` (in samples: the total x the share of
    the deadline elapsed), its rules are:

    1. *Uniform progress*: idle and behind the line (``cp < ep``) -> on-demand.
    2. *Taking risks*: otherwise take spot whenever it is available (a request succeeds), and stay on
       it until reclaimed (exploitation); idle and ahead with no spot: wait and ask again.
    3. *Hysteresis*: on on-demand, stay until ``cp(t) >= ep(t + 2d)``, then leave it (a checkpoint,
       then spot).
    4. *Safety net*: idle and ``R(t) < C(t) + 2d`` -> on-demand until the end.

    The configuration is the spot plan with the lowest uninterrupted cost whose uninterrupted time
    plus ``2d`` fits the deadline (so the safety net does not fire at once); ``C(t)`` is measured at
    the rate the job's own progress showed on it (the model's prediction before it has run). Jobs
    without a deadline have no line: spot, waiting when there is none.

    Events: due in 20 h, 10 h of work -> spot; reclaimed at 4 h with 3.5 h done (line: 2 h) -> spot
    again; spot short at 9 h with 5 h done (line 4.5 h) -> wait 10 min, ask again; short again at
    11 h, 5 h done < line 5.5 h -> on-demand until 5 h + 2d is ahead of the line, then spot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuscaler.api import PrecisionName, SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType
from gpuscaler.planner import Candidate
from gpuscaler.planner.recovery import LATE_H, fastest_sensible
from gpuscaler.simulator.allocation import Allocation, Review
from gpuscaler.simulator.planning import CachedPlanner, config_key, with_remaining
from gpuscaler.simulator.strategies import Decision, JobState, Strategy

MIN_REVIEW_H = 60.0 / 3600
"""Shortest wait between two reviews of one allocation (a minute)."""


def _samples(st: JobState) -> float | None:
    """The samples to plan: None (the spec's own, cache-friendly) before any progress."""
    return None if st.remaining_samples >= st.total_samples else st.remaining_samples


def _hours_left(st: JobState, now_h: float) -> float | None:
    left = st.deadline_left_h(now_h)
    return None if left is not None and left <= LATE_H else left


def on_demand_plan(st: JobState, planner: CachedPlanner, now_h: float, spec: TrainingJobSpec | None = None,
                   avoid: frozenset[tuple[str, str]] | None = None) -> Candidate | None:
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

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h)

    def after_interruption(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h)

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h)

    def _decide(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        spec = with_remaining(st.spec, _samples(st), spot=SpotPolicy.PREFERRED)
        left = _hours_left(st, now_h)
        spot = None
        if left is not None or st.deadline_h is None:
            spot = planner.choose(spec, left, st.avoided(now_h), st.name, rule="uninterrupted",
                                  capacity=CapacityType.SPOT).chosen
        return _decision(spot if spot is not None else on_demand_plan(st, planner, now_h))


@dataclass
class Twins:
    """Uniform Progress's view of one job: its two twins and whether the safety net has fired."""

    spot: Decision | None
    on_demand: Decision | None
    changeover_h: float
    """``d``: restart plus one checkpoint interval of lost work, hours."""
    latched: bool = False
    """The safety net fired: on-demand until the end."""


class UniformProgress(Strategy):
    """Can't Be Late's Uniform Progress with its safety net (module docstring)."""

    name = "uniform-progress"
    label = "uniform progress (Can't Be Late)"

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

    def safety_net(self, st: JobState, p: Twins, now_h: float) -> bool:
        """``R(t) < C(t) + 2d`` (latches)."""
        if p.latched:
            return True
        left = st.deadline_left_h(now_h)
        if left is None or p.on_demand is None:
            return False
        compute_h = st.remaining_samples / self.rate(st, p.on_demand) / 3600.0
        p.latched = left < compute_h + 2 * p.changeover_h
        return p.latched

    def _idle(self, st: JobState, now_h: float) -> Decision | None:
        p = self.jobs[st.name]
        if p.spot is None or self.safety_net(st, p, now_h):
            return p.on_demand
        return p.spot

    # ------------------------------------------------------------------------- strategy hooks

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        restart_h = st.spec.checkpoint.restart_seconds / 3600.0
        guess_h = restart_h + planner.policy.max_checkpoint_interval_s / 3600.0
        left = st.deadline_h
        spot = None
        if left is None or left - 2 * guess_h > 0:
            spec = with_remaining(st.spec, spot=SpotPolicy.PREFERRED)
            target = None if left is None else left - 2 * guess_h
            spot = planner.choose(spec, target, frozenset(), st.name, rule="uninterrupted",
                                  capacity=CapacityType.SPOT).chosen
        if spot is None:
            od = _decision(on_demand_plan(st, planner, now_h))
            self.jobs[st.name] = Twins(None, od, restart_h, latched=True)
            return od
        twin = _twin(st, planner, spot)
        changeover_h = restart_h + spot.outlook.interval_s / 3600.0
        self.jobs[st.name] = Twins(_decision(spot), _decision(twin), changeover_h)
        return self._idle(st, now_h)

    def after_interruption(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._idle(st, now_h)

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        p = self.jobs[st.name]
        if st.current is p.on_demand or p.on_demand is None:
            return st.current  # on-demand short: ask again after the back-off
        if self.safety_net(st, p, now_h) or self.done(st) < self.expected(st, now_h):
            return p.on_demand
        return st.current  # ahead and no spot: wait, then ask again

    def review_at_h(self, st: JobState, alloc: Allocation) -> float | None:
        p = self.jobs.get(st.name)
        if p is None or p.latched or p.spot is None or alloc.decision is not p.on_demand or not st.deadline_h:
            return None
        start_h = alloc.start_h + alloc.provisioning_s / 3600.0
        return self._catch_up_h(st, p, start_h, alloc.samples_saved)

    def review(self, st: JobState, planner: CachedPlanner, now_h: float, alloc: Allocation) -> Review | None:
        p = self.jobs[st.name]
        if p.latched or p.spot is None:
            return None
        if alloc.samples_done >= self.expected(st, now_h + 2 * p.changeover_h):
            return Review(move=p.spot)
        again = self._catch_up_h(st, p, now_h, alloc.samples_done)
        return None if again is None else Review(again_h=max(again, now_h + MIN_REVIEW_H))

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
