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

from gpuscaler.api import Objective, SpotPolicy, TrainingJobSpec
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
) -> TrainingJobSpec:
    """The spec of what is left: ``total - done`` samples (at least one step).

    Args:
        spec: The job's spec.
        total_samples: Samples of the whole job.
        done_samples: Samples in the checkpoint the job resumes from.
        on_demand_only: Plan on-demand capacity only.
        budget_usd: The budget for the rest (None: none; False: keep the spec's).

    Returns:
        A copy of ``spec`` with ``training.samples`` set to the remainder.
    """
    left = max(total_samples - done_samples, float(spec.global_batch))
    update: dict[str, object] = {"training": TrainingAmount(samples=left)}
    if on_demand_only:
        update["constraints"] = spec.constraints.model_copy(update={"spot": SpotPolicy.NEVER})
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


def recover(s: Situation, planner: PlanFn[R]) -> Recovery[R]:
    """Decide how to run the rest of the job (the rule is in the module docstring).

    Args:
        s: The situation after the interruption.
        planner: Plans a spec with hours left and offerings to avoid.

    Returns:
        The decision: ``chosen`` runs the rest; ``result`` is the planner call it came from.
    """
    spec = without_deadline(s.spec)
    left = s.deadline_h
    reasons: list[str] = []
    on_demand = False
    if s.interruptions >= s.rules.max_interruptions and s.interruptions > 0:
        on_demand = True
        reasons.append(
            f"{s.interruptions} interruption(s) reached policy spot.maxInterruptions {s.rules.max_interruptions}"
        )
    elif left is not None and left < s.rules.min_hours_to_deadline:
        on_demand = True
        reasons.append(f"{left:.2f} h to the deadline < policy spot.minHoursToDeadline {s.rules.min_hours_to_deadline:g} h")
    late = left is not None and left <= LATE_H
    budget_left: float | None = None
    if spec.budget_usd is not None:
        budget_left = max(spec.budget_usd - s.spent_usd, 0.0)
    left_samples = max(s.total_samples - s.done_samples, float(spec.global_batch))
    what = f"re-planned the remaining {left_samples:,.0f} samples"
    if left is not None:
        what += f" in {left:.2f} h"
    if budget_left is not None and s.spent_usd > 0:
        what += f" within ${budget_left:,.2f} of the ${spec.budget_usd:,.0f} budget left"

    def rest(*, od: bool, budget: float | bool | None) -> TrainingJobSpec:
        return remaining_spec(spec, s.total_samples, s.done_samples, on_demand_only=od, budget_usd=budget)

    over_budget = False
    result: R | None = None
    chosen: Candidate | None = None
    if not late:
        result = planner(rest(od=on_demand, budget=budget_left if budget_left is not None else False), left,
                         s.unavailable)
        chosen = result.chosen
        if chosen is None and budget_left is not None:
            free = planner(rest(od=on_demand, budget=None), left, s.unavailable)
            if free.chosen is not None:
                over_budget = True
                reasons.append(
                    f"no plan fits the ${budget_left:,.2f} left of the budget: the rest runs over budget at the "
                    f"cheapest plan that meets the deadline"
                )
                result, chosen = free, free.chosen
        if not on_demand and chosen is not None and chosen.capacity is CapacityType.SPOT and left is not None:
            restart = s.spec.checkpoint.restart_seconds
            worst = chosen.expected_hours + (restart + chosen.outlook.interval_s) / 3600
            if worst > left:
                budget: float | bool | None = None if over_budget else (budget_left if budget_left is not None else False)
                safe = planner(rest(od=True, budget=budget), left, s.unavailable)
                if safe.chosen is not None:
                    reasons.append(
                        f"spot would put the deadline at risk: another reclaim makes {worst:.2f} h > {left:.2f} h left"
                    )
                    result, chosen, on_demand = safe, safe.chosen, True
        it = s.interrupted
        if it is not None and 0 < s.survivors < it.nodes and not on_demand:
            back = s.unavailable - {(it.instance_type, it.capacity_type)}
            budget = None if over_budget else (budget_left if budget_left is not None else False)
            small = survivors_spec(rest(od=False, budget=budget), it.instance_type, CapacityType(it.capacity_type),
                                   s.survivors, it.gpus_per_node)
            alt = planner(small, left, back)
            choice = choose_recovery(chosen, alt.chosen, spec.objective)
            if choice.elastic and alt.chosen is not None:
                return Recovery(alt, alt.chosen, f"{what}: {choice.why}", "survivors", False, over_budget,
                                budget_left, (*reasons, choice.why))
            reasons.append(choice.why)
    if chosen is None:
        # The deadline cannot be met (or has passed): the fastest sensible on-demand plan.
        why = "the deadline has passed" if late else "no plan meets the deadline"
        fallback = rest(od=True, budget=None)
        for avoid in (s.unavailable, frozenset()):
            res = planner(fallback, None, avoid)
            fast = contingency.fallback(res.pareto) if res.chosen is not None else None
            if fast is not None:
                reasons.append(
                    f"{why}: the fastest on-demand plan costing at most {FALLBACK_COST_FACTOR:g}x the cheapest"
                )
                return Recovery(res, fast, f"{what}: {fast.label} (fastest finish; {'; '.join(reasons)})",
                                "fastest", True, budget_left is not None and fast.expected_cost_usd > budget_left,
                                budget_left, tuple(reasons))
            if not avoid:
                break
        return Recovery(result, None, f"{what}: no feasible plan", "none", on_demand, over_budget, budget_left,
                        tuple(reasons))
    moved = (
        "same offering"
        if s.interrupted is not None
        and (chosen.instance.name, chosen.capacity.value) == (s.interrupted.instance_type, s.interrupted.capacity_type)
        else f"moved from {s.interrupted.instance_type} {s.interrupted.capacity_type}"
        if s.interrupted is not None
        else "first plan"
    )
    head = "on-demand fallback" if on_demand else f"{chosen.capacity.value}, {moved}"
    why_text = "; ".join(reasons) or f"{spec.objective.value} plan for the rest"
    kind = "on-demand" if on_demand else "replacement"
    return Recovery(result, chosen, f"{what}: {chosen.label} ({head}; {why_text})", kind, on_demand, over_budget,
                    budget_left, tuple(reasons))
