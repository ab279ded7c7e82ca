"""Policies: the model's validation, loading (plain, GPUScalingPolicy, multi-document), merging for
a namespace, violation checks, and ``gpuscaler policy check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cli import main
from gpuscaler.policy import (
    NamespaceUsage,
    Policy,
    PolicyConflictError,
    PolicyFileError,
    check_job,
    check_plan,
    effective_precisions,
    from_document,
    load_policies,
    load_policy,
    policy_for_namespace,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "policies").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ model


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_validate_and_check(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_policies(path)
    assert main(["policy", "check", str(path)]) == 0
    assert "valid" in capsys.readouterr().out


def test_example_files_exist() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "cost-first-research",
        "deadline-first-production",
        "on-demand-only-regulated",
    }


def test_model_refuses_bad_values() -> None:
    with pytest.raises(ValidationError, match="maxGpusPerJb"):
        Policy.model_validate({"maxGpusPerJb": 8})
    with pytest.raises(ValidationError, match="mode"):
        Policy.model_validate({"spot": {"mode": "sometimes"}})
    with pytest.raises(ValidationError, match="unknown precision fp4"):
        Policy.model_validate({"allowedPrecisions": ["fp4"]})
    with pytest.raises(ValidationError, match="minCheckpointIntervalS 8000 > maxCheckpointIntervalS 7200"):
        Policy.model_validate({"minCheckpointIntervalS": 8000})
    with pytest.raises(ValidationError, match="defaultPrecisions fp8 not in allowedPrecisions"):
        Policy.model_validate({"allowedPrecisions": ["amp"], "defaultPrecisions": ["fp8"]})


def test_existing_api_kept() -> None:
    p = Policy.model_validate({"maxUsdPerHour": 10, "spot": {"mode": "never"}})
    assert p.max_usd_per_hour == 10 and p.spot.mode == "never" and p.name == "default"
    inst = load_catalog().instance("p4d.24xlarge")
    discounted = Policy.model_validate({"priceOverrides": [{"instanceType": "*", "discountPct": 50}]})
    assert discounted.price(inst, CapacityType.ON_DEMAND) == pytest.approx(inst.ondemand_usd_hr / 2)


def test_load_resource_and_multi_document(tmp_path: Path) -> None:
    one = write(tmp_path, "kind: GPUScalingPolicy\nmetadata: {name: gold}\nspec: {maxGpusPerJob: 4}\n")
    assert load_policy(one).name == "gold" and load_policy(one).max_gpus_per_job == 4
    many = write(tmp_path, "name: a\n---\nname: b\nnamespaces: [x]\n", "many.yaml")
    assert [p.name for p in load_policies(many)] == ["a", "b"]
    with pytest.raises(PolicyFileError, match="holds 2 policies"):
        load_policy(many)
    with pytest.raises(PolicyFileError, match="holds no policy"):
        load_policies(write(tmp_path, "", "empty.yaml"))
    with pytest.raises(PolicyFileError, match="not valid YAML"):
        load_policies(write(tmp_path, "a: [", "bad.yaml"))


def test_applies_to_patterns() -> None:
    p = Policy(namespaces=["team-*", "prod"])
    assert p.applies_to("team-a") and p.applies_to("prod")
    assert not p.applies_to("production") and not p.applies_to(None)
    assert Policy().applies_to("anything")


# ------------------------------------------------------------------------------------ merge


def test_namespace_policy_overrides_only_what_it_sets() -> None:
    base = from_document(
        {"name": "base", "maxGpusPerJob": 8, "maxUsdPerMonth": 1000, "spot": {"mode": "preferred"}}
    )
    team = from_document({"name": "team", "namespaces": ["team-*"], "maxUsdPerMonth": 5000})
    merged = policy_for_namespace([base, team], "team-a")
    assert merged.name == "base+team"
    assert merged.max_gpus_per_job == 8  # kept from the cluster-wide policy
    assert merged.max_usd_per_month == 5000  # the namespace policy's own (it may loosen)
    assert merged.spot.mode == "preferred"
    other = policy_for_namespace([base, team], "other")
    assert other.name == "base" and other.max_usd_per_month == 1000
    assert policy_for_namespace([], "x") == Policy()


def test_same_level_takes_the_strictest() -> None:
    a = from_document(
        {
            "name": "a",
            "maxGpusPerJob": 8,
            "allowedGpuTypes": ["A100-40GB", "H100-80GB-SXM"],
            "spot": {"mode": "preferred", "maxInterruptions": 5},
        }
    )
    b = from_document(
        {
            "name": "b",
            "maxGpusPerJob": 16,
            "allowedGpuTypes": ["h100-80gb-sxm", "L4"],
            "spot": {"mode": "never"},
            "minCheckpointIntervalS": 900,
        }
    )
    m = policy_for_namespace([a, b], "ns")
    assert m.max_gpus_per_job == 8
    assert m.allowed_gpu_types == ["H100-80GB-SXM"]
    assert m.spot.mode == "never" and m.spot.max_interruptions == 5
    assert m.min_checkpoint_interval_s == 900


def test_disjoint_allow_lists_are_a_conflict_not_unrestricted() -> None:
    a = Policy(name="a", allowed_gpu_types=["A100-40GB"])
    b = Policy(name="b", allowed_gpu_types=["L4"])
    with pytest.raises(PolicyConflictError, match="allowed_gpu_types"):
        policy_for_namespace([a, b], "ns")


# ------------------------------------------------------------------------------------ checks


def job(**constraints: object) -> dict[str, object]:
    return {
        "workload": {"model": "resnet50"},
        "globalBatch": 256,
        "training": {"epochs": 1},
        "constraints": constraints,
    }


def test_check_job_reports_rule_field_value_and_limit() -> None:
    policy = from_document(
        {"name": "p", "maxGpusPerJob": 8, "allowedGpuTypes": ["A100-40GB"], "regions": ["us-east-1"]}
    )
    assert check_job(job(minGpus=8, gpuTypes=["a100"]), policy) == []
    v = check_job(job(minGpus=16, gpuTypes=["L4"], regions=["eu-west-1"]), policy)
    assert [x.rule for x in v] == ["allowedGpuTypes", "regions", "maxGpusPerJob"]
    gpus = v[2]
    assert (gpus.field, gpus.value, gpus.limit, gpus.policy) == ("spec.constraints.minGpus", 16, 8, "p")
    assert "minGpus 16 > maxGpusPerJob 8" in gpus.message
    assert gpus.to_dict()["rule"] == "maxGpusPerJob"


def test_check_job_checkpoint_and_precision() -> None:
    policy = Policy(min_checkpoint_interval_s=600, allowed_precisions=["amp", "bf16"])
    spec = job(precisions=["fp32"])
    spec["checkpoint"] = {"intervalSeconds": 60}
    rules = [x.rule for x in check_job(spec, policy)]
    assert rules == ["allowedPrecisions", "minCheckpointIntervalS"]


def test_namespace_budget_and_gpus() -> None:
    policy = Policy(name="team", max_usd_per_month=1000, max_gpus_per_namespace=16)
    assert check_job(job(minGpus=8), policy, NamespaceUsage(gpus=8, usd_this_month=999)) == []
    v = check_job(job(minGpus=8), policy, NamespaceUsage(gpus=9, usd_this_month=1000))
    assert [x.rule for x in v] == ["maxGpusPerNamespace", "maxUsdPerMonth"]
    assert v[1].limit == 1000
    plan_v = check_plan(8, 30.0, 200.0, policy, NamespaceUsage(gpus=0, usd_this_month=900))
    assert [x.rule for x in plan_v] == ["maxUsdPerMonth"]
    assert "leaves $100.00" in plan_v[0].message
    assert check_job(job(minGpus=8), policy) == []  # no usage given: namespace caps not checked


def test_check_plan_per_job_caps() -> None:
    policy = Policy(max_gpus_per_job=8, max_usd_per_hour=20, max_usd_per_job=100)
    assert [v.rule for v in check_plan(16, 40, 500, policy)] == [
        "maxGpusPerJob",
        "maxUsdPerHour",
        "maxUsdPerJob",
    ]
    assert check_plan(8, 20, 100, policy) == []


def test_effective_precisions() -> None:
    policy = Policy(default_precisions=["bf16"])
    assert effective_precisions(job(), policy) == ["bf16"]
    assert effective_precisions(job(precisions=["fp32"]), policy) == ["fp32"]
    assert effective_precisions(job(), Policy()) == []


# ------------------------------------------------------------------------------------ CLI


def test_check_prints_prices_after_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        "name: p\nallowedInstanceTypes: [p4d.24xlarge]\npriceOverrides:\n  - {instanceType: p4d.24xlarge, onDemandUsdHr: 10, spotUsdHr: 4}\n",
    )
    assert main(["policy", "check", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["instanceTypes"] == [
        {
            "name": "p4d.24xlarge",
            "provider": "aws",
            "region": "us-east-1",
            "gpus": "8 x A100-40GB",
            "onDemandUsdHr": 10.0,
            "spotUsdHr": 4.0,
            "catalogOnDemandUsdHr": load_catalog().instance("p4d.24xlarge").ondemand_usd_hr,
        }
    ]
    assert out["gpuTypes"] == ["A100-40GB"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("maxGpusPerJob: 0\n", ["maxGpusPerJob", "got 0"]),
        ("spot: {mode: sometimes}\n", ["spot.mode", "'sometimes'"]),
        ("allowedGpuTypes: [A1000]\n", ["allowedGpuTypes.0", "A1000"]),
        ("allowedInstanceTypes: [p9.huge]\n", ["allowedInstanceTypes.0", "p9.huge"]),
        ("regions: [mars-1]\n", ["regions.0", "mars-1"]),
        ("name: a\nallowedGpuTypes: [L4]\n---\nname: b\nallowedGpuTypes: [T4]\n", None),
    ],
)
def test_check_invalid_exits_2_with_field_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: list[str] | None
) -> None:
    path = write(tmp_path, text)
    if expected is None:  # valid on its own, conflicting for a namespace both apply to
        assert main(["policy", "check", str(path)]) == 0
        assert main(["policy", "check", str(path), "--namespace", "ns"]) == 2
        assert "nothing in common" in capsys.readouterr().err
        return
    assert main(["policy", "check", str(path)]) == 2
    err = capsys.readouterr().err
    for piece in expected:
        assert piece in err


def test_check_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", "/nonexistent.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_check_namespace_merges(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "policies" / "cost-first-research.yaml"
    assert main(["policy", "check", str(path), "--namespace", "team-vision", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "research-defaults+research-teams"
    assert out["caps"]["maxUsdPerMonth"] == 20000 and out["caps"]["maxGpusPerJob"] == 16
