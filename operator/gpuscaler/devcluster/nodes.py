"""Fake GPU node pools: Node objects shaped the way a cloud's nodes are, played by kwok.

Each node gets, from the gpuscaler catalog row of its instance type, ``status.capacity`` and
``status.allocatable`` (``nvidia.com/gpu``, cpu, memory, pods; allocatable less a cloud-style
kubelet reservation), the well-known labels a cloud, Karpenter and NVIDIA GPU feature discovery
set (instance type, zone, region, capacity type, GPU product and count), ``spec.providerID``
``kwok://<name>``, optionally the GPU taint clouds put on GPU nodes, and the
``kwok.x-k8s.io/node: fake`` annotation that makes the dev cluster's kwok manage it.

The Node bodies are built by :mod:`gpuscaler.cloud.kwok_nodes` (the kwok provider's own); this
module makes pools of them. Every function takes a ``kubernetes.client.CoreV1Api`` (or an
``ApiClient``) and nothing else from the dev cluster.
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
from gpuscaler.cloud.kwok_nodes import (  # the node bodies are the kwok provider's; pools reuse them
    CAPACITY_TYPE_LABEL,
    DEFAULT_MAX_PODS,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPU_TAINT,
    INSTANCE_TYPE_LABEL,
    KWOK_ANNOTATION,
    NOT_READY_TAINT,
    POOL_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
    default_zone,
    label_value,
    node_labels,
    node_manifest,
    node_resources,
    reserved_cpu_millis,
    reserved_memory_mib,
)


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


__all__ = [
    "CAPACITY_TYPE_LABEL",
    "DEFAULT_MAX_PODS",
    "GPU_COUNT_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "GPU_TAINT",
    "INSTANCE_TYPE_LABEL",
    "KWOK_ANNOTATION",
    "NOT_READY_TAINT",
    "POOL_LABEL",
    "REGION_LABEL",
    "ZONE_LABEL",
    "NodePool",
    "create_node_pool",
    "default_zone",
    "delete_node_pool",
    "label_value",
    "list_nodes_raw",
    "node_is_ready",
    "node_labels",
    "node_manifest",
    "node_resources",
    "pool_node_names",
    "reserved_cpu_millis",
    "reserved_memory_mib",
    "wait_nodes_ready",
]
