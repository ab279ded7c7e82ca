"""Spot interruptions: the notice table, the re-plan decision, lost-work accounting, the loop's handshake."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpuscaler.api import Objective, TrainingJobSpec
from gpuscaler.api.status import ObservedStatus, Phase, Progress, TrainingJobStatus
from gpuscaler.cloud.nodes import NOTICE_SOURCES, node_state
from gpuscaler.controller import interruptions as spot
from gpuscaler.handlers import metrics
from gpuscaler.kube.workers import pod_state
from gpuscaler.planner import Candidate, PlanResult, choose_recovery, plan, remaining_spec, survivors_spec
from gpuscaler.policy import Policy
from gpuscaler.policy.models import SpotRules
from gpuscaler.runtime import constants as rc
from gpuscaler.settings import Settings
from loop_harness import (
    CATALOG,
    SPOT_SPEC,
    T0,
    first_plan,
    make_job,
    node_body,
    planner_with,
    spec,
    spot_world,
)

CFG = spot.SpotConfig.from_settings(Settings(node_not_ready_grace_s=60, soft_notice_wait_s=30, annotation_notice_s=30))


def node(name: str = "n0", *, taints: list[dict[str, str]] | None = None, ann: dict[str, str] | None = None,
         ready: str = "True", since: datetime = T0) -> dict[str, Any]:
    """A spot g4dn.xlarge Node with these taints, annotations and Ready status."""
    return node_body(name, instance_type="g4dn.xlarge", capacity_type="spot", ready=ready, since=since,
                     taints=taints or [], annotations=ann)


def notice_of(body: dict[str, Any], now: datetime = T0) -> spot.Notice | None:
    return spot.node_notice(node_state(body), now, CFG)


# ------------------------------------------------------------------------------ the notice table


@pytest.mark.parametrize(
    ("taint", "signal", "seconds"),
    [
        ("aws-node-termination-handler/spot-itn", "aws-spot-itn", 120),
        ("cloud.google.com/impending-node-termination", "gke-termination", 30),
        ("karpenter.sh/disrupted", "karpenter-disrupted", 30),
    ],
)
def test_taints_map_to_notices_with_their_deadlines(taint: str, signal: str, seconds: int) -> None:
    n = notice_of(node(taints=[{"key": taint, "effect": "NoSchedule"}]))
    assert n is not None and n.source.signal == signal and not n.hard
    assert n.deadline == T0 + timedelta(seconds=seconds)


def test_taint_time_added_starts_the_clock() -> None:
    added = T0 - timedelta(seconds=100)
    body = node(taints=[{"key": "aws-node-termination-handler/spot-itn", "effect": "NoExecute",
                         "timeAdded": added.isoformat()}])
    n = notice_of(body)
    assert n is not None and n.deadline == added + timedelta(seconds=120)


def test_rebalance_is_soft_and_the_earliest_deadline_wins() -> None:
    soft = notice_of(node(taints=[{"key": "aws-node-termination-handler/rebalance-recommendation"}]))
    assert soft is not None and soft.source.signal == "aws-rebalance" and soft.deadline is None
    both = notice_of(node(taints=[{"key": "aws-node-termination-handler/rebalance-recommendation"},
                                  {"key": "aws-node-termination-handler/spot-itn"}]))
    assert both is not None and both.source.signal == "aws-spot-itn"
    later = (T0 + timedelta(seconds=90)).isoformat()
    gke = notice_of(node(taints=[{"key": "cloud.google.com/impending-node-termination"}],
                         ann={"gpuscaler.io/interruption-notice": later}))
    assert gke is not None and gke.source.signal == "gke-termination"


def test_annotation_with_a_deadline_or_a_reason() -> None:
    at = T0 + timedelta(seconds=75)
    n = notice_of(node(ann={"gpuscaler.io/interruption-notice": at.isoformat().replace("+00:00", "Z")}))
    assert n is not None and n.source.signal == "annotation" and n.deadline == at
    r = notice_of(node(ann={"gpuscaler.io/interruption-notice": "host maintenance"}))
    assert r is not None and r.deadline == T0 + timedelta(seconds=30) and "host maintenance" in r.describe()


def test_not_ready_counts_only_past_the_grace_period_and_is_a_hard_loss() -> None:
    body = node(ready="Unknown", since=T0)
    assert notice_of(body, T0 + timedelta(seconds=30)) is None
    n = notice_of(body, T0 + timedelta(seconds=61))
    assert n is not None and n.source.signal == "node-not-ready" and n.hard
    assert notice_of(node()) is None


def test_the_table_is_ordered_and_every_signal_is_unique() -> None:
    names = [s.signal for s in NOTICE_SOURCES]
    assert len(names) == len(set(names))
    assert names.index("aws-spot-itn") < names.index("aws-rebalance")
    assert {s.key for s in NOTICE_SOURCES if s.kind == "taint"} >= {
        "aws-node-termination-handler/spot-itn", "aws-node-termination-handler/rebalance-recommendation",
        "karpenter.sh/disrupted", "cloud.google.com/impending-node-termination"}


def test_detect_picks_the_most_urgent_node() -> None:
    a = node_state(node("a", taints=[{"key": "aws-node-termination-handler/spot-itn"}]))
    b = node_state(node("b", taints=[{"key": "cloud.google.com/impending-node-termination"}]))
    n = spot.detect([a, b, node_state(node("c"))], T0, CFG)
    assert n is not None and n.node == "b"


# ------------------------------------------------------------------------------ re-plan decision


def replanned(s: TrainingJobSpec, *, interruptions: int = 1, done_samples: float = 0, deadline_h: float = 1.5,
              unavailable: frozenset[tuple[str, ...]] = frozenset(),
              rules: SpotRules | None = None) -> tuple[Candidate, str, PlanResult]:
    """The loop's re-plan of job ``s`` after an interruption of its first plan, which must choose a
    plan: (the chosen plan, the action, the planner's result)."""
    rp = spot.replan(s, "j", first_plan(s), interruptions=interruptions, done_samples=done_samples,
                     deadline_h=deadline_h, unavailable=unavailable, planner=planner_with(Policy()), rules=rules)
    assert rp.result is not None and rp.result.chosen is not None
    return rp.result.chosen, rp.action, rp.result


def test_replan_moves_to_another_spot_offering_and_plans_only_the_rest() -> None:
    s = spec(SPOT_SPEC)
    ps = first_plan(s)
    assert (ps.instance_type, ps.capacity_type) == ("g4dn.xlarge", "spot")
    chosen, action, result = replanned(s, done_samples=200 * 256, unavailable=frozenset({("g4dn.xlarge", "spot")}))
    assert chosen.capacity.value == "spot" and chosen.instance.name != "g4dn.xlarge"
    assert result.job.total_samples == 200 * 256
    assert "moved from g4dn.xlarge spot" in action and "remaining 51,200 samples" in action


def test_replan_falls_back_to_on_demand_after_max_interruptions() -> None:
    s = spec(SPOT_SPEC)
    rules = SpotRules(max_interruptions=3)
    chosen, action, _ = replanned(s, interruptions=3, rules=rules)
    assert chosen.capacity.value == "on-demand"
    assert "on-demand fallback" in action and "maxInterruptions 3" in action
    assert replanned(s, interruptions=2, rules=rules)[0].capacity.value == "spot"


def test_replan_goes_on_demand_close_to_the_deadline() -> None:
    chosen, action, _ = replanned(spec(SPOT_SPEC), deadline_h=0.4, rules=SpotRules(min_hours_to_deadline=0.5))
    assert chosen.capacity.value == "on-demand" and "minHoursToDeadline" in action


def test_replan_goes_on_demand_when_another_reclaim_would_miss_the_deadline() -> None:
    s = spec(SPOT_SPEC, checkpoint={"intervalSeconds": 10, "restartSeconds": 600})
    # the rest takes about 0.12 h on spot; 600 s of restart more would miss a 0.25 h deadline
    chosen, action, _ = replanned(s, deadline_h=0.25, rules=SpotRules())
    assert chosen.capacity.value == "on-demand" and "deadline at risk" in action


def test_remaining_spec_keeps_at_least_one_step() -> None:
    s = spec(SPOT_SPEC)
    assert remaining_spec(s, 1000.0, 5000.0).training.samples == 256
    assert remaining_spec(s, 102400.0, 0.0, on_demand_only=True).constraints.spot.value == "never"


def test_elastic_recovery_when_replacement_is_scarce_or_slower() -> None:
    s = spec(SPOT_SPEC, constraints={**SPOT_SPEC["constraints"], "instanceTypes": ["p4d.24xlarge"], "minGpus": 16, "maxGpus": 16},
             training={"steps": 20000}, maxDuration="24h")
    two = plan(s, CATALOG, Policy()).chosen
    assert two is not None and two.nodes == 2
    one = plan(survivors_spec(s, "p4d.24xlarge", two.capacity, 1, 8), CATALOG, Policy()).chosen
    assert one is not None and one.nodes == 1
    # the global batch is kept: each GPU now carries twice the samples per step
    assert one.micro_batch * one.accumulation * one.gpus == two.micro_batch * two.accumulation * two.gpus == 256
    assert choose_recovery(None, one, Objective.CHEAPEST).elastic
    assert not choose_recovery(two, None, Objective.CHEAPEST).elastic
    # replacement capacity that takes an hour to arrive: the survivors finish sooner
    slow = choose_recovery(two, one, Objective.FASTEST, provisioning_s=3600)
    assert slow.elastic and "survivors" in slow.why
    quick = choose_recovery(two, one, Objective.FASTEST, provisioning_s=0)
    assert not quick.elastic


# ------------------------------------------------------------------------------ lost work


def test_lost_work_accounting() -> None:
    st = TrainingJobStatus(plan=first_plan(spec(SPOT_SPEC)), progress=Progress(step=130, checkpoint_step=100), attempt=1)
    notes = spot.record(st, node="n0", signal="node-deleted", acked=False, now=T0, cfg=CFG)
    assert notes[0].reason == "CheckpointMissed" and st.interruptions == 1
    assert [(u.instance_type, u.capacity_type) for u in st.unavailable] == [("g4dn.xlarge", "spot")]
    spot.settle_loss(st)
    rec = st.interruption_history[-1]
    assert rec.checkpoint_step == 100 and rec.step_reached == 130 and rec.lost_steps == 30
    # the new gang reports it resumed from step 120 (the SIGTERM checkpoint was not reported)
    st.attempt = 2
    pod = pod_state({"metadata": {"name": "w", "labels": {"gpuscaler.io/attempt": "2", "gpuscaler.io/rank": "0"},
                                  "annotations": {rc.ANNOTATION_CHECKPOINT_STEP: "120"}}, "status": {"phase": "Running"}})
    summary = spot.recovered(st, T0 + timedelta(seconds=12))
    assert rec.recovery_seconds == 12 and st.recovery_seconds == 12 and st.lost_steps == 30 and "30 step" in summary
    spot.refine_loss(st, [pod], T0 + timedelta(seconds=13))
    assert rec.checkpoint_step == 120 and rec.lost_steps == 10 and st.lost_steps == 10
    # a checkpoint a full interval later is not mistaken for the resume point
    later = replace(pod, checkpoint_step=125)
    spot.refine_loss(st, [later], T0 + timedelta(seconds=60))
    assert rec.checkpoint_step == 120


# ------------------------------------------------------------------------------ the loop


def test_notice_checkpoint_replan_resume() -> None:
    w = spot_world()
    job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    assert w.status.capacity_type == "spot" and w.status.instance_type == "g4dn.xlarge"
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "150", rc.ANNOTATION_CHECKPOINT_STEP: "100"})
    w.step(job)
    name = next(iter(w.nodes))
    w.nodes[name]["spec"]["taints"] = [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]
    reasons = w.step(job)
    assert w.status.phase is Phase.CHECKPOINTING and "Interrupted" in reasons
    assert w.status.notice is not None and w.status.notice.signal == "aws-spot-itn"
    rid = w.status.notice.request_id
    assert all(b["metadata"]["annotations"][rc.ANNOTATION_CHECKPOINT_REQUESTED] == rid for b in w.workers.pods())
    w.step(job)
    assert w.status.phase is Phase.CHECKPOINTING, "waits for the ack"
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_ACK: rid, rc.ANNOTATION_CHECKPOINT_STEP: "152",
                  rc.ANNOTATION_PROGRESS_STEP: "152"})
    reasons = w.step(job)
    assert w.status.phase is Phase.RECOVERING and "Checkpointed" in reasons and w.status.interruptions == 1
    assert name in w.nodes, "the noticed node stays until its workers have stopped"
    reasons = w.run_to(job, Phase.RUNNING)
    assert name not in w.nodes
    assert "Replanned" in reasons and "Recovered" in reasons
    assert w.status.instance_type != "g4dn.xlarge" and w.status.capacity_type == "spot"
    rec = w.status.interruption_history[-1]
    assert rec.signal == "aws-spot-itn" and rec.checkpoint_acked and rec.checkpoint_step == 152
    assert rec.lost_steps == 0 and rec.recovery_seconds is not None and rec.recovery_seconds > 0
    assert "moved from g4dn.xlarge spot" in rec.action
    assert w.status.plan is not None and w.status.plan.total_samples == 400 * 256


def test_notice_without_an_ack_moves_at_the_deadline() -> None:
    w = spot_world()
    job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    name = next(iter(w.nodes))
    w.nodes[name]["spec"]["taints"] = [{"key": "cloud.google.com/impending-node-termination"}]
    w.step(job)
    assert w.status.phase is Phase.CHECKPOINTING
    w.step(job, seconds=20)
    assert w.status.phase is Phase.CHECKPOINTING
    reasons = w.step(job, seconds=11)
    assert w.status.phase is Phase.RECOVERING and "CheckpointMissed" in reasons


def test_node_deleted_without_notice_resumes_from_the_periodic_checkpoint() -> None:
    w = spot_world()
    job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "170", rc.ANNOTATION_CHECKPOINT_STEP: "160"})
    w.step(job)
    w.lose_nodes()
    reasons = w.step(job)
    assert w.status.phase is Phase.RECOVERING and "Interrupted" in reasons
    w.run_to(job, Phase.RUNNING)
    rec = w.status.interruption_history[-1]
    assert rec.signal == "node-deleted" and not rec.checkpoint_acked and rec.lost_steps == 10
    assert w.status.lost_steps == 10


def test_three_interruptions_then_on_demand() -> None:
    w = spot_world()
    job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    seen = []
    for _ in range(3):
        seen.append((w.status.instance_type, w.status.capacity_type))
        name = next(iter(w.nodes))
        w.nodes[name]["spec"]["taints"] = [{"key": "aws-node-termination-handler/spot-itn"}]
        w.step(job)
        w.annotate(**{rc.ANNOTATION_CHECKPOINT_ACK: w.status.notice.request_id if w.status.notice else "",
                      rc.ANNOTATION_CHECKPOINT_STEP: "0"})  # the runtime reports the checkpoint with its ack
        w.run_to(job, Phase.RUNNING)
    assert all(c == "spot" for _, c in seen) and len({i for i, _ in seen}) == 3
    assert w.status.capacity_type == "on-demand" and w.status.interruptions == 3
    assert "maxInterruptions" in w.status.interruption_history[-1].action


# ------------------------------------------------------------------------------ observed efficiency


def efficient_planner(policy: Policy, calls: list[dict[str, float] | None]) -> spot.Planner:
    """The loop's planner shape (efficiency optional), recording the factors of each call."""
    def p(s: TrainingJobSpec, name: str, dl: float | None, un: frozenset[tuple[str, str]],
          efficiency: dict[str, float] | None = None) -> Any:
        calls.append(None if efficiency is None else dict(efficiency))
        return plan(s, CATALOG, policy, name=name, deadline_h=dl, unavailable=un, efficiency=efficiency)
    return p


def test_replan_uses_the_observed_efficiency_factors() -> None:
    """Without factors the rest goes to g5.xlarge spot (A10G); with A10G measured at 0.3 of the
    model the corrected model prefers another offering, and every planner call carried the factors."""
    s = spec(SPOT_SPEC)
    ps = first_plan(s)
    back = frozenset({("g4dn.xlarge", "spot")})
    calls: list[dict[str, float] | None] = []
    plain = spot.replan(s, "j", ps, interruptions=1, done_samples=200 * 256, deadline_h=1.5, unavailable=back,
                        planner=efficient_planner(Policy(), calls))
    assert plain.result is not None and plain.result.chosen is not None
    assert plain.result.chosen.instance.name == "g5.xlarge" and calls == [None]
    calls.clear()
    slow = {"A10G": 0.3}
    fixed = spot.replan(s, "j", ps, interruptions=1, done_samples=200 * 256, deadline_h=1.5, unavailable=back,
                        planner=efficient_planner(Policy(), calls), efficiency=slow)
    assert fixed.result is not None and fixed.result.chosen is not None
    assert fixed.result.chosen.instance.gpu_id != "A10G"
    assert calls and all(c == slow for c in calls)
    # the on-demand check and the survivors' plan use the corrected model too
    calls.clear()
    spot.replan(s, "j", ps, interruptions=3, done_samples=0, deadline_h=1.5, unavailable=frozenset(),
                planner=efficient_planner(Policy(), calls), rules=SpotRules(max_interruptions=3), efficiency=slow)
    assert calls == [slow]


def test_the_loop_replans_an_interruption_with_status_observed() -> None:
    calls: list[dict[str, float] | None] = []
    w = spot_world()
    w.loop.planner = efficient_planner(Policy(), calls)
    job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    w.status.observed = ObservedStatus(efficiency_by_gpu={"A10G": 0.3, "T4": 0.9}, efficiency_factor=0.9)
    calls.clear()
    name = next(iter(w.nodes))
    w.nodes[name]["spec"]["taints"] = [{"key": "aws-node-termination-handler/spot-itn"}]
    w.step(job)
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_ACK: w.status.notice.request_id if w.status.notice else "",
                  rc.ANNOTATION_CHECKPOINT_STEP: "0"})
    w.run_to(job, Phase.RUNNING)
    assert calls and all(c == {"A10G": 0.3, "T4": 0.9} for c in calls)
    assert w.status.plan is not None and w.status.plan.gpu_type != "A10G"
    assert w.status.plan.efficiency_factor == {"A10G": 0.3, "T4": 0.9}.get(w.status.plan.gpu_type, 1.0)


# ------------------------------------------------------------------------------ metrics


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_interruption_metrics_count_each_recorded_interruption_once() -> None:
    """gpuscaler_interruptions_total / gpuscaler_lost_steps_total grow with the status, once per
    interruption, however many reconcile steps the handshake and the recovery take."""
    w = spot_world()
    job = make_job(SPOT_SPEC, namespace="ns-metrics")
    labels = {"namespace": "ns-metrics", "job": "job"}

    def step(seconds: float = 1.0) -> None:
        before = w.status
        w.step(job, seconds)
        metrics.observe_interruptions("ns-metrics", "job", before, w.status)

    for _ in range(20):
        step()
        if w.status.phase is Phase.RUNNING:
            break
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "170", rc.ANNOTATION_CHECKPOINT_STEP: "160"})
    step()
    w.lose_nodes()
    for _ in range(20):
        step()
        if w.status.phase is Phase.RUNNING and w.status.interruptions == 1:
            break
    for _ in range(5):
        step()  # steps after the recovery count nothing more
    assert w.status.interruptions == 1 and w.status.lost_steps == 10
    assert counter("gpuscaler_interruptions_total", **labels, signal="node-deleted") == 1
    assert counter("gpuscaler_lost_steps_total", **labels) == 10
    metrics.forget_job("ns-metrics", "job")
    assert REGISTRY.get_sample_value("gpuscaler_interruptions_total", {**labels, "signal": "node-deleted"}) is None


def test_new_interruptions_from_two_statuses() -> None:
    before = TrainingJobStatus(plan=first_plan(spec(SPOT_SPEC)), progress=Progress(step=30, checkpoint_step=20))
    after = before.model_copy(deep=True)
    spot.record(after, node="n0", signal="gke-termination", acked=True, now=T0, cfg=CFG)
    after.interruptions += 1  # a worker pod deleted under the job: counted, no record
    assert metrics.new_interruptions(before, after) == (["gke-termination", "worker-deleted"], 0)
    assert metrics.new_interruptions(after, after) == ([], 0)
    spot.recovered(after, T0 + timedelta(seconds=5))
    assert metrics.new_interruptions(before, after)[1] == 10


def test_a_reclaim_backs_off_the_plans_zone_and_the_replan_moves_zone() -> None:
    zoned = {**SPOT_SPEC, "constraints": {**SPOT_SPEC["constraints"], "instanceTypes": ["g4dn.xlarge"],
                                          "zones": ["us-east-1b", "us-east-1c"]}}  # fmt: skip
    w = spot_world()
    job = make_job(zoned)
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None and w.status.plan.zone == "us-east-1b"
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "170", rc.ANNOTATION_CHECKPOINT_STEP: "160"})
    w.step(job)
    w.lose_nodes()
    w.step(job)
    assert [(u.instance_type, u.capacity_type, u.zone) for u in w.status.unavailable] == [
        ("g4dn.xlarge", "spot", "us-east-1b")
    ]
    w.run_to(job, Phase.RUNNING)
    assert (w.status.plan.instance_type, w.status.plan.capacity_type, w.status.plan.zone) == (
        "g4dn.xlarge", "spot", "us-east-1c"
    )
    last = [c.request for c in w.provider.calls if c.method == "ensure_nodes"][-1]
    assert last is not None and last.zone == "us-east-1c"
