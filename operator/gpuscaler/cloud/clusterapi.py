"""The clusterapi provider: scale Cluster API ``MachineDeployment`` objects through their scale subresource.

One MachineDeployment per offering, found by its labels ``gpuscaler.io/instance-type=<type>`` and
``gpuscaler.io/capacity-type=<on-demand|spot>`` in the configured namespace (and, if set, with
``spec.clusterName`` of the configured cluster). Scaling writes ``spec.replicas`` through the
``scale`` subresource (``cluster.x-k8s.io/v1beta2``, the served storage version of Cluster API
v1.11+; v1beta1 is served too). The infrastructure provider creates the machines; their nodes
register on their own and are *adopted* (:mod:`gpuscaler.cloud.adoption`). A node's selector is
the MachineDeployment's annotation ``gpuscaler.io/node-selector`` (``k=v,k=v``), by default
``node.kubernetes.io/instance-type=<type>,karpenter.sh/capacity-type=<capacity>``: the bootstrap
config must set that label (e.g. kubelet ``--node-labels``).

Scale-down is targeted: the released nodes' Machines (node annotation ``cluster.x-k8s.io/machine``)
get ``cluster.x-k8s.io/delete-machine`` so the MachineSet removes exactly them, then replicas go
down by as many. RBAC is in ``docs/providers.md``.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler import names
from gpuscaler.cloud.adoption import NodeAdopter, core_api
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    AdoptsNodes,
    JobRef,
    NodeRequest,
    ProviderError,
    Scheduling,
)
from gpuscaler.names import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, JOB_LABEL

GROUP = "cluster.x-k8s.io"
VERSION = "v1beta2"
PLURAL = "machinedeployments"
INSTANCE_LABEL = names.INSTANCE_TYPE_KEY
CAPACITY_LABEL = names.CAPACITY_TYPE_KEY
NODE_SELECTOR_ANNOTATION = names.NODE_SELECTOR_ANNOTATION
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
"""On nodes: the name of their Machine (set by Cluster API)."""
DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
"""On Machines: delete this one first when the MachineSet scales down."""
HTTP_NOT_FOUND = 404


class ClusterApiProvider(AdoptsNodes):
    """Scales MachineDeployments; adopts the nodes their machines register."""

    name = "clusterapi"

    def __init__(
        self,
        api: Any,
        *,
        namespace: str = "default",
        cluster: str | None = None,
        toleration_key: str = names.GPU_RESOURCE,
        version: str = VERSION,
    ) -> None:
        """
        Args:
            api: A ``kubernetes.client.ApiClient`` of the cluster holding the MachineDeployments (the
                management cluster) whose nodes are also its workers (a self-managed cluster).
            namespace: Namespace of the MachineDeployments.
            cluster: Only MachineDeployments of this Cluster (``spec.clusterName``); None = any.
            toleration_key: GPU taint key the workers tolerate.
            version: ``cluster.x-k8s.io`` API version to use.
        """
        self.custom: Any = client.CustomObjectsApi(api)
        self.adopter = NodeAdopter(core_api(api))
        self.namespace = namespace
        self.cluster = cluster
        self.toleration_key = toleration_key
        self.version = version

    def find(self, instance: str, capacity: str) -> dict[str, Any] | None:
        """The MachineDeployment serving an offering, or None.

        Raises:
            ProviderError: listing failed (e.g. the Cluster API CRDs are missing), with its cause.
        """
        try:
            items = self.custom.list_namespaced_custom_object(
                GROUP,
                self.version,
                self.namespace,
                PLURAL,
                label_selector=f"{INSTANCE_LABEL}={instance},{CAPACITY_LABEL}={capacity}",
            )["items"]
        except ApiException as err:
            raise ProviderError(
                f"clusterapi: listing MachineDeployments in {self.namespace}, {err.reason}"
            ) from err
        for md in items:
            if self.cluster is None or md.get("spec", {}).get("clusterName") == self.cluster:
                return dict(md)
        return None

    @staticmethod
    def node_selector(md: dict[str, Any]) -> str:
        labels = md["metadata"].get("labels") or {}
        default = f"{INSTANCE_TYPE_LABEL}={labels.get(INSTANCE_LABEL)},{CAPACITY_TYPE_LABEL}={labels.get(CAPACITY_LABEL)}"
        return str((md["metadata"].get("annotations") or {}).get(NODE_SELECTOR_ANNOTATION, default))

    def replicas(self, name: str) -> int:
        """``spec.replicas`` as the scale subresource reports it."""
        try:
            scale = self.custom.get_namespaced_custom_object_scale(
                GROUP, self.version, self.namespace, PLURAL, name
            )
        except ApiException as err:
            raise ProviderError(
                f"clusterapi: reading scale of MachineDeployment {name}, {err.reason}"
            ) from err
        return int((scale.get("spec") or {}).get("replicas") or 0)

    def scale(self, name: str, replicas: int, why: str) -> None:
        """Set ``spec.replicas`` through the scale subresource."""
        try:
            self.custom.patch_namespaced_custom_object_scale(
                GROUP, self.version, self.namespace, PLURAL, name, {"spec": {"replicas": replicas}}
            )
        except ApiException as err:
            raise ProviderError(
                f"clusterapi: scaling MachineDeployment {self.namespace}/{name} to {replicas} ({why}), "
                f"{err.reason}: {err.body}"
            ) from err

    # ------------------------------------------------------------------ the Protocol

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        inst, cap = request.instance.name, request.capacity.value
        md = self.find(inst, cap)
        if md is None:
            raise ProviderError(
                f"clusterapi: no MachineDeployment in {self.namespace} labelled {INSTANCE_LABEL}={inst}, "
                f"{CAPACITY_LABEL}={cap}; create one per offering (docs/providers.md)"
            )
        name = md["metadata"]["name"]
        selector = self.node_selector(md)
        have = sum(1 for n in existing if not n.deleting)
        adopted = self.adopter.adopt(request, selector, have)
        missing = request.count - have - len(adopted)
        if missing <= 0:
            return adopted
        replicas = self.replicas(name)
        launching = max(0, replicas - len(self.adopter.group_nodes(selector)))
        if missing > launching:
            self.scale(name, replicas + missing - launching, f"{request.count} for {request.job.key}")
        return adopted

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        """Mark the nodes' Machines for deletion, lower replicas, free the nodes."""
        names = {n.name for n in nodes if not n.deleting}
        by_md: dict[str, list[Any]] = {}
        for n in nodes:
            if n.name not in names:
                continue
            md = self.find(n.instance_type, n.capacity_type)
            if md is not None:
                by_md.setdefault(md["metadata"]["name"], []).append(n.name)
        held = {n.metadata.name: n for n in self.adopter.group_nodes(f"{JOB_LABEL}={job.label}")}
        released: list[str] = []
        for md_name, node_names in by_md.items():
            for node_name in node_names:
                node = held.get(node_name)
                machine = (node.metadata.annotations or {}).get(MACHINE_ANNOTATION) if node else None
                if machine:
                    self._mark_for_deletion(machine)
            replicas = self.replicas(md_name)
            self.scale(md_name, max(0, replicas - len(node_names)), f"release {len(node_names)} of {job.key}")
            self.adopter.disown(node_names)
            released += node_names
        return released

    def _mark_for_deletion(self, machine: str) -> None:
        body = {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "yes"}}}
        try:
            self.custom.patch_namespaced_custom_object(
                GROUP, self.version, self.namespace, "machines", machine, body
            )
        except ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise ProviderError(
                    f"clusterapi: marking Machine {machine} for deletion, {err.reason}"
                ) from err

    def scheduling(self, request: NodeRequest) -> Scheduling:
        return Scheduling(
            node_selector={
                INSTANCE_TYPE_LABEL: request.instance.name,
                CAPACITY_TYPE_LABEL: request.capacity.value,
                JOB_LABEL: request.job.label,
            },
            tolerations=[{"key": self.toleration_key, "operator": "Exists", "effect": "NoSchedule"}],
        )
