"""The karpenter provider with the REAL Karpenter controller (its kwok cloud provider) on the local control plane.

Karpenter ships a fake cloud, the ``kwok`` main package of ``sigs.k8s.io/karpenter``: it launches
NodeClaims as Node objects annotated ``kwok.x-k8s.io/node=fake``, which the dev cluster's kwok
then plays (Ready, runs pods). It is built once with the dev cluster's build machinery and cached
as ``karpenter-kwok-<version>``, and given an instance-type file made from gpuscaler's catalog
(GPU capacity, spot and on-demand prices). The test proves the whole path: gpuscaler's NodePool +
a pending worker pod with the plan's nodeSelector -> Karpenter creates a node of exactly that
instance and capacity type, labelled with the job -> the pod runs there -> after the pod is gone
(or the provider releases the node) Karpenter removes the node.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster, gpu_pod, wait_for
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JOB_LABEL, JobRef, NodeRequest
from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef
from gpuscaler.cloud.provider import node_state
from gpuscaler.devcluster import build
from test_providers_crds import KARPENTER_CRDS, KARPENTER_MODULE, KARPENTER_VERSION, install_crds, module_dir

KARPENTER_KWOK = build.Component("karpenter-kwok", KARPENTER_VERSION, ("karpenter-kwok",))
"""The cache entry of Karpenter's kwok-provider controller (7-8 minutes to build on 2 cores, once)."""

INSTANCE_TYPES = ("p4d.24xlarge", "g5.xlarge", "g5.12xlarge")
ZONE = "test-zone-a"
CAT = load_catalog()


def _build_karpenter_kwok(tmp: Path, log: build.Log, logfile: Path) -> None:
    build._wrapper_build(
        KARPENTER_KWOK,
        tmp=tmp,
        requires={KARPENTER_MODULE: KARPENTER_VERSION},
        packages=[f"{KARPENTER_MODULE}/kwok"],
        ldflags="-s -w",
        log=log,
        logfile=logfile,
    )
    (tmp / "out" / "kwok").rename(tmp / "out" / "karpenter-kwok")


build.BUILDERS.setdefault(KARPENTER_KWOK.name, _build_karpenter_kwok)


def instance_types_json() -> list[dict[str, Any]]:
    """Karpenter-kwok's instance-type file from the catalog rows (resources and prices)."""
    out = []
    for name in INSTANCE_TYPES:
        inst = CAT.instance(name)
        offerings = []
        for cap in CapacityType:
            price = inst.price(cap)
            if price is None:
                continue
            offerings.append(
                {
                    "Price": price,
                    "Available": True,
                    "Requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [cap.value]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                    ],
                }
            )
        out.append(
            {
                "name": name,
                "offerings": offerings,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": {
                    "cpu": str(inst.vcpu),
                    "memory": f"{int(inst.memory_gib)}Gi",
                    "nvidia.com/gpu": str(inst.gpu_count),
                    "pods": "110",
                },
            }
        )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def karpenter(dev_cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Karpenter (kwok provider) running against the dev cluster; yields its log file."""
    install_crds(
        dev_cluster.api, [module_dir(KARPENTER_MODULE, KARPENTER_VERSION) / f for f in KARPENTER_CRDS]
    )
    binary = build.ensure(KARPENTER_KWOK) / "karpenter-kwok"
    work = tmp_path_factory.mktemp("karpenter")
    types = work / "instance-types.json"
    types.write_text(json.dumps(instance_types_json()))
    log = work / "karpenter.log"
    env = dict(
        dev_cluster.env,
        KUBECONFIG=str(dev_cluster.kubeconfig),
        SYSTEM_NAMESPACE="kube-system",
        DISABLE_LEADER_ELECTION="true",
        METRICS_PORT=str(_free_port()),
        HEALTH_PROBE_PORT=str(_free_port()),
        INSTANCE_TYPES_FILE_PATH=str(types),
        BATCH_IDLE_DURATION="1s",
        BATCH_MAX_DURATION="3s",
        LOG_LEVEL="info",
    )
    with log.open("w") as fh:
        proc = subprocess.Popen([str(binary)], env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        time.sleep(2)
        if proc.poll() is not None:
            pytest.fail(f"karpenter-kwok exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        custom = client.CustomObjectsApi(dev_cluster.api)
        try:
            custom.create_cluster_custom_object(
                "karpenter.kwok.sh",
                "v1alpha1",
                "kwoknodeclasses",
                {
                    "apiVersion": "karpenter.kwok.sh/v1alpha1",
                    "kind": "KWOKNodeClass",
                    "metadata": {"name": "default"},
                },
            )
        except ApiException as err:
            if err.status != 409:
                raise
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _job_nodes(core: Any, job: JobRef) -> list[Any]:
    return list(core.list_node(label_selector=f"{JOB_LABEL}={job.label}").items)


def _tail(log: Path) -> str:
    return "\n".join(log.read_text().splitlines()[-30:])


def test_karpenter_provisions_the_plan_and_removes_it(
    dev_cluster: E2ECluster, karpenter: Path, namespace: str
) -> None:
    core = client.CoreV1Api(dev_cluster.api)
    custom = client.CustomObjectsApi(dev_cluster.api)
    pool = f"gpuscaler-{uuid.uuid4().hex[:5]}"
    provider = KarpenterProvider(
        dev_cluster.api,
        node_class=NodeClassRef("karpenter.kwok.sh", "KWOKNodeClass", "default"),
        instance_types=INSTANCE_TYPES,
        nodepool=pool,
        gpu_limit=32,
        consolidate_after="5s",
    )
    job = JobRef(namespace, "bert")
    inst = CAT.instance("p4d.24xlarge")
    req = NodeRequest(job, inst, CapacityType.SPOT, 1, inst.spot_usd_hr or 0.0)
    try:
        sched = provider.scheduling(req)  # also ensures the NodePool (manages_nodes is False)
        t0 = time.monotonic()
        pod = gpu_pod("worker-0", 8, node_selector=sched.node_selector)
        pod["spec"]["tolerations"] = sched.tolerations
        core.create_namespaced_pod(namespace, pod)

        nodes = wait_for(
            lambda: _job_nodes(core, job), timeout=120, what=f"a Karpenter node ({_tail(karpenter)})"
        )
        t_node = time.monotonic() - t0
        assert len(nodes) == 1
        labels = nodes[0].metadata.labels
        assert labels["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
        assert labels["karpenter.sh/capacity-type"] == "spot"
        assert labels["karpenter.sh/nodepool"] == pool
        assert labels[JOB_LABEL] == job.label

        def running() -> bool:
            p = core.read_namespaced_pod("worker-0", namespace)
            return bool(p.spec.node_name == nodes[0].metadata.name and p.status.phase == "Running")

        wait_for(running, timeout=120, what="the worker Running on the Karpenter node")
        t_running = time.monotonic() - t0
        state = node_state(dev_cluster.api.sanitize_for_serialization(core.read_node(nodes[0].metadata.name)))
        assert state.instance_type == "p4d.24xlarge" and state.capacity_type == "spot" and state.ready

        # scale down is Karpenter's: the pod goes, consolidation (WhenEmpty, 5 s) removes the node
        core.delete_namespaced_pod("worker-0", namespace, grace_period_seconds=0)
        t1 = time.monotonic()
        wait_for(
            lambda: not _job_nodes(core, job), timeout=180, what=f"the node removed ({_tail(karpenter)})"
        )
        t_gone = time.monotonic() - t1
        print(
            f"\nkarpenter: node after {t_node:.1f}s, pod Running after {t_running:.1f}s, node gone {t_gone:.1f}s after the pod"
        )

        # release_nodes path: a second job's node is removed by deleting its NodeClaim
        job2 = JobRef(namespace, "gpt")
        inst2 = CAT.instance("g5.xlarge")
        req2 = NodeRequest(job2, inst2, CapacityType.ON_DEMAND, 1, inst2.ondemand_usd_hr)
        sched2 = provider.scheduling(req2)
        pod2 = gpu_pod("gpt-0", 1, node_selector=sched2.node_selector)
        pod2["spec"]["tolerations"] = sched2.tolerations
        core.create_namespaced_pod(namespace, pod2)
        n2 = wait_for(lambda: _job_nodes(core, job2), timeout=120, what="the second job's node")
        assert n2[0].metadata.labels["node.kubernetes.io/instance-type"] == "g5.xlarge"
        assert n2[0].metadata.labels["karpenter.sh/capacity-type"] == "on-demand"
        wait_for(
            lambda: any(
                (c.get("status") or {}).get("nodeName") == n2[0].metadata.name
                for c in custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")["items"]
            ),
            what="the NodeClaim to name its node",
        )
        held = [node_state(dev_cluster.api.sanitize_for_serialization(n)) for n in n2]
        t2 = time.monotonic()
        assert provider.release_nodes(job2, held) == [n2[0].metadata.name]
        wait_for(lambda: not _job_nodes(core, job2), timeout=180, what="the released node removed")
        print(f"karpenter: released node gone {time.monotonic() - t2:.1f}s after release_nodes")
    finally:
        for p in ("worker-0", "gpt-0"):
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool)
        wait_for(
            lambda: not core.list_node(label_selector=f"karpenter.sh/nodepool={pool}").items,
            timeout=120,
            what="the pool's nodes gone",
        )
