"""Helpers of the operator's e2e tests: ``gpuscaler run`` as a subprocess, the jobs' manifests, and
reading and playing what the operator does (its jobs, nodes, pods, Events).

A helper module (not a test module) so that every e2e test imports it; the ``custom`` and
``operator`` fixtures built on it are in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.cloud import JOB_LABEL, job_label_value
from gpuscaler.devcluster import chart
from gpuscaler.runtime.progress import Progress
from gpuscaler.testing import pinned, training_job, worker_template

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "gpuscaler.io", "v1alpha1", "trainingjobs"


def kubectl(cluster: E2ECluster, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], input=stdin, env=cluster.env, capture_output=True, text=True, check=check, timeout=60
    )


class OperatorProcess:
    """``gpuscaler run`` as a subprocess, restartable, scoped to one namespace."""

    def __init__(self, cluster: E2ECluster, namespace: str, log: Path, **settings: str) -> None:
        self.cluster = cluster
        self.log = log
        self.env = dict(
            cluster.env,
            GPUSCALER_NAMESPACE=namespace,
            GPUSCALER_METRICS_PORT="0",
            GPUSCALER_HEALTH_PORT="0",
            GPUSCALER_RECONCILE_INTERVAL_S="0.5",
            GPUSCALER_KWOK_PROVISIONING_DELAY_S="1",
            PYTHONUNBUFFERED="1",
        )
        self.env.update(settings)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=self.env, stdout=out, stderr=out
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crashed or evicted operator."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def operators(cluster: E2ECluster, namespace: str, log: Path, **base: str) -> Iterator[Callable[..., OperatorProcess]]:
    """``start(**settings)``: start an operator for ``namespace`` with the ``base`` settings and then
    ``settings`` (``GPUSCALER_*`` variables), logging to ``log``. The first start installs the Helm
    chart's finalizer policy for the namespace, as the chart does beside its operator
    (:func:`gpuscaler.devcluster.chart.install_finalizer_policy`). On exit the namespace's jobs are
    deleted while the last operator runs (its finalizer releases their pods and nodes), every
    operator is stopped, the policy removed and the log's tail printed."""
    started: list[OperatorProcess] = []
    policy: list[chart.Installed | None] = []

    def start(**settings: str) -> OperatorProcess:
        if not policy:
            policy.append(chart.install_finalizer_policy(cluster.env, namespace))
        op = OperatorProcess(cluster, namespace, log, **{**base, **settings})
        op.start()
        started.append(op)
        return op

    try:
        yield start
    finally:
        if started and started[-1].proc and started[-1].proc.poll() is None:
            kubectl(cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s", check=False)
        for op in started:
            op.stop()
        for installed in policy:
            chart.uninstall_finalizer_policy(cluster.env, installed)
        if log.exists():
            print(log.read_text(errors="replace")[-6000:])


# ------------------------------------------------------------------------------------ helpers


def job_manifest(name: str, *, instance: str = "p3.2xlarge", gpus: int = 1, suspend: bool = False) -> dict[str, Any]:
    """A small job pinned to one instance type and GPU count (so the test knows the plan's shape)."""
    template = worker_template(command=["python", "-m", "train"], resources={"requests": {"cpu": "1", "memory": "1Gi"}})
    return training_job(name, constraints=pinned(instance, gpus), suspend=suspend, template=template)


def get_job(custom: Any, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return obj


def phase_of(custom: Any, ns: str, name: str) -> str:
    return str((get_job(custom, ns, name).get("status") or {}).get("phase", ""))


def wait_phase(custom: Any, ns: str, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    wait_for(lambda: phase_of(custom, ns, name) == phase, timeout=timeout, interval=0.3, what=f"{name} {phase}")
    return get_job(custom, ns, name)


def job_nodes(core: Any, ns: str, name: str) -> list[Any]:
    items: list[Any] = core.list_node(label_selector=f"{JOB_LABEL}={job_label_value(ns, name)}").items
    return items


def job_pods(core: Any, ns: str, name: str) -> list[Any]:
    items: list[Any] = core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={job_label_value(ns, name)}").items
    return items


def finish_workers(core: Any, ns: str, name: str, steps: int = 50, batch: int = 256) -> None:
    """Play the training: report progress as the runtime does, then exit 0 on every worker."""
    now = time.time()
    for pod in job_pods(core, ns, name):
        progress = Progress(
            step=steps,
            samples=steps * batch,
            last_checkpoint_step=steps,
            last_checkpoint_time=now,
            checkpoint_ack=None,
            phase="finished",
            updated_at=now,
        )
        core.patch_namespaced_pod(pod.metadata.name, ns, {"metadata": {"annotations": progress.annotations()}})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        terminated = {"exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}
        statuses = [
            {"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0, "state": {"terminated": terminated}}
            for c in pod.spec.containers
        ]
        core.patch_namespaced_pod_status(
            pod.metadata.name, ns, {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
        )


def event_reasons(core: Any, ns: str, name: str) -> list[str]:
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TrainingJob")
    return [e.reason for e in sorted(events.items, key=lambda e: e.metadata.creation_timestamp)]


def event_messages(core: Any, ns: str, name: str, reason: str) -> list[str]:
    """The messages of a TrainingJob's Events of one reason, oldest first."""
    items = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},involvedObject.kind=TrainingJob").items
    return [e.message for e in sorted(items, key=lambda e: e.metadata.creation_timestamp) if e.reason == reason]


def apply(cluster: E2ECluster, ns: str, manifest: dict[str, Any]) -> None:
    kubectl(cluster, "apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(manifest))
