"""End to end: a trial plan (``constraints.atRiskLimit: Trial``, the default) on a real API server.

The job accepts a 1% risk of missing its 2.7 h deadline. No plan meets that under the model's band
(g5.xlarge's P(miss) is about 4%, p3.2xlarge's about 2%), but the deadline is inside their bands,
so the operator (``gpuscaler run``, kwok provider) starts the
cheapest, g5.xlarge, as a trial: ``status.plan.trial``, ``Planned`` condition and Event ``Trial``.
The training is played by :class:`spot_harness.Harness` (real processes running the runtime library,
reporting progress on the worker pod). Measured on time, the trial is kept (``TrialKept``). Measured
30% slow (pinned to g5.xlarge), it would probably miss the deadline, no plan meets 1% at that speed and
no other GPU type is left for a next trial, so the job stops from a checkpoint it asks the workers for
at once (``gpuscaler.io/checkpoint-requested``, which the real runtime answers): ``Failed`` with
reason ``DeadlineInfeasible``, naming the measured speed and the checkpoint step to resume from.
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
from gpuscaler.runtime.checkpoint_files import step_dir_name
from operator_helpers import OperatorProcess, apply, event_reasons, get_job, wait_phase
from operator_helpers import event_messages as events
from spot_harness import Harness

__all__ = ["played"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(300)


def _trial(dev_cluster: E2ECluster, custom: Any, core: Any, namespace: str, name: str,
           operator: Callable[..., OperatorProcess], tmp_path: Path, **kw: Any) -> dict[str, Any]:  # fmt: skip
    start_operator(operator, tmp_path)
    apply(dev_cluster, namespace, job(name, 0.01, **kw))
    plan: dict[str, Any] = wait_for(lambda: (get_job(custom, namespace, name).get("status") or {}).get("plan"),
                                    timeout=60, what="a plan")  # fmt: skip
    assert plan["trial"] is True and plan["instanceType"] == "g5.xlarge", plan
    assert plan["why"].startswith("trial: no plan meets maxDeadlineRisk 1.0%"), plan["why"]
    assert 0.01 < plan["deadlineMissProbability"] < 0.5, plan
    conds = {c["type"]: c for c in get_job(custom, namespace, name)["status"]["conditions"]}
    assert conds["Planned"]["reason"] == "Trial", conds["Planned"]
    wait_for(lambda: events(core, namespace, name, "Trial"), timeout=30, interval=0.2, what="the Trial event")
    return plan


def _running(custom: Any, namespace: str, name: str) -> float:
    """Waits for the job to run; the clock then."""
    wait_phase(custom, namespace, name, "Running", timeout=60)
    return time.monotonic()


def _event(core: Any, namespace: str, name: str, reason: str, timeout: float) -> list[str]:
    """The messages of the job's Events of ``reason`` once there is one."""
    return wait_for(lambda: events(core, namespace, name, reason), timeout=timeout, interval=0.2,
                    what=f"the {reason} event of {name}")  # fmt: skip


def test_a_trial_measured_on_time_is_kept(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    played: Callable[..., Harness], tmp_path: Path,
) -> None:
    plan = _trial(dev_cluster, custom, core, namespace, "kept", operator, tmp_path)
    played("kept", SAMPLES_PER_STEP / plan["throughput"] - 0.001)
    t0 = _running(custom, namespace, "kept")
    kept = _event(core, namespace, "kept", "TrialKept", 90)
    assert "<= maxDeadlineRisk 1.0%" in kept[-1], kept
    st = get_job(custom, namespace, "kept")["status"]
    assert st["plan"]["trial"] is False and st["plan"]["instanceType"] == "g5.xlarge" and st["phase"] == "Running", st
    print(f"\ntrial e2e: kept {time.monotonic() - t0:.1f} s after Running: {kept[-1]}")


def test_a_trial_measured_too_slow_stops_the_job_at_a_checkpoint(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    played: Callable[..., Harness], tmp_path: Path,
) -> None:
    # g5.xlarge only: no other GPU type for a next trial, so the job stops
    plan = _trial(dev_cluster, custom, core, namespace, "slow", operator, tmp_path, instances=("g5.xlarge",))
    h = played("slow", SAMPLES_PER_STEP / (0.7 * plan["throughput"]) - 0.001)
    t0 = _running(custom, namespace, "slow")
    wait_phase(custom, namespace, "slow", "Failed", timeout=120)
    stopped_after = time.monotonic() - t0
    st = get_job(custom, namespace, "slow")["status"]
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "DeadlineInfeasible", failed
    assert "trial ended: measured" in failed["message"], failed
    assert "(the deadline would probably be missed; maxDeadlineRisk 1.0%)" in failed["message"], failed
    assert "DeadlineInfeasible" in event_reasons(core, namespace, "slow")
    # it stopped from the checkpoint it asked the workers for (the periodic one is an hour apart), which the
    # real runtime wrote: the job can resume from it
    at = int(re.search(r"stopped at checkpoint step (\d+)$", failed["message"]).group(1))  # type: ignore[union-attr]
    assert at > 0 and (h.ckpt_dir / step_dir_name(at)).exists(), sorted(p.name for p in h.ckpt_dir.iterdir())
    wait_for(lambda: all(not p.alive for p in h.played.values()) or None, timeout=60, interval=0.2,
             what="the workers to stop")  # fmt: skip
    print(f"\ntrial e2e: stopped {stopped_after:.1f} s after Running at checkpoint step {at}: {failed['message']}")


def test_a_trial_measured_too_slow_goes_on_to_a_next_trial_on_another_gpu_type(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    played: Callable[..., Harness], tmp_path: Path,
) -> None:
    """g5.xlarge plays 30% slow: it would probably miss, and p3.2xlarge (V100) has the deadline inside its band,
    so the job moves there from the checkpoint it asks for, as the next trial; played on time there, it is kept."""
    plan = _trial(dev_cluster, custom, core, namespace, "next", operator, tmp_path)
    # the resumed gang (on p3.2xlarge, predicted about 1.24x g5.xlarge) plays 1.4x g5.xlarge's prediction
    h = played("next", SAMPLES_PER_STEP / (0.7 * plan["throughput"]) - 0.001,
               resumed_step_sleep=SAMPLES_PER_STEP / (1.4 * plan["throughput"]))  # fmt: skip
    t0 = _running(custom, namespace, "next")
    moved = _event(core, namespace, "next", "Replanned", 120)
    assert "a next trial on a GPU type not tried yet (A10G tried): 1 x p3.2xlarge" in moved[-1], moved
    st = get_job(custom, namespace, "next")["status"]
    assert st["plan"]["instanceType"] == "p3.2xlarge" and st["plan"]["trial"] is True, st["plan"]
    assert st["observed"]["triedGpuTypes"] == ["A10G"], st["observed"]
    moved_after = time.monotonic() - t0
    kept = _event(core, namespace, "next", "TrialKept", 150)
    st = get_job(custom, namespace, "next")["status"]
    assert st["plan"]["instanceType"] == "p3.2xlarge" and st["plan"]["trial"] is False and st["phase"] == "Running", st
    assert "DeadlineInfeasible" not in event_reasons(core, namespace, "next")
    assert any(h.ckpt_dir.glob("step-*")), "the move resumed from the checkpoint the first trial wrote on request"
    print(f"\ntrial e2e: next trial after {moved_after:.1f} s, kept {time.monotonic() - t0:.1f} s after Running: {kept[-1]}")
