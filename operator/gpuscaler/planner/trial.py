"""Trial plans: where no plan meets the deadline's risk limit, measure before refusing.

When no plan meets ``maxDeadlineRisk`` the planner used to answer "no plan" (:mod:`gpuscaler.planner.binding`
names the rule that binds). Most of those refusals are the model's error band, not the job: the
operator learns the job's real speed within minutes of starting it (:mod:`gpuscaler.planner.correction`),
and a deadline inside a plan's band may well be met. So, with ``spec.constraints.atRiskLimit: Trial``
(the default), the planner starts a *trial* instead: of the plans that break nothing but the deadline
and whose band reaches it (P(miss) below :data:`PLAUSIBLY_MEETS`: the band's fast end, its P90 speed,
meets the deadline), the one the objective picks (the cheapest for ``cheapest``, the fastest for
``fastest``):

1. It runs for its correction window (:func:`window_s`: start-up, the observer's warm-up and its
   least measuring window) and is measured (:func:`gpuscaler.planner.correction.correct`).
2. At every corrected estimate from then on, the observer judges it by the measured P(miss) of the
   rest (:func:`verdict`):

   * *kept* once that P(miss) is within ``maxDeadlineRisk`` (the plan is then the job's plan like any
     other);
   * *moved*, for the deadline, when the corrected planner has a plan that meets the limit;
   * *continued* while the measurement says the deadline would probably be met (P(miss) below
     :data:`~gpuscaler.planner.binding.PROBABLY_MEETS`) but not yet within the limit: the measurement's
     floor (:data:`~gpuscaler.planner.correction.MEASURED_LOG_SIGMA_FLOOR`) is a share of the time
     the rest takes, so a plan on time gets within the limit as its rest shortens, and one that is late
     falls behind and crosses one half;
   * otherwise, from a checkpoint it asks for, it goes on to the **next trial**: the rest planned with
     every GPU type tried so far left out (``status.observed.triedGpuTypes``), offered by the same rule
     (the deadline inside a plan's band) in the time left. A trial measures one GPU type, and the
     model's errors differ between types (:data:`~gpuscaler.perfmodel.uncertainty.ERROR_CORRELATION_OTHER_GPU`);
   * *stopped* when there is no next trial: ``Failed`` with reason ``DeadlineInfeasible``, naming the
     measured speed and how late it would finish. The checkpoint stays; a job created with a later
     deadline (or a higher ``maxDeadlineRisk``) on the same checkpoint directory resumes from it.

Stopping a plan that would probably meet the deadline would make the miss certain to save the rest of
its cost, so a trial stops only when it would probably miss. The cheapest plausible plan, not the
likeliest (the lowest P(miss)), is tried: the measurement guards the deadline either way, and on the
project's decisions the likeliest cost a mean 8 points of regret more, and trying only plans that
probably meet (P(miss) below one half) left the model's cross-type errors in the choice (worst regret
219%; ``benchmarks/decision_scores.py``, ``docs/decision-scores.md``). Other re-plans of a running job
never start a trial (the rest is planned with ``Refuse``): what a trial would measure is measured; only
the next trial of one that would miss does, on the GPU types not yet measured.
``atRiskLimit: Refuse`` keeps the refusal, as does a policy with ``allowTrials: false``. A stopped
trial costs what it ran at the plan's price (at least :func:`window_cost_usd`, which the plan's ``why``
states) and the minute or so its checkpoint takes.

Pure (no I/O); :func:`gpuscaler.planner.planner.plan` makes the offer, the operator's observer and
:mod:`gpuscaler.planner.decisions` (which scores it) apply the same rule.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from gpuscaler.api import AtRiskLimit, Objective, TrainingJobSpec
from gpuscaler.planner.binding import PROBABLY_MEETS, Binding
from gpuscaler.planner.candidate import Reason
from gpuscaler.planner.correction import CorrectionConfig
from gpuscaler.planner.risk import over_risk
from gpuscaler.planner.solve import solve, violations

if TYPE_CHECKING:
    from gpuscaler.planner.candidate import Candidate
    from gpuscaler.planner.job import ResolvedJob
    from gpuscaler.policy import Policy

PLAUSIBLY_MEETS = 0.9
"""A plan with P(miss) below this has the deadline inside its band: its P90 speed (the fast end of the
band ``gpuscaler plan`` shows) meets it, so the model cannot tell that it misses. The trial's bound."""


class Verdict(StrEnum):
    """What a measured trial does next (:func:`verdict`)."""

    KEEP = "kept"
    MOVE = "moved"
    CONTINUE = "continued"
    STOP = "stopped"


def verdict(miss: float, max_risk: float, can_move: bool) -> Verdict:
    """A measured trial's verdict from the measured P(miss) of its rest: kept within ``max_risk``; else moved
    when the corrected planner has a plan that meets the limit (``can_move``); else continued while the
    deadline would probably be met; else stopped."""
    if not over_risk(miss, max_risk):
        return Verdict.KEEP
    if can_move:
        return Verdict.MOVE
    return Verdict.CONTINUE if miss < PROBABLY_MEETS else Verdict.STOP


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
    """The plan to try, or None: where no plan is feasible and the job and the policy (``allowTrials``)
    allow trials, the objective's pick of the ``fitting`` plans that break nothing but the deadline
    (its time or its risk limit) and whose P(miss) is below :data:`PLAUSIBLY_MEETS`."""
    if binding is None or spec.constraints.at_risk_limit is AtRiskLimit.REFUSE or not policy.allow_trials:
        return None
    near = [c for c in fitting if c.outlook.deadline_miss_probability < PLAUSIBLY_MEETS
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
        f"{PLAUSIBLY_MEETS:.0%} (the deadline inside its band). It runs about {minutes:.0f} min "
        f"(${window_cost_usd(c, startup_s, config):,.2f}) to measure its speed; it is kept once the measured "
        f"P(miss) is within {max_risk:.1%}, moves to a plan that is, goes on measuring while the deadline "
        f"would probably be met, and once the measured P(miss) reaches {PROBABLY_MEETS:.0%} goes on to a trial on a "
        "GPU type not tried yet, or stops at a checkpoint (atRiskLimit: Refuse answers no plan instead)"
    )
