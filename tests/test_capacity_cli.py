"""``gpuscaler catalog capacity`` (a policy's held capacity; EC2's reservations and blocks, read with
boto3 through botocore's Stubber: moto implements neither DescribeCapacityReservations nor
DescribeCapacityBlocks) and the segments ``gpuscaler plan`` prints."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from gpuscaler.cli import main
from gpuscaler.cloud.capacity import USABLE_STATES, CapacityReadError, read_aws
from gpuscaler.errors import ErrorKind
from gpuscaler.policy import Policy
from gpuscaler.testing import training_job

START = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)
RESERVATIONS = [
    {
        "CapacityReservationId": "cr-0a1b2c3d4e5f60001", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 4, "AvailableInstanceCount": 3, "State": "active", "EndDateType": "limited",
        "StartDate": START - timedelta(days=30), "EndDate": START + timedelta(days=60), "ReservationType": "default",
    },
    {
        "CapacityReservationId": "cr-0a1b2c3d4e5f60002", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1b",
        "TotalInstanceCount": 2, "AvailableInstanceCount": 2, "State": "scheduled", "EndDateType": "limited",
        "StartDate": START, "EndDate": START + timedelta(days=1), "ReservationType": "capacity-block",
    },
    {
        "CapacityReservationId": "cr-0a1b2c3d4e5f60003", "InstanceType": "p4d.24xlarge", "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 1, "AvailableInstanceCount": 1, "State": "active", "EndDateType": "unlimited",
        "ReservationType": "default",
    },
]  # fmt: skip


def stubbed(response: dict[str, Any] | None = None, error: str | None = None) -> Any:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(ec2)
    params = {"Filters": [{"Name": "state", "Values": list(USABLE_STATES)}]}
    if error:
        stub.add_client_error("describe_capacity_reservations", error, "not allowed", expected_params=params)
    else:
        stub.add_response("describe_capacity_reservations", response or {}, params)
    stub.activate()
    return ec2


def test_ec2_reservations_and_blocks_read_as_pools() -> None:
    found = read_aws(stubbed({"CapacityReservations": RESERVATIONS}))
    odcr, blk, forever = (c.pool for c in found)
    assert (odcr.type, odcr.count, odcr.zone, odcr.end, odcr.start) == ("reserved", 4, "us-east-1a", START + timedelta(days=60), None)
    assert odcr.reservation_id == "cr-0a1b2c3d4e5f60001" and found[0].available == 3
    assert (blk.type, blk.start, blk.end) == ("capacityBlock", START, START + timedelta(days=1))
    assert forever.type == "reserved" and forever.end is None
    assert all(p.usd_per_hour is None for p in (odcr, blk, forever))  # prepaid: 0 at the margin by default


def test_a_denied_read_says_what_permission_is_missing() -> None:
    with pytest.raises(CapacityReadError, match="ec2:DescribeCapacityReservations") as err:
        read_aws(stubbed(error="UnauthorizedOperation"))
    assert err.value.kind is ErrorKind.INVALID_INPUT


POLICY = {
    "name": "ml-platform",
    "capacity": [
        {"name": "team-h100", "type": "reserved", "instanceType": "p5.48xlarge", "count": 2},
        {"name": "flex-a100", "type": "flexStart", "instanceType": "a2-highgpu-8g", "count": 2,
         "startDelay": {"p50Minutes": 30, "p90Minutes": 120}},
    ],
}  # fmt: skip


def test_catalog_capacity_lists_the_policys_pools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    assert main(["catalog", "capacity", "--policy", str(path)]) == 0
    text = capsys.readouterr().out
    assert "team-h100" in text and "$0.00 (prepaid)" in text and "P50 30 / P90 120 min" in text
    assert main(["catalog", "capacity", "--policy", str(path), "--json"]) == 0
    items = json.loads(capsys.readouterr().out)["capacity"]
    assert [i["name"] for i in items] == ["team-h100", "flex-a100"] and items[0]["source"] == "policy ml-platform"
    assert main(["catalog", "capacity", "--policy", str(path), "--as-policy"]) == 0
    again = Policy.model_validate(yaml.safe_load(capsys.readouterr().out))  # pastes back into a policy
    assert [p.name for p in again.capacity] == ["team-h100", "flex-a100"]


def test_catalog_capacity_needs_a_source_and_a_known_instance_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "capacity"]) == 2
    assert "--policy FILE" in capsys.readouterr().err
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({"capacity": [{"name": "x", "type": "reserved", "instanceType": "p5.48xlarg", "count": 1}]}))
    assert main(["catalog", "capacity", "--policy", str(path)]) == 2
    assert "capacity.0.instanceType: unknown instance type 'p5.48xlarg'; did you mean p5.48xlarge" in capsys.readouterr().err


def test_plan_prints_the_segments_of_a_plan_into_a_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    block = {"name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1,
             "start": (now - timedelta(minutes=5)).isoformat(), "end": (now + timedelta(minutes=55)).isoformat()}  # fmt: skip
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump({"capacity": [block]}))
    job = training_job("r", training={"epochs": 90}, maxDuration="48h")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["plan", str(tmp_path / "job.yaml"), "--policy", str(tmp_path / "policy.yaml")]) == 0
    text = capsys.readouterr().out
    assert "segment 1: 1 x p5.48xlarge capacity-block blk" in text and "before the window closes), then move" in text
    assert "segment 2:" in text and "held capacity: what the policy declares the team pays at the margin" in text


def test_simulate_replays_a_policy_with_held_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    trace, policy = root / "examples" / "traces" / "research-week.yaml", root / "examples" / "policies" / "research-week-held.yaml"
    argv = ["simulate", str(trace), "--policy", str(policy), "--strategies", "when-it-fits,gpuscaler", "--seeds", "1", "--json"]
    assert main(argv) == 0
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["strategies"]}
    assert rows["gpuscaler"]["cost_usd"]["mean"] < rows["when-it-fits"]["cost_usd"]["mean"]
