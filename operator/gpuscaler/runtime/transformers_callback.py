"""Hugging Face ``transformers``: a ``TrainerCallback`` that runs a ``Trainer`` under the guard.

Optional: importing this module imports ``transformers``. Use::

    from gpuscaler.runtime.transformers_callback import GuardCallback

    guard_cb = GuardCallback()                      # TrainingGuard.from_env() inside
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[guard_cb])
    trainer.train(resume_from_checkpoint=guard_cb.resume_checkpoint())
    sys.exit(guard_cb.exit_code)                    # 75 after a preemption, 0 when done

What it does: at every optimizer step (``on_step_end``) it asks the guard what the boundary needs
(:meth:`TrainingGuard.boundary`: SIGTERM, the operator's checkpoint request, the planned interval;
agreed among ranks when the guard has ``agree=``). When a checkpoint is due it sets
``control.should_save`` so the Trainer writes its own checkpoint (model, optimizer, scheduler,
RNG and trainer state), then (``on_save``) moves that ``checkpoint-N`` folder into the guard's
store, which commits it atomically with its manifest and acknowledges the request. On SIGTERM it
also sets ``control.should_training_stop``; ``exit_code`` is then 75. ``resume_checkpoint()`` is
the newest complete checkpoint, in the form ``Trainer.train(resume_from_checkpoint=...)`` takes.
Set ``save_strategy="no"`` (the guard decides) or keep the Trainer's own saves: those are
committed as ``interval`` checkpoints too. ``output_dir`` should be on the checkpoint volume (the
folder is moved, not copied).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from gpuscaler.runtime.constants import EXIT_DONE
from gpuscaler.runtime.guard import Boundary, TrainingGuard, payload_path


class GuardCallback(TrainerCallback):  # type: ignore[misc]  # transformers is not type-checked
    """Checkpoint on notice, on SIGTERM and on the planned interval; stop all ranks at one step.

    Args:
        guard: A guard whose load callback is :func:`payload_path`; default:
            ``TrainingGuard.from_env(load=payload_path, **guard_kwargs)``.
        samples_per_step: Samples per optimizer step for progress; default: per-device batch x
            accumulation x world size, from the Trainer's arguments.
        **guard_kwargs: Passed to ``TrainingGuard.from_env`` when ``guard`` is None.
    """

    def __init__(self, guard: TrainingGuard[Any] | None = None, samples_per_step: int | None = None,
                 **guard_kwargs: Any) -> None:
        self.guard: TrainingGuard[Any] = (
            guard if guard is not None else TrainingGuard.from_env(load=payload_path, **guard_kwargs)
        )
        self.samples_per_step = samples_per_step
        self.exit_code = EXIT_DONE
        """:data:`EXIT_PREEMPTED` once training stopped on SIGTERM after its checkpoint; else 0."""
        self._todo: Boundary | None = None
        self._done = 0

    def resume_checkpoint(self) -> str | None:
        """The newest complete checkpoint's Trainer folder (agreed among ranks), or None.

        Returns:
            A path for ``Trainer.train(resume_from_checkpoint=...)``.
        """
        found, start = self.guard.resume(None)
        self._done = start
        return str(found) if start > 0 and found is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Install the SIGTERM handler; work out the samples per step."""
        self.guard.start()
        if self.samples_per_step is None:
            self.samples_per_step = (
                args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1)
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Decide (agreed among ranks) whether to save, and whether to stop after saving."""
        steps = int(state.global_step)
        todo = self.guard.boundary(steps, (steps - self._done) * (self.samples_per_step or 0))
        self._done = steps
        if state.max_steps and steps >= state.max_steps and not todo.checkpoint:
            todo = Boundary(False, True, "final", None, None)
        if todo.checkpoint:
            control.should_save = True
            self._todo = todo
        if todo.stop:
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Move the folder the Trainer just wrote into the guard's store (commit + acknowledge)."""
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.guard.agree is not None:
            self.guard.agree.barrier()  # every rank has written its part (rng_state_<rank>.pth)
        todo, self._todo = self._todo, None

        def write(path: Path) -> None:
            shutil.move(str(folder), str(path))

        self.guard.commit(write, todo, reason="interval")
        if todo is not None and todo.stop:
            self.exit_code = self.guard.stopped()
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Report ``finished`` (or keep ``preempted``) and restore the signal handler."""
        if self.exit_code == EXIT_DONE:
            self.guard.finished()
