"""The TrainingJob API: the pydantic models that are the source of truth for the CRD.

A TrainingJob says what to train (a named workload, or a custom one from parameters and FLOPs or a
transformer shape), how much (samples, epochs or steps at a global batch), by when (deadline) and
for how much (budget), what to optimise, the user's constraints, and the worker pod template. The
planner (``gpuscaler plan``) and the operator read exactly these models; ``gpuscaler crd`` turns
them into ``crds/``. Python names are snake_case; the wire format is camelCase.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gpuscaler.inputs import StrictModel, aware_time, check_labels, check_name, shown
from gpuscaler.names import QUEUE_NAME_LABEL

API_GROUP = "gpuscaler.io"
API_VERSION = "v1alpha1"
KIND = "TrainingJob"
PLURAL = "trainingjobs"

MAX_TRAINING_SAMPLES = 1e15
"""Most samples one job may train (samples, epochs x dataset or steps x global batch): about 65
times the largest published training run even counted in tokens (Llama 3: 15.6e12 tokens, Meta,
"The Llama 3 Herd of Models", 2024). Bounds the work a plan describes."""
MAX_HORIZON_HOURS = 366 * 24.0
"""Furthest deadline (maxDuration, or a deadline's distance from now) planned for: one year. Prices
and spot rates are not forecast beyond it, and it bounds the planner's deadline-risk sums."""
MAX_GPUS = 4096
"""Most GPUs one job may use (constraints.minGpus/maxGpus; ``gpuscaler estimate --gpus``)."""
MAX_NODES = 1024
"""Most nodes one job may use (constraints.maxNodes; ``gpuscaler estimate --nodes``)."""
MAX_GLOBAL_BATCH = 100_000_000
"""Largest global batch in batch items (globalBatch; ``gpuscaler estimate``'s batch per GPU x
accumulation x GPUs)."""
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?d)?\s*(\d+(\.\d+)?h)?\s*(\d+(\.\d+)?m)?\s*$"
"""A maxDuration as the CRD's schema checks it: days, hours and/or minutes."""


class Model(StrictModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields refused, types as written
    (:class:`gpuscaler.inputs.StrictModel`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Objective(StrEnum):
    CHEAPEST = "cheapest"
    """Cheapest plan that meets the deadline (and budget)."""
    FASTEST = "fastest"
    """Fastest plan within the budget."""


class SpotPolicy(StrEnum):
    NEVER = "never"
    ALLOWED = "allowed"
    PREFERRED = "preferred"


class AtRiskLimit(StrEnum):
    """What the planner does when no plan meets ``maxDeadlineRisk``."""

    TRIAL = "Trial"
    """Start the objective's pick of the plans whose band reaches the deadline and judge it as it is measured:
    kept once the measured P(miss) is within the limit, stopped once it reaches one half
    (:mod:`gpuscaler.planner.trial`)."""
    REFUSE = "Refuse"
    """Answer no plan (Infeasible), naming the binding rule."""


class PrecisionName(StrEnum):
    FP32 = "fp32"
    TF32 = "tf32"
    AMP = "amp"
    BF16 = "bf16"
    FP8 = "fp8"


class WorkerRuntime(StrEnum):
    """How the gang of workers runs (docs/kueue-jobset.md)."""

    PODS = "pods"
    """One pod per node, created by the operator (a job with a queue runs as a JobSet instead)."""
    JOBSET = "jobset"
    """One JobSet (JobSet controller, jobset.x-k8s.io/v1alpha2) with one replicated job of N workers."""


QUEUE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ZONE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""An availability zone as the node label ``topology.kubernetes.io/zone`` spells it."""
"""A LocalQueue name (Kueue's queue-name label value, which must also be a DNS-1123 label)."""


class TransformerSpec(Model):
    """A dense transformer's shape; gpuscaler derives parameters, FLOPs and activation memory."""

    layers: int = Field(ge=1, le=1000, description="Number of transformer layers.")
    hidden: int = Field(ge=8, le=131072, description="Hidden (model) dimension.")
    heads: int = Field(ge=1, le=1024, description="Attention heads.")
    seq_len: int = Field(ge=1, le=1_048_576, description="Tokens per sequence (one sample).")
    vocab: int = Field(ge=1, le=10_000_000, description="Vocabulary size.")
    ffn: int | None = Field(
        default=None, ge=1, description="Feed-forward inner size; 4 x hidden when omitted."
    )
    gated: bool = Field(default=False, description="SwiGLU-style gated feed-forward (3 matrices).")
    head: Literal["lm", "mlm", "none"] = Field(
        default="lm", description="Output head: causal LM, masked LM, none."
    )
    flash_attention: bool = Field(
        default=True, description="Memory-efficient attention (no s^2 activations)."
    )

    @model_validator(mode="after")
    def _shape(self) -> TransformerSpec:
        if self.hidden % self.heads:
            raise ValueError(
                f"transformer: hidden {self.hidden} is not divisible by heads {self.heads} (each head gets "
                f"hidden / heads dimensions); use e.g. heads {_divisor_near(self.hidden, self.heads)}"
            )
        return self


def _divisor_near(n: int, k: int) -> int:
    """The divisor of ``n`` closest to ``k`` (for the hint of a transformer shape that does not divide)."""
    return min((d for d in range(1, min(n, 4 * k) + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


class WorkloadSpec(Model):
    """What is trained: a named profile (``gpuscaler catalog workloads``) or a custom workload."""

    model: str | None = Field(
        default=None, description="Named workload, e.g. resnet50, bert-large-squad, llama-7b."
    )
    transformer: TransformerSpec | None = Field(default=None, description="Custom transformer by shape.")
    params: float | None = Field(default=None, gt=0, description="Custom: trainable parameters.")
    flops_per_sample: float | None = Field(
        default=None, gt=0, description="Custom: training FLOPs per sample."
    )
    activation_bytes_per_sample: float | None = Field(
        default=None,
        gt=0,
        description="Custom: 16-bit activation bytes kept per sample; estimated when omitted.",
    )
    family: Literal["cnn", "cnn-light", "detection", "transformer", "rnn"] = Field(
        default="transformer", description="Custom: workload family (selects the fitted efficiencies)."
    )
    unit: str = Field(
        default="samples", max_length=32, description="Custom: what one sample is (images, sequences)."
    )
    optimizer: Literal["adam", "sgd"] | None = Field(
        default=None, description="Optimizer (memory for its state)."
    )
    channels_last: bool = Field(
        default=False,
        description=(
            "Convolutions run in channels-last (NHWC) memory format, e.g. "
            "model.to(memory_format=torch.channels_last); false = PyTorch's default NCHW, which is "
            "slower on tensor cores at 16-bit precision."
        ),
    )
    data_loader: Literal["pytorch", "dali"] = Field(
        default="pytorch",
        description=(
            "Input pipeline: pytorch (DataLoader workers decoding on the CPU) or dali (NVIDIA DALI, "
            "decoding on the GPU); bounds image workloads by the node's vCPUs."
        ),
    )
    depthwise_flop_share: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description=(
            "Custom: share of the training FLOPs in depthwise (grouped) convolutions, e.g. 0.09 for an "
            "EfficientNet-B0-like network; they run on CUDA cores, not tensor cores. Default 0."
        ),
    )
    variable_inputs: bool | None = Field(
        default=None,
        description=(
            "Custom: inputs vary in size from step to step (images of varying shape, sentences of "
            "varying length), so each synchronous step waits for the slowest GPU. Default false."
        ),
    )

    @model_validator(mode="after")
    def _one_kind(self) -> WorkloadSpec:
        kinds = [self.model is not None, self.transformer is not None, self.params is not None]
        if sum(kinds) != 1:
            raise ValueError("workload: give exactly one of model, transformer, or params + flopsPerSample")
        if self.params is not None and self.flops_per_sample is None:
            raise ValueError("workload: a custom workload with params also needs flopsPerSample")
        if self.model is not None and (self.depthwise_flop_share is not None or self.variable_inputs is not None):
            raise ValueError(
                "workload: depthwiseFlopShare and variableInputs describe a custom workload; a named "
                "workload has its own (gpuscaler catalog workloads): remove them"
            )
        if self.transformer is not None and self.depthwise_flop_share is not None:
            raise ValueError("workload.depthwiseFlopShare: a transformer has no convolutions; remove it")
        return self


class TrainingAmount(Model):
    """How much training: exactly one of samples, epochs (with samplesPerEpoch for custom data) or steps."""

    samples: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TRAINING_SAMPLES,
        description="Total training samples in the workload's unit (what its throughput counts: images, sequences, tokens).",
    )
    epochs: float | None = Field(default=None, gt=0, le=1_000_000, description="Epochs over the dataset.")
    samples_per_epoch: int | None = Field(
        default=None, gt=0, description="Dataset size; named workloads know theirs."
    )
    steps: int | None = Field(
        default=None, gt=0, le=int(MAX_TRAINING_SAMPLES), description="Optimizer steps at the global batch."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> TrainingAmount:
        if sum(x is not None for x in (self.samples, self.epochs, self.steps)) != 1:
            raise ValueError("training: give exactly one of samples, epochs or steps")
        return self


class Constraints(Model):
    """The user's own limits on how the job may run (policies can narrow them further)."""

    gpu_types: list[str] = Field(
        default_factory=list, description="Allowed GPU types (ids or aliases); empty = any."
    )
    instance_types: list[str] = Field(
        default_factory=list, description="Allowed instance types; empty = any."
    )
    providers: list[Literal["aws", "gcp", "azure"]] = Field(
        default_factory=list, description="Allowed clouds."
    )
    regions: list[str] = Field(default_factory=list, description="Allowed regions; empty = any.")
    zones: list[str] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Allowed availability zones, as nodes label them (topology.kubernetes.io/zone: us-east-1a, "
            "us-central1-a, eastus-1); empty = any. The planner picks among them by price and capacity."
        ),
    )
    min_gpus: int = Field(default=1, ge=1, le=MAX_GPUS, description="Fewest GPUs to use.")
    max_gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS, description="Most GPUs to use.")
    max_nodes: int | None = Field(default=None, ge=1, le=MAX_NODES, description="Most nodes to use.")
    precisions: list[PrecisionName] = Field(
        default_factory=list,
        description=(
            "Precisions to consider; empty = fp32 and amp. fp8 (Transformer Engine) is considered "
            "only when listed here."
        ),
    )
    spot: SpotPolicy = Field(
        default=SpotPolicy.ALLOWED, description="Use spot capacity: never, allowed, preferred."
    )
    max_deadline_risk: float = Field(
        default=0.05, ge=0, le=1, description="Highest acceptable probability of missing the deadline."
    )
    at_risk_limit: AtRiskLimit = Field(
        default=AtRiskLimit.TRIAL,
        description=(
            "When no plan meets maxDeadlineRisk but the deadline is inside a plan's band (P(miss) below 90%): "
            "Trial (default) starts the cheapest such plan and measures it within minutes; it is kept once its "
            "measured P(miss) is within maxDeadlineRisk, moves to a plan that is, runs on while the deadline "
            "would probably be met, or else stops at a checkpoint (Failed, DeadlineInfeasible); Refuse fails "
            "the job at once (Infeasible)."
        ),
    )

    @field_validator("zones")
    @classmethod
    def _zones(cls, v: list[str]) -> list[str]:
        for zone in v:
            if not re.fullmatch(ZONE_PATTERN, zone):
                raise ValueError(
                    f"zones: {shown(zone)} is not a zone name as nodes label it (topology.kubernetes.io/zone): "
                    "lower-case letters, digits and '-', at most 63 characters, like us-east-1a, us-central1-a or eastus-1"
                )
        return v

    @model_validator(mode="after")
    def _gpu_range(self) -> Constraints:
        if self.max_gpus is not None and self.min_gpus > self.max_gpus:
            raise ValueError(f"constraints: minGpus {self.min_gpus} > maxGpus {self.max_gpus}")
        return self


class CheckpointSpec(Model):
    """Checkpointing: where, how often (Young/Daly optimum when omitted), how long it takes."""

    dir: str = Field(default="/checkpoints", description="Checkpoint directory inside the workers.")
    interval_seconds: int | None = Field(
        default=None, ge=10, le=86400, description="Fixed interval; auto if omitted."
    )
    write_seconds: float | None = Field(
        default=None, gt=0, description="Time to write one; estimated if omitted."
    )
    restart_seconds: float = Field(
        default=300, ge=0, description="Time to get replacement capacity and restart."
    )
    keep: int = Field(default=3, ge=1, le=100, description="Checkpoints kept.")


def parse_duration(text: str) -> timedelta:
    """'36h', '2d', '90m', '1d12h' -> timedelta, longer than zero and at most a year.

    Raises:
        ValueError: not of that form, zero, or beyond :data:`MAX_HORIZON_HOURS`.
    """
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*", text)
    if not parts or not any(parts.groups()):
        raise ValueError(
            f"duration {shown(text)}: write days, hours and/or minutes, like '36h', '2d', '1d12h' or '90m'"
        )
    d, h, m = (float(g) if g else 0.0 for g in parts.groups())
    hours = d * 24 + h + m / 60
    if hours <= 0:
        raise ValueError(f"duration {shown(text)} is zero; give how long the job may take, like '36h'")
    if hours > MAX_HORIZON_HOURS:
        raise ValueError(
            f"duration {shown(text)} is {hours:,.0f} h, beyond the {MAX_HORIZON_HOURS:,.0f} h (one year) "
            "planning horizon; give a shorter one or omit it for no deadline"
        )
    return timedelta(hours=hours)


class TrainingJobSpec(Model):
    """The desired state of a TrainingJob."""

    workload: WorkloadSpec = Field(description="What is trained.")
    global_batch: int = Field(
        ge=1,
        le=MAX_GLOBAL_BATCH,
        description=(
            "Global batch in batch items (images, sequences, sentence pairs: the batch unit of "
            "gpuscaler catalog workloads), kept exactly."
        ),
    )
    training: TrainingAmount = Field(description="How much training.")
    deadline: datetime | None = Field(default=None, description="Finish by this time (RFC 3339).")
    max_duration: str | None = Field(
        default=None,
        json_schema_extra={"pattern": DURATION_PATTERN},
        description="Finish within this long of submission, e.g. 36h, 2d.",
    )
    budget_usd: float | None = Field(default=None, gt=0, description="Spend at most this many US dollars.")
    objective: Objective = Field(
        default=Objective.CHEAPEST, description="cheapest (within deadline) or fastest (within budget)."
    )
    constraints: Constraints = Field(default_factory=Constraints, description="Limits on how it may run.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoint settings.")
    suspend: bool = Field(default=False, description="Plan only; provision nothing until set to false.")
    template: dict[str, Any] | None = Field(
        default=None,
        description="Worker pod template (a core/v1 PodTemplateSpec): image, command, env, volumes.",
    )
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        json_schema_extra={"pattern": QUEUE_NAME_PATTERN},
        description=(
            "Kueue LocalQueue (in the job's namespace) that admits the job's workers; the label "
            "kueue.x-k8s.io/queue-name on the TrainingJob says the same. Nodes are provisioned only "
            "once Kueue admits the gang."
        ),
    )
    runtime: WorkerRuntime = Field(
        default=WorkerRuntime.PODS,
        description="pods: one pod per node (default); jobset: one JobSet of N workers (needs the JobSet controller). A job with a queue always runs as a JobSet.",
    )

    @field_validator("queue_name")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(QUEUE_NAME_PATTERN, v):
            raise ValueError(
                f"queueName {shown(v)} is not a LocalQueue name: lower-case letters, digits and '-', "
                "starting and ending with a letter or digit, at most 63 characters"
            )
        return v

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_zone(cls, v: object) -> object:
        return v if v is None else aware_time(v, "deadline")  # no zone, or a bare number: refused, not guessed

    @field_validator("max_duration")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    @model_validator(mode="after")
    def _objective_needs(self) -> TrainingJobSpec:
        if self.objective is Objective.FASTEST and self.budget_usd is None:
            raise ValueError("objective fastest needs budgetUsd (the fastest plan within what budget?)")
        if self.training.steps is not None and self.training.steps * self.global_batch > MAX_TRAINING_SAMPLES:
            raise ValueError(
                f"training.steps {self.training.steps:,} x globalBatch {self.global_batch:,} is over "
                f"{MAX_TRAINING_SAMPLES:.0e} samples, beyond any real training run; check the numbers"
            )
        return self

    def deadline_hours(self, now: datetime | None = None) -> float | None:
        """Hours from ``now`` to the effective deadline (the earlier of deadline and maxDuration)."""
        now = now or datetime.now(UTC)
        limits = []
        if self.deadline is not None:
            dl = self.deadline if self.deadline.tzinfo else self.deadline.replace(tzinfo=UTC)
            limits.append((dl - now).total_seconds() / 3600)
        if self.max_duration is not None:
            limits.append(parse_duration(self.max_duration).total_seconds() / 3600)
        return min(limits) if limits else None


class ObjectMeta(Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    name: str = "trainingjob"
    namespace: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_names(cls, data: Any) -> Any:
        """The name, namespace and labels as the API server accepts them (gpuscaler.inputs)."""
        if isinstance(data, dict):
            if "name" in data:
                check_name(data["name"], "metadata.name")
            if data.get("namespace") is not None:
                check_name(data["namespace"], "metadata.namespace", label=True)
            check_labels(data.get("labels"), "metadata.labels")
        return data


class TrainingJob(Model):
    """A whole TrainingJob document, as in ``examples/trainingjob.yaml``."""

    api_version: Literal["gpuscaler.io/v1alpha1"] = "gpuscaler.io/v1alpha1"
    kind: Literal["TrainingJob"] = "TrainingJob"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TrainingJobSpec

    @model_validator(mode="after")
    def _one_queue(self) -> TrainingJob:
        effective_queue(self.spec.queue_name, getattr(self.metadata, "labels", None))
        return self


def effective_queue(queue_name: str | None, labels: Any) -> str | None:
    """The LocalQueue a job names: ``spec.queueName``, else its ``kueue.x-k8s.io/queue-name`` label.

    Args:
        queue_name: ``spec.queueName``.
        labels: the TrainingJob's ``metadata.labels`` (a mapping, or None).

    Returns:
        The queue name, or None when the job names no queue (it is not admitted through Kueue).

    Raises:
        ValueError: the label is not a queue name, or the label and ``spec.queueName`` differ.
    """
    label = (labels or {}).get(QUEUE_NAME_LABEL) if isinstance(labels, dict) else None
    if label is not None and (not isinstance(label, str) or not re.fullmatch(QUEUE_NAME_PATTERN, label)):
        raise ValueError(
            f"metadata.labels[{QUEUE_NAME_LABEL}] {shown(label)} is not a LocalQueue name: lower-case "
            "letters, digits and '-', starting and ending with a letter or digit"
        )
    if queue_name is not None and label is not None and label != queue_name:
        raise ValueError(
            f"spec.queueName {shown(queue_name)} and label {QUEUE_NAME_LABEL}={shown(label)} name different "
            "queues; give one, or the same in both"
        )
    return queue_name if queue_name is not None else label
