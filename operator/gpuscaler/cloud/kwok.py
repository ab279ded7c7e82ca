"""The kwok provider: a fake cloud that "launches" GPU nodes as kwok-played Node objects.

Nodes are built by :mod:`gpuscaler.cloud.kwok_nodes` from the catalog row of the instance type
(GPU capacity, cloud labels, GPU taint), labelled ``gpuscaler.io/job=<ns>.<name>`` so scale-down
finds them, annotated with their price, and registered NotReady: kwok makes them Ready after
``kwok_provisioning_delay_s`` (a cloud instance booting). ``kwok_capacity`` caps how many nodes
of an instance type the fake cloud has, to play a capacity shortage. The default provider of the
dev cluster, the e2e tests and the scale benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.cloud.kwok_nodes import GPU_TAINT, label_value, node_manifest
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    InsufficientCapacityError,
    JobRef,
    MakesNodes,
    NodeRequest,
    ProviderError,
    Scheduling,
    node_names,
)
from gpuscaler.kube_create import Creates
from gpuscaler.names import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, JOB_LABEL, PRICE_ANNOTATION

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class KwokProvider(MakesNodes):
    """Creates and deletes fake GPU nodes in a cluster whose kwok manages ``kwok.x-k8s.io/node=fake``."""

    name = "kwok"

    def __init__(
        self,
        api: Any,
        *,
        provisioning_delay_s: float = 2.0,
        capacity: Mapping[str, int] | None = None,
        toleration_key: str = GPU_TAINT["key"],
    ) -> None:
        """
        Args:
            api: A ``kubernetes.client.ApiClient`` (or ``CoreV1Api``) allowed to create and delete nodes.
            provisioning_delay_s: Seconds a node stays NotReady after it is created.
            capacity: Instance type -> most nodes of it in the fake cloud (unlisted: unlimited).
            toleration_key: Taint key of the GPU nodes that workers tolerate.
        """
        self.core: Any = api if isinstance(api, client.CoreV1Api) else client.CoreV1Api(api)
        self.creates: Any = Creates(self.core.api_client)
        """Nodes are created without the client's typed models (:mod:`gpuscaler.kube_create`)."""
        self.delay = provisioning_delay_s
        self.capacity = dict(capacity or {})
        self.toleration_key = toleration_key

    def _available(self, request: NodeRequest, mine: int) -> int:
        """How many more nodes of the request's instance type the fake cloud can give this job."""
        limit = self.capacity.get(request.instance.name)
        if limit is None:
            return request.count
        try:
            used = self.core.list_node(
                label_selector=f"{INSTANCE_TYPE_LABEL}={label_value(request.instance.name)},{JOB_LABEL}"
            ).items
        except ApiException as err:
            raise ProviderError(f"kwok: listing {request.instance.name} nodes, {err.reason}") from err
        return max(0, min(request.count, limit - len(used) + mine))

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        have = {n.name for n in existing}
        wanted = node_names(request)
        missing = [n for n in wanted if n not in have]
        if not missing:
            return []
        allowed = self._available(request, len([n for n in wanted if n in have]))
        can_make = max(0, allowed - (len(wanted) - len(missing)))
        created: list[str] = []
        for name in missing[:can_make]:
            body = node_manifest(
                name,
                f"gpuscaler-{request.pool_id}",
                request.instance,
                capacity_type=request.capacity,
                zone=request.zone or None,
                ready_after=self.delay,
                labels={JOB_LABEL: request.job.label, **request.held_labels()},
                annotations={PRICE_ANNOTATION: f"{request.usd_per_hour_per_node:.6g}"},
            )
            try:
                self.creates.create_node(body)
                created.append(name)
            except ApiException as err:
                if err.status == HTTP_CONFLICT:
                    continue  # made before a restart: create-if-absent
                raise ProviderError(f"kwok: creating node {name} for {request.job.key}, {err.reason}") from err
        if can_make < len(missing):
            short = len(missing) - can_make
            raise InsufficientCapacityError(
                f"kwok: {short} of {request.count} {request.instance.name} ({request.capacity.value}) nodes "
                f"unavailable: the fake cloud holds {self.capacity.get(request.instance.name)}"
            )
        return created

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        deleted: list[str] = []
        for n in nodes:
            if n.deleting:
                continue
            try:
                self.core.delete_node(n.name)
                deleted.append(n.name)
            except ApiException as err:
                if err.status == HTTP_NOT_FOUND:
                    continue
                raise ProviderError(f"kwok: deleting node {n.name} of {job.key}, {err.reason}") from err
        return deleted

    def scheduling(self, request: NodeRequest) -> Scheduling:
        return Scheduling(
            node_selector={
                INSTANCE_TYPE_LABEL: label_value(request.instance.name),
                CAPACITY_TYPE_LABEL: request.capacity.value,
                JOB_LABEL: request.job.label,
                **request.zone_selector(),
            },
            tolerations=[{"key": self.toleration_key, "operator": "Exists", "effect": "NoSchedule"}],
        )
