"""gpuscaler.runtime: the library inside the training container (checkpoint, resume, notice, progress).

No framework and no Kubernetes client is imported; only the standard library (``prometheus_client``
lazily, when a metrics port is set and it is installed; the ``kubernetes`` client lazily, on the
first report of a :class:`KubeReporter`). Typical use in a worker the operator started::

    from gpuscaler.runtime import KubeReporter, TrainingGuard

    guard = TrainingGuard.from_env(
        save=lambda state, path: torch.save(state, path),
        load=lambda path: torch.load(path),
        reporter=KubeReporter.from_env(),
    )
    state, start = guard.resume(initial_state)
    for step in guard.steps(start, total_steps):
        state = train_step(state, step)
        guard.completed(step, state, samples=batch_size)

The default save/load callbacks store and read plain data only (:func:`.checkpoint.data_save`,
:func:`.checkpoint.data_load`): loading a checkpoint never runs code from it unless you pass
:func:`pickle_load` yourself. Under ``torchrun`` pass ``agree=TorchAgreement()`` (and
``save=torch_save, load=torch_load``) from the optional :mod:`gpuscaler.runtime.distributed`: the
ranks then agree at every step boundary and stop or checkpoint at the same step; ``sharded=True``
has every rank write its shard. Hooks for the Hugging Face Trainer and for Lightning are in
:mod:`gpuscaler.runtime.transformers_callback` and :mod:`gpuscaler.runtime.lightning_callback`
(docs/runtime.md).

``KubeReporter.from_env()`` reads ``POD_NAME``/``POD_NAMESPACE`` (the operator sets them through
the downward API) and patches the worker's own pod with its progress, ``checkpoint-step`` and, on
a spot notice, ``checkpoint-ack``: that is how the operator follows the job and finishes the
checkpoint handshake. Outside a pod it returns None and the guard reports nowhere. It needs the
``kubernetes`` package in the image and ``patch`` on ``pods``: the operator's ServiceAccount
``gpuscaler-worker`` has it; a ``serviceAccountName`` of your own in the job's template must be
given it. Reporting failures are logged and never stop the training.

The package root exports only what a training script uses: the guard, the reporter, the plan
the operator handed over (:class:`PlanEnv`), the agreement hook, the save/load callbacks that are
a choice (the pickle pair; the data-only pair is the default), the checkpoint errors a script
may catch and the exit codes it returns. Everything else lives in its submodule:
:mod:`gpuscaler.runtime.guard` (the step-boundary protocol, ``Boundary``, ``GuardUsageError``),
:mod:`.checkpoint` (the on-disk format, ``CheckpointStore``, ``data_save``/``data_load``),
:mod:`.constants` (the env variables, annotations and exit codes shared with the operator),
:mod:`.config` (``GuardConfig``), :mod:`.notice` (spot notices), :mod:`.progress` (reporters),
:mod:`.metrics`, :mod:`.schedule`, :mod:`.atomic`, :mod:`.kube_reporter`, and the optional
:mod:`.distributed`, :mod:`.transformers_callback`, :mod:`.lightning_callback`.
"""

from typing import TYPE_CHECKING, Any

from gpuscaler.runtime.agreement import Agreement, SoloAgreement
from gpuscaler.runtime.checkpoint import CheckpointError, UnsafeCheckpointError, pickle_load, pickle_save
from gpuscaler.runtime.config import PlanEnv
from gpuscaler.runtime.constants import EXIT_DONE, EXIT_PREEMPTED
from gpuscaler.runtime.guard import TrainingGuard

if TYPE_CHECKING:
    from gpuscaler.runtime.kube_reporter import KubeReporter

_LAZY = {"KubeReporter": "gpuscaler.runtime.kube_reporter"}
"""Exported names whose module is imported on first access (``gpuscaler.runtime.KubeReporter``)."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EXIT_DONE",
    "EXIT_PREEMPTED",
    "Agreement",
    "CheckpointError",
    "KubeReporter",
    "PlanEnv",
    "SoloAgreement",
    "TrainingGuard",
    "UnsafeCheckpointError",
    "pickle_load",
    "pickle_save",
]
