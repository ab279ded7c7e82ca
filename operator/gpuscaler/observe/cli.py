"""``gpuscaler report JOB``: predicted vs observed, cost so far and projected, bottlenecks, plots.

Registered by :mod:`gpuscaler.cli` (``EXTENSIONS``) through :func:`register`. Reads the
TrainingJob through the Kubernetes API (``KUBECONFIG``, else in-cluster) and, when
``--prometheus URL`` or ``GPUSCALER_PROMETHEUS_URL`` is given, the job's live metrics per pod;
``--plot FILE.png`` draws observed vs predicted throughput and cost over the job's life from
Prometheus range queries (matplotlib). Exit codes: 0 shown, 2 the job or Prometheus could not be
read (raised as :class:`gpuscaler.inputs.InputError`; the CLI's ``main`` prints which and why).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuscaler.api.status import TrainingJobStatus
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION
from gpuscaler.inputs import (
    InputError,
    namespace_name,
    object_name,
    output_file,
    positive_float,
    to_json,
    write_output,
)
from gpuscaler.observe.assess import JobMetrics
from gpuscaler.observe.controller import BOTTLENECKS

PLURAL = "trainingjobs"
LIVE_WINDOW_S = 600.0
"""Seconds of metrics the live per-pod table summarises."""


def projected_cost(st: TrainingJobStatus) -> tuple[float | None, float | None]:
    """(hours left, projected total cost) from the observed throughput when known, else the plan's."""
    if st.plan is None:
        return None, None
    if st.phase.finished:
        return 0.0, st.cost_usd
    rate = (st.observed.throughput if st.observed and st.observed.throughput else None) or st.plan.throughput
    if rate <= 0:
        return None, None
    left_h = max(st.plan.total_samples - st.progress.samples, 0.0) / rate / 3600
    return left_h, st.cost_usd + left_h * st.plan.usd_per_hour


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(name: str, namespace: str, st: TrainingJobStatus, live: JobMetrics | None = None) -> str:
    """The report as text."""
    lines = [f"TrainingJob {namespace}/{name}: {st.phase.value}" + (f" - {st.message}" if st.message else "")]
    p = st.plan
    if p is not None:
        lines.append(f"plan        {p.summary}  ${p.usd_per_hour:,.2f}/h  (efficiency factor {p.efficiency_factor:g})")
    o = st.observed
    predicted = (o.predicted if o and o.predicted else None) or (p.throughput if p else None)
    lines.append(
        f"throughput  predicted {_num(predicted)}/s  observed {_num(o.throughput if o else None)}/s  "
        f"ratio {_num(o.ratio if o else None, '{:.0%}')}"
    )
    if o is not None:
        lines.append(
            f"model       efficiency factor {o.efficiency_factor:g} on {p.gpu_type if p else '?'}"
            + (f"  (per GPU: {', '.join(f'{k} {v:g}' for k, v in sorted(o.efficiency_by_gpu.items()))})" if o.efficiency_by_gpu else "")
        )
        if o.corrected_throughput is not None:
            lines.append(
                f"corrected   {o.corrected_throughput:,.1f}/s (sigma {_num(o.correction_log_sigma, '{:.2f}')}, "
                f"{_num(o.window_seconds, '{:.0f}')} s of {o.source or '?'})  P(miss deadline) "
                f"{_num(o.deadline_miss_probability, '{:.1%}')} for the work left"
                + (f" (planned {p.deadline_miss_probability:.1%})" if p and p.deadline_miss_probability is not None else "")
            )
        lines.append(
            f"GPUs        util {_num(o.gpu_util, '{:.0f}%')}  tensor {_num(o.tensor_active, '{:.0%}')}  "
            f"DRAM {_num(o.dram_active, '{:.0%}')}  memory {_num(o.memory_used_gb, '{:.1f} GB')} "
            f"({_num(o.memory_used_fraction, '{:.0%}')})  interconnect {_num(o.interconnect_gbs, '{:.1f} GB/s')}  "
            f"[{o.gpus_seen} GPU(s), {o.pods} pod(s), assessed {o.last_assessed.isoformat() if o.last_assessed else 'never'}]"
        )
        if o.replan_pending:
            lines.append(f"re-plan     pending until a checkpoint: {o.replan_reason}")
        elif o.replans:
            lines.append(f"re-plans    {o.replans}, last {o.last_replan.isoformat() if o.last_replan else '?'}: {o.replan_reason}")
    left_h, total = projected_cost(st)
    lines.append(
        f"cost        so far ${st.cost_usd:,.2f}  projected ${_num(total, '{:,.2f}')}"
        + (f"  (plan said ${p.expected_cost_usd:,.2f})" if p else "")
        + (f"  time left {left_h:.2f} h" if left_h else "")
        + f"  progress {st.progress.percent:g}%"
    )
    found = [c for c in st.conditions if c.type in BOTTLENECKS and c.status == "True"]
    lines.append("bottlenecks " + ("none observed" if not found else ""))
    for c in found:
        lines.append(f"  {c.type} ({c.reason}): {c.message}")
    if live is not None:
        lines.append(f"live (last {LIVE_WINDOW_S:g}s, Prometheus)")
        lines.append(f"  {'pod':<32} {'samples/s':>10} {'GPUs':>5} {'util':>6} {'tensor':>7} {'mem GB':>7}")
        for pm in live.pods:
            lines.append(
                f"  {pm.pod:<32} {_num(pm.throughput.rate if pm.throughput else None):>10} {pm.gpus:>5} "
                f"{_num(pm.gpu_util, '{:.0f}%'):>6} {_num(pm.tensor_active, '{:.0%}'):>7} {_num(pm.memory_used_gb):>7}"
            )
    return "\n".join(lines)


def _read_job(name: str, namespace: str) -> dict[str, Any]:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    try:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (ConfigException, FileNotFoundError):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        api: Any = client.CustomObjectsApi()
        obj: dict[str, Any] = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    except ApiException as err:
        what = "not found" if err.status == 404 else f"HTTP {err.status} {err.reason}"
        raise LookupError(f"TrainingJob {namespace}/{name}: {what}") from err
    except ConfigException as err:
        raise LookupError(f"no cluster to read TrainingJob {namespace}/{name} from: {err} (set KUBECONFIG)") from err
    return obj


def _plot(path: str, name: str, namespace: str, st: TrainingJobStatus, url: str, step_s: float | None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuscaler.observe.prometheus import PrometheusSource, job_selector

    src = PrometheusSource(url)
    end = datetime.now(UTC)
    start = st.start_time or (end - timedelta(hours=1))
    span = max((end - start).total_seconds(), 60.0)
    step = step_s or max(span / 300, 1.0)
    sel = job_selector(namespace, name)
    rate_w = f"{max(int(step * 4), 60)}s"
    observed = src.query_range(f"avg(rate(gpuscaler_runtime_samples_total{{{sel}}}[{rate_w}]))", start, end, step)
    predicted = src.query_range(f'max(gpuscaler_throughput_predicted{{namespace="{namespace}", job="{name}"}})', start, end, step)
    cost = src.query_range(f'max(gpuscaler_job_cost_usd{{namespace="{namespace}", job="{name}"}})', start, end, step)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for series, label in ((observed, "observed"), (predicted, "predicted (operator)")):
        for s in series:
            ax1.plot([datetime.fromtimestamp(t, UTC) for t, _ in s.points], [v for _, v in s.points], label=label)
    if not predicted and st.plan is not None:
        ax1.axhline(st.plan.throughput, linestyle="--", color="gray", label="predicted (plan)")
    ax1.set_ylabel("samples/s")
    ax1.legend(loc="best")
    ax1.set_title(f"{namespace}/{name}: throughput and cost")
    if cost:
        for s in cost:
            ax2.plot([datetime.fromtimestamp(t, UTC) for t, _ in s.points], [v for _, v in s.points], label="cost so far")
    elif st.plan is not None:  # no operator metrics in this Prometheus: the plan's price over the run
        ts = [start + timedelta(seconds=span * i / 50) for i in range(51)]
        ax2.plot(ts, [(t - start).total_seconds() / 3600 * st.plan.usd_per_hour for t in ts], label="cost (plan price x time)")
    ax2.set_ylabel("US$")
    ax2.legend(loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format="png")
    plt.close(fig)
    write_output(path, image.getvalue(), "--plot")  # checked: a full device is an error, not "written"
    return path


def cmd_report(args: argparse.Namespace) -> int:
    try:
        obj = _read_job(args.job, args.namespace)
    except LookupError as err:
        raise InputError(f"report: {err}") from None
    st = TrainingJobStatus.model_validate(obj.get("status") or {})
    url = args.prometheus
    if url is None:
        from gpuscaler.settings import Settings

        url = Settings().prometheus_url
    live: JobMetrics | None = None
    if url:
        from gpuscaler.observe.prometheus import PrometheusError, PrometheusSource

        try:
            live = PrometheusSource(url).job_metrics(
                args.namespace, args.job, LIVE_WINDOW_S, time.time() - LIVE_WINDOW_S, None
            )
            if args.plot:
                print(f"plot written to {_plot(args.plot, args.job, args.namespace, st, url, args.step)}", file=sys.stderr)
        except PrometheusError as err:
            raise InputError(f"report: {err}") from None
    elif args.plot:
        raise InputError("report: --plot needs Prometheus: give --prometheus URL or GPUSCALER_PROMETHEUS_URL")
    if args.json:
        left_h, total = projected_cost(st)
        out = {
            "job": f"{args.namespace}/{args.job}",
            "status": st.model_dump(mode="json", by_alias=True, exclude_none=True),
            "projectedCostUsd": total,
            "hoursLeft": left_h,
        }
        print(to_json(out))
    else:
        print(render(args.job, args.namespace, st, live))
    return 0


def register(sub: Any) -> None:
    """Add ``report`` to the ``gpuscaler`` subcommands."""
    p = sub.add_parser("report", help="a TrainingJob's predicted vs observed performance, cost and bottlenecks")
    p.add_argument("job", type=object_name, help="TrainingJob name")
    p.add_argument("-n", "--namespace", type=namespace_name, default="default")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus to read live metrics from (default: GPUSCALER_PROMETHEUS_URL)")
    p.add_argument("--plot", metavar="FILE.png", type=output_file, help="draw throughput and cost over time (needs Prometheus)")
    p.add_argument("--step", type=positive_float, help="plot resolution in seconds (default: the job's life / 300)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)
