"""The operator carries out a segmented plan: it runs in the capacity block, asks for the checkpoint
at the planned margin before the block closes (a planned move, not a failure: no interruption
counted, a Normal Event, do-not-disrupt while it is written), and continues on the next cheapest
capacity; pools other jobs hold are not planned twice (gpuscaler.controller.windows,
gpuscaler.controller.policy.held_nodes)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase
from gpuscaler.catalog import CapacityType
from gpuscaler.controller.policy import held_nodes
from gpuscaler.controller.wakeups import WakeConfig, next_wake
from gpuscaler.names import DO_NOT_DISRUPT_ANNOTATION
from gpuscaler.planner import PlanResult, plan
from gpuscaler.policy import Policy
from gpuscaler.runtime import constants as rc
from gpuscaler.settings import Settings
from loop_harness import CATALOG, T0, World, make_job

JOB = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 90}, "maxDuration": "48h"}
BLOCK = Policy.model_validate({
    "name": "ml-platform",
    "capacity": [{"name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1,
                  "start": T0.isoformat(), "end": (T0 + timedelta(hours=1)).isoformat()}],
})  # fmt: skip


def block_world() -> World:
    w = World(pod_phase="Running", node={"ready": "True", "created": T0, "price": 0.0})

    def planner(s: TrainingJobSpec, name: str, dl: float | None, un: frozenset[tuple[str, ...]], /, **_: Any) -> PlanResult:
        return plan(s, CATALOG, BLOCK, name=name, deadline_h=dl, unavailable=un, now=w.now)

    w.loop.planner = planner
    return w


def test_the_block_end_is_a_planned_move_to_the_next_cheapest_capacity() -> None:
    w = block_world()
    job = make_job(JOB)
    w.run_to(job, Phase.RUNNING)
    p = w.status.plan
    assert p is not None and p.capacity_type == "capacity-block" and p.held_capacity == "blk"
    assert p.window_end == T0 + timedelta(hours=1) and len(p.segments) == 2
    at = p.segments[0].checkpoint_at
    assert at is not None and T0 + timedelta(minutes=55) < at < T0 + timedelta(hours=1)
    # the timer wakes the job for it
    due = next_wake(w.status, [], w.now, WakeConfig.from_settings(Settings()))
    assert due <= (at - w.now).total_seconds() + 1
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "20000", rc.ANNOTATION_CHECKPOINT_STEP: "19000"})
    w.step(job, seconds=(at - w.now).total_seconds() - 5)
    assert w.status.phase is Phase.RUNNING, "not before checkpointAt"
    reasons = w.step(job, seconds=6)
    assert w.status.phase is Phase.CHECKPOINTING and "PlannedMove" in reasons and "Interrupted" not in reasons
    notice = w.status.notice
    assert notice is not None and notice.signal == "capacity-window-end" and notice.deadline == T0 + timedelta(hours=1)
    pods = w.workers.pods()
    assert all(b["metadata"]["annotations"][rc.ANNOTATION_CHECKPOINT_REQUESTED] == notice.request_id for b in pods)
    assert all(b["metadata"]["annotations"][DO_NOT_DISRUPT_ANNOTATION] == "true" for b in pods)
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_ACK: notice.request_id, rc.ANNOTATION_CHECKPOINT_STEP: "20010",
                  rc.ANNOTATION_PROGRESS_STEP: "20010"})  # fmt: skip
    reasons = w.step(job)
    assert w.status.phase is Phase.RECOVERING and "Checkpointed" in reasons
    assert w.status.interruptions == 0, "a planned move is not an interruption"
    reasons = w.step(job)  # the old workers are deleted; once gone, the rest is re-planned
    while "Replanned" not in reasons and w.status.phase is Phase.RECOVERING:
        reasons = w.step(job)
    assert "Replanned" in reasons
    made = [n for names in w.provider.ensured for n in names]
    assert made and w.status.phase is not Phase.RECOVERING, (
        "the new plan's nodes are requested in the step that re-plans (a planned move has no watch event "
        "to wake the next step)"
    )
    assert not set(made) & set(w.nodes), "the replacement is new capacity, not the block's node"
    reasons += w.run_to(job, Phase.RUNNING)
    p = w.status.plan
    assert p is not None and p.capacity_type in (CapacityType.SPOT.value, CapacityType.ON_DEMAND.value) and p.segments == []
    rec = w.status.interruption_history[-1]
    assert rec.signal == "capacity-window-end" and rec.checkpoint_acked and rec.checkpoint_step == 20010


def test_pools_other_jobs_hold_are_counted_cluster_wide() -> None:
    jobs = [
        {"namespace": "a", "name": "j1", "phase": "Running", "heldCapacity": "blk", "nodes": 1},
        {"namespace": "b", "name": "j2", "phase": "Running", "heldCapacity": "blk", "nodes": 2},
        {"namespace": "b", "name": "j3", "phase": "Succeeded", "heldCapacity": "blk", "nodes": 4},
        {"namespace": "b", "name": "me", "phase": "Running", "heldCapacity": "blk", "nodes": 8},
        {"namespace": "c", "name": "j4", "phase": "Running", "heldCapacity": None, "nodes": 1},
    ]
    assert held_nodes(jobs, ("b", "me")) == {"blk": 3}


def test_a_plan_into_a_block_that_opens_later_waits_for_it_unprovisioned() -> None:
    later = Policy.model_validate({"capacity": [
        {"name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1,
         "start": (T0 + timedelta(hours=1)).isoformat(), "end": (T0 + timedelta(hours=30)).isoformat()}]})  # fmt: skip
    w = World(pod_phase="Running", node={"ready": "True", "created": T0, "price": 0.0})

    def planner(s: TrainingJobSpec, name: str, dl: float | None, un: frozenset[tuple[str, ...]], /, **_: Any) -> PlanResult:
        return plan(s, CATALOG, later, name=name, deadline_h=dl, unavailable=un, now=w.now)

    w.loop.planner = planner
    job = make_job(JOB)
    w.step(job)
    w.step(job, seconds=60)
    p = w.status.plan
    assert p is not None and p.held_capacity == "blk" and p.window_start == T0 + timedelta(hours=1)
    assert w.status.phase is Phase.PENDING and "waiting" in w.status.message and not w.nodes, w.status.message
    slow = WakeConfig(resync_s=86400.0, urgent_s=2.0, gang_timeout_s=600.0, cost_refresh_s=30.0, min_s=0.05,
                      admission_recheck_s=30.0)  # fmt: skip
    due = next_wake(w.status, [], w.now, slow)
    assert 3400 < due <= 3600 - 60 + 1, due  # the timer wakes the job when the block opens
    w.step(job, seconds=due)
    assert w.status.phase is not Phase.PENDING and w.status.provisioning_started_at is not None


def test_a_slower_measured_checkpoint_moves_the_planned_checkpoint_earlier() -> None:
    w = block_world()
    job = make_job(JOB)
    w.run_to(job, Phase.RUNNING)
    p = w.status.plan
    assert p is not None and p.window_end is not None and p.segments[0].checkpoint_at is not None
    planned = p.segments[0].checkpoint_at
    # the runtime measured 120 s per checkpoint: the margin is 2 x 120 + 60 s before the end
    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "100", rc.ANNOTATION_CHECKPOINT_STEP: "90",
                  rc.ANNOTATION_CHECKPOINT_DURATION: "120.0"})  # fmt: skip
    early = p.window_end - timedelta(seconds=2 * 120 + 60)
    assert early < planned
    w.step(job, seconds=(early - w.now).total_seconds() - 2)
    assert w.status.phase is Phase.RUNNING
    assert "PlannedMove" in w.step(job, seconds=3) and w.status.phase is Phase.CHECKPOINTING
