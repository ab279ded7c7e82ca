"""The real kube-scheduler binds GPU pods to fake GPU nodes, and kwok runs them."""

from __future__ import annotations

from typing import Any

import pytest

from e2e_helpers import condition, gpu_pod, wait_for
from gpuscaler.devcluster.nodes import GPU_RESOURCE, INSTANCE_TYPE_LABEL, NodePool

pytestmark = pytest.mark.e2e


def test_eight_gpu_pod_is_bound_to_a_p4d_node_and_runs(core: Any, namespace: str, p4d_pool: NodePool) -> None:
    core.create_namespaced_pod(namespace, gpu_pod("trainer", 8, instance_type="p4d.24xlarge"))

    def running() -> Any:
        pod = core.read_namespaced_pod("trainer", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_for(running, what="pod Running")
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None and scheduled.status == "True"
    assert condition(pod, "Ready").status == "True"
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels[INSTANCE_TYPE_LABEL] == "p4d.24xlarge"
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    # kwok gave it a (fake) pod IP and a container status like a kubelet would
    assert pod.status.pod_ip
    assert pod.status.container_statuses[0].state.running is not None


def test_pod_asking_more_gpus_than_any_node_has_stays_pending(
    core: Any, namespace: str, p4d_pool: NodePool
) -> None:
    most = max(int((n.status.allocatable or {}).get(GPU_RESOURCE, "0")) for n in core.list_node().items)
    core.create_namespaced_pod(namespace, gpu_pod("too-big", most + 1))

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("too-big", namespace)
        c = condition(pod, "PodScheduled")
        return pod if c is not None and c.status == "False" and c.reason == "Unschedulable" else None

    pod = wait_for(unschedulable, what="PodScheduled=False/Unschedulable")
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None
    assert f"Insufficient {GPU_RESOURCE}" in condition(pod, "PodScheduled").message


def test_gpu_pod_without_toleration_does_not_land_on_tainted_gpu_nodes(
    core: Any, namespace: str, p4d_pool: NodePool
) -> None:
    core.create_namespaced_pod(
        namespace, gpu_pod("no-toleration", 1, instance_type="p4d.24xlarge", tolerate_gpu_taint=False)
    )

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("no-toleration", namespace)
        c = condition(pod, "PodScheduled")
        return c if c is not None and c.reason == "Unschedulable" else None

    c = wait_for(unschedulable, what="PodScheduled=False/Unschedulable")
    assert "untolerated taint" in c.message
