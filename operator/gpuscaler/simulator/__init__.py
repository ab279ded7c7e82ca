"""Trace-driven simulator: replay a workload trace against a cloud model under several strategies.

Pure (no kopf, no Kubernetes client): it reuses the planner, the performance model and the spot
maths of :mod:`gpuscaler.planner.risk`, and adds only what a simulation needs: a trace format
(:mod:`.trace`), a seeded cloud model (:mod:`.cloud`), the strategies compared (:mod:`.strategies`),
the event-driven engine with conserving accounting (:mod:`.engine`) and the report (:mod:`.report`).
``gpuscaler simulate TRACE`` is :mod:`.cli`.
"""

from gpuscaler.simulator.cloud import CloudModel
from gpuscaler.simulator.compare import Comparison, compare
from gpuscaler.simulator.engine import JobOutcome, Segment, SimulationResult, simulate
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.report import StrategySummary, format_table, summarize
from gpuscaler.simulator.strategies import STRATEGIES, Strategy, make_strategies
from gpuscaler.simulator.trace import Trace, TraceError, TraceJob, load_trace

__all__ = [
    "STRATEGIES",
    "CachedPlanner",
    "CloudModel",
    "Comparison",
    "JobOutcome",
    "Segment",
    "SimulationResult",
    "Strategy",
    "StrategySummary",
    "Trace",
    "TraceError",
    "TraceJob",
    "compare",
    "format_table",
    "load_trace",
    "make_strategies",
    "simulate",
    "summarize",
]
