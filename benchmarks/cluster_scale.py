"""Dev-cluster scale benchmark: control-plane start-up, then 500 fake GPU nodes and 2,000 GPU pods.

Prints how long the binaries took to get (a build on a cold cache, a cache hit otherwise), how long
the control plane took to come up, how long node creation and readiness took, and how long the
real kube-scheduler needed to bind every pod and kwok to report them all Running. It prints figures
and asserts nothing about time.

    python benchmarks/cluster_scale.py                 # 500 nodes, 2000 pods
    python benchmarks/cluster_scale.py --nodes 50 --pods 200
    python benchmarks/cluster_scale.py --cold          # also time a from-scratch build (minutes)

``--cold`` builds every binary into a throw-away cache with an empty Go build cache (the Go module
download cache is kept, so it measures compilation, not the network).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

from kubernetes import client

from gpuscaler.devcluster import build
from gpuscaler.devcluster.cluster import Cluster
from gpuscaler.devcluster.nodes import GPU_RESOURCE, NodePool, create_node_pool, wait_nodes_ready
from gpuscaler.devcluster.watch import RawWatch

POOLS = ("p4d.24xlarge", "p5.48xlarge", "a2-highgpu-8g", "g6e.48xlarge")
"""8-GPU instance types the nodes are spread over (round-robin)."""
POD_GPUS = (1, 1, 1, 2)
"""GPUs per pod, cycled: 1.25 on average, about 62% of the nodes' GPUs for the default sizes."""


def log(msg: str) -> None:
    print(msg, flush=True)


def cold_build() -> float:
    """Build everything into a temporary cache with an empty Go build cache; seconds taken."""
    with tempfile.TemporaryDirectory(prefix="gpuscaler-cold-") as tmp, mock.patch.dict(
        os.environ, GPUSCALER_CACHE_DIR=str(Path(tmp) / "cache"), GOCACHE=str(Path(tmp) / "gocache")
    ):
        t0 = time.monotonic()
        build.ensure_all(log=log)
        return time.monotonic() - t0


class PodWatcher(RawWatch):
    """Watch a namespace's pods and record when each was bound and Running (monotonic seconds)."""

    def __init__(self, core: Any, namespace: str) -> None:
        super().__init__("pod")
        self.core = core
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}

    def list_call(self, **kw: Any) -> Any:
        return self.core.list_namespaced_pod(self.namespace, **kw)

    def seen(self, obj: dict[str, Any]) -> None:
        name, now = obj["metadata"]["name"], time.monotonic()
        if obj["spec"].get("nodeName"):
            self.bound.setdefault(name, now)
        if obj.get("status", {}).get("phase") == "Running":
            self.running.setdefault(name, now)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--cold", action="store_true", help="also time a from-scratch build (minutes)")
    ap.add_argument("--threads", type=int, default=8, help="client threads creating pods")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)

    figures: dict[str, float] = {}
    if args.cold:
        figures["cold build (empty Go build cache), s"] = cold_build()

    t0 = time.monotonic()
    cached = all(c.is_built() for c in (build.ETCD, build.KUBERNETES, build.KWOK))
    binaries = build.ensure_all(log=log)
    figures[f"get binaries ({'cache hit' if cached else 'first build'}), s"] = time.monotonic() - t0

    with Cluster(binaries, name=f"bench-{os.getpid()}", log=log) as cluster:
        for comp, secs in cluster.startup_seconds.items():
            figures[f"control plane start-up: {comp}, s"] = secs
        api = cluster.api_client()
        api.configuration.connection_pool_maxsize = max(args.threads, 8) * 2
        core = client.CoreV1Api(api)

        # nodes
        t0 = time.monotonic()
        per_pool = [args.nodes // len(POOLS) + (1 if i < args.nodes % len(POOLS) else 0) for i in range(len(POOLS))]
        pools: list[NodePool] = [
            create_node_pool(api, f"bench-{i}", itype, n, parallelism=args.threads)
            for i, (itype, n) in enumerate(zip(POOLS, per_pool, strict=True)) if n
        ]
        figures[f"create {args.nodes} nodes, s"] = time.monotonic() - t0
        wait_nodes_ready(api, [n for p in pools for n in p.node_names], timeout=args.timeout)
        figures[f"create + {args.nodes} nodes Ready and schedulable, s"] = time.monotonic() - t0
        gpus_total = sum(p.instance_type.gpu_count * len(p.node_names) for p in pools)

        # pods
        ns = "bench"
        core.create_namespace({"metadata": {"name": ns}})
        while not core.list_namespaced_service_account(ns).items:
            time.sleep(0.2)
        watcher = PodWatcher(core, ns)
        watcher.start()
        watcher.ready.wait(30)

        def pod(i: int) -> dict[str, Any]:
            return {
                "metadata": {"name": f"w-{i}"},
                "spec": {
                    "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{
                        "name": "train", "image": "registry.invalid/trainer:bench",
                        "resources": {"limits": {GPU_RESOURCE: str(POD_GPUS[i % len(POD_GPUS)])}},
                    }],
                },
            }

        created: dict[str, float] = {}

        def create(i: int) -> None:
            core.create_namespaced_pod(ns, pod(i))
            created[f"w-{i}"] = time.monotonic()

        gpus_asked = sum(POD_GPUS[i % len(POD_GPUS)] for i in range(args.pods))
        log(f"creating {args.pods} pods asking {gpus_asked} of {gpus_total} GPUs on {args.nodes} nodes ...")
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.threads) as ex:
            list(ex.map(create, range(args.pods)))
        figures[f"create {args.pods} pods (API), s"] = time.monotonic() - t0

        deadline = t0 + args.timeout
        last_report = time.monotonic()
        while len(watcher.running) < args.pods and time.monotonic() < deadline:
            time.sleep(0.2)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(f"  {time.monotonic() - t0:.0f}s: {len(watcher.bound)} bound, {len(watcher.running)} Running")
        watcher.stop.set()
        if len(watcher.running) < args.pods:
            log(f"TIMEOUT: {len(watcher.bound)} bound, {len(watcher.running)} Running of {args.pods}")
            return 1
        figures[f"first pod created -> all {args.pods} bound, s"] = max(watcher.bound.values()) - t0
        figures[f"first pod created -> all {args.pods} Running, s"] = max(watcher.running.values()) - t0
        span = max(watcher.bound.values()) - min(watcher.bound.values())
        figures["scheduler throughput (first..last bind), pods/s"] = (args.pods - 1) / span if span else float("inf")
        lat = [watcher.bound[n] - created[n] for n in created]
        figures["per-pod create->bound latency p50, s"] = statistics.median(lat)
        figures["per-pod create->bound latency p99, s"] = pct(lat, 0.99)
        used = {p.spec.node_name for p in core.list_namespaced_pod(ns).items}
        figures["nodes that got at least one pod"] = len(used)

    log("")
    log(f"== dev-cluster scale benchmark ({os.cpu_count()} CPUs) ==")
    width = max(len(k) for k in figures)
    for k, v in figures.items():
        log(f"{k:<{width}}  {v:10.2f}" if isinstance(v, float) else f"{k:<{width}}  {v:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
