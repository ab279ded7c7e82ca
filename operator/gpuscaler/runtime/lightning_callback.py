"""PyTorch Lightning: a ``Callback`` that runs ``Trainer.fit`` under the guard.

Optional: importing this module imports ``lightning``. Use::

    from gpuscaler.runtime.lightning_callback import GuardCallback

    guard_cb = GuardCallback()                       # TrainingGuard.from_env() inside
    trainer = lightning.Trainer(max_steps=..., callbacks=[guard_cb], enable_checkpointing=False)
    trainer.fit(model, train_loader, ckpt_path=guard_cb.resume_checkpoint())
    sys.exit(guard_cb.exit_code)                     # 75 after a preemption, 0 when done

At the end of every optimizer step (``on_train_batch_end`` when ``trainer.global_step`` moved) it
asks the guard what the boundary needs (:meth:`TrainingGuard.boundary`: SIGTERM, the operator's
checkpoint request, the planned interval; agreed among ranks with ``agree=``). A due checkpoint is
``trainer.save_checkpoint`` into the guard's staging directory, committed atomically with its
manifest; on SIGTERM it then sets ``trainer.should_stop`` and ``exit_code`` becomes 75. When
``fit`` ends a final checkpoint is committed. With several processes (DDP), build the guard with
``sharded=True`` and an agreement: Lightning's ``save_checkpoint`` is a collective every rank must
enter, and the sharded commit has every rank take part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning

from gpuscaler.runtime.constants import EXIT_DONE
from gpuscaler.runtime.guard import Boundary, GuardUsageError, TrainingGuard, payload_path

CHECKPOINT_FILE = "model.ckpt"
"""The Lightning checkpoint file inside a guard checkpoint's payload directory."""


class GuardCallback(lightning.pytorch.Callback):  # type: ignore[misc]  # lightning is not type-checked
    """Checkpoint on notice, on SIGTERM and on the planned interval; stop all ranks at one step.

    Args:
        guard: A guard whose load callback is :func:`payload_path`; default:
            ``TrainingGuard.from_env(load=payload_path, **guard_kwargs)``.
        samples_per_step: Samples per optimizer step, for progress.
        **guard_kwargs: Passed to ``TrainingGuard.from_env`` when ``guard`` is None.
    """

    def __init__(self, guard: TrainingGuard[Any] | None = None, samples_per_step: int = 0,
                 **guard_kwargs: Any) -> None:
        super().__init__()
        self.guard: TrainingGuard[Any] = (
            guard if guard is not None else TrainingGuard.from_env(load=payload_path, **guard_kwargs)
        )
        if self.guard.agree is not None and not self.guard.sharded:
            raise GuardUsageError(
                "with several processes build the guard with sharded=True: Lightning's "
                "save_checkpoint must run on every rank"
            )
        self.samples_per_step = samples_per_step
        self.exit_code = EXIT_DONE
        """:data:`EXIT_PREEMPTED` once training stopped on SIGTERM after its checkpoint; else 0."""
        self._seen = -1

    def resume_checkpoint(self) -> str | None:
        """The newest complete checkpoint's Lightning file (agreed among ranks), or None.

        Returns:
            A path for ``Trainer.fit(..., ckpt_path=...)``.
        """
        found, start = self.guard.resume(None)
        return str(Path(found) / CHECKPOINT_FILE) if start > 0 and found is not None else None

    def _save(self, trainer: Any, todo: Boundary | None, reason: str = "interval") -> None:
        def write(path: Path) -> None:
            path.mkdir(exist_ok=True)
            trainer.save_checkpoint(str(path / CHECKPOINT_FILE))

        self.guard.commit(write, todo, reason=reason)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Install the SIGTERM handler (over Lightning's, which would raise in the middle of a step)."""
        self.guard.start()
        self.guard.reclaim_signals()
        self._seen = int(trainer.global_step)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After an optimizer step: decide (agreed among ranks), checkpoint, stop."""
        steps = int(trainer.global_step)
        if steps == self._seen:  # gradient accumulation: no optimizer step in this batch
            return
        todo = self.guard.boundary(steps, (steps - self._seen) * self.samples_per_step)
        self._seen = steps
        if todo.checkpoint:
            self._save(trainer, todo)
        if todo.stop:
            trainer.should_stop = True
            self.exit_code = self.guard.stopped()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Commit the final checkpoint (unless stopped) and report ``finished``."""
        if self.exit_code != EXIT_DONE:
            return
        last = self.guard.last_checkpoint
        if last is None or last.step != int(trainer.global_step):
            self._save(trainer, None, reason="final")
        self.guard.finished()
