"""The API-call budget of a job from creation to Running, counted on the fake clients (counts, not times).

The loop is stepped the way the event-driven operator steps it: once when the job appears, then
once per watch event that concerns it (its nodes appear, turn Ready; its pods appear, turn
Running), plus repeats of events that change nothing the loop reads. The worker client is the
real :class:`gpuscaler.kube.client.Workers` over a recording stand-in for the Kubernetes API, so
its memory of the namespace's shared worker identity is part of what is counted. A status write
is a step whose status differs in more than cost and ETA (what the handler writes).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from gpuscaler.api.events import Event
from gpuscaler.api.status import Phase
from gpuscaler.controller.reconcile import Job
from gpuscaler.controller.status_writes import Write, decide, fold_held_events
from gpuscaler.kube.client import Workers
from gpuscaler.kube.workers import worker_rbac
from gpuscaler.settings import Settings
from loop_harness import RESNET_SPEC, World, make_job

ONE_NODE = {
    **RESNET_SPEC,
    "constraints": {"instanceTypes": ["p3.2xlarge"], "minGpus": 1, "maxGpus": 1, "spot": "never"},
}
"""The benchmark's job (benchmarks/operator_scale.py): one node, one GPU."""


class RecordingApi:
    """CoreV1Api / RbacAuthorizationV1Api stand-in: records every call; a second create of the same
    object is a 409 Conflict, as the API server answers."""

    def __init__(self, calls: Counter[str], objects: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.calls = calls
        self.objects = objects
        self.latency_s = 0.0
        """Seconds each call takes (the API server's answer time, for steps on several threads)."""
        self.lock = threading.Lock()

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            time.sleep(self.latency_s)
            with self.lock:
                self.calls[method] += 1
            if method.startswith("create_"):
                namespace, body = args
                key = (body["kind"], namespace, body["metadata"]["name"])
                with self.lock:
                    if key in self.objects:
                        raise ApiException(status=409, reason="Conflict")
                    self.objects[key] = body
            elif method == "delete_namespaced_pod":
                self.objects.pop(("Pod", args[1], args[0]), None)
            elif method == "patch_namespaced_pod":  # the annotations merged, as the API server does
                name, namespace, body = args
                pod = self.objects.get(("Pod", namespace, name))
                if pod is not None:
                    have = pod["metadata"].setdefault("annotations", {})
                    for k, v in body["metadata"]["annotations"].items():
                        if v is None:
                            have.pop(k, None)
                        else:
                            have[k] = v

        return call


class RecordedWorkers(Workers):
    """The real worker client over :class:`RecordingApi`, with the pods it made for the harness."""

    def __init__(self) -> None:
        super().__init__(ApiClient())
        self.calls: Counter[str] = Counter()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.core = RecordingApi(self.calls, self.objects)
        self.rbac = RecordingApi(self.calls, self.objects)
        self.creates = RecordingApi(self.calls, self.objects)

    def pods(self) -> list[dict[str, Any]]:
        return [b for (kind, _, _), b in self.objects.items() if kind == "Pod"]


class Counted:
    """A world whose steps count status writes and Events (the nodes made are the world's nodes).

    A step's status is written as the handler decides (:func:`gpuscaler.controller.status_writes.decide`,
    on the world's clock): at once, or held a moment (a gang's move to Starting)."""

    def __init__(self, world: World | None = None, hold_s: float = Settings().bringup_write_hold_s) -> None:
        self.w = world or World()
        self.workers = RecordedWorkers()
        self.w.workers = self.workers  # type: ignore[assignment]
        self.w.loop.workers = self.workers
        self.hold_s = hold_s
        self.server: dict[str, Any] = {}
        """The status the API server has (the last one written)."""
        self.held_at: datetime | None = None
        self.writes = 0
        self.phases_written: list[str] = []
        self.events: Counter[str] = Counter()
        self.messages: dict[str, list[str]] = {}
        self.held_events: list[Event] = []

    def step(self, job: Job) -> None:
        self.w.step(job)
        after = self.w.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        held_for = (self.w.now - self.held_at).total_seconds() if self.held_at else None
        write = decide(self.server, after, held_for_s=held_for, since_write_s=0, refresh_s=300, hold_s=self.hold_s)
        self.held_at = (self.held_at or self.w.now) if write is Write.HOLD else None
        if write is Write.NOW:
            self.writes += 1
            self.phases_written.append(after["phase"])
            self.server = after
        post, self.held_events = fold_held_events(self.held_events, list(self.w.events), holding=write is Write.HOLD)
        for e in post:
            self.messages.setdefault(e.reason, []).append(e.message)
        self.events.update(e.reason for e in post)

    def calls(self) -> int:
        return sum(self.workers.calls.values())


def to_running(c: Counted, job: Job) -> None:
    """The watch events of one job's start, each a step, with a repeat after each."""
    c.step(job)  # created: plans, asks for its node
    c.step(job)  # its node appears (NotReady)
    c.step(job)  # a repeat (the node's status, nothing the loop reads)
    c.w.ready()
    c.step(job)  # the node Ready: starts the workers
    c.step(job)  # the pods appear (Pending)
    c.step(job)  # a repeat
    c.w.pod_phase = "Running"
    c.step(job)  # the pods Running
    assert c.w.status.phase is Phase.RUNNING, c.w.status.message


def test_one_node_job_to_running_within_the_budget() -> None:
    c = Counted()
    job = make_job(ONE_NODE)
    to_running(c, job)
    made = len(c.w.nodes)
    assert made == 1
    # the worker client: the namespace's ServiceAccount, Role and RoleBinding, the pod (a one-node
    # gang meets on its own pod: no rendezvous Service)
    assert c.workers.calls == {
        "create_namespaced_service_account": 1,
        "create_namespaced_role": 1,
        "create_namespaced_role_binding": 1,
        "create_namespaced_pod": 1,  # with what a preemption would cost (0, docs/preemption-cost.md): no PATCH when it runs
    }
    # status writes: the way up (Provisioning, Starting) is held up to 3 s at a time: Starting, at
    # the end of the first hold (each step is 1 s: planned at +0 s, Starting from +3 s), then
    # Running (+6 s); with the gang up within the hold, Running alone
    assert c.phases_written == ["Starting", "Running"]
    quick = Counted(hold_s=10)
    to_running(quick, make_job(ONE_NODE))
    assert quick.phases_written == ["Running"]
    # with the gang up within the hold, its plan is said in the Started Event: one Event, one write
    assert quick.events == {"Started": 1}
    (said,) = quick.messages["Started"]
    assert said.startswith("all 1 worker(s) started on p3.2xlarge (requested") and "; planned 1 x p3.2xlarge" in said, said
    # the plan, and the start with the way there (a gang up within progressEventAfterS posts no
    # Event on the way: controller/bringup.py)
    assert c.events == {"Planned": 1, "Started": 1}
    assert c.messages["Started"] == ["all 1 worker(s) started on p3.2xlarge (requested, nodes Ready +3.0s, running +6.0s)"]
    total = made + c.calls() + c.writes + sum(c.events.values())
    assert total == 9  # the namespace's first job; kopf adds its finalizer patch


def test_steps_that_change_nothing_call_nothing_and_write_nothing() -> None:
    c = Counted()
    job = make_job(ONE_NODE)
    to_running(c, job)
    calls, writes, events = c.calls(), c.writes, sum(c.events.values())
    for _ in range(10):  # ten more events of the running job that change nothing
        c.step(job)
    assert (c.calls(), c.writes, sum(c.events.values())) == (calls, writes, events)
    assert len(c.w.nodes) == 1


def test_the_second_job_of_a_namespace_sends_no_worker_identity() -> None:
    first, second = Counted(), Counted()
    second.workers = first.workers  # one operator, one worker client, one namespace
    second.w.workers = first.workers  # type: ignore[assignment]
    second.w.loop.workers = first.workers
    to_running(first, make_job(ONE_NODE, name="a", uid="uid-a"))
    before = Counter(first.workers.calls)
    to_running(second, make_job(ONE_NODE, name="b", uid="uid-b"))
    sent = first.workers.calls - before
    assert sent == {"create_namespaced_pod": 1}
    # 1 node + 1 pod + 2 status writes + 2 Events: every later job of the namespace
    assert len(second.w.nodes) + sum(sent.values()) + second.writes + sum(second.events.values()) == 6


def test_a_gang_of_two_costs_one_create_per_node_and_pod_and_still_two_writes() -> None:
    c = Counted()
    job = make_job()  # two 8-GPU nodes
    to_running(c, job)
    assert len(c.w.nodes) == 2
    assert c.workers.calls["create_namespaced_pod"] == 2 and c.workers.calls["create_namespaced_service"] == 1
    assert c.writes == 2


def test_a_gang_still_on_its_way_when_the_hold_ends_is_written_then() -> None:
    c = Counted(hold_s=1.5)  # Provisioning from +0 s, Starting from +3 s, Running at +6 s
    to_running(c, make_job(ONE_NODE))
    assert c.phases_written == ["Provisioning", "Starting", "Running"]
    c = Counted(hold_s=0)  # nothing held
    to_running(c, make_job(ONE_NODE))
    assert c.phases_written == ["Provisioning", "Starting", "Running"]


def test_a_slow_gang_says_where_it_waits_once_then_posts_each_step() -> None:
    # each step is 1 s: requested at +0 s, NotReady at +1 s and +2 s, Ready at +3 s, the workers
    # Pending at +4 s and +5 s, running at +6 s
    c = Counted(World(progress_event_after_s=1.5))
    to_running(c, make_job(ONE_NODE))
    assert c.events == {"Planned": 1, "ScaledUp": 1, "NodesReady": 1, "WorkersCreated": 1, "Started": 1}
    (scaled_up,) = c.messages["ScaledUp"]  # said once, at +2 s (not at +1 s, nor again at +3 s)
    assert scaled_up.startswith("0 of 1 x p3.2xlarge (on-demand) Ready (") and scaled_up.endswith(") 2s after the request")
    assert c.messages["NodesReady"] == ["all 1 node(s) Ready; created 1 worker pod(s) (attempt 1)"]
    assert c.messages["WorkersCreated"] == ["0/1 workers running (attempt 1) 2s after the nodes were Ready"]
    assert c.messages["Started"] == ["all 1 worker(s) started on p3.2xlarge (requested, nodes Ready +3.0s, running +6.0s)"]
    cond = {x.type: x for x in c.w.status.conditions}
    assert cond["NodesReady"].status == "True" and cond["Running"].status == "True"


def test_a_namespace_identity_is_sent_once_by_steps_on_many_threads() -> None:
    workers = RecordedWorkers()
    workers.core.latency_s = workers.rbac.latency_s = 0.05  # all eight are inside create_if_absent at once
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        for body in worker_rbac("ns"):
            workers.create_if_absent(body)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert workers.calls == {
        "create_namespaced_service_account": 1,
        "create_namespaced_role": 1,
        "create_namespaced_role_binding": 1,
    }
