"""The simulated operator's observe-and-correct step: the operator's own code on simulated progress.

The gpuscaler strategy never sees the world's true throughput (:mod:`gpuscaler.simulator.truth`).
Like the operator without Prometheus, it reads the job's samples counter (the runtime's
``gpuscaler.io/progress-samples`` annotation) once per observer tick (``observe_interval_s``), each
interval's increase carrying measurement noise (:class:`~gpuscaler.simulator.cloud.CloudModel`),
keeping the newest readings as the operator keeps them. On those readings it runs the early
correction of :mod:`gpuscaler.planner.correction`, the functions the operator's observer calls:

1. :func:`~gpuscaler.planner.correction.correct`: after the warm-up and ``min_window_s`` of
   readings, the corrected efficiency factor of the GPU type (a posterior between the plan's band
   and the measurement); :func:`~gpuscaler.planner.correction.keep_factor` is the hysteresis;
2. :func:`~gpuscaler.planner.correction.remaining_miss_probability`: the running plan's corrected
   P(miss deadline) for the work left;
3. :func:`~gpuscaler.planner.correction.should_replan`: with the corrected planner's plan for the
   rest and the running plan's figures in the same result, whether to move (deadline at risk, or
   cheaper by more than the margin; behind with no plan meeting the risk: to the contingency's
   fallback, :func:`gpuscaler.planner.contingency.fallback`, where the plan's P(miss) with
   recourse assumed it would go); no move within ``min_interval_s`` of a plan change; a move for
   the deadline (``urgent``) starts from a checkpoint asked for at once, one for cost at the next
   periodic checkpoint.

When a job finishes, :func:`record_profile` does what the operator's profile recorder does: it
measures the last gang's readings with :func:`gpuscaler.planner.profiles.measure_run` (enough
readings, a believable factor, the rate the job achieved by its completion) and folds the run into
the strategy's :class:`~gpuscaler.planner.profiles.ProfileStore` under the job's workload signature
and configuration; the next plans of that workload plan with it.

The settings are the operator's shipped defaults (:class:`gpuscaler.settings.Settings`). The engine
(:mod:`gpuscaler.simulator.engine`) decides when to look: once the window is covered, and again
when the minimum interval allows a move; it applies the answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, Workload
from gpuscaler.planner.correction import (
    Correction,
    CorrectionConfig,
    PlanOption,
    ProgressPoint,
    ReplanDecision,
    correct,
    plan_option,
    remaining_miss_probability,
    should_replan,
)
from gpuscaler.planner.profiles import ProfileKey, ProfileStore, RunMeasurement, measure_run, signature_of
from gpuscaler.planner.risk import hourly_rate
from gpuscaler.settings import Settings
from gpuscaler.simulator.strategies import Decision

MAX_POINTS = 60
"""Progress readings the operator keeps per job (``status.observed.progressPoints``, the newest)."""


def _default(name: str) -> float:
    value = Settings.model_fields[name].default
    assert isinstance(value, int | float)
    return float(value)


@dataclass(frozen=True)
class ObserveRules:
    """The operator's observation settings, as the simulated operator applies them."""

    correction: CorrectionConfig
    """Warm-up, window, divergence, margin, restart (the observer's ``correction()``)."""
    tick_s: float
    """Seconds between two readings of the progress annotation (``observe_interval_s``)."""
    min_interval_s: float
    """No move considered within this many seconds of a plan change (``replan_min_interval_s``)."""

    @classmethod
    def operator_defaults(cls) -> ObserveRules:
        """The operator's shipped defaults (not the environment of whoever runs the simulator)."""
        return cls(
            correction=CorrectionConfig(
                warmup_s=_default("observe_warmup_s"),
                min_window_s=_default("correction_min_window_s"),
                divergence=_default("observe_divergence"),
                margin=_default("replan_margin"),
                restart_s=_default("replan_restart_s"),
            ),
            tick_s=_default("observe_interval_s"),
            min_interval_s=_default("replan_min_interval_s"),
        )

    @property
    def first_look_s(self) -> float:
        """Seconds after the gang starts when the first correction can be made."""
        return self.correction.warmup_s + self.correction.min_window_s


def progress_points(rate: float, samples0: float, since_s: float, until_s: float, tick_s: float,
                    noise: Callable[[], float]) -> list[ProgressPoint]:
    """The progress annotation as the operator reads it: one reading per tick from ``since_s``.

    Args:
        rate: the true samples per second.
        samples0: the counter when the gang started.
        since_s: when the gang started (simulated seconds).
        until_s: now.
        tick_s: the observer's interval.
        noise: draws one interval's relative error.

    Returns:
        The newest :data:`MAX_POINTS` readings.
    """
    points = [ProgressPoint(since_s, samples0)]
    value, k = samples0, 1
    while since_s + k * tick_s <= until_s + 1e-9:
        value += rate * tick_s * (1.0 + noise())
        points.append(ProgressPoint(since_s + k * tick_s, value))
        k += 1
    return points[-MAX_POINTS:]


def correction(points: list[ProgressPoint], d: Decision, since_s: float, rules: ObserveRules) -> Correction:
    """The operator's correction of the running plan's GPU type from ``points``."""
    cand = d.candidate
    return correct(points, gpu_type=cand.instance.gpu_id, predicted=cand.estimate.throughput, running_since=since_s,
                   prior_log_sigma=cand.outlook.log_sigma, plan_factor=d.efficiency, config=rules.correction)


def miss_probability(d: Decision, remaining_samples: float, throughput: float, log_sigma: float,
                     hours_left: float | None, restart_s: float) -> float:
    """The running plan's corrected P(miss deadline) for the work left, as the operator computes it."""
    cand = d.candidate
    rate = hourly_rate(cand.instance.interruption_bucket) * cand.nodes if cand.capacity is CapacityType.SPOT else 0.0
    return remaining_miss_probability(remaining_samples, throughput, log_sigma, hours_left, rate_per_h=rate,
                                      interval_s=d.interval_s or 3600.0, restart_s=restart_s)


def decide_move(miss: float, max_risk: float, current: PlanOption | None, best: Decision | None,
                rules: ObserveRules, fallback: Decision | None = None) -> ReplanDecision:
    """The operator's :func:`~gpuscaler.planner.correction.should_replan` on the simulator's plans
    (both plan the rest only, so the share left is 1), with the contingency's ``fallback`` as the
    operator's observer passes it (None when it is the running plan): a job behind with no plan
    meeting the risk moves there (``ReplanDecision.fallback``)."""
    fb = None if fallback is None else plan_option(fallback.candidate)
    if fb is not None and current is not None and fb.key == current.key:
        fb = None  # already on it
    return should_replan(miss, max_risk, current, None if best is None else plan_option(best.candidate),
                         rules.correction, fallback=fb)


def record_profile(store: ProfileStore, spec: TrainingJobSpec, workload: Workload, d: Decision,
                   points: list[ProgressPoint], since_s: float, completed_s: float, total_samples: float,
                   at: datetime, job: str, rules: ObserveRules) -> RunMeasurement | None:
    """Record a finished run as the operator's profile recorder does; the measurement, or None when none.

    Args:
        store: the profiles (the strategy's, as the operator's namespace store).
        spec: the job's spec (its declared workload is the signature).
        workload: the resolved workload (its id).
        d: the decision of the last gang (its configuration is the profile's key).
        points: the last gang's progress readings, as the operator kept them.
        since_s: when the last gang started training.
        completed_s: when the job finished.
        total_samples: the job's samples.
        at: the finish as a date (the profile's last seen).
        job: the job's name (a run is counted once).
        rules: the operator's correction settings (warm-up, window, readings).
    """
    cand = d.candidate
    got = measure_run(points, since=since_s, completed=completed_s, total_samples=total_samples,
                      model_throughput=cand.estimate.throughput / d.efficiency, at=at, job=job, config=rules.correction)
    if not isinstance(got, RunMeasurement):
        return None
    sig = signature_of(spec.workload, workload.id)
    key = ProfileKey(sig.id, cand.instance.gpu_id, cand.gpus, cand.nodes, cand.micro_batch, cand.accumulation,
                     cand.precision.value)
    store.record(key, got, sig.labels(cand.instance.name, workload.unit))
    return got
