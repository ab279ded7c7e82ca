"""The Starting and Running phases: workers created on the plan's nodes, running, preempted or lost, and the checkpoint a notice asks for (sub-reconciler of :class:`gpuscaler.controller.reconcile.Reconciler`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from gpuscaler.api.status import Phase
from gpuscaler.cloud import NodeRequest, NodeState
from gpuscaler.cloud.nodes import NODE_DELETED, WORKER_PREEMPTED
from gpuscaler.controller import bringup, queueing
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller import preemption as preemption_cost
from gpuscaler.controller.step import StepContext, format_duration, preemption
from gpuscaler.controller.windows import window_closing
from gpuscaler.kube.workers import (
    PodState,
    headless_service,
    needs_rendezvous_service,
    uses_worker_account,
    worker_pod,
    worker_rbac,
)
from gpuscaler.names import ConditionType, EventReason

if TYPE_CHECKING:
    from gpuscaler.controller.reconcile import Reconciler


def _starting(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
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
    made = [
        r
        for r in range(request.count)
        if r not in have and self.workers.create_if_absent(preemption_cost.at_creation(worker_pod(wp, r), ctx.now))
    ]
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
        said = [s for s in ("" if first else spot.recovered(st, ctx.now), bringup.timeline(st, ctx.now)) if s]
        ctx.event(
            "Normal",
            reason,
            f"all {request.count} worker(s) {verb} on {request.instance.name}" + (f" ({'; '.join(said)})" if said else ""),
        )
        self._running(ctx, request, nodes)
        return
    st.message = f"{len(running)}/{request.count} workers running"
    if self.provider.launches_for_workers(request):
        self._nodes_for_pods(ctx, request, nodes)
    bringup.still_waiting(
        ctx,
        self.config.progress_event_after_s,
        ConditionType.RUNNING,
        EventReason.WORKERS_CREATED,
        f"{st.message} (attempt {st.attempt})",
        st.message,
    )
    if self._gang_timed_out(ctx):
        why = f"only {len(running)} of {request.count} workers started within {self.config.gang_timeout_s:g}s"
        self._give_up_offering(ctx, nodes, why)


def _workers_created(self: Reconciler, ctx: StepContext, text: str) -> None:
    """The WorkersCreated Event of a slow gang (:mod:`gpuscaler.controller.bringup`), or, when this
    step also posted NodesReady, that Event saying so too: at most one Event per step (each is a POST)."""
    events = ctx.out.events
    if events and events[-1].reason == EventReason.NODES_READY:
        events[-1] = replace(events[-1], message=f"{events[-1].message}; {text}")
    else:
        bringup.step_event(ctx, self.config.progress_event_after_s, EventReason.WORKERS_CREATED, text)


def _nodes_for_pods(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
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
        bringup.step_event(ctx, self.config.progress_event_after_s, EventReason.NODES_READY, f"all {request.count} node(s) Ready")


def _preempted(self: Reconciler, pod: PodState, nodes: list[NodeState], now: datetime) -> str | None:
    """Why a failed worker counts as preempted (None: a failure), from what the operator knows."""
    node = next((n for n in nodes if n.name == pod.node), None)
    going = node is not None and (node.deleting or spot.node_notice(node, now, self.config.spot) is not None)
    return preemption(pod, node_going=going)


def _lost(self: Reconciler, ctx: StepContext, nodes: list[NodeState]) -> bool:
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
            self._fail_running(ctx, nodes, f"{why}; backoff limit {self.config.backoff_limit} reached",
                               reason="BackoffLimitExceeded", event=EventReason.FAILED, running=("Failed", why))
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


def _running(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
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
        self._observe(ctx, live, nodes)


def _checkpointing(self: Reconciler, ctx: StepContext, request: NodeRequest, nodes: list[NodeState]) -> None:
    st = ctx.status
    done, acked = spot.handshake_done(st, ctx.pods, ctx.now, self.config.spot)
    if done:
        self._to_recovery(ctx, nodes, acked=acked)
    elif st.notice is not None:
        left = f"until {st.notice.deadline:%H:%M:%S}" if st.notice.deadline else "(soft notice)"
        st.message = f"waiting for checkpoint {st.notice.request_id} {left}"
