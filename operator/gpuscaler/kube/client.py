"""Create and delete the objects of a TrainingJob through the API server, idempotently.

Every create is create-if-absent (409 Conflict is success: the object exists from before a
restart) and every delete is delete-if-present (404 is success). Errors are
:class:`KubeError` wrapping the ``ApiException``, with what was being done in the message.

The workers' ServiceAccount, Role and RoleBinding are shared by every job of a namespace, so
:class:`Workers` remembers the ones it created or found, for :data:`SHARED_RECHECK_S`, and does not
send them again meanwhile: without that each job's gang start cost three POSTs, all but the first
namespace's answered 409 Conflict. Steps running at once on several threads send each of them once:
the others wait for that answer. A pod the API server refuses because its ServiceAccount is
missing (someone deleted it) makes it forget the namespace's, so the next step creates them again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, PLURAL
from gpuscaler.errors import ErrorKind, GpuscalerError
from gpuscaler.kube_create import Creates

HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
SHARED_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding"})
"""Kinds of the workers' identity, one of each per namespace for all its jobs."""
SHARED_RECHECK_S = 600.0
"""Seconds a shared object created or found is taken to be there without asking the API server
(an object deleted behind the operator's back is made again within this; at most three POSTs per
namespace per period, against three per job without it)."""


class KubeError(GpuscalerError, RuntimeError):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached).

    Its kind is ``TEMPORARY`` when the call may succeed later (no answer, 429, 5xx), else
    ``INVALID_INPUT``: a 4xx the API server will answer the same way again.
    """

    def __init__(self, message: str, status: int = 0, *, retry: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self._retry = retry
        self.kind = ErrorKind.TEMPORARY if self.retriable else ErrorKind.INVALID_INPUT

    @property
    def retriable(self) -> bool:
        """Whether the same call may succeed later (server unreachable, throttled, 5xx, or marked so)."""
        return self._retry or self.status in {0, 429} or self.status >= 500


def load_config() -> Any:
    """An ``ApiClient`` from the in-cluster service account or else ``$KUBECONFIG``/``~/.kube/config``."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def unless_done(doing: str, call: Callable[[], object], done: int, *, with_body: bool = False) -> bool:
    """Send an idempotent create or delete: the ``done`` answer (409 to a create, 404 to a delete
    or patch) means the object is already as asked.

    Args:
        doing: What the call does, for the error (``deleting Pod ns/name``).
        call: The API call.
        done: The HTTP status that means it was done before.
        with_body: Add the API server's answer to the error (a webhook's reason for refusing).

    Returns:
        True when this call did it, False when it was done before.

    Raises:
        KubeError: any other failure, with ``doing`` and the status.
    """
    try:
        call()
    except ApiException as err:
        if err.status == done:
            return False
        detail = f": {err.body}" if with_body else ""
        raise KubeError(f"{doing}, {err.status} {err.reason}{detail}", err.status) from err
    return True


class Workers:
    """Worker pods and Services of jobs, and the workers' ServiceAccount, Role and RoleBinding."""

    def __init__(self, api: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.rbac: Any = client.RbacAuthorizationV1Api(api)
        self.creates: Any = Creates(api)
        """Pods are created without the client's typed models (:mod:`gpuscaler.kube_create`)."""
        self.clock = clock
        self._shared: dict[tuple[str, str, str], float] = {}
        """(kind, namespace, name) of shared objects known to exist -> when that was learnt."""
        self._sending: dict[tuple[str, str, str], threading.Lock] = {}
        """A lock per shared object: steps of a namespace's jobs on several threads send it once."""
        self._lock = threading.Lock()

    def _known(self, key: tuple[str, str, str]) -> bool:
        with self._lock:
            seen = self._shared.get(key)
            return seen is not None and self.clock() - seen < SHARED_RECHECK_S

    def _learn(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._shared[key] = self.clock()

    def forget_shared(self, namespace: str) -> None:
        """Forget the shared objects of a namespace: the next create sends them again."""
        with self._lock:
            for key in [k for k in self._shared if k[1] == namespace]:
                del self._shared[key]

    def create_if_absent(self, body: dict[str, Any]) -> bool:
        """Create a Pod, Service, ServiceAccount, Role or RoleBinding; False when it already existed.

        A shared object (:data:`SHARED_KINDS`) known to exist is not sent again (False).

        Raises:
            KubeError: the API server refused or was not reached; a pod refused for a missing
                ServiceAccount is retriable (the shared objects are forgotten and made again).
            ValueError: a kind this client does not create.
        """
        kind = body["kind"]
        key = (kind, body["metadata"]["namespace"], body["metadata"]["name"])
        if kind not in SHARED_KINDS:
            return self._create(key, body)
        with self._lock:
            sending = self._sending.setdefault(key, threading.Lock())
        with sending:  # one step sends it; the others of the namespace wait and then know it is there
            if self._known(key):
                return False
            return self._create(key, body)

    def _create(self, key: tuple[str, str, str], body: dict[str, Any]) -> bool:
        kind, ns, name = key
        shared = kind in SHARED_KINDS
        try:
            if kind == "Pod":
                self.creates.create_namespaced_pod(ns, body)
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
                if shared:
                    self._learn(key)
                return False
            lost_account = kind == "Pod" and err.status == HTTP_FORBIDDEN and "service account" in str(err.body)
            if lost_account:
                self.forget_shared(ns)
            raise KubeError(
                f"creating {kind} {ns}/{name}, {err.status} {err.reason}", err.status, retry=lost_account
            ) from err
        if shared:
            self._learn(key)
        return True

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod at once (grace 0: a worker of a released gang); False when already gone."""
        return unless_done(
            f"deleting Pod {namespace}/{name}",
            lambda: self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0),
            HTTP_NOT_FOUND,
        )

    def delete_service(self, namespace: str, name: str) -> bool:
        """Delete a Service; False when already gone."""
        return unless_done(
            f"deleting Service {namespace}/{name}",
            lambda: self.core.delete_namespaced_service(name, namespace),
            HTTP_NOT_FOUND,
        )

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge annotations into a pod (the checkpoint request, the preemption cost); None removes a key."""
        patch = {"metadata": {"annotations": dict(annotations)}}
        unless_done(
            f"annotating Pod {namespace}/{name}",
            lambda: self.core.patch_namespaced_pod(name, namespace, patch),
            HTTP_NOT_FOUND,
        )


class TrainingJobs:
    """Status writes of TrainingJobs: the reconcile daemon patches them itself (kopf applies a
    handler's ``patch`` only when the handler returns, and a daemon does not return)."""

    def __init__(self, api: Any) -> None:
        self.custom: Any = client.CustomObjectsApi(api)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> str:
        """Merge-patch the status subresource (a None value removes a field).

        Returns:
            The resourceVersion the write made.

        Raises:
            KubeError: the API server refused or was not reached (404: the job is gone).
        """
        try:
            obj = self.custom.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, namespace, PLURAL, name, {"status": status}
            )
        except ApiException as err:
            raise KubeError(
                f"patching the status of TrainingJob {namespace}/{name}, {err.status} {err.reason}", err.status
            ) from err
        return str((obj.get("metadata") or {}).get("resourceVersion") or "")
