"""Creates through the Kubernetes client without its typed models: the operator's worker pods
(:class:`gpuscaler.kube.client.Workers`) and the kwok provider's nodes
(:class:`gpuscaler.cloud.kwok.KwokProvider`), one of each per job.

The client's typed methods (``CoreV1Api.create_namespaced_pod``, ``create_node``) validate the
manifest, a plain dict here, into the client's pydantic models, serialize those back to a dict, send
it, and decode the created object the API server returns into models again, which the operator never
reads. :func:`create` sends the manifest as JSON through the same ``ApiClient`` (its host, TLS,
credentials and User-Agent) and reads only the answer's status. Measured
(``benchmarks/kube_create.py``, CPU of the calling thread, answers as the dev cluster's API server
stores the objects): a worker pod 1.12 -> 0.57 ms, a kwok node 0.67 -> 0.51 ms. In a 200-job run of
``benchmarks/operator_scale.py`` (``py-spy record --gil`` on the operator), the two creates'
decoding and request building were 12% of the samples (6.8% and 4.8%), 3.1% and 2.4% after.

Outside the layers of ``pyproject.toml`` (kube/ and cloud/ are independent and both use it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

JSON = "application/json"


def create(api: Any, path: str, body: Mapping[str, Any], **path_params: str) -> None:
    """POST a manifest and check the answer's status, without decoding the created object.

    Args:
        api: A ``kubernetes.client.ApiClient``.
        path: The collection's path, ``{name}`` placeholders filled (URL-quoted) from ``path_params``
            (``/api/v1/namespaces/{namespace}/pods``).
        body: The manifest (JSON-ready: strings, numbers, booleans, lists and dicts).
        path_params: The placeholders' values.

    Raises:
        ApiException: an answer outside 2xx, as the typed methods raise it (``status``, ``reason``,
            ``body`` the API server's Status); the client's own errors when it was not reached.
    """
    method, url, headers, data, post = api.param_serialize(
        method="POST",
        resource_path=path,
        path_params=path_params,
        header_params={"Content-Type": JSON, "Accept": JSON},
        body=dict(body),
        auth_settings=["BearerToken"],
    )
    answer = api.call_api(method, url, header_params=headers, body=data, post_params=post)
    answer.read()
    if not 200 <= answer.status <= 299:
        raise ApiException.from_response(http_resp=answer, body=None, data=None)


class Creates:
    """The two creates the operator makes per job, by :func:`create`, named as ``CoreV1Api``'s."""

    def __init__(self, api: Any) -> None:
        """``api``: a ``kubernetes.client.ApiClient``."""
        self.api = api

    def create_namespaced_pod(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a pod (``POST /api/v1/namespaces/{namespace}/pods``)."""
        create(self.api, "/api/v1/namespaces/{namespace}/pods", body, namespace=namespace)

    def create_node(self, body: Mapping[str, Any]) -> None:
        """Create a node (``POST /api/v1/nodes``)."""
        create(self.api, "/api/v1/nodes", body)
