"""What a reconcile step posts and how it sets conditions: one Event type, one condition setter.

Used by the controller (:mod:`gpuscaler.controller`) and the observer (:mod:`gpuscaler.observe`);
the handler posts the Events on the TrainingJob. Pure: no client.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuscaler.api.status import Condition, TrainingJobStatus

MESSAGE_CHARS = 1000
"""An Event's message is cut to this many characters (the API server refuses messages over 1 KiB)."""


def capped(text: str) -> str:
    """``text`` cut to :data:`MESSAGE_CHARS`: a status or condition message kept as short as an Event's."""
    return text[:MESSAGE_CHARS]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the TrainingJob: the one place Events are built.

    The message is cut to :data:`MESSAGE_CHARS` here, so no caller cuts it.
    """

    type: str
    """Normal or Warning."""
    reason: str
    """A :class:`gpuscaler.names.EventReason` (the observer's findings post their own types)."""
    message: str

    def __post_init__(self) -> None:
        if len(self.message) > MESSAGE_CHARS:
            object.__setattr__(self, "message", capped(self.message))


def set_condition(
    st: TrainingJobStatus, ctype: str, status: bool, reason: str, message: str, now: datetime, generation: int
) -> None:
    """Set a condition of ``st``; its lastTransitionTime moves only when its status changes.

    Args:
        st: The status to change.
        ctype: The condition type (:class:`gpuscaler.names.ConditionType`, or an observer finding).
        status: True or False.
        reason: A CamelCase reason.
        message: What a user reads.
        now: The time of the change.
        generation: The job's generation it was decided on.
    """
    value = "True" if status else "False"
    at = next((i for i, c in enumerate(st.conditions) if c.type == ctype), None)
    old = None if at is None else st.conditions[at]
    cond = Condition(
        type=ctype,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=old.last_transition_time if old is not None and old.status == value else now,
        observed_generation=generation,
    )
    if at is None:
        st.conditions.append(cond)
    else:
        st.conditions[at] = cond
