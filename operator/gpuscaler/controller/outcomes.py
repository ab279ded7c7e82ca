"""Outcomes of a step that never reaches the loop, and the PolicyInvalid condition.

Called by the handler (:func:`gpuscaler.handlers.trainingjob.reconcile`) before or after
:meth:`gpuscaler.controller.reconcile.Reconciler.step`: a spec the models refuse (the CRD schema
let it through: an older CRD, a future field), no valid policy in force (fail closed), and the
``PolicyInvalid`` condition from the policy source's errors. Pure: status in, status out.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from pydantic import ValidationError

from gpuscaler.api.events import Event, capped, set_condition
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.controller.policy import PolicyUnavailableError
from gpuscaler.controller.reconcile import Outcome
from gpuscaler.inputs import format_validation, iter_fields
from gpuscaler.names import ConditionType, EventReason


def invalid_spec(current: TrainingJobStatus, err: ValidationError, generation: int) -> Outcome:
    """The status of a job whose spec the models refuse (the CRD schema let it through: an older
    CRD, a future field): Failed with the ``InvalidSpec`` condition naming each field, one Event."""
    now = datetime.now(UTC)
    st = current.model_copy(deep=True)
    out = Outcome(st)
    fields = ", ".join(dict.fromkeys(loc for loc, _, _ in iter_fields(err)))
    message = format_validation(err, "spec").replace("\n  ", "; ").replace(":;", ":")
    was = any(c.type == ConditionType.FAILED and c.reason == "InvalidSpec" and c.status == "True" for c in st.conditions)
    st.phase = Phase.FAILED
    st.completion_time = st.completion_time or now
    st.message = capped(f"invalid spec ({fields}): {message}")
    set_condition(st, ConditionType.PLANNED, False, "InvalidSpec", message, now, generation)
    set_condition(st, ConditionType.FAILED, True, "InvalidSpec", message, now, generation)
    st.observed_generation = generation
    if not was:
        out.events.append(Event("Warning", EventReason.INVALID_SPEC, st.message))
    return out




def policy_invalid(st: TrainingJobStatus, errors: Mapping[str, str], out: Outcome, generation: int) -> None:
    """Set (or clear) the ``PolicyInvalid`` condition from the policy source's errors; an Event when
    it turns true."""
    was = any(c.type == ConditionType.POLICY_INVALID and c.status == "True" for c in st.conditions)
    if errors:
        message = capped("; ".join(errors.values()).replace("\n  ", " "))
        set_condition(st, ConditionType.POLICY_INVALID, True, "InvalidPolicy", message, datetime.now(UTC), generation)
        if not was:
            out.events.append(Event("Warning", EventReason.INVALID_POLICY, message))
    elif was:
        set_condition(st, ConditionType.POLICY_INVALID, False, "PoliciesValid", "every policy source is valid", datetime.now(UTC), generation)


def policy_unavailable(current: TrainingJobStatus, err: PolicyUnavailableError, generation: int) -> Outcome:
    """A job while no policy can be loaded: not planned (fail closed), phase kept until it can be."""
    st = current.model_copy(deep=True)
    out = Outcome(st)
    if st.phase in (Phase.PENDING, Phase.PLANNING):
        st.phase = Phase.PENDING
        st.message = capped(f"not planned: no valid policy in force: {err}")
    st.observed_generation = generation
    return out
