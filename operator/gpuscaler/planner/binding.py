"""Honest infeasibility: when no plan meets every requirement, which rule binds and which plans come closest.

Called by :func:`gpuscaler.planner.plan` when its feasible set is empty. Every plan that fits in
memory breaks one or more requirements (:func:`gpuscaler.planner.solve.violations`, where the
risk test ``P(miss) > maxDeadlineRisk`` is written, once: :func:`gpuscaler.planner.risk.over_risk`);
each broken deadline requirement is read as one of two kinds:

* ``risk``: the plan would probably meet the deadline (``P(miss) < 1/2``) but not at the allowed
  risk: the limit binds, not the time;
* ``time``: the plan would probably miss it (``P(miss) >= 1/2``): only more time helps.

The other kinds are ``budget`` (the job's budget), ``policy`` (the platform policy's caps: GPUs
per job, $ per job, $ per hour), ``memory`` (no allowed configuration fits in GPU memory) and
``constraint`` (the job's own constraints: its ``maxGpus``, or no offering left at all). The **binding** kind is the one whose
relaxation alone makes a plan feasible: the plans that break exactly one requirement are grouped by
it, and the first kind of :data:`BINDING_ORDER` that has any binds (the risk limit first: the
cheapest rule to relax, and the one that hides behind a "deadline" rejection otherwise). When every
plan breaks two or more, the plan that breaks the fewest (then the likeliest to meet the deadline)
names them together. "Extend the deadline" is said only when time binds.

Each of the **closest** plans (up to :data:`CLOSEST`) says what would make it feasible: the risk
it needs allowed and the hours more to the deadline that bring its P(miss) to the limit (by
bisection on the deadline, with its contingency: :mod:`gpuscaler.planner.contingency`), the budget
it needs, or the cap it breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from gpuscaler.api import TrainingJobSpec
from gpuscaler.planner.candidate import Candidate, Reason, Rejection
from gpuscaler.planner.contingency import Recourse
from gpuscaler.planner.job import ResolvedJob
from gpuscaler.planner.risk import outlook, over_risk
from gpuscaler.planner.solve import violations
from gpuscaler.policy import Policy


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x < 100 else f"${x:,.0f}"


def _hours(h: float) -> str:
    return f"{max(h * 60.0, 1.0):.0f} min" if h < 1.0 else f"{h:.1f} h"


PROBABLY_MEETS = 0.5
"""A plan with P(miss) below this would probably meet the deadline: if it is not allowed, the risk
limit binds, not the time."""
CLOSEST = 3
"""Closest plans reported."""
MORE_HOURS_TOL = 0.01
"""Hours to which the extra time a plan needs is found."""


class Kind(StrEnum):
    """Which rule binds; the value is what ``--json`` prints under ``binding.kind``."""

    RISK = "risk"
    TIME = "time"
    BUDGET = "budget"
    POLICY = "policy"
    MEMORY = "memory"
    CONSTRAINT = "constraint"


BINDING_ORDER = (Kind.RISK, Kind.BUDGET, Kind.POLICY, Kind.CONSTRAINT, Kind.TIME)
"""Among the kinds whose relaxation alone makes a plan feasible, the one reported as binding."""


@dataclass(frozen=True)
class Closest:
    """A plan that comes close, what it breaks and what would make it feasible."""

    plan: Candidate
    breaks: tuple[Kind, ...]
    fix: str
    more_hours: float | None = None
    """Hours more to the deadline that bring its P(miss) to the limit (None: not a deadline matter)."""
    needed_risk: float | None = None
    """The ``maxDeadlineRisk`` it needs (its P(miss)), when risk or time is what it breaks."""

    def to_dict(self) -> dict[str, object]:
        c = self.plan
        return {
            "plan": c.label,
            "instanceType": c.instance.name,
            "nodes": c.nodes,
            "gpus": c.gpus,
            "capacityType": c.capacity.value,
            "precision": c.precision.value,
            "expectedHours": round(c.expected_hours, 3),
            "expectedCostUsd": round(c.expected_cost_usd, 2),
            "deadlineMissProbability": round(c.outlook.deadline_miss_probability, 4),
            "breaks": [k.value for k in self.breaks],
            "fix": self.fix,
            "moreHours": None if self.more_hours is None else round(self.more_hours, 2),
            "neededRisk": None if self.needed_risk is None else round(self.needed_risk, 4),
        }


@dataclass(frozen=True)
class Binding:
    """The rule (or rules) that bind, in one sentence."""

    kind: Kind
    kinds: tuple[Kind, ...]
    """Every rule the closest plan breaks (one when relaxing ``kind`` alone is enough)."""
    message: str
    also: tuple[str, ...] = ()
    """The other rules whose relaxation alone would also do (later in :data:`BINDING_ORDER`)."""

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind.value, "kinds": [k.value for k in self.kinds], "message": self.message,
                "also": list(self.also)}  # fmt: skip


def miss_at(c: Candidate, deadline_h: float, spec: TrainingJobSpec, target: Candidate | None, startup_s: float,
            alternate: Candidate | None = None) -> float:  # fmt: skip
    """The P(miss) plan ``c`` would have with ``deadline_h`` hours, its contingency included."""
    o = c.outlook
    rate = o.interruptions / o.expected_hours if o.expected_hours > 0 else 0.0
    restart = spec.checkpoint.restart_seconds
    static = outlook(c.work_hours, rate, c.checkpoint_write_s, restart, startup_s, o.interval_s, deadline_h,
                     o.log_sigma)  # fmt: skip
    bare = c._replace(outlook=static, contingency=None)
    recourse = Recourse(target, deadline_h=deadline_h, max_risk=spec.constraints.max_deadline_risk,
                        restart_s=restart, startup_s=startup_s, alternate=alternate)  # fmt: skip
    return recourse.of(bare).miss_probability


def more_hours(c: Candidate, deadline_h: float, spec: TrainingJobSpec, target: Candidate | None,
               startup_s: float, alternate: Candidate | None = None) -> float | None:  # fmt: skip
    """Hours more than ``deadline_h`` at which ``c`` meets ``maxDeadlineRisk`` (None: not within 2^12 x)."""
    risk = spec.constraints.max_deadline_risk
    if not over_risk(miss_at(c, deadline_h, spec, target, startup_s, alternate), risk):
        return 0.0
    step = max(c.expected_hours, 0.1)
    hi = deadline_h + step
    for _ in range(12):
        if not over_risk(miss_at(c, hi, spec, target, startup_s, alternate), risk):
            break
        step *= 2.0
        hi = deadline_h + step
    else:
        return None
    lo = max(deadline_h, hi - step)
    while hi - lo > MORE_HOURS_TOL:
        mid = (lo + hi) / 2.0
        if over_risk(miss_at(c, mid, spec, target, startup_s, alternate), risk):
            lo = mid
        else:
            hi = mid
    return hi - deadline_h


def _breaks(
    c: Candidate, job: ResolvedJob, spec: TrainingJobSpec, policy: Policy, over_cap: Kind | None
) -> tuple[Kind, ...]:
    kinds: list[Kind] = []
    for reason, _ in violations(c, job, spec, policy):
        if reason is Reason.DEADLINE:
            kinds.append(Kind.RISK if c.outlook.deadline_miss_probability < PROBABLY_MEETS else Kind.TIME)
        elif reason is Reason.BUDGET:
            kinds.append(Kind.BUDGET)
        elif Kind.POLICY not in kinds:
            kinds.append(Kind.POLICY)
    if over_cap is not None and over_cap not in kinds:
        kinds.append(over_cap)
    return tuple(kinds)


def _nothing_to_plan(job: ResolvedJob, rejected: list[Rejection]) -> Binding:
    """The rule that binds when no plan was even evaluated: memory when an offering was rejected for
    memory, batch or precision; else the policy when it rejected one; else the job's constraints."""
    categories = {r.category for r in rejected}
    if categories & {Reason.MEMORY, Reason.BATCH, Reason.PRECISION}:
        kind = Kind.MEMORY
        what = (
            f"memory binds: no allowed instance fits {job.workload.id} in memory at global batch "
            f"{job.global_batch}: allow larger-memory GPUs, or change the global batch so it divides by the "
            "GPU count"
        )
    elif Reason.POLICY in categories:
        kind, what = Kind.POLICY, "the policy binds: it allows no offering for this job; ask the platform team"
    else:
        kind = Kind.CONSTRAINT
        left = ", ".join(sorted(c.value for c in categories)) or "none"
        what = (
            f"the job's constraints bind: no offering is left to plan ({left}); widen the GPU or instance "
            "types, providers, regions or spot setting"
        )
    return Binding(kind, (kind,), what)


def explain(
    job: ResolvedJob,
    spec: TrainingJobSpec,
    policy: Policy,
    fitting: list[Candidate],
    over_cap: list[Candidate],
    gpu_cap: int,
    cap_source: str,
    rejected: list[Rejection],
    target: Candidate | None,
    startup_s: float,
    alternate: Candidate | None = None,
) -> tuple[Binding, list[Closest]]:
    """Which rule binds an infeasible job, and its closest plans (the rule is in the module docstring).

    Args:
        job: the resolved job.
        spec: its spec (``maxDeadlineRisk``, restart seconds).
        policy: the policy (spending caps).
        fitting: the plans under the GPU cap that fit in memory.
        over_cap: the plans over the GPU cap.
        gpu_cap: the GPU cap.
        cap_source: what sets it (``policy lab maxGpusPerJob``).
        rejected: the offerings rejected before or during configuration.
        target: the contingency's fallback of this plan (for the extra hours).
        startup_s: the planner's start-up seconds.
        alternate: the fallback's own (:func:`gpuscaler.planner.planner.alternate_of`).

    Returns:
        The binding rule and up to :data:`CLOSEST` closest plans, closest first.
    """
    if not fitting and not over_cap:
        return _nothing_to_plan(job, rejected), []
    cap_kind = Kind.POLICY if cap_source.startswith("policy") else Kind.CONSTRAINT  # or gpuscaler's default
    rows = [(c, _breaks(c, job, spec, policy, None)) for c in fitting]
    rows += [(c, _breaks(c, job, spec, policy, cap_kind)) for c in over_cap]
    singles: dict[Kind, list[Candidate]] = {}
    for c, kinds in rows:
        if len(kinds) == 1:
            singles.setdefault(kinds[0], []).append(c)
    risk = spec.constraints.max_deadline_risk
    deadline = job.deadline_h

    def hours(c: Candidate) -> float | None:
        return None if deadline is None else more_hours(c, deadline, spec, target, startup_s, alternate)

    def closest(cands: list[Candidate], key: Callable[[Candidate], tuple[float, ...]], kinds: tuple[Kind, ...]) -> list[Closest]:
        out = []
        for c in sorted(cands, key=key)[:CLOSEST]:
            out.append(_closest(c, kinds, job, spec, policy, gpu_cap, cap_source, hours))
        return out

    def p(c: Candidate) -> float:
        return c.outlook.deadline_miss_probability

    found: list[tuple[Binding, list[Closest]]] = []  # per kind whose relaxation alone would do
    for kind in BINDING_ORDER:
        cands = singles.get(kind)
        if not cands or (kind is Kind.TIME and Kind.RISK in singles):  # more time is in the risk's answer
            continue
        if kind is Kind.RISK:
            near = closest(cands, lambda c: (p(c), c.expected_cost_usd), (kind,))
            best = near[0]
            more = f" or give {_hours(best.more_hours)} more" if best.more_hours is not None else ""
            msg = (
                f"the risk limit binds: best plan {best.plan.label} P(miss) {p(best.plan):.1%} > {risk:.1%}; "
                f"allow {p(best.plan):.1%}{more}"
            )
        elif kind is Kind.BUDGET:
            near = closest(cands, lambda c: (c.expected_cost_usd, c.expected_hours), (kind,))
            best = near[0]
            meets = "the cheapest plan that meets the deadline" if deadline is not None else "the cheapest plan"
            msg = (
                f"the budget binds: {meets}, {best.plan.label}, costs "
                f"{_usd(best.plan.expected_cost_usd)} > {_usd(job.budget_usd or 0.0)}; raise the budget to "
                f"{_usd(best.plan.expected_cost_usd)}"
            )
        elif kind in (Kind.POLICY, Kind.CONSTRAINT):
            near = closest(cands, lambda c: (c.gpus, c.expected_cost_usd), (kind,))
            who = "the policy binds" if kind is Kind.POLICY else "the job's constraints bind"
            msg = f"{who}: {near[0].plan.label}: {near[0].fix}"
        else:
            near = closest(cands, lambda c: (c.expected_hours, c.expected_cost_usd), (kind,))
            best = near[0]
            assert deadline is not None
            more = f" by {_hours(best.more_hours)}" if best.more_hours is not None else ""
            msg = (
                f"the deadline binds: the fastest allowed plan, {best.plan.label}, takes {best.plan.expected_hours:.1f} h; "
                f"the deadline is {deadline:.1f} h away (P(miss) {p(best.plan):.0%}): extend the deadline{more}"
            )
        found.append((Binding(kind, (kind,), msg), near))
    if found:
        first, near = found[0]
        also = tuple("or " + b.message.replace(" binds:", " alone:", 1) for b, _ in found[1:])
        return Binding(first.kind, first.kinds, first.message, also), near
    # every plan breaks two or more: the one breaking the fewest, then the likeliest to meet the deadline
    c, kinds = min(rows, key=lambda r: (len(r[1]), p(r[0]), r[0].expected_cost_usd))
    near = [_closest(c, kinds, job, spec, policy, gpu_cap, cap_source, hours)]
    names = " and ".join({Kind.RISK: "the risk limit", Kind.TIME: "the deadline", Kind.BUDGET: "the budget",
                          Kind.POLICY: "the policy", Kind.CONSTRAINT: "the job's constraints"}.get(k, k.value)
                         for k in kinds)  # fmt: skip
    return Binding(kinds[0], kinds, f"{names} bind together: the closest plan, {c.label}, {near[0].fix}"), near


def _closest(
    c: Candidate,
    kinds: tuple[Kind, ...],
    job: ResolvedJob,
    spec: TrainingJobSpec,
    policy: Policy,
    gpu_cap: int,
    cap_source: str,
    hours: Callable[[Candidate], float | None],
) -> Closest:
    """What would make plan ``c`` feasible, rule by rule."""
    fixes: list[str] = []
    more: float | None = None
    needed: float | None = None
    p = c.outlook.deadline_miss_probability
    if Kind.RISK in kinds or Kind.TIME in kinds:
        more = hours(c)
        needed = p
        give = f"give {_hours(more)} more" if more is not None else "the deadline cannot be met by more time"
        if Kind.RISK in kinds:
            fixes.append(f"P(miss) {p:.1%}: allow {p:.1%} or {give}")
        else:
            fixes.append(f"takes {c.expected_hours:.1f} h (P(miss) {p:.0%}): {give}")
    if Kind.BUDGET in kinds:
        fixes.append(f"costs {_usd(c.expected_cost_usd)} > the {_usd(job.budget_usd or 0.0)} budget")
    if Kind.POLICY in kinds or Kind.CONSTRAINT in kinds:
        if c.gpus > gpu_cap:
            fixes.append(f"needs {c.gpus} {c.instance.gpu_id} GPUs; {cap_source} allows {gpu_cap}")
        for reason, sentence in violations(c, job, spec, policy):
            if reason is Reason.POLICY:
                fixes.append(sentence())
    return Closest(c, kinds, "; ".join(fixes), more, needed)
