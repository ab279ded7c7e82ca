"""The one recovery decision: how to run the rest of a job after an interruption (or a shortage).

Pure. Called by the operator (:func:`gpuscaler.controller.interruptions.replan`, from the reconcile
loop's Recovering phase) and by the simulator's ``gpuscaler`` strategy
(:class:`gpuscaler.simulator.strategies.Gpuscaler`), so what the simulator measures is what the
operator does. Each caller passes its own planner (:class:`PlanFn`): the operator's is the
governed planner with the job's observed efficiency factors, the simulator's is memoised.

The rule, in order:

1. **Spot or not.** Spot stays allowed, except on-demand only after ``spot.maxInterruptions``
   interruptions, or with less than ``spot.minHoursToDeadline`` hours left.
2. **Budget (decided once, here).** ``budgetUsd`` bounds the job's total cost: the rest is planned
   within ``budgetUsd - spent`` (what the job has cost so far, ``status.costUsd`` in the operator,
   the books in the simulator). When no plan fits what is left of it, the rest runs at the
   cheapest plan that meets the deadline, over budget, and the decision says so: the money spent
   is gone either way, and stopping would waste it.
3. **Plan the rest**: the remaining samples (after the checkpoint resumed from) in the hours left,
   without the offerings in back-off (the reclaimed one among them).
4. **Deadline-risk fallback.** If the spot plan found could not absorb one more reclaim (its
   expected hours plus a restart and one checkpoint interval exceed the hours left), the rest
   runs on-demand when an on-demand plan is feasible.
5. **Elastic continuation.** With some nodes of the interrupted plan still up (and spot still
   allowed), the planner also plans the rest on them alone (more gradient accumulation, the same
   global batch); :func:`choose_recovery` picks between the survivors and the replacement.
6. **No plan meets the deadline** (or it is within ``LATE_H``): the rest runs at the fastest
   sensible on-demand plan, the fastest costing at most ``FALLBACK_COST_FACTOR`` x the cheapest,
   without deadline or budget (finish as early as is sensible rather than at any price); without
   capacity in back-off first, then with it. That is the contingency's fallback
   (:func:`gpuscaler.planner.contingency.fallback`): where the planner's P(miss) with recourse
   assumes a late job goes, it goes.
7. Nothing at all: no plan (the caller waits for the back-off to end).

Walk-through: a 3-node spot job, 40% done, 10 h to its deadline, $100 of its $300 budget spent,
one node reclaimed (first interruption): the rest (60%) is planned within $200 in 10 h, spot
allowed, the reclaimed offering in back-off -> e.g. 2 x g5 spot elsewhere; the 2 survivors are
planned too (accumulation x3/2) -> the survivors win when their rest is cheaper (no provisioning).
The third reclaim (``maxInterruptions`` 3) -> on-demand only, whatever spot costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gpuscaler.api import AtRiskLimit, Objective, SpotPolicy, TrainingJobSpec
from gpuscaler.api.trainingjob import TrainingAmount
from gpuscaler.catalog import CapacityType
from gpuscaler.planner import contingency
from gpuscaler.planner.planner import STARTUP_S, Candidate
from gpuscaler.policy.models import SpotRules

FALLBACK_COST_FACTOR = contingency.FALLBACK_COST_FACTOR
"""When no plan meets the deadline, the rest runs at the fastest on-demand plan costing at most
this multiple of the cheapest one (finish as early as is sensible rather than at any price)."""
LATE_H = 0.05
"""Hours to the deadline below which it is treated as missed (plan for the fastest finish)."""


class PlanLike(Protocol):
    """What the decision reads of a planner result (:class:`~gpuscaler.planner.PlanResult` or the
    simulator's cached ``Choice``)."""

    @property
    def chosen(self) -> Candidate | None: ...

    @property
    def pareto(self) -> Sequence[Candidate]: ...


R = TypeVar("R", bound=PlanLike)
R_co = TypeVar("R_co", bound=PlanLike, covariant=True)


class PlanFn(Protocol[R_co]):
    """Plan ``spec`` with ``deadline_h`` hours left (None: no deadline), avoiding ``unavailable``."""

    def __call__(
        self, spec: TrainingJobSpec, deadline_h: float | None, unavailable: frozenset[tuple[str, ...]], /
    ) -> R_co: ...


@dataclass(frozen=True)
class Interrupted:
    """The plan that was running when the job lost its capacity."""

    instance_type: str
    capacity_type: str
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Situation:
    """Everything the decision depends on."""

    spec: TrainingJobSpec
    total_samples: float
    done_samples: float
    """Samples in the checkpoint the job resumes from."""
    interrupted: Interrupted | None
    """The plan interrupted (None: nothing ran yet, e.g. a first plan or a shortage before it ran)."""
    interruptions: int
    """Interruptions so far, this one included."""
    deadline_h: float | None
    """Hours left to the deadline (None: no deadline)."""
    spent_usd: float = 0.0
    """What the job has cost so far."""
    unavailable: frozenset[tuple[str, ...]] = frozenset()
    """Offerings in back-off, the reclaimed one included."""
    survivors: int = 0
    """Nodes of the interrupted plan still up and not under notice (0: none to continue on)."""
    rules: SpotRules = field(default_factory=SpotRules)


@dataclass(frozen=True)
class Recovery(Generic[R]):
    """The decision: the plan to run the rest with, the planner result it came from, and why."""

    result: R | None
    """The planner result the plan came from (None: no planner call could be made)."""
    chosen: Candidate | None
    """The plan to run the rest with (None: nothing fits now). It is ``result.chosen``, except for
    the fastest-sensible fallback, which picks from ``result.pareto``."""
    action: str
    """What was chosen and why, in one line (the operator's Replanned event, the record's action)."""
    kind: str
    """``replacement``, ``survivors``, ``on-demand``, ``fastest`` or ``none``."""
    on_demand: bool = False
    """The rest was restricted to on-demand (rules 1 or 4)."""
    over_budget: bool = False
    """No plan fits the budget left; the rest runs over it (rule 2)."""
    budget_left_usd: float | None = None
    reasons: tuple[str, ...] = ()

    @property
    def elastic(self) -> bool:
        return self.kind == "survivors"


def remaining_spec(
    spec: TrainingJobSpec,
    total_samples: float,
    done_samples: float,
    *,
    on_demand_only: bool = False,
    budget_usd: float | bool | None = False,
    trials: bool = False,
) -> TrainingJobSpec:
    """The spec of what is left: ``total - done`` samples (at least one step).

    Args:
        spec: The job's spec.
        total_samples: Samples of the whole job.
        done_samples: Samples in the checkpoint the job resumes from.
        on_demand_only: Plan on-demand capacity only.
        budget_usd: The budget for the rest (None: none; False: keep the spec's).
        trials: Keep the spec's ``atRiskLimit`` (the next trial of a trial that would miss, on a GPU type
            not tried yet: :mod:`gpuscaler.planner.trial`).

    Returns:
        A copy of ``spec`` with ``training.samples`` set to the remainder and ``atRiskLimit: Refuse``
        unless ``trials``.
    """
    left = max(total_samples - done_samples, float(spec.global_batch))
    # the rest of a running job starts no trial (gpuscaler.planner.trial), its speed being measured, but for
    # the next trial of one that would miss
    constraints: dict[str, object] = {} if trials else {"at_risk_limit": AtRiskLimit.REFUSE}
    if on_demand_only:
        constraints["spot"] = SpotPolicy.NEVER
    update: dict[str, object] = {"training": TrainingAmount(samples=left),
                                 "constraints": spec.constraints.model_copy(update=constraints)}
    if budget_usd is not False:
        update["budget_usd"] = budget_usd
        if budget_usd is None and spec.objective is Objective.FASTEST:
            update["objective"] = Objective.CHEAPEST
    return spec.model_copy(update=update)


def without_deadline(spec: TrainingJobSpec) -> TrainingJobSpec:
    """``spec`` with no ``deadline``/``maxDuration`` (the hours left are passed to the planner)."""
    if spec.deadline is None and spec.max_duration is None:
        return spec
    return spec.model_copy(update={"deadline": None, "max_duration": None})


def survivors_spec(
    spec: TrainingJobSpec, instance_type: str, capacity: CapacityType, nodes: int, gpus_per_node: int
) -> TrainingJobSpec:
    """``spec`` restricted to ``nodes`` nodes of one offering (the nodes that survived a reclaim).

    The planner then chooses micro-batch and accumulation for the smaller gang with the global
    batch kept exactly, or says why it does not fit.
    """
    gpus = max(nodes * gpus_per_node, 1)
    constraints = spec.constraints.model_copy(
        update={
            "instance_types": [instance_type],
            "min_gpus": gpus,
            "max_gpus": gpus,
            "max_nodes": nodes,
            "spot": SpotPolicy.PREFERRED if capacity is CapacityType.SPOT else SpotPolicy.NEVER,
        }
    )
    return spec.model_copy(update={"constraints": constraints})


@dataclass(frozen=True)
class RecoveryChoice:
    """Continue on the survivors (``elastic``) or on replacement capacity, and why."""

    elastic: bool
    why: str


def choose_recovery(
    replacement: Candidate | None,
    elastic: Candidate | None,
    objective: Objective,
    provisioning_s: float = STARTUP_S,
) -> RecoveryChoice:
    """Pick between replacement capacity and the surviving nodes.

    Both candidates come from the planner, so both already meet the deadline and budget. The
    survivors need no provisioning: their expected hours lose the planner's start-up allowance
    (``STARTUP_S``), while the replacement's keep ``provisioning_s``. Objective ``fastest`` takes
    the sooner finish; ``cheapest`` takes the cheaper, and the sooner on a tie.

    Args:
        replacement: The plan on new capacity (None: none is feasible, e.g. capacity is scarce).
        elastic: The plan on the survivors (None: they cannot run the job, or there are none).
        objective: The job's objective.
        provisioning_s: Expected seconds until replacement capacity runs.

    Returns:
        The choice with its reason.
    """
    if elastic is None:
        return RecoveryChoice(False, "replacement capacity" if replacement else "no plan")
    if replacement is None:
        return RecoveryChoice(True, f"no replacement capacity: continue on {elastic.label}")
    e_h = max(elastic.expected_hours - STARTUP_S / 3600, 0.0)
    r_h = replacement.expected_hours - STARTUP_S / 3600 + provisioning_s / 3600
    e_usd = e_h * elastic.usd_per_hour
    r_usd = r_h * replacement.usd_per_hour
    if objective is Objective.FASTEST:
        better = e_h < r_h
    else:
        better = e_usd < r_usd - 1e-9 or (abs(e_usd - r_usd) <= 1e-9 and e_h <= r_h)
    text = (
        f"survivors {elastic.label} (accumulation {elastic.accumulation}): {e_h:.2f} h, ${e_usd:,.2f}; "
        f"replacement {replacement.label}: {r_h:.2f} h, ${r_usd:,.2f}"
    )
    return RecoveryChoice(better, ("continue on the survivors: " if better else "replace: ") + text)


fastest_sensible = contingency.fallback
"""The fastest plan of a front costing at most :data:`FALLBACK_COST_FACTOR` x its cheapest: the
contingency's own rule (:func:`gpuscaler.planner.contingency.fallback`), the same function object."""


@dataclass
class _Draft(Generic[R]):
    """The decision as the rules build it: what is known of the rest, and the plan chosen so far."""

    s: Situation
    spec: TrainingJobSpec
    """The job's spec without its deadline (the hours left go to the planner)."""
    left: float | None
    """Hours to the deadline (None: no deadline)."""
    budget_left: float | None
    """``max(budgetUsd - spent, 0)`` (None: no budget)."""
    what: str
    """The head of the decision's one line (what was re-planned, in what, within what)."""
    reasons: list[str] = field(default_factory=list)
    on_demand: bool = False
    over_budget: bool = False
    result: R | None = None
    chosen: Candidate | None = None

    @property
    def late(self) -> bool:
        """The deadline has passed, or is within :data:`LATE_H`."""
        return self.left is not None and self.left <= LATE_H

    def budget(self) -> float | bool | None:
        """The budget of the rest: none once it runs over budget, else what is left (False: no budget)."""
        if self.over_budget:
            return None
        return self.budget_left if self.budget_left is not None else False

    def rest(self, *, od: bool, budget: float | bool | None) -> TrainingJobSpec:
        """The spec of the rest (:func:`remaining_spec`)."""
        return remaining_spec(self.spec, self.s.total_samples, self.s.done_samples, on_demand_only=od, budget_usd=budget)

    def decided(self, result: R | None, chosen: Candidate | None, action: str, kind: str) -> Recovery[R]:
        """The decision with this draft's flags and reasons."""
        return Recovery(result, chosen, action, kind, self.on_demand, self.over_budget, self.budget_left,
                        tuple(self.reasons))


def _draft(s: Situation) -> _Draft[R]:
    """What the rules start from: the spec without its deadline, ``budget_left = max(budget - spent, 0)``
    and the remaining ``max(total - done, global batch)`` samples in the decision's words."""
    spec = without_deadline(s.spec)
    left = s.deadline_h
    budget_left = max(spec.budget_usd - s.spent_usd, 0.0) if spec.budget_usd is not None else None
    left_samples = max(s.total_samples - s.done_samples, float(spec.global_batch))
    what = f"re-planned the remaining {left_samples:,.0f} samples"
    if left is not None:
        what += f" in {left:.2f} h"
    if budget_left is not None and s.spent_usd > 0:
        what += f" within ${budget_left:,.2f} of the ${spec.budget_usd:,.0f} budget left"
    return _Draft(s, spec, left, budget_left, what)


class _Rule(Protocol):
    """One rule of the decision: it refines the draft, or decides (returns the recovery)."""

    def __call__(self, d: _Draft[R], planner: PlanFn[R], /) -> Recovery[R] | None: ...


def spot_or_not(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 1: on-demand only when ``interruptions >= spot.maxInterruptions`` (and > 0), or when
    ``hours left < spot.minHoursToDeadline``; else spot stays allowed."""
    s, rules = d.s, d.s.rules
    if s.interruptions >= rules.max_interruptions and s.interruptions > 0:
        d.on_demand = True
        d.reasons.append(
            f"{s.interruptions} interruption(s) reached policy spot.maxInterruptions {rules.max_interruptions}"
        )
    elif d.left is not None and d.left < rules.min_hours_to_deadline:
        d.on_demand = True
        d.reasons.append(
            f"{d.left:.2f} h to the deadline < policy spot.minHoursToDeadline {rules.min_hours_to_deadline:g} h"
        )
    return None


def plan_the_rest(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 3: plan ``max(total - done, global batch)`` samples in the hours left within
    ``budget_left``, without the offerings in back-off (not when late: rule 6 plans then)."""
    if not d.late:
        d.result = planner(d.rest(od=d.on_demand, budget=d.budget()), d.left, d.s.unavailable)
        d.chosen = d.result.chosen
    return None


def over_budget_fallback(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 2: when no plan fits ``budget_left``, the cheapest plan that meets the deadline without
    a budget runs the rest, over budget (the money spent is gone either way)."""
    if d.late or d.chosen is not None or d.budget_left is None:
        return None
    free = planner(d.rest(od=d.on_demand, budget=None), d.left, d.s.unavailable)
    if free.chosen is not None:
        d.over_budget = True
        d.reasons.append(
            f"no plan fits the ${d.budget_left:,.2f} left of the budget: the rest runs over budget at the "
            f"cheapest plan that meets the deadline"
        )
        d.result, d.chosen = free, free.chosen
    return None


def deadline_risk(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 4: a spot plan that could not absorb one more reclaim,
    ``expected_h + (restart_s + checkpoint interval_s) / 3600 > hours left``, gives way to an
    on-demand plan when one is feasible."""
    chosen, left = d.chosen, d.left
    if d.late or d.on_demand or chosen is None or chosen.capacity is not CapacityType.SPOT or left is None:
        return None
    worst = chosen.expected_hours + (d.s.spec.checkpoint.restart_seconds + chosen.outlook.interval_s) / 3600
    if worst > left:
        safe = planner(d.rest(od=True, budget=d.budget()), left, d.s.unavailable)
        if safe.chosen is not None:
            d.reasons.append(
                f"spot would put the deadline at risk: another reclaim makes {worst:.2f} h > {left:.2f} h left"
            )
            d.result, d.chosen, d.on_demand = safe, safe.chosen, True
    return None


def elastic_continuation(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 5: with ``0 < survivors < nodes`` of the interrupted plan up (spot still allowed), plan
    the rest on the survivors alone (the same global batch, more accumulation) and let
    :func:`choose_recovery` pick between them and the replacement."""
    it = d.s.interrupted
    if d.late or it is None or not 0 < d.s.survivors < it.nodes or d.on_demand:
        return None
    back = d.s.unavailable - {(it.instance_type, it.capacity_type)}
    small = survivors_spec(d.rest(od=False, budget=d.budget()), it.instance_type, CapacityType(it.capacity_type),
                           d.s.survivors, it.gpus_per_node)
    alt = planner(small, d.left, back)
    choice = choose_recovery(d.chosen, alt.chosen, d.spec.objective)
    if choice.elastic and alt.chosen is not None:
        d.reasons.append(choice.why)
        return Recovery(alt, alt.chosen, f"{d.what}: {choice.why}", "survivors", False, d.over_budget,
                        d.budget_left, tuple(d.reasons))
    d.reasons.append(choice.why)
    return None


def fastest_finish(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 6: no plan meets the deadline (or it has passed): the fastest on-demand plan costing at
    most ``FALLBACK_COST_FACTOR x`` the cheapest (:func:`contingency.fallback`), without deadline or
    budget; avoiding the capacity in back-off first, then not."""
    if d.chosen is not None:
        return None
    why = "the deadline has passed" if d.late else "no plan meets the deadline"
    fallback = d.rest(od=True, budget=None)
    for avoid in (d.s.unavailable, frozenset()):
        res = planner(fallback, None, avoid)
        fast = contingency.fallback(res.pareto) if res.chosen is not None else None
        if fast is not None:
            d.reasons.append(f"{why}: the fastest on-demand plan costing at most {FALLBACK_COST_FACTOR:g}x the cheapest")
            return Recovery(res, fast, f"{d.what}: {fast.label} (fastest finish; {'; '.join(d.reasons)})",
                            "fastest", True, d.budget_left is not None and fast.expected_cost_usd > d.budget_left,
                            d.budget_left, tuple(d.reasons))
        if not avoid:
            break
    return None


def no_plan(d: _Draft[R], planner: PlanFn[R]) -> Recovery[R] | None:
    """Rule 7: nothing at all: no plan (the caller waits for the back-off to end)."""
    if d.chosen is None:
        return d.decided(d.result, None, f"{d.what}: no feasible plan", "none")
    return None


RULES: tuple[_Rule, ...] = (
    # Decided first: whether spot is allowed shapes every plan below.
    spot_or_not,
    # The plan for the rest within the budget left; the rules after it only revise it.
    plan_the_rest,
    # Before the risk check, so that an over-budget plan is checked for deadline risk too.
    over_budget_fallback,
    # A spot plan that another reclaim would make late moves to on-demand before survivors are weighed.
    deadline_risk,
    # The survivors compete with the plan the rules above settled on (it may be on-demand).
    elastic_continuation,
    # Only when every rule above found nothing that meets the deadline.
    fastest_finish,
    # The last word when even the fallback found nothing.
    no_plan,
)
"""The recovery rules, in the order :func:`recover` applies them (the module docstring's numbers)."""


def _replacement(d: _Draft[R]) -> Recovery[R]:
    """The plan the rules settled on, on replacement (or on-demand) capacity, with the move it makes."""
    chosen, it = d.chosen, d.s.interrupted
    assert chosen is not None  # no_plan decided otherwise
    if it is None:
        moved = "first plan"
    elif (chosen.instance.name, chosen.capacity.value) == (it.instance_type, it.capacity_type):
        moved = "same offering"
    else:
        moved = f"moved from {it.instance_type} {it.capacity_type}"
    head = "on-demand fallback" if d.on_demand else f"{chosen.capacity.value}, {moved}"
    why_text = "; ".join(d.reasons) or f"{d.spec.objective.value} plan for the rest"
    kind = "on-demand" if d.on_demand else "replacement"
    return d.decided(d.result, chosen, f"{d.what}: {chosen.label} ({head}; {why_text})", kind)


def recover(s: Situation, planner: PlanFn[R]) -> Recovery[R]:
    """Decide how to run the rest of the job: the :data:`RULES` in order (the module docstring says
    why each), the first that decides wins; else the plan they settled on runs the rest.

    Args:
        s: The situation after the interruption.
        planner: Plans a spec with hours left and offerings to avoid.

    Returns:
        The decision: ``chosen`` runs the rest; ``result`` is the planner call it came from.
    """
    d: _Draft[R] = _draft(s)
    for rule in RULES:
        decided = rule(d, planner)
        if decided is not None:
            return decided
    return _replacement(d)
