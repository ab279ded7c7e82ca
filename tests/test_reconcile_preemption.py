"""The operator tells a preempted worker from a failed one from its own evidence only.

torchrun exits 1 when its workers stopped cleanly with 75; the loop must still count a stop the
cluster or the operator caused as an interruption (against ``spot.maxInterruptions``), not a
failure (against ``backoffLimit``). And a crashing worker that exits 75 or writes
``runtime-phase=preempted`` itself is a failure: that is the worker's word. These drive the
reconcile loop of tests/loop_harness.py (World) with full pod statuses.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuscaler.api.status import Phase
from gpuscaler.controller.reconcile import preemption
from gpuscaler.kube.workers import pod_state
from gpuscaler.names import INTERRUPTION_ANNOTATION
from gpuscaler.runtime import constants as rc
from loop_harness import World, make_job, node_body


def running(w: World) -> Any:
    job = make_job()
    w.two_workers_running(job)
    return job


def terminated(code: int, **extra: Any) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "train", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}], **extra}


def fail_and_step(w: World, job: Any, code: int, *, annotations: dict[str, str] | None = None,
                  status: dict[str, Any] | None = None) -> list[str]:
    w.phases["job-worker-1"] = "Failed"
    w.statuses["job-worker-1"] = terminated(code, **(status or {}))
    w.annotations["job-worker-1"] = annotations or {}
    return w.step(job)


@pytest.mark.parametrize(
    ("annotations", "status"),
    [
        ({}, {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]}),
        ({rc.ANNOTATION_CHECKPOINT_REQUESTED: "r1", rc.ANNOTATION_CHECKPOINT_ACK: "r1"}, {}),
    ],
    ids=["disruption-target", "operator-request"],
)
def test_launcher_exit_1_after_a_preemption_is_an_interruption_not_a_failure(
    annotations: dict[str, str], status: dict[str, Any]
) -> None:
    w = World(backoff_limit=0)  # a single counted failure would fail the job
    job = running(w)
    reasons = fail_and_step(w, job, 1, annotations=annotations, status=status)
    assert w.status.phase is Phase.RECOVERING, w.status.message
    assert "Interrupted" in reasons and "WorkerFailed" not in reasons
    assert w.status.failures == 0 and w.status.interruptions == 1
    assert "was preempted" in w.status.message
    assert w.status.interruption_history[-1].signal == "worker-preempted"


@pytest.mark.parametrize("code", [1, 75])
def test_a_worker_that_says_it_was_preempted_with_no_evidence_is_a_failure(code: int) -> None:
    w = World(backoff_limit=0)
    job = running(w)
    reasons = fail_and_step(w, job, code, annotations={rc.ANNOTATION_RUNTIME_PHASE: rc.RUNTIME_PHASE_PREEMPTED})
    assert w.status.phase is Phase.FAILED and "Failed" in reasons, w.status.message
    assert w.status.failures == 1 and w.status.interruptions == 0


def test_exit_1_with_nothing_else_known_is_a_failure_against_the_backoff_limit() -> None:
    w = World(backoff_limit=0)
    job = running(w)
    reasons = fail_and_step(w, job, 1, annotations={rc.ANNOTATION_RUNTIME_PHASE: "running"})
    assert w.status.phase is Phase.FAILED and "Failed" in reasons
    assert w.status.failures == 1 and w.status.interruptions == 0


def test_a_failed_worker_on_a_node_under_notice_is_preempted() -> None:
    w = World(backoff_limit=0)
    job = running(w)
    node = sorted(w.nodes)[1]
    w.nodes[node] = node_body(node, ready="True", created=w.now, price=10.0,
                              annotations={INTERRUPTION_ANNOTATION: "maintenance"})
    for body in w.workers.pods():
        if body["metadata"]["name"] == "job-worker-1":
            body.setdefault("spec", {})["nodeName"] = node
    fail_and_step(w, job, 137)
    assert w.status.failures == 0 and w.status.interruptions == 1, w.status.message


def test_preemption_reasons_in_order() -> None:
    said = {rc.ANNOTATION_RUNTIME_PHASE: rc.RUNTIME_PHASE_PREEMPTED}
    base = pod_state({"metadata": {"name": "p", "annotations": said}, "status": {"phase": "Failed", **terminated(75)}})
    assert preemption(base) is None, "exit 75 and the preempted phase are the worker's word"
    assert preemption(base, node_going=True) == "its node None is going, exit code 75, runtime preempted"
    gone = pod_state({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                      "status": {"phase": "Failed", **terminated(1)}})
    assert preemption(gone) == "the pod was being deleted, exit code 1"
    asked = pod_state({"metadata": {"name": "p", "annotations": {rc.ANNOTATION_CHECKPOINT_REQUESTED: "r1"}},
                       "status": {"phase": "Failed", **terminated(1),
                                  "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "x"}]}})
    assert preemption(asked, node_going=True) == "after the operator's checkpoint request r1, exit code 1"
