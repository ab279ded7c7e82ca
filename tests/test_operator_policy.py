"""The operator's policy gate: the merged policy per namespace, reloads, and PolicyViolation causes."""

from __future__ import annotations

import functools
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase
from gpuscaler.catalog import load_catalog
from gpuscaler.controller.policy import (
    Governance,
    PolicySource,
    PolicyViolationError,
    gated_plan,
    namespace_usage,
)
from gpuscaler.names import ConditionType
from gpuscaler.policy import NamespaceUsage, Policy
from loop_harness import World, make_job, spec

CAT = load_catalog()


def run(s: TrainingJobSpec, policy: Policy, usage: NamespaceUsage | None = None) -> Any:
    return gated_plan(s, "job", None, frozenset(), governance=Governance(policy, usage or NamespaceUsage()), catalog=CAT)


def test_no_governance_plans_like_the_cli() -> None:
    assert gated_plan(spec(), "job", None, frozenset(), catalog=CAT).chosen is not None


def test_job_cost_cap_is_a_violation_naming_rule_and_values() -> None:
    with pytest.raises(PolicyViolationError) as err:
        run(spec(), Policy(name="tight", max_usd_per_job=0.01))
    assert err.value.rule == "maxUsdPerJob"
    v = err.value.violations[0]
    assert v.limit == 0.01 and v.value > 0.01
    assert "tight" in str(err.value)


def test_namespace_gpu_cap_counts_other_jobs() -> None:
    pol = Policy(name="ns", max_gpus_per_namespace=8)
    s = spec(constraints={"minGpus": 4})
    assert run(s, pol, NamespaceUsage(gpus=0)).chosen is not None
    with pytest.raises(PolicyViolationError) as err:
        run(s, pol, NamespaceUsage(gpus=6))
    assert err.value.rule == "maxGpusPerNamespace"


def test_forbidden_gpu_type_in_the_spec_is_refused_before_planning() -> None:
    with pytest.raises(PolicyViolationError) as err:
        run(spec(constraints={"gpuTypes": ["h100"]}), Policy(name="cheap", allowed_gpu_types=["t4", "l4"]))
    assert "H100" in str(err.value) or "h100" in str(err.value)


def test_infeasible_for_its_own_reasons_is_not_a_policy_violation() -> None:
    # A deadline no plan can meet, policy or not: the loop reports Infeasible, not PolicyViolation.
    r = run(spec(training={"epochs": 500}, maxDuration="10m"), Policy(name="any", max_gpus_per_job=64))
    assert r.chosen is None


def test_namespace_usage_counts_active_gpus_and_this_months_spend() -> None:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    jobs = [
        {"name": "a", "phase": "Running", "gpus": 8, "costUsd": 10.0, "startTime": "2026-11-02T00:00:00Z"},
        {"name": "b", "phase": "Succeeded", "gpus": 4, "costUsd": 5.0, "startTime": "2026-10-30T00:00:00Z"},
        {"name": "me", "phase": "Running", "gpus": 16, "costUsd": 99.0, "startTime": "2026-11-29T00:00:00Z"},
    ]
    u = namespace_usage(jobs, exclude="me", now=now)
    assert u.gpus == 8
    assert u.usd_this_month == pytest.approx(10.0)


def test_policy_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("name: one\nmaxGpusPerJob: 8\n")
    src = PolicySource(str(f))
    assert src.for_namespace("team").max_gpus_per_job == 8
    f.write_text("name: two\nmaxGpusPerJob: 16\n")
    later = time.time() + 5
    os.utime(f, (later, later))
    assert src.for_namespace("team").max_gpus_per_job == 16


def test_objects_merge_with_the_file_per_namespace(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("name: cluster\nmaxGpusPerJob: 32\n")
    obj = {"kind": "GPUScalingPolicy", "metadata": {"name": "vision"},
           "spec": {"namespaces": ["team-vision"], "maxGpusPerJob": 4}}  # fmt: skip
    src = PolicySource(str(f))
    assert src.for_namespace("team-vision", [obj]).max_gpus_per_job == 4
    assert src.for_namespace("team-nlp", [obj]).max_gpus_per_job == 32


def test_the_step_writes_the_policy_violation_and_clears_it_once_compliant() -> None:
    """The governance reaches the loop as an argument; a broken rule is the step's PolicyViolation
    condition (one Event), the job stays Pending with nothing provisioned; once the policy allows
    the job the condition turns False (Compliant) and the job is planned and provisioned."""
    w = World(planner=functools.partial(gated_plan, catalog=CAT))  # the operator's planner
    job = make_job()  # 16 GPUs
    w.governance = Governance(Policy(name="small", max_gpus_per_job=8), NamespaceUsage())
    reasons = w.step(job)
    cond = next(c for c in w.status.conditions if c.type == ConditionType.POLICY_VIOLATION)
    assert cond.status == "True" and cond.reason == "maxGpusPerJob" and "small" in cond.message
    assert reasons == ["PolicyViolation"] and w.status.phase is Phase.PENDING and w.status.plan is None
    assert not w.provider.calls and w.status.message.startswith("not provisioned:")
    assert w.step(job) == [], "posted once while it holds"
    w.governance = Governance(Policy(name="big", max_gpus_per_job=16), NamespaceUsage())
    reasons = w.step(job)
    cond = next(c for c in w.status.conditions if c.type == ConditionType.POLICY_VIOLATION)
    assert cond.status == "False" and cond.reason == "Compliant"
    assert "Planned" in reasons and w.status.phase is Phase.PROVISIONING and w.provider.requests()


def test_the_namespace_usage_is_gathered_only_by_a_step_that_plans() -> None:
    """Gathering the usage reads every TrainingJob the operator knows: a step that does not plan
    (every step of a job after its first) does not gather it."""
    gathered: list[int] = []

    def usage() -> NamespaceUsage:
        gathered.append(1)
        return NamespaceUsage(gpus=8)

    w = World(planner=functools.partial(gated_plan, catalog=CAT))
    job = make_job()  # 16 GPUs
    policy = Policy(name="lab", max_gpus_per_namespace=32)
    for i in range(5):  # planned, the nodes asked for, Ready, the workers made, ...
        w.governance = Governance(policy, usage)  # a new one per step, as the handler builds it
        w.step(job)
        if i == 1:
            w.ready()
    assert w.status.phase is Phase.STARTING and len(gathered) == 1
    capped = Governance(policy, lambda: NamespaceUsage(gpus=32))  # the namespace holds its cap
    assert capped.usage.gpus == 32 and capped.usage is capped.usage  # gathered once
    with pytest.raises(PolicyViolationError):
        gated_plan(spec(), "job", None, frozenset(), governance=capped, catalog=CAT)
