"""What the operator believes of the annotations workers write: every value checked and bounded.

Workers report through their own pod's annotations (:data:`gpuscaler.runtime.constants.REPORTED_ANNOTATIONS`,
written by :class:`~gpuscaler.runtime.kube_reporter.KubeReporter`). Anything that can patch a pod
can write them (a worker without the admission policy, a user with ``patch`` on pods in the
namespace), and the operator acts on them: the progress shown and charged against the deadline,
the checkpoint step a re-plan resumes from (the samples left), and the acknowledgement that ends
the checkpoint handshake and lets the gang stop and its nodes go. So nothing is taken as written:

* **Types and ranges** (:func:`parse`, per pod, called by :func:`gpuscaler.kube.workers.pod_state`):
  steps are decimal integers, samples finite non-negative decimals, both at most
  :data:`MAX_COUNT`; an acknowledgement is a short id of the request alphabet. Anything else is
  dropped and listed in :attr:`PodState.rejected <gpuscaler.kube.workers.PodState.rejected>`.
* **Who wrote it** (:func:`trusted_report`, per job, with its status): only the writer rank's pod
  (rank :data:`WRITER_RANK`: it writes the checkpoints and answers for the job, as
  :class:`~gpuscaler.runtime.guard.TrainingGuard` does) of the current gang attempt counts; the
  values are recorded with that pod's name (``status.progress.reportedBy``).
* **Against the plan**: no step beyond the plan's steps (``ceil(totalSamples / globalBatch)``), no
  samples beyond its samples plus one global batch, no checkpoint beyond the step reported with it.
* **Monotone**: the loop never lowers ``status.progress`` step or samples on a report (a lower
  report is legitimate only after a resume from a checkpoint, and is then not applied until it
  passes the old value), and a checkpoint is never ahead of the progress it is reported with.
* **Acknowledgements** only for the request the operator made (the pending
  ``status.notice.requestId``, which it also wrote on the pod); an id it never sent is rejected,
  and the writer's ack counts only with a checkpoint at or after the progress step the operator
  had seen when it asked (``status.notice.progressStep``). Without that, the handshake waits for
  the notice's deadline as if nothing had been acknowledged: a forged ack cannot stop the gang
  and release its nodes before the job has checkpointed.

Rejected values are posted as a Warning Event and kept in the ``WorkerReports`` condition by the
reconcile loop (:mod:`gpuscaler.controller.reconcile`); this module is pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscaler.api.status import TrainingJobStatus
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
SHOWN_CHARS = 40
"""A rejected value is quoted in Events and conditions up to this many characters."""


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
    return Parsed(step, samples, ckpt, ack, tuple(out))


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
    """The progress step when it was requested: the acknowledged checkpoint is at or after it."""


def bounds(st: TrainingJobStatus) -> Bounds:
    """The :class:`Bounds` of a job from its status (plan, attempt, pending notice)."""
    plan = st.plan
    max_steps = max_samples = None
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
    """The writer acknowledged the pending request with a checkpoint at or after it."""
    rejected: tuple[Rejected, ...] = ()
    """Every value ignored, on any of the job's pods."""


def trusted_report(st: TrainingJobStatus, pods: Iterable[PodState]) -> TrustedReport:
    """The job's reported progress, checkpoint and acknowledgement that pass every check.

    Args:
        st: The job's status (plan, attempt, pending notice).
        pods: The job's worker pods (already the job's own: owner and job label checked).

    Returns:
        The writer's values within bounds, and everything rejected (see the module docstring).
    """
    b = bounds(st)
    rejected: list[Rejected] = []
    writer: PodState | None = None
    for p in pods:
        rejected += p.rejected
        if p.rank == WRITER_RANK and p.attempt == b.attempt:  # also while it stops: its SIGTERM checkpoint
            writer = p
        elif p.checkpoint_ack is not None and p.checkpoint_ack == b.request_id:
            why = f"rank {p.rank} attempt {p.attempt}: only rank {WRITER_RANK} of attempt {b.attempt} answers for the job"
            rejected.append(Rejected(p.name, rc.ANNOTATION_CHECKPOINT_ACK, p.checkpoint_ack, why))
    if writer is None:
        return TrustedReport(rejected=tuple(rejected))
    step, samples, ckpt = writer.step, writer.samples, writer.checkpoint_step
    if step is not None and b.max_steps is not None and step > b.max_steps:
        rejected.append(Rejected(writer.name, rc.ANNOTATION_PROGRESS_STEP, str(step), f"beyond the plan's {b.max_steps} steps"))
        step = None
    if samples is not None and b.max_samples is not None and samples > b.max_samples:
        rejected.append(
            Rejected(writer.name, rc.ANNOTATION_PROGRESS_SAMPLES, f"{samples:g}", f"beyond the plan's {b.max_samples:,.0f} samples")
        )
        samples = None
    if ckpt is not None:
        limit = step if step is not None else b.max_steps  # a step kept is within the plan
        if step is None and writer.step is not None:  # the step it came with was rejected
            rejected.append(Rejected(writer.name, rc.ANNOTATION_CHECKPOINT_STEP, str(ckpt), "reported with a rejected step"))
            ckpt = None
        elif limit is not None and ckpt > limit:
            ahead = "the step reported with it" if step is not None else "the plan's steps"
            rejected.append(Rejected(writer.name, rc.ANNOTATION_CHECKPOINT_STEP, str(ckpt), f"beyond {ahead} ({limit})"))
            ckpt = None
    acked = False
    ack = writer.checkpoint_ack
    if ack is not None:
        if b.request_id and ack == b.request_id:
            acked = ckpt is not None and ckpt >= b.request_step
            if not acked:
                why = (
                    f"no checkpoint at or after step {b.request_step}, the progress when it was requested"
                    + (f" (checkpoint-step {ckpt})" if ckpt is not None else "")
                )
                rejected.append(Rejected(writer.name, rc.ANNOTATION_CHECKPOINT_ACK, ack, why))
        elif ack != writer.checkpoint_requested:
            rejected.append(Rejected(writer.name, rc.ANNOTATION_CHECKPOINT_ACK, ack, "no such checkpoint request was made"))
        # else: the answer to an earlier request of this gang (a soft notice that passed): not news
    return TrustedReport(writer.name, step, samples, ckpt, acked, tuple(rejected))


def summary(rejected: Iterable[Rejected], limit: int = 5) -> str:
    """The rejections in one line (at most ``limit`` of them, then a count)."""
    items = sorted({r.describe() for r in rejected})
    text = "; ".join(items[:limit])
    return text + (f"; and {len(items) - limit} more" if len(items) > limit else "")
