"""Helpers of the chart install tests (test_helm_install.py, test_kueue.py): helm install on the e2e cluster, the release's ServiceAccount kubeconfig."""

from __future__ import annotations

import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import upstream_crds as upstream
from e2e_helpers import E2ECluster, service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "gpuscaler"
GROUP, VERSION = "gpuscaler.io", "v1alpha1"


def run(
    cluster: E2ECluster, *argv: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        list(argv), input=stdin, env=cluster.env, capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert res.returncode == 0, f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


class Release:
    def __init__(
        self, cluster: E2ECluster, namespace: str, name: str, manifests: list[dict[str, Any]]
    ) -> None:
        self.cluster, self.namespace, self.name, self.manifests = cluster, namespace, name, manifests

    @property
    def service_account(self) -> str:
        return next(m["metadata"]["name"] for m in self.manifests if m["kind"] == "ServiceAccount")

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def can(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        """``kubectl auth can-i`` as the ServiceAccount; ``resource/sub`` checks a subresource."""
        ns = ["-n", namespace] if namespace else ["--all-namespaces"]
        resource, _, sub = resource.partition("/")
        extra = ["--subresource", sub] if sub else []
        res = run(
            self.cluster,
            "kubectl",
            "auth",
            "can-i",
            verb,
            resource,
            *extra,
            "--as",
            self.user,
            *ns,
            check=False,
        )
        return res.stdout.strip() == "yes"

    def deployment_env(self) -> dict[str, str]:
        dep = next(m for m in self.manifests if m["kind"] == "Deployment")
        return {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def install(cluster: E2ECluster, namespace: str, *values: str) -> Release:
    name = f"gs-{uuid.uuid4().hex[:5]}"
    run(cluster, "helm", "install", name, str(CHART), "--namespace", namespace, *values)
    text = run(cluster, "helm", "get", "manifest", name, "--namespace", namespace).stdout
    return Release(cluster, namespace, name, [d for d in yaml.safe_load_all(text) if d])


@pytest.fixture
def release(dev_cluster: E2ECluster, namespace: str) -> Iterator[Release]:
    rel = install(dev_cluster, namespace)
    yield rel
    run(dev_cluster, "helm", "uninstall", rel.name, "--namespace", namespace, check=False)


@pytest.fixture(scope="module")
def provider_crds(dev_cluster: E2ECluster) -> list[str]:
    """Karpenter's NodePool/NodeClaim and Cluster API's MachineDeployment/Machine CRDs, installed."""
    karpenter = upstream.module_dir(upstream.KARPENTER_MODULE, upstream.KARPENTER_VERSION)
    capi = upstream.module_dir(upstream.CLUSTER_API_MODULE, upstream.CLUSTER_API_VERSION)
    bases = capi / "core" / "config" / "crd" / "bases"
    return upstream.install_crds(
        dev_cluster,
        [
            karpenter / "pkg/apis/crds/karpenter.sh_nodepools.yaml",
            karpenter / "pkg/apis/crds/karpenter.sh_nodeclaims.yaml",
            bases / "cluster.x-k8s.io_machinedeployments.yaml",
            bases / "cluster.x-k8s.io_machines.yaml",
        ],
    )


def sa_kubeconfig(cluster: E2ECluster, rel: Release, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount with a short-lived token."""
    doc = service_account_kubeconfig(cluster, rel.service_account, rel.namespace, duration="1h")
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
