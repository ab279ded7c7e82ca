"""The committed calibration: the cross-validation file has the schema others read and was computed
from the rows and model terms of this checkout; the held-out schemes really hold rows out; the fit's
fast path is the model itself; ``calibrate.py --check`` tolerates a solver's hair and fails on drift."""

from __future__ import annotations

import copy
import json
import math
import statistics
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import repo_scripts
from gpuscaler.perfmodel import calibration, fitted

ROOT = Path(__file__).resolve().parents[1]


def _calibrate() -> ModuleType:
    return repo_scripts.load("scripts/calibrate.py", "calibrate")


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
    models = {calibration.model_of(r.workload.id) for r in rows}
    assert len(schemes["leave_one_workload_out"]) == len(models)
    for parts in schemes.values():
        for _, held_out in parts:
            test = [held_out(r) for r in rows]
            assert 0 < sum(test) < len(rows)
    # Leaving BERT-large seq512 out leaves its sequence-binned tables out too: one model, one fold.
    (seq512,) = [h for name, h in schemes["leave_one_workload_out"] if name == "without bert-large-seq512"]
    held = {r.workload.id for r in rows if seq512(r)}
    assert held == {"bert-large-seq512", "bert-large-seq512" + calibration.BINNED_SUFFIX}


def test_single_gpu_rows_their_own_table_outruns_superlinearly_are_dropped() -> None:
    """No kept single-GPU row is outrun by more than SUPERLINEAR_LIMIT x linear by a multi-GPU row of
    the same table and configuration; the dropped ones are the V100-32GB EfficientNet rows of DLE's
    L627 table, and the data file flags each of their 8-GPU rows as quoting more than 8x."""
    rows, skipped = calibration.load_rows()
    single = {r.run: r.measured for r in rows if r.cfg.gpus == 1}
    for r in rows:
        if r.cfg.gpus > 1 and r.run in single:
            assert r.measured / r.cfg.gpus <= calibration.SUPERLINEAR_LIMIT * single[r.run], r.source
    (reason,) = [k for k in skipped if "outrun" in k]
    assert skipped[reason] == 6
    raw = calibration.raw_rows()
    flagged = [r for r in raw if "quoted scaling exceeds" in str(r.get("notes")) and "efficientnet" in str(r["model"])]
    assert {(r["model"], r["precision"]) for r in flagged} == {
        (m, p) for m in ("efficientnet-b4", "efficientnet-widese-b0", "efficientnet-widese-b4") for p in ("FP32", "AMP")
    }
    kept_sources = {(r.workload.id, r.gpu.id, r.precision, r.cfg.gpus) for r in rows}
    for r in flagged:
        assert (r["model"], r["gpu"], r["precision"], 1) not in kept_sources
        assert (r["model"], r["gpu"], r["precision"], 8) in kept_sources


def test_only_the_sequence_binned_phase2_tables_are_their_own_workload() -> None:
    rows, _ = calibration.load_rows()
    binned = [r for r in rows if r.workload.id.endswith(calibration.BINNED_SUFFIX)]
    assert binned and all(r.document in calibration.BINNED_PHASE2_DOCUMENTS for r in binned)
    assert {r.workload.seq_len for r in binned} == {512}
    assert {r.cfg.framework for r in binned} == {"pytorch", "paddlepaddle"}
    # Phase 1 of the same documents (unbinned parquet shards) and every other seq512 table stay as they were.
    for r in rows:
        if r.workload.id in ("bert-large-seq128", "bert-large-seq512"):
            assert r.workload.id == "bert-large-seq128" or r.document not in calibration.BINNED_PHASE2_DOCUMENTS
    # Its fitted scale is the share of the nominal length its batches were padded to: at least 1.
    assert fitted().workload_scale["bert-large-seq512" + calibration.BINNED_SUFFIX] >= 1.0


def test_baseline_replicates_and_lookup_are_what_the_rows_give() -> None:
    """The model-free figures in cross_validation.json need no fit: recomputed, they are equal."""
    cal = _calibrate()
    rows, _ = calibration.load_rows()
    cv: Any = _cv()
    fresh = cal.cross_validate(rows, cal.baseline_errors(rows), calibration.RATIO_METRICS)
    assert cv["baseline"]["metrics"] == fresh["metrics"] and cv["baseline"]["schemes"] == fresh["schemes"]
    assert {k: v for k, v in cv["replicates"].items() if k != "source"} == cal.replicate_disagreement(rows)
    assert {k: v for k, v in cv["lookup_in_sample"].items() if k != "source"} == cal.lookup_in_sample(rows)
    # The model beats the baseline on every pooled ratio.
    for metric in calibration.RATIO_METRICS:
        assert cv["metrics"][metric]["mape"] < cv["baseline"]["metrics"][metric]["mape"], metric


def test_own_parameter_fits_are_what_the_rows_give_and_fit_better_with_more_freedom() -> None:
    """The committed in-sample errors of the model with each workload's (and each workload and
    framework's) own family parameters are reproduced by a refit, and more freedom fits the rows
    better: per workload and framework below per workload below the per-family fit."""
    cal = _calibrate()
    rows, _ = calibration.load_rows()
    committed: Any = _cv()["own_parameters_in_sample"]
    fresh = cal.own_parameters_in_sample(rows)
    assert set(fresh) == {"workload", "workload_framework"}
    for level, metrics in fresh.items():
        assert set(metrics) == {"throughput", *calibration.RATIO_METRICS}
        for metric, v in metrics.items():
            assert v["n"] == committed[level][metric]["n"]
            assert v["mape"] == pytest.approx(committed[level][metric]["mape"], abs=cal.CHECK_CV_TOLERANCE / 100)
    per_family = calibration.report().overall.mape / 100
    assert fresh["workload_framework"]["throughput"]["mape"] < fresh["workload"]["throughput"]["mape"] < per_family


def test_own_rows_make_each_group_its_own_family() -> None:
    cal = _calibrate()
    rows, _ = calibration.load_rows()
    own = cal.own_rows(rows, "workload_framework")
    assert [r.measured for r in own] == [r.measured for r in rows]
    for r, o in zip(rows, own, strict=True):
        assert o.workload.family == o.terms.family == f"{r.workload.id}|{r.cfg.framework}"
    assert len({r.workload.family for r in cal.own_rows(rows, "workload")}) == len({r.workload.id for r in rows})


def test_baseline_predicts_held_out_pairs_from_training_pairs_only() -> None:
    """Leave ResNet-50 out: its AMP speedups are predicted by the median of the other CNN's on the same
    GPU generation, never by its own; a GPU ratio with no training pair of the kind gets the
    bandwidth ratio."""
    cal = _calibrate()
    all_rows, _ = calibration.load_rows()
    rows = [r for r in all_rows if r.workload.id in ("resnet50", "resnext101-32x4d") and r.cfg.framework == "pytorch"]
    errors = [e for e in cal.baseline_errors(rows) if e[0] == "leave_one_workload_out"]
    measured = [r.measured for r in rows]
    other = [
        measured[i] / measured[j]
        for i, j, _ in calibration.ratio_pairs(rows, measured)["amp_speedup"]
        if rows[i].workload.id == "resnext101-32x4d" and rows[i].gpu.arch == "volta"
    ]
    own_volta = [(i, j, e) for s, m, i, j, e in errors if m == "amp_speedup" and rows[i].workload.id == "resnet50" and rows[i].gpu.arch == "volta"]
    assert own_volta and other
    expected = statistics.median(other)
    for i, j, e in own_volta:
        assert e == pytest.approx(expected / (measured[i] / measured[j]) - 1)
    # Only pairs with a held-out row are scored, and the GPU-transfer folds see no GPU ratio at all.
    transfer = [e for e in cal.baseline_errors(rows) if e[0] == "gpu_transfer" and e[1] == "gpu_ratio"]
    assert transfer
    for _, _, i, j, e in transfer:
        bw = rows[i].gpu.mem_bw_gbs / rows[j].gpu.mem_bw_gbs
        assert e == pytest.approx(bw / (measured[i] / measured[j]) - 1)


def test_replicates_pair_only_the_same_configuration_on_the_same_chip() -> None:
    cal = _calibrate()
    rows, _ = calibration.load_rows()
    resnet = [r for r in rows if r.workload.id == "resnet50" and r.cfg.framework == "pytorch" and r.gpu.arch == "volta" and r.cfg.gpus == 1]
    # V100-16GB and V100-32GB rows of one configuration are one chip measured twice.
    got = cal.replicate_disagreement(resnet)["throughput"]
    pairs = [
        (a, b)
        for n, a in enumerate(resnet)
        for b in resnet[n + 1 :]
        if (a.precision, a.cfg.micro_batch) == (b.precision, b.cfg.micro_batch)
    ]
    assert got["n"] == len(pairs) > 0
    assert got["mape"] == pytest.approx(round(statistics.fmean(abs(b.measured / a.measured - 1) for a, b in pairs), 4))


# ------------------------------------------------------------------ reproducibility of the fit


def _fitted_json() -> dict[str, Any]:
    text = (resources.files("gpuscaler.perfmodel") / "data" / "fitted.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def test_vectorised_fit_path_equals_the_model() -> None:
    """The fit evaluates the model through calibrate.Batch; it gives what ``combine`` gives, also
    away from the committed values (every family, framework and workload parameter moved)."""
    cal = _calibrate()
    rows, _ = calibration.load_rows()
    p = fitted()
    moved = replace(
        p,
        families={
            k: replace(
                f,
                tensor_efficiency=f.tensor_efficiency * 0.7,
                launch_s_per_kernel=f.launch_s_per_kernel * 2,
                straggler_cv=f.straggler_cv * 1.5 + 0.05,
            )
            for k, f in p.families.items()
        },
        framework_scale={k: v * 1.1 for k, v in p.framework_scale.items()},
        workload_scale={k: v * 0.9 for k, v in p.workload_scale.items()},
        workload_launch_scale={k: v * 1.3 for k, v in p.workload_launch_scale.items()},
        overlap=0.5,
        depthwise_efficiency=p.depthwise_efficiency * 0.5,
    )
    batch = cal.Batch([r.terms for r in rows])
    for params in (p, moved):
        assert list(batch.predict(params)) == pytest.approx(calibration.predict(rows, params), rel=1e-12)


def test_a_refit_on_another_solver_path_passes_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A solver that takes another path to the optimum (here: unit-scaled steps, a different
    start) lands within the tolerances --check allows, so a numpy/scipy change does not fail CI."""
    cal = _calibrate()
    rows, skipped = calibration.load_rows()
    solve = cal.least_squares

    def other_path(fun: Any, x0: Any, **kw: Any) -> Any:
        return solve(fun, x0 + 0.05, **{**kw, "x_scale": 1.0})

    monkeypatch.setattr(cal, "least_squares", other_path)
    fresh = cal.fitted_document(cal.fit(rows), rows, skipped, cal.inputs_sha256(rows))
    committed = _fitted_json()
    assert cal.fitted_drift(committed, fresh) == []
    # ... and it did take another path: the values are not bit-identical.
    assert fresh["families"] != committed["families"]


def test_the_check_fails_on_real_drift() -> None:
    cal = _calibrate()
    committed = _fitted_json()
    assert cal.fitted_drift(committed, copy.deepcopy(committed)) == []

    hair = copy.deepcopy(committed)
    hair["families"]["cnn"]["tensor_efficiency"] *= 1 + 1e-5
    hair["meta"]["fit_mape_pct"] += 0.01
    assert cal.fitted_drift(committed, hair) == []

    drift = copy.deepcopy(committed)
    drift["families"]["cnn"]["tensor_efficiency"] *= 1.03
    assert [p.split(":")[0] for p in cal.fitted_drift(committed, drift)] == ["families.cnn.tensor_efficiency"]

    worse = copy.deepcopy(committed)
    worse["meta"]["fit_mape_pct"] += 0.5
    assert [p.split(":")[0] for p in cal.fitted_drift(committed, worse)] == ["meta.fit_mape_pct"]

    new_param = copy.deepcopy(committed)
    new_param["workload_scale"]["gpt2-small"] = 1.0
    assert cal.fitted_drift(committed, new_param) == ["workload_scale.gpt2-small: parameter set changed"]

    other_data = copy.deepcopy(committed)
    other_data["meta"]["data_sha256"] = "0" * 64
    assert cal.fitted_drift(committed, other_data)


def test_the_check_of_cross_validated_errors() -> None:
    cal = _calibrate()
    cv = _cv()
    assert cal.cv_drift(cv, copy.deepcopy(cv)) == []
    hair = copy.deepcopy(cv)
    hair["metrics"]["gpu_ratio"]["mape"] += 0.008  # 0.8 points: another BLAS thread count moved one so far
    assert cal.cv_drift(cv, hair) == []
    drift = copy.deepcopy(cv)
    drift["schemes"]["gpu_transfer"]["scaling"]["mape"] += 0.015  # 1.5 points
    assert [p.split(":")[0] for p in cal.cv_drift(cv, drift)] == ["schemes.gpu_transfer.scaling.mape"]
    fewer = copy.deepcopy(cv)
    fewer["metrics"]["amp_speedup"]["n"] -= 1
    assert [p.split(":")[0] for p in cal.cv_drift(cv, fewer)] == ["metrics.amp_speedup.n"]
    own = copy.deepcopy(cv)
    own["own_parameters_in_sample"]["workload"]["amp_speedup"]["mape"] -= 0.02
    own["own_parameters_in_sample"]["source"] = "reworded"  # prose is not checked
    assert [p.split(":")[0] for p in cal.cv_drift(cv, own)] == ["own_parameters_in_sample.workload.amp_speedup.mape"]


def test_ci_installs_the_solver_the_fit_was_made_with() -> None:
    """The dev extra (scripts/test.sh installs it) pins numpy and scipy to what fitted.json records."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    pins = dict(p.split("==") for p in dev if p.startswith(("numpy", "scipy")))
    assert set(pins) == {"numpy", "scipy"}, f"numpy and scipy must be pinned with == in the dev extra: {dev}"
    assert _fitted_json()["meta"]["solver"] == f"numpy {pins['numpy']}, scipy {pins['scipy']}"


def test_residuals_rank_workloads_by_their_share_of_the_held_out_error(capsys: pytest.CaptureFixture[str]) -> None:
    cal = _calibrate()
    rows, _ = calibration.load_rows()
    mrcnn = next(i for i, r in enumerate(rows) if r.workload.id == "maskrcnn" and r.precision != "AMP")
    rn50 = next(i for i, r in enumerate(rows) if r.workload.id == "resnet50" and r.precision != "AMP")
    errors = [("gpu_transfer", "gpu_ratio", mrcnn, rn50, 0.9), ("gpu_transfer", "gpu_ratio", rn50, mrcnn, -0.1)]
    errors += [("gpu_transfer", "throughput", rn50, -1, 0.5)]  # not a ratio metric: not listed
    cv = cal.cross_validate(rows, errors)
    assert cv["schemes"]["gpu_transfer"]["gpu_ratio"]["n"] == 2
    assert cv["metrics"]["gpu_ratio"]["mape"] == pytest.approx(0.5)
    cal.print_residuals(rows, errors)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu_ratio: MAPE 50.0% over 2 held-out pairs")
    assert out[1].split()[0] == "maskrcnn" and "share 90.0%" in out[1] and "bias +90.0%" in out[1]
    assert out[2].split()[0] == "resnet50" and "share 10.0%" in out[2]
    assert out[3:] == ["amp_speedup: no held-out pairs with an error", "scaling: no held-out pairs with an error"]
