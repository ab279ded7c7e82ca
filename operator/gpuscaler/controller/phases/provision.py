"""The Provisioning phase: nodes requested until all are Ready, the gang timeout and the capacity back-off (sub-reconciler of :class:`gpuscaler.controller.reconcile.Reconciler`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscaler.api.status import Phase
from gpuscaler.cloud import InsufficientCapacityError, NodeRequest, NodeState
from gpuscaler.controller import bringup
from gpuscaler.controller.step import StepContext
from gpuscaler.kube.workers import WorkerPlan
from gpuscaler.names import ConditionType, EventReason

if TYPE_CHECKING:
    from gpuscaler.controller.reconcile import Reconciler


def _gang_timed_out(self: Reconciler, ctx: StepContext) -> bool:
    started = ctx.status.provisioning_started_at or ctx.now
    return (ctx.now - started).total_seconds() > self.config.gang_timeout_s


def _give_up_offering(self: Reconciler, ctx: StepContext, nodes: list[NodeState], why: str) -> None:
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


def _provisioning(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
    st = ctx.status
    short = ""
    try:
        created = self.provider.ensure_nodes(request, nodes)
    except InsufficientCapacityError as err:
        created, short = [], str(err)
    after = self.config.progress_event_after_s
    if created:  # a gang that comes up at once says so in its Started Event (controller/bringup.py)
        bringup.step_event(
            ctx,
            after,
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
        bringup.step_event(ctx, after, EventReason.NODES_READY, f"all {request.count} node(s) Ready")
        st.phase = Phase.STARTING
        self._starting(ctx, request, nodes)
        return
    st.message = f"{len(ready)}/{request.count} nodes Ready" + (f"; {short}" if short else "")
    waiting = f"{len(ready)} of {request.count} x {request.instance.name} ({request.capacity.value}) Ready"
    if short or not bringup.still_waiting(
        ctx,
        after,
        ConditionType.NODES_READY,
        EventReason.SCALED_UP,
        f"{waiting} ({', '.join(st.nodes[:5])})",
        st.message,
    ):
        ctx.condition(ConditionType.NODES_READY, False, "InsufficientCapacity" if short else "Provisioning", st.message)
    if self._gang_timed_out(ctx):
        why = f"only {len(ready)} of {request.count} nodes arrived within {self.config.gang_timeout_s:g}s"
        self._give_up_offering(ctx, nodes, why + (f" ({short})" if short else ""))


def _worker_plan(self: Reconciler, ctx: StepContext, request: NodeRequest) -> WorkerPlan:
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
