"""The TrainingJob status: what the operator reports back (phase, conditions, plan, progress, cost).

The operator writes these models to the ``status`` subresource; ``gpuscaler crd`` turns them into
the CRD's status schema and the printer columns read them (``kubectl get trainingjobs``). The
operator also reads the status back on every reconcile, which is what makes it restart-safe: the
phase, the chosen plan, the attempt counters and the offerings in back-off all live here, and
everything else (nodes, pods) is observed from the cluster.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class StatusModel(BaseModel):
    """Base: camelCase on the wire; unknown fields ignored (an older or newer operator wrote them)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Phase(StrEnum):
    """Where a TrainingJob is in its life."""

    PENDING = "Pending"
    """Accepted, not planned yet; or planned and suspended (``spec.suspend``)."""
    PLANNING = "Planning"
    """The planner is choosing (or re-choosing, after a capacity shortage) a plan."""
    QUEUED = "Queued"
    """Planned; the gang waits in its Kueue LocalQueue for admission (``status.queue.reason`` says why)."""
    PROVISIONING = "Provisioning"
    """The node pool is growing to the planned nodes."""
    STARTING = "Starting"
    """All nodes are there; the workers are being scheduled and started."""
    RUNNING = "Running"
    """Every worker runs."""
    CHECKPOINTING = "Checkpointing"
    """A checkpoint was requested (interruption notice) and is being written."""
    RECOVERING = "Recovering"
    """A worker or node was lost; the gang is restarted from the last checkpoint."""
    SUCCEEDED = "Succeeded"
    """Every worker finished successfully."""
    FAILED = "Failed"
    """Infeasible, or the workers failed more often than the backoff limit allows."""

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


ACTIVE_PHASES = (Phase.PROVISIONING, Phase.STARTING, Phase.RUNNING, Phase.CHECKPOINTING, Phase.RECOVERING)
"""Phases in which the job holds (or is acquiring) nodes."""


class Condition(StatusModel):
    """A standard Kubernetes condition (``metav1.Condition``)."""

    type: str = Field(max_length=316, description="Condition type: Planned, NodesReady, Running, Complete, Failed, Suspended.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", max_length=1024, description="CamelCase reason for the last transition.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation it was set for.")


class PlanSegment(StatusModel):
    """One stretch of a segmented plan (a capacity block's window, then what follows; docs/capacity.md)."""

    offering: str = Field(description="Nodes x instance type, capacity type and held pool.")
    capacity_type: str = Field(description="on-demand, spot, reserved, capacity-block or flex-start.")
    held_capacity: str = Field(default="", description="The policy's held capacity pool it runs on; empty for capacity bought by the hour.")
    start: datetime = Field(description="When it starts (planned).")
    checkpoint_at: datetime | None = Field(
        default=None, description="When the operator asks for the checkpoint before the window closes (a planned move, not a failure).",
    )
    samples: float = Field(ge=0, description="Samples trained in it.")
    cost_usd: float = Field(ge=0, description="What the team pays for it at the margin.")


class PlanStatus(StatusModel):
    """The plan the operator runs (the same numbers ``gpuscaler plan`` prints)."""

    instance_type: str = Field(description="Instance type of every node.")
    provider: str = Field(description="Cloud of the instance type.")
    region: str = Field(description="Region of the price used.")
    zone: str = Field(default="", description="Availability zone the nodes are created in and the price is for; empty = any zone of the region.")
    gpu_type: str = Field(description="GPU id.")
    gpus_per_node: int = Field(ge=0, description="GPUs on one node.")
    nodes: int = Field(ge=1, description="Nodes (= worker pods).")
    gpus: int = Field(ge=0, description="GPUs in total.")
    capacity_type: Literal["on-demand", "spot", "reserved", "capacity-block", "flex-start"] = Field(
        description="on-demand, spot, or held capacity: reserved, capacity-block, flex-start (docs/capacity.md)."
    )
    held_capacity: str = Field(default="", description="The policy's held capacity pool the plan runs on; empty for capacity bought by the hour.")
    reservation_id: str = Field(default="", description="The cloud's id of that pool (an EC2 capacity reservation), when declared.")
    window_start: datetime | None = Field(default=None, description="When the pool's window opens (a capacity block).")
    window_end: datetime | None = Field(default=None, description="When the pool's window closes (a block's end, a reservation's expiry).")
    segments: list[PlanSegment] = Field(
        default_factory=list, max_length=16,
        description="A segmented plan's stretches in order (runs in a window, checkpoints before it closes, continues); empty for one piece.",
    )  # fmt: skip
    precision: str = Field(description="Numeric precision the workers train in.")
    micro_batch: int = Field(ge=1, description="Micro-batch per GPU.")
    accumulation: int = Field(ge=1, description="Gradient-accumulation steps.")
    usd_per_hour: float = Field(ge=0, description="Price of all the plan's nodes per hour.")
    price_source: str = Field(default="", description="Where the price came from: shipped-table, policy-override, or a live price source (docs/prices.md).")
    price_date: str = Field(default="", description="ISO day the price was read.")
    expected_hours: float = Field(ge=0, description="Predicted wall-clock hours, interruptions included.")
    expected_cost_usd: float = Field(ge=0, description="Predicted cost in US dollars.")
    checkpoint_interval_seconds: int = Field(ge=0, description="Planned checkpoint interval.")
    total_samples: float = Field(ge=0, description="Samples the job trains on in total.")
    throughput: float = Field(ge=0, description="Predicted samples per second.")
    why: str = Field(default="", description="Why the planner chose this plan.")
    trial: bool = Field(
        default=False,
        description=(
            "A trial (constraints.atRiskLimit: Trial): no plan met maxDeadlineRisk, so this one runs until its "
            "speed is measured; kept (false) when the measured P(miss) is within the limit, else the job moves "
            "to a plan that is or stops (Failed, DeadlineInfeasible)."
        ),
    )
    summary: str = Field(default="", description="One line: nodes x instance (GPUs) capacity precision.")
    planned_at: datetime = Field(description="When it was planned.")
    generation: int = Field(default=0, ge=0, description="metadata.generation of the spec it was planned for.")
    efficiency_factor: float = Field(
        default=1.0, gt=0, description="Observed/model efficiency factor of the GPU type that throughput includes (1 = the model as calibrated; a performance profile's measured/model ratio when the plan came from one)."
    )
    throughput_p10: float | None = Field(default=None, ge=0, description="Slow end of the throughput band (10th percentile of the model's error), samples/s.")
    throughput_p90: float | None = Field(default=None, ge=0, description="Fast end of the throughput band (90th percentile), samples/s.")
    throughput_log_sigma: float | None = Field(default=None, ge=0, description="Log-space sigma of the throughput band (the model's cross-validated error, widened away from calibration).")
    p90_hours: float | None = Field(default=None, ge=0, description="Expected hours at the band's slow end (P90 time).")
    p90_cost_usd: float | None = Field(default=None, ge=0, description="Expected cost at the band's slow end (P90 cost).")
    deadline_miss_probability: float | None = Field(default=None, ge=0, le=1, description="P(miss deadline) at planning, with interruptions and model error.")
    throughput_source: str | None = Field(
        default=None,
        max_length=512,
        description="What throughput comes from when the namespace has performance profiles of the workload: 'measured in N runs' (a PerformanceProfile of this very configuration), how a near profile moved the model, or 'model'.",
    )


class Progress(StatusModel):
    """Training progress, from the annotations the training runtime writes on the workers."""

    step: int = Field(default=0, ge=0, description="Optimizer steps completed.")
    samples: float = Field(default=0, ge=0, description="Samples processed (across restarts).")
    percent: float = Field(default=0, ge=0, le=100, description="Samples processed of the total, in percent.")
    checkpoint_step: int | None = Field(default=None, ge=0, description="Step of the newest complete checkpoint.")
    updated_at: datetime | None = Field(default=None, description="When progress last changed.")
    reported_by: str | None = Field(
        default=None,
        max_length=253,
        description="The worker pod whose annotations these values came from (the writer rank's, checked and bounded).",
    )


class UnavailableOffering(StatusModel):
    """An instance type x capacity type that ran short of capacity, left out of plans until ``until``."""

    instance_type: str = Field(description="Instance type.")
    capacity_type: str = Field(description="on-demand or spot.")
    zone: str = Field(default="", description="The zone that ran short; empty = every zone of the region.")
    until: datetime = Field(description="Left out of plans until this time.")
    reason: str = Field(default="", description="What happened.")

    @property
    def key(self) -> tuple[str, ...]:
        """How the planner's ``unavailable`` names it: ``(instance, capacity)`` in every zone,
        ``(instance, capacity, zone)`` in one."""
        return (self.instance_type, self.capacity_type, self.zone) if self.zone else (self.instance_type, self.capacity_type)


class NoticeStatus(StatusModel):
    """An interruption notice being handled: the checkpoint handshake in flight (kept for restarts)."""

    node: str = Field(description="The node that is going away.")
    signal: str = Field(description="What announced it, e.g. aws-spot-itn, gke-termination (see docs/operator.md).")
    reason: str = Field(default="", description="The signal in words, with the annotation's text if any.")
    noticed_at: datetime = Field(description="When the operator first saw the notice.")
    deadline: datetime | None = Field(default=None, description="When the node goes; none for a soft notice.")
    request_id: str = Field(default="", description="The gpuscaler.io/checkpoint-requested id sent to the workers.")
    progress_step: int = Field(
        default=0,
        ge=0,
        description="Progress step when the checkpoint was requested: an acknowledgement counts only with a checkpoint at or after it.",
    )


class InterruptionRecord(StatusModel):
    """One interruption: what announced it, what it cost and how the job recovered."""

    time: datetime = Field(description="When the notice (or the loss) was seen.")
    node: str = Field(default="", description="The node reclaimed.")
    signal: str = Field(description="aws-spot-itn, gke-termination, karpenter-disrupted, node-deleted, ...")
    instance_type: str = Field(default="", description="Instance type of the plan interrupted.")
    capacity_type: str = Field(default="", description="Capacity type of the plan interrupted.")
    checkpoint_acked: bool = Field(default=False, description="The workers confirmed the requested checkpoint.")
    checkpoint_step: int | None = Field(default=None, ge=0, description="Step of the checkpoint resumed from.")
    step_reached: int = Field(default=0, ge=0, description="Newest step reported before the interruption.")
    lost_steps: int | None = Field(default=None, ge=0, description="Steps trained again: stepReached - checkpointStep.")
    recovery_seconds: float | None = Field(default=None, ge=0, description="Seconds from the notice to Running again.")
    action: str = Field(default="", description="What the re-plan chose, and why.")


class ProgressSample(StatusModel):
    """One reading of the workers' ``gpuscaler.io/progress-samples`` annotation."""

    at: datetime = Field(description="When the operator saw the value.")
    samples: float = Field(ge=0, description="Samples processed so far.")


class ObservedStatus(StatusModel):
    """Observed performance: the workers' progress annotations (always), and the cluster's
    Prometheus (DCGM exporter + the runtime's metrics) when configured.

    Written by :mod:`gpuscaler.observe.controller` while the job runs; the efficiency factors are
    applied when the job is planned again (see docs/observe.md).
    """

    throughput: float | None = Field(default=None, ge=0, description="Observed samples/s: robust rate of gpuscaler_runtime_samples_total.")
    predicted: float | None = Field(default=None, ge=0, description="The running plan's predicted samples/s (plan.throughput).")
    ratio: float | None = Field(default=None, ge=0, description="throughput / predicted.")
    efficiency_factor: float = Field(default=1.0, gt=0, description="Observed/model throughput on the plan's GPU type; applied when re-planning.")
    efficiency_by_gpu: dict[str, float] = Field(default_factory=dict, description="Efficiency factor per GPU type measured so far (GPU id -> factor).")
    gpu_util: float | None = Field(default=None, ge=0, le=100, description="Mean GPU utilisation, percent (DCGM_FI_DEV_GPU_UTIL).")
    tensor_active: float | None = Field(default=None, ge=0, le=1, description="Mean tensor-pipe activity, 0-1 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).")
    dram_active: float | None = Field(default=None, ge=0, le=1, description="Mean DRAM activity, 0-1 (DCGM_FI_PROF_DRAM_ACTIVE).")
    memory_used_gb: float | None = Field(default=None, ge=0, description="GPU memory used on the fullest GPU, GB (DCGM_FI_DEV_FB_USED).")
    memory_used_fraction: float | None = Field(default=None, ge=0, le=1, description="FB used / (used + free) on the fullest GPU.")
    interconnect_gbs: float | None = Field(default=None, ge=0, description="PCIe + NVLink tx+rx per GPU, GB/s.")
    pods: int = Field(default=0, ge=0, description="Worker pods with samples-counter data.")
    gpus_seen: int = Field(default=0, ge=0, description="GPUs with DCGM data.")
    message: str = Field(default="", description="What the last assessment concluded.")
    last_assessed: datetime | None = Field(default=None, description="When the metrics were last assessed.")
    last_corrected: datetime | None = Field(default=None, description="When the efficiency factor last changed.")
    replan_pending: bool = Field(default=False, description="A re-plan was decided; the move waits for a checkpoint (for the deadline, one the operator asks the workers for at once; for cost, the next periodic one).")
    replan_reason: str = Field(default="", description="Why a re-plan is pending (or why the last one was made).")
    stop_pending: bool = Field(default=False, description="A trial ended with no plan that meets maxDeadlineRisk at the measured speed: the job stops (Failed, DeadlineInfeasible) at the checkpoint the operator asked the workers for (replanAfterCheckpointStep).")
    next_trial_pending: bool = Field(default=False, description="A trial would probably miss the deadline and a plan on a GPU type not tried yet has the deadline inside its band: the job moves there as the next trial at the checkpoint the operator asked the workers for (or stops when there is none then).")
    tried_gpu_types: list[str] = Field(default_factory=list, description="GPU types this job ran trials on that would probably have missed the deadline: a next trial is on another type.")
    replan_after_checkpoint_step: int | None = Field(default=None, ge=0, description="Move when a checkpoint newer than this step is reported.")
    last_replan: datetime | None = Field(default=None, description="When the job last moved to a plan found by observation.")
    replans: int = Field(default=0, ge=0, description="Moves to a plan found by observation so far.")
    source: str = Field(default="", description="Where throughput was measured: annotations (progress annotations) or prometheus.")
    progress_points: list[ProgressSample] = Field(
        default_factory=list, max_length=64, description="Recent progress readings of the running gang (the correction's input)."
    )
    corrected_throughput: float | None = Field(default=None, ge=0, description="The running plan's corrected throughput, samples/s.")
    correction_log_sigma: float | None = Field(
        default=None, ge=0, description="How sure the correction is: log-space sigma of the corrected throughput."
    )
    window_seconds: float | None = Field(default=None, ge=0, description="Seconds of progress the correction was measured over.")
    deadline_miss_probability: float | None = Field(
        default=None, ge=0, le=1, description="The running plan's P(miss deadline) for the work left, at the corrected throughput."
    )


class QueueStatus(StatusModel):
    """The job's gang in Kueue: which queue, which Workload, admitted or why it waits."""

    name: str = Field(description="The LocalQueue (spec.queueName or the kueue.x-k8s.io/queue-name label).")
    workload: str | None = Field(default=None, description="The Kueue Workload of the current gang, once Kueue made it.")
    admitted: bool = Field(default=False, description="Kueue admitted the gang (quota reserved and admission checks passed).")
    cluster_queue: str | None = Field(default=None, description="The ClusterQueue that admitted it.")
    flavor: str | None = Field(default=None, description="The ResourceFlavor Kueue assigned to nvidia.com/gpu.")
    expected_flavor: str | None = Field(
        default=None, description="The ResourceFlavor that matches the plan's GPU type and capacity type (docs/kueue-jobset.md)."
    )
    reason: str = Field(default="", description="Why the gang waits or was evicted, from the Workload's conditions (a printer column).")
    evictions: int = Field(default=0, ge=0, description="Kueue evictions and preemptions of this job so far.")


class TrainingJobStatus(StatusModel):
    """The observed state of a TrainingJob (the ``status`` subresource)."""

    phase: Phase = Field(default=Phase.PENDING, description="Pending, Planning, Queued, Provisioning, Starting, Running, Checkpointing, Recovering, Succeeded or Failed.")
    message: str = Field(default="", description="What is happening now, or why it failed.")
    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
    plan: PlanStatus | None = Field(default=None, description="The chosen plan with its predicted cost and time.")
    gpus: int | None = Field(default=None, ge=0, description="GPUs of the plan (a printer column).")
    instance_type: str | None = Field(default=None, description="Instance type of the plan (a printer column).")
    capacity_type: str | None = Field(default=None, description="Capacity type of the plan (a printer column).")
    progress: Progress = Field(default_factory=Progress, description="Training progress.")
    cost_usd: float = Field(default=0, ge=0, description="Cost so far: node-hours x price by capacity type.")
    released_cost_usd: float = Field(default=0, ge=0, description="Part of costUsd from nodes already released.")
    eta: str | None = Field(default=None, description="Time left, e.g. 2h13m (a printer column).")
    estimated_completion_time: datetime | None = Field(default=None, description="When it should finish.")
    start_time: datetime | None = Field(default=None, description="When every worker first ran.")
    completion_time: datetime | None = Field(default=None, description="When it succeeded or failed.")
    provisioning_started_at: datetime | None = Field(default=None, description="When the current gang was requested (gang timeout).")
    attempt: int = Field(default=0, ge=0, description="Gang starts so far (1 = first).")
    failures: int = Field(default=0, ge=0, description="Worker failures counted against the backoff limit.")
    interruptions: int = Field(default=0, ge=0, description="Nodes lost (spot reclaims) so far.")
    interruption_history: list[InterruptionRecord] = Field(
        default_factory=list, description="The latest interruptions (at most 20), oldest first."
    )
    notice: NoticeStatus | None = Field(default=None, description="The interruption notice being handled now.")
    lost_steps: int = Field(default=0, ge=0, description="Steps trained again after interruptions, in total.")
    recovery_seconds: float = Field(default=0, ge=0, description="Seconds from notices to Running again, in total.")
    unavailable: list[UnavailableOffering] = Field(default_factory=list, description="Offerings in capacity back-off.")
    nodes: list[str] = Field(default_factory=list, description="Names of the nodes the job holds.")
    queue: QueueStatus | None = Field(default=None, description="Kueue admission of the gang (jobs with a queue only).")
    observed: ObservedStatus | None = Field(default=None, description="Observed performance vs the plan's prediction (progress annotations; Prometheus when configured).")
