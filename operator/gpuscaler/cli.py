"""The ``gpuscaler`` command line: plan, estimate, validate, catalog, and the operator's commands.

Each subcommand is a thin adapter over the pure layers (catalog, perfmodel, planner). Every command,
the extensions' too, exits with the codes of :data:`EXIT_CODES`: 0 success, 1 an infeasible job
(valid, but no plan meets it; the output says what would), 2 invalid input or usage (the message
names the field or option, the value and what to do; unknown names come with close matches) or a
service it needs failing in a way that may pass, 3 a bug or a broken install. Errors are mapped by
their kind (:class:`gpuscaler.errors.ErrorKind`).
Commands raise; :func:`main` is the one place an error becomes a message and an exit code
(:func:`describe_error`), and under ``--json`` also a JSON error object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from dataclasses import field as _field
from typing import Any

from pydantic import ValidationError

from gpuscaler import __version__, capacity_cli
from gpuscaler import prices_cli as pc
from gpuscaler.api import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_NODES, TrainingJob
from gpuscaler.catalog import (
    CapacityType,
    Catalog,
    CatalogError,
    Precision,
    UnknownIdError,
    Workload,
    load_catalog,
)
from gpuscaler.errors import ErrorKind, GpuscalerError
from gpuscaler.inputs import (
    InputError,
    format_validation,
    iter_fields,
    load_yaml,
    namespace_name,
    output_file,
    positive_float,
    positive_int,
    shown,
    to_json,
    validation_error,
    write_output,
)
from gpuscaler.perfmodel import DATA_LOADERS, ParallelConfig, estimate
from gpuscaler.perfmodel.uncertainty import CrossValidationError, throughput_band
from gpuscaler.planner import PlanResult, plan
from gpuscaler.planner.profile_docs import load_profiles
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.policy import Policy, load_policies, policy_for_namespace

EXTENSIONS = (
    "gpuscaler.devcluster.cli",  # dev-cluster up|down|env|build (local control plane)
    "gpuscaler.operator_cli",  # run, crd (the operator)
    "gpuscaler.policy.cli",  # policy check
    "gpuscaler.simulator.cli",  # simulate
    "gpuscaler.observe.cli",  # report
    "gpuscaler.profiles_cli",  # profiles list|show|export|import|prune
)
"""Modules that add subcommands through ``register(subparsers)``; skipped when not importable."""

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_INFEASIBLE: "infeasible: the job is valid but no plan meets it; the output says what would",
    EXIT_USAGE: "invalid input or usage: the message names the field or option, the value and what to do; "
    "or a service it needs failed in a way that may pass (try again)",
    EXIT_INTERNAL: "internal error: a bug in gpuscaler or a broken install, please report it "
    "(GPUSCALER_DEBUG=1 shows the traceback)",
}
"""The exit codes of every command, as ``gpuscaler --help`` and docs/inputs.md list them."""

EXTRAS = {
    "kopf": "operator",
    "kubernetes": "operator",
    "cryptography": "operator",
    "prometheus_client": "operator",
    "boto3": "aws",
    "botocore": "aws",
    "google": "gcp",
    "prometheus_api_client": "observe",
}
"""Optional packages by the pip extra that installs them (for the "needs ..." message)."""


class UsageError(InputError):
    """Bad input from the user; printed without a traceback, exit 2.

    Attributes:
        usage: the command's usage line, printed after the message on stderr (not in ``--json``).
    """

    usage: str = ""


@dataclass
class Failure:
    """An error as the user sees it: exit code, message, and the fields of the ``--json`` object."""

    code: int
    kind: str
    message: str
    field: str | None = None
    value: str | None = None
    matches: list[str] = _field(default_factory=list)
    problems: list[dict[str, str | None]] = _field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``{"error": ...}`` object printed under ``--json``."""
        body: dict[str, Any] = {"exitCode": self.code, "kind": self.kind, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.value is not None:
            body["value"] = self.value
        if self.matches:
            body["closeMatches"] = self.matches
        if self.problems:
            body["problems"] = self.problems
        return {"error": body}


def describe_error(err: BaseException) -> Failure:
    """The one mapping of errors onto exit codes and messages, for every command.

    A :class:`~gpuscaler.errors.GpuscalerError` maps by its kind: ``INVALID_INPUT`` exit 2 (an
    unknown name with its close matches), ``INFEASIBLE`` exit 1, ``TEMPORARY`` exit 2 (a service
    it needs failed: try again), ``INTERNAL`` exit 3. Of the rest, a pydantic ``ValidationError``,
    a missing optional package, a file error and an input too large to process are the user's to
    fix (exit 2); anything else is a bug (exit 3).

    Args:
        err: what a command raised.

    Returns:
        The failure to print.
    """
    if isinstance(err, GpuscalerError):
        return _describe_domain_error(err)
    if isinstance(err, ValidationError):
        problems = [{"field": loc, "problem": msg, "value": value} for loc, msg, value in iter_fields(err)]
        first = problems[0] if problems else {}
        return Failure(
            EXIT_USAGE, "invalid-input", format_validation(err, "input"), first.get("field"), first.get("value"),
            problems=problems,
        )  # fmt: skip
    if isinstance(err, ModuleNotFoundError):
        top = (err.name or "").split(".")[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'gpuscaler[{extra}]'" if extra else f"pip install {top}"
        return Failure(EXIT_USAGE, "missing-dependency", f"this command needs the Python package {top!r}: {how}")
    if isinstance(err, OSError):
        where = f"{err.filename}: " if err.filename else "writing the output: "  # no file named: stdout
        return Failure(EXIT_USAGE, "io-error", f"{where}{err.strerror or err}", err.filename and str(err.filename))
    if isinstance(err, MemoryError | RecursionError):
        return Failure(EXIT_USAGE, "too-large", "the input is too large or too deeply nested to process")
    return _internal(err)


def _describe_domain_error(err: GpuscalerError) -> Failure:
    if err.kind is ErrorKind.INVALID_INPUT:
        if isinstance(err, UnknownIdError):
            return Failure(EXIT_USAGE, "unknown-name", str(err), err.what, shown(err.value), list(err.matches))
        return Failure(EXIT_USAGE, "invalid-input", str(err), err.field, err.value)
    if err.kind is ErrorKind.INFEASIBLE:
        return Failure(EXIT_INFEASIBLE, "infeasible", str(err), err.field, err.value)
    if err.kind is ErrorKind.TEMPORARY:
        return Failure(EXIT_USAGE, "unavailable", f"{err} (this may pass: try again)", err.field, err.value)
    if isinstance(err, CatalogError | CrossValidationError):  # shipped data files: a broken install
        what = "catalog" if isinstance(err, CatalogError) else "performance model's data"
        return Failure(EXIT_INTERNAL, "broken-install", f"the {what} is broken: {err}; reinstall gpuscaler")
    return _internal(err)


def _internal(err: BaseException) -> Failure:
    return Failure(
        EXIT_INTERNAL,
        "internal-error",
        f"internal error {type(err).__name__}: {str(err)[:300]} (a bug; please report it with the command; "
        "GPUSCALER_DEBUG=1 prints the traceback)",
    )


EXIT_CODES_HELP = "exit codes:\n" + "\n".join(f"  {code}  {what}" for code, what in EXIT_CODES.items())


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors raised as :class:`UsageError` (so ``--json`` gets an error object),
    an unknown choice answered with its close matches, and the exit codes in every ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn
        """Raise the usage error instead of printing and exiting.

        Raises:
            UsageError: always.
        """
        hint = ""
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:
            choices = re.findall(r"'([^']*)'", bad.group(2)) or [c.strip() for c in bad.group(2).split(",")]
            close = difflib.get_close_matches(bad.group(1), choices, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            message = f"invalid choice {shown(bad.group(1))} (choose from {', '.join(choices)})"
        command = self.prog.removeprefix("gpuscaler").strip()
        err = UsageError(f"{command + ': ' if command else ''}{message}{hint}")
        err.usage = self.format_usage().rstrip()
        raise err


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _money(x: float) -> str:
    return f"${x:,.2f}" if x < 100 else f"${x:,.0f}"


def load_job(path: str) -> TrainingJob:
    """Read a TrainingJob YAML file (the same document ``kubectl apply`` takes).

    Raises:
        InputError: unreadable, not YAML (see :mod:`gpuscaler.inputs`), not a TrainingJob, or a field
            the models refuse (the message names each field and its value).
    """
    raw = load_yaml(path, "TrainingJob file")
    if not isinstance(raw, dict) or raw.get("kind") != "TrainingJob":
        raise UsageError(f"{path}: expected a document with kind: TrainingJob")
    try:
        return TrainingJob.model_validate(raw)
    except ValidationError as err:
        raise validation_error(err, path) from None


def _load_policy(path: str | None, namespace: str | None, catalog: Catalog | None = None) -> Policy | None:
    """The policy in force for ``namespace`` from a (possibly multi-document) policy file.

    Raises:
        InputError: the file cannot be read, breaks the schema, or names unknown GPU or instance
            types, providers or regions.
    """
    if path is None:
        return None
    from gpuscaler.policy.cli import unknown_ids

    try:
        policies = load_policies(path)
    except ValidationError as err:
        raise validation_error(err, f"policy {path}") from None
    catalog = catalog or load_catalog()
    errors = [f"policy {p.name}: {e}" for p in policies for e in unknown_ids(p, catalog)]
    if errors:
        raise UsageError(f"policy {path} is invalid:\n  " + "\n  ".join(errors))
    return policy_for_namespace(policies, namespace)


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
        out.append(f"Chosen: {c.label}")
        out.append(f"  why: {result.why}")
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


# -------------------------------------------------------------------------------------- estimate

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


# -------------------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    from gpuscaler.perfmodel import calibration, fitted
    from gpuscaler.perfmodel import memory as mem
    from gpuscaler.planner import decisions

    rep = calibration.report()
    memory = mem.memory_agreement()
    meta = fitted().meta
    cv = calibration.cross_validation()
    if args.json:

        def s(x: calibration.ErrorStats) -> dict[str, float]:
            return {"n": x.n, "mape_pct": round(x.mape, 2), "median_ape_pct": round(x.median, 2)}

        print(
            to_json(
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
                        "baseline": cv.get("baseline", {}),
                        "replicates": cv.get("replicates", {}),
                        "lookup_in_sample": cv.get("lookup_in_sample", {}),
                        "own_parameters_in_sample": cv.get("own_parameters_in_sample", {}),
                    },
                    "skipped": rep.skipped,
                    "calibration": meta,
                    "memory": mem.agreement_json(memory),
                    "decisions": decisions.scores(),
                },
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
    baseline = cv.get("baseline", {}).get("metrics", {})
    replicates = cv.get("replicates", {})
    lookup = cv.get("lookup_in_sample", {})
    own = cv.get("own_parameters_in_sample", {})

    def pct(d: dict[str, Any], key: str) -> str:
        return f"{d[key]['mape'] * 100:.1f}" if isinstance(d.get(key), dict) and d[key].get("n") else "-"

    print("Relative errors (what the planner's choices hinge on), in sample and cross-validated:")
    rows: list[list[object]] = []
    for key, label in labels.items():
        m = cv["metrics"][key]
        fit = in_sample.get(key, rep.overall)
        rows.append(
            [
                label,
                fit.n,
                f"{fit.mape:.1f}",
                m["n"],
                f"{m['mape'] * 100:.1f}",
                f"{m['median_ape'] * 100:.1f}",
                pct(baseline, key),
                f"{pct(own.get('workload', {}), key)} / {pct(own.get('workload_framework', {}), key)}",
                pct(lookup, key),
                pct(replicates, key),
            ]
        )
    print(
        _table(
            [
                "quantity",
                "rows or pairs",
                "fit MAPE %",
                "held out",
                "CV MAPE %",
                "CV median %",
                "baseline CV %",
                "own params %",
                "lookup %",
                "replicates %",
            ],
            rows,
        )
    )
    if baseline:
        print(
            "baseline CV: the same held-out pairs predicted without a model, from the median measured ratio of the\n"
            "fold's training pairs of the same workload and framework (then family), else the spec sheet (bandwidth\n"
            "ratio, no AMP speedup, linear scaling). own params: in sample, the model with every family parameter\n"
            "fitted per workload / per workload and framework: what its terms explain at best, knowing each one's own\n"
            "answer (a held-out row has no parameters of its own). lookup: in sample, each workload and framework's\n"
            "own median ratio; what is left is how ratios move with batch size, GPU count and table. replicates: the\n"
            "same configuration measured twice in the tables differs by this much; against one noisy measurement no\n"
            "model can be expected below about this / sqrt(2)."
        )
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
    if baseline:
        print("\nModel-free baseline, cross-validated MAPE % by scheme (the same held-out pairs):")
        print(
            _table(
                ["scheme", *list(labels)[1:]],
                [
                    [name, *(f"{m[k]['mape'] * 100:.1f} ({m[k]['n']})" for k in list(labels)[1:])]
                    for name, m in cv["baseline"]["schemes"].items()
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
    print("\nMemory against documented configurations (catalog/data/memory_runs.csv; docs/memory-model.md):")
    print("\n".join([_table(mem.MEMORY_TABLE_HEADERS, mem.agreement_rows(memory)), *mem.agreement_misses(memory)]))
    print("\n" + "\n".join(decisions.format_scores(decisions.scores())) + "\n(docs/decision-scores.md)")
    return 0


# --------------------------------------------------------------------------------------- catalog


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


# ----------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gpuscaler", description="Cost-aware GPU autoscaling for deep-learning training.")
    p.add_argument("--version", action="version", version=f"gpuscaler {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sp = sub.add_parser("plan", help="plan a TrainingJob: cost, time and risk of every way to run it")
    sp.add_argument("file", help="TrainingJob YAML (the same file kubectl apply takes)")
    sp.add_argument("--policy", help="platform policy YAML to apply (one or several policies)")
    sp.add_argument("--namespace", type=namespace_name, help="namespace whose policies apply (default: the job's, else 'default')")
    sp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sp.add_argument(
        "--plot", metavar="FILE.png", type=output_file, help="draw cost vs time with the chosen plan marked"
    )
    sp.add_argument(
        "--allow-flagged-prices",
        action="store_true",
        help="plan on spot prices the catalog flags as suspicious (left out by default; shown with a caveat)",
    )
    pc.add_prices_option(sp)
    sp.add_argument("--profiles", metavar="FILE", help="performance profiles (gpuscaler profiles export) as measured priors")
    sp.set_defaults(func=cmd_plan)

    se = sub.add_parser("estimate", help="predict memory, step time and throughput of one configuration")
    se.add_argument("--workload", required=True, help="workload id (gpuscaler catalog workloads)")
    se.add_argument("--gpu", required=True, help="GPU id or alias (gpuscaler catalog gpus)")
    se.add_argument("--gpus", type=positive_int, default=1, help="total GPUs (default 1)")
    se.add_argument("--nodes", type=positive_int, default=1, help="nodes the GPUs are spread over (default 1)")
    se.add_argument("--precision", choices=[x.value for x in Precision], default="amp")
    se.add_argument(
        "--batch-per-gpu",
        type=positive_int,
        help="micro-batch per GPU in batch items: images, sequences, sentence pairs (default: largest power of 2 that fits)",
    )
    se.add_argument("--accumulation", type=positive_int, default=1, help="gradient accumulation steps")
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
    se.add_argument(
        "--network-gbps", type=positive_float, help="inter-node bandwidth (default: from the catalog)"
    )
    se.add_argument("--json", action="store_true")
    pc.add_prices_option(se)
    se.set_defaults(func=cmd_estimate)

    sv = sub.add_parser("validate", help="the performance model's fit error on its calibration data")
    sv.add_argument("--json", action="store_true")
    sv.set_defaults(func=cmd_validate)

    sc = sub.add_parser("catalog", help="list GPUs, instance types or workloads; refresh prices")
    cs = sc.add_subparsers(dest="what", required=True, metavar="WHAT")
    for what in ("gpus", "instances", "workloads"):
        sw = cs.add_parser(what, help=f"list the catalog's {what}")
        sw.add_argument("--json", action="store_true", help="print JSON ({WHAT: [...]}); workloads carry batch_unit")
        if what == "instances":
            pc.add_prices_option(sw)
        sw.set_defaults(func=cmd_catalog)
    pc.register_refresh(cs)
    capacity_cli.register_catalog(cs)

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


MAX_MESSAGE_CHARS = 8000
"""Longest error message printed (a document can break many rules; each value is already shortened)."""


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    with contextlib.suppress(OSError, ValueError):  # no real file descriptor (captured output)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error becomes a message and an exit code of :data:`EXIT_CODES`.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in words
    try:
        args = build_parser().parse_args(words)
        code: int = args.func(args)
        sys.stdout.flush()  # a full or closed stdout fails here, inside the handler, not at exit
        return code
    except SystemExit as stop:  # --help and --version, or a command that exits itself
        return stop.code if isinstance(stop.code, int) else (EXIT_OK if stop.code is None else EXIT_USAGE)
    except BrokenPipeError:  # the reader went away (``| head``): not an error of ours
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        failure = describe_error(err)
        if failure.code == EXIT_INTERNAL and os.environ.get("GPUSCALER_DEBUG"):
            traceback.print_exc()
        try:
            print(f"gpuscaler: {failure.message[:MAX_MESSAGE_CHARS]}", file=sys.stderr)
            if isinstance(err, UsageError) and err.usage:
                print(err.usage, file=sys.stderr)
            if as_json:
                print(to_json(failure.to_dict()), flush=True)
        except OSError:  # stdout gone or full (the message went to stderr)
            _quiet_stdout()
        return failure.code


if __name__ == "__main__":
    sys.exit(main())
