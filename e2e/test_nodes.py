"""The fake GPU node helper: Node objects follow their catalog row, kwok makes them Ready."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from e2e_helpers import wait_for
from gpuscaler.catalog import CapacityType, InstanceType, load_catalog
from gpuscaler.devcluster import nodes
from gpuscaler.devcluster.nodes import (
    GPU_RESOURCE,
    create_node_pool,
    delete_node_pool,
    node_is_ready,
    node_manifest,
    wait_nodes_ready,
)

pytestmark = pytest.mark.e2e


def _one_per_provider() -> list[InstanceType]:
    seen: dict[str, InstanceType] = {}
    for inst in load_catalog().instances:
        seen.setdefault(inst.provider, inst)
    return [load_catalog().instance("p4d.24xlarge"), *seen.values()]


@pytest.mark.parametrize("inst", _one_per_provider(), ids=lambda i: i.name)
@pytest.mark.parametrize("capacity", list(CapacityType))
def test_manifest_follows_the_catalog_row(inst: InstanceType, capacity: CapacityType) -> None:
    m = node_manifest("n-0", "pool-a", inst, capacity_type=capacity)
    labels = m["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == inst.name
    assert labels["topology.kubernetes.io/region"] == inst.region
    assert labels["topology.kubernetes.io/zone"].startswith(inst.region)
    assert labels["karpenter.sh/capacity-type"] == capacity.value
    assert labels["nvidia.com/gpu.product"] == nodes.label_value(inst.gpu.product_label)
    assert labels["nvidia.com/gpu.count"] == str(inst.gpu_count)
    assert labels["type"] == "kwok"
    assert labels["gpuscaler.io/pool"] == "pool-a"
    assert m["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert m["spec"]["providerID"] == "kwok://n-0"
    cap, alloc = m["status"]["capacity"], m["status"]["allocatable"]
    assert cap[GPU_RESOURCE] == alloc[GPU_RESOURCE] == str(inst.gpu_count)
    assert cap["cpu"] == str(inst.vcpu)
    assert cap["memory"] == f"{round(inst.memory_gib * 1024)}Mi"
    assert 0 < int(alloc["cpu"].rstrip("m")) < inst.vcpu * 1000
    assert 0 < int(alloc["memory"].rstrip("Mi")) < inst.memory_gib * 1024
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in m["spec"]["taints"]
    if inst.provider == "aws":
        # EKS managed node groups' capacityType: SPOT, CAPACITY_BLOCK, else ON_DEMAND (reservations too)
        want = {CapacityType.SPOT: "SPOT", CapacityType.CAPACITY_BLOCK: "CAPACITY_BLOCK"}.get(capacity, "ON_DEMAND")
        assert labels["eks.amazonaws.com/capacityType"] == want


def test_gpu_taint_is_optional() -> None:
    m = node_manifest("n-0", "p", load_catalog().instance("p4d.24xlarge"), gpu_taint=False)
    assert m["spec"]["taints"] == []


def test_kubelet_style_reservations() -> None:
    assert nodes.reserved_cpu_millis(1) == 60
    assert nodes.reserved_cpu_millis(4) == 80  # 60 + 10 + 5 + 5
    assert nodes.reserved_cpu_millis(96) == 80 + 92 * 2.5
    assert nodes.reserved_memory_mib(110) == 255 + 1210 + 100


def test_pool_on_the_cluster_matches_the_catalog(dev_cluster: Any, core: Any, kwok: None) -> None:
    inst = load_catalog().instance("p4d.24xlarge")
    pool = create_node_pool(dev_cluster.api, f"np-{uuid.uuid4().hex[:4]}", inst, 3, capacity_type="spot")
    try:
        assert pool.node_names == tuple(f"{pool.name}-{i}" for i in range(3))
        wait_nodes_ready(dev_cluster.api, pool.node_names)
        for name in pool.node_names:
            node = core.read_node(name)
            assert node.status.capacity[GPU_RESOURCE] == "8"
            assert node.status.allocatable[GPU_RESOURCE] == "8"
            assert node.status.capacity["cpu"] == str(inst.vcpu)
            assert node.metadata.labels["karpenter.sh/capacity-type"] == "spot"
            assert node.spec.provider_id == f"kwok://{name}"
        # growing the pool continues the numbering
        more = create_node_pool(dev_cluster.api, pool.name, inst, 1)
        assert more.node_names == (f"{pool.name}-3",)
    finally:
        assert delete_node_pool(dev_cluster.api, pool.name) == 4
    wait_for(lambda: not nodes.pool_node_names(core, pool.name), what="pool deleted")


def test_node_registered_not_ready_turns_ready_after_the_delay(dev_cluster: Any, core: Any, kwok: None) -> None:
    t0 = time.monotonic()
    pool = create_node_pool(dev_cluster.api, f"slow-{uuid.uuid4().hex[:4]}", "p4d.24xlarge", 1, ready_after=3)
    try:
        node = core.read_node(pool.node_names[0])
        assert not node_is_ready(node)
        wait_nodes_ready(dev_cluster.api, pool.node_names, timeout=60)
        assert time.monotonic() - t0 >= 2.5
    finally:
        delete_node_pool(dev_cluster.api, pool.name)
