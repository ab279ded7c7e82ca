"""The running job of the correction tests (test_observe_correction.py, test_contingency.py): a ResNet-50 pinned to g5.xlarge or p3.2xlarge, 2.7 h to its deadline, and its planner."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Condition, TrainingJobStatus
from gpuscaler.catalog import load_catalog
from gpuscaler.controller.reconcile import plan_status
from gpuscaler.observe.controller import ObserveConfig
from gpuscaler.planner import plan, remaining_spec
from gpuscaler.policy import Policy

CATALOG = load_catalog()
POLICY = Policy.model_validate({"name": "t", "minCheckpointIntervalS": 10})
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CFG = ObserveConfig(interval_s=10, warmup_s=20, min_window_s=60, min_interval_s=0, restart_s=60)
SPEC = TrainingJobSpec.model_validate({
    "workload": {"model": "resnet50"},
    "globalBatch": 256,
    "training": {"steps": 20000},
    "constraints": {"instanceTypes": ["g5.xlarge", "p3.2xlarge"], "minGpus": 1, "maxGpus": 1, "spot": "never",
                    "maxDeadlineRisk": 0.3},
    "checkpoint": {"intervalSeconds": 10, "restartSeconds": 30, "writeSeconds": 0.1},
})
DEADLINE_H = 2.7


def running(spec: TrainingJobSpec) -> TrainingJobStatus:
    st = TrainingJobStatus(plan=plan_status(plan(spec, CATALOG, POLICY, deadline_h=DEADLINE_H), 1, T0))
    st.conditions.append(Condition(type="Running", status="True", reason="Started", last_transition_time=T0))
    return st


def planner(st: TrainingJobStatus, hours_left: float) -> Any:
    def plan_with(eff: Any) -> Any:
        assert st.plan is not None
        rest = remaining_spec(SPEC, st.plan.total_samples, st.progress.samples)
        return plan(rest, CATALOG, POLICY, deadline_h=hours_left, efficiency=eff)
    return plan_with
