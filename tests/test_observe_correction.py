"""The observer without Prometheus: progress annotations -> corrected estimate -> re-plan at a checkpoint
(for the deadline, one it asks the workers for at once)."""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest

from correction_helpers import CATALOG, CFG, DEADLINE_H, SPEC, T0, planner, running
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.controller.policy import gated_plan
from gpuscaler.observe.controller import JobContext, Observer
from gpuscaler.runtime import constants as rc
from loop_harness import World, make_job


def run(st: TrainingJobStatus, obs: Observer, rate: float, seconds: int, ckpt: int | None = None,
        asked: list[int] | None = None) -> list[str]:
    """The observer's Events over ``seconds`` at ``rate``; ``asked`` gets the second of each step that asked
    the loop for a checkpoint now."""
    reasons: list[str] = []
    for s in range(0, seconds + 1, 5):
        now = T0 + timedelta(seconds=s)
        st.progress.samples = rate * s
        left = DEADLINE_H - s / 3600
        ctx = JobContext(progress_samples=rate * s, hours_left=left, max_deadline_risk=0.3, restart_s=30)
        res = obs.step("ns", "j", 1, st, ckpt, now, planner(st, left), ctx)
        reasons += [e.reason for e in res.events]
        if res.checkpoint_now and asked is not None:
            asked.append(s)
        assert res.replan is None
    return reasons


def test_thirty_percent_slower_from_annotations_corrects_and_replans_from_a_checkpoint_asked_for_now() -> None:
    st = running(SPEC)
    assert st.plan is not None and st.plan.gpu_type == "A10G"
    assert st.plan.deadline_miss_probability is not None and st.plan.deadline_miss_probability <= 0.3
    predicted = st.plan.throughput
    obs = Observer(None, CFG, CATALOG)
    # not enough progress yet: nothing corrected
    assert run(st, obs, 0.7 * predicted, 60, ckpt=40) == []
    seen = st.observed
    assert seen is not None and "measuring" in seen.message and seen.efficiency_by_gpu == {}
    asked: list[int] = []
    reasons = run(st, obs, 0.7 * predicted, 120, ckpt=40, asked=asked)
    assert reasons == ["ModelCorrected", "ReplanPending"]
    # the move is for the deadline: the loop is asked once, in the step that decided it, for a checkpoint now
    assert len(asked) == 1, asked
    assert seen.source == "annotations"
    assert seen.efficiency_by_gpu["A10G"] == pytest.approx(0.7, abs=0.03)
    assert seen.corrected_throughput == pytest.approx(0.7 * predicted, rel=0.04)
    assert seen.correction_log_sigma is not None and seen.correction_log_sigma <= 0.05
    assert seen.deadline_miss_probability is not None and seen.deadline_miss_probability > 0.3
    assert seen.replan_pending and seen.replan_after_checkpoint_step == 40 and "P(miss deadline)" in seen.replan_reason
    assert 3 <= len(seen.progress_points) <= 60
    # the checkpoint asked for: move to the faster plan
    now = T0 + timedelta(seconds=130)
    left = DEADLINE_H - 130 / 3600
    res = obs.step("ns", "j", 1, st, 50, now, planner(st, left),
                   JobContext(0.7 * predicted * 130, left, 0.3, 30))
    assert res.replan is not None and res.replan.chosen is not None
    assert res.replan.chosen.instance.name == "p3.2xlarge"
    assert [e.reason for e in res.events] == ["Replanned"] and seen.replans == 1


def test_a_job_on_its_prediction_is_left_alone() -> None:
    st = running(SPEC)
    assert st.plan is not None
    obs = Observer(None, CFG, CATALOG)
    assert run(st, obs, st.plan.throughput, 200, ckpt=40) == []
    seen = st.observed
    assert seen is not None and seen.efficiency_by_gpu == {} and not seen.replan_pending
    assert seen.ratio == pytest.approx(1.0, abs=0.01) and seen.deadline_miss_probability is not None
    assert seen.deadline_miss_probability < 0.3


def test_no_status_churn_while_measuring() -> None:
    """Until the window is covered the observed status changes only when a point is added."""
    st = running(SPEC)
    assert st.plan is not None
    obs = Observer(None, CFG, CATALOG)
    obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=25), planner(st, 2.0), JobContext(100.0, 2.0, 0.3))
    assert st.observed is not None
    before = st.observed.model_dump()
    # the same progress a second later: nothing new to record, nothing rewritten
    obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=26), planner(st, 2.0), JobContext(100.0, 2.0, 0.3))
    assert st.observed.model_dump() == before


def test_report_shows_the_correction() -> None:
    from gpuscaler.observe.cli import render

    st = running(SPEC)
    assert st.plan is not None
    obs = Observer(None, CFG, CATALOG)
    run(st, obs, 0.7 * st.plan.throughput, 120, ckpt=40)
    text = render("j", "ns", st)
    assert "corrected" in text and "s of annotations" in text and "P(miss deadline)" in text and "planned" in text


def test_the_loop_asks_the_workers_for_the_checkpoint_a_move_for_the_deadline_starts_from() -> None:
    """In the reconcile loop: the step that decides a move for the deadline writes
    ``gpuscaler.io/checkpoint-requested`` on every worker (the spot handshake's request, which the runtime
    answers at its next step boundary), once; the move waits for a checkpoint newer than the one known
    and is made at it. The periodic checkpoint (every 30 min) never comes in this test."""
    node = {"instance_type": "g5.xlarge", "capacity_type": "on-demand", "ready": "True", "created": T0}
    w = World(planner=functools.partial(gated_plan, catalog=CATALOG), pod_phase="Running", node=node)
    w.loop.observer = Observer(None, CFG, CATALOG)
    job = make_job(SPEC.model_dump(by_alias=True, exclude_none=True), maxDuration=f"{DEADLINE_H}h",
                   checkpoint={"intervalSeconds": 1800, "restartSeconds": 30, "writeSeconds": 0.1})
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None and w.status.plan.instance_type == "g5.xlarge"
    slow = 0.7 * w.status.plan.throughput
    asked: dict[str, str] = {}
    for t in range(5, 301, 5):
        w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{slow * t:.0f}", rc.ANNOTATION_CHECKPOINT_STEP: "40"})
        reasons = w.step(job, 5)
        asked = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(rc.ANNOTATION_CHECKPOINT_REQUESTED, "")
                 for p in w.workers.pods()}  # fmt: skip
        if "ReplanPending" in reasons:
            break
    else:
        raise AssertionError(f"no re-plan: {w.status.observed}")
    pending = next(e for e in w.events if e.reason == "ReplanPending")
    assert "P(miss deadline)" in pending.message and "from the checkpoint asked for now" in pending.message
    assert asked and all(asked.values()), asked
    assert w.status.plan.instance_type == "g5.xlarge"
    # no newer checkpoint yet: the job stays, and the request is not made again
    first = dict(asked)
    w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{slow * (t + 5):.0f}"})
    assert "Replanned" not in w.step(job, 5)
    assert w.status.plan.instance_type == "g5.xlarge"
    assert {p["metadata"]["name"]: p["metadata"]["annotations"][rc.ANNOTATION_CHECKPOINT_REQUESTED]
            for p in w.workers.pods()} == first  # fmt: skip
    # the workers answer with checkpoint 41: the job moves from it
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_STEP: "41", rc.ANNOTATION_CHECKPOINT_ACK: next(iter(first.values()))})
    assert "Replanned" in w.step(job, 5)
    assert w.status.plan.instance_type == "p3.2xlarge"
