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

The default save/load callbacks store and read plain data only (:func:`data_save`,
:func:`data_load`): loading a checkpoint never runs code from it unless you pass
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

See :mod:`gpuscaler.runtime.guard` for the step-boundary protocol, :mod:`.checkpoint` for the
on-disk format, :mod:`.constants` for the env variables, annotations and exit codes shared with
the operator, :mod:`.kube_reporter` for the reporter.
"""

from typing import TYPE_CHECKING, Any

from gpuscaler.runtime.agreement import Agreement, SoloAgreement
from gpuscaler.runtime.atomic import atomic_write_bytes, atomic_write_text, fsync_dir
from gpuscaler.runtime.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    CheckpointStore,
    CorruptCheckpointError,
    LoadFn,
    SaveFn,
    UnsafeCheckpointError,
    bytes_callbacks,
    data_load,
    data_save,
    pickle_load,
    pickle_save,
)
from gpuscaler.runtime.config import GuardConfig, PlanEnv, RuntimeConfigError
from gpuscaler.runtime.constants import (
    ANNOTATION_CHECKPOINT_ACK,
    ANNOTATION_CHECKPOINT_REQUESTED,
    ANNOTATION_CHECKPOINT_STEP,
    ANNOTATION_CHECKPOINT_TIME,
    ANNOTATION_PROGRESS_SAMPLES,
    ANNOTATION_PROGRESS_STEP,
    ANNOTATION_RUNTIME_PHASE,
    ENV_ACCUMULATION_STEPS,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_STEPS,
    ENV_CHECKPOINT_INTERVAL_S,
    ENV_CHECKPOINT_KEEP,
    ENV_METRICS_PORT,
    ENV_MICRO_BATCH,
    ENV_PODINFO_DIR,
    ENV_PRECISION,
    ENV_PROGRESS_FILE,
    EXIT_DONE,
    EXIT_PREEMPTED,
)
from gpuscaler.runtime.guard import Boundary, GuardUsageError, TrainingGuard
from gpuscaler.runtime.metrics import RuntimeMetrics, serve_metrics
from gpuscaler.runtime.notice import AnnotationWatcher, StopSignal, parse_downward_annotations
from gpuscaler.runtime.progress import (
    CheckpointEvent,
    FanoutReporter,
    FileReporter,
    NullReporter,
    Progress,
    ProgressReporter,
)
from gpuscaler.runtime.schedule import CheckpointSchedule

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
    "ANNOTATION_CHECKPOINT_ACK",
    "ANNOTATION_CHECKPOINT_REQUESTED",
    "ANNOTATION_CHECKPOINT_STEP",
    "ANNOTATION_CHECKPOINT_TIME",
    "ANNOTATION_PROGRESS_SAMPLES",
    "ANNOTATION_PROGRESS_STEP",
    "ANNOTATION_RUNTIME_PHASE",
    "ENV_ACCUMULATION_STEPS",
    "ENV_CHECKPOINT_DIR",
    "ENV_CHECKPOINT_EVERY_STEPS",
    "ENV_CHECKPOINT_INTERVAL_S",
    "ENV_CHECKPOINT_KEEP",
    "ENV_METRICS_PORT",
    "ENV_MICRO_BATCH",
    "ENV_PODINFO_DIR",
    "ENV_PRECISION",
    "ENV_PROGRESS_FILE",
    "EXIT_DONE",
    "EXIT_PREEMPTED",
    "Agreement",
    "AnnotationWatcher",
    "Boundary",
    "CheckpointError",
    "CheckpointEvent",
    "CheckpointInfo",
    "CheckpointSchedule",
    "CheckpointStore",
    "CorruptCheckpointError",
    "FanoutReporter",
    "FileReporter",
    "GuardConfig",
    "GuardUsageError",
    "KubeReporter",
    "LoadFn",
    "NullReporter",
    "PlanEnv",
    "Progress",
    "ProgressReporter",
    "RuntimeConfigError",
    "RuntimeMetrics",
    "SaveFn",
    "SoloAgreement",
    "StopSignal",
    "TrainingGuard",
    "UnsafeCheckpointError",
    "atomic_write_bytes",
    "atomic_write_text",
    "bytes_callbacks",
    "data_load",
    "data_save",
    "fsync_dir",
    "parse_downward_annotations",
    "pickle_load",
    "pickle_save",
    "serve_metrics",
]
