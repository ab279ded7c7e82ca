"""What a preemption would cost, told to the schedulers (gpuscaler.controller.preemption).

``karpenter.sh/do-not-disrupt`` is on a job's pods only while a checkpoint is being written (the
runtime reports the write; the operator's own request counts too), a forged or endless "writing"
report does not pin a node, and every running worker carries the last checkpoint's step and time
and the work at risk, refreshed without a patch per reconcile.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuscaler.api.status import NoticeStatus, Phase, Progress, TrainingJobStatus
from gpuscaler.controller import preemption
from gpuscaler.controller.reconcile import Job
from gpuscaler.kube.workers import pod_state
from gpuscaler.names import (
    CHECKPOINT_SECONDS_ANNOTATION,
    DO_NOT_DISRUPT_ANNOTATION,
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
    PREEMPTION_COST_TIME_ANNOTATION,
    WORK_AT_RISK_ANNOTATION,
)
from gpuscaler.runtime import TrainingGuard
from gpuscaler.runtime import constants as rc
from gpuscaler.runtime.progress import CheckpointEvent
from gpuscaler.runtime.progress import Progress as RuntimeProgress
from loop_harness import SPOT_NODE, SPOT_SPEC, T0, World, make_job, spot_world

WRITING, CKPT_TIME, DURATION = rc.ANNOTATION_CHECKPOINT_WRITING, rc.ANNOTATION_CHECKPOINT_TIME, rc.ANNOTATION_CHECKPOINT_DURATION
NOW = T0 + timedelta(hours=1)
WRITE_MAX_S, REFRESH_S = 900.0, 60.0


def at(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(rank: int, ann: dict[str, str] | None = None, *, attempt: int = 1, started: datetime = NOW - timedelta(minutes=30)) -> Any:
    meta = {
        "name": f"job-worker-{rank}",
        "labels": {"gpuscaler.io/rank": str(rank), "gpuscaler.io/attempt": str(attempt)},
        "annotations": dict(ann or {}),
    }
    return pod_state({"metadata": meta, "status": {"phase": "Running", "startTime": at(started)}})


def status(phase: Phase = Phase.RUNNING, checkpoint_step: int | None = 100) -> TrainingJobStatus:
    return TrainingJobStatus(phase=phase, attempt=1, progress=Progress(step=120, checkpoint_step=checkpoint_step))


def patches(st: TrainingJobStatus, pods: list[Any], now: datetime = NOW, **kw: Any) -> dict[str, dict[str, str | None]]:
    return preemption.patches(st, pods, now, write_max_s=WRITE_MAX_S, refresh_s=REFRESH_S, **kw)


# ------------------------------------------------------------------------------ do-not-disrupt


def test_do_not_disrupt_is_set_on_every_worker_only_while_the_writer_writes() -> None:
    writing = {rc.ANNOTATION_CHECKPOINT_STEP: "100", WRITING: at(NOW - timedelta(seconds=20))}
    out = patches(status(), [pod(0, writing), pod(1)])
    assert {p[DO_NOT_DISRUPT_ANNOTATION] for p in out.values()} == {"true"} and len(out) == 2
    # the write is over (the runtime reports an empty value): removed from both
    held = {DO_NOT_DISRUPT_ANNOTATION: "true"}
    done = {rc.ANNOTATION_CHECKPOINT_STEP: "100", WRITING: ""}
    out = patches(status(), [pod(0, {**done, **held}), pod(1, held)])
    assert [p[DO_NOT_DISRUPT_ANNOTATION] for p in out.values()] == [None, None]
    # between checkpoints nobody has it and nothing sets it
    out = patches(status(), [pod(0, done), pod(1)])
    assert all(DO_NOT_DISRUPT_ANNOTATION not in p for p in out.values())


def test_the_operators_own_checkpoint_request_holds_the_nodes_until_it_is_done() -> None:
    st = status(Phase.CHECKPOINTING)
    st.notice = NoticeStatus(node="n1", signal="spot-itn", reason="spot", noticed_at=NOW, request_id="r1", progress_step=120)
    out = patches(st, [pod(0), pod(1)])
    assert [p[DO_NOT_DISRUPT_ANNOTATION] for p in out.values()] == ["true", "true"]


@pytest.mark.parametrize(
    ("rank", "since"),
    [
        (1, NOW - timedelta(seconds=20)),  # only the writer rank answers for the job
        (0, NOW - timedelta(seconds=WRITE_MAX_S + 1)),  # a write longer than the bound: not believed
        (0, NOW + timedelta(hours=1)),  # a start in the future
    ],
    ids=["not-the-writer", "endless", "future"],
)
def test_a_forged_or_endless_write_does_not_pin_the_node(rank: int, since: datetime) -> None:
    pods = [pod(0, {DO_NOT_DISRUPT_ANNOTATION: "true"}), pod(1, {DO_NOT_DISRUPT_ANNOTATION: "true"})]
    pods[rank] = pod(rank, {WRITING: at(since), DO_NOT_DISRUPT_ANNOTATION: "true"})
    out = patches(status(), pods)
    assert [p[DO_NOT_DISRUPT_ANNOTATION] for p in out.values()] == [None, None]


def test_a_template_that_sets_do_not_disrupt_itself_keeps_it() -> None:
    pods = [pod(0, {DO_NOT_DISRUPT_ANNOTATION: "true"})]
    assert DO_NOT_DISRUPT_ANNOTATION not in patches(status(), pods, manage_do_not_disrupt=False).get("job-worker-0", {})


def test_malformed_timing_reports_are_rejected() -> None:
    p = pod(0, {WRITING: "soon", CKPT_TIME: "2026-13-01T00:00:00Z", DURATION: "-3"})
    assert (p.timing.writing_since, p.timing.committed_at, p.timing.write_seconds) == (None, None, None)
    assert sorted(r.annotation for r in p.rejected) == sorted([WRITING, CKPT_TIME, DURATION])


# ------------------------------------------------------------------------------ the cost figures


def test_work_at_risk_is_the_time_since_the_checkpoint_or_the_gang_start() -> None:
    ckpt = {rc.ANNOTATION_CHECKPOINT_STEP: "100", CKPT_TIME: at(NOW - timedelta(seconds=300)), DURATION: "42.5"}
    (p0,) = patches(status(), [pod(0, ckpt)]).values()
    assert p0[WORK_AT_RISK_ANNOTATION] == "300" and p0[LAST_CHECKPOINT_STEP_ANNOTATION] == "100"
    assert p0[LAST_CHECKPOINT_TIME_ANNOTATION] == at(NOW - timedelta(seconds=300))
    assert p0[CHECKPOINT_SECONDS_ANNOTATION] == "42.5" and p0[PREEMPTION_COST_TIME_ANNOTATION] == at(NOW)
    # a gang resumed from an older checkpoint: only what it trained since its start is at risk
    (p0,) = patches(status(), [pod(0, ckpt, started=NOW - timedelta(seconds=120))]).values()
    assert p0[WORK_AT_RISK_ANNOTATION] == "120"
    # a step the operator does not trust (beyond the checkpoint in its status) lends no time
    other = {**ckpt, rc.ANNOTATION_CHECKPOINT_STEP: "110"}
    (p0,) = patches(status(), [pod(0, other)]).values()
    assert p0[LAST_CHECKPOINT_STEP_ANNOTATION] == "100" and p0[LAST_CHECKPOINT_TIME_ANNOTATION] == at(NOW)


def test_the_figures_are_refreshed_every_refresh_s_not_every_reconcile() -> None:
    ckpt = {rc.ANNOTATION_CHECKPOINT_STEP: "100", CKPT_TIME: at(NOW - timedelta(seconds=300))}
    (first,) = patches(status(), [pod(0, ckpt)]).values()
    published = {**ckpt, **{k: v for k, v in first.items() if v is not None}}
    assert patches(status(), [pod(0, published)], NOW + timedelta(seconds=30)) == {}
    (later,) = patches(status(), [pod(0, published)], NOW + timedelta(seconds=REFRESH_S)).values()
    assert later[WORK_AT_RISK_ANNOTATION] == str(300 + int(REFRESH_S))
    # a new checkpoint is published at once
    newer = status(checkpoint_step=120)
    fresh = {**published, rc.ANNOTATION_CHECKPOINT_STEP: "120", CKPT_TIME: at(NOW + timedelta(seconds=5))}
    (p0,) = patches(newer, [pod(0, fresh)], NOW + timedelta(seconds=10)).values()
    assert p0[LAST_CHECKPOINT_STEP_ANNOTATION] == "120" and p0[WORK_AT_RISK_ANNOTATION] == "5"


def test_nothing_is_published_before_the_job_runs() -> None:
    assert patches(status(Phase.STARTING), [pod(0)]) == {}


def test_a_worker_is_created_with_nothing_at_risk_and_not_patched_when_it_starts_soon() -> None:
    created = NOW - timedelta(seconds=30)
    body = preemption.at_creation({"metadata": {"name": "job-worker-0", "annotations": {"team": "a"}}}, created)
    ann = body["metadata"]["annotations"]
    assert ann == {"team": "a", WORK_AT_RISK_ANNOTATION: "0", PREEMPTION_COST_TIME_ANNOTATION: at(created)}
    first = status(checkpoint_step=None)
    # started 2 s after its creation: the published 0 as of the creation stands (no PATCH)
    assert patches(first, [pod(0, ann, started=created + timedelta(seconds=2))]) == {}
    # started later than START_SLACK_S after it: readers would count the wait as training, so the
    # figure is published again as of now
    slow = created + timedelta(seconds=preemption.START_SLACK_S + 5)
    (p0,) = patches(first, [pod(0, ann, started=slow)]).values()
    assert p0 == {WORK_AT_RISK_ANNOTATION: str(int((NOW - slow).total_seconds())), PREEMPTION_COST_TIME_ANNOTATION: at(NOW)}
    # a gang resumed after a checkpoint: the checkpoint is published when it runs, as of now
    (p0,) = patches(status(), [pod(0, ann, started=created + timedelta(seconds=2))]).values()
    assert p0[LAST_CHECKPOINT_STEP_ANNOTATION] == "100" and p0[PREEMPTION_COST_TIME_ANNOTATION] == at(NOW)


def test_the_loop_creates_its_workers_with_the_cost_and_does_not_patch_them_at_start() -> None:
    w = World(node=SPOT_NODE)  # the workers stay Pending until pod_phase says otherwise
    job: Job = make_job(SPOT_SPEC)
    for _ in range(5):
        w.step(job)
        if w.workers.pods():
            break
    created = {b["metadata"]["name"]: dict(b["metadata"]["annotations"]) for b in w.workers.pods()}
    assert created and w.status.phase is Phase.STARTING
    for ann in created.values():  # in the POST: nothing at risk as of the step that made it
        assert ann[WORK_AT_RISK_ANNOTATION] == "0" and ann[PREEMPTION_COST_TIME_ANNOTATION] == at(w.now), ann
    w.pod_phase = "Running"
    w.run_to(job, Phase.RUNNING)
    w.step(job)
    assert {b["metadata"]["name"]: b["metadata"]["annotations"] for b in w.workers.pods()} == created


# ------------------------------------------------------------------------------ through the loop


def test_the_loop_sets_and_removes_do_not_disrupt_around_a_reported_write() -> None:
    w: World = spot_world()
    job: Job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    names = [b["metadata"]["name"] for b in w.workers.pods()]

    def ann(name: str) -> dict[str, str]:
        return next(b for b in w.workers.pods() if b["metadata"]["name"] == name)["metadata"]["annotations"]

    w.annotate(**{rc.ANNOTATION_PROGRESS_STEP: "50", rc.ANNOTATION_CHECKPOINT_STEP: "40", WRITING: at(w.now)})
    w.step(job)
    assert all(ann(n)[DO_NOT_DISRUPT_ANNOTATION] == "true" for n in names)
    assert all(ann(n)[LAST_CHECKPOINT_STEP_ANNOTATION] == "40" for n in names)
    w.annotate(**{rc.ANNOTATION_CHECKPOINT_STEP: "50", WRITING: "", CKPT_TIME: at(w.now)})
    w.step(job)
    assert all(DO_NOT_DISRUPT_ANNOTATION not in ann(n) for n in names)
    assert ann(names[0])[LAST_CHECKPOINT_STEP_ANNOTATION] == "50"


# ------------------------------------------------------------------------------ the runtime side


class Recording:
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def report(self, progress: RuntimeProgress) -> None:
        self.seen.append(progress.annotations())

    def checkpointed(self, event: CheckpointEvent, progress: RuntimeProgress) -> None:
        self.seen.append(progress.annotations())


def test_the_runtime_reports_the_write_while_it_lasts(tmp_path: Path) -> None:
    rec = Recording()
    guard: TrainingGuard[int] = TrainingGuard(tmp_path / "ck", reporter=rec, handle_signals=False, wall_clock=lambda: 1.7e9)
    during: list[str] = []

    def write(path: Path) -> None:
        during.append(rec.seen[-1][WRITING])
        path.write_text("state")

    guard.commit(write)
    assert during == ["2023-11-14T22:13:20Z"], "the write in progress was reported before it began"
    assert rec.seen[-1][WRITING] == "" and float(rec.seen[-1][DURATION]) >= 0
    assert set(rec.seen[-1]) <= set(rc.REPORTED_ANNOTATIONS)

    def fail(path: Path) -> None:
        raise OSError("disk gone")

    guard._last = None  # a new step's checkpoint
    with pytest.raises(Exception, match="disk gone"):
        guard.commit(fail)
    assert rec.seen[-1][WRITING] == "", "a failed write is reported over too"
