"""The simulated world's true throughput: the model's prediction times hidden lognormal factors.

The planner, and every strategy, plans with the performance model's prediction. The simulator
runs every allocation at::

    true = model x exp(sigma z[family, GPU type, precision]) x exp(sigma_s z_s[family, GPU type, GPUs, nodes])

with ``z, z_s ~ N(0, 1)`` drawn once per seed and key: the first factor is the model's error on
one workload family (CNN, light CNN, detection, RNN, transformer) on one GPU type at one
precision, shared by every job, strategy and allocation of that family there within one run (so
all strategies face the same truth: common random numbers); the second is a separate error on
scaling efficiency, 1 on a single GPU and its own draw for each GPU count and node count (eight
GPUs on one node and on two nodes scale differently). ``sigma = sigma_s = 0`` gives exactly 1:
the world is the model.

Both sigmas default to the model's own cross-validated errors in
``gpuscaler/perfmodel/data/cross_validation.json`` (written by ``scripts/calibrate.py`` from its
GPU-transfer, leave-one-workload-out and leave-one-precision-out refits):
``metrics.throughput.log_sigma`` (the held-out rows' error of log throughput) and
``metrics.scaling.log_sigma`` (the held-out error of log scaling efficiency, pairs of GPU counts).
The throughput residuals pool one- and many-GPU rows, so on many GPUs the two together
(``sqrt(0.263^2 + 0.097^2) = 0.280`` with the current file) overstate the model's error a little;
a world slightly harder than the model's measured error, never easier. The file holds the
residuals' statistics, not the rows, so the draws are lognormal with the residuals' standard
deviation (the residuals are heavier-tailed than that: a few rows off by 2-3x).

No strategy sees the factors. A strategy learns them only by running: the gpuscaler strategy
through the operator's own early-correction code on noisy progress samples
(:mod:`gpuscaler.simulator.observing`); the baselines through their own progress, if at all.
Corrections are per GPU type, as the operator keeps them (``efficiencyByGpu``): a job that moves
to another GPU count on the same GPU type carries a factor whose scaling part no longer holds.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources

CROSS_VALIDATION_FILE = "cross_validation.json"
"""Package data of :mod:`gpuscaler.perfmodel` holding the model's cross-validated errors."""


@dataclass(frozen=True)
class DefaultError:
    """The default ``--throughput-error`` and where it comes from."""

    sigma: float
    source: str
    """Human-readable provenance, printed in the simulator's header."""


def _default_metric(metric: str, option: str) -> DefaultError:
    """``metrics.<metric>.log_sigma`` of the model's ``cross_validation.json``, or 0 when absent."""
    try:
        text = resources.files("gpuscaler.perfmodel").joinpath("data", CROSS_VALIDATION_FILE).read_text("utf-8")
        value = json.loads(text)["metrics"][metric]["log_sigma"]
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return DefaultError(0.0, f"no perfmodel/data/{CROSS_VALIDATION_FILE} with metrics.{metric}.log_sigma: "
                                 f"truth = model; pass {option} SIGMA")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return DefaultError(0.0, f"perfmodel/data/{CROSS_VALIDATION_FILE}: {metric} log_sigma {value!r} is not a "
                                 "number >= 0; truth = model")
    what = "log error" if metric == "throughput" else f"{metric} log error"
    return DefaultError(float(value), f"the model's cross-validated {what}, perfmodel/data/{CROSS_VALIDATION_FILE}")


def default_throughput_error() -> DefaultError:
    """The model's cross-validated log-throughput error, or 0 when the file is not shipped.

    Returns:
        ``metrics.throughput.log_sigma`` of the performance model's ``cross_validation.json`` with
        that file named as the source; ``sigma = 0`` with a source saying so when the file or the
        field is missing or not a finite number >= 0.
    """
    return _default_metric("throughput", "--throughput-error")


def default_scaling_error() -> DefaultError:
    """The model's cross-validated error of log scaling efficiency (``metrics.scaling.log_sigma``), or 0."""
    return _default_metric("scaling", "--scaling-error")


@dataclass
class ThroughputTruth:
    """Hidden factors between the model and the simulated world (module docstring).

    Attributes:
        sigma: standard deviation of ``ln(true / model)`` per (family, GPU type, precision); 0 = none.
        seed: the run's seed; the drawn factors depend on it and on nothing else.
        fixed: factors set by hand per GPU id (all families, precisions and GPU counts), instead of
            drawn (tests, what-ifs: ``{"A100-40GB": 0.7}`` is an A100 30% slower than the model says).
        scaling_sigma: standard deviation of the log scaling-efficiency error per (family, GPU type,
            GPUs, nodes) on more than one GPU; 0 = the model's scaling is right.
    """

    sigma: float = 0.0
    seed: int = 0
    fixed: Mapping[str, float] = field(default_factory=dict)
    scaling_sigma: float = 0.0
    _cache: dict[tuple[object, ...], float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name, value in (("throughput error", self.sigma), ("scaling error", self.scaling_sigma)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        for gpu, f in self.fixed.items():
            if not (math.isfinite(f) and f > 0):
                raise ValueError(f"throughput factor of {gpu} must be a number > 0, got {f}")

    def _draw(self, key: tuple[object, ...], sigma: float) -> float:
        f = self._cache.get(key)
        if f is None:
            z = random.Random("|".join(str(k) for k in (self.seed, "truth", *key))).gauss(0.0, 1.0)
            f = self._cache[key] = math.exp(sigma * z)
        return f

    def factor(self, gpu_id: str, precision: str, family: str = "", gpus: int = 1, nodes: int = 1) -> float:
        """``true / model`` throughput of ``family`` on ``gpus`` x ``gpu_id`` over ``nodes`` at ``precision``.

        1.0 when both sigmas are 0; the scaling part is 1 on a single GPU.
        """
        if gpu_id in self.fixed:
            return self.fixed[gpu_id]
        f = self._draw((family, gpu_id, precision), self.sigma) if self.sigma > 0 else 1.0
        if self.scaling_sigma > 0 and gpus > 1:
            f *= self._draw(("scaling", family, gpu_id, gpus, nodes), self.scaling_sigma)
        return f

    def factors(self) -> dict[str, float]:
        """The factors drawn so far, ``"family/GPU/precision"`` and ``"scaling/family/GPU/GPUs/nodes"`` (reports)."""
        return {"/".join(str(k) for k in key if k != ""): f
                for key, f in sorted(self._cache.items(), key=lambda kv: tuple(map(str, kv[0])))}
