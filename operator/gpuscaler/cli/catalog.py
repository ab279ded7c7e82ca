"""``gpuscaler catalog``: the GPUs, instance types and workloads the planner knows."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from gpuscaler import prices_cli as pc
from gpuscaler.catalog import Workload
from gpuscaler.cli.common import _table
from gpuscaler.inputs import to_json


def _workload_dict(w: Workload) -> dict[str, object]:
    """A workload profile as ``catalog workloads --json`` prints it."""
    return {
        "id": w.id,
        "aliases": list(w.aliases),
        "family": w.family,
        "unit": w.unit,
        "batch_unit": w.item,
        "samples_per_item": w.samples_per_item,
        "params": w.params,
        "flops_per_sample": w.flops_per_sample,
        "activation_bytes_per_sample": w.activation_bytes_per_sample,
        "traffic_bytes_per_sample": w.traffic_bytes,
        "seq_len": w.seq_len,
        "kernels_per_step": w.kernels_per_step,
        "kernels_per_item": w.kernels_per_item,
        "optimizer": w.optimizer,
        "default_global_batch": w.default_global_batch,
        "samples_per_epoch": w.samples_per_epoch,
        "source": w.source,
    }


def cmd_catalog(args: argparse.Namespace) -> int:
    cat = pc.catalog_for(args)
    if args.json:
        if args.what == "workloads":
            items: list[dict[str, object]] = [_workload_dict(w) for w in cat.workloads]
        elif args.what == "gpus":
            items = [asdict(x) for x in cat.gpus]
        else:
            items = [asdict(x) | pc.instance_price_fields(x) for x in cat.instances]
        print(to_json({args.what: items}))
        return 0
    if args.what == "gpus":
        rows: list[list[object]] = [
            [
                g.id,
                g.arch,
                f"{g.memory_gb:g}",
                f"{g.mem_bw_gbs:g}",
                f"{g.fp32_tflops:g}",
                f"{g.tf32_tflops or '-'}",
                f"{g.fp16_tflops:g}",
                f"{g.fp8_tflops or '-'}",
                g.intra_link,
            ]
            for g in cat.gpus
        ]
        print(_table(["gpu", "arch", "GB", "GB/s", "fp32", "tf32", "fp16/bf16", "fp8", "link"], rows))
    elif args.what == "instances":
        rows = [
            [
                i.name,
                i.provider,
                i.region,
                f"{i.gpu_count} x {i.gpu_id}",
                i.vcpu,
                f"{i.memory_gib:g}",
                f"{i.network_gbps:g}",
                f"{i.ondemand_usd_hr:.3f}",
                f"{i.spot_usd_hr:.3f}" if i.spot_usd_hr else "-",
                i.interruption_bucket if i.interruption_bucket is not None else "-",
                i.price_date,
                pc.age_label(i),
                pc.source_label(i),
            ]
            for i in cat.instances
        ]
        print(
            _table(
                [
                    "instance",
                    "cloud",
                    "region",
                    "GPUs",
                    "vCPU",
                    "GiB",
                    "Gbps",
                    "$/h",
                    "spot $/h",
                    "bucket",
                    "prices of",
                    "age",
                    "source",
                ],
                rows,
            )
        )
    else:
        rows = [
            [
                w.id,
                w.family,
                w.unit,
                w.item,
                f"{w.params / 1e6:,.1f}M",
                f"{w.flops_per_sample / 1e9:,.2f}",
                f"{w.activation_bytes_per_sample / 1e6:,.1f}",
                w.optimizer,
            ]
            for w in cat.workloads
        ]
        print(
            _table(
                ["workload", "family", "unit", "batch unit", "params", "GFLOPs/sample", "act MB/sample", "optimizer"],
                rows,
            )
        )
    return 0
