"""Stage 2 of the planner, configure: how one offering runs the job at a node count and precision.

:func:`configure` finds the micro-batch, gradient accumulation and memory savers (activation
checkpointing, ZeRO stages) that keep the global batch exactly and fit in GPU memory; a
configuration that cannot run is a :class:`~gpuscaler.planner.candidate.Refusal` with its reason
code. Pure; the performance model's memory estimate is the only input beyond the arguments.
"""

from __future__ import annotations

import math
from functools import cache

from gpuscaler.catalog import InstanceType, Precision, Workload
from gpuscaler.perfmodel import ParallelConfig, memory_per_gpu
from gpuscaler.planner.candidate import Reason, Refusal


@cache
def _divisors_desc(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}, reverse=True))


def configure(
    workload: Workload,
    inst: InstanceType,
    nodes: int,
    precision: Precision,
    global_batch: int,
    channels_last: bool = False,
    data_loader: str = "pytorch",
) -> tuple[ParallelConfig | None, Refusal | None]:
    """The fastest-to-run configuration that fits, or None with the refusal.

    With ``g`` GPUs and global batch ``B``, the per-GPU batch ``b = B / g`` must be whole
    (else ``Reason.BATCH``); every configuration keeps ``B = g x m x K`` exactly, micro-batch
    ``m`` a divisor of ``b`` and ``K = b / m`` accumulation steps. Prefers, in order: no memory
    savers, activation checkpointing, then ZeRO stages 1-3 (sharding over ``g > 1``); within each,
    the largest ``m`` with ``memory(m) <= capacity``. Memory grows with ``m``, so "fits" flips once
    along the descending divisors and is bisected: ``O(log d(b))`` memory evaluations per saver
    instead of ``d(b)``. Nothing fits: ``Reason.MEMORY``. The micro-batch is chosen per
    precision, so mixed precision's smaller activations buy a larger micro-batch, which the model
    runs more efficiently (fixed host time and wave quantization amortised): the two are coupled.

    Args:
        workload: what is trained.
        inst: the instance type (GPU, GPUs per node, network, vCPUs).
        nodes: how many nodes.
        precision: the precision.
        global_batch: the job's global batch in items.
        channels_last: the job's memory format.
        data_loader: the job's input pipeline.

    Returns:
        ``(config, None)``, or ``(None, refusal)`` with ``Reason.BATCH`` or ``Reason.MEMORY``.

    Raises:
        PrecisionUnsupportedError: the GPU cannot run ``precision`` (the caller's to map).
    """
    gpus = inst.gpu_count * nodes
    if global_batch % gpus:
        return None, Refusal(Reason.BATCH, f"global batch {global_batch} is not divisible by {gpus} GPUs")
    per_gpu = global_batch // gpus
    options = [(0, False), (0, True)] + ([(1, True), (2, True), (3, True)] if gpus > 1 else [])
    divisors = _divisors_desc(per_gpu)  # largest micro-batch first
    smallest = math.inf
    for zero, ckpt in options:

        def config(micro: int, zero: int = zero, ckpt: bool = ckpt) -> ParallelConfig:
            return ParallelConfig(
                micro_batch=micro,
                precision=precision,
                gpus_per_node=inst.gpu_count,
                nodes=nodes,
                accumulation=per_gpu // micro,
                zero_stage=zero,
                activation_checkpointing=ckpt,
                network_gbps=inst.network_gbps,
                vcpus_per_node=inst.vcpu,
                channels_last=channels_last,
                data_loader=data_loader,
            )

        # Memory grows with the micro-batch, so "fits" flips once along the descending divisors:
        # bisect for the first (largest) micro-batch that fits.
        lowest = memory_per_gpu(workload, inst.gpu, config(divisors[-1]))
        if not lowest.fits:
            smallest = min(smallest, lowest.total)
            continue
        lo, hi = 0, len(divisors) - 1  # divisors[hi] fits
        while lo < hi:
            mid = (lo + hi) // 2
            if memory_per_gpu(workload, inst.gpu, config(divisors[mid])).fits:
                hi = mid
            else:
                lo = mid + 1
        return config(divisors[hi]), None
    return None, Refusal(
        Reason.MEMORY,
        f"does not fit: needs {smallest / 1e9:.1f} GB per GPU even at micro-batch 1 with activation "
        f"checkpointing{' and ZeRO-3' if gpus > 1 else ''}; {inst.gpu_id} has {inst.gpu.memory_gb:g} GB",
    )
