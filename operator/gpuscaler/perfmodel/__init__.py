"""The performance model: memory per GPU, step time, throughput for one way of running a workload.

Pure: imports no Kubernetes or cloud code. See :mod:`gpuscaler.perfmodel.model` for the maths.
"""

from gpuscaler.perfmodel.config import ParallelConfig
from gpuscaler.perfmodel.memory import MemoryBreakdown, memory_per_gpu
from gpuscaler.perfmodel.model import (
    DATA_LOADERS,
    Estimate,
    PrecisionUnsupportedError,
    allreduce_seconds,
    estimate,
    hardware_precision,
)
from gpuscaler.perfmodel.parameters import FittedParams, constants, fitted

__all__ = [
    "DATA_LOADERS",
    "Estimate",
    "FittedParams",
    "MemoryBreakdown",
    "ParallelConfig",
    "PrecisionUnsupportedError",
    "allreduce_seconds",
    "constants",
    "estimate",
    "fitted",
    "hardware_precision",
    "memory_per_gpu",
]
