"""Stopping and accounting: the gang stopped, workers deleted, nodes released, progress, cost and rejected reports (sub-reconciler of :class:`gpuscaler.controller.reconcile.Reconciler`)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from gpuscaler.api.events import capped
from gpuscaler.api.status import Phase
from gpuscaler.cloud import NodeRequest, NodeState
from gpuscaler.controller import bringup, queueing
from gpuscaler.controller import preemption as preemption_cost
from gpuscaler.controller.step import StepContext, _node_cost, format_duration
from gpuscaler.kube.jobset import jobset_name
from gpuscaler.kube.reports import TrustedReport, trusted_report
from gpuscaler.kube.reports import summary as report_summary
from gpuscaler.kube.workers import WorkerPlan, uses_worker_account, worker_rbac
from gpuscaler.names import DO_NOT_DISRUPT_ANNOTATION, ConditionType, EventReason

if TYPE_CHECKING:
    from gpuscaler.controller.reconcile import Reconciler


def _stop_gang(self: Reconciler, ctx: StepContext, nodes: list[NodeState]) -> None:
    self._delete_workers(ctx)
    self._release(ctx, [n for n in nodes if not n.deleting])


def _fail_running(self: Reconciler, ctx: StepContext, nodes: list[NodeState], message: str, *, reason: str,
                  event: str, running: tuple[str, str]) -> None:  # fmt: skip
    """A running job ends as Failed: its gang stopped, ``message`` in the status, the Failed condition
    (``reason``), the Running condition False (``running``: its reason and message) and a Warning Event
    (``event``)."""
    st = ctx.status
    self._stop_gang(ctx, nodes)
    st.phase = Phase.FAILED
    st.completion_time = ctx.now
    st.message = message
    ctx.condition(ConditionType.FAILED, True, reason, message)
    ctx.condition(ConditionType.RUNNING, False, *running)
    ctx.event("Warning", event, message)


def _delete_workers(self: Reconciler, ctx: StepContext) -> None:
    """The gang's workers go: its JobSet (``runtime: jobset``; its Jobs and pods with it), or each pod."""
    if queueing.uses_jobset(ctx.job):
        if self.gangs is not None and ctx.status.attempt:
            queueing.stop_jobset(self.gangs, ctx.job, ctx.status.attempt)
        return
    for p in ctx.pods:
        if not p.deleting:
            self.workers.delete_pod(ctx.job.namespace, p.name)


def _start_jobset(self: Reconciler, ctx: StepContext, request: NodeRequest, wp: WorkerPlan) -> None:
    """The gang's JobSet, created once per gang start (a queued one exists since it was queued)."""
    if self.gangs is None:
        ctx.status.message = "runtime jobset: this operator runs without a JobSet client"
        return
    if queueing.queue_of(ctx.job) is not None:
        return
    self._worker_identity(ctx, wp)
    if queueing.start_jobset(self.gangs, ctx.job, wp, None, self.config.backoff_limit):
        bringup.step_event(
            ctx, self.config.progress_event_after_s, EventReason.WORKERS_CREATED,
            f"created JobSet {jobset_name(wp.job_name, wp.attempt)} of {request.count} worker(s) (attempt {wp.attempt})",
        )


def _worker_identity(self: Reconciler, ctx: StepContext, wp: WorkerPlan) -> None:
    """The workers' ServiceAccount and Role before a JobSet's pods need them (see _starting)."""
    if uses_worker_account(wp.template):
        for body in worker_rbac(ctx.job.namespace):
            self.workers.create_if_absent(body)


def _release(self: Reconciler, ctx: StepContext, nodes: list[NodeState]) -> None:
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


def _progress(self: Reconciler, ctx: StepContext) -> None:
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


def _publish_preemption_cost(self: Reconciler, ctx: StepContext) -> None:
    """The preemption-cost annotations and do-not-disrupt on the workers (gpuscaler.controller.preemption)."""
    own = ((ctx.job.spec.template or {}).get("metadata") or {}).get("annotations") or {}
    cfg = self.config.spot
    for pod, patch in preemption_cost.patches(
        ctx.status, ctx.pods, ctx.now, write_max_s=cfg.checkpoint_write_max_s,
        refresh_s=cfg.preemption_cost_refresh_s, manage_do_not_disrupt=DO_NOT_DISRUPT_ANNOTATION not in own,
    ).items():
        self.workers.annotate_pod(ctx.job.namespace, pod, patch)


def _rejected_reports(self: Reconciler, ctx: StepContext, rep: TrustedReport) -> None:
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


def _cost(self: Reconciler, ctx: StepContext) -> None:
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
