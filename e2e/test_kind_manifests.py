"""The kind path's files (``e2e/kind/``), checked here since the kind path itself cannot run here.

The kwok and stage manifests must be what :mod:`kind_cluster` generates from kwok's module source
and the dev cluster's stages, and the session cluster's real API server must accept them
(``kubectl apply --dry-run=server``: schema, defaulting and admission, nothing stored); an invalid
Stage is refused, so the check has teeth. ``scripts/kind-e2e.sh`` applies the same files.
"""

from __future__ import annotations

import pytest
import yaml

import any_cluster
import kind_cluster
import kind_manifest_helpers
from e2e_helpers import E2ECluster
from kind_manifest_helpers import (
    KIND,
    SCRIPT,
    documents,
    kubectl,
)

stage_crd = kind_manifest_helpers.stage_crd


def test_kind_manifests_are_generated_from_kwok_and_the_dev_cluster_stages() -> None:
    try:
        generated = kind_cluster.manifests()
    except kind_cluster.ManifestError as err:
        pytest.skip(f"cannot regenerate e2e/kind/ here: {err}")
    for name, text in generated.items():
        assert kind_cluster.same_objects((KIND / name).read_text(encoding="utf-8"), text), (
            f"e2e/kind/{name} is stale: run python e2e/kind_cluster.py manifests"
        )


def test_kwok_manifest_is_kwoks_release_at_the_dev_cluster_version() -> None:
    docs = documents("kwok.yaml")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "kwok-controller") in kinds
    assert ("CustomResourceDefinition", any_cluster.STAGE_CRD) in kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{kind_cluster.KWOK_IMAGE}:{kind_cluster.KWOK_VERSION}"
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["kwok.yaml"])
    # kwok reads its stages from Stage objects and plays only the nodes gpuscaler marks as fake
    assert "Stage" in config["options"]["enableCRDs"]
    assert config["options"]["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"


def test_kind_cluster_config_and_script_agree() -> None:
    config = yaml.safe_load((KIND / "cluster.yaml").read_text(encoding="utf-8"))
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    assert [n["role"] for n in config["nodes"]] == ["control-plane"]
    assert "@sha256:" in config["nodes"][0]["image"], "pin the node image by digest"
    script = SCRIPT.read_text(encoding="utf-8")
    assert f'KIND_CLUSTER_NAME:-{config["name"]}' in script
    for name in ("cluster.yaml", "kwok.yaml", "stages.yaml"):
        assert f"e2e/kind/{name}" in script


def test_api_server_accepts_the_kwok_manifest(dev_cluster: E2ECluster) -> None:
    res = kubectl(dev_cluster, "apply", "--dry-run=server", "-f", str(KIND / "kwok.yaml"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("(server dry run)") == len(documents("kwok.yaml")), res.stdout


def test_api_server_accepts_the_stages_and_refuses_a_broken_one(dev_cluster: E2ECluster, stage_crd: None) -> None:
    res = kubectl(dev_cluster, "apply", "--dry-run=server", "-f", str(KIND / "stages.yaml"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("(server dry run)") == len(documents("stages.yaml")) == 5, res.stdout
    broken = documents("stages.yaml")[0]
    broken["spec"]["delay"]["durationMilliseconds"] = "soon"
    res = kubectl(dev_cluster, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(broken))
    assert res.returncode != 0
    assert "durationMilliseconds" in res.stderr
