"""The Checkpointing and Recovering phases: an interruption handled, the rest re-planned (sub-reconciler of :class:`gpuscaler.controller.reconcile.Reconciler`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpuscaler.api.status import Phase
from gpuscaler.cloud import NodeRequest, NodeState, node_names
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller.step import StepContext
from gpuscaler.names import ConditionType, EventReason

if TYPE_CHECKING:
    from gpuscaler.controller.reconcile import Reconciler


def _interrupted(self: Reconciler, ctx: StepContext, nodes: list[NodeState], notice: spot.Notice) -> None:
    """A node's notice: ask the workers for a checkpoint now, or on a hard loss recover at once."""
    st, namespace = ctx.status, ctx.job.namespace
    annotate = lambda pod, ann: self.workers.annotate_pod(namespace, pod, ann)  # noqa: E731
    ctx.out.events.extend(spot.begin_handshake(st, notice, ctx.pods, annotate, ctx.now))
    ctx.condition(ConditionType.RUNNING, False, "Interrupted", st.message)
    st.phase = Phase.CHECKPOINTING
    if notice.hard:
        self._to_recovery(ctx, nodes, acked=False)


def _to_recovery(self: Reconciler, ctx: StepContext, nodes: list[NodeState], *, acked: bool) -> None:
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


def _replan_rest(self: Reconciler, ctx: StepContext, nodes: list[NodeState]) -> bool:
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


def _recovering(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
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
    if st.phase is Phase.PROVISIONING:
        # As a first start does (Reconciler.step): the new plan's nodes are requested in this step.
        # Left to the next, a move with no watch event to wake it (a planned move: the old nodes
        # go only as stale ones, in that next step) waited for the progress timer (30 s).
        request, current = self._plan_nodes(ctx, [n for n in ctx.nodes if n.name not in ctx.out.released])
        self._provisioning(ctx, request, current)
