"""How a :class:`~gpuscaler.runtime.guard.TrainingGuard` resumes: the newest checkpoint every rank verifies, corrupt or refused ones set aside (methods of the guard, bound in its class)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from gpuscaler.runtime.checkpoint import (
    CheckpointInfo,
    CorruptCheckpointError,
    step_dir_name,
)
from gpuscaler.runtime.checkpoint_safety import load_agreed

if TYPE_CHECKING:
    from gpuscaler.runtime.guard import TrainingGuard

log = logging.getLogger("gpuscaler.runtime.guard")
"""The guard's logger (its records keep the guard's name)."""

S = TypeVar("S")

def resume(self: TrainingGuard[S], initial_state: S) -> tuple[S, int]:
    """Load the newest complete, verified checkpoint; skip (and set aside) corrupt ones.

    With ``agree``, the ranks agree on the checkpoint first (the newest one every rank can
    verify; each rank re-hashes its share of the files) and all load that one, so they start at
    the same step even when one of them saw a newer or a corrupt one.

    Args:
        initial_state: Returned when there is no usable checkpoint.

    Returns:
        ``(state, start_step)``: the loaded state and the steps it has completed, or
        ``(initial_state, 0)``.

    Raises:
        CheckpointError: Loading a verified checkpoint failed in the load callback (a code or
            format problem, not corruption: falling back would hide it), or the default loader
            refused a payload (one that would run code or build far more than it holds) and
            there is no older checkpoint to fall back on; with one, the refused checkpoint is
            set aside and the older one loaded, with a warning.
    """
    self.start()
    state = initial_state
    info = self._agreed_checkpoint() if self.agree is not None else self._newest_checkpoint()
    while info is not None:
        loaded, refused = load_agreed(self._load, info.path, info.payload_path, self.agree)
        if refused is None:
            state = loaded
            break
        older = self._agreed_checkpoint(info.step) if self.agree is not None else self._newest_checkpoint(info.step)
        if older is None:  # nothing to fall back on: say so rather than start again from step 0
            raise refused
        log.warning("checkpoint at step %d refused (%s); falling back to step %d", info.step, refused, older.step)
        self.metrics.corrupt_checkpoints += 1
        self.store.quarantine(info.path)
        info = older
    if info is not None:
        self._step, self._samples, self._last = info.step, info.samples, info
        if info.request_id is not None:
            self._ack = info.request_id
            if self.watcher is not None:
                self.watcher.acknowledge(info.request_id)
        self.metrics.last_checkpoint_step = info.step
        self.metrics.last_checkpoint_time = info.created_at
        log.info("resumed from %s (step %d, %d samples)", info.path, info.step, info.samples)
    else:
        self._step, self._samples = 0, 0
        log.info("no checkpoint in %s: starting at step 0", self.store.directory)
    self._state, self._has_state = state, True
    self.metrics.resumed_step = self._step
    self.metrics.set_progress(self._step, self._samples)
    self.schedule.mark(self._step)
    self._report(force=True)
    return state, self._step


def _newest_checkpoint(self: TrainingGuard[S], below: int | None = None) -> CheckpointInfo | None:
    for step, path in self.store.list_steps():
        if below is not None and step >= below:
            continue
        try:
            return self.store.verify(path)
        except CorruptCheckpointError as err:
            log.warning("skipping checkpoint at step %d: %s", step, err)
            self.metrics.corrupt_checkpoints += 1
            self.store.quarantine(path)
    return None


def _agreed_checkpoint(self: TrainingGuard[S], below: int | None = None) -> CheckpointInfo | None:
    """The newest checkpoint every rank has and verifies (its share of the files), agreed on.

    Each round agrees on the lowest of the ranks' newest candidate steps (MAX of negated
    steps; no candidate counts as -1), verifies it on every rank and agrees on the verdict;
    a corrupt one is quarantined by the writer (after the vote, when no rank reads it any
    more) and the next round looks below it.
    """
    assert self.agree is not None
    rank, world = self.agree.rank, self.agree.world_size
    while True:
        mine = [(s, p) for s, p in self.store.list_steps() if below is None or s < below]
        candidate = mine[0][0] if mine else -1
        (neg,) = self.agree.max([-candidate])
        step = -neg
        if step < 0:
            return None
        path = self.store.directory / step_dir_name(step)
        info: CheckpointInfo | None = None
        try:
            info = self.store.verify(path, share=(rank, world))
        except CorruptCheckpointError as err:
            log.warning("checkpoint at step %d fails verification on rank %d: %s", step, rank, err)
        (bad,) = self.agree.max([int(info is None)])
        if not bad:
            return info
        self.metrics.corrupt_checkpoints += 1
        self.store.quarantine(path)
        below = step
