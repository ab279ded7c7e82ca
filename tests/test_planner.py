"""Planner: keeps the global batch, honours what it claims, picks the optimum, explains rejections."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.planner import plan, trial
from gpuscaler.planner.binding import PROBABLY_MEETS, Kind
from gpuscaler.planner.risk import hourly_rate, optimal_interval_s, outlook, poisson_cdf
from gpuscaler.policy import Policy

CAT = load_catalog()


def spec(**kw: Any) -> TrainingJobSpec:
    base: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 10}}
    base.update(kw)
    return TrainingJobSpec.model_validate(base)


jobs = st.fixed_dictionaries(
    {
        "workload": st.sampled_from([{"model": m} for m in ("resnet50", "bert-large-squad", "gpt2-small", "ssd300")]),
        "globalBatch": st.sampled_from([64, 256, 384, 1000, 1024, 4096]),
        "training": st.sampled_from([{"samples": 1e6}, {"samples": 2e7}, {"steps": 5000}]),
        "maxDuration": st.sampled_from([None, "2h", "12h", "3d"]),
        "budgetUsd": st.sampled_from([None, 20.0, 300.0, 5000.0]),
        "constraints": st.fixed_dictionaries(
            {
                "spot": st.sampled_from(["never", "allowed", "preferred"]),
                "providers": st.sampled_from([[], ["aws"], ["gcp", "azure"]]),
            }
        ),
    }
)
policies = st.builds(
    Policy,
    max_gpus_per_job=st.sampled_from([None, 8, 32]),
    max_usd_per_hour=st.sampled_from([None, 15.0, 100.0]),
    allowed_gpu_types=st.sampled_from([[], ["a100", "h100"], ["t4", "l4", "a10g"]]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs, policies)
def test_plan_keeps_batch_and_honours_every_claim(raw: dict[str, Any], policy: Policy) -> None:
    raw = {k: v for k, v in raw.items() if v is not None}
    s = TrainingJobSpec.model_validate(raw)
    r = plan(s, CAT, policy)
    for c in r.feasible:
        assert c.micro_batch * c.accumulation * c.gpus == s.global_batch
        assert c.estimate.fits
        if policy.max_gpus_per_job:
            assert c.gpus <= policy.max_gpus_per_job
        if policy.max_usd_per_hour:
            assert c.usd_per_hour <= policy.max_usd_per_hour
        if policy.allowed_gpu_types:
            assert c.instance.gpu_id in {CAT.gpu(g).id for g in policy.allowed_gpu_types}
        if s.budget_usd is not None:
            assert c.expected_cost_usd <= s.budget_usd
        if r.job.deadline_h is not None:
            assert c.outlook.deadline_miss_probability <= s.constraints.max_deadline_risk
        if s.constraints.spot.value == "never":
            assert c.capacity is CapacityType.ON_DEMAND
        if s.constraints.providers:
            assert c.instance.provider in s.constraints.providers
    if r.chosen is None:
        assert not r.feasible and r.hints
    elif r.trial:  # nothing feasible; a plan that breaks only the deadline has the deadline inside its band
        assert not r.feasible and r.hints and r.binding is not None and r.binding.kind in (Kind.RISK, Kind.TIME)
        assert r.chosen.outlook.deadline_miss_probability < trial.PLAUSIBLY_MEETS
        # where time binds, no plan that breaks only the deadline would probably meet it, the trial included
        assert r.binding.kind is not Kind.TIME or r.chosen.outlook.deadline_miss_probability >= PROBABLY_MEETS
        assert r.chosen.gpus <= (policy.max_gpus_per_job or r.chosen.gpus)
    else:
        pool = r.feasible
        if s.constraints.spot.value == "preferred" and any(c.capacity is CapacityType.SPOT for c in pool):
            pool = [c for c in pool if c.capacity is CapacityType.SPOT]
        assert r.chosen.expected_cost_usd == min(c.expected_cost_usd for c in pool)


def test_fastest_objective_is_fastest_within_budget() -> None:
    r = plan(spec(objective="fastest", budgetUsd=200.0), CAT)
    assert r.chosen is not None
    assert r.chosen.expected_cost_usd <= 200
    assert r.chosen.expected_hours == min(c.expected_hours for c in r.feasible)
    cheapest = plan(spec(budgetUsd=200.0), CAT).chosen
    assert cheapest is not None and cheapest.expected_hours >= r.chosen.expected_hours


def test_pareto_front_is_non_dominated() -> None:
    r = plan(spec(maxDuration="24h"), CAT)
    front = r.pareto
    assert len(front) >= 3
    for a in front:
        for b in r.feasible:
            dominated = b.expected_hours < a.expected_hours and b.expected_cost_usd < a.expected_cost_usd
            assert not dominated


def test_infeasible_deadline_says_what_would_make_it_feasible() -> None:
    r = plan(
        spec(workload={"model": "bert-large-seq512"}, training={"samples": 5e7}, globalBatch=4096, maxDuration="2h"),
        CAT,
        Policy(name="lab", max_gpus_per_job=16),
    )
    assert r.chosen is None
    text = " ".join(r.hints)
    assert "deadline" in text
    assert "allows 16" in text


def test_memory_rejections_name_the_numbers() -> None:
    r = plan(
        spec(
            workload={"model": "llama-7b"}, globalBatch=64, training={"samples": 1e5},
            constraints={"gpuTypes": ["t4"], "maxNodes": 1},
        ),
        CAT,
    )  # fmt: skip
    assert r.chosen is None
    mem = [x for x in r.rejected if x.category == "memory"]
    assert {x.instance for x in mem} >= {"g4dn.xlarge", "g4dn.12xlarge"}
    assert all("GB per GPU" in x.reason and "T4 has 16 GB" in x.reason for x in mem)
    bigger = plan(spec(workload={"model": "llama-7b"}, globalBatch=64, training={"samples": 1e5}), CAT).chosen
    assert bigger is not None and bigger.gpus > 1


def test_policy_spot_never_and_price_override() -> None:
    pol = Policy.model_validate(
        {"name": "regulated", "spot": {"mode": "never"}, "priceOverrides": [{"instanceType": "*", "discountPct": 50}]}
    )
    r = plan(spec(), CAT, pol)
    assert r.chosen is not None and r.chosen.capacity is CapacityType.ON_DEMAND
    assert r.chosen.usd_per_hour == pytest.approx(r.chosen.instance.ondemand_usd_hr * r.chosen.nodes * 0.5)
    assert any("spot is never used" in x.reason for x in r.rejected)


def test_unavailable_offering_is_skipped() -> None:
    first = plan(spec(), CAT).chosen
    assert first is not None
    key = (first.instance.name, first.capacity.value)
    second = plan(spec(), CAT, unavailable=frozenset({key})).chosen
    assert second is not None and (second.instance.name, second.capacity.value) != key


def test_risk_maths() -> None:
    assert hourly_rate(4) > hourly_rate(0) > 0
    # Young/Daly: sqrt(2 C / lambda)
    assert optimal_interval_s(60, 0.1, 1, 1e9) == pytest.approx((2 * 60 * 3600 / 0.1) ** 0.5)
    assert poisson_cdf(0, 1.0) == pytest.approx(0.36788, rel=1e-4)
    calm = outlook(10, 0.0, 30, 300, 180, 1800, 12)
    risky = outlook(10, 0.5, 30, 300, 180, 1800, 12)
    assert calm.deadline_miss_probability == 0
    assert risky.expected_hours > calm.expected_hours
    assert 0 < risky.deadline_miss_probability < 1


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["resnet50", "bert-large-seq512", "llama-7b", "gpt2-small"]),
    st.sampled_from(["g4dn.xlarge", "g5.12xlarge", "p4d.24xlarge", "p5.48xlarge"]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([64, 96, 256, 1000, 4096]),
)
def test_configure_picks_the_largest_micro_batch_that_fits(wid: str, iname: str, nodes: int, batch: int) -> None:
    from gpuscaler.catalog import Precision
    from gpuscaler.perfmodel import ParallelConfig, memory_per_gpu
    from gpuscaler.planner import Reason, configure

    w, inst = CAT.workload(wid), CAT.instance(iname)
    cfg, why = configure(w, inst, nodes, Precision.AMP, batch)
    gpus = inst.gpu_count * nodes
    if batch % gpus:
        assert cfg is None and why is not None and why.reason is Reason.BATCH and "divisible" in why.text
        return
    per_gpu = batch // gpus
    options = [(0, False), (0, True)] + ([(1, True), (2, True), (3, True)] if gpus > 1 else [])
    expected = None
    for zero, ckpt in options:  # brute force: first option, then largest micro-batch, that fits
        fitting = [
            m for m in range(per_gpu, 0, -1)
            if per_gpu % m == 0 and memory_per_gpu(w, inst.gpu, ParallelConfig(
                micro_batch=m, precision=Precision.AMP, gpus_per_node=inst.gpu_count, nodes=nodes,
                accumulation=per_gpu // m, zero_stage=zero, activation_checkpointing=ckpt)).fits
        ]  # fmt: skip
        if fitting:
            expected = (fitting[0], zero, ckpt)
            break
    if expected is None:
        assert cfg is None and why is not None and why.reason is Reason.MEMORY and "does not fit" in why.text
    else:
        assert cfg is not None
        assert (cfg.micro_batch, cfg.zero_stage, cfg.activation_checkpointing) == expected
        assert cfg.micro_batch * cfg.accumulation * gpus == batch
