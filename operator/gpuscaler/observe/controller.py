"""Observed performance inside the reconcile loop: assess, correct the model, re-plan at a checkpoint.

:class:`gpuscaler.handlers.reconcile.Reconciler` calls :meth:`Observer.step` on every tick of a
Running job. The observer:

1. acts on a pending re-plan as soon as the workers report a checkpoint newer than the one known
   when it was decided (annotation ``gpuscaler.io/checkpoint-step``): it plans again with the
   corrected model and, if the move still pays, returns the new plan for the loop to move the gang
   to (the loop restarts the gang from that checkpoint, so no work is lost);
2. every ``interval_s`` (after ``warmup_s`` of the gang), reads the job's metrics from the
   :class:`MetricsSource` (Prometheus), compares them with the plan
   (:func:`gpuscaler.observe.assess.assess`), writes ``status.observed``, sets the bottleneck
   conditions, and, when the efficiency factor changed, asks the planner whether another plan is
   now cheaper by ``margin`` (:func:`~gpuscaler.observe.assess.decide_replan`); if so it marks a
   re-plan pending. Hysteresis: the factor changes only beyond the divergence threshold, a move
   must save more than the margin after paying for the restart, and no move comes within
   ``min_interval_s`` of the last plan change.

Everything it decides is in ``status.observed`` and the conditions, so a restarted operator goes on
from there. Prometheus being down is reported in ``status.observed.message``, never fails the job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from gpuscaler.api.status import Condition, ObservedStatus, TrainingJobStatus
from gpuscaler.catalog import Catalog, UnknownIdError
from gpuscaler.observe.assess import (
    Assessment,
    Expectation,
    JobMetrics,
    PlanOption,
    ReplanDecision,
    Thresholds,
    assess,
    decide_replan,
)
from gpuscaler.observe.prometheus import PrometheusError
from gpuscaler.planner import Candidate, PlanResult
from gpuscaler.settings import Settings

BOTTLENECKS = ("InputBound", "MemoryBound", "CommunicationBound", "AMPInactive", "MemoryNearFull")
"""Condition types the observer owns."""

PlanWith = Callable[[Mapping[str, float]], PlanResult]
"""Plan the job again with these efficiency factors per GPU id (deadline, policy, back-offs bound)."""


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


@dataclass
class ObserveResult:
    """What one observer step wants the loop to do."""

    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) Events to post."""
    replan: PlanResult | None = None
    """Move the gang to this plan now (at a checkpoint)."""


def _set_condition(st: TrainingJobStatus, ctype: str, status: bool, reason: str, message: str, now: datetime, generation: int) -> None:
    value = "True" if status else "False"
    for i, c in enumerate(st.conditions):
        if c.type == ctype:
            st.conditions[i] = Condition(
                type=ctype,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=now if c.status != value else c.last_transition_time,
                observed_generation=generation,
            )
            return
    st.conditions.append(
        Condition(
            type=ctype, status=value, reason=reason, message=message, last_transition_time=now, observed_generation=generation
        )
    )


def _running_since(st: TrainingJobStatus) -> datetime | None:
    for c in st.conditions:
        if c.type == "Running" and c.status == "True":
            return c.last_transition_time
    return st.start_time


def _option(c: Candidate) -> PlanOption:
    return PlanOption(
        key=(c.instance.name, c.nodes, c.capacity.value, c.precision.value),
        label=c.label,
        usd_per_hour=c.usd_per_hour,
        expected_cost_usd=c.expected_cost_usd,
        expected_hours=c.expected_hours,
    )


class Observer:
    """Observed performance of running jobs (see the module docstring)."""

    def __init__(self, source: MetricsSource, config: ObserveConfig, catalog: Catalog | None = None) -> None:
        self.source = source
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
    ) -> ObserveResult:
        """One look at a Running job; updates ``st`` in place and returns what the loop must do."""
        out = ObserveResult()
        if st.plan is None:
            return out
        obs = st.observed if st.observed is not None else ObservedStatus()
        st.observed = obs
        if obs.replan_pending and self._checkpoint_reached(obs, checkpoint_step):
            self._act_on_pending(st, obs, checkpoint_step, now, plan_with, out)
            if out.replan is not None:
                return out
        due = obs.last_assessed is None or (now - obs.last_assessed).total_seconds() >= self.config.interval_s
        since = _running_since(st)
        if not due or since is None:
            return out
        if (now - since).total_seconds() < self.config.warmup_s:
            obs.message = f"warming up: samples count from {self.config.warmup_s:g}s after the workers started"
            return out
        start = since.timestamp() + self.config.warmup_s
        obs.last_assessed = now
        try:
            metrics = self.source.job_metrics(namespace, name, self.config.window_s, start, self.config.rate_window_s)
        except PrometheusError as err:
            text = f"Prometheus unavailable: {err}"
            if obs.message != text:
                out.events.append(("Warning", "ObserveFailed", text[:1000]))
            obs.message = text
            return out
        a = self._assess(st, obs, metrics)
        self._record(st, obs, metrics, a, now, generation, out)
        if a.corrected or st.plan.efficiency_factor != obs.efficiency_factor:
            self._consider_replan(st, obs, checkpoint_step, now, plan_with, out)
        return out

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
                (
                    "Normal",
                    "ModelCorrected",
                    f"{a.summary}: efficiency factor on {gpu} {before:.2f} -> {a.factor:.2f} (applied when re-planning)",
                )
            )
        obs.efficiency_factor = obs.efficiency_by_gpu.get(gpu, st.plan.efficiency_factor)
        found = {f.type: f for f in a.findings}
        for f in a.findings:
            was = next((c for c in st.conditions if c.type == f.type), None)
            _set_condition(st, f.type, True, f.reason, f.message, now, generation)
            if was is None or was.status != "True":
                out.events.append(("Warning", f.type, f.message[:1000]))
        for c in list(st.conditions):
            if c.type in BOTTLENECKS and c.type not in found and c.status == "True":
                _set_condition(st, c.type, False, "NotObserved", f"no longer observed: {a.summary}", now, generation)

    def _decide(self, st: TrainingJobStatus, obs: ObservedStatus, plan_with: PlanWith) -> tuple[ReplanDecision, PlanResult]:
        assert st.plan is not None
        result = plan_with(dict(obs.efficiency_by_gpu))
        p = st.plan
        key = (p.instance_type, p.nodes, p.capacity_type, p.precision)
        current = next((_option(c) for c in result.feasible if _option(c).key == key), None)
        best = _option(result.chosen) if result.chosen is not None else None
        remaining = 1 - st.progress.percent / 100
        return decide_replan(current, best, remaining, self.config.restart_s, self.config.margin), result

    def _consider_replan(
        self,
        st: TrainingJobStatus,
        obs: ObservedStatus,
        checkpoint_step: int | None,
        now: datetime,
        plan_with: PlanWith,
        out: ObserveResult,
    ) -> None:
        assert st.plan is not None
        if obs.replan_pending:
            return
        changed = max(st.plan.planned_at, obs.last_replan or st.plan.planned_at)
        if (now - changed).total_seconds() < self.config.min_interval_s:
            obs.message += f"; re-plan not considered within {self.config.min_interval_s:g}s of the last plan change"
            return
        decision, _ = self._decide(st, obs, plan_with)
        if not decision.replan:
            obs.replan_reason = decision.reason
            return
        obs.replan_pending = True
        obs.replan_reason = decision.reason
        obs.replan_after_checkpoint_step = checkpoint_step
        at = f"after checkpoint step {checkpoint_step}" if checkpoint_step is not None else "at the first checkpoint"
        out.events.append(("Normal", "ReplanPending", f"{decision.reason}; moving {at}"[:1000]))

    def _checkpoint_reached(self, obs: ObservedStatus, checkpoint_step: int | None) -> bool:
        if checkpoint_step is None:
            return False
        return obs.replan_after_checkpoint_step is None or checkpoint_step > obs.replan_after_checkpoint_step

    def _act_on_pending(
        self,
        st: TrainingJobStatus,
        obs: ObservedStatus,
        checkpoint_step: int | None,
        now: datetime,
        plan_with: PlanWith,
        out: ObserveResult,
    ) -> None:
        decision, result = self._decide(st, obs, plan_with)
        obs.replan_pending = False
        obs.replan_after_checkpoint_step = None
        obs.replan_reason = decision.reason
        if not decision.replan or result.chosen is None:
            out.events.append(("Normal", "ReplanCancelled", f"at checkpoint step {checkpoint_step}: {decision.reason}"[:1000]))
            return
        obs.last_replan = now
        obs.replans += 1
        out.replan = result
        out.events.append(
            ("Normal", "Replanned", f"at checkpoint step {checkpoint_step}: {decision.reason}"[:1000])
        )


def from_settings(settings: Settings, catalog: Catalog | None = None) -> Observer | None:
    """The operator's observer, or None when ``settings.prometheus_url`` is unset or the
    ``observe`` extra (prometheus-api-client) is not installed."""
    if not settings.prometheus_url:
        return None
    try:
        from gpuscaler.observe.prometheus import PrometheusSource

        source = PrometheusSource(
            settings.prometheus_url,
            timeout_s=settings.observe_query_timeout_s,
            dcgm_pod_label=settings.dcgm_pod_label,
            dcgm_namespace_label=settings.dcgm_namespace_label,
        )
    except ImportError:
        return None
    config = ObserveConfig(
        interval_s=settings.observe_interval_s,
        window_s=settings.observe_window_s,
        rate_window_s=settings.observe_rate_window_s,
        warmup_s=settings.observe_warmup_s,
        margin=settings.replan_margin,
        min_interval_s=settings.replan_min_interval_s,
        restart_s=settings.replan_restart_s,
        thresholds=Thresholds(divergence=settings.observe_divergence),
    )
    return Observer(source, config, catalog)
