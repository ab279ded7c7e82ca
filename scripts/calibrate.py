#!/usr/bin/env python3
"""Fit the performance model's free parameters on the published throughput rows.

Reproducible: deterministic least squares (scipy) on log errors, from fixed starting values, over
``operator/gpuscaler/perfmodel/data/published_throughput.jsonl`` only. Writes
``operator/gpuscaler/perfmodel/data/fitted.json``; ``gpuscaler validate`` reports the result.

    python scripts/calibrate.py            # fit and write
    python scripts/calibrate.py --check    # fit and fail if the committed file differs

Free parameters: per family the tensor and SIMT efficiencies, DRAM traffic per activation byte and
fixed per-micro-batch overhead; per framework a throughput factor (PyTorch = 1); per named
workload a scale regularised towards 1 (a log-normal prior, weight REG); the communication
overlap and the synchronisation cost per GPU doubling.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
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


def unpack(x: np.ndarray, families: list[str], frameworks: list[str], workloads: list[str]) -> FittedParams:
    i = 0
    fams = {}
    for f in families:
        te, se, mt, t0 = np.exp(x[i : i + 4])
        fams[f] = FamilyParams(float(te), float(se), float(mt), float(t0))
        i += 4
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
    fams["default"] = FamilyParams(
        *(
            float(np.exp(np.mean([math.log(getattr(fams[f], a)) for f in families])))
            for a in ("tensor_efficiency", "simt_efficiency", "memory_traffic", "step_overhead_s")
        )
    )
    return FittedParams(fams, ws, fw, overlap, sync)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if fitted.json would change")
    args = ap.parse_args()

    rows, skipped = calibration.load_rows()
    families = sorted({r.workload.family for r in rows})
    frameworks = sorted({r.cfg.framework for r in rows} - {"pytorch"})
    workloads = sorted({r.workload.id for r in rows})
    x0 = []
    for _ in families:
        x0 += [math.log(0.5), math.log(0.6), math.log(2.0), math.log(0.005)]
    x0 += [0.0] * len(frameworks) + [0.0] * len(workloads) + [0.0, math.log(0.002)]
    w_offset = 4 * len(families) + len(frameworks)
    measured = np.array([r.measured for r in rows])

    def residuals(x: np.ndarray) -> np.ndarray:
        params = unpack(x, families, frameworks, workloads)
        pred = np.array(calibration.predict(rows, params))
        data = np.log(pred / measured)
        prior = math.sqrt(REG) * x[w_offset : w_offset + len(workloads)]
        return np.concatenate([data, prior])

    print(
        f"fitting {len(x0)} parameters on {len(rows)} rows ({sum(skipped.values())} skipped)...",
        file=sys.stderr,
    )
    lo, hi = [], []
    for _ in families:  # efficiencies in (0, 1], DRAM traffic 0.1-50 x, overhead 10 us - 0.5 s
        lo += [math.log(0.01), math.log(0.01), math.log(0.1), math.log(1e-5)]
        hi += [0.0, 0.0, math.log(50.0), math.log(0.5)]
    lo += [math.log(0.5)] * len(frameworks) + [math.log(0.25)] * len(workloads) + [-6.0, math.log(1e-6)]
    hi += [math.log(2.0)] * len(frameworks) + [math.log(4.0)] * len(workloads) + [6.0, math.log(0.1)]
    fit = least_squares(residuals, np.array(x0), bounds=(lo, hi), method="trf", max_nfev=300)
    params = unpack(fit.x, families, frameworks, workloads)
    data_bytes = (resources.files("gpuscaler.perfmodel") / "data" / "published_throughput.jsonl").read_bytes()
    rep = calibration.report(params)
    out = fitted_to_dict(params)
    out["meta"] = {
        "data": "published_throughput.jsonl",
        "data_sha256": hashlib.sha256(data_bytes).hexdigest(),
        "rows_used": len(rows),
        "rows_skipped": skipped,
        "method": f"scipy least_squares on log(pred/measured), workload-scale prior weight {REG}",
        "fit_mape_pct": round(rep.overall.mape, 2),
        "fit_median_ape_pct": round(rep.overall.median, 2),
    }
    text = json.dumps(out, indent=2, sort_keys=False) + "\n"
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        same = json.loads(old) if old else None
        if same is None or any(
            not math.isclose(a, b, rel_tol=1e-3) for a, b in zip(_numbers(same), _numbers(out), strict=False)
        ):
            print("fitted.json is out of date: run scripts/calibrate.py", file=sys.stderr)
            return 1
        print("fitted.json is up to date")
        return 0
    OUT.write_text(text)
    print(
        f"wrote {OUT}: MAPE {rep.overall.mape:.1f}%, median {rep.overall.median:.1f}% over {len(rows)} rows"
    )
    return 0


def _numbers(obj: object) -> list[float]:
    if isinstance(obj, dict):
        return [n for k in sorted(obj) if k != "meta" for n in _numbers(obj[k])]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    if isinstance(obj, (int, float)):
        return [float(obj)]
    return []


if __name__ == "__main__":
    sys.exit(main())
