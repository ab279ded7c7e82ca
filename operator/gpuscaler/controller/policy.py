"""Platform policies in the operator: which policy governs a job, and the gate before provisioning.

The policies in force come from two places, merged per namespace by
:func:`gpuscaler.policy.policy_for_namespace`: the policy file the chart mounts
(``GPUSCALER_POLICY_FILE``, re-read whenever it changes on disk) and the ``GPUScalingPolicy``
objects of the cluster (a kopf index kept by a watch). So a policy change applies to the next
plan without a restart.

A bad policy (a file that does not parse or breaks the schema, a GPUScalingPolicy object an older
CRD let through) never stops the operator: the last good version of that file or object stays in
force and :attr:`PolicySource.errors` says what is wrong, which the handler shows on every job as
the ``PolicyInvalid`` condition with an Event. With no good version to fall back on (the first
read failed) the source fails closed: :class:`PolicyUnavailableError`, and jobs are not planned.

The gate wraps the planner the reconcile loop calls:

1. ``check_job``: rules the spec breaks before any planning (a forbidden GPU type, more GPUs than
   the per-job cap, a namespace whose monthly budget is spent);
2. plan under the policy; if no plan is feasible but one would be without the policy, the policy
   is what stops the job: the chosen plan of the unrestricted planner is checked against the caps
   to name the rule and the values;
3. ``check_plan`` on the chosen plan, with what the namespace already holds (namespace GPU cap).

A broken rule raises :class:`PolicyViolationError`; the reconcile step
(:class:`gpuscaler.controller.reconcile.Reconciler`) turns it into the ``PolicyViolation``
condition, keeps the job Pending and provisions nothing. The governance reaches the gate as an
argument: the handler reads it for each step and passes it to the loop, which passes it on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import Catalog
from gpuscaler.controller.plan_cache import PlanFn
from gpuscaler.errors import InfeasibleError, TemporaryError
from gpuscaler.inputs import format_validation
from gpuscaler.planner import PlanResult, plan
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.policy import (
    NamespaceUsage,
    Policy,
    PolicyFileError,
    Violation,
    check_job,
    check_plan,
    from_document,
    load_policies,
    policy_for_namespace,
)

ACTIVE_PHASES = frozenset({"Provisioning", "Starting", "Running", "Checkpointing", "Recovering"})
"""Phases in which a job holds GPUs (counted against ``maxGpusPerNamespace``)."""


class PolicyViolationError(InfeasibleError):
    """The job breaks a policy rule; carries the violations (rule, policy, value, limit)."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        super().__init__("; ".join(v.message for v in violations))

    @property
    def rule(self) -> str:
        return self.violations[0].rule if self.violations else "Policy"


class PolicyUnavailableError(TemporaryError):
    """A policy source is invalid and has no good version to fall back on: jobs are not planned."""


@dataclass
class PolicySource:
    """The policies in force: the mounted file (re-read on change) plus GPUScalingPolicy objects,
    each falling back to its last good version when the current one is invalid."""

    path: str | None
    errors: dict[str, str] = field(default_factory=dict)
    """What is wrong with each invalid source ("policy file PATH", "GPUScalingPolicy NAME")."""
    _mtime: float | None = None
    _file: list[Policy] | None = None
    _objects: dict[str, Policy] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _failed(self, source: str, message: str, fallback: object) -> None:
        self.errors[source] = message + (
            "; the last good version stays in force" if fallback is not None else "; no good version to use"
        )

    def file_policies(self) -> list[Policy]:
        """The file's policies, re-read when its modification time changed; the last good ones
        while the file is invalid (the problem in :attr:`errors`).

        Raises:
            PolicyUnavailableError: the file is invalid and no version of it was ever good.
        """
        if not self.path:
            return []
        source = f"policy file {self.path}"
        with self._lock:
            try:
                mtime: float | None = Path(self.path).stat().st_mtime
            except OSError as err:
                mtime = None
                self._failed(source, f"{source}: cannot be read ({err.strerror or err})", self._file)
            if mtime is not None and mtime != self._mtime:
                self._mtime = mtime
                try:
                    self._file = load_policies(self.path)
                    self.errors.pop(source, None)
                except ValidationError as err:
                    self._failed(source, format_validation(err, source), self._file)
                except PolicyFileError as err:
                    self._failed(source, f"{source}: {err}", self._file)
            if self._file is None:
                raise PolicyUnavailableError(self.errors.get(source, f"{source}: not loaded"))
            return list(self._file)

    def object_policies(self, objects: Iterable[dict[str, Any]]) -> list[Policy]:
        """Policies of the GPUScalingPolicy bodies, an invalid one replaced by its last good version.

        Raises:
            PolicyUnavailableError: an object is invalid and no version of it was ever good.
        """
        out: list[Policy] = []
        names = set()
        for body in objects:
            name = str((body.get("metadata") or {}).get("name", "policy"))
            names.add(name)
            source = f"GPUScalingPolicy {name}"
            try:
                policy = from_document(body)
            except (ValidationError, PolicyFileError) as err:
                detail = format_validation(err, source) if isinstance(err, ValidationError) else f"{source}: {err}"
                with self._lock:
                    self._failed(source, detail, self._objects.get(name))
                if name not in self._objects:
                    raise PolicyUnavailableError(self.errors[source]) from None
                out.append(self._objects[name])
                continue
            with self._lock:
                self._objects[name] = policy
                self.errors.pop(source, None)
            out.append(policy)
        with self._lock:  # deleted objects: forget their last good version and their error
            for gone in set(self._objects) - names:
                del self._objects[gone]
                self.errors.pop(f"GPUScalingPolicy {gone}", None)
        return out

    def for_namespace(self, namespace: str, objects: Iterable[dict[str, Any]] = ()) -> Policy:
        """The merged policy for ``namespace`` from the file and the GPUScalingPolicy bodies.

        Raises:
            PolicyUnavailableError: a source is invalid with no good version to fall back on.
        """
        return policy_for_namespace([*self.file_policies(), *self.object_policies(objects)], namespace)


def held_nodes(jobs: Iterable[dict[str, Any]], exclude: tuple[str, str]) -> dict[str, int]:
    """Nodes of each held capacity pool the active jobs hold (``status.plan.heldCapacity``), but ``exclude``.

    Args:
        jobs: ``{"namespace", "name", "phase", "heldCapacity", "nodes"}`` of every TrainingJob.
        exclude: (namespace, name) of the job being planned.
    """
    out: dict[str, int] = {}
    for j in jobs:
        pool = j.get("heldCapacity")
        if pool and j.get("phase") in ACTIVE_PHASES and (j.get("namespace"), j.get("name")) != exclude:
            out[str(pool)] = out.get(str(pool), 0) + int(j.get("nodes") or 0)
    return out


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
    given: NamespaceUsage | Callable[[], NamespaceUsage] = field(default_factory=NamespaceUsage)
    """The namespace's usage, or how to gather it (called at most once, by :attr:`usage`)."""

    @cached_property
    def usage(self) -> NamespaceUsage:
        """The namespace's usage, gathered the first time it is read: only a step that plans reads
        it, and gathering it reads every TrainingJob the operator knows (O(jobs) per step, so
        O(jobs^2) for a burst of new jobs when every step gathered it)."""
        return self.given() if callable(self.given) else self.given


def gated_plan(
    spec: TrainingJobSpec,
    name: str,
    deadline_h: float | None,
    unavailable: frozenset[tuple[str, ...]],
    /,
    efficiency: Mapping[str, float] | None = None,
    governance: Governance | None = None,
    profiles: ProfileStore | None = None,
    *,
    catalog: Catalog,
    plan_fn: PlanFn = plan,
) -> PlanResult:
    """Plan under ``governance`` (no policy when None), the gate of the module docstring.

    With ``catalog`` bound (``functools.partial(gated_plan, catalog=...)``) it is the loop's
    :class:`gpuscaler.controller.interruptions.Planner`.

    Args:
        spec: The job's spec.
        name: The job's name.
        deadline_h: Hours left to the deadline (None: no deadline).
        unavailable: Offerings in back-off, as (instance type, capacity type).
        efficiency: Observed/model efficiency per GPU id (None: the model as is).
        governance: The policy governing the job and its namespace's usage (the loop passes
            what the handler read for this step).
        profiles: Performance profiles of the job's namespace (measured priors); None: none.
        catalog: The instance catalog.
        plan_fn: The planner (the operator passes its cache's, :mod:`gpuscaler.controller.plan_cache`).

    Returns:
        The planner's result under the policy.

    Raises:
        PolicyViolationError: the spec or the plan breaks a rule, or only the policy stops the job.
    """
    gov = governance
    policy = gov.policy if gov else Policy()
    usage = gov.usage if gov else NamespaceUsage()
    before = check_job(spec.model_dump(mode="json", by_alias=True, exclude_none=True), policy, usage, catalog)
    if before:
        raise PolicyViolationError(before)
    result = plan_fn(
        spec, catalog, policy, name=name, deadline_h=deadline_h, unavailable=unavailable, efficiency=efficiency,
        profiles=profiles, **({"held_in_use": usage.held_nodes} if usage.held_nodes else {}),
    )
    chosen = result.chosen
    if chosen is None:
        if gov is None:
            return result
        free = plan_fn(
            spec, catalog, None, name=name, deadline_h=deadline_h, unavailable=unavailable, efficiency=efficiency,
            profiles=profiles,
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
