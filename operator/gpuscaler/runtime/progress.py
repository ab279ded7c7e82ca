"""Progress reporting from the training container: a reporter Protocol, a no-op and a JSON-file reporter.

The guard calls a :class:`ProgressReporter` periodically (at most every ``report_interval_s``),
after every checkpoint, and when it stops. The operator side plugs in a reporter that patches the
pod's annotations (:meth:`Progress.annotations` gives exactly those key/values); the
:class:`FileReporter` here writes the same status as JSON to a file (``GPUSCALER_PROGRESS_FILE``),
atomically, for a sidecar, a ``kubectl exec cat`` or a test to read.

The checkpoint acknowledgement travels the same way: after a checkpoint that answered a
``gpuscaler.io/checkpoint-requested`` id, :meth:`ProgressReporter.checkpointed` is called with that
id in the event, and :attr:`Progress.checkpoint_ack` carries it from then on, so the operator sees
``gpuscaler.io/checkpoint-ack=<id>`` next to ``gpuscaler.io/checkpoint-step``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpuscaler.runtime.atomic import atomic_write_text
from gpuscaler.runtime.constants import (
    ANNOTATION_CHECKPOINT_ACK,
    ANNOTATION_CHECKPOINT_DURATION,
    ANNOTATION_CHECKPOINT_STEP,
    ANNOTATION_CHECKPOINT_TIME,
    ANNOTATION_CHECKPOINT_WRITING,
    ANNOTATION_PROGRESS_SAMPLES,
    ANNOTATION_PROGRESS_STEP,
    ANNOTATION_RUNTIME_PHASE,
    RUNTIME_PHASE_PREEMPTED,
)

log = logging.getLogger(__name__)

PHASE_RUNNING = "running"
PHASE_PREEMPTED = RUNTIME_PHASE_PREEMPTED
"""Stopped on SIGTERM after a complete checkpoint."""
PHASE_FINISHED = "finished"
"""All steps done, final checkpoint complete."""


def rfc3339(unix_time: float) -> str:
    """Format a unix time as RFC 3339 UTC with second precision (``2024-05-01T12:00:00Z``).

    Args:
        unix_time: Seconds since the epoch.

    Returns:
        The timestamp string.
    """
    return datetime.fromtimestamp(unix_time, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CheckpointEvent:
    """One committed checkpoint, as reported."""

    step: int
    """Steps completed at the checkpoint; a resume starts at this step."""
    samples: int
    reason: str
    """``interval``, ``notice``, ``sigterm``, ``final`` or ``manual``."""
    request_id: str | None
    """The ``gpuscaler.io/checkpoint-requested`` id this checkpoint answers (notice-triggered only)."""
    path: str
    created_at: float
    """Unix time of the commit."""
    write_seconds: float
    payload_bytes: int
    notice_latency_s: float | None = None
    """Seconds from the notice (signal or annotation seen) to the commit, for triggered checkpoints."""


@dataclass(frozen=True)
class Progress:
    """A snapshot of training progress."""

    step: int
    """Steps completed."""
    samples: int
    """Samples processed (cumulative over restarts)."""
    last_checkpoint_step: int | None
    last_checkpoint_time: float | None
    """Unix time of the newest checkpoint."""
    checkpoint_ack: str | None
    """The last checkpoint request answered by a complete checkpoint."""
    phase: str
    """:data:`PHASE_RUNNING`, :data:`PHASE_PREEMPTED` or :data:`PHASE_FINISHED`."""
    updated_at: float
    """Unix time of this snapshot."""
    checkpoint_writing_since: float | None = None
    """Unix time the checkpoint being written now began; None when none is being written."""
    checkpoint_write_seconds: float | None = None
    """Seconds the newest checkpoint written by this process took (None: none written yet)."""

    def annotations(self) -> dict[str, str]:
        """The pod annotations this snapshot maps to (what an annotation-patching reporter writes).

        Returns:
            Annotation key -> value; checkpoint keys only once there is a checkpoint;
            ``checkpoint-writing`` always (empty while no checkpoint is being written).
        """
        out = {
            ANNOTATION_PROGRESS_STEP: str(self.step),
            ANNOTATION_PROGRESS_SAMPLES: str(self.samples),
            ANNOTATION_RUNTIME_PHASE: self.phase,
            ANNOTATION_CHECKPOINT_WRITING: ""
            if self.checkpoint_writing_since is None
            else rfc3339(self.checkpoint_writing_since),
        }
        if self.checkpoint_write_seconds is not None:
            out[ANNOTATION_CHECKPOINT_DURATION] = f"{self.checkpoint_write_seconds:.3f}"
        if self.last_checkpoint_step is not None:
            out[ANNOTATION_CHECKPOINT_STEP] = str(self.last_checkpoint_step)
        if self.last_checkpoint_time is not None:
            out[ANNOTATION_CHECKPOINT_TIME] = rfc3339(self.last_checkpoint_time)
        if self.checkpoint_ack is not None:
            out[ANNOTATION_CHECKPOINT_ACK] = self.checkpoint_ack
        return out


@runtime_checkable
class ProgressReporter(Protocol):
    """Receives progress from the guard. Implementations must be quick and should not raise (the
    guard logs and ignores their exceptions: reporting never stops training)."""

    def report(self, progress: Progress) -> None:
        """Periodic progress (rate-limited by the guard) and the final state on stop.

        Args:
            progress: The current snapshot.
        """

    def checkpointed(self, event: CheckpointEvent, progress: Progress) -> None:
        """A checkpoint was committed; ``event.request_id`` is set when it answered a request.

        Args:
            event: The checkpoint.
            progress: The snapshot after it (with ``checkpoint_ack`` updated).
        """


class FileReporter:
    """Writes the latest status as one JSON object to a file, replaced atomically each time.

    The object has the :class:`Progress` fields, ``annotations`` (as the pod would carry them) and
    ``last_checkpoint`` (the newest :class:`CheckpointEvent`, or null).

    Args:
        path: The status file; its directory is created if missing.
        durable: fsync each write (off by default: the status is rewritten often and is not data).
    """

    def __init__(self, path: str | os.PathLike[str], *, durable: bool = False) -> None:
        self.path = Path(path)
        self.durable = durable
        self._last_event: CheckpointEvent | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _write(self, progress: Progress) -> None:
        doc: dict[str, Any] = asdict(progress)
        doc["annotations"] = progress.annotations()
        doc["last_checkpoint"] = asdict(self._last_event) if self._last_event else None
        atomic_write_text(self.path, json.dumps(doc, sort_keys=True) + "\n", durable=self.durable)

    def report(self, progress: Progress) -> None:
        """Write the snapshot.

        Args:
            progress: The current snapshot.
        """
        self._write(progress)

    def checkpointed(self, event: CheckpointEvent, progress: Progress) -> None:
        """Write the snapshot with this checkpoint as ``last_checkpoint``.

        Args:
            event: The checkpoint.
            progress: The snapshot after it.
        """
        self._last_event = event
        self._write(progress)


class FanoutReporter:
    """Forwards to several reporters; one failing does not stop the others. With none, it reports
    nowhere (the guard's default).

    Args:
        reporters: The reporters, called in order.
    """

    def __init__(self, *reporters: ProgressReporter) -> None:
        self.reporters = reporters

    def report(self, progress: Progress) -> None:
        """Forward the snapshot.

        Args:
            progress: The current snapshot.
        """
        for reporter in self.reporters:
            try:
                reporter.report(progress)
            except Exception:
                log.exception("progress reporter %r failed", reporter)

    def checkpointed(self, event: CheckpointEvent, progress: Progress) -> None:
        """Forward the checkpoint.

        Args:
            event: The checkpoint.
            progress: The snapshot after it.
        """
        for reporter in self.reporters:
            try:
                reporter.checkpointed(event, progress)
            except Exception:
                log.exception("progress reporter %r failed", reporter)
