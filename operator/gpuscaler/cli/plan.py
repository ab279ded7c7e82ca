"""``gpuscaler plan``: plan a TrainingJob file; the plan as text, JSON (:func:`plan_to_dict`) or a plot."""

from __future__ import annotations

import argparse
import io
import sys
import textwrap
from typing import Any

from gpuscaler import capacity_cli
from gpuscaler import prices_cli as pc
from gpuscaler.catalog import CapacityType
from gpuscaler.cli.common import EXIT_INFEASIBLE, _load_policy, _money, _table, load_job
from gpuscaler.inputs import to_json, write_output
from gpuscaler.planner import PlanResult, plan
from gpuscaler.planner.profile_docs import load_profiles
from gpuscaler.planner.profiles import ProfileStore


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
        "trial": result.trial,
        "chosen": result.chosen.to_dict(result.profiles) if result.chosen else None,
        "why": result.why,
        "pareto": [c.to_dict(result.profiles) for c in result.pareto],
        "rejected": [
            {
                "instanceType": r.instance,
                "capacityType": r.capacity,
                "zone": r.zone,
                "category": r.category,
                "reason": r.reason,
            }
            for r in result.rejected
        ],
        "hints": result.hints,
        "binding": result.binding.to_dict() if result.binding is not None else None,
        "closest": [c.to_dict() for c in result.closest],
        "caveats": result.caveats,
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
        out.append(f"{'Trial' if result.trial else 'Chosen'}: {c.label}")
        out.append(f"  why: {result.why}")
        if result.trial:  # what the trial stands in for: the refusal, with its rule and closest plans
            out += [f"  - {h}" for h in result.hints]
        out.append(
            f"  micro-batch {c.micro_batch} x {c.accumulation} accumulation x {c.gpus} GPUs = {job.global_batch}"
            + (" | activation checkpointing" if c.activation_checkpointing else "")
            + (f" | ZeRO-{c.zero_stage}" if c.zero_stage else "")
        )
        out.append(
            f"  {e.throughput:,.1f} {e.unit}/s" + (f" ({c.throughput_source})" if result.profiles else "")
            + f", step {e.step_time_s * 1000:,.1f} ms, "
            f"{e.memory_per_gpu_gb:.1f} GB/GPU of {e.memory.capacity / 1e9:.1f} usable, scaling efficiency "
            f"{e.scaling_efficiency:.0%}, bound by {e.bottleneck} ({e.precision_used})"
        )
        out.append(
            f"  expected {c.expected_hours:.2f} h, {_money(c.expected_cost_usd)} at {_money(c.usd_per_hour)}/h; "
            f"checkpoint every {c.outlook.interval_s / 60:.0f} min ({c.checkpoint_write_s:.0f} s each)"
            + (f"; {c.outlook.interruptions:.2f} interruptions expected" if c.capacity is CapacityType.SPOT else "")
        )
        out.append(f"  price: {pc.price_note(c.price_source, c.price_date)}")
        band = c.band
        out.append(
            f"  P50 {c.expected_hours:.2f} h, {_money(c.expected_cost_usd)}; P90 {c.p90_hours:.2f} h, "
            f"{_money(c.p90_cost_usd)} (the model's throughput error, interruptions at their expectation)"
        )
        risk = (
            [f"P(miss deadline) {c.outlook.deadline_miss_probability:.1%} with interruptions and model error"]
            if job.deadline_h is not None
            else []
        )
        if band is not None:
            risk.insert(
                0,
                f"throughput P10-P90 {band.p10:,.1f}-{band.p90:,.1f} {e.unit}/s "
                + f"({'measured' if c.prior and c.prior.exact else 'model error'} sigma {band.log_sigma:.2f}"
                + (f": {', '.join(band.reasons)}" if band.reasons else "")
                + ")",
            )
        if risk:
            out.append("  " + "; ".join(risk))
        if c.contingency is not None:
            out.append(f"  contingency: {c.contingency.sentence(e.unit)}")
        for caveat in result.caveats:
            out.append(f"  caveat: {caveat}")
        out += capacity_cli.segment_lines(c)
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
                f"{p.p90_hours:.2f}",
                _money(p.expected_cost_usd),
                f"{p.outlook.deadline_miss_probability:.1%}" if job.deadline_h is not None else "-",
            ]
        )
    out.append(
        _table(
            ["", "plan", "micro x K", f"{job.workload.unit}/s", "GB/GPU", "hours", "P90 h", "cost", "P(miss)"], rows
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
    """Cost vs time of every feasible (or, for an infeasible job, fitting) plan.

    Colour tells the GPU types apart, the marker spot from on-demand; the Pareto front is a dashed
    line, the chosen plan ringed; the deadline and budget are lines labelled with their values; the
    legend sits outside the axes, off the data. An infeasible job's plot says so in its title and
    carries the first hint.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    job = result.job
    pts = result.feasible or result.pareto
    fig, ax = plt.subplots(figsize=(10, 5.5))
    gpus = sorted({p.instance.gpu.id for p in pts})
    colours = plt.get_cmap("tab10" if len(gpus) <= 10 else "tab20")
    markers = {"on-demand": "o", "spot": "^", "reserved": "s", "capacity-block": "D", "flex-start": "v"}
    for k, gpu in enumerate(gpus):
        for cap, marker in markers.items():
            sel = [p for p in pts if p.instance.gpu.id == gpu and p.capacity.value == cap]
            if sel:
                ax.scatter(
                    [p.expected_hours for p in sel], [p.expected_cost_usd for p in sel], marker=marker,
                    color=colours(k % colours.N), alpha=0.6, s=28,
                )  # fmt: skip
        ax.scatter([], [], marker="s", color=colours(k % colours.N), label=gpu)  # legend: colour = GPU type
    for cap, marker in markers.items():
        if any(p.capacity.value == cap for p in pts):
            ax.scatter([], [], marker=marker, color="grey", label=cap)  # legend: marker = capacity type
    if result.pareto:
        ax.plot(
            [p.expected_hours for p in result.pareto],
            [p.expected_cost_usd for p in result.pareto],
            "k--",
            linewidth=1,
            label="Pareto front",
        )
    if result.chosen:
        c = result.chosen
        ax.scatter(
            [c.expected_hours], [c.expected_cost_usd], s=260, facecolors="none", edgecolors="red", linewidths=2,
            label=f"chosen: {c.label}", zorder=5,
        )  # fmt: skip
        ax.annotate(
            f"{c.expected_hours:.1f} h, {_money(c.expected_cost_usd)}", (c.expected_hours, c.expected_cost_usd),
            textcoords="offset points", xytext=(10, -14), color="red", fontsize=8,
        )  # fmt: skip
    if job.deadline_h:
        ax.axvline(job.deadline_h, color="grey", linestyle=":", label=f"deadline {job.deadline_h:,.1f} h")
        ax.annotate(
            f"deadline {job.deadline_h:,.1f} h", (job.deadline_h, 0), xycoords=("data", "axes fraction"),
            xytext=(-4, 4), textcoords="offset points", rotation=90, ha="right", va="bottom", fontsize=8,
            color="dimgrey",
        )  # fmt: skip
    if job.budget_usd:
        ax.axhline(job.budget_usd, color="grey", linestyle="-.", label=f"budget {_money(job.budget_usd)}")
        ax.annotate(
            f"budget {_money(job.budget_usd)}", (1, job.budget_usd), xycoords=("axes fraction", "data"),
            xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=8, color="dimgrey",
        )  # fmt: skip
    if pts:
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("expected hours")
    ax.set_ylabel("expected cost (USD)")
    title = f"{job.name}: {job.workload.id}, cost vs time of {len(pts)} plans"
    if not result.ok:
        title = f"{job.name}: {job.workload.id}: NO FEASIBLE PLAN" + (
            f" (showing the {len(pts)} that fit)" if pts else ""
        )
        why = result.hints[0] if result.hints else result.why
        fig.text(0.01, 0.01, "\n".join(textwrap.wrap(f"Infeasible: {why}", 130)), fontsize=9, color="darkred",
                 va="bottom")  # fmt: skip
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.0 if result.ok else 0.08, 1, 1))
    image = io.BytesIO()
    fig.savefig(image, dpi=120, format="png")
    plt.close(fig)
    write_output(path, image.getvalue(), "--plot")  # checked: a full device is an error, not "written"


def cmd_plan(args: argparse.Namespace) -> int:
    if args.plot:
        import matplotlib  # noqa: F401  (missing: say so before planning, not after printing the plan)
    doc = load_job(args.file)
    catalog = pc.catalog_for(args)
    policy = _load_policy(args.policy, args.namespace or doc.metadata.namespace or "default", catalog)
    profiles = ProfileStore.of(load_profiles(args.profiles)) if args.profiles else None
    result = plan(
        doc.spec, catalog, policy, name=doc.metadata.name, allow_flagged_prices=args.allow_flagged_prices,
        profiles=profiles,
    )
    if args.json:
        print(to_json(plan_to_dict(result)))
    else:
        print(render_plan(result))
    if args.plot:
        plot_plan(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0 if result.ok else EXIT_INFEASIBLE
