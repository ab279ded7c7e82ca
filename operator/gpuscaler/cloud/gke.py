"""The gke provider: GKE node pools, one per (machine type, spot or not), via ``ClusterManagerClient``.

How it maps the :class:`~gpuscaler.cloud.provider.NodePoolProvider` contract onto GKE:

- **Finding the pool.** A node pool serves an offering when its node labels (``config.labels``) say
  ``gpuscaler.io/instance-type=<machine type>`` and ``gpuscaler.io/capacity-type=<on-demand|spot>``,
  or, unlabelled, when ``config.machineType`` is the machine type and ``config.spot`` (or
  ``preemptible``) matches. Pools must exist beforehand (``docs/providers.md`` shows the command);
  a zonal pool, because ``setSize`` counts nodes per zone. A plan pinned to a zone is served by a
  pool whose node locations (``locations``) are exactly that zone; a plan for any zone by the first
  pool that serves the offering.
- **Scaling.** ``setSize`` to the nodes registered in the pool plus what the job still lacks beyond
  nodes already launching (the last size this process set). When the pool autoscales and its
  ``maxNodeCount`` is below that, ``setAutoscaling`` raises the bound first. Nodes register on their
  own; free nodes of the pool (label ``cloud.google.com/gke-nodepool``) are adopted
  (:mod:`gpuscaler.cloud.adoption`). Release lowers the size and frees the nodes' job label (the
  managed instance group picks the instances to remove).
- **Operations.** Each call returns an ``Operation``; it is polled with ``getOperation`` for up to
  ``operation_timeout_s``; still RUNNING then, it is remembered and polled on the next call
  instead of starting another. An operation or API error mentioning ``GCE_STOCKOUT``,
  ``ZONE_RESOURCE_POOL_EXHAUSTED`` (or ``..._WITH_DETAILS``) or a GPU quota becomes
  :class:`~gpuscaler.cloud.provider.InsufficientCapacityError` wrapping the cause.
- **Scheduling.** ``node.kubernetes.io/instance-type``, ``cloud.google.com/gke-accelerator``
  (GKE's accelerator name, e.g. ``nvidia-tesla-a100``), ``cloud.google.com/gke-spot=true`` for spot,
  and the job label; GKE taints GPU nodes ``nvidia.com/gpu``, tolerated.
- **Credentials.** Application Default Credentials: on GKE, Workload Identity (the operator's
  ServiceAccount bound to a Google service account). Roles are in ``docs/providers.md``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuscaler import names
from gpuscaler.catalog import CapacityType
from gpuscaler.cloud.adoption import NodeAdopter
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    AdoptsNodes,
    JobRef,
    NodeRequest,
    ProviderError,
    Scheduling,
    cloud_error,
)
from gpuscaler.names import INSTANCE_TYPE_LABEL, JOB_LABEL

GKE_ACCELERATORS: dict[str, str] = {
    "V100-16GB": "nvidia-tesla-v100",
    "T4": "nvidia-tesla-t4",
    "L4": "nvidia-l4",
    "A100-40GB": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100-80GB-SXM": "nvidia-h100-80gb",
    "H100-MEGA-80GB": "nvidia-h100-mega-80gb",
    "H200-141GB-SXM": "nvidia-h200-141gb",
    "B200-192GB": "nvidia-b200",
}
"""Catalog GPU id -> GKE accelerator type (``gcloud compute accelerator-types list``; GKE GPU docs)."""

CAPACITY_MESSAGE = re.compile(
    r"GCE_STOCKOUT|ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available|"
    r"QUOTA_EXCEEDED.*GPUS|NVIDIA_[A-Z0-9_]*GPUS",
    re.IGNORECASE,
)
"""Messages that mean "no capacity of this offering right now" (GCE error codes seen by GKE)."""

OP_DONE = "DONE"


@dataclass
class _Pool:
    name: str
    """Full resource name ``projects/P/locations/L/clusters/C/nodePools/NP``."""
    short: str
    autoscaling: bool
    max_nodes: int


def _error(what: str, text: str) -> ProviderError:
    """The error of ``what`` failing with GKE or GCE error ``text``: no capacity when it says so
    (:data:`CAPACITY_MESSAGE`)."""
    return cloud_error(f"gke: {what}, {text}", no_capacity=bool(CAPACITY_MESSAGE.search(text)))


def _status_name(status: Any) -> str:
    return str(getattr(status, "name", status))


class GkeProvider(AdoptsNodes):
    """Sizes GKE node pools; adopts the nodes they register."""

    name = "gke"

    def __init__(
        self,
        gke: Any,
        core: Any,
        *,
        project: str,
        location: str,
        cluster: str,
        operation_timeout_s: float = 30.0,
        poll_s: float = 2.0,
        toleration_key: str = names.GPU_RESOURCE,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            gke: A ``google.cloud.container_v1.ClusterManagerClient``.
            core: A Kubernetes ``CoreV1Api`` (to adopt and count the pool's nodes).
            project, location, cluster: The GKE cluster (location: a zone or region).
            operation_timeout_s: How long one call waits for its Operation before returning.
            poll_s: Seconds between ``getOperation`` polls.
            toleration_key: Taint key of GPU nodes (GKE's own: ``nvidia.com/gpu``).
        """
        self.gke = gke
        self.parent = f"projects/{project}/locations/{location}/clusters/{cluster}"
        self.ops_parent = f"projects/{project}/locations/{location}"
        self.timeout = operation_timeout_s
        self.poll_s = poll_s
        self.toleration_key = toleration_key
        self.sleep = sleep
        self.clock = clock
        self.adopter = NodeAdopter(core)
        self._pools: dict[tuple[str, str, str], _Pool] = {}
        self._target: dict[str, int] = {}
        """Last size this process set per pool: nodes above the registered ones are launching."""
        self._pending: dict[str, str] = {}
        """Pool -> name of an Operation still RUNNING when we stopped waiting."""

    # ------------------------------------------------------------------ GKE calls

    def _api(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return fn(**kwargs)
        except gexc.GoogleAPIError as err:
            raise _error(what, str(err)) from err

    def _wait(self, what: str, pool: str, op: Any) -> bool:
        """Poll an Operation until DONE or the timeout; True when done. Raises on an operation error."""
        deadline = self.clock() + self.timeout
        while True:
            if _status_name(op.status) == OP_DONE:
                self._pending.pop(pool, None)
                error = getattr(op, "error", None)
                message = " ".join(
                    s for s in (op.status_message, getattr(error, "message", "") if error else "") if s
                )
                if message:
                    cause = ProviderError(f"operation {op.name}: {message}")
                    raise _error(what, message) from cause
                return True
            if self.clock() >= deadline:
                self._pending[pool] = op.name
                return False
            self.sleep(self.poll_s)
            op = self._api(
                f"polling operation {op.name}",
                self.gke.get_operation,
                request={"name": f"{self.ops_parent}/operations/{op.name.rsplit('/', 1)[-1]}"},
            )

    def _busy(self, pool: str, what: str) -> bool:
        """True while an earlier operation on the pool is still running (polls it once)."""
        name = self._pending.get(pool)
        if name is None:
            return False
        op = self._api(
            f"polling operation {name}",
            self.gke.get_operation,
            request={"name": f"{self.ops_parent}/operations/{name.rsplit('/', 1)[-1]}"},
        )
        saved, self.timeout = self.timeout, 0.0
        try:
            return not self._wait(what, pool, op)
        finally:
            self.timeout = saved

    @staticmethod
    def _serves(np: Any, instance: str, capacity: CapacityType, zone: str = "") -> bool:
        if zone and list(np.locations or []) != [zone]:
            return False
        labels = dict(np.config.labels or {})
        if names.INSTANCE_TYPE_KEY in labels:
            labelled = (labels[names.INSTANCE_TYPE_KEY], labels.get(names.CAPACITY_TYPE_KEY))
            return labelled == (instance, capacity.value)
        if np.config.machine_type != instance:
            return False
        served = pool_capacity(np.config)
        if capacity is CapacityType.CAPACITY_BLOCK:  # DWS calendar mode: a specific reservation too
            return served is CapacityType.RESERVED
        return served is capacity

    def find_pool(self, instance: str, capacity: CapacityType, zone: str = "") -> _Pool | None:
        """The node pool that serves an offering (with node locations ``[zone]`` when given), or None."""
        key = (instance, capacity.value, zone)
        if key in self._pools:
            return self._pools[key]
        resp = self._api(
            f"listing node pools of {self.parent}", self.gke.list_node_pools, request={"parent": self.parent}
        )
        for np in resp.node_pools:
            if self._serves(np, instance, capacity, zone):
                pool = _Pool(
                    name=f"{self.parent}/nodePools/{np.name}",
                    short=np.name,
                    autoscaling=bool(np.autoscaling and np.autoscaling.enabled),
                    max_nodes=int(np.autoscaling.max_node_count) if np.autoscaling else 0,
                )
                self._pools[key] = pool
                return pool
        return None

    def _set_size(self, pool: _Pool, size: int, what: str) -> None:
        if pool.autoscaling and pool.max_nodes < size:
            op = self._api(
                f"raising autoscaling max of {pool.short} to {size}",
                self.gke.set_node_pool_autoscaling,
                request={
                    "name": pool.name,
                    "autoscaling": {"enabled": True, "min_node_count": 0, "max_node_count": size},
                },
            )
            if not self._wait(what, pool.short, op):
                return  # still running: setSize on the next reconcile
            pool.max_nodes = size
        op = self._api(
            f"{what}: setting {pool.short} to {size} nodes",
            self.gke.set_node_pool_size,
            request={"name": pool.name, "node_count": size},
        )
        self._target[pool.short] = size
        self._wait(what, pool.short, op)

    # ------------------------------------------------------------------ the Protocol

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        inst, cap = request.instance.name, request.capacity
        pool = self.find_pool(inst, cap, request.zone)
        if pool is None:
            where = f" in {request.zone}" if request.zone else ""
            locations = f" and --node-locations {request.zone}" if request.zone else ""
            raise ProviderError(
                f"gke: no node pool of {self.parent} serves {inst} ({cap.value}){where}; create one with node labels "
                f"{names.INSTANCE_TYPE_KEY}={inst},{names.CAPACITY_TYPE_KEY}={cap.value}{locations} (docs/providers.md)"
            )
        have = sum(1 for n in existing if not n.deleting)
        selector = f"{names.GKE_NODEPOOL_LABEL}={pool.short}"
        adopted = self.adopter.adopt(request, selector, have)
        missing = request.count - have - len(adopted)
        what = f"scaling {pool.short} for {request.job.key} ({inst}, {cap.value})"
        if missing <= 0 or self._busy(pool.short, what):
            return adopted
        registered = len(self.adopter.group_nodes(selector))
        target = max(self._target.get(pool.short, 0), registered)
        launching = target - registered
        if missing <= launching:
            return adopted
        self._set_size(pool, target + missing - launching, what)
        return adopted

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        """Lower each pool's size by the job's nodes in it and free their job label."""
        if not nodes:
            return []
        given = {n.name for n in nodes}
        by_pool: dict[str, list[str]] = {}
        for node in self.adopter.group_nodes(f"{JOB_LABEL}={job.label}"):
            pool = (node.metadata.labels or {}).get(names.GKE_NODEPOOL_LABEL)
            if node.metadata.name in given and pool:
                by_pool.setdefault(pool, []).append(node.metadata.name)
        released: list[str] = []
        for short, pool_nodes in by_pool.items():
            registered = len(self.adopter.group_nodes(f"{names.GKE_NODEPOOL_LABEL}={short}"))
            size = max(0, max(self._target.get(short, 0), registered) - len(pool_nodes))
            pool = _Pool(f"{self.parent}/nodePools/{short}", short, autoscaling=False, max_nodes=0)
            self.adopter.disown(pool_nodes)
            self._set_size(pool, size, f"releasing {len(pool_nodes)} node(s) of {job.key}")
            released += pool_nodes
        return released

    def scheduling(self, request: NodeRequest) -> Scheduling:
        """Pods select the machine type, accelerator and job; spot and flex-start pods GKE's own
        labels, a reservation's pods their node pool (one that consumes the reservation)."""
        selector = {INSTANCE_TYPE_LABEL: request.instance.name, JOB_LABEL: request.job.label}
        accelerator = GKE_ACCELERATORS.get(request.instance.gpu_id)
        if accelerator:
            selector[names.GKE_ACCELERATOR_LABEL] = accelerator
        if request.capacity is CapacityType.SPOT:
            selector[names.GKE_SPOT_LABEL] = "true"
        elif request.capacity is CapacityType.FLEX_START:
            selector[names.GKE_FLEX_START_LABEL] = "true"
        elif request.capacity in (CapacityType.RESERVED, CapacityType.CAPACITY_BLOCK):
            pool = self.find_pool(request.instance.name, request.capacity, request.zone)
            if pool is not None:
                selector[names.GKE_NODEPOOL_LABEL] = pool.short
        selector.update(request.zone_selector())
        return Scheduling(
            node_selector=selector,
            tolerations=[{"key": self.toleration_key, "operator": "Exists", "effect": "NoSchedule"}],
        )


SPECIFIC_RESERVATION = 3
"""``ReservationAffinity.Type.SPECIFIC_RESERVATION``: the pool consumes one named reservation."""


def pool_capacity(config: Any) -> CapacityType:
    """The capacity type an unlabelled node pool's ``config`` provides: flex-start (``flexStart``),
    reserved (``reservationAffinity`` of a specific reservation), spot (``spot`` or
    ``preemptible``), else on-demand."""
    if getattr(config, "flex_start", False):
        return CapacityType.FLEX_START
    affinity = getattr(config, "reservation_affinity", None)
    if affinity is not None and int(getattr(affinity, "consume_reservation_type", 0) or 0) == SPECIFIC_RESERVATION:
        return CapacityType.RESERVED
    if config.spot or config.preemptible:
        return CapacityType.SPOT
    return CapacityType.ON_DEMAND
