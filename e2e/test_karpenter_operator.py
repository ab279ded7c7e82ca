"""End to end: the operator with ``GPUSCALER_PROVIDER_NAME=karpenter`` on the REAL Karpenter controller.

Karpenter (its kwok cloud provider, :mod:`karpenter_helpers`) offers instance types made from
gpuscaler's catalog. The operator (``gpuscaler run``, a subprocess as in ``test_operator.py``)
plans a job pinned to p4d.24xlarge on-demand, 16 GPUs: two nodes. The loop ensures its NodePool,
creates the worker pods at once (``workers_first``), Karpenter launches exactly the planned
nodes for them, the workers run there, the test finishes them, and after Succeeded the operator's
release (deleting the NodeClaims; consolidation of empty nodes is the fallback) makes Karpenter
remove the nodes. Timings are printed.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.cloud import JobRef
from karpenter_helpers import NODE_CLASS, job_nodes, run_karpenter, tail
from operator_helpers import (
    OperatorProcess,
    apply,
    event_messages,
    event_reasons,
    finish_workers,
    get_job,
    job_manifest,
    job_pods,
    kubectl,
)

INSTANCE, GPUS, NODES = "p4d.24xlarge", 16, 2


@pytest.fixture(scope="module")
def karpenter(dev_cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Karpenter (kwok provider) for this module; yields its log file."""
    with run_karpenter(dev_cluster, tmp_path_factory.mktemp("karpenter")) as log:
        yield log


@pytest.fixture
def nodepool(dev_cluster: E2ECluster) -> Iterator[str]:
    """A fresh NodePool name for the operator; the pool (and so its nodes) deleted afterwards."""
    name = f"gpuscaler-{uuid.uuid4().hex[:5]}"
    yield name
    custom = client.CustomObjectsApi(dev_cluster.api)
    core = client.CoreV1Api(dev_cluster.api)
    try:
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", name)
    except ApiException as err:
        if err.status != 404:
            raise
    wait_for(
        lambda: not core.list_node(label_selector=f"karpenter.sh/nodepool={name}").items,
        timeout=120,
        what="the pool's nodes gone",
    )


def test_operator_runs_a_job_on_karpenter(
    dev_cluster: E2ECluster,
    karpenter: Path,
    crd: None,
    nodepool: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(dev_cluster.api)
    custom = client.CustomObjectsApi(dev_cluster.api)
    op = OperatorProcess(
        dev_cluster,
        namespace,
        tmp_path / "operator.log",
        GPUSCALER_PROVIDER_NAME="karpenter",
        GPUSCALER_KARPENTER_NODE_CLASS=NODE_CLASS,
        GPUSCALER_KARPENTER_NODEPOOL=nodepool,
        GPUSCALER_KARPENTER_CLOUD="aws",
        GPUSCALER_KARPENTER_GPU_LIMIT="64",
        GPUSCALER_KARPENTER_CONSOLIDATE_AFTER="5s",
        GPUSCALER_GANG_TIMEOUT_S="180",
    )
    op.start()
    job = JobRef(namespace, "cnn")
    try:
        t0 = time.monotonic()
        apply(dev_cluster, namespace, job_manifest("cnn", instance=INSTANCE, gpus=GPUS))

        def status() -> dict[str, Any]:
            return dict(get_job(custom, namespace, "cnn").get("status") or {})

        # the plan; the NodePool the operator made for it
        plan = wait_for(lambda: status().get("plan"), timeout=60, what=f"a plan ({op.log.read_text()[-2000:]})")
        assert (plan["instanceType"], plan["capacityType"], plan["nodes"]) == (INSTANCE, "on-demand", NODES)
        pool = wait_for(
            lambda: _nodepool(custom, nodepool), timeout=30, what=f"the NodePool ({op.log.read_text()[-2000:]})"
        )
        reqs = {r["key"]: r for r in pool["spec"]["template"]["spec"]["requirements"]}
        assert INSTANCE in reqs["node.kubernetes.io/instance-type"]["values"]
        assert reqs["node.kubernetes.io/instance-type"]["operator"] == "In"
        assert sorted(reqs["karpenter.sh/capacity-type"]["values"]) == ["on-demand", "reserved", "spot"]
        assert reqs["gpuscaler.io/job"]["operator"] == "Exists"
        assert pool["spec"]["template"]["spec"]["nodeClassRef"]["kind"] == "KWOKNodeClass"
        assert pool["spec"]["template"]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
        assert pool["spec"]["limits"] == {"nvidia.com/gpu": "64"}
        assert pool["spec"]["disruption"]["consolidateAfter"] == "5s"

        # pods first (Karpenter provisions for pending pods), then the nodes it launches for them
        pods = wait_for(lambda: len(job_pods(core, namespace, "cnn")) == NODES and job_pods(core, namespace, "cnn"),
                        timeout=30, what="the worker pods")
        t_pods = time.monotonic() - t0
        sel = pods[0].spec.node_selector
        assert sel["node.kubernetes.io/instance-type"] == INSTANCE
        assert sel["karpenter.sh/capacity-type"] == "on-demand" and sel["karpenter.sh/nodepool"] == nodepool
        nodes = wait_for(
            lambda: len(job_nodes(core, job)) >= NODES and job_nodes(core, job),
            timeout=120,
            what=f"Karpenter's nodes ({tail(karpenter)})",
        )
        t_nodes = time.monotonic() - t0

        st = wait_for(
            lambda: status().get("phase") == "Running" and status(),
            timeout=120,
            what=f"Running ({tail(karpenter)})",
        )
        t_running = time.monotonic() - t0
        time.sleep(3)  # a few more reconciles and Karpenter batches: nothing more may be launched
        nodes = job_nodes(core, job)
        assert len(nodes) == NODES, [n.metadata.name for n in nodes]
        for n in nodes:
            assert n.metadata.labels["node.kubernetes.io/instance-type"] == INSTANCE
            assert n.metadata.labels["karpenter.sh/capacity-type"] == "on-demand"
            assert n.metadata.labels["karpenter.sh/nodepool"] == nodepool
        pods = job_pods(core, namespace, "cnn")
        assert {p.status.phase for p in pods} == {"Running"}
        assert {p.spec.node_name for p in pods} == {n.metadata.name for n in nodes}, "one worker per node"
        claims = custom.list_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", label_selector=f"karpenter.sh/nodepool={nodepool}"
        )["items"]
        assert len(claims) == NODES
        st = status()
        assert st["phase"] == "Running" and st["attempt"] == 1 and sorted(st["nodes"]) == sorted(
            n.metadata.name for n in nodes
        )
        assert st["gpus"] == GPUS and st["instanceType"] == INSTANCE and st["capacityType"] == "on-demand"

        # finish the training -> Succeeded -> the operator releases the nodes, Karpenter removes them
        finish_workers(core, namespace, "cnn")
        t1 = time.monotonic()
        st = wait_for(lambda: status().get("phase") == "Succeeded" and status(), timeout=30, what="Succeeded")
        t_succeeded = time.monotonic() - t1
        assert st["progress"]["step"] == 50 and st["costUsd"] > 0, st
        wait_for(lambda: not job_nodes(core, job), timeout=120, what=f"the nodes removed ({tail(karpenter)})")
        t_gone = time.monotonic() - t1
        wait_for(lambda: not job_pods(core, namespace, "cnn"), timeout=120, what="the finished pods gone")
        t_pods_gone = time.monotonic() - t1
        assert not custom.list_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", label_selector=f"karpenter.sh/nodepool={nodepool}"
        )["items"]
        reasons = event_reasons(core, namespace, "cnn")
        for r in ("Started", "Succeeded", "ScaledDown"):
            assert r in reasons, reasons
        # the way there: in the Started Event; WorkersCreated and NodesReady as Events of their own
        # only where the gang took longer than 30 s (controller/bringup.py); the plan its own Event,
        # or said in Started where the gang ran within the status hold (controller/status_writes.py)
        (started,) = event_messages(core, namespace, "cnn", "Started")
        assert re.search(r"\(requested, nodes Ready \+[\dms.]+, running \+[\dms.]+\)(; planned .*)?$", started), started
        assert ("Planned" in reasons) != ("; planned " in started), (reasons, started)
        print(
            f"\nkarpenter operator: apply -> pods {t_pods:.1f}s -> {NODES} nodes {t_nodes:.1f}s -> "
            f"Running {t_running:.1f}s; finished -> Succeeded {t_succeeded:.1f}s -> nodes gone {t_gone:.1f}s "
            f"-> pods gone {t_pods_gone:.1f}s"
        )
    finally:
        kubectl(dev_cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s", check=False)
        op.stop()
        if op.log.exists():
            print(op.log.read_text(errors="replace")[-4000:])


def _nodepool(custom: Any, name: str) -> dict[str, Any] | None:
    try:
        out: dict[str, Any] = custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return out
