"""Worker-written annotations: forged or out-of-range values are ignored with an Event, only the
writer rank's pod counts, acks count only for the request the operator made and only with a
checkpoint at or after it, and a forged ack cannot make the operator stop the gang early."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

import pytest

from gpuscaler.api.status import NoticeStatus, Phase, Progress, TrainingJobStatus
from gpuscaler.controller.reconcile import Job
from gpuscaler.kube import reports
from gpuscaler.kube.workers import NO_RANK, pod_state
from gpuscaler.names import ConditionType
from gpuscaler.runtime import constants as rc
from gpuscaler.settings import Settings
from loop_harness import SPOT_SPEC, T0, World, first_plan, make_job, spec, spot_world

STEP, SAMPLES, CKPT, ACK = (
    rc.ANNOTATION_PROGRESS_STEP,
    rc.ANNOTATION_PROGRESS_SAMPLES,
    rc.ANNOTATION_CHECKPOINT_STEP,
    rc.ANNOTATION_CHECKPOINT_ACK,
)
SPOT_ITN = [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]


def pod(ann: dict[str, str], *, rank: str | None = "0", attempt: str = "1", name: str = "job-worker-0") -> Any:
    labels = {"gpuscaler.io/attempt": attempt}
    if rank is not None:
        labels["gpuscaler.io/rank"] = rank
    return pod_state({"metadata": {"name": name, "labels": labels, "annotations": ann}, "status": {"phase": "Running"}})


# ------------------------------------------------------------------------------ types and ranges


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (STEP, "-5"),
        (STEP, "1e3"),
        (STEP, "1_000"),
        (STEP, " 12"),
        (STEP, "12.0"),
        (STEP, "99999999999999999"),  # 17 digits
        (STEP, "9" * 16),  # above MAX_COUNT
        (CKPT, "abc"),
        (SAMPLES, "nan"),
        (SAMPLES, "inf"),
        (SAMPLES, "-1"),
        (SAMPLES, "1e400"),
        (SAMPLES, "0x10"),
        (ACK, "a b"),
        (ACK, "x" * 64),
        (ACK, "<script>"),
        (ACK, ""),
    ],
)
def test_values_of_the_wrong_type_or_range_are_dropped_and_listed(key: str, value: str) -> None:
    state = pod({key: value})
    got = {STEP: state.step, CKPT: state.checkpoint_step, SAMPLES: state.samples, ACK: state.checkpoint_ack}
    assert got[key] is None
    (rej,) = state.rejected
    assert (rej.pod, rej.annotation, rej.value) == ("job-worker-0", key, value)
    assert key in rej.describe() and "ignored" in rej.describe()


def test_what_the_runtime_writes_passes() -> None:
    state = pod({STEP: "152", SAMPLES: "38912.0", CKPT: "150", ACK: "20260101T000000-000-a1"})
    assert (state.step, state.samples, state.checkpoint_step, state.checkpoint_ack) == (
        152, 38912.0, 150, "20260101T000000-000-a1")
    assert not state.rejected
    assert pod({SAMPLES: "1.5e+06"}).samples == 1.5e6


def test_a_pod_without_a_rank_label_is_no_rank() -> None:
    assert pod({}, rank=None).rank == NO_RANK
    assert pod({}, rank="zero").rank == NO_RANK


# ------------------------------------------------------------------------------ against the job


def status(**changes: Any) -> TrainingJobStatus:
    st = TrainingJobStatus(**{"plan": first_plan(spec(SPOT_SPEC)), "attempt": 1, **changes})  # 400 steps of 256
    assert st.plan is not None and st.plan.total_samples == 400 * 256
    return st


def test_only_the_writer_rank_of_this_attempt_counts_and_its_pod_is_named() -> None:
    st = status()
    rep = reports.trusted_report(st, [pod({STEP: "90"}, rank="1", name="job-worker-1"),
                                      pod({STEP: "80"}, attempt="0", name="old"),
                                      pod({STEP: "70"})])
    assert (rep.writer, rep.step) == ("job-worker-0", 70)
    assert not rep.rejected
    assert reports.trusted_report(st, [pod({STEP: "90"}, rank=None)]).step is None


def test_values_beyond_the_plan_are_rejected() -> None:
    st = status()
    rep = reports.trusted_report(st, [pod({STEP: "401", SAMPLES: str(401 * 256 + 1), CKPT: "10"})])
    assert rep.step is None and rep.samples is None and rep.checkpoint_step is None
    whys = {r.annotation: r.why for r in rep.rejected}
    assert "400 steps" in whys[STEP] and "samples" in whys[SAMPLES] and "rejected value" in whys[CKPT]
    ok = reports.trusted_report(st, [pod({STEP: "400", SAMPLES: str(400 * 256), CKPT: "400"})])
    assert (ok.step, ok.samples, ok.checkpoint_step, ok.rejected) == (400, 400 * 256, 400, ())


def test_a_checkpoint_ahead_of_its_progress_is_rejected() -> None:
    rep = reports.trusted_report(status(), [pod({STEP: "100", CKPT: "120"})])
    assert rep.step is None and rep.checkpoint_step is None, "a report that fails is dropped whole"
    whys = {r.annotation: r.why for r in rep.rejected}
    assert "beyond the step reported with it (100)" in whys[CKPT] and "rejected value" in whys[STEP]


def notice(rid: str = "20260101T000010-000-a1", step: int = 150) -> NoticeStatus:
    return NoticeStatus(node="n", signal="aws-spot-itn", noticed_at=T0, request_id=rid, progress_step=step)


def test_acks_count_only_for_the_pending_request_with_a_checkpoint_after_it() -> None:
    rid = "20260101T000010-000-a1"
    st = status(notice=notice(rid, 150), progress=Progress(step=150))
    requested = {rc.ANNOTATION_CHECKPOINT_REQUESTED: rid}
    good = reports.trusted_report(st, [pod({**requested, STEP: "152", CKPT: "152", ACK: rid})])
    assert good.acked and not good.rejected
    # an id the operator never sent
    forged = reports.trusted_report(st, [pod({**requested, STEP: "152", CKPT: "152", ACK: "made-up"})])
    assert not forged.acked and forged.rejected[0].why == "no such checkpoint request was made"
    # the right id, but no checkpoint since the request: the ack is not believed
    early = reports.trusted_report(st, [pod({**requested, STEP: "152", CKPT: "100", ACK: rid})])
    assert not early.acked and "at or after step 150" in early.rejected[0].why
    bare = reports.trusted_report(st, [pod({**requested, ACK: rid})])
    assert not bare.acked and bare.rejected
    # from another rank: only the writer answers for the job
    other = reports.trusted_report(st, [pod({**requested, STEP: "152", CKPT: "152", ACK: rid}, rank="1")])
    assert not other.acked and "only rank 0" in other.rejected[0].why
    # an earlier request of this gang answered: neither an ack now nor a forgery
    old = reports.trusted_report(st, [pod({rc.ANNOTATION_CHECKPOINT_REQUESTED: "r0", ACK: "r0", STEP: "152", CKPT: "152"})])
    assert not old.acked and not old.rejected


# ------------------------------------------------------------------------------ the loop


def running(w: World) -> Job:
    job = make_job(SPOT_SPEC)
    w.run_to(job, Phase.RUNNING)
    return job


def spot_notice(w: World, job: Job) -> list[str]:
    """An AWS spot-itn taint on the job's node, and the loop's next step: its Event reasons."""
    node = next(iter(w.nodes))
    w.nodes[node]["spec"]["taints"] = SPOT_ITN
    return w.step(job)


def false_report_believed(w: World) -> Job:
    """A running job whose worker reports step 60 (checkpoint 50), then a minute later a false step 150
    (checkpoint 150; the job is at about 70): in range and within the rate, so believed."""
    job = running(w)
    w.annotate(**{STEP: "60", SAMPLES: str(60 * 256), CKPT: "50"})
    w.step(job, seconds=60)
    w.annotate(**{STEP: "150", SAMPLES: str(150 * 256), CKPT: "150"})
    w.step(job, seconds=10)
    return job


def condition(st: TrainingJobStatus, ctype: str) -> Any:
    return next((c for c in st.conditions if c.type == ctype), None)


def test_forged_progress_is_ignored_with_one_event_and_a_condition() -> None:
    w = spot_world()
    job = running(w)
    w.annotate(**{STEP: "120", SAMPLES: str(120 * 256), CKPT: "100"})
    assert "ReportRejected" not in w.step(job)
    assert (w.status.progress.step, w.status.progress.checkpoint_step) == (120, 100)
    assert w.status.progress.reported_by == "job-worker-0"
    assert condition(w.status, ConditionType.WORKER_REPORTS) is None
    w.annotate(**{STEP: "1000000", SAMPLES: "inf", CKPT: "399"})
    reasons = w.step(job)
    assert reasons.count("ReportRejected") == 1
    assert w.status.progress.step == 120 and w.status.progress.samples == 120 * 256
    assert w.status.progress.checkpoint_step == 100 and w.status.progress.percent < 50
    cond = condition(w.status, ConditionType.WORKER_REPORTS)
    assert cond.status == "False" and "job-worker-0" in cond.message and "1000000" in cond.message
    assert "ReportRejected" not in w.step(job) + w.step(job), "one Event per change, not per reconcile"
    # a lower report is not applied either (the status is monotone) and the condition clears
    w.annotate(**{STEP: "110", SAMPLES: str(110 * 256), CKPT: "100"})
    w.step(job)
    assert w.status.progress.step == 120 and condition(w.status, ConditionType.WORKER_REPORTS).status == "True"


def to_checkpointing(w: World, job: Job) -> str:
    w.annotate(**{STEP: "150", SAMPLES: str(150 * 256), CKPT: "100"})
    w.step(job)
    spot_notice(w, job)
    assert w.status.phase is Phase.CHECKPOINTING and w.status.notice is not None
    assert w.status.notice.progress_step == 150
    return w.status.notice.request_id


@pytest.mark.parametrize(
    "forged",
    [
        {ACK: "made-up"},  # an id the operator never sent
        {ACK: "{rid}", CKPT: "100"},  # the request's id without a checkpoint since
        {ACK: "{rid}", CKPT: "9999", STEP: "9999"},  # with a checkpoint beyond the plan
    ],
    ids=["unknown-id", "no-new-checkpoint", "out-of-range-checkpoint"],
)
def test_a_forged_ack_does_not_stop_the_gang_or_release_nodes(forged: dict[str, str]) -> None:
    w = spot_world()
    job = running(w)
    rid = to_checkpointing(w, job)
    node = next(iter(w.nodes))
    w.annotate(**{k: v.format(rid=rid) for k, v in forged.items()})
    for _ in range(5):
        reasons = w.step(job, seconds=10)
        assert w.status.phase is Phase.CHECKPOINTING, w.status.message
        assert not w.workers.deleted and node in w.nodes and not w.provider.released
    assert "ReportRejected" in reasons or condition(w.status, ConditionType.WORKER_REPORTS).status == "False"
    # the real checkpoint then ends the handshake at once
    w.annotate(**{ACK: rid, CKPT: "153", STEP: "153", SAMPLES: str(153 * 256)})
    assert "Checkpointed" in w.step(job)
    assert w.status.phase is Phase.RECOVERING and w.status.interruption_history[-1].checkpoint_acked


def test_without_a_real_checkpoint_the_handshake_waits_for_the_deadline() -> None:
    w = spot_world()
    job = running(w)
    rid = to_checkpointing(w, job)
    w.annotate(**{ACK: rid})  # acked, but checkpoint-step is still the old 100
    w.step(job, seconds=100)
    assert w.status.phase is Phase.CHECKPOINTING
    reasons = w.step(job, seconds=21)  # past the 120 s notice
    assert w.status.phase is Phase.RECOVERING and "CheckpointMissed" in reasons
    rec = w.status.interruption_history[-1]
    assert not rec.checkpoint_acked and rec.checkpoint_step == 100


def test_loss_refinement_uses_the_writers_checked_checkpoint() -> None:
    st = status(progress=Progress(step=130, checkpoint_step=100))
    from gpuscaler.controller import interruptions as spot

    spot.record(st, node="n0", signal="node-deleted", acked=False, now=T0, cfg=spot.SpotConfig.from_settings(Settings()))
    spot.settle_loss(st)
    st.attempt = 2
    spot.recovered(st, T0 + timedelta(seconds=5))
    rec = st.interruption_history[-1]
    # another rank's (or an out-of-range) resume point is not taken
    spot.refine_loss(st, [pod({CKPT: "129", STEP: "129"}, rank="1", attempt="2")], T0 + timedelta(seconds=6))
    spot.refine_loss(st, [pod({CKPT: "500", STEP: "500"}, attempt="2")], T0 + timedelta(seconds=6))
    assert rec.checkpoint_step == 100 and rec.lost_steps == 30
    spot.refine_loss(st, [pod({CKPT: "120", STEP: "120"}, attempt="2")], T0 + timedelta(seconds=6))
    assert rec.checkpoint_step == 120 and rec.lost_steps == 10


# ------------------------------------------------------------------------------ history and time


def test_the_docs_list_exactly_the_worker_writable_annotations_the_code_reads() -> None:
    from pathlib import Path

    text = Path(__file__).resolve().parents[1].joinpath("docs", "security.md").read_text()
    block = text.split("<!-- worker-writable annotations -->", 1)[1].split("<!-- end -->", 1)[0]
    listed = set(re.findall(r"`(gpuscaler\.io/[a-z-]+)`", block))
    assert listed == set(reports.ACCEPTED_ANNOTATIONS) == set(rc.REPORTED_ANNOTATIONS)
    # and the code reads every one of them: each changes what pod_state/parse returns
    seen = pod({STEP: "1", SAMPLES: "2", CKPT: "1", ACK: "a", rc.ANNOTATION_CHECKPOINT_TIME: "2026-01-01T00:00:00Z",
                rc.ANNOTATION_RUNTIME_PHASE: rc.RUNTIME_PHASE_PREEMPTED})
    assert (seen.step, seen.samples, seen.checkpoint_step, seen.checkpoint_ack, seen.runtime_phase) == (
        1, 2.0, 1, "a", rc.RUNTIME_PHASE_PREEMPTED)
    assert seen.timing.committed_at == T0


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00", "1767225600", "yesterday", "2026-13-01T00:00:00Z"])
def test_a_checkpoint_time_without_a_zone_or_not_a_time_is_rejected(value: str) -> None:
    state = pod({rc.ANNOTATION_CHECKPOINT_TIME: value, STEP: "5"})
    assert state.timing.committed_at is None and state.rejected[0].annotation == rc.ANNOTATION_CHECKPOINT_TIME
    rep = reports.trusted_report(status(), [state])
    assert rep.step is None, "a report that fails is dropped whole"


def test_progress_faster_than_the_throughput_band_allows_is_not_believed() -> None:
    st = status(start_time=T0)
    plan = st.plan
    assert plan is not None and plan.throughput_p90 is not None
    now = T0 + timedelta(seconds=10)
    limits = reports.rate_limits(st, now)
    assert limits is not None
    # (10 s + 60 s of grace) at 3x the band's fast end, in steps of 256 samples
    assert limits.max_step == math.ceil(reports.RATE_MARGIN * plan.throughput_p90 * 70 / 256) + 1 < 400
    ok = reports.trusted_report(st, [pod({STEP: str(limits.max_step), SAMPLES: "1"})], now)
    assert ok.step == limits.max_step and not ok.rejected
    fast = reports.trusted_report(st, [pod({STEP: str(limits.max_step + 1), SAMPLES: "1", CKPT: "1"})], now)
    assert fast.step is None and fast.samples is None and fast.checkpoint_step is None
    assert "throughput band" in {r.annotation: r.why for r in fast.rejected}[STEP]
    # the same report is believed once enough time has passed
    later = reports.trusted_report(st, [pod({STEP: str(limits.max_step + 1)})], now + timedelta(seconds=10))
    assert later.step == limits.max_step + 1


def test_a_checkpoint_time_in_the_future_drops_the_report() -> None:
    st = status(start_time=T0)
    rep = reports.trusted_report(st, [pod({STEP: "5", CKPT: "5", rc.ANNOTATION_CHECKPOINT_TIME: "2026-01-01T01:00:00Z"})],
                                 T0 + timedelta(seconds=30))
    assert rep.step is None and rep.checkpoint_step is None
    assert "in the future" in {r.annotation: r.why for r in rep.rejected}[rc.ANNOTATION_CHECKPOINT_TIME]


def test_one_false_in_range_report_does_not_make_the_real_ack_rejected() -> None:
    w = spot_world()
    job = false_report_believed(w)
    assert w.status.progress.step == 150, "in range and within the rate: believed"
    w.annotate(**{STEP: "75", SAMPLES: str(75 * 256), CKPT: "50"})  # the real runtime's next report
    w.step(job, seconds=10)
    assert w.status.progress.checkpoint_step == 150, "checkpoint steps never go backwards in the status"
    spot_notice(w, job)
    assert w.status.phase is Phase.CHECKPOINTING and w.status.notice is not None
    assert w.status.notice.progress_step == 75, "asked at this attempt's last believed step"
    rid = w.status.notice.request_id
    w.annotate(**{STEP: "80", SAMPLES: str(80 * 256), CKPT: "80", ACK: rid})
    assert "Checkpointed" in w.step(job, seconds=5)
    assert w.status.interruption_history[-1].checkpoint_acked


def test_a_false_report_just_before_the_request_does_not_reject_the_real_answer() -> None:
    w = spot_world()
    job = false_report_believed(w)  # the false report is the last before the notice
    spot_notice(w, job)
    rid = w.status.notice.request_id if w.status.notice else ""
    assert w.status.notice is not None and w.status.notice.progress_step == 150
    # the real answer: a checkpoint at its real step 80, completed after the request
    done = (w.now + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    w.annotate(**{STEP: "80", SAMPLES: str(80 * 256), CKPT: "80", ACK: rid, rc.ANNOTATION_CHECKPOINT_TIME: done})
    assert "Checkpointed" in w.step(job, seconds=5)
    # an old checkpoint with the request's id is still no answer
    assert w.status.interruption_history[-1].checkpoint_acked


def test_after_a_node_loss_a_notice_before_catching_up_takes_the_real_checkpoint() -> None:
    w = spot_world()
    job = running(w)
    w.annotate(**{STEP: "150", SAMPLES: str(150 * 256), CKPT: "100"})
    w.step(job, seconds=120)
    assert w.status.progress.step == 150
    w.lose_nodes()
    w.run_to(job, Phase.RUNNING, limit=40)
    assert w.status.attempt == 2 and w.status.interruption_history[-1].checkpoint_step == 100
    w.annotate(**{STEP: "130", SAMPLES: str(130 * 256), CKPT: "100"})  # resumed at 100, not caught up
    w.step(job, seconds=30)
    spot_notice(w, job)
    assert w.status.notice is not None and w.status.notice.progress_step == 130
    rid = w.status.notice.request_id
    w.annotate(**{STEP: "131", SAMPLES: str(131 * 256), CKPT: "131", ACK: rid})  # no checkpoint-time: the step decides
    reasons = w.step(job, seconds=5)
    assert "Checkpointed" in reasons and "CheckpointMissed" not in reasons
    assert w.status.progress.checkpoint_step == 131


def test_before_the_new_gang_reports_the_request_asks_at_the_last_committed_checkpoint() -> None:
    st = status(progress=Progress(step=150, checkpoint_step=100), attempt=2)
    assert reports.asked_step(st, [pod({}, attempt="2")], T0) == 100
    assert reports.asked_step(st, [pod({STEP: "120"}, attempt="2")], T0) == 120
    assert reports.asked_step(st, [pod({STEP: "140"}, attempt="1")], T0) == 100, "an old attempt's pod is not asked"
