"""Each careful baseline's rule on small hand-made cases: what it does, exactly when it does it."""

from __future__ import annotations

import pytest

from gpuscaler.api import SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.planner import plan, resolve
from gpuscaler.simulator import CachedPlanner, CloudModel, Trace, TraceJob, simulate
from gpuscaler.simulator.allocation import Allocation
from gpuscaler.simulator.baselines import ManagedSpot, OnDemandBest, UniformProgress
from gpuscaler.simulator.planning import strip_deadline, with_remaining
from gpuscaler.simulator.strategies import JobState

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


def test_uniform_progress_safety_net_latches_on_demand(up: tuple[UniformProgress, JobState]) -> None:
    s, st = up
    twins = s.jobs["job"]
    assert twins.on_demand is not None
    compute_h = st.total_samples / twins.on_demand.candidate.estimate.throughput / 3600
    st.remaining_samples = st.total_samples * 0.5
    # R(t) = C(t) + 2d exactly: not yet; a minute later: on-demand to the end.
    t = 40.0 - (0.5 * compute_h + 2 * twins.changeover_h)
    assert s.after_interruption(st, PLANNER, t - 1e-6) is twins.spot
    assert s.after_interruption(st, PLANNER, t + 1 / 60) is twins.on_demand and twins.latched
    st.remaining_samples = st.total_samples * 0.01  # far ahead now, but it stays
    assert s.after_interruption(st, PLANNER, t + 1.0) is twins.on_demand


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
