"""Re-planning the rest of a job after an interruption: the remaining work, and the elastic option.

Pure helpers for :mod:`gpuscaler.handlers.interruptions`. After a spot reclaim the operator plans
only what is left (samples after the checkpoint it resumes from, hours left to the deadline), and
may instead continue on the nodes that survived, with more gradient accumulation so the global
batch stays exactly the same. :func:`choose_recovery` is the rule between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscaler.api import Objective, SpotPolicy, TrainingJobSpec
from gpuscaler.api.trainingjob import TrainingAmount
from gpuscaler.catalog import CapacityType
from gpuscaler.planner.planner import STARTUP_S, Candidate


def remaining_spec(
    spec: TrainingJobSpec, total_samples: float, done_samples: float, *, on_demand_only: bool = False
) -> TrainingJobSpec:
    """The spec of what is left: ``total - done`` samples (at least one step); spot off when asked.

    Args:
        spec: The job's spec.
        total_samples: Samples of the whole job.
        done_samples: Samples in the checkpoint the job resumes from.
        on_demand_only: Plan on-demand capacity only (the spot fallback).

    Returns:
        A copy of ``spec`` with ``training.samples`` set to the remainder.
    """
    left = max(total_samples - done_samples, float(spec.global_batch))
    update: dict[str, object] = {"training": TrainingAmount(samples=left)}
    if on_demand_only:
        update["constraints"] = spec.constraints.model_copy(update={"spot": SpotPolicy.NEVER})
    return spec.model_copy(update=update)


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
