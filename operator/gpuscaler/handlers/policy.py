"""Platform policies in the operator: which policy governs a job, and the gate before provisioning.

The policies in force come from two places, merged per namespace by
:func:`gpuscaler.policy.policy_for_namespace`: the policy file the chart mounts
(``GPUSCALER_POLICY_FILE``, re-read whenever it changes on disk) and the ``GPUScalingPolicy``
objects of the cluster (a kopf index kept by a watch). So a policy change applies to the next
plan without a restart.

The gate wraps the planner the reconcile loop calls:

1. ``check_job``: rules the spec breaks before any planning (a forbidden GPU type, more GPUs than
   the per-job cap, a namespace whose monthly budget is spent);
2. plan under the policy; if no plan is feasible but one would be without the policy, the policy
   is what stops the job: the chosen plan of the unrestricted planner is checked against the caps
   to name the rule and the values;
3. ``check_plan`` on the chosen plan, with what the namespace already holds (namespace GPU cap).

A broken rule raises :class:`PolicyViolationError`; the handler turns it into the
``PolicyViolation`` condition, keeps the job Pending and provisions nothing.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import Catalog
from gpuscaler.planner import PlanResult, plan
from gpuscaler.policy import (
    NamespaceUsage,
    Policy,
    Violation,
    check_job,
    check_plan,
    from_document,
    load_policies,
    policy_for_namespace,
)

ACTIVE_PHASES = frozenset({"Provisioning", "Starting", "Running", "Checkpointing", "Recovering"})
"""Phases in which a job holds GPUs (counted against ``maxGpusPerNamespace``)."""


class PolicyViolationError(Exception):
    """The job breaks a policy rule; carries the violations (rule, policy, value, limit)."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        super().__init__("; ".join(v.message for v in violations))

    @property
    def rule(self) -> str:
        return self.violations[0].rule if self.violations else "Policy"


@dataclass
class PolicySource:
    """The policies in force: the mounted file (re-read on change) plus GPUScalingPolicy objects."""

    path: str | None
    _mtime: float | None = None
    _file: list[Policy] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def file_policies(self) -> list[Policy]:
        """The file's policies, re-read when its modification time changed.

        Raises:
            pydantic.ValidationError, PolicyFileError: the file is invalid (the last good one is not
                kept: a platform team's mistake must be loud, not silently ignored).
        """
        if not self.path:
            return []
        mtime = Path(self.path).stat().st_mtime
        with self._lock:
            if mtime != self._mtime:
                self._file = load_policies(self.path)
                self._mtime = mtime
            return list(self._file)

    def for_namespace(self, namespace: str, objects: Iterable[dict[str, Any]] = ()) -> Policy:
        """The merged policy for ``namespace`` from the file and the GPUScalingPolicy bodies."""
        return policy_for_namespace([*self.file_policies(), *(from_document(o) for o in objects)], namespace)


def namespace_usage(
    jobs: Iterable[dict[str, Any]], exclude: str, now: datetime | None = None
) -> NamespaceUsage:
    """GPUs held by a namespace's other active jobs and its jobs' spend this calendar month.

    Args:
        jobs: ``{"name", "phase", "gpus", "costUsd", "startTime"}`` of the namespace's TrainingJobs.
        exclude: the job being planned (its own GPUs and cost do not count against it).
        now: the time that decides "this month".
    """
    now = now or datetime.now(UTC)
    gpus = 0
    usd = 0.0
    for j in jobs:
        if j.get("name") == exclude:
            continue
        if j.get("phase") in ACTIVE_PHASES:
            gpus += int(j.get("gpus") or 0)
        started = j.get("startTime")
        if started:
            when = datetime.fromisoformat(str(started).replace("Z", "+00:00"))
            if (when.year, when.month) == (now.year, now.month):
                usd += float(j.get("costUsd") or 0.0)
    return NamespaceUsage(gpus=gpus, usd_this_month=usd)


@dataclass(frozen=True)
class Governance:
    """What the gate needs for one job: the merged policy and the namespace's usage."""

    policy: Policy
    usage: NamespaceUsage


current: contextvars.ContextVar[Governance | None] = contextvars.ContextVar(
    "gpuscaler_governance", default=None
)
"""Set by the handler around one reconcile step; read by :func:`gated_plan` (the loop's planner
knows the job, not its namespace's policy)."""


def gated_plan(
    spec: TrainingJobSpec,
    catalog: Catalog,
    name: str,
    deadline_h: float | None,
    unavailable: frozenset[tuple[str, str]],
    efficiency: Mapping[str, float] | None = None,
) -> PlanResult:
    """Plan under the governance in :data:`current` (no policy when unset).

    Raises:
        PolicyViolationError: the spec or the plan breaks a rule, or only the policy stops the job.
    """
    gov = current.get()
    policy = gov.policy if gov else Policy()
    usage = gov.usage if gov else NamespaceUsage()
    before = check_job(spec.model_dump(mode="json", by_alias=True, exclude_none=True), policy, usage, catalog)
    if before:
        raise PolicyViolationError(before)
    result = plan(
        spec, catalog, policy, name=name, deadline_h=deadline_h, unavailable=unavailable, efficiency=efficiency
    )
    chosen = result.chosen
    if chosen is None:
        if gov is None:
            return result
        free = plan(
            spec, catalog, None, name=name, deadline_h=deadline_h, unavailable=unavailable, efficiency=efficiency
        ).chosen
        if free is None:
            return result  # infeasible for reasons of its own: the loop reports Infeasible
        caps = check_plan(free.gpus, free.usd_per_hour, free.expected_cost_usd, policy, usage)
        if caps:
            raise PolicyViolationError(caps)
        reasons = sorted({r.reason for r in result.rejected if r.category == "policy"})
        raise PolicyViolationError(
            [Violation("Policy", policy.name, "plan", free.label, None, r) for r in reasons[:3]]
            or [
                Violation(
                    "Policy", policy.name, "plan", free.label, None, f"policy {policy.name}: {result.why}"
                )
            ]
        )
    after = check_plan(chosen.gpus, chosen.usd_per_hour, chosen.expected_cost_usd, policy, usage)
    if after:
        raise PolicyViolationError(after)
    return result
