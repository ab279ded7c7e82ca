"""End to end: spot interruptions on the real control plane, with the training played by real processes.

Each test runs the operator (a subprocess, kwok provider) and :class:`spot_harness.Harness`, which
starts a local process with the runtime library for every Running worker pod (see its docstring).
A node is then interrupted the way a cloud would: an AWS NTH ``spot-itn`` taint, GKE's
termination taint, a deletion with no notice, three reclaims in a row, a reclaim close to the
deadline, the reclaim of one node of two (continued elastically on the survivor), and a torchrun
launcher that exits 1 after a clean preemption (recovered as preempted, not counted as a failure).
Every job must end Succeeded with the final weights bit-identical to an uninterrupted run, and lose
at most one checkpoint interval of steps.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import spot_helpers
from e2e_helpers import E2ECluster, wait_for
from operator_helpers import OperatorProcess, event_reasons, get_job, job_nodes, wait_phase
from spot_harness import Harness
from spot_helpers import (
    STEPS_PER_INTERVAL,
    finish,
    interrupt_with_taint,
    progressed,
    running_node,
    running_spot_job,
    spot_job,
    start_operator,
    taint,
)

harness = spot_helpers.harness
spot_operator = spot_helpers.spot_operator

pytestmark = pytest.mark.timeout(240)

"""The operator suite's fixtures: the CRD installed, the custom-objects API, an operator per test."""

def test_spot_aws_itn_checkpoints_replans_and_resumes(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, spot_operator: OperatorProcess,
    harness: Callable[..., Harness],
) -> None:
    interrupt_with_taint(dev_cluster, core, custom, namespace, harness, "aws-node-termination-handler/spot-itn", "aws-spot-itn")


def test_spot_gke_termination_fits_the_30s_notice(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, spot_operator: OperatorProcess,
    harness: Callable[..., Harness],
) -> None:
    st = interrupt_with_taint(
        dev_cluster, core, custom, namespace, harness, "cloud.google.com/impending-node-termination", "gke-termination"
    )
    assert st["interruptionHistory"][0]["recoverySeconds"] < 30, st["interruptionHistory"]


def test_spot_node_deleted_without_notice_resumes_from_periodic_checkpoint(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, spot_operator: OperatorProcess,
    harness: Callable[..., Harness],
) -> None:
    h, _ = running_spot_job(dev_cluster, custom, namespace, harness, 800)
    progressed(h, STEPS_PER_INTERVAL + 60)  # past the first periodic checkpoint, mid-interval
    node = running_node(core, namespace, "tj")
    core.delete_node(node)
    st = finish(custom, h, namespace, "tj")
    rec = st["interruptionHistory"][0]
    assert rec["signal"] == "node-deleted" and not rec["checkpointAcked"] and rec["checkpointStep"] >= 1, rec
    assert st["interruptions"] == 1 and st["lostSteps"] == rec["lostSteps"]


def test_spot_three_interruptions_fall_back_to_on_demand(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, spot_operator: OperatorProcess,
    harness: Callable[..., Harness],
) -> None:
    h, _ = running_spot_job(dev_cluster, custom, namespace, harness, 900)
    seen = []
    for i in range(3):
        job = wait_phase(custom, namespace, "tj", "Running", timeout=60)
        seen.append((job["status"]["instanceType"], job["status"]["capacityType"]))
        progressed(h, 100 * (i + 1))
        taint(core, running_node(core, namespace, "tj"), "aws-node-termination-handler/spot-itn")
        wait_for(lambda n=i: get_job(custom, namespace, "tj")["status"].get("interruptions", 0) > n, timeout=30,
                 what=f"interruption {i + 1}")
    st = finish(custom, h, namespace, "tj", timeout=150)
    assert [c for _, c in seen] == ["spot"] * 3 and len({i for i, _ in seen}) == 3, seen
    assert st["interruptions"] == 3 and st["capacityType"] == "on-demand", st
    assert "maxInterruptions 3" in st["interruptionHistory"][-1]["action"], st["interruptionHistory"][-1]


def test_spot_interruption_close_to_the_deadline_goes_on_demand(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    harness: Callable[..., Harness], tmp_path: Path,
) -> None:
    start_operator(operator, tmp_path, "spot:\n  minHoursToDeadline: 0.5\n")
    steps = 1000
    # spot is allowed for the first 20 s only: then less than 0.5 h is left to the deadline
    deadline = (datetime.now(UTC) + timedelta(minutes=30, seconds=20)).replace(microsecond=0)
    doc = spot_job("tj", steps)
    del doc["spec"]["maxDuration"]
    doc["spec"]["deadline"] = deadline.isoformat().replace("+00:00", "Z")
    t0 = datetime.now(UTC)
    h, job = running_spot_job(dev_cluster, custom, namespace, harness, steps, doc)
    assert job["status"]["capacityType"] == "spot", job["status"]
    wait_for(lambda: datetime.now(UTC) - t0 > timedelta(seconds=22), timeout=40, what="the slack to shrink")
    taint(core, running_node(core, namespace, "tj"), "aws-node-termination-handler/spot-itn")
    st = finish(custom, h, namespace, "tj")
    assert st["capacityType"] == "on-demand" and st["interruptions"] == 1, st
    assert "minHoursToDeadline" in st["interruptionHistory"][0]["action"], st["interruptionHistory"]


def test_spot_reclaim_of_one_node_continues_elastically_on_the_survivor(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, spot_operator: OperatorProcess,
    harness: Callable[..., Harness],
) -> None:
    """Two spot nodes, one reclaimed near the end: new capacity would cost more than the little work
    left, so the planner continues on the surviving node (one GPU, twice the accumulation, the same
    global batch) and no node is provisioned."""
    steps = 700
    doc = spot_job("tj", steps)
    doc["spec"]["constraints"].update(instanceTypes=["g4dn.xlarge", "g5.xlarge"], minGpus=2, maxGpus=2)
    h, job = running_spot_job(dev_cluster, custom, namespace, harness, steps, doc)
    before = job["status"]
    assert (before["gpus"], before["instanceType"], before["capacityType"]) == (2, "g4dn.xlarge", "spot"), before
    nodes = sorted(n.metadata.name for n in job_nodes(core, namespace, "tj"))
    assert len(nodes) == 2, nodes
    created = {n.metadata.name: n.metadata.uid for n in job_nodes(core, namespace, "tj")}
    progressed(h, 150)
    taint(core, nodes[1], "aws-node-termination-handler/spot-itn")
    wait_for(lambda: get_job(custom, namespace, "tj")["status"].get("interruptions", 0) == 1, timeout=30,
             what="the interruption recorded")
    wait_phase(custom, namespace, "tj", "Running", timeout=60)
    # running again on the survivor itself: the same Node object, nothing new provisioned
    live = {n.metadata.name: n.metadata.uid for n in job_nodes(core, namespace, "tj") if not n.metadata.deletion_timestamp}
    assert live == {nodes[0]: created[nodes[0]]}, live
    st = finish(custom, h, namespace, "tj")
    rec = st["interruptionHistory"][0]
    assert st["interruptions"] == 1 and rec["node"] == nodes[1] and rec["checkpointAcked"], rec
    assert "continue on the survivors" in rec["action"], rec["action"]
    # the rest ran on the surviving node itself: one GPU, twice the accumulation, same global batch
    assert (st["gpus"], st["instanceType"], st["capacityType"]) == (1, "g4dn.xlarge", "spot"), st
    plan, first = st["plan"], before["plan"]
    assert plan["microBatch"] * plan["accumulation"] * 1 == first["microBatch"] * first["accumulation"] * 2 == 256
    ran_on = {pl.node for pl in h.played.values()}
    assert ran_on == set(nodes), ran_on  # no third node: the last attempt ran on nodes[0]
    assert [pl.node for pl in sorted(h.played.values(), key=lambda p: p.started)][-1] == nodes[0]
    assert "Replanned" in event_reasons(core, namespace, "tj")


def test_spot_torchrun_launcher_exiting_1_on_a_preemption_is_recovered_as_preempted(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    harness: Callable[..., Harness], tmp_path: Path,
) -> None:
    """The node shuts down gracefully (SIGTERM, no taint, the pod not deleted) under a real torchrun.

    The kubelet marks the pod ``DisruptionTarget`` (TerminationByKubelet); the worker checkpoints,
    reports ``gpuscaler.io/runtime-phase=preempted`` and exits 75; torchrun exits 1 and the pod
    turns Failed with exit code 1. The operator must count an interruption (from the cluster's
    condition, not the worker's word), not a failure against ``backoffLimit``, and resume from that
    checkpoint.
    """
    if importlib.util.find_spec("torch") is None:
        why = "torch is not installed (pip install -e '.[dev,train]'; scripts/test.sh uses scripts/ci-torch-venv.sh)"
        if os.environ.get("GPUSCALER_REQUIRE_TORCH") == "1":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    start_operator(operator, tmp_path)
    h, _ = running_spot_job(dev_cluster, custom, namespace, harness, 700, torchrun=True)
    progressed(h, 150, timeout=180)  # torchrun and its worker import torch first
    played = h.rank0_running()
    assert played is not None
    h.terminate(played)
    wait_for(lambda: played.exit_code is not None, timeout=60, what="the torchrun launcher to exit")
    assert played.exit_code == 1, f"torchrun exited {played.exit_code}"
    events = h.events(played)
    assert events[-1]["e"] == "preempted", events[-3:]
    st = finish(custom, h, namespace, "tj", timeout=300)
    assert st["interruptions"] == 1 and st.get("failures", 0) == 0, st
    rec = st["interruptionHistory"][0]
    assert rec["signal"] == "worker-preempted", rec
    assert rec["lostSteps"] <= 5, rec  # the SIGTERM checkpoint: at most the steps the report lagged
    reasons = event_reasons(core, namespace, "tj")
    assert "WorkerFailed" not in reasons and "Interrupted" in reasons, reasons
    pod_msgs = [e.message for e in core.list_namespaced_event(namespace).items if e.reason == "Interrupted"]
    assert any("was preempted (DisruptionTarget: TerminationByKubelet, exit code 1, runtime preempted)" in m for m in pod_msgs), pod_msgs
