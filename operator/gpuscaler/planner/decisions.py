"""Decision scores: the planner's choices against measured throughput, cross-validated on the project's own data.

``gpuscaler validate`` (its ``decisions``) and ``benchmarks/decision_scores.py`` call
:func:`scores`. The throughput model's errors matter only through the choices they lead to, so
this scores choices, not predictions.

**Data.** The calibration rows (``perfmodel/data/published_throughput.jsonl``, mapped by
:func:`gpuscaler.perfmodel.calibration.load_rows`) and, per cross-validation fold of
``scripts/calibrate.py`` (GPU transfer: fit on V100, predict A100 and the reverse; leave one
workload out), the throughput of every row as the model fitted *without that fold's rows*
predicts it (``perfmodel/data/fold_predictions.json``, ``scripts/calibrate.py --folds``).

**Decisions.** The rows of one training code (one README at its commit, one workload, one
framework) are the options a team with that code has: GPU type, GPU count, precision, batch
per GPU as measured (the tables do not keep the global batch fixed across rows; neither can this).
An option costs its GPU's cheapest on-demand catalog price per GPU-hour times its GPUs, and
trains ``S`` items in ``S / X / 3600 (1 + write / interval) + startup`` hours (the planner's
checkpoint write time and on-demand interval, its start-up allowance). ``S`` is what the measured
fastest option trains in :data:`REFERENCE_HOURS`. A fold decides for every group that has a row
it held out (for GPU transfer: groups measured on both GPU generations), once without a deadline
and once for each deadline ``k x T_fast`` of :data:`TIGHTNESS` (``T_fast``: the measured fastest
option's hours; so at least one measured option always meets the deadline, and ``k`` near 1 leaves
only the fastest few).

**Choosers.**

* ``planner``: the planner's rule on the options, with the fold's predictions: each option's band
  (:func:`gpuscaler.perfmodel.uncertainty.throughput_band`), P(miss) with its contingency
  (:mod:`gpuscaler.planner.contingency`, the fallback over the options), expected cost with the
  contingency's, feasible when not :func:`~gpuscaler.planner.risk.over_risk` at
  :data:`MAX_RISK`, the cheapest (then sooner) feasible one. It is scored as the operator runs it:
  when the measured speed is below the contingency's threshold, the job moves to the fallback at
  the contingency's hour and finishes there at the fallback's measured speed, paying both. Where
  nothing is feasible but an option's P(miss) is below 90%, the cheapest such option is a trial
  (:mod:`gpuscaler.planner.trial`, :func:`realise_trial`): kept, moved, continued or, when it would
  probably miss, followed by the next trial on a GPU type not tried (:func:`next_trial`); one with no
  next trial is a "no plan" that paid what it ran.
* ``argmin``: the model's plain cheapest option whose predicted hours fit the deadline (no band,
  no recourse).
* ``spec-sheet``: no model: one measured GPU type (the fold's training GPU for GPU transfer, else
  the group's V100 rows when it has any, else its A100 rows); every option's throughput is the
  nearest measured row on that GPU (same precision when there is one, closest GPU count) times the
  ratio of peak TFLOPS at the precisions and of the GPU counts (linear scaling); the cheapest whose
  hours fit.

**Scores** per chooser (per scheme and pooled): cost regret (realised cost over the cheapest
measured option that meets the deadline, minus 1) mean and worst over the decisions where it
chose, and over the decisions where all three chose (``common_*``: the same decisions for each,
what the targets compare); deadline misses (realised hours over the deadline) and "no plan" where
a measured option meets the deadline, each over the deadline decisions; per deadline tightness
as well (``by_tightness``).

**The floor under "no plan"** (``no_plan_floor``, per tightness and pooled): the share of deadline
decisions the planner's rule refuses when every prediction *is* the measured throughput, each option
keeping the model's band. No planner that keeps ``maxDeadlineRisk`` honestly with a model this
uncertain can answer those: with a band of sigma ``s`` a plan whose median finishes exactly on time
misses with P 1/2, and one needs ``D >= T exp(z_{1-r} s)`` (1.41 x ``T`` at ``s`` = 0.21 and ``r`` = 5%)
before P(miss) reaches ``r`` with no second plan to move to.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from gpuscaler.catalog import CapacityType, Catalog, InstanceType, load_catalog
from gpuscaler.perfmodel import calibration, estimate
from gpuscaler.perfmodel.uncertainty import throughput_band
from gpuscaler.planner import trial
from gpuscaler.planner.candidate import Candidate
from gpuscaler.planner.contingency import ALTERNATE_COST_FACTOR, Recourse, fallback, with_fallback
from gpuscaler.planner.correction import (
    MEASURED_LOG_SIGMA_FLOOR,
    CorrectionConfig,
    posterior,
    remaining_miss_probability,
)
from gpuscaler.planner.evaluate import STARTUP_S, checkpoint_write_seconds, corrected
from gpuscaler.planner.profiles import RUN_LOG_SIGMA_FLOOR, ProfileKey, ProfileStore, RunMeasurement
from gpuscaler.planner.risk import outlook, over_risk
from gpuscaler.policy import Policy

TIGHTNESS = (1.05, 1.15, 1.3, 1.6, 2.0, 3.0)
"""Deadlines as multiples of the measured fastest option's hours."""
REFERENCE_HOURS = 4.0
"""The job trains what the measured fastest option trains in this many hours."""
MAX_RISK = 0.05
"""``maxDeadlineRisk`` of the decisions (the default of the API)."""
PROFILED_AT = datetime(2026, 1, 1, tzinfo=UTC)
"""When the profiled run of :func:`profiled_predictions` finished (no profile expires within the scores)."""
RESTART_S = 300.0
"""``checkpoint.restartSeconds`` of the decisions (the API's default)."""
TRIAL_STEP_S = 600.0
"""How often the scores judge a continued trial again (the observer does at every corrected estimate,
minutes apart; the verdict moves slowly, so a coarser step changes only when a stop is seen)."""
HOPELESS = (0.8, 0.95)
"""Deadlines (x the measured fastest option's hours) that no measured option meets: what trials cost
where the job cannot be done (``hopeless`` in :func:`scores`)."""
CHOOSERS = ("planner", "argmin", "spec-sheet")
NO_PLAN_TARGET_PCT = 5.0
"""Issue 35's targets: "no plan" where a measured option meets the deadline, at most this share of
the deadline decisions; the planner's mean regret at most the argmin's plus :data:`OVER_ARGMIN_POINTS`
and below the spec-sheet chooser's; its worst regret at most :data:`WORST_TARGET_PCT`; its misses
at most :data:`MISSES_TARGET_PCT` of the deadline decisions."""
OVER_ARGMIN_POINTS = 0.5
WORST_TARGET_PCT = 15.0
MISSES_TARGET_PCT = 5.0


@dataclass(frozen=True)
class Option:
    """One measured row as a way to run the job."""

    index: int
    row: calibration.Row
    usd_per_hour: float
    """Its GPUs at the GPU's cheapest on-demand catalog price per GPU-hour."""
    instance: InstanceType
    """The catalog instance that price comes from (labels only)."""
    write_s: float

    @property
    def gpus(self) -> int:
        return self.row.cfg.gpus

    def hours(self, throughput: float, samples: float) -> float:
        """Hours to train ``samples`` at ``throughput`` on-demand (checkpoint writes and start-up included)."""
        interval = float(Policy().max_checkpoint_interval_s)
        return samples / throughput / 3600.0 * (1.0 + self.write_s / interval) + STARTUP_S / 3600.0


@dataclass(frozen=True)
class Outcome:
    """What one chooser did in one decision."""

    chosen: int | None
    """Row index of the option chosen (None: no plan)."""
    hours: float = 0.0
    cost: float = 0.0
    """Of the whole run; of the trial's window when a trial stopped (``chosen`` None)."""
    moved: bool = False
    trial: str = ""
    """A trial's end (:mod:`gpuscaler.planner.trial`): ``kept``, ``moved`` or ``stopped``; empty: no trial."""


def gpu_prices(catalog: Catalog) -> dict[str, tuple[float, InstanceType]]:
    """Per GPU id: the cheapest on-demand price per GPU-hour in the catalog, and its instance."""
    out: dict[str, tuple[float, InstanceType]] = {}
    for inst in catalog.instances:
        price = inst.price(CapacityType.ON_DEMAND)
        if price is None:
            continue
        per = price / inst.gpu_count
        if inst.gpu_id not in out or per < out[inst.gpu_id][0]:
            out[inst.gpu_id] = (per, inst)
    return out


def peak_tflops(row: calibration.Row) -> float:
    """The GPU's peak at the row's precision (AMP: FP16 tensor; TF32 where listed; else FP32)."""
    g = row.gpu
    if row.precision == "AMP":
        return g.fp16_tflops
    if row.precision == "TF32" and g.tf32_tflops:
        return g.tf32_tflops
    return g.fp32_tflops


def spec_sheet(options: Sequence[Option], reference_arch: str) -> dict[int, float] | None:
    """Every option's throughput from one measured GPU type by peak-TFLOPS and GPU-count ratios (None:
    the group has no row on that GPU generation)."""
    ref = [o for o in options if o.row.gpu.arch == reference_arch]
    if not ref:
        return None
    gpu_id = min({o.row.gpu.id for o in ref}, key=lambda g: (-sum(o.row.gpu.id == g for o in ref), g))
    ref = [o for o in ref if o.row.gpu.id == gpu_id]
    out = {}
    for o in options:
        same = [r for r in ref if r.row.precision == o.row.precision] or ref
        r = min(same, key=lambda r: (abs(math.log(r.gpus / o.gpus)), abs(r.row.cfg.micro_batch - o.row.cfg.micro_batch)))
        out[o.index] = r.row.measured * peak_tflops(o.row) / peak_tflops(r.row) * o.gpus / r.gpus
    return out


def _candidate(o: Option, throughput: float, samples: float, deadline_h: float | None,
               log_sigma: float | None = None) -> Candidate:  # fmt: skip
    """The option as the planner's candidate, at ``throughput`` with the model's band there (or a band of
    ``log_sigma``: a profile's)."""
    r = o.row
    est = estimate(r.workload, r.gpu, r.cfg)
    est = corrected(est, throughput / est.throughput)
    band = throughput_band(r.workload, r.gpu, r.cfg.precision, throughput)
    if log_sigma is not None:
        band = band.scaled(1.0, log_sigma)
    work_h = samples / throughput / 3600.0
    interval = float(Policy().max_checkpoint_interval_s)
    out = outlook(work_h, 0.0, o.write_s, RESTART_S, STARTUP_S, interval, deadline_h, band.log_sigma)
    return Candidate(
        instance=o.instance, nodes=o.gpus, capacity=CapacityType.ON_DEMAND, precision=r.cfg.precision,
        micro_batch=r.cfg.micro_batch, accumulation=r.cfg.accumulation, zero_stage=0, activation_checkpointing=False,
        estimate=est, usd_per_hour=o.usd_per_hour, work_hours=work_h, checkpoint_write_s=o.write_s, outlook=out,
        band=band,
    )  # fmt: skip


def plan_options(options: Sequence[Option], predicted: dict[int, float], samples: float, deadline_h: float | None,
                 sigmas: dict[int, float] | None = None) -> tuple[Candidate | None, dict[int, Candidate]]:  # fmt: skip
    """The planner's rule on the options: contingencies, the risk limit, the cheapest then sooner (``sigmas``:
    each option's band, where a profile gives it)."""
    cands = {o.index: _candidate(o, predicted[o.index], samples, deadline_h, None if sigmas is None else sigmas[o.index])
             for o in options}  # fmt: skip
    if deadline_h is not None:
        plain = list(cands.values())

        def attach(target: Candidate | None) -> list[Candidate]:
            alternate = None if target is None else fallback(plain, ALTERNATE_COST_FACTOR, target)
            of = Recourse(target, deadline_h=deadline_h, max_risk=MAX_RISK, restart_s=RESTART_S, startup_s=STARTUP_S,
                          alternate=alternate).of  # fmt: skip
            return [c.with_contingency(of(c)) for c in plain]

        def feasible(c: Candidate) -> bool:
            return not over_risk(c.outlook.deadline_miss_probability, MAX_RISK)

        with_k, _ = with_fallback(plain, lambda factor: fallback(plain, factor), attach, feasible)
        cands = dict(zip(cands, with_k, strict=True))
    ok = [c for c in cands.values() if deadline_h is None or not over_risk(c.outlook.deadline_miss_probability, MAX_RISK)]
    chosen = min(ok, key=lambda c: (c.expected_cost_usd, c.expected_hours), default=None)
    return chosen, cands


def realise_planner(chosen: Candidate, options: dict[int, Option], cands: dict[int, Candidate], index: int,
                    samples: float) -> Outcome:  # fmt: skip
    """The chosen plan as the operator runs it on the measured speeds: its contingency's move when it measures slow."""
    o = options[index]
    hours = o.hours(o.row.measured, samples)
    k = chosen.contingency
    if k is None or not k.applies or k.target is None or o.row.measured >= k.threshold or hours <= k.move_h:
        return Outcome(index, hours, hours * o.usd_per_hour)
    t_index = next(i for i, c in cands.items() if c.instance is k.target.instance and c.nodes == k.target.nodes
                   and c.precision is k.target.precision and c.micro_batch == k.target.micro_batch)  # fmt: skip
    t = options[t_index]
    startup_h = STARTUP_S / 3600.0
    interval = float(Policy().max_checkpoint_interval_s)
    done = min(o.row.measured * 3600.0 * (k.move_h - startup_h) / (1.0 + o.write_s / interval), samples)
    overhead_h = (o.write_s + RESTART_S + STARTUP_S) / 3600.0
    rest_h = t.hours(t.row.measured, samples - done) - startup_h + overhead_h
    return Outcome(index, k.move_h + rest_h, k.move_h * o.usd_per_hour + rest_h * t.usd_per_hour, moved=True)


def cheapest_fitting(options: Sequence[Option], speed: dict[int, float], samples: float,
                     deadline_h: float | None) -> int | None:  # fmt: skip
    """The option with the lowest cost at ``speed`` whose hours at ``speed`` fit the deadline."""
    fits = [o for o in options if deadline_h is None or o.hours(speed[o.index], samples) <= deadline_h]
    best = min(fits, key=lambda o: (o.hours(speed[o.index], samples) * o.usd_per_hour, o.hours(speed[o.index], samples)),
               default=None)  # fmt: skip
    return None if best is None else best.index


def measured(o: Option, samples: float) -> Outcome:
    h = o.hours(o.row.measured, samples)
    return Outcome(o.index, h, h * o.usd_per_hour)


def fold_predictions() -> dict[str, Any]:
    """The committed per-fold predictions (``perfmodel/data/fold_predictions.json``)."""
    text = (resources.files("gpuscaler.perfmodel") / "data" / "fold_predictions.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def training_code(row: calibration.Row) -> tuple[str, str, str]:
    """The training code a row measured: its README (at its commit), workload and framework. The rows of
    one code are one team's options (:func:`scores`) and share most of the model's error
    (:func:`error_correlations`)."""
    return row.document, row.workload.id, row.cfg.framework


def error_correlations(folds: dict[str, Any] | None = None) -> tuple[float, float]:
    """Correlation of the model's log errors on two held-out rows of one code (one README, workload and
    framework) in one fold, both schemes pooled: on the same GPU type and precision, and across them.

    What :data:`gpuscaler.perfmodel.uncertainty.ERROR_CORRELATION_SAME_GPU` and ``_OTHER_GPU`` hold
    (a test checks they agree); the recourse reads a plan's fallback from the plan's measurement by them.
    """
    data = folds or fold_predictions()
    rows, _ = calibration.load_rows(load_catalog())
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[training_code(r)].append(i)
    pairs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for fold in data["folds"]:
        held, predicted = set(fold["held_out"]), fold["predicted"]
        for members in groups.values():
            err = {i: math.log(rows[i].measured / predicted[i]) for i in members if i in held}
            for a, b in itertools.combinations(sorted(err), 2):
                alike = rows[a].gpu.id == rows[b].gpu.id and rows[a].precision == rows[b].precision
                pairs[alike] += [(err[a], err[b]), (err[b], err[a])]
    same, other = (statistics.correlation([x for x, _ in pairs[k]], [y for _, y in pairs[k]]) for k in (True, False))
    return same, other


@dataclass
class Tally:
    """One chooser's scores over a set of decisions."""

    regrets: list[float]
    common: list[float] = field(default_factory=list)
    """Regrets on the decisions where every chooser made a plan (comparable across choosers)."""
    deadline_decisions: int = 0
    misses: int = 0
    no_plan: int = 0
    moves: int = 0
    trials: dict[str, int] = field(default_factory=lambda: {"kept": 0, "moved": 0, "next": 0, "stopped": 0})
    """Trials (:mod:`gpuscaler.planner.trial`) by how they ended ("next": stopped, and a next trial on another
    GPU type ended with a plan)."""
    trial_regrets: list[float] = field(default_factory=list)
    """Regrets of the kept and moved trials (in ``regrets`` too)."""
    untried_regrets: list[float] = field(default_factory=list)
    """Regrets of the decisions that were no trial (in ``regrets`` too)."""
    stopped_spend: list[float] = field(default_factory=list)
    """What each stopped trial spent, over the cheapest measured option that meets the deadline."""

    def to_dict(self) -> dict[str, Any]:
        n = self.deadline_decisions
        return {
            "decisions_with_a_plan": len(self.regrets),
            "mean_regret_pct": round(100 * statistics.fmean(self.regrets), 2) if self.regrets else None,
            "worst_regret_pct": round(100 * max(self.regrets), 2) if self.regrets else None,
            "common_decisions": len(self.common),
            "common_mean_regret_pct": round(100 * statistics.fmean(self.common), 2) if self.common else None,
            "common_worst_regret_pct": round(100 * max(self.common), 2) if self.common else None,
            "deadline_decisions": n,
            "misses": self.misses,
            "misses_pct": round(100 * self.misses / n, 2) if n else None,
            "no_plan_where_feasible": self.no_plan,
            "no_plan_where_feasible_pct": round(100 * self.no_plan / n, 2) if n else None,
            "moves": self.moves,
            "trials": dict(self.trials),
            "trial_mean_regret_pct": round(100 * statistics.fmean(self.trial_regrets), 2) if self.trial_regrets else None,
            "trial_worst_regret_pct": round(100 * max(self.trial_regrets), 2) if self.trial_regrets else None,
            "worst_regret_without_trials_pct": (
                round(100 * max(self.untried_regrets), 2) if self.untried_regrets else None
            ),
            "stopped_trial_mean_spend_pct": (
                round(100 * statistics.fmean(self.stopped_spend), 2) if self.stopped_spend else None
            ),
        }


@dataclass
class Hopeless:
    """The planner at deadlines no measured option meets (:data:`HOPELESS`): what trying costs where the job
    cannot be done. A plan there (kept or moved trial, or a plan the model found feasible) misses."""

    decisions: int = 0
    refused: int = 0
    """Answered "no plan" at once."""
    stopped: int = 0
    misses: int = 0
    spend: list[float] = field(default_factory=list)
    """What each stopped trial spent, over the cheapest measured run of the whole job."""

    def decide(self, opts: Sequence[Option], by_index: dict[int, Option], predicted: dict[int, float], samples: float,
               t_fast: float, trials: bool, trial_read: float) -> None:  # fmt: skip
        """The planner's decisions of one group at each deadline of :data:`HOPELESS`, counted."""
        cheapest = min(measured(o, samples).cost for o in opts)
        for k in HOPELESS:
            out, _ = _planned(opts, by_index, predicted, samples, k * t_fast, trials=trials, trial_read=trial_read)
            self.add(out, cheapest)

    def add(self, out: Outcome, cheapest: float) -> None:
        self.decisions += 1
        if out.chosen is not None:
            self.misses += 1
        elif out.trial:
            self.stopped += 1
            self.spend.append(out.cost / cheapest)
        else:
            self.refused += 1

    def to_dict(self) -> dict[str, Any]:
        n = self.decisions
        return {
            "deadlines_x_fastest_measured": list(HOPELESS),
            "decisions": n,
            "refused_pct": round(100.0 * self.refused / n, 2) if n else None,
            "trials_stopped_pct": round(100.0 * self.stopped / n, 2) if n else None,
            "misses_pct": round(100.0 * self.misses / n, 2) if n else None,
            "stopped_mean_spend_pct": round(100.0 * statistics.fmean(self.spend), 2) if self.spend else None,
            "stopped_worst_spend_pct": round(100.0 * max(self.spend), 2) if self.spend else None,
        }


def scores(
    catalog: Catalog | None = None, folds: dict[str, Any] | None = None, trace: list[dict[str, Any]] | None = None,
    trials: bool = True,
    trial_read: float = 0.0,
) -> dict[str, Any]:
    """Cross-validated decision scores of the planner, the model's argmin and a spec-sheet chooser.

    Args:
        catalog: prices (the shipped catalog when None).
        folds: per-fold predictions (the committed ``fold_predictions.json`` when None).
        trace: when given, one record per chooser and decision is appended (fold, group, deadline,
            the option chosen and the best measured one, regret, miss): what the benchmark lists.
        trials: where the risk limit alone binds, the planner tries a plan (``atRiskLimit: Trial``,
            the default) rather than refusing (False: ``Refuse``).
        trial_read: the log error of a trial's measuring window against the run's throughput (0: it
            reads the measured throughput; 0.05: 5% fast, one floor sigma, the case that keeps what
            it should not).

    Returns:
        ``{"design": ..., "pooled": {chooser: scores}, "schemes": {scheme: {chooser: scores}},
        "targets": {...}}`` (the module docstring says what each figure is).

    Raises:
        ValueError: the fold predictions were made from other rows than the package's.
    """
    cat = catalog or load_catalog()
    data = folds or fold_predictions()
    rows, _ = calibration.load_rows(cat)
    if data["rows"] != len(rows):
        raise ValueError(f"fold_predictions.json has {data['rows']} rows, the calibration {len(rows)}: "
                         "run python scripts/calibrate.py --folds")  # fmt: skip
    prices = gpu_prices(cat)
    policy = Policy()
    options = {
        i: Option(i, r, prices[r.gpu.id][0] * r.cfg.gpus, prices[r.gpu.id][1],
                  checkpoint_write_seconds(r.workload, r.cfg, policy, None))
        for i, r in enumerate(rows) if r.gpu.id in prices
    }  # fmt: skip
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, o in options.items():
        groups[training_code(o.row)].append(i)
    tallies: dict[str, dict[str, Tally]] = defaultdict(lambda: {c: Tally([]) for c in CHOOSERS})
    floor: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # per tightness: [refused with exact medians, decisions]
    refused: list[tuple[bool, float, float]] = []  # the planner's "no plan": its closest plan at measured speed
    profiled = Tally([])  # leave one workload out, after one profiled run of the team's code
    profiled_refused: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # per tightness: [no plan, decisions]
    hopeless = Hopeless()
    decisions = 0
    for fold in data["folds"]:
        scheme, held = fold["scheme"], set(fold["held_out"])
        predicted = {i: float(p) for i, p in enumerate(fold["predicted"])}
        for members in groups.values():
            opts = [options[i] for i in members]
            if len(opts) < 2 or not held & set(members):
                continue
            reference = _reference(scheme, opts, held)
            spec = None if reference is None else spec_sheet(opts, reference)
            if spec is None:
                continue
            fastest = min(opts, key=lambda o: o.hours(o.row.measured, 1.0))
            samples = fastest.row.measured * 3600.0 * REFERENCE_HOURS
            t_fast = fastest.hours(fastest.row.measured, samples)
            by_index = {o.index: o for o in opts}
            first = None
            if scheme == "leave_one_workload_out":  # the team's first run: the plan without a deadline
                first, _ = plan_options(opts, predicted, samples, None)
            prof = None if first is None else profiled_predictions(opts, predicted, first)
            for k in (None, *TIGHTNESS):
                deadline = None if k is None else k * t_fast
                meets = [measured(o, samples) for o in opts if deadline is None or measured(o, samples).hours <= deadline]
                best = min(x.cost for x in meets)
                planned, cands = _planned(opts, by_index, predicted, samples, deadline, trials=trials,
                                          trial_read=trial_read)  # fmt: skip
                outcomes = {
                    "planner": planned,
                    "argmin": _outcome(cheapest_fitting(opts, predicted, samples, deadline), by_index, samples),
                    "spec-sheet": _outcome(cheapest_fitting(opts, spec, samples, deadline), by_index, samples),
                }  # fmt: skip
                decisions += 1
                if deadline is not None and planned.chosen is None:
                    refused.append(closest_outcome(opts, cands, samples, deadline, best))
                if deadline is not None:
                    exact, _ = plan_options(opts, {o.index: o.row.measured for o in opts}, samples, deadline)
                    for key in (f"{k:g}x", "pooled"):
                        floor[key][0] += exact is None
                        floor[key][1] += 1
                if trace is not None:
                    trace += _trace_records(scheme, fold["fold"], opts[0].row, k, deadline, meets, outcomes)
                _count(tallies, scheme, k, deadline, best, outcomes)
                if prof is not None:
                    out, _ = _planned(opts, by_index, prof[0], samples, deadline, prof[1], trials=trials,
                                      trial_read=trial_read)  # fmt: skip
                    _count_one(profiled, deadline, best, out)
                    if deadline is not None:
                        profiled_refused[f"{k:g}x"][0] += out.chosen is None
                        profiled_refused[f"{k:g}x"][1] += 1
            hopeless.decide(opts, by_index, predicted, samples, t_fast, trials, trial_read)
    pooled = {c: t.to_dict() for c, t in tallies.pop("pooled").items()}
    by_tightness = {key.split(" ", 1)[1]: {c: t.to_dict() for c, t in tallies.pop(key).items()}
                    for key in [key for key in tallies if key.startswith("deadline ")]}  # fmt: skip
    return {
        "design": {
            "groups": "rows of one README, workload and framework are one team's options",
            "deadlines_x_fastest_measured": list(TIGHTNESS),
            "reference_hours": REFERENCE_HOURS,
            "max_deadline_risk": MAX_RISK,
            "decisions": decisions,
            "schemes": sorted(k for k in tallies if not k.startswith("deadline ")),
        },
        "pooled": pooled,
        "schemes": {s: {c: t.to_dict() for c, t in by.items()} for s, by in sorted(tallies.items())},
        "by_tightness": by_tightness,
        "targets": targets(pooled),
        "no_plan_floor": {
            key: round(100.0 * floor[key][0] / floor[key][1], 2)
            for key in [*(f"{k:g}x" for k in TIGHTNESS), "pooled"]
            if floor[key][1]
        },
        "no_plan_closest": _closest_summary(refused),
        "hopeless": hopeless.to_dict(),
        "profiled": {
            "design": "leave_one_workload_out, after the team ran its code once: the planner's choice without a "
                      "deadline, measured, kept as a performance profile (planner.profiles); every option planned "
                      "with what the profile says of it (exact match or near match), the rest as before",
            "planner": profiled.to_dict(),
            "no_plan_by_tightness_pct": {key: round(100.0 * n / d, 2) for key, (n, d) in profiled_refused.items() if d},
        },
    }


def profiled_predictions(options: Sequence[Option], predicted: dict[int, float],
                         first: Candidate) -> tuple[dict[int, float], dict[int, float]]:  # fmt: skip
    """Every option's throughput and band sigma after one run of ``first`` (at its measured throughput,
    the run's sigma at :data:`~gpuscaler.planner.profiles.RUN_LOG_SIGMA_FLOOR`) is kept as a profile: what
    :meth:`~gpuscaler.planner.profiles.ProfileStore.prior_for` says of each (the model where it says nothing)."""
    def key(o: Option) -> ProfileKey:
        c = o.row.cfg
        return ProfileKey(o.row.workload.id, o.row.gpu.id, c.gpus, c.nodes, c.micro_batch, c.accumulation, c.precision.value)

    ran = next(o for o in options if o.instance is first.instance and o.gpus == first.nodes
               and o.row.cfg.precision is first.precision and o.row.cfg.micro_batch == first.micro_batch)  # fmt: skip
    store = ProfileStore()
    store.record(key(ran), RunMeasurement(ran.row.measured, RUN_LOG_SIGMA_FLOOR, predicted[ran.index], PROFILED_AT))
    throughput, sigma = {}, {}
    for o in options:
        model = throughput_band(o.row.workload, o.row.gpu, o.row.cfg.precision, predicted[o.index])
        prior = store.prior_for(key(o), predicted[o.index], model.log_sigma)
        throughput[o.index] = predicted[o.index] if prior is None else prior.throughput
        sigma[o.index] = model.log_sigma if prior is None else prior.log_sigma
    return throughput, sigma


def _trace_records(scheme: str, fold: str, row: calibration.Row, k: float | None, deadline: float | None,
                   meets: list[Outcome], outcomes: dict[str, Outcome]) -> list[dict[str, Any]]:  # fmt: skip
    """One record per chooser of one decision (``scores(trace=...)``: what the benchmark lists)."""
    best = min(meets, key=lambda x: x.cost)
    return [{
        "scheme": scheme, "fold": fold, "workload": row.workload.id, "framework": row.cfg.framework, "k": k,
        "chooser": name, "chosen": out.chosen, "best": best.chosen,
        "regret": None if out.chosen is None else out.cost / best.cost - 1.0,
        "missed": out.chosen is not None and deadline is not None and out.hours > deadline * (1 + 1e-9),
        "moved": out.moved,
    } for name, out in outcomes.items()]  # fmt: skip


def _reference(scheme: str, opts: Sequence[Option], held: set[int]) -> str | None:
    """The spec-sheet chooser's measured GPU generation: the fold's training GPU for GPU transfer (None
    where the group was measured on one generation only), else V100 where the group has it, else A100."""
    if scheme == "gpu_transfer":
        if len({o.row.gpu.arch for o in opts}) < 2:
            return None
        return next(o.row.gpu.arch for o in opts if o.index not in held)
    return "volta" if any(o.row.gpu.arch == "volta" for o in opts) else "ampere"


def _planned(opts: Sequence[Option], by_index: dict[int, Option], predicted: dict[int, float], samples: float,
             deadline: float | None, sigmas: dict[int, float] | None = None,
             trials: bool = True, trial_read: float = 0.0) -> tuple[Outcome, dict[int, Candidate]]:  # fmt: skip
    """The planner's choice (:func:`plan_options`) as the operator runs it (:func:`realise_planner`); where
    the risk limit alone binds, its trial (:func:`realise_trial`) unless ``trials`` is False."""
    chosen, cands = plan_options(opts, predicted, samples, deadline, sigmas)
    if chosen is None:
        tried = trial_of(cands) if trials and deadline is not None else None
        if tried is None:
            return Outcome(None), cands
        assert deadline is not None
        return realise_trial(tried, opts, by_index, cands, predicted, samples, deadline, trial_read), cands
    index = next(i for i, c in cands.items() if c is chosen)
    return realise_planner(chosen, by_index, cands, index, samples), cands


def trial_of(cands: dict[int, Candidate]) -> int | None:
    """The option a refused decision tries (:func:`gpuscaler.planner.trial.offer` on the options): the
    cheapest (then sooner) whose P(miss) is below :data:`~gpuscaler.planner.trial.PLAUSIBLY_MEETS`, or None."""
    near = [(i, c) for i, c in cands.items() if c.outlook.deadline_miss_probability < trial.PLAUSIBLY_MEETS]
    best = min(near, key=lambda kv: (kv[1].expected_cost_usd, kv[1].expected_hours), default=None)
    return None if best is None else best[0]


def realise_trial(index: int, opts: Sequence[Option], by_index: dict[int, Option], cands: dict[int, Candidate],
                  predicted: dict[int, float], samples: float, deadline_h: float, read: float = 0.0,
                  tried: frozenset[str] = frozenset()) -> Outcome:  # fmt: skip
    """A trial as the operator runs it on the measured speeds (:mod:`gpuscaler.planner.trial`).

    The option runs its window (start-up, warm-up, the least measuring window) and is measured: the
    observer's posterior (:func:`~gpuscaler.planner.correction.posterior`, the measurement at the
    measured throughput times ``exp(read)`` at every estimate, with the floor's sigma). From then on it
    is judged every :data:`TRIAL_STEP_S` by :func:`gpuscaler.planner.trial.verdict` on the rest's P(miss)
    in the time left: kept; moved to the corrected planner's plan for the rest (every option on the
    measured GPU type at the posterior factor and sigma, as the operator's efficiency factor moves
    them; no trial) in the time left after the move's checkpoint write and restart; continued; or
    stopped. A stopped trial goes on to the next trial (:func:`next_trial`: the cheapest plausible option
    on a GPU type not ``tried`` yet, for the rest in the time left after the move), else it is a "no plan"
    that paid what it ran. One that finishes while continued counts as kept.
    """
    o, c = by_index[index], cands[index]
    cfg = CorrectionConfig()
    interval = float(Policy().max_checkpoint_interval_s)
    spent_h = trial.window_s(STARTUP_S, cfg) / 3600.0
    trained_s = cfg.warmup_s + cfg.min_window_s
    seen = o.row.measured * math.exp(read)  # what the estimates read; the run goes at the measured throughput
    factor, s_post = posterior(1.0, c.outlook.log_sigma, seen / predicted[index], MEASURED_LOG_SIGMA_FLOOR)
    gpu = o.row.gpu.id
    again = {i: v * factor if by_index[i].row.gpu.id == gpu else v for i, v in predicted.items() if i in by_index}
    spread = {i: s_post if by_index[i].row.gpu.id == gpu else cands[i].outlook.log_sigma for i in again}
    move_h = (o.write_s + RESTART_S) / 3600.0
    whole = measured(o, samples)
    while (done := o.row.measured * trained_s) < samples:
        left = deadline_h - spent_h
        p = remaining_miss_probability(samples - done, predicted[index] * factor, s_post, left, interval_s=interval,
                                       restart_s=RESTART_S, write_s=o.write_s)  # fmt: skip
        j = None
        if over_risk(p, MAX_RISK):
            chosen, rest = plan_options(opts, again, samples - done, left - move_h, spread)
            j = None if chosen is None else next(i for i, x in rest.items() if x is chosen)
        said = trial.verdict(p, MAX_RISK, j is not None and j != index)
        if said is trial.Verdict.KEEP:
            break
        if said is trial.Verdict.STOP:
            stopped = Outcome(None, cost=spent_h * o.usd_per_hour, trial="stopped")
            return next_trial(stopped, opts, predicted, samples - done, left - move_h, read, tried | {gpu}, spent_h + move_h)
        if said is trial.Verdict.MOVE:
            assert j is not None
            t = by_index[j]
            rest_h = t.hours(t.row.measured, samples - done) + move_h
            return Outcome(j, spent_h + rest_h, spent_h * o.usd_per_hour + rest_h * t.usd_per_hour, moved=True,
                           trial="moved")  # fmt: skip
        spent_h += TRIAL_STEP_S / 3600.0
        trained_s += TRIAL_STEP_S
    return replace(whole, trial="kept")


def next_trial(stopped: Outcome, opts: Sequence[Option], predicted: dict[int, float], samples: float, left_h: float,
               read: float, tried: frozenset[str], spent_h: float) -> Outcome:  # fmt: skip
    """What a stopped trial does next (the observer's :meth:`~gpuscaler.observe.controller.Observer._end_trial`):
    the next trial, the objective's pick (:func:`trial_of`) of the options on GPU types not ``tried``
    planned for the rest in ``left_h``, run as a trial (``trial`` "next" when it ends with a plan);
    ``stopped`` when there is none or it stops too, having paid both."""
    others = [o for o in opts if o.row.gpu.id not in tried]
    if not others or left_h <= 0:
        return stopped
    by_index = {o.index: o for o in others}
    mine = {i: predicted[i] for i in by_index}
    _, cands = plan_options(others, mine, samples, left_h)
    j = trial_of(cands)
    if j is None:
        return stopped
    then = realise_trial(j, others, by_index, cands, mine, samples, left_h, read, tried)
    if then.chosen is None:
        return replace(stopped, cost=stopped.cost + then.cost)
    return Outcome(then.chosen, spent_h + then.hours, stopped.cost + then.cost, moved=True, trial="next")


def _count_one(t: Tally, deadline: float | None, best: float, out: Outcome) -> None:
    """One decision of one chooser into ``t``: its regret, a miss, a plan missing where one was feasible, a move."""
    if deadline is not None:
        t.deadline_decisions += 1
    if out.trial:
        t.trials[out.trial] += 1
    if out.chosen is None:
        t.no_plan += deadline is not None
        if out.trial:
            t.stopped_spend.append(out.cost / best)
        return
    t.regrets.append(out.cost / best - 1.0)
    (t.trial_regrets if out.trial else t.untried_regrets).append(t.regrets[-1])
    t.misses += deadline is not None and out.hours > deadline * (1 + 1e-9)
    t.moves += out.moved


def closest_outcome(options: Sequence[Option], cands: dict[int, Candidate], samples: float, deadline_h: float,
                    best: float) -> tuple[bool, float, float]:  # fmt: skip
    """A refused decision's closest plan (the lowest P(miss), then the cheapest: what the planner's answer
    names when the risk limit binds) run at its measured speed: whether it meets the deadline, its
    regret when it does, and its P(miss)."""
    by_index = {o.index: o for o in options}
    i, c = min(cands.items(), key=lambda kv: (kv[1].outlook.deadline_miss_probability, kv[1].expected_cost_usd))
    out = measured(by_index[i], samples)
    return out.hours <= deadline_h, out.cost / best - 1.0, c.outlook.deadline_miss_probability


def _closest_summary(refused: list[tuple[bool, float, float]]) -> dict[str, Any]:
    meets = [regret for ok, regret, _ in refused if ok]
    return {
        "refused": len(refused),
        "closest_meets": len(meets),
        "closest_meets_pct": round(100.0 * len(meets) / len(refused), 2) if refused else None,
        "closest_mean_regret_pct": round(100.0 * statistics.fmean(meets), 2) if meets else None,
        "closest_median_miss_probability": round(statistics.median(p for *_, p in refused), 4) if refused else None,
    }


def _count(
    tallies: dict[str, dict[str, Tally]],
    scheme: str,
    k: float | None,
    deadline: float | None,
    best: float,
    outcomes: dict[str, Outcome],
) -> None:
    """Count one decision's outcomes in the scheme's, the pooled and the tightness's tallies: the
    regret ``cost / best - 1`` (in ``common`` too when every chooser found a plan), a miss when
    ``hours > deadline``, a plan missing where one was feasible, and the moves."""
    everyone = all(out.chosen is not None for out in outcomes.values())
    tight = "none" if k is None else f"{k:g}x"
    for name, out in outcomes.items():
        for t in (tallies[scheme][name], tallies["pooled"][name], tallies[f"deadline {tight}"][name]):
            if everyone:
                t.common.append(out.cost / best - 1.0)
            _count_one(t, deadline, best, out)


def _outcome(index: int | None, options: dict[int, Option], samples: float) -> Outcome:
    return Outcome(None) if index is None else measured(options[index], samples)


def targets(pooled: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Issue 35's targets against the pooled scores: the figure, the target and whether it is met."""
    p, a, s = pooled["planner"], pooled["argmin"], pooled["spec-sheet"]

    def row(value: float | None, target: float, met: bool) -> dict[str, Any]:
        return {"value": value, "target": target, "met": met}

    mean, worst = p["common_mean_regret_pct"] or 0.0, p["worst_regret_pct"] or 0.0
    no_plan, misses = p["no_plan_where_feasible_pct"] or 0.0, p["misses_pct"] or 0.0
    argmin, sheet = a["common_mean_regret_pct"] or 0.0, s["common_mean_regret_pct"] or 0.0
    return {
        "no_plan_where_feasible_pct": row(no_plan, NO_PLAN_TARGET_PCT, no_plan <= NO_PLAN_TARGET_PCT),
        "mean_regret_over_argmin_points": row(round(mean - argmin, 2), OVER_ARGMIN_POINTS,
                                              mean <= argmin + OVER_ARGMIN_POINTS),
        "mean_regret_below_spec_sheet_pct": row(mean, sheet, mean < sheet),
        "worst_regret_pct": row(worst, WORST_TARGET_PCT, worst <= WORST_TARGET_PCT),
        "misses_pct": row(misses, MISSES_TARGET_PCT, misses <= MISSES_TARGET_PCT),
    }  # fmt: skip


def format_scores(d: dict[str, Any]) -> list[str]:
    """The scores as text lines (``gpuscaler validate`` and ``benchmarks/decision_scores.py``)."""

    def pct(x: object) -> str:
        return "-" if x is None else f"{x:.1f}"

    def block(title: str, by: dict[str, dict[str, Any]]) -> list[str]:
        out = [title, f"  {'chooser':<11} {'mean %':>7} {'worst %':>8} {'common mean %':>14} {'common worst %':>15} "
               f"{'misses %':>9} {'no plan %':>10} {'moves':>6}"]  # fmt: skip
        for name, t in by.items():
            out.append(
                f"  {name:<11} {pct(t['mean_regret_pct']):>7} {pct(t['worst_regret_pct']):>8} "
                f"{pct(t['common_mean_regret_pct']):>14} {pct(t['common_worst_regret_pct']):>15} "
                f"{pct(t['misses_pct']):>9} {pct(t['no_plan_where_feasible_pct']):>10} {t['moves']:>6}"
            )
        return out

    design = d["design"]
    lines = [
        f"Decision scores, cross-validated ({design['decisions']} decisions: every README x workload x framework "
        "group with a held-out row,",
        f"per fold of {', '.join(design['schemes'])}; no deadline and deadlines at "
        f"{', '.join(f'{k:g}' for k in design['deadlines_x_fastest_measured'])} x the measured fastest option's hours).",
        "Regret: realised cost over the cheapest measured option that meets the deadline; 'common': the decisions "
        "where all three chose.",
        "",
        *block("Pooled:", d["pooled"]),
    ]
    for scheme, by in d["schemes"].items():
        lines += ["", *block(f"{scheme}:", by)]
    lines += ["", "By deadline (x the measured fastest option's hours; 'none': cost only):"]
    for tight, by in d["by_tightness"].items():
        lines += block(f" {tight}:", by)
    fl = d["no_plan_floor"]
    lines += ["", "'No plan' with exact medians (the planner's rule, each option's band, the measured throughput as the",
              "prediction): what a model this uncertain must refuse at maxDeadlineRisk even when its median is right, % of",
              "the deadline decisions: " + ", ".join(f"{key} {v:.1f}" for key, v in fl.items())]
    cl = d["no_plan_closest"]
    if cl["refused"]:
        lines += ["", f"Where the planner answers 'no plan', the plan its answer names closest (the lowest P(miss), median "
                      f"{cl['closest_median_miss_probability']:.0%}) would have met the deadline in {cl['closest_meets']} of "
                      f"{cl['refused']} ({cl['closest_meets_pct']:.0f}%), at a mean cost regret of {cl['closest_mean_regret_pct']:.0f}%."]
    pr, lowo = d["profiled"], d["schemes"].get("leave_one_workload_out", {}).get("planner")
    if pr["planner"]["deadline_decisions"] and lowo:

        def brief(t: dict[str, Any]) -> str:
            return (f"mean regret {pct(t['mean_regret_pct'])}%, worst {pct(t['worst_regret_pct'])}%, misses "
                    f"{pct(t['misses_pct'])}%, no plan {pct(t['no_plan_where_feasible_pct'])}%")

        lines += ["", "Leave one workload out after one profiled run of the team's code (its plan without a deadline, "
                      "measured, kept as a performance profile):",
                  f"  planner {brief(pr['planner'])}", f"  without the profile, the same decisions: {brief(lowo)}",
                  "  no plan by deadline: " + ", ".join(f"{key} {v:.1f}" for key, v in pr["no_plan_by_tightness_pct"].items())]
    tr = d["pooled"]["planner"]
    n = sum(tr["trials"].values())
    if n:
        lines += ["", f"Trials (no plan meets the risk limit: the cheapest plan with P(miss) below 90% runs, judged as it is "
                      f"measured): {n}, kept {tr['trials']['kept']}, moved {tr['trials']['moved']}, stopped and "
                      f"kept or moved on a next trial {tr['trials']['next']}, stopped {tr['trials']['stopped']};",
                  f"  kept or moved: mean regret {pct(tr['trial_mean_regret_pct'])}%, worst {pct(tr['trial_worst_regret_pct'])}%; "
                  f"a stopped trial spent a mean {pct(tr['stopped_trial_mean_spend_pct'])}% of the best plan's cost;",
                  f"  worst regret of the decisions that were no trial: {pct(tr['worst_regret_without_trials_pct'])}%"]
    ho = d["hopeless"]
    if ho["decisions"]:
        lines += ["", f"Deadlines no measured option meets ({', '.join(f'{k:g}' for k in ho['deadlines_x_fastest_measured'])} "
                      f"x the fastest; {ho['decisions']} decisions): refused {pct(ho['refused_pct'])}%, trials stopped "
                      f"{pct(ho['trials_stopped_pct'])}% (spent a mean {pct(ho['stopped_mean_spend_pct'])}%, worst "
                      f"{pct(ho['stopped_worst_spend_pct'])}% of the cheapest whole run), plans that missed "
                      f"{pct(ho['misses_pct'])}%"]
    lines += ["", "Targets (issue 35):"]
    for name, t in d["targets"].items():
        lines.append(f"  {name:<34} {t['value']!s:>8} vs {t['target']!s:<8} {'met' if t['met'] else 'NOT met'}")
    return lines
