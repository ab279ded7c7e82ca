#!/usr/bin/env python3
"""Fit the performance model's free parameters on the published throughput rows.

Reproducible: deterministic bounded least squares (scipy) on log errors, from fixed starting
values, over ``operator/gpuscaler/perfmodel/data/published_throughput.jsonl`` only. Writes
``operator/gpuscaler/perfmodel/data/fitted.json``; ``gpuscaler validate`` reports the result.

    python scripts/calibrate.py              # fit on all rows and write fitted.json
    python scripts/calibrate.py --check      # fit and fail if the committed file differs
    python scripts/calibrate.py --holdout    # out-of-sample: fit on one GPU generation, predict the other

Free parameters: per family the tensor and SIMT efficiencies, DRAM traffic per activation byte,
fixed time per micro-batch and per optimizer step; per framework a throughput factor (PyTorch = 1);
per named workload a scale regularised towards 1 (a log-normal prior, weight REG); the
communication overlap and the synchronisation cost per GPU doubling.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from gpuscaler.perfmodel import calibration
from gpuscaler.perfmodel.parameters import FamilyParams, FittedParams, fitted_to_dict

OUT = Path(__file__).resolve().parents[1] / "operator/gpuscaler/perfmodel/data/fitted.json"
REG = 0.5
"""Weight of the prior pulling workload scales to 1 (in log space) against one data row."""
FAMILY_FIELDS = (
    "tensor_efficiency",
    "simt_efficiency",
    "memory_traffic",
    "launch_overhead_s",
    "update_overhead_s",
)
# Per family: start, lower and upper bound of each field: efficiencies in (0, 1], DRAM traffic
# 0.1-50 x the stored activations, per-step cost 10 us - 0.5 s, and per-micro-batch launch cost at
# most 20 ms (a physical prior: the forward and backward of a ~24-layer model launch ~1,000-3,000
# kernels at ~5-10 us each). Left free, the fit put ~60 ms there for transformers, which made
# GPU-to-GPU speed ratios worse out of sample (--holdout: 15.0% vs 13.1% ratio MAPE, Volta -> Ampere).
FAMILY_START = (0.5, 0.6, 2.0, 0.005, 0.005)
FAMILY_LO = (0.01, 0.01, 0.1, 1e-5, 1e-5)
FAMILY_HI = (1.0, 1.0, 50.0, 0.02, 0.5)


def unpack(x: np.ndarray, families: list[str], frameworks: list[str], workloads: list[str]) -> FittedParams:
    i = 0
    fams = {}
    n = len(FAMILY_FIELDS)
    for f in families:
        fams[f] = FamilyParams(*(float(v) for v in np.exp(x[i : i + n])))
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
        *(float(np.exp(np.mean([math.log(getattr(fams[f], a)) for f in families]))) for a in FAMILY_FIELDS)
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
    w_offset = len(FAMILY_FIELDS) * len(families) + len(frameworks)
    measured = np.array([r.measured for r in rows])

    def residuals(x: np.ndarray) -> np.ndarray:
        params = unpack(x, families, frameworks, workloads)
        pred = np.array(calibration.predict(rows, params))
        prior = math.sqrt(REG) * x[w_offset : w_offset + len(workloads)]
        return np.concatenate([np.log(pred / measured), prior])

    result = least_squares(residuals, np.array(x0), bounds=(lo, hi), method="trf", max_nfev=300)
    return unpack(result.x, families, frameworks, workloads)


def holdout(rows: list[calibration.Row]) -> list[dict[str, object]]:
    """Fit on one GPU generation, predict the other: the error a new GPU type would see."""
    results: list[dict[str, object]] = []
    for train_arch, test_arch in (("volta", "ampere"), ("ampere", "volta")):
        train = [r for r in rows if r.gpu.arch == train_arch]
        test = [r for r in rows if r.gpu.arch == test_arch]
        params = fit(train)
        pred = calibration.predict(test, params)
        errors = [abs(p / r.measured - 1) * 100 for p, r in zip(pred, test, strict=True)]

        # The ratio that matters for choosing a GPU: predicted test/train speed ratio of the same run.
        def run_key(r: calibration.Row) -> tuple[object, ...]:
            return (r.workload.id, r.cfg.framework, r.precision == "AMP", r.cfg.gpus, r.cfg.micro_batch)

        train_pred = calibration.predict(train, params)
        twins = {run_key(r): (r, p) for r, p in zip(train, train_pred, strict=True)}
        ratio_err = []
        for r, p in zip(test, pred, strict=True):
            if run_key(r) in twins:
                twin, twin_pred = twins[run_key(r)]
                ratio_err.append(abs((p / twin_pred) / (r.measured / twin.measured) - 1) * 100)
        results.append(
            {
                "train": train_arch,
                "test": test_arch,
                "test_rows": len(test),
                "mape_pct": round(statistics.fmean(errors), 2),
                "median_ape_pct": round(statistics.median(errors), 2),
                "ratio_pairs": len(ratio_err),
                "ratio_mape_pct": round(statistics.fmean(ratio_err), 2),
                "ratio_median_ape_pct": round(statistics.median(ratio_err), 2),
            }
        )
    return results


def _numbers(obj: object) -> list[float]:
    if isinstance(obj, dict):
        return [n for k in sorted(obj) if k != "meta" for n in _numbers(obj[k])]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    if isinstance(obj, (int, float)):
        return [float(obj)]
    return []


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if fitted.json would change")
    ap.add_argument(
        "--holdout", action="store_true", help="report out-of-sample error across GPU generations"
    )
    args = ap.parse_args()

    rows, skipped = calibration.load_rows()
    if args.holdout:
        for h in holdout(rows):
            print(
                f"fit on {h['train']} -> predict {h['test']} ({h['test_rows']} rows): MAPE {h['mape_pct']}%, "
                f"median {h['median_ape_pct']}%; speed ratio over {h['ratio_pairs']} pairs: "
                f"MAPE {h['ratio_mape_pct']}%, median {h['ratio_median_ape_pct']}%"
            )
        return 0
    print(f"fitting on {len(rows)} rows ({sum(skipped.values())} skipped)...", file=sys.stderr)
    params = fit(rows)
    data_bytes = (resources.files("gpuscaler.perfmodel") / "data" / "published_throughput.jsonl").read_bytes()
    rep = calibration.report(params)
    out = fitted_to_dict(params)
    out["meta"] = {
        "data": "published_throughput.jsonl",
        "data_sha256": hashlib.sha256(data_bytes).hexdigest(),
        "rows_used": len(rows),
        "rows_skipped": skipped,
        "method": f"scipy least_squares (trf, bounded) on log(pred/measured), workload-scale prior weight {REG}",
        "fit_mape_pct": round(rep.overall.mape, 2),
        "fit_median_ape_pct": round(rep.overall.median, 2),
    }
    if not args.check:
        out["meta"]["holdout"] = holdout(rows)
    if args.check:
        committed = json.loads(OUT.read_text()) if OUT.exists() else {}
        a, b = _numbers(committed), _numbers(out)
        if len(a) != len(b) or any(
            not math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-9) for x, y in zip(a, b, strict=True)
        ):
            print("fitted.json is out of date: run python scripts/calibrate.py", file=sys.stderr)
            return 1
        print("fitted.json is up to date")
        return 0
    OUT.write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"wrote {OUT}: MAPE {rep.overall.mape:.1f}%, median {rep.overall.median:.1f}% over {len(rows)} rows"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
