"""The dev cluster's Kueue and JobSet add-ons: how a module's manifests become loopback webhooks,
their controller configs, and the ``--with`` option (the controllers themselves run in e2e)."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest
import yaml

from gpuscaler.devcluster import addons, build
from gpuscaler.devcluster.cli import _parse_addons

URL = "https://127.0.0.1:9443"
CA = "Q0E="

WEBHOOKS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mjobset.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-jobset}}
  rules: []
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: []
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate--v1-pod}}
  rules: []
"""


def _module(tmp_path: Path, kustomization: str, patches: dict[str, str] | None = None) -> Path:
    d = tmp_path / addons.WEBHOOK_DIR
    (d / "patches").mkdir(parents=True)
    (d / "manifests.yaml").write_text(WEBHOOKS)
    (d / "kustomization.yaml").write_text(textwrap.dedent(kustomization))
    for name, text in (patches or {}).items():
        (d / "patches" / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_inline_strategic_patches_by_webhook_name_as_kueue_writes_them(tmp_path: Path) -> None:
    manifests = _module(
        tmp_path,
        """
        patches:
        - patch: |-
            apiVersion: admissionregistration.k8s.io/v1
            kind: MutatingWebhookConfiguration
            metadata:
              name: mutating-webhook-configuration
            webhooks:
            - name: mpod.kb.io
              namespaceSelector:
                matchExpressions:
                - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kueue-system]}
        """,
    )
    mutating, validating = addons.webhook_configurations(manifests, "kueue-", URL, CA)
    assert mutating["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    assert validating["metadata"] == {"name": "kueue-validating-webhook-configuration"}
    jobset, pod = mutating["webhooks"]
    assert jobset["clientConfig"] == {"url": f"{URL}/mutate-jobset", "caBundle": CA}
    assert "namespaceSelector" not in jobset
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]
    assert validating["webhooks"][0]["clientConfig"]["url"] == f"{URL}/validate--v1-pod"
    assert "namespaceSelector" not in validating["webhooks"][0]  # the patch names the mutating one only


def test_json6902_replace_patches_for_a_target_as_jobset_writes_them(tmp_path: Path) -> None:
    replaced = """
    - op: replace
      path: /webhooks/1
      value:
        name: mpod.kb.io
        clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
        objectSelector: {matchExpressions: [{key: jobset.sigs.k8s.io/jobset-name, operator: Exists}]}
        rules: []
    """
    manifests = _module(
        tmp_path,
        """
        patches:
        - path: patches/mutating-patch.yaml
          target: {group: admissionregistration.k8s.io, version: v1, kind: MutatingWebhookConfiguration,
                   name: mutating-webhook-configuration}
        """,
        {"mutating-patch.yaml": replaced},
    )
    mutating, validating = addons.webhook_configurations(manifests, "jobset-", URL, CA)
    pod = mutating["webhooks"][1]
    assert pod["objectSelector"]["matchExpressions"][0]["key"] == "jobset.sigs.k8s.io/jobset-name"
    assert pod["clientConfig"] == {"url": f"{URL}/mutate--v1-pod", "caBundle": CA}
    assert "objectSelector" not in validating["webhooks"][0]


def test_an_unsupported_patch_is_an_error_not_ignored(tmp_path: Path) -> None:
    manifests = _module(
        tmp_path,
        """
        patches:
        - path: patches/p.yaml
          target: {kind: MutatingWebhookConfiguration, name: mutating-webhook-configuration}
        """,
        {"p.yaml": "- {op: add, path: /webhooks/0/timeoutSeconds, value: 5}\n"},
    )
    with pytest.raises(addons.AddonError, match="unsupported patch op add"):
        addons.webhook_configurations(manifests, "x-", URL, CA)


def test_crds_get_the_conversion_webhooks_their_kustomization_enables(tmp_path: Path) -> None:
    crd_dir = tmp_path / addons.CRD_DIR
    (crd_dir / "bases").mkdir(parents=True)
    (crd_dir / "patches").mkdir()
    for name in ("workloads", "resourceflavors"):
        body = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{name}.kueue.x-k8s.io"}, "spec": {"group": "kueue.x-k8s.io"}}
        (crd_dir / "bases" / f"{name}.yaml").write_text(yaml.safe_dump(body))
        patch = {"metadata": {"name": f"{name}.kueue.x-k8s.io"}, "spec": {"conversion": {
            "strategy": "Webhook", "webhook": {"clientConfig": {"service": {"name": "s", "path": "/convert"}},
                                               "conversionReviewVersions": ["v1"]}}}}
        (crd_dir / "patches" / f"webhook_in_{name}.yaml").write_text(yaml.safe_dump(patch))
    # resourceflavors' patch is commented out upstream: only the listed one applies
    (crd_dir / "kustomization.yaml").write_text("patches:\n- path: patches/webhook_in_workloads.yaml\n"
                                                "#- path: patches/webhook_in_resourceflavors.yaml\n")
    by_name = {c["metadata"]["name"]: c for c in addons.crds(tmp_path, URL, CA)}
    conversion = by_name["workloads.kueue.x-k8s.io"]["spec"]["conversion"]
    assert conversion["webhook"]["clientConfig"] == {"url": f"{URL}/convert", "caBundle": CA}
    assert "conversion" not in by_name["resourceflavors.kueue.x-k8s.io"]["spec"]


def test_controller_configs_serve_on_loopback_without_their_own_cert_management(tmp_path: Path) -> None:
    ports = addons.Ports(webhook=1234, health=5678)
    kueue = yaml.safe_load(addons.kueue_config(ports, tmp_path))
    assert kueue["webhook"] == {"port": 1234, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert kueue["health"]["healthProbeBindAddress"] == "127.0.0.1:5678"
    assert kueue["internalCertManagement"] == {"enable": False} and kueue["leaderElection"]["leaderElect"] is False
    assert set(kueue["integrations"]["frameworks"]) == {"batch/job", "jobset.x-k8s.io/jobset", "pod"}
    assert kueue["manageJobsWithoutQueueName"] is False
    jobset = yaml.safe_load(addons.jobset_config(ports, tmp_path))
    assert jobset["webhook"]["port"] == 1234 and jobset["internalCertManagement"] == {"enable": False}


def test_every_addon_has_a_build_and_a_start() -> None:
    assert set(addons.ADDON_SPECS) == set(build.ADDONS) == {"kueue", "jobset"}
    assert set(build.ADDONS) <= set(build.BUILDERS)
    assert list(addons.ADDON_SPECS) == ["jobset", "kueue"]  # JobSet's CRD first, for Kueue's integration


def test_with_option_parses_and_refuses_unknown_names() -> None:
    assert _parse_addons("kueue,jobset") == ("kueue", "jobset")
    assert _parse_addons(" jobset ") == ("jobset",)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown add-on ray: choose from kueue, jobset"):
        _parse_addons("kueue,ray")
    with pytest.raises(argparse.ArgumentTypeError):
        _parse_addons(",")
    with pytest.raises(build.BuildError, match="unknown add-on ray"):
        build.ensure_all(addons=("ray",))
