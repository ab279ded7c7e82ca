"""The simulated world: correlated spot markets, shortages that grow with the request, and a true
throughput off the model's prediction."""

from __future__ import annotations

import math
import statistics

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.simulator import CachedPlanner, CloudModel, ThroughputTruth, Trace, TraceJob, simulate
from gpuscaler.simulator.cloud import Cloud
from gpuscaler.simulator.registry import make_strategies
from gpuscaler.simulator.truth import default_throughput_error

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


def test_default_throughput_error_names_its_source() -> None:
    d = default_throughput_error()
    assert d.sigma >= 0 and "cross_validation.json" in d.source
