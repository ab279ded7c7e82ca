"""The planner: pure (job, catalog, policy, prices) -> plan with alternatives and reasons.

Stages: :mod:`.offerings` (enumerate), :mod:`.configure`, :mod:`.evaluate`, :mod:`.solve`,
composed by :func:`plan` (:mod:`.planner`, the maths in its docstring); spot recovery in
:mod:`.recovery`, the observed-throughput correction in :mod:`.correction`, risk in :mod:`.risk`.
"""

from gpuscaler.planner.job import JobError, ResolvedJob, resolve, resolve_workload
from gpuscaler.planner.planner import (
    Candidate,
    Offering,
    PlanResult,
    Reason,
    Rejection,
    configure,
    pareto_front,
    plan,
)
from gpuscaler.planner.recovery import (
    Interrupted,
    Recovery,
    RecoveryChoice,
    Situation,
    choose_recovery,
    recover,
    remaining_spec,
    survivors_spec,
)

__all__ = [
    "Candidate",
    "Interrupted",
    "JobError",
    "Offering",
    "PlanResult",
    "Reason",
    "Recovery",
    "RecoveryChoice",
    "Rejection",
    "ResolvedJob",
    "Situation",
    "choose_recovery",
    "configure",
    "pareto_front",
    "plan",
    "recover",
    "remaining_spec",
    "resolve",
    "resolve_workload",
    "survivors_spec",
]
