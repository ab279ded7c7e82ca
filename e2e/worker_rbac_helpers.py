"""Helpers of the worker identity tests (test_worker_rbac.py, test_worker_admission.py): a worker's token client, two running jobs, and how a refusal reads."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster, service_account_kubeconfig, wait_for
from operator_helpers import apply, job_manifest, job_pods, kubectl, wait_phase

WORKER = "gpuscaler-worker"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuscaler"}


def can_i(cluster: E2ECluster, user: str, verb: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i`` as ``user``; ``resource/sub`` checks a subresource (not a name)."""
    resource, _, sub = resource.partition("/")
    extra = ["--subresource", sub] if sub else []
    res = kubectl(cluster, "auth", "can-i", verb, resource, *extra, "--as", user, "-n", namespace, check=False)
    return res.stdout.strip() == "yes"


def token_client(cluster: E2ECluster, namespace: str, account: str, pod: str | None = None) -> Any:
    """An ApiClient authenticated with a short-lived token of the ServiceAccount; with ``pod``, the
    token is bound to that pod, as the kubelet-projected token in the pod is."""
    return config.new_client_from_config_dict(service_account_kubeconfig(cluster, account, namespace, pod=pod))

CHART = Path(__file__).resolve().parents[1] / "helm" / "gpuscaler"


def two_running_jobs(cluster: E2ECluster, core: Any, custom: Any, namespace: str) -> tuple[str, str]:
    """Jobs ``a`` and ``b`` (one worker each, as gpuscaler-worker) Running; their pods' names."""
    for name in ("a", "b"):
        apply(cluster, namespace, job_manifest(name))
    for name in ("a", "b"):
        wait_phase(custom, namespace, name, "Running", timeout=90)
    (pod_a,) = [p.metadata.name for p in job_pods(core, namespace, "a")]
    (pod_b,) = [p.metadata.name for p in job_pods(core, namespace, "b")]
    assert {p.spec.service_account_name for n in "ab" for p in job_pods(core, namespace, n)} == {WORKER}
    return pod_a, pod_b


def refused(call: Callable[[], object]) -> str:
    """The message of the 403 that ``call`` must raise."""
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, err.value
    message: str = json.loads(err.value.body)["message"]
    return message


def wait_enforced(worker: Any, other_pod: str, namespace: str) -> None:
    """Wait until a worker's patch of ``other_pod`` is refused (the API server loads a new policy
    within a moment)."""

    def enforced() -> bool:
        try:
            worker.patch_namespaced_pod(other_pod, namespace, {"metadata": {"annotations": {"gpuscaler.io/progress-step": "1"}}})
        except ApiException as err:
            return err.status == 403
        return False

    wait_for(enforced, timeout=30, interval=0.5, what="the admission policy enforced")


def chart_worker_policy(cluster: E2ECluster, release: str) -> str:
    """The chart's worker admission policy and binding, as ``helm template`` renders them."""
    res = subprocess.run(
        ["helm", "template", release, str(CHART), "--show-only", "templates/worker-admission-policy.yaml"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return res.stdout
