"""Observed performance inside the reconcile loop: measure, correct the model, re-plan at a checkpoint.

:class:`gpuscaler.controller.reconcile.Reconciler` calls :meth:`Observer.step` on every tick of a
Running job. The observer:

1. acts on a pending re-plan as soon as the workers report a checkpoint newer than the one known
   when it was decided (annotation ``gpuscaler.io/checkpoint-step``): it plans again with the
   corrected model and, if the move still pays, returns the new plan for the loop to move the gang
   to (the loop restarts the gang from that checkpoint, so no work is lost);
2. on every tick, records the workers' progress (annotation ``gpuscaler.io/progress-samples``,
   always there: the runtime writes it) in ``status.observed.progressPoints``;
3. every ``interval_s`` (after ``warmup_s`` of the gang): with Prometheus configured (a
   :class:`MetricsSource`), reads the job's metrics, compares them with the plan
   (:func:`gpuscaler.observe.assess.assess`) and sets the bottleneck conditions; without it (or
   when it has no throughput for the job), corrects from the progress points
   (:func:`gpuscaler.planner.correction.correct`, after ``min_window_s`` of them). It writes
   ``status.observed`` (the corrected throughput, how sure it is, the efficiency factor per GPU
   type) and the running plan's corrected P(miss deadline) for the work left;
4. when the factor changed or that P(miss) exceeds the job's ``maxDeadlineRisk``, asks the
   planner for the rest with the corrected model and
   :func:`gpuscaler.planner.correction.should_replan` decides; a re-plan waits for a checkpoint
   (step 1): for the deadline, one the loop asks the workers for at once (``checkpoint_now``, the
   spot handshake's request, as the plan's contingency counted); for cost, the next periodic one.
   Hysteresis: the factor changes only beyond the divergence threshold, a move for cost must save
   more than the margin after paying for the restart, and no move comes within ``min_interval_s``
   of the last plan change;
5. a trial plan (``status.plan.trial``, :mod:`gpuscaler.planner.trial`) gets a verdict at every
   corrected estimate instead, with no ``min_interval_s`` wait (:func:`gpuscaler.planner.trial.verdict`):
   kept when the corrected P(miss) is within the limit; a move for the deadline when the corrected
   planner has a plan that meets it; continued while the P(miss) is below one half; else
   ``stopPending``: a checkpoint is asked for at once and, once it is reported, the loop stops the job
   (``stop``: Failed, DeadlineInfeasible). One whose workers report no progress is said to be
   unmeasured, once.

The decisions are the pure functions of :mod:`gpuscaler.planner.correction`, the ones the
simulator's simulated operator calls. Everything the observer decides is in ``status.observed``
and the conditions, so a restarted operator goes on from there. Prometheus being down is reported
in ``status.observed.message``, never fails the job, and the progress annotations carry on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from gpuscaler.api.events import Event, set_condition
from gpuscaler.api.status import ObservedStatus, ProgressSample, TrainingJobStatus
from gpuscaler.catalog import CapacityType, Catalog, UnknownIdError
from gpuscaler.names import ConditionType, EventReason
from gpuscaler.observe.assess import (
    Assessment,
    Expectation,
    JobMetrics,
    ReplanDecision,
    Thresholds,
    assess,
)
from gpuscaler.observe.prometheus import PrometheusError
from gpuscaler.perfmodel.uncertainty import base_log_sigma
from gpuscaler.planner import PlanResult, trial
from gpuscaler.planner.binding import PROBABLY_MEETS
from gpuscaler.planner.correction import (
    MEASURED_LOG_SIGMA_FLOOR,
    CorrectionConfig,
    ProgressPoint,
    correct,
    fallback_for,
    keep_factor,
    plan_option,
    remaining_miss_probability,
    should_replan,
)
from gpuscaler.planner.risk import hourly_rate, over_risk
from gpuscaler.settings import Settings

BOTTLENECKS = ("InputBound", "MemoryBound", "CommunicationBound", "AMPInactive", "MemoryNearFull")
"""Condition types the observer owns."""

class PlanWith(Protocol):
    """Plan the rest of the job (samples, hours and budget left; policy, back-offs bound) with these
    efficiency factors per GPU id; ``without``: offerings left out as well (``(instance type, capacity
    type)``); ``trials``: the job's own ``atRiskLimit`` instead of ``Refuse`` (a next trial)."""

    def __call__(
        self, efficiency: Mapping[str, float], without: frozenset[tuple[str, ...]] = ..., trials: bool = ...
    ) -> PlanResult: ...


MAX_POINTS = 60
"""Progress readings kept in the status (the newest; one is added only when the samples moved)."""
POINTS_PER_WINDOW = 20
"""Readings are kept at least ``min_window_s / POINTS_PER_WINDOW`` apart (a window is measured from
about twenty; more would only grow the status)."""


class MetricsSource(Protocol):
    """What the observer needs from :class:`gpuscaler.observe.prometheus.PrometheusSource`."""

    def job_metrics(
        self, namespace: str, job: str, window_s: float, start: float, rate_window_s: float | None
    ) -> JobMetrics: ...


@dataclass(frozen=True)
class ObserveConfig:
    """The settings the observer reads (from :class:`gpuscaler.settings.Settings`)."""

    interval_s: float = 60.0
    window_s: float = 600.0
    rate_window_s: float = 60.0
    warmup_s: float = 120.0
    margin: float = 0.10
    min_interval_s: float = 1800.0
    restart_s: float = 300.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    min_window_s: float = 120.0
    """Seconds of progress readings before the annotation path corrects the estimate."""

    def correction(self) -> CorrectionConfig:
        """The pure correction's configuration (:mod:`gpuscaler.planner.correction`)."""
        return CorrectionConfig(
            warmup_s=self.warmup_s,
            min_window_s=self.min_window_s,
            divergence=self.thresholds.divergence,
            margin=self.margin,
            restart_s=self.restart_s,
        )


@dataclass(frozen=True)
class JobContext:
    """What the observer needs of the job beyond its status (the loop passes it)."""

    progress_samples: float | None = None
    """The gang's newest ``gpuscaler.io/progress-samples`` (None: none reported yet)."""
    hours_left: float | None = None
    """Hours to the deadline (None: no deadline)."""
    max_deadline_risk: float = 1.0
    """The job's ``constraints.maxDeadlineRisk``."""
    restart_s: float = 300.0
    """The job's ``checkpoint.restartSeconds`` (an interruption's cost in the risk)."""


@dataclass
class ObserveResult:
    """What one observer step wants the loop to do."""

    events: list[Event] = field(default_factory=list)
    """Events to post."""
    replan: PlanResult | None = None
    """Move the gang to this plan now (at a checkpoint)."""
    checkpoint_now: bool = False
    """A re-plan for the deadline was just decided: ask the workers for a checkpoint now
    (``gpuscaler.io/checkpoint-requested``) rather than wait for the next periodic one."""
    stop: str | None = None
    """A trial ended with no plan that meets ``maxDeadlineRisk`` at the measured speed, and the checkpoint
    it asked for is reported: stop the job and fail it with this message (:mod:`gpuscaler.planner.trial`)."""


@dataclass(frozen=True)
class _Look:
    """One look at a Running job, as the re-plan steps read it: the job's status, the newest
    checkpoint, the time, how to plan the rest, and where the look's Events and plan go."""

    st: TrainingJobStatus
    obs: ObservedStatus
    checkpoint_step: int | None
    now: datetime
    plan_with: PlanWith
    out: ObserveResult
    max_risk: float
    """The job's ``constraints.maxDeadlineRisk``."""
    hours_left: float | None = None
    """Hours to the deadline (None: none)."""
    generation: int = 0
    """The job's metadata.generation (for conditions)."""


UNMEASURED_TRIAL_WINDOWS = 3.0
"""A trial is said to be unmeasured after this many correction windows (warm-up plus the least
measuring window) without a measurement."""


def _running_since(st: TrainingJobStatus) -> datetime | None:
    for c in st.conditions:
        if c.type == ConditionType.RUNNING and c.status == "True":
            return c.last_transition_time
    return st.start_time


class Observer:
    """Observed performance of running jobs (see the module docstring)."""

    def __init__(self, source: MetricsSource | None, config: ObserveConfig, catalog: Catalog | None = None) -> None:
        self.source = source
        """Prometheus (None: the progress annotations only)."""
        self.config = config
        self.catalog = catalog

    # ------------------------------------------------------------------------------ entry point

    def step(
        self,
        namespace: str,
        name: str,
        generation: int,
        st: TrainingJobStatus,
        checkpoint_step: int | None,
        now: datetime,
        plan_with: PlanWith,
        job: JobContext | None = None,
    ) -> ObserveResult:
        """One look at a Running job; updates ``st`` in place and returns what the loop must do.

        Args:
            namespace: The job's namespace.
            name: The job's name.
            generation: Its metadata.generation (for conditions).
            st: Its status, updated in place.
            checkpoint_step: The newest checkpoint the workers report.
            now: The time.
            plan_with: Plans the rest of the job with efficiency factors.
            job: Progress, deadline and risk of the job (None: no progress reported, no deadline).

        Returns:
            Events to post and, at a checkpoint with a pending re-plan, the plan to move to.
        """
        out = ObserveResult()
        if st.plan is None:
            return out
        ctx = job or JobContext()
        obs = st.observed if st.observed is not None else ObservedStatus()
        st.observed = obs
        since = _running_since(st)
        if since is not None:
            self._record_progress(obs, ctx.progress_samples, since, now)
        look = _Look(st, obs, checkpoint_step, now, plan_with, out, ctx.max_deadline_risk, ctx.hours_left, generation)
        if obs.replan_pending and self._checkpoint_reached(obs, checkpoint_step) and self._at_checkpoint(look):
            return out
        due = obs.last_assessed is None or (now - obs.last_assessed).total_seconds() >= self.config.interval_s
        if not due or since is None:
            return out
        if (now - since).total_seconds() < self.config.warmup_s:
            obs.message = f"warming up: samples count from {self.config.warmup_s:g}s after the workers started"
            return out
        start = since.timestamp() + self.config.warmup_s
        factor_changed = False
        sigma = MEASURED_LOG_SIGMA_FLOOR
        measured = False
        if self.source is not None:
            obs.last_assessed = now  # queries cost: at most one assessment per interval_s
            try:
                metrics = self.source.job_metrics(namespace, name, self.config.window_s, start, self.config.rate_window_s)
            except PrometheusError as err:
                text = f"Prometheus unavailable: {err}"
                if not obs.message.startswith(text):
                    out.events.append(Event("Warning", EventReason.OBSERVE_FAILED, text))
                obs.message = text
                metrics = None
            if metrics is not None:
                a = self._assess(st, obs, metrics)
                self._record(st, obs, metrics, a, now, generation, out)
                factor_changed = a.corrected
                if a.ratio is not None and metrics.rate is not None:
                    measured = True
                    obs.source = "prometheus"
                    sigma = max(MEASURED_LOG_SIGMA_FLOOR, metrics.rate.spread)
                    obs.corrected_throughput = round(st.plan.throughput / st.plan.efficiency_factor * obs.efficiency_factor, 3)
                    obs.correction_log_sigma = round(sigma, 4)
                    obs.window_seconds = round(metrics.rate.seconds, 1)
        if not measured:
            # pure and cheap: looked at on every tick until the window is covered (a status that
            # does not change is not written), then once per interval_s
            got = self._correct_from_progress(st, obs, since, now, out)
            if got is None:
                self._trial_unmeasured(look, since)
                return out
            obs.last_assessed = now
            factor_changed, sigma = got
        self._after_measuring(look, self._miss_probability(st, obs, sigma, ctx), factor_changed)
        return out

    # ------------------------------------------------------------------------------- progress

    def _record_progress(self, obs: ObservedStatus, samples: float | None, since: datetime, now: datetime) -> None:
        """Keep the gang's progress readings (only those of the gang running since ``since``)."""
        pts = [p for p in obs.progress_points if p.at >= since]
        spacing = self.config.min_window_s / POINTS_PER_WINDOW
        if (
            samples is not None
            and now >= since
            and (not pts or (pts[-1].samples != samples and (now - pts[-1].at).total_seconds() >= spacing))
        ):
            pts.append(ProgressSample(at=now, samples=samples))
        obs.progress_points = pts[-MAX_POINTS:]

    def _correct_from_progress(
        self, st: TrainingJobStatus, obs: ObservedStatus, since: datetime, now: datetime, out: ObserveResult
    ) -> tuple[bool, float] | None:
        """The annotation path: correct the plan's GPU type from the progress points.

        Returns:
            (factor changed, how sure) once the window is covered, else None (message written).
        """
        assert st.plan is not None
        p = st.plan
        prior = p.throughput_log_sigma if p.throughput_log_sigma else base_log_sigma()
        c = correct(
            [ProgressPoint(x.at.timestamp(), x.samples) for x in obs.progress_points],
            gpu_type=p.gpu_type,
            predicted=p.throughput,
            running_since=since.timestamp(),
            prior_log_sigma=prior,
            plan_factor=p.efficiency_factor,
            config=self.config.correction(),
        )
        if self.source is not None and obs.message.startswith("Prometheus unavailable"):
            prefix = obs.message.split("; from the progress annotations: ")[0] + "; from the progress annotations: "
        else:
            prefix = ""
        if not c.ready:  # no figures that move every tick (each change is a status write)
            obs.message = prefix + c.reason
            if c.window_s >= self.config.min_window_s:  # measured but not believed: look again later
                obs.last_assessed = now
            return None
        obs.predicted = round(p.throughput, 3)
        if c.observed is not None:
            obs.throughput = round(c.observed, 3)
            obs.ratio = round(c.observed / p.throughput, 3) if p.throughput > 0 else None
        obs.source = "annotations"
        obs.pods = max(obs.pods, 1)
        obs.corrected_throughput = round(c.throughput, 3)
        obs.correction_log_sigma = round(c.log_sigma, 4)
        obs.window_seconds = round(c.window_s, 1)
        obs.message = prefix + c.reason
        gpu = p.gpu_type
        current = obs.efficiency_by_gpu.get(gpu, p.efficiency_factor)
        changed = not keep_factor(current, c.factor, self.config.thresholds.divergence)
        if changed:
            obs.efficiency_by_gpu = {**obs.efficiency_by_gpu, gpu: round(c.factor, 3)}
            obs.last_corrected = now
            out.events.append(
                Event(
                    "Normal",
                    EventReason.MODEL_CORRECTED,
                    f"{c.reason}: efficiency factor on {gpu} {current:.2f} -> {c.factor:.2f} (from the progress "
                    "annotations; applied when re-planning)",
                )
            )
        obs.efficiency_factor = obs.efficiency_by_gpu.get(gpu, p.efficiency_factor)
        return changed, c.log_sigma

    def _miss_probability(
        self, st: TrainingJobStatus, obs: ObservedStatus, sigma: float, ctx: JobContext
    ) -> float | None:
        """The running plan's corrected P(miss deadline) for the work left (None without a deadline)."""
        assert st.plan is not None
        p = st.plan
        if ctx.hours_left is None:
            obs.deadline_miss_probability = None
            return None
        throughput = p.throughput / p.efficiency_factor * obs.efficiency_factor
        if p.trial and obs.corrected_throughput:
            # a trial is judged by what it measured, not by the factor the hysteresis holds for re-planning
            throughput = obs.corrected_throughput
        rate = 0.0
        if p.capacity_type == CapacityType.SPOT.value and self.catalog is not None:
            try:
                rate = hourly_rate(self.catalog.instance(p.instance_type).interruption_bucket) * p.nodes
            except UnknownIdError:
                rate = hourly_rate(None) * p.nodes
        miss = remaining_miss_probability(
            max(p.total_samples - st.progress.samples, 0.0),
            throughput,
            sigma,
            ctx.hours_left,
            rate_per_h=rate,
            interval_s=float(p.checkpoint_interval_seconds),
            restart_s=ctx.restart_s,
        )
        obs.deadline_miss_probability = round(miss, 4)
        return miss

    # ------------------------------------------------------------------------------- stages

    def _assess(self, st: TrainingJobStatus, obs: ObservedStatus, m: JobMetrics) -> Assessment:
        assert st.plan is not None
        vcpus: int | None = None
        if self.catalog is not None:
            try:
                vcpus = self.catalog.instance(st.plan.instance_type).vcpu
            except UnknownIdError:
                vcpus = None
        e = Expectation(
            predicted=st.plan.throughput,
            plan_factor=st.plan.efficiency_factor,
            current_factor=obs.efficiency_by_gpu.get(st.plan.gpu_type, st.plan.efficiency_factor),
            gpus=st.plan.gpus,
            precision=st.plan.precision,
            vcpus_per_node=vcpus,
            instance_type=st.plan.instance_type,
        )
        t = self.config.thresholds
        return assess(m, e, t)

    def _record(
        self,
        st: TrainingJobStatus,
        obs: ObservedStatus,
        m: JobMetrics,
        a: Assessment,
        now: datetime,
        generation: int,
        out: ObserveResult,
    ) -> None:
        assert st.plan is not None
        gpu = st.plan.gpu_type
        obs.throughput = None if m.throughput is None else round(m.throughput, 3)
        obs.predicted = round(a.predicted, 3)
        obs.ratio = None if a.ratio is None else round(a.ratio, 3)
        obs.gpu_util = None if m.gpu_util is None else round(min(max(m.gpu_util, 0.0), 100.0), 1)
        obs.tensor_active = None if m.tensor_active is None else round(min(max(m.tensor_active, 0.0), 1.0), 3)
        obs.dram_active = None if m.dram_active is None else round(min(max(m.dram_active, 0.0), 1.0), 3)
        obs.memory_used_gb = None if m.memory_used_gb is None else round(m.memory_used_gb, 2)
        obs.memory_used_fraction = (
            None if m.memory_used_fraction is None else round(min(max(m.memory_used_fraction, 0.0), 1.0), 3)
        )
        obs.interconnect_gbs = None if m.interconnect_gbs is None else round(m.interconnect_gbs, 3)
        obs.pods = sum(1 for p in m.pods if p.throughput is not None)
        obs.gpus_seen = m.gpus
        obs.message = a.summary
        if a.corrected:
            before = obs.efficiency_by_gpu.get(gpu, st.plan.efficiency_factor)
            obs.efficiency_by_gpu = {**obs.efficiency_by_gpu, gpu: a.factor}
            obs.last_corrected = now
            out.events.append(
                Event(
                    "Normal",
                    EventReason.MODEL_CORRECTED,
                    f"{a.summary}: efficiency factor on {gpu} {before:.2f} -> {a.factor:.2f} (applied when re-planning)",
                )
            )
        obs.efficiency_factor = obs.efficiency_by_gpu.get(gpu, st.plan.efficiency_factor)
        found = {f.type: f for f in a.findings}
        for f in a.findings:
            was = next((c for c in st.conditions if c.type == f.type), None)
            set_condition(st, f.type, True, f.reason, f.message, now, generation)
            if was is None or was.status != "True":
                out.events.append(Event("Warning", f.type, f.message))
        for c in list(st.conditions):
            if c.type in BOTTLENECKS and c.type not in found and c.status == "True":
                set_condition(st, c.type, False, "NotObserved", f"no longer observed: {a.summary}", now, generation)

    def _decide(self, look: _Look, miss: float) -> tuple[ReplanDecision, PlanResult]:
        p = look.st.plan
        assert p is not None
        result = look.plan_with(dict(look.obs.efficiency_by_gpu))
        key = (p.instance_type, p.nodes, p.capacity_type, p.precision)
        current = next((plan_option(c) for c in result.feasible if plan_option(c).key == key), None)
        best = plan_option(result.chosen) if result.chosen is not None else None
        # already on the fallback: its alternate (the plan's contingency priced that move)
        target = fallback_for(result.fallback, result.alternate, lambda c: plan_option(c).key == key)
        fallback = plan_option(target) if target is not None else None
        # plan_with plans the rest only: the options' costs are the rest's
        decision = should_replan(miss, look.max_risk, current, best, self.config.correction(), fallback=fallback)
        if decision.replan and decision.fallback and target is not None:
            result = replace(result, chosen=target, why=decision.reason)
        return decision, result

    def _consider_replan(self, look: _Look, miss: float) -> None:
        plan, obs = look.st.plan, look.obs
        assert plan is not None
        if obs.replan_pending:
            return
        changed = max(plan.planned_at, obs.last_replan or plan.planned_at)
        if (look.now - changed).total_seconds() < self.config.min_interval_s:
            obs.message += f"; re-plan not considered within {self.config.min_interval_s:g}s of the last plan change"
            return
        decision, _ = self._decide(look, miss)
        if not decision.replan:
            obs.replan_reason = decision.reason
            return
        self._pend(look, decision)

    def _pend(self, look: _Look, decision: ReplanDecision) -> None:
        """A re-plan decided: pending until the checkpoint it waits for (asked for now when urgent)."""
        obs, step = look.obs, look.checkpoint_step
        obs.replan_pending = True
        obs.replan_reason = decision.reason
        obs.replan_after_checkpoint_step = step
        if decision.urgent:
            look.out.checkpoint_now = True
            at = "from the checkpoint asked for now"
        else:
            at = f"after checkpoint step {step}" if step is not None else "at the first checkpoint"
        look.out.events.append(Event("Normal", EventReason.REPLAN_PENDING, f"{decision.reason}; moving {at}"))

    def _after_measuring(self, look: _Look, miss: float | None, factor_changed: bool) -> None:
        """A trial's verdict (:meth:`_end_trial`), else a re-plan considered when the factor changed or
        the corrected P(miss) is over the job's limit."""
        plan, obs = look.st.plan, look.obs
        assert plan is not None
        if plan.trial and miss is not None and not obs.replan_pending:
            self._end_trial(look, miss)
            return
        at_risk = miss is not None and over_risk(miss, look.max_risk)
        if factor_changed or at_risk or plan.efficiency_factor != obs.efficiency_factor:
            self._consider_replan(look, miss or 0.0)

    def _trial_unmeasured(self, look: _Look, since: datetime) -> None:
        """A trial still without a measurement :data:`UNMEASURED_TRIAL_WINDOWS` correction windows after its
        gang started (a runtime that reports no progress): said once, in the Planned condition (reason
        ``TrialUnmeasured``) and a Warning Event. It runs on; nothing judges it."""
        plan, st = look.st.plan, look.st
        assert plan is not None
        waited = (look.now - since).total_seconds()
        if not plan.trial or waited < UNMEASURED_TRIAL_WINDOWS * (self.config.warmup_s + self.config.min_window_s):
            return
        planned = next((c for c in st.conditions if c.type == ConditionType.PLANNED), None)
        if planned is not None and planned.reason == "TrialUnmeasured":
            return
        why = (f"trial not measured after {waited / 60:.0f} min: the workers report no progress "
               f"(gpuscaler.io/progress-samples), so it runs on at its planned P(miss) "
               f"{plan.deadline_miss_probability or 0.0:.1%} > maxDeadlineRisk {look.max_risk:.1%}")  # fmt: skip
        set_condition(st, ConditionType.PLANNED, True, "TrialUnmeasured", why, look.now, look.generation)
        look.out.events.append(Event("Warning", EventReason.TRIAL_UNMEASURED, why))

    def _end_trial(self, look: _Look, miss: float) -> None:
        """The trial's verdict at each corrected estimate (:func:`gpuscaler.planner.trial.verdict`): kept when
        the corrected P(miss) of the rest is within the limit; a move for the deadline (from a checkpoint
        asked for at once) when the corrected planner has a plan that meets it; continued while the
        deadline would probably be met; else the job stops."""
        plan, obs = look.st.plan, look.obs
        assert plan is not None
        rate = obs.corrected_throughput or plan.throughput / plan.efficiency_factor * obs.efficiency_factor
        measured = f"measured {rate:,.1f}/s"
        decision = None
        if over_risk(miss, look.max_risk):
            decision, result = self._decide(look, miss)
        can_move = decision is not None and decision.replan and not decision.fallback and result.chosen is not None
        said = trial.verdict(miss, look.max_risk, can_move)
        if said is trial.Verdict.KEEP:
            plan.trial = False
            obs.replan_reason = f"trial kept: {measured}, P(miss) {miss:.1%} <= maxDeadlineRisk {look.max_risk:.1%}"
            look.out.events.append(Event("Normal", EventReason.TRIAL_KEPT, obs.replan_reason))
            set_condition(look.st, ConditionType.PLANNED, True, "TrialKept", f"{plan.summary}: {obs.replan_reason}",
                          look.now, look.generation)  # fmt: skip
            return
        if said is trial.Verdict.MOVE:
            assert decision is not None
            self._pend(look, decision)  # no min_interval_s wait: the trial's verdict is due now
            return
        if said is trial.Verdict.CONTINUE:
            self._continue_trial(look, miss, measured)
            return
        need = max(plan.total_samples - look.st.progress.samples, 0.0) / rate / 3600.0 if rate > 0 else math.inf
        left = f", {look.hours_left:.2f} h are left" if look.hours_left is not None else ""
        ended = (
            f"trial ended: {measured}, at which the rest takes {need:.2f} h{left}: P(miss) {miss:.1%} >= "
            f"{PROBABLY_MEETS:.0%} (the deadline would probably be missed; maxDeadlineRisk {look.max_risk:.1%}), "
            "and no plan meets the limit under the corrected model"
        )
        # stop (or go on to the next trial) from a checkpoint asked for now (the first one when none was reported
        # yet), as a move for the deadline does: the trial's window is shorter than any periodic interval
        obs.tried_gpu_types = sorted({*obs.tried_gpu_types, plan.gpu_type})
        obs.replan_pending = True
        obs.replan_after_checkpoint_step = look.checkpoint_step
        look.out.checkpoint_now = True
        nxt = self._next_trial(look)
        if nxt is not None and nxt.chosen is not None:
            obs.next_trial_pending = True
            obs.replan_reason = (f"{ended}; a next trial on a GPU type not tried yet "
                                 f"({', '.join(obs.tried_gpu_types)} tried): {nxt.chosen.label}")  # fmt: skip
            obs.message = f"{obs.replan_reason}; moving from the checkpoint asked for now"
            look.out.events.append(Event("Normal", EventReason.REPLAN_PENDING, obs.message))
            return
        obs.stop_pending = True
        obs.replan_reason = (f"{ended}. To go on, extend the deadline and create the job again on the same "
                             "checkpoint directory: it resumes from there")  # fmt: skip
        obs.message = f"{obs.replan_reason}; stopping at the checkpoint asked for now"

    def _next_trial(self, look: _Look) -> PlanResult | None:
        """The rest planned as the next trial: with the job's ``atRiskLimit``, every offering of the GPU types
        tried so far left out (:func:`gpuscaler.planner.trial.offer` picks on the others); None when it plans
        nothing or cannot tell the offerings of a GPU type (no catalog)."""
        if self.catalog is None:
            return None
        tried = set(look.obs.tried_gpu_types)
        without = frozenset((i.name, cap.value) for i in self.catalog.instances if i.gpu_id in tried
                            for cap in CapacityType)  # fmt: skip
        result = look.plan_with(dict(look.obs.efficiency_by_gpu), without, True)
        return result if result.chosen is not None else None

    def _start_next_trial(self, look: _Look) -> None:
        """At the checkpoint a next trial waited for: plan it again from there and move (``replan``), or stop
        when there is none now (``stopPending``, acted on at once)."""
        result = self._next_trial(look)
        if result is None:
            look.obs.stop_pending = True
            look.obs.replan_reason = f"{look.obs.replan_reason}; no next trial at the checkpoint"
            return
        self._move(look, result)

    def _continue_trial(self, look: _Look, miss: float, measured: str) -> None:
        """A measured trial that would probably meet the deadline, not yet within the limit: it runs on, judged
        again at each corrected estimate. Said once in the Planned condition (reason ``TrialContinued``) and an
        Event; the current figure is in ``status.observed``."""
        plan, st = look.st.plan, look.st
        assert plan is not None
        why = (f"trial measuring on: {measured}, P(miss) {miss:.1%} > maxDeadlineRisk {look.max_risk:.1%} but "
               f"< {PROBABLY_MEETS:.0%}; kept once within the limit, stopped at a checkpoint if it reaches "
               f"{PROBABLY_MEETS:.0%}")  # fmt: skip
        look.obs.replan_reason = why
        planned = next((c for c in st.conditions if c.type == ConditionType.PLANNED), None)
        if planned is not None and planned.reason == "TrialContinued":
            return
        set_condition(st, ConditionType.PLANNED, True, "TrialContinued", f"{plan.summary}: {why}", look.now,
                      look.generation)  # fmt: skip
        look.out.events.append(Event("Normal", EventReason.TRIAL_CONTINUED, why))

    def _at_checkpoint(self, look: _Look) -> bool:
        """The checkpoint a pending decision waited for is there: the next trial, the trial's stop or the move.
        True when the step ends here (a stop or a move)."""
        obs, out = look.obs, look.out
        if obs.next_trial_pending:  # a trial that would miss: the next one, planned again from this checkpoint
            obs.next_trial_pending = False
            self._start_next_trial(look)
            if out.replan is not None:
                return True
        if obs.stop_pending:  # a trial that ended: the checkpoint it asked for is there
            obs.replan_pending = obs.stop_pending = False
            out.stop = f"{obs.replan_reason}; stopped at checkpoint step {look.checkpoint_step}"
            return True
        self._act_on_pending(look)
        return out.replan is not None

    def _checkpoint_reached(self, obs: ObservedStatus, checkpoint_step: int | None) -> bool:
        if checkpoint_step is None:
            return False
        return obs.replan_after_checkpoint_step is None or checkpoint_step > obs.replan_after_checkpoint_step

    def _act_on_pending(self, look: _Look) -> None:
        obs = look.obs
        decision, result = self._decide(look, obs.deadline_miss_probability or 0.0)
        obs.replan_reason = decision.reason
        if not decision.replan or result.chosen is None:
            obs.replan_pending = False
            obs.replan_after_checkpoint_step = None
            said = f"at checkpoint step {look.checkpoint_step}: {decision.reason}"
            look.out.events.append(Event("Normal", EventReason.REPLAN_CANCELLED, said))
            return
        self._move(look, result)

    def _move(self, look: _Look, result: PlanResult) -> None:
        """At the checkpoint a pending move waited for: the loop moves the gang to ``result`` (Event
        ``Replanned``, with ``replanReason``)."""
        obs = look.obs
        obs.replan_pending = False
        obs.replan_after_checkpoint_step = None
        obs.last_replan = look.now
        obs.replans += 1
        look.out.replan = result
        look.out.events.append(Event("Normal", EventReason.REPLANNED,
                                     f"at checkpoint step {look.checkpoint_step}: {obs.replan_reason}"))  # fmt: skip


def from_settings(settings: Settings, catalog: Catalog | None = None) -> Observer:
    """The operator's observer: from the progress annotations always, and from Prometheus when
    ``settings.prometheus_url`` is set and the ``observe`` extra (prometheus-api-client) is installed."""
    source: MetricsSource | None = None
    if settings.prometheus_url:
        try:
            from gpuscaler.observe.prometheus import PrometheusSource

            source = PrometheusSource(
                settings.prometheus_url,
                timeout_s=settings.observe_query_timeout_s,
                dcgm_pod_label=settings.dcgm_pod_label,
                dcgm_namespace_label=settings.dcgm_namespace_label,
            )
        except ImportError:
            source = None
    config = ObserveConfig(
        interval_s=settings.observe_interval_s,
        window_s=settings.observe_window_s,
        rate_window_s=settings.observe_rate_window_s,
        warmup_s=settings.observe_warmup_s,
        margin=settings.replan_margin,
        min_interval_s=settings.replan_min_interval_s,
        restart_s=settings.replan_restart_s,
        thresholds=Thresholds(divergence=settings.observe_divergence),
        min_window_s=settings.correction_min_window_s,
    )
    return Observer(source, config, catalog)
