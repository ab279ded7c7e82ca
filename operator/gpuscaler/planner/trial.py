"""Trial plans: where only the risk limit binds, measure before refusing.

When no plan meets ``maxDeadlineRisk`` the planner used to answer "no plan" (the risk limit binds,
:mod:`gpuscaler.planner.binding`). Most of those refusals are the model's error band, not the job:
the closest plan would meet the deadline more often than not, and the operator learns the job's real
speed within minutes of starting it (:mod:`gpuscaler.planner.correction`). So, with
``spec.constraints.atRiskLimit: Trial`` (the default), the planner starts a *trial* instead: of the
plans that break nothing but the risk limit and would probably meet the deadline (P(miss) below
:data:`~gpuscaler.planner.binding.PROBABLY_MEETS`), the one the objective picks (the cheapest for
``cheapest``, the fastest for ``fastest``):

1. It runs for its correction window (:func:`window_s`: start-up, the observer's warm-up and its
   least measuring window) and is measured (:func:`gpuscaler.planner.correction.correct`).
2. The observer's usual rule then decides (:func:`gpuscaler.planner.correction.should_replan`):
   the trial is *kept* when the measured P(miss) of the rest is within ``maxDeadlineRisk``; it
   *moves* when the corrected planner has a plan that meets the risk; else the job *stops* at a
   checkpoint it asks for, ``Failed`` with reason ``DeadlineInfeasible``, naming the measured speed
   and how late it would finish. The checkpoint stays; a job created with a later deadline (or a
   higher ``maxDeadlineRisk``) on the same checkpoint directory resumes from it.

A trial is offered only when the risk limit alone binds (:func:`gpuscaler.planner.binding.explain`):
where every plan is more likely to miss than not, time binds, and the answer is "no plan" with the
binding rule as before. The cheapest such plan, not the likeliest (the lowest P(miss)), is tried: the
measurement guards the deadline either way, and on the project's decisions the likeliest cost a mean
8 points of regret more for the same refusals (``benchmarks/decision_scores.py``). Re-plans of a
running job never start a trial (the rest is planned with ``Refuse``): what a trial would measure is
measured. ``atRiskLimit: Refuse`` keeps the refusal, as does a policy with ``allowTrials: false``. A
stopped trial costs its window at the plan's price (:func:`window_cost_usd`, which the plan's ``why``
states) and the minute or so its checkpoint takes.

Pure (no I/O); :func:`gpuscaler.planner.planner.plan` makes the offer, the operator's observer and
:mod:`gpuscaler.planner.decisions` (which scores it) apply the same rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscaler.api import AtRiskLimit, Objective, TrainingJobSpec
from gpuscaler.planner.binding import PROBABLY_MEETS, Binding, Kind
from gpuscaler.planner.candidate import Reason
from gpuscaler.planner.correction import CorrectionConfig
from gpuscaler.planner.solve import solve, violations

if TYPE_CHECKING:
    from gpuscaler.planner.candidate import Candidate
    from gpuscaler.planner.job import ResolvedJob
    from gpuscaler.policy import Policy


def window_s(startup_s: float, config: CorrectionConfig | None = None) -> float:
    """Seconds from the start of a trial until the observer's correction is ready: start-up, warm-up
    and the least measuring window (the operator's defaults when ``config`` is None)."""
    cfg = config or CorrectionConfig()
    return startup_s + cfg.warmup_s + cfg.min_window_s


def window_cost_usd(c: Candidate, startup_s: float, config: CorrectionConfig | None = None) -> float:
    """What a trial on ``c`` costs if it stops at the end of its window."""
    return c.usd_per_hour * window_s(startup_s, config) / 3600.0


def offer(binding: Binding | None, fitting: list[Candidate], job: ResolvedJob, spec: TrainingJobSpec,
          policy: Policy) -> Candidate | None:  # fmt: skip
    """The plan to try, or None: where the risk limit alone binds and the job and the policy
    (``allowTrials``) allow trials, the objective's pick of the ``fitting`` plans that break nothing
    but the risk limit and whose P(miss) is below :data:`~gpuscaler.planner.binding.PROBABLY_MEETS`."""
    if binding is None or binding.kind is not Kind.RISK or spec.constraints.at_risk_limit is AtRiskLimit.REFUSE:
        return None
    if not policy.allow_trials:
        return None
    near = [c for c in fitting if c.outlook.deadline_miss_probability < PROBABLY_MEETS
            and all(reason is Reason.DEADLINE for reason, _ in violations(c, job, spec, policy))]  # fmt: skip
    chosen, _ = solve(near, spec, job)
    return chosen


def why(c: Candidate, spec: TrainingJobSpec, startup_s: float, config: CorrectionConfig | None = None) -> str:
    """The trial's reason, for the plan's ``why``."""
    minutes = window_s(startup_s, config) / 60.0
    max_risk = spec.constraints.max_deadline_risk
    pick = "fastest" if spec.objective is Objective.FASTEST else "cheapest"
    return (
        f"trial: no plan meets maxDeadlineRisk {max_risk:.1%}; {c.label} has P(miss) "
        f"{c.outlook.deadline_miss_probability:.1%} under the model's band, the {pick} below "
        f"{PROBABLY_MEETS:.0%}. It runs about {minutes:.0f} min "
        f"(${window_cost_usd(c, startup_s, config):,.2f}) to measure its speed, and is kept only if the measured "
        f"P(miss) is within {max_risk:.1%}; else it moves to a plan that is, or stops at a checkpoint "
        "(atRiskLimit: Refuse answers no plan instead)"
    )
