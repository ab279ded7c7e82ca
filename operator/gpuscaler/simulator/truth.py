"""The simulated world's true throughput: the model's prediction times a hidden lognormal factor.

The planner, and every strategy, plans with the performance model's prediction. The simulator
runs every allocation at ``true = model x f(GPU type, precision)``, where ``f = exp(sigma x z)``
and ``z ~ N(0, 1)`` is drawn once per (seed, GPU type, precision): the same factor for every job,
strategy and allocation on that GPU type and precision within one run, so all strategies face the
same truth (common random numbers). ``sigma = 0`` gives ``f = 1`` exactly: the world is the model,
as the simulator assumed before it had this option.

No strategy sees the factors. A strategy learns them only by running: the gpuscaler strategy
through the operator's own early-correction code on noisy progress samples
(:mod:`gpuscaler.simulator.observing`); the baselines through their own progress, if at all.

The default ``sigma`` is the performance model's own cross-validated error of log throughput,
``metrics.throughput.log_sigma`` in ``gpuscaler/perfmodel/data/cross_validation.json`` (written by
the model's validation), so a run with no option is graded against a world as far from the model
as the model is from its held-out data.
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


def default_throughput_error() -> DefaultError:
    """The model's cross-validated log-throughput error, or 0 when the file is not shipped.

    Returns:
        ``metrics.throughput.log_sigma`` of the performance model's ``cross_validation.json`` with
        that file named as the source; ``sigma = 0`` with a source saying so when the file or the
        field is missing or not a finite number >= 0.
    """
    try:
        text = resources.files("gpuscaler.perfmodel").joinpath("data", CROSS_VALIDATION_FILE).read_text("utf-8")
        value = json.loads(text)["metrics"]["throughput"]["log_sigma"]
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return DefaultError(0.0, f"no perfmodel/data/{CROSS_VALIDATION_FILE} with metrics.throughput.log_sigma: "
                                 "truth = model; pass --throughput-error SIGMA")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return DefaultError(0.0, f"perfmodel/data/{CROSS_VALIDATION_FILE}: log_sigma {value!r} is not a number "
                                 ">= 0; truth = model")
    return DefaultError(float(value), f"the model's cross-validated log error, perfmodel/data/{CROSS_VALIDATION_FILE}")


@dataclass
class ThroughputTruth:
    """Hidden per-(GPU type, precision) factors between the model and the simulated world.

    Attributes:
        sigma: standard deviation of ``ln(true / model)``; 0 = the world is the model.
        seed: the run's seed; the drawn factors depend on it and on nothing else.
        fixed: factors set by hand per GPU id (all precisions), instead of drawn (tests, what-ifs:
            ``{"A100-40GB": 0.7}`` is an A100 30% slower than the model says).
    """

    sigma: float = 0.0
    seed: int = 0
    fixed: Mapping[str, float] = field(default_factory=dict)
    _cache: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.sigma) or self.sigma < 0:
            raise ValueError(f"throughput error must be a finite number >= 0, got {self.sigma}")
        for gpu, f in self.fixed.items():
            if not (math.isfinite(f) and f > 0):
                raise ValueError(f"throughput factor of {gpu} must be a number > 0, got {f}")

    def factor(self, gpu_id: str, precision: str) -> float:
        """``true / model`` throughput on ``gpu_id`` at ``precision`` (1.0 when ``sigma`` is 0)."""
        if gpu_id in self.fixed:
            return self.fixed[gpu_id]
        if self.sigma == 0:
            return 1.0
        key = (gpu_id, precision)
        f = self._cache.get(key)
        if f is None:
            z = random.Random(f"{self.seed}|truth|{gpu_id}|{precision}").gauss(0.0, 1.0)
            f = self._cache[key] = math.exp(self.sigma * z)
        return f

    def factors(self) -> dict[str, float]:
        """The factors drawn so far, ``"GPU/precision" -> factor`` (for reports)."""
        return {f"{g}/{p}": f for (g, p), f in sorted(self._cache.items())}
