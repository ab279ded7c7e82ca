"""When a step's status is written: at once, later (cost and ETA alone), or held a moment (a gang on its way up).

Each status write is a PATCH of the whole TrainingJob at the API server (decoded, patched,
validated against the CRD's schema, its managed fields updated, encoded: about 4 ms of
kube-apiserver CPU each in a 500-job run) and a watch event to every watcher of TrainingJobs (the
operator's own, the garbage collector's, any ``kubectl get -w``). A new job on its way to Running
changes phase three times: Provisioning (planned, nodes asked for), Starting (nodes Ready, workers
created), Running. Where the gang comes up within moments (nodes that boot in a second or exist,
images already on the node), the first two are over before anyone reads them: a new job's way up
(Provisioning, Starting, from Pending or no status) is **held** for up to
``settings.bringup_write_hold_s`` (3 s by default) from its first held step, and the step that sees
the workers running writes it all in one PATCH. A gang still on its way when the hold ends is
written then (its daemon is stepped at that moment), and its next move on the way up is held again,
as long at most. Until a held status is written, the job's next step starts from it, not from the
one on the server.

The ``Planned`` Event is held with the status (:func:`fold_held_events`): a gang that runs within
the hold says its plan in its ``Started`` Event (one Event for the way from the plan to running, as
the status is one write); where the hold ends first, ``Planned`` is posted then, at most
``bringup_write_hold_s`` late, with the status that carries the plan.

What is held is never lost to the operator's own decisions: a namespace's usage and the held
capacity in use (policy caps, :func:`gpuscaler.controller.policy.namespace_usage`) are gathered
from the statuses the operator holds or has just written, not only from the watch's older copy.
Nothing else is held: a notice, an interruption, a failure, a
finish, a policy's refusal, and a gang's way up again after an interruption (Recovering) are
written by the step that decided them. An operator that restarts during a hold plans the job again
from the status on the server: the planner gives the same plan, nodes and workers are created if
absent, by name, so nothing is made twice.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Any

from gpuscaler.api.events import Event
from gpuscaler.api.status import Phase
from gpuscaler.controller.step import status_change
from gpuscaler.names import EventReason


class Write(StrEnum):
    """What to do with a step's status."""

    NOW = "now"
    """Write it (a change of state, or cost and ETA due a refresh, or a hold that ended)."""
    HOLD = "hold"
    """Keep it for the job's next step (a new job on its way up, within the hold)."""
    NONE = "none"
    """Nothing to write (no change, or cost and ETA alone before their refresh)."""


HELD_PHASES = frozenset({Phase.PROVISIONING.value, Phase.STARTING.value})
"""The phases a new job's way up is held in."""
HELD_FROM = frozenset({"", Phase.PENDING.value, Phase.PLANNING.value, *HELD_PHASES})
"""The phases on the server (``""``: no status yet) a status may be held from."""


def decide(
    server: dict[str, Any],
    new: dict[str, Any],
    *,
    held_for_s: float | None,
    since_write_s: float,
    refresh_s: float,
    hold_s: float,
) -> Write:
    """Whether a step's status is written now, held, or not written.

    Args:
        server: The status the API server has (as the watch, or the last write, says; empty for a new job).
        new: The status the step decided (JSON names).
        held_for_s: Seconds since the job's status was first held (None: nothing held).
        since_write_s: Seconds since the job's last status write.
        refresh_s: ``settings.status_refresh_s``: cost and ETA alone are written this often.
        hold_s: ``settings.bringup_write_hold_s`` (0: nothing is held).

    Returns:
        :attr:`Write.NOW`, :attr:`Write.HOLD` or :attr:`Write.NONE`.
    """
    change = status_change(server, new) if server else "state"
    if change == "none":
        return Write.NONE
    if change == "clock":
        return Write.NOW if since_write_s >= refresh_s else Write.NONE
    coming_up = new.get("phase") in HELD_PHASES and str(server.get("phase") or "") in HELD_FROM
    if coming_up and hold_s > 0 and (held_for_s is None or held_for_s < hold_s):
        return Write.HOLD
    return Write.NOW


def hold_left_s(held_for_s: float | None, hold_s: float) -> float | None:
    """Seconds until a held status must be written (None: nothing held)."""
    return None if held_for_s is None else max(hold_s - held_for_s, 0.0)


HELD_EVENTS = frozenset({EventReason.PLANNED.value})
"""The Events held with a held status (the others are posted by the step that decided them)."""


def fold_held_events(held: list[Event], events: list[Event], *, holding: bool) -> tuple[list[Event], list[Event]]:
    """The Events a step posts, and those it keeps with its held status.

    While the status is held (``holding``), the step's :data:`HELD_EVENTS` join ``held`` and the rest
    are posted. When it is written, the latest held ``Planned`` goes into the step's ``Started`` Event
    (``"<Started message>; planned <Planned message>"``) where the gang started in this step, and is
    posted first, as it was, where it did not.

    Args:
        held: The Events kept from the job's earlier held steps (oldest first).
        events: This step's Events.
        holding: This step's status is held (:attr:`Write.HOLD`).

    Returns:
        (to post now, to keep with the held status: the latest held Event, or none).
    """
    if holding:  # only the latest is ever posted: a re-plan within the hold supersedes the plan before it
        keep = [e for e in events if e.reason in HELD_EVENTS]
        return [e for e in events if e.reason not in HELD_EVENTS], (held + keep)[-1:]
    if not held:
        return events, []
    planned = held[-1]
    at = next((i for i, e in enumerate(events) if e.reason == EventReason.STARTED), None)
    if at is None:
        return [planned, *events], []
    started = events[at]
    merged = Event(started.type, started.reason, f"{started.message}; planned {planned.message}")
    return [*events[:at], merged, *events[at + 1:]], []
