"""The planner as the simulator calls it: :func:`gpuscaler.planner.plan`, memoised by spec signature.

A trace repeats itself (the nightly retraining, the sweep of one configuration), and every strategy
plans every job, so plans are cached by (spec as JSON, hours to the deadline, unavailable
offerings). The cache keeps only what the simulator needs from a plan (the chosen candidate and the
front), not the whole :class:`~gpuscaler.planner.PlanResult`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuscaler.api import Objective, SpotPolicy, TrainingAmount, TrainingJobSpec
from gpuscaler.catalog import Catalog, UnknownIdError
from gpuscaler.planner import Candidate, JobError, plan
from gpuscaler.policy import Policy


@dataclass(frozen=True, slots=True)
class Choice:
    """What the simulator keeps of one planner call."""

    chosen: Candidate | None
    pareto: tuple[Candidate, ...]
    error: str = ""


class CachedPlanner:
    """Calls the planner, memoising results by spec signature.

    Attributes:
        calls: planner invocations requested.
        misses: invocations that ran the planner (the rest were cache hits).
        planning_s: seconds spent inside the planner.
    """

    def __init__(self, catalog: Catalog, policy: Policy | None = None, *, cache: bool = True) -> None:
        self.catalog = catalog
        self.policy = policy or Policy()
        self.cache_enabled = cache
        self._cache: dict[tuple[str, float | None, frozenset[tuple[str, str]]], Choice] = {}
        self.calls = 0
        self.misses = 0
        self.planning_s = 0.0

    def choose(
        self,
        spec: TrainingJobSpec,
        deadline_h: float | None,
        unavailable: frozenset[tuple[str, str]] = frozenset(),
        name: str = "trainingjob",
    ) -> Choice:
        """Plan ``spec`` with ``deadline_h`` hours left (the spec's own deadline fields are ignored).

        Args:
            spec: the spec to plan; its ``deadline`` and ``maxDuration`` are stripped.
            deadline_h: hours to the deadline, or None for no deadline.
            unavailable: (instance type, capacity type) pairs without capacity right now.
            name: the job's name, for the planner's messages.

        Returns:
            The chosen candidate (None when infeasible or unplannable, with ``error``) and the front.
        """
        spec = strip_deadline(spec)
        self.calls += 1
        key = (spec.model_dump_json(), None if deadline_h is None else round(deadline_h, 6), unavailable)
        if self.cache_enabled and key in self._cache:
            return self._cache[key]
        self.misses += 1
        try:
            result = plan(spec, self.catalog, self.policy, name=name, deadline_h=deadline_h, unavailable=unavailable)
        except (JobError, UnknownIdError, ValueError) as err:
            choice = Choice(None, (), str(err))
        else:
            self.planning_s += result.planning_seconds
            choice = Choice(result.chosen, tuple(result.pareto), "" if result.ok else result.why)
        if self.cache_enabled:
            self._cache[key] = choice
        return choice

    @property
    def hit_rate(self) -> float:
        """Share of calls answered from the cache."""
        return 1.0 - self.misses / self.calls if self.calls else 0.0


def strip_deadline(spec: TrainingJobSpec) -> TrainingJobSpec:
    """The spec without ``deadline``/``maxDuration`` (the simulator passes hours left explicitly)."""
    if spec.deadline is None and spec.max_duration is None:
        return spec
    return spec.model_copy(update={"deadline": None, "max_duration": None})


def with_remaining(
    spec: TrainingJobSpec,
    samples: float | None = None,
    *,
    spot: SpotPolicy | None = None,
    budget_usd: float | bool | None = False,
    constraints: Mapping[str, object] | None = None,
) -> TrainingJobSpec:
    """A copy of ``spec`` with the remaining samples, a spot mode, a budget and constraint overrides.

    Args:
        spec: the original spec.
        samples: samples still to train (None keeps the spec's amount).
        spot: spot mode to force (None keeps the spec's).
        budget_usd: the budget left; None removes it; False keeps the spec's.
        constraints: other ``Constraints`` fields to override (snake_case names).
    """
    update: dict[str, object] = {}
    if samples is not None:
        update["training"] = TrainingAmount(samples=max(samples, 1.0))
    cons: dict[str, object] = dict(constraints or {})
    if spot is not None:
        cons["spot"] = spot
    if cons:
        update["constraints"] = spec.constraints.model_copy(update=cons)
    if budget_usd is not False:
        update["budget_usd"] = budget_usd
        if budget_usd is None and spec.objective is Objective.FASTEST:
            update["objective"] = Objective.CHEAPEST
    return spec.model_copy(update=update) if update else spec
