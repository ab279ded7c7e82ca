"""gpuscaler.kube_create: pods and nodes created without the client's typed models, by the real
Kubernetes client (its ApiClient: host, credentials, User-Agent) against a loopback HTTP server that
answers as the API server does."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.kube.client import KubeError, Workers
from gpuscaler.kube_create import Creates

CONFLICT = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409,
            "message": 'pods "j-worker-0" already exists'}  # fmt: skip


@contextmanager
def api_server(status: int, answer: dict[str, Any]) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """An ApiClient against a loopback server that answers every POST with ``status`` and ``answer``;
    the requests it got (method, path, headers, JSON body)."""
    got: list[dict[str, Any]] = []

    class Handle(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            got.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": json.loads(raw)})
            out = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    config.api_key = {"BearerToken": "Bearer t0ken"}
    api = client.ApiClient(config)
    api.user_agent = "gpuscaler-operator/test"
    try:
        yield api, got
    finally:
        server.shutdown()
        api.close()


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j-worker-0", "namespace": "team a"},
       "spec": {"containers": [{"name": "train", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}  # fmt: skip


def test_a_pod_is_posted_as_built_with_the_clients_credentials_and_agent() -> None:
    with api_server(201, {**POD, "metadata": {**POD["metadata"], "uid": "u1"}}) as (api, got):
        assert Creates(api).create_namespaced_pod("team a", POD) is None  # the answer is not decoded
    (req,) = got
    assert req["path"] == "/api/v1/namespaces/team%20a/pods"  # the namespace URL-quoted
    assert req["body"] == POD  # sent as built: no field added, renamed or dropped
    assert req["headers"]["authorization"] == "Bearer t0ken"
    assert req["headers"]["user-agent"] == "gpuscaler-operator/test"
    assert req["headers"]["content-type"] == "application/json"


def test_a_node_is_posted_to_the_cluster_scope() -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "b"}}}
    with api_server(201, node) as (api, got):
        Creates(api).create_node(node)
    assert [(r["path"], r["body"]) for r in got] == [("/api/v1/nodes", node)]


def test_a_refusal_is_the_clients_api_exception_with_the_servers_status() -> None:
    with api_server(409, CONFLICT) as (api, _), pytest.raises(ApiException) as err:
        Creates(api).create_namespaced_pod("team a", POD)
    assert err.value.status == 409 and err.value.reason == "Conflict"
    assert "already exists" in str(err.value.body)


def test_workers_take_a_conflict_as_created_before_and_report_other_refusals() -> None:
    with api_server(409, CONFLICT) as (api, got):
        assert Workers(api).create_if_absent(POD) is False  # create-if-absent: it exists from before
    assert len(got) == 1
    forbidden = {**CONFLICT, "code": 403, "reason": "Forbidden", "message": "error looking up service account"}
    with api_server(403, forbidden) as (api, _), pytest.raises(KubeError, match="403 Forbidden") as err:
        Workers(api).create_if_absent(POD)
    assert err.value.retriable  # the workers' account is made again by the next step
