"""End to end: early correction from the workers' progress annotations alone (no Prometheus).

The operator (``gpuscaler run``, kwok provider, no ``GPUSCALER_PROMETHEUS_URL``) plans a job with
a deadline on the cheapest GPU that meets it within its accepted risk (g5.xlarge, A10G). The
training is played by :class:`spot_harness.Harness`: real processes running the runtime library,
whose :class:`~gpuscaler.runtime.kube_reporter.KubeReporter` writes ``gpuscaler.io/progress-samples``
and ``gpuscaler.io/checkpoint-step`` on the worker pod, at 30% below the plan's predicted
throughput. The operator must measure that from the annotations, write the corrected estimate
(factor ~0.7 for A10G, how sure, the corrected P(miss deadline)) in ``status.observed``, find the
deadline at risk, ask the workers for a checkpoint at once (``gpuscaler.io/checkpoint-requested``, the
spot handshake's request, which the real runtime answers at its next step) and move the job to a faster
plan from that checkpoint (not before it). The job's periodic checkpoint is an hour apart: only the
requested one can come within the test.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from correction_helpers_e2e import SAMPLES_PER_STEP, job, played, start_operator
from e2e_helpers import E2ECluster, wait_for
from operator_helpers import OperatorProcess, apply, event_reasons, get_job, wait_phase
from operator_helpers import event_messages as events
from spot_harness import Harness

__all__ = ["played"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(240)


SLOWER = 0.7
"""Real throughput / predicted: the workers run 30% below the plan."""


def test_slow_workers_are_corrected_from_annotations_and_replanned_from_a_checkpoint_asked_for_now(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    played: Callable[..., Harness], tmp_path: Path,
) -> None:
    op = start_operator(operator, tmp_path)
    assert "GPUSCALER_PROMETHEUS_URL" not in op.env
    # g5.xlarge's predicted 2.19 h meets 2.7 h within the 30% P(miss) this job accepts (the model's error
    # on a GDDR GPU); at 70% of that speed it needs 3.1 h (as tests/test_observe_correction.py)
    apply(dev_cluster, namespace, job("late", 0.3))
    plan = wait_for(lambda: (get_job(custom, namespace, "late").get("status") or {}).get("plan"), timeout=60,
                    what="a plan")
    assert plan["instanceType"] == "g5.xlarge" and plan["gpuType"] == "A10G", plan
    assert plan["throughputP10"] < plan["throughput"] < plan["throughputP90"]
    assert 0.05 < plan["deadlineMissProbability"] <= 0.3, plan
    predicted = plan["throughput"]
    # one step of SAMPLES_PER_STEP at 70% of the predicted rate (the step itself takes ~1 ms)
    played("late", SAMPLES_PER_STEP / (SLOWER * predicted) - 0.001)
    wait_phase(custom, namespace, "late", "Running", timeout=60)
    t0 = time.monotonic()

    def pending() -> dict[str, Any] | None:
        o = (get_job(custom, namespace, "late").get("status") or {}).get("observed") or {}
        return o if o.get("replanPending") else None

    seen = wait_for(pending, timeout=90, interval=0.2, what="a corrected estimate and a re-plan pending")
    corrected_after = time.monotonic() - t0
    assert seen["source"] == "annotations", seen
    assert seen["efficiencyByGpu"]["A10G"] == pytest.approx(SLOWER, abs=0.07), seen
    assert seen["correctedThroughput"] == pytest.approx(SLOWER * predicted, rel=0.1), seen
    assert seen["correctionLogSigma"] < plan["throughputLogSigma"] and seen["windowSeconds"] >= 15, seen
    assert seen["deadlineMissProbability"] > 0.3, seen
    assert "P(miss deadline)" in seen["replanReason"] and "p3.2xlarge" in seen["replanReason"], seen
    after_step = seen.get("replanAfterCheckpointStep")
    st = get_job(custom, namespace, "late")["status"]
    assert st["plan"]["instanceType"] == "g5.xlarge"  # not before the checkpoint
    pending = wait_for(lambda: events(core, namespace, "late", "ReplanPending"), timeout=30, interval=0.2,
                       what="the ReplanPending event")
    assert "from the checkpoint asked for now" in pending[-1], pending

    def moved() -> dict[str, Any] | None:
        s = get_job(custom, namespace, "late").get("status") or {}
        return s if (s.get("plan") or {}).get("instanceType") == "p3.2xlarge" else None

    st = wait_for(moved, timeout=60, interval=0.2, what="the new plan on p3.2xlarge")
    moved_after = time.monotonic() - t0
    assert st["observed"]["replans"] == 1 and not st["observed"].get("replanPending")
    assert st["plan"]["totalSamples"] == 20000 * SAMPLES_PER_STEP
    # The Event is posted after the status patch that moved the plan, so it may show up a little later.
    replanned = wait_for(
        lambda: events(core, namespace, "late", "Replanned"), timeout=30, interval=0.2, what="the Replanned event"
    )
    at = int(re.search(r"at checkpoint step (\d+)", replanned[-1]).group(1))  # type: ignore[union-attr]
    assert after_step is None or at > after_step, (after_step, replanned)
    reasons = event_reasons(core, namespace, "late")
    for r in ("ModelCorrected", "ReplanPending", "Replanned"):
        assert r in reasons, reasons
    wait_phase(custom, namespace, "late", "Running", timeout=60)
    print(f"\nearly correction e2e: re-plan pending {corrected_after:.1f} s after Running, "
          f"moved {moved_after:.1f} s after Running (checkpoint step {at})")
