"""Adopting nodes that a cloud node group registered on its own (EKS, GKE, Cluster API).

Real node groups launch instances whose kubelets register Node objects with the group's labels;
the provider never creates a Node and does not know the names in advance. The reconcile loop,
however, finds a job's nodes by :data:`~gpuscaler.cloud.provider.JOB_LABEL`. So providers that
scale shared node groups *adopt* free nodes: a node of the group without a job label gets this
job's label and price annotation (an optimistic-concurrency patch: two adopters never claim one
node), and loses them again on release. Worker pods select the job label, so a node serves one job.

Called by :mod:`gpuscaler.cloud.eks`, :mod:`gpuscaler.cloud.gke` and
:mod:`gpuscaler.cloud.clusterapi`.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.cloud.provider import (
    NodeRequest,
    ProviderError,
)
from gpuscaler.names import JOB_LABEL, PRICE_ANNOTATION

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
CLAIM_ATTEMPTS = 5
"""Tries to label a free node whose resourceVersion keeps moving before leaving it for the next reconcile."""


def core_api(api: Any) -> Any:
    """A ``CoreV1Api`` from an ``ApiClient`` (or the ``CoreV1Api`` itself)."""
    return api if isinstance(api, client.CoreV1Api) else client.CoreV1Api(api)


class NodeAdopter:
    """Labels free nodes of a node group with a job, and unlabels them on release."""

    def __init__(self, core: Any) -> None:
        """
        Args:
            core: A ``CoreV1Api`` allowed to list and patch nodes.
        """
        self.core = core

    def group_nodes(self, selector: str) -> list[Any]:
        """The group's Node objects (``V1Node``) not being deleted.

        Raises:
            ProviderError: listing failed, with its cause.
        """
        try:
            items = self.core.list_node(label_selector=selector).items
        except ApiException as err:
            raise ProviderError(f"listing nodes {selector!r}, {err.reason}") from err
        return [n for n in items if not n.metadata.deletion_timestamp]

    def adopt(self, request: NodeRequest, selector: str, have: int) -> list[str]:
        """Give free nodes of the group to the request's job until it holds ``request.count``.

        Args:
            request: The job and node count.
            selector: Label selector of the node group's nodes.
            have: Nodes the job holds already.

        Returns:
            The names adopted now.
        """
        adopted: list[str] = []
        for node in self.group_nodes(selector):
            if have + len(adopted) >= request.count:
                break
            if self._claim(node, request):
                adopted.append(node.metadata.name)
        return adopted

    def _claim(self, node: Any, request: NodeRequest, attempts: int = CLAIM_ATTEMPTS) -> bool:
        """Label one node with the request's job unless another job holds it.

        A conflict (409) only says the node changed since it was read (the node lifecycle
        controller updates new nodes' taints and conditions right after they register), so the
        node is read again and the claim retried while it is still free.
        """
        for _ in range(attempts):
            if (node.metadata.labels or {}).get(JOB_LABEL):
                return False
            body = {
                "metadata": {
                    "resourceVersion": node.metadata.resource_version,
                    "labels": {JOB_LABEL: request.job.label},
                    "annotations": {PRICE_ANNOTATION: f"{request.usd_per_hour_per_node:.6g}"},
                }
            }
            try:
                self.core.patch_node(node.metadata.name, body)
                return True
            except ApiException as err:
                if err.status == HTTP_NOT_FOUND:
                    return False
                if err.status != HTTP_CONFLICT:
                    raise ProviderError(
                        f"adopting node {node.metadata.name} for {request.job.key}, {err.reason}"
                    ) from err
            try:
                node = self.core.read_node(node.metadata.name)
            except ApiException as err:
                if err.status == HTTP_NOT_FOUND:
                    return False
                raise ProviderError(f"reading node {node.metadata.name}, {err.reason}") from err
        return False

    def free_count(self, selector: str) -> int:
        """Nodes of the group that no job holds."""
        return sum(1 for n in self.group_nodes(selector) if not (n.metadata.labels or {}).get(JOB_LABEL))

    def disown(self, names: list[str]) -> None:
        """Remove the job label and price from nodes (gone nodes are fine)."""
        for name in names:
            body = {"metadata": {"labels": {JOB_LABEL: None}, "annotations": {PRICE_ANNOTATION: None}}}
            try:
                self.core.patch_node(name, body)
            except ApiException as err:
                if err.status == HTTP_NOT_FOUND:
                    continue
                raise ProviderError(f"releasing node {name}, {err.reason}") from err
