"""End to end: observed performance with a real Prometheus (gpuscaler.observe, docs/observe.md).

The operator (``gpuscaler run``) runs on the local control plane with ``GPUSCALER_PROMETHEUS_URL``
pointing at a real Prometheus (Debian's package, started by :mod:`prometheus_fixture`) that scrapes
a test exporter every second. The exporter plays the DCGM exporter and the training runtime for the
job's worker pod (same pod name and namespace as the operator's worker), so the label join is the
one a cluster has. Scenarios: a job on its prediction is left alone; an input-bound job gets the
InputBound condition; a job at half its predicted speed gets efficiency factor ~0.5 and, because
another plan is now cheaper, moves to it at its next checkpoint and not before.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from e2e_helpers import E2ECluster, wait_for
from operator_helpers import (
    OperatorProcess,
    apply,
    event_reasons,
    get_job,
    job_manifest,
    operators,
    wait_phase,
)

if TYPE_CHECKING:  # imported by pytest as a plugin; importing it here too would skip its assert rewriting
    from prometheus_fixture import PrometheusServer

pytest_plugins = ["prometheus_fixture"]

ROOT = Path(__file__).resolve().parents[1]
OBSERVE_ENV = {
    "GPUSCALER_OBSERVE_INTERVAL_S": "1",
    "GPUSCALER_OBSERVE_WINDOW_S": "60",
    "GPUSCALER_OBSERVE_RATE_WINDOW_S": "2",
    "GPUSCALER_OBSERVE_WARMUP_S": "2",
    "GPUSCALER_REPLAN_MIN_INTERVAL_S": "0",
    "GPUSCALER_REPLAN_RESTART_S": "60",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def observing_operator(
    dev_cluster: E2ECluster, crd: None, kwok: None, namespace: str, tmp_path: Path, prometheus: PrometheusServer
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start an operator for this test's namespace, observing through the test Prometheus."""
    env = {**OBSERVE_ENV, "GPUSCALER_PROMETHEUS_URL": prometheus.url}
    with operators(dev_cluster, namespace, tmp_path / "operator.log", **env) as start:
        yield start
    for key in [k for k in prometheus.exporter.workers if k[0] == namespace]:
        prometheus.exporter.workers.pop(key, None)


def observed(custom: Any, ns: str, name: str) -> dict[str, Any]:
    return dict((get_job(custom, ns, name).get("status") or {}).get("observed") or {})


def conditions(custom: Any, ns: str, name: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (get_job(custom, ns, name).get("status") or {}).get("conditions", [])}


def running_job(cluster: E2ECluster, custom: Any, ns: str, name: str, instances: list[str]) -> dict[str, Any]:
    manifest = job_manifest(name, instance=instances[0], gpus=1)
    manifest["spec"]["constraints"]["instanceTypes"] = instances
    apply(cluster, ns, manifest)
    return wait_phase(custom, ns, name, "Running", timeout=60)


def test_observe_matching_job_is_left_alone(
    dev_cluster: E2ECluster, custom: Any, core: Any, namespace: str, prometheus: PrometheusServer,
    observing_operator: Callable[..., OperatorProcess],
) -> None:
    metrics_port = free_port()
    observing_operator(GPUSCALER_METRICS_PORT=str(metrics_port))
    job = running_job(dev_cluster, custom, namespace, "steady", ["g5.xlarge", "g6.xlarge"])
    plan = job["status"]["plan"]
    assert plan["instanceType"] == "g5.xlarge"
    prometheus.exporter.add(prometheus.exporter.worker(namespace, "steady-worker-0", samples_per_s=plan["throughput"]))
    wait_for(lambda: observed(custom, namespace, "steady").get("throughput"), timeout=40, what="observed throughput")
    time.sleep(4)  # a few more assessments
    seen = observed(custom, namespace, "steady")
    assert seen["ratio"] == pytest.approx(1.0, abs=0.1), seen
    assert seen["efficiencyFactor"] == 1.0 and not seen.get("replanPending") and seen["pods"] == 1
    assert seen["gpuUtil"] == pytest.approx(95.0) and seen["tensorActive"] == pytest.approx(0.45)
    assert seen["memoryUsedGb"] == pytest.approx(12000 * 1024 * 1024 / 1e9, rel=0.01)
    st = get_job(custom, namespace, "steady")["status"]
    assert st["plan"]["instanceType"] == "g5.xlarge" and st["phase"] == "Running"
    bottlenecks = {"InputBound", "MemoryBound", "CommunicationBound", "AMPInactive", "MemoryNearFull"}
    assert not bottlenecks & set(conditions(custom, namespace, "steady"))
    reasons = event_reasons(core, namespace, "steady")
    assert not {"ModelCorrected", "ReplanPending", "Replanned"} & set(reasons), reasons
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    assert f'gpuscaler_throughput_predicted{{job="steady",namespace="{namespace}"}}' in text
    assert f'gpuscaler_throughput_observed{{job="steady",namespace="{namespace}"}}' in text


def test_observe_input_bound_job_gets_the_condition(
    dev_cluster: E2ECluster, custom: Any, namespace: str, prometheus: PrometheusServer, tmp_path: Path,
    observing_operator: Callable[..., OperatorProcess],
) -> None:
    observing_operator()
    job = running_job(dev_cluster, custom, namespace, "starved", ["p3.2xlarge"])
    predicted = job["status"]["plan"]["throughput"]
    prometheus.exporter.add(
        prometheus.exporter.worker(namespace, "starved-worker-0", samples_per_s=0.5 * predicted, gpu_util=30.0, tensor_active=0.1)
    )
    cond = wait_for(
        lambda: conditions(custom, namespace, "starved").get("InputBound"), timeout=40, what="InputBound condition"
    )
    assert cond["status"] == "True" and cond["reason"] == "LowGPUUtilization"
    assert "GPU utilisation 30%" in cond["message"] and "data-loader" in cond["message"]
    seen = observed(custom, namespace, "starved")
    assert seen["ratio"] == pytest.approx(0.5, abs=0.08) and seen["gpuUtil"] == pytest.approx(30.0)
    assert get_job(custom, namespace, "starved")["status"]["plan"]["instanceType"] == "p3.2xlarge"
    # the report: status through the API, live metrics and the plot from Prometheus
    plot = tmp_path / "starved.png"
    report = subprocess.run(
        [sys.executable, "-m", "gpuscaler.cli", "report", "starved", "-n", namespace, "--prometheus", prometheus.url,
         "--plot", str(plot)],
        env=dev_cluster.env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert report.returncode == 0, report.stderr
    assert "InputBound (LowGPUUtilization)" in report.stdout and "starved-worker-0" in report.stdout, report.stdout
    assert "projected $" in report.stdout and plot.stat().st_size > 10_000
    print("\n" + report.stdout)


def test_observe_slow_job_is_corrected_and_replanned_at_its_checkpoint(
    dev_cluster: E2ECluster, custom: Any, core: Any, namespace: str, prometheus: PrometheusServer,
    observing_operator: Callable[..., OperatorProcess],
) -> None:
    observing_operator()
    job = running_job(dev_cluster, custom, namespace, "slow", ["g5.xlarge", "g6.xlarge"])
    plan = job["status"]["plan"]
    assert plan["instanceType"] == "g5.xlarge" and plan["gpuType"] == "A10G"
    worker = prometheus.exporter.add(
        prometheus.exporter.worker(namespace, "slow-worker-0", samples_per_s=0.5 * plan["throughput"], checkpoint_step=40)
    )
    t0 = time.monotonic()
    seen = wait_for(
        lambda: (o := observed(custom, namespace, "slow")).get("replanPending") and o,
        timeout=40,
        what="model corrected and a re-plan pending",
    )
    corrected_after = time.monotonic() - t0
    assert seen["efficiencyFactor"] == pytest.approx(0.5, abs=0.05), seen
    assert seen["efficiencyByGpu"]["A10G"] == pytest.approx(0.5, abs=0.05)
    assert "g6.xlarge" in seen["replanReason"], seen
    # no checkpoint yet: the job stays where it is
    time.sleep(3)
    st = get_job(custom, namespace, "slow")["status"]
    assert st["plan"]["instanceType"] == "g5.xlarge" and st["phase"] == "Running"
    # the runtime reports a new checkpoint (annotation on the pod, as the runtime's reporter writes it)
    worker.checkpoint_step = 100
    core.patch_namespaced_pod("slow-worker-0", namespace, {"metadata": {"annotations": {"gpuscaler.io/checkpoint-step": "100"}}})
    t1 = time.monotonic()
    wait_for(
        lambda: (get_job(custom, namespace, "slow")["status"].get("plan") or {}).get("instanceType") == "g6.xlarge",
        timeout=30,
        what="new plan on g6.xlarge",
    )
    prometheus.exporter.workers.pop((namespace, "slow-worker-0"), None)
    st = wait_phase(custom, namespace, "slow", "Running", timeout=60)["status"]
    moved_after = time.monotonic() - t1
    assert st["plan"]["gpuType"] == "L4" and st["plan"]["efficiencyFactor"] == 1.0
    assert st["observed"]["replans"] == 1 and not st["observed"].get("replanPending")
    assert st["observed"]["efficiencyByGpu"]["A10G"] == pytest.approx(0.5, abs=0.05)
    pods = core.list_namespaced_pod(namespace, label_selector="gpuscaler.io/rank=0").items
    nodes = {n.metadata.name: n for n in core.list_node().items}
    live = [p for p in pods if not p.metadata.deletion_timestamp and p.spec.node_name]
    assert live and all(
        nodes[p.spec.node_name].metadata.labels["node.kubernetes.io/instance-type"] == "g6.xlarge" for p in live
    )
    reasons = event_reasons(core, namespace, "slow")
    for r in ("ModelCorrected", "ReplanPending", "Replanned"):
        assert r in reasons, reasons
    print(f"\nobserve e2e: corrected + re-plan pending {corrected_after:.1f}s after metrics appeared; "
          f"Running on the new plan {moved_after:.1f}s after the checkpoint")
