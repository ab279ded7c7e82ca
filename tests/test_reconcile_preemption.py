"""The operator tells a preempted worker from a failed one without trusting the exit code.

torchrun exits 1 when its workers stopped cleanly with 75; the loop must still count that as an
interruption (against ``spot.maxInterruptions``), not a failure (against ``backoffLimit``). These
drive the reconcile loop of tests/loop_harness.py (World) with full pod statuses.
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
    w.step(job)
    w.step(job)
    w.ready()
    w.step(job)
    w.phases = {"job-worker-0": "Running", "job-worker-1": "Running"}
    w.step(job)
    assert w.status.phase is Phase.RUNNING
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
        ({rc.ANNOTATION_RUNTIME_PHASE: rc.RUNTIME_PHASE_PREEMPTED}, {}),
        ({}, {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]}),
        ({rc.ANNOTATION_CHECKPOINT_REQUESTED: "r1", rc.ANNOTATION_CHECKPOINT_ACK: "r1"}, {}),
    ],
    ids=["runtime-phase", "disruption-target", "operator-request"],
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
    base = pod_state({"metadata": {"name": "p"}, "status": {"phase": "Failed", **terminated(75)}})
    assert preemption(base) == "exit code 75"
    one = pod_state({"metadata": {"name": "p"}, "status": {"phase": "Failed", **terminated(1)}})
    assert preemption(one) is None
    assert preemption(one, node_going=True) == "its node None is going"
