"""The operator's Prometheus metrics (``prometheus_client``), served on ``settings.metrics_port``.

``gpuscaler_trainingjobs{phase}``, ``gpuscaler_gpus_in_use``, ``gpuscaler_job_cost_usd{namespace,job}``,
``gpuscaler_cost_usd_total`` (cost so far of the jobs the operator knows),
``gpuscaler_throughput_predicted{namespace,job}``, ``gpuscaler_throughput_observed{namespace,job}``
and ``gpuscaler_efficiency_factor{namespace,job}`` (observed performance, :mod:`gpuscaler.observe`;
:func:`observe_performance`), the counters ``gpuscaler_interruptions_total{namespace,job,signal}``
and ``gpuscaler_lost_steps_total{namespace,job}`` (:func:`observe_interruptions`), histograms of
``gpuscaler_reconcile_duration_seconds`` and ``gpuscaler_planner_latency_seconds``, and the counters
``gpuscaler_plan_cache_hits_total``, ``gpuscaler_reconcile_wakeups_total{source}`` (what woke
jobs: the event-driven loop, :mod:`gpuscaler.controller.wakeups`) and
``gpuscaler_watch_events_total{resource}`` (every watch event handled, whether it woke a job or not). The handlers
call :func:`observe_job` and :func:`observe_interruptions` after every reconcile and
:func:`forget_job` when a job is deleted.
"""

from __future__ import annotations

import contextlib
import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from gpuscaler.api.status import Phase, TrainingJobStatus

JOBS = Gauge("gpuscaler_trainingjobs", "TrainingJobs by phase.", ["phase"])
GPUS = Gauge("gpuscaler_gpus_in_use", "GPUs of jobs whose workers run (Starting, Running, Checkpointing).")
JOB_COST = Gauge("gpuscaler_job_cost_usd", "Cost so far of a TrainingJob, US dollars.", ["namespace", "job"])
COST = Gauge("gpuscaler_cost_usd_total", "Cost so far of all TrainingJobs the operator knows, US dollars.")
RECONCILE = Histogram(
    "gpuscaler_reconcile_duration_seconds",
    "Duration of one reconcile step.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PLANNER = Histogram(
    "gpuscaler_planner_latency_seconds",
    "Duration of one planner call (a plan found in the plan cache is not a call).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
PLAN_CACHE_HITS = Counter(
    "gpuscaler_plan_cache_hits_total", "Plans served from the plan cache (identical planning inputs)."
)
WAKEUPS = Counter(
    "gpuscaler_reconcile_wakeups_total",
    "Watch events that woke a job for a step, by the object that changed (pod, node, trainingjob, policy).",
    ["source"],
)
WATCH_EVENTS = Counter(
    "gpuscaler_watch_events_total",
    "Watch events the operator handled, by resource (pod, node, trainingjob): woken a job or not.",
    ["resource"],
)

THROUGHPUT_PREDICTED = Gauge(
    "gpuscaler_throughput_predicted",
    "Predicted samples/s of a running TrainingJob's plan (status.observed.predicted).",
    ["namespace", "job"],
)
THROUGHPUT_OBSERVED = Gauge(
    "gpuscaler_throughput_observed",
    "Observed samples/s of a TrainingJob from Prometheus (status.observed.throughput).",
    ["namespace", "job"],
)
EFFICIENCY = Gauge(
    "gpuscaler_efficiency_factor",
    "Observed/model efficiency factor of a TrainingJob on its plan's GPU type.",
    ["namespace", "job"],
)

INTERRUPTIONS = Counter(
    "gpuscaler_interruptions_total",
    "Interruptions of a TrainingJob's gang recorded in its status (status.interruptions), by signal "
    "(aws-spot-itn, gke-termination, karpenter-disrupted, annotation, aws-rebalance, node-not-ready, "
    "node-deleted, worker-preempted; worker-deleted: a worker pod deleted under the job).",
    ["namespace", "job", "signal"],
)
LOST_STEPS = Counter(
    "gpuscaler_lost_steps_total",
    "Training steps lost to interruptions (trained again after resuming from a checkpoint), as the "
    "operator adds them to status.lostSteps; a later downward refinement is not subtracted.",
    ["namespace", "job"],
)
PRICES_AGE = Gauge(
    "gpuscaler_prices_age_seconds",
    "Seconds since the live prices in force were read, by kind (on-demand, spot); absent before the first "
    "live copy (docs/prices.md).",
    ["kind"],
)
PRICES_STALE = Gauge(
    "gpuscaler_prices_stale",
    "1 while the prices in force are older than GPUSCALER_PRICES_*_MAX_AGE_S allows (or none is live), else 0.",
)
PRICE_REFRESHES = Counter(
    "gpuscaler_price_refreshes_total", "Price refreshes by outcome (ok, failed).", ["outcome"]
)
UNRECORDED_SIGNAL = "worker-deleted"
"""Signal label of an interruption counted in status.interruptions without a history record."""

_lock = threading.Lock()
_signals: dict[tuple[str, str], set[str]] = {}
_jobs: dict[tuple[str, str], tuple[Phase, int, float]] = {}
_GPU_PHASES = (Phase.STARTING, Phase.RUNNING, Phase.CHECKPOINTING)


def _refresh() -> None:
    counts = dict.fromkeys(Phase, 0)
    gpus = 0
    total = 0.0
    for phase, g, cost in _jobs.values():
        counts[phase] += 1
        total += cost
        if phase in _GPU_PHASES:
            gpus += g
    for phase, n in counts.items():
        JOBS.labels(phase=phase.value).set(n)
    GPUS.set(gpus)
    COST.set(total)


def observe_job(namespace: str, name: str, phase: Phase, gpus: int, cost_usd: float) -> None:
    """Record a job's phase, GPUs and cost after a reconcile."""
    with _lock:
        _jobs[(namespace, name)] = (phase, gpus, cost_usd)
        JOB_COST.labels(namespace=namespace, job=name).set(cost_usd)
        _refresh()


def observe_performance(
    namespace: str, name: str, predicted: float | None, observed: float | None, efficiency: float | None
) -> None:
    """Record a job's predicted and observed throughput (None: not known, the series is removed)."""
    for gauge, value in ((THROUGHPUT_PREDICTED, predicted), (THROUGHPUT_OBSERVED, observed), (EFFICIENCY, efficiency)):
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
        else:
            gauge.labels(namespace=namespace, job=name).set(value)


def new_interruptions(before: TrainingJobStatus, after: TrainingJobStatus) -> tuple[list[str], int]:
    """The signals of the interruptions a reconcile step recorded, and the steps it added as lost.

    Level-based, so idempotent across steps: only what grew from the status read to the status
    written counts (``interruptions``, and ``lostSteps`` upwards). The newest records of
    ``interruptionHistory`` name the signals; a count without a record is :data:`UNRECORDED_SIGNAL`.
    """
    grew = max(after.interruptions - before.interruptions, 0)
    known = {(r.time, r.node, r.signal) for r in before.interruption_history}
    added = [r.signal for r in after.interruption_history if (r.time, r.node, r.signal) not in known][-grew:] if grew else []
    signals = added + [UNRECORDED_SIGNAL] * (grew - len(added))
    return signals, max(after.lost_steps - before.lost_steps, 0)


def observe_interruptions(namespace: str, name: str, before: TrainingJobStatus, after: TrainingJobStatus) -> None:
    """Count the interruptions and lost steps one reconcile step added to a job's status."""
    signals, lost = new_interruptions(before, after)
    if not signals and not lost:
        return
    with _lock:
        for signal in signals:
            INTERRUPTIONS.labels(namespace=namespace, job=name, signal=signal).inc()
            _signals.setdefault((namespace, name), set()).add(signal)
        if lost:
            LOST_STEPS.labels(namespace=namespace, job=name).inc(lost)


def forget_job(namespace: str, name: str) -> None:
    """Drop a deleted job from the metrics."""
    with _lock:
        _jobs.pop((namespace, name), None)
        with contextlib.suppress(KeyError):
            JOB_COST.remove(namespace, name)
        for signal in _signals.pop((namespace, name), set()):
            with contextlib.suppress(KeyError):
                INTERRUPTIONS.remove(namespace, name, signal)
        with contextlib.suppress(KeyError):
            LOST_STEPS.remove(namespace, name)
        observe_performance(namespace, name, None, None, None)
        _refresh()


def serve(port: int) -> None:
    """Serve ``/metrics`` on ``port`` (0 = off)."""
    if port > 0:
        start_http_server(port)
