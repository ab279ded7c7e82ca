"""Tests of the trace-driven simulator: conserving accounting, reproducibility, the plan's prediction,
the world's throughput off the model, and the simulated operator's correction."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.observe import controller
from gpuscaler.planner import correction, resolve, resolve_workload
from gpuscaler.planner.contingency import TIMING
from gpuscaler.simulator import (
    ALL_STRATEGIES,
    CachedPlanner,
    CloudModel,
    ThroughputTruth,
    Trace,
    TraceJob,
    compare,
    load_trace,
    observing,
    simulate,
)
from gpuscaler.simulator.engine import Segment, SimulationResult, progress, run_wall_s
from gpuscaler.simulator.registry import make_strategies
from gpuscaler.simulator.spot_prices import SpotPriceHistory
from gpuscaler.simulator.strategies import Gpuscaler
from gpuscaler.simulator.trace import TraceError
from gpuscaler.testing import training_job

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"
CATALOG = load_catalog()
QUIET = CloudModel(interruption_scale=0.0, shortage_scale=0.0, provisioning_jitter=0.0)
STORMY = CloudModel(interruption_scale=400.0)


def _spec(**kw: object) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(kw)


def small_trace() -> Trace:
    """Five jobs of different sizes, one with a deadline and budget."""
    jobs = (
        TraceJob("resnet", 0.0, _spec(workload={"model": "resnet50"}, globalBatch=1024, training={"epochs": 20},
                                      constraints={"providers": ["aws"]})),
        TraceJob("bert", 1.0, _spec(workload={"model": "bert-large-squad"}, globalBatch=32,
                                    training={"epochs": 2}, maxDuration="6h", constraints={"providers": ["aws"]})),
        TraceJob("gpt2", 2.0, _spec(workload={"model": "gpt2-small"}, globalBatch=256,
                                    training={"samples": 2_000_000}, constraints={"providers": ["aws", "gcp"]})),
        TraceJob("llama", 3.0, _spec(workload={"model": "llama-7b"}, globalBatch=64, training={"samples": 100_000},
                                     maxDuration="24h", budgetUsd=2000, constraints={"providers": ["aws"]})),
        TraceJob("effnet", 4.0, _spec(workload={"model": "efficientnet-b0"}, globalBatch=1024,
                                      training={"epochs": 10}, constraints={"providers": ["aws"]})),
    )
    return Trace("small", jobs)


def _billed(s: Segment, history: SpotPriceHistory | None) -> float:
    """A segment's cost from the history itself: hours x the price in force, cut at every change."""
    if history is None or s.capacity is not CapacityType.SPOT:
        return (s.end_h - s.start_h) * s.usd_per_hour
    if not s.zone:  # nothing priced the type: the planned price
        assert not history.zones(s.instance)
    else:  # planned in a zone of the history (the cheapest then), or placed in the cheapest
        assert s.zone in history.zones(s.instance)
    series = history.series.get((s.instance, s.zone))
    changes = [h for h in (series.hours if series else ()) if s.start_h < h < s.end_h]
    bounds = [s.start_h, *changes, s.end_h]
    per_node = s.usd_per_hour / s.nodes
    return sum((b - a) * s.nodes * (history.price(s.instance, s.zone, a) or per_node)
               for a, b in itertools.pairwise(bounds))


def _check_books(res: SimulationResult, trace: Trace, history: SpotPriceHistory | None = None) -> None:
    for job, out in zip(trace.jobs, res.outcomes, strict=True):
        segs = out.segments
        assert math.isclose(out.cost_usd, sum(s.cost_usd for s in segs), rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(out.cost_usd, sum(_billed(s, history) for s in segs), rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(out.gpu_hours, sum(s.wall_s / 3600 * s.gpus for s in segs), rel_tol=1e-9, abs_tol=1e-9)
        for s in segs:
            # Wall time = provisioning + compute + checkpoint writes + idle; compute = kept + lost.
            parts = s.provisioning_s + s.compute_s + s.checkpoint_s + s.idle_s
            assert math.isclose(s.wall_s, parts, rel_tol=1e-9, abs_tol=1e-6), (res.strategy, s)
            assert math.isclose(s.compute_s, s.kept_s + s.lost_s, rel_tol=1e-12, abs_tol=1e-9)
            assert s.lost_s >= -1e-9 and s.kept_s >= -1e-9 and s.idle_s >= -1e-9
            # Price by capacity: the nodes' catalog price, or the history's in force when planned.
            inst = next(i for i in CATALOG.instances if i.name == s.instance)
            price = inst.price(s.capacity)
            assert price is not None
            known = [price]
            if history is not None and s.capacity is CapacityType.SPOT and (s.instance, s.zone) in history.series:
                known += list(history.series[(s.instance, s.zone)].usd)
            assert any(math.isclose(s.usd_per_hour, p * s.nodes, rel_tol=1e-9) for p in known), s
            if s.capacity is CapacityType.ON_DEMAND:
                assert not s.interrupted
        if out.status == "finished":
            total = resolve(job.spec, CATALOG, job.name).total_samples
            assert math.isclose(sum(s.samples for s in segs), total, rel_tol=1e-6)
            assert out.finish_h == pytest.approx(segs[-1].end_h)


@pytest.fixture(scope="module")
def stormy() -> list[SimulationResult]:
    return compare(small_trace(), CATALOG, cloud=STORMY, seed=7, strategies=ALL_STRATEGIES, throughput_error=0.26,
                   scaling_error=0.1).results


def test_accounting_conserves_cost_and_time(stormy: list[SimulationResult]) -> None:
    assert sum(o.interruptions for r in stormy for o in r.outcomes) > 5  # the storm did interrupt
    for res in stormy:
        _check_books(res, small_trace())


def test_gpuscaler_loses_at_most_one_interval_per_interruption(stormy: list[SimulationResult]) -> None:
    res = next(r for r in stormy if r.strategy == "gpuscaler")
    interrupted = [s for o in res.outcomes for s in o.segments if s.interrupted]
    assert interrupted
    for s in interrupted:
        assert s.interval_s is not None
        assert s.lost_s <= s.interval_s + 1e-6


def test_naive_strategies_lose_work(stormy: list[SimulationResult]) -> None:
    by = {r.strategy: r for r in stormy}
    lost = {k: sum(o.gpu_hours_lost for o in r.outcomes) for k, r in by.items()}
    assert lost["deadline-blind-spot-restart"] >= lost["deadline-blind-spot-checkpoint"] >= 0
    assert lost["gpuscaler"] <= lost["deadline-blind-spot-checkpoint"]
    assert lost["ondemand-8xa100"] == 0 and lost["cheapest-fits"] == 0 and lost["ondemand-best"] == 0


def test_same_seed_same_result() -> None:
    a = compare(small_trace(), CATALOG, cloud=STORMY, seed=3, throughput_error=0.3).results
    b = compare(small_trace(), CATALOG, cloud=STORMY, seed=3, throughput_error=0.3).results
    for ra, rb in zip(a, b, strict=True):
        assert [(o.cost_usd, o.finish_h, o.interruptions, o.segments) for o in ra.outcomes] == \
               [(o.cost_usd, o.finish_h, o.interruptions, o.segments) for o in rb.outcomes]


def test_different_seed_different_draws() -> None:
    def interruption_times(seed: int) -> list[float]:
        res = compare(small_trace(), CATALOG, cloud=STORMY, seed=seed,
                      strategies=["deadline-blind-spot-checkpoint"]).results[0]
        return [s.end_h for o in res.outcomes for s in o.segments if s.interrupted]

    a, b = interruption_times(1), interruption_times(2)
    assert a and b and a != b


def test_no_interruptions_equals_plan_prediction() -> None:
    """With --throughput-error 0 and a quiet cloud, every run is the plan's prediction."""
    trace = small_trace()
    # The strategies that checkpoint at the plan's own interval (the deadline-blind ones change it).
    plan_interval = ["ondemand-best", "managed-spot", "uniform-progress", "ondemand-8xa100", "cheapest-fits",
                     "gpuscaler"]
    for res in compare(trace, CATALOG, cloud=QUIET, seed=0, strategies=plan_interval, throughput_error=0).results:
        for out in res.outcomes:
            assert out.status == "finished", (res.strategy, out.name, out.note)
            assert out.interruptions == 0 and out.shortages == 0 and len(out.segments) == 1
            assert out.moves == 0 and out.corrections == 0  # noisy samples of a true model: nothing to correct
            seg = out.segments[0]
            # Checkpoints are discrete here, continuous in the planner: at most one write apart.
            tol_h = seg.write_s / 3600 + 1e-9
            assert out.completion_h == pytest.approx(out.predicted_hours, abs=tol_h)
            assert out.cost_usd == pytest.approx(out.predicted_cost_usd, abs=tol_h * seg.usd_per_hour + 1e-9)


def test_gpuscaler_meets_deadlines_when_quiet() -> None:
    res = compare(small_trace(), CATALOG, cloud=QUIET, strategies=["gpuscaler"]).results[0]
    assert not any(o.missed_deadline for o in res.outcomes)


def test_throughput_error_changes_the_world_not_the_plan() -> None:
    """The plan is the model's; the run is the world's: time = predicted / the factor of the job's
    workload family, GPU type and precision (x its scaling factor on more than one GPU)."""
    trace = Trace("one", (small_trace().jobs[0],))
    family = resolve_workload(trace.jobs[0].spec.workload, CATALOG).family
    for strategy in ("ondemand-best", "ondemand-8xa100"):  # no correction, no interruption
        exact = compare(trace, CATALOG, cloud=QUIET, strategies=[strategy]).results[0].outcomes[0]
        off = compare(trace, CATALOG, cloud=QUIET, strategies=[strategy], seed=5, throughput_error=0.4,
                      scaling_error=0.1)
        out = off.results[0].outcomes[0]
        assert out.plan_label == exact.plan_label  # the planner never sees the factors
        seg = out.segments[0]
        gpu = next(i for i in CATALOG.instances if i.name == seg.instance).gpu_id
        precision = out.plan_label.split()[-1]  # "... on-demand amp"
        truth = ThroughputTruth(0.4, 5, scaling_sigma=0.1)
        factor = truth.factor(gpu, precision, family, seg.gpus, seg.nodes)
        assert factor != pytest.approx(1.0, abs=1e-3)
        assert seg.kept_s == pytest.approx(exact.segments[0].kept_s / factor, rel=1e-9)
        expected = {f"{family}/{gpu}/{precision}"}
        if seg.gpus > 1:
            expected.add(f"scaling/{family}/{gpu}/{seg.gpus}/{seg.nodes}")
        assert off.truth_factors is not None and set(off.truth_factors) == expected
        assert math.prod(off.truth_factors.values()) == pytest.approx(factor, rel=1e-12)


def test_simulated_operator_corrects_a_slow_gpu_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU type 30% slower than the model: the simulated operator measures it from noisy progress
    readings with the operator's own early-correction code, corrects the factor, re-plans at a
    checkpoint it asks for at once (the deadline is at risk) and meets the deadline that the same plan
    without correction misses."""
    spec = _spec(workload={"model": "resnet50"}, globalBatch=1024, training={"epochs": 170}, maxDuration="8h",
                 constraints={"providers": ["aws"], "spot": "never", "maxDeadlineRisk": 0.5})
    trace = Trace("slow", (TraceJob("resnet", 0.0, spec),))
    planner = CachedPlanner(CATALOG)
    first = compare(trace, CATALOG, cloud=QUIET, strategies=["gpuscaler"], planner=planner).results[0].outcomes[0]
    gpu = next(i for i in CATALOG.instances if i.name == first.segments[0].instance).gpu_id
    assert first.completion_h is not None and first.completion_h / 0.7 > 8  # 30% slower would miss
    slow = ThroughputTruth(fixed={gpu: 0.7})
    blind = simulate(trace, make_strategies(CATALOG, ["ondemand-best"])[0], planner, QUIET, truth=slow)
    assert blind.outcomes[0].plan_label == first.plan_label and blind.outcomes[0].missed_deadline

    # The operator's functions, spied on where both the observer and the simulator get them.
    seen: list[float] = []
    real = correction.correct

    def spy(*args: Any, **kwargs: Any) -> correction.Correction:
        c = real(*args, **kwargs)
        seen.append(c.factor)
        return c

    assert observing.correct is real and controller.correct is real
    monkeypatch.setattr(observing, "correct", spy)
    res = simulate(trace, Gpuscaler(), planner, QUIET, truth=slow)
    out = res.outcomes[0]
    # Measured through noise: the first estimate within 10%, the next (more readings) within 5%.
    assert len(seen) >= 2 and seen[0] == pytest.approx(0.7, rel=0.1) and seen[1] == pytest.approx(0.7, rel=0.05)
    assert out.corrections == 1 and out.moves == 1
    assert not out.missed_deadline
    assert out.segments[0].interrupted is False and out.segments[0].lost_s == 0  # moved at a checkpoint
    first_seg = out.segments[0]
    assert first_seg.end_h - first_seg.start_h >= 0.5  # not within replanMinInterval (30 min)
    # a move for the deadline: from a checkpoint asked for when the move was decided (its write ends the
    # segment), not the next periodic one
    assert first_seg.interval_s is not None and first_seg.compute_s < first_seg.interval_s, first_seg
    assert first_seg.end_h - first_seg.start_h == pytest.approx(0.5 + (TIMING.request_s + first_seg.write_s) / 3600.0)
    assert first_seg.checkpoint_s == pytest.approx(first_seg.write_s)
    moved = out.segments[1]
    assert (moved.instance, moved.nodes) != (out.segments[0].instance, out.segments[0].nodes)
    _check_books(res, trace)


@pytest.mark.parametrize("name", ["research-week.yaml", "production-month.yaml", "llm-finetune-burst.jsonl",
                                  "recurring-month.yaml"])
def test_shipped_traces_load_and_plan(name: str) -> None:
    trace = load_trace(TRACES / name)
    assert len(trace.jobs) >= 20
    res = compare(trace, CATALOG, seed=0, strategies=["gpuscaler"], keep_segments=True).results[0]
    assert all(o.status == "finished" for o in res.outcomes)
    _check_books(res, trace)


def test_trace_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n- name: x\n  spec: {workload: {model: resnet50}}\n", encoding="utf-8")
    with pytest.raises(TraceError, match="arrivalHours"):
        load_trace(bad)
    bad.write_text("jobs:\n- name: x\n  arrivalHours: 1\n  spec: {workload: {model: resnet50}}\n", encoding="utf-8")
    with pytest.raises(TraceError, match="spec is invalid"):
        load_trace(bad)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="unknown"):
        make_strategies(CATALOG, ["nope"])


def test_jsonl_with_full_documents(tmp_path: Path) -> None:
    doc = {**training_job("a"), "arrivalHours": 2}
    p = tmp_path / "t.jsonl"
    other = {**doc, "metadata": {"name": "b"}}
    p.write_text(json.dumps({"trace": {"name": "tiny"}}) + "\n" + json.dumps(doc) + "\n" + json.dumps(other) + "\n",
                 encoding="utf-8")
    trace = load_trace(p)
    assert trace.name == "tiny" and [j.name for j in trace.jobs] == ["a", "b"]  # a name used twice: test_cli_inputs.py


def test_cli_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuscaler.cli import main

    trace = str(TRACES / "llm-finetune-burst.jsonl")
    assert main(["simulate", trace, "--seed", "1", "--seeds", "2", "--plot", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "seeds 1-2" in out and "throughput error" in out
    assert "gpuscaler" in out and "managed-spot" in out and "uniform-progress" in out and "GPU-h lost" in out
    assert (tmp_path / "cost_vs_misses.png").stat().st_size > 1000
    assert (tmp_path / "completion_cdf.png").stat().st_size > 1000
    assert main(["simulate", trace, "--json", "--seeds", "2", "--throughput-error", "0.2",
                 "--strategies", "ondemand-8xa100,gpuscaler"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seeds"] == [0, 1] and data["throughputError"] == 0.2
    assert [s["strategy"] for s in data["strategies"]] == ["ondemand-8xa100", "gpuscaler"]
    for s in data["strategies"]:
        assert s["deadline_jobs"] == 12
        for key in ("cost_usd", "deadline_misses", "gpu_hours_lost", "interruptions"):
            per_seed = [row[key] for row in s["per_seed"]]
            assert s[key]["min"] == min(per_seed) and s[key]["max"] == max(per_seed)
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 2
    for bad in (["--throughput-error", "-0.1"], ["--seeds", "0"], ["--interruption-scale", "-1"],
                ["--checkpoint-interval", "0"], ["--strategies", "spot-restart"],
                ["--jobs-out", str(tmp_path / "missing" / "jobs.jsonl")]):
        assert main(["simulate", trace, *bad]) == 2, bad
        assert bad[0] in capsys.readouterr().err


# ------------------------------------------------------------------------------------- properties


@given(t=st.floats(0, 1e6), interval=st.floats(10, 1e4), write=st.floats(0.1, 500))
def test_progress_splits_time_exactly(t: float, interval: float, write: float) -> None:
    compute, saved, writing = progress(t, interval, write)
    assert compute + writing == pytest.approx(t, rel=1e-9, abs=1e-6)
    assert 0 <= saved <= compute + 1e-9
    assert compute - saved <= interval + 1e-6  # never more than one interval unsaved


@given(work=st.floats(1, 1e6), interval=st.floats(10, 1e4), write=st.floats(0.1, 500))
def test_uninterrupted_run_matches_progress(work: float, interval: float, write: float) -> None:
    wall, writes = run_wall_s(work, interval, write)
    compute, _, writing = progress(wall, interval, write)
    assert compute == pytest.approx(work, rel=1e-9, abs=1e-6)
    assert writes * write == pytest.approx(writing, rel=1e-9, abs=1e-6)


HISTORY = SpotPriceHistory.read(str(ROOT / "operator" / "gpuscaler" / "simulator" / "data" / "spot-price-history.json"))


def test_books_balance_with_moving_spot_prices() -> None:
    """With the shipped spot price history every spot segment is billed at the prices in force."""
    trace = small_trace()
    cloud = CloudModel(interruption_scale=50.0, spot_prices=HISTORY)
    results = compare(trace, CATALOG, cloud=cloud, seed=5, strategies=ALL_STRATEGIES).results
    spot = [s for r in results for o in r.outcomes for s in o.segments if s.capacity is CapacityType.SPOT]
    assert spot and all(s.zone for s in spot if HISTORY.zones(s.instance))
    assert any(len(s.charges) > 1 for s in spot)  # some ran through a price change
    for res in results:
        _check_books(res, trace, HISTORY)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.0, 50.0, 400.0]),
       shortage=st.sampled_from([0.0, 1.0, 4.0]), error=st.sampled_from([0.0, 0.2, 0.5]),
       scaling=st.sampled_from([0.0, 0.1, 0.3]))
def test_books_balance_for_any_seed(seed: int, scale: float, shortage: float, error: float, scaling: float) -> None:
    """Cost = price x hours per segment, time and work conserved, under any luck and model error
    (per workload family, GPU type and precision, and on scaling)."""
    trace = small_trace()
    cloud = CloudModel(interruption_scale=scale, shortage_scale=shortage)
    for res in compare(trace, CATALOG, cloud=cloud, seed=seed, strategies=ALL_STRATEGIES,
                       throughput_error=error, scaling_error=scaling).results:
        _check_books(res, trace)
        if res.strategy == "gpuscaler":  # naive strategies may give up on scarce capacity
            assert all(o.status == "finished" for o in res.outcomes)
