"""The operator's CPU per create: a worker pod and a kwok node, by the Kubernetes client's typed
methods against :mod:`gpuscaler.kube_create`, load-independent (CPU time of the calling thread).

First the objects are created once on a private dev cluster (``--kubeconfig``: that cluster) and
read back as its API server stored them (every defaulted field of the spec, the projected token
volume, managedFields, status). Then a loopback HTTP server (a thread of this process) answers
each POST with 201 and that stored object, as the API server answers a create, and the client's
side of each call is measured with ``time.thread_time()`` (the server's thread is not counted):
the request built and sent, the answer read and, by the typed methods, decoded into models. Plain
HTTP: the TLS of a real API server costs both the same.

    python benchmarks/kube_create.py            # 300 of each
    python benchmarks/kube_create.py --calls 1000
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from gpuscaler.catalog import load_catalog
from gpuscaler.cloud.kwok_nodes import node_manifest
from gpuscaler.devcluster.cluster import existing_or_private
from gpuscaler.kube.client import Workers
from gpuscaler.kube.workers import WorkerPlan, worker_pod, worker_rbac
from gpuscaler.kube_create import Creates
from gpuscaler.testing import worker_template

STORED: dict[str, bytes] = {}
"""Kind -> the object as the dev cluster's API server stored it (JSON)."""


class Stored(http.server.BaseHTTPRequestHandler):
    """Answers a POST with 201 and the stored object of its kind."""

    def do_POST(self) -> None:
        kind = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["kind"]
        out = STORED[kind]
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def stored_objects(kubeconfig: str, pod: dict[str, Any], node: dict[str, Any]) -> None:
    """Create the pod (and the workers' ServiceAccount it runs as) and the node on a real cluster;
    keep what its API server answered (:data:`STORED`); delete them again."""
    from kubernetes import config

    api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api)
    ns = pod["metadata"]["namespace"]
    core.create_namespace({"metadata": {"name": ns}})
    for body in worker_rbac(ns):
        Workers(api).create_if_absent(body)
    answer = core.create_namespaced_pod(ns, pod, _preload_content=False)
    STORED["Pod"] = answer.data
    answer = core.create_node(node, _preload_content=False)
    STORED["Node"] = answer.data
    core.delete_node(node["metadata"]["name"])
    core.delete_namespace(ns)


def cpu_per_call(call: Callable[[int], None], calls: int) -> float:
    """Median CPU milliseconds of the calling thread per call, over ``calls`` calls (after 20 to warm up)."""
    for i in range(20):
        call(-1 - i)
    samples = []
    for i in range(calls):
        t0 = time.thread_time()
        call(i)
        samples.append((time.thread_time() - t0) * 1000)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--kubeconfig", help="read the stored objects from this cluster instead of a private dev cluster")
    args = ap.parse_args()
    plan = WorkerPlan(
        job_name="bench", namespace="bench-kube-create", job_label="bench-kube-create.bench", owner={
        "apiVersion": "gpuscaler.io/v1alpha1", "kind": "TrainingJob", "name": "bench",
        "uid": "0f0e0d0c-0b0a-0908-0706-050403020100", "controller": True, "blockOwnerDeletion": True},
        nodes=1, gpus_per_node=1, precision="amp", micro_batch=32, accumulation=1, checkpoint_dir="/ckpt",
        checkpoint_interval_s=600, checkpoint_keep=2, master_port=29500, attempt=1,
        node_selector={"node.kubernetes.io/instance-type": "p3.2xlarge"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        default_image="python:3.11-slim", template=worker_template(command=["python", "-m", "train"]),
    )  # fmt: skip
    instance = load_catalog().instance("p3.2xlarge")

    def pod(i: int) -> dict[str, Any]:
        body = worker_pod(plan, 0)
        body["metadata"]["ownerReferences"] = []  # the owner does not exist on the dev cluster
        body["metadata"]["name"] = f"bench-worker-{i}"
        return body

    def node(i: int) -> dict[str, Any]:
        return node_manifest(f"bench-node-{i}", "gpuscaler-bench", instance, labels={"gpuscaler.io/job": "bench.bench"})

    with existing_or_private(args.kubeconfig, f"bench-create-{os.getpid()}") as (kubeconfig, _):
        stored_objects(kubeconfig, pod(0), node(0))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stored)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    config.api_key = {"BearerToken": "Bearer bench"}
    api = client.ApiClient(config)
    typed, lean = client.CoreV1Api(api), Creates(api)
    rows = [
        ("worker pod", cpu_per_call(lambda i: typed.create_namespaced_pod(plan.namespace, pod(i)), args.calls),
         cpu_per_call(lambda i: lean.create_namespaced_pod(plan.namespace, pod(i)), args.calls)),
        ("kwok node", cpu_per_call(lambda i: typed.create_node(node(i)), args.calls),
         cpu_per_call(lambda i: lean.create_node(node(i)), args.calls)),
    ]  # fmt: skip
    server.shutdown()
    sizes = ", ".join(f"{k.lower()} {len(v):,} bytes" for k, v in STORED.items())
    print(f"client CPU per create (median of {args.calls}, ms of the calling thread; loopback HTTP server")
    print(f"answering as the dev cluster's API server did: {sizes})")
    print(f"  {'object':<12} {'typed method':>13} {'kube_create':>12} {'saved':>7}")
    for what, before, after in rows:
        print(f"  {what:<12} {before:>13.2f} {after:>12.2f} {before - after:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
