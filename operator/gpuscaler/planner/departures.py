"""Where the chosen plan departs from the model's own cheapest option, and why (said in ``why``).

The performance model alone would pick its **plain argmin**: the plan with the lowest
``work hours x price`` (the predicted throughput, nothing else) among the plans that fit, keep the
budget and the policy's caps, and whose predicted interruption-free time fits the deadline. The
planner's choice can differ from it only for one of these deliberate reasons, and
:func:`departure` names the one that applies (first match), with the figures:

1. **risk hedging**: the argmin's P(miss) (the model's error band, interruptions, its contingency)
   is over ``maxDeadlineRisk``;
2. **spot preference**: ``spot: preferred`` keeps the choice on spot while the argmin is on-demand;
3. **start-up, checkpoints and interruptions**: the expected cost adds the start-up allowance, the
   checkpoint writes and, on spot, the expected interruptions (lost work and restarts), which make
   the argmin dearer than the choice;
4. **contingency**: the expected extra cost of the argmin's likely move to the fallback makes it
   dearer;
5. **objective**: ``fastest`` trades cost for time by definition;
6. **tie**: the two are within :data:`TIE` of each other in plain cost, and the planner breaks
   ties by expected cost, then time.

Memory margin is not a departure here: a configuration that does not fit under the memory model's
headroom is not a plan at all (:mod:`gpuscaler.planner.configure`), for the argmin as for the choice.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuscaler.api import Objective, SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType
from gpuscaler.planner.candidate import Candidate
from gpuscaler.planner.job import ResolvedJob
from gpuscaler.planner.risk import over_risk

TIE = 0.005
"""Plain costs within this fraction of each other are a tie."""


def plain_cost(c: Candidate) -> float:
    """The model's own figure: predicted work hours x price (no start-up, checkpoints, interruptions, contingency)."""
    return c.work_hours * c.usd_per_hour


def argmin(cands: list[Candidate], job: ResolvedJob, allowed: Callable[[Candidate], bool]) -> Candidate | None:
    """The model's plain cheapest plan among ``cands`` whose predicted time fits the deadline and that
    ``allowed`` keeps (the budget and the policy's caps)."""
    dl = job.deadline_h
    for c in sorted(cands, key=lambda c: (plain_cost(c), c.work_hours)):
        if (dl is None or c.outlook.base_hours <= dl) and allowed(c):
            return c
    return None


def _same(a: Candidate, b: Candidate) -> bool:
    return (a.instance.name, a.nodes, a.capacity, a.precision, a.zone) == (b.instance.name, b.nodes, b.capacity,
                                                                           b.precision, b.zone)  # fmt: skip


def departure(chosen: Candidate, model: Candidate | None, spec: TrainingJobSpec) -> str:
    """Why ``chosen`` is not ``model`` (the plain argmin); empty when they are the same plan or there is none."""
    if model is None or _same(chosen, model):
        return ""
    head = f"the model's own cheapest, {model.label} (${plain_cost(model):,.2f} at its predicted speed), is not taken: "
    risk = spec.constraints.max_deadline_risk
    p = model.outlook.deadline_miss_probability
    if over_risk(p, risk):  # 0 without a deadline
        return head + f"risk hedging, its P(miss) {p:.1%} > maxDeadlineRisk {risk:.1%}"
    if (
        spec.constraints.spot is SpotPolicy.PREFERRED
        and chosen.capacity is CapacityType.SPOT
        and model.capacity is not CapacityType.SPOT
    ):
        return head + "spot is preferred"
    if spec.objective is Objective.FASTEST:
        return head + f"the objective is fastest ({chosen.expected_hours:.2f} h against {model.expected_hours:.2f} h)"
    extra = model.contingency.extra_cost_usd if model.contingency is not None else 0.0
    without = model.expected_cost_usd - extra
    mine = chosen.expected_cost_usd - (chosen.contingency.extra_cost_usd if chosen.contingency is not None else 0.0)
    if without > mine:
        what = "start-up, checkpoint writes" + (" and expected interruptions" if model.capacity is CapacityType.SPOT else "")
        return head + f"with {what} it costs ${without:,.2f} against ${mine:,.2f}"
    if extra > 0 and model.expected_cost_usd > chosen.expected_cost_usd:
        k = model.contingency
        assert k is not None
        return head + (
            f"its contingency (P {k.move_probability:.0%} of a move) adds ${extra:,.2f} in expectation: "
            f"${model.expected_cost_usd:,.2f} against ${chosen.expected_cost_usd:,.2f}"
        )
    if abs(plain_cost(model) - plain_cost(chosen)) <= TIE * plain_cost(model):
        return head + f"a tie within {TIE:.1%}, broken by expected cost then time"
    return head + f"expected ${model.expected_cost_usd:,.2f} against ${chosen.expected_cost_usd:,.2f}"
