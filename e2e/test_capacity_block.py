"""End to end: a job planned into a capacity block checkpoints before the block closes and continues on spot.

The operator (a subprocess, kwok provider) reads a policy that declares a 30-minute capacity block
of one g4dn.xlarge whose window closes a few minutes from now (it opened 30 minutes before that,
so the test waits only for its end). The job is longer than what is left of the window, so the
planner segments it: it runs in the block (kwok's node is labelled with the capacity type, the
pool and the window), the operator asks for a checkpoint at the margin from the checkpoint's
write time before the window closes (a planned move: Normal Event, no interruption counted), and
the rest runs on the next cheapest capacity, spot. The training is played by real processes
(:mod:`spot_harness`): the job must end Succeeded with the final weights bit-identical to an
uninterrupted run, and its worker pods must carry the documented preemption-cost annotations.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import spot_helpers
from e2e_helpers import E2ECluster, wait_for
from operator_helpers import OperatorProcess, apply, event_reasons, get_job, job_nodes, wait_phase
from spot_harness import Harness

harness = spot_helpers.harness

pytestmark = pytest.mark.timeout(720)


STEP_S = 0.02
"""Sleep per training step (the spot tests' is 0.03): the job outlasts what is left of the window."""
RESUMED_STEP_S = 0.002
"""Sleep per step of the run on spot after the move: its checks (final weights, steps redone, the
job Succeeded on spot) do not depend on its pace, and at STEP_S it took about 1.5 minutes."""
WINDOW_LEFT_S = 320
"""Seconds of the block's window left when the job is planned: more than the planner's start-up
allowance (3 min) plus the margin (about a minute), or the block is too short to plan into at all."""


def block_policy(now: datetime) -> str:
    start = now - timedelta(seconds=1800 - WINDOW_LEFT_S)
    end = now + timedelta(seconds=WINDOW_LEFT_S)
    return (
        "capacity:\n"
        "  - name: e2e-block\n"
        "    type: capacityBlock\n"
        "    instanceType: g4dn.xlarge\n"
        "    count: 1\n"
        f"    start: \"{start:%Y-%m-%dT%H:%M:%SZ}\"\n"
        f"    end: \"{end:%Y-%m-%dT%H:%M:%SZ}\"\n"
        "    reservationId: cr-0e2e0000000000001\n"
    )


def test_a_job_in_a_capacity_block_checkpoints_before_its_end_and_continues_on_spot(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    harness: Callable[..., Harness], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spot_helpers, "STEP_S", STEP_S)  # the spot suite's harness fixture reads it
    spot_helpers.start_operator(operator, tmp_path, extra=block_policy(datetime.now(UTC)))
    steps = int((WINDOW_LEFT_S - 30) / STEP_S)  # each step takes longer than its sleep: past the move
    apply(dev_cluster, namespace, spot_helpers.spot_job("tj", steps))
    h = harness("tj", steps, resumed_step_sleep=RESUMED_STEP_S)
    wait_phase(custom, namespace, "tj", "Running", timeout=90)
    st = get_job(custom, namespace, "tj")["status"]
    plan = st["plan"]
    assert plan["capacityType"] == "capacity-block" and plan["heldCapacity"] == "e2e-block", plan
    assert plan["reservationId"] == "cr-0e2e0000000000001" and len(plan["segments"]) == 2, plan
    first = plan["segments"][0]
    checkpoint_at = datetime.fromisoformat(first["checkpointAt"].replace("Z", "+00:00"))
    window_end = datetime.fromisoformat(plan["windowEnd"].replace("Z", "+00:00"))
    assert timedelta(0) < window_end - checkpoint_at < timedelta(minutes=5), plan  # a margin, not Karpenter's 40 min
    (node,) = [n for n in job_nodes(core, namespace, "tj") if not n.metadata.deletion_timestamp]
    labels = node.metadata.labels
    assert labels["karpenter.sh/capacity-type"] == "capacity-block" and labels["gpuscaler.io/held-capacity"] == "e2e-block"
    assert labels["gpuscaler.io/capacity-window-end"] == str(int(window_end.timestamp())), labels
    # the worker pods carry what a preemption would cost (docs/preemption-cost.md)
    spot_helpers.progressed(h, 1000, timeout=90)

    def published() -> dict[str, str]:
        pods = core.list_namespaced_pod(namespace, label_selector="gpuscaler.io/job").items
        return dict(pods[0].metadata.annotations or {}) if pods else {}

    wait_for(lambda: "gpuscaler.io/last-checkpoint-step" in published(), timeout=60, interval=0.5,
             what="the preemption-cost annotations on the worker")  # fmt: skip
    ann = published()
    assert int(ann["gpuscaler.io/work-at-risk-seconds"]) >= 0 and "gpuscaler.io/preemption-cost-time" in ann, ann
    assert "gpuscaler.io/last-checkpoint-time" in ann, ann
    # the planned move at checkpointAt, then spot
    wait_for(lambda: any(r["signal"] == "capacity-window-end" for r in
                         get_job(custom, namespace, "tj")["status"].get("interruptionHistory", [])),
             timeout=WINDOW_LEFT_S + 60, interval=1, what="the planned move before the block closes")  # fmt: skip
    st = spot_helpers.finish(custom, h, namespace, "tj", steps, timeout=WINDOW_LEFT_S + 120)
    rec = next(r for r in st["interruptionHistory"] if r["signal"] == "capacity-window-end")
    assert rec["checkpointAcked"] and rec["capacityType"] == "capacity-block", rec
    moved_at = datetime.fromisoformat(rec["time"].replace("Z", "+00:00"))
    assert checkpoint_at - timedelta(seconds=5) <= moved_at < window_end, (rec, checkpoint_at, window_end)
    assert st["interruptions"] == 0, "a planned move is not an interruption"
    assert st["capacityType"] == "spot" and st["plan"]["heldCapacity"] == "", st["plan"]
    reasons = event_reasons(core, namespace, "tj")
    for r in ("PlannedMove", "Checkpointed", "Replanned", "Recovered", "Succeeded"):
        assert r in reasons, reasons
    assert "Interrupted" not in reasons, reasons
