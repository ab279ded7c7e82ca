"""The planner: pure (job, catalog, policy, prices) -> plan with alternatives and reasons."""

from gpuscaler.planner.job import JobError, ResolvedJob, resolve, resolve_workload
from gpuscaler.planner.planner import Candidate, PlanResult, Rejection, configure, pareto_front, plan
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
    "PlanResult",
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
