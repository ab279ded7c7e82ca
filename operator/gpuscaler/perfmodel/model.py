"""The performance model: memory per GPU, step time and throughput of one way of running a workload.

Pure functions of (workload, GPU, parallel configuration, parameters); no I/O beyond the cached
parameter files. Called by the planner for every candidate, by ``gpuscaler estimate`` and by the
calibration script.

Step time of data-parallel training with ``n = gpus_per_node x nodes`` GPUs, micro-batch ``b``
and ``K`` accumulation steps::

    t_micro  = t0 + b * (F / R  +  A * m / W)          one micro-batch on one GPU
    t_step   = K * t_micro + t_update + t_opt + t_comm_exposed + t_sync

where ``F`` is training FLOPs per sample (x 4/3 under activation checkpointing), ``R`` the
achievable FLOPS for the precision (tensor-core peak x family tensor efficiency x the GPU's
measured matmul efficiency relative to the A100 reference, or non-tensor FP32 peak x family SIMT
efficiency), ``A`` stored activation bytes per sample at the precision, ``m`` the family's DRAM
traffic per activation byte and ``W`` achievable memory bandwidth; ``t0`` and ``t_update`` are fitted fixed costs per micro-batch and per
optimizer step, ``t_opt`` the optimizer's DRAM traffic. Mixed precision speeds up both
terms by different amounts (higher tensor peak, half the activation bytes), so its speedup comes
out of the hardware, not a constant.

``t_comm`` is a ring all-reduce of the gradients (``2(g-1)/g x G`` over the intra-node link plus
``2(M-1)/M x G`` over the network between ``M`` nodes), once per step, hidden behind the last
micro-batch's backward pass up to the fitted overlap; ``t_sync`` grows with ``log2 n``.
Throughput is ``n x b x K / t_step`` samples/s, capped by the input pipeline when vCPUs are known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuscaler.catalog.models import GPU, Precision, Workload
from gpuscaler.perfmodel.parameters import FittedParams, constants, fitted

GIB = 1024.0**3
GB = 1e9


class PrecisionUnsupportedError(ValueError):
    """The GPU cannot run the requested precision (e.g. bf16 on a V100, fp8 before Hopper/Ada)."""


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """How a workload is run: GPUs, precision, micro-batch and accumulation, memory savers."""

    micro_batch: int
    precision: Precision = Precision.AMP
    gpus_per_node: int = 1
    nodes: int = 1
    accumulation: int = 1
    zero_stage: int = 0
    """ZeRO/FSDP sharding: 0 none, 1 optimizer state, 2 + gradients, 3 + weights."""
    activation_checkpointing: bool = False
    intra_link_gbs: float | None = None
    """Override of the GPU's intra-node link (e.g. an instance without NVLink)."""
    intra_link: str | None = None
    network_gbps: float | None = None
    """Inter-node network bandwidth of the instance; required when nodes > 1."""
    vcpus_per_node: int | None = None
    """Enables the input-pipeline bound."""
    framework: str = "pytorch"

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.gpus


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU by role."""

    weights: float
    gradients: float
    optimizer: float
    """Optimizer state plus fp32 master weights under mixed precision."""
    activations: float
    overhead: float
    capacity: float
    """Usable bytes on the GPU (memory x usable fraction)."""

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass(frozen=True, slots=True)
class Estimate:
    """The model's prediction for one (workload, GPU, configuration)."""

    throughput: float
    """Aggregate samples/s over all GPUs, in the workload's unit."""
    unit: str
    step_time_s: float
    memory: MemoryBreakdown
    scaling_efficiency: float
    """Throughput / (GPUs x single-GPU throughput at the same micro-batch)."""
    compute_s: float
    """Per-step time in matmul/conv compute."""
    memory_bound_s: float
    """Per-step time in DRAM-bound layers."""
    overhead_s: float
    """Per-step fixed overheads (launches, optimizer update, synchronisation)."""
    comm_s: float
    """All-reduce time per step (before overlap)."""
    comm_exposed_s: float
    """All-reduce time not hidden behind backward."""
    input_bound: bool
    precision_used: str
    """What runs on the hardware: fp32-simt, tf32, fp16, bf16, fp8."""
    bottleneck: str
    """compute, memory-bandwidth, communication, input-pipeline or overhead."""

    @property
    def memory_per_gpu_gb(self) -> float:
        return self.memory.total / GB

    @property
    def fits(self) -> bool:
        return self.memory.fits


def hardware_precision(gpu: GPU, precision: Precision) -> tuple[str, float]:
    """What the precision runs as on this GPU and its dense peak TFLOPS.

    Raises:
        PrecisionUnsupportedError: the GPU lacks the precision (the message says which GPUs have it).
    """
    if precision is Precision.FP32:
        if gpu.tf32_tflops is not None:
            return "tf32", gpu.tf32_tflops
        return "fp32-simt", gpu.fp32_tflops
    if precision is Precision.TF32:
        if gpu.tf32_tflops is None:
            raise PrecisionUnsupportedError(
                f"{gpu.id} has no TF32 tensor cores (Ampere or newer has); use fp32 or amp"
            )
        return "tf32", gpu.tf32_tflops
    if precision is Precision.AMP:
        return ("bf16" if gpu.has_bf16 else "fp16"), gpu.fp16_tflops
    if precision is Precision.BF16:
        if not gpu.has_bf16:
            raise PrecisionUnsupportedError(f"{gpu.id} has no bf16 (Ampere or newer has); use amp (fp16)")
        return "bf16", gpu.fp16_tflops
    if gpu.fp8_tflops is None:
        raise PrecisionUnsupportedError(
            f"{gpu.id} has no fp8 (Ada, Hopper, Blackwell and MI300X have); use amp"
        )
    return "fp8", gpu.fp8_tflops


def memory_per_gpu(workload: Workload, gpu: GPU, cfg: ParallelConfig) -> MemoryBreakdown:
    """Bytes per GPU: weights, gradients, optimizer state (+ master weights), activations, overhead."""
    c = constants()["memory"]
    p = cfg.precision.value
    n = cfg.gpus
    params = workload.params
    shard_opt = n if cfg.zero_stage >= 1 else 1
    shard_grad = n if cfg.zero_stage >= 2 else 1
    shard_w = n if cfg.zero_stage >= 3 else 1
    weights = params * c["weight_bytes"][p] / shard_w
    grads = params * c["grad_bytes"][p] / shard_grad
    opt_bytes = c["optimizer_state_bytes"].get(workload.optimizer, 8) + c["master_weight_bytes"][p]
    optimizer = params * opt_bytes / shard_opt
    act_scale = c["activation_scale"][p]
    if cfg.activation_checkpointing:
        if workload.shape is not None:
            per_sample = workload.shape.checkpointed_activation_bytes_per_sequence()
        else:
            per_sample = workload.activation_bytes_per_sample * c["checkpointed_activation_fraction"]
    else:
        per_sample = workload.activation_bytes_per_sample
    activations = cfg.micro_batch * per_sample * act_scale
    overhead = c["framework_overhead_gb"] * GB + c["fragmentation"] * activations
    capacity = gpu.memory_gb * GB * c["usable_fraction"]
    return MemoryBreakdown(weights, grads, optimizer, activations, overhead, capacity)


def _link_efficiency(link: str) -> float:
    eff: dict[str, float] = constants()["communication"]["link_efficiency"]
    for prefix, value in eff.items():
        if link.startswith(prefix):
            return value
    return eff["pcie"]


def allreduce_seconds(workload: Workload, gpu: GPU, cfg: ParallelConfig) -> float:
    """Ring all-reduce of one step's gradients: intra-node ring plus inter-node ring.

    Raises:
        ValueError: several nodes but no network bandwidth given.
    """
    n = cfg.gpus
    if n <= 1:
        return 0.0
    c = constants()["communication"]
    grad_bytes = workload.params * constants()["memory"]["grad_bytes"][cfg.precision.value]
    volume = 3.0 if cfg.zero_stage >= 3 else 2.0  # ZeRO-3 adds a weight all-gather
    t = 0.0
    g = cfg.gpus_per_node
    if g > 1:
        link = cfg.intra_link or gpu.intra_link
        bw = (cfg.intra_link_gbs or gpu.intra_link_gbs) * GB * _link_efficiency(link)
        t += volume * (g - 1) / g * grad_bytes / bw + 2 * (g - 1) * c["hop_latency_s"]["intra"]
    m = cfg.nodes
    if m > 1:
        if not cfg.network_gbps:
            raise ValueError(
                "a multi-node configuration needs the instance's network bandwidth (network_gbps)"
            )
        bw = cfg.network_gbps / 8.0 * GB * c["network_efficiency"]
        t += volume * (m - 1) / m * grad_bytes / bw + 2 * (m - 1) * c["hop_latency_s"]["inter"]
    return t


def _compute_rate(
    workload: Workload, gpu: GPU, cfg: ParallelConfig, params: FittedParams
) -> tuple[str, float]:
    cc = constants()["compute"]
    fam = params.family(workload.family)
    hw, peak = hardware_precision(gpu, cfg.precision)
    if hw == "fp8" and workload.family not in cc["fp8_families"]:
        hw, peak = ("bf16" if gpu.has_bf16 else "fp16"), gpu.fp16_tflops
    if hw == "fp32-simt":
        return hw, peak * 1e12 * fam.simt_efficiency
    gpu_eff = (gpu.matmul_efficiency or cc["reference_matmul_efficiency"]) / cc["reference_matmul_efficiency"]
    rate = peak * 1e12 * fam.tensor_efficiency * gpu_eff
    if hw == "fp8":
        rate *= cc["fp8_relative_efficiency"]
    return hw, rate


def estimate(
    workload: Workload,
    gpu: GPU,
    cfg: ParallelConfig,
    params: FittedParams | None = None,
) -> Estimate:
    """Predict memory, step time and throughput of running ``workload`` on ``gpu`` as ``cfg`` says.

    Args:
        workload: the workload profile (FLOPs, activations, parameters, family).
        gpu: the GPU type.
        cfg: GPUs, precision, micro-batch, accumulation, sharding and links.
        params: fitted parameters; the committed calibration when None.

    Returns:
        The estimate; ``fits`` is False when the configuration does not fit in GPU memory (the
        timing is still computed so callers can report it).

    Raises:
        PrecisionUnsupportedError: the GPU lacks the precision.
        ValueError: a non-positive micro-batch or accumulation, or several nodes with no network.
    """
    if cfg.micro_batch < 1 or cfg.accumulation < 1 or cfg.gpus_per_node < 1 or cfg.nodes < 1:
        raise ValueError(f"micro_batch, accumulation, gpus_per_node and nodes must be >= 1, got {cfg}")
    p = params or fitted()
    cc = constants()["compute"]
    fam = p.family(workload.family)
    hw, rate = _compute_rate(workload, gpu, cfg, p)
    scale = p.workload_scale.get(workload.id, 1.0) * p.framework_scale.get(cfg.framework.lower(), 1.0)

    flops = workload.flops_per_sample * (
        1.0 + cc["recompute_overhead"] if cfg.activation_checkpointing else 1.0
    )
    act_bytes = (
        workload.activation_bytes_per_sample * constants()["memory"]["activation_scale"][cfg.precision.value]
    )
    bw = gpu.mem_bw_gbs * GB * cc["memory_bandwidth_efficiency"]
    b, k = cfg.micro_batch, cfg.accumulation
    compute_micro = b * flops / rate / scale
    memory_micro = b * act_bytes * fam.memory_traffic / bw / scale
    micro = fam.launch_overhead_s + compute_micro + memory_micro

    shard = cfg.gpus if cfg.zero_stage >= 1 else 1
    opt_bytes = constants()["compute"]["optimizer_step_bytes"].get(workload.optimizer, 28)
    t_opt = workload.params / shard * opt_bytes / bw

    comm = allreduce_seconds(workload, gpu, cfg)
    backward = (2.0 / 3.0) * (compute_micro + memory_micro)
    exposed = max(0.0, comm - p.overlap * backward)
    sync = p.sync_overhead_s * math.log2(cfg.gpus) if cfg.gpus > 1 else 0.0
    step = k * micro + fam.update_overhead_s + t_opt + exposed + sync
    single_step = k * micro + fam.update_overhead_s + t_opt

    samples = b * k * cfg.gpus
    throughput = samples / step
    input_bound = False
    rate_per_vcpu = constants()["input"]["samples_per_vcpu_s"].get(workload.family)
    if cfg.vcpus_per_node and rate_per_vcpu:
        cap = rate_per_vcpu * cfg.vcpus_per_node * cfg.nodes
        if cap < throughput:
            throughput, input_bound = cap, True
            step = samples / throughput

    parts = {
        "compute": k * compute_micro,
        "memory-bandwidth": k * memory_micro,
        "communication": exposed,
        "overhead": k * fam.launch_overhead_s + fam.update_overhead_s + t_opt + sync,
    }
    bottleneck = "input-pipeline" if input_bound else max(parts, key=lambda name: parts[name])
    return Estimate(
        throughput=throughput,
        unit=workload.unit,
        step_time_s=step,
        memory=memory_per_gpu(workload, gpu, cfg),
        scaling_efficiency=min(1.0, (samples / step) / (cfg.gpus * b * k / single_step)),
        compute_s=k * compute_micro,
        memory_bound_s=k * memory_micro,
        overhead_s=k * fam.launch_overhead_s + fam.update_overhead_s + t_opt + sync,
        comm_s=comm,
        comm_exposed_s=exposed,
        input_bound=input_bound,
        precision_used=hw,
        bottleneck=bottleneck,
    )
