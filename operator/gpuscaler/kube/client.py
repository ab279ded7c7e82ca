"""Create and delete the objects of a TrainingJob through the API server, idempotently.

Every create is create-if-absent (409 Conflict is success: the object exists from before a
restart) and every delete is delete-if-present (404 is success). Errors are
:class:`KubeError` wrapping the ``ApiException``, with what was being done in the message.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.errors import ErrorKind, GpuscalerError

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class KubeError(GpuscalerError, RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached).

    Its kind is ``TEMPORARY`` when the call may succeed later (no answer, 429, 5xx), else
    ``INVALID_INPUT``: a 4xx the API server will answer the same way again.
    """

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.kind = ErrorKind.TEMPORARY if self.retriable else ErrorKind.INVALID_INPUT

    @property
    def retriable(self) -> bool:
        return self.status in {0, 429} or self.status >= 500


def load_config() -> Any:
    """An ``ApiClient`` from the in-cluster service account or else ``$KUBECONFIG``/``~/.kube/config``."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class Workers:
    """Worker pods and Services of jobs, and the workers' ServiceAccount, Role and RoleBinding."""

    def __init__(self, api: Any) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.rbac: Any = client.RbacAuthorizationV1Api(api)

    def create_if_absent(self, body: dict[str, Any]) -> bool:
        """Create a Pod, Service, ServiceAccount, Role or RoleBinding; False when it already existed."""
        ns = body["metadata"]["namespace"]
        name = body["metadata"]["name"]
        kind = body["kind"]
        try:
            if kind == "Pod":
                self.core.create_namespaced_pod(ns, body)
            elif kind == "Service":
                self.core.create_namespaced_service(ns, body)
            elif kind == "ServiceAccount":
                self.core.create_namespaced_service_account(ns, body)
            elif kind == "Role":
                self.rbac.create_namespaced_role(ns, body)
            elif kind == "RoleBinding":
                self.rbac.create_namespaced_role_binding(ns, body)
            else:
                raise ValueError(f"create_if_absent: kind {kind} not handled")
        except ApiException as err:
            if err.status == HTTP_CONFLICT:
                return False
            raise KubeError(f"creating {kind} {ns}/{name}, {err.status} {err.reason}", err.status) from err
        return True

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod at once (grace 0: a worker of a released gang); False when already gone."""
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return False
            raise KubeError(f"deleting Pod {namespace}/{name}, {err.status} {err.reason}", err.status) from err
        return True

    def delete_service(self, namespace: str, name: str) -> bool:
        """Delete a Service; False when already gone."""
        try:
            self.core.delete_namespaced_service(name, namespace)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return False
            raise KubeError(
                f"deleting Service {namespace}/{name}, {err.status} {err.reason}", err.status
            ) from err
        return True

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge annotations into a pod (the checkpoint request)."""
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return
            raise KubeError(f"annotating Pod {namespace}/{name}, {err.status} {err.reason}", err.status) from err
