"""What a preemption would cost, told to the schedulers: annotations on every worker pod.

Schedulers that preempt (Kueue, the kube-scheduler, KAI, Volcano) and autoscalers that disrupt
nodes (Karpenter) choose victims without knowing how much training a victim would lose: none of
them reads a checkpoint (Kueue's victim order is priority, then the most recently admitted first;
kubernetes-sigs/kueue#477 asks for this and is open; Kueue v0.17, the version the e2e builds, has
no field for it). So the operator publishes it where any of them can read it, on each running
worker pod (the names in :mod:`gpuscaler.names`; the spec in docs/preemption-cost.md):

* ``gpuscaler.io/last-checkpoint-step`` / ``last-checkpoint-time``: the job's newest complete
  checkpoint (the step as the operator trusts it, :func:`gpuscaler.kube.reports.trusted_report`);
* ``gpuscaler.io/work-at-risk-seconds``: ``now - max(checkpoint time, gang start)``, the training a
  preemption now would redo, as of ``gpuscaler.io/preemption-cost-time`` (a reader adds the time
  since while the job runs; the figure is refreshed every ``preemption_cost_refresh_s`` and at
  every new checkpoint). A worker pod is created with 0 as of its creation (:func:`at_creation`),
  so a gang that starts within :data:`START_SLACK_S` costs no PATCH per pod when it starts (the
  extrapolation then counts its start-up, at most that long, as at risk); a slower start is
  published again when the pod runs;
* ``gpuscaler.io/checkpoint-seconds``: the measured write time of the last checkpoint (what a
  graceful stop costs instead);
* ``karpenter.sh/do-not-disrupt: "true"`` **only while a checkpoint is being written**: while the
  operator's own checkpoint request is pending (phase Checkpointing) or the writer rank reports a
  write in progress (``gpuscaler.io/checkpoint-writing``), believed for at most
  ``checkpoint_write_max_s`` after the write began, so a worker cannot pin its node by claiming
  to write forever. It is removed once the write is over. A job whose pod template sets the
  annotation itself keeps the template's value: the operator then does not manage it.

Only the operator writes these (the worker admission policy lets workers change only
:data:`gpuscaler.runtime.constants.REPORTED_ANNOTATIONS`). Pure: :func:`patches` says what to
write; the reconcile loop writes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.kube.checkpoint_reports import parse_utc
from gpuscaler.kube.reports import WRITER_RANK
from gpuscaler.kube.workers import PodState
from gpuscaler.names import (
    CHECKPOINT_SECONDS_ANNOTATION,
    DO_NOT_DISRUPT_ANNOTATION,
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
    PREEMPTION_COST_TIME_ANNOTATION,
    WORK_AT_RISK_ANNOTATION,
)

START_SLACK_S = 10.0
"""A work at risk published at the pod's creation (0) stands when the gang started at most this long
after it; a later start is published again when the pods run (readers would add the wait)."""
CLOCK_SKEW_S = 60.0
"""A reported time at most this far in the operator's future is taken as now (clocks differ);
further ahead it is not believed."""

Patch = dict[str, str | None]
"""Annotations to merge into a pod; None removes the key."""


@dataclass(frozen=True)
class PreemptionCost:
    """What preempting the job now would cost, as published."""

    checkpoint_step: int | None
    checkpoint_time: datetime | None
    work_at_risk_s: float
    checkpoint_s: float | None
    writing: str
    """Why a checkpoint is being written now ('' when none is): do-not-disrupt is set meanwhile."""
    gang_start: datetime | None = None
    """The earliest start of the gang's live pods (None: none has started)."""

    def annotations(self, now: datetime) -> dict[str, str]:
        """The preemption-cost annotations (without do-not-disrupt) as of ``now``."""
        out = {
            WORK_AT_RISK_ANNOTATION: f"{self.work_at_risk_s:.0f}",
            PREEMPTION_COST_TIME_ANNOTATION: _rfc3339(now),
        }
        if self.checkpoint_step is not None:
            out[LAST_CHECKPOINT_STEP_ANNOTATION] = str(self.checkpoint_step)
        if self.checkpoint_time is not None:
            out[LAST_CHECKPOINT_TIME_ANNOTATION] = _rfc3339(self.checkpoint_time)
        if self.checkpoint_s is not None:
            out[CHECKPOINT_SECONDS_ANNOTATION] = f"{self.checkpoint_s:.1f}"
        return out


def _rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _believed(t: datetime | None, now: datetime) -> datetime | None:
    """A reported time, capped at now; None when it lies beyond the clock skew."""
    if t is None or t > now + timedelta(seconds=CLOCK_SKEW_S):
        return None
    return min(t, now)


def _live(st: TrainingJobStatus, pods: Iterable[PodState]) -> list[PodState]:
    return [p for p in pods if p.attempt == st.attempt and not p.deleting and not p.succeeded and not p.failed]


def assess(st: TrainingJobStatus, pods: list[PodState], now: datetime, write_max_s: float) -> PreemptionCost:
    """The job's preemption cost now, from its trusted status and the writer rank's timing reports.

    The checkpoint step is ``status.progress.checkpointStep`` (already checked); its time is the
    writer's reported commit time when the writer reports that same step (else the time the
    operator published before for it, else now: first seen). The gang's start is the earliest
    ``startTime`` of its live pods. With ``c`` the checkpoint time and ``g`` the gang start:
    ``work_at_risk = now - max(c, g)`` (a checkpoint of an earlier gang was already resumed from).

    Args:
        st: The job's status (after this step's progress update).
        pods: Its worker pods.
        now: The time.
        write_max_s: Longest a reported write in progress is believed.

    Returns:
        The cost and whether a checkpoint is being written.
    """
    live = _live(st, pods)
    writer = next((p for p in live if p.rank == WRITER_RANK), None)
    step = st.progress.checkpoint_step
    ckpt_time: datetime | None = None
    if step is not None:
        if writer is not None and writer.checkpoint_step == step:
            ckpt_time = _believed(writer.timing.committed_at, now)
        if ckpt_time is None:
            before = {p.name: dict(p.published) for p in live}
            ckpt_time = next(
                (
                    _believed(parse_utc(ann.get(LAST_CHECKPOINT_TIME_ANNOTATION, "")), now)
                    for ann in before.values()
                    if ann.get(LAST_CHECKPOINT_STEP_ANNOTATION) == str(step)
                ),
                None,
            ) or now
    starts = [t for t in (_believed(p.started_at, now) for p in live) if t is not None]
    gang = min(starts) if starts else now
    since = max(ckpt_time, gang) if ckpt_time is not None else gang
    writing = ""
    notice = st.notice
    if st.phase == Phase.CHECKPOINTING and notice is not None and notice.request_id:
        writing = f"checkpoint {notice.request_id} requested by the operator"
    elif writer is not None and writer.timing.writing_since is not None:
        began = _believed(writer.timing.writing_since, now)
        if began is not None and (now - began).total_seconds() <= write_max_s:
            writing = f"{writer.name} writes a checkpoint since {_rfc3339(began)}"
    seconds = writer.timing.write_seconds if writer is not None else None
    return PreemptionCost(
        checkpoint_step=step,
        checkpoint_time=ckpt_time,
        work_at_risk_s=max((now - since).total_seconds(), 0.0),
        checkpoint_s=min(seconds, write_max_s) if seconds is not None else None,
        writing=writing,
        gang_start=min(starts) if starts else None,
    )


def at_creation(pod: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A new worker pod's manifest with nothing at risk yet, as of its creation (``now``).

    Nothing of the new gang has trained, so ``work-at-risk-seconds`` is 0 at ``now``. Published in
    the pod's POST, it spares the PATCH of each pod when the gang starts; :func:`patches` publishes
    again when the gang started more than :data:`START_SLACK_S` after ``now``. The checkpoint
    figures of an earlier gang are published when the pods run, as before.

    Args:
        pod: The pod manifest (:func:`gpuscaler.kube.workers.worker_pod`); changed in place.
        now: The time of the create.

    Returns:
        ``pod``, with the two annotations in ``metadata.annotations``.
    """
    meta = pod.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        **PreemptionCost(None, None, 0.0, None, "").annotations(now),
    }
    return pod


def patches(
    st: TrainingJobStatus,
    pods: list[PodState],
    now: datetime,
    *,
    write_max_s: float,
    refresh_s: float,
    manage_do_not_disrupt: bool = True,
) -> dict[str, Patch]:
    """The annotation patches of each live worker pod (only pods whose annotations must change).

    A pod is patched when ``do-not-disrupt`` must be set or removed, when the checkpoint (step,
    time, write seconds) changed, or when its published work at risk is older than ``refresh_s`` or
    was published more than :data:`START_SLACK_S` before the gang started (at the pod's creation).

    Args:
        st: The job's status (after this step's progress update).
        pods: Its worker pods.
        now: The time.
        write_max_s: Longest a reported write in progress is believed (``settings.checkpoint_write_max_s``).
        refresh_s: Oldest a published work at risk may get (``settings.preemption_cost_refresh_s``).
        manage_do_not_disrupt: False when the job's template sets ``karpenter.sh/do-not-disrupt``
            itself: the template's value stays.

    Returns:
        Pod name -> annotations to merge (None removes a key).
    """
    if st.phase not in (Phase.RUNNING, Phase.CHECKPOINTING):
        return {}
    live = [p for p in _live(st, pods) if p.running]
    if not live:
        return {}
    cost = assess(st, pods, now, write_max_s)
    wanted = cost.annotations(now)
    out: dict[str, Patch] = {}
    for p in live:
        have = dict(p.published)
        patch: Patch = {}
        if manage_do_not_disrupt:
            if cost.writing and have.get(DO_NOT_DISRUPT_ANNOTATION) != "true":
                patch[DO_NOT_DISRUPT_ANNOTATION] = "true"
            elif not cost.writing and DO_NOT_DISRUPT_ANNOTATION in have:
                patch[DO_NOT_DISRUPT_ANNOTATION] = None
        stale = _stale(have, now, refresh_s, cost.gang_start)
        for key, value in wanted.items():
            if have.get(key) != value and (stale or key not in _MOVING):
                patch[key] = value
        if patch and any(k in wanted for k in patch):  # whatever is written is written as of now
            patch.update({k: v for k, v in wanted.items() if k in _MOVING})
        if patch:
            out[p.name] = patch
    return out


_MOVING = frozenset({WORK_AT_RISK_ANNOTATION, PREEMPTION_COST_TIME_ANNOTATION})
"""The annotations that change with the clock alone: refreshed every ``refresh_s``, or with any other change."""


def _stale(have: Mapping[str, str], now: datetime, refresh_s: float, gang_start: datetime | None = None) -> bool:
    at = parse_utc(have.get(PREEMPTION_COST_TIME_ANNOTATION, ""))
    if at is None or (now - at).total_seconds() >= refresh_s:
        return True
    return gang_start is not None and (gang_start - at).total_seconds() > START_SLACK_S


def measured_write_s(st: TrainingJobStatus, pods: list[PodState], write_max_s: float) -> float | None:
    """The writer rank's measured checkpoint write seconds (``gpuscaler.io/checkpoint-duration`` of
    the current attempt), bounded by ``write_max_s``; None before its first checkpoint."""
    writer = next((p for p in _live(st, pods) if p.rank == WRITER_RANK), None)
    seconds = writer.timing.write_seconds if writer is not None else None
    return min(seconds, write_max_s) if seconds is not None else None
