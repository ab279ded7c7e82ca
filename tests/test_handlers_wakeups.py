"""The watch-event handlers that wake jobs (handlers/trainingjob.py): only changes the loop reads wake a job."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from gpuscaler.controller.policy import held_nodes, namespace_usage
from gpuscaler.controller.wakeups import Seen, Wakeups
from gpuscaler.handlers import trainingjob as h
from gpuscaler.names import INTERRUPTION_ANNOTATION, JOB_LABEL
from loop_harness import node_body

KEY = "ns.job"
INDEX_OF = {"pod_event": "job_pods", "node_event": "job_nodes", "job_event": "namespace_jobs"}
"""The index function that sees a watch-event handler's events but deletions."""


@pytest.fixture
def op() -> Iterator[SimpleNamespace]:
    """The parts of the operator the watch-event handlers use, installed as the running operator."""
    fake = SimpleNamespace(seen=Seen(), wakeups=Wakeups(), blocked={}, written={}, held={})
    before = h._operator
    h._operator = fake  # type: ignore[assignment]
    yield fake
    h._operator = before


def woken(op: SimpleNamespace, *events: tuple[str, Any]) -> list[bool]:
    """Feed (handler, kwargs) calls to the handlers with one job registered; which calls woke it.

    As kopf calls them: a deletion goes to the watch-event handler (``pod_event``...: registered
    with ``when=h.deleted``), every other event to the index function (``job_pods``...), which
    wakes the job once kopf has stored its entry (a callback queued on the loop)."""

    async def run() -> list[bool]:
        flag = op.wakeups.register(KEY)
        out = []
        for handler, event in events:
            flag.clear()
            fn, kwargs = handler, event
            if handler not in INDEX_OF:  # no index function (policies): every event to the handler
                pass
            elif event["type"] == "DELETED":
                assert h.deleted(**event)
            else:
                assert not h.deleted(**event)
                fn = INDEX_OF[handler]
                kwargs = {k: v for k, v in event.items() if k != "type"}  # an index function gets no type
            await getattr(h, fn)(**kwargs)
            stored = flag.is_set()  # nothing woke it before kopf stores the index entry
            await asyncio.sleep(0)
            out.append(flag.is_set())
            assert fn.endswith("_event") or not stored
        return out

    return asyncio.run(run())


def node(**kw: Any) -> dict[str, Any]:
    body = node_body("n-0", instance_type="p3.2xlarge", capacity_type="on-demand", **kw)
    body["metadata"]["labels"][JOB_LABEL] = KEY
    return body


def node_event(body: dict[str, Any], type: str = "MODIFIED") -> tuple[str, dict[str, Any]]:
    return "node_event", {
        "type": type,
        "body": kopf.Body(body),
        "labels": body["metadata"]["labels"],
        "name": "n-0",
    }


def test_a_node_wakes_its_job_on_readiness_notice_and_deletion_not_on_a_heartbeat(
    op: SimpleNamespace,
) -> None:
    registering = node(ready="False")
    heartbeat = node(ready="False")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:10Z"
    ready = node(ready="True")
    noticed = node(ready="True", annotations={INTERRUPTION_ANNOTATION: "reclaim"})
    got = woken(
        op,
        node_event(registering, "ADDED"),
        node_event(heartbeat),
        node_event(ready),
        node_event(ready),
        node_event(noticed),
        node_event(noticed, "DELETED"),
    )
    assert got == [True, False, True, False, True, True]


def pod(phase: str, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "job-worker-0",
            "namespace": "ns",
            "labels": {JOB_LABEL: KEY, "gpuscaler.io/rank": "0"},
            "annotations": annotations,
            "resourceVersion": phase,
        },
        "status": {"phase": phase},
    }


def pod_event(body: dict[str, Any], type: str = "MODIFIED") -> tuple[str, dict[str, Any]]:
    meta = body["metadata"]
    return "pod_event", {
        "type": type,
        "body": kopf.Body(body),
        "labels": meta["labels"],
        "namespace": "ns",
        "name": meta["name"],
    }


def test_a_pod_wakes_its_job_on_what_the_loop_reads(op: SimpleNamespace) -> None:
    pending = pod("Pending")
    repeat = pod("Pending")
    repeat["metadata"]["annotations"]["unrelated.example.com/x"] = "1"  # not read by the loop
    got = woken(
        op,
        pod_event(pending, "ADDED"),
        pod_event(repeat),
        pod_event(pod("Running")),
        pod_event(pod("Running", **{"gpuscaler.io/progress-step": "10"})),  # a progress report
        pod_event(pod("Running", **{"gpuscaler.io/progress-step": "10"}), "DELETED"),
    )
    assert got == [True, False, True, True, True]


def job_event(
    generation: int, phase: str | None = None, type: str = "MODIFIED", name: str = "job"
) -> tuple[str, dict[str, Any]]:
    return "job_event", {
        "type": type,
        "meta": {"generation": generation},
        "status": {"phase": phase} if phase else {},
        "namespace": "ns",
        "name": name,
    }


def test_a_job_wakes_on_its_spec_not_on_its_own_status_and_a_finish_wakes_the_held_back(
    op: SimpleNamespace,
) -> None:
    got = woken(
        op, job_event(1, "Pending", "ADDED"), job_event(1, "Provisioning"), job_event(2, "Provisioning")
    )
    assert got == [True, False, True]  # its own status write (phase) is not a wake-up; a new generation is
    op.blocked[KEY] = "ns"  # a policy holds it back
    got = woken(op, job_event(1, "Running", name="other"), job_event(1, "Succeeded", name="other"))
    assert got == [False, True]  # another job of the namespace finished: the cap may allow it now


def test_a_policy_change_wakes_every_job(op: SimpleNamespace) -> None:
    event = ("policy_event", {"type": "ADDED", "name": "lab", "spec": {"maxGpusPerJob": 8}})
    same = ("policy_event", {"type": "MODIFIED", "name": "lab", "spec": {"maxGpusPerJob": 8}})
    assert woken(op, event, same) == [True, False]


def test_the_next_step_starts_from_the_status_it_wrote_until_the_watch_brings_it_back() -> None:
    op = SimpleNamespace(written={KEY: ("120", {"phase": "Provisioning"})})
    stale, fresh = {"phase": "Pending"}, {"phase": "Provisioning", "message": "0/1 nodes Ready"}
    assert h._fresher(op, KEY, "110", stale) == {"phase": "Provisioning"}  # type: ignore[arg-type]
    assert h._fresher(op, KEY, "121", fresh) == fresh  # type: ignore[arg-type]
    assert KEY not in op.written
    assert h._fresher(op, KEY, "100", stale) == stale  # type: ignore[arg-type]


def test_kopf_success_lines_of_the_watch_handlers_are_dropped_and_nothing_else() -> None:
    f = h.QuietWatchHandlers()

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, msg, None, None)

    assert not f.filter(record("Handler 'pod_event' succeeded."))
    assert f.filter(record("Handler 'pod_event' failed with an exception. Will retry."))
    assert f.filter(record("Handler 'cleanup' succeeded."))
    assert f.filter(record("Planned: 1 x p3.2xlarge"))


def test_the_pod_and_node_watches_are_filtered_by_the_api_server() -> None:
    from kopf._cogs.structs.references import Resource

    settings = kopf.OperatorSettings()
    h.watch_selectors(settings)
    pods = Resource("", "v1", "pods", kind="Pod", singular="pod", namespaced=True)
    nodes = Resource("", "v1", "nodes", kind="Node", singular="node", namespaced=False)
    jobs = Resource("gpuscaler.io", "v1alpha1", "trainingjobs", kind="TrainingJob", singular="trainingjob", namespaced=True)
    assert list(settings.watching.label_selectors.collect(pods)) == [JOB_LABEL]
    assert list(settings.watching.label_selectors.collect(nodes)) == [JOB_LABEL]
    assert list(settings.watching.label_selectors.collect(jobs)) == []


def test_a_namespaces_usage_counts_the_statuses_the_operator_holds_or_just_wrote() -> None:
    """A new job's way up is held (controller/status_writes.py) and a write reaches the index only
    with its watch event: the usage a namespace cap counts is gathered from the operator's own,
    newer statuses, so a burst of new jobs cannot pass a cap while their statuses are in flight."""
    planned = {"phase": "Provisioning", "gpus": 8, "plan": {"nodes": 1, "heldCapacity": "cb-1"}}
    index = [h.job_usage("ns", n, {}) for n in ("a", "b", "c")]  # the watch saw them created, no status yet
    op = SimpleNamespace(held={"ns.a": (0.0, planned)}, written={"ns.b": ("7", {**planned, "gpus": 4})})
    latest = h._latest(op, index)  # type: ignore[arg-type]
    assert [e["gpus"] for e in latest] == [8, 4, None]
    assert namespace_usage(latest, exclude="c").gpus == 12
    assert namespace_usage(index, exclude="c").gpus == 0  # the watch's copy alone
    assert held_nodes(latest, ("ns", "c")) == {"cb-1": 2}


def test_index_entries_copies_every_store_or_one() -> None:
    index = {"ns": [{"name": "a"}, {"name": "b"}], "other": [{"name": "c"}]}
    assert [e["name"] for e in h.index_entries(index)] == ["a", "b", "c"]
    assert [e["name"] for e in h.index_entries(index, "ns")] == ["a", "b"]
    assert h.index_entries(index, "gone") == [] and h.index_entries(None) == []


def test_the_watch_handlers_see_deletions_only_and_the_index_functions_every_other_event() -> None:
    """The registrations (gpuscaler.main): what wakes a job on an event but a deletion is the
    index function kopf calls for every such event, and the handler is kept for the deletions."""
    import gpuscaler.main  # noqa: F401  (registers the handlers in kopf's default registry)

    registry = kopf.get_default_registry()
    watching = {x.fn.__name__: x for x in registry._watching.get_all_handlers()}
    assert all(watching[fn].when is h.deleted for fn in INDEX_OF)
    assert {x.fn.__name__ for x in registry._indexing.get_all_handlers()} >= set(INDEX_OF.values())
