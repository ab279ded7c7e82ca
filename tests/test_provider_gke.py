"""The gke provider's REST contract: the real ``ClusterManagerClient`` (REST transport) against a stub server.

The stub answers with the documented shapes of the GKE v1 REST API (NodePool, Operation) and
records every request, so the test checks the paths and bodies the client sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.container_v1 import ClusterManagerClient

from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JOB_LABEL, InsufficientCapacityError, JobRef, NodeRequest, ProviderError
from gpuscaler.cloud.gke import GkeProvider
from loop_harness import FakeCore

CAT = load_catalog()
JOB = JobRef("ml", "llm")
CLUSTER = "/v1/projects/p1/locations/us-central1-a/clusters/c1"
OPS = "/v1/projects/p1/locations/us-central1-a/operations"

POOLS = {
    "nodePools": [
        {
            "name": "a100-spot",
            "config": {
                "machineType": "a2-highgpu-1g",
                "spot": True,
                "labels": {
                    "gpuscaler.io/instance-type": "a2-highgpu-1g",
                    "gpuscaler.io/capacity-type": "spot",
                },
                "accelerators": [{"acceleratorCount": "1", "acceleratorType": "nvidia-tesla-a100"}],
            },
            "autoscaling": {"enabled": True, "minNodeCount": 0, "maxNodeCount": 1},
            "status": "RUNNING",
        },
        {
            "name": "l4-ondemand",
            "config": {"machineType": "g2-standard-4"},
            "status": "RUNNING",
        },
    ]
}

Route = Callable[[str, str, dict[str, Any]], tuple[int, dict[str, Any]]]


class Stub:
    """Records requests; ``route`` picks the answer."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.calls: list[tuple[str, str, dict[str, Any]]] = []


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub(lambda m, p, b: (404, {}))

    class Handler(BaseHTTPRequestHandler):
        def _do(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}") if n else {}
            path = self.path.split("?", 1)[0]
            state.calls.append((self.command, path, body))
            code, out = state.route(self.command, path, body)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = _do  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.port = server.server_address[1]  # type: ignore[attr-defined]
    yield state
    server.shutdown()


def provider(stub: Stub, core: FakeCore, **kw: Any) -> GkeProvider:
    gke = ClusterManagerClient(
        credentials=AnonymousCredentials(),
        transport="rest",
        client_options=ClientOptions(api_endpoint=f"http://127.0.0.1:{stub.port}"),  # type: ignore[attr-defined]
    )
    kw.setdefault("poll_s", 0.01)
    return GkeProvider(gke, core, project="p1", location="us-central1-a", cluster="c1", **kw)


def request(instance: str, capacity: CapacityType, count: int) -> NodeRequest:
    inst = CAT.instance(instance)
    return NodeRequest(JOB, inst, capacity, count, inst.price(capacity) or 0.0)


def op(name: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "operationType": "SET_NODE_POOL_SIZE", "status": status, **extra}


def test_scale_up_raises_autoscaling_bound_then_sets_size_polling_operations(stub: Stub) -> None:
    polls = {"op-size": 0}

    def route(method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path == f"{CLUSTER}/nodePools":
            return 200, POOLS
        if path == f"{CLUSTER}/nodePools/a100-spot:setAutoscaling":
            return 200, op("op-auto", "DONE")
        if path == f"{CLUSTER}/nodePools/a100-spot:setSize":
            return 200, op("op-size", "RUNNING")
        if method == "GET" and path == f"{OPS}/op-size":
            polls["op-size"] += 1
            return 200, op("op-size", "DONE" if polls["op-size"] >= 2 else "RUNNING")
        return 404, {"error": {"code": 404, "message": f"no route {path}", "status": "NOT_FOUND"}}

    stub.route = route
    core = FakeCore()
    p = provider(stub, core)
    req = request("a2-highgpu-1g", CapacityType.SPOT, 3)
    assert p.ensure_nodes(req, []) == []
    calls = [(m, path) for m, path, _ in stub.calls]
    assert calls == [
        ("GET", f"{CLUSTER}/nodePools"),
        ("POST", f"{CLUSTER}/nodePools/a100-spot:setAutoscaling"),
        ("POST", f"{CLUSTER}/nodePools/a100-spot:setSize"),
        ("GET", f"{OPS}/op-size"),
        ("GET", f"{OPS}/op-size"),
    ]
    bodies = {path: body for _, path, body in stub.calls}
    # the resource name travels in the path, not the body (REST transcoding of `name`)
    assert bodies[f"{CLUSTER}/nodePools/a100-spot:setAutoscaling"] == {
        "autoscaling": {"enabled": True, "maxNodeCount": 3}
    }
    assert bodies[f"{CLUSTER}/nodePools/a100-spot:setSize"] == {"nodeCount": 3}

    # nodes still booting: no new call; then they register and are adopted
    stub.calls.clear()
    assert p.ensure_nodes(req, []) == []
    assert stub.calls == []
    for i in range(3):
        core.register(f"gke-c1-a100-spot-{i}", "x", f"i-{i}")
        core.nodes[f"gke-c1-a100-spot-{i}"].metadata.labels = {"cloud.google.com/gke-nodepool": "a100-spot"}
    assert len(p.ensure_nodes(req, [])) == 3
    assert stub.calls == []

    sched = p.scheduling(req)
    assert sched.node_selector == {
        "node.kubernetes.io/instance-type": "a2-highgpu-1g",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
        "cloud.google.com/gke-spot": "true",
        JOB_LABEL: JOB.label,
    }


def test_release_lowers_the_size(stub: Stub) -> None:
    stub.route = lambda m, path, b: (
        (200, POOLS) if path.endswith("/nodePools") else (200, op("op-down", "DONE"))
    )
    core = FakeCore()
    for i in range(2):
        core.register(f"n{i}", "x", f"i-{i}")
        core.nodes[f"n{i}"].metadata.labels = {
            "cloud.google.com/gke-nodepool": "l4-ondemand",
            JOB_LABEL: JOB.label,
        }
    core.register("other", "x", "i-9")
    core.nodes["other"].metadata.labels = {"cloud.google.com/gke-nodepool": "l4-ondemand"}
    p = provider(stub, core)
    from gpuscaler.cloud.provider import NodeState

    gone = p.release_nodes(
        JOB, [NodeState(f"n{i}", "g2-standard-4", "on-demand", True, None, 1.0) for i in range(2)]
    )
    assert gone == ["n0", "n1"]
    assert stub.calls == [
        (
            "POST",
            f"{CLUSTER}/nodePools/l4-ondemand:setSize",
            {"nodeCount": 1},
        )
    ]
    assert all(JOB_LABEL not in (n.metadata.labels or {}) for n in core.nodes.values())


def test_stockout_in_the_operation_is_a_capacity_error(stub: Stub) -> None:
    def route(method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path.endswith("/nodePools"):
            return 200, POOLS
        return 200, op(
            "op-x",
            "DONE",
            statusMessage="Instance 'gke-c1-l4-1' creation failed: GCE_STOCKOUT: The zone "
            "'projects/p1/zones/us-central1-a' does not have enough resources available to fulfill the request.",
            error={"code": 8, "message": "GCE_STOCKOUT"},
        )

    stub.route = route
    with pytest.raises(InsufficientCapacityError, match="GCE_STOCKOUT") as info:
        provider(stub, FakeCore()).ensure_nodes(request("g2-standard-4", CapacityType.ON_DEMAND, 2), [])
    assert info.value.__cause__ is not None


def test_api_error_with_resource_pool_exhausted_is_a_capacity_error(stub: Stub) -> None:
    def route(method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path.endswith("/nodePools"):
            return 200, POOLS
        return 503, {
            "error": {
                "code": 503,
                "message": "ZONE_RESOURCE_POOL_EXHAUSTED: a2-highgpu-1g in us-central1-a",
                "status": "UNAVAILABLE",
            }
        }

    stub.route = route
    with pytest.raises(InsufficientCapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        provider(stub, FakeCore()).ensure_nodes(request("g2-standard-4", CapacityType.ON_DEMAND, 1), [])


def test_operation_still_running_is_polled_on_the_next_call(stub: Stub) -> None:
    done = {"v": False}

    def route(method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path.endswith("/nodePools"):
            return 200, POOLS
        if path.endswith(":setSize"):
            return 200, op("op-slow", "RUNNING")
        return 200, op("op-slow", "DONE" if done["v"] else "RUNNING")

    stub.route = route
    p = provider(stub, FakeCore(), operation_timeout_s=0.0)
    req = request("g2-standard-4", CapacityType.ON_DEMAND, 2)
    p.ensure_nodes(req, [])
    stub.calls.clear()
    p.ensure_nodes(req, [])  # busy: polls, does not start a second setSize
    assert [path for _, path, _ in stub.calls] == [f"{OPS}/op-slow"]
    done["v"] = True
    stub.calls.clear()
    p.ensure_nodes(req, [])  # done: 2 launching already cover the request
    assert [path for _, path, _ in stub.calls] == [f"{OPS}/op-slow"]


def test_no_pool_says_what_to_create(stub: Stub) -> None:
    stub.route = lambda m, path, b: (200, POOLS)
    with pytest.raises(ProviderError, match=r"gpuscaler\.io/instance-type=a3-highgpu-8g"):
        provider(stub, FakeCore()).ensure_nodes(request("a3-highgpu-8g", CapacityType.SPOT, 1), [])


def test_a_zoned_plan_is_served_only_by_a_pool_in_that_zone(stub: Stub) -> None:
    pools = {"nodePools": [{**POOLS["nodePools"][0], "locations": ["us-central1-a"]}]}
    stub.route = lambda method, path, body: (200, pools)
    p = provider(stub, FakeCore())
    assert p.find_pool("a2-highgpu-1g", CapacityType.SPOT, "us-central1-a") is not None
    assert p.find_pool("a2-highgpu-1g", CapacityType.SPOT, "us-central1-b") is None
    inst = CAT.instance("a2-highgpu-1g")
    req = NodeRequest(JOB, inst, CapacityType.SPOT, 1, 1.0, zone="us-central1-b")
    with pytest.raises(ProviderError, match=r"in us-central1-b; create one .* --node-locations us-central1-b"):
        p.ensure_nodes(req, [])
    assert p.scheduling(req).node_selector["topology.kubernetes.io/zone"] == "us-central1-b"
