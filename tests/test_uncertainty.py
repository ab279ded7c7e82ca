"""The throughput band: cross-validated residuals, widening away from calibration, estimate --json."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from gpuscaler.catalog import Precision, load_catalog
from gpuscaler.cli import main
from gpuscaler.perfmodel.uncertainty import (
    METRICS,
    Z90,
    CrossValidationError,
    base_log_sigma,
    load_cross_validation,
    parse_cross_validation,
    throughput_band,
    widening,
)

CATALOG = load_catalog()
VALID: dict[str, Any] = {
    "schema_version": 1,
    "source": "test",
    "metrics": {m: {"mape": 0.2, "median_ape": 0.15, "log_sigma": 0.25, "n": 10} for m in METRICS},
}


def test_the_shipped_residuals_load_and_say_where_they_come_from() -> None:
    cv = load_cross_validation()
    assert set(cv.metrics) == set(METRICS)
    assert "V100" in cv.source and "A100" in cv.source
    for m in cv.metrics.values():
        assert m.log_sigma > 0 and m.n > 0 and 0 < m.median_ape <= m.mape * 3


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("schema_version",), 2, "schema_version 2"),
        (("source",), "", "source"),
        (("metrics", "scaling"), None, "metrics.scaling is missing"),
        (("metrics", "throughput", "log_sigma"), -0.1, "metrics.throughput.log_sigma"),
        (("metrics", "gpu_ratio", "n"), 2.5, "metrics.gpu_ratio.n"),
        (("metrics", "amp_speedup", "mape"), "big", "metrics.amp_speedup.mape must be a number"),
    ],
)
def test_a_malformed_file_names_the_field(path: tuple[str, ...], value: object, message: str) -> None:
    doc = copy.deepcopy(VALID)
    where: Any = doc
    for key in path[:-1]:
        where = where[key]
    if value is None:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    with pytest.raises(CrossValidationError, match=message.replace(".", r"\.")):
        parse_cross_validation(doc)
    assert parse_cross_validation(VALID).metrics["throughput"].log_sigma == 0.25


def test_band_is_the_lognormal_quantiles_around_the_prediction() -> None:
    w = CATALOG.workload("resnet50")
    band = throughput_band(w, CATALOG.gpu("A100-80GB"), Precision.AMP, 1000.0)
    s = base_log_sigma()
    assert band.p50 == 1000.0 and band.widening == 1.0 and band.reasons == ()
    assert band.log_sigma == pytest.approx(s)
    assert band.p10 == pytest.approx(1000 * math.exp(-Z90 * s)) and band.p90 == pytest.approx(1000 * math.exp(Z90 * s))
    assert band.quantile(0.1) == pytest.approx(band.p10) and band.quantile(0.5) == pytest.approx(1000.0)


def test_band_widens_away_from_calibration() -> None:
    w = CATALOG.workload("resnet50")

    def sigma(gpu: str, precision: Precision = Precision.AMP) -> float:
        return throughput_band(w, CATALOG.gpu(gpu), precision, 100.0).log_sigma

    calibrated = sigma("A100-80GB")
    assert sigma("V100-16GB") == pytest.approx(calibrated)
    assert sigma("A100-80GB-PCIe") == pytest.approx(calibrated)  # same chip and memory type
    assert calibrated < sigma("H100-80GB-SXM")  # another generation, HBM
    assert sigma("H100-80GB-SXM") < sigma("L4")  # GDDR memory
    assert sigma("L4") < sigma("MI300X")  # another vendor
    bert = CATALOG.workload("bert-large")
    h100 = CATALOG.gpu("H100-80GB-SXM")
    fp8 = throughput_band(bert, h100, Precision.FP8, 1.0)
    amp = throughput_band(bert, h100, Precision.AMP, 1.0)
    assert fp8.log_sigma > amp.log_sigma and any("fp8" in r for r in fp8.reasons)
    factor, reasons = widening(w, CATALOG.gpu("L4"), Precision.AMP)
    assert factor > 1 and any("GDDR" in r for r in reasons)


def test_estimate_json_carries_the_band(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--workload", "resnet50", "--gpu", "l4", "--gpus", "1", "--precision", "amp", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["throughput_p10"] < data["throughput"] < data["throughput_p90"]
    assert data["throughput_band_reasons"] and data["throughput_log_sigma"] > 0
    for key in ("throughput", "unit", "step_time_s", "memory_per_gpu_gb", "fits", "scaling_efficiency"):
        assert key in data
