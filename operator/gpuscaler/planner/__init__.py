"""The planner: pure (job, catalog, policy, prices) -> plan with alternatives and reasons."""

from gpuscaler.planner.job import JobError, ResolvedJob, resolve, resolve_workload
from gpuscaler.planner.planner import Candidate, PlanResult, Rejection, configure, pareto_front, plan
from gpuscaler.planner.remaining import RecoveryChoice, choose_recovery, remaining_spec, survivors_spec

__all__ = [
    "Candidate",
    "JobError",
    "PlanResult",
    "RecoveryChoice",
    "Rejection",
    "ResolvedJob",
    "choose_recovery",
    "configure",
    "pareto_front",
    "plan",
    "remaining_spec",
    "resolve",
    "resolve_workload",
    "survivors_spec",
]
