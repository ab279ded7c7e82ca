"""Events on a gang's way to Running, at the pace people read them.

A gang that runs within ``LoopConfig.progress_event_after_s`` (``settings.progress_event_after_s``,
30 s by default) of its request posts no Event between ``Planned`` and ``Started`` (or
``Recovered``): that Event carries the way there as a timeline, e.g. ``requested, nodes Ready
+1.2s, running +2.3s``. A wait that lasts that long is said once, when it has: ``ScaledUp`` while
nodes are missing (from the request), ``WorkersCreated`` while the workers do not run (from their
nodes being Ready). A gang that has waited that long since its request posts each later step as it
happens (``ScaledUp``, ``NodesReady``, ``WorkersCreated``), as every step was posted before. On a
real cloud a node boots and an image is pulled in minutes, so there the steps are still posted;
where a gang comes up in seconds (kwok, nodes that exist), four Events in three seconds said no
more than one does, and each was a POST to the API server.

Which wait has been said is in the status, not in memory: the condition the wait is about
(``NodesReady`` while nodes are missing, ``Running`` while workers do not run) is False with reason
:data:`WAITING_FOR_NODES` or :data:`WAITING_FOR_WORKERS` from that step on.
"""
from __future__ import annotations

from datetime import datetime

from gpuscaler.api.status import TrainingJobStatus
from gpuscaler.controller.step import StepContext, format_duration
from gpuscaler.names import ConditionType, EventReason

WAITING_FOR_NODES = "WaitingForNodes"
"""``NodesReady`` False: the gang's nodes were not all Ready ``progress_event_after_s`` after its request."""
WAITING_FOR_WORKERS = "WaitingForWorkers"
"""``Running`` False: the gang's workers were not all running ``progress_event_after_s`` after its request."""


def waited_s(st: TrainingJobStatus, now: datetime) -> float:
    """Seconds since the current gang was requested (0 before it is)."""
    started = st.provisioning_started_at
    return max((now - started).total_seconds(), 0.0) if started is not None else 0.0


def slow(ctx: StepContext, after_s: float) -> bool:
    """Whether the gang has waited ``after_s`` or longer since its request."""
    return ctx.status.provisioning_started_at is not None and waited_s(ctx.status, ctx.now) >= after_s


def step_event(ctx: StepContext, after_s: float, reason: EventReason, message: str) -> None:
    """A step on the way to Running: its Event when the gang is slow, else left to the timeline."""
    if slow(ctx, after_s):
        ctx.event("Normal", reason, message)


def nodes_ready_at(st: TrainingJobStatus) -> datetime | None:
    """When the current gang's nodes were all Ready (the ``NodesReady`` condition turned True after
    the gang's request), else None."""
    started = st.provisioning_started_at
    ready = next((c for c in st.conditions if c.type == ConditionType.NODES_READY and c.status == "True"), None)
    if started is None or ready is None or ready.last_transition_time < started:
        return None
    return ready.last_transition_time


def waiting_since(st: TrainingJobStatus, condition: ConditionType) -> datetime | None:
    """When the wait ``condition`` is about began: nodes from the gang's request; workers from their
    nodes being Ready (from the request where the workers come first)."""
    if condition is ConditionType.NODES_READY:
        return st.provisioning_started_at
    return nodes_ready_at(st) or st.provisioning_started_at


def still_waiting(
    ctx: StepContext, after_s: float, condition: ConditionType, reason: EventReason, message: str, condition_message: str
) -> bool:
    """Once a wait has lasted ``after_s`` (:func:`waiting_since`): ``condition`` False for
    :data:`WAITING_FOR_NODES` or :data:`WAITING_FOR_WORKERS`, and, in the step where it first says
    so, the Event ``reason`` with ``message`` and how long it has waited.

    Args:
        ctx: The step.
        after_s: ``LoopConfig.progress_event_after_s``.
        condition: ``NodesReady`` (nodes missing) or ``Running`` (workers not running).
        reason: The Event's reason (``ScaledUp`` or ``WorkersCreated``).
        message: The start of the Event's message (it is posted once).
        condition_message: The condition's message (stable from step to step: a change is a write).

    Returns:
        Whether the wait has lasted ``after_s`` (the condition was set here).
    """
    since = waiting_since(ctx.status, condition)
    if since is None or (ctx.now - since).total_seconds() < after_s:
        return False
    waiting, what = (
        (WAITING_FOR_NODES, "the request")
        if condition is ConditionType.NODES_READY
        else (WAITING_FOR_WORKERS, "the nodes were Ready" if nodes_ready_at(ctx.status) else "the request")
    )
    message = f"{message} {format_duration((ctx.now - since).total_seconds())} after {what}"
    had = next((c for c in ctx.status.conditions if c.type == condition), None)
    if had is None or had.status != "False" or had.reason != waiting:
        ctx.event("Normal", reason, message)
    ctx.condition(condition, False, waiting, condition_message)
    return True


def timeline(st: TrainingJobStatus, now: datetime) -> str:
    """The gang's way from its request to running, for the Started or Recovered Event:
    ``requested, nodes Ready +1.2s, running +2.3s`` (the nodes' time from the ``NodesReady``
    condition, when it turned True after the request); empty before a gang was requested."""
    started = st.provisioning_started_at
    if started is None:
        return ""
    parts = ["requested"]
    if (ready := nodes_ready_at(st)) is not None:
        parts.append(f"nodes Ready +{_seconds((ready - started).total_seconds())}")
    parts.append(f"running +{_seconds(waited_s(st, now))}")
    return ", ".join(parts)


def _seconds(s: float) -> str:
    """``1.234`` -> ``1.2s``; ``75`` -> ``1m15s`` (:func:`format_duration` from a minute on)."""
    return f"{s:.1f}s" if s < 60 else format_duration(s)
