"""Deadline risk with recourse: the bound holds, it never raises the risk, and one rule moves a late job.

The figures of :mod:`gpuscaler.planner.contingency` are upper bounds on the miss probability of the
world they describe (a true speed ``f`` around the prediction, a noisy measurement, a move to the
fallback from a checkpoint asked for when the correction is known); a Monte Carlo of that world, with the fallback's error
independent of the plan's, the same draw, or as correlated as the model's errors, must land under them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cli import plan_to_dict, render_plan
from gpuscaler.perfmodel.uncertainty import error_correlation
from gpuscaler.planner import contingency, plan, recover, recovery
from gpuscaler.planner.contingency import Recourse, RecourseTiming, fallback
from gpuscaler.planner.correction import PlanOption, should_replan
from gpuscaler.planner.evaluate import STARTUP_S
from gpuscaler.planner.planner import Candidate, PlanResult

CAT = load_catalog()
ON_DEMAND_RESNET: dict[str, Any] = {
    "workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 10}, "constraints": {"spot": "never"},
}  # fmt: skip


def spec(**kw: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({**ON_DEMAND_RESNET, **kw})


RESTART_S = 300.0
"""The spec's default ``checkpoint.restartSeconds``, which the planner passes."""


def static_of(c: Candidate) -> Candidate:
    """The plan as it was before its contingency (the risk without recourse)."""
    assert c.contingency is not None
    o = c.outlook._replace(deadline_miss_probability=c.contingency.static_miss_probability)
    return c._replace(outlook=o, contingency=None)


def all_plans(result: PlanResult) -> list[Candidate]:
    seen = {id(c): c for c in [*result.feasible, *result.pareto]}
    return list(seen.values())


@pytest.mark.parametrize("deadline_h", [0.6, 1.5, 3.0, 4.0, 6.0, 8.0, 12.0, 30.0])
@pytest.mark.parametrize("spot", ["never", "allowed"])
def test_recourse_never_raises_the_risk_above_the_static_figure(deadline_h: float, spot: str) -> None:
    result = plan(spec(constraints={"spot": spot}), CAT, deadline_h=deadline_h)
    plans = all_plans(result)
    assert plans
    for c in plans:
        k = c.contingency
        assert k is not None
        assert k.miss_probability <= k.static_miss_probability + 1e-15, c.label
        assert c.outlook.deadline_miss_probability == k.miss_probability
        assert k.extra_cost_usd >= 0.0
        assert c.expected_cost_usd == pytest.approx(c.outlook.expected_hours * c.usd_per_hour + k.extra_cost_usd)


def test_a_risky_plan_with_a_safe_fallback_becomes_feasible() -> None:
    """8 h for ten ResNet-50 epochs on-demand: the single A10G's static P(miss) is about 10% (over the 5%
    limit); the 8 x A100 fallback finishes in under half an hour, so measuring and moving makes it safe."""
    result = plan(spec(), CAT, deadline_h=8.0)
    rescued = [c for c in result.feasible if c.contingency and c.contingency.static_miss_probability > 0.05]
    assert rescued, "no plan over the static limit was made feasible by its contingency"
    for c in rescued:
        k = c.contingency
        assert k is not None and k.applies and k.target is not None and result.fallback is not None
        assert k.target.label == result.fallback.label
        assert k.miss_probability <= 0.05 < k.static_miss_probability
        assert 0.0 < k.move_probability < 1.0
        assert k.move_h < k.slack_h
        # the move starts from a checkpoint the operator asks for when it decides, not the next periodic one
        assert k.move_h == pytest.approx(k.decide_h + (contingency.TIMING.request_s + c.checkpoint_write_s) / 3600.0)
        assert k.move_h < k.decide_h + c.outlook.interval_s / 3600.0


def test_a_window_longer_than_the_slack_gains_nothing() -> None:
    """The same risky plans with a correction that comes only after the slack: no recourse, the static risk."""
    result = plan(spec(), CAT, deadline_h=8.0)
    risky = [c for c in result.feasible if c.contingency and c.contingency.static_miss_probability > 0.05]
    assert risky
    for c in risky:
        k = c.contingency
        assert k is not None
        slow = RecourseTiming(min_interval_s=(k.slack_h + 0.5) * 3600.0)
        late = Recourse(result.fallback, deadline_h=8.0, max_risk=0.05, restart_s=RESTART_S, startup_s=STARTUP_S,
                        timing=slow).of(static_of(c))  # fmt: skip
        assert late.move_h > late.slack_h
        assert not late.applies and "longer than the slack" in late.reason
        assert late.miss_probability == late.static_miss_probability == k.static_miss_probability
        assert late.extra_cost_usd == 0.0


def test_the_fallback_moves_to_another_gpu_type_or_gains_nothing() -> None:
    """The fallback, measured slow, goes where the corrected planner's fallback then is: the fastest plan
    on another GPU type (its measurement corrects its own type's plans), and only once it is slower than
    that plan's prediction; with no plan on another GPU type it has no recourse. A plan expected to miss
    gains nothing either."""
    result = plan(spec(), CAT, deadline_h=3.0)
    fb = result.fallback
    assert fb is not None and fb.contingency is not None
    k = fb.contingency
    assert k.target is not None and k.target.instance.gpu_id != fb.instance.gpu_id, k.target
    assert k.miss_probability <= k.static_miss_probability
    # it moves only when measured slower than the alternate's predicted speed: the threshold is at most
    # the throughput at which the two finish together
    even = fb.estimate.throughput * (fb.outlook.base_hours - STARTUP_S / 3600.0) / (
        k.target.outlook.base_hours - STARTUP_S / 3600.0)
    assert k.threshold <= even * (1 + 1e-9)
    alone = plan(spec(constraints={"spot": "never", "instanceTypes": [fb.instance.name]}), CAT, deadline_h=3.0).fallback
    assert alone is not None and alone.contingency is not None
    assert not alone.contingency.applies and alone.contingency.reason == contingency.ITSELF
    hopeless = plan(spec(), CAT, deadline_h=0.2).pareto
    assert hopeless
    for c in hopeless:
        if c.contingency is not None and c.expected_hours > 0.2:
            assert c.contingency.miss_probability == c.contingency.static_miss_probability


def monte_carlo(c: Candidate, target: Candidate, k: contingency.Contingency, deadline_h: float, max_risk: float,
                restart_s: float, correlated: str, n: int = 400_000) -> float:
    """P(miss) of the world the contingency describes (on-demand, no interruptions), by sampling; the
    fallback's error independent of the plan's, the same draw, or correlated as the model's errors are."""
    rng = np.random.default_rng(7)
    s, s_obs = c.outlook.log_sigma, contingency.TIMING.measured_log_sigma
    f = np.exp(rng.normal(0.0, s, n))
    f_hat = f * np.exp(rng.normal(0.0, s_obs, n))
    startup = STARTUP_S / 3600.0
    run = c.outlook.expected_hours - startup
    stays = f_hat >= k.threshold / c.estimate.throughput
    stay_miss = startup + run / f > deadline_h
    s_t = target.outlook.log_sigma
    rho = {"independent": 0.0, "same draw": 1.0}.get(
        correlated, error_correlation(c.instance.gpu_id, c.precision, target.instance.gpu_id, target.precision))
    f_t = f ** (rho * s_t / s) * np.exp(rng.normal(0.0, s_t * math.sqrt(1.0 - rho * rho), n))
    overhead = (c.checkpoint_write_s + restart_s + STARTUP_S) / 3600.0
    done = np.clip((k.move_h - startup) * f / (c.outlook.base_hours - startup), 0.0, 1.0)
    move_finish = k.move_h + overhead + (1.0 - done) * (target.outlook.base_hours - startup) / f_t
    miss = np.where(stays, stay_miss, move_finish > deadline_h)
    return float(miss.mean())


@pytest.mark.parametrize("correlated", ["independent", "same draw", "as the model's errors"])
def test_the_figure_bounds_a_monte_carlo_of_the_same_world(correlated: str) -> None:
    deadline_h, risk, restart = 8.0, 0.05, RESTART_S
    result = plan(spec(), CAT, deadline_h=deadline_h)
    target = result.fallback
    assert target is not None
    checked = 0
    for c in result.feasible:
        k = c.contingency
        if k is None or not k.applies or k.static_miss_probability < 0.02:
            continue
        mc = monte_carlo(c, target, k, deadline_h, risk, restart, correlated)
        se = math.sqrt(max(mc * (1 - mc), 1e-6) / 400_000)
        assert mc <= k.miss_probability + 4 * se, (c.label, mc, k.miss_probability)
        checked += 1
    assert checked >= 3


def test_the_plan_shows_its_contingency_in_text_and_json() -> None:
    result = plan(spec(), CAT, deadline_h=8.0)
    c = result.chosen
    assert c is not None and c.contingency is not None
    text = render_plan(result)
    assert "contingency: if the first 30 min measure below" in text
    assert f"move to {result.fallback.label}" in text if result.fallback is not None else False
    data = plan_to_dict(result)["chosen"]["contingency"]
    assert data["moveTo"]["instanceType"] == c.contingency.target.instance.name  # type: ignore[union-attr]
    assert data["deadlineMissProbability"] == round(c.outlook.deadline_miss_probability, 4)
    assert data["expectedExtraCostUsd"] == round(c.contingency.extra_cost_usd, 2)
    assert plan_to_dict(result)["chosen"]["expectedCostUsd"] == round(c.expected_cost_usd, 2)


def test_one_rule_moves_a_late_job_in_the_planner_the_recovery_and_the_correction() -> None:
    """The planner's contingency target, the recovery's fastest-sensible plan and the operator's
    correction move are the one function :func:`gpuscaler.planner.contingency.fallback`."""
    assert recovery.fastest_sensible is contingency.fallback
    calls: list[int] = []
    real = contingency.fallback

    def spy(cands: Any, factor: float = contingency.FALLBACK_COST_FACTOR, besides: Any = None) -> Any:
        calls.append(len(cands))
        return real(cands, factor, besides)

    mp = pytest.MonkeyPatch()
    mp.setattr(contingency, "fallback", spy)
    try:
        result = plan(spec(), CAT, deadline_h=8.0)
        assert calls, "the planner did not ask the contingency's fallback"
        assert result.fallback is not None and result.fallback.capacity is CapacityType.ON_DEMAND
        calls.clear()
        from gpuscaler.planner import Situation

        s = Situation(spec=spec(), total_samples=1e7, done_samples=0.0, interrupted=None, interruptions=0,
                      deadline_h=0.01)  # fmt: skip
        rec = recover(s, lambda sp, dl, un: plan(sp, CAT, deadline_h=dl, unavailable=un))
        assert rec.kind == "fastest" and calls, "the recovery's late-job fallback is not the contingency's"
    finally:
        mp.undo()
    from pathlib import Path

    from gpuscaler.observe import controller as observer
    from gpuscaler.simulator import strategies

    assert "result.fallback" in Path(observer.__file__).read_text()
    assert strategies.recover is recovery.recover


def test_should_replan_moves_to_the_fallback_when_nothing_meets_the_risk() -> None:
    cur = PlanOption(("g5.xlarge", 1, "on-demand", "amp"), "1 x g5.xlarge", 1.0, 8.0, 8.0)
    fb = PlanOption(("p4de.24xlarge", 1, "on-demand", "amp"), "1 x p4de.24xlarge", 40.0, 16.0, 0.4)
    d = should_replan(0.3, 0.05, None, None, fallback=fb)
    assert d.replan and d.fallback and "p4de.24xlarge" in d.reason
    assert not should_replan(0.3, 0.05, None, None).replan
    assert not should_replan(0.3, 0.05, fb, None, fallback=fb).replan  # already on it
    assert not should_replan(0.01, 0.05, cur, cur, fallback=fb).replan  # not behind


def test_fallback_is_the_fastest_within_the_cost_factor_of_the_cheapest() -> None:
    result = plan(spec(), CAT, deadline_h=None)
    front = list(result.pareto)
    fb = fallback(front)
    assert fb is not None
    cheapest = min(c.expected_cost_usd for c in front)
    assert fb.expected_cost_usd <= contingency.FALLBACK_COST_FACTOR * cheapest
    assert all(c.expected_hours >= fb.expected_hours for c in front
               if c.expected_cost_usd <= contingency.FALLBACK_COST_FACTOR * cheapest)  # fmt: skip
    assert fallback([]) is None


def test_one_recourse_per_plan_call_gives_a_fresh_one_s_answer() -> None:
    result = plan(spec(), CAT, deadline_h=8.0)
    first = result.feasible[0].contingency
    assert first is not None
    target = first.target  # the fallback as the planner priced it (before its own contingency)
    assert target is not None and result.fallback is not None and target.label == result.fallback.label
    r = Recourse(target, deadline_h=8.0, max_risk=0.05, restart_s=RESTART_S, startup_s=STARTUP_S)
    for c in result.feasible[:40]:
        static = static_of(c)
        alone = Recourse(target, deadline_h=8.0, max_risk=0.05, restart_s=RESTART_S, startup_s=STARTUP_S).of(static)
        assert r.of(static) == alone == c.contingency


def test_the_operator_s_observer_moves_a_late_job_to_the_fallback_when_nothing_meets_the_risk() -> None:
    """A job measured at half its predicted speed with 1.8 h left: under the corrected model no plan
    meets its 30% risk (the V100 plan's P(miss) is about 49%), so before the contingency the observer
    stayed; now it moves, from a checkpoint it asks for at once, to the contingency's fallback, the V100 plan."""
    from datetime import timedelta

    from correction_helpers import CATALOG, CFG, SPEC, T0, planner, running
    from gpuscaler.observe.controller import JobContext, Observer

    st = running(SPEC)
    assert st.plan is not None and st.plan.gpu_type == "A10G"
    slow = 0.5 * st.plan.throughput
    obs = Observer(None, CFG, CATALOG)
    reasons: list[str] = []
    asked = False
    for s in range(0, 181, 5):
        st.progress.samples = slow * s
        left = 1.8 - s / 3600
        res = obs.step("ns", "j", 1, st, 40, T0 + timedelta(seconds=s), planner(st, left),
                       JobContext(slow * s, left, 0.3, 30))  # fmt: skip
        reasons += [e.reason for e in res.events]
        asked = asked or res.checkpoint_now
    seen = st.observed
    assert seen is not None and "ReplanPending" in reasons, (reasons, seen and seen.replan_reason)
    assert asked  # a move for the deadline: the loop is asked for a checkpoint now
    assert "the contingency moves to the fastest sensible plan" in seen.replan_reason
    left = 1.8 - 185 / 3600
    res = obs.step("ns", "j", 1, st, 50, T0 + timedelta(seconds=185), planner(st, left),
                   JobContext(slow * 185, left, 0.3, 30))  # fmt: skip
    assert res.replan is not None and res.replan.chosen is not None
    assert res.replan.chosen.instance.name == "p3.2xlarge"
    assert res.replan.chosen is res.replan.fallback


def test_the_fallback_widens_only_where_it_makes_a_cheaper_plan_feasible() -> None:
    """``with_fallback``: the 4x fallback is taken when, with it, a plan cheaper than any feasible with the
    2x one meets the job; otherwise the plans keep their 2x contingencies; one fallback is priced once."""
    from types import SimpleNamespace

    cheap, near, far = (SimpleNamespace(name=n, expected_cost_usd=x) for n, x in (("cheap", 1.0), ("near", 2.0), ("far", 4.0)))
    cands: list[Any] = [cheap, near, far]
    targets = {contingency.FALLBACK_COST_FACTOR: near, contingency.WIDER_FALLBACK_COST_FACTOR: far}

    def run(saved_by_far: bool) -> tuple[list[Any], Any, list[str]]:
        priced: list[str] = []

        def attach(target: Any) -> list[Any]:
            priced.append(target.name)
            ok = {"near": {"near", "far"}, "far": {"cheap", "near", "far"} if saved_by_far else {"near", "far"}}
            extra = 0.1 if target is far else 0.05  # a dearer fallback costs every plan more in expectation
            return [SimpleNamespace(name=c.name, expected_cost_usd=c.expected_cost_usd + extra,
                                    feasible=c.name in ok[target.name], target=target.name) for c in cands]  # fmt: skip

        out, fb = contingency.with_fallback(cands, targets.__getitem__, attach, lambda c: c.feasible)
        return out, fb, priced

    out, fb, priced = run(saved_by_far=True)
    assert fb.name == "far" and {c.target for c in out} == {"far"} and out[0].feasible and priced == ["near", "far"]
    out, fb, _ = run(saved_by_far=False)
    assert fb.name == "near" and {c.target for c in out} == {"near"} and not out[0].feasible
    same = {k: near for k in targets}
    priced_once: list[str] = []
    contingency.with_fallback(cands, same.__getitem__, lambda t: priced_once.append(t.name) or list(cands), lambda c: True)
    assert priced_once == ["near"]
