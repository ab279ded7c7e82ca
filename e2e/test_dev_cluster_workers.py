"""End to end: the dev cluster's worker runner plays the kubelet, and the getting-started demo passes.

The runner (:mod:`gpuscaler.devcluster.workers`, ``gpuscaler dev-cluster workers``) runs each
TrainingJob pod's command on this machine. Here it runs ``examples/demo-spot.yaml`` (the real
``examples/train/demo_train.py`` under the runtime) through the operator: a spot notice part-way is
answered with a checkpoint within the notice, the job resumes on its new node from that step, and
the final weights equal an uninterrupted run's. Deleting a job stops every process the runner
started; a command that cannot start, or that exits at once, ends its pod Failed as a kubelet
would. ``gpuscaler dev-cluster demo`` itself runs last, on a private cluster of its own (its time is
printed).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_helpers import E2ECluster, gpu_pod, wait_for
from gpuscaler.devcluster.demo import DEMO_INTERVAL_S, job_args, resumed_at
from gpuscaler.devcluster.nodes import create_node_pool, wait_nodes_ready
from gpuscaler.devcluster.workers import (
    RunnerConfig,
    RunnerError,
    WorkerRunner,
    bind_claim,
    check_dev_cluster,
)
from gpuscaler.names import AWS_SPOT_ITN_TAINT, JOB_LABEL
from operator_helpers import OperatorProcess, apply, get_job, wait_phase

pytestmark = pytest.mark.timeout(420)

"""The custom-objects API (the operator suite's fixture)."""

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "demo-spot.yaml"
TRAIN = ROOT / "examples" / "train"
POLICY = ROOT / "policies" / "dev-cluster-demo.yaml"
STEP_S = 0.1
"""The example's pace here (its own is 0.2 s a step)."""


@pytest.fixture
def runner(dev_cluster: E2ECluster, core: Any, namespace: str, tmp_path: Path) -> Iterator[WorkerRunner]:
    try:
        check_dev_cluster(dev_cluster.kubeconfig)
    except RunnerError as err:
        pytest.skip(f"the worker runner runs only on a dev cluster: {err}")
    r = WorkerRunner(
        core,
        RunnerConfig(
            work_dir=tmp_path / "workers", kubeconfig=Path(dev_cluster.kubeconfig), namespace=namespace,
            path_maps={"/app": TRAIN}, env={"OMP_NUM_THREADS": "1"}, poll_s=0.1,
        ),
    ).start()  # fmt: skip
    yield r
    r.stop()
    assert not [p for p in r.processes.values() if p.alive], "the runner left processes running"
    for p in r.processes.values():
        if p.log.exists():
            print(f"--- {p.name}\n{p.log.read_text(errors='replace')[-2000:]}")


def demo_job(steps: int = 300) -> dict[str, Any]:
    """The example job, paced at :data:`STEP_S`, with ``steps`` steps."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    command = doc["spec"]["template"]["spec"]["containers"][0]["command"]
    command[command.index("--step-seconds") + 1] = str(STEP_S)
    command[command.index("--total-steps") + 1] = str(steps)
    doc["spec"]["training"]["steps"] = steps
    doc["spec"]["checkpoint"]["intervalSeconds"] = DEMO_INTERVAL_S  # as the demo does, with its policy
    return doc


def reference_digest(steps: int, tmp_path: Path) -> str:
    """The example script's final weights' digest, trained alone and uninterrupted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCALER_", "POD_"))}
    env.update(GPUSCALER_CHECKPOINT_DIR=str(tmp_path / "ref-ckpt"), GPUSCALER_CHECKPOINT_INTERVAL_S="86400", OMP_NUM_THREADS="1")
    out = tmp_path / "ref.sha256"
    subprocess.run(
        [sys.executable, str(TRAIN / "demo_train.py"), "--total-steps", str(steps), "--step-seconds", "0",
         "--digest", str(out)],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out.read_text().strip()


@contextlib.contextmanager
def demo_applied(
    dev_cluster: E2ECluster, core: Any, namespace: str, tmp_path: Path, runner: WorkerRunner, steps: int
) -> Iterator[tuple[dict[str, Any], str]]:
    """The demo job with ``steps`` steps applied, its claim bound to a directory of the runner's and an
    operator (with the demo's policy) running: (the job's manifest, its claim's name). On exit the
    operator stops and its log's tail is printed."""
    doc = demo_job(steps)
    claim = doc["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    bind_claim(core, namespace, claim, runner.claim_dir(namespace, claim))
    op = OperatorProcess(dev_cluster, namespace, tmp_path / "operator.log", GPUSCALER_POLICY_FILE=str(POLICY))
    op.start()
    try:
        apply(dev_cluster, namespace, doc)
        yield doc, claim
    finally:
        op.stop()
        print((tmp_path / "operator.log").read_text(errors="replace")[-4000:])


def test_example_trains_survives_a_spot_notice_and_ends_with_the_same_weights(
    dev_cluster: E2ECluster, crd: None, kwok: None, core: Any, custom: Any, namespace: str, tmp_path: Path,
    runner: WorkerRunner,
) -> None:
    steps = 300
    with demo_applied(dev_cluster, core, namespace, tmp_path, runner, steps) as (doc, claim):
        name = doc["metadata"]["name"]
        label = f"{JOB_LABEL}={namespace}.{name}"

        def step() -> int:
            return int(((get_job(custom, namespace, name).get("status") or {}).get("progress") or {}).get("step") or 0)

        wait_for(lambda: step() >= steps * 0.4, timeout=240, interval=0.3, what="40% of the steps")
        pods = [p for p in core.list_namespaced_pod(namespace, label_selector=label).items if p.status.phase == "Running"]
        node = pods[0].spec.node_name
        body = core.read_node(node)
        noticed = time.time()
        core.patch_node(node, {"spec": {"taints": [*(body.spec.taints or []), {"key": AWS_SPOT_ITN_TAINT, "effect": "NoSchedule"}]}})
        job = wait_phase(custom, namespace, name, "Succeeded", timeout=300)
    st = job["status"]
    (rec,) = st["interruptionHistory"]
    assert rec["checkpointAcked"], rec
    acked_after = (_parse(rec["time"]) - noticed) if rec.get("time") else 0
    assert acked_after < 120, f"the checkpoint came {acked_after:.0f} s after the notice (AWS gives 120 s)"
    resumed = resumed_at(runner, f"{namespace}.{name}")
    assert resumed[0] == 0 and len(resumed) == 2, resumed
    # resumed from the acknowledged checkpoint, or a newer one: the worker trains on after it until its
    # pod is deleted, and checkpoints again on SIGTERM
    assert resumed[1] >= rec["checkpointStep"], (resumed, rec)
    assert rec["lostSteps"] <= DEMO_INTERVAL_S / STEP_S + 1, rec
    new_nodes = {p.node for p in runner.processes.values()}
    assert len(new_nodes) == 2, f"the job should resume on a new node: {new_nodes}"
    _, digest = job_args(doc)
    got = (runner.claim_dir(namespace, claim) / digest.relative_to("/checkpoints")).read_text().strip()
    assert got == reference_digest(steps, tmp_path), "the final weights differ from an uninterrupted run's"


def _parse(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_deleting_the_job_stops_every_process_it_started(
    dev_cluster: E2ECluster, crd: None, kwok: None, core: Any, custom: Any, namespace: str, tmp_path: Path,
    runner: WorkerRunner,
) -> None:
    # 3000 steps: 5 minutes at the pace here, deleted long before
    with demo_applied(dev_cluster, core, namespace, tmp_path, runner, 3000) as (doc, _):
        wait_for(lambda: any(p.alive for p in runner.processes.values()), timeout=180, interval=0.3, what="a worker process")
        pids = [p.proc.pid for p in runner.processes.values() if p.proc is not None]
        subprocess.run(["kubectl", "delete", "trainingjob", doc["metadata"]["name"], "-n", namespace, "--wait=false"],
                       env=dev_cluster.env, check=True, capture_output=True)  # fmt: skip
        wait_for(lambda: not any(p.alive for p in runner.processes.values()), timeout=90, interval=0.3,
                 what="every worker process stopped")  # fmt: skip
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"process {pid} still runs"
    # each was stopped by the runner: SIGTERM for its deleted pod, or SIGKILL when the operator's finalizer
    # deleted the node too before the runner's next look (a machine gone)
    assert all(p.signalled in ("TERM", "KILL") for p in runner.processes.values() if p.proc is not None), [
        (p.name, p.signalled) for p in runner.processes.values()
    ]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    ("command", "code", "reason"),
    [(["/nonexistent/train"], 128, "StartError"), (["python", "-c", "raise SystemExit(3)"], 3, "Error")],
    ids=["missing-command", "exits-at-once"],
)
def test_a_command_that_fails_ends_its_pod_failed_as_a_kubelet_would(
    dev_cluster: E2ECluster, kwok: None, core: Any, namespace: str, runner: WorkerRunner,
    command: list[str], code: int, reason: str,
) -> None:
    pool = f"fail-{namespace[-5:]}-{code}"
    made = create_node_pool(dev_cluster.api, pool, "g4dn.xlarge", 1)
    try:
        wait_nodes_ready(dev_cluster.api, made.node_names)
        pod = gpu_pod("w", 1)
        pod["metadata"]["labels"] = {JOB_LABEL: f"{namespace}.bad"}
        pod["spec"]["nodeName"] = made.node_names[0]
        pod["spec"]["containers"][0]["command"] = command
        apply(dev_cluster, namespace, pod)

        def ended() -> Any:
            p = core.read_namespaced_pod("w", namespace)
            return p if p.status.phase == "Failed" else None

        failed = wait_for(ended, timeout=120, interval=0.3, what="the pod Failed")
    finally:
        core.delete_collection_node(label_selector=f"gpuscaler.io/pool={pool}")
    (status,) = failed.status.container_statuses
    term = status.state.terminated
    assert (term.exit_code, term.reason) == (code, reason), term
    if reason == "StartError":
        assert "/nonexistent/train" in (term.message or ""), term.message


def test_the_demo_passes(dev_cluster: E2ECluster, tmp_path: Path) -> None:
    """``gpuscaler dev-cluster demo``, as the tutorial runs it (a private cluster of its own)."""
    try:
        check_dev_cluster(dev_cluster.kubeconfig)
    except RunnerError as err:
        pytest.skip(f"the demo runs a dev cluster of its own; this session runs elsewhere: {err}")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "gpuscaler.cli", "dev-cluster", "demo", "--name", f"demo-{os.getpid()}",
         "--step-seconds", str(STEP_S), "--work-dir", str(tmp_path / "demo"), "--timeout", "360"],
        check=False, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PATH": dev_cluster.env["PATH"]},
    )  # fmt: skip
    print(proc.stdout)
    print(proc.stderr[-3000:])
    print(f"gpuscaler dev-cluster demo took {time.monotonic() - t0:.0f} s")
    assert proc.returncode == 0
    out = proc.stdout
    acked = re.search(r"checkpoint acknowledged at step (\d+)", out)
    resumed = re.search(r"resumed at step (\d+)", out)
    assert acked and resumed and int(resumed.group(1)) >= int(acked.group(1)), out
    assert "identical" in out and "Succeeded" in out
