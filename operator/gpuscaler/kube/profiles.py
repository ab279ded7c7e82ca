"""PerformanceProfile objects through the API server: list, read, write, delete.

Used by the operator's recorder (:class:`gpuscaler.controller.profiles.Recorder`, through its
``ProfileApi`` protocol) and by ``gpuscaler profiles`` (:mod:`gpuscaler.profiles_cli`). Errors are
:class:`~gpuscaler.kube.client.KubeError` with what was being done; a 404 on read is None.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.api.profile import PLURAL
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION
from gpuscaler.kube.client import HTTP_CONFLICT, HTTP_NOT_FOUND, KubeError


class Profiles:
    """PerformanceProfile objects (namespaced)."""

    def __init__(self, api: Any) -> None:
        self.custom: Any = client.CustomObjectsApi(api)

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        """Every profile of a namespace (all namespaces when None)."""
        try:
            if namespace is None:
                got = self.custom.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)
            else:
                got = self.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)
        except ApiException as err:
            where = f"in {namespace}" if namespace else "in all namespaces"
            raise KubeError(f"listing PerformanceProfiles {where}, {err.status} {err.reason}", err.status) from err
        items: list[dict[str, Any]] = list(got.get("items") or [])
        return items

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One profile, or None when there is none of that name."""
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return None
            raise KubeError(f"reading PerformanceProfile {namespace}/{name}, {err.status} {err.reason}", err.status) from err
        return obj

    def put(self, namespace: str, body: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        """Create the profile, or replace it (guarded by ``resource_version`` when given).

        Raises:
            KubeError: refused; 409 (``retriable``) when it changed since ``resource_version`` was read
                or was created meanwhile.
        """
        name = body["metadata"]["name"]
        try:
            if resource_version is None:
                obj: dict[str, Any] = self.custom.create_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, PLURAL, body
                )
            else:
                meta = {**body["metadata"], "resourceVersion": resource_version}
                obj = self.custom.replace_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, PLURAL, name, {**body, "metadata": meta}
                )
        except ApiException as err:
            raise KubeError(
                f"writing PerformanceProfile {namespace}/{name}, {err.status} {err.reason}",
                err.status,
                retry=err.status == HTTP_CONFLICT,
            ) from err
        return obj

    def delete(self, namespace: str, name: str) -> bool:
        """Delete a profile; False when it was already gone."""
        try:
            self.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return False
            raise KubeError(f"deleting PerformanceProfile {namespace}/{name}, {err.status} {err.reason}", err.status) from err
        return True
