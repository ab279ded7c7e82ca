"""Names shared by the training container and the operator: env variables, annotations, exit codes.

The operator sets the ``GPUSCALER_*`` environment variables on every worker it starts and writes
the ``gpuscaler.io/checkpoint-requested`` annotation on a pod when it wants a checkpoint now (a
spot interruption notice arrived). The runtime (this package) reads them inside the container and
reports back through the progress annotations. Both sides import the names from here, so the
handshake cannot drift. This module imports nothing and is safe to import anywhere.
"""

from __future__ import annotations

from typing import Final

# --- Environment variables the operator sets on worker containers -------------------------------

ENV_CHECKPOINT_DIR: Final = "GPUSCALER_CHECKPOINT_DIR"
"""Directory holding the job's checkpoints (a persistent volume shared across restarts)."""

ENV_CHECKPOINT_INTERVAL_S: Final = "GPUSCALER_CHECKPOINT_INTERVAL_S"
"""Planned checkpoint interval in seconds (float); the planner derives it from the interruption rate."""

ENV_CHECKPOINT_EVERY_STEPS: Final = "GPUSCALER_CHECKPOINT_EVERY_STEPS"
"""Optional: also checkpoint every N completed steps (int)."""

ENV_CHECKPOINT_KEEP: Final = "GPUSCALER_CHECKPOINT_KEEP"
"""How many complete checkpoints to keep (int, default :data:`DEFAULT_CHECKPOINT_KEEP`)."""

ENV_PODINFO_DIR: Final = "GPUSCALER_PODINFO_DIR"
"""Directory of the downward API volume; its ``annotations`` file carries the checkpoint request."""

ENV_METRICS_PORT: Final = "GPUSCALER_METRICS_PORT"
"""TCP port for the Prometheus metrics endpoint; unset, empty or ``0`` disables it."""

ENV_PROGRESS_FILE: Final = "GPUSCALER_PROGRESS_FILE"
"""Path of a JSON status file rewritten atomically on every progress report (optional)."""

ENV_PRECISION: Final = "GPUSCALER_PRECISION"
"""The plan's numeric precision: one of :data:`PRECISIONS`."""

ENV_MICRO_BATCH: Final = "GPUSCALER_MICRO_BATCH"
"""The plan's micro-batch size per GPU (int)."""

ENV_ACCUMULATION_STEPS: Final = "GPUSCALER_ACCUMULATION_STEPS"
"""The plan's gradient-accumulation steps (int)."""

PRECISIONS: Final = ("fp32", "tf32", "amp", "bf16", "fp8")
"""Precision names, the same as ``gpuscaler estimate --precision`` accepts."""

# --- Pod annotations (the operator <-> runtime handshake) ---------------------------------------

ANNOTATION_CHECKPOINT_REQUESTED: Final = "gpuscaler.io/checkpoint-requested"
"""Set by the operator: a request id (or timestamp). A new value asks for a checkpoint at the next
step boundary; the runtime answers with :data:`ANNOTATION_CHECKPOINT_ACK`."""

ANNOTATION_CHECKPOINT_ACK: Final = "gpuscaler.io/checkpoint-ack"
"""Set from the runtime's reports: the request id of the last notice-triggered checkpoint that is
complete on disk. Equal to the requested value means "done"."""

ANNOTATION_CHECKPOINT_STEP: Final = "gpuscaler.io/checkpoint-step"
"""Set from the runtime's reports: the step of the newest complete checkpoint (steps completed)."""

ANNOTATION_CHECKPOINT_TIME: Final = "gpuscaler.io/checkpoint-time"
"""Set from the runtime's reports: when the newest checkpoint completed (RFC 3339, UTC)."""

ANNOTATION_PROGRESS_STEP: Final = "gpuscaler.io/progress-step"
"""Set from the runtime's reports: steps completed so far."""

ANNOTATION_PROGRESS_SAMPLES: Final = "gpuscaler.io/progress-samples"
"""Set from the runtime's reports: samples processed so far (across restarts)."""

ANNOTATION_RUNTIME_PHASE: Final = "gpuscaler.io/runtime-phase"
"""Set from the runtime's reports: ``running``, ``preempted`` (stopped on SIGTERM or a stop request
after a complete checkpoint) or ``finished``. The operator counts a worker that failed after
reporting ``preempted`` as preempted whatever its exit code (a launcher such as torchrun exits 1
when its workers exit 75)."""

ANNOTATION_CHECKPOINT_WRITING: Final = "gpuscaler.io/checkpoint-writing"
"""Set from the runtime's reports: when the checkpoint being written now began (RFC 3339, UTC), or
empty when none is being written. The operator keeps ``karpenter.sh/do-not-disrupt`` on the job's
pods while it is set (for at most ``settings.checkpoint_write_max_s``; docs/preemption-cost.md)."""

ANNOTATION_CHECKPOINT_DURATION: Final = "gpuscaler.io/checkpoint-duration"
"""Set from the runtime's reports: seconds the newest checkpoint took to write (measured)."""

RUNTIME_PHASE_PREEMPTED: Final = "preempted"
"""The value of :data:`ANNOTATION_RUNTIME_PHASE` after a stop with a complete checkpoint."""

REPORTED_ANNOTATIONS: Final = (
    ANNOTATION_PROGRESS_STEP,
    ANNOTATION_PROGRESS_SAMPLES,
    ANNOTATION_CHECKPOINT_STEP,
    ANNOTATION_CHECKPOINT_TIME,
    ANNOTATION_CHECKPOINT_ACK,
    ANNOTATION_RUNTIME_PHASE,
    ANNOTATION_CHECKPOINT_WRITING,
    ANNOTATION_CHECKPOINT_DURATION,
)
"""Every annotation a worker writes on its own pod (:meth:`gpuscaler.runtime.progress.Progress.annotations`);
the Helm chart's worker admission policy allows a worker to change these and nothing else."""

DOWNWARD_ANNOTATIONS_FILE: Final = "annotations"
"""File name, inside :data:`ENV_PODINFO_DIR`, of the downward API projection of
``metadata.annotations``."""

# --- Exit codes ---------------------------------------------------------------------------------

EXIT_PREEMPTED: Final = 75
"""The worker stopped on SIGTERM after its checkpoint completed: resume it elsewhere. 75 is
``EX_TEMPFAIL`` from sysexits.h ("temporary failure, try again"), distinct from 0 (training done),
1 (error) and 143 (killed by SIGTERM without a handler, i.e. no checkpoint was taken)."""

EXIT_DONE: Final = 0
"""Training finished; the final checkpoint is complete."""

# --- Defaults -----------------------------------------------------------------------------------

DEFAULT_CHECKPOINT_KEEP: Final = 3
"""Checkpoints kept: the newest plus two to fall back on when the newest turns out corrupt."""

DEFAULT_CHECKPOINT_INTERVAL_S: Final = 600.0
"""Used only when neither the env nor the caller gives an interval. Ten minutes bounds the work
lost to a spot reclaim without notice; the operator normally sets the planned interval."""

DISK_FULL_FREE_BYTES: Final = 1 << 20
"""A failed checkpoint write on a file system with less than this free (1 MiB) is reported as "disk
full" even when the framework's exception hides the ENOSPC (torch.save raises a RuntimeError)."""

DEFAULT_REPORT_INTERVAL_S: Final = 10.0
"""Minimum seconds between periodic progress reports (checkpoints and exit always report), so a
reporter that patches the pod does not flood the API server."""
