"""``gpuscaler estimate``: the performance model's prediction for one configuration."""

from __future__ import annotations

import argparse
from typing import Any

from gpuscaler import prices_cli as pc
from gpuscaler.api import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_NODES
from gpuscaler.catalog import Precision, Workload
from gpuscaler.cli.common import UsageError
from gpuscaler.inputs import to_json
from gpuscaler.perfmodel import ParallelConfig, estimate
from gpuscaler.perfmodel.uncertainty import throughput_band

MAX_GPUS_PER_NODE = 16
"""Most GPUs ``gpuscaler estimate`` puts in one node: the largest single-node systems built (DGX-2
and HGX-2: 16 V100s on NVSwitch; NVIDIA DGX-2 user guide); the catalog's instances have at most 8."""


def _check_global_batch(batch: int, args: argparse.Namespace, workload: Workload, what: str) -> None:
    """At most the largest globalBatch a TrainingJob may ask for: ``batch`` per GPU x accumulation x
    GPUs, ``what`` saying where the micro-batch came from."""
    items = batch * args.accumulation * args.gpus
    if items <= MAX_GLOBAL_BATCH:
        return
    raise UsageError(
        f"{what} x --accumulation {args.accumulation:,} x --gpus {args.gpus:,} is a global batch of "
        f"{items:,} {workload.item}: at most {MAX_GLOBAL_BATCH:,} (the largest globalBatch a TrainingJob "
        "may ask for)"
    )


def cmd_estimate(args: argparse.Namespace) -> int:
    cat = pc.catalog_for(args)
    workload = cat.workload(args.workload)
    gpu = cat.gpu(args.gpu)
    counts: tuple[tuple[str, int | None, str, int | None], ...] = (
        ("--gpus", args.gpus, "GPUs in total", MAX_GPUS),
        ("--nodes", args.nodes, "nodes", MAX_NODES),
        ("--batch-per-gpu", args.batch_per_gpu, f"{workload.item} per GPU per micro-batch", None),
        ("--accumulation", args.accumulation, "micro-batches per optimizer step", None),
    )
    for flag, value, what, most in counts:
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be at least 1 ({what})")
        if value is not None and most is not None and value > most:
            raise UsageError(f"{flag} {value:,}: at most {most:,} (the most a TrainingJob may use)")
    if args.network_gbps is not None and args.network_gbps <= 0:
        raise UsageError(f"--network-gbps {args.network_gbps:g}: must be positive (Gb/s between nodes)")
    if args.gpus % args.nodes:
        raise UsageError(f"--gpus {args.gpus} must be a multiple of --nodes {args.nodes}")
    per_node = args.gpus // args.nodes
    if per_node > MAX_GPUS_PER_NODE:
        largest = max((i.gpu_count for i in cat.instances if i.gpu_id == gpu.id), default=MAX_GPUS_PER_NODE)
        nodes = -(-args.gpus // largest)
        raise UsageError(
            f"--gpus {args.gpus} on --nodes {args.nodes} is {per_node} GPUs per node; no node has more "
            f"than {MAX_GPUS_PER_NODE}: spread them over more nodes, e.g. --gpus {largest * nodes} --nodes {nodes}"
        )
    given = f"--batch-per-gpu {args.batch_per_gpu:,}" if args.batch_per_gpu else None
    _check_global_batch(args.batch_per_gpu or 1, args, workload, given or "a micro-batch of 1 (the least)")
    network = args.network_gbps
    if args.nodes > 1 and network is None:
        same = [i for i in cat.instances if i.gpu_id == gpu.id and i.gpu_count == per_node]
        if not same:
            raise UsageError(
                f"--nodes {args.nodes}: give --network-gbps (no catalog instance has {per_node} x {gpu.id})"
            )
        network = max(i.network_gbps for i in same)
    batch = args.batch_per_gpu or _default_batch(
        workload, gpu, Precision(args.precision), args.accumulation, per_node, args.nodes
    )
    if given is None:
        _check_global_batch(batch, args, workload, f"the default micro-batch of {batch:,} (the largest that fits)")
    cfg = ParallelConfig(
        micro_batch=batch,
        precision=Precision(args.precision),
        gpus_per_node=per_node,
        nodes=args.nodes,
        accumulation=args.accumulation,
        zero_stage=args.zero_stage,
        activation_checkpointing=args.activation_checkpointing,
        network_gbps=network,
        channels_last=args.channels_last,
        data_loader=args.data_loader,
    )
    est = estimate(workload, gpu, cfg)
    band = throughput_band(workload, gpu, cfg.precision, est.throughput)
    data = {
        "workload": workload.id,
        "gpu": gpu.id,
        "gpus": cfg.gpus,
        "nodes": cfg.nodes,
        "precision": args.precision,
        "precision_on_hardware": est.precision_used,
        "batch_per_gpu": cfg.micro_batch,
        "accumulation": cfg.accumulation,
        "global_batch": cfg.global_batch,
        "throughput": est.throughput,
        "throughput_p10": band.p10,
        "throughput_p90": band.p90,
        "throughput_log_sigma": band.log_sigma,
        "throughput_band_reasons": list(band.reasons),
        "unit": est.unit,
        "batch_unit": est.batch_unit,
        "channels_last": cfg.channels_last,
        "data_loader": cfg.data_loader,
        "step_time_s": est.step_time_s,
        "memory_per_gpu_gb": est.memory_per_gpu_gb,
        "memory_breakdown_gb": {
            "weights": est.memory.weights / 1e9,
            "gradients": est.memory.gradients / 1e9,
            "optimizer": est.memory.optimizer / 1e9,
            "activations": est.memory.activations / 1e9,
            "overhead": est.memory.overhead / 1e9,
            **{k: getattr(est.memory, k) / 1e9 for k in ("gathered", "buckets", "workspace", "fragmentation")},
            "usable": est.memory.capacity / 1e9,
            "visible": est.memory.visible / 1e9,
            "reserved": est.memory.reserved / 1e9,
        },
        "fits": est.fits,
        "scaling_efficiency": est.scaling_efficiency,
        "bottleneck": est.bottleneck,
        "time_breakdown_s": {
            "compute": est.compute_s,
            "memory_bound": est.memory_bound_s,
            "overhead": est.overhead_s,
            "host": est.host_s,
            "allreduce": est.comm_s,
            "allreduce_exposed": est.comm_exposed_s,
        },
        "kernels_per_micro_batch": est.kernels_per_micro_batch,
        "prices": pc.estimate_prices(cat, gpu.id, per_node, cfg.nodes, est.throughput),
    }
    if args.json:
        print(to_json(data))
    else:
        print(
            f"{workload.id} on {cfg.gpus} x {gpu.id} ({args.precision} -> {est.precision_used}), batch/GPU "
            f"{cfg.micro_batch} {est.batch_unit} x {cfg.accumulation}:\n"
            f"  throughput {est.throughput:,.1f} {est.unit}/s, step {est.step_time_s * 1000:,.1f} ms, "
            f"scaling efficiency {est.scaling_efficiency:.0%}, bound by {est.bottleneck}\n"
            f"  per step: compute {est.compute_s * 1000:,.1f} ms, memory-bound {est.memory_bound_s * 1000:,.1f} ms, "
            f"host {est.host_s * 1000:,.1f} ms ({est.kernels_per_micro_batch:,.0f} kernels per micro-batch), "
            f"exposed all-reduce {est.comm_exposed_s * 1000:,.1f} ms\n"
            f"  P10-P90 {band.p10:,.1f}-{band.p90:,.1f} {est.unit}/s (model error sigma {band.log_sigma:.2f}"
            + (f": {', '.join(band.reasons)}" if band.reasons else "")
            + ")\n"
            f"  memory {est.memory_per_gpu_gb:.2f} GB/GPU of {est.memory.capacity / 1e9:.2f} GB usable "
            f"({gpu.memory_gb:g} GiB card): "
            f"{'fits' if est.fits else 'DOES NOT FIT'}"
        )
        if data["prices"]:
            print(pc.render_estimate_prices(data["prices"], est.unit))
    return 0


def _default_batch(
    workload: Any, gpu: Any, precision: Precision, accumulation: int, per_node: int, nodes: int
) -> int:
    """Largest power-of-two micro-batch up to 256 that fits, for estimates without --batch-per-gpu."""
    from gpuscaler.perfmodel import memory_per_gpu

    best = 1
    b = 1
    while b <= 256:
        cfg = ParallelConfig(
            micro_batch=b, precision=precision, gpus_per_node=per_node, nodes=nodes, accumulation=accumulation
        )
        if memory_per_gpu(workload, gpu, cfg).fits:
            best = b
        b *= 2
    return best
