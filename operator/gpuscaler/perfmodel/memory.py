"""Memory per GPU of one way of training a workload, and the rule that decides whether it fits.

Called by :func:`gpuscaler.perfmodel.model.estimate`, the planner's configure stage (the largest
micro-batch that fits, and the memory savers it needs) and ``gpuscaler validate``, which checks the
rule against every configuration of ``catalog/data/memory_runs.csv`` (documented to have trained,
or to have run out of memory) with :func:`memory_agreement`. The constants and their sources are in
``data/constants.yaml`` (``memory:``); docs/memory-model.md explains each term.

The peak of a data-parallel training step, per GPU, with ``P`` parameters, ``n`` GPUs, micro-batch
``b`` and ZeRO/FSDP stage ``z``::

    states    = P * (w_p / n_3 + g_p / n_2 + (o + m_p) / n_1)     weights, gradients, optimizer state
                                                                  and fp32 master weights, each
                                                                  sharded over n GPUs from its stage
                                                                  on (n_k = n if z >= k else 1)
    gathered  = w_p (U1 + U2) + g_p U1         z = 3 only: FSDP gathers a unit's full weights
                                               before use (the current unit and the prefetched next)
                                               and holds one unit's full gradients until its
                                               reduce-scatter; U1, U2 = the two largest units'
                                               parameters (a transformer's embedding and a layer)
    buckets   = P * g_p                        z = 0 and n > 1: DistributedDataParallel's gradient
                                               buckets, a second copy of the gradients (PyTorch's
                                               DDP docs: gradient_as_bucket_view=False, the default,
                                               "the saved memory size will be equal to the total
                                               gradients size" when it is turned on)
    acts      = b * a_item * c_p               the tensors autograd keeps for backward (16-bit
                                               bytes per item a_item; c_p = 2 at full precision)
    workspace = cuBLAS workspace (+ cuDNN's for convolutions)
    frag      = f * (acts + gathered)          the caching allocator's reserved-but-unallocated
                                               bytes around the allocations that come and go
    peak      = states + gathered + buckets + acts + workspace + frag

and the headroom rule::

    fits  <=>  peak <= usable = visible - context - nccl
    visible = memory_gb * GiB * v              what the driver gives the process (v < 1: memory the
                                               driver keeps; ECC on GDDR cards takes 1/16 more)
    context = the CUDA context and libraries outside PyTorch's allocator (kernels, cuBLAS and cuDNN
              handles); nccl = NCCL's communication buffers, when there is more than one GPU.

The GPU's ``memory_gb`` is the vendor's figure, which for NVIDIA's HBM and GDDR cards is in binary
units: an "80 GB" A100 has 81,920 MiB and PyTorch reports "80.00 GiB total capacity".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from gpuscaler.catalog.memory_runs import MemoryRun
from gpuscaler.catalog.models import GPU, Precision, Workload
from gpuscaler.perfmodel.config import ParallelConfig
from gpuscaler.perfmodel.parameters import constants

GIB = 1024.0**3
CACHE_SIZE = 8192
"""Entries of the memo of the micro-batch-independent part (per workload, precision, GPUs and savers)."""


class MemoryBreakdown(NamedTuple):
    """Bytes per GPU at the peak of a training step, by role, and the bytes the step may use.

    A named tuple, not a frozen dataclass: the planner builds one per configuration it bisects
    (thousands per plan), and a frozen dataclass's field-by-field ``__init__`` costs ~0.4 us a field.
    """

    weights: float
    gradients: float
    optimizer: float
    """Optimizer state plus fp32 master weights under mixed precision."""
    activations: float
    gathered: float
    """ZeRO-3/FSDP: full weights and gradients of the units in flight."""
    buckets: float
    """DistributedDataParallel's gradient buckets (ZeRO 0 over several GPUs)."""
    workspace: float
    """cuBLAS (and for convolutions cuDNN) workspace."""
    fragmentation: float
    """The caching allocator's reserved-but-unallocated bytes."""
    visible: float
    """What the driver gives the process."""
    reserved: float
    """CUDA context and NCCL buffers: memory outside PyTorch's allocator."""

    @property
    def overhead(self) -> float:
        """What the framework adds around them: ``gathered + buckets + workspace + fragmentation``."""
        return self.gathered + self.buckets + self.workspace + self.fragmentation

    @property
    def capacity(self) -> float:
        """Usable bytes: ``visible - reserved`` (the headroom rule in the module docstring)."""
        return self.visible - self.reserved

    @property
    def total(self) -> float:
        """The predicted peak."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    @property
    def fits(self) -> bool:
        """The headroom rule: peak <= usable."""
        return self.total <= self.capacity


def visible_bytes(gpu: GPU) -> float:
    """What the driver gives a process on ``gpu``: ``memory_gb`` GiB x the visible fraction
    (``memory.visible_fraction``: GDDR cards with ECC on lose a sixteenth more)."""
    return _headroom(gpu.id, gpu.memory_gb, False, "")[0]


def reserved_bytes(gpus: int) -> float:
    """Memory outside PyTorch's allocator: the CUDA context, and NCCL's buffers with several GPUs."""
    c = constants()["memory"]
    return float((c["cuda_context_gib"] + (c["nccl_buffers_gib"] if gpus > 1 else 0.0)) * GIB)


def _sharding_units(workload: Workload) -> tuple[float, float]:
    """Parameters of the two largest units FSDP gathers (largest first): a transformer's embedding
    and its layers, else the parameters over the layers (``memory.default_sharding_units`` where the
    layers are unknown)."""
    if workload.shape is not None:
        units = sorted((workload.shape.layer_params, float(workload.shape.vocab * workload.shape.hidden)))
        return units[1], units[0]
    unit = workload.params / (workload.layers or constants()["memory"]["default_sharding_units"])
    return unit, unit


@lru_cache(maxsize=CACHE_SIZE)
def _memory_form(
    workload: Workload, precision: Precision, n: int, zero_stage: int, checkpointing: bool
) -> tuple[float, float, float, float, float, float, float]:
    """The micro-batch-independent part of :func:`memory_per_gpu`: weights, gradients, optimizer,
    gathered and bucket bytes, stored activation bytes per item and the precision's activation scale."""
    c = constants()["memory"]
    p = precision.value
    params = workload.params
    shard_opt = n if zero_stage >= 1 else 1
    shard_grad = n if zero_stage >= 2 else 1
    shard_w = n if zero_stage >= 3 else 1
    weights = params * c["weight_bytes"][p] / shard_w
    grads = params * c["grad_bytes"][p] / shard_grad
    opt_bytes = c["optimizer_state_bytes"].get(workload.optimizer, 8) + c["master_weight_bytes"][p]
    optimizer = params * opt_bytes / shard_opt
    gathered = 0.0
    if zero_stage >= 3 and n > 1:
        largest, second = _sharding_units(workload)
        gathered = c["weight_bytes"][p] * (largest + second) + c["grad_bytes"][p] * largest
    buckets = params * c["grad_bytes"][p] if zero_stage == 0 and n > 1 else 0.0
    act_scale = c["activation_scale"][p]
    if checkpointing:
        if workload.shape is not None:
            per_item = workload.shape.checkpointed_activation_bytes_per_sequence()
        else:
            per_item = (
                workload.activation_bytes_per_sample
                * workload.samples_per_item
                * c["checkpointed_activation_fraction"]
            )
    else:
        per_item = workload.activation_bytes_per_sample * workload.samples_per_item
    return weights, grads, optimizer, gathered, buckets, per_item, act_scale


@lru_cache(maxsize=CACHE_SIZE)
def _headroom(gpu_id: str, memory_gb: float, several: bool, family: str) -> tuple[float, float, float, float]:
    """The micro-batch-independent bytes of the rule for a GPU: visible, reserved (context, and NCCL
    with ``several`` GPUs), the workspace for ``family`` and the fragmentation rate. Keyed by the
    GPU's id and memory, not the row, which is slower to hash."""
    c = constants()["memory"]
    workspace = c["cublas_workspace_gib"] * GIB
    if family in c["cudnn_families"]:
        workspace += c["cudnn_workspace_gib"] * GIB
    kind = "gddr_ecc" if gpu_id in c["gddr_ecc_gpus"] else "default"
    visible = memory_gb * GIB * c["visible_fraction"][kind]
    return visible, reserved_bytes(2 if several else 1), workspace, float(c["fragmentation"])


def memory_per_gpu(workload: Workload, gpu: GPU, cfg: ParallelConfig) -> MemoryBreakdown:
    """Bytes per GPU at the peak of a step, by role, and the usable bytes (module docstring)."""
    weights, grads, optimizer, gathered, buckets, per_item, act_scale = _memory_form(
        workload, cfg.precision, cfg.gpus, cfg.zero_stage, cfg.activation_checkpointing
    )
    visible, reserved, workspace, frag = _headroom(gpu.id, gpu.memory_gb, cfg.gpus > 1, workload.family)
    activations = cfg.micro_batch * per_item * act_scale
    fragmentation = frag * (activations + gathered)
    return MemoryBreakdown(
        weights=weights,
        gradients=grads,
        optimizer=optimizer,
        activations=activations,
        gathered=gathered,
        buckets=buckets,
        workspace=workspace,
        fragmentation=fragmentation,
        visible=visible,
        reserved=reserved,
    )


@dataclass(frozen=True, slots=True)
class RunCheck:
    """The memory model's verdict on one documented configuration."""

    run: MemoryRun
    memory: MemoryBreakdown

    @property
    def agrees(self) -> bool:
        """A "ran" row is predicted to fit; an "oom" row is predicted not to."""
        return self.memory.fits if self.run.outcome == "ran" else not self.memory.fits


@dataclass(frozen=True, slots=True)
class MemoryAgreement:
    """How the memory model agrees with what is documented to run and to run out of memory."""

    checks: tuple[RunCheck, ...]

    def tally(self, outcome: str) -> tuple[int, int]:
        """The rows documented with ``outcome`` (``ran`` or ``oom``), and how many of them the model
        predicts as documented ("ran": to fit; "oom": not to fit)."""
        checks = [c for c in self.checks if c.run.outcome == outcome]
        return len(checks), sum(c.agrees for c in checks)

    @property
    def misses(self) -> tuple[RunCheck, ...]:
        return tuple(c for c in self.checks if not c.agrees)


def check_run(run: MemoryRun) -> RunCheck:
    """The memory model's prediction for one documented configuration."""
    cfg = ParallelConfig(
        micro_batch=run.micro_batch,
        precision=run.precision,
        gpus_per_node=run.gpus_per_node,
        nodes=run.nodes,
        zero_stage=run.zero_stage,
        activation_checkpointing=run.activation_checkpointing,
    )
    return RunCheck(run, memory_per_gpu(run.workload, run.gpu, cfg))


def memory_agreement(runs: tuple[MemoryRun, ...] | None = None) -> MemoryAgreement:
    """Both rates over ``runs`` (the shipped ``memory_runs.csv`` when None)."""
    if runs is None:
        from gpuscaler.catalog.memory_runs import load_memory_runs

        runs = load_memory_runs()
    return MemoryAgreement(tuple(check_run(r) for r in runs))


def agreement_json(a: MemoryAgreement) -> dict[str, object]:
    """``gpuscaler validate --json``'s ``memory`` object: both rates and every disagreeing row."""
    ran, ran_fit = a.tally("ran")
    oom, oom_flagged = a.tally("oom")
    return {
        "ran": ran,
        "ran_predicted_to_fit": ran_fit,
        "ran_fit_pct": round(100.0 * ran_fit / ran, 2) if ran else None,
        "oom": oom,
        "oom_predicted_not_to_fit": oom_flagged,
        "oom_flagged_pct": round(100.0 * oom_flagged / oom, 2) if oom else None,
        "misses": [
            {
                "id": c.run.id,
                "outcome": c.run.outcome,
                "predicted_gb": round(c.memory.total / 1e9, 2),
                "usable_gb": round(c.memory.capacity / 1e9, 2),
                "source": c.run.source,
            }
            for c in a.misses
        ],
        "source": "catalog/data/memory_runs.csv",
    }


MEMORY_TABLE_HEADERS = ("documented outcome", "rows", "predicted as documented", "rate")
"""The columns of :func:`agreement_rows` (``gpuscaler validate``'s memory table)."""


def agreement_rows(a: MemoryAgreement) -> list[list[str]]:
    """``gpuscaler validate``'s memory table: per documented outcome, the rows and how many the model
    predicts as documented (ran: fits; out of memory: does not fit)."""
    rows = []
    for label, outcome in (("trained (predicted to fit)", "ran"), ("out of memory (predicted not to fit)", "oom")):
        n, agreeing = a.tally(outcome)
        rows.append([label, str(n), str(agreeing), f"{100.0 * agreeing / n:.1f}%" if n else "-"])
    return rows


def agreement_misses(a: MemoryAgreement) -> list[str]:
    """One line per row the model predicts against its documented outcome."""
    return [
        f"MISS {c.run.id} ({c.run.outcome}): predicted {c.memory.total / 1e9:.1f} GB of "
        f"{c.memory.capacity / 1e9:.1f} usable; {c.run.source}"
        for c in a.misses
    ]
