"""Observed performance decisions: divergence, the efficiency factor, bottlenecks, re-plans (no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Condition, ObservedStatus, TrainingJobStatus
from gpuscaler.catalog import load_catalog
from gpuscaler.controller.reconcile import plan_status
from gpuscaler.observe.assess import (
    Expectation,
    JobMetrics,
    PlanOption,
    Thresholds,
    assess,
    bottlenecks,
    decide_replan,
)
from gpuscaler.observe.controller import ObserveConfig, Observer
from gpuscaler.observe.estimators import RateEstimate
from gpuscaler.observe.prometheus import PrometheusError, job_selector, worker_pod_regex
from gpuscaler.planner import plan

CATALOG = load_catalog()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T = Thresholds()


def metrics(throughput: float | None, **gpu: Any) -> JobMetrics:
    rate = None if throughput is None else RateEstimate(throughput, throughput, 5, 300.0, 0, 0, 0.01)
    return JobMetrics(pods=[], throughput=throughput, rate=rate, gpus=gpu.pop("gpus", 1), **gpu)


def test_matching_job_is_left_alone() -> None:
    a = assess(metrics(98.0, gpu_util=95.0, tensor_active=0.5, dram_active=0.3), Expectation(100.0), T)
    assert a.ratio == pytest.approx(0.98)
    assert not a.corrected and a.factor == 1.0 and a.findings == []


def test_thirty_percent_slower_corrects_the_factor() -> None:
    a = assess(metrics(70.0, gpu_util=95.0, tensor_active=0.5), Expectation(100.0), T)
    assert a.corrected and a.factor == pytest.approx(0.7)
    assert a.findings == []  # slow, but the GPU is busy: no named bottleneck


def test_factor_is_relative_to_the_uncorrected_model() -> None:
    # the plan was made with factor 0.7 (predicted already 70/s); observing 70/s changes nothing
    e = Expectation(70.0, plan_factor=0.7, current_factor=0.7)
    a = assess(metrics(70.0), e, T)
    assert not a.corrected and a.factor == 0.7
    # the factor was corrected to 0.7 but the plan predates it: still no second correction (0.49)
    e = Expectation(100.0, plan_factor=1.0, current_factor=0.7)
    a = assess(metrics(70.0), e, T)
    assert not a.corrected and a.factor == 0.7 and a.measured_factor == pytest.approx(0.7)


def test_within_threshold_keeps_the_factor() -> None:
    a = assess(metrics(88.0), Expectation(100.0), T)  # 12 % < 15 %
    assert not a.corrected and a.factor == 1.0


def test_unsteady_or_missing_data_is_not_judged() -> None:
    noisy = JobMetrics(pods=[], throughput=70.0, rate=RateEstimate(70.0, 70.0, 5, 300.0, 0, 0, 0.5))
    assert not assess(noisy, Expectation(100.0), T).corrected
    a = assess(metrics(None), Expectation(100.0), T)
    assert a.ratio is None and not a.corrected


def test_input_bound() -> None:
    e = Expectation(100.0, gpus=1, vcpus_per_node=4, instance_type="g4dn.xlarge")
    fs = bottlenecks(metrics(55.0, gpu_util=35.0, tensor_active=0.1), e, 0.55, T)
    assert [f.type for f in fs] == ["InputBound"]
    assert "35%" in fs[0].message and "data-loader" in fs[0].message and "4 vCPU" in fs[0].message
    # low utilisation but on prediction: nothing to act on
    assert bottlenecks(metrics(99.0, gpu_util=35.0), e, 0.99, T) == []


def test_memory_bound_amp_inactive_memory_full() -> None:
    e = Expectation(100.0, precision="amp")
    fs = bottlenecks(
        metrics(100.0, gpu_util=90.0, tensor_active=0.01, dram_active=0.8, memory_used_fraction=0.97, memory_used_gb=15.6),
        e,
        1.0,
        T,
    )
    assert [f.type for f in fs] == ["MemoryBound", "AMPInactive", "MemoryNearFull"]
    assert "autocast" in fs[1].message and "97%" in fs[2].message


def test_communication_bound_needs_several_gpus_and_traffic() -> None:
    m = metrics(50.0, gpu_util=45.0, tensor_active=0.2, interconnect_gbs=12.0, gpus=16)
    fs = bottlenecks(m, Expectation(100.0, gpus=16), 0.5, T)
    assert [f.type for f in fs] == ["CommunicationBound"]  # not InputBound: the links are busy
    assert bottlenecks(m, Expectation(100.0, gpus=1), 0.5, T)[0].type == "InputBound"


def option(key: str, cost: float, usd_h: float = 1.0) -> PlanOption:
    return PlanOption((key, 1, "on-demand", "amp"), key, usd_h, cost, cost / usd_h)


def test_replan_margin_and_restart_cost() -> None:
    assert decide_replan(option("a", 100), option("b", 80), 1.0, 0, 0.10).replan
    assert not decide_replan(option("a", 100), option("b", 95), 1.0, 0, 0.10).replan  # 5 % < margin
    # half done: saving 10 of 50 = 20 %, but a 2 h restart at $5/h eats it
    assert decide_replan(option("a", 100), option("b", 80), 0.5, 0, 0.10).replan
    assert not decide_replan(option("a", 100), option("b", 80, usd_h=5.0), 0.5, 7200, 0.10).replan
    assert not decide_replan(option("a", 100), option("a", 100), 1.0, 0, 0.10).replan
    assert decide_replan(None, option("b", 80), 1.0, 0, 0.10).replan  # current no longer feasible
    assert not decide_replan(option("a", 100), None, 1.0, 0, 0.10).replan


def test_planner_efficiency_hook_scales_only_that_gpu() -> None:
    spec = job_spec(["g5.xlarge", "g6.xlarge"])
    base = plan(spec, CATALOG)
    assert base.chosen is not None and base.chosen.instance.gpu_id == "A10G"
    slow = plan(spec, CATALOG, efficiency={"A10G": 0.7})
    assert slow.chosen is not None and slow.chosen.instance.gpu_id == "L4"
    a10 = {c.precision: c for c in slow.feasible if c.instance.gpu_id == "A10G"}
    a10_base = {c.precision: c for c in base.feasible if c.instance.gpu_id == "A10G"}
    for p, c in a10.items():
        assert c.estimate.throughput == pytest.approx(0.7 * a10_base[p].estimate.throughput)
    l4 = [c.estimate.throughput for c in slow.feasible if c.instance.gpu_id == "L4"]
    assert l4 == [c.estimate.throughput for c in base.feasible if c.instance.gpu_id == "L4"]


def test_worker_pod_selector() -> None:
    assert worker_pod_regex("a.b") == "a\\.b-worker-[0-9]+"
    assert job_selector("ns", "j") == 'namespace="ns", pod=~"j-worker-[0-9]+"'


# ------------------------------------------------------------------------------ the observer


def job_spec(instances: list[str]) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(
        {
            "workload": {"model": "resnet50"},
            "globalBatch": 256,
            "training": {"epochs": 1},
            "constraints": {"instanceTypes": instances, "minGpus": 1, "maxGpus": 1, "spot": "never"},
        }
    )


class FakeSource:
    def __init__(self, m: JobMetrics | Exception) -> None:
        self.m = m
        self.calls = 0

    def job_metrics(self, namespace: str, job: str, window_s: float, start: float, rate_window_s: float | None) -> JobMetrics:
        self.calls += 1
        if isinstance(self.m, Exception):
            raise self.m
        return self.m


def running_status(spec: TrainingJobSpec) -> TrainingJobStatus:
    result = plan(spec, CATALOG)
    st = TrainingJobStatus(plan=plan_status(result, 1, T0))
    st.conditions.append(Condition(type="Running", status="True", reason="Started", last_transition_time=T0))
    return st


def planner_for(spec: TrainingJobSpec) -> Any:
    return lambda eff: plan(spec, CATALOG, efficiency=eff)


CFG = ObserveConfig(interval_s=10, warmup_s=5, min_interval_s=0, restart_s=60)


def test_observer_corrects_then_replans_at_the_next_checkpoint() -> None:
    # The A10G, planned for ResNet-50 over the L4, runs at half its prediction: the L4 is then cheaper by a
    # margin the re-plan rule takes.
    spec = job_spec(["g5.xlarge", "g6.xlarge"])
    st = running_status(spec)
    assert st.plan is not None
    predicted = st.plan.throughput
    obs = Observer(FakeSource(metrics(0.5 * predicted, gpu_util=96.0, tensor_active=0.4)), CFG, CATALOG)
    res = obs.step("ns", "j", 1, st, 40, T0 + timedelta(seconds=2), planner_for(spec))
    assert res.events == [] and st.observed is not None and "warming up" in st.observed.message
    res = obs.step("ns", "j", 1, st, 40, T0 + timedelta(seconds=30), planner_for(spec))
    seen = st.observed
    assert seen.efficiency_factor == pytest.approx(0.5) and seen.efficiency_by_gpu == {"A10G": 0.5}
    assert seen.ratio == pytest.approx(0.5, abs=0.01) and seen.throughput == pytest.approx(0.5 * predicted, rel=1e-3)
    assert seen.replan_pending and seen.replan_after_checkpoint_step == 40
    assert [e.reason for e in res.events] == ["ModelCorrected", "ReplanPending"]
    # a move for cost: no checkpoint asked for, it waits for the next periodic one
    assert not res.checkpoint_now and "after checkpoint step 40" in res.events[-1].message
    assert not any(c.type == "InputBound" for c in st.conditions)
    # no new checkpoint yet: wait
    res = obs.step("ns", "j", 1, st, 40, T0 + timedelta(seconds=31), planner_for(spec))
    assert res.replan is None and seen.replan_pending
    # the runtime reports checkpoint 50: move
    res = obs.step("ns", "j", 1, st, 50, T0 + timedelta(seconds=32), planner_for(spec))
    assert res.replan is not None and res.replan.chosen is not None
    assert res.replan.chosen.instance.gpu_id == "L4"
    assert not seen.replan_pending and seen.replans == 1 and [e.reason for e in res.events] == ["Replanned"]


def test_observer_leaves_a_matching_job_alone() -> None:
    spec = job_spec(["g5.xlarge", "g6.xlarge"])
    st = running_status(spec)
    assert st.plan is not None
    calls: list[Any] = []

    def planner(eff: Any) -> Any:
        calls.append(eff)
        return plan(spec, CATALOG, efficiency=eff)

    obs = Observer(FakeSource(metrics(st.plan.throughput * 1.02, gpu_util=95.0, tensor_active=0.45)), CFG, CATALOG)
    for s in (30, 45, 60):
        res = obs.step("ns", "j", 1, st, s, T0 + timedelta(seconds=s), planner)
        assert res.events == [] and res.replan is None
    assert st.observed is not None and st.observed.efficiency_factor == 1.0 and not st.observed.replan_pending
    assert calls == []  # the planner is not even asked
    assert [c.type for c in st.conditions] == ["Running"]


def test_observer_input_bound_condition_set_and_cleared() -> None:
    spec = job_spec(["p3.2xlarge"])
    st = running_status(spec)
    assert st.plan is not None
    src = FakeSource(metrics(0.5 * st.plan.throughput, gpu_util=30.0, tensor_active=0.1))
    obs = Observer(src, CFG, CATALOG)
    res = obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=30), planner_for(spec))
    cond = next(c for c in st.conditions if c.type == "InputBound")
    assert cond.status == "True" and cond.reason == "LowGPUUtilization" and "30%" in cond.message
    assert "InputBound" in [e.reason for e in res.events]
    assert st.observed is not None and not st.observed.replan_pending  # p3.2xlarge only: nothing cheaper
    src.m = metrics(st.plan.throughput * 0.5, gpu_util=97.0, tensor_active=0.5)
    obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=45), planner_for(spec))
    cond = next(c for c in st.conditions if c.type == "InputBound")
    assert cond.status == "False" and cond.reason == "NotObserved"


def test_observer_min_interval_blocks_replans() -> None:
    spec = job_spec(["g5.xlarge", "g6.xlarge"])
    st = running_status(spec)
    assert st.plan is not None
    cfg = ObserveConfig(interval_s=10, warmup_s=5, min_interval_s=3600)
    obs = Observer(FakeSource(metrics(0.7 * st.plan.throughput, gpu_util=96.0)), cfg, CATALOG)
    obs.step("ns", "j", 1, st, 10, T0 + timedelta(seconds=30), planner_for(spec))
    assert st.observed is not None and st.observed.efficiency_factor == pytest.approx(0.7)
    assert not st.observed.replan_pending and "not considered" in st.observed.message


def test_observer_reports_prometheus_down_once() -> None:
    spec = job_spec(["p3.2xlarge"])
    st = running_status(spec)
    obs = Observer(FakeSource(PrometheusError("connection refused")), CFG, CATALOG)
    res = obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=30), planner_for(spec))
    assert [e.reason for e in res.events] == ["ObserveFailed"]
    res = obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=45), planner_for(spec))
    assert res.events == [] and st.observed is not None and "connection refused" in st.observed.message


def test_status_round_trips() -> None:
    o = ObservedStatus(throughput=1.0, efficiency_by_gpu={"A10G": 0.7}, replan_pending=True)
    st = TrainingJobStatus(observed=o)
    wire = st.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["observed"]["efficiencyByGpu"] == {"A10G": 0.7} and wire["observed"]["replanPending"] is True
    assert TrainingJobStatus.model_validate(wire).observed == o


def test_report_renders_prediction_observation_cost_and_bottlenecks() -> None:
    from gpuscaler.observe.cli import projected_cost, render

    spec = job_spec(["p3.2xlarge"])
    st = running_status(spec)
    assert st.plan is not None
    obs = Observer(FakeSource(metrics(0.5 * st.plan.throughput, gpu_util=30.0, tensor_active=0.1)), CFG, CATALOG)
    obs.step("ns", "j", 1, st, None, T0 + timedelta(seconds=30), planner_for(spec))
    st.cost_usd = 0.10
    left_h, total = projected_cost(st)
    assert left_h is not None and total is not None
    assert left_h == pytest.approx(st.plan.total_samples / (0.5 * st.plan.throughput) / 3600, rel=1e-3)
    assert total == pytest.approx(0.10 + left_h * st.plan.usd_per_hour)
    text = render("j", "ns", st)
    assert "InputBound (LowGPUUtilization)" in text and "ratio 50%" in text and "projected $" in text
