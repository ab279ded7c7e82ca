"""kubectl and helm work against the dev cluster from the test environment."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.devcluster.versions import KUBERNETES_VERSION

pytestmark = pytest.mark.e2e


def _run(cluster: E2ECluster, *argv: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        list(argv), env=cluster.env, capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def test_kubectl_version_reports_the_server(dev_cluster: E2ECluster) -> None:
    out = json.loads(_run(dev_cluster, "kubectl", "version", "--output=json").stdout)
    assert out["clientVersion"]["gitVersion"].startswith("v1.")
    server = out["serverVersion"]["gitVersion"]
    if dev_cluster.cluster is not None:  # a cluster this session built and started
        assert server == KUBERNETES_VERSION
    else:
        assert server.startswith("v1.")


def test_kubectl_sees_nodes_and_namespaces(dev_cluster: E2ECluster) -> None:
    _run(dev_cluster, "kubectl", "get", "--raw", "/readyz")
    names = _run(dev_cluster, "kubectl", "get", "namespaces", "-o", "name").stdout.split()
    assert "namespace/kube-system" in names


def test_helm_version_and_install_a_chart(
    dev_cluster: E2ECluster, helm: str, namespace: str, tmp_path: Path, core: Any
) -> None:
    assert _run(dev_cluster, "helm", "version", "--short").stdout.startswith("v3.")
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\ndata:\n  k: v\n"
    )
    home = {"HELM_CACHE_HOME": str(tmp_path / "c"), "HELM_CONFIG_HOME": str(tmp_path / "f"),
            "HELM_DATA_HOME": str(tmp_path / "d")}
    dev_cluster.env.update(home)
    _run(dev_cluster, "helm", "install", "demo", str(chart), "--namespace", namespace, "--wait")
    wait_for(lambda: core.read_namespaced_config_map("demo-cm", namespace).data == {"k": "v"})
    listed = json.loads(_run(dev_cluster, "helm", "list", "--namespace", namespace, "-o", "json").stdout)
    assert [r["name"] for r in listed] == ["demo"]
    _run(dev_cluster, "helm", "uninstall", "demo", "--namespace", namespace)
