"""End to end, without the Helm chart: the operator's own worker admission policy, or its refusal.

The operator runs as the e2e suite runs it (admin credentials, no chart). In its default mode
(``install``) it creates the ValidatingAdmissionPolicy of :mod:`gpuscaler.kube.admission` and its
binding for the watched namespace, and a ``gpuscaler-worker`` token bound to one job's pod can
then report on that pod only: patching another job's pod, another annotation or a label is
refused by the real API server. In ``verify`` mode, with the policy absent, the operator starts no
workers (the job waits with the ``WorkerAdmissionPolicy`` condition and an Event saying why and
what to do) until a cluster admin applies the policy, which it then picks up.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.kube import admission
from gpuscaler.runtime import KubeReporter
from gpuscaler.runtime.progress import Progress
from operator_helpers import (
    OperatorProcess,
    apply,
    event_reasons,
    get_job,
    job_manifest,
    job_pods,
    kubectl,
    wait_phase,
)
from worker_rbac_helpers import WORKER, refused, token_client, two_running_jobs, wait_enforced

"""The operator suite's fixtures: the CRD installed, the custom-objects API, an operator per test."""

POLICY = admission.POLICY_NAME


def delete_policy(cluster: E2ECluster, namespace: str) -> None:
    """Remove the operator's policy and this namespace's binding (as if never installed)."""
    kubectl(cluster, "delete", "validatingadmissionpolicybinding", admission.binding_name(POLICY, namespace),
            "--ignore-not-found", check=False)
    kubectl(cluster, "delete", "validatingadmissionpolicy", POLICY, "--ignore-not-found", check=False)


def test_operator_installs_its_policy_and_a_worker_token_cannot_patch_another_jobs_pod(
    dev_cluster: E2ECluster,
    core: Any,
    custom: Any,
    namespace: str,
    operator: Callable[..., OperatorProcess],
) -> None:
    delete_policy(dev_cluster, namespace)
    operator()  # the default mode, install
    pod_a, pod_b = two_running_jobs(dev_cluster, core, custom, namespace)

    adm = client.AdmissionregistrationV1Api(dev_cluster.api)
    policy = adm.read_validating_admission_policy(POLICY)
    binding = adm.read_validating_admission_policy_binding(admission.binding_name(POLICY, namespace))
    assert policy.metadata.labels == {"app.kubernetes.io/managed-by": "gpuscaler"}
    assert admission.contains(dev_cluster.api.sanitize_for_serialization(policy.spec), admission.policy_spec())
    assert binding.spec.policy_name == POLICY and binding.spec.validation_actions == ["Deny"]
    assert binding.spec.match_resources.namespace_selector.match_labels == {"kubernetes.io/metadata.name": namespace}

    own = token_client(dev_cluster, namespace, WORKER, pod=pod_a)
    try:
        worker = client.CoreV1Api(own)
        forged = {"metadata": {"annotations": {"gpuscaler.io/progress-step": "99"}}}
        wait_enforced(worker, pod_b, namespace)
        body = refused(lambda: worker.patch_namespaced_pod(pod_b, namespace, forged))
        assert f'this token is bound to pod "{pod_a}", the request is for pod "{pod_b}"' in body, body
        assert (core.read_namespaced_pod(pod_b, namespace).metadata.annotations or {}).get("gpuscaler.io/progress-step") != "99"
        body = refused(lambda: worker.patch_namespaced_pod(pod_a, namespace, {"metadata": {"labels": {"gpuscaler.io/rank": "1"}}}))
        assert "spec, labels" in body, body
        body = refused(lambda: worker.patch_namespaced_pod(pod_a, namespace, {"metadata": {"annotations": {"gpuscaler.io/checkpoint-requested": "x"}}}))
        assert "may change only the annotations" in body, body

        # its own pod's reports still go through, and the operator records which pod wrote them
        reporter = KubeReporter(pod_a, namespace, patch=worker.patch_namespaced_pod)
        now = time.time()
        reporter.report(Progress(step=7, samples=7 * 256, last_checkpoint_step=5, last_checkpoint_time=now,
                                 checkpoint_ack=None, phase="training", updated_at=now))
        assert reporter.failures == 0, "the policy refused the runtime's own annotations"

        def progress() -> dict[str, Any]:
            p: dict[str, Any] = (get_job(custom, namespace, "a").get("status") or {}).get("progress", {})
            return p

        wait_for(lambda: progress().get("step") == 7, timeout=30, interval=0.3, what="the operator reading the report")
        assert progress()["reportedBy"] == pod_a and progress()["checkpointStep"] == 5
    finally:
        own.close()


def test_verify_mode_without_the_policy_starts_no_workers_until_it_is_applied(
    dev_cluster: E2ECluster,
    core: Any,
    custom: Any,
    namespace: str,
    operator: Callable[..., OperatorProcess],
) -> None:
    delete_policy(dev_cluster, namespace)
    operator(GPUSCALER_WORKER_ADMISSION_POLICY="verify")
    apply(dev_cluster, namespace, job_manifest("held"))

    def condition() -> dict[str, Any] | None:
        conds = (get_job(custom, namespace, "held").get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "WorkerAdmissionPolicy"), None)

    cond = wait_for(condition, timeout=60, interval=0.5, what="the WorkerAdmissionPolicy condition")
    assert cond["status"] == "False" and cond["reason"] == "PolicyMissing", cond
    assert f"{POLICY} is not in force" in cond["message"] and "mode verify installs nothing" in cond["message"]
    assert "GPUSCALER_WORKER_ADMISSION_POLICY=off" in cond["message"]
    st = get_job(custom, namespace, "held")["status"]
    assert st["phase"] == "Pending" and not st.get("nodes") and not job_pods(core, namespace, "held")
    assert "WorkerAdmissionPolicyMissing" in event_reasons(core, namespace, "held")
    with pytest.raises(ApiException) as missing:
        client.AdmissionregistrationV1Api(dev_cluster.api).read_validating_admission_policy(POLICY)
    assert missing.value.status == 404, "verify mode installed nothing"

    # a cluster admin applies the printed policy; the operator sees it at its next check and starts
    printed = subprocess.run([sys.executable, "-m", "gpuscaler.kube.admission", "--namespace", namespace],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    kubectl(dev_cluster, "apply", "-f", "-", stdin=printed)
    wait_phase(custom, namespace, "held", "Running", timeout=admission.RECHECK_S + 60)
    cond = condition()
    assert cond is not None and cond["status"] == "True", cond
