"""The chart's finalizer policy (templates/finalizer-policy.yaml), rendered by the real helm.

A MutatingAdmissionPolicy that puts the operator's finalizer on a TrainingJob at its creation, so
kopf sends no PATCH to add it. Rendered only where the API server serves the kind; the project's
own operator launches install it from the chart (gpuscaler.devcluster.chart), not from a copy.
Whether a real API server applies it: e2e/test_helm_install.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gpuscaler.devcluster import chart
from gpuscaler.names import FINALIZER
from helm_helpers import CHART, ROOT, helm, kinds, one, render, run_helm, values_file

SERVED = ("--api-versions", chart.MUTATING_POLICY_API)
KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def test_rendered_where_the_api_server_serves_the_kind_and_adds_only_the_finalizer_on_create() -> None:
    docs = render(*SERVED)
    policy, binding = one(docs, "MutatingAdmissionPolicy"), one(docs, "MutatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    # CREATE only: the operator's own removal of the finalizer (an UPDATE) must not be undone
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["gpuscaler.io"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["trainingjobs"]}
    ]
    assert spec["failurePolicy"] == "Ignore"  # a broken policy must not refuse jobs: kopf adds it then
    (mutation,) = spec["mutations"]
    assert mutation["patchType"] == "ApplyConfiguration"
    expression = mutation["applyConfiguration"]["expression"]
    assert f'finalizers: ["{FINALIZER}"]' in expression  # the finalizer kopf is configured with
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "matchResources" not in binding["spec"]  # the operator watches every namespace


def test_not_rendered_without_the_kind_or_when_turned_off(tmp_path: Path) -> None:
    assert not KINDS & kinds(render())  # helm template's default capabilities: Kubernetes without it
    assert not KINDS & kinds(render("--kube-version", "1.35.0"))
    off = values_file(tmp_path, {"finalizerPolicy": {"enabled": False}})
    assert not KINDS & kinds(render("-f", off, *SERVED))
    assert "Deployment" in kinds(render("-f", off, *SERVED))


def test_binding_follows_the_watched_namespace() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"), *SERVED)
    binding = one(docs, "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml-team"}}
    }
    assert binding["metadata"]["name"].endswith("-ml-team")  # one binding per watched namespace


def test_schema_refuses_a_typo() -> None:
    res = run_helm("template", "gs", str(CHART), "--set", "finalizerPolicy.enable=true", check=False)
    assert res.returncode != 0 and "enable" in res.stderr


def test_the_launches_render_the_charts_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpuscaler.devcluster.chart (the benchmark's, the e2e operators' and the demo's source) gives
    the chart's objects as helm renders them, scoped to the operator's namespace."""
    monkeypatch.setenv("PATH", f"{Path(helm()).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    docs = [d for d in yaml.safe_load_all(chart.finalizer_policy(os.environ, "team-a")) if d]
    assert {d["kind"] for d in docs} == KINDS
    expected = render(*SERVED, "--show-only", chart.FINALIZER_TEMPLATE, "--set", "settings.namespace=team-a")
    assert one(docs, "MutatingAdmissionPolicy")["spec"] == one(expected, "MutatingAdmissionPolicy")["spec"]
    binding = one(docs, "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == one(docs, "MutatingAdmissionPolicy")["metadata"]["name"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "team-a"
    }


def test_no_second_copy_of_the_policy() -> None:
    """Only the chart's template holds the mutation: every launch renders it (no copy to drift)."""
    needle = "Object.metadata{finalizers"
    holders = [
        p.relative_to(ROOT).as_posix()
        for folder in ("operator", "benchmarks", "e2e", "scripts", "helm")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix in {".py", ".yaml", ".yml", ".tpl", ".json"} and needle in p.read_text(errors="replace")
    ]
    assert holders == ["helm/gpuscaler/templates/finalizer-policy.yaml"]
