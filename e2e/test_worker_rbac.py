"""End to end: the workers' identity on the real control plane.

For a job whose template names no ServiceAccount the operator creates, in the job's namespace,
the ServiceAccount ``gpuscaler-worker``, a Role allowing ``get`` and ``patch`` on ``pods`` and its
RoleBinding, and runs the workers as that account. With a token of that account the runtime's
:class:`~gpuscaler.runtime.kube_reporter.KubeReporter` patches its pod's progress annotations
(the operator then shows the progress), while deleting a pod or reading a Secret is Forbidden.
A job that names its own ServiceAccount keeps it and gets none of this.

With the Helm chart's ValidatingAdmissionPolicy installed (rendered from the chart, applied to
the real API server), that account can change only the runtime's annotations, and only on the pod
its token is bound to: the reporter still works, everything else is refused with a message. (The
operator run here, without the chart, installs the same policy itself: e2e/test_worker_admission.py.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.runtime import KubeReporter
from gpuscaler.runtime.progress import Progress
from operator_helpers import OperatorProcess, apply, get_job, job_manifest, job_pods, kubectl, wait_phase
from worker_rbac_helpers import (
    MANAGED_BY,
    WORKER,
    can_i,
    chart_worker_policy,
    refused,
    token_client,
    two_running_jobs,
    wait_enforced,
)

"""The operator suite's fixtures: the CRD installed, the custom-objects API, an operator per test."""

def test_operator_gives_workers_an_identity_that_can_only_report(
    dev_cluster: E2ECluster,
    core: Any,
    custom: Any,
    namespace: str,
    operator: Callable[..., OperatorProcess],
) -> None:
    rbac = client.RbacAuthorizationV1Api(dev_cluster.api)
    # a job that names its own ServiceAccount: kept, and no gpuscaler-worker objects for it
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}})
    own = job_manifest("own")
    own["spec"]["template"]["spec"]["serviceAccountName"] = "trainer"
    operator()
    apply(dev_cluster, namespace, own)
    wait_phase(custom, namespace, "own", "Running", timeout=60)
    assert [p.spec.service_account_name for p in job_pods(core, namespace, "own")] == ["trainer"]
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_service_account(WORKER, namespace)
    assert missing.value.status == 404

    # a job without one: the operator creates the three objects and the workers run as the account
    apply(dev_cluster, namespace, job_manifest("w"))
    wait_phase(custom, namespace, "w", "Running", timeout=60)
    pods = job_pods(core, namespace, "w")
    assert [p.spec.service_account_name for p in pods] == [WORKER]
    sa = core.read_namespaced_service_account(WORKER, namespace)
    role = rbac.read_namespaced_role(WORKER, namespace)
    binding = rbac.read_namespaced_role_binding(WORKER, namespace)
    for obj in (sa, role, binding):
        assert obj.metadata.labels == MANAGED_BY
    assert [(r.api_groups, r.resources, r.verbs, r.resource_names) for r in role.rules] == [
        ([""], ["pods"], ["get", "patch"], None)
    ]
    assert (binding.role_ref.kind, binding.role_ref.name) == ("Role", WORKER)
    assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [("ServiceAccount", WORKER, namespace)]

    # what the account may do: get and patch pods here; nothing else, nowhere else
    user = f"system:serviceaccount:{namespace}:{WORKER}"
    assert can_i(dev_cluster, user, "patch", "pods", namespace)
    assert can_i(dev_cluster, user, "get", "pods", namespace)
    denied = [
        ("delete", "pods"),
        ("create", "pods"),
        ("list", "pods"),
        ("get", "secrets"),
        ("list", "secrets"),
        ("patch", "pods/status"),
        ("create", "pods/exec"),
        ("patch", "trainingjobs.gpuscaler.io"),
        ("create", "roles.rbac.authorization.k8s.io"),
    ]
    assert not [d for d in denied if can_i(dev_cluster, user, *d, namespace)]
    assert not can_i(dev_cluster, user, "patch", "pods", "default")

    # with a real token of the account, bound to the pod as the kubelet-projected one is (the
    # operator's own admission policy requires it): the reporter writes progress, the operator reads it
    pod = pods[0].metadata.name
    api = token_client(dev_cluster, namespace, WORKER, pod=pod)
    try:
        worker = client.CoreV1Api(api)
        reporter = KubeReporter(pod, namespace, patch=worker.patch_namespaced_pod)
        now = time.time()
        reporter.report(
            Progress(step=42, samples=42 * 256, last_checkpoint_step=40, last_checkpoint_time=now,
                     checkpoint_ack=None, phase="training", updated_at=now)
        )
        assert reporter.failures == 0 and reporter.last
        ann = core.read_namespaced_pod(pod, namespace).metadata.annotations
        assert ann["gpuscaler.io/progress-step"] == "42"
        wait_for(
            lambda: (get_job(custom, namespace, "w").get("status") or {}).get("progress", {}).get("step") == 42,
            timeout=30,
            interval=0.3,
            what="the operator reading the reported progress",
        )
        for call in (
            lambda: worker.delete_namespaced_pod(pod, namespace),
            lambda: worker.list_namespaced_secret(namespace),
            lambda: worker.create_namespaced_pod(namespace, {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        ):
            with pytest.raises(ApiException) as err:
                call()
            assert err.value.status == 403
        assert core.read_namespaced_pod(pod, namespace).metadata.deletion_timestamp is None
    finally:
        api.close()


def test_chart_admission_policy_confines_workers_to_their_own_pod(
    dev_cluster: E2ECluster,
    helm: str,
    core: Any,
    custom: Any,
    namespace: str,
    operator: Callable[..., OperatorProcess],
) -> None:
    operator()
    pod_a, pod_b = two_running_jobs(dev_cluster, core, custom, namespace)

    manifest = chart_worker_policy(dev_cluster, f"vap-{uuid.uuid4().hex[:5]}")
    kubectl(dev_cluster, "apply", "-f", "-", stdin=manifest)
    own = token_client(dev_cluster, namespace, WORKER, pod=pod_a)
    unbound = token_client(dev_cluster, namespace, WORKER)
    try:
        worker = client.CoreV1Api(own)
        wait_enforced(worker, pod_b, namespace)

        # the runtime's reporter, with the pod's own token, still reports progress and checkpoints
        reporter = KubeReporter(pod_a, namespace, patch=worker.patch_namespaced_pod)
        now = time.time()
        reporter.report(
            Progress(step=7, samples=7 * 256, last_checkpoint_step=5, last_checkpoint_time=now,
                     checkpoint_ack="r1", phase="training", updated_at=now)
        )
        assert reporter.failures == 0, "the policy refused the runtime's own annotations"
        assert core.read_namespaced_pod(pod_a, namespace).metadata.annotations["gpuscaler.io/checkpoint-ack"] == "r1"
        wait_for(
            lambda: (get_job(custom, namespace, "a").get("status") or {}).get("progress", {}).get("step") == 7,
            timeout=30,
            interval=0.3,
            what="the operator reading the reported progress",
        )

        # everything else is refused, with a message that says why
        ann = {"metadata": {"annotations": {"gpuscaler.io/progress-step": "99"}}}
        body = refused(lambda: worker.patch_namespaced_pod(pod_b, namespace, ann))
        assert f'this token is bound to pod "{pod_a}", the request is for pod "{pod_b}"' in body, body
        body = refused(lambda: worker.patch_namespaced_pod(pod_a, namespace, {"metadata": {"annotations": {"evil": "1"}}}))
        assert "may change only the annotations" in body and "evil" in body, body
        body = refused(lambda: worker.patch_namespaced_pod(pod_a, namespace, {"metadata": {"labels": {"gpuscaler.io/job": "x"}}}))
        assert "spec, labels" in body, body
        body = refused(
            lambda: client.CoreV1Api(unbound).patch_namespaced_pod(pod_a, namespace, ann)
        )
        assert "token bound to its pod" in body, body
        b_ann = core.read_namespaced_pod(pod_b, namespace).metadata.annotations or {}
        assert b_ann.get("gpuscaler.io/progress-step") != "99"
        assert "gpuscaler.io/job" in core.read_namespaced_pod(pod_a, namespace).metadata.labels
        assert core.read_namespaced_pod(pod_a, namespace).metadata.labels["gpuscaler.io/job"] != "x"

        # other identities (the operator, an admin) are untouched by it
        core.patch_namespaced_pod(pod_b, namespace, {"metadata": {"labels": {"checked": "yes"}}})
    finally:
        own.close()
        unbound.close()
        kubectl(dev_cluster, "delete", "-f", "-", "--ignore-not-found", stdin=manifest)
