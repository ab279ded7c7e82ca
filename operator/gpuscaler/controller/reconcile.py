"""The TrainingJob reconcile loop: one level-triggered step from (spec, status, observed pods and nodes).

Called every ``reconcile_interval_s`` per unfinished job by :mod:`gpuscaler.handlers.trainingjob`.
Everything it needs is passed in (provider, worker client, planner, clock), so unit tests drive it
with fakes. What it decides lives in the returned status and in the cluster, never in memory, so a
restarted operator resumes where the status says; every create is create-if-absent on a
deterministic name, so a step repeated after a crash makes no duplicates.

Phases (``status.phase``) and what moves them::

    Pending --plan--> Provisioning --all nodes Ready--> Starting --all workers Running--> Running
    Pending (suspend) <--- any active phase when spec.suspend turns true
    Provisioning/Starting --gang timeout--> release, back off the offering, re-plan -> Provisioning
    Running --node notice--> Checkpointing --ack or exit--> Recovering --gang gone--> Provisioning
    Running --worker failed--> Recovering (within backoffLimit) | Failed
    Running --worker preempted (the operator's evidence, see preemption())--> Recovering (an interruption, not a failure)
    Running --all workers Succeeded--> Succeeded; nodes released
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.events import Event, capped, set_condition
from gpuscaler.api.status import (
    Phase,
    PlanStatus,
    TrainingJobStatus,
    UnavailableOffering,
)
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, KIND, parse_duration
from gpuscaler.catalog import CapacityType, Catalog, UnknownIdError
from gpuscaler.cloud import (
    InsufficientCapacityError,
    JobRef,
    NodePoolProvider,
    NodeRequest,
    NodeState,
    node_names,
)
from gpuscaler.cloud.nodes import NODE_DELETED, WORKER_PREEMPTED
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller import preemption as preemption_cost
from gpuscaler.controller import queueing
from gpuscaler.controller.interruptions import Planner
from gpuscaler.controller.policy import Governance, PolicyViolationError
from gpuscaler.controller.prices import PriceLog, Staleness
from gpuscaler.controller.profiles import Recorder
from gpuscaler.controller.windows import window_closing, window_opens_in
from gpuscaler.kube.jobset import jobset_name
from gpuscaler.kube.reports import TrustedReport, trusted_report
from gpuscaler.kube.reports import summary as report_summary
from gpuscaler.kube.workers import (
    PodState,
    WorkerPlan,
    headless_service,
    needs_rendezvous_service,
    uses_worker_account,
    worker_pod,
    worker_rbac,
)
from gpuscaler.names import DO_NOT_DISRUPT_ANNOTATION, ConditionType, EventReason
from gpuscaler.observe.controller import JobContext, Observer
from gpuscaler.perfmodel import PrecisionUnsupportedError
from gpuscaler.planner import JobError, PlanResult, remaining_spec
from gpuscaler.planner.held import held_placement, plan_segments
from gpuscaler.runtime import constants as rc
from gpuscaler.settings import Settings

COST_REFRESH_S = 30.0
"""A job holding nodes is stepped at least this often (its cost, ETA and observed performance move
with time); the step writes cost and ETA alone at most every ``settings.status_refresh_s``
(:func:`status_change`)."""


class WorkerClient(Protocol):
    """What the loop needs from :class:`gpuscaler.kube.client.Workers`."""

    def create_if_absent(self, body: dict[str, Any]) -> bool: ...
    def delete_pod(self, namespace: str, name: str) -> bool: ...
    def delete_service(self, namespace: str, name: str) -> bool: ...
    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...


@dataclass(frozen=True)
class Job:
    """The TrainingJob as the loop sees it."""

    namespace: str
    name: str
    uid: str
    generation: int
    created: datetime
    spec: TrainingJobSpec
    labels: Mapping[str, str] = field(default_factory=dict)
    """The TrainingJob's labels (the ``kueue.x-k8s.io/queue-name`` label names its queue)."""

    @property
    def ref(self) -> JobRef:
        return JobRef(self.namespace, self.name)

    @property
    def owner(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass
class Outcome:
    """What one step decided: the new status and the events to post."""

    status: TrainingJobStatus
    events: list[Event] = field(default_factory=list)
    planned: bool = False
    plan_seconds: float = 0.0
    released: set[str] = field(default_factory=set)
    """Nodes deleted in this step (their cost moved to ``releasedCostUsd``)."""


@dataclass
class LoopConfig:
    """The settings the loop reads: a subset of :class:`gpuscaler.settings.Settings`, where their
    defaults and reasons are (built by :meth:`from_settings`, never spelled again here)."""

    gang_timeout_s: float
    """Seconds to wait for all planned nodes (or workers) before releasing them and re-planning."""
    capacity_backoff_s: float
    """Seconds an offering that ran short of capacity is left out of plans."""
    kueue_quota_fallback: bool
    """Queued jobs: re-plan without an offering whose Kueue flavor has no quota left (queueing.no_quota)."""
    backoff_limit: int
    """Worker failures retried before the job is Failed."""
    master_port: int
    """Rendezvous port of worker rank 0."""
    default_image: str
    """Worker image when the job's template gives none."""
    spot: spot.SpotConfig
    """Interruption handling (:mod:`gpuscaler.controller.interruptions`)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> LoopConfig:
        """The loop's values in ``settings``."""
        values = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name != "spot"}
        return cls(**values, spot=spot.SpotConfig.from_settings(settings))


def format_duration(seconds: float) -> str:
    """``7980`` -> ``2h13m``; ``50`` -> ``50s``."""
    s = max(0, round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s" if m < 10 else f"{m}m"
    return f"{s}s"


def plan_status(result: PlanResult, generation: int, now: datetime) -> PlanStatus:
    """The status form of the planner's chosen candidate."""
    c = result.chosen
    assert c is not None
    return PlanStatus(
        instance_type=c.instance.name,
        provider=c.instance.provider,
        region=c.instance.region,
        zone=c.zone,
        gpu_type=c.instance.gpu_id,
        gpus_per_node=c.instance.gpu_count,
        nodes=c.nodes,
        gpus=c.gpus,
        capacity_type=c.capacity.value,
        held_capacity=c.pool,
        **held_placement(result, c),
        segments=plan_segments(c, now),
        precision=c.precision.value,
        micro_batch=c.micro_batch,
        accumulation=c.accumulation,
        usd_per_hour=round(c.usd_per_hour, 4),
        price_source=c.price_source,
        price_date=c.price_date,
        expected_hours=round(c.expected_hours, 4),
        expected_cost_usd=round(c.expected_cost_usd, 2),
        checkpoint_interval_seconds=round(c.outlook.interval_s),
        total_samples=result.job.total_samples,
        throughput=round(c.estimate.throughput, 3),
        throughput_p10=round(c.band.p10, 3) if c.band else None,
        throughput_p90=round(c.band.p90, 3) if c.band else None,
        throughput_log_sigma=round(c.outlook.log_sigma, 4),
        p90_hours=round(c.p90_hours, 4),
        p90_cost_usd=round(c.p90_cost_usd, 2),
        deadline_miss_probability=round(c.outlook.deadline_miss_probability, 4),
        why=result.why,
        summary=c.label,
        planned_at=now,
        generation=generation,
        efficiency_factor=round(c.prior.factor, 4) if c.prior else 1.0,
        throughput_source=c.throughput_source if result.profiles else None,
    )


@dataclass
class StepContext:
    """One step of one job: what the loop observed, what it decides, and when.

    Built once by :meth:`Reconciler.step`; every phase method takes it instead of the same
    job, status, pods, nodes, outcome and clock reading.
    """

    job: Job
    status: TrainingJobStatus
    """The status being decided: a deep copy of the one read, the same object as ``out.status``."""
    pods: list[PodState]
    """The job's worker pods (pods another job with the same name owned are left out)."""
    nodes: list[NodeState]
    """Every node of the job as observed, priced (the current plan's and an earlier plan's)."""
    now: datetime
    """The clock, read once per step."""
    out: Outcome
    governance: Governance | None = None
    """The policy governing the job and its namespace's usage (None: no policy, as the CLI plans)."""

    def condition(self, ctype: str, status: bool, reason: str, message: str) -> None:
        """Set a condition of the status now, at the job's generation (:func:`set_condition`)."""
        set_condition(self.status, ctype, status, reason, message, self.now, self.job.generation)

    def event(self, type_: str, reason: str, message: str) -> None:
        """Post an Event with this step's outcome."""
        self.out.events.append(Event(type_, reason, message))


@dataclass
class Reconciler:
    """One step of the loop for one job (see the module docstring for the phases).

    Everything it needs is given here, so unit tests drive it with fakes.
    """

    provider: NodePoolProvider
    """Grows and shrinks the job's nodes (:class:`gpuscaler.cloud.NodePoolProvider`)."""
    workers: WorkerClient
    """Creates and deletes the worker pods and Service."""
    planner: Planner
    """The loop's planner (the operator's is the policy gate, :func:`gpuscaler.controller.policy.gated_plan`)."""
    catalog: Catalog
    config: LoopConfig
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    """The time, read once per step."""
    observer: Observer | None = None
    """Observed performance (gpuscaler.observe); None when no Prometheus is configured."""
    admission: Callable[[], str | None] | None = None
    """Why workers may not run under the gpuscaler-worker account now, or None
    (:meth:`gpuscaler.kube.admission.WorkerAdmission.refusal`); None: no check."""
    gangs: queueing.GangClient | None = None
    """Kueue Workloads and JobSets (:mod:`gpuscaler.controller.queueing`); None: neither is used."""
    profiles: Recorder | None = None
    """Performance profiles: planned with, and recorded when a job succeeds (:mod:`gpuscaler.controller.profiles`)."""
    price_log: PriceLog | None = None
    """The live prices in force over time: nodes created at a live price are costed at each price in
    force while they ran (:meth:`gpuscaler.controller.prices.PriceLog.node_cost`)."""
    prices: Callable[[datetime], Staleness] | None = None
    """How fresh the live prices are (:meth:`gpuscaler.controller.prices.PriceRefresher.staleness`);
    None: no live prices configured, no PricesStale condition."""

    # ------------------------------------------------------------------------------ entry point

    def step(
        self,
        job: Job,
        status: TrainingJobStatus,
        pods: list[PodState],
        nodes: list[NodeState],
        governance: Governance | None = None,
    ) -> Outcome:
        """Decide and act once; returns the status to write and the events to post.

        Args:
            job: The TrainingJob (its spec valid).
            status: Its status as read.
            pods: Its worker pods as observed.
            nodes: Its nodes as observed.
            governance: The policy in force for the job's namespace and what the namespace holds
                (None: no policy). A rule the job breaks sets the ``PolicyViolation`` condition,
                keeps it Pending and provisions nothing; once it complies the condition turns False.

        Returns:
            The new status and the events to post.
        """
        now = self.clock()
        st = status.model_copy(deep=True)
        ctx = StepContext(
            job=job,
            status=st,
            # a JobSet's pods are owned by its Jobs; the job label alone names them
            pods=[p for p in pods if p.owner_uid in (None, job.uid) or queueing.uses_jobset(job)],
            nodes=[self._priced(n) for n in nodes],  # nodes a cloud named may carry no price annotation
            now=now,
            out=Outcome(st),
            governance=governance,
        )
        try:
            self._step(ctx)
        except PolicyViolationError as err:
            return self._policy_blocked(job, status, err, now)
        if any(c.type == ConditionType.POLICY_VIOLATION and c.status == "True" for c in st.conditions):
            ctx.condition(ConditionType.POLICY_VIOLATION, False, "Compliant", "the job meets the policies in force")
        return ctx.out

    def _policy_blocked(self, job: Job, status: TrainingJobStatus, err: PolicyViolationError, now: datetime) -> Outcome:
        """The status of a job a policy stops: PolicyViolation with the rule and values, nothing provisioned."""
        st = status.model_copy(deep=True)
        out = Outcome(st)
        was = any(c.type == ConditionType.POLICY_VIOLATION and c.status == "True" for c in st.conditions)
        set_condition(st, ConditionType.POLICY_VIOLATION, True, err.rule, str(err), now, job.generation)
        if st.phase in (Phase.PENDING, Phase.PLANNING):
            st.phase = Phase.PENDING
            st.message = f"not provisioned: {err}"
        st.observed_generation = job.generation
        if not was:
            out.events.append(Event("Warning", EventReason.POLICY_VIOLATION, str(err)))
        return out

    def _step(self, ctx: StepContext) -> None:
        job, st, now = ctx.job, ctx.status, ctx.now
        st.unavailable = [u for u in st.unavailable if u.until > now]
        st.observed_generation = job.generation

        if st.phase.finished:
            self._release(ctx, [n for n in ctx.nodes if not n.deleting])
            self._cost(ctx)
            return

        if job.spec.suspend and st.phase not in (Phase.PENDING, Phase.PLANNING):
            self._stop_gang(ctx, ctx.nodes)
            st.phase = Phase.PENDING
            ctx.event("Normal", EventReason.SUSPENDED, "spec.suspend is true: workers and nodes released")

        replan = st.plan is None or (
            st.phase in (Phase.PENDING, Phase.PLANNING) and st.plan.generation != job.generation
        )
        if replan and not self._plan(ctx):
            self._cost(ctx)
            return

        if st.phase in (Phase.PENDING, Phase.PLANNING):
            if job.spec.suspend:
                ctx.condition(ConditionType.SUSPENDED, True, "Suspended", "planned only: spec.suspend is true")
                st.message = "suspended: the plan is in status.plan; set spec.suspend to false to start"
                self._cost(ctx)
                return
            ctx.condition(ConditionType.SUSPENDED, False, "Started", "spec.suspend is false")
            if self._workers_refused(ctx):
                self._cost(ctx)
                return
            if (opens := window_opens_in(st, now)) is not None:  # a capacity block that opens later
                st.message = f"waiting {format_duration(opens)} for capacity {st.plan.held_capacity} to open"  # type: ignore[union-attr]
                self._cost(ctx)
                return
            self._begin_gang(ctx)

        assert st.plan is not None
        request = self._request(job, st.plan)
        current, stale = self._split_nodes(request, ctx.nodes)
        if stale:  # nodes of an earlier plan (a re-plan moved the job elsewhere): scale down
            self._release(ctx, stale)

        handler = {
            Phase.QUEUED: self._queued,
            Phase.PROVISIONING: self._provisioning,
            Phase.STARTING: self._starting,
            Phase.RUNNING: self._running,
            Phase.CHECKPOINTING: self._checkpointing,
            Phase.RECOVERING: self._recovering,
        }[st.phase]
        handler(ctx, request, current)
        self._progress(ctx)
        self._publish_preemption_cost(ctx)
        spot.refine_loss(st, ctx.pods, now)
        self._cost(ctx)

    # ------------------------------------------------------------------------------- planning

    def _deadline_hours(self, job: Job, now: datetime) -> float | None:
        limits: list[float] = []
        if job.spec.deadline is not None:
            dl = job.spec.deadline if job.spec.deadline.tzinfo else job.spec.deadline.replace(tzinfo=UTC)
            limits.append((dl - now).total_seconds() / 3600)
        if job.spec.max_duration is not None:
            total = parse_duration(job.spec.max_duration)
            limits.append((job.created + total - now).total_seconds() / 3600)
        return max(min(limits), 0.01) if limits else None

    def _plan(self, ctx: StepContext) -> bool:
        job, st, now = ctx.job, ctx.status, ctx.now
        unavailable = frozenset(u.key for u in st.unavailable)
        t0 = time.perf_counter()
        try:
            result = self._call_planner(ctx, job, unavailable)
        except (JobError, UnknownIdError, PrecisionUnsupportedError) as err:  # the spec names what is not there
            st.phase = Phase.FAILED
            st.completion_time = now
            st.message = f"cannot plan: {err}"
            ctx.condition(ConditionType.PLANNED, False, "InvalidSpec", str(err))
            ctx.condition(ConditionType.FAILED, True, "InvalidSpec", str(err))
            ctx.event("Warning", EventReason.INVALID_SPEC, st.message)
            return False
        ctx.out.plan_seconds = time.perf_counter() - t0
        ctx.out.planned = True
        if result.chosen is None:
            why = result.why + ("; " + "; ".join(result.hints) if result.hints else "")
            ctx.condition(ConditionType.PLANNED, False, "Infeasible", why)
            if unavailable:  # only short of capacity for now: plan again when the back-off ends
                st.phase = Phase.PLANNING
                st.plan = None
                st.message = f"no offering with capacity right now; waiting for back-off to end: {why}"
                return False
            st.phase = Phase.FAILED
            st.completion_time = now
            st.message = f"infeasible: {why}"
            ctx.condition(ConditionType.FAILED, True, "Infeasible", why)
            ctx.event("Warning", EventReason.INFEASIBLE, why)
            return False
        plan = self._adopt(ctx, result, "Planned")
        msg = (
            f"{plan.summary}: expected {plan.expected_hours:.2f} h, ${plan.expected_cost_usd:,.2f} "
            f"at ${plan.usd_per_hour:,.2f}/h; {result.why}"
        )
        ctx.event("Normal", EventReason.PLANNED, msg)
        if st.phase is Phase.PLANNING:
            st.phase = Phase.PENDING
        return True

    def _adopt(
        self, ctx: StepContext, result: PlanResult, reason: str, *, total_samples: float | None = None, why: str | None = None
    ) -> PlanStatus:
        """Make the planner's chosen candidate the job's plan (status.plan and the fields that
        mirror it, its observed efficiency factor, the Planned condition).

        Args:
            ctx: The step.
            result: A planner result with a chosen candidate.
            reason: The Planned condition's reason (``Planned``, ``Replanned``).
            total_samples: The whole job's samples, kept when ``result`` planned only the rest.
            why: The plan's ``why`` instead of the planner's (a re-plan's action).

        Returns:
            The new plan.
        """
        st = ctx.status
        plan = plan_status(result, ctx.job.generation, ctx.now)
        if total_samples is not None:
            plan.total_samples = total_samples
        if why is not None:
            plan.why = why
        plan.efficiency_factor = (st.observed.efficiency_by_gpu if st.observed else {}).get(plan.gpu_type, plan.efficiency_factor)
        st.plan = plan
        st.gpus, st.instance_type, st.capacity_type = plan.gpus, plan.instance_type, plan.capacity_type
        ctx.condition(ConditionType.PLANNED, True, reason, plan.summary)
        ctx.out.planned = True
        if self.prices is not None:
            fresh = self.prices(ctx.now)
            was = any(c.type == ConditionType.PRICES_STALE and c.status == "True" for c in st.conditions)
            ctx.condition(ConditionType.PRICES_STALE, fresh.stale, fresh.reason, fresh.message)
            if fresh.stale and not was:
                ctx.event("Warning", EventReason.PRICES_STALE, f"{plan.summary} planned on stale prices: {fresh.message}")
        return plan

    def _planner(self, ctx: StepContext) -> Planner:
        """The loop's planner under the step's governance (passed only when there is one, so a
        planner that knows no policy still serves an ungoverned loop)."""
        extra: dict[str, Any] = {} if ctx.governance is None else {"governance": ctx.governance}
        store = self.profiles.book.store_for(ctx.job.namespace, ctx.now) if self.profiles is not None else None
        if store:
            extra["profiles"] = store
        return functools.partial(self.planner, **extra) if extra else self.planner

    def _call_planner(
        self,
        ctx: StepContext,
        job: Job,
        unavailable: frozenset[tuple[str, ...]],
        efficiency: Mapping[str, float] | None = None,
    ) -> PlanResult:
        """The planner on ``job`` (the step's, or the rest of it) with the job's observed
        efficiency factors (when it has any)."""
        st = ctx.status
        eff = efficiency if efficiency is not None else (st.observed.efficiency_by_gpu if st.observed else {})
        planner = self._planner(ctx)
        deadline_h = self._deadline_hours(job, ctx.now)
        if eff:
            return planner(job.spec, job.name, deadline_h, unavailable, efficiency=eff)
        return planner(job.spec, job.name, deadline_h, unavailable)

    def _observe(self, ctx: StepContext, pods: list[PodState]) -> None:
        """Observed performance of a Running job (gpuscaler.observe): status.observed, bottleneck
        conditions, model correction; at a checkpoint, move the gang to a cheaper plan if one is pending."""
        job, st, now = ctx.job, ctx.status, ctx.now
        assert self.observer is not None and st.plan is not None
        unavailable = frozenset(u.key for u in st.unavailable)
        report = trusted_report(st, pods, now)
        ckpt = report.checkpoint_step
        hours_left = self._deadline_hours(job, now)
        total = st.plan.total_samples
        # the corrected planner plans the rest: samples after the progress made, the budget left
        budget = None if job.spec.budget_usd is None else max(job.spec.budget_usd - st.cost_usd, 0.0)
        rest = replace(job, spec=remaining_spec(job.spec, total, st.progress.samples, budget_usd=budget))
        context = JobContext(
            progress_samples=report.samples,
            hours_left=hours_left,
            max_deadline_risk=job.spec.constraints.max_deadline_risk,
            restart_s=job.spec.checkpoint.restart_seconds,
        )
        res = self.observer.step(
            job.namespace,
            job.name,
            job.generation,
            st,
            ckpt,
            now,
            lambda eff: self._call_planner(ctx, rest, unavailable, eff),
            context,
        )
        ctx.out.events.extend(res.events)
        if res.replan is None or res.replan.chosen is None:
            return
        before = st.plan.summary
        plan = self._adopt(ctx, res.replan, "Replanned", total_samples=total)
        st.phase = Phase.RECOVERING  # workers go, then the gang starts on the new plan from the checkpoint
        st.message = f"moving from {before} to {plan.summary} at checkpoint step {ckpt}"
        ctx.condition(ConditionType.RUNNING, False, "Replanned", st.message)

    def _workers_refused(self, ctx: StepContext) -> bool:
        """Whether workers may not start under the gpuscaler-worker account now (its admission
        policy missing: gpuscaler.kube.admission); then the job waits, with a condition and an Event."""
        job, st = ctx.job, ctx.status
        why = self.admission() if self.admission is not None and uses_worker_account(job.spec.template) else None
        had = next((c for c in st.conditions if c.type == ConditionType.WORKER_ADMISSION), None)
        if why is None:
            if had is not None and had.status == "False":
                ctx.condition(ConditionType.WORKER_ADMISSION, True, "PolicyInstalled", "the worker admission policy is in force")
            return False
        st.message = f"not starting workers: {why}"
        if had is None or had.status == "True":
            ctx.event("Warning", EventReason.WORKER_ADMISSION_POLICY_MISSING, st.message)
        ctx.condition(ConditionType.WORKER_ADMISSION, False, "PolicyMissing", capped(why))
        return True

    def _begin_gang(self, ctx: StepContext) -> None:
        st = ctx.status
        st.phase = Phase.PROVISIONING
        st.provisioning_started_at = ctx.now
        st.attempt += 1
        st.message = "provisioning nodes"
        if st.plan is not None and queueing.queue_of(ctx.job) is not None:
            request = self._request(ctx.job, st.plan)
            wp = self._worker_plan(ctx, request)
            self._worker_identity(ctx, wp)
            queueing.enqueue(self.gangs, ctx, request, wp, self.config.backoff_limit)

    def _queued(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        """Waiting in a Kueue LocalQueue: nothing is provisioned until Kueue admits the gang."""
        if queueing.admission(self.gangs, ctx):
            ctx.status.phase = Phase.PROVISIONING
            ctx.status.provisioning_started_at = ctx.now
            self._provisioning(ctx, request, nodes)
            return
        why = queueing.no_quota(ctx) if self.config.kueue_quota_fallback else None
        if why is not None:
            self._plan_within_quota(ctx, nodes, why)

    def _plan_within_quota(self, ctx: StepContext, nodes: list[NodeState], why: str) -> None:
        """The planned offering's flavor has no Kueue quota left: withdraw the gang, leave the
        offering out for the back-off, and queue the next plan that meets the deadline (if any)."""
        st = ctx.status
        assert st.plan is not None
        before = st.plan.summary
        self._back_off(ctx, nodes, f"no Kueue quota: {why}")
        st.plan = None
        st.phase = Phase.PLANNING
        if self._plan(ctx) and st.plan is not None:
            st.plan.why = f"chosen within the Kueue quota left: {before} has none ({why}); {st.plan.why}"
            ctx.event("Normal", EventReason.REPLANNED_WITHIN_QUOTA, f"{before} -> {st.plan.summary}: {why}")
            self._begin_gang(ctx)

    def _back_off(self, ctx: StepContext, nodes: list[NodeState], reason: str) -> None:
        """Stop the gang of the current plan and leave its offering out for the capacity back-off."""
        st = ctx.status
        assert st.plan is not None
        self._stop_gang(ctx, nodes)
        st.unavailable.append(
            UnavailableOffering(
                instance_type=st.plan.instance_type,
                capacity_type=st.plan.capacity_type,
                zone=st.plan.zone,
                until=ctx.now + timedelta(seconds=self.config.capacity_backoff_s),
                reason=reason,
            )
        )

    def _split_nodes(self, request: NodeRequest, nodes: list[NodeState]) -> tuple[list[NodeState], list[NodeState]]:
        """The live nodes of the current plan, and those of an earlier plan (to release), as the
        provider tells its nodes apart (:meth:`gpuscaler.cloud.NodePoolProvider.owns`)."""
        live = [n for n in nodes if not n.deleting]
        ours = [self.provider.owns(request, n) for n in live]
        return [n for n, o in zip(live, ours, strict=True) if o], [n for n, o in zip(live, ours, strict=True) if not o]

    def _priced(self, node: NodeState) -> NodeState:
        """A node without the price annotation (one Karpenter launched) priced from the catalog."""
        if node.usd_per_hour or not node.instance_type:
            return node
        try:
            price = self.catalog.instance(node.instance_type).price(CapacityType(node.capacity_type))
        except (UnknownIdError, ValueError):
            return node
        return replace(node, usd_per_hour=price or 0.0)

    def _request(self, job: Job, plan: PlanStatus) -> NodeRequest:
        inst = self.catalog.instance(plan.instance_type)
        return NodeRequest(
            job=job.ref,
            instance=inst,
            capacity=CapacityType(plan.capacity_type),
            count=plan.nodes,
            usd_per_hour_per_node=plan.usd_per_hour / max(plan.nodes, 1),
            zone=plan.zone,
            pool=plan.held_capacity,
            reservation_id=plan.reservation_id,
            window_start=plan.window_start,
            window_end=plan.window_end,
        )

    # ------------------------------------------------------------------------------- phases

    def _gang_timed_out(self, ctx: StepContext) -> bool:
        started = ctx.status.provisioning_started_at or ctx.now
        return (ctx.now - started).total_seconds() > self.config.gang_timeout_s

    def _give_up_offering(self, ctx: StepContext, nodes: list[NodeState], why: str) -> None:
        """Release a partial gang, back off its offering, and re-plan without it."""
        st = ctx.status
        assert st.plan is not None
        self._back_off(ctx, nodes, why)
        ctx.event(
            "Warning",
            EventReason.GANG_TIMEOUT,
            f"{why}; released {len(nodes)} node(s) and {len(ctx.pods)} worker(s); "
            f"{st.plan.instance_type} {st.plan.capacity_type} left out for {self.config.capacity_backoff_s:g}s",
        )
        ctx.condition(ConditionType.NODES_READY, False, "GangTimeout", why)
        st.plan = None
        st.phase = Phase.PLANNING
        if self._plan(ctx):
            self._begin_gang(ctx)

    def _provisioning(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        st = ctx.status
        short = ""
        try:
            created = self.provider.ensure_nodes(request, nodes)
        except InsufficientCapacityError as err:
            created, short = [], str(err)
        if created:
            ctx.event(
                "Normal",
                EventReason.SCALED_UP,
                f"requested {len(created)} x {request.instance.name} ({request.capacity.value}) "
                f"for {request.count} planned node(s): {', '.join(created[:5])}",
            )
        if self.provider.workers_first(request):
            # pods first: static steers them onto existing nodes, Karpenter provisions for them;
            # the gang timeout then runs on the workers being scheduled and Running (_starting)
            st.phase = Phase.STARTING
            self._starting(ctx, request, nodes)
            return
        ready = [n for n in nodes if n.ready]
        # the nodes made in this step too: the watch shows them only later, and that step then
        # writes nothing new
        st.nodes = sorted({n.name for n in nodes} | set(created))
        if len(ready) >= request.count:
            ctx.condition(ConditionType.NODES_READY, True, "NodesReady", f"{len(ready)} node(s) Ready")
            ctx.event("Normal", EventReason.NODES_READY, f"all {request.count} node(s) Ready")
            st.phase = Phase.STARTING
            self._starting(ctx, request, nodes)
            return
        st.message = f"{len(ready)}/{request.count} nodes Ready" + (f"; {short}" if short else "")
        ctx.condition(ConditionType.NODES_READY, False, "InsufficientCapacity" if short else "Provisioning", st.message)
        if self._gang_timed_out(ctx):
            why = f"only {len(ready)} of {request.count} nodes arrived within {self.config.gang_timeout_s:g}s"
            self._give_up_offering(ctx, nodes, why + (f" ({short})" if short else ""))

    def _worker_plan(self, ctx: StepContext, request: NodeRequest) -> WorkerPlan:
        job, st = ctx.job, ctx.status
        assert st.plan is not None
        sched = self.provider.scheduling(request)
        return WorkerPlan(
            job_name=job.name,
            namespace=job.namespace,
            job_label=job.ref.label,
            owner=job.owner,
            nodes=st.plan.nodes,
            gpus_per_node=st.plan.gpus_per_node,
            precision=st.plan.precision,
            micro_batch=st.plan.micro_batch,
            accumulation=st.plan.accumulation,
            checkpoint_dir=job.spec.checkpoint.dir,
            checkpoint_interval_s=float(st.plan.checkpoint_interval_seconds),
            checkpoint_keep=job.spec.checkpoint.keep,
            master_port=self.config.master_port,
            attempt=st.attempt,
            node_selector=sched.node_selector,
            tolerations=sched.tolerations,
            default_image=self.config.default_image,
            template=job.spec.template,
        )

    def _starting(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        job, st, pods = ctx.job, ctx.status, ctx.pods
        if self._lost(ctx, nodes):
            return
        wp = self._worker_plan(ctx, request)
        if queueing.uses_jobset(job):
            self._start_jobset(ctx, request, wp)
            have = set(range(request.count))  # the JobSet controller makes the pods and their Service
        else:
            have = {p.rank for p in pods if not p.deleting}
        if len(have) < request.count and self._workers_refused(ctx):
            return  # the admission policy went away since the gang began: no new workers without it
        if len(have) < request.count and needs_rendezvous_service(wp):
            # the rendezvous Service with the pods that need it (not on every step: each repeat was a 409);
            # a one-node gang meets on its own pod and needs none
            self.workers.create_if_absent(headless_service(wp))
        if len(have) < request.count and uses_worker_account(wp.template):
            # the workers' ServiceAccount and Role (KubeReporter patches its pod); before the pods,
            # which the ServiceAccount admission refuses while their account is missing
            for body in worker_rbac(job.namespace):
                self.workers.create_if_absent(body)
        made = [r for r in range(request.count) if r not in have and self.workers.create_if_absent(worker_pod(wp, r))]
        if made:
            self._workers_created(ctx, f"created {len(made)} worker pod(s) (attempt {st.attempt})")
        running = [p for p in pods if p.running or p.succeeded]
        if len(running) >= request.count:
            first = st.start_time is None
            st.start_time = st.start_time or ctx.now
            st.phase = Phase.RUNNING
            st.message = f"{request.count} worker(s) running"
            ctx.condition(ConditionType.RUNNING, True, "Started", st.message)
            reason, verb = (EventReason.STARTED, "started") if first else (EventReason.RECOVERED, "recovered and resumed")
            after = "" if first else spot.recovered(st, ctx.now)
            ctx.event(
                "Normal",
                reason,
                f"all {request.count} worker(s) {verb} on {request.instance.name}" + (f" ({after})" if after else ""),
            )
            self._running(ctx, request, nodes)
            return
        st.message = f"{len(running)}/{request.count} workers running"
        if self.provider.launches_for_workers(request):
            self._nodes_for_pods(ctx, request, nodes)
        if self._gang_timed_out(ctx):
            why = f"only {len(running)} of {request.count} workers started within {self.config.gang_timeout_s:g}s"
            self._give_up_offering(ctx, nodes, why)

    def _workers_created(self, ctx: StepContext, text: str) -> None:
        """The WorkersCreated Event, or, when this step also found the nodes Ready, that NodesReady
        Event saying so too: one Event per step on the way to Running (each is a POST)."""
        events = ctx.out.events
        if events and events[-1].reason == "NodesReady":
            events[-1] = replace(events[-1], message=f"{events[-1].message}; {text}")
        else:
            ctx.event("Normal", EventReason.WORKERS_CREATED, text)

    def _nodes_for_pods(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        """While the workers wait for nodes a provider launches for them: status.nodes, NodesReady."""
        st = ctx.status
        st.nodes = sorted(n.name for n in nodes)
        ready = sum(n.ready for n in nodes)
        st.message += f"; {ready}/{request.count} nodes Ready"
        was = any(c.type == ConditionType.NODES_READY and c.status == "True" for c in st.conditions)
        ctx.condition(
            ConditionType.NODES_READY,
            ready >= request.count,
            "NodesReady" if ready >= request.count else "Provisioning",
            f"{ready}/{request.count} node(s) Ready",
        )
        if ready >= request.count and not was:
            ctx.event("Normal", EventReason.NODES_READY, f"all {request.count} node(s) Ready")

    def _preempted(self, pod: PodState, nodes: list[NodeState], now: datetime) -> str | None:
        """Why a failed worker counts as preempted (None: a failure), from what the operator knows."""
        node = next((n for n in nodes if n.name == pod.node), None)
        going = node is not None and (node.deleting or spot.node_notice(node, now, self.config.spot) is not None)
        return preemption(pod, node_going=going)

    def _lost(self, ctx: StepContext, nodes: list[NodeState]) -> bool:
        """A worker failed or its node went away: count it and move to Recovering (or Failed).

        A worker that was preempted (:func:`preemption`) is an interruption, counted against
        ``spot.maxInterruptions`` by the re-plan; only real failures count against backoffLimit.
        """
        st, pods, now = ctx.status, ctx.pods, ctx.now
        why_preempted = {p.name: self._preempted(p, nodes, now) for p in pods if p.failed}
        preempted = [p for p in pods if why_preempted.get(p.name)]
        orphaned = [p for p in pods if p.node and not p.succeeded and self.provider.node_gone(p.node, nodes)]
        failed = [p for p in pods if p.failed and p not in preempted and p not in orphaned]
        if failed:
            st.failures += 1
            p = failed[0]
            why = f"worker {p.name} failed (exit code {p.exit_code}, {p.reason or 'no reason'})"
            if st.failures > self.config.backoff_limit:
                self._stop_gang(ctx, nodes)
                st.phase = Phase.FAILED
                st.completion_time = now
                st.message = f"{why}; backoff limit {self.config.backoff_limit} reached"
                ctx.condition(ConditionType.FAILED, True, "BackoffLimitExceeded", st.message)
                ctx.condition(ConditionType.RUNNING, False, "Failed", why)
                ctx.event("Warning", EventReason.FAILED, st.message)
                return True
            st.phase = Phase.RECOVERING
            st.message = f"{why}; restarting the gang (failure {st.failures} of {self.config.backoff_limit} allowed)"
            ctx.event("Warning", EventReason.WORKER_FAILED, st.message)
            ctx.condition(ConditionType.RUNNING, False, "WorkerFailed", why)
            return True
        if preempted or orphaned:
            names = ", ".join(p.name for p in (preempted or orphaned)[:3])
            st.phase = Phase.RECOVERING
            how = f"was preempted ({why_preempted[preempted[0].name]})" if preempted and not orphaned else "lost its node"
            st.message = f"interrupted: {names} {how}; resuming from the last checkpoint"
            ctx.event("Warning", EventReason.INTERRUPTED, st.message)
            ctx.condition(ConditionType.RUNNING, False, "Interrupted", st.message)
            lost = (orphaned or preempted)[0]
            signal = NODE_DELETED if orphaned else WORKER_PREEMPTED
            notes = spot.record(st, node=lost.node or "", signal=signal, acked=False, now=now, cfg=self.config.spot)
            ctx.out.events.extend(notes)
            return True
        return False

    def _running(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        st, pods, now = ctx.status, ctx.pods, ctx.now
        live = [p for p in pods if not p.deleting]
        if len(live) >= request.count and all(p.succeeded for p in live):
            if self.profiles is not None:  # before Running turns False: the run is measured from it
                ctx.out.events += self.profiles.finished(ctx.job.namespace, ctx.job.uid, ctx.job.spec, st, now)
            st.phase = Phase.SUCCEEDED
            st.completion_time = now
            st.message = "every worker finished"
            st.eta = None
            ctx.condition(ConditionType.RUNNING, False, "Completed", st.message)
            ctx.condition(ConditionType.COMPLETE, True, "Succeeded", st.message)
            self._release(ctx, nodes)
            took = format_duration((now - (st.start_time or now)).total_seconds())
            ctx.event("Normal", EventReason.SUCCEEDED, f"training done in {took}; nodes released")
            return
        if queueing.evicted(self.gangs, ctx):  # first: the workers Kueue stops fail, and that is no failure
            return
        if self._lost(ctx, nodes):
            return
        if len(live) < request.count:  # a worker pod was deleted under us
            st.interruptions += 1
            st.phase = Phase.RECOVERING
            st.message = f"{request.count - len(live)} worker(s) disappeared; restarting the gang"
            ctx.event("Warning", EventReason.INTERRUPTED, st.message)
            return
        measured = preemption_cost.measured_write_s(st, pods, self.config.spot.checkpoint_write_max_s)
        notice = spot.detect(nodes, now, self.config.spot) or window_closing(st, nodes, now, measured)
        if notice is not None:
            self._interrupted(ctx, nodes, notice)
            return
        st.message = f"{request.count} worker(s) running"
        if self.observer is not None:
            self._observe(ctx, live)

    def _checkpointing(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        st = ctx.status
        done, acked = spot.handshake_done(st, ctx.pods, ctx.now, self.config.spot)
        if done:
            self._to_recovery(ctx, nodes, acked=acked)
        elif st.notice is not None:
            left = f"until {st.notice.deadline:%H:%M:%S}" if st.notice.deadline else "(soft notice)"
            st.message = f"waiting for checkpoint {st.notice.request_id} {left}"

    def _interrupted(self, ctx: StepContext, nodes: list[NodeState], notice: spot.Notice) -> None:
        """A node's notice: ask the workers for a checkpoint now, or on a hard loss recover at once."""
        st, namespace = ctx.status, ctx.job.namespace
        annotate = lambda pod, ann: self.workers.annotate_pod(namespace, pod, ann)  # noqa: E731
        ctx.out.events.extend(spot.begin_handshake(st, notice, ctx.pods, annotate, ctx.now))
        ctx.condition(ConditionType.RUNNING, False, "Interrupted", st.message)
        st.phase = Phase.CHECKPOINTING
        if notice.hard:
            self._to_recovery(ctx, nodes, acked=False)

    def _to_recovery(self, ctx: StepContext, nodes: list[NodeState], *, acked: bool) -> None:
        """The handshake is over: record the interruption, release the noticed node, stop the gang."""
        st = ctx.status
        node = st.notice.node if st.notice else ""
        signal = st.notice.signal if st.notice else "unknown"
        notes = spot.record(st, node=node, signal=signal, acked=acked, now=ctx.now, cfg=self.config.spot)
        ctx.out.events.extend(notes)
        st.phase = Phase.RECOVERING
        st.message = f"{signal} on {node}: moving the gang from the checkpoint at step {st.progress.checkpoint_step or 0}"
        # a node that still runs the workers goes once they have stopped (SIGTERM: one more checkpoint)
        self._release(ctx, [n for n in nodes if n.name == node and not n.ready])

    def _replan_rest(self, ctx: StepContext, nodes: list[NodeState]) -> bool:
        """After an interruption: plan the remaining work (spot.replan); False when nothing fits now."""
        job, st, now = ctx.job, ctx.status, ctx.now
        rec = spot.open_record(st)
        assert st.plan is not None and rec is not None
        spot.settle_loss(st)
        request = self._request(job, st.plan)
        survivors = [n for n in nodes if n.ready and not n.deleting and spot.node_notice(n, now, self.config.spot) is None]
        # The survivors can carry on only as the first k nodes of their pool (names are <pool>-<i>).
        k = len(survivors)
        keep = k if k and {n.name for n in survivors} == set(node_names(replace(request, count=k))) else 0
        rp = spot.replan(
            job.spec,
            job.name,
            st.plan,
            interruptions=st.interruptions,
            done_samples=(rec.checkpoint_step or 0) * job.spec.global_batch,
            deadline_h=self._deadline_hours(job, now),
            unavailable=frozenset(u.key for u in st.unavailable),
            planner=self._planner(ctx),
            survivors=keep,
            rules=ctx.governance.policy.spot if ctx.governance is not None else None,
            efficiency=st.observed.efficiency_by_gpu if st.observed else None,
            spent_usd=st.cost_usd,
        )
        rec.action = rp.action
        if rp.result is None or rp.result.chosen is None:
            st.phase = Phase.PLANNING
            st.plan = None
            st.message = f"no plan for the rest right now: {rp.action}"
            ctx.event("Warning", EventReason.INFEASIBLE, st.message)
            return False
        self._adopt(ctx, rp.result, "Replanned", total_samples=st.plan.total_samples, why=rp.action)
        ctx.event("Normal", EventReason.REPLANNED, rp.action)
        return True

    def _recovering(self, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
        st, pods = ctx.status, ctx.pods
        self._delete_workers(ctx)
        lost = [n for n in nodes if n.interrupted and (not n.ready or not any(p.node == n.name for p in pods))]
        if lost:
            self._release(ctx, lost)
        if any(True for _ in pods):
            st.message = "waiting for the old workers to go"
            return
        rec = spot.open_record(st)
        if rec is not None and not rec.action and not self._replan_rest(ctx, nodes):
            return
        self._begin_gang(ctx)
        st.message = f"restarting the gang (attempt {st.attempt})"

    # ------------------------------------------------------------------------------- helpers

    def _stop_gang(self, ctx: StepContext, nodes: list[NodeState]) -> None:
        self._delete_workers(ctx)
        self._release(ctx, [n for n in nodes if not n.deleting])

    def _delete_workers(self, ctx: StepContext) -> None:
        """The gang's workers go: its JobSet (``runtime: jobset``; its Jobs and pods with it), or each pod."""
        if queueing.uses_jobset(ctx.job):
            if self.gangs is not None and ctx.status.attempt:
                queueing.stop_jobset(self.gangs, ctx.job, ctx.status.attempt)
            return
        for p in ctx.pods:
            if not p.deleting:
                self.workers.delete_pod(ctx.job.namespace, p.name)

    def _start_jobset(self, ctx: StepContext, request: NodeRequest, wp: WorkerPlan) -> None:
        """The gang's JobSet, created once per gang start (a queued one exists since it was queued)."""
        if self.gangs is None:
            ctx.status.message = "runtime jobset: this operator runs without a JobSet client"
            return
        if queueing.queue_of(ctx.job) is not None:
            return
        self._worker_identity(ctx, wp)
        if queueing.start_jobset(self.gangs, ctx.job, wp, None, self.config.backoff_limit):
            ctx.event(
                "Normal", EventReason.WORKERS_CREATED,
                f"created JobSet {jobset_name(wp.job_name, wp.attempt)} of {request.count} worker(s) (attempt {wp.attempt})",
            )

    def _worker_identity(self, ctx: StepContext, wp: WorkerPlan) -> None:
        """The workers' ServiceAccount and Role before a JobSet's pods need them (see _starting)."""
        if uses_worker_account(wp.template):
            for body in worker_rbac(ctx.job.namespace):
                self.workers.create_if_absent(body)

    def _release(self, ctx: StepContext, nodes: list[NodeState]) -> None:
        st, out = ctx.status, ctx.out
        if not nodes:
            if st.phase.finished:
                st.nodes = []
            return
        deleted = set(self.provider.release_nodes(ctx.job.ref, [n for n in nodes if n.name not in out.released]))
        out.released |= deleted
        for n in nodes:
            if n.name in deleted:
                st.released_cost_usd += _node_cost(n, ctx.now, self.price_log)
        st.released_cost_usd = round(st.released_cost_usd, 4)
        st.nodes = sorted(set(st.nodes) - deleted)
        if deleted:
            ctx.event("Normal", EventReason.SCALED_DOWN, f"released {len(deleted)} node(s): {', '.join(sorted(deleted)[:5])}")

    def _progress(self, ctx: StepContext) -> None:
        """status.progress from the writer's checked reports (gpuscaler.kube.reports); what was
        rejected goes to the WorkerReports condition and, when it changes, a Warning Event."""
        st = ctx.status
        rep = trusted_report(st, ctx.pods, ctx.now)
        self._rejected_reports(ctx, rep)
        prog = st.progress
        new_step = max(rep.step if rep.step is not None else prog.step, prog.step)
        new_samples = max(rep.samples if rep.samples is not None else prog.samples, prog.samples)
        if new_step != prog.step or new_samples != prog.samples:  # monotone: a lower report is not applied
            prog.step = new_step
            prog.samples = new_samples
            prog.updated_at = ctx.now
            prog.reported_by = rep.writer
        if rep.checkpoint_step is not None and rep.checkpoint_step > (prog.checkpoint_step or -1):  # never backwards
            prog.checkpoint_step = rep.checkpoint_step
            prog.reported_by = rep.writer
        if st.plan is not None and st.plan.total_samples > 0:
            prog.percent = round(min(100.0, 100 * prog.samples / st.plan.total_samples), 2)

    def _publish_preemption_cost(self, ctx: StepContext) -> None:
        """The preemption-cost annotations and do-not-disrupt on the workers (gpuscaler.controller.preemption)."""
        own = ((ctx.job.spec.template or {}).get("metadata") or {}).get("annotations") or {}
        cfg = self.config.spot
        for pod, patch in preemption_cost.patches(
            ctx.status, ctx.pods, ctx.now, write_max_s=cfg.checkpoint_write_max_s,
            refresh_s=cfg.preemption_cost_refresh_s, manage_do_not_disrupt=DO_NOT_DISRUPT_ANNOTATION not in own,
        ).items():
            self.workers.annotate_pod(ctx.job.namespace, pod, patch)

    def _rejected_reports(self, ctx: StepContext, rep: TrustedReport) -> None:
        """Condition WorkerReports (set once something was rejected) and an Event when that changes."""
        had = next((c for c in ctx.status.conditions if c.type == ConditionType.WORKER_REPORTS), None)
        if not rep.rejected:
            if had is not None and had.status == "False":
                ctx.condition(ConditionType.WORKER_REPORTS, True, "Valid", "the workers' reports pass every check")
            return
        text = capped(report_summary(rep.rejected))
        if had is None or had.status == "True" or had.message != text:
            ctx.event("Warning", EventReason.REPORT_REJECTED, text)
        ctx.condition(ConditionType.WORKER_REPORTS, False, "Rejected", text)

    def _cost(self, ctx: StepContext) -> None:
        st, out, now = ctx.status, ctx.out, ctx.now
        live = sum(_node_cost(n, now, self.price_log) for n in ctx.nodes if not n.deleting and n.name not in out.released)
        st.cost_usd = round(st.released_cost_usd + live, 2)
        if st.plan is None or st.phase.finished:
            st.eta = None
            st.estimated_completion_time = None
            return
        if st.phase in (Phase.RUNNING, Phase.CHECKPOINTING) and st.plan.throughput > 0:
            left = max(st.plan.total_samples - st.progress.samples, 0) / st.plan.throughput
        else:
            left = st.plan.expected_hours * 3600 * (1 - st.progress.percent / 100)
        st.eta = format_duration(left)
        st.estimated_completion_time = (now + timedelta(seconds=left)).replace(microsecond=0)


def preemption(pod: PodState, *, node_going: bool = False) -> str | None:
    """Why a failed worker pod was preempted rather than failed, or None for a real failure.

    Only the operator's own evidence counts, never what the worker says of itself: its exit code
    (75, or the launcher's 1 after its workers exited 75) and its ``runtime-phase=preempted``
    annotation are the container's to choose, so a crashing worker could claim them and never
    reach ``backoffLimit``. In this order: the operator's own checkpoint request on the pod (it
    sent the notice; the workers may not write that annotation), answered or not; the pod's
    ``DisruptionTarget`` condition (set by the API server's eviction, the scheduler's preemption,
    the kubelet's graceful node shutdown: pod status the worker's Role cannot write); the pod
    being deleted (``deletionTimestamp``: the worker's Role cannot delete); its node under a
    notice, being deleted or gone. A Kueue eviction is handled before this is asked
    (:func:`gpuscaler.controller.queueing.evicted`). What the worker reported is added to the
    reason as a detail.

    Args:
        pod: A failed worker pod.
        node_going: Whether the pod's node is under an interruption notice or being deleted.

    Returns:
        The reason, for the status message and the Interrupted event.
    """
    said = f", exit code {pod.exit_code}" + (
        f", runtime {rc.RUNTIME_PHASE_PREEMPTED}" if pod.runtime_phase == rc.RUNTIME_PHASE_PREEMPTED else ""
    )
    if pod.checkpoint_requested:
        acked = pod.checkpoint_ack == pod.checkpoint_requested
        return f"after the operator's checkpoint request {pod.checkpoint_requested}" + (" (acknowledged)" if acked else "") + said
    if pod.disruption is not None:
        return f"DisruptionTarget: {pod.disruption}{said}"
    if pod.deleting:
        return f"the pod was being deleted{said}"
    if node_going:
        return f"its node {pod.node} is going{said}"
    return None


def _node_cost(node: NodeState, now: datetime, log: PriceLog | None = None) -> float:
    if node.created is None:
        return 0.0
    if log is not None and (at_prices_in_force := log.node_cost(node, node.region, now)) is not None:
        return at_prices_in_force
    hours = max((now - node.created).total_seconds(), 0) / 3600
    return hours * node.usd_per_hour


SHOWN_CLOCK_FIELDS = ("costUsd", "eta")
"""The status fields that move with time alone and that ``kubectl get`` shows (COST to the cent, as
:meth:`Reconciler._cost` rounds it, and ETA as :func:`format_duration` writes it)."""
CLOCK_FIELDS = (*SHOWN_CLOCK_FIELDS, "estimatedCompletionTime")
"""Every field that moves with time alone; ``estimatedCompletionTime`` shifts by seconds as the
throughput estimate does and is written with the next change of the others."""


def status_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``none``, ``clock`` (only what time moves changed, and cost or ETA as shown did) or ``state``.

    The handler writes ``clock`` changes at most every ``settings.status_refresh_s`` seconds.
    """
    a = {k: v for k, v in old.items() if k not in CLOCK_FIELDS}
    b = {k: v for k, v in new.items() if k not in CLOCK_FIELDS}
    if a != b:
        return "state"
    if all(old.get(k) == new.get(k) for k in SHOWN_CLOCK_FIELDS):
        return "none"
    return "clock"
