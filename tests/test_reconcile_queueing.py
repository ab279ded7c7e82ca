"""The loop with Kueue and JobSet (gpuscaler.controller.queueing): a queued job provisions nothing
until Kueue admits its gang, says why it waits, treats an eviction as an interruption and goes
back into the queue with a new JobSet; a ``runtime: jobset`` job runs its gang as one JobSet."""

from __future__ import annotations

from typing import Any

from gpuscaler.api.status import Phase
from gpuscaler.kube import jobset as js
from gpuscaler.kube import kueue
from gpuscaler.names import COMPLETION_INDEX_LABEL, JOB_LABEL
from loop_harness import GANG_SPEC, World, create_once, make_job

WAITING = "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu in flavor a100-spot"


class FakeGangs:
    """The loop's :class:`gpuscaler.controller.queueing.GangClient`: JobSets in a dict, the Workload a test sets."""

    def __init__(self, flavors: list[kueue.Flavor]) -> None:
        self.jobsets: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.workload: kueue.WorkloadState | None = None
        self._flavors = flavors

    def create_jobset(self, body: dict[str, Any]) -> bool:
        return create_once(self.jobsets, body["metadata"]["name"], body)

    def delete_jobset(self, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return self.jobsets.pop(name, None) is not None

    def workload_of(self, namespace: str, owner_kind: str, owner_name: str) -> kueue.WorkloadState | None:
        assert owner_kind == js.KIND
        return self.workload if owner_name in self.jobsets else None

    def flavors(self) -> list[kueue.Flavor]:
        return self._flavors


def state(*, admitted: bool = False, evicted: bool = False, reason: str = "", flavor: str | None = None) -> kueue.WorkloadState:
    return kueue.WorkloadState("wl", admitted, admitted, evicted, False, "gpu-cq" if admitted else None, flavor, reason)


def world_with_gangs() -> tuple[World, FakeGangs]:
    w = World(pod_phase="Running")
    gangs = FakeGangs([])
    w.loop.gangs = gangs
    return w, gangs


def jobset_pods(w: World, gangs: FakeGangs, job_label: str) -> None:
    """The JobSet controller's part: the pods of the current JobSet, one per index."""
    for name, body in gangs.jobsets.items():
        n = body["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
        for i in range(n):
            pod = f"{name}-workers-0-{i}-x"
            w.workers.objects[f"Pod/{pod}"] = {
                "kind": "Pod",
                "metadata": {"name": pod, "labels": {JOB_LABEL: job_label, COMPLETION_INDEX_LABEL: str(i)},
                             "ownerReferences": [{"uid": "job-uid", "controller": True}]},
                "spec": {"nodeName": sorted(w.nodes)[i]},
            }


def test_a_queued_job_waits_for_admission_then_provisions_and_runs_its_jobset() -> None:
    w, gangs = world_with_gangs()
    job = make_job(GANG_SPEC, queueName="team-a")
    w.step(job)
    assert w.status.phase is Phase.QUEUED
    assert w.provider.ensured == [] and not w.nodes  # nothing provisioned before admission
    [body] = gangs.jobsets.values()
    assert body["spec"]["suspend"] is True and body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert w.status.queue is not None and w.status.queue.name == "team-a"

    gangs.workload = state(reason=WAITING)
    for _ in range(3):
        w.step(job)
    assert w.status.phase is Phase.QUEUED and not w.nodes
    assert w.status.queue.reason == WAITING
    assert w.status.message == f"Queued in LocalQueue team-a: {WAITING}"

    gangs.workload = state(admitted=True, flavor="a100-spot")
    reasons = w.step(job)
    assert "Admitted" in reasons and w.status.phase is Phase.PROVISIONING
    assert w.status.queue.admitted and w.status.queue.flavor == "a100-spot"
    w.step(job)
    assert w.nodes  # the provider made the planned nodes once admitted
    w.ready()
    jobset_pods(w, gangs, job.ref.label)
    w.run_to(job, Phase.RUNNING)
    assert [k for k in w.workers.objects if k.startswith("Pod/")] and len(gangs.jobsets) == 1  # no pods of our own


def test_a_kueue_eviction_is_an_interruption_and_the_gang_is_requeued_as_a_new_jobset() -> None:
    w, gangs = world_with_gangs()
    job = make_job(GANG_SPEC, queueName="team-a")
    w.step(job)
    gangs.workload = state(admitted=True, flavor="a100-spot")
    w.step(job)
    w.step(job)
    w.ready()
    jobset_pods(w, gangs, job.ref.label)
    w.run_to(job, Phase.RUNNING)
    first = next(iter(gangs.jobsets))
    gangs.workload = state(evicted=True, reason="evicted (Preempted): Preempted to accommodate a workload")
    reasons = w.step(job)
    assert "Evicted" in reasons and w.status.phase is Phase.RECOVERING
    assert w.status.queue is not None and w.status.queue.evictions == 1 and w.status.interruptions == 1
    w.step(job)
    assert gangs.deleted == [first]  # the old gang's JobSet goes (its pods with it)
    for k in [k for k in w.workers.objects if k.startswith("Pod/")]:
        del w.workers.objects[k]
    gangs.workload = None
    w.step(job)
    assert w.status.phase is Phase.QUEUED and w.status.attempt == 2
    assert list(gangs.jobsets) == [js.jobset_name(job.name, 2)]


def test_runtime_jobset_without_a_queue_runs_one_jobset_and_no_pods_of_its_own() -> None:
    w, gangs = world_with_gangs()
    job = make_job(GANG_SPEC, runtime="jobset")
    w.step(job)
    assert w.status.phase is Phase.PROVISIONING
    w.step(job)
    w.ready()
    w.step(job)
    [body] = gangs.jobsets.values()
    assert body["spec"]["suspend"] is False
    assert not [k for k in w.workers.objects if k.startswith(("Pod/", "Service/"))]
    assert "ServiceAccount/gpuscaler-worker" in w.workers.objects
    jobset_pods(w, gangs, job.ref.label)
    w.run_to(job, Phase.RUNNING)


def test_with_the_quota_fallback_a_plan_without_quota_gives_way_to_the_next_that_meets_the_deadline() -> None:
    w = World(pod_phase="Running", kueue_quota_fallback=True)
    gangs = FakeGangs([])
    w.loop.gangs = gangs
    job = make_job(GANG_SPEC, queueName="team-a")
    w.step(job)
    assert w.status.plan is not None
    first = (w.status.plan.instance_type, w.status.plan.capacity_type)
    gangs.workload = state(reason=WAITING)
    reasons = w.step(job)
    assert "ReplannedWithinQuota" in reasons
    plan = w.status.plan
    assert plan is not None and (plan.instance_type, plan.capacity_type) != first
    assert plan.why.startswith("chosen within the Kueue quota left:") and WAITING in plan.why
    assert w.status.phase is Phase.QUEUED and w.status.attempt == 2
    assert gangs.deleted == [js.jobset_name(job.name, 1)] and list(gangs.jobsets) == [js.jobset_name(job.name, 2)]
    assert any(u.instance_type == first[0] and u.reason.startswith("no Kueue quota") for u in w.status.unavailable)


def test_without_the_fallback_the_job_waits_for_the_planned_flavor() -> None:
    w, gangs = world_with_gangs()
    job = make_job(GANG_SPEC, queueName="team-a")
    w.step(job)
    assert w.status.plan is not None
    planned = w.status.plan.summary
    gangs.workload = state(reason=WAITING)
    for _ in range(3):
        assert "ReplannedWithinQuota" not in w.step(job)
    assert w.status.phase is Phase.QUEUED and w.status.plan.summary == planned and w.status.attempt == 1
