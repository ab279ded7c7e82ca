"""Pure decisions on observed performance: how far from the model, the corrected factor, named
bottlenecks with advice. Whether moving to another plan pays is
:func:`gpuscaler.planner.correction.decide_replan` (re-exported here), shared with the simulator.

Called by :mod:`gpuscaler.observe.controller` (the operator) and :mod:`gpuscaler.observe.cli`
(``gpuscaler report``). Inputs are plain values (a :class:`JobMetrics` summarised from
Prometheus, the plan's prediction); no I/O, no clock.

The efficiency factor: ``factor = observed / model`` where ``model`` is the performance model's
uncorrected throughput for the running plan (``plan.throughput / plan.efficiencyFactor``). It is
kept per GPU type, because one run tells how this job performs on the GPU it ran on and nothing
certain about others (an input pipeline short of CPU, a framework version, custom kernels all
differ by instance). The planner multiplies each candidate's predicted throughput by the factor of
its GPU type (``plan(..., efficiency={gpu: factor})``); GPU types not measured keep the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuscaler.observe.estimators import RateEstimate
from gpuscaler.planner.correction import MAX_FACTOR, MIN_FACTOR, PlanOption, ReplanDecision, decide_replan

__all__ = [
    "MAX_FACTOR",
    "MIN_FACTOR",
    "Assessment",
    "Expectation",
    "Finding",
    "GpuUse",
    "JobMetrics",
    "PlanOption",
    "PodMetrics",
    "ReplanDecision",
    "Thresholds",
    "assess",
    "bottlenecks",
    "decide_replan",
]
PRECISIONS_WITH_TENSOR_CORES = ("amp", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Thresholds:
    """When a difference counts and when a bottleneck is named. Defaults and where they come from.

    The DCGM profiling ratios (``DCGM_FI_PROF_*``) are fractions of cycles the unit was busy
    (NVIDIA DCGM docs, "Profiling Metrics"); GPU utilisation is percent of time a kernel ran.
    """

    divergence: float = 0.15
    """Observed vs predicted differs by more than this fraction: correct the model
    (``GPUSCALER_OBSERVE_DIVERGENCE``)."""
    input_gpu_util_max: float = 60.0
    """InputBound: GPU busy less than this percent. A fed GPU shows 90 %+ in DL training (NVIDIA's
    data-loading guidance, DALI docs); 60 leaves room for short evaluation or logging pauses."""
    memory_dram_min: float = 0.5
    """MemoryBound: DRAM interface busy more than half the cycles ..."""
    memory_tensor_max: float = 0.2
    """... while the tensor pipes are busy less than a fifth (DCGM profiling guidance)."""
    comm_interconnect_min_gbs: float = 5.0
    """CommunicationBound: PCIe + NVLink traffic per GPU above this many GB/s (PCIe 4 x16 moves
    ~25 GB/s; an all-reduce-bound job keeps the links busy) ..."""
    comm_gpu_util_max: float = 80.0
    """... while the GPU computes less than this percent."""
    amp_tensor_max: float = 0.05
    """AMPInactive: tensor pipes busy less than 5 % of cycles under a mixed-precision plan ..."""
    amp_gpu_util_min: float = 30.0
    """... although the GPU is busy (else it is idle, not running without tensor cores)."""
    memory_full: float = 0.95
    """MemoryNearFull: frame buffer used above this fraction on some GPU."""
    min_seconds: float = 0.0
    """Usable seconds of the samples counter needed before throughput is judged."""
    max_spread: float = 0.25
    """A throughput whose windows differ (median absolute deviation) by more than this fraction is
    too unsteady to correct the model with."""


@dataclass(frozen=True)
class GpuUse:
    """GPU use over the observation window, over the GPUs of a pod or of the whole job (what
    :mod:`gpuscaler.observe.summary` reads from the DCGM series)."""

    gpus: int = 0
    """GPUs with DCGM data."""
    gpu_util: float | None = None
    """Mean over GPUs, percent."""
    tensor_active: float | None = None
    dram_active: float | None = None
    memory_used_gb: float | None = None
    """The fullest GPU, GB."""
    memory_used_fraction: float | None = None
    interconnect_gbs: float | None = None
    """Mean over GPUs of PCIe + NVLink transmit + receive, GB/s."""


@dataclass(frozen=True, kw_only=True)
class PodMetrics(GpuUse):
    """One worker pod over the observation window."""

    pod: str
    throughput: RateEstimate | None


@dataclass(frozen=True, kw_only=True)
class JobMetrics(GpuUse):
    """A job over the observation window: per pod, and summarised."""

    pods: list[PodMetrics]
    throughput: float | None
    """Samples/s of the job: the median of the pods' rates (every worker counts the job's global
    samples, as the progress annotations do)."""
    rate: RateEstimate | None
    """The estimate the throughput came from (the median pod's)."""


@dataclass(frozen=True)
class Expectation:
    """What the running plan predicted."""

    predicted: float
    """The plan's throughput, samples/s (it includes ``plan_factor``)."""
    plan_factor: float = 1.0
    """The efficiency factor the plan's throughput was computed with."""
    current_factor: float = 1.0
    """The factor known now for the plan's GPU type (the plan may predate it)."""
    gpus: int = 1
    precision: str = "fp32"
    vcpus_per_node: int | None = None
    instance_type: str = ""


@dataclass(frozen=True)
class Finding:
    """A named bottleneck: a condition type with its reason and a message with numbers and advice."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Assessment:
    """What one look at the metrics concluded."""

    observed: float | None
    predicted: float
    ratio: float | None
    """observed / predicted (None without enough data)."""
    measured_factor: float | None
    """observed / uncorrected model."""
    factor: float
    """The factor to keep for the plan's GPU type (the measured one when corrected)."""
    corrected: bool
    findings: list[Finding] = field(default_factory=list)
    summary: str = ""

    @property
    def diverged(self) -> bool:
        return self.ratio is not None and self.corrected


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def bottlenecks(m: JobMetrics, e: Expectation, ratio: float | None, t: Thresholds) -> list[Finding]:
    """The named bottlenecks the metrics show (only those detected), each with advice.

    ``ratio`` (observed / predicted) gates the ones that are about being slow: a job that meets
    its prediction is not input- or communication-bound in a way worth acting on.
    """
    out: list[Finding] = []
    slow = ratio is not None and ratio < 1 - t.divergence
    speed = f"throughput {m.throughput:.1f}/s is {_pct(ratio)} of the predicted {e.predicted:.1f}/s" if (
        ratio is not None and m.throughput is not None
    ) else ""
    high_traffic = m.interconnect_gbs is not None and m.interconnect_gbs >= t.comm_interconnect_min_gbs
    if slow and m.gpu_util is not None and m.gpu_util < t.input_gpu_util_max and not (high_traffic and e.gpus > 1):
        cpu = f" ({e.vcpus_per_node} vCPU per node on {e.instance_type})" if e.vcpus_per_node else ""
        out.append(
            Finding(
                "InputBound",
                "LowGPUUtilization",
                f"GPU utilisation {m.gpu_util:.0f}% (< {t.input_gpu_util_max:.0f}%) and {speed}: the GPUs wait "
                f"for data. Raise the data-loader workers (e.g. DataLoader num_workers, pin_memory, prefetch), "
                f"move decoding/augmentation to the GPU (DALI), or request more CPU{cpu} / a larger instance.",
            )
        )
    if (
        m.dram_active is not None
        and m.tensor_active is not None
        and m.dram_active > t.memory_dram_min
        and m.tensor_active < t.memory_tensor_max
    ):
        out.append(
            Finding(
                "MemoryBound",
                "HighDRAMActivity",
                f"DRAM active {_pct(m.dram_active)} (> {_pct(t.memory_dram_min)}) while tensor pipes are active "
                f"{_pct(m.tensor_active)} (< {_pct(t.memory_tensor_max)}): kernels wait on memory bandwidth. "
                "Use mixed precision (halves the bytes), fused kernels (torch.compile, fused optimizers, "
                "FlashAttention), larger micro-batches, or a GPU with more memory bandwidth.",
            )
        )
    if (
        e.gpus > 1
        and slow
        and high_traffic
        and m.gpu_util is not None
        and m.gpu_util < t.comm_gpu_util_max
        and m.interconnect_gbs is not None
    ):
        out.append(
            Finding(
                "CommunicationBound",
                "HighInterconnectTraffic",
                f"{e.gpus} GPUs move {m.interconnect_gbs:.1f} GB/s each over PCIe/NVLink (>= "
                f"{t.comm_interconnect_min_gbs:g}) while computing {m.gpu_util:.0f}% of the time "
                f"(< {t.comm_gpu_util_max:.0f}%) and {speed}: scaling is far below the model's. Use fewer, larger "
                "GPUs or NVLink/EFA instances, raise gradient accumulation (fewer all-reduces), enable "
                "gradient bucketing/overlap (DDP bucket_cap_mb) or ZeRO/FSDP with communication overlap.",
            )
        )
    if (
        e.precision in PRECISIONS_WITH_TENSOR_CORES
        and m.tensor_active is not None
        and m.gpu_util is not None
        and m.tensor_active < t.amp_tensor_max
        and m.gpu_util >= t.amp_gpu_util_min
    ):
        out.append(
            Finding(
                "AMPInactive",
                "TensorPipeIdle",
                f"the plan trains in {e.precision} but the tensor pipes are active {_pct(m.tensor_active)} of "
                f"cycles (< {_pct(t.amp_tensor_max)}) with the GPU {m.gpu_util:.0f}% busy: mixed precision is "
                "not in effect. Wrap the forward pass in torch.autocast (with a GradScaler for fp16), or read "
                "GPUSCALER_PRECISION in the training script; the plan's cost assumed tensor cores.",
            )
        )
    if m.memory_used_fraction is not None and m.memory_used_fraction > t.memory_full:
        used = f"{m.memory_used_gb:.1f} GB, " if m.memory_used_gb is not None else ""
        out.append(
            Finding(
                "MemoryNearFull",
                "FrameBufferNearFull",
                f"GPU memory {used}{_pct(m.memory_used_fraction)} used on the fullest GPU (> {_pct(t.memory_full)}): "
                "close to out-of-memory. Lower the micro-batch (raise accumulation), enable activation "
                "checkpointing, or shard optimizer state (ZeRO/FSDP).",
            )
        )
    return out


def assess(m: JobMetrics, e: Expectation, t: Thresholds) -> Assessment:
    """Compare observed with predicted, correct the factor when beyond the threshold, name bottlenecks.

    The factor changes only when the measured factor differs from the one known for the GPU type by
    more than ``t.divergence`` (hysteresis: a job hovering around its prediction keeps its factor),
    and only from a steady measurement (``t.max_spread``, ``t.min_seconds``).
    """
    observed = m.throughput
    steady = (
        m.rate is not None and m.rate.seconds >= t.min_seconds and m.rate.spread <= t.max_spread
    )
    if observed is None or e.predicted <= 0 or not steady:
        why = "no samples counter data yet" if observed is None else "not enough steady samples yet"
        return Assessment(None, e.predicted, None, None, e.current_factor, False, bottlenecks(m, e, None, t), why)
    ratio = observed / e.predicted
    model = e.predicted / e.plan_factor if e.plan_factor > 0 else e.predicted
    measured = min(max(observed / model, MIN_FACTOR), MAX_FACTOR)
    corrected = abs(measured / e.current_factor - 1) > t.divergence
    factor = round(measured, 3) if corrected else e.current_factor
    findings = bottlenecks(m, e, ratio, t)
    summary = f"observed {observed:.1f}/s vs predicted {e.predicted:.1f}/s ({ratio:.0%})"
    if corrected:
        summary += f"; efficiency factor {e.current_factor:.2f} -> {factor:.2f}"
    if findings:
        summary += "; " + ", ".join(f.type for f in findings)
    return Assessment(observed, e.predicted, ratio, measured, factor, corrected, findings, summary)
