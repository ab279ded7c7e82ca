"""Honest infeasibility: the answer names the rule that binds, each kind, and the plans that come closest."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase
from gpuscaler.catalog import load_catalog
from gpuscaler.cli import plan_to_dict, render_plan
from gpuscaler.names import ConditionType
from gpuscaler.planner import binding, correction, plan, solve
from gpuscaler.planner.binding import Kind, miss_at
from gpuscaler.planner.evaluate import STARTUP_S
from gpuscaler.planner.planner import PlanResult
from gpuscaler.policy import Policy
from loop_harness import World, make_job

CAT = load_catalog()
RESNET: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 10}}


def spec(**kw: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({**RESNET, **kw})


def infeasible(result: PlanResult) -> binding.Binding:
    assert result.chosen is None and result.binding is not None
    assert result.hints[0] == result.binding.message
    return result.binding


def test_risk_binds_when_a_plan_would_probably_meet_the_deadline() -> None:
    """0.22 h for ten ResNet-50 epochs on-demand: the best plan's P(miss) is about 17%, so it would
    probably finish; the 5% limit binds, and the answer says so with the risk to allow and the time to give
    (``atRiskLimit: Refuse``; the default tries a plan instead, test_trial.py)."""
    r = plan(spec(constraints={"spot": "never", "atRiskLimit": "Refuse"}), CAT, deadline_h=0.22)
    b = infeasible(r)
    assert b.kind is Kind.RISK and b.kinds == (Kind.RISK,)
    best = r.closest[0]
    p = best.plan.outlook.deadline_miss_probability
    assert 0.05 < p < 0.5
    assert all(p <= c.plan.outlook.deadline_miss_probability for c in r.closest)
    assert b.message.startswith("the risk limit binds: best plan ")
    assert f"P(miss) {p:.1%} > 5.0%; allow {p:.1%} or give " in b.message
    assert "extend the deadline" not in " ".join(r.hints)
    assert best.more_hours is not None and best.more_hours > 0
    # the time it names is enough, and barely: the same plan meets the limit with it, not much sooner
    target = r.fallback
    later = miss_at(best.plan, 0.22 + best.more_hours, spec(constraints={"spot": "never"}), _pre(target), STARTUP_S)
    assert later <= 0.05
    sooner = miss_at(best.plan, 0.22 + best.more_hours - 0.02, spec(constraints={"spot": "never"}), _pre(target),
                     STARTUP_S)  # fmt: skip
    assert sooner > 0.05
    allowed = plan(spec(constraints={"spot": "never", "maxDeadlineRisk": round(p + 0.001, 3)}), CAT, deadline_h=0.22)
    assert allowed.chosen is not None, "allowing the risk it names makes the job feasible"


def _pre(target: Any) -> Any:
    """The fallback as plans priced it (its own contingency is 'itself', its figures the static ones)."""
    return None if target is None else target._replace(contingency=None)


def test_time_binds_only_when_no_plan_would_probably_make_it() -> None:
    r = plan(spec(), CAT, deadline_h=0.1)
    b = infeasible(r)
    assert b.kind is Kind.TIME
    assert "the deadline binds" in b.message and "extend the deadline by" in b.message
    assert all(c.plan.outlook.deadline_miss_probability >= 0.5 for c in r.closest)
    assert r.closest[0].more_hours is not None and r.closest[0].more_hours > 0


def test_budget_binds_with_the_cheapest_plan_that_meets_the_deadline() -> None:
    r = plan(spec(budgetUsd=0.5), CAT, deadline_h=24.0)
    b = infeasible(r)
    assert b.kind is Kind.BUDGET and "raise the budget to $" in b.message
    cheapest = r.closest[0].plan
    assert cheapest.expected_cost_usd > 0.5
    assert plan(spec(budgetUsd=round(cheapest.expected_cost_usd + 0.01, 2)), CAT, deadline_h=24.0).chosen is not None


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        (Policy(name="lab", max_usd_per_hour=0.05), "maxUsdPerHour"),
        (Policy(name="lab", max_gpus_per_job=16), "allows 16"),
    ],
)
def test_policy_binds_naming_its_rule(policy: Policy, words: str) -> None:
    s = (
        spec(workload={"model": "bert-large-seq512"}, training={"samples": 5e7}, globalBatch=4096, maxDuration="2h")
        if policy.max_gpus_per_job
        else spec()
    )
    r = plan(s, CAT, policy, deadline_h=None if policy.max_gpus_per_job else 24.0)
    b = infeasible(r)
    assert b.kind is Kind.POLICY and b.message.startswith("the policy binds: ")
    assert words in b.message and "policy lab" in b.message


def test_memory_binds_when_nothing_fits() -> None:
    r = plan(
        spec(workload={"model": "llama-7b"}, globalBatch=64, training={"samples": 1e5},
             constraints={"gpuTypes": ["t4"], "maxNodes": 1}),
        CAT,
    )  # fmt: skip
    b = infeasible(r)
    assert b.kind is Kind.MEMORY and "memory binds" in b.message and r.closest == []


def test_json_and_text_carry_binding_and_closest() -> None:
    r = plan(spec(constraints={"spot": "never", "atRiskLimit": "Refuse"}), CAT, deadline_h=0.22)
    d = json.loads(json.dumps(plan_to_dict(r)))
    assert d["binding"]["kind"] == "risk" and d["binding"]["message"] == r.binding.message  # type: ignore[union-attr]
    assert len(d["closest"]) == len(r.closest) >= 1
    first = d["closest"][0]
    assert first["breaks"] == ["risk"] and first["moreHours"] > 0 and first["neededRisk"] > 0.05
    assert "allow" in first["fix"]
    text = render_plan(r)
    assert "No feasible plan." in text and "the risk limit binds" in text
    ok = plan_to_dict(plan(spec(), CAT, deadline_h=24.0))
    assert ok["binding"] is None and ok["closest"] == []


def test_the_operator_condition_names_the_binding_rule() -> None:
    w = World()
    job = make_job(maxDuration="4m")
    w.step(job)
    st = w.status
    assert st.phase is Phase.FAILED
    cond = next(c for c in st.conditions if c.type == ConditionType.PLANNED)
    assert cond.reason == "Infeasible"
    assert "binds" in cond.message, cond.message


def test_the_risk_test_is_written_once() -> None:
    """``P(miss) > maxDeadlineRisk`` lives in risk.over_risk; the planner, its binding analysis, the
    correction's re-plan and both observers call it instead of comparing themselves."""
    from gpuscaler.observe import controller as observer
    from gpuscaler.simulator import engine

    for module in (solve, binding, correction, observer, engine):
        src = inspect.getsource(module)
        assert "over_risk(" in src, module.__name__
        assert "> max_deadline_risk" not in src and "> ctx.max_deadline_risk" not in src
        assert "> st.spec.constraints.max_deadline_risk" not in src and "> risk:" not in src
