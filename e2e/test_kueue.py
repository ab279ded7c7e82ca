"""gpuscaler's gang against the REAL Kueue and JobSet controllers (built from their Go modules).

One dev cluster with the ``kueue`` and ``jobset`` add-ons (:mod:`gpuscaler.devcluster.addons`) per
module, with fake spot and on-demand p4d.24xlarge nodes. The JobSets are the ones
:func:`gpuscaler.kube.jobset.jobset` builds from a worker plan; what is checked is what the real
controllers do with them: Kueue admits the gang as one Workload on the flavor whose node labels
match the planned offering (:func:`gpuscaler.kube.kueue.matching_flavors`, computed from the
catalog, not from Kueue's answer), a gang without quota waits and the Workload's conditions say why
(:func:`gpuscaler.kube.kueue.workload_state`), freed quota lets it run; a higher-priority gang
preempts a running one and its Workload says so; the JobSet's failure policy ignores a preempted
worker (exit code 75) and fails the JobSet on a training failure.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import any_cluster
from e2e_helpers import E2ECluster, rbac_checked, wait_for
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.devcluster import build
from gpuscaler.devcluster.cluster import Cluster, apply_crds
from gpuscaler.devcluster.nodes import create_node_pool, wait_nodes_ready
from gpuscaler.devcluster.stages import POD_COMPLETE_DELAY_ANNOTATION
from gpuscaler.kube import jobset as js
from gpuscaler.kube import kueue
from gpuscaler.kube.workers import WorkerPlan
from gpuscaler.names import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, JOBSET_NAME_LABEL
from gpuscaler.runtime import constants as rc
from helm_install_helpers import install, sa_kubeconfig
from operator_helpers import (
    ROOT,
    OperatorProcess,
    apply,
    get_job,
    job_manifest,
    job_nodes,
    job_pods,
    kubectl,
    wait_phase,
)
from spot_harness import Harness
from spot_helpers import POLICY, STEP_S, finish, progressed, running_node, spot_job, taint

KUEUE = ("kueue.x-k8s.io", "v1beta2")
P4D = load_catalog().instance("p4d.24xlarge")
GPUS_PER_NODE = P4D.gpu_count
FLAVORS = {
    "a100-spot": {INSTANCE_TYPE_LABEL: P4D.name, CAPACITY_TYPE_LABEL: "spot"},
    "a100-od": {INSTANCE_TYPE_LABEL: P4D.name, CAPACITY_TYPE_LABEL: "on-demand"},
}


QUEUED_RESYNC_S = "5"
"""``GPUSCALER_RESYNC_INTERVAL_S`` of the operators here: no watch event wakes a Queued job when Kueue
changes its Workload (the reason it waits, its admission), so it sees them at its next resync, 60 s
by default; what these tests check is what it does then, not the default's wait."""


def quota(gpus: int) -> list[dict[str, Any]]:
    """A flavor's quotas in a ClusterQueue: ``gpus`` GPUs, CPU and memory beyond any test's need."""
    return [
        {"name": "nvidia.com/gpu", "nominalQuota": gpus},
        {"name": "cpu", "nominalQuota": 1000},
        {"name": "memory", "nominalQuota": "10Ti"},
    ]


class Kueued:
    """The module's cluster with Kueue and JobSet, and its API clients."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.api = cluster.api_client()
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.core: Any = client.CoreV1Api(self.api)

    def namespace(self) -> str:
        name = f"kq-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        wait_for(
            lambda: any(sa.metadata.name == "default" for sa in self.core.list_namespaced_service_account(name).items),
            what=f"default ServiceAccount in {name}",
        )
        return name

    def queue(self, namespace: str, cq: str, spot_quota: int, *, od_quota: int = 0, preemption: bool = False) -> str:
        """A ClusterQueue ``cq`` with ``spot_quota`` GPUs on a100-spot and ``od_quota`` on a100-od
        (CPU and memory plenty), and its LocalQueue ``team``."""
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                    "flavors": [
                        {"name": "a100-od", "resources": quota(od_quota)},
                        {"name": "a100-spot", "resources": quota(spot_quota)},
                    ],
                }
            ],
        }
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        self.custom.create_cluster_custom_object(
            *KUEUE, "clusterqueues", {"apiVersion": "/".join(KUEUE), "kind": "ClusterQueue", "metadata": {"name": cq}, "spec": spec}
        )
        body = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "team"}, "spec": {"clusterQueue": cq}}
        self.custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", body)
        return "team"

    def submit(
        self, namespace: str, name: str, nodes: int, queue: str | None, priority: str | None = None,
        instance: str = P4D.name,
    ) -> dict[str, Any]:
        """The JobSet of a spot plan of ``nodes`` x ``instance``, as the builder makes it (its pods stay Running)."""
        plan = WorkerPlan(
            job_name=name, namespace=namespace, job_label=f"{namespace}.{name}", owner={}, nodes=nodes,
            gpus_per_node=load_catalog().instance(instance).gpu_count, precision="amp", micro_batch=32, accumulation=1, checkpoint_dir="/ckpt",
            checkpoint_interval_s=600, checkpoint_keep=2, master_port=29500, attempt=1,
            node_selector={INSTANCE_TYPE_LABEL: instance, CAPACITY_TYPE_LABEL: "spot"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            default_image="python:3.11-slim",
            template={
                "metadata": {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "1h"}},
                "spec": {"serviceAccountName": "default", "containers": [{"name": "train", "image": "trainer"}]},
            },
        )
        body = js.jobset(plan, queue=queue)
        body["metadata"].pop("ownerReferences")  # no TrainingJob here: the gang alone
        if priority:
            body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
        made: dict[str, Any] = self.custom.create_namespaced_custom_object(js.GROUP, js.VERSION, namespace, js.PLURAL, body)
        return made

    def workload(self, namespace: str, jobset: dict[str, Any]) -> kueue.WorkloadState | None:
        items = self.custom.list_namespaced_custom_object(*KUEUE, namespace, kueue.WORKLOADS)["items"]
        mine = [w for w in items if kueue.owned_by(w, jobset["metadata"]["uid"])]
        return kueue.workload_state(mine[0]) if mine else None

    def pods(self, namespace: str, jobset: dict[str, Any]) -> list[Any]:
        sel = f"{JOBSET_NAME_LABEL}={jobset['metadata']['name']}"
        return list(self.core.list_namespaced_pod(namespace, label_selector=sel).items)

    def running(self, namespace: str, jobset: dict[str, Any], n: int) -> list[Any]:
        pods = [p for p in self.pods(namespace, jobset) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return pods if len(pods) == n else []

    def jobset_body(self, namespace: str, jobset: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            js.GROUP, js.VERSION, namespace, js.PLURAL, jobset["metadata"]["name"]
        )
        return got


@pytest.fixture(scope="module")
def kq(dev_cluster: E2ECluster) -> Iterator[Kueued]:
    """A private dev cluster with Kueue and JobSet, 4 spot and 2 on-demand p4d nodes, two flavors."""
    any_cluster.require(dev_cluster, "private")
    binaries = build.ensure_all(addons=("kueue", "jobset"))
    cluster = Cluster(binaries, name=f"e2e-kueue-{os.getpid()}", addons=("jobset", "kueue"))
    cluster.start()
    try:
        k = Kueued(cluster)
        for pool, count, cap in (("spot", 4, CapacityType.SPOT), ("od", 2, CapacityType.ON_DEMAND)):
            made = create_node_pool(k.api, f"p4d-{pool}", P4D.name, count, capacity_type=cap.value)
            wait_nodes_ready(k.api, made.node_names)
        for name, labels in FLAVORS.items():
            body = {"apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {"nodeLabels": labels}}
            k.custom.create_cluster_custom_object(*KUEUE, kueue.RESOURCE_FLAVORS, body)
        yield k
        k.api.close()
    finally:
        cluster.stop()


@pytest.fixture
def ns(kq: Kueued) -> Iterator[str]:
    """A fresh namespace of the module's cluster; its JobSets (and so their nodes) go with it."""
    name = kq.namespace()
    yield name
    for body in kq.custom.list_namespaced_custom_object(js.GROUP, js.VERSION, name, js.PLURAL)["items"]:
        kq.custom.delete_namespaced_custom_object(
            js.GROUP, js.VERSION, name, js.PLURAL, body["metadata"]["name"], propagation_policy="Foreground"
        )
    wait_for(lambda: not kq.core.list_namespaced_pod(name).items, timeout=90, what=f"the pods of {name} gone")
    kq.core.delete_namespace(name)


def test_admitted_on_the_planned_flavor_waits_without_quota_and_runs_once_freed(kq: Kueued, ns: str) -> None:
    queue = kq.queue(ns, "gpu-cq-quota", spot_quota=2 * GPUS_PER_NODE)
    flavors = [kueue.Flavor.from_object(f) for f in kq.custom.list_cluster_custom_object(*KUEUE, kueue.RESOURCE_FLAVORS)["items"]]
    expected = kueue.matching_flavors(flavors, P4D, CapacityType.SPOT)
    assert expected == ["a100-spot"]

    first = kq.submit(ns, "first", 2, queue)
    st = wait_for(lambda: (w := kq.workload(ns, first)) is not None and w.admitted and w, timeout=90, what="first admitted")
    assert st.flavor == expected[0] and st.cluster_queue == "gpu-cq-quota"
    pods = wait_for(lambda: kq.running(ns, first, 2), timeout=90, what="first's 2 workers Running")
    nodes = {n.metadata.name: n for n in kq.core.list_node().items}
    for p in pods:  # on the planned offering: spot p4d nodes
        labels = nodes[p.spec.node_name].metadata.labels
        assert labels[INSTANCE_TYPE_LABEL] == P4D.name and labels[CAPACITY_TYPE_LABEL] == "spot"
    assert js.jobset_phase(kq.jobset_body(ns, first)) == "Active"

    second = kq.submit(ns, "second", 2, queue)
    waiting = wait_for(
        lambda: (w := kq.workload(ns, second)) is not None and "insufficient" in w.reason and w, timeout=60, what="a reason"
    )
    assert not waiting.admitted
    assert "insufficient unused quota for nvidia.com/gpu in flavor a100-spot" in waiting.reason
    assert kueue.queued_message(queue, waiting).startswith(f"Queued in LocalQueue {queue}: couldn't assign flavors")
    assert js.jobset_phase(kq.jobset_body(ns, second)) == "Suspended" and kq.pods(ns, second) == []

    kq.custom.delete_namespaced_custom_object(
        js.GROUP, js.VERSION, ns, js.PLURAL, first["metadata"]["name"], propagation_policy="Foreground"
    )
    st2 = wait_for(lambda: (w := kq.workload(ns, second)) is not None and w.admitted and w, timeout=120, what="second admitted")
    assert st2.flavor == "a100-spot"
    wait_for(lambda: kq.running(ns, second, 2), timeout=90, what="second's workers Running")


def test_a_higher_priority_gang_preempts_and_the_workload_says_so(kq: Kueued, ns: str) -> None:
    queue = kq.queue(ns, "gpu-cq-prio", spot_quota=2 * GPUS_PER_NODE, preemption=True)
    for name, value in (("low-prio", 10), ("high-prio", 1000)):
        body = {"apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
        kq.custom.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", body)
    low = kq.submit(ns, "low", 2, queue, priority="low-prio")
    wait_for(lambda: kq.running(ns, low, 2), timeout=120, what="low's workers Running")
    high = kq.submit(ns, "high", 2, queue, priority="high-prio")
    evicted = wait_for(lambda: (w := kq.workload(ns, low)) is not None and w.evicted and w, timeout=90, what="low evicted")
    assert evicted.reason.startswith("evicted (Preempted)")
    # Kueue suspends the preempted JobSet: its workers get SIGTERM (the runtime's checkpoint signal) and go
    wait_for(lambda: kq.pods(ns, low) == [], timeout=90, what="low's workers gone")
    wait_for(lambda: (w := kq.workload(ns, high)) is not None and w.admitted, timeout=90, what="high admitted")
    wait_for(lambda: kq.running(ns, high, 2), timeout=90, what="high's workers Running")
    requeued = kq.workload(ns, low)
    assert requeued is not None and not requeued.admitted  # back in the queue, not lost


def _fail(kq: Kueued, ns: str, pod: Any, exit_code: int) -> None:
    """End a worker as the kubelet would report a container exiting with ``exit_code``."""
    now = pod.status.start_time.isoformat()
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "train", "image": "trainer", "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": now, "finishedAt": now}},
            }
        ],
    }
    kq.core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": status})


def test_failure_policy_ignores_a_preempted_worker_and_fails_on_a_training_failure(kq: Kueued, ns: str) -> None:
    gang = kq.submit(ns, "policy", 2, queue=None)  # no queue: the JobSet starts at once
    pods = wait_for(lambda: kq.running(ns, gang, 2), timeout=90, what="workers Running")
    preempted = pods[0]
    _fail(kq, ns, preempted, rc.EXIT_PREEMPTED)
    # ignored: the Job replaces the worker, the JobSet neither fails nor restarts
    wait_for(
        lambda: [p for p in kq.running(ns, gang, 2) if p.metadata.name != preempted.metadata.name],
        timeout=90,
        what="a replacement worker",
    )
    body = kq.jobset_body(ns, gang)
    assert js.jobset_phase(body) == "Active" and (body.get("status") or {}).get("restarts", 0) == 0
    victim = kq.running(ns, gang, 2)[0]
    _fail(kq, ns, victim, 1)
    failed = wait_for(lambda: js.jobset_phase(b := kq.jobset_body(ns, gang)) == "Failed" and b, timeout=90, what="JobSet Failed")
    conditions = {c["type"]: c for c in failed["status"]["conditions"]}
    # our rule's action (with no rule matching, the JobSet would restart instead: RestartJobSet)
    assert conditions["Failed"]["reason"] == "FailJobSetFailurePolicyAction"
    assert (failed.get("status") or {}).get("restarts", 0) == 0


# ------------------------------------------------------------------------- the operator with Kueue


@pytest.fixture
def kq_operator(kq: Kueued, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator (``gpuscaler run``) for ``ns`` on the Kueue cluster, gpuscaler's CRDs installed."""
    env = kq.cluster.env()
    apply_crds(env, [ROOT / "crds" / n for n in ("trainingjob.yaml", "gpuscalingpolicy.yaml", "performanceprofile.yaml")],
               ["trainingjobs.gpuscaler.io", "gpuscalingpolicies.gpuscaler.io", "performanceprofiles.gpuscaler.io"])
    e2e = E2ECluster(kq.cluster.kubeconfig, kq.api, env, kq.cluster.binaries, kq.cluster)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)  # checkpoints every 10 s allowed (the spot test's interval)
    op = OperatorProcess(e2e, ns, tmp_path / "operator.log", GPUSCALER_POLICY_FILE=str(policy),
                         GPUSCALER_RESYNC_INTERVAL_S=QUEUED_RESYNC_S)  # fmt: skip
    op.start()
    yield op
    kubectl(e2e, "delete", "trainingjobs", "--all", "-n", ns, "--timeout=60s", check=False)
    op.stop()
    print((tmp_path / "operator.log").read_text(errors="replace")[-6000:])


def test_operator_queues_a_job_until_kueue_admits_it_then_runs_and_deletes_its_jobset(
    kq: Kueued, ns: str, kq_operator: OperatorProcess
) -> None:
    custom = kq.custom
    queue = kq.queue(ns, "gpu-cq-operator", spot_quota=0, od_quota=0)  # no quota yet
    manifest = job_manifest("queued", instance=P4D.name, gpus=2 * GPUS_PER_NODE)
    manifest["spec"]["queueName"] = queue
    # kwok finishes a Job's pods at once unless told to keep them Running (the JobSet's pods are a Job's)
    manifest["spec"]["template"]["metadata"] = {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "1h"}}
    e2e = E2ECluster(kq.cluster.kubeconfig, kq.api, kq.cluster.env(), kq.cluster.binaries, kq.cluster)
    apply(e2e, ns, manifest)
    job = wait_for(
        lambda: "insufficient" in ((j := get_job(custom, ns, "queued")).get("status") or {}).get("queue", {}).get("reason", "") and j,
        timeout=90,
        what="the job Queued with Kueue's reason",
    )
    status = job["status"]
    assert status["phase"] == "Queued" and status["queue"]["expectedFlavor"] == "a100-od"
    assert "insufficient" in status["message"] and status["message"].startswith(f"Queued in LocalQueue {queue}")
    assert job_nodes(kq.core, ns, "queued") == []  # nothing provisioned before admission
    table = kubectl(e2e, "get", "trainingjobs", "-n", ns).stdout
    assert "Queued" in table and "insufficient" in table  # the Waiting column

    kq.custom.patch_cluster_custom_object(  # the platform team frees quota
        *KUEUE, "clusterqueues", "gpu-cq-operator",
        {"spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                                      "flavors": [{"name": "a100-od", "resources": quota(2 * GPUS_PER_NODE)},
                                                  {"name": "a100-spot", "resources": quota(0)}]}]}},
    )
    running = wait_phase(custom, ns, "queued", "Running", timeout=180)
    assert running["status"]["queue"]["admitted"] and running["status"]["queue"]["flavor"] == "a100-od"
    nodes = job_nodes(kq.core, ns, "queued")
    assert len(nodes) == 2 and all(n.metadata.labels[CAPACITY_TYPE_LABEL] == "on-demand" for n in nodes)
    jobset = js.jobset_name("queued", running["status"]["attempt"])
    pods = job_pods(kq.core, ns, "queued")
    assert len(pods) == 2 and {p.metadata.labels[JOBSET_NAME_LABEL] for p in pods} == {jobset}
    assert {p.spec.node_name for p in pods} == {n.metadata.name for n in nodes}

    kubectl(e2e, "delete", "trainingjob", "queued", "-n", ns, "--timeout=90s")
    wait_for(
        lambda: not kq.custom.list_namespaced_custom_object(js.GROUP, js.VERSION, ns, js.PLURAL)["items"],
        timeout=90,
        what="the JobSet deleted with the job",
    )
    wait_for(lambda: not job_nodes(kq.core, ns, "queued"), timeout=90, what="the job's nodes released")


def test_runtime_jobset_survives_a_spot_notice_through_a_replan_and_goes_with_the_job(
    kq: Kueued, ns: str, kq_operator: OperatorProcess, tmp_path: Path
) -> None:
    steps = 700
    manifest = spot_job("js", steps, runtime="jobset")
    manifest["spec"]["template"]["metadata"] = {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "1h"}}
    e2e = E2ECluster(kq.cluster.kubeconfig, kq.api, kq.cluster.env(), kq.cluster.binaries, kq.cluster)
    apply(e2e, ns, manifest)
    # the training container, played by real runtime processes (e2e/spot_harness.py)
    h = Harness(kq.core, ns, "js", tmp_path / "js", str(kq.cluster.kubeconfig), steps, step_sleep=STEP_S).start()
    try:
        running = wait_phase(kq.custom, ns, "js", "Running", timeout=90)
        first = js.jobset_name("js", running["status"]["attempt"])
        assert {p.metadata.labels[JOBSET_NAME_LABEL] for p in job_pods(kq.core, ns, "js")} == {first}
        progressed(h, 150)
        node = running_node(kq.core, ns, "js")
        taint(kq.core, node, "aws-node-termination-handler/spot-itn")
        st = finish(kq.custom, h, ns, "js", steps)  # same weights as an uninterrupted run, few steps redone
    finally:
        h.stop()
    assert st["interruptions"] == 1 and st["interruptionHistory"][0]["checkpointAcked"], st
    assert st["interruptionHistory"][0]["instanceType"] != st["instanceType"]  # re-planned elsewhere
    last = js.jobset_name("js", st["attempt"])
    assert last != first
    names = [b["metadata"]["name"] for b in kq.custom.list_namespaced_custom_object(js.GROUP, js.VERSION, ns, js.PLURAL)["items"]]
    assert names == [last]  # the first gang's JobSet went at the re-plan; the new shape is a new JobSet
    kubectl(e2e, "delete", "trainingjob", "js", "-n", ns, "--timeout=90s")
    wait_for(
        lambda: not kq.custom.list_namespaced_custom_object(js.GROUP, js.VERSION, ns, js.PLURAL)["items"],
        timeout=90,
        what="the JobSet deleted with the job",
    )


def test_a_kueue_preemption_of_a_running_job_checkpoints_and_requeues_with_no_lost_steps(
    kq: Kueued, ns: str, kq_operator: OperatorProcess, tmp_path: Path
) -> None:
    t4 = "g4dn.xlarge"  # spot_job's first choice
    with contextlib.suppress(ApiException):  # cluster-scoped: made once per cluster
        kq.custom.create_cluster_custom_object(*KUEUE, kueue.RESOURCE_FLAVORS, {
            "apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor", "metadata": {"name": "t4-spot"},
            "spec": {"nodeLabels": {INSTANCE_TYPE_LABEL: t4, CAPACITY_TYPE_LABEL: "spot"}}})
        for name, value in (("low-prio", 10), ("high-prio", 1000)):
            kq.custom.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", {
                "apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})
    spec = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "cpu", "memory"],
                                "flavors": [{"name": "t4-spot", "resources": quota(1)}]}]}
    kq.custom.create_cluster_custom_object(
        *KUEUE, "clusterqueues", {"apiVersion": "/".join(KUEUE), "kind": "ClusterQueue", "metadata": {"name": "t4-cq"}, "spec": spec})
    kq.custom.create_namespaced_custom_object(*KUEUE, ns, "localqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "t4"}, "spec": {"clusterQueue": "t4-cq"}})
    steps = 700
    manifest = spot_job("low", steps, queueName="t4")
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "low-prio"}
    manifest["spec"]["template"]["metadata"] = {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "1h"}}
    e2e = E2ECluster(kq.cluster.kubeconfig, kq.api, kq.cluster.env(), kq.cluster.binaries, kq.cluster)
    apply(e2e, ns, manifest)
    h = Harness(kq.core, ns, "low", tmp_path / "low", str(kq.cluster.kubeconfig), steps, step_sleep=STEP_S).start()
    try:
        wait_phase(kq.custom, ns, "low", "Running", timeout=120)
        progressed(h, 150)
        high = kq.submit(ns, "high", 1, "t4", priority="high-prio", instance=t4)  # the same quota, higher priority
        requeued = wait_for(
            lambda: (j := get_job(kq.custom, ns, "low"))["status"].get("queue", {}).get("evictions", 0) >= 1 and j,
            timeout=90, what="low evicted by Kueue",
        )
        assert "Preempted" in " ".join(event_messages(kq.core, ns, "low"))
        wait_phase(kq.custom, ns, "low", "Queued", timeout=90)  # back in the queue, the next attempt's JobSet
        assert requeued["status"]["interruptions"] >= 1
        kq.custom.delete_namespaced_custom_object(js.GROUP, js.VERSION, ns, js.PLURAL, high["metadata"]["name"])
        st = finish(kq.custom, h, ns, "low", steps, timeout=240)  # weights as uninterrupted; few steps redone
    finally:
        h.stop()
    assert st["queue"]["evictions"] == 1 and st["queue"]["flavor"] == "t4-spot"
    runs = h.steps_reached()
    assert len(runs) >= 2 and runs[1][1] is not None and runs[1][1] >= 150  # resumed from the SIGTERM checkpoint


def event_messages(core: Any, ns: str, name: str) -> list[str]:
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TrainingJob")
    return [e.message or "" for e in events.items]


def test_the_charts_kueue_and_jobset_rbac_runs_a_queued_job(kq: Kueued, ns: str, tmp_path: Path) -> None:
    """``helm install`` with kueue.enabled and jobset.enabled; the operator under the chart's
    ServiceAccount queues, runs and deletes a job with no RBAC denial."""
    env = kq.cluster.env()
    e2e = E2ECluster(kq.cluster.kubeconfig, kq.api, env, kq.cluster.binaries, kq.cluster)
    rel = install(e2e, ns, "--set", "kueue.enabled=true", "--set", "jobset.enabled=true")
    try:
        assert rel.can("create", "jobsets.jobset.x-k8s.io", ns) and rel.can("delete", "jobsets.jobset.x-k8s.io", ns)
        assert rel.can("watch", "workloads.kueue.x-k8s.io", ns) and rel.can("list", "resourceflavors.kueue.x-k8s.io")
        assert not rel.can("create", "workloads.kueue.x-k8s.io", ns) and not rel.can("patch", "clusterqueues.kueue.x-k8s.io")
        queue = kq.queue(ns, "gpu-cq-helm", spot_quota=0, od_quota=2 * GPUS_PER_NODE)
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        op_env = {k: v for k, v in env.items() if not k.startswith("GPUSCALER_")}
        op_env.update(rel.deployment_env())  # the settings exactly as the chart renders them
        op_env.update(
            KUBECONFIG=str(sa_kubeconfig(e2e, rel, tmp_path / "sa.kubeconfig")),
            GPUSCALER_NAMESPACE=ns, GPUSCALER_HEALTH_PORT="0", GPUSCALER_METRICS_PORT="0",
            GPUSCALER_RECONCILE_INTERVAL_S="0.5", GPUSCALER_KWOK_PROVISIONING_DELAY_S="1", PYTHONUNBUFFERED="1",
        )
        log = tmp_path / "operator.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=op_env, stdout=out, stderr=out)
        with rbac_checked(proc, log):
            manifest = job_manifest("helm", instance=P4D.name, gpus=2 * GPUS_PER_NODE)
            manifest["spec"]["queueName"] = queue
            manifest["spec"]["template"]["metadata"] = {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "1h"}}
            apply(e2e, ns, manifest)
            running = wait_phase(kq.custom, ns, "helm", "Running", timeout=180)
            assert running["status"]["queue"]["admitted"] and running["status"]["queue"]["flavor"] == "a100-od"
            kubectl(e2e, "delete", "trainingjob", "helm", "-n", ns, "--timeout=90s")
            wait_for(
                lambda: not kq.custom.list_namespaced_custom_object(js.GROUP, js.VERSION, ns, js.PLURAL)["items"],
                timeout=90, what="the JobSet deleted with the job",
            )
    finally:
        kubectl(e2e, "delete", "trainingjobs", "--all", "-n", ns, "--timeout=60s", check=False)
        subprocess.run(["helm", "uninstall", rel.name, "-n", ns], env=env, capture_output=True, check=False, timeout=120)


def test_quota_fallback_moves_a_queued_job_to_the_plan_kueue_has_quota_for(kq: Kueued, ns: str, tmp_path: Path) -> None:
    """With kueueQuotaFallback, the cheapest plan (p4d spot) has no quota left, so the job moves to
    the next plan that meets the deadline (p4d on-demand), which Kueue admits and which runs."""
    queue = kq.queue(ns, "gpu-cq-fallback", spot_quota=0, od_quota=2 * GPUS_PER_NODE)
    env = kq.cluster.env()
    e2e = E2ECluster(kq.cluster.kubeconfig, kq.api, env, kq.cluster.binaries, kq.cluster)
    apply_crds(env, [ROOT / "crds" / n for n in ("trainingjob.yaml", "gpuscalingpolicy.yaml", "performanceprofile.yaml")],
               ["trainingjobs.gpuscaler.io", "gpuscalingpolicies.gpuscaler.io", "performanceprofiles.gpuscaler.io"])
    op = OperatorProcess(e2e, ns, tmp_path / "operator.log", GPUSCALER_KUEUE_QUOTA_FALLBACK="true",
                         GPUSCALER_RESYNC_INTERVAL_S=QUEUED_RESYNC_S)  # fmt: skip
    op.start()
    try:
        manifest = job_manifest("fallback", instance=P4D.name, gpus=2 * GPUS_PER_NODE)
        manifest["spec"]["constraints"]["spot"] = "allowed"
        manifest["spec"]["queueName"] = queue
        manifest["spec"]["template"]["metadata"] = {"annotations": {POD_COMPLETE_DELAY_ANNOTATION: "1h"}}
        apply(e2e, ns, manifest)
        running = wait_phase(kq.custom, ns, "fallback", "Running", timeout=180)
        st = running["status"]
        assert st["capacityType"] == "on-demand" and st["queue"]["flavor"] == "a100-od"
        assert st["plan"]["why"].startswith("chosen within the Kueue quota left: ")
        assert "insufficient" in st["plan"]["why"] and "spot" in st["plan"]["why"].split(" has none")[0]
        [left_out] = [u for u in st["unavailable"] if u["reason"].startswith("no Kueue quota")]
        assert left_out["instanceType"] == P4D.name and left_out["capacityType"] == "spot"
        assert st["attempt"] == 2  # the spot plan's JobSet was withdrawn, the on-demand one queued
        kubectl(e2e, "delete", "trainingjob", "fallback", "-n", ns, "--timeout=90s")
    finally:
        op.stop()
        print((tmp_path / "operator.log").read_text(errors="replace")[-4000:])
