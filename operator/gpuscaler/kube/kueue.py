"""Kueue admission of a TrainingJob's gang: flavor matching, pod groups, and what a Workload says.

**Flavor <-> offering.** A Kueue ResourceFlavor names nodes by their labels (``spec.nodeLabels``);
a plan names a catalog offering (instance type, GPU type, capacity type). A flavor *matches* an
offering when every offering label it sets agrees with the offering:

=====================================================  ========================================
flavor node label                                      agrees when
=====================================================  ========================================
``node.kubernetes.io/instance-type``                   it is the offering's instance type
``nvidia.com/gpu.product``                             it is the GPU's product label (GPU
                                                       feature discovery, e.g. ``NVIDIA-A100-SXM4-40GB``)
``gpuscaler.io/gpu``                                   it is the catalog GPU id (``a100-40gb``)
``karpenter.sh/capacity-type``                         ``spot`` / ``on-demand``
``eks.amazonaws.com/capacityType``                     ``SPOT`` / ``ON_DEMAND``
``cloud.google.com/gke-spot``                          ``true`` for spot (absent: on-demand)
``kubernetes.azure.com/scalesetpriority``              ``spot`` / ``regular``
=====================================================  ========================================

and it sets at least one of the first three (a flavor naming no GPU or instance type says
nothing about GPUs). A flavor with no capacity label counts as on-demand capacity. Other labels
(zone, pool) are not compared. The JobSet or pod group carries the plan's node selector (instance
type and capacity type), so Kueue itself can only assign a flavor compatible with the plan; the
matching here names the flavor the plan expects (``status.queue.expectedFlavor``) and checks the
one Kueue assigned.

**The unit Kueue admits** is the gang's JobSet (:mod:`gpuscaler.kube.jobset`), labelled
``kueue.x-k8s.io/queue-name`` and created suspended: one Workload, all workers or none.

**Workload state.** :func:`workload_state` reads a Workload's conditions (``QuotaReserved``,
``Admitted``, ``Evicted``, ``Preempted``) and admission into an admitted flag, the ClusterQueue
and flavor, and the reason to show while the gang waits, e.g. "couldn't assign flavors to pod set
workers: insufficient quota for nvidia.com/gpu in flavor a100-spot, ...".

Pure functions; the caller lists Workloads and ResourceFlavors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpuscaler.catalog import CapacityType, InstanceType
from gpuscaler.names import (
    AZURE_PRIORITY_LABEL,
    CAPACITY_TYPE_LABEL,
    EKS_CAPACITY_LABEL,
    GKE_SPOT_LABEL,
    GPU_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
)

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
WORKLOADS: Final = "workloads"
RESOURCE_FLAVORS: Final = "resourceflavors"
GPU_ID_LABEL: Final = GPU_LABEL
CAPACITY_LABELS: Final[dict[str, dict[str, CapacityType]]] = {
    CAPACITY_TYPE_LABEL: {"spot": CapacityType.SPOT, "on-demand": CapacityType.ON_DEMAND},
    EKS_CAPACITY_LABEL: {"SPOT": CapacityType.SPOT, "ON_DEMAND": CapacityType.ON_DEMAND},
    GKE_SPOT_LABEL: {"true": CapacityType.SPOT, "false": CapacityType.ON_DEMAND},
    AZURE_PRIORITY_LABEL: {"spot": CapacityType.SPOT, "regular": CapacityType.ON_DEMAND},
}
"""Node labels that say a node's capacity type, per cloud, and what each value means."""


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor as far as matching goes."""

    name: str
    node_labels: Mapping[str, str]

    @classmethod
    def from_object(cls, body: Mapping[str, Any]) -> Flavor:
        """From a ResourceFlavor object (a dict)."""
        spec = body.get("spec") or {}
        return cls(str((body.get("metadata") or {}).get("name", "")), dict(spec.get("nodeLabels") or {}))

    def capacity(self) -> CapacityType | None:
        """The capacity type its labels name; on-demand when none does; None for a value it cannot read."""
        for label, values in CAPACITY_LABELS.items():
            if label in self.node_labels:
                return values.get(self.node_labels[label])
        return CapacityType.ON_DEMAND

    def matches(self, instance: InstanceType, capacity: CapacityType) -> bool:
        """Whether this flavor's nodes are the offering ``instance`` at ``capacity`` (module docstring)."""
        labels = self.node_labels
        checks = {
            INSTANCE_TYPE_LABEL: instance.name,
            GPU_PRODUCT_LABEL: instance.gpu.product_label,
            GPU_ID_LABEL: instance.gpu.id,
        }
        named = [k for k in checks if k in labels]
        if not named or any(labels[k] != checks[k] for k in named):
            return False
        return self.capacity() is capacity


def matching_flavors(
    flavors: Iterable[Flavor], instance: InstanceType, capacity: CapacityType
) -> list[str]:
    """Names of the flavors that match the offering, most specific first (instance type named
    before GPU type only), then by name."""
    found = [f for f in flavors if f.matches(instance, capacity)]
    found.sort(key=lambda f: (INSTANCE_TYPE_LABEL not in f.node_labels, f.name))
    return [f.name for f in found]


@dataclass(frozen=True)
class WorkloadState:
    """What a Kueue Workload says about the gang."""

    name: str
    admitted: bool
    quota_reserved: bool
    evicted: bool
    finished: bool
    cluster_queue: str | None
    flavor: str | None
    """The flavor assigned to ``nvidia.com/gpu`` (the first pod set's), once quota is reserved."""
    reason: str
    """Why it waits (no quota reserved or admission checks pending) or why it was evicted."""


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in status.get("conditions") or []}


def _true(conds: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return conds.get(kind, {}).get("status") == "True"


def workload_state(body: Mapping[str, Any]) -> WorkloadState:
    """A :class:`WorkloadState` from a Workload object (a dict)."""
    status = body.get("status") or {}
    conds = _conditions(status)
    admission = status.get("admission") or {}
    flavor: str | None = None
    for ps in admission.get("podSetAssignments") or []:
        flavors = ps.get("flavors") or {}
        if GPU_RESOURCE in flavors:
            flavor = str(flavors[GPU_RESOURCE])
            break
    admitted = _true(conds, "Admitted")
    reserved = _true(conds, "QuotaReserved")
    evicted = _true(conds, "Evicted")
    if evicted:
        c = conds["Evicted"]
        reason = f"evicted ({c.get('reason', '')}): {c.get('message', '')}".strip()
    elif admitted:
        reason = ""
    elif reserved:
        checks = [
            f"{ac.get('name')}: {ac.get('state')}{' - ' + ac['message'] if ac.get('message') else ''}"
            for ac in status.get("admissionChecks") or []
            if ac.get("state") != "Ready"
        ]
        reason = "waiting for admission checks: " + "; ".join(checks) if checks else "quota reserved"
    else:
        c = conds.get("QuotaReserved") or conds.get("Pending") or {}
        reason = str(c.get("message") or c.get("reason") or "not yet considered by Kueue")
    return WorkloadState(
        name=str((body.get("metadata") or {}).get("name", "")),
        admitted=admitted,
        quota_reserved=reserved,
        evicted=evicted,
        finished=_true(conds, "Finished"),
        cluster_queue=admission.get("clusterQueue"),
        flavor=flavor,
        reason=reason,
    )


def owned_by(body: Mapping[str, Any], uid: str) -> bool:
    """Whether the object (a Workload) has an owner reference to ``uid`` (its JobSet or a pod)."""
    return any(o.get("uid") == uid for o in (body.get("metadata") or {}).get("ownerReferences") or [])


def queued_message(queue: str, state: WorkloadState | None) -> str:
    """The status message of a job waiting in ``queue``: ``Queued in <queue>: <why>``."""
    why = state.reason if state is not None else "waiting for Kueue to create the Workload"
    return f"Queued in LocalQueue {queue}: {why}"
