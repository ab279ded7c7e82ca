"""Run several strategies on one trace with the same seed and cloud: the comparison behind the table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuscaler.catalog import Catalog
from gpuscaler.policy import Policy
from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.engine import SimulationResult, simulate
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.strategies import STRATEGIES, make_strategies
from gpuscaler.simulator.trace import Trace


@dataclass
class Comparison:
    """Results of every strategy on one trace, and the planner's cache statistics."""

    trace: Trace
    cloud: CloudModel
    seed: int
    results: list[SimulationResult]
    planner: CachedPlanner


def compare(
    trace: Trace,
    catalog: Catalog,
    *,
    policy: Policy | None = None,
    cloud: CloudModel | None = None,
    seed: int = 0,
    strategies: Sequence[str] = STRATEGIES,
    checkpoint_interval_s: float = 3600.0,
    cache: bool = True,
    keep_segments: bool = True,
) -> Comparison:
    """Simulate ``trace`` under each strategy with the same seed, cloud and (cached) planner.

    Args:
        trace: the workload trace.
        catalog: instance types, prices and workloads.
        policy: the platform policy (default: no restrictions).
        cloud: the cloud model (default: the trace's ``cloud`` mapping over the defaults).
        seed: the random seed shared by all strategies.
        strategies: strategy names, the first being the baseline of the savings column.
        checkpoint_interval_s: the fixed interval of ``spot-checkpoint``.
        cache: memoise planner calls by spec signature.
        keep_segments: keep every allocation in the outcomes.

    Returns:
        The results in the order of ``strategies``.
    """
    cloud = cloud or CloudModel.from_mapping(trace.cloud)
    planner = CachedPlanner(catalog, policy, cache=cache)
    results = [
        simulate(trace, s, planner, cloud, seed=seed, keep_segments=keep_segments)
        for s in make_strategies(catalog, strategies, checkpoint_interval_s)
    ]
    return Comparison(trace, cloud, seed, results, planner)
