"""Stage 4 of the planner, solve: which candidates meet the job, which one runs, and why not the rest.

A candidate ``c`` is feasible when it breaks no requirement (:func:`violations`):

```
P(miss deadline | c) <= maxDeadlineRisk      (when there is a deadline)
cost(c) <= budgetUsd                          (when there is a budget)
cost(c) <= policy maxUsdPerJob, price(c) <= policy maxUsdPerHour
gpus(c) <= min(maxGpus, policy maxGpusPerJob, default cap)   (plans over it are kept for the binding)
```

The policy's spending caps are the rules of :mod:`gpuscaler.policy.evaluate`, the one place each
is checked (the operator checks a chosen plan against the same functions). :func:`solve` picks by
objective, :func:`pareto_front` gives the cost-vs-time front, :class:`Outcomes` collects per
offering the reason codes of its configurations and reports each offering that has no feasible
plan under the first of :data:`~gpuscaler.planner.candidate.REPORT_ORDER`. When nothing is
feasible, :mod:`gpuscaler.planner.binding` says which rule binds and which plans come closest.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from gpuscaler.api import Objective, SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType
from gpuscaler.planner.candidate import REPORT_ORDER, Candidate, Reason, Refusal, Rejection
from gpuscaler.planner.job import ResolvedJob
from gpuscaler.planner.risk import over_risk
from gpuscaler.policy import Policy
from gpuscaler.policy.evaluate import MAX_USD_PER_HOUR, MAX_USD_PER_JOB


def violations(
    c: Candidate, job: ResolvedJob, spec: TrainingJobSpec, policy: Policy
) -> list[tuple[Reason, Callable[[], str]]]:
    """The requirements a candidate breaks, in the order deadline, budget, policy caps (empty: feasible).

    Args:
        c: the candidate.
        job: the resolved job (deadline, budget).
        spec: its spec (``maxDeadlineRisk``).
        policy: the policy (spending caps).

    Returns:
        Per broken requirement its code and a function that writes its sentence: of the hundreds of
        candidates that miss a deadline, :class:`Outcomes` keeps one sentence per offering and
        code, so only that one is formatted.
    """
    out: list[tuple[Reason, Callable[[], str]]] = []
    risk = spec.constraints.max_deadline_risk
    if job.deadline_h is not None and over_risk(c.outlook.deadline_miss_probability, risk):
        deadline_h = job.deadline_h
        out.append((
            Reason.DEADLINE,
            lambda: f"misses the {deadline_h:.1f} h deadline: expected {c.expected_hours:.1f} h, "
            f"P(miss) {c.outlook.deadline_miss_probability:.0%} > {risk:.0%}",
        ))
    budget = job.budget_usd
    if budget is not None and c.expected_cost_usd > budget:
        out.append((Reason.BUDGET, lambda: f"over budget: ${c.expected_cost_usd:,.0f} > ${budget:,.0f}"))
    for broken in (
        MAX_USD_PER_JOB.violation(policy, c.expected_cost_usd),
        MAX_USD_PER_HOUR.violation(policy, c.usd_per_hour),
    ):
        if broken is not None:
            out.append((Reason.POLICY, partial(str, broken.message)))
    return out


@dataclass
class Outcomes:
    """The evaluated candidates of one plan, sorted into fitting, feasible and over the GPU cap,
    with the reasons of every offering's configurations that failed."""

    gpu_cap: int
    cap_source: str
    fitting: list[Candidate] = field(default_factory=list)
    """Under the GPU cap, whether or not they meet the job."""
    feasible: list[Candidate] = field(default_factory=list)
    over_cap: list[Candidate] = field(default_factory=list)
    """Beyond the GPU cap: kept only to say what the deadline would need."""
    reasons: dict[tuple[str, str], dict[Reason, str]] = field(default_factory=lambda: defaultdict(dict))
    """Per offering (instance, capacity): the first sentence of each reason code met."""

    def refuse(self, offering: tuple[str, str], refusal: Refusal) -> None:
        """Note why a configuration of ``offering`` cannot run."""
        self.reasons[offering].setdefault(refusal.reason, refusal.text)

    def add(self, c: Candidate, job: ResolvedJob, spec: TrainingJobSpec, policy: Policy) -> None:
        """Sort one candidate: over the cap, fitting and breaking a requirement, or feasible."""
        known = self.reasons[(c.instance.name, c.capacity.value)]
        if c.gpus > self.gpu_cap:
            self.over_cap.append(c)
            if Reason.POLICY not in known:
                known[Reason.POLICY] = f"{c.gpus} GPUs > {self.gpu_cap} ({self.cap_source})"
            return
        self.fitting.append(c)
        broken = violations(c, job, spec, policy)
        for reason, sentence in broken:
            if reason not in known:
                known[reason] = sentence()
        if not broken:
            self.feasible.append(c)

    def rejections(self) -> list[Rejection]:
        """One rejection per offering without a feasible plan, under the first reason of :data:`REPORT_ORDER`."""
        have = {(c.instance.name, c.capacity.value) for c in self.feasible}
        out = []
        for (inst_name, cap_name), by_reason in self.reasons.items():
            if (inst_name, cap_name) in have:
                continue
            for reason in REPORT_ORDER:
                if reason in by_reason:
                    out.append(Rejection(inst_name, cap_name, reason, by_reason[reason]))
                    break
        return out


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Plans not beaten on both expected cost and expected time, fastest first.

    ``c`` is on the front when no ``c'`` has ``T(c') <= T(c)`` and ``cost(c') < cost(c)``: one
    pass over the plans sorted by (time, cost), keeping each that is cheaper than all before it.
    """
    front: list[Candidate] = []
    best_cost = math.inf
    for c in sorted(cands, key=lambda c: (c.expected_hours, c.expected_cost_usd)):
        if c.expected_cost_usd < best_cost - 1e-9:
            front.append(c)
            best_cost = c.expected_cost_usd
    return front


def solve(
    feasible: list[Candidate], spec: TrainingJobSpec, job: ResolvedJob
) -> tuple[Candidate | None, str]:
    """The plan to run among the feasible ones, and why.

    ``cheapest``: ``argmin_c (cost(c), T(c))``; ``fastest``: ``argmin_c (T(c), cost(c))``, over
    the spot plans alone when spot is ``preferred`` and any is feasible. The reason names the
    deadline's risk, the budget and (cheapest) the next best plan on another offering.

    Args:
        feasible: the plans that meet every requirement.
        spec: the job's spec (objective, spot preference).
        job: the resolved job (deadline, budget).

    Returns:
        The chosen plan (None when nothing is feasible) and the sentence that explains it.
    """
    if not feasible:
        return None, "no plan meets every requirement"
    pool = feasible
    spot_note = ""
    if spec.constraints.spot is SpotPolicy.PREFERRED:  # held capacity the team has is preferred as well
        spot = [c for c in feasible if c.capacity is CapacityType.SPOT or c.pool]
        if spot:
            pool, spot_note = spot, "; spot preferred"
    if spec.objective is Objective.FASTEST:
        best = min(pool, key=lambda c: (c.expected_hours, c.expected_cost_usd))
        why = f"fastest plan within the ${job.budget_usd:,.0f} budget" if job.budget_usd else "fastest plan"
    else:
        best = min(pool, key=lambda c: (c.expected_cost_usd, c.expected_hours))
        parts = ["cheapest plan"]
        if job.deadline_h is not None:
            parts.append(
                f"that meets the {job.deadline_h:.1f} h deadline "
                f"(P(miss) {best.outlook.deadline_miss_probability:.1%})"
            )
        if job.budget_usd is not None:
            parts.append(f"within the ${job.budget_usd:,.0f} budget")
        why = " ".join(parts)
    runner_up = [c for c in pool if c.instance.name != best.instance.name or c.capacity != best.capacity]
    if runner_up and spec.objective is Objective.CHEAPEST:
        nxt = min(runner_up, key=lambda c: c.expected_cost_usd)
        why += f"; next best {nxt.label} costs ${nxt.expected_cost_usd:,.0f}"
    return best, why + spot_note

