"""Held capacity in the providers: Karpenter's ``reserved`` (with the AWS reservation labels), EKS's
capacity-block node groups, GKE's reservation affinity and flex-start pools, kwok's nodes labelled
with the pool and its window; flex-start refused where the cloud has none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiClient

from gpuscaler import names
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JobRef, NodeRequest, ProviderError
from gpuscaler.cloud.eks import EksProvider, eks_capacity
from gpuscaler.cloud.gke import GkeProvider, pool_capacity
from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef
from gpuscaler.cloud.kwok_nodes import node_labels
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import owned_by_offering

CATALOG = load_catalog()
P5 = CATALOG.instance("p5.48xlarge")
START = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)


def request(capacity: CapacityType, **kw: Any) -> NodeRequest:
    return NodeRequest(JobRef("ns", "job"), kw.pop("instance", P5), capacity, 1, 0.0, **kw)


def karpenter(group: str) -> KarpenterProvider:
    return KarpenterProvider(ApiClient(), node_class=NodeClassRef(group, "EC2NodeClass", "default"), instance_types=["p5.48xlarge"])


def test_karpenter_admits_reserved_and_selects_the_reservation_on_aws() -> None:
    aws = karpenter("karpenter.k8s.aws")
    reqs = {r["key"]: r for r in aws.manifest()["spec"]["template"]["spec"]["requirements"]}
    assert reqs[names.CAPACITY_TYPE_LABEL]["values"] == ["on-demand", "spot", "reserved"]
    sel = aws.scheduling(request(CapacityType.RESERVED, pool="team", reservation_id="cr-0123")).node_selector
    assert sel[names.CAPACITY_TYPE_LABEL] == "reserved" and sel[names.KARPENTER_RESERVATION_ID_LABEL] == "cr-0123"
    assert sel[names.KARPENTER_RESERVATION_TYPE_LABEL] == "default"
    block = aws.scheduling(request(CapacityType.CAPACITY_BLOCK, pool="blk")).node_selector
    assert block[names.CAPACITY_TYPE_LABEL] == "reserved" and block[names.KARPENTER_RESERVATION_TYPE_LABEL] == "capacity-block"
    kwok = karpenter("karpenter.kwok.sh").scheduling(request(CapacityType.RESERVED)).node_selector
    assert names.KARPENTER_RESERVATION_TYPE_LABEL not in kwok  # only Karpenter's AWS provider sets them
    with pytest.raises(ProviderError, match="flex-start"):
        aws.scheduling(request(CapacityType.FLEX_START))


def test_a_reserved_node_karpenter_made_belongs_to_a_capacity_block_plan() -> None:
    node = NodeState(name="n", instance_type="p5.48xlarge", capacity_type="reserved", ready=True, created=None, usd_per_hour=0.0)
    assert owned_by_offering(request(CapacityType.CAPACITY_BLOCK), node)
    assert not owned_by_offering(request(CapacityType.SPOT), node)


def test_eks_serves_capacity_blocks_and_refuses_flex_start() -> None:
    assert eks_capacity(CapacityType.CAPACITY_BLOCK) == "CAPACITY_BLOCK"
    group = {"instanceTypes": ["p5.48xlarge"], "capacityType": "CAPACITY_BLOCK"}
    assert EksProvider._serves(group, "p5.48xlarge", CapacityType.CAPACITY_BLOCK)
    assert not EksProvider._serves(group, "p5.48xlarge", CapacityType.ON_DEMAND)
    tagged = {"tags": {names.INSTANCE_TYPE_KEY: "p5.48xlarge", names.CAPACITY_TYPE_KEY: "reserved"}}
    assert EksProvider._serves(tagged, "p5.48xlarge", CapacityType.RESERVED)
    with pytest.raises(ProviderError, match="no flex-start"):
        eks_capacity(CapacityType.FLEX_START)


def gke_pool(**config: Any) -> Any:
    cfg = {"labels": {}, "machine_type": "a3-highgpu-8g", "spot": False, "preemptible": False, **config}
    return SimpleNamespace(locations=[], config=SimpleNamespace(**cfg))


def test_gke_tells_reservation_and_flex_start_pools_apart() -> None:
    specific = SimpleNamespace(consume_reservation_type=3, key="compute.googleapis.com/reservation-name", values=["r1"])
    assert pool_capacity(gke_pool(flex_start=True).config) is CapacityType.FLEX_START
    assert pool_capacity(gke_pool(reservation_affinity=specific).config) is CapacityType.RESERVED
    assert pool_capacity(gke_pool(spot=True).config) is CapacityType.SPOT
    assert pool_capacity(gke_pool().config) is CapacityType.ON_DEMAND
    assert GkeProvider._serves(gke_pool(flex_start=True), "a3-highgpu-8g", CapacityType.FLEX_START)
    assert GkeProvider._serves(gke_pool(reservation_affinity=specific), "a3-highgpu-8g", CapacityType.CAPACITY_BLOCK)
    assert not GkeProvider._serves(gke_pool(flex_start=True), "a3-highgpu-8g", CapacityType.ON_DEMAND)


def test_kwok_nodes_carry_the_capacity_type_the_pool_and_its_window() -> None:
    req = request(CapacityType.CAPACITY_BLOCK, pool="blk", window_start=START, window_end=START + timedelta(minutes=30))
    held = req.held_labels()
    assert held == {
        names.HELD_CAPACITY_LABEL: "blk", names.CAPACITY_TYPE_KEY: "capacity-block",
        names.CAPACITY_WINDOW_START_LABEL: str(int(START.timestamp())),
        names.CAPACITY_WINDOW_END_LABEL: str(int(START.timestamp()) + 1800),
    }  # fmt: skip
    labels = node_labels("n", "pool", P5, capacity_type=CapacityType.CAPACITY_BLOCK, zone="us-east-1a", extra=held)
    assert labels[names.CAPACITY_TYPE_LABEL] == "capacity-block" and labels[names.EKS_CAPACITY_LABEL] == "CAPACITY_BLOCK"
    assert labels[names.CAPACITY_WINDOW_END_LABEL] == held[names.CAPACITY_WINDOW_END_LABEL]
    a3 = CATALOG.instance("a3-highgpu-8g")
    assert node_labels("n", "pool", a3, capacity_type=CapacityType.FLEX_START, zone="us-central1-a")[names.GKE_FLEX_START_LABEL] == "true"
    assert request(CapacityType.SPOT).held_labels() == {}


def test_the_ec2nodeclass_terms_admit_the_declared_reservations_only() -> None:
    from gpuscaler.cloud.karpenter import capacity_reservation_selector_terms
    from gpuscaler.policy import Policy

    pools = Policy.model_validate({"capacity": [
        {"name": "a", "type": "reserved", "instanceType": "p5.48xlarge", "count": 1, "reservationId": "cr-1"},
        {"name": "b", "type": "reserved", "instanceType": "p5.48xlarge", "count": 1},  # no id: nothing to select
        {"name": "c", "type": "flexStart", "instanceType": "a3-highgpu-8g", "count": 1, "reservationId": "x",
         "startDelay": {"p50Minutes": 5, "p90Minutes": 9}},
    ]}).capacity  # fmt: skip
    assert capacity_reservation_selector_terms(pools) == [{"id": "cr-1"}]
