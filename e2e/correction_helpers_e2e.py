"""What the early-correction and trial e2e tests share: the operator's settings for a correction within
seconds, the job (ResNet-50 steps pinned to g5.xlarge or p3.2xlarge, 2.7 h to its deadline, an hourly
periodic checkpoint) and the training played by :class:`spot_harness.Harness` at a chosen pace."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e_helpers import E2ECluster
from gpuscaler.testing import pinned, training_job, worker_template
from operator_helpers import OperatorProcess
from spot_harness import Harness, Harnesses

SAMPLES_PER_STEP = 256
STEPS = 20000
ENV = {
    "GPUSCALER_OBSERVE_INTERVAL_S": "1",
    "GPUSCALER_OBSERVE_WARMUP_S": "3",
    "GPUSCALER_CORRECTION_MIN_WINDOW_S": "15",
    "GPUSCALER_REPLAN_MIN_INTERVAL_S": "0",
    "GPUSCALER_REPLAN_RESTART_S": "60",
}
"""A correction after 3 s of warm-up and 15 s of progress, re-plans at any time, a 60 s move."""
POLICY = "name: e2e-correction\nminCheckpointIntervalS: 10\n"


def job(name: str, max_deadline_risk: float, instances: tuple[str, ...] = ("g5.xlarge", "p3.2xlarge")) -> dict[str, Any]:
    """The TrainingJob: g5.xlarge's predicted 2.19 h and p3.2xlarge's 1.77 h against a 2.7 h deadline (on
    ``instances``)."""
    return training_job(
        name,
        globalBatch=SAMPLES_PER_STEP,
        training={"steps": STEPS},
        maxDuration="2.7h",
        constraints={**pinned(list(instances)), "maxDeadlineRisk": max_deadline_risk},
        checkpoint={"intervalSeconds": 3600, "restartSeconds": 30, "writeSeconds": 0.1, "dir": "/checkpoints"},
        template=worker_template(),
    )


def start_operator(operator: Callable[..., OperatorProcess], tmp_path: Path) -> OperatorProcess:
    """The operator with :data:`ENV` and :data:`POLICY` (checkpoints every 10 s allowed)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return operator(GPUSCALER_POLICY_FILE=str(policy), **ENV)


@pytest.fixture
def played(core: Any, namespace: str, tmp_path: Path, dev_cluster: E2ECluster) -> Iterator[Callable[..., Harness]]:
    """Starts the played training of a job: ``played(name, step_sleep)`` (``resumed_step_sleep=``: the pace of a
    gang that resumes from a checkpoint); every harness stops after the test."""
    made = Harnesses(core, namespace, tmp_path, str(dev_cluster.kubeconfig))

    def start(name: str, step_sleep: float, **kw: Any) -> Harness:
        return made(name, STEPS, step_sleep=step_sleep, samples_per_step=SAMPLES_PER_STEP, **kw)

    yield start
    made.stop_all()
