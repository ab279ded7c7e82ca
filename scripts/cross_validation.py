#!/usr/bin/env python3
"""Write the performance model's cross-validated residuals (``perfmodel/data/cross_validation.json``).

The throughput band (:mod:`gpuscaler.perfmodel.uncertainty`) is drawn from these residuals. They
are out of sample by GPU generation, as ``scripts/calibrate.py --holdout`` splits the rows: fit
every free parameter on the V100 rows and predict the A100 rows, then fit on A100 and predict
V100; the residuals of both folds are pooled. Per metric (``ln(pred/measured)`` of):

* ``throughput``: every held-out row;
* ``gpu_ratio``: the held-out row's speed over its twin's in the training generation (same
  workload, framework, precision mode, GPU count and micro-batch), predicted vs measured;
* ``amp_speedup``: AMP over full precision on the same held-out GPU, workload, framework, GPUs;
* ``scaling``: n GPUs over 1 GPU on the same held-out GPU, workload, framework, precision, batch.

    python scripts/cross_validation.py            # write the file
    python scripts/cross_validation.py --print    # print it instead
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate import fit

from gpuscaler.perfmodel import calibration
from gpuscaler.perfmodel.uncertainty import SCHEMA_VERSION, parse_cross_validation

OUT = Path(__file__).resolve().parents[1] / "operator/gpuscaler/perfmodel/data/cross_validation.json"
FOLDS = (("volta", "ampere"), ("ampere", "volta"))


def _stats(log_errors: list[float]) -> dict[str, float | int]:
    ape = [abs(math.exp(e) - 1) for e in log_errors]
    return {
        "mape": round(statistics.fmean(ape), 4),
        "median_ape": round(statistics.median(ape), 4),
        "log_sigma": round(statistics.stdev(log_errors), 4),
        "n": len(log_errors),
    }


def residuals(rows: list[calibration.Row]) -> dict[str, list[float]]:
    """Pooled held-out log residuals of both folds, per metric."""
    out: dict[str, list[float]] = {"throughput": [], "gpu_ratio": [], "amp_speedup": [], "scaling": []}
    for train_arch, test_arch in FOLDS:
        train = [r for r in rows if r.gpu.arch == train_arch]
        test = [r for r in rows if r.gpu.arch == test_arch]
        params = fit(train)
        pred = calibration.predict(test, params)
        out["throughput"] += [math.log(p / r.measured) for p, r in zip(pred, test, strict=True)]

        def run_key(r: calibration.Row) -> tuple[object, ...]:
            return (r.workload.id, r.cfg.framework, r.precision == "AMP", r.cfg.gpus, r.cfg.micro_batch)

        twins = {run_key(r): (r, p) for r, p in zip(train, calibration.predict(train, params), strict=True)}
        for r, p in zip(test, pred, strict=True):
            if run_key(r) in twins:
                twin, twin_pred = twins[run_key(r)]
                out["gpu_ratio"].append(math.log((p / twin_pred) / (r.measured / twin.measured)))
        amp = calibration._ratio_errors(
            test, pred,
            lambda r: (r.workload.id, r.cfg.framework, r.gpu.id, r.cfg.gpus),
            lambda a, b: a.precision == "AMP" and b.precision != "AMP",
        )
        scaling = calibration._ratio_errors(
            test, pred,
            lambda r: (r.workload.id, r.cfg.framework, r.gpu.id, r.precision, r.cfg.micro_batch, r.cfg.accumulation),
            lambda a, b: a.cfg.gpus > 1 and b.cfg.gpus == 1,
        )
        out["amp_speedup"] += [math.log1p(e) for e in amp]
        out["scaling"] += [math.log1p(e) for e in scaling]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--print", action="store_true", help="print the JSON instead of writing the file")
    args = ap.parse_args()
    rows, _ = calibration.load_rows()
    res = residuals(rows)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "source": (
            "scripts/cross_validation.py: fit on the V100 rows of published_throughput.jsonl, predict the "
            "A100 rows, and the reverse (scripts/calibrate.py's fit and holdout split); residuals of both "
            f"folds pooled; {len(rows)} usable rows"
        ),
        "metrics": {name: _stats(v) for name, v in res.items()},
    }
    parse_cross_validation(doc)
    text = json.dumps(doc, indent=2) + "\n"
    if args.print:
        print(text, end="")
    else:
        OUT.write_text(text)
        print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
