"""Plans of identical planning inputs, computed once: the operator's planner cache.

The operator plans a job once per spec generation, and a burst of jobs often carries the same
spec (a sweep's copies, a team's template): the planner is pure, so the same inputs give the same
plan, and planning one (tens of milliseconds of CPU, see docs/benchmarks.md, "Planning speed") for each copy
is wasted work while the API server needs the CPU it shares with the operator. The key is every
input of :func:`gpuscaler.planner.plan`: the spec, the policy in force (its price overrides
included), the hours left to the deadline, the offerings short of capacity, the observed
efficiency per GPU, the catalog object (prices) and the performance profiles (their store's version). The job's name only labels the result, so a
hit is the cached result under the asking job's name.

The hours to the deadline move with the clock, so they are rounded down to
:data:`DEADLINE_STEP_H` before planning (a hit or not): the plan is made for at most that much less
time than the job has, never more. Kept in memory only, least recently used out first
(``settings.plan_cache_size`` entries); a restarted operator plans again. Built by the operator's
wiring (:mod:`gpuscaler.handlers.trainingjob`); nothing here talks to the API server.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import Catalog
from gpuscaler.planner import PlanResult, plan
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.policy import Policy

DEADLINE_STEP_H = 1 / 60
"""Hours to the deadline are planned rounded down to the minute: a minute is under 0.1% of the
shortest deadline a job plans for in practice (a couple of hours) and lets jobs created in the same
minute with the same spec share a plan."""


class PlanFn(Protocol):
    """The planner's signature as the cache calls it (:func:`gpuscaler.planner.plan`)."""

    def __call__(
        self,
        spec: TrainingJobSpec,
        catalog: Catalog,
        policy: Policy | None = None,
        *,
        name: str = ...,
        deadline_h: float | None = ...,
        unavailable: frozenset[tuple[str, ...]] = ...,
        efficiency: Mapping[str, float] | None = ...,
        profiles: ProfileStore | None = ...,
        held_in_use: Mapping[str, int] | None = ...,
    ) -> PlanResult: ...


def planned_deadline(deadline_h: float | None) -> float | None:
    """The hours to the deadline the cache plans for: rounded down to :data:`DEADLINE_STEP_H`,
    and never below one step (a deadline already here still plans, as the loop's 0.01 h floor does)."""
    if deadline_h is None:
        return None
    return max(math.floor(deadline_h / DEADLINE_STEP_H) * DEADLINE_STEP_H, min(deadline_h, DEADLINE_STEP_H))


class PlanCache:
    """A least-recently-used map from planning inputs to the plan.

    Args:
        size: The most plans kept (0: no caching, every call plans).
        plan_fn: The planner (injectable for tests).
    """

    def __init__(self, size: int = 128, plan_fn: PlanFn = plan) -> None:
        if size < 0:
            raise ValueError(f"plan cache size must be at least 0, got {size}")
        self.size = size
        self.plan_fn = plan_fn
        self.hits = 0
        self.misses = 0
        self._plans: OrderedDict[Hashable, PlanResult] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def plan(
        self,
        spec: TrainingJobSpec,
        catalog: Catalog,
        policy: Policy | None = None,
        *,
        name: str = "trainingjob",
        deadline_h: float | None = None,
        unavailable: frozenset[tuple[str, ...]] = frozenset(),
        efficiency: Mapping[str, float] | None = None,
        profiles: ProfileStore | None = None,
        held_in_use: Mapping[str, int] | None = None,
    ) -> PlanResult:
        """:func:`gpuscaler.planner.plan` of these inputs, from the cache when they were planned before.

        A policy that declares held capacity (windows that close, pools other jobs take) keys its
        plans by the minute too, and by what other jobs hold of each pool.

        Returns:
            The plan, labelled with ``name``; its deadline is :func:`planned_deadline` of ``deadline_h``.

        Raises:
            Whatever the planner raises for these inputs (nothing is cached then).
        """
        deadline = planned_deadline(deadline_h)
        key = (
            spec.model_dump_json(by_alias=True, exclude_none=True),
            policy.model_dump_json() if policy is not None else None,
            deadline,
            tuple(sorted(unavailable)),
            tuple(sorted((efficiency or {}).items())),
            id(catalog),
            profiles.fingerprint() if profiles else None,
            tuple(sorted((held_in_use or {}).items())),
            int(time.time() // 60) if policy is not None and policy.capacity else None,
        )
        with self._lock:
            got = self._plans.get(key)
            if got is not None:
                self._plans.move_to_end(key)
                self.hits += 1
        if got is not None:
            return got if got.job.name == name else replace(got, job=replace(got.job, name=name))
        extra: dict[str, Any] = {}  # passed only when given: a plan_fn of tests may know neither
        if profiles:
            extra["profiles"] = profiles
        if held_in_use:
            extra["held_in_use"] = held_in_use
        result = self.plan_fn(
            spec,
            catalog,
            policy,
            name=name,
            deadline_h=deadline,
            unavailable=unavailable,
            efficiency=efficiency,
            **extra,
        )
        with self._lock:
            self.misses += 1
            if self.size:
                self._plans[key] = result
                self._plans.move_to_end(key)
                while len(self._plans) > self.size:
                    self._plans.popitem(last=False)
        return result
