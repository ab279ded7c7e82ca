"""The planner: pure (job, catalog, policy, prices) -> plan with alternatives and reasons."""

from gpuscaler.planner.job import JobError, ResolvedJob, resolve, resolve_workload
from gpuscaler.planner.planner import Candidate, PlanResult, Rejection, configure, pareto_front, plan

__all__ = [
    "Candidate",
    "JobError",
    "PlanResult",
    "Rejection",
    "ResolvedJob",
    "configure",
    "pareto_front",
    "plan",
    "resolve",
    "resolve_workload",
]
