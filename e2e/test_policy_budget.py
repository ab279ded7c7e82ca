"""End to end: a namespace budget in a GPUScalingPolicy stops a job; raising it lets the job through.

Expected of the operator: before provisioning it merges the policies in force for the job's
namespace (``gpuscaler.policy.policy_for_namespace`` over the policy file and the
GPUScalingPolicy objects), checks the job (``check_job`` with the namespace's ``NamespaceUsage``)
and, on a violation, sets the ``PolicyViolation`` condition with the rule and values, stays
Pending and provisions nothing; a policy change applies on the next reconcile, no restart.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.testing import pinned, training_job, worker_template
from operator_helpers import OperatorProcess, kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION = "gpuscaler.io", "v1alpha1"


@pytest.fixture
def operator(dev_cluster: E2ECluster, crd: None, kwok: None, namespace: str, tmp_path: Path) -> Iterator[None]:
    op = OperatorProcess(dev_cluster, namespace, tmp_path / "operator.log", GPUSCALER_WATCH_POLICIES="true")
    op.start()
    yield
    kubectl(dev_cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s")
    op.stop()
    print(op.log.read_text(errors="replace")[-3000:])


def policy(name: str, namespace: str, usd_per_job: float) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUScalingPolicy",
        "metadata": {"name": name},
        "spec": {"namespaces": [namespace], "maxUsdPerJob": usd_per_job, "maxGpusPerNamespace": 8},
    }


def test_namespace_budget_stops_a_job_and_a_policy_change_lets_it_through(
    dev_cluster: E2ECluster, namespace: str, core: Any, operator: None
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    name = f"budget-{uuid.uuid4().hex[:5]}"
    kubectl(dev_cluster, "apply", "-f", "-", stdin=yaml.safe_dump(policy(name, namespace, 0.01)))
    try:
        job = training_job("capped", constraints=pinned("p3.2xlarge"), template=worker_template("registry.invalid/t:e2e"))
        kubectl(dev_cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(job))

        def status() -> dict[str, Any]:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "capped")
            return dict(obj.get("status") or {})

        def violation() -> dict[str, Any] | None:
            conds = status().get("conditions") or []
            return next((c for c in conds if c["type"] == "PolicyViolation" and c["status"] == "True"), None)

        cond = wait_for(violation, timeout=30, what="PolicyViolation condition")
        assert "maxUsdPerJob" in cond["message"]
        assert status().get("phase") in ("Pending", "Planning")
        assert not core.list_node(label_selector="gpuscaler.io/job").items, "nothing provisioned"

        kubectl(dev_cluster, "apply", "-f", "-", stdin=yaml.safe_dump(policy(name, namespace, 10_000)))
        wait_for(
            lambda: status().get("phase") == "Running", timeout=60, what="Running after the policy change"
        )
        assert violation() is None
    finally:
        kubectl(dev_cluster, "delete", "gpuscalingpolicy", name, "--ignore-not-found")
