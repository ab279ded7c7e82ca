"""End to end: ``helm install`` the chart into the local control plane and prove its RBAC.

The operator pod cannot run here (no image, and kwok runs nothing), so the operator process runs
locally with the chart's ServiceAccount credentials (a token from ``kubectl create token`` in a
kubeconfig of its own): it must plan, provision a kwok node, start a worker and write the status
of a TrainingJob without a single Forbidden. ``kubectl auth can-i --as`` checks each verb the
chart grants, and some it must not; for the karpenter and clusterapi providers against the real
upstream CRDs (from the Go module cache, as in ``test_providers_crds.py``), since ``can-i`` only
resolves ``nodepools.karpenter.sh`` and the like through discovery.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

import helm_install_helpers
from e2e_helpers import E2ECluster, rbac_checked, wait_for
from gpuscaler.devcluster.cluster import wait_established
from gpuscaler.names import FINALIZER
from gpuscaler.testing import pinned, training_job, worker_template
from helm_install_helpers import (
    CHART,
    GROUP,
    VERSION,
    Release,
    free_port,
    install,
    run,
    sa_kubeconfig,
)
from operator_helpers import job_nodes, job_pods

provider_crds = helm_install_helpers.provider_crds
release = helm_install_helpers.release

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("helm")]

# ------------------------------------------------------------------------------------ tests


def test_install_creates_the_chart_objects(dev_cluster: E2ECluster, release: Release) -> None:
    kinds = {m["kind"] for m in release.manifests}
    assert {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "ClusterKopfPeering",
    } <= kinds
    wait_established(
        dev_cluster.env,
        [
            "trainingjobs.gpuscaler.io",
            "gpuscalingpolicies.gpuscaler.io",
            "performanceprofiles.gpuscaler.io",
            "clusterkopfpeerings.kopf.dev",
            "kopfpeerings.kopf.dev",
        ],
        timeout=30,
    )
    listed = run(dev_cluster, "helm", "list", "-n", release.namespace, "-o", "yaml").stdout
    assert yaml.safe_load(listed)[0]["status"] == "deployed"


def test_typo_in_values_fails_install(dev_cluster: E2ECluster, namespace: str) -> None:
    res = run(
        dev_cluster,
        "helm",
        "install",
        "typo",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "replicaCountt=2",
        check=False,
    )
    assert res.returncode != 0 and "replicaCountt" in res.stderr


def test_service_account_can_do_what_the_operator_needs(release: Release) -> None:
    ns = release.namespace
    allowed = [
        # Framework (kopf)
        ("list", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("patch", "clusterkopfpeerings.kopf.dev", None),
        ("list", "namespaces", None),
        ("create", "events", ns),
        # Application
        *[(v, "trainingjobs.gpuscaler.io", None) for v in ("get", "list", "watch", "patch")],
        ("patch", "trainingjobs.gpuscaler.io/status", ns),
        ("update", "trainingjobs.gpuscaler.io/finalizers", ns),
        *[(v, "gpuscalingpolicies.gpuscaler.io", None) for v in ("get", "list", "watch")],
        *[(v, "performanceprofiles.gpuscaler.io", None) for v in ("get", "list", "watch", "create", "update", "delete")],
        *[(v, "pods", None) for v in ("get", "list", "watch", "create", "patch", "delete")],
        *[(v, "services", None) for v in ("list", "watch", "create", "delete")],
        *[(v, "nodes", None) for v in ("get", "list", "watch", "create", "delete")],  # kwok provider
        # the workers' identity in a job namespace (ServiceAccount, Role and RoleBinding gpuscaler-worker)
        ("create", "serviceaccounts", None),
        ("create", "roles.rbac.authorization.k8s.io", None),
        ("create", "rolebindings.rbac.authorization.k8s.io", None),
    ]
    missing = [(v, r) for v, r, n in allowed if not release.can(v, r, n)]
    assert not missing, f"the chart's ServiceAccount cannot: {missing}"


def test_service_account_cannot_do_more(release: Release, provider_crds: list[str]) -> None:
    denied = [
        ("get", "secrets"),
        ("delete", "secrets"),
        ("create", "deployments.apps"),
        ("create", "jobs.batch"),
        ("delete", "namespaces"),
        ("create", "gpuscalingpolicies.gpuscaler.io"),
        ("delete", "gpuscalingpolicies.gpuscaler.io"),
        ("create", "trainingjobs.gpuscaler.io"),
        ("delete", "trainingjobs.gpuscaler.io"),
        ("patch", "nodes"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        # the workers' identity: create only, and no way around RBAC's escalation check
        ("get", "serviceaccounts"),
        ("delete", "serviceaccounts"),
        ("create", "serviceaccounts/token"),
        ("update", "roles.rbac.authorization.k8s.io"),
        ("delete", "roles.rbac.authorization.k8s.io"),
        ("patch", "rolebindings.rbac.authorization.k8s.io"),
        ("escalate", "roles.rbac.authorization.k8s.io"),
        ("bind", "roles.rbac.authorization.k8s.io"),
        ("bind", "clusterroles.rbac.authorization.k8s.io"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("update", "trainingjobs.gpuscaler.io/status"),  # patch only
        ("patch", "performanceprofiles.gpuscaler.io"),  # written whole, guarded by resourceVersion
        ("get", "services/proxy"),
        # other providers' rules: the default (kwok) release has none of them
        ("get", "nodepools.karpenter.sh"),
        ("list", "nodeclaims.karpenter.sh"),
        ("list", "machinedeployments.cluster.x-k8s.io"),
        ("patch", "machinedeployments.cluster.x-k8s.io/scale"),
    ]
    granted = [(v, r) for v, r in denied if release.can(v, r, release.namespace)]
    assert not granted, f"the chart's ServiceAccount may also: {granted}"


def test_namespaced_mode_is_confined(dev_cluster: E2ECluster, namespace: str, core: Any) -> None:
    other = f"{namespace[:50]}-other"
    core.create_namespace({"metadata": {"name": other}})
    rel = install(
        dev_cluster, namespace, "--set", "rbac.namespaced=true", "--set", "settings.providerName=static"
    )
    try:
        assert rel.deployment_env()["GPUSCALER_NAMESPACE"] == namespace
        assert rel.can("create", "pods", namespace) and rel.can(
            "patch", "trainingjobs.gpuscaler.io", namespace
        )
        assert rel.can("patch", "kopfpeerings.kopf.dev", namespace)
        for res in ("serviceaccounts", "roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io"):
            assert rel.can("create", res, namespace) and not rel.can("create", res, other), res
        assert not rel.can("create", "pods", other) and not rel.can(
            "list", "trainingjobs.gpuscaler.io", other
        )
        assert rel.can("watch", "nodes") and not rel.can("create", "nodes")  # static provider: read only
        assert rel.can("list", "gpuscalingpolicies.gpuscaler.io")
    finally:
        run(dev_cluster, "helm", "uninstall", rel.name, "-n", namespace, check=False)
        core.delete_namespace(other)


def test_karpenter_provider_rules_only_with_providername_karpenter(
    dev_cluster: E2ECluster, namespace: str, release: Release, provider_crds: list[str]
) -> None:
    """providerName=karpenter grants the NodePool/NodeClaim verbs the karpenter provider calls,
    and takes away kwok's node create/delete; the kwok release next to it has no karpenter rules."""
    name = f"gs-karp-{uuid.uuid4().hex[:5]}"
    rel = install(
        dev_cluster,
        namespace,
        "-f",
        str(CHART / "ci" / "karpenter-values.yaml"),
        "--set",
        f"settings.peering={name}",  # one ClusterKopfPeering per release
    )
    try:
        assert rel.deployment_env()["GPUSCALER_PROVIDER_NAME"] == "karpenter"
        allowed = [
            *[(v, "nodepools.karpenter.sh") for v in ("get", "create", "update")],
            *[(v, "nodeclaims.karpenter.sh") for v in ("list", "delete")],
            *[(v, "nodes") for v in ("get", "list", "watch")],
        ]
        denied = [
            ("delete", "nodepools.karpenter.sh"),
            ("create", "nodeclaims.karpenter.sh"),
            ("create", "nodes"),
            ("delete", "nodes"),
            ("patch", "nodes"),
            ("list", "machinedeployments.cluster.x-k8s.io"),
        ]
        assert not [a for a in allowed if not rel.can(*a)], "karpenter release misses rules"
        assert not [d for d in denied if rel.can(*d)], "karpenter release may do more"
        # the kwok release installed next to it: node create, nothing of karpenter's
        assert release.can("create", "nodes") and not release.can("get", "nodepools.karpenter.sh")
    finally:
        run(dev_cluster, "helm", "uninstall", rel.name, "-n", namespace, check=False)
    wait_for(
        lambda: not rel.can("get", "nodepools.karpenter.sh"),
        timeout=30,
        interval=0.5,
        what="uninstall removing the karpenter rules",
    )


def test_clusterapi_provider_rules_are_confined_to_its_namespace(
    dev_cluster: E2ECluster, namespace: str, provider_crds: list[str]
) -> None:
    name = f"gs-capi-{uuid.uuid4().hex[:5]}"
    rel = install(
        dev_cluster,
        namespace,
        "--set",
        "settings.providerName=clusterapi",
        "--set",
        f"settings.clusterapiNamespace={namespace}",
        "--set",
        f"settings.peering={name}",
    )
    try:
        md = "machinedeployments.cluster.x-k8s.io"
        assert rel.can("list", md, namespace) and rel.can("get", f"{md}/scale", namespace)
        assert rel.can("patch", f"{md}/scale", namespace)
        assert rel.can("patch", "machines.cluster.x-k8s.io", namespace)
        assert rel.can("patch", "nodes")  # adoption labels the registered nodes
        elsewhere = f"{namespace[:50]}-other"
        assert not rel.can("list", md, elsewhere) and not rel.can("patch", f"{md}/scale", elsewhere)
        assert not rel.can("delete", md, namespace) and not rel.can("create", "nodes")
    finally:
        run(dev_cluster, "helm", "uninstall", rel.name, "-n", namespace, check=False)


def test_operator_runs_a_job_with_the_charts_credentials(
    dev_cluster: E2ECluster, kwok: None, release: Release, namespace: str, core: Any, tmp_path: Path
) -> None:
    """The real operator, authenticated as the chart's ServiceAccount, takes a job to Running."""
    kubeconfig = sa_kubeconfig(dev_cluster, release, tmp_path / "sa.kubeconfig")
    health = free_port()
    env = {k: v for k, v in dev_cluster.env.items() if not k.startswith("GPUSCALER_")}
    env.update(release.deployment_env())  # the settings exactly as the chart renders them
    env.update(
        KUBECONFIG=str(kubeconfig),
        GPUSCALER_NAMESPACE=namespace,
        GPUSCALER_HEALTH_PORT=str(health),
        GPUSCALER_METRICS_PORT="0",
        GPUSCALER_RECONCILE_INTERVAL_S="0.5",
        GPUSCALER_KWOK_PROVISIONING_DELAY_S="1",
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "operator.log"
    custom = client.CustomObjectsApi(dev_cluster.api)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=env, stdout=out, stderr=out
        )
    with rbac_checked(proc, log):

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(healthy, timeout=60, interval=0.5, what="the operator's /healthz (the chart's probes)")
        job = training_job(
            "rbac", constraints=pinned("p3.2xlarge"), template=worker_template("registry.invalid/trainer:e2e")
        )
        created = run(dev_cluster, "kubectl", "create", "-n", namespace, "-f", "-", "-o", "json", stdin=yaml.safe_dump(job))
        # the chart's finalizer policy (the API server serves MutatingAdmissionPolicy v1): the
        # finalizer is on the job as stored by its creation, before the operator saw it
        assert {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"} <= {m["kind"] for m in release.manifests}
        assert json.loads(created.stdout)["metadata"]["finalizers"] == [FINALIZER]

        def phase() -> str:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "rbac")
            return str((obj.get("status") or {}).get("phase", ""))

        wait_for(
            lambda: phase() == "Running", timeout=90, interval=0.5, what="job Running under the chart's RBAC"
        )
        pods = core.list_namespaced_pod(namespace, label_selector="gpuscaler.io/job").items
        assert pods and all(p.spec.node_name for p in pods)
        # the workers' identity, created under the chart's RBAC (which passed the escalation check)
        assert all(p.spec.service_account_name == "gpuscaler-worker" for p in pods)
        rbac = client.RbacAuthorizationV1Api(dev_cluster.api)
        assert core.read_namespaced_service_account("gpuscaler-worker", namespace)
        role = rbac.read_namespaced_role("gpuscaler-worker", namespace)
        assert [(r.resources, r.verbs) for r in role.rules] == [(["pods"], ["get", "patch"])]
        assert rbac.read_namespaced_role_binding("gpuscaler-worker", namespace).role_ref.name == "gpuscaler-worker"
        # kopf found its finalizer present: it wrote nothing to the job (its PATCH would add a
        # managedFields entry of manager "kopf"); the operator wrote only the status
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingjobs", "rbac")
        writers = {(f["manager"], f.get("subresource", "")) for f in obj["metadata"]["managedFields"]}
        assert not {w for w in writers if w[0].startswith("kopf")}, writers
        assert obj["metadata"]["finalizers"] == [FINALIZER]
        nodes = job_nodes(core, namespace, "rbac")
        assert nodes
        # delete while the operator runs: its finalizer releases the worker and the kwok node
        run(dev_cluster, "kubectl", "delete", "trainingjob", "rbac", "-n", namespace, "--timeout=60s")
        wait_for(
            lambda: not job_pods(core, namespace, "rbac") and not job_nodes(core, namespace, "rbac"),
            timeout=30,
            interval=0.5,
            what="the job's worker and node released by the operator's cleanup",
        )
