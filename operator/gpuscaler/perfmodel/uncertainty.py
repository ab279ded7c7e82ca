"""How wrong the performance model may be: a throughput band (P10/P50/P90) for every estimate.

Called by the planner (every candidate carries a :class:`Band`), by ``gpuscaler estimate``
(``throughput_p10``/``throughput_p90``) and by the early correction
(:mod:`gpuscaler.planner.correction`, whose prior is this band).

The model's error is read as log-normal: ``measured = predicted x exp(e)``, ``e ~ N(0, s^2)``.
``s`` comes from the model's cross-validated residuals on rows the fit did not see (fit on one GPU
generation, predict the other), the ``throughput`` metric of ``data/cross_validation.json``. It is
the robust estimate from the median absolute error, ``s_cv = ln(1 + median_ape) / 0.6745`` (for a
normal ``e``, ``median |e| = 0.6745 s``), not the file's ``log_sigma``: the residuals are
heavy-tailed (a few rows off by 2-3x, V100 FP32 predicted from a fit that saw no non-tensor FP32
run), and their standard deviation (0.47 in the first file) would make every band twice as wide
as what 80% of the held-out rows need. It is widened by the factors of
``data/uncertainty.yaml`` for what lies further from the calibration set than one generation:
another memory type (GDDR vs the calibration's HBM), another GPU generation or vendor, FP8, a
workload family with no calibration row. The factors multiply::

    s = s_cv x f_gpu x f_precision x f_family
    P10 = T exp(-1.2816 s),  P50 = T,  P90 = T exp(+1.2816 s)

(1.2816 is the standard normal's 90th percentile). P50 is the model's own prediction: the fit
minimises log error, so the model is its own median estimate.

``cross_validation.json`` is written by a calibration run; :func:`load_cross_validation`
validates it and raises :class:`CrossValidationError` naming the field when it is malformed.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from gpuscaler.catalog import GPU, Precision, Workload
from gpuscaler.errors import GpuscalerError

Z90 = 1.2815515655446004
"""Standard normal quantile at 0.9 (P10 and P90 sit this many sigmas from the median)."""
METRICS = ("throughput", "gpu_ratio", "amp_speedup", "scaling")
"""The metrics ``cross_validation.json`` must carry."""
STAT_FIELDS = ("mape", "median_ape", "log_sigma", "n")
SCHEMA_VERSION = 1
_STANDARD = statistics.NormalDist()


class CrossValidationError(GpuscalerError, ValueError):
    """``cross_validation.json`` is missing a field or holds a value out of range."""


@dataclass(frozen=True, slots=True)
class ResidualStats:
    """One metric's held-out error."""

    mape: float
    """Mean absolute percentage error, as a fraction (0.2 = 20%)."""
    median_ape: float
    """Median absolute percentage error, as a fraction."""
    log_sigma: float
    """Standard deviation of ``ln(predicted / measured)``."""
    n: int
    """Held-out rows (or pairs, for ratios)."""


@dataclass(frozen=True, slots=True)
class CrossValidation:
    """The model's cross-validated residuals."""

    schema_version: int
    source: str
    """How they were produced."""
    metrics: dict[str, ResidualStats]


@dataclass(frozen=True, slots=True)
class Band:
    """A throughput prediction with its spread (samples/s, aggregate over the GPUs)."""

    p10: float
    p50: float
    p90: float
    log_sigma: float
    """Log-space standard deviation the band was drawn with."""
    widening: float
    """Product of the distance factors applied to the cross-validated sigma (1 = calibrated)."""
    reasons: tuple[str, ...] = ()
    """Why it is wider than the cross-validated error (empty when it is not)."""

    def quantile(self, q: float) -> float:
        """The throughput at quantile ``q`` (0 < q < 1) of the log-normal band."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {q}")
        return self.p50 * math.exp(normal_ppf(q) * self.log_sigma)

    def scaled(self, factor: float, log_sigma: float | None = None) -> Band:
        """The band of a corrected prediction: throughput x ``factor``; ``log_sigma`` when measured."""
        s = self.log_sigma if log_sigma is None else log_sigma
        p50 = self.p50 * factor
        return Band(p50 * math.exp(-Z90 * s), p50, p50 * math.exp(Z90 * s), s, self.widening, self.reasons)


def normal_cdf(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def normal_ppf(q: float) -> float:
    """Standard normal quantile."""
    return _STANDARD.inv_cdf(q)


def _read(name: str) -> str:
    return (resources.files("gpuscaler.perfmodel") / "data" / name).read_text(encoding="utf-8")


def parse_cross_validation(raw: Any, where: str = "cross_validation.json") -> CrossValidation:
    """Validate the parsed JSON of ``cross_validation.json``.

    Args:
        raw: The parsed document.
        where: Its name, for messages.

    Returns:
        The residuals.

    Raises:
        CrossValidationError: a field is missing, of the wrong type or out of range.
    """
    if not isinstance(raw, dict):
        raise CrossValidationError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise CrossValidationError(f"{where}: schema_version {version!r}, expected {SCHEMA_VERSION}")
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise CrossValidationError(f"{where}: source must say how the residuals were produced")
    metrics = raw.get("metrics")
    if not isinstance(metrics, dict):
        raise CrossValidationError(f"{where}: metrics must be an object with {', '.join(METRICS)}")
    out: dict[str, ResidualStats] = {}
    for name in METRICS:
        m = metrics.get(name)
        if not isinstance(m, dict):
            raise CrossValidationError(f"{where}: metrics.{name} is missing")
        values: dict[str, float] = {}
        for f in STAT_FIELDS:
            v = m.get(f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise CrossValidationError(f"{where}: metrics.{name}.{f} must be a number, got {v!r}")
            if v < 0 or (f == "n" and (v < 1 or int(v) != v)):
                raise CrossValidationError(
                    f"{where}: metrics.{name}.{f} = {v!r} is out of range (fractions >= 0, n a positive integer)"
                )
            values[f] = float(v)
        if values["log_sigma"] <= 0:
            raise CrossValidationError(f"{where}: metrics.{name}.log_sigma must be > 0")
        out[name] = ResidualStats(values["mape"], values["median_ape"], values["log_sigma"], int(values["n"]))
    return CrossValidation(SCHEMA_VERSION, source, out)


@cache
def load_cross_validation() -> CrossValidation:
    """The shipped ``data/cross_validation.json``, validated (loaded once per process).

    Raises:
        CrossValidationError: the file is malformed (see :func:`parse_cross_validation`).
    """
    try:
        raw = json.loads(_read("cross_validation.json"))
    except json.JSONDecodeError as err:
        raise CrossValidationError(f"cross_validation.json: not JSON: {err}") from err
    return parse_cross_validation(raw)


@cache
def widening_data() -> dict[str, Any]:
    """``data/uncertainty.yaml``: the distance factors and the memory type of every GPU id."""
    data: dict[str, Any] = yaml.safe_load(_read("uncertainty.yaml"))
    return data


@cache
def _calibrated_families() -> frozenset[str]:
    from gpuscaler.perfmodel.parameters import fitted

    return frozenset(f for f in fitted().families if f != "default")


def widening(workload: Workload, gpu: GPU, precision: Precision | str) -> tuple[float, tuple[str, ...]]:
    """The factor on the cross-validated sigma for this distance from the calibration set.

    Args:
        workload: The workload (its family is checked against the fitted families).
        gpu: The GPU (architecture, vendor and memory type vs the calibration's).
        precision: The precision trained in.

    Returns:
        (factor, reasons): the product of the factors of ``data/uncertainty.yaml`` that apply, and
        one phrase per factor above 1.
    """
    return _widening(workload.family, gpu.id, gpu.vendor, gpu.arch, str(precision))


@cache
def _widening(family: str, gpu_id: str, vendor: str, arch: str, precision: str) -> tuple[float, tuple[str, ...]]:
    """:func:`widening` by value (cached: the planner asks for every candidate)."""
    d = widening_data()
    f = d["factors"]
    memory = d["memory_type"].get(gpu_id)
    factor = 1.0
    reasons: list[str] = []
    if vendor != "nvidia":
        factor *= f["other_vendor"]
        reasons.append(f"{vendor} GPU (calibrated on NVIDIA only)")
    elif memory is None:
        factor *= f["unknown_gpu"]
        reasons.append(f"{gpu_id}: memory type unknown")
    elif memory != d["calibrated_memory"]:
        factor *= f["gddr"]
        reasons.append(f"{gpu_id} has {memory.upper()} memory (calibrated on {d['calibrated_memory'].upper()})")
    elif arch not in d["calibrated_archs"]:
        factor *= f["other_generation_hbm"]
        reasons.append(f"{arch} generation (calibrated on {', '.join(d['calibrated_archs'])})")
    if precision == Precision.FP8.value:
        factor *= f["fp8"]
        reasons.append("fp8 (no calibration row)")
    if family not in _calibrated_families():
        factor *= f["uncalibrated_family"]
        reasons.append(f"family {family} (no calibration row)")
    return factor, tuple(reasons)


MEDIAN_ABS_NORMAL = 0.6744897501960817
"""Median of ``|e|`` for a standard normal ``e`` (its 75th percentile)."""


@cache
def base_log_sigma() -> float:
    """The cross-validated log-sigma of absolute throughput (the band of a calibrated GPU):
    ``ln(1 + median_ape) / 0.6745`` of the ``throughput`` metric (see the module docstring)."""
    m = load_cross_validation().metrics["throughput"]
    return math.log1p(m.median_ape) / MEDIAN_ABS_NORMAL


def throughput_band(workload: Workload, gpu: GPU, precision: Precision | str, throughput: float) -> Band:
    """The P10/P50/P90 band of a throughput prediction.

    Args:
        workload: The workload.
        gpu: The GPU it runs on.
        precision: The precision it trains in.
        throughput: The model's prediction (samples/s).

    Returns:
        The band; see the module docstring for the maths.

    Raises:
        CrossValidationError: the shipped residuals are malformed.
    """
    factor, reasons = widening(workload, gpu, precision)
    s = base_log_sigma() * factor
    return Band(throughput * math.exp(-Z90 * s), throughput, throughput * math.exp(Z90 * s), s, factor, reasons)


ERROR_CORRELATION_SAME_GPU = 0.94
"""Correlation of the model's log errors on two ways to run one training code on the same GPU type
and precision (other GPU counts, batches): the errors come mostly from the code, not the count.
From the cross-validated predictions (``data/fold_predictions.json``: every pair of held-out rows of
one README, workload and framework in one fold, both schemes pooled; 3,118 pairs);
:func:`gpuscaler.planner.decisions.error_correlations` recomputes it and a test checks the two agree."""
ERROR_CORRELATION_OTHER_GPU = 0.76
"""The same for two ways on different GPU types or precisions (10,116 pairs): a plan measured slow
says less about a plan on other hardware, but still much."""


def error_correlation(gpu_a: str, precision_a: Precision | str, gpu_b: str, precision_b: Precision | str) -> float:
    """Correlation of the model's log throughput errors on two plans of one job (the recourse's
    fallback read from the plan's measurement: :mod:`gpuscaler.planner.contingency`)."""
    same = gpu_a == gpu_b and str(precision_a) == str(precision_b)
    return ERROR_CORRELATION_SAME_GPU if same else ERROR_CORRELATION_OTHER_GPU
