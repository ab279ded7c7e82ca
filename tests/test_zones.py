"""Zones as choices: zone names, constraints.zones and policy zones in the planner, the capacity
back-off per zone, and the node-pool providers creating capacity in the planned zone."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from kubernetes import client
from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import UnavailableOffering
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.catalog.prices import Price, PriceTable, apply_prices
from gpuscaler.catalog.zones import default_zone, in_region, unknown_zone, zone_region
from gpuscaler.cloud import JobRef, NodeRequest
from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef
from gpuscaler.cloud.kwok_nodes import node_manifest
from gpuscaler.cloud.nodes import node_state
from gpuscaler.names import ZONE_LABEL
from gpuscaler.planner import JobError, Reason, plan
from gpuscaler.policy import Policy
from gpuscaler.policy.cli import unknown_ids

CAT = load_catalog()
AWS = "p4d.24xlarge"


def spec(**constraints: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(
        {
            "workload": {"model": "resnet50"},
            "globalBatch": 1024,
            "training": {"epochs": 10},
            "constraints": {"instanceTypes": [AWS], **constraints},
        }
    )


@pytest.mark.parametrize(
    ("provider", "zone", "region"),
    [
        ("aws", "us-east-1a", "us-east-1"),
        ("aws", "us-east-1-bos-1a", "us-east-1"),
        ("aws", "eu-west-1c", "eu-west-1"),
        ("gcp", "us-central1-a", "us-central1"),
        ("azure", "eastus-1", "eastus"),
        ("aws", "us-east-1", None),  # a region is not a zone
        ("gcp", "us-central1", None),
        ("azure", "eastus", None),
        ("aws", "US-EAST-1A", None),
    ],
)
def test_zone_region(provider: str, zone: str, region: str | None) -> None:
    assert zone_region(provider, zone) == region
    if region:
        assert in_region(provider, region, zone)


def test_default_zone_is_a_zone_of_its_region() -> None:
    for inst in CAT.instances:
        assert zone_region(inst.provider, default_zone(inst.provider, inst.region)) == inst.region


def test_region_wide_offerings_are_pinned_to_each_allowed_zone_cheapest_first() -> None:
    r = plan(spec(zones=["us-east-1b", "us-east-1c"]), CAT)
    assert r.chosen is not None and r.chosen.zone == "us-east-1b"
    zones = {c.zone for c in r.feasible if c.instance.name == AWS}
    assert zones == {"us-east-1b", "us-east-1c"}
    assert "in us-east-1b" in r.chosen.label


def test_without_zones_an_offering_is_for_any_zone() -> None:
    r = plan(spec(), CAT)
    assert r.chosen is not None and r.chosen.zone == ""
    assert {c.zone for c in r.feasible} == {""}


def test_a_zone_short_of_capacity_moves_the_plan_to_the_next_zone() -> None:
    first = plan(spec(zones=["us-east-1b", "us-east-1c"]), CAT)
    assert first.chosen is not None
    c = first.chosen
    gone = UnavailableOffering.model_validate(
        {"instanceType": AWS, "capacityType": c.capacity.value, "zone": c.zone, "until": "2030-01-01T00:00:00Z"}
    )
    again = plan(spec(zones=["us-east-1b", "us-east-1c"]), CAT, unavailable=frozenset({gone.key}))
    assert again.chosen is not None
    assert (again.chosen.capacity, again.chosen.zone) == (c.capacity, "us-east-1c")
    assert any(
        r.category is Reason.CAPACITY and r.zone == "us-east-1b" and r.capacity == c.capacity.value
        for r in again.rejected
    )
    # a shortage without a zone (the plan was for any zone) leaves out every zone of the offering
    everywhere = UnavailableOffering.model_validate(
        {"instanceType": AWS, "capacityType": c.capacity.value, "until": "2030-01-01T00:00:00Z"}
    )
    third = plan(spec(zones=["us-east-1b", "us-east-1c"]), CAT, unavailable=frozenset({everywhere.key}))
    assert third.chosen is None or third.chosen.capacity != c.capacity


def test_zones_of_another_region_reject_the_offering_with_a_reason() -> None:
    r = plan(spec(zones=["us-central1-a"], instanceTypes=[]), CAT)
    aws = [x for x in r.rejected if x.instance == AWS]
    assert aws and all(x.category is Reason.CONSTRAINT and "constraints.zones" in x.reason for x in aws)
    assert r.chosen is not None and r.chosen.instance.provider == "gcp" and r.chosen.zone == "us-central1-a"


def test_policy_zones_restrict_and_narrow_the_jobs_zones() -> None:
    policy = Policy(name="eu-only", zones=["us-east-1c"])
    r = plan(spec(zones=["us-east-1b", "us-east-1c"]), CAT, policy)
    assert r.chosen is not None and {c.zone for c in r.feasible} == {"us-east-1c"}
    r = plan(spec(), CAT, policy)
    assert r.chosen is not None and r.chosen.zone == "us-east-1c"
    r = plan(spec(zones=["us-east-1b"]), CAT, policy)
    assert r.chosen is None
    assert {x.category for x in r.rejected if x.instance == AWS} == {Reason.POLICY}


def test_bad_zones_are_refused_with_the_field() -> None:
    with pytest.raises(ValidationError, match=r"zones: 'US East' is not a zone name"):
        spec(zones=["US East"])
    with pytest.raises(JobError, match=r"constraints\.zones: zone 'mars-north-1a' is in no region"):
        plan(spec(zones=["mars-north-1a"]), CAT)
    assert unknown_zone("us-east-1a", CAT.instances) is None
    errors = unknown_ids(Policy(zones=["us-east-1a", "moon-1-a"]), CAT)
    assert len(errors) == 1 and errors[0].startswith("zones.1: zone 'moon-1-a' is in no region")


def test_node_request_pool_id_is_unchanged_without_a_zone_and_differs_per_zone() -> None:
    inst = CAT.instance(AWS)
    job = JobRef("ns", "j")
    anywhere = NodeRequest(job, inst, CapacityType.SPOT, 2, 1.0)
    b = NodeRequest(job, inst, CapacityType.SPOT, 2, 1.0, zone="us-east-1b")
    c = NodeRequest(job, inst, CapacityType.SPOT, 2, 1.0, zone="us-east-1c")
    assert anywhere.pool_id == hashlib.sha256(b"ns.j/p4d.24xlarge/spot").hexdigest()[:6]  # names kept
    assert len({anywhere.pool_id, b.pool_id, c.pool_id}) == 3
    assert anywhere.zone_selector() == {} and b.zone_selector() == {ZONE_LABEL: "us-east-1b"}


def test_kwok_nodes_are_labelled_with_the_planned_zone() -> None:
    inst = CAT.instance(AWS)
    node = node_manifest("n1", "pool", inst, zone="us-east-1c")
    assert node["metadata"]["labels"][ZONE_LABEL] == "us-east-1c"
    assert node_state(node).zone == "us-east-1c"
    assert node_manifest("n2", "pool", inst)["metadata"]["labels"][ZONE_LABEL] == "us-east-1a"


def test_karpenter_pods_select_the_zone_and_a_zone_requirement_admits_it() -> None:
    inst = CAT.instance(AWS)
    req = NodeRequest(JobRef("ns", "j"), inst, CapacityType.SPOT, 1, 1.0, zone="us-east-1c")
    p = KarpenterProvider(
        client.ApiClient(),  # not called: admit(), manifest() and scheduling() need no server
        node_class=NodeClassRef.parse("karpenter.k8s.aws/EC2NodeClass/default"),
        instance_types=[AWS],
        extra_requirements=[{"key": ZONE_LABEL, "operator": "In", "values": ["us-east-1a"]}],
    )
    assert p.scheduling(req).node_selector[ZONE_LABEL] == "us-east-1c"
    p.admit(AWS, req.zone)  # what ensure_nodepool does before it writes the pool
    zone_req = [r for r in p.manifest()["spec"]["template"]["spec"]["requirements"] if r["key"] == ZONE_LABEL]
    assert zone_req == [{"key": ZONE_LABEL, "operator": "In", "values": ["us-east-1a", "us-east-1c"]}]


def zoned_catalog(prices: dict[str, float]) -> Any:
    """The shipped catalog with per-zone spot prices of p4d.24xlarge (as a spot price history gives them)."""
    rows = [Price("aws", "us-east-1", z, AWS, CapacityType.SPOT, usd, "2026-12-06", "aws-spot-price-history")
            for z, usd in prices.items()]  # fmt: skip
    return apply_prices(CAT, PriceTable(rows, "zones.csv"))


def test_spot_is_planned_in_the_cheapest_zone_and_moves_on_a_shortage() -> None:
    cat = zoned_catalog({"us-east-1a": 9.0, "us-east-1b": 7.5, "us-east-1c": 8.0})
    s = spec(spot="preferred")
    r = plan(s, cat)
    assert r.chosen is not None
    assert (r.chosen.capacity, r.chosen.zone, r.chosen.price_source) == (CapacityType.SPOT, "us-east-1b", "aws-spot-price-history")
    assert r.chosen.usd_per_hour == pytest.approx(7.5 * r.chosen.nodes)
    assert r.chosen.price_date == "2026-12-06"
    again = plan(s, cat, unavailable=frozenset({(AWS, "spot", "us-east-1b")}))
    assert again.chosen is not None and again.chosen.zone == "us-east-1c"
    assert plan(spec(spot="preferred", zones=["us-east-1a"]), cat).chosen.zone == "us-east-1a"  # type: ignore[union-attr]


def test_an_implausible_zone_price_is_flagged_alone() -> None:
    od = CAT.instance(AWS).ondemand_usd_hr
    cat = zoned_catalog({"us-east-1a": od * 0.05, "us-east-1b": od * 0.4})
    r = plan(spec(spot="preferred"), cat)
    assert r.chosen is not None and r.chosen.zone == "us-east-1b"
    flagged = [x for x in r.rejected if x.category is Reason.PRICE]
    assert [(x.instance, x.zone) for x in flagged] == [(AWS, "us-east-1a")]
