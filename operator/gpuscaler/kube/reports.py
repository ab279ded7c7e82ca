r"""What the operator believes of the annotations workers write: every value checked and bounded.

Workers report through their own pod's annotations (:data:`gpuscaler.runtime.constants.REPORTED_ANNOTATIONS`,
written by :class:`~gpuscaler.runtime.kube_reporter.KubeReporter`). Anything that can patch a pod
can write them (a worker without the admission policy, a user with ``patch`` on pods in the
namespace), and the operator acts on them: the progress shown and charged against the deadline,
the checkpoint step a re-plan resumes from (the samples left), and the acknowledgement that ends
the checkpoint handshake and lets the gang stop and its nodes go. So nothing is taken as written:

* **Types and ranges** (:func:`parse`, per pod, called by :func:`gpuscaler.kube.workers.pod_state`):
  steps are decimal integers, samples finite non-negative decimals, both at most
  :data:`MAX_COUNT`; an acknowledgement is a short id of the request alphabet; checkpoint times
  are strict RFC 3339 UTC and write seconds finite, non-negative and at most
  :data:`~gpuscaler.kube.checkpoint_reports.MAX_SECONDS`. Anything else is dropped and listed in
  :attr:`PodState.rejected <gpuscaler.kube.workers.PodState.rejected>`.
* **Who wrote it** (:func:`trusted_report`, per job, with its status): only the writer rank's pod
  (rank :data:`WRITER_RANK`: it writes the checkpoints and answers for the job, as
  :class:`~gpuscaler.runtime.guard.TrainingGuard` does) of the current gang attempt counts; the
  values are recorded with that pod's name (``status.progress.reportedBy``).
* **Against the plan**: no step beyond the plan's steps (``ceil(totalSamples / globalBatch)``), no
  samples beyond its samples plus one global batch, no checkpoint beyond the step reported with it.
* **Against the job's history and time** (:func:`rate_limits`, when the caller passes ``now``):
  progress moves at most as fast as the plan's throughput band allows. From the status's last
  believed progress ``(s0, n0)`` at ``t0`` (``status.progress.updatedAt``, else the job's start or
  the plan's time), a report at ``now`` is believed only while

  .. math::

      step \le s_0 + \lceil r_{hi} (now - t_0 + g) / B \rceil + 1, \qquad
      samples \le n_0 + r_{hi} (now - t_0 + g) + B

  with :math:`r_{hi} =` :data:`RATE_MARGIN` :math:`\times \max(throughput, throughput_{p90})`,
  :math:`B` the global batch and :math:`g =` :data:`RATE_GRACE_S`. A checkpoint time in the future
  (beyond :data:`CLOCK_SKEW_S`) is refused too.
* **A report that fails is dropped whole**: when any of the writer's step, samples, checkpoint step
  or checkpoint time fails a check, none of them is taken (no floor moves on a report that is
  partly false); an acknowledgement is judged on its own.
* **Monotone**: the loop never lowers ``status.progress`` step, samples or checkpoint step on a
  report (a lower report is legitimate after a resume from a checkpoint, and is then not applied
  until it passes the old value), and a checkpoint is never ahead of the progress it is reported with.
* **Acknowledgements** only for the request the operator made (the pending
  ``status.notice.requestId``, which it also wrote on the pod); an id it never sent is rejected.
  The writer's ack answers *that request*: it counts with a checkpoint at or after the step the
  operator asked at (``status.notice.progressStep``: this attempt's last believed step when it
  asked, or the checkpoint the attempt resumed from when it had reported none; never the highest
  step of an earlier attempt, see :func:`asked_step`), or with a checkpoint completed after the
  request (``checkpoint-time`` no earlier than ``status.notice.noticedAt`` less
  :data:`CLOCK_SKEW_S`: a false in-range progress report made just before the request cannot
  make the operator refuse the real answer). Without either, the handshake waits for the notice's
  deadline as if nothing had been acknowledged: an ack with no checkpoint since the request
  cannot stop the gang and release its nodes before the job has checkpointed.

Rejected values are posted as a Warning Event and kept in the ``WorkerReports`` condition by the
reconcile loop (:mod:`gpuscaler.controller.reconcile`); this module is pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuscaler.api.status import TrainingJobStatus
from gpuscaler.kube.checkpoint_reports import MAX_SECONDS, CheckpointTiming, parse_utc
from gpuscaler.runtime import constants as rc

if TYPE_CHECKING:
    from gpuscaler.kube.workers import PodState

WRITER_RANK = 0
"""The rank whose reports count: the checkpoint writer (``TrainingGuard(writer=rank == 0)``);
the other ranks read checkpoints and never acknowledge."""
MAX_COUNT = 10**15
"""Largest step or sample count taken at all: far beyond any training run (a trillion steps), and
below 2**53, so the value stays exact as a float and in JSON."""
_INTEGER = re.compile(r"[0-9]{1,16}")
_DECIMAL = re.compile(r"[0-9]{1,16}(\.[0-9]{1,16})?([eE]\+?[0-9]{1,2})?")
_ACK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,62}")
"""A checkpoint request id: what :func:`gpuscaler.controller.interruptions.request_id` makes, or
any id of up to 63 characters of this alphabet."""
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")
SHOWN_CHARS = 40
"""A rejected value is quoted in Events and conditions up to this many characters."""
RATE_MARGIN = 3.0
"""How much faster than the fast end of the plan's throughput band (its 90th percentile) progress
may move and still be believed. The band's log-space sigma is about 0.3 (``status.plan.
throughputLogSigma``), so 3x the P90 is beyond 4 sigma of the model's error above the P90."""
RATE_GRACE_S = 60.0
"""Seconds of progress at the fastest rate allowed on top of the time elapsed: the runtime's
report interval (:data:`gpuscaler.runtime.constants.DEFAULT_REPORT_INTERVAL_S`), the watch's
delay and the reconcile's, so a report written just before it is read is not refused."""
CLOCK_SKEW_S = 5.0
"""Seconds a worker's clock may differ from the operator's (the runtime writes checkpoint times
to the second)."""
ACCEPTED_ANNOTATIONS: tuple[str, ...] = (
    rc.ANNOTATION_PROGRESS_STEP,
    rc.ANNOTATION_PROGRESS_SAMPLES,
    rc.ANNOTATION_CHECKPOINT_STEP,
    rc.ANNOTATION_CHECKPOINT_TIME,
    rc.ANNOTATION_CHECKPOINT_ACK,
    rc.ANNOTATION_RUNTIME_PHASE,
    rc.ANNOTATION_CHECKPOINT_WRITING,
    rc.ANNOTATION_CHECKPOINT_DURATION,
)
"""Every worker-written annotation the operator reads (:func:`parse` and
:func:`gpuscaler.kube.workers.pod_state`); the same set as
:data:`gpuscaler.runtime.constants.REPORTED_ANNOTATIONS` and docs/security.md list
(tests/test_worker_reports.py checks all three)."""


@dataclass(frozen=True)
class Rejected:
    """One annotation value the operator ignored, and why."""

    pod: str
    annotation: str
    value: str
    why: str

    def describe(self) -> str:
        """``pod: annotation='value' ignored (why)`` (the value shortened)."""
        shown = self.value if len(self.value) <= SHOWN_CHARS else self.value[:SHOWN_CHARS] + "..."
        return f"{self.pod}: {self.annotation}={shown!r} ignored ({self.why})"


@dataclass(frozen=True)
class Parsed:
    """A pod's reported values that passed the type and range checks (None: absent or rejected)."""

    step: int | None = None
    samples: float | None = None
    checkpoint_step: int | None = None
    checkpoint_ack: str | None = None
    rejected: tuple[Rejected, ...] = ()
    timing: CheckpointTiming = field(default_factory=CheckpointTiming)
    """The checkpoint-timing reports (:mod:`gpuscaler.kube.checkpoint_reports`)."""


def _count(pod: str, key: str, raw: object, pattern: re.Pattern[str], out: list[Rejected]) -> float | None:
    text = str(raw)
    if not pattern.fullmatch(text):
        what = "a whole number" if pattern is _INTEGER else "a non-negative decimal number"
        out.append(Rejected(pod, key, text, f"not {what}"))
        return None
    value = float(text)
    if not math.isfinite(value) or value > MAX_COUNT:
        out.append(Rejected(pod, key, text, f"above {MAX_COUNT:.0e}"))
        return None
    return value


def parse(pod: str, annotations: Mapping[str, object]) -> Parsed:
    """The reported values of one pod, each checked for its type and range.

    Args:
        pod: The pod's name (recorded with each rejection).
        annotations: The pod's ``metadata.annotations``.

    Returns:
        The values that passed, and what was rejected.
    """
    out: list[Rejected] = []
    step = ckpt = samples = None
    if rc.ANNOTATION_PROGRESS_STEP in annotations:
        v = _count(pod, rc.ANNOTATION_PROGRESS_STEP, annotations[rc.ANNOTATION_PROGRESS_STEP], _INTEGER, out)
        step = None if v is None else int(v)
    if rc.ANNOTATION_CHECKPOINT_STEP in annotations:
        v = _count(pod, rc.ANNOTATION_CHECKPOINT_STEP, annotations[rc.ANNOTATION_CHECKPOINT_STEP], _INTEGER, out)
        ckpt = None if v is None else int(v)
    if rc.ANNOTATION_PROGRESS_SAMPLES in annotations:
        samples = _count(pod, rc.ANNOTATION_PROGRESS_SAMPLES, annotations[rc.ANNOTATION_PROGRESS_SAMPLES], _DECIMAL, out)
    ack: str | None = None
    if rc.ANNOTATION_CHECKPOINT_ACK in annotations:
        text = str(annotations[rc.ANNOTATION_CHECKPOINT_ACK])
        if _ACK.fullmatch(text):
            ack = text
        else:
            out.append(Rejected(pod, rc.ANNOTATION_CHECKPOINT_ACK, text, "not a checkpoint request id"))
    timing = _timing(pod, annotations, out)
    return Parsed(step, samples, ckpt, ack, tuple(out), timing)


def _timing(pod: str, annotations: Mapping[str, object], out: list[Rejected]) -> CheckpointTiming:
    """The checkpoint-timing reports of a pod that pass their checks; the others go to ``out``."""
    times: dict[str, datetime | None] = {}
    for key in (rc.ANNOTATION_CHECKPOINT_WRITING, rc.ANNOTATION_CHECKPOINT_TIME):
        text = str(annotations.get(key, ""))
        times[key] = parse_utc(text) if text else None
        if text and times[key] is None:
            out.append(Rejected(pod, key, text, "not an RFC 3339 UTC time"))
    seconds: float | None = None
    if rc.ANNOTATION_CHECKPOINT_DURATION in annotations:
        text = str(annotations[rc.ANNOTATION_CHECKPOINT_DURATION])
        value = float(text) if _SECONDS.fullmatch(text) else math.nan
        if math.isfinite(value) and value <= MAX_SECONDS:
            seconds = value
        else:
            out.append(Rejected(pod, rc.ANNOTATION_CHECKPOINT_DURATION, text, f"not a number of seconds up to {MAX_SECONDS:.0f}"))
    return CheckpointTiming(times[rc.ANNOTATION_CHECKPOINT_WRITING], times[rc.ANNOTATION_CHECKPOINT_TIME], seconds)


@dataclass(frozen=True)
class Bounds:
    """What a job's reports are checked against, from its status."""

    attempt: int
    """The current gang attempt: older pods' reports do not count."""
    max_steps: int | None
    """The plan's optimizer steps (None: no plan yet)."""
    max_samples: float | None
    """The plan's samples plus one global batch (the last step may overshoot)."""
    request_id: str
    """The pending checkpoint request ('' when none)."""
    request_step: int
    """The step the request asked at: an acknowledged checkpoint at or after it answers it."""
    requested_at: datetime | None = None
    """When the request was made: a checkpoint completed after it answers it too."""
    batch: int = 1
    """The plan's global batch (samples per step)."""


def bounds(st: TrainingJobStatus) -> Bounds:
    """The :class:`Bounds` of a job from its status (plan, attempt, pending notice)."""
    plan = st.plan
    max_steps = max_samples = None
    batch = 1
    if plan is not None and plan.total_samples > 0:
        batch = max(plan.gpus * plan.micro_batch * plan.accumulation, 1)  # the global batch, kept exactly
        max_steps = math.ceil(plan.total_samples / batch)
        max_samples = plan.total_samples + batch
    notice = st.notice
    return Bounds(
        attempt=st.attempt,
        max_steps=max_steps,
        max_samples=max_samples,
        request_id=notice.request_id if notice is not None else "",
        request_step=notice.progress_step if notice is not None else 0,
        requested_at=notice.noticed_at if notice is not None and notice.request_id else None,
        batch=batch,
    )


@dataclass(frozen=True)
class RateLimits:
    """The most progress the job's history and the time allow (see the module docstring)."""

    max_step: int
    max_samples: float


def rate_limits(st: TrainingJobStatus, now: datetime) -> RateLimits | None:
    """How far a report at ``now`` may be believed, from the last believed progress and the plan.

    Args:
        st: The job's status (``progress``, ``plan``, ``startTime``).
        now: The time of the report's reading.

    Returns:
        The limits, or None when the plan gives no throughput (nothing to bound by).
    """
    plan = st.plan
    if plan is None or plan.throughput <= 0:
        return None
    prog = st.progress
    since = prog.updated_at or st.start_time or plan.planned_at
    elapsed = max((now - since).total_seconds(), 0.0) + RATE_GRACE_S
    batch = bounds(st).batch
    rate = RATE_MARGIN * max(plan.throughput, plan.throughput_p90 or 0.0)  # samples/s
    return RateLimits(
        max_step=prog.step + math.ceil(rate * elapsed / batch) + 1,
        max_samples=prog.samples + rate * elapsed + batch,
    )


@dataclass(frozen=True)
class TrustedReport:
    """The values of a job's reports the operator acts on (None: nothing trustworthy reported)."""

    writer: str | None = None
    """The pod the values come from (the writer rank's pod of the current attempt)."""
    step: int | None = None
    samples: float | None = None
    checkpoint_step: int | None = None
    acked: bool = False
    """The writer acknowledged the pending request with a checkpoint that answers it."""
    rejected: tuple[Rejected, ...] = ()
    """Every value ignored, on any of the job's pods."""
    checkpoint_time: datetime | None = None


def _writer(b: Bounds, pods: Iterable[PodState], rejected: list[Rejected]) -> PodState | None:
    """The writer rank's pod of the current attempt; every pod's rejections and other ranks' acks go to ``rejected``."""
    writer: PodState | None = None
    for p in pods:
        rejected += p.rejected
        if p.rank == WRITER_RANK and p.attempt == b.attempt:  # also while it stops: its SIGTERM checkpoint
            writer = p
        elif p.checkpoint_ack is not None and p.checkpoint_ack == b.request_id:
            why = f"rank {p.rank} attempt {p.attempt}: only rank {WRITER_RANK} of attempt {b.attempt} answers for the job"
            rejected.append(Rejected(p.name, rc.ANNOTATION_CHECKPOINT_ACK, p.checkpoint_ack, why))
    return writer


def _checked_values(
    b: Bounds, writer: PodState, limits: RateLimits | None, now: datetime | None
) -> tuple[list[Rejected], int | None, float | None, int | None, datetime | None]:
    """The writer's step, samples, checkpoint step and time checked against the plan, the rate
    and one another; the rejections (the values are returned as read)."""
    out: list[Rejected] = []
    step, samples, ckpt, at = writer.step, writer.samples, writer.checkpoint_step, writer.timing.committed_at
    name = writer.name
    if step is not None and b.max_steps is not None and step > b.max_steps:
        out.append(Rejected(name, rc.ANNOTATION_PROGRESS_STEP, str(step), f"beyond the plan's {b.max_steps} steps"))
    elif step is not None and limits is not None and step > limits.max_step:
        out.append(Rejected(name, rc.ANNOTATION_PROGRESS_STEP, str(step), f"faster than the plan's throughput band allows (at most {limits.max_step} by now)"))
    if samples is not None and b.max_samples is not None and samples > b.max_samples:
        out.append(Rejected(name, rc.ANNOTATION_PROGRESS_SAMPLES, f"{samples:g}", f"beyond the plan's {b.max_samples:,.0f} samples"))
    elif samples is not None and limits is not None and samples > limits.max_samples:
        out.append(
            Rejected(name, rc.ANNOTATION_PROGRESS_SAMPLES, f"{samples:g}", f"faster than the plan's throughput band allows (at most {limits.max_samples:,.0f} by now)")
        )
    if ckpt is not None:
        limit = step if step is not None else b.max_steps
        if limit is not None and ckpt > limit:
            ahead = "the step reported with it" if step is not None else "the plan's steps"
            out.append(Rejected(name, rc.ANNOTATION_CHECKPOINT_STEP, str(ckpt), f"beyond {ahead} ({limit})"))
    if at is not None and now is not None and at > now + timedelta(seconds=CLOCK_SKEW_S):
        out.append(Rejected(name, rc.ANNOTATION_CHECKPOINT_TIME, at.isoformat(), "in the future"))
    return out, step, samples, ckpt, at


def trusted_report(st: TrainingJobStatus, pods: Iterable[PodState], now: datetime | None = None) -> TrustedReport:
    """The job's reported progress, checkpoint and acknowledgement that pass every check.

    Args:
        st: The job's status (plan, attempt, pending notice, the progress believed so far).
        pods: The job's worker pods (already the job's own: owner and job label checked).
        now: The time of the reading: with it, progress is also checked against the time since
            the last believed progress (:func:`rate_limits`) and checkpoint times against the clock.

    Returns:
        The writer's values within bounds, and everything rejected (see the module docstring).
    """
    b = bounds(st)
    rejected: list[Rejected] = []
    writer = _writer(b, pods, rejected)
    if writer is None:
        return TrustedReport(rejected=tuple(rejected))
    limits = rate_limits(st, now) if now is not None else None
    failed, step, samples, ckpt, at = _checked_values(b, writer, limits, now)
    if failed or any(r.annotation != rc.ANNOTATION_CHECKPOINT_ACK for r in writer.rejected):
        # a report that fails is dropped whole: no floor moves on it
        step = samples = ckpt = None
        at = None
        kept = {r.annotation for r in failed} | {r.annotation for r in writer.rejected}
        for key, value in (
            (rc.ANNOTATION_PROGRESS_STEP, writer.step),
            (rc.ANNOTATION_PROGRESS_SAMPLES, writer.samples),
            (rc.ANNOTATION_CHECKPOINT_STEP, writer.checkpoint_step),
        ):
            if value is not None and key not in kept:
                failed.append(Rejected(writer.name, key, f"{value:g}", "reported with a rejected value"))
        rejected += failed
    acked = _acked(b, writer, ckpt, at, rejected)
    return TrustedReport(writer.name, step, samples, ckpt, acked, tuple(rejected), at)


def _acked(b: Bounds, writer: PodState, ckpt: int | None, at: datetime | None, rejected: list[Rejected]) -> bool:
    """Whether the writer's ack answers the pending request (see the module docstring)."""
    ack = writer.checkpoint_ack
    if ack is None:
        return False
    if b.request_id and ack == b.request_id:
        after = at is not None and b.requested_at is not None and at >= b.requested_at - timedelta(seconds=CLOCK_SKEW_S)
        if ckpt is not None and (ckpt >= b.request_step or after):
            return True
        why = (
            f"no checkpoint at or after step {b.request_step}, the step it was requested at, nor completed after the request"
            + (f" (checkpoint-step {ckpt})" if ckpt is not None else "")
        )
        rejected.append(Rejected(writer.name, rc.ANNOTATION_CHECKPOINT_ACK, ack, why))
    elif ack != writer.checkpoint_requested:
        rejected.append(Rejected(writer.name, rc.ANNOTATION_CHECKPOINT_ACK, ack, "no such checkpoint request was made"))
    # else: the answer to an earlier request of this gang (a soft notice that passed): not news
    return False


def asked_step(st: TrainingJobStatus, pods: Iterable[PodState], now: datetime) -> int:
    """The step a checkpoint request made now asks at: the current attempt's last believed step.

    Not ``status.progress.step``, the highest step ever believed: after a node loss the new gang
    resumes from the last committed checkpoint, below it, and its answer to a notice would be
    refused until it caught up. So the writer's believed step of this attempt; before it has
    reported one, the checkpoint the job resumes from (what a node loss resets it to).

    Args:
        st: The job's status.
        pods: The job's worker pods.
        now: The time.

    Returns:
        The step (0 when nothing is known).
    """
    rep = trusted_report(st, pods, now)
    if rep.step is not None:
        return rep.step
    return st.progress.checkpoint_step or 0


def summary(rejected: Iterable[Rejected], limit: int = 5) -> str:
    """The rejections in one line (at most ``limit`` of them, then a count)."""
    items = sorted({r.describe() for r in rejected})
    text = "; ".join(items[:limit])
    return text + (f"; and {len(items) - limit} more" if len(items) > limit else "")
