"""The simulated world: correlated spot markets, shortages that grow with the request, and a true
throughput off the model's prediction."""

from __future__ import annotations

import json
import math
import statistics
from importlib import resources
from pathlib import Path

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.simulator import CachedPlanner, CloudModel, ThroughputTruth, Trace, TraceJob, simulate
from gpuscaler.simulator.cloud import Cloud
from gpuscaler.simulator.registry import make_strategies
from gpuscaler.simulator.trace import load_trace, scale_deadlines
from gpuscaler.simulator.truth import default_scaling_error, default_throughput_error

CATALOG = load_catalog()
P4D = next(i for i in CATALOG.instances if i.name == "p4d.24xlarge")
G4DN = next(i for i in CATALOG.instances if i.name == "g4dn.xlarge")


def test_shortages_grow_with_the_request_and_in_storms() -> None:
    m = CloudModel()
    p = m.node_shortage_probability(G4DN, CapacityType.SPOT)
    assert p == pytest.approx(0.10)
    assert m.shortage_probability(G4DN, CapacityType.SPOT, 1) == pytest.approx(p)
    assert m.shortage_probability(G4DN, CapacityType.SPOT, 8) == pytest.approx(1 - (1 - p) ** 8)
    assert m.node_shortage_probability(P4D, CapacityType.SPOT) == pytest.approx(0.20)  # scarce 8 x A100
    calm = m.shortage_probability(G4DN, CapacityType.SPOT, 1, storm=False)
    storm = m.shortage_probability(G4DN, CapacityType.SPOT, 1, storm=True)
    assert storm == pytest.approx(5 * calm)
    assert (1 - m.storm_share) * calm + m.storm_share * storm == pytest.approx(p)  # the average is kept


def test_reclaim_waves_keep_the_published_rate_on_average() -> None:
    """Over a long horizon an offering's waves come at wave_share x the per-node rate, more in storms."""
    m = CloudModel(interruption_scale=20.0)
    cloud = Cloud(m, seed=3)
    market = cloud.market(G4DN, CapacityType.SPOT)
    t, waves, in_storm = 0.0, 0, 0
    while True:
        t = market.next_wave_h(t)
        if t > 24 * 365:
            break
        waves += 1
        in_storm += market.storm_at(t)
    expected = m.node_rate_per_h(G4DN, CapacityType.SPOT) * m.wave_share * 24 * 365
    assert waves == pytest.approx(expected, rel=0.25)
    # A tenth of the time in storms with ten times the waves: about half the waves are in storms.
    assert 0.3 < in_storm / waves < 0.75


def test_markets_are_shared_and_the_same_whoever_asks_first() -> None:
    a, b = Cloud(CloudModel(), seed=1), Cloud(CloudModel(), seed=1)
    late = a.market(G4DN, CapacityType.SPOT).next_wave_h(500.0)
    early = [b.market(G4DN, CapacityType.SPOT).next_wave_h(x) for x in (0.0, 100.0)]
    assert b.market(G4DN, CapacityType.SPOT).next_wave_h(500.0) == late
    assert early[0] == a.market(G4DN, CapacityType.SPOT).next_wave_h(0.0)
    assert Cloud(CloudModel(), seed=2).market(G4DN, CapacityType.SPOT).next_wave_h(0.0) != early[0]
    assert a.market(G4DN, CapacityType.ON_DEMAND).next_wave_h(0.0) == math.inf  # on-demand is not reclaimed


def test_a_wave_interrupts_every_job_on_the_offering_at_once() -> None:
    spec = TrainingJobSpec.model_validate({
        "workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 60},
        "constraints": {"providers": ["aws"], "instanceTypes": ["g4dn.xlarge"], "maxNodes": 1}})
    trace = Trace("pair", (TraceJob("a", 0.0, spec), TraceJob("b", 0.1, spec)))
    cloud = CloudModel(interruption_scale=30.0, wave_share=1.0, shortage_scale=0.0)
    res = simulate(trace, make_strategies(CATALOG, ["deadline-blind-spot-checkpoint"])[0], CachedPlanner(CATALOG),
                   cloud, seed=4)
    ends = [{round(s.end_h, 9) for s in o.segments if s.interrupted} for o in res.outcomes]
    assert ends[0] and ends[0] & ends[1]  # the same reclaim hours
    # Independent reclaims (no waves): never the same instant.
    res = simulate(trace, make_strategies(CATALOG, ["deadline-blind-spot-checkpoint"])[0], CachedPlanner(CATALOG),
                   CloudModel(interruption_scale=30.0, wave_share=0.0, shortage_scale=0.0), seed=4)
    ends = [{round(s.end_h, 9) for s in o.segments if s.interrupted} for o in res.outcomes]
    assert ends[0] and not ends[0] & ends[1]


def test_cloud_values_are_checked() -> None:
    cases = {"interruptionScale": (-1, ">= 0"), "waveShare": (1.5, "between 0 and 1"), "stormHours": (0, "> 0"),
             "stormWaveMultiplier": (0.5, ">= 1"), "nope": (1, "unknown")}
    for key, (value, what) in cases.items():
        with pytest.raises(ValueError, match=rf"cloud\.{key}\b.*{what}"):
            CloudModel.from_mapping({key: value})


def test_truth_factors_are_lognormal_seeded_and_one_at_zero() -> None:
    assert ThroughputTruth(0.0, 7).factor("A100-40GB", "amp") == 1.0
    t = ThroughputTruth(0.3, 7)
    assert t.factor("A100-40GB", "amp") == ThroughputTruth(0.3, 7).factor("A100-40GB", "amp")
    assert t.factor("A100-40GB", "amp") != ThroughputTruth(0.3, 8).factor("A100-40GB", "amp")
    assert t.factor("A100-40GB", "amp") != t.factor("A100-40GB", "fp32")
    logs = [math.log(t.factor(f"gpu{k}", "amp")) for k in range(3000)]
    assert statistics.fmean(logs) == pytest.approx(0.0, abs=0.03)
    assert statistics.stdev(logs) == pytest.approx(0.3, rel=0.08)
    assert ThroughputTruth(0.3, 7, fixed={"T4": 0.7}).factor("T4", "fp32") == 0.7
    with pytest.raises(ValueError, match="throughput error"):
        ThroughputTruth(-0.1)


def test_truth_is_per_workload_family_with_a_separate_scaling_error() -> None:
    t = ThroughputTruth(0.3, 7, scaling_sigma=0.1)
    # One factor per (family, GPU type, precision): shared by jobs of a family, not across families.
    assert t.factor("V100-16GB", "amp", "cnn") == t.factor("V100-16GB", "amp", "cnn")
    assert t.factor("V100-16GB", "amp", "cnn") != t.factor("V100-16GB", "amp", "transformer")
    # Scaling: 1 on a single GPU; its own draw per GPU count and node count on more.
    one = t.factor("V100-16GB", "amp", "cnn", 1, 1)
    assert t.factor("V100-16GB", "amp", "cnn", 4, 1) != one
    assert t.factor("V100-16GB", "amp", "cnn", 8, 1) != t.factor("V100-16GB", "amp", "cnn", 8, 2)
    logs = [math.log(t.factor("V100-16GB", "amp", "cnn", 2, k + 1) / one) for k in range(3000)]
    assert statistics.stdev(logs) == pytest.approx(0.1, rel=0.08)
    assert ThroughputTruth(0.0, 7).factor("V100-16GB", "amp", "cnn", 8, 2) == 1.0  # both 0: the model
    assert ThroughputTruth(0.0, 7, scaling_sigma=0.1).factor("V100-16GB", "amp", "cnn", 1, 1) == 1.0
    assert ThroughputTruth(0.3, 7, fixed={"T4": 0.7}, scaling_sigma=0.1).factor("T4", "fp32", "cnn", 4, 1) == 0.7
    assert set(t.factors()) >= {"cnn/V100-16GB/amp", "scaling/cnn/V100-16GB/4/1"}
    with pytest.raises(ValueError, match="scaling error"):
        ThroughputTruth(0.1, scaling_sigma=math.inf)


def test_default_scaling_error_is_the_models_cross_validated_scaling_error() -> None:
    d = default_scaling_error()
    cv = json.loads(resources.files("gpuscaler.perfmodel").joinpath("data", "cross_validation.json").read_text())
    assert d.sigma == cv["metrics"]["scaling"]["log_sigma"] > 0 and "cross_validation.json" in d.source


def test_scale_deadlines_multiplies_the_hours_to_each_deadline() -> None:
    trace = load_trace(Path(__file__).resolve().parent.parent / "examples" / "traces" / "production-month.yaml")
    tight = scale_deadlines(trace, 0.7)
    assert scale_deadlines(trace, 1.0) is trace
    for a, b in zip(trace.jobs, tight.jobs, strict=True):
        before, after = a.deadline_h(trace.start), b.deadline_h(tight.start)
        assert (before is None) == (after is None)
        if before is not None and after is not None:
            assert after == pytest.approx(before * 0.7, abs=1e-4)
    with pytest.raises(ValueError, match="deadline scale"):
        scale_deadlines(trace, 0.0)


def test_default_throughput_error_names_its_source() -> None:
    d = default_throughput_error()
    assert d.sigma >= 0 and "cross_validation.json" in d.source
