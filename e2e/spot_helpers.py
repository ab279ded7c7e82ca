"""Helpers of the spot e2e tests (test_spot.py, test_capacity_block.py, test_kueue.py): the spot job, the played workers (the harness fixture), the operator with their policy (spot_operator), a job run to Running, taints and waits."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.testing import pinned, training_job, worker_template
from operator_helpers import OperatorProcess, apply, event_reasons, job_nodes, wait_phase
from spot_harness import Harness, Harnesses, reference_weights

INTERVAL_S = 10
"""spec.checkpoint.intervalSeconds (the CRD's minimum)."""
STEP_S = 0.03
"""Sleep per training step: at most INTERVAL_S / STEP_S steps fit in one checkpoint interval."""
STEPS_PER_INTERVAL = int(INTERVAL_S / STEP_S)
SPOT_TYPES = ["g4dn.xlarge", "g5.xlarge", "g6.xlarge", "p3.2xlarge"]
"""One-GPU AWS types with spot prices; the planner's first choice is g4dn.xlarge spot."""


def spot_job(name: str, steps: int, **spec: Any) -> dict[str, Any]:
    return training_job(
        name,
        training={"steps": steps},
        maxDuration="4h",
        constraints=pinned(SPOT_TYPES, 1, "preferred"),
        checkpoint={"intervalSeconds": INTERVAL_S, "restartSeconds": 30, "dir": "/checkpoints"},
        template=worker_template(),
        **spec,
    )


@pytest.fixture
def harness(dev_cluster: E2ECluster, core: Any, namespace: str, tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made = Harnesses(core, namespace, tmp_path, str(dev_cluster.kubeconfig))

    def start(job: str, steps: int, **kw: Any) -> Harness:
        return made(job, steps, step_sleep=STEP_S, **kw)

    yield start
    made.stop_all()


POLICY = "name: e2e-spot\nminCheckpointIntervalS: 10\n"
"""The default policy allows checkpoint intervals of 300 s and more; these tests checkpoint every 10 s."""


def start_operator(operator: Callable[..., OperatorProcess], tmp_path: Path, extra: str = "") -> OperatorProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY + extra)
    return operator(GPUSCALER_POLICY_FILE=str(policy))


@pytest.fixture
def spot_operator(operator: Callable[..., OperatorProcess], tmp_path: Path) -> OperatorProcess:
    """The test's operator, with the spot tests' policy."""
    return start_operator(operator, tmp_path)


def running_spot_job(
    cluster: E2ECluster, custom: Any, ns: str, harness: Callable[..., Harness], steps: int,
    doc: dict[str, Any] | None = None, **played: Any,
) -> tuple[Harness, dict[str, Any]]:
    """Apply ``doc`` (a spot job ``tj`` of ``steps`` steps unless given), play its workers (``played``:
    the harness's options) and wait until it runs: (the harness, the job)."""
    apply(cluster, ns, doc or spot_job("tj", steps))
    h = harness("tj", steps, **played)
    return h, wait_phase(custom, ns, "tj", "Running", timeout=60)


def taint(core: Any, node: str, key: str) -> None:
    body = core.read_node(node)
    taints = [*(body.spec.taints or []), {"key": key, "effect": "NoSchedule"}]
    core.patch_node(node, {"spec": {"taints": taints}})


def running_node(core: Any, ns: str, name: str) -> str:
    nodes = [n for n in job_nodes(core, ns, name) if not n.metadata.deletion_timestamp]
    assert len(nodes) == 1, [n.metadata.name for n in nodes]
    return str(nodes[0].metadata.name)


def progressed(h: Harness, steps: int, timeout: float = 60) -> None:
    wait_for(lambda: h.rank0_step() >= steps, timeout=timeout, interval=0.1, what=f"rank 0 past step {steps}")


def finish(
    custom: Any, h: Harness, ns: str, name: str, steps: int | None = None, timeout: float = 120
) -> dict[str, Any]:
    """Wait for the job Succeeded and check what its played workers did: the final weights those of an
    uninterrupted run of ``steps`` steps (default: the harness's), at most a checkpoint interval of
    steps lost or redone per interruption. Returns the job's status."""
    steps = h.total_steps if steps is None else steps
    job = wait_phase(custom, ns, name, "Succeeded", timeout=timeout)
    assert not h.errors, h.errors
    assert h.weights.exists(), "rank 0 wrote no final weights"
    assert np.array_equal(np.load(h.weights), reference_weights(steps)), "weights differ from the uninterrupted run"
    st: dict[str, Any] = job["status"]
    for rec in st.get("interruptionHistory", []):
        assert rec["lostSteps"] <= STEPS_PER_INTERVAL, rec
        assert rec["recoverySeconds"] is not None, rec
    # what the processes really redid: last step of each run vs where the next one resumed
    runs = h.steps_reached()
    for (done, _), (_, start) in itertools.pairwise(runs):
        assert start is not None and done - start <= STEPS_PER_INTERVAL, runs
    return st


def interrupt_with_taint(
    dev_cluster: E2ECluster, core: Any, custom: Any, ns: str, harness: Callable[..., Harness], key: str, signal: str
) -> dict[str, Any]:
    h, _ = running_spot_job(dev_cluster, custom, ns, harness, 700)
    progressed(h, 150)
    node = running_node(core, ns, "tj")
    taint(core, node, key)
    st = finish(custom, h, ns, "tj")
    assert st["interruptions"] == 1 and st["capacityType"] == "spot", st
    rec = st["interruptionHistory"][0]
    assert rec["signal"] == signal and rec["node"] == node and rec["checkpointAcked"], rec
    assert rec["instanceType"] == "g4dn.xlarge" and st["instanceType"] != "g4dn.xlarge", st
    assert rec["lostSteps"] <= 5, rec  # a checkpoint at the notice: at most the steps the report lagged
    reasons = event_reasons(core, ns, "tj")
    for r in ("Interrupted", "Checkpointed", "Replanned", "Recovered", "Succeeded"):
        assert r in reasons, reasons
    return st
