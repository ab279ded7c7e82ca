#!/usr/bin/env python3
"""Fit the performance model's free parameters on the published throughput rows, and cross-validate.

Reproducible: deterministic bounded least squares (scipy) on log errors, from fixed starting
values, over ``operator/gpuscaler/perfmodel/data/published_throughput.jsonl`` only. Writes
``operator/gpuscaler/perfmodel/data/fitted.json`` (the parameters) and
``operator/gpuscaler/perfmodel/data/cross_validation.json`` (out-of-sample errors); ``gpuscaler
validate`` reports both.

    python scripts/calibrate.py              # fit, cross-validate, write both files
    python scripts/calibrate.py --check      # refit and fail if either file is out of date
    python scripts/calibrate.py --holdout    # print the cross-validation table only

Free parameters: per family the tensor and SIMT efficiencies, the share of FLOPs that never
reach tensor cores, DRAM traffic per activation byte, the share of it autocast keeps in fp32, fixed host time per micro-batch and per item, and per
optimizer step; per framework a throughput factor (PyTorch = 1); per named workload a scale
regularised towards 1 (a log-normal prior, weight REG); the communication overlap and the
synchronisation cost per GPU doubling. Family parameters carry a weak prior towards their start
values (REG_FAMILY), which decides only what the rows leave undetermined.

Cross-validation (every prediction scored is of a row the fit did not see):
- GPU transfer: fit on the V100 rows, predict the A100 rows, and the reverse;
- leave one workload out: fit without it, predict its rows (its scale is the prior's 1, and a
  family left with no rows uses the default family);
- leave one precision out: fit on the full-precision rows, predict the AMP rows, and the reverse.
Each relative metric pools the pairs with at least one held-out row over all schemes; the
throughput metric pools the held-out rows' absolute errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import math
import statistics
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from gpuscaler.perfmodel import calibration
from gpuscaler.perfmodel.model import combine
from gpuscaler.perfmodel.parameters import FamilyParams, FittedParams, fitted_to_dict

DATA = Path(__file__).resolve().parents[1] / "operator/gpuscaler/perfmodel/data"
OUT = DATA / "fitted.json"
CV_OUT = DATA / "cross_validation.json"
CV_SCHEMA = 1
REG = 0.5
"""Weight of the prior pulling workload scales to 1 (in log space) against one data row."""
REG_FAMILY = 0.02
"""Weight of the weak prior pulling each family parameter to its start value (in log space): a
family's ~50-200 rows outweigh it wherever they inform the parameter, and where they cannot (no
non-tensor FP32 rows in a fit on Ampere rows, no AMP rows in a fit on full precision) the parameter
stays at its start instead of drifting to a bound."""
FAMILY_FIELDS = (
    "tensor_efficiency",
    "simt_efficiency",
    "memory_traffic",
    "launch_overhead_s",
    "update_overhead_s",
    "fp32_memory_fraction",
    "host_s_per_item",
    "simt_fraction",
)
# Per family: start, lower and upper bound of each field: efficiencies in (0, 1], DRAM traffic
# 0.1-50 x the stored activations, fp32 share of it under autocast 0.01-1, per-step cost 10 us -
# 0.5 s, per-micro-batch launch cost at most 20 ms (a physical prior: the forward and backward of a
# ~24-layer model launch ~1,000-3,000 kernels at ~5-10 us each), host time per item 10 ns - 1 ms,
# share of FLOPs off the tensor cores 0.01% - 50% (start 2%).
FAMILY_START = (0.5, 0.6, 2.0, 0.005, 0.005, 0.3, 1e-5, 0.02)
FAMILY_LO = (0.01, 0.01, 0.1, 1e-5, 1e-5, 0.01, 1e-8, 1e-4)
FAMILY_HI = (1.0, 1.0, 50.0, 0.02, 0.5, 1.0, 1e-3, 0.5)
MAX_NFEV = 200


def unpack(x: np.ndarray, families: list[str], frameworks: list[str], workloads: list[str]) -> FittedParams:
    """The parameters a solver vector stands for (log-space values; the overlap as a logit)."""
    i = 0
    fams = {}
    n = len(FAMILY_FIELDS)
    for f in families:
        fams[f] = FamilyParams(**{a: float(v) for a, v in zip(FAMILY_FIELDS, np.exp(x[i : i + n]), strict=True)})
        i += n
    fw = {"pytorch": 1.0}
    for name in frameworks:
        fw[name] = float(math.exp(x[i]))
        i += 1
    ws = {}
    for w in workloads:
        ws[w] = float(math.exp(x[i]))
        i += 1
    overlap = float(1 / (1 + math.exp(-x[i])))
    sync = float(math.exp(x[i + 1]))
    # Custom workloads of a family not in the data use the geometric mean of the fitted families.
    fams["default"] = FamilyParams(
        **{
            a: float(np.exp(np.mean([math.log(getattr(fams[f], a)) for f in families])))
            for a in FAMILY_FIELDS
        }
    )
    return FittedParams(fams, ws, fw, overlap, sync)


def fit(rows: list[calibration.Row]) -> FittedParams:
    """Least-squares fit of every free parameter on ``rows``."""
    families = sorted({r.workload.family for r in rows})
    frameworks = sorted({r.cfg.framework for r in rows} - {"pytorch"})
    workloads = sorted({r.workload.id for r in rows})
    x0: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for _ in families:
        x0 += [math.log(v) for v in FAMILY_START]
        lo += [math.log(v) for v in FAMILY_LO]
        hi += [math.log(v) for v in FAMILY_HI]
    x0 += [0.0] * (len(frameworks) + len(workloads)) + [0.0, math.log(0.002)]
    lo += [math.log(0.5)] * len(frameworks) + [math.log(0.25)] * len(workloads) + [-6.0, math.log(1e-6)]
    hi += [math.log(2.0)] * len(frameworks) + [math.log(4.0)] * len(workloads) + [6.0, math.log(0.1)]
    n_fam = len(FAMILY_FIELDS) * len(families)
    w_offset = n_fam + len(frameworks)
    measured = np.array([r.measured for r in rows])
    fam_start = np.array(x0[:n_fam])

    def residuals(x: np.ndarray) -> np.ndarray:
        params = unpack(x, families, frameworks, workloads)
        pred = np.array(calibration.predict(rows, params))
        prior = math.sqrt(REG) * x[w_offset : w_offset + len(workloads)]
        fam_prior = math.sqrt(REG_FAMILY) * (x[:n_fam] - fam_start)
        return np.concatenate([np.log(pred / measured), prior, fam_prior])

    result = least_squares(residuals, np.array(x0), bounds=(lo, hi), method="trf", max_nfev=MAX_NFEV)
    return unpack(result.x, families, frameworks, workloads)


# ------------------------------------------------------------------------------ cross-validation

Split = tuple[str, Callable[[calibration.Row], bool]]
"""A scheme's name and which rows it holds out."""


def _workload_is(wid: str) -> Callable[[calibration.Row], bool]:
    return lambda r: r.workload.id == wid


def splits(rows: list[calibration.Row]) -> dict[str, list[Split]]:
    """The cross-validation schemes: each a list of (name, held-out predicate)."""
    workloads = sorted({r.workload.id for r in rows})
    return {
        "gpu_transfer": [
            ("fit V100 -> predict A100", lambda r: r.gpu.arch == "ampere"),
            ("fit A100 -> predict V100", lambda r: r.gpu.arch == "volta"),
        ],
        "leave_one_workload_out": [(f"without {w}", _workload_is(w)) for w in workloads],
        "leave_one_precision_out": [
            ("fit full precision -> predict AMP", lambda r: r.precision == "AMP"),
            ("fit AMP -> predict full precision", lambda r: r.precision != "AMP"),
        ],
    }


def _summary(errors: list[float]) -> dict[str, float | int]:
    """MAPE, median APE (fractions), the spread of log(pred/measured) and n, of relative errors."""
    if not errors:
        return {"mape": math.nan, "median_ape": math.nan, "log_sigma": math.nan, "n": 0}
    logs = [math.log1p(e) for e in errors]
    return {
        "mape": round(statistics.fmean(abs(e) for e in errors), 4),
        "median_ape": round(statistics.median(abs(e) for e in errors), 4),
        "log_sigma": round(statistics.pstdev(logs), 4),
        "n": len(errors),
    }


def cross_validate(rows: list[calibration.Row]) -> dict[str, Any]:
    """Out-of-sample errors by scheme and pooled (the cross_validation.json body)."""
    pooled: dict[str, list[float]] = {m: [] for m in ("throughput", *calibration.RATIO_METRICS)}
    schemes: dict[str, Any] = {}
    for scheme, parts in splits(rows).items():
        got: dict[str, list[float]] = {m: [] for m in pooled}
        for _, held_out in parts:
            test = [held_out(r) for r in rows]
            train = [r for r, t in zip(rows, test, strict=True) if not t]
            if not train or all(not t for t in test):
                continue
            preds = calibration.predict(rows, fit(train))
            got["throughput"] += [p / r.measured - 1 for p, r, t in zip(preds, rows, test, strict=True) if t]
            for metric, pairs in calibration.ratio_pairs(rows, preds).items():
                got[metric] += [e for i, j, e in pairs if test[i] or test[j]]
        schemes[scheme] = {m: _summary(v) for m, v in got.items()}
        for m, v in got.items():
            pooled[m] += v
    return {"metrics": {m: _summary(v) for m, v in pooled.items()}, "schemes": schemes}


# ----------------------------------------------------------------------------------------- main


def _numbers(obj: object) -> list[float]:
    if isinstance(obj, dict):
        return [n for k in sorted(obj) if k != "meta" for n in _numbers(obj[k])]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    if isinstance(obj, (int, float)):
        return [float(obj)]
    return []


def _same(committed: object, fresh: object) -> bool:
    a, b = _numbers(committed), _numbers(fresh)
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-9) or (math.isnan(x) and math.isnan(y))
        for x, y in zip(a, b, strict=True)
    )


def inputs_sha256(rows: list[calibration.Row]) -> str:
    """Hash of what the predictions of the calibration rows depend on: each row's measured value and
    parameter-free model terms (so catalog or constant edits that do not touch these rows leave it
    alone), and the source of the fitted combination (a change to the fitting itself shows in
    fitted.json, which --check refits)."""
    h = hashlib.sha256()
    for r in rows:
        terms = dataclasses.asdict(r.terms)
        h.update(repr((r.measured, r.precision, sorted((k, _rounded(v)) for k, v in terms.items()))).encode())
    h.update(inspect.getsource(combine).encode())
    return h.hexdigest()


def _rounded(value: object) -> object:
    return float(f"{value:.9g}") if isinstance(value, float) else value


def print_cv(cv: dict[str, Any]) -> None:
    print("cross-validated (out-of-sample) errors: MAPE / median / n")
    for scheme, metrics in [("pooled", cv["metrics"]), *cv["schemes"].items()]:
        cells = [f"{m} {v['mape']:.1%} / {v['median_ape']:.1%} / {v['n']}" for m, v in metrics.items()]
        print(f"  {scheme:<24} " + "; ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if fitted.json or cross_validation.json would change")
    ap.add_argument("--holdout", action="store_true", help="print the cross-validated errors only")
    args = ap.parse_args()

    rows, skipped = calibration.load_rows()
    if args.holdout:
        print_cv(cross_validate(rows))
        return 0
    print(f"fitting on {len(rows)} rows ({sum(skipped.values())} skipped)...", file=sys.stderr)
    params = fit(rows)
    data_bytes = (resources.files("gpuscaler.perfmodel") / "data" / "published_throughput.jsonl").read_bytes()
    rep = calibration.report(params)
    out = fitted_to_dict(params)
    digest = inputs_sha256(rows)
    out["meta"] = {
        "data": "published_throughput.jsonl",
        "data_sha256": hashlib.sha256(data_bytes).hexdigest(),
        "inputs_sha256": digest,
        "rows_used": len(rows),
        "rows_skipped": skipped,
        "method": (
            f"scipy least_squares (trf, bounded) on log(pred/measured), workload-scale prior weight {REG}, "
            f"family-parameter prior weight {REG_FAMILY}"
        ),
        "fit_mape_pct": round(rep.overall.mape, 2),
        "fit_median_ape_pct": round(rep.overall.median, 2),
    }
    if args.check:
        committed = json.loads(OUT.read_text()) if OUT.exists() else {}
        cv_committed = json.loads(CV_OUT.read_text()) if CV_OUT.exists() else {}
        problems = []
        if not _same(committed, out):
            problems.append("fitted.json is out of date")
        # The cross-validation refits take minutes; CI checks they were made from these inputs.
        if cv_committed.get("inputs_sha256") != digest or cv_committed.get("schema_version") != CV_SCHEMA:
            problems.append("cross_validation.json was computed from other inputs")
        if problems:
            print("; ".join(problems) + ": run python scripts/calibrate.py", file=sys.stderr)
            return 1
        print("fitted.json and cross_validation.json are up to date")
        return 0
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {OUT}: MAPE {rep.overall.mape:.1f}%, median {rep.overall.median:.1f}% over {len(rows)} rows")
    cv = cross_validate(rows)
    CV_OUT.write_text(
        json.dumps(
            {
                "schema_version": CV_SCHEMA,
                "source": (
                    "python scripts/calibrate.py: refits on the calibration rows with one part held out "
                    "(GPU transfer V100->A100 and A100->V100; leave one workload out; leave one precision "
                    "out, full precision<->AMP) and scores the held-out predictions; relative metrics pool "
                    "the pairs with at least one held-out row, throughput the held-out rows"
                ),
                "inputs_sha256": digest,
                "rows": len(rows),
                **cv,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {CV_OUT}")
    print_cv(cv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
