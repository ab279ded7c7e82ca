"""When a step's status is written: at once, later (cost and ETA alone), or held a moment (a gang's move to Starting).

Each status write is a PATCH and a watch event to every watcher of TrainingJobs (the operator's own,
the garbage collector's, any ``kubectl get -w``). A job on its way to Running changes phase three
times: Provisioning (planned, nodes asked for), Starting (nodes Ready, workers created), Running.
Where the workers run within a moment of being created (nodes that were Ready at once, images
already on the node), Starting is over before anyone reads it: the move to Starting is **held** for
up to ``settings.starting_write_hold_s`` (3 s by default), and the step that sees the workers
running writes both moves in one PATCH. A gang still Starting when the hold ends is written then
(its daemon is stepped at that moment). Until a held status is written, the job's next step starts
from it, not from the one on the server.

Nothing else is held: a plan, a node asked for, a notice, an interruption, a failure, a finish is
written by the step that decided it, and Provisioning is written at once, so what a namespace holds
(policy caps read the phase and GPUs of its jobs) is never later than before. An operator that
restarts during a hold steps the job from Provisioning again: the nodes are Ready and the workers
exist (created if absent, by name), so it moves to Starting as before.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from gpuscaler.api.status import Phase
from gpuscaler.controller.step import status_change


class Write(StrEnum):
    """What to do with a step's status."""

    NOW = "now"
    """Write it (a change of state, or cost and ETA due a refresh, or a hold that ended)."""
    HOLD = "hold"
    """Keep it for the job's next step (a gang's move to Starting, within the hold)."""
    NONE = "none"
    """Nothing to write (no change, or cost and ETA alone before their refresh)."""


HELD_PHASES = frozenset({Phase.STARTING.value})
"""The phases a status is held in (from Provisioning or Starting)."""


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
        hold_s: ``settings.starting_write_hold_s`` (0: nothing is held).

    Returns:
        :attr:`Write.NOW`, :attr:`Write.HOLD` or :attr:`Write.NONE`.
    """
    change = status_change(server, new) if server else "state"
    if change == "none":
        return Write.NONE
    if change == "clock":
        return Write.NOW if since_write_s >= refresh_s else Write.NONE
    coming_up = new.get("phase") in HELD_PHASES and server.get("phase") in (Phase.PROVISIONING.value, *HELD_PHASES)
    if coming_up and hold_s > 0 and (held_for_s is None or held_for_s < hold_s):
        return Write.HOLD
    return Write.NOW


def hold_left_s(held_for_s: float | None, hold_s: float) -> float | None:
    """Seconds until a held status must be written (None: nothing held)."""
    return None if held_for_s is None else max(hold_s - held_for_s, 0.0)
