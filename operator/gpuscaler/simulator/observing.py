"""The simulated operator's observe-and-correct step: the operator's own code on simulated samples.

The gpuscaler strategy never sees the world's true throughput (:mod:`gpuscaler.simulator.truth`).
Like the operator, it sees the job's samples counter, scraped every ``scrape_s`` with measurement
noise (:class:`~gpuscaler.simulator.cloud.CloudModel`), from ``warmup_s`` after the workers start
for ``window_s``. On those points it runs the operator's code unchanged:

1. :func:`gpuscaler.observe.estimators.robust_rate`: the median-of-windows rate the operator
   computes from a counter;
2. :func:`gpuscaler.observe.assess.assess`: observed vs predicted, and the corrected efficiency
   factor of the GPU type when they differ by more than the divergence threshold (hysteresis);
3. :func:`gpuscaler.observe.assess.decide_replan`: whether moving the rest of the job to the plan
   the corrected planner now picks pays by more than the margin (or the running plan no longer
   meets the job's limits), considered no sooner than ``min_interval_s`` after a plan change; a
   move happens at the next periodic checkpoint, as the operator does it.

The thresholds and windows are the operator's defaults (:class:`gpuscaler.settings.Settings`).
The engine (:mod:`gpuscaler.simulator.engine`) decides *when* to look (once per allocation, after
the window; again when the minimum interval allows a move) and applies the answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuscaler.api import PrecisionName, SpotPolicy
from gpuscaler.catalog import CapacityType
from gpuscaler.observe.assess import (
    Assessment,
    Expectation,
    JobMetrics,
    PlanOption,
    PodMetrics,
    ReplanDecision,
    Thresholds,
    assess,
    decide_replan,
)
from gpuscaler.observe.estimators import Point, robust_rate
from gpuscaler.settings import Settings
from gpuscaler.simulator.planning import CachedPlanner, option, plan_key, with_remaining
from gpuscaler.simulator.strategies import Decision, JobState


def _default(field: str) -> float:
    value = Settings.model_fields[field].default
    assert isinstance(value, int | float)
    return float(value)


@dataclass(frozen=True)
class ObserveRules:
    """The operator's observation settings, as the simulated operator applies them."""

    warmup_s: float
    """Seconds after the workers start before samples count (``observe_warmup_s``)."""
    window_s: float
    """Seconds of samples one assessment reads (``observe_window_s``)."""
    rate_window_s: float
    """Seconds per window of the median-of-windows rate (``observe_rate_window_s``)."""
    thresholds: Thresholds
    """Divergence and steadiness thresholds (``observe_divergence``)."""
    margin: float
    """A move must save more than this share of the remaining cost (``replan_margin``)."""
    min_interval_s: float
    """No move considered within this many seconds of a plan change (``replan_min_interval_s``)."""
    restart_s: float
    """What a move costs in the decision, seconds of the new plan (``replan_restart_s``)."""

    @classmethod
    def operator_defaults(cls) -> ObserveRules:
        """The operator's shipped defaults (not the environment of whoever runs the simulator)."""
        return cls(
            warmup_s=_default("observe_warmup_s"),
            window_s=_default("observe_window_s"),
            rate_window_s=_default("observe_rate_window_s"),
            thresholds=Thresholds(divergence=_default("observe_divergence")),
            margin=_default("replan_margin"),
            min_interval_s=_default("replan_min_interval_s"),
            restart_s=_default("replan_restart_s"),
        )


def progress_points(rate: float, samples0: float, start_s: float, seconds: float, scrape_s: float,
                    noise: Callable[[], float]) -> list[Point]:
    """The samples counter as scraped: ``(seconds, samples)`` every ``scrape_s`` over ``seconds``.

    Args:
        rate: the true samples per second.
        samples0: the counter at ``start_s``.
        start_s: time of the first scrape.
        seconds: how long to scrape.
        scrape_s: the scrape interval.
        noise: draws one interval's relative error.

    Returns:
        The points, first at ``start_s``.
    """
    points = [(start_s, samples0)]
    value, k = samples0, 1
    while k * scrape_s <= seconds + 1e-9:
        value += rate * scrape_s * (1.0 + noise())
        points.append((start_s + k * scrape_s, value))
        k += 1
    return points


def assess_points(points: list[Point], d: Decision, current_factor: float, rules: ObserveRules) -> Assessment:
    """What the operator concludes from ``points`` about the plan of ``d``.

    Args:
        points: the samples counter.
        d: the running decision (its candidate's throughput includes ``d.efficiency``).
        current_factor: the factor known now for the plan's GPU type.
        rules: the operator's settings.

    Returns:
        The operator's assessment (``corrected`` and ``factor`` are what matter here).
    """
    rate = robust_rate(points, rules.rate_window_s)
    cand = d.candidate
    metrics = JobMetrics(pods=[PodMetrics("worker-0", rate, gpus=cand.gpus)],
                         throughput=None if rate is None else rate.rate, rate=rate)
    expectation = Expectation(predicted=cand.estimate.throughput, plan_factor=d.efficiency,
                              current_factor=current_factor, gpus=cand.gpus, precision=cand.precision.value,
                              vcpus_per_node=cand.instance.vcpu, instance_type=cand.instance.name)
    return assess(metrics, expectation, rules.thresholds)


def current_option(st: JobState, planner: CachedPlanner, d: Decision, now_h: float) -> PlanOption | None:
    """The running plan's full-job figures under the corrected model, None when it no longer meets
    the deadline left (or the budget left): the operator's ``current`` in its re-plan decision.
    """
    c = d.candidate
    spec = with_remaining(st.spec, st.remaining_samples, budget_usd=_budget_left(st),
                          spot=SpotPolicy.PREFERRED if c.capacity is CapacityType.SPOT else SpotPolicy.NEVER,
                          constraints={"instance_types": [c.instance.name], "gpu_types": [], "providers": [],
                                       "regions": [], "min_gpus": c.gpus, "max_gpus": c.gpus, "max_nodes": c.nodes,
                                       "precisions": [PrecisionName(c.precision.value)]})
    left = st.deadline_left_h(now_h)
    if left is not None and left <= 0:
        return None
    choice = planner.choose(spec, left, frozenset(), st.name, efficiency=st.efficiency, current=plan_key(c))
    return choice.current


def _budget_left(st: JobState) -> float | None:
    if st.spec.budget_usd is None:
        return None
    return max(st.spec.budget_usd - st.spent_usd, 0.0) or None


def decide_move(current: PlanOption | None, best: Decision | None, rules: ObserveRules) -> ReplanDecision:
    """The operator's :func:`~gpuscaler.observe.assess.decide_replan` on the simulator's plans.

    Both plans are for the samples left (the operator plans the whole job and scales by the share
    left; the same comparison), so the share passed is 1.
    """
    return decide_replan(current, None if best is None else option(best.candidate), 1.0, rules.restart_s,
                         rules.margin)
