"""The karpenter provider: the cluster runs Karpenter; gpuscaler owns one ``NodePool`` and steers pods.

Karpenter provisions for *pending pods*; it creates the NodeClaims and Node objects itself. So this
provider does not create nodes: it keeps a gpuscaler-owned ``karpenter.sh/v1`` ``NodePool`` whose
requirements admit the catalog's instance types and both capacity types, whose ``limits`` cap the
GPUs it may hold (``nvidia.com/gpu``, from policy/settings), and which taints its nodes with the
GPU taint; and it puts the plan on the worker pods (:meth:`KarpenterProvider.scheduling`):
``node.kubernetes.io/instance-type``, ``karpenter.sh/capacity-type``, ``karpenter.sh/nodepool`` and
the job label. The pool requires ``gpuscaler.io/job`` with ``Exists``, so Karpenter copies the pod's
job label onto the node it launches: nodes are per job and the operator's node index finds them.

The workers go first (:meth:`workers_first`): the reconcile loop calls :meth:`ensure_nodes` when a gang starts
(it creates or updates the NodePool and launches nothing), then creates the worker pods at once
(Karpenter acts on them) rather than wait for nodes first; the gang timeout runs on the pods being
scheduled and Running. The loop knows the job's nodes by their offering (Karpenter names them), and
they are the job's own (:meth:`node_gone`), released when it ends or is re-planned.

Scale-down is Karpenter's: ``consolidationPolicy: WhenEmpty`` removes a job's nodes once its pods
are gone. :meth:`release_nodes` hastens it by deleting the nodes' NodeClaims (Karpenter drains and
terminates them). RBAC and prerequisites (a NodeClass) are in ``docs/providers.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler import names
from gpuscaler.catalog.models import HELD_CAPACITY, CapacityType
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    AdoptsNodes,
    JobRef,
    NodeRequest,
    ProviderError,
    Scheduling,
    karpenter_capacity,
)
from gpuscaler.names import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, JOB_LABEL
from gpuscaler.policy.capacity import HeldCapacity

GROUP = "karpenter.sh"
VERSION = "v1"
NODEPOOL_LABEL = names.KARPENTER_NODEPOOL_LABEL
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuscaler"}
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
CAPACITY_VALUES = ("on-demand", "spot", "reserved")
"""``karpenter.sh/capacity-type`` values the pool admits: Karpenter's own (``reserved`` since v1.3,
its ReservedCapacity feature gate on by default in v1.14)."""
AWS_NODECLASS_GROUP = "karpenter.k8s.aws"
"""The group of Karpenter's AWS node class (``EC2NodeClass``), whose nodes carry the reservation labels."""


@dataclass(frozen=True)
class NodeClassRef:
    """The cloud's node class the pool launches with (must exist), e.g. ``karpenter.k8s.aws/EC2NodeClass/default``."""

    group: str
    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> NodeClassRef:
        """From ``<group>/<kind>/<name>``.

        Raises:
            ValueError: not three parts.
        """
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"node class {text!r} is not <group>/<kind>/<name>, e.g. karpenter.k8s.aws/EC2NodeClass/default"
            )
        return cls(*parts)


class KarpenterProvider(AdoptsNodes):
    """Keeps the gpuscaler NodePool; Karpenter does the provisioning."""

    name = "karpenter"

    def workers_first(self, request: NodeRequest) -> bool:
        """See :meth:`NodePoolProvider.workers_first`: Karpenter provisions for the pending workers."""
        return True

    def launches_for_workers(self, request: NodeRequest) -> bool:
        """See :meth:`NodePoolProvider.launches_for_workers`: Karpenter's nodes come for the workers."""
        return True

    def __init__(
        self,
        api: Any,
        *,
        node_class: NodeClassRef,
        instance_types: Iterable[str],
        nodepool: str = "gpuscaler",
        gpu_limit: int | None = None,
        taint_key: str = names.GPU_RESOURCE,
        consolidate_after: str = "60s",
        extra_requirements: list[dict[str, Any]] | None = None,
    ) -> None:
        """
        Args:
            api: A ``kubernetes.client.ApiClient`` allowed to manage NodePools and delete NodeClaims.
            node_class: The NodeClass the pool references.
            instance_types: Instance types the pool admits (the catalog's, for this cloud).
            nodepool: Name of the gpuscaler-owned NodePool.
            gpu_limit: ``limits.nvidia.com/gpu`` of the pool (None = no limit).
            taint_key: GPU taint put on the pool's nodes (workers tolerate it).
            consolidate_after: ``disruption.consolidateAfter``: how long an empty node stays.
            extra_requirements: More NodeSelectorRequirements (e.g. zones, architecture).
        """
        self.custom: Any = client.CustomObjectsApi(api)
        self.node_class = node_class
        self.instance_types = sorted(set(instance_types))
        self.nodepool = nodepool
        self.gpu_limit = gpu_limit
        self.taint_key = taint_key
        self.consolidate_after = consolidate_after
        self.extra_requirements = list(extra_requirements or [])

    def admit(self, instance_type: str | None, zone: str = "") -> None:
        """Widen the pool's requirements to admit an instance type and a zone (see :meth:`ensure_nodepool`)."""
        if instance_type and instance_type not in self.instance_types:
            self.instance_types = sorted({*self.instance_types, instance_type})
        if zone:
            self.extra_requirements = [
                {**r, "values": sorted({*r.get("values", []), zone})}
                if r.get("key") == names.ZONE_LABEL and r.get("operator") == "In"
                else r
                for r in self.extra_requirements
            ]

    def manifest(self) -> dict[str, Any]:
        """The NodePool as gpuscaler wants it."""
        spec: dict[str, Any] = {
            "template": {
                "metadata": {"labels": {names.MANAGED_LABEL: "true"}},
                "spec": {
                    "nodeClassRef": {
                        "group": self.node_class.group,
                        "kind": self.node_class.kind,
                        "name": self.node_class.name,
                    },
                    "requirements": [
                        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": self.instance_types},
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(CAPACITY_VALUES)},
                        {"key": JOB_LABEL, "operator": "Exists"},
                        *self.extra_requirements,
                    ],
                    "taints": [{"key": self.taint_key, "effect": "NoSchedule"}],
                    "expireAfter": "Never",
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": self.consolidate_after},
        }
        if self.gpu_limit is not None:
            spec["limits"] = {names.GPU_RESOURCE: str(self.gpu_limit)}
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "NodePool",
            "metadata": {"name": self.nodepool, "labels": dict(MANAGED_BY)},
            "spec": spec,
        }

    def ensure_nodepool(self, instance_type: str | None = None, zone: str = "") -> dict[str, Any]:
        """Create the NodePool, or bring its spec to what gpuscaler wants; returns the server's object.

        The pool admits ``instance_type`` and, when its requirements restrict
        ``topology.kubernetes.io/zone`` (an ``extra_requirements`` entry), ``zone``: the planned
        zone is added to that requirement's values, as a planned instance type is to the pool's
        (a pool without a zone requirement admits every zone of its NodeClass already; the
        workers' node selector then picks the zone).

        Raises:
            ProviderError: the API server refused (e.g. the Karpenter CRDs are not installed), with its cause.
        """
        self.admit(instance_type, zone)
        want = self.manifest()
        try:
            have = self.custom.get_cluster_custom_object(GROUP, VERSION, "nodepools", self.nodepool)
        except ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise ProviderError(
                    f"karpenter: reading NodePool {self.nodepool}, {err.reason}: {err.body}"
                ) from err
            try:
                out: dict[str, Any] = self.custom.create_cluster_custom_object(
                    GROUP, VERSION, "nodepools", want
                )
                return out
            except ApiException as err2:
                raise ProviderError(
                    f"karpenter: creating NodePool {self.nodepool}, {err2.reason}: {err2.body}"
                ) from err2
        if all(have.get("spec", {}).get(k) == v for k, v in want["spec"].items()):
            return dict(have)
        want["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
        want["spec"] = {**have.get("spec", {}), **want["spec"]}
        if self.gpu_limit is None:
            want["spec"].pop("limits", None)
        try:
            out = self.custom.replace_cluster_custom_object(GROUP, VERSION, "nodepools", self.nodepool, want)
        except ApiException as err:
            raise ProviderError(
                f"karpenter: updating NodePool {self.nodepool}, {err.reason}: {err.body}"
            ) from err
        return out

    # ------------------------------------------------------------------ the Protocol

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        """Create or update the NodePool so it admits the request; returns ``[]``.

        Karpenter makes the nodes for the worker pods once the loop has created them.

        Raises:
            ProviderError: the NodePool could not be read or written, with its cause.
        """
        self.ensure_nodepool(request.instance.name, request.zone)
        return []

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        """Delete the NodeClaims behind the job's nodes (Karpenter drains and terminates them)."""
        names = {n.name for n in nodes if not n.deleting}
        if not names:
            return []
        try:
            claims = self.custom.list_cluster_custom_object(
                GROUP, VERSION, "nodeclaims", label_selector=f"{NODEPOOL_LABEL}={self.nodepool}"
            )["items"]
        except ApiException as err:
            raise ProviderError(f"karpenter: listing NodeClaims of {job.key}, {err.reason}") from err
        deleted: list[str] = []
        for claim in claims:
            node = (claim.get("status") or {}).get("nodeName")
            if node not in names:
                continue
            try:
                self.custom.delete_cluster_custom_object(
                    GROUP, VERSION, "nodeclaims", claim["metadata"]["name"]
                )
            except ApiException as err:
                if err.status != HTTP_NOT_FOUND:
                    raise ProviderError(
                        f"karpenter: deleting NodeClaim {claim['metadata']['name']} of node {node} ({job.key}), "
                        f"{err.reason}"
                    ) from err
            deleted.append(node)
        return deleted

    def scheduling(self, request: NodeRequest) -> Scheduling:
        """Pods select the offering, the pool and the job (no API call). Held capacity is
        Karpenter's ``reserved``; on AWS (an ``EC2NodeClass``) the pods also select the
        reservation's id and type (``karpenter.k8s.aws/capacity-reservation-id``/``-type``), which
        the NodeClass's ``capacityReservationSelectorTerms`` must admit (docs/capacity.md).

        Raises:
            ProviderError: flex-start (Karpenter offers none).
        """
        held: dict[str, str] = {}
        if request.capacity in HELD_CAPACITY and self.node_class.group == AWS_NODECLASS_GROUP:
            block = request.capacity is CapacityType.CAPACITY_BLOCK
            held[names.KARPENTER_RESERVATION_TYPE_LABEL] = "capacity-block" if block else "default"
            if request.reservation_id:
                held[names.KARPENTER_RESERVATION_ID_LABEL] = request.reservation_id
        return Scheduling(
            node_selector={
                INSTANCE_TYPE_LABEL: request.instance.name,
                CAPACITY_TYPE_LABEL: karpenter_capacity(request.capacity),
                NODEPOOL_LABEL: self.nodepool,
                JOB_LABEL: request.job.label,
                **request.zone_selector(),
                **held,
            },
            tolerations=[{"key": self.taint_key, "operator": "Exists", "effect": "NoSchedule"}],
        )


def capacity_reservation_selector_terms(pools: Iterable[HeldCapacity]) -> list[dict[str, str]]:
    """The ``EC2NodeClass`` ``spec.capacityReservationSelectorTerms`` that admit the held pools'
    EC2 reservations (reserved and capacity-block pools that name a ``reservationId``).

    Karpenter launches ``reserved`` nodes only into reservations its NodeClass selects (Karpenter
    AWS v1.14.1's CRD: each term an ``id``, or ``tags``/``ownerID``/``instanceMatchCriteria``).
    """
    return [
        {"id": p.reservation_id} for p in pools if p.reservation_id and p.type in ("reserved", "capacityBlock")
    ]
