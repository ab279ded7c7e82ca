#!/usr/bin/env python3
"""Decision scores of the planner, the model's plain argmin and a spec-sheet chooser, cross-validated.

    python benchmarks/decision_scores.py [--worst 10] [--json]

Prints what ``gpuscaler validate`` prints under "Decision scores" (the design is in
:mod:`gpuscaler.planner.decisions` and docs/decision-scores.md), then the decisions where each
chooser's regret was largest, with the option chosen and the measured best one; and the planner's
scores without trials (``atRiskLimit: Refuse``) and with every trial's estimates reading one or two
floor sigmas fast or one slow, for comparison. Figures only, no timed assertions. The per-fold predictions come from ``scripts/calibrate.py --folds``.
"""

from __future__ import annotations

import argparse
import json

from gpuscaler.perfmodel import calibration
from gpuscaler.planner.correction import MEASURED_LOG_SIGMA_FLOOR
from gpuscaler.planner.decisions import CHOOSERS, format_scores, scores


def describe(row: calibration.Row) -> str:
    return f"{row.cfg.gpus} x {row.gpu.id} {row.precision} b{row.cfg.micro_batch} ({row.measured:,.0f}/s measured)"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--worst", type=int, default=5, help="decisions listed per chooser (largest regret first)")
    ap.add_argument("--json", action="store_true", help="print the scores as JSON (validate --json's decisions)")
    args = ap.parse_args()
    trace: list[dict[str, object]] = []
    d = scores(trace=trace)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    print("\n".join(format_scores(d)))
    refuse = scores(trials=False)["pooled"]["planner"]
    print(f"\nThe planner with atRiskLimit: Refuse (no trials), the same decisions: mean regret "
          f"{refuse['mean_regret_pct']:.1f}%, worst {refuse['worst_regret_pct']:.1f}%, misses {refuse['misses_pct']:.1f}%, "
          f"no plan {refuse['no_plan_where_feasible_pct']:.1f}%")
    for read in (MEASURED_LOG_SIGMA_FLOOR, 2 * MEASURED_LOG_SIGMA_FLOOR, -MEASURED_LOG_SIGMA_FLOOR):
        got = scores(trial_read=read)
        off, ho = got["pooled"]["planner"], got["hopeless"]
        print(f"Trials whose every estimate reads {abs(read):.0%} {'fast' if read > 0 else 'slow'} (a persistent error of "
              f"{abs(read) / MEASURED_LOG_SIGMA_FLOOR:g} floor sigma): mean regret {off['mean_regret_pct']:.1f}%, worst "
              f"{off['worst_regret_pct']:.1f}%, misses {off['misses_pct']:.1f}%, no plan "
              f"{off['no_plan_where_feasible_pct']:.1f}%, stopped trials spent {off['stopped_trial_mean_spend_pct']}%; "
              f"at deadlines nothing meets: misses {ho['misses_pct']}%, stopped spent a mean {ho['stopped_mean_spend_pct']}% "
              f"(worst {ho['stopped_worst_spend_pct']}%)")
    rows, _ = calibration.load_rows()
    for chooser in CHOOSERS:
        mine = [t for t in trace if t["chooser"] == chooser and t["regret"] is not None]
        mine.sort(key=lambda t: -float(t["regret"]))  # type: ignore[arg-type]
        print(f"\nLargest regrets of {chooser}:")
        for t in mine[: args.worst]:
            k = "no deadline" if t["k"] is None else f"deadline {t['k']:g}x"
            chosen, best = rows[int(t["chosen"])], rows[int(t["best"])]  # type: ignore[call-overload]
            print(f"  {float(t['regret']):+.0%} {t['fold']} | {t['workload']} {t['framework']} {k}: "  # type: ignore[arg-type]
                  f"chose {describe(chosen)}; best {describe(best)}{' (missed)' if t['missed'] else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
