"""The karpenter provider with the REAL Karpenter controller (its kwok cloud provider) on the local control plane.

The controller, its build and its catalog-made instance types are in :mod:`karpenter_helpers`. The
test proves the whole path: gpuscaler's NodePool + a pending worker pod with the plan's
nodeSelector -> Karpenter creates a node of exactly that instance and capacity type, labelled with
the job -> the pod runs there -> after the pod is gone (or the provider releases the node)
Karpenter removes the node. ``test_karpenter_operator.py`` runs the operator itself on it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster, gpu_pod, wait_for
from gpuscaler.catalog import CapacityType
from gpuscaler.cloud import JOB_LABEL, JobRef, NodeRequest
from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef
from gpuscaler.cloud.nodes import node_state
from karpenter_helpers import CAT, INSTANCE_TYPES, NODE_CLASS, run_karpenter
from karpenter_helpers import job_nodes as _job_nodes
from karpenter_helpers import tail as _tail


@pytest.fixture(scope="module")
def karpenter(dev_cluster: E2ECluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Karpenter (kwok provider) for this module; yields its log file."""
    with run_karpenter(dev_cluster, tmp_path_factory.mktemp("karpenter")) as log:
        yield log


def test_karpenter_provisions_the_plan_and_removes_it(
    dev_cluster: E2ECluster, karpenter: Path, namespace: str
) -> None:
    core = client.CoreV1Api(dev_cluster.api)
    custom = client.CustomObjectsApi(dev_cluster.api)
    pool = f"gpuscaler-{uuid.uuid4().hex[:5]}"
    provider = KarpenterProvider(
        dev_cluster.api,
        node_class=NodeClassRef.parse(NODE_CLASS),
        instance_types=INSTANCE_TYPES,
        nodepool=pool,
        gpu_limit=32,
        consolidate_after="5s",
    )
    job = JobRef(namespace, "bert")
    inst = CAT.instance("p4d.24xlarge")
    req = NodeRequest(job, inst, CapacityType.SPOT, 1, inst.spot_usd_hr or 0.0)
    try:
        assert provider.ensure_nodes(req, []) == []  # the NodePool; Karpenter launches for the pod
        sched = provider.scheduling(req)
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
        provider.ensure_nodes(req2, [])
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
        released = n2[0].metadata.name
        assert provider.release_nodes(job2, held) == [released]
        # The node released is what release_nodes answers for. The pod left on it here (the operator
        # stops its workers first) may get a node of its own: Karpenter provisions for the pods of a
        # node it drains before they are evicted; the NodePool's deletion below removes that one.
        wait_for(
            lambda: released not in {n.metadata.name for n in _job_nodes(core, job2)},
            timeout=180,
            what=f"the released node {released} removed",
        )
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
