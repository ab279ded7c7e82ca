"""One recovery decision: the same cases through the operator's re-plan and the simulator's strategy.

``gpuscaler.planner.recovery.recover`` is called by the reconcile loop (through
``controller.interruptions.replan``) and by the simulator's ``gpuscaler`` strategy; each feeds it its
own planner (the loop's, the simulator's memoised one) and its own state (status, books). The table
below drives both and asserts the same plan for the rest, and what that plan must be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller.reconcile import Job, plan_status
from gpuscaler.planner import Candidate, Interrupted, Situation, plan, recover
from gpuscaler.policy import Policy
from gpuscaler.policy.models import SpotRules
from gpuscaler.runtime import constants as rc
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.strategies import Decision, Gpuscaler, JobState
from loop_harness import CATALOG, SPOT_SPEC, T0, spec, spot_world

SPEC: dict[str, Any] = {
    **{k: v for k, v in SPOT_SPEC.items() if k != "maxDuration"},  # the hours left are given per case
    "training": {"steps": 4000},
    "checkpoint": {"intervalSeconds": 60, "restartSeconds": 60},
}


@dataclass(frozen=True)
class Case:
    name: str
    hours_left: float | None
    interruptions: int = 1
    done_fraction: float = 0.5
    spent_usd: float = 0.0
    budget_usd: float | None = None
    rules: SpotRules = field(default_factory=SpotRules)
    capacity: str = "spot"
    """What the rest must run on."""
    kind: str = "replacement"
    avoid_interrupted: bool = True


CASES = [
    Case("first reclaim: spot elsewhere", hours_left=10.0),
    Case("reclaims reach maxInterruptions: on-demand", hours_left=10.0, interruptions=3,
         rules=SpotRules(max_interruptions=3), capacity="on-demand", kind="on-demand"),
    Case("below minHoursToDeadline: on-demand", hours_left=0.9, rules=SpotRules(min_hours_to_deadline=1.0),
         capacity="on-demand", kind="on-demand"),
    Case("budget left fits: spot within it", hours_left=10.0, budget_usd=50.0, spent_usd=10.0),
    Case("budget spent: the cheapest plan that meets the deadline, over budget", hours_left=10.0,
         budget_usd=5.0, spent_usd=4.99),
    Case("deadline passed: the fastest sensible on-demand plan", hours_left=0.01, capacity="on-demand",
         kind="fastest"),
    Case("no deadline: cheapest spot", hours_left=None),
]


def spec_for(case: Case) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({**SPEC, **({"budgetUsd": case.budget_usd} if case.budget_usd else {})})


def first(spec: TrainingJobSpec, policy: Policy) -> Candidate:
    chosen = plan(spec, CATALOG, policy, name="j").chosen
    assert chosen is not None
    return chosen


def key(c: Candidate | None) -> tuple[object, ...] | None:
    if c is None:
        return None
    return (c.instance.name, c.nodes, c.capacity.value, c.precision.value, c.micro_batch, c.accumulation)


def operator_decision(case: Case, policy: Policy) -> Candidate | None:
    spec = spec_for(case)
    ps = plan_status(plan(spec, CATALOG, policy, name="j"), 1, T0)
    unavailable = frozenset({(ps.instance_type, ps.capacity_type)}) if case.avoid_interrupted else frozenset()

    def planner(s: TrainingJobSpec, name: str, dl: float | None, un: frozenset[tuple[str, str]]) -> Any:
        return plan(s, CATALOG, policy, name=name, deadline_h=dl, unavailable=un)

    rp = spot.replan(spec, "j", ps, interruptions=case.interruptions, done_samples=case.done_fraction * ps.total_samples,
                     deadline_h=case.hours_left, unavailable=unavailable, planner=planner, rules=policy.spot,
                     spent_usd=case.spent_usd)
    return None if rp.result is None else rp.result.chosen


def simulator_decision(case: Case, policy: Policy) -> Candidate | None:
    spec = spec_for(case)
    cand = first(spec, policy)
    total = 4000 * 256
    st = JobState(name="j", spec=spec, arrival_h=0.0, deadline_h=case.hours_left, total_samples=total,
                  remaining_samples=total * (1 - case.done_fraction), interruptions=case.interruptions,
                  spent_usd=case.spent_usd, current=Decision(cand, cand.outlook.interval_s, handshake=True))
    if case.avoid_interrupted:
        st.unavailable[(cand.instance.name, cand.capacity.value)] = 1e9
    d = Gpuscaler().after_interruption(st, CachedPlanner(CATALOG, policy), 0.0)
    return None if d is None else d.candidate


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_loop_and_the_simulator_decide_the_same(case: Case) -> None:
    policy = Policy(spot=case.rules)
    by_loop = operator_decision(case, policy)
    by_sim = simulator_decision(case, policy)
    assert by_loop is not None and by_sim is not None
    assert key(by_loop) == key(by_sim)
    assert by_loop.capacity.value == case.capacity
    interrupted = first(spec_for(case), policy)
    if case.avoid_interrupted and case.kind == "replacement":
        assert (by_loop.instance.name, by_loop.capacity) != (interrupted.instance.name, interrupted.capacity)
    # the pure decision says the same and names its kind
    spec = spec_for(case)
    total = 4000 * 256.0
    rec = recover(
        Situation(spec, total, case.done_fraction * total,
                  Interrupted(interrupted.instance.name, interrupted.capacity.value, 1, 1), case.interruptions,
                  case.hours_left, case.spent_usd,
                  frozenset({(interrupted.instance.name, interrupted.capacity.value)}), 0, case.rules),
        lambda s, dl, un: plan(s, CATALOG, policy, deadline_h=dl, unavailable=un),
    )
    assert rec.kind == case.kind and key(rec.chosen) == key(by_loop)
    if case.budget_usd is not None:
        left = case.budget_usd - case.spent_usd
        assert rec.budget_left_usd == pytest.approx(left)
        assert rec.over_budget == (by_loop.expected_cost_usd > left)


def test_the_reconcile_loop_replans_as_the_simulator_would() -> None:
    """The whole loop (notice, handshake, recovery) against the simulator's strategy on the same state."""
    w = spot_world()
    s = spec(SPOT_SPEC)
    job = Job("ns", "job", "uid-1", 1, T0, s)
    w.run_to(job, Phase.RUNNING)
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "150", rc.ANNOTATION_CHECKPOINT_STEP: "100"})
    w.step(job)
    name = next(iter(w.nodes))
    w.nodes[name]["spec"]["taints"] = [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]
    w.step(job)
    rid = w.status.notice.request_id if w.status.notice else ""
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_ACK: rid, rc.ANNOTATION_CHECKPOINT_STEP: "152",
                  rc.ANNOTATION_PROGRESS_STEP: "152"})
    for _ in range(20):
        if "Replanned" in w.step(job):
            break
    else:
        raise AssertionError(f"no re-plan: {w.status.phase} {w.status.message}")
    p = w.status.plan
    assert p is not None
    by_loop = (p.instance_type, p.nodes, p.capacity_type, p.precision, p.micro_batch, p.accumulation)
    policy = Policy()
    cand = first(s, policy)
    total = 400 * 256
    st = JobState(name="job", spec=s, arrival_h=0.0, deadline_h=2.0, total_samples=total,
                  remaining_samples=total - 152 * 256, interruptions=1,
                  current=Decision(cand, cand.outlook.interval_s, handshake=True),
                  unavailable={(cand.instance.name, cand.capacity.value): 1e9})
    d = Gpuscaler().after_interruption(st, CachedPlanner(CATALOG, policy), (w.now - T0).total_seconds() / 3600)
    assert d is not None and key(d.candidate) == by_loop
    assert by_loop[0] != "g4dn.xlarge" and by_loop[2] == "spot"
