"""Kueue and JobSet objects of a TrainingJob's gang through the API server (the loop's
:class:`gpuscaler.controller.queueing.GangClient`).

Creates are create-if-absent (409 is success), deletes delete-if-present (404 is success) and
foreground (a JobSet's Jobs and pods go first); errors are :class:`gpuscaler.kube.client.KubeError`
with what was being done. RBAC: ``jobset.enabled`` and ``kueue.enabled`` in the Helm chart.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.kube import jobset as js
from gpuscaler.kube import kueue
from gpuscaler.kube.client import HTTP_CONFLICT, HTTP_FORBIDDEN, HTTP_NOT_FOUND, KubeError, unless_done
from gpuscaler.names import JOB_LABEL


class Gangs:
    """JobSets (create, delete) and Kueue Workloads and ResourceFlavors (read)."""

    def __init__(self, api: Any) -> None:
        self.custom: Any = client.CustomObjectsApi(api)

    def create_jobset(self, body: dict[str, Any]) -> bool:
        """Create a JobSet; False when it already existed."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        return unless_done(
            f"creating JobSet {ns}/{name}",
            lambda: self.custom.create_namespaced_custom_object(js.GROUP, js.VERSION, ns, js.PLURAL, body),
            HTTP_CONFLICT,
            with_body=True,
        )

    def delete_jobset(self, namespace: str, name: str) -> bool:
        """Delete a JobSet in the foreground (its Jobs and pods first); False when already gone."""
        return unless_done(
            f"deleting JobSet {namespace}/{name}",
            lambda: self.custom.delete_namespaced_custom_object(
                js.GROUP, js.VERSION, namespace, js.PLURAL, name, propagation_policy="Foreground"
            ),
            HTTP_NOT_FOUND,
        )

    def delete_jobsets_of(self, namespace: str, job_label: str) -> list[str]:
        """Delete every JobSet of a job (by its ``gpuscaler.io/job`` label: all attempts); their names.

        A cluster without the JobSet CRD (404), or an operator without ``jobset.enabled`` (403: it
        cannot have made any), has none: an empty list, so a job's deletion never waits on JobSets.
        """
        try:
            items = self.custom.list_namespaced_custom_object(
                js.GROUP, js.VERSION, namespace, js.PLURAL, label_selector=f"{JOB_LABEL}={job_label}"
            )["items"]
        except ApiException as err:
            if err.status in (HTTP_NOT_FOUND, HTTP_FORBIDDEN):
                return []
            raise KubeError(f"listing JobSets in {namespace}, {err.status} {err.reason}", err.status) from err
        names = [str(b["metadata"]["name"]) for b in items]
        return [n for n in names if self.delete_jobset(namespace, n)]

    def workload_of(self, namespace: str, owner_kind: str, owner_name: str) -> kueue.WorkloadState | None:
        """The Kueue Workload owned by the ``owner_kind`` ``owner_name`` (Kueue names it with a hash)."""
        try:
            items = self.custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, namespace, kueue.WORKLOADS)["items"]
        except ApiException as err:
            raise KubeError(f"listing Kueue Workloads in {namespace}, {err.status} {err.reason}", err.status) from err
        for w in items:
            owners = (w.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("kind") == owner_kind and o.get("name") == owner_name for o in owners):
                return kueue.workload_state(w)
        return None

    def flavors(self) -> list[kueue.Flavor]:
        """Every ResourceFlavor (cluster-scoped)."""
        try:
            items = self.custom.list_cluster_custom_object(kueue.GROUP, kueue.VERSION, kueue.RESOURCE_FLAVORS)["items"]
        except ApiException as err:
            raise KubeError(f"listing Kueue ResourceFlavors, {err.status} {err.reason}", err.status) from err
        return [kueue.Flavor.from_object(f) for f in items]
