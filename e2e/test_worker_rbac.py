"""End to end: the workers' identity on the real control plane.

For a job whose template names no ServiceAccount the operator creates, in the job's namespace,
the ServiceAccount ``gpuscaler-worker``, a Role allowing ``get`` and ``patch`` on ``pods`` and its
RoleBinding, and runs the workers as that account. With a token of that account the runtime's
:class:`~gpuscaler.runtime.kube_reporter.KubeReporter` patches its pod's progress annotations
(the operator then shows the progress), while deleting a pod or reading a Secret is Forbidden.
A job that names its own ServiceAccount keeps it and gets none of this.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

import test_operator
from e2e_helpers import E2ECluster, wait_for
from gpuscaler.runtime import KubeReporter
from gpuscaler.runtime.progress import Progress
from test_operator import OperatorProcess, apply, get_job, job_manifest, job_pods, kubectl, wait_phase

custom = test_operator.custom
operator = test_operator.operator
"""The operator suite's fixtures: the CRD installed, the custom-objects API, an operator per test."""

WORKER = "gpuscaler-worker"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuscaler"}


def can_i(cluster: E2ECluster, user: str, verb: str, resource: str, namespace: str) -> bool:
    """``kubectl auth can-i`` as ``user``; ``resource/sub`` checks a subresource (not a name)."""
    resource, _, sub = resource.partition("/")
    extra = ["--subresource", sub] if sub else []
    res = kubectl(cluster, "auth", "can-i", verb, resource, *extra, "--as", user, "-n", namespace, check=False)
    return res.stdout.strip() == "yes"


def token_client(cluster: E2ECluster, namespace: str, account: str) -> Any:
    """An ApiClient authenticated with a short-lived token of the ServiceAccount (as in a pod)."""
    token = kubectl(cluster, "create", "token", account, "-n", namespace, "--duration=10m").stdout.strip()
    admin = yaml.safe_load(Path(cluster.env["KUBECONFIG"]).read_text(encoding="utf-8"))
    cl = admin["clusters"][0]["cluster"]
    if "certificate-authority-data" not in cl and "certificate-authority" in cl:
        ca = base64.b64encode(Path(cl["certificate-authority"]).read_bytes()).decode()
        cl = {"server": cl["server"], "certificate-authority-data": ca}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": cl}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": account, "namespace": namespace}}],
        "current-context": "sa",
    }
    return config.new_client_from_config_dict(doc)


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

    # with a real token of the account: the runtime's reporter writes progress, the operator reads it
    api = token_client(dev_cluster, namespace, WORKER)
    try:
        worker = client.CoreV1Api(api)
        pod = pods[0].metadata.name
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
