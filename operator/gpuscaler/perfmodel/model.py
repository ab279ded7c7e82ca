"""The performance model: memory per GPU, step time and throughput of one way of running a workload.

Pure functions of (workload, GPU, parallel configuration, parameters); no I/O beyond the cached
parameter files. Called by the planner for every candidate, by ``gpuscaler estimate`` and by the
calibration script.

Batches count items (images, sequences, sentence pairs: ``Workload.item``); throughput counts the
workload's unit (``Workload.unit``), which for token-unit workloads is ``samples_per_item`` tokens
per item. Step time of data-parallel training with ``n = gpus_per_node x nodes`` GPUs, micro-batch
``b`` items and ``K`` accumulation steps::

    t_micro = s_w * N_w(b) * t_k + b * h            host: kernel launches, Python, data hand-off
            + b * F (1-d) ((1-u) L / (R * e_w) + u / S)  matmul/conv work on tensor cores, rest on CUDA cores
            + b * F d / (S_fp32 * e_dw)             depthwise convolutions, CUDA cores at any precision
            + b * A * (m * c_p + n_l * e) / W       memory-bound work (norms, softmax, elementwise; NCHW transposes)
    t_step  = K * t_micro + t_update + t_opt + max(t_tail, t_comm - overlap * t_backward) + t_sync
            + z_n * cv * sqrt(K) * t_micro          waiting for the slowest GPU (variable inputs only)

- ``F`` training FLOPs per item (x 4/3 under activation checkpointing), of which the family's fitted
  share ``u`` never reaches tensor cores (runs at the non-tensor FP32 rate x SIMT efficiency at any
  precision: ROI and box operations, reductions; ``S`` = FP32 peak x SIMT efficiency x derate).
  ``R`` the achievable rate at the precision: dense tensor-core peak (TF32 for fp32 on Ampere and
  newer, fp16/bf16 for amp)
  x the family's fitted tensor efficiency x the GPU's measured matmul efficiency (MAMF) relative to
  the A100 reference x a power-limited clock derate for cards with no MAMF measurement, or the
  non-tensor FP32 peak x the family's SIMT efficiency on GPUs without TF32. ``e_w`` is wave
  quantization over the GPU's SMs for workloads with a known hidden size (waves / (waves + tail)).
- ``d`` the share of ``F`` in depthwise convolutions (``Workload.depthwise_flop_share``, an
  architecture fact: 8.95% for EfficientNet-B0, 7.0% for B4, 1.05% for EfficientNetV2-S, from the
  papers' layer tables by ``scripts/depthwise_share.py``): cuDNN runs them on CUDA cores, one
  filter per channel leaving no reduction dimension for a tensor-core tile, at the fitted fraction
  ``e_dw`` of the FP32 peak (``S_fp32`` = FP32 peak x derate) at any precision. So they scale with
  the CUDA-core rate between GPUs (V100 -> A100 1.24x, not the tensor ratio) and gain nothing from AMP.
- ``A`` the traffic base per item at 16 bits (``Workload.traffic_bytes``: the stored activation
  bytes, or for the CNN and detection rows the activation estimate the fit was made on, which their
  measured activation memory has replaced for the memory model; the catalog's header says why),
  ``m`` the family's DRAM traffic per byte of it, ``W`` achievable memory bandwidth; ``c_p`` is 2 at
  full precision and ``1 + phi`` under mixed precision, ``phi`` the fitted share of that traffic
  autocast keeps in fp32 (softmax, layer norm, losses, reductions).
- ``N_w(b)`` is the kernels one micro-batch of the workload launches, a fact counted op by op in
  real PyTorch (``Workload.kernels_per_step`` + ``b x kernels_per_item``, by
  ``scripts/kernel_counts.py``: 408 for ResNet-50, 1,489 for BERT-large, 1,101 + 189.5 per image for
  Mask R-CNN), or estimated from the layers where not counted (``kernels_of``). The time per kernel
  ``t_k`` (x a fitted per-framework factor, PyTorch 1) and the time per item ``h`` are fitted per
  family and do not scale with the GPU; ``s_w`` is a named workload's fitted factor on it,
  regularised towards 1, for what the count does not see (fusion or host synchronisation in the
  framework it was measured in; custom workloads use 1).
  So a faster GPU spends a larger share of its step there and gains less from mixed precision: the AMP speedup is
  ``(host + simt + tensor_fp32 + memory_fp32) / (host + simt + tensor_fp32 / peak_ratio + memory_fp32
  * (1+phi)/2)``, at most the tensor peak ratio, shrinking as the GPU gets faster.
- ``n_l`` is the DRAM traffic of memory-format transposes: cuDNN's tensor-core convolutions work
  in channels-last (NHWC), so on tensors in PyTorch's default NCHW layout it transposes each
  convolution's inputs and outputs in and out, a memory-bound pass whose bytes follow the element
  size (``e`` = 2 at TF32, 1 at 16 bits, in 16-bit units) and which does not get faster with the
  tensor cores. ``n_l`` (fitted: bytes per stored activation byte) applies to the convolutional
  families on tensor cores unless the job runs channels-last (``ParallelConfig.channels_last``);
  CUDA-core (SIMT) FP32 convolutions run NCHW natively and pay nothing. The calibration rows declare
  what NVIDIA's DeepLearningExamples ran (every CNN TF32/FP32 row NCHW, the CNN AMP rows NHWC), so
  the A100 TF32 rows teach ``n_l`` and an NCHW user at any tensor-core precision pays it.
- ``t_comm`` is a ring all-reduce of the fp32 gradients (4 bytes per parameter, also under
  autocast): ``2 (g-1)/g x G`` at the node's NCCL bus bandwidth (measured where published, else the
  link's spec x its efficiency, PCIe-only nodes capped by the host), plus ``2 (M-1)/M x G`` over the
  network between ``M`` nodes. DDP buckets it behind the last micro-batch's backward pass up to the
  fitted overlap; the last bucket (``t_tail``) is always exposed. Once per step, i.e. once per ``K``
  accumulation micro-batches. ``t_sync`` grows with ``log2 n``.
- Stragglers: where the work per step varies with the input (``Workload.variable_inputs``:
  detection and segmentation with variable image sizes and instance counts, translation with
  variable sentence lengths), each GPU's micro-batch time varies with the family's fitted
  coefficient of variation ``cv``; a synchronous step waits for the slowest of the ``n`` GPUs (all
  ranks, across nodes too), whose expected excess over the mean is ``z_n`` standard deviations,
  ``z_n`` = E[max of n standard normals] (0, 0.56, 1.03, 1.42, 1.77 for 1, 2, 4, 8, 16 GPUs); the K
  accumulated micro-batches of a step average as independent draws (``sqrt(K)`` on ``K t_micro``).

Throughput is ``n x b x K x samples_per_item / t_step``, capped by the input pipeline when vCPUs are
known (PyTorch DataLoader rate per vCPU, x the DALI factor with ``data_loader="dali"``).

The parameter-free part of this (rates, bytes, link times) is :func:`step_terms`; the fitted part
is :func:`combine`. Calibration computes the terms of each measured row once and refits only the
combination. Memory per GPU and the rule that decides whether it fits are in
:mod:`gpuscaler.perfmodel.memory`. The micro-batch-independent parts (memory of weights, gradients and optimizer state;
achievable rates per GPU, precision and family; all-reduce time per link) are memoised, since the
planner evaluates thousands of micro-batches and node counts of the same few workloads and GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gpuscaler.catalog.models import GPU, Precision, Workload
from gpuscaler.errors import InvalidInputError
from gpuscaler.perfmodel.config import ParallelConfig
from gpuscaler.perfmodel.memory import MemoryBreakdown, memory_per_gpu
from gpuscaler.perfmodel.parameters import FittedParams, constants, fitted

GIB = 1024.0**3
GB = 1e9
SIXTEEN_BIT = ("fp16", "bf16", "fp8")
DATA_LOADERS = ("pytorch", "dali")
CACHE_SIZE = 8192
"""Entries of each memo of the parameter-free, micro-batch-independent parts (per workload, GPU and
precision or link): the planner evaluates thousands of micro-batches and node counts of the same
few, so the memos hold a whole plan's working set."""


class PrecisionUnsupportedError(InvalidInputError, ValueError):
    """The GPU cannot run the requested precision (e.g. bf16 on a V100, fp8 before Hopper/Ada)."""


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
    """Per-step fixed overheads (host time, launches, optimizer update, synchronisation, waiting for
    the slowest GPU)."""
    comm_s: float
    """All-reduce time per step (before overlap)."""
    comm_exposed_s: float
    """All-reduce time not hidden behind backward."""
    input_bound: bool
    precision_used: str
    """What runs on the hardware: fp32-simt, tf32, fp16, bf16, fp8."""
    bottleneck: str
    """compute, memory-bandwidth, communication, input-pipeline or overhead."""
    batch_unit: str = ""
    """What one batch item is (images, sequences, sentence pairs)."""
    host_s: float = 0.0
    """Per-step host time that does not scale with the GPU (part of ``overhead_s``)."""
    kernels_per_micro_batch: float = 0.0
    """Kernels one micro-batch launches (``kernels_of``): what the fixed part of ``host_s`` counts."""

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


def _link_efficiency(link: str) -> float:
    eff: dict[str, float] = constants()["communication"]["link_efficiency"]
    for prefix, value in eff.items():
        if link.startswith(prefix):
            return value
    return eff["pcie"]


def intra_node_busbw(gpu: GPU, cfg: ParallelConfig) -> float:
    """NCCL all-reduce bus bandwidth between the GPUs of one node, bytes/s.

    The measured 8-GPU figure where the catalog has one (and the link is not overridden); else the
    link's unidirectional spec x its efficiency, and on PCIe-only nodes at most what the host
    delivers for that many GPUs.
    """
    c = constants()["communication"]
    if gpu.nccl_busbw_gbs and cfg.intra_link_gbs is None and cfg.intra_link is None:
        return gpu.nccl_busbw_gbs * GB
    link = cfg.intra_link or gpu.intra_link
    bw = (cfg.intra_link_gbs or gpu.intra_link_gbs) * _link_efficiency(link)
    if link.startswith("pcie"):
        caps: dict[int, float] = c["pcie_host_busbw_gbs"]
        g = cfg.gpus_per_node
        cap = next((caps[k] for k in sorted(caps) if g <= k), caps[max(caps)])
        bw = min(bw, cap)
    return bw * GB


def _allreduce(workload: Workload, gpu: GPU, cfg: ParallelConfig) -> tuple[float, float]:
    """All-reduce seconds per step and the part of it (the last DDP bucket) that cannot overlap."""
    if cfg.gpus <= 1:
        return 0.0, 0.0
    return _allreduce_cached(
        workload.params,
        gpu,
        cfg.gpus_per_node,
        cfg.nodes,
        cfg.zero_stage >= 3,
        cfg.intra_link_gbs,
        cfg.intra_link,
        cfg.network_gbps,
    )


@lru_cache(maxsize=CACHE_SIZE)
def _allreduce_cached(
    params: float,
    gpu: GPU,
    g: int,
    m: int,
    zero3: bool,
    intra_link_gbs: float | None,
    intra_link: str | None,
    network_gbps: float | None,
) -> tuple[float, float]:
    """:func:`_allreduce` of the fields it depends on: ``g`` GPUs per node, ``m`` nodes."""
    c = constants()["communication"]
    grad_bytes = params * c["allreduce_grad_bytes"]
    volume = 3.0 if zero3 else 2.0  # ZeRO-3 adds a weight all-gather
    t = 0.0
    if g > 1:
        link = ParallelConfig(1, gpus_per_node=g, intra_link_gbs=intra_link_gbs, intra_link=intra_link)
        bw = intra_node_busbw(gpu, link)
        t += volume * (g - 1) / g * grad_bytes / bw + 2 * (g - 1) * c["hop_latency_s"]["intra"]
    if m > 1:
        if not network_gbps:
            raise ValueError(
                "a multi-node configuration needs the instance's network bandwidth (network_gbps)"
            )
        bw = network_gbps / 8.0 * GB * c["network_efficiency"]
        t += volume * (m - 1) / m * grad_bytes / bw + 2 * (m - 1) * c["hop_latency_s"]["inter"]
    tail = t * min(1.0, c["ddp_bucket_bytes"] / grad_bytes)
    return t, tail


def allreduce_seconds(workload: Workload, gpu: GPU, cfg: ParallelConfig) -> float:
    """Ring all-reduce of one step's fp32 gradients: intra-node ring plus inter-node ring.

    Raises:
        ValueError: several nodes but no network bandwidth given.
    """
    return _allreduce(workload, gpu, cfg)[0]


def clock_derate(gpu: GPU) -> float:
    """Fraction of the boost clock a power-limited card sustains under dense tensor work.

    1 for GPUs with a measured matmul efficiency (the measurement already includes it), unknown TDP
    or architecture; else ``(TDP / needed) ** exponent`` capped at 1 (constants.yaml explains).
    """
    c = constants()["compute"]
    ref = c["power_reference_w_per_tflop"].get(gpu.arch)
    if gpu.matmul_efficiency is not None or not gpu.tdp_w or ref is None:
        return 1.0
    needed = gpu.fp16_tflops * ref
    return float(min(1.0, (gpu.tdp_w / needed) ** c["power_derate_exponent"]))


def wave_efficiency(workload: Workload, gpu: GPU, micro_batch: int) -> float:
    """Share of the SMs' tile slots a micro-batch's GEMMs fill (1 where the shape is unknown)."""
    if workload.family != "transformer" or not workload.hidden or not workload.seq_len or not gpu.sm_count:
        return 1.0
    c = constants()["compute"]
    tiles = micro_batch * workload.seq_len * workload.hidden / c["gemm_tile_elements"]
    waves = tiles / gpu.sm_count
    return float(waves / (waves + c["wave_tail"]))


@lru_cache(maxsize=CACHE_SIZE)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for one, 0.564 for two, 1.029 for four, 1.424 for
    eight): the trapezoid rule on ``x d/dx Phi(x)^n`` over [-12, 12] in 480 steps, which for this
    smooth, fast-decaying integrand is exact to ~1e-13 (against 1/sqrt(pi) for two, and 4,800 steps
    up to 4,096 GPUs); ~0.2 ms once per GPU count."""
    if n <= 1:
        return 0.0
    steps = 480
    h = 24.0 / steps
    total = 0.0
    for i in range(steps + 1):
        x = -12.0 + i * h
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        w = 0.5 if i in (0, steps) else 1.0
        total += w * x * n * pdf * cdf ** (n - 1)
    return total * h


@dataclass(frozen=True, slots=True)
class StepTerms:
    """The parameter-free quantities of one configuration; :func:`combine` adds the fitted ones."""

    workload_id: str
    family: str
    framework: str
    items: int
    """Micro-batch b, in batch items."""
    accumulation: int
    gpus: int
    samples_per_item: int
    flops_per_item: float
    depthwise_flops_per_item: float
    """The part of ``flops_per_item`` in depthwise convolutions (CUDA cores at any precision)."""
    rate: float
    """Achievable FLOPS before the family's efficiency: peak x MAMF x derate x wave efficiency."""
    simt_rate: float
    """Non-tensor FP32 FLOPS (x derate), where the family's non-convertible FLOPs run."""
    tensor: bool
    """Runs on tensor cores (tensor efficiency) or SIMT FP32 (SIMT efficiency)."""
    sixteen_bit: bool
    nchw_bytes: float
    """Element size, in 16-bit units, of the NCHW<->NHWC transposes around tensor-core convolutions (2 at
    TF32, 1 at 16 bits; 0 when the convolutions run channels-last or on CUDA cores, or the family has none)."""
    traffic_bytes_per_item: float
    """What the memory-bound DRAM traffic per item is counted in, at 16 bits (``Workload.traffic_bytes``)."""
    bandwidth: float
    """Achievable DRAM bytes/s."""
    optimizer_s: float
    comm_s: float
    comm_tail_s: float
    kernels: float
    """Kernels one micro-batch launches (``kernels_of``)."""
    straggler_z: float
    """E[max of n standard normals] over the run's n GPUs for workloads with variable inputs, else 0."""
    input_cap: float | None
    """Samples/s the input pipeline can deliver; None = not bound."""
    precision_used: str
    unit: str
    batch_unit: str


def kernels_of(workload: Workload, micro_batch: int) -> float:
    """Kernels one training micro-batch of ``micro_batch`` items launches: the counted figure
    (``Workload.kernels_per_step`` + per item), else ``compute.kernels_per_layer`` x the layers, else
    ``compute.default_kernels_per_step``."""
    cc = constants()["compute"]
    if workload.kernels_per_step is not None:
        base = float(workload.kernels_per_step)
    elif workload.layers:
        base = float(cc["kernels_per_layer"] * workload.layers)
    else:
        base = float(cc["default_kernels_per_step"])
    return base + micro_batch * workload.kernels_per_item


@lru_cache(maxsize=CACHE_SIZE)
def _rates(gpu: GPU, precision: Precision, family: str) -> tuple[str, float, float]:
    """What ``precision`` runs as on ``gpu`` for ``family``, its achievable FLOPS before wave
    quantization (peak x derate x MAMF relative to the reference) and the non-tensor FP32 FLOPS.

    Raises:
        PrecisionUnsupportedError: the GPU lacks the precision.
    """
    cc = constants()["compute"]
    hw, peak = hardware_precision(gpu, precision)
    if hw == "fp8" and family not in cc["fp8_families"]:
        hw, peak = ("bf16" if gpu.has_bf16 else "fp16"), gpu.fp16_tflops
    derate = clock_derate(gpu)
    rate = peak * 1e12 * derate
    if hw != "fp32-simt":
        ref = cc["reference_matmul_efficiency"]
        rate *= (gpu.matmul_efficiency or ref) / ref
        if hw == "fp8":
            rate *= cc["fp8_relative_efficiency"]
    return hw, rate, gpu.fp32_tflops * 1e12 * derate


def step_terms(workload: Workload, gpu: GPU, cfg: ParallelConfig) -> StepTerms:
    """The parameter-free terms of running ``workload`` on ``gpu`` as ``cfg`` says.

    Raises:
        PrecisionUnsupportedError: the GPU lacks the precision.
        ValueError: a non-positive batch, accumulation or GPU count; an unknown data loader; several
            nodes with no network.
    """
    if cfg.micro_batch < 1 or cfg.accumulation < 1 or cfg.gpus_per_node < 1 or cfg.nodes < 1:
        raise ValueError(f"micro_batch, accumulation, gpus_per_node and nodes must be >= 1, got {cfg}")
    if cfg.data_loader not in DATA_LOADERS:
        raise ValueError(f"data_loader {cfg.data_loader!r}: use one of {', '.join(DATA_LOADERS)}")
    cc = constants()["compute"]
    hw, rate, simt_rate = _rates(gpu, cfg.precision, workload.family)
    tensor = hw != "fp32-simt"
    rate *= wave_efficiency(workload, gpu, cfg.micro_batch)
    sixteen = hw in SIXTEEN_BIT
    nchw = tensor and not cfg.channels_last and workload.family in cc["channels_last_families"]
    per_item = workload.samples_per_item
    flops = workload.flops_per_sample * per_item
    if cfg.activation_checkpointing:
        flops *= 1.0 + cc["recompute_overhead"]
    bw = gpu.mem_bw_gbs * GB * cc["memory_bandwidth_efficiency"]
    shard = cfg.gpus if cfg.zero_stage >= 1 else 1
    opt_bytes = cc["optimizer_step_bytes"].get(workload.optimizer, 28)
    comm, tail = _allreduce(workload, gpu, cfg)
    cap = None
    inp = constants()["input"]
    per_vcpu = inp["samples_per_vcpu_s"].get(workload.family)
    if cfg.vcpus_per_node and per_vcpu:
        loader = inp["dali_speedup"] if cfg.data_loader == "dali" else 1.0
        cap = per_vcpu * loader * cfg.vcpus_per_node * cfg.nodes * per_item
    return StepTerms(
        workload_id=workload.id,
        family=workload.family,
        framework=cfg.framework.lower(),
        items=cfg.micro_batch,
        accumulation=cfg.accumulation,
        gpus=cfg.gpus,
        samples_per_item=per_item,
        flops_per_item=flops,
        depthwise_flops_per_item=flops * workload.depthwise_flop_share,
        rate=rate,
        simt_rate=simt_rate,
        tensor=tensor,
        sixteen_bit=sixteen,
        nchw_bytes=(1.0 if sixteen else 2.0) if nchw else 0.0,
        traffic_bytes_per_item=workload.traffic_bytes * per_item,
        bandwidth=bw,
        optimizer_s=workload.params / shard * opt_bytes / bw,
        comm_s=comm,
        comm_tail_s=tail,
        kernels=kernels_of(workload, cfg.micro_batch),
        straggler_z=expected_max_normal(cfg.gpus) if workload.variable_inputs else 0.0,
        input_cap=cap,
        precision_used=hw,
        unit=workload.unit,
        batch_unit=workload.item,
    )


@dataclass(frozen=True, slots=True)
class StepTime:
    """The fitted combination of one configuration's terms: times per step and throughput."""

    step_s: float
    throughput: float
    single_step_s: float
    """The step without communication and synchronisation (for scaling efficiency)."""
    compute_s: float
    memory_s: float
    host_s: float
    overhead_s: float
    exposed_s: float
    input_bound: bool


def combine(t: StepTerms, p: FittedParams) -> StepTime:
    """Step time and throughput from the parameter-free terms and the fitted parameters."""
    fam = p.family(t.family)
    scale = p.workload_scale.get(t.workload_id, 1.0) * p.framework_scale.get(t.framework, 1.0)
    b, k = t.items, t.accumulation
    if t.tensor:
        u = fam.simt_fraction
        per_flop = (1.0 - u) / (t.rate * fam.tensor_efficiency) + u / (t.simt_rate * fam.simt_efficiency)
    else:
        per_flop = 1.0 / (t.rate * fam.simt_efficiency)
    dw = t.depthwise_flops_per_item
    compute_micro = b * ((t.flops_per_item - dw) * per_flop + dw / (t.simt_rate * p.depthwise_efficiency)) / scale
    bytes_factor = (1.0 + fam.fp32_memory_fraction) if t.sixteen_bit else 2.0
    traffic = fam.memory_traffic * bytes_factor + p.nchw_traffic * t.nchw_bytes
    memory_micro = b * t.traffic_bytes_per_item * traffic / t.bandwidth / scale
    per_kernel = fam.launch_s_per_kernel * p.framework_launch_scale.get(t.framework, 1.0)
    host_micro = per_kernel * t.kernels * p.workload_launch_scale.get(t.workload_id, 1.0) + b * fam.host_s_per_item
    micro = host_micro + compute_micro + memory_micro
    if t.comm_s > 0:
        backward = (2.0 / 3.0) * (compute_micro + memory_micro)
        exposed = max(t.comm_tail_s, t.comm_s - p.overlap * backward)
    else:
        exposed = 0.0
    sync = p.sync_overhead_s * math.log2(t.gpus) if t.gpus > 1 else 0.0
    single = k * micro + fam.update_overhead_s + t.optimizer_s
    straggle = t.straggler_z * fam.straggler_cv * math.sqrt(k) * micro
    step = single + exposed + sync + straggle
    samples = b * k * t.gpus * t.samples_per_item
    throughput = samples / step
    bound = False
    if t.input_cap is not None and t.input_cap < throughput:
        throughput, bound = t.input_cap, True
        step = samples / throughput
    return StepTime(
        step_s=step,
        throughput=throughput,
        single_step_s=single,
        compute_s=k * compute_micro,
        memory_s=k * memory_micro,
        host_s=k * host_micro,
        overhead_s=k * host_micro + fam.update_overhead_s + t.optimizer_s + sync + straggle,
        exposed_s=exposed,
        input_bound=bound,
    )


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
        cfg: GPUs, precision, micro-batch (in batch items), accumulation, sharding, links, memory
            format and input pipeline.
        params: fitted parameters; the committed calibration when None.

    Returns:
        The estimate; ``fits`` is False when the configuration does not fit in GPU memory (the
        timing is still computed so callers can report it).

    Raises:
        PrecisionUnsupportedError: the GPU lacks the precision.
        ValueError: a non-positive micro-batch or accumulation, an unknown data loader, or several
            nodes with no network.
    """
    terms = step_terms(workload, gpu, cfg)
    s = combine(terms, params or fitted())
    parts = {
        "compute": s.compute_s,
        "memory-bandwidth": s.memory_s,
        "communication": s.exposed_s,
        "overhead": s.overhead_s,
    }
    bottleneck = "input-pipeline" if s.input_bound else max(parts, key=lambda name: parts[name])
    return Estimate(
        throughput=s.throughput,
        unit=workload.unit,
        step_time_s=s.step_s,
        memory=memory_per_gpu(workload, gpu, cfg),
        scaling_efficiency=min(1.0, s.single_step_s / s.step_s),
        compute_s=s.compute_s,
        memory_bound_s=s.memory_s,
        overhead_s=s.overhead_s,
        comm_s=terms.comm_s,
        comm_exposed_s=s.exposed_s,
        input_bound=s.input_bound,
        precision_used=terms.precision_used,
        bottleneck=bottleneck,
        batch_unit=workload.item,
        host_s=s.host_s,
        kernels_per_micro_batch=terms.kernels,
    )
