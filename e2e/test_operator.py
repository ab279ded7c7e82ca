"""End to end: the TrainingJob operator (``gpuscaler run``, a subprocess) on the real control plane.

The kwok provider creates the planned fake GPU nodes, the real scheduler binds the workers to
them and kwok marks them Running. The "training" is played from here, the way the runtime reports
it: the worker pod gets the progress annotations :class:`gpuscaler.runtime.progress.Progress`
writes, and its status is set to Succeeded (exit code 0) as a kubelet would after the process
exits. Each test runs its own operator, scoped to the test's namespace.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.cloud import JOB_LABEL
from gpuscaler.names import INTERRUPTION_ANNOTATION
from gpuscaler.runtime.constants import ANNOTATION_CHECKPOINT_REQUESTED
from operator_helpers import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    apply,
    event_messages,
    event_reasons,
    finish_workers,
    get_job,
    job_manifest,
    job_nodes,
    job_pods,
    kubectl,
    phase_of,
    wait_phase,
)

# --------------------------------------------------------------------------------------- tests


def test_operator_runs_a_job_to_success(dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess]) -> None:
    """apply -> planned -> nodes made -> workers scheduled there and Running -> Succeeded -> nodes gone."""
    operator()
    apply(dev_cluster, namespace, job_manifest("cnn", instance="p4d.24xlarge", gpus=16))
    job = wait_phase(custom, namespace, "cnn", "Running", timeout=60)
    st = job["status"]
    assert st["plan"]["nodes"] == 2 and st["gpus"] == 16 and st["instanceType"] == "p4d.24xlarge"
    assert st["capacityType"] == "on-demand" and st["startTime"]

    nodes = job_nodes(core, namespace, "cnn")
    assert len(nodes) == 2
    assert {n.metadata.labels["node.kubernetes.io/instance-type"] for n in nodes} == {"p4d.24xlarge"}
    pods = job_pods(core, namespace, "cnn")
    assert sorted(p.metadata.name for p in pods) == ["cnn-worker-0", "cnn-worker-1"]
    assert {p.spec.node_name for p in pods} == {n.metadata.name for n in nodes}, "one worker per planned node"
    env = {e.name: e.value for e in pods[0].spec.containers[0].env}
    assert env["WORLD_SIZE"] == "2" and env["NPROC_PER_NODE"] == "8" and env["MASTER_PORT"] == "29500"
    assert env["GPUSCALER_PRECISION"] == st["plan"]["precision"]
    assert env["GPUSCALER_MICRO_BATCH"] == str(st["plan"]["microBatch"])
    assert pods[0].spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
    assert pods[0].metadata.owner_references[0].kind == "TrainingJob"
    assert core.read_namespaced_service("cnn-workers", namespace).spec.cluster_ip == "None"

    table = kubectl(dev_cluster, "get", "trainingjobs", "-n", namespace).stdout
    assert table.split()[:7] == ["NAME", "PHASE", "GPUS", "TYPE", "CAPACITY", "COST", "ETA"], table
    assert "Running" in table and "p4d.24xlarge" in table

    finish_workers(core, namespace, "cnn")
    job = wait_phase(custom, namespace, "cnn", "Succeeded", timeout=30)
    st = job["status"]
    assert st["progress"]["step"] == 50 and st["progress"]["samples"] == 50 * 256
    assert st["completionTime"] and st["costUsd"] >= 0
    wait_for(lambda: not job_nodes(core, namespace, "cnn"), timeout=30, what="nodes released")
    reasons = event_reasons(core, namespace, "cnn")
    for r in ("Started", "Succeeded", "ScaledDown"):
        assert r in reasons, reasons
    # up within 30 s: no Event on the way, the Started Event gives the way there (controller/bringup.py);
    # the plan is its own Event, or said in Started when the gang ran within the status hold
    # (controller/status_writes.py: one Event and one write for the way up)
    assert "ScaledUp" not in reasons and "NodesReady" not in reasons, reasons
    (started,) = event_messages(core, namespace, "cnn", "Started")
    assert re.search(r"\(requested, nodes Ready \+[\d.]+s, running \+[\d.]+s\)(; planned 2 x p4d\.24xlarge .*)?$", started), started
    assert ("Planned" in reasons) != ("; planned " in started), (reasons, started)


def test_operator_suspend_plans_without_provisioning(dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess]) -> None:
    operator()
    apply(dev_cluster, namespace, job_manifest("held", suspend=True))
    wait_for(lambda: (get_job(custom, namespace, "held").get("status") or {}).get("plan"), timeout=30, what="plan")
    time.sleep(2)
    st = get_job(custom, namespace, "held")["status"]
    assert st["phase"] == "Pending" and st["plan"]["instanceType"] == "p3.2xlarge"
    assert not job_nodes(core, namespace, "held") and not job_pods(core, namespace, "held")
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "held", {"spec": {"suspend": False}})
    wait_phase(custom, namespace, "held", "Running", timeout=30)
    assert len(job_nodes(core, namespace, "held")) == 1
    # a one-node gang meets on its own pod: MASTER_ADDR is the pod, and no rendezvous Service is made
    (pod,) = job_pods(core, namespace, "held")
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["WORLD_SIZE"] == "1" and env["MASTER_ADDR"] == "127.0.0.1" and pod.spec.subdomain is None
    assert not core.list_namespaced_service(namespace).items


BAD_SPECS = [
    ({"objective": "fastest"}, "spec.budgetUsd"),
    ({"training": {"epochs": 1, "steps": 10}}, "spec.training"),
    ({"workload": {}}, "spec.workload"),
    ({"workload": {"params": 1e9}}, "spec.workload.flopsPerSample"),
    ({"workload": {"model": "resnet50", "variableInputs": True}}, "a named workload has its own"),
    ({"workload": {"transformer": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 8, "vocab": 100},
                   "depthwiseFlopShare": 0.1}}, "spec.workload.depthwiseFlopShare"),
    ({"workload": {"params": 1e9, "flopsPerSample": 1e12, "depthwiseFlopShare": 1}}, "spec.workload.depthwiseFlopShare"),
    ({"globalBatch": 0}, "spec.globalBatch"),
    ({"constraints": {"spot": "sometimes"}}, "spec.constraints.spot"),
    ({"constraints": {"maxDeadlineRisk": 2}}, "spec.constraints.maxDeadlineRisk"),
    ({"maxDuration": "soon"}, "spec.maxDuration"),
    ({"gpus": 8}, "spec.gpus"),
]


@pytest.mark.parametrize(("change", "field"), BAD_SPECS, ids=[f for _, f in BAD_SPECS])
def test_operator_invalid_specs_refused(dev_cluster: E2ECluster, crd: None, change: dict[str, Any], field: str) -> None:
    """The API server refuses each mistake, and its message names the field."""
    doc = job_manifest("bad")
    doc["metadata"]["namespace"] = "default"
    doc["spec"].update(change)
    res = kubectl(dev_cluster, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
    assert res.returncode != 0, res.stdout
    assert field in res.stderr, res.stderr


def test_operator_restart_mid_provisioning(dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess]) -> None:
    """SIGKILL the operator while nodes are being provisioned; a new one finishes with no duplicates."""
    first = operator(GPUSCALER_KWOK_PROVISIONING_DELAY_S="4")
    apply(dev_cluster, namespace, job_manifest("bert", instance="p4d.24xlarge", gpus=16))
    # The nodes are created inside a reconcile step and the phase is written when that step ends,
    # so wait for both: the operator must die with nodes requested and the job still Provisioning.
    wait_for(
        lambda: phase_of(custom, namespace, "bert") == "Provisioning" and len(job_nodes(core, namespace, "bert")) >= 1,
        timeout=30,
        interval=0.1,
        what="first node while Provisioning",
    )
    assert not any(p.status.phase == "Running" for p in job_pods(core, namespace, "bert"))
    first.kill()
    operator(GPUSCALER_KWOK_PROVISIONING_DELAY_S="4")
    wait_phase(custom, namespace, "bert", "Running", timeout=60)
    time.sleep(2)  # a few more reconciles: nothing may be added
    nodes = job_nodes(core, namespace, "bert")
    pods = job_pods(core, namespace, "bert")
    assert len(nodes) == 2, [n.metadata.name for n in nodes]
    assert sorted(p.metadata.name for p in pods) == ["bert-worker-0", "bert-worker-1"]
    assert get_job(custom, namespace, "bert")["status"]["attempt"] == 1
    finish_workers(core, namespace, "bert")
    wait_phase(custom, namespace, "bert", "Succeeded", timeout=30)
    wait_for(lambda: not job_nodes(core, namespace, "bert"), timeout=30, what="nodes released")


def test_operator_gang_timeout_replans(dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess]) -> None:
    """Only 1 of 2 p4d nodes exists: after the gang timeout it is released and the job re-planned elsewhere."""
    operator(
        GPUSCALER_KWOK_CAPACITY=json.dumps({"p4d.24xlarge": 1}),
        GPUSCALER_GANG_TIMEOUT_S="4",
    )
    doc = job_manifest("gang", instance="p4d.24xlarge", gpus=16)
    doc["spec"]["constraints"]["instanceTypes"] = ["p4d.24xlarge", "p4de.24xlarge"]
    apply(dev_cluster, namespace, doc)
    job = wait_phase(custom, namespace, "gang", "Running", timeout=60)
    st = job["status"]
    assert st["instanceType"] == "p4de.24xlarge", st
    assert [u["instanceType"] for u in st["unavailable"]] == ["p4d.24xlarge"]
    assert {n.metadata.labels["node.kubernetes.io/instance-type"] for n in job_nodes(core, namespace, "gang")} == {
        "p4de.24xlarge"
    }
    assert "GangTimeout" in event_reasons(core, namespace, "gang")


def test_operator_fifty_jobs_reach_running(dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess]) -> None:
    operator(GPUSCALER_KWOK_PROVISIONING_DELAY_S="0.5")
    docs = [job_manifest(f"many-{i}") for i in range(50)]
    t0 = time.monotonic()
    kubectl(dev_cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))

    def all_running() -> bool:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        return sum((i.get("status") or {}).get("phase") == "Running" for i in items) == 50

    wait_for(all_running, timeout=120, interval=1, what="50 jobs Running")
    print(f"50 jobs applied -> all Running in {time.monotonic() - t0:.1f}s")
    nodes = core.list_node(label_selector=JOB_LABEL).items
    mine = [n for n in nodes if n.metadata.labels[JOB_LABEL].startswith(f"{namespace}.")]
    assert len(mine) == 50


def test_operator_steps_a_job_on_its_pod_and_node_changes_not_on_a_timer(dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess]) -> None:
    """With the resync and the time-critical period at 10 minutes (the shortest timer left is the 30 s
    cost refresh of a job holding nodes), jobs still move on each change of their nodes and pods within
    seconds: their steps are driven by the watch events of those objects, not by a timer."""
    resync = 600.0
    operator(GPUSCALER_RESYNC_INTERVAL_S=f"{resync:g}", GPUSCALER_RECONCILE_INTERVAL_S=f"{resync:g}")
    bound = 20.0  # well under the resync, and under the cost refresh
    for name in ("by-pod", "by-node"):
        apply(dev_cluster, namespace, job_manifest(name))
    for name in ("by-pod", "by-node"):  # node Ready, then the pod Running: each a watch event
        wait_phase(custom, namespace, name, "Running", timeout=bound * 3)

    t0 = time.monotonic()
    finish_workers(core, namespace, "by-pod")  # a pod change: its workers exit 0
    wait_phase(custom, namespace, "by-pod", "Succeeded", timeout=bound)
    print(f"worker pods Succeeded -> job Succeeded in {time.monotonic() - t0:.1f}s (resync {resync:g}s)")

    (node,) = job_nodes(core, namespace, "by-node")
    t0 = time.monotonic()
    core.patch_node(node.metadata.name, {"metadata": {"annotations": {INTERRUPTION_ANNOTATION: "e2e notice"}}})

    def checkpoint_requested() -> bool:
        return any(ANNOTATION_CHECKPOINT_REQUESTED in (p.metadata.annotations or {}) for p in job_pods(core, namespace, "by-node"))

    wait_for(checkpoint_requested, timeout=bound, interval=0.2, what="the checkpoint request after the node's notice")
    print(f"node notice -> checkpoint requested in {time.monotonic() - t0:.1f}s (resync {resync:g}s)")
    assert phase_of(custom, namespace, "by-node") == "Checkpointing"
