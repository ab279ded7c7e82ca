"""Early correction: a running job's measured throughput, the corrected estimate, and whether to re-plan.

Pure (no I/O, no clock, no kopf). Called by the operator's observer
(:mod:`gpuscaler.observe.controller`, from the runtime's progress annotations on the worker pods,
or from Prometheus when configured) and by the simulator's simulated operator, so both correct
and re-plan by exactly the same rule:

1. :func:`measure`: from ``(time, cumulative samples)`` points of the running gang, the rate over
   the usable intervals after a warm-up (an interval where the counter went down, a restart from a
   checkpoint, is left out), with its relative standard error from the spread of the interval
   rates.
2. :func:`correct`: after at least ``min_window_s`` of usable points, the efficiency factor
   ``f = measured / model`` per GPU type, as a log-normal posterior: the prior is the model's
   throughput band (``ln f ~ N(ln f_plan, s_model^2)``, :mod:`gpuscaler.perfmodel.uncertainty`),
   the measurement ``ln(rate / model) ~ N(ln f, s_obs^2)`` with
   ``s_obs = max(relative standard error, MEASURED_LOG_SIGMA_FLOOR)``::

       w = s_model^2 / (s_model^2 + s_obs^2)
       ln f_post = (1 - w) ln f_plan + w ln f_measured,    s_post = sqrt(w) s_obs

   ``s_post`` is how sure the correction is; the planner draws a measured GPU's band with it.
3. :func:`remaining_miss_probability`: the running plan's P(miss deadline) for the work left at
   the corrected throughput with ``s_post`` (:func:`gpuscaler.planner.risk.outlook`).
4. :func:`should_replan`: re-plan when that P(miss) exceeds the job's ``maxDeadlineRisk`` and the
   corrected planner has another plan (``urgent``: at a checkpoint the operator asks for at once), or
   when another plan is cheaper for the rest by more than the margin after paying for the move
   (:func:`decide_replan`; at the next periodic checkpoint).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscaler.planner.risk import outlook, over_risk

if TYPE_CHECKING:  # the planner imports this module; a runtime import would be circular
    from gpuscaler.planner.planner import Candidate

MEASURED_LOG_SIGMA_FLOOR = 0.05
"""Least log-space sigma of a measured throughput (assumption): a window of minutes early in a run
differs from the run's average by a few percent (evaluation passes, checkpoint pauses, data-loader
caching after the first epoch), however steady the window itself was."""
MIN_FACTOR = 0.05
MAX_FACTOR = 3.0
"""Bounds of a believable efficiency factor: outside them the measurement, not the model, is wrong
(a runtime counting local instead of global samples is off by the GPU count)."""


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """One reading of a worker's cumulative samples (``gpuscaler.io/progress-samples``)."""

    t: float
    """Seconds (any fixed epoch, e.g. Unix time) when the value was seen."""
    samples: float


@dataclass(frozen=True)
class CorrectionConfig:
    """When a measurement counts and when a re-plan pays (the operator's settings; the simulator's defaults)."""

    warmup_s: float = 120.0
    """Seconds after the gang started running before its points count (compilation, data-loader
    start-up); ``GPUSCALER_OBSERVE_WARMUP_S``."""
    min_window_s: float = 120.0
    """Usable seconds of points needed before the estimate is corrected; ``GPUSCALER_CORRECTION_MIN_WINDOW_S``."""
    min_points: int = 3
    """Fewest points (two intervals) a measurement is made from."""
    divergence: float = 0.15
    """The factor kept for a GPU type changes only when the new one differs by more than this
    fraction (hysteresis); ``GPUSCALER_OBSERVE_DIVERGENCE``."""
    margin: float = 0.10
    """A cheaper plan must save more than this fraction of the rest's cost; ``GPUSCALER_REPLAN_MARGIN``."""
    restart_s: float = 300.0
    """Seconds a move costs at the new plan's price; ``GPUSCALER_REPLAN_RESTART_S``."""


@dataclass(frozen=True, slots=True)
class Measurement:
    """The rate of a samples counter over the usable part of a window."""

    rate: float
    """Samples per second: total increase over total usable seconds."""
    seconds: float
    """Usable seconds."""
    points: int
    """Points it was made from."""
    resets: int
    """Intervals left out because the counter went down (a restart from a checkpoint)."""
    rel_se: float
    """Relative standard error of ``rate`` (0 with fewer than three intervals)."""


@dataclass(frozen=True, slots=True)
class Correction:
    """The corrected estimate of one GPU type for one job."""

    gpu_type: str
    ready: bool
    """False until ``min_window_s`` of usable points were measured (``factor`` is the plan's then)."""
    factor: float
    """Observed / model throughput (the posterior median); what ``plan(efficiency=...)`` takes."""
    log_sigma: float
    """How sure ``factor`` is: the posterior's log-space sigma (the model's band when not ready)."""
    observed: float | None
    """Measured samples/s (None before any measurement)."""
    model: float
    """The model's uncorrected prediction for the running plan, samples/s."""
    window_s: float
    points: int
    reason: str

    @property
    def throughput(self) -> float:
        """The corrected throughput of the running plan, samples/s."""
        return self.model * self.factor


def measure(points: Iterable[ProgressPoint], since: float, warmup_s: float = 0.0) -> Measurement | None:
    """The samples rate of a running gang.

    Args:
        points: Readings, in any order; several at one time keep the last.
        since: When the gang started running (same epoch as the points).
        warmup_s: Points earlier than ``since + warmup_s`` are left out.

    Returns:
        The measurement, or None with fewer than two usable points.
    """
    by_t: dict[float, float] = {}
    for p in points:
        if p.t >= since + warmup_s and math.isfinite(p.t) and math.isfinite(p.samples):
            by_t[p.t] = p.samples
    pts = sorted(by_t.items())
    if len(pts) < 2:
        return None
    secs: list[float] = []
    incs: list[float] = []
    resets = 0
    for (t0, v0), (t1, v1) in itertools.pairwise(pts):
        if v1 < v0:
            resets += 1
            continue
        secs.append(t1 - t0)
        incs.append(v1 - v0)
    total_s = sum(secs)
    if total_s <= 0:
        return None
    rate = sum(incs) / total_s
    rel_se = 0.0
    if len(secs) >= 2 and rate > 0:
        # duration-weighted variance of the interval rates, over the effective number of intervals
        var = sum(s * (i / s - rate) ** 2 for s, i in zip(secs, incs, strict=True)) / total_s
        n_eff = total_s**2 / sum(s * s for s in secs)
        rel_se = math.sqrt(var / max(n_eff - 1.0, 1.0)) / rate
    return Measurement(rate, total_s, len(pts), resets, rel_se)


def posterior(
    prior_factor: float, prior_log_sigma: float, measured_factor: float, measured_log_sigma: float
) -> tuple[float, float]:
    """Combine the model's prior on the factor with a measurement, both log-normal.

    Returns:
        (factor, log_sigma) of the posterior (see the module docstring).
    """
    sp2 = max(prior_log_sigma, 1e-9) ** 2
    so2 = max(measured_log_sigma, 1e-9) ** 2
    w = sp2 / (sp2 + so2)
    mean = (1 - w) * math.log(prior_factor) + w * math.log(measured_factor)
    return math.exp(mean), math.sqrt(w * so2)


def correct(
    points: Iterable[ProgressPoint],
    *,
    gpu_type: str,
    predicted: float,
    running_since: float,
    prior_log_sigma: float,
    plan_factor: float = 1.0,
    config: CorrectionConfig | None = None,
) -> Correction:
    """The corrected estimate of the running plan's GPU type, once enough has been measured.

    Args:
        points: ``(time, cumulative samples)`` readings of the gang (any worker: each counts the
            job's global samples).
        gpu_type: The running plan's GPU id (the factor is kept per GPU type).
        predicted: The plan's predicted throughput, samples/s (it includes ``plan_factor``).
        running_since: When the gang started running.
        prior_log_sigma: The model's band for the plan (its ``log_sigma``), the prior's width.
        plan_factor: The efficiency factor ``predicted`` was computed with (1 = the model as is).
        config: Window and warm-up (defaults: :class:`CorrectionConfig`).

    Returns:
        The correction; ``ready`` False (and the plan's factor) until ``min_window_s`` is covered,
        and when the measured factor is outside ``[MIN_FACTOR, MAX_FACTOR]``.
    """
    cfg = config or CorrectionConfig()
    model = predicted / plan_factor if plan_factor > 0 else predicted
    m = measure(points, running_since, cfg.warmup_s)
    if m is None or m.points < cfg.min_points or m.seconds < cfg.min_window_s or model <= 0:
        have = 0.0 if m is None else m.seconds
        return Correction(
            gpu_type, False, plan_factor, prior_log_sigma, None if m is None else m.rate, model, have,
            0 if m is None else m.points,
            f"measuring: the correction needs {cfg.min_window_s:g} s of progress after a {cfg.warmup_s:g} s warm-up",
        )
    measured = m.rate / model
    if not MIN_FACTOR <= measured <= MAX_FACTOR:
        return Correction(
            gpu_type, False, plan_factor, prior_log_sigma, m.rate, model, m.seconds, m.points,
            f"measured {m.rate:,.1f}/s is {measured:.2f}x the model's {model:,.1f}/s, outside "
            f"[{MIN_FACTOR:g}, {MAX_FACTOR:g}]: the progress count, not the model, is off (a runtime counting "
            "per-GPU instead of global samples?); not corrected",
        )
    s_obs = max(m.rel_se, MEASURED_LOG_SIGMA_FLOOR)
    factor, sigma = posterior(plan_factor, prior_log_sigma, measured, s_obs)
    return Correction(
        gpu_type, True, factor, sigma, m.rate, model, m.seconds, m.points,
        f"measured {m.rate:,.1f}/s over {m.seconds:.0f} s vs model {model:,.1f}/s: factor {factor:.3f} "
        f"(+-{sigma:.0%})",
    )


def remaining_miss_probability(
    remaining_samples: float,
    throughput: float,
    log_sigma: float,
    hours_left: float | None,
    *,
    rate_per_h: float = 0.0,
    interval_s: float = 1800.0,
    restart_s: float = 300.0,
    write_s: float = 0.0,
) -> float:
    """P(miss deadline) of finishing ``remaining_samples`` at ``throughput`` in ``hours_left``.

    ``write_s`` defaults to 0: a throughput measured over a window that spans checkpoints already
    includes their pauses.

    Returns:
        0 without a deadline; else the probability with interruptions and ``log_sigma``.
    """
    if hours_left is None:
        return 0.0
    if throughput <= 0:
        return 1.0
    work_h = max(remaining_samples, 0.0) / throughput / 3600.0
    o = outlook(work_h, rate_per_h, write_s, restart_s, 0.0, max(interval_s, 1.0), hours_left, log_sigma)
    return o.deadline_miss_probability


def keep_factor(current: float, new: float, divergence: float) -> bool:
    """Hysteresis: True when ``new`` is within ``divergence`` of ``current`` (keep the current one)."""
    return abs(new / current - 1) <= divergence if current > 0 else False


# ------------------------------------------------------------------------------------ re-planning


@dataclass(frozen=True)
class PlanOption:
    """A plan as the re-plan decision sees it (numbers from the corrected planner)."""

    key: tuple[str, int, str, str]
    """(instance type, nodes, capacity type, precision): the same key = the same plan."""
    label: str
    usd_per_hour: float
    expected_cost_usd: float
    expected_hours: float


def plan_option(c: Candidate) -> PlanOption:
    """A planner candidate as the decision sees it (the same key = the same plan)."""
    return PlanOption(
        key=(c.instance.name, c.nodes, c.capacity.value, c.precision.value),
        label=c.label,
        usd_per_hour=c.usd_per_hour,
        expected_cost_usd=c.expected_cost_usd,
        expected_hours=c.expected_hours,
    )


@dataclass(frozen=True)
class ReplanDecision:
    """Whether to move the rest of the job, and why."""

    replan: bool
    reason: str
    saving_usd: float = 0.0
    fallback: bool = False
    """The move is the contingency's: to the fallback (:func:`gpuscaler.planner.contingency.fallback`)
    because no plan meets the risk under the corrected model."""
    urgent: bool = False
    """The move is for the deadline (its corrected P(miss) is over the limit): it does not wait for the next
    periodic checkpoint, the operator asks the workers for one at once (the spot handshake's request), as
    the plan's contingency counted (:mod:`gpuscaler.planner.contingency`). A move for cost waits for the
    periodic one (nothing is lost by waiting, and no checkpoint is written for it)."""


def decide_replan(
    current: PlanOption | None,
    best: PlanOption | None,
    remaining_fraction: float,
    restart_s: float,
    margin: float,
) -> ReplanDecision:
    """Whether moving the rest of the job from ``current`` to ``best`` pays.

    Both options are the corrected planner's predictions; the remaining work costs
    ``remaining_fraction`` of them. Moving also pays ``restart_s`` of the new plan's nodes
    (provisioning, start, resume). It pays when the new remaining cost plus the restart is below
    the current remaining cost by more than ``margin`` of it.

    ``current`` None means the running plan is no longer feasible under the corrected model (it
    would miss the deadline or the budget): any feasible ``best`` is taken.
    """
    if best is None:
        return ReplanDecision(False, "no feasible plan under the corrected model")
    if current is not None and best.key == current.key:
        return ReplanDecision(False, f"the running plan {current.label} is still the best")
    left = max(min(remaining_fraction, 1.0), 0.0)
    new = best.expected_cost_usd * left + restart_s / 3600 * best.usd_per_hour
    if current is None:
        return ReplanDecision(
            True,
            f"the running plan no longer meets the job's limits with the corrected model; {best.label} does "
            f"(${new:,.2f} for the rest)",
        )
    cur = current.expected_cost_usd * left
    saving = cur - new
    if saving > margin * cur:
        return ReplanDecision(
            True,
            f"{best.label} costs ${new:,.2f} for the remaining {left:.0%} (restart included) vs ${cur:,.2f} "
            f"on {current.label}: saves ${saving:,.2f} ({saving / cur:.0%} > {margin:.0%} margin)",
            saving,
        )
    return ReplanDecision(
        False,
        f"{best.label} would save ${saving:,.2f} ({(saving / cur if cur > 0 else 0):.0%}), "
        f"not more than the {margin:.0%} margin",
        saving,
    )


def fallback_for(fallback: Candidate | None, alternate: Candidate | None,
                 running: Callable[[Candidate], bool]) -> Candidate | None:  # fmt: skip
    """Where a job goes when it is behind and no plan meets the risk: the planner's ``fallback``, or, when
    the job is already on it (``running``), the fallback's ``alternate`` (the fastest plan on another GPU
    type: the measurement corrected the running type only) once that is sooner than the running plan
    under the corrected model. The move the contingency priced for that plan
    (:class:`gpuscaler.planner.contingency.Recourse`); the operator's observer and the simulated operator
    both ask here. None when neither is another, sooner plan."""
    if fallback is None:
        return None
    if not running(fallback):
        return fallback
    if alternate is None or running(alternate) or alternate.expected_hours >= fallback.expected_hours:
        return None
    return alternate


def should_replan(
    miss_probability: float,
    max_deadline_risk: float,
    current: PlanOption | None,
    best: PlanOption | None,
    config: CorrectionConfig | None = None,
    remaining_fraction: float = 1.0,
    fallback: PlanOption | None = None,
) -> ReplanDecision:
    """The early-correction verdict: re-plan (at a checkpoint asked for at once when the deadline is at
    risk, else at the next periodic one), or keep running.

    Args:
        miss_probability: The running plan's corrected P(miss deadline)
            (:func:`remaining_miss_probability`).
        max_deadline_risk: The job's ``constraints.maxDeadlineRisk``.
        current: The running plan in the corrected planner's result (None: no longer feasible there).
        best: The corrected planner's choice (None: nothing is feasible).
        config: The move's cost (``restart_s``) and the saving a move for cost needs (``margin``).
        remaining_fraction: Share of the options' cost still ahead (1 when they plan the rest only).
        fallback: The contingency's target in the corrected planner's result (its ``fallback``),
            None when there is none or it is the running plan: when the running plan is behind and no
            plan meets the risk, the job moves there, as the plan's contingency said it would
            (:mod:`gpuscaler.planner.contingency`).

    Returns:
        The decision with its reason.
    """
    cfg = config or CorrectionConfig()
    if over_risk(miss_probability, max_deadline_risk):
        risk = f"corrected P(miss deadline) {miss_probability:.1%} > maxDeadlineRisk {max_deadline_risk:.1%}"
        if best is None:
            if fallback is not None and (current is None or fallback.key != current.key):
                return ReplanDecision(
                    True,
                    f"{risk}, and no plan meets it under the corrected model: the contingency moves to the fastest "
                    f"sensible plan, {fallback.label} ({fallback.expected_hours:.2f} h expected)",
                    fallback=True,
                    urgent=True,
                )
            return ReplanDecision(False, f"{risk}, and no plan meets the deadline under the corrected model")
        if current is not None and best.key == current.key:
            return ReplanDecision(False, f"{risk}, but the corrected planner still finds {current.label} best")
        return ReplanDecision(True, f"{risk}: move to {best.label} (${best.expected_cost_usd:,.2f}, "
                                    f"{best.expected_hours:.2f} h expected)", urgent=True)
    return decide_replan(current, best, remaining_fraction, cfg.restart_s, cfg.margin)
