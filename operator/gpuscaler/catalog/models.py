"""Typed rows of the catalog: GPUs, cloud instance types and workload profiles.

Loaded from the schema-versioned CSV files in ``catalog/data`` by :mod:`gpuscaler.catalog.loader`;
used by the performance model, the planner and the fake node pools of the dev cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpuscaler.catalog.workloads import TransformerShape

SUSPECT_PRICE_MARK = "suspiciously deep"
"""The phrase with which ``instances.csv`` flags a spot price its source lists but that looks wrong
(``scripts/build_instances_catalog.py``: Azure spot prices ~88% below on-demand)."""
MIN_SPOT_SHARE = 0.10
"""A spot price under this share of the on-demand price is flagged as implausible wherever it came
from (a live source included): AWS advertises spot "up to 90% off" on-demand (aws.amazon.com/ec2/spot),
so a deeper discount is a data error (moto's EC2 answers every spot price as $0.00001)."""
SHIPPED_SOURCE = "shipped-table"
"""The ``source`` id of a price from the catalog shipped with gpuscaler (``catalog/data/instances.csv``)."""


class CapacityType(StrEnum):
    """How an instance is bought; the values are Karpenter's ``karpenter.sh/capacity-type`` where it
    has one (``reserved`` is Karpenter's own value for capacity reservations).

    On-demand and spot are priced by the catalog; the held types (:data:`HELD_CAPACITY`) are
    declared by the platform team (a policy's ``capacity``, docs/capacity.md) with the price the
    team pays for them at the margin: the catalog prices none of them.
    """

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"
    """Capacity the team holds for a period (ODCR, GCP or Azure reservation): no interruptions."""
    CAPACITY_BLOCK = "capacity-block"
    """A prepaid window (start, end) of N instances (AWS Capacity Blocks for ML, GKE DWS calendar mode)."""
    FLEX_START = "flex-start"
    """Queued capacity that starts after a delay and runs for a bounded time (GKE DWS flex-start)."""


HELD_CAPACITY = frozenset({CapacityType.RESERVED, CapacityType.CAPACITY_BLOCK, CapacityType.FLEX_START})
"""The capacity types a policy declares (priced by the declaration, never by the catalog)."""


class Precision(StrEnum):
    """Numeric precision of training, as a framework user means it.

    ``fp32`` is the framework default full precision: TF32 tensor cores on Ampere and newer (what
    PyTorch's cuDNN default and NGC containers run), plain FP32 on older GPUs. ``amp`` is mixed
    precision with fp16 or bf16 (bf16 where the GPU has it).
    """

    FP32 = "fp32"
    TF32 = "tf32"
    AMP = "amp"
    BF16 = "bf16"
    FP8 = "fp8"


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU model from its spec sheet (dense, non-sparse tensor numbers)."""

    id: str
    """Canonical id, e.g. ``A100-80GB``."""
    aliases: tuple[str, ...]
    """Other names users and clouds give it (case-insensitive), incl. ``nvidia.com/gpu.product``."""
    vendor: str
    arch: str
    """Architecture: volta, turing, ampere, ada, hopper, blackwell, cdna3."""
    memory_gb: float
    mem_bw_gbs: float
    """Memory bandwidth, GB/s."""
    fp32_tflops: float
    """Non-tensor FP32."""
    tf32_tflops: float | None
    """TF32 tensor-core peak; None where the GPU has no TF32 (pre-Ampere)."""
    fp16_tflops: float
    """FP16/BF16 tensor-core peak (dense)."""
    has_bf16: bool
    fp8_tflops: float | None
    intra_link: str
    """GPU-to-GPU link inside a node: nvlink2..nvlink5, infinity-fabric, pcie3..pcie5."""
    intra_link_gbs: float
    """Unidirectional per-GPU bandwidth of that link, GB/s."""
    product_label: str
    """The value GPU feature discovery puts in ``nvidia.com/gpu.product``."""
    tdp_w: float | None
    matmul_efficiency: float | None
    """Measured max achievable BF16 matmul FLOPS / peak (MAMF), where published."""
    source: str
    sm_count: int | None = None
    """Streaming multiprocessors (AMD: compute units): how many GEMM tiles run in one wave."""
    nccl_busbw_gbs: float | None = None
    """Measured NCCL all-reduce bus bandwidth of 8 GPUs in one node, GB/s; None = derive from the link."""


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One cloud instance type with its GPUs and prices (on-demand, spot) in one region."""

    name: str
    provider: str
    """aws, gcp or azure."""
    region: str
    gpu_id: str
    gpu_count: int
    vcpu: int
    memory_gib: float
    network_gbps: float
    """Baseline network bandwidth between instances."""
    ondemand_usd_hr: float
    spot_usd_hr: float | None
    """None where the provider offers no spot for it."""
    interruption_bucket: int | None
    """AWS Spot Advisor bucket: 0 <5%, 1 5-10%, 2 10-15%, 3 15-20%, 4 >20% per month."""
    price_date: str
    source: str
    gpu: GPU = field(compare=False, repr=False)
    """The resolved GPU row."""
    ondemand_source: str = SHIPPED_SOURCE
    """Short id of where the on-demand price came from (``shipped-table``, ``aws-pricing-api``, ...)."""
    spot_source: str = SHIPPED_SOURCE
    """Short id of where the spot price came from."""
    spot_price_date: str = ""
    """The day the spot price was read; empty = ``price_date``."""
    spot_zones: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    """Spot price per zone where the source gives one (``(zone, usd_per_hour)``, by zone); the
    region's ``spot_usd_hr`` is then the cheapest of them."""

    @property
    def spot_price_suspect(self) -> bool:
        """The spot price is suspicious: the catalog row flags it (:data:`SUSPECT_PRICE_MARK`), or it
        is under :data:`MIN_SPOT_SHARE` of the on-demand price."""
        if SUSPECT_PRICE_MARK in self.source:
            return True
        return self.spot_usd_hr is not None and self.spot_usd_hr < MIN_SPOT_SHARE * self.ondemand_usd_hr

    def price(self, capacity: CapacityType) -> float | None:
        """Hourly price for a capacity type, or None when that capacity does not exist (held
        capacity: the catalog prices none; its declaration does)."""
        if capacity is CapacityType.ON_DEMAND:
            return self.ondemand_usd_hr
        if capacity is CapacityType.SPOT:
            return self.spot_usd_hr
        return None

    def price_source(self, capacity: CapacityType) -> str:
        """Where the price of a capacity type came from (a short id; '' for held capacity)."""
        if capacity is CapacityType.ON_DEMAND:
            return self.ondemand_source
        return self.spot_source if capacity is CapacityType.SPOT else ""

    def price_date_of(self, capacity: CapacityType) -> str:
        """The day the price of a capacity type was read (ISO date, or the shipped table's label;
        '' for held capacity)."""
        if capacity is CapacityType.ON_DEMAND:
            return self.price_date
        return (self.spot_price_date or self.price_date) if capacity is CapacityType.SPOT else ""


@dataclass(frozen=True, slots=True)
class Workload:
    """A training workload: what the performance model needs to know about the model.

    FLOPs are per sample (forward + backward, i.e. about 3x forward), in the workload's unit.
    """

    id: str
    family: str
    """cnn, detection, transformer-encoder, transformer-decoder, rnn, recsys."""
    unit: str
    """What one sample is (what throughput counts): images, sequences, tokens."""
    params: float
    """Trainable parameters."""
    flops_per_sample: float
    """Training FLOPs per sample (fwd + bwd)."""
    activation_bytes_per_sample: float
    """Activation memory per sample under mixed precision, without activation checkpointing: the bytes
    autograd keeps for the backward pass (measured by ``scripts/activation_bytes.py`` for the CNN and
    detection rows, derived from the shape for transformers)."""
    seq_len: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    aliases: tuple[str, ...] = ()
    optimizer: str = "adam"
    """adam or sgd (momentum): decides optimizer-state memory."""
    default_global_batch: int | None = None
    samples_per_epoch: int | None = None
    source: str = ""
    shape: TransformerShape | None = field(default=None, compare=False, repr=False)
    """The transformer shape it was derived from, when it was (enables activation checkpointing maths)."""
    batch_unit: str = ""
    """What one batch item is (what a user's batch counts): images, sequences, sentence pairs;
    empty = the same as ``unit``."""
    depthwise_flop_share: float = 0.0
    """Share of the training FLOPs in depthwise convolutions (an architecture fact: EfficientNet,
    MobileNet); they run on CUDA cores, not tensor cores. 0 for architectures without them."""
    variable_inputs: bool = False
    """Per-step work varies with the input (image sizes and instance counts in detection, sentence
    lengths in translation): a synchronous data-parallel step waits for the slowest GPU."""
    kernels_per_step: int | None = None
    """Kernels one training micro-batch (forward and backward) launches, counted in real PyTorch by
    ``scripts/kernel_counts.py``; None = not counted (the model estimates it)."""
    kernels_per_item: float = 0.0
    """More kernels per batch item (per-image loops, as in torchvision's detection models)."""
    traffic_bytes_per_sample: float | None = None
    """The base of the performance model's DRAM traffic of memory-bound layers (x a fitted traffic per
    byte), where it is not the activation memory; None = ``activation_bytes_per_sample``."""

    @property
    def traffic_bytes(self) -> float:
        """Per sample, what the memory-bound traffic is counted in: ``traffic_bytes_per_sample``, else the
        activation memory."""
        if self.traffic_bytes_per_sample is not None:
            return self.traffic_bytes_per_sample
        return self.activation_bytes_per_sample

    @property
    def item(self) -> str:
        """The batch item's name (``batch_unit``, else ``unit``)."""
        return self.batch_unit or self.unit

    @property
    def samples_per_item(self) -> int:
        """Samples (throughput units) in one batch item: ``seq_len`` tokens for token-unit
        workloads (a sequence or sentence pair), else 1."""
        return self.seq_len if self.unit == "tokens" and self.seq_len else 1


def transformer_workload(
    shape: TransformerShape, optimizer: str = "adam", variable_inputs: bool = False, source: str = ""
) -> Workload:
    """The workload profile of a dense transformer given by its shape (a custom job, or a row of
    ``memory_runs.csv``): parameters, FLOPs and activations derived by :class:`TransformerShape`."""
    return Workload(
        id=f"custom-transformer-{shape.layers}x{shape.hidden}",
        family="transformer",
        unit="sequences",
        params=shape.params,
        flops_per_sample=shape.train_flops_per_sequence(),
        activation_bytes_per_sample=shape.activation_bytes_per_sequence(),
        seq_len=shape.seq_len,
        layers=shape.layers,
        hidden=shape.hidden,
        heads=shape.heads,
        vocab=shape.vocab,
        optimizer=optimizer,
        source=source or "custom transformer shape",
        shape=shape,
        variable_inputs=variable_inputs,
    )
