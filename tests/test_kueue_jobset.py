"""Kueue and JobSet on the gpuscaler side: spec fields, the JobSet builder, flavor matching and
what a Workload's conditions say (pure functions; the real controllers run in e2e/test_kueue.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpuscaler.api.trainingjob import TrainingJob, WorkerRuntime, effective_queue
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.kube import jobset as js
from gpuscaler.kube import kueue
from gpuscaler.kube.workers import DISRUPTION_TARGET, PODINFO_VOLUME, WorkerPlan, pod_state, worker_pod
from gpuscaler.names import QUEUE_NAME_LABEL, RANK_LABEL
from gpuscaler.runtime import constants as rc

CAT = load_catalog()

BASE_SPEC: dict[str, Any] = {
    "workload": {"model": "resnet50"},
    "globalBatch": 256,
    "training": {"samples": 1_000_000},
    "maxDuration": "24h",
}


def plan(nodes: int = 2, attempt: int = 1) -> WorkerPlan:
    return WorkerPlan(
        job_name="resnet", namespace="ns", job_label="ns.resnet", owner={"uid": "u1", "kind": "TrainingJob"},
        nodes=nodes, gpus_per_node=8, precision="amp", micro_batch=32, accumulation=1, checkpoint_dir="/c",
        checkpoint_interval_s=600, checkpoint_keep=2, master_port=29500, attempt=attempt,
        node_selector={"node.kubernetes.io/instance-type": "p4d.24xlarge", "karpenter.sh/capacity-type": "spot"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        default_image="python:3.11-slim",
        template={"spec": {"containers": [{"name": "train", "image": "trainer:1", "env": [{"name": "A", "value": "1"}]}]}},
    )


# --- the spec fields ------------------------------------------------------------------------


def test_queue_name_and_runtime_are_read_and_default() -> None:
    job = TrainingJob.model_validate({"spec": {**BASE_SPEC, "queueName": "team-a", "runtime": "jobset"}})
    assert job.spec.queue_name == "team-a"
    assert job.spec.runtime is WorkerRuntime.JOBSET
    plain = TrainingJob.model_validate({"spec": BASE_SPEC})
    assert plain.spec.queue_name is None and plain.spec.runtime is WorkerRuntime.PODS


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("queueName", "Team_A", "not a LocalQueue name"),
        ("queueName", "", "at least 1 character"),
        ("queueName", 7, "string"),
        ("runtime", "mpi", "'pods' or 'jobset'"),
    ],
)
def test_bad_queue_or_runtime_is_refused_naming_the_field(field: str, value: Any, needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        TrainingJob.model_validate({"spec": {**BASE_SPEC, field: value}})
    text = str(err.value)
    assert field in text and needle in text


def test_the_queue_label_is_honoured_and_must_agree_with_the_field() -> None:
    labelled = TrainingJob.model_validate({"metadata": {"labels": {QUEUE_NAME_LABEL: "team-b"}}, "spec": BASE_SPEC})
    assert effective_queue(labelled.spec.queue_name, labelled.metadata.labels) == "team-b"  # type: ignore[attr-defined]
    same = {"metadata": {"labels": {QUEUE_NAME_LABEL: "team-b"}}, "spec": {**BASE_SPEC, "queueName": "team-b"}}
    assert TrainingJob.model_validate(same).spec.queue_name == "team-b"
    with pytest.raises(ValidationError, match="name different queues"):
        TrainingJob.model_validate({**same, "spec": {**BASE_SPEC, "queueName": "team-c"}})
    with pytest.raises(ValueError, match="not a LocalQueue name"):
        effective_queue(None, {QUEUE_NAME_LABEL: "No Spaces"})
    assert effective_queue(None, None) is None


def test_the_crd_schema_carries_the_new_fields() -> None:
    from gpuscaler.api.crd import trainingjob_crd

    schema = trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    assert spec["runtime"]["enum"] == ["pods", "jobset"] and spec["runtime"]["default"] == "pods"
    assert spec["queueName"]["pattern"] == r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    assert "Queued" in schema["properties"]["status"]["properties"]["phase"]["enum"]


# --- the JobSet -----------------------------------------------------------------------------


def test_jobset_is_one_indexed_job_of_n_workers_with_the_pod_of_runtime_pods() -> None:
    p = plan(nodes=3, attempt=2)
    body = js.jobset(p, queue="team-a")
    assert body["metadata"]["name"] == "resnet-a2"
    assert body["metadata"]["labels"][QUEUE_NAME_LABEL] == "team-a"
    assert body["spec"]["suspend"] is True  # Kueue admits, then un-suspends
    assert body["metadata"]["ownerReferences"] == [p.owner]
    [rjob] = body["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert rjob["replicas"] == 1 and job["parallelism"] == job["completions"] == 3
    assert job["completionMode"] == "Indexed"
    pod = job["template"]
    ref = worker_pod(p, 0)
    assert pod["spec"]["nodeSelector"] == ref["spec"]["nodeSelector"] == p.node_selector
    assert pod["spec"]["tolerations"] == ref["spec"]["tolerations"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == [PODINFO_VOLUME]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "hostname" not in pod["spec"] and RANK_LABEL not in pod["metadata"]["labels"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["MASTER_ADDR"]["value"] == "resnet-a2-workers-0-0.resnet-a2.ns.svc"
    assert body["spec"]["network"]["subdomain"] == "resnet-a2"
    assert env["WORLD_SIZE"]["value"] == "3" and env["A"]["value"] == "1"
    assert env[rc.ENV_MICRO_BATCH]["value"] == "32"


def test_extra_labels_reach_the_jobset_but_never_override_gpuscalers() -> None:
    body = js.jobset(plan(), queue="q", labels={"kueue.x-k8s.io/priority-class": "high", QUEUE_NAME_LABEL: "other"})
    labels = body["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/priority-class"] == "high" and labels[QUEUE_NAME_LABEL] == "q"


def test_without_a_queue_the_jobset_starts_at_once() -> None:
    body = js.jobset(plan(), queue=None)
    assert body["spec"]["suspend"] is False and QUEUE_NAME_LABEL not in body["metadata"]["labels"]


def test_failure_policy_tells_preemptions_from_failures() -> None:
    body = js.jobset(plan(), max_restarts=2)
    rules = body["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    ignored = [r for r in rules if r["action"] == "Ignore"]
    assert {"type": DISRUPTION_TARGET, "status": "True"} in ignored[0]["onPodConditions"]
    assert ignored[1]["onExitCodes"]["values"] == [rc.EXIT_PREEMPTED]
    [fail] = [r for r in rules if r["action"] == "FailJob"]
    assert fail["onExitCodes"] == {"containerName": "train", "operator": "NotIn", "values": [0, rc.EXIT_PREEMPTED]}
    policy = body["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 2
    assert policy["rules"][0]["action"] == "FailJobSet" and policy["rules"][0]["onJobFailureReasons"] == [
        "PodFailurePolicy"
    ]


def test_jobset_names_stay_short_and_change_per_attempt() -> None:
    long = "a-very-long-training-job-name-that-goes-on-and-on-and-on"
    names = {js.jobset_name(long, a) for a in (1, 2, 10)}
    assert len(names) == 3 and all(len(n) <= js.MAX_NAME and n[0].isalpha() for n in names)


def test_a_jobset_pod_reads_its_rank_from_the_completion_index() -> None:
    pod = {"metadata": {"name": "resnet-a1-workers-0-1-x", "labels": {"batch.kubernetes.io/job-completion-index": "1"}}}
    assert pod_state(pod).rank == 1


@pytest.mark.parametrize(
    ("conditions", "suspend", "phase"),
    [
        ([{"type": "Completed", "status": "True"}], False, "Completed"),
        ([{"type": "Failed", "status": "True"}], False, "Failed"),
        ([], True, "Suspended"),
        ([], False, "Active"),
    ],
)
def test_jobset_phase(conditions: list[dict[str, str]], suspend: bool, phase: str) -> None:
    assert js.jobset_phase({"spec": {"suspend": suspend}, "status": {"conditions": conditions}}) == phase


# --- flavors --------------------------------------------------------------------------------


def test_flavor_matching_follows_the_documented_labels() -> None:
    p4d = CAT.instance("p4d.24xlarge")
    g5 = CAT.instance("g5.xlarge")
    flavors = [
        kueue.Flavor("a100-spot", {"node.kubernetes.io/instance-type": "p4d.24xlarge", "karpenter.sh/capacity-type": "spot"}),
        kueue.Flavor("a100-od", {"node.kubernetes.io/instance-type": "p4d.24xlarge"}),
        kueue.Flavor("a100-any-spot", {"nvidia.com/gpu.product": p4d.gpu.product_label, "eks.amazonaws.com/capacityType": "SPOT"}),
        kueue.Flavor("cpu", {"kubernetes.io/arch": "amd64"}),
        kueue.Flavor("g5", {"gpuscaler.io/gpu": g5.gpu.id, "karpenter.sh/capacity-type": "spot"}),
    ]
    assert kueue.matching_flavors(flavors, p4d, CapacityType.SPOT) == ["a100-spot", "a100-any-spot"]
    assert kueue.matching_flavors(flavors, p4d, CapacityType.ON_DEMAND) == ["a100-od"]
    assert kueue.matching_flavors(flavors, g5, CapacityType.SPOT) == ["g5"]
    assert kueue.matching_flavors(flavors, g5, CapacityType.ON_DEMAND) == []
    gke = kueue.Flavor("gke-spot", {"node.kubernetes.io/instance-type": "p4d.24xlarge", "cloud.google.com/gke-spot": "true"})
    assert gke.capacity() is CapacityType.SPOT
    odd = kueue.Flavor("odd", {"node.kubernetes.io/instance-type": "p4d.24xlarge", "karpenter.sh/capacity-type": "reserved"})
    assert odd.capacity() is None and not odd.matches(p4d, CapacityType.ON_DEMAND)


def test_flavor_from_a_resource_flavor_object() -> None:
    f = kueue.Flavor.from_object({"metadata": {"name": "x"}, "spec": {"nodeLabels": {"a": "b"}}})
    assert f == kueue.Flavor("x", {"a": "b"})


# --- workloads ------------------------------------------------------------------------------

NO_QUOTA = (
    "couldn't assign flavors to pod set workers: insufficient quota for nvidia.com/gpu in flavor a100-spot, "
    "previously considered podsets requests (0) + current podset request (16) > maximum capacity (8)"
)


def test_a_pending_workload_says_why() -> None:
    wl = {
        "metadata": {"name": "jobset-resnet-a1-1"},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": NO_QUOTA}]},
    }
    st = kueue.workload_state(wl)
    assert not st.admitted and not st.quota_reserved and st.reason == NO_QUOTA
    assert kueue.queued_message("team-a", st) == f"Queued in LocalQueue team-a: {NO_QUOTA}"
    assert "create the Workload" in kueue.queued_message("team-a", None)


def test_an_admitted_workload_names_its_flavor_and_cluster_queue() -> None:
    wl = {
        "metadata": {"name": "w"},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
            "admission": {
                "clusterQueue": "gpu-cq",
                "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "default", "nvidia.com/gpu": "a100-spot"}}],
            },
        },
    }
    st = kueue.workload_state(wl)
    assert st.admitted and st.cluster_queue == "gpu-cq" and st.flavor == "a100-spot" and st.reason == ""


def test_admission_checks_and_evictions_are_reasons() -> None:
    checking = {
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admissionChecks": [{"name": "dws", "state": "Pending", "message": "provisioning"}],
        }
    }
    assert kueue.workload_state(checking).reason == "waiting for admission checks: dws: Pending - provisioning"
    evicted = {
        "status": {
            "conditions": [
                {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"},
            ]
        }
    }
    st = kueue.workload_state(evicted)
    assert st.evicted and st.reason == "evicted (Preempted): Preempted to accommodate a workload"
    assert kueue.owned_by({"metadata": {"ownerReferences": [{"uid": "u1"}]}}, "u1")
    assert not kueue.owned_by({"metadata": {}}, "u1")
