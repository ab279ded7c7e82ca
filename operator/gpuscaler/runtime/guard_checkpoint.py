"""How a :class:`~gpuscaler.runtime.guard.TrainingGuard` checkpoints: write and commit (sharded on every rank), acknowledge the request, report it (methods of the guard, bound in its class)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuscaler.runtime.checkpoint import (
    CheckpointInfo,
)
from gpuscaler.runtime.progress import (
    CheckpointEvent,
)

if TYPE_CHECKING:
    from gpuscaler.runtime.guard import TrainingGuard

log = logging.getLogger("gpuscaler.runtime.guard")
"""The guard's logger (its records keep the guard's name)."""

S = TypeVar("S")

def checkpoint(
    self: TrainingGuard[S],
    state: S,
    *,
    reason: str = "manual",
    request_id: str | None = None,
    notice_at: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> CheckpointInfo | None:
    """Checkpoint ``state`` as of :attr:`step` now, unless the newest checkpoint is at this step.

    With ``sharded=True`` this is a collective (every rank writes its shard); otherwise only
    the writer saves, and a reader only marks the request as seen.

    Args:
        state: The state after :attr:`step` steps.
        reason: Stored in the manifest and the ``checkpoints_total`` metric.
        request_id: The checkpoint request this answers; acknowledged once committed.
        notice_at: Monotonic time the notice arrived, for the latency metric.
        extra: JSON-serialisable metadata for the manifest.

    Returns:
        The committed (or already current) checkpoint; for a non-writer of an unsharded
        checkpoint (which saves nothing) the checkpoint it resumed from.

    Raises:
        CheckpointError: Writing failed (on any rank, for a sharded one); nothing was committed.
    """
    return self._checkpoint(
        lambda path: self._save(state, path), reason=reason, request_id=request_id, notice_at=notice_at, extra=extra
    )


def _checkpoint(
    self: TrainingGuard[S],
    write: Callable[[Path], None],
    *,
    reason: str,
    request_id: str | None = None,
    notice_at: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> CheckpointInfo | None:
    info = self._last
    if not self.store.writer and not self.sharded:
        # Readers neither write nor acknowledge: the writer answers for the job. The request
        # is answered all the same (by the agreed checkpoint): do not ask again for it.
        self.schedule.mark(self._step)
        if request_id is not None and self.watcher is not None:
            self.watcher.acknowledge(request_id)
        return info
    saved = False
    if info is None or info.step != self._step:
        saved = True
        self._begin_write()
        try:
            info = self._save_checkpoint(write, reason=reason, request_id=request_id, extra=extra)
        except BaseException:
            self._writing_since = None
            self._report(force=True)  # nothing is being written any more
            raise
        self._writing_since = None  # the checkpointed() report below clears the annotation
        self._last = info
        self._write_seconds = info.write_seconds
        self.metrics.observe_checkpoint(
            info.step, info.created_at, info.write_seconds, info.payload_bytes, reason
        )
        log.info(
            "checkpoint at step %d (%s) in %.3fs: %s", info.step, reason, info.write_seconds, info.path
        )
    self.schedule.mark(self._step)
    latency = self._clock() - notice_at if notice_at is not None else None
    if latency is not None:
        self.metrics.notice_to_checkpoint_seconds = latency
    if request_id is not None:
        if self.store.writer:
            self._ack = request_id
        if self.watcher is not None:
            self.watcher.acknowledge(request_id)
    if info is not None and self.reports:
        event = CheckpointEvent(
            step=info.step,
            samples=info.samples,
            reason=reason if saved else info.reason,
            request_id=request_id if self.store.writer else None,
            path=str(info.path),
            created_at=info.created_at,
            write_seconds=info.write_seconds,
            payload_bytes=info.payload_bytes,
            notice_latency_s=latency,
        )
        self._call_reporter(lambda r: r.checkpointed(event, self.progress()))
        self._last_report = self._clock()
    return info


def _begin_write(self: TrainingGuard[S]) -> None:
    """Report that a checkpoint write begins (``gpuscaler.io/checkpoint-writing``), whatever the interval."""
    self._writing_since = self._wall_clock()
    if self.reports:
        snapshot = self.progress()
        self._call_reporter(lambda r: r.report(snapshot))


def _save_checkpoint(
    self: TrainingGuard[S],
    write: Callable[[Path], None],
    *,
    reason: str,
    request_id: str | None,
    extra: Mapping[str, Any] | None,
) -> CheckpointInfo:
    """Write and commit the checkpoint of :attr:`step` (sharded: on every rank)."""
    if self.sharded:
        assert self.agree is not None
        return self.store.save_sharded(
            self._step,
            write,
            self.agree,
            samples=self._samples,
            reason=reason,
            request_id=request_id,
            extra=extra,
        )
    return self.store.save(
        self._step, write, samples=self._samples, reason=reason, request_id=request_id, extra=extra
    )
