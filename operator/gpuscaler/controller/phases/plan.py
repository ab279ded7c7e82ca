"""The Pending phase and planning: the plan of a job, its adoption into the status, the observer's corrections and the node request a plan makes (sub-reconciler of :class:`gpuscaler.controller.reconcile.Reconciler`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpuscaler.api.events import capped
from gpuscaler.api.status import Phase, PlanStatus, UnavailableOffering
from gpuscaler.api.trainingjob import parse_duration
from gpuscaler.catalog import CapacityType, UnknownIdError
from gpuscaler.cloud import NodeRequest, NodeState
from gpuscaler.controller import queueing
from gpuscaler.controller.interruptions import Planner, ask_for_checkpoint, request_id
from gpuscaler.controller.step import Job, StepContext, plan_status
from gpuscaler.kube.reports import trusted_report
from gpuscaler.kube.workers import PodState, uses_worker_account
from gpuscaler.names import ConditionType, EventReason
from gpuscaler.observe.controller import JobContext
from gpuscaler.perfmodel import PrecisionUnsupportedError
from gpuscaler.planner import JobError, PlanResult, remaining_spec

if TYPE_CHECKING:
    from gpuscaler.controller.reconcile import Reconciler


def _deadline_hours(self: Reconciler, job: Job, now: datetime) -> float | None:
    limits: list[float] = []
    if job.spec.deadline is not None:
        dl = job.spec.deadline if job.spec.deadline.tzinfo else job.spec.deadline.replace(tzinfo=UTC)
        limits.append((dl - now).total_seconds() / 3600)
    if job.spec.max_duration is not None:
        total = parse_duration(job.spec.max_duration)
        limits.append((job.created + total - now).total_seconds() / 3600)
    return max(min(limits), 0.01) if limits else None


def _plan(self: Reconciler, ctx: StepContext) -> bool:
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
    plan = self._adopt(ctx, result, "Trial" if result.trial else "Planned")
    msg = (
        f"{plan.summary}: expected {plan.expected_hours:.2f} h, ${plan.expected_cost_usd:,.2f} "
        f"at ${plan.usd_per_hour:,.2f}/h; {result.why}"
    )
    ctx.event("Normal", EventReason.TRIAL if result.trial else EventReason.PLANNED, msg)
    if st.phase is Phase.PLANNING:
        st.phase = Phase.PENDING
    return True


def _adopt(self: Reconciler, ctx: StepContext, result: PlanResult, reason: str, *, total_samples: float | None = None, why: str | None = None
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


def _planner(self: Reconciler, ctx: StepContext) -> Planner:
    """The loop's planner under the step's governance (passed only when there is one, so a
    planner that knows no policy still serves an ungoverned loop)."""
    extra: dict[str, Any] = {} if ctx.governance is None else {"governance": ctx.governance}
    store = self.profiles.book.store_for(ctx.job.namespace, ctx.now) if self.profiles is not None else None
    if store:
        extra["profiles"] = store
    return functools.partial(self.planner, **extra) if extra else self.planner


def _call_planner(self: Reconciler,
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


def _observe(self: Reconciler, ctx: StepContext, pods: list[PodState], nodes: list[NodeState]) -> None:
    """Observed performance of a Running job (gpuscaler.observe): status.observed, bottleneck
    conditions, model correction; at a checkpoint, move the gang to a cheaper plan if one is pending;
    a trial that found no plan meeting the risk stops (Failed, DeadlineInfeasible)."""
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

    def plan_rest(efficiency: Mapping[str, float], without: frozenset[tuple[str, ...]] = frozenset(),
                  trials: bool = False) -> PlanResult:  # fmt: skip
        """The corrected planner on the rest; ``trials``: with the job's atRiskLimit (a next trial, rare: its
        spec is built then, not on every tick)."""
        whose = (replace(job, spec=remaining_spec(job.spec, total, st.progress.samples, budget_usd=budget, trials=True))
                 if trials else rest)  # fmt: skip
        return self._call_planner(ctx, whose, unavailable | without, efficiency)

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
        plan_rest,
        context,
    )
    ctx.out.events.extend(res.events)
    if res.stop is not None:  # a trial that ended, at the checkpoint it asked for
        self._fail_running(ctx, nodes, res.stop, reason="DeadlineInfeasible", event=EventReason.DEADLINE_INFEASIBLE,
                           running=("DeadlineInfeasible", res.stop))  # fmt: skip
        return
    if res.checkpoint_now:  # a move for the deadline: the checkpoint it starts from, asked for now
        ask_for_checkpoint(pods, request_id(now, st.attempt), lambda pod, ann: self.workers.annotate_pod(job.namespace, pod, ann))
    if res.replan is None or res.replan.chosen is None:
        return
    before = st.plan.summary
    plan = self._adopt(ctx, res.replan, "Replanned", total_samples=total)
    st.phase = Phase.RECOVERING  # workers go, then the gang starts on the new plan from the checkpoint
    st.message = f"moving from {before} to {plan.summary} at checkpoint step {ckpt}"
    ctx.condition(ConditionType.RUNNING, False, "Replanned", st.message)


def _workers_refused(self: Reconciler, ctx: StepContext) -> bool:
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


def _begin_gang(self: Reconciler, ctx: StepContext) -> None:
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


def _queued(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
    """Waiting in a Kueue LocalQueue: nothing is provisioned until Kueue admits the gang."""
    if queueing.admission(self.gangs, ctx):
        ctx.status.phase = Phase.PROVISIONING
        ctx.status.provisioning_started_at = ctx.now
        self._provisioning(ctx, request, nodes)
        return
    why = queueing.no_quota(ctx) if self.config.kueue_quota_fallback else None
    if why is not None:
        self._plan_within_quota(ctx, nodes, why)


def _plan_within_quota(self: Reconciler, ctx: StepContext, nodes: list[NodeState], why: str) -> None:
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


def _back_off(self: Reconciler, ctx: StepContext, nodes: list[NodeState], reason: str) -> None:
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


def _plan_nodes(self: Reconciler, ctx: StepContext, nodes: list[NodeState]) -> tuple[NodeRequest, list[NodeState]]:
    """The plan's node request and its live nodes among ``nodes``; the live nodes of an earlier plan
    (a re-plan moved the job elsewhere) are released, as the provider tells its nodes apart
    (:meth:`gpuscaler.cloud.NodePoolProvider.owns`)."""
    assert ctx.status.plan is not None
    request = self._request(ctx.job, ctx.status.plan)
    live = [n for n in nodes if not n.deleting]
    ours = [self.provider.owns(request, n) for n in live]
    stale = [n for n, o in zip(live, ours, strict=True) if not o]
    if stale:
        self._release(ctx, stale)
    return request, [n for n, o in zip(live, ours, strict=True) if o]


def _priced(self: Reconciler, node: NodeState) -> NodeState:
    """A node without the price annotation (one Karpenter launched) priced from the catalog."""
    if node.usd_per_hour or not node.instance_type:
        return node
    try:
        price = self.catalog.instance(node.instance_type).price(CapacityType(node.capacity_type))
    except (UnknownIdError, ValueError):
        return node
    return replace(node, usd_per_hour=price or 0.0)


def _request(self: Reconciler, job: Job, plan: PlanStatus) -> NodeRequest:
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
