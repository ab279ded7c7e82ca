"""Trace-driven simulator: replay a workload trace against a cloud model under several strategies.

Pure (no kopf, no Kubernetes client): it reuses the planner, the performance model and the spot
maths of :mod:`gpuscaler.planner.risk`, and adds only what a simulation needs: a trace format
(:mod:`.trace`), a seeded cloud with correlated spot markets (:mod:`.cloud`), a world whose
throughput differs from the model's (:mod:`.truth`), the strategies compared (:mod:`.strategies`,
the careful baselines in :mod:`.baselines`, names in :mod:`.registry`), the simulated operator's
observe-and-correct step on the operator's own code (:mod:`.observing`), the event-driven engine
with conserving accounting (:mod:`.engine`) and the report (:mod:`.report`).
``gpuscaler simulate TRACE`` is :mod:`.cli`.
"""

from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.compare import Comparison, compare
from gpuscaler.simulator.engine import JobOutcome, Segment, SimulationResult, simulate
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.registry import ALL_STRATEGIES, BASELINES, STRATEGIES, make_strategies
from gpuscaler.simulator.report import SeedRange, StrategySummary, format_table, ranges, summarize
from gpuscaler.simulator.strategies import Strategy
from gpuscaler.simulator.trace import Trace, TraceError, TraceJob, load_trace
from gpuscaler.simulator.truth import ThroughputTruth, default_scaling_error, default_throughput_error

__all__ = [
    "ALL_STRATEGIES",
    "BASELINES",
    "STRATEGIES",
    "CachedPlanner",
    "CloudModel",
    "Comparison",
    "JobOutcome",
    "SeedRange",
    "Segment",
    "SimulationResult",
    "Strategy",
    "StrategySummary",
    "ThroughputTruth",
    "Trace",
    "TraceError",
    "TraceJob",
    "compare",
    "default_scaling_error",
    "default_throughput_error",
    "format_table",
    "load_trace",
    "make_strategies",
    "ranges",
    "simulate",
    "summarize",
]
