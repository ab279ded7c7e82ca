"""The reconcile loop with a fake provider and fake worker client (no cluster)."""

from __future__ import annotations

import pytest

from gpuscaler.api.status import Phase
from gpuscaler.cloud import JobRef, NodeRequest, node_names
from gpuscaler.cloud.fake import FakeNodeGroup, FakePodProvisioner, FakeProvider
from gpuscaler.cloud.provider import job_label_value
from gpuscaler.controller.reconcile import format_duration, status_change
from gpuscaler.kube.workers import PodState, pod_state, worker_pod
from loop_harness import CATALOG, RESNET_SPEC, World, make_job, node_body


def test_happy_path_plans_provisions_starts_and_succeeds() -> None:
    w = World()
    job = make_job()
    reasons = w.step(job)
    # the nodes asked for are said in the Started Event (a gang up within 30 s: controller/bringup.py)
    assert w.status.phase is Phase.PROVISIONING and reasons == ["Planned"]
    assert w.status.plan is not None and w.status.plan.nodes == 2 and w.status.gpus == 16
    w.step(job)
    assert len(w.nodes) == 2 and w.status.phase is Phase.PROVISIONING
    w.ready()
    reasons = w.step(job)
    assert w.status.phase is Phase.STARTING and reasons == []
    assert any(c.type == "NodesReady" and c.status == "True" for c in w.status.conditions)
    assert sorted(p["metadata"]["name"] for p in w.workers.pods()) == ["job-worker-0", "job-worker-1"]
    assert "Service/job-workers" in w.workers.objects
    w.step(job)
    assert len(w.workers.pods()) == 2, "create-if-absent: no duplicates"
    w.phases = {"job-worker-0": "Running", "job-worker-1": "Running"}
    reasons = w.step(job)
    assert w.status.phase is Phase.RUNNING and reasons == ["Started"] and w.status.start_time
    assert w.events[0].message.endswith("(requested, nodes Ready +2.0s, running +4.0s)"), w.events[0].message
    w.phases = {"job-worker-0": "Succeeded", "job-worker-1": "Succeeded"}
    reasons = w.step(job, seconds=3600)
    assert w.status.phase is Phase.SUCCEEDED and "Succeeded" in reasons and "ScaledDown" in reasons
    assert w.status.cost_usd > 0 and w.status.released_cost_usd > 0 and w.status.nodes == []


def test_suspend_plans_without_provisioning_then_starts() -> None:
    w = World()
    w.step(make_job(suspend=True))
    assert w.status.phase is Phase.PENDING and w.status.plan is not None
    assert not w.nodes and not w.provider.ensured
    w.step(make_job(suspend=False))
    assert w.status.phase is Phase.PROVISIONING and len(w.nodes) == 0  # appear on the next observation
    w.step(make_job(suspend=False))
    assert len(w.nodes) == 2


def test_gang_timeout_releases_backs_off_and_replans() -> None:
    w = World(FakeProvider(capacity=1), gang_timeout_s=60, capacity_backoff_s=900)
    job = make_job()
    w.step(job)
    first = w.status.plan
    assert first is not None
    w.step(job)
    w.ready()
    assert len(w.nodes) == 1 and w.status.phase is Phase.PROVISIONING
    reasons = w.step(job, seconds=120)
    assert "GangTimeout" in reasons and "Planned" in reasons
    assert set(w.provider.released) == set(w.nodes), "the partial gang is released"
    assert [(u.instance_type, u.capacity_type) for u in w.status.unavailable] == [
        (first.instance_type, first.capacity_type)
    ]
    assert w.status.plan is not None and (w.status.plan.instance_type, w.status.plan.capacity_type) != (
        first.instance_type,
        first.capacity_type,
    )
    assert w.status.phase is Phase.PROVISIONING and w.status.attempt == 2


def test_worker_failures_retry_then_fail() -> None:
    w = World(backoff_limit=1)
    job = make_job()
    w.two_workers_running(job)
    w.phases["job-worker-1"] = "Failed"
    reasons = w.step(job)
    assert w.status.phase is Phase.RECOVERING and "WorkerFailed" in reasons and w.status.failures == 1
    w.step(job)  # old workers deleted
    w.phases = {}
    w.step(job)
    assert w.status.phase in (Phase.PROVISIONING, Phase.STARTING)
    w.step(job)
    w.phases = {"job-worker-0": "Running", "job-worker-1": "Failed"}
    w.step(job)
    reasons = w.step(job)
    assert w.status.phase is Phase.FAILED, (w.status.phase, w.status.message)
    assert "backoff limit" in w.status.message
    w.step(job)
    assert not w.nodes


def test_lost_node_recovers_with_same_names() -> None:
    w = World()
    job = make_job()
    w.two_workers_running(job)
    w.nodes.pop(sorted(w.nodes)[0])
    for body in w.workers.pods():
        body.setdefault("spec", {})["nodeName"] = sorted(node_names(w.loop._request(job, w.status.plan)))[0]  # type: ignore[arg-type]
    reasons = w.step(job)
    assert "Interrupted" in reasons and w.status.phase is Phase.RECOVERING and w.status.interruptions == 1


def _launch(w: World, names: list[str], ready: bool = False) -> None:
    """Play Karpenter: nodes of the planned offering, no price annotation, names of its own."""
    plan = w.status.plan
    assert plan is not None
    for n in names:
        w.nodes[n] = node_body(n, instance_type=plan.instance_type, capacity_type=plan.capacity_type,
                               ready="True" if ready else None, created=w.now)


def test_pod_provisioner_gets_pods_first_and_its_nodes_are_the_jobs() -> None:
    w = World(FakePodProvisioner(), progress_event_after_s=0)  # every step on the way posts its Event
    prov = w.provider
    assert isinstance(prov, FakePodProvisioner)
    job = make_job()
    w.step(job)
    assert prov.prepared == [("p4d.24xlarge", 0)], "ensure_nodes is called for every provider"
    assert w.status.phase is Phase.STARTING
    assert sorted(p["metadata"]["name"] for p in w.workers.pods()) == ["job-worker-0", "job-worker-1"]
    assert w.status.message == "0/2 workers running; 0/2 nodes Ready"
    _launch(w, ["ip-10-0-0-7", "ip-10-0-0-9"])
    w.step(job)
    assert not prov.released, "nodes named by the provider are not mistaken for an earlier plan's"
    assert w.status.nodes == ["ip-10-0-0-7", "ip-10-0-0-9"] and len(prov.prepared) == 1
    w.ready()
    assert "NodesReady" in w.step(job)
    assert "NodesReady" not in w.step(job), "posted once"
    w.phases = {"job-worker-0": "Running", "job-worker-1": "Running"}
    assert "Started" in w.step(job) and w.status.phase is Phase.RUNNING
    w.phases = {"job-worker-0": "Succeeded", "job-worker-1": "Succeeded"}
    reasons = w.step(job, seconds=3600)
    assert w.status.phase is Phase.SUCCEEDED and "ScaledDown" in reasons
    assert sorted(prov.released) == ["ip-10-0-0-7", "ip-10-0-0-9"] and w.status.nodes == []
    hourly = CATALOG.instance("p4d.24xlarge").ondemand_usd_hr
    assert w.status.released_cost_usd == pytest.approx(2 * hourly, rel=0.01), "priced from the catalog"


def test_pod_provisioner_gang_timeout_runs_on_pod_scheduling() -> None:
    w = World(FakePodProvisioner(), gang_timeout_s=60, capacity_backoff_s=900)
    prov = w.provider
    assert isinstance(prov, FakePodProvisioner)
    job = make_job()
    w.step(job)
    first = w.status.plan
    assert first is not None
    _launch(w, ["ip-10-0-0-7"], ready=True)  # one of two: the gang never starts
    w.phases = {"job-worker-0": "Running"}
    w.step(job)
    assert w.status.phase is Phase.STARTING
    reasons = w.step(job, seconds=120)
    assert "GangTimeout" in reasons and "Planned" in reasons
    assert prov.released == ["ip-10-0-0-7"] and {"job-worker-0", "job-worker-1"} <= set(w.workers.deleted)
    assert [u.instance_type for u in w.status.unavailable] == [first.instance_type]
    assert w.status.plan is not None and w.status.plan.instance_type != first.instance_type
    second = w.status.plan.instance_type
    # the released node is still observed (being deleted): it belongs to the earlier plan
    w.nodes = {"ip-10-0-0-7": node_body("ip-10-0-0-7", instance_type=first.instance_type,
                                        capacity_type=first.capacity_type, ready="True", created=w.now, deleting=True)}
    w.step(job)
    assert w.status.phase is Phase.STARTING and w.status.attempt == 2
    assert [t for t, _ in prov.prepared] == [first.instance_type, second], "ensure_nodes again for the new gang"
    assert not prov.released


def test_pod_provisioner_releases_nodes_of_another_offering() -> None:
    w = World(FakePodProvisioner())
    job = make_job()
    w.step(job)
    w.nodes["old-node"] = node_body("old-node", instance_type="p3.2xlarge", capacity_type="spot", ready="True",
                                    created=w.now, price=1.0)
    assert "ScaledDown" in w.step(job)
    assert w.provider.released == ["old-node"]


def test_unknown_workload_fails_with_the_reason() -> None:
    w = World()
    w.step(make_job(workload={"model": "no-such-model"}))
    assert w.status.phase is Phase.FAILED and "no-such-model" in w.status.message


def test_worker_pod_manifest() -> None:
    from gpuscaler.kube.workers import WorkerPlan

    wp = WorkerPlan(
        job_name="bert", namespace="ml", job_label="ml.bert", owner={"uid": "u", "controller": True},
        nodes=2, gpus_per_node=8, precision="amp", micro_batch=32, accumulation=2,
        checkpoint_dir="/ckpt", checkpoint_interval_s=600, checkpoint_keep=3, master_port=29500, attempt=1,
        node_selector={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        default_image="img", template={"spec": {"containers": [{"name": "t", "image": "me/train", "env": [{"name": "WORLD_SIZE", "value": "9"}, {"name": "X", "value": "1"}]}]}},
    )
    pod = worker_pod(wp, 1)
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert pod["metadata"]["name"] == "bert-worker-1" and c["image"] == "me/train"
    assert env["WORLD_SIZE"] == "2" and env["NODE_RANK"] == "1" and env["X"] == "1"
    assert env["MASTER_ADDR"] == "bert-worker-0.bert-workers.ml.svc" and env["NPROC_PER_NODE"] == "8"
    assert env["GPUSCALER_PRECISION"] == "amp" and env["GPUSCALER_ACCUMULATION_STEPS"] == "2"
    assert env["GPUSCALER_CHECKPOINT_DIR"] == "/ckpt" and env["GPUSCALER_CHECKPOINT_INTERVAL_S"] == "600"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["subdomain"] == "bert-workers"
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u"
    state: PodState = pod_state({**pod, "status": {"phase": "Running"}})
    assert state.rank == 1 and state.owner_uid == "u"


def test_a_one_node_gang_meets_on_its_own_pod_without_a_service() -> None:
    w = World()
    job = make_job({**RESNET_SPEC, "constraints": {"instanceTypes": ["p3.2xlarge"], "minGpus": 1, "maxGpus": 1}})
    w.step(job)  # planned, its node asked for
    w.step(job)  # the node appears
    w.ready()
    w.step(job)  # Ready: the worker
    assert [p["metadata"]["name"] for p in w.workers.pods()] == [f"{job.name}-worker-0"]
    pod = w.workers.pods()[0]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"] == "1" and env["MASTER_ADDR"] == "127.0.0.1"
    assert "subdomain" not in pod["spec"]
    assert not [k for k in w.workers.objects if k.startswith("Service/")], "no rendezvous Service for one node"


def test_names_and_labels_are_deterministic_and_valid() -> None:
    inst = CATALOG.instance("p4d.24xlarge")
    from gpuscaler.catalog import CapacityType

    req = NodeRequest(JobRef("ns", "j" * 80), inst, CapacityType.SPOT, 3, 1.0)
    names = node_names(req)
    assert names == node_names(req) and len(set(names)) == 3 and all(len(n) <= 63 for n in names)
    assert len(job_label_value("n" * 40, "j" * 80)) <= 63
    assert job_label_value("ns", "job") == "ns.job"


@pytest.mark.parametrize(("s", "text"), [(50, "50s"), (125, "2m05s"), (7980, "2h13m"), (90000, "1d1h")])
def test_format_duration(s: float, text: str) -> None:
    assert format_duration(s) == text


def test_status_change_throttles_the_clock() -> None:
    assert status_change({"phase": "Running", "costUsd": 1}, {"phase": "Running", "costUsd": 1}) == "none"
    assert status_change({"phase": "Running", "costUsd": 1}, {"phase": "Running", "costUsd": 2}) == "clock"
    assert status_change({"phase": "Running"}, {"phase": "Succeeded"}) == "state"
    # only what kubectl get shows counts: the completion time shifting by seconds alone is no change
    at = {"phase": "Running", "costUsd": 1, "eta": "2h13m", "estimatedCompletionTime": "2026-12-01T18:00:00Z"}
    assert status_change(at, {**at, "estimatedCompletionTime": "2026-12-01T18:00:04Z"}) == "none"
    assert status_change(at, {**at, "eta": "2h12m"}) == "clock"


def test_node_group_nodes_with_cloud_names_are_the_jobs_not_an_earlier_plans() -> None:
    w = World(FakeNodeGroup(), progress_event_after_s=0)  # every step on the way posts its Event
    job = make_job()
    w.step(job)
    assert w.status.phase is Phase.PROVISIONING and w.provider.requested == 2
    _launch(w, ["ip-10-1-2-3", "ip-10-1-2-4"], ready=True)  # registered and adopted by the provider
    reasons = w.step(job)
    assert not w.provider.released, "adopted nodes are kept, not released as strangers"
    assert "NodesReady" in reasons and w.status.phase is Phase.STARTING
    assert w.status.nodes == ["ip-10-1-2-3", "ip-10-1-2-4"]
    w.phases = {"job-worker-0": "Running", "job-worker-1": "Running"}
    assert "Started" in w.step(job)
    w.phases = {"job-worker-0": "Succeeded", "job-worker-1": "Succeeded"}
    w.step(job, seconds=3600)
    assert w.status.phase is Phase.SUCCEEDED
    assert sorted(w.provider.released) == ["ip-10-1-2-3", "ip-10-1-2-4"]
