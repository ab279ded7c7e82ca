"""The planner as the simulator calls it: :func:`gpuscaler.planner.plan`, memoised by spec signature.

A trace repeats itself (the nightly retraining, the sweep of one configuration), and every strategy
plans every job, so plans are cached by (spec as JSON, hours to the deadline, unavailable
offerings, efficiency factors, selection rule). The cache keeps only what the simulator needs from
a plan (the chosen candidate, the front, and on request one named plan's figures), not
the whole :class:`~gpuscaler.planner.PlanResult`.

Two selection rules:

* ``planner``: the planner's own choice (deadline risk, budget, objective, spot preference);
* ``uninterrupted``: among the planner's feasible plans with no deadline, the one with the lowest
  uninterrupted cost (``base_hours x $/h``) whose uninterrupted time fits the hours left, as an
  optimizer that does not model interruptions picks (SkyPilot's: cost = price x estimated time).
  A :class:`Fit` changes what "fits" means: the uninterrupted time x the model's P90 factor for that
  offering (``managed-spot-padded``), plus a changeover delay (``uniform-progress``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from gpuscaler.api import Objective, SpotPolicy, TrainingAmount, TrainingJobSpec
from gpuscaler.catalog import CapacityType, Catalog, UnknownIdError
from gpuscaler.catalog.prices import Price, PriceTable, apply_prices
from gpuscaler.catalog.zones import zone_region
from gpuscaler.perfmodel.uncertainty import Z90
from gpuscaler.planner import Candidate, JobError, PlanResult, plan
from gpuscaler.planner.correction import PlanOption, fallback_for, plan_option
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.policy import Policy
from gpuscaler.simulator.spot_prices import HISTORY_SOURCE, SpotPriceHistory

PlanKey = tuple[str, int, str, str]
"""(instance type, nodes, capacity type, precision): the same key = the same plan (as the operator keys it)."""
Rule = Literal["planner", "uninterrupted"]


def plan_key(c: Candidate) -> PlanKey:
    """The key of a candidate's plan."""
    return (c.instance.name, c.nodes, c.capacity.value, c.precision.value)


def config_key(c: Candidate) -> tuple[str, int, str]:
    """A configuration whatever its capacity type: (instance type, nodes, precision)."""
    return (c.instance.name, c.nodes, c.precision.value)


def p90_factor(c: Candidate) -> float:
    """The model's P90 factor on time for ``c``'s offering: ``P50 / P10`` of its throughput band.

    With the band's log-space sigma ``s`` (:mod:`gpuscaler.perfmodel.uncertainty`), ``P10 = P50
    exp(-1.2816 s)``, so 9 in 10 runs at the model's error finish within ``exp(1.2816 s)`` of the
    predicted time. 1 for a hand-built candidate without a band.
    """
    return math.exp(Z90 * c.band.log_sigma) if c.band is not None else 1.0


def changeover_s(c: Candidate, restart_s: float) -> float:
    """Seconds a switch away from ``c`` (a reclaim, or leaving it) can cost at most.

    ``d = restart_s + interval + write``: provisioning the next nodes (``restart_s``, the caller's
    longest expected restart), the work a reclaim throws away since the last checkpoint (at most one
    interval) and the checkpoint written on leaving. Can't Be Late's ``d`` (Wu et al., NSDI 2024) is
    the restart alone: its jobs lose no work on a preemption; here a reclaim without a checkpoint
    handshake loses up to one interval.
    """
    return restart_s + c.outlook.interval_s + c.checkpoint_write_s


@dataclass(frozen=True, slots=True)
class Fit:
    """What "the uninterrupted time fits the hours left" means for the ``uninterrupted`` rule."""

    p90_pad: bool = False
    """Multiply the uninterrupted time by the offering's :func:`p90_factor` (once)."""
    changeover_restart_s: float | None = None
    """Add the offering's :func:`changeover_s` with this restart time (None: add nothing)."""

    def hours(self, c: Candidate) -> float:
        """Hours ``c`` must fit into the hours left."""
        h = c.outlook.base_hours * (p90_factor(c) if self.p90_pad else 1.0)
        if self.changeover_restart_s is not None:
            h += changeover_s(c, self.changeover_restart_s) / 3600.0
        return h


@dataclass(frozen=True, slots=True)
class Choice:
    """What the simulator keeps of one planner call."""

    chosen: Candidate | None
    pareto: tuple[Candidate, ...]
    error: str = ""
    current: PlanOption | None = None
    """The plan asked for by ``current`` in :meth:`CachedPlanner.choose`, when it is still feasible."""
    fallback: Candidate | None = None
    """Where the job moves when behind with no plan meeting the risk: the planner's contingency target
    (:func:`gpuscaler.planner.contingency.fallback`), or its alternate when ``current`` is on it
    (:func:`gpuscaler.planner.correction.fallback_for`)."""


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
        self.bought = self.policy.model_copy(update={"capacity": []}) if self.policy.capacity else self.policy
        """The policy without its held capacity: what a plan that does not plan into the pools sees."""
        self.start = datetime(2026, 1, 1, tzinfo=UTC)
        """The trace's start (simulated hour 0; the engine sets it): the pools' windows are read against it."""
        self.held_in_use: dict[str, int] = {}
        """Nodes of each held pool other jobs hold now (the engine sets it per event)."""
        self.spot_prices: SpotPriceHistory | None = None
        """Spot prices that move (the cloud's): plans are made at the prices in force at :attr:`now_h`."""
        self.now_h = 0.0
        """The simulated hour of the plans asked for now (the engine sets it per event)."""
        self._priced: dict[tuple[int, ...], Catalog] = {}
        self.cache_enabled = cache
        self._cache: dict[tuple[object, ...], Choice] = {}
        self.calls = 0
        self.misses = 0
        self.planning_s = 0.0

    def choose(
        self,
        spec: TrainingJobSpec,
        deadline_h: float | None,
        unavailable: frozenset[tuple[str, ...]] = frozenset(),
        name: str = "trainingjob",
        *,
        efficiency: Mapping[str, float] | None = None,
        current: PlanKey | None = None,
        rule: Rule = "planner",
        capacity: CapacityType | None = None,
        fit: Fit | None = None,
        profiles: ProfileStore | None = None,
        held: bool = False,
    ) -> Choice:
        """Plan ``spec`` with ``deadline_h`` hours left (the spec's own deadline fields are ignored).

        Args:
            spec: the spec to plan; its ``deadline`` and ``maxDuration`` are stripped.
            deadline_h: hours to the deadline, or None for no deadline.
            unavailable: (instance type, capacity type) pairs without capacity right now.
            name: the job's name, for the planner's messages.
            efficiency: observed / model throughput per GPU id, as the operator passes it to the
                planner (``plan(..., efficiency=...)``).
            current: a plan to report on (``Choice.current``) if it is among the feasible ones.
            rule: ``planner`` (the planner's choice) or ``uninterrupted`` (module docstring).
            capacity: with ``uninterrupted``, choose among this capacity type only.
            fit: with ``uninterrupted``, what fits the hours left (default: the uninterrupted time).
            profiles: performance profiles to plan with (``plan(..., profiles=...)``), as the operator
                passes its namespace's; the cache keys on the store's fingerprint (it grows with
                every run recorded).
            held: plan into the policy's held capacity (its pools less :attr:`held_in_use`, windows
                read at the simulated :attr:`now_h`), as the operator does; False: the policy
                without it (capacity bought by the hour only).

        Returns:
            The chosen candidate (None when infeasible or unplannable, with ``error``) and the front.
        """
        spec = strip_deadline(spec)
        self.calls += 1
        eff = tuple(sorted((g, round(f, 6)) for g, f in (efficiency or {}).items()))
        catalog, epoch = self._catalog()
        held = held and bool(self.policy.capacity)
        in_use = tuple(sorted(self.held_in_use.items())) if held else None
        at = round(self.now_h, 6) if held else None
        key = (spec.model_dump_json(), None if deadline_h is None else round(deadline_h, 6), unavailable, eff,
               current, rule, capacity, fit, profiles.fingerprint() if profiles else None, epoch, in_use, at)
        if self.cache_enabled and key in self._cache:
            return self._cache[key]
        self.misses += 1
        factors = dict(eff) or None
        try:
            result = plan(spec, catalog, self.policy if held else self.bought, name=name, unavailable=unavailable,
                          efficiency=factors, deadline_h=deadline_h if rule == "planner" else None,
                          profiles=profiles or None, **self._held_args(held))
        except (JobError, UnknownIdError, ValueError) as err:
            choice = Choice(None, (), str(err))
        else:
            self.planning_s += result.planning_seconds
            choice = _select(result, rule, deadline_h, capacity, current, fit or Fit())
        if self.cache_enabled:
            self._cache[key] = choice
        return choice

    def _held_args(self, held: bool) -> dict[str, Any]:
        """``plan``'s ``now`` and ``held_in_use`` for a plan into the pools (none otherwise)."""
        if not held:
            return {}
        return {"now": self.start + timedelta(hours=self.now_h), "held_in_use": dict(self.held_in_use)}

    def _catalog(self) -> tuple[Catalog, tuple[int, ...] | None]:
        """The catalog at the spot prices in force at :attr:`now_h` (per zone), and their epoch."""
        history = self.spot_prices
        if history is None:
            return self.catalog, None
        epoch = history.epoch(self.now_h)
        found = self._priced.get(epoch)
        if found is None:
            rows = []
            for name, zone, usd in history.in_force(self.now_h):
                if name not in self.catalog.instances:
                    continue
                provider = self.catalog.instance(name).provider
                region = zone_region(provider, zone)
                if region is not None and region in self.catalog.instances.regions(name):
                    day = history.start.date().isoformat()
                    rows.append(Price(provider, region, zone, name, CapacityType.SPOT, usd, day, HISTORY_SOURCE))
            table = PriceTable(rows, history.source)
            found = self._priced[epoch] = apply_prices(self.catalog, table) if rows else self.catalog
        return found, epoch

    @property
    def hit_rate(self) -> float:
        """Share of calls answered from the cache."""
        return 1.0 - self.misses / self.calls if self.calls else 0.0


def _select(result: PlanResult, rule: Rule, deadline_h: float | None, capacity: CapacityType | None,
            current: PlanKey | None, fit: Fit) -> Choice:
    if rule == "planner":
        chosen, error = result.chosen, "" if result.ok else result.why
    else:
        pool = [c for c in result.feasible
                if (capacity is None or c.capacity is capacity)
                and (deadline_h is None or fit.hours(c) <= deadline_h)]
        chosen = min(pool, key=lambda c: (c.outlook.base_hours * c.usd_per_hour, c.outlook.base_hours), default=None)
        error = "" if chosen else "no plan's uninterrupted time fits the hours left"
    found = None
    if current is not None:
        found = next((plan_option(c) for c in result.feasible if plan_key(c) == current), None)
    # a job already on the fallback goes to its alternate, as the operator's observer does
    fallback = fallback_for(result.fallback, result.alternate, lambda c: plan_key(c) == current)
    return Choice(chosen, tuple(result.pareto), error, found, fallback)


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
