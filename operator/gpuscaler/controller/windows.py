"""Held capacity windows in the loop: the planned move before a capacity block closes.

A plan into a capacity block (or a reservation that expires) that the job outlasts is segmented
(:mod:`gpuscaler.planner.held`): ``status.plan.segments[0].checkpointAt`` is when the job must
checkpoint, a margin from its checkpoint's write time before the window's end
(``status.plan.windowEnd``). The window's end is an interruption with a known time, so the loop
treats it as one: at ``checkpointAt`` it raises a notice (:func:`window_closing`) with the
window's end as its deadline, and the interruption sequence of
:mod:`gpuscaler.controller.interruptions` runs as for a spot notice (checkpoint request, the
acknowledgement, the old workers gone, the rest re-planned on the next cheapest capacity). It is a
planned move, not a failure: it does not count against ``policy.spot.maxInterruptions``, backs no
offering off, and its Event is Normal (``PlannedMove``). :func:`seconds_to_move` tells the
wake-up timer when. A plan into a window that opens later waits for it, unprovisioned
(:func:`window_opens_in`; the timer wakes the job when it opens). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gpuscaler.api.status import PlanSegment, TrainingJobStatus
from gpuscaler.cloud.nodes import CAPACITY_WINDOW_END, SOURCES, NodeState
from gpuscaler.controller.interruptions import Notice
from gpuscaler.planner.held import margin_s


def _current(st: TrainingJobStatus) -> PlanSegment | None:
    """The plan's first segment when the job runs in it (a window that closes), else None."""
    plan = st.plan
    if plan is None or not plan.segments or not plan.held_capacity:
        return None
    seg = plan.segments[0]
    if seg.checkpoint_at is None or seg.held_capacity != plan.held_capacity:
        return None
    return seg


def window_closing(
    st: TrainingJobStatus, nodes: Sequence[NodeState], now: datetime, measured_write_s: float | None = None
) -> Notice | None:
    """The planned move's notice once its time has come, else None.

    The time is ``checkpointAt``, or earlier when the job's measured checkpoint write is slower
    than the plan's: ``end - margin(measured)`` (:func:`gpuscaler.planner.held.margin_s`), so the
    margin follows the checkpoint as measured, not as predicted.

    Args:
        st: The job's status (its plan and segments).
        nodes: The job's nodes (the notice names the first).
        now: The time.
        measured_write_s: The workers' measured checkpoint write seconds (None: not measured yet).
    """
    seg = _current(st)
    if seg is None or seg.checkpoint_at is None:
        return None
    assert st.plan is not None
    end = st.plan.window_end or seg.checkpoint_at
    at = seg.checkpoint_at
    if measured_write_s is not None and st.plan.window_end is not None:
        at = min(at, st.plan.window_end - timedelta(seconds=margin_s(measured_write_s)))
    if now < at:
        return None
    node = next((n.name for n in nodes if not n.deleting), nodes[0].name if nodes else "")
    return Notice(node, SOURCES[CAPACITY_WINDOW_END], f"capacity {st.plan.held_capacity} closes at {end:%H:%M:%S}", end)


def seconds_to_move(st: TrainingJobStatus, now: datetime) -> float | None:
    """Seconds until the planned move (None: the plan has none)."""
    seg = _current(st)
    if seg is None or seg.checkpoint_at is None:
        return None
    return (seg.checkpoint_at - now).total_seconds()


def window_opens_in(st: TrainingJobStatus, now: datetime) -> float | None:
    """Seconds until the plan's held capacity window opens (None: it is open, or the plan has none)."""
    plan = st.plan
    if plan is None or not plan.held_capacity or plan.window_start is None or plan.window_start <= now:
        return None
    return (plan.window_start - now).total_seconds()
