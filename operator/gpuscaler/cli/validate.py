"""``gpuscaler validate``: the performance model against the published throughput it was calibrated on."""

from __future__ import annotations

import argparse
from typing import Any

from gpuscaler.cli.common import _table
from gpuscaler.inputs import to_json


def cmd_validate(args: argparse.Namespace) -> int:
    from gpuscaler.perfmodel import calibration, fitted
    from gpuscaler.perfmodel import memory as mem
    from gpuscaler.planner import decisions

    rep = calibration.report()
    memory = mem.memory_agreement()
    meta = fitted().meta
    cv = calibration.cross_validation()
    if args.json:

        def s(x: calibration.ErrorStats) -> dict[str, float]:
            return {"n": x.n, "mape_pct": round(x.mape, 2), "median_ape_pct": round(x.median, 2)}

        print(
            to_json(
                {
                    "overall": s(rep.overall),
                    "by": {d: {k: s(v) for k, v in g.items()} for d, g in rep.by.items()},
                    "relative": {
                        "gpu_speed_ratio": s(rep.gpu_ratio),
                        "amp_speedup": s(rep.amp_speedup),
                        "scaling_efficiency": s(rep.scaling),
                    },
                    "cross_validation": {
                        **cv["metrics"],
                        "schemes": cv["schemes"],
                        "source": cv["source"],
                        "baseline": cv.get("baseline", {}),
                        "replicates": cv.get("replicates", {}),
                        "lookup_in_sample": cv.get("lookup_in_sample", {}),
                        "own_parameters_in_sample": cv.get("own_parameters_in_sample", {}),
                    },
                    "skipped": rep.skipped,
                    "calibration": meta,
                    "memory": mem.agreement_json(memory),
                    "decisions": decisions.scores(),
                },
            )
        )
        return 0
    print("Fit error of the performance model on the rows it was calibrated on")
    print("(NVIDIA DeepLearningExamples tables; in-sample, so an optimistic bound on accuracy).")
    print(
        f"\nOverall: {rep.overall.n} rows, MAPE {rep.overall.mape:.1f}%, median error {rep.overall.median:.1f}%\n"
    )
    labels = {
        "throughput": "throughput (absolute)",
        "gpu_ratio": "GPU speed ratio (A100 vs V100, same run)",
        "amp_speedup": "mixed-precision speedup (same GPU)",
        "scaling": "multi-GPU scaling (n GPUs vs 1)",
    }
    in_sample = {"gpu_ratio": rep.gpu_ratio, "amp_speedup": rep.amp_speedup, "scaling": rep.scaling}
    baseline = cv.get("baseline", {}).get("metrics", {})
    replicates = cv.get("replicates", {})
    lookup = cv.get("lookup_in_sample", {})
    own = cv.get("own_parameters_in_sample", {})

    def pct(d: dict[str, Any], key: str) -> str:
        return f"{d[key]['mape'] * 100:.1f}" if isinstance(d.get(key), dict) and d[key].get("n") else "-"

    print("Relative errors (what the planner's choices hinge on), in sample and cross-validated:")
    rows: list[list[object]] = []
    for key, label in labels.items():
        m = cv["metrics"][key]
        fit = in_sample.get(key, rep.overall)
        rows.append(
            [
                label,
                fit.n,
                f"{fit.mape:.1f}",
                m["n"],
                f"{m['mape'] * 100:.1f}",
                f"{m['median_ape'] * 100:.1f}",
                pct(baseline, key),
                f"{pct(own.get('workload', {}), key)} / {pct(own.get('workload_framework', {}), key)}",
                pct(lookup, key),
                pct(replicates, key),
            ]
        )
    print(
        _table(
            [
                "quantity",
                "rows or pairs",
                "fit MAPE %",
                "held out",
                "CV MAPE %",
                "CV median %",
                "baseline CV %",
                "own params %",
                "lookup %",
                "replicates %",
            ],
            rows,
        )
    )
    if baseline:
        print(
            "baseline CV: the same held-out pairs predicted without a model, from the median measured ratio of the\n"
            "fold's training pairs of the same workload and framework (then family), else the spec sheet (bandwidth\n"
            "ratio, no AMP speedup, linear scaling). own params: in sample, the model with every family parameter\n"
            "fitted per workload / per workload and framework: what its terms explain at best, knowing each one's own\n"
            "answer (a held-out row has no parameters of its own). lookup: in sample, each workload and framework's\n"
            "own median ratio; what is left is how ratios move with batch size, GPU count and table. replicates: the\n"
            "same configuration measured twice in the tables differs by this much; against one noisy measurement no\n"
            "model can be expected below about this / sqrt(2)."
        )
    print("\nCross-validated MAPE % by scheme (scripts/calibrate.py; every scored prediction is held out):")
    print(
        _table(
            ["scheme", *labels],
            [
                [name, *(f"{m[k]['mape'] * 100:.1f} ({m[k]['n']})" for k in labels)]
                for name, m in cv["schemes"].items()
            ],
        )
    )
    if baseline:
        print("\nModel-free baseline, cross-validated MAPE % by scheme (the same held-out pairs):")
        print(
            _table(
                ["scheme", *list(labels)[1:]],
                [
                    [name, *(f"{m[k]['mape'] * 100:.1f} ({m[k]['n']})" for k in list(labels)[1:])]
                    for name, m in cv["baseline"]["schemes"].items()
                ],
            )
        )
    for dim in ("gpu", "precision", "family", "gpus", "workload", "framework"):
        print(f"\nBy {dim} (in sample):")
        print(
            _table(
                [dim, "rows", "MAPE %", "median %"],
                [[k.strip(), v.n, f"{v.mape:.1f}", f"{v.median:.1f}"] for k, v in rep.by[dim].items()],
            )
        )
    if rep.skipped:
        print("\nSkipped rows: " + "; ".join(f"{n} {why}" for why, n in rep.skipped.items()))
    print("\nMemory against documented configurations (catalog/data/memory_runs.csv; docs/memory-model.md):")
    print("\n".join([_table(mem.MEMORY_TABLE_HEADERS, mem.agreement_rows(memory)), *mem.agreement_misses(memory)]))
    print("\n" + "\n".join(decisions.format_scores(decisions.scores())) + "\n(docs/decision-scores.md)")
    return 0
