"""Fake GPU node pools: Node objects shaped the way a cloud's nodes are, played by kwok.

Each node gets, from the gpuscaler catalog row of its instance type, ``status.capacity`` and
``status.allocatable`` (``nvidia.com/gpu``, cpu, memory, pods; allocatable less a cloud-style
kubelet reservation), the well-known labels a cloud, Karpenter and NVIDIA GPU feature discovery
set (instance type, zone, region, capacity type, GPU product and count), ``spec.providerID``
``kwok://<name>``, optionally the GPU taint clouds put on GPU nodes, and the
``kwok.x-k8s.io/node: fake`` annotation that makes the dev cluster's kwok manage it.

This is the seed of the operator's kwok node-pool provider: every function takes a
``kubernetes.client.CoreV1Api`` (or an ``ApiClient``) and nothing else from the dev cluster.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuscaler.catalog import CapacityType, InstanceType, load_catalog
from gpuscaler.devcluster.stages import NODE_READY_DELAY_ANNOTATION

POOL_LABEL = "gpuscaler.io/pool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_RESOURCE = "nvidia.com/gpu"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT: Mapping[str, str] = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
"""The taint EKS, GKE and AKS GPU node groups carry (pods need a matching toleration)."""
NOT_READY_TAINT: Mapping[str, str] = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}

DEFAULT_MAX_PODS = 110

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(value: str) -> str:
    """Make ``value`` a valid label value (alphanumerics, ``-_.``, at most 63, alnum at both ends)."""
    v = _LABEL_VALUE.sub("-", value).strip("-_.")
    return v[:63].rstrip("-_.")


def default_zone(inst: InstanceType) -> str:
    """The first zone of the instance's region, spelled the provider's way."""
    if inst.provider == "aws":
        return f"{inst.region}a"
    if inst.provider == "gcp":
        return f"{inst.region}-a"
    return f"{inst.region}-1"


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
        "gpuscaler.io/gpu": label_value(inst.gpu.id),
        "gpuscaler.io/provider": label_value(inst.provider),
    }
    if inst.provider == "aws":
        spot = capacity_type is CapacityType.SPOT
        labels["eks.amazonaws.com/capacityType"] = "SPOT" if spot else "ON_DEMAND"
    elif inst.provider == "gcp" and capacity_type is CapacityType.SPOT:
        labels["cloud.google.com/gke-spot"] = "true"
    elif inst.provider == "azure":
        labels["kubernetes.azure.com/scalesetpriority"] = (
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
    ann = {KWOK_ANNOTATION: "fake", "gpuscaler.io/instance-type": inst.name}
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


def _core(api: Any) -> Any:
    """Accept a CoreV1Api or an ApiClient."""
    from kubernetes import client

    return api if isinstance(api, client.CoreV1Api) else client.CoreV1Api(api)


@dataclass(frozen=True)
class NodePool:
    """What :func:`create_node_pool` made."""

    name: str
    instance_type: InstanceType
    capacity_type: CapacityType
    zone: str
    node_names: tuple[str, ...]


def pool_node_names(api: Any, pool: str) -> list[str]:
    """Names of the nodes of a pool."""
    nodes = _core(api).list_node(label_selector=f"{POOL_LABEL}={label_value(pool)}")
    return sorted(n.metadata.name for n in nodes.items)


def create_node_pool(
    api: Any,
    pool: str,
    instance_type: str | InstanceType,
    count: int,
    *,
    capacity_type: CapacityType | str = CapacityType.ON_DEMAND,
    zone: str | None = None,
    gpu_taint: bool = True,
    ready_after: float = 0.0,
    provisioning_delay: float = 0.0,
    labels: Mapping[str, str] | None = None,
    max_pods: int = DEFAULT_MAX_PODS,
    parallelism: int = 8,
) -> NodePool:
    """Add ``count`` fake nodes of ``instance_type`` to ``pool`` (names ``<pool>-<n>``, n continues).

    ``provisioning_delay`` sleeps before creating the nodes (the cloud launching instances);
    ``ready_after`` registers them NotReady and lets kwok turn them Ready later (the kubelet
    booting). Returns at once after creating; use :func:`wait_nodes_ready` to wait.
    """
    inst = load_catalog().instance(instance_type) if isinstance(instance_type, str) else instance_type
    cap = CapacityType(capacity_type)
    zone = zone or default_zone(inst)
    core = _core(api)
    prefix = label_value(pool)
    pattern = re.compile(rf"{re.escape(prefix)}-(\d+)")
    taken = {int(m[1]) for n in pool_node_names(core, pool) if (m := pattern.fullmatch(n))}
    start = max(taken, default=-1) + 1
    names = [f"{prefix}-{i}" for i in range(start, start + count)]
    if provisioning_delay > 0:
        time.sleep(provisioning_delay)
    bodies = [
        node_manifest(
            n, pool, inst, capacity_type=cap, zone=zone, gpu_taint=gpu_taint,
            ready_after=ready_after, max_pods=max_pods, labels=labels,
        )
        for n in names
    ]
    if len(bodies) <= 2 or parallelism <= 1:
        for body in bodies:
            core.create_node(body)
    else:
        with ThreadPoolExecutor(max_workers=parallelism) as ex:
            list(ex.map(core.create_node, bodies))
    return NodePool(pool, inst, cap, zone, tuple(names))


def delete_node_pool(api: Any, pool: str) -> int:
    """Delete every node of ``pool``; returns how many."""
    core = _core(api)
    names = pool_node_names(core, pool)
    for n in names:
        core.delete_node(n)
    return len(names)


def node_is_ready(node: Any) -> bool:
    """True when a Node (client model or plain dict) is Ready and carries no not-ready taint.

    New nodes get ``node.kubernetes.io/not-ready:NoSchedule`` from the API server's
    TaintNodesByCondition admission; the node lifecycle controller lifts it once kwok reports
    Ready. Until then the scheduler will not use the node, so both are checked.
    """
    if isinstance(node, dict):
        status, spec = node.get("status") or {}, node.get("spec") or {}
        conds = [(c.get("type"), c.get("status")) for c in status.get("conditions") or []]
        taint_keys = [t.get("key") for t in spec.get("taints") or []]
    else:
        conds = [(c.type, c.status) for c in (node.status.conditions or [] if node.status else [])]
        taint_keys = [t.key for t in (node.spec.taints or [] if node.spec else [])]
    return ("Ready", "True") in conds and NOT_READY_TAINT["key"] not in taint_keys


def list_nodes_raw(api: Any, label_selector: str = "") -> list[dict[str, Any]]:
    """Nodes as plain dicts (skips the client's model parsing: much faster for hundreds of nodes)."""
    resp = _core(api).list_node(label_selector=label_selector, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def wait_nodes_ready(api: Any, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until every named node is Ready and schedulable; raises TimeoutError naming the rest."""
    pending = set(names)
    deadline = time.monotonic() + timeout
    interval = 0.2
    while pending:
        for n in list_nodes_raw(api):
            if n["metadata"]["name"] in pending and node_is_ready(n):
                pending.discard(n["metadata"]["name"])
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout}s: {sorted(pending)[:10]}")
        time.sleep(interval)
        interval = min(interval * 1.5, 2.0)
