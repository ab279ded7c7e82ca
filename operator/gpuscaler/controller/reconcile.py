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

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuscaler.api.events import Event, set_condition
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.catalog import Catalog
from gpuscaler.cloud import NodePoolProvider, NodeState
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller import queueing
from gpuscaler.controller.interruptions import Planner
from gpuscaler.controller.phases import finish as phase_finish
from gpuscaler.controller.phases import interruptions as phase_interruptions
from gpuscaler.controller.phases import plan as phase_plan
from gpuscaler.controller.phases import provision as phase_provision
from gpuscaler.controller.phases import run as phase_run
from gpuscaler.controller.policy import Governance, PolicyViolationError
from gpuscaler.controller.prices import PriceLog, Staleness
from gpuscaler.controller.profiles import Recorder
from gpuscaler.controller.step import (
    CLOCK_FIELDS,
    COST_REFRESH_S,
    SHOWN_CLOCK_FIELDS,
    Job,
    LoopConfig,
    Outcome,
    StepContext,
    WorkerClient,
    _node_cost,
    format_duration,
    plan_status,
    preemption,
    status_change,
)
from gpuscaler.controller.windows import window_opens_in
from gpuscaler.kube.workers import PodState
from gpuscaler.names import ConditionType, EventReason
from gpuscaler.observe.controller import Observer

__all__ = [
    "CLOCK_FIELDS",
    "COST_REFRESH_S",
    "SHOWN_CLOCK_FIELDS",
    "Job",
    "LoopConfig",
    "Outcome",
    "Reconciler",
    "StepContext",
    "WorkerClient",
    "_node_cost",
    "format_duration",
    "plan_status",
    "preemption",
    "status_change",
]


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

        request, current = self._plan_nodes(ctx, ctx.nodes)  # an earlier plan's nodes are released

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

    # ------------------------------------------------------------------------------ the phases
    # plan: :mod:`gpuscaler.controller.phases.plan`
    _deadline_hours = phase_plan._deadline_hours
    _plan = phase_plan._plan
    _adopt = phase_plan._adopt
    _planner = phase_plan._planner
    _call_planner = phase_plan._call_planner
    _observe = phase_plan._observe
    _workers_refused = phase_plan._workers_refused
    _begin_gang = phase_plan._begin_gang
    _queued = phase_plan._queued
    _plan_within_quota = phase_plan._plan_within_quota
    _back_off = phase_plan._back_off
    _plan_nodes = phase_plan._plan_nodes
    _priced = phase_plan._priced
    _request = phase_plan._request
    # provision: :mod:`gpuscaler.controller.phases.provision`
    _gang_timed_out = phase_provision._gang_timed_out
    _give_up_offering = phase_provision._give_up_offering
    _provisioning = phase_provision._provisioning
    _worker_plan = phase_provision._worker_plan
    # run: :mod:`gpuscaler.controller.phases.run`
    _starting = phase_run._starting
    _workers_created = phase_run._workers_created
    _nodes_for_pods = phase_run._nodes_for_pods
    _preempted = phase_run._preempted
    _lost = phase_run._lost
    _running = phase_run._running
    _checkpointing = phase_run._checkpointing
    # interruptions: :mod:`gpuscaler.controller.phases.interruptions`
    _interrupted = phase_interruptions._interrupted
    _to_recovery = phase_interruptions._to_recovery
    _replan_rest = phase_interruptions._replan_rest
    _recovering = phase_interruptions._recovering
    # finish: :mod:`gpuscaler.controller.phases.finish`
    _stop_gang = phase_finish._stop_gang
    _fail_running = phase_finish._fail_running
    _delete_workers = phase_finish._delete_workers
    _start_jobset = phase_finish._start_jobset
    _worker_identity = phase_finish._worker_identity
    _release = phase_finish._release
    _progress = phase_finish._progress
    _publish_preemption_cost = phase_finish._publish_preemption_cost
    _rejected_reports = phase_finish._rejected_reports
    _cost = phase_finish._cost
