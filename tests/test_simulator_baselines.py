"""Each careful baseline's rule on small hand-made cases: what it does, exactly when it does it."""

from __future__ import annotations

import math

import pytest

from gpuscaler.api import SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.planner import plan, resolve
from gpuscaler.simulator import CachedPlanner, CloudModel, Trace, TraceJob, simulate
from gpuscaler.simulator.allocation import Allocation
from gpuscaler.simulator.baselines import (
    RESTART_MARGIN,
    ManagedSpot,
    ManagedSpotPadded,
    ManagedSpotPaddedCorrection,
    OnDemandBest,
    UniformProgress,
)
from gpuscaler.simulator.planning import changeover_s, p90_factor, strip_deadline, with_remaining
from gpuscaler.simulator.strategies import JobState
from gpuscaler.simulator.truth import ThroughputTruth

CATALOG = load_catalog()
PLANNER = CachedPlanner(CATALOG)
QUIET = CloudModel(interruption_scale=0.0, shortage_scale=0.0, provisioning_jitter=0.0)


def _spec(hours: str = "40h", **kw: object) -> TrainingJobSpec:
    base: dict[str, object] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 20},
                               "maxDuration": hours, "constraints": {"providers": ["aws"]}}
    base.update(kw)
    return TrainingJobSpec.model_validate(base)


def _state(spec: TrainingJobSpec, deadline_h: float | None = 40.0) -> JobState:
    total = resolve(spec, CATALOG, "job", deadline_h).total_samples
    return JobState("job", spec, 0.0, deadline_h, total, total)


def _all_feasible(spec: TrainingJobSpec) -> list:  # type: ignore[type-arg]
    return plan(strip_deadline(spec), CATALOG, name="job").feasible


# ------------------------------------------------------------------------------------ ondemand-best


def test_ondemand_best_is_the_planners_cheapest_on_demand_plan() -> None:
    spec = _spec("12h")
    st = _state(spec, 12.0)
    d = OnDemandBest().initial(st, PLANNER, 0.0)
    assert d is not None and d.candidate.capacity is CapacityType.ON_DEMAND and not d.handshake
    expected = plan(strip_deadline(with_remaining(spec, spot=SpotPolicy.NEVER)), CATALOG, name="job",
                    deadline_h=12.0).chosen
    assert expected is not None and d.candidate.label == expected.label
    # Among every on-demand plan that meets the deadline by the planner's risk (model error included).
    feasible = plan(strip_deadline(spec), CATALOG, name="job", deadline_h=12.0).feasible
    on_demand = [c for c in feasible if c.capacity is CapacityType.ON_DEMAND]
    assert all(c.outlook.deadline_miss_probability <= spec.constraints.max_deadline_risk for c in on_demand)
    assert d.candidate.expected_cost_usd == pytest.approx(min(c.expected_cost_usd for c in on_demand))


def test_ondemand_best_takes_the_next_offering_after_a_capacity_error() -> None:
    st = _state(_spec("12h"), 12.0)
    s = OnDemandBest()
    first = s.initial(st, PLANNER, 0.0)
    assert first is not None
    st.unavailable[(first.candidate.instance.name, "on-demand")] = 1.0
    nxt = s.after_shortage(st, PLANNER, 0.1)
    assert nxt is not None and nxt.candidate.instance.name != first.candidate.instance.name
    assert nxt.candidate.capacity is CapacityType.ON_DEMAND


# ------------------------------------------------------------------------------------ managed-spot


def test_managed_spot_takes_the_cheapest_uninterrupted_spot_plan_that_fits() -> None:
    spec = _spec("10h")
    st = _state(spec, 10.0)
    d = ManagedSpot().initial(st, PLANNER, 0.0)
    assert d is not None and d.candidate.capacity is CapacityType.SPOT and not d.handshake
    fits = [c for c in _all_feasible(spec) if c.capacity is CapacityType.SPOT and c.outlook.base_hours <= 10.0]
    best = min(fits, key=lambda c: c.outlook.base_hours * c.usd_per_hour)
    assert d.candidate.label == best.label
    assert d.interval_s == pytest.approx(best.outlook.interval_s)  # Young/Daly at the planner's rate


def test_managed_spot_fails_over_on_a_capacity_error() -> None:
    st = _state(_spec("10h"), 10.0)
    s = ManagedSpot()
    first = s.initial(st, PLANNER, 0.0)
    assert first is not None
    st.unavailable[(first.candidate.instance.name, "spot")] = 1.0  # what the engine records on the error
    nxt = s.after_shortage(st, PLANNER, 0.05)
    assert nxt is not None and nxt.candidate.capacity is CapacityType.SPOT
    assert nxt.candidate.instance.name != first.candidate.instance.name
    # In the engine: spot capacity of the first choice never there -> the job runs elsewhere.
    cloud = CloudModel(interruption_scale=0.0, provisioning_jitter=0.0, ondemand_shortage=0.0, spot_shortage=0.0,
                       shortage_overrides={first.candidate.instance.name: {"spot": 1.0}})
    out = simulate(Trace("t", (TraceJob("job", 0.0, _spec("10h")),)), ManagedSpot(), PLANNER, cloud).outcomes[0]
    assert out.shortages == 1 and out.status == "finished"
    assert [s.instance for s in out.segments] == [nxt.candidate.instance.name]


def test_managed_spot_goes_on_demand_when_no_spot_plan_fits() -> None:
    spec = _spec("10h")
    fastest_spot = min(c.outlook.base_hours for c in _all_feasible(spec) if c.capacity is CapacityType.SPOT)
    st = _state(_spec(f"{fastest_spot * 0.9 * 60:.0f}m"), fastest_spot * 0.9)
    d = ManagedSpot().initial(st, PLANNER, 0.0)
    assert d is not None and d.candidate.capacity is CapacityType.ON_DEMAND


# ----------------------------------------------------------------------------- managed-spot-padded


def test_managed_spot_padded_pads_the_uninterrupted_time_once_by_the_p90_factor() -> None:
    spec = _spec("10h")
    st = _state(spec, 10.0)
    d = ManagedSpotPadded().initial(st, PLANNER, 0.0)
    assert d is not None and d.candidate.capacity is CapacityType.SPOT and not d.handshake
    spot = [c for c in _all_feasible(spec) if c.capacity is CapacityType.SPOT]
    c0 = spot[0]
    assert c0.band is not None and p90_factor(c0) == pytest.approx(c0.band.p50 / c0.band.p10)
    fits = [c for c in spot if c.outlook.base_hours * p90_factor(c) <= 10.0]
    assert d.candidate.label == min(fits, key=lambda c: c.outlook.base_hours * c.usd_per_hour).label
    # A deadline between the padded and the unpadded time of the unpadded choice: the pad changes it.
    plain = ManagedSpot().initial(st, PLANNER, 0.0)
    assert plain is not None
    between = plain.candidate.outlook.base_hours * (1 + p90_factor(plain.candidate)) / 2
    st2 = _state(_spec(f"{between * 60:.0f}m"), round(between * 60) / 60)
    padded = ManagedSpotPadded().initial(st2, PLANNER, 0.0)
    unpadded = ManagedSpot().initial(st2, PLANNER, 0.0)
    assert padded is not None and unpadded is not None and padded.candidate.label != unpadded.candidate.label
    assert padded.candidate.outlook.base_hours * p90_factor(padded.candidate) <= st2.deadline_h  # type: ignore[operator]


def test_managed_spot_padded_pads_the_rest_once_after_a_reclaim() -> None:
    """After a reclaim the rest is planned with the pad applied once to its own time: padding the
    rest's time again with the first pad would refuse a plan this accepts."""
    spec = _spec("10h")
    st = _state(spec, 10.0)
    s = ManagedSpotPadded()
    first = s.initial(st, PLANNER, 0.0)
    assert first is not None
    st.remaining_samples = st.total_samples * 0.5
    st.interruptions = 1
    again = s.after_interruption(st, PLANNER, 5.0)
    assert again is not None and again.candidate.capacity is CapacityType.SPOT
    pad = p90_factor(again.candidate)
    assert again.candidate.outlook.base_hours * pad <= 5.0
    fits_twice = [c for c in _all_feasible(with_remaining(spec, st.remaining_samples))
                  if c.capacity is CapacityType.SPOT and c.outlook.base_hours * p90_factor(c) ** 2 <= 5.0]
    chosen_twice = min(fits_twice, key=lambda c: c.outlook.base_hours * c.usd_per_hour, default=None)
    assert chosen_twice is None or (chosen_twice.outlook.base_hours * chosen_twice.usd_per_hour
                                    >= again.candidate.outlook.base_hours * again.candidate.usd_per_hour)


def test_managed_spot_padded_goes_on_demand_by_the_padded_rule_when_no_spot_fits() -> None:
    spec = _spec("10h")
    spot_fast = min(c.outlook.base_hours * p90_factor(c) for c in _all_feasible(spec)
                    if c.capacity is CapacityType.SPOT)
    hours = spot_fast * 0.98
    st = _state(_spec(f"{hours * 60:.0f}m"), round(hours * 60) / 60)
    d = ManagedSpotPadded().initial(st, PLANNER, 0.0)
    assert d is not None and d.candidate.capacity is CapacityType.ON_DEMAND
    left = st.deadline_h
    assert left is not None
    od = [c for c in _all_feasible(spec) if c.capacity is CapacityType.ON_DEMAND
          and c.outlook.base_hours * p90_factor(c) <= left]
    if od:
        assert d.candidate.label == min(od, key=lambda c: c.outlook.base_hours * c.usd_per_hour).label


def test_managed_spot_padded_with_correction_moves_off_a_slow_gpu_type() -> None:
    """The ablation corrects as the operator does: on a GPU type at half the model's speed, a deadline
    at the padded time is missed by the plain padded baseline; with the correction loop the rest moves
    to a faster plan at a checkpoint and the deadline is met."""
    first = ManagedSpotPadded().initial(_state(_spec("10h"), 10.0), PLANNER, 0.0)
    assert first is not None
    minutes = math.floor(first.candidate.outlook.base_hours * p90_factor(first.candidate) * 60 + 1)
    spec = _spec(f"{minutes}m")
    chosen = ManagedSpotPadded().initial(_state(spec, minutes / 60), PLANNER, 0.0)
    assert chosen is not None and chosen.candidate.label == first.candidate.label
    truth = ThroughputTruth(0.0, 0, fixed={first.candidate.instance.gpu_id: 0.5})
    trace = Trace("t", (TraceJob("job", 0.0, spec),))
    plain = simulate(trace, ManagedSpotPadded(), PLANNER, QUIET, truth=truth).outcomes[0]
    fixed = simulate(trace, ManagedSpotPaddedCorrection(), PLANNER, QUIET, truth=truth).outcomes[0]
    assert plain.corrections == 0 and plain.moves == 0 and plain.missed_deadline
    assert fixed.corrections >= 1 and fixed.moves >= 1 and fixed.status == "finished"
    assert not fixed.missed_deadline and not any(seg.interrupted for seg in fixed.segments)


# --------------------------------------------------------------------------------- uniform-progress


@pytest.fixture
def up() -> tuple[UniformProgress, JobState]:
    s = UniformProgress()
    st = _state(_spec("40h"), 40.0)
    d = s.initial(st, PLANNER, 0.0)
    twins = s.jobs["job"]
    assert d is twins.spot and twins.spot is not None and twins.on_demand is not None and not twins.latched
    assert twins.spot.candidate.capacity is CapacityType.SPOT
    assert twins.on_demand.candidate.capacity is CapacityType.ON_DEMAND
    # The same configuration on both capacity types.
    a, b = twins.spot.candidate, twins.on_demand.candidate
    assert (a.instance.name, a.nodes, a.precision, a.micro_batch) == (b.instance.name, b.nodes, b.precision, b.micro_batch)
    st.current = d
    return s, st


def test_uniform_progress_goes_on_demand_exactly_when_behind_the_line(up: tuple[UniformProgress, JobState]) -> None:
    s, st = up
    twins = s.jobs["job"]
    st.remaining_samples = st.total_samples * 0.6  # 40% done: on the line at 16 h of 40
    assert s.after_shortage(st, PLANNER, 16.0 - 1e-6) is twins.spot  # ahead, no spot: wait for it
    assert s.after_shortage(st, PLANNER, 16.0 + 1e-6) is twins.on_demand  # behind: on-demand
    assert not twins.latched  # rule 1, not the safety net


def test_uniform_progress_takes_risks_on_spot_even_when_behind(up: tuple[UniformProgress, JobState]) -> None:
    s, st = up
    st.remaining_samples = st.total_samples * 0.9  # 10% done at 20 h: far behind the line
    assert s.after_interruption(st, PLANNER, 20.0) is s.jobs["job"].spot


def test_uniform_progress_safety_net_fires_exactly_when_the_slack_reaches_the_changeover_delay(
        up: tuple[UniformProgress, JobState]) -> None:
    s, st = up
    twins = s.jobs["job"]
    assert twins.on_demand is not None and twins.spot is not None
    # d = the longest restart + one checkpoint interval lost + one write, nothing more.
    spot = twins.spot.candidate
    d_s = st.spec.checkpoint.restart_seconds * RESTART_MARGIN + spot.outlook.interval_s + spot.checkpoint_write_s
    assert twins.changeover_h * 3600 == pytest.approx(d_s) == changeover_s(spot, 300 * RESTART_MARGIN)
    st.remaining_samples = st.total_samples * 0.5
    # C(t): the twin's compute for the rest at its rate, with its checkpoint writes.
    od = twins.on_demand
    work_s = 0.5 * st.total_samples / od.candidate.estimate.throughput
    assert od.interval_s is not None
    c_h = (work_s + work_s / od.interval_s * od.candidate.checkpoint_write_s) / 3600
    assert s.compute_h(st, od) == pytest.approx(c_h)
    # R(t) - C(t) = d exactly: on-demand to the end; a second sooner (slack above d): spot.
    t = 40.0 - (c_h + twins.changeover_h)
    assert s.after_interruption(st, PLANNER, t - 1 / 3600) is twins.spot and not twins.latched
    assert s.after_interruption(st, PLANNER, t) is twins.on_demand and twins.latched
    st.remaining_samples = st.total_samples * 0.01  # far ahead now, but it stays
    assert s.after_interruption(st, PLANNER, t + 1.0) is twins.on_demand


def test_uniform_progress_safety_net_leaves_spot_when_the_slack_reaches_d(up: tuple[UniformProgress, JobState]) -> None:
    """On spot, the net is watched too: a review no sooner than the slack could reach d, and a move to
    on-demand (a checkpoint now) once it has."""
    s, st = up
    twins = s.jobs["job"]
    assert twins.on_demand is not None and twins.spot is not None
    done = 0.5 * st.total_samples
    slack = s.slack_h(st, twins, 20.0, done)
    c_h = s.compute_h(st, twins.on_demand, done)
    assert slack == pytest.approx(20.0 - c_h) and c_h > 0.5 * st.total_samples / twins.on_demand.candidate.estimate.throughput / 3600

    def on_spot(samples: float) -> Allocation:
        return Allocation(twins.spot, 1.0, 60.0, samples, samples * 0.9, st.total_samples, 0.0)  # type: ignore[arg-type]

    look = s.review(st, PLANNER, 20.0, on_spot(done))
    assert look is not None and look.move is None and look.again_h == pytest.approx(20.0 + slack - twins.changeover_h)
    t = 40.0 - c_h - twins.changeover_h  # slack = d exactly
    leave = s.review(st, PLANNER, t, on_spot(done))
    assert leave is not None and leave.move is twins.on_demand and not leave.at_checkpoint and twins.latched


def test_uniform_progress_subtracts_nothing_up_front() -> None:
    """A job due in 4 h whose spot plan fits with d to spare runs on spot (the rule before issue 36
    took 4.17 h off every deadline first and ran it wholly on-demand)."""
    spec = _spec("4h", workload={"model": "bert-large-squad"}, globalBatch=32, training={"epochs": 2})
    st = _state(spec, 4.0)
    s = UniformProgress()
    d = s.initial(st, PLANNER, 0.0)
    assert d is not None and d.candidate.capacity is CapacityType.SPOT and not s.jobs["job"].latched
    assert d.candidate.outlook.base_hours + s.jobs["job"].changeover_h <= 4.0
    fits = [c for c in _all_feasible(spec) if c.capacity is CapacityType.SPOT
            and c.outlook.base_hours + changeover_s(c, 300 * RESTART_MARGIN) / 3600 <= 4.0]
    assert d.candidate.label == min(fits, key=lambda c: c.outlook.base_hours * c.usd_per_hour).label
    # With no spot plan that fits with d to spare: on-demand from the start, the net latched.
    tight = min(c.outlook.base_hours for c in fits) + 1 / 60
    st2 = _state(_spec(f"{tight * 60:.0f}m", workload={"model": "bert-large-squad"}, globalBatch=32,
                       training={"epochs": 2}), round(tight * 60) / 60)
    s2 = UniformProgress()
    d2 = s2.initial(st2, PLANNER, 0.0)
    assert d2 is not None and d2.candidate.capacity is CapacityType.ON_DEMAND and s2.jobs["job"].latched


def test_uniform_progress_fails_over_across_spot_offerings(up: tuple[UniformProgress, JobState]) -> None:
    s, st = up
    first = s.jobs["job"]
    assert first.spot is not None
    st.unavailable[(first.spot.candidate.instance.name, "spot")] = 1.0  # the engine records the error
    st.remaining_samples = st.total_samples * 0.99  # ahead of the line at 0.05 h: the next spot offering
    nxt = s.after_shortage(st, PLANNER, 0.05)
    assert nxt is not None and nxt.candidate.capacity is CapacityType.SPOT
    assert nxt.candidate.instance.name != first.spot.candidate.instance.name
    twins = s.jobs["job"]
    assert nxt is twins.spot and twins.on_demand is not None
    assert twins.on_demand.candidate.instance.name == nxt.candidate.instance.name  # its own twin


def test_uniform_progress_hysteresis_leaves_on_demand_past_ep_t_plus_2d(up: tuple[UniformProgress, JobState]) -> None:
    s, st = up
    twins = s.jobs["job"]
    assert twins.on_demand is not None and twins.spot is not None
    st.current = twins.on_demand
    t = 10.0
    line = s.expected(st, t + 2 * twins.changeover_h)
    assert line == pytest.approx(st.total_samples * (t + 2 * twins.changeover_h) / 40.0)

    def at(done: float) -> Allocation:
        return Allocation(twins.on_demand, 8.0, 60.0, done, done, st.total_samples, 0.0)  # type: ignore[arg-type]

    stay = s.review(st, PLANNER, t, at(line * 0.99))
    assert stay is not None and stay.move is None and stay.again_h is not None and stay.again_h > t
    leave = s.review(st, PLANNER, t, at(line))
    assert leave is not None and leave.move is twins.spot and not leave.at_checkpoint


def test_uniform_progress_in_the_engine_follows_the_line_without_spot() -> None:
    """No spot capacity at all: on-demand whenever behind the line, off it (hysteresis) when ahead by
    2d, waiting for spot in between; it finishes within the deadline."""
    cloud = CloudModel(interruption_scale=0.0, provisioning_jitter=0.0, ondemand_shortage=0.0, spot_shortage=1.0)
    s = UniformProgress()
    out = simulate(Trace("t", (TraceJob("job", 0.0, _spec("40h")),)), s, PLANNER, cloud).outcomes[0]
    assert out.status == "finished" and not out.missed_deadline
    assert all(seg.capacity is CapacityType.ON_DEMAND for seg in out.segments)
    assert len(out.segments) > 3 and out.moves == len(out.segments) - 1 and out.shortages >= len(out.segments)
    st = _state(_spec("40h"), 40.0)
    d = s.jobs["job"].changeover_h
    done = 0.0
    for seg in out.segments:
        # on-demand only when behind, or at the end for the safety net
        assert done < s.expected(st, seg.start_h) or (seg is out.segments[-1] and s.jobs["job"].latched)
        done += seg.samples
        if seg is not out.segments[-1]:  # left when ahead of ep(t + 2d), t before the last write
            assert done >= s.expected(st, seg.end_h - seg.write_s / 3600 + 2 * d) * (1 - 1e-9)


def test_uniform_progress_net_leaves_a_twin_too_slow_to_finish() -> None:
    """The model is 40% optimistic on the twin's GPU type and spot never comes: on the twin, the job's
    progress shows within a quarter of an hour that the slack is gone, the net fires, and since the
    twin itself cannot finish in time, the rest goes to the planner's on-demand plan (rescued)."""
    probe = UniformProgress()
    st = _state(_spec("40h"), 40.0)
    assert probe.initial(st, PLANNER, 0.0) is not None
    twins = probe.jobs["job"]
    assert twins.spot is not None and twins.on_demand is not None
    hours = twins.spot.candidate.outlook.base_hours + twins.changeover_h + 0.5
    spec = _spec(f"{hours * 60:.0f}m")
    truth = ThroughputTruth(fixed={twins.spot.candidate.instance.gpu_id: 0.6})
    cloud = CloudModel(interruption_scale=0.0, provisioning_jitter=0.0, ondemand_shortage=0.0, spot_shortage=1.0)
    s = UniformProgress()
    out = simulate(Trace("t", (TraceJob("job", 0.0, spec),)), s, PLANNER, cloud, truth=truth).outcomes[0]
    p = s.jobs["job"]
    assert p.latched and p.rescued and out.status == "finished"
    first, second = out.segments[0], out.segments[1]
    assert first.capacity is CapacityType.ON_DEMAND and first.instance == twins.on_demand.candidate.instance.name
    assert first.end_h - first.start_h <= 0.5  # a quarter of an hour of training, then the move
    assert p.on_demand is not None and second.capacity is CapacityType.ON_DEMAND
    assert (second.instance, second.nodes) != (first.instance, first.nodes)
