"""The ``gpuscaler`` command line: plan, estimate, validate, catalog, and the operator's commands.

Each subcommand is a thin adapter over the pure layers (catalog, perfmodel, planner); exit codes:
0 success, 1 an infeasible plan, 2 bad input (unknown id, invalid file) with a message saying what
to change.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuscaler import __version__
from gpuscaler.api import TrainingJob
from gpuscaler.catalog import Precision, UnknownIdError, load_catalog
from gpuscaler.perfmodel import DATA_LOADERS, ParallelConfig, PrecisionUnsupportedError, estimate
from gpuscaler.planner import JobError, PlanResult, plan
from gpuscaler.policy import Policy, PolicyConflictError, PolicyFileError, load_policies, policy_for_namespace
from gpuscaler.validation import format_validation

EXTENSIONS = (
    "gpuscaler.devcluster.cli",  # dev-cluster up|down|env|build (local control plane)
    "gpuscaler.operator_cli",  # run, crd (the operator)
    "gpuscaler.policy.cli",  # policy check
    "gpuscaler.simulator.cli",  # simulate
    "gpuscaler.observe.cli",  # report
)
"""Modules that add subcommands through ``register(subparsers)``; skipped when not importable."""

EXIT_INFEASIBLE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user; printed without a traceback, exit 2."""


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _money(x: float) -> str:
    return f"${x:,.2f}" if x < 100 else f"${x:,.0f}"


def load_job(path: str) -> TrainingJob:
    """Read a TrainingJob YAML file (the same document ``kubectl apply`` takes)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise UsageError(f"{path}: no such file") from err
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict) or raw.get("kind") != "TrainingJob":
        raise UsageError(f"{path}: expected a document with kind: TrainingJob")
    try:
        return TrainingJob.model_validate(raw)
    except ValidationError as err:
        raise UsageError(format_validation(err, path)) from err


def _load_policy(path: str | None, namespace: str | None) -> Policy | None:
    """The policy in force for ``namespace`` from a (possibly multi-document) policy file."""
    if path is None:
        return None
    try:
        return policy_for_namespace(load_policies(path), namespace)
    except FileNotFoundError as err:
        raise UsageError(f"{path}: no such file") from err
    except ValidationError as err:
        raise UsageError(format_validation(err, f"policy {path}")) from err
    except (PolicyFileError, PolicyConflictError) as err:
        raise UsageError(f"policy {path}: {err}") from err


# ------------------------------------------------------------------------------------------ plan


def plan_to_dict(result: PlanResult) -> dict[str, Any]:
    job = result.job
    return {
        "job": {
            "name": job.name,
            "workload": job.workload.id,
            "unit": job.workload.unit,
            "globalBatch": job.global_batch,
            "totalSamples": job.total_samples,
            "steps": job.steps,
            "deadlineHours": job.deadline_h,
            "budgetUsd": job.budget_usd,
            "objective": result.objective.value,
        },
        "feasible": result.ok,
        "chosen": result.chosen.to_dict() if result.chosen else None,
        "why": result.why,
        "pareto": [c.to_dict() for c in result.pareto],
        "rejected": [
            {
                "instanceType": r.instance,
                "capacityType": r.capacity,
                "category": r.category,
                "reason": r.reason,
            }
            for r in result.rejected
        ],
        "hints": result.hints,
        "candidatesEvaluated": result.candidates_evaluated,
        "planningSeconds": round(result.planning_seconds, 4),
    }


def render_plan(result: PlanResult) -> str:
    job = result.job
    out = []
    limits = []
    if job.deadline_h is not None:
        limits.append(f"deadline in {job.deadline_h:.1f} h")
    if job.budget_usd is not None:
        limits.append(f"budget {_money(job.budget_usd)}")
    out.append(
        f"Job {job.name}: {job.workload.id}, {job.total_samples:,.0f} {job.workload.unit} "
        f"({job.steps:,} steps at global batch {job.global_batch}), objective {result.objective.value}"
        + (f", {', '.join(limits)}" if limits else "")
    )
    out.append("")
    c = result.chosen
    if c is not None:
        e = c.estimate
        out.append(f"Chosen: {c.label}")
        out.append(f"  why: {result.why}")
        out.append(
            f"  micro-batch {c.micro_batch} x {c.accumulation} accumulation x {c.gpus} GPUs = {job.global_batch}"
            + (" | activation checkpointing" if c.activation_checkpointing else "")
            + (f" | ZeRO-{c.zero_stage}" if c.zero_stage else "")
        )
        out.append(
            f"  {e.throughput:,.1f} {e.unit}/s, step {e.step_time_s * 1000:,.1f} ms, "
            f"{e.memory_per_gpu_gb:.1f} GB/GPU of {c.instance.gpu.memory_gb:g}, scaling efficiency "
            f"{e.scaling_efficiency:.0%}, bound by {e.bottleneck} ({e.precision_used})"
        )
        out.append(
            f"  expected {c.expected_hours:.2f} h, {_money(c.expected_cost_usd)} at {_money(c.usd_per_hour)}/h; "
            f"checkpoint every {c.outlook.interval_s / 60:.0f} min ({c.checkpoint_write_s:.0f} s each)"
            + (
                f"; {c.outlook.interruptions:.2f} interruptions expected, P(miss deadline) "
                f"{c.outlook.deadline_miss_probability:.1%}"
                if c.capacity.value == "spot"
                else ""
            )
        )
    else:
        out.append("No feasible plan.")
        for h in result.hints:
            out.append(f"  - {h}")
    out.append("")
    title = (
        "Cost vs time (Pareto front of feasible plans)"
        if result.feasible
        else "Cost vs time (all plans that fit)"
    )
    out.append(title + ":")
    rows = []
    for p in result.pareto[:15]:
        rows.append(
            [
                "*" if p is c else "",
                p.label,
                f"{p.micro_batch}x{p.accumulation}",
                f"{p.estimate.throughput:,.0f}",
                f"{p.estimate.memory_per_gpu_gb:.1f}",
                f"{p.expected_hours:.2f}",
                _money(p.expected_cost_usd),
                f"{p.outlook.deadline_miss_probability:.1%}" if job.deadline_h is not None else "-",
            ]
        )
    out.append(
        _table(
            ["", "plan", "micro x K", f"{job.workload.unit}/s", "GB/GPU", "hours", "cost", "P(miss)"], rows
        )
    )
    if result.rejected:
        out.append("")
        out.append("Rejected:")
        by_reason: dict[tuple[str, str], list[str]] = {}
        for r in result.rejected:
            by_reason.setdefault((r.category, r.reason), []).append(f"{r.instance}/{r.capacity}")
        for (category, reason), names in sorted(by_reason.items()):
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            out.append(f"  [{category}] {shown}: {reason}")
    out.append("")
    out.append(
        f"{result.candidates_evaluated} configurations evaluated in {result.planning_seconds * 1000:.0f} ms"
    )
    return "\n".join(out)


def plot_plan(result: PlanResult, path: str) -> None:
    """Cost vs time of every feasible (or fitting) plan, the Pareto front and the chosen plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = result.feasible or result.pareto
    fig, ax = plt.subplots(figsize=(8, 5))
    for cap, marker in (("on-demand", "o"), ("spot", "^")):
        sel = [p for p in pts if p.capacity.value == cap]
        ax.scatter(
            [p.expected_hours for p in sel],
            [p.expected_cost_usd for p in sel],
            marker=marker,
            alpha=0.4,
            label=cap,
        )
    ax.plot(
        [p.expected_hours for p in result.pareto],
        [p.expected_cost_usd for p in result.pareto],
        "k--",
        label="Pareto front",
    )
    if result.chosen:
        ax.scatter(
            [result.chosen.expected_hours],
            [result.chosen.expected_cost_usd],
            s=200,
            facecolors="none",
            edgecolors="red",
            linewidths=2,
            label=f"chosen: {result.chosen.label}",
        )
    if result.job.deadline_h:
        ax.axvline(result.job.deadline_h, color="grey", linestyle=":", label="deadline")
    if result.job.budget_usd:
        ax.axhline(result.job.budget_usd, color="grey", linestyle="-.", label="budget")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("expected hours")
    ax.set_ylabel("expected cost (USD)")
    ax.set_title(f"{result.job.name}: {result.job.workload.id}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_plan(args: argparse.Namespace) -> int:
    doc = load_job(args.file)
    policy = _load_policy(args.policy, args.namespace or doc.metadata.namespace or "default")
    result = plan(doc.spec, load_catalog(), policy, name=doc.metadata.name)
    if args.json:
        print(json.dumps(plan_to_dict(result), indent=2))
    else:
        print(render_plan(result))
    if args.plot:
        plot_plan(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0 if result.ok else EXIT_INFEASIBLE


# -------------------------------------------------------------------------------------- estimate


def cmd_estimate(args: argparse.Namespace) -> int:
    cat = load_catalog()
    workload = cat.workload(args.workload)
    gpu = cat.gpu(args.gpu)
    counts = (
        ("--gpus", args.gpus, "GPUs in total"),
        ("--nodes", args.nodes, "nodes"),
        ("--batch-per-gpu", args.batch_per_gpu, f"{workload.item} per GPU per micro-batch"),
        ("--accumulation", args.accumulation, "micro-batches per optimizer step"),
    )
    for flag, value, what in counts:
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: must be at least 1 ({what})")
    if args.network_gbps is not None and args.network_gbps <= 0:
        raise UsageError(f"--network-gbps {args.network_gbps:g}: must be positive (Gb/s between nodes)")
    if args.gpus % args.nodes:
        raise UsageError(f"--gpus {args.gpus} must be a multiple of --nodes {args.nodes}")
    per_node = args.gpus // args.nodes
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
            "usable": est.memory.capacity / 1e9,
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
    }
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(
            f"{workload.id} on {cfg.gpus} x {gpu.id} ({args.precision} -> {est.precision_used}), batch/GPU "
            f"{cfg.micro_batch} {est.batch_unit} x {cfg.accumulation}:\n"
            f"  throughput {est.throughput:,.1f} {est.unit}/s, step {est.step_time_s * 1000:,.1f} ms, "
            f"scaling efficiency {est.scaling_efficiency:.0%}, bound by {est.bottleneck}\n"
            f"  memory {est.memory_per_gpu_gb:.2f} GB/GPU of {gpu.memory_gb:g} GB: "
            f"{'fits' if est.fits else 'DOES NOT FIT'}"
        )
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


# -------------------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    from gpuscaler.perfmodel import calibration, fitted

    rep = calibration.report()
    meta = fitted().meta
    cv = calibration.cross_validation()
    if args.json:

        def s(x: calibration.ErrorStats) -> dict[str, float]:
            return {"n": x.n, "mape_pct": round(x.mape, 2), "median_ape_pct": round(x.median, 2)}

        print(
            json.dumps(
                {
                    "overall": s(rep.overall),
                    "by": {d: {k: s(v) for k, v in g.items()} for d, g in rep.by.items()},
                    "relative": {
                        "gpu_speed_ratio": s(rep.gpu_ratio),
                        "amp_speedup": s(rep.amp_speedup),
                        "scaling_efficiency": s(rep.scaling),
                    },
                    "cross_validation": {
                        **cv["metrics"],
                        "schemes": cv["schemes"],
                        "source": cv["source"],
                    },
                    "skipped": rep.skipped,
                    "calibration": meta,
                },
                indent=2,
            )
        )
        return 0
    print("Fit error of the performance model on the rows it was calibrated on")
    print("(NVIDIA DeepLearningExamples tables; in-sample, so an optimistic bound on accuracy).")
    print(
        f"\nOverall: {rep.overall.n} rows, MAPE {rep.overall.mape:.1f}%, median error {rep.overall.median:.1f}%\n"
    )
    labels = {
        "throughput": "throughput (absolute)",
        "gpu_ratio": "GPU speed ratio (A100 vs V100, same run)",
        "amp_speedup": "mixed-precision speedup (same GPU)",
        "scaling": "multi-GPU scaling (n GPUs vs 1)",
    }
    in_sample = {"gpu_ratio": rep.gpu_ratio, "amp_speedup": rep.amp_speedup, "scaling": rep.scaling}
    print("Relative errors (what the planner's choices hinge on), in sample and cross-validated:")
    rows: list[list[object]] = []
    for key, label in labels.items():
        m = cv["metrics"][key]
        fit = in_sample.get(key, rep.overall)
        rows.append([label, fit.n, f"{fit.mape:.1f}", m["n"], f"{m['mape'] * 100:.1f}", f"{m['median_ape'] * 100:.1f}"])
    print(_table(["quantity", "rows or pairs", "fit MAPE %", "held out", "CV MAPE %", "CV median %"], rows))
    print("\nCross-validated MAPE % by scheme (scripts/calibrate.py; every scored prediction is held out):")
    print(
        _table(
            ["scheme", *labels],
            [
                [name, *(f"{m[k]['mape'] * 100:.1f} ({m[k]['n']})" for k in labels)]
                for name, m in cv["schemes"].items()
            ],
        )
    )
    for dim in ("gpu", "precision", "family", "gpus", "workload", "framework"):
        print(f"\nBy {dim} (in sample):")
        print(
            _table(
                [dim, "rows", "MAPE %", "median %"],
                [[k.strip(), v.n, f"{v.mape:.1f}", f"{v.median:.1f}"] for k, v in rep.by[dim].items()],
            )
        )
    if rep.skipped:
        print("\nSkipped rows: " + "; ".join(f"{n} {why}" for why, n in rep.skipped.items()))
    return 0


# --------------------------------------------------------------------------------------- catalog


def cmd_catalog(args: argparse.Namespace) -> int:
    cat = load_catalog()
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
                f"{w.params / 1e6:,.1f}M",
                f"{w.flops_per_sample / 1e9:,.2f}",
                f"{w.activation_bytes_per_sample / 1e6:,.1f}",
                w.optimizer,
            ]
            for w in cat.workloads
        ]
        print(
            _table(
                ["workload", "family", "unit", "params", "GFLOPs/sample", "act MB/sample", "optimizer"], rows
            )
        )
    return 0


# ----------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuscaler", description="Cost-aware GPU autoscaling for deep-learning training."
    )
    p.add_argument("--version", action="version", version=f"gpuscaler {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sp = sub.add_parser("plan", help="plan a TrainingJob: cost, time and risk of every way to run it")
    sp.add_argument("file", help="TrainingJob YAML (the same file kubectl apply takes)")
    sp.add_argument("--policy", help="platform policy YAML to apply (one or several policies)")
    sp.add_argument("--namespace", help="namespace whose policies apply (default: the job's, else 'default')")
    sp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sp.add_argument("--plot", metavar="FILE.png", help="draw cost vs time with the chosen plan marked")
    sp.set_defaults(func=cmd_plan)

    se = sub.add_parser("estimate", help="predict memory, step time and throughput of one configuration")
    se.add_argument("--workload", required=True, help="workload id (gpuscaler catalog workloads)")
    se.add_argument("--gpu", required=True, help="GPU id or alias (gpuscaler catalog gpus)")
    se.add_argument("--gpus", type=int, default=1, help="total GPUs (default 1)")
    se.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are spread over (default 1)")
    se.add_argument("--precision", choices=[x.value for x in Precision], default="amp")
    se.add_argument(
        "--batch-per-gpu",
        type=int,
        help="micro-batch per GPU in batch items: images, sequences, sentence pairs (default: largest power of 2 that fits)",
    )
    se.add_argument("--accumulation", type=int, default=1, help="gradient accumulation steps")
    se.add_argument(
        "--channels-last",
        action="store_true",
        help="convolutions in channels-last (NHWC) memory format (default: PyTorch's NCHW)",
    )
    se.add_argument(
        "--data-loader",
        choices=list(DATA_LOADERS),
        default="pytorch",
        help="input pipeline: pytorch DataLoader (default) or NVIDIA dali",
    )
    se.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=0)
    se.add_argument("--activation-checkpointing", action="store_true")
    se.add_argument("--network-gbps", type=float, help="inter-node bandwidth (default: from the catalog)")
    se.add_argument("--json", action="store_true")
    se.set_defaults(func=cmd_estimate)

    sv = sub.add_parser("validate", help="the performance model's fit error on its calibration data")
    sv.add_argument("--json", action="store_true")
    sv.set_defaults(func=cmd_validate)

    sc = sub.add_parser("catalog", help="list GPUs, instance types or workloads")
    sc.add_argument("what", choices=["gpus", "instances", "workloads"])
    sc.set_defaults(func=cmd_catalog)

    for register in _extensions():
        register(sub)
    return p


def _extensions() -> list[Callable[[Any], None]]:
    """Subcommands from modules that need optional dependencies (operator, dev cluster)."""
    regs: list[Callable[[Any], None]] = []
    for module in EXTENSIONS:
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        regs.append(mod.register)
    return regs


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except UnknownIdError as err:
        print(f"gpuscaler: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, JobError, PrecisionUnsupportedError) as err:
        print(f"gpuscaler: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
