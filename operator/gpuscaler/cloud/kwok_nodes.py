"""The Node objects of kwok's fake GPU nodes, shaped the way a cloud's nodes are.

Each node gets, from the gpuscaler catalog row of its instance type, ``status.capacity`` and
``status.allocatable`` (``nvidia.com/gpu``, cpu, memory, pods; allocatable less a cloud-style
kubelet reservation), the well-known labels a cloud, Karpenter and NVIDIA GPU feature discovery
set (instance type, zone, region, capacity type, GPU product and count), ``spec.providerID``
``kwok://<name>``, optionally the GPU taint clouds put on GPU nodes, and the
``kwok.x-k8s.io/node: fake`` annotation that makes a cluster's kwok manage it.

Built by the kwok provider (:mod:`gpuscaler.cloud.kwok`) when it "launches" nodes, and by the
dev cluster's node pools (:mod:`gpuscaler.devcluster.nodes`). Pure: catalog rows in, dicts out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpuscaler import names
from gpuscaler.catalog import CapacityType, InstanceType, zones

NODE_READY_DELAY_ANNOTATION: Final = "node-initialize.stage.kwok.x-k8s.io/delay"
"""Node annotation: how long kwok waits before making the node Ready (the dev cluster's kwok
stages, :mod:`gpuscaler.devcluster.stages`, read it)."""

POOL_LABEL = names.POOL_LABEL
INSTANCE_TYPE_LABEL = names.INSTANCE_TYPE_LABEL
ZONE_LABEL = names.ZONE_LABEL
REGION_LABEL = names.REGION_LABEL
CAPACITY_TYPE_LABEL = names.CAPACITY_TYPE_LABEL
GPU_PRODUCT_LABEL = names.GPU_PRODUCT_LABEL
GPU_COUNT_LABEL = names.GPU_COUNT_LABEL
GPU_MEMORY_LABEL = names.GPU_MEMORY_LABEL
GPU_RESOURCE = names.GPU_RESOURCE
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT: Mapping[str, str] = {"key": names.GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
"""The taint EKS, GKE and AKS GPU node groups carry (pods need a matching toleration)."""
NOT_READY_TAINT: Mapping[str, str] = {"key": names.NOT_READY_TAINT_KEY, "effect": "NoSchedule"}

DEFAULT_MAX_PODS = 110

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(value: str) -> str:
    """Make ``value`` a valid label value (alphanumerics, ``-_.``, at most 63, alnum at both ends)."""
    v = _LABEL_VALUE.sub("-", value).strip("-_.")
    return v[:63].rstrip("-_.")


def default_zone(inst: InstanceType) -> str:
    """The first zone of the instance's region, spelled the provider's way."""
    return zones.default_zone(inst.provider, inst.region)


def reserved_cpu_millis(vcpu: int) -> int:
    """Kubelet CPU reservation of EKS/GKE: 6% of core 1, 1% of core 2, 0.5% of cores 3-4, 0.25% above."""
    tiers = [(1, 60), (1, 10), (2, 5)]
    left, total = vcpu, 0.0
    for cores, per_core in tiers:
        n = min(left, cores)
        total += n * per_core
        left -= n
    total += max(left, 0) * 2.5
    return round(total)


def reserved_memory_mib(max_pods: int) -> int:
    """Kubelet memory reservation of EKS (255 MiB + 11 MiB per pod) plus the 100 MiB eviction threshold."""
    return 255 + 11 * max_pods + 100


def node_resources(
    inst: InstanceType, max_pods: int = DEFAULT_MAX_PODS
) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) of a node of this instance type."""
    mem_mib = round(inst.memory_gib * 1024)
    capacity = {
        "cpu": str(inst.vcpu),
        "memory": f"{mem_mib}Mi",
        "pods": str(max_pods),
        "ephemeral-storage": "100Gi",
        GPU_RESOURCE: str(inst.gpu_count),
    }
    allocatable = dict(capacity)
    allocatable["cpu"] = f"{inst.vcpu * 1000 - reserved_cpu_millis(inst.vcpu)}m"
    allocatable["memory"] = f"{max(mem_mib - reserved_memory_mib(max_pods), 0)}Mi"
    allocatable["ephemeral-storage"] = "90Gi"
    return capacity, allocatable


def node_labels(
    name: str,
    pool: str,
    inst: InstanceType,
    *,
    capacity_type: CapacityType,
    zone: str,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The labels a cloud, Karpenter and GPU feature discovery put on such a node."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        POOL_LABEL: label_value(pool),
        INSTANCE_TYPE_LABEL: label_value(inst.name),
        ZONE_LABEL: label_value(zone),
        REGION_LABEL: label_value(inst.region),
        CAPACITY_TYPE_LABEL: capacity_type.value,
        GPU_PRODUCT_LABEL: label_value(inst.gpu.product_label),
        GPU_COUNT_LABEL: str(inst.gpu_count),
        GPU_MEMORY_LABEL: str(round(inst.gpu.memory_gb * 1024)),
        names.GPU_LABEL: label_value(inst.gpu.id),
        names.PROVIDER_LABEL: label_value(inst.provider),
    }
    if inst.provider == "aws":  # EKS's capacityType: SPOT, CAPACITY_BLOCK, else ON_DEMAND (a reservation's too)
        eks = {CapacityType.SPOT: "SPOT", CapacityType.CAPACITY_BLOCK: "CAPACITY_BLOCK"}
        labels[names.EKS_CAPACITY_LABEL] = eks.get(capacity_type, "ON_DEMAND")
    elif inst.provider == "gcp" and capacity_type is CapacityType.SPOT:
        labels[names.GKE_SPOT_LABEL] = "true"
    elif inst.provider == "gcp" and capacity_type is CapacityType.FLEX_START:
        labels[names.GKE_FLEX_START_LABEL] = "true"
    elif inst.provider == "azure":
        labels[names.AZURE_PRIORITY_LABEL] = (
            "spot" if capacity_type is CapacityType.SPOT else "regular"
        )
    labels.update(extra or {})
    return labels


def node_manifest(
    name: str,
    pool: str,
    inst: InstanceType,
    *,
    capacity_type: CapacityType = CapacityType.ON_DEMAND,
    zone: str | None = None,
    gpu_taint: bool = True,
    ready_after: float = 0.0,
    max_pods: int = DEFAULT_MAX_PODS,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Iterable[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The Node object (a plain dict) for one fake node of ``inst`` in ``pool``.

    ``ready_after`` > 0 registers the node NotReady (tainted ``node.kubernetes.io/not-ready``, as
    a booting kubelet's node is) and lets kwok make it Ready after that many seconds.
    """
    capacity, allocatable = node_resources(inst, max_pods)
    ann = {KWOK_ANNOTATION: "fake", names.INSTANCE_TYPE_KEY: inst.name}
    if ready_after > 0:
        ann[NODE_READY_DELAY_ANNOTATION] = f"{int(ready_after * 1000)}ms"
    ann.update(annotations or {})
    node_taints = [dict(t) for t in taints]
    if gpu_taint and inst.gpu_count > 0:
        node_taints.append(dict(GPU_TAINT))
    if ready_after > 0:
        node_taints.append(dict(NOT_READY_TAINT))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels(
                name, pool, inst, capacity_type=capacity_type, zone=zone or default_zone(inst), extra=labels
            ),
            "annotations": ann,
        },
        "spec": {"providerID": f"kwok://{name}", "taints": node_taints},
        # Nodes may carry status on create (kubelets register that way); kwok keeps these values
        # and fills in conditions, addresses and nodeInfo.
        "status": {"capacity": capacity, "allocatable": allocatable},
    }
