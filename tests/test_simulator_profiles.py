"""The operator's learning in the simulator: performance profiles (the simulated operator records a
finished run through the operator's own ``measure_run`` and ``ProfileStore``, and the next run of the
same workload plans with it) and the contingency's move to the planner's fallback."""

from __future__ import annotations

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import load_catalog
from gpuscaler.planner import plan
from gpuscaler.planner.correction import plan_option
from gpuscaler.simulator import CachedPlanner, CloudModel, ThroughputTruth, Trace, TraceJob, simulate
from gpuscaler.simulator.observing import ObserveRules, decide_move
from gpuscaler.simulator.planning import strip_deadline
from gpuscaler.simulator.strategies import Decision, Gpuscaler

CATALOG = load_catalog()
QUIET = CloudModel(interruption_scale=0.0, shortage_scale=0.0, provisioning_jitter=0.0)
SPEC = TrainingJobSpec.model_validate({
    "workload": {"model": "efficientnet-b0"}, "globalBatch": 1024, "training": {"epochs": 30},
    "maxDuration": "6h", "constraints": {"providers": ["aws"]},
})


def _nightly(n: int) -> Trace:
    return Trace("nightly", tuple(TraceJob(f"run-{k}", 24.0 * k, SPEC) for k in range(n)))


def _width(c: object) -> float:
    band = c.band  # type: ignore[attr-defined]
    assert band is not None
    return (band.p90 - band.p10) / band.p50


def test_the_next_run_plans_from_the_first_runs_profile() -> None:
    """Issue 36's profile target in the simulator: after a job's first run, the next run's P10-P90
    band is at most half as wide and its predicted hours within 10% of the measured ones, in a world
    15% slower than the model on that GPU type."""
    first = plan(strip_deadline(SPEC), CATALOG, name="x", deadline_h=6.0).chosen
    assert first is not None
    truth = ThroughputTruth(fixed={first.instance.gpu_id: 0.85})
    strategy = Gpuscaler()
    res = simulate(_nightly(3), strategy, CachedPlanner(CATALOG), QUIET, truth=truth)
    one, two, three = res.outcomes
    assert one.throughput_source == "model" and one.profiled
    assert two.throughput_source.startswith("measured in 1 run") and two.profiled
    assert three.throughput_source.startswith("measured in 2 runs")
    assert two.completion_h is not None and one.completion_h is not None
    # The model's plan was 15% too optimistic; the profile's plan is within 10% of what happened.
    assert abs(one.predicted_hours - one.completion_h) / one.completion_h > 0.10
    assert abs(two.predicted_hours - two.completion_h) / two.completion_h <= 0.10
    # The band of the same configuration, with the profile and without: at most half as wide.
    store = strategy.profiles
    assert store is not None and len(store) >= 1
    with_profile = plan(strip_deadline(SPEC), CATALOG, name="x", deadline_h=6.0, profiles=store).chosen
    assert with_profile is not None and with_profile.prior is not None and with_profile.prior.exact
    model = next(c for c in plan(strip_deadline(SPEC), CATALOG, name="x").feasible
                 if (c.instance.name, c.nodes, c.capacity, c.precision, c.micro_batch)
                 == (with_profile.instance.name, with_profile.nodes, with_profile.capacity, with_profile.precision,
                     with_profile.micro_batch))
    assert _width(with_profile) <= 0.5 * _width(model)
    assert with_profile.estimate.throughput / model.estimate.throughput == pytest.approx(0.85, rel=0.05)


def test_without_profiles_every_run_starts_from_the_model() -> None:
    strategy = Gpuscaler(profiles=False)
    assert strategy.name == "gpuscaler-no-profiles"
    res = simulate(_nightly(2), strategy, CachedPlanner(CATALOG), QUIET, truth=ThroughputTruth(0.3, 1))
    assert [o.throughput_source for o in res.outcomes] == ["model", "model"]
    assert not any(o.profiled for o in res.outcomes)


def test_a_run_too_short_to_measure_leaves_no_profile() -> None:
    """measure_run's checks hold in the simulator too: a run shorter than the warm-up plus the
    window records nothing."""
    tiny = SPEC.model_copy(update={"training": SPEC.training.model_copy(update={"epochs": None, "samples": 2048.0})})
    strategy = Gpuscaler()
    out = simulate(Trace("t", (TraceJob("tiny", 0.0, tiny),)), strategy, CachedPlanner(CATALOG), QUIET).outcomes[0]
    assert out.status == "finished" and not out.profiled
    assert strategy.profiles is not None and len(strategy.profiles) == 0


def test_the_simulated_operator_moves_to_the_contingency_fallback_as_the_operator_does() -> None:
    """decide_move is the operator's should_replan with the planner's fallback: behind, with no plan
    meeting the risk, the move is to the fallback; not when the job already runs on it."""
    result = plan(strip_deadline(SPEC), CATALOG, name="x", deadline_h=6.0)
    assert result.chosen is not None and result.fallback is not None
    running = result.chosen
    fb = Decision(result.fallback, result.fallback.outlook.interval_s, handshake=True)
    current = plan_option(running)
    rules = ObserveRules.operator_defaults()
    moved = decide_move(0.5, 0.05, current, None, rules, fb)
    assert moved.replan and moved.fallback
    assert not decide_move(0.5, 0.05, plan_option(result.fallback), None, rules, fb).replan  # already on it
    assert not decide_move(0.01, 0.05, current, None, rules, fb).replan  # not behind
