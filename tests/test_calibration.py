"""The committed calibration: the cross-validation file has the schema others read and was computed
from the rows and model terms of this checkout; the held-out schemes really hold rows out."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from importlib import resources
from pathlib import Path
from types import ModuleType

from gpuscaler.perfmodel import calibration

ROOT = Path(__file__).resolve().parents[1]


def _calibrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "scripts" / "calibrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = module
    spec.loader.exec_module(module)
    return module


def _cv() -> dict[str, object]:
    text = (resources.files("gpuscaler.perfmodel") / "data" / "cross_validation.json").read_text("utf-8")
    data: dict[str, object] = json.loads(text)
    return data


def test_cross_validation_file_schema() -> None:
    cv = _cv()
    assert cv["schema_version"] == 1 and "scripts/calibrate.py" in str(cv["source"])
    metrics = cv["metrics"]
    assert isinstance(metrics, dict)
    assert set(metrics) >= {"throughput", "gpu_ratio", "amp_speedup", "scaling"}
    for m in metrics.values():
        assert set(m) >= {"mape", "median_ape", "log_sigma", "n"}
        assert isinstance(m["n"], int) and m["n"] > 0
        assert 0 < m["median_ape"] < 1 and 0 < m["mape"] < 5 and m["log_sigma"] > 0
        assert not math.isnan(m["log_sigma"])


def test_cross_validation_was_computed_from_these_rows_and_terms() -> None:
    rows, _ = calibration.load_rows()
    assert _cv()["inputs_sha256"] == _calibrate().inputs_sha256(rows), (
        "cross_validation.json is stale: run python scripts/calibrate.py"
    )


def test_every_scheme_holds_rows_out_and_keeps_rows_in() -> None:
    rows, _ = calibration.load_rows()
    schemes = _calibrate().splits(rows)
    assert set(schemes) == {"gpu_transfer", "leave_one_workload_out", "leave_one_precision_out"}
    assert len(schemes["leave_one_workload_out"]) == len({r.workload.id for r in rows})
    for parts in schemes.values():
        for _, held_out in parts:
            test = [held_out(r) for r in rows]
            assert 0 < sum(test) < len(rows)
