"""Run several strategies on one trace with the same seeds, cloud and truth: the comparison behind the table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuscaler.catalog import Catalog
from gpuscaler.policy import Policy
from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.engine import SimulationResult, simulate
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.pools import held_policy
from gpuscaler.simulator.registry import STRATEGIES, make_strategies
from gpuscaler.simulator.trace import Trace
from gpuscaler.simulator.truth import ThroughputTruth


@dataclass
class Comparison:
    """Results of every strategy on one trace for one seed, and the planner's cache statistics."""

    trace: Trace
    cloud: CloudModel
    seed: int
    results: list[SimulationResult]
    planner: CachedPlanner
    throughput_error: float = 0.0
    truth_factors: dict[str, float] | None = None
    """The hidden ``true/model`` factors the run drew, by key (reports only)."""
    scaling_error: float = 0.0


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
    throughput_error: float = 0.0,
    planner: CachedPlanner | None = None,
    scaling_error: float = 0.0,
) -> Comparison:
    """Simulate ``trace`` under each strategy with the same seed, cloud, truth and (cached) planner.

    Args:
        trace: the workload trace.
        catalog: instance types, prices and workloads.
        policy: the platform policy (default: no restrictions).
        cloud: the cloud model (default: the trace's ``cloud`` mapping over the defaults).
        seed: the random seed shared by all strategies (cloud draws and throughput factors).
        strategies: strategy names, the first being the baseline of the savings column.
        checkpoint_interval_s: the fixed interval of ``deadline-blind-spot-checkpoint``.
        cache: memoise planner calls by spec signature.
        keep_segments: keep every allocation in the outcomes.
        throughput_error: sigma of ln(true / model throughput) per workload family, GPU type and
            precision (0: none).
        planner: a planner to share (its cache) across calls, made with the policy and the trace's
            held capacity (:func:`gpuscaler.simulator.pools.held_policy`); default a new one.
        scaling_error: sigma of ln(true / model scaling efficiency) per family, GPU type, GPU count
            and node count, on more than one GPU (0: none). Both 0: the world is the model.

    Returns:
        The results in the order of ``strategies``.

    Raises:
        ValueError: an unknown strategy name or a negative throughput error.
    """
    cloud = cloud or CloudModel.from_mapping(trace.cloud)
    planner = planner or CachedPlanner(catalog, held_policy(policy, trace), cache=cache)
    truth = ThroughputTruth(throughput_error, seed, scaling_sigma=scaling_error)
    results = [
        simulate(trace, s, planner, cloud, seed=seed, keep_segments=keep_segments, truth=truth)
        for s in make_strategies(catalog, strategies, checkpoint_interval_s)
    ]
    return Comparison(trace, cloud, seed, results, planner, throughput_error, truth.factors(), scaling_error)
