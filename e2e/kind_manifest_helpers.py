"""Helpers of the kind manifest tests (test_kind_manifests.py, test_any_cluster.py): the kind manifests and a Stage CRD fixture."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import any_cluster
import kind_cluster
from e2e_helpers import E2ECluster, wait_for
from gpuscaler.devcluster.cluster import wait_established

KIND = kind_cluster.KIND_DIR
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kind-e2e.sh"


def kubectl(cluster: E2ECluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], input=stdin, env=cluster.env, capture_output=True, text=True, check=False, timeout=120
    )


def documents(name: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all((KIND / name).read_text(encoding="utf-8")) if d]
    return docs

@pytest.fixture
def stage_crd(dev_cluster: E2ECluster) -> Iterator[None]:
    """kwok's Stage CRD (from e2e/kind/kwok.yaml), created for real if missing and removed afterwards."""
    ext: Any = client.ApiextensionsV1Api(dev_cluster.api)
    body = next(d for d in documents("kwok.yaml") if d["metadata"]["name"] == any_cluster.STAGE_CRD)
    created = False
    try:
        ext.read_custom_resource_definition(any_cluster.STAGE_CRD)
    except ApiException as err:
        if err.status != 404:
            raise
        any_cluster.track_new_crds(dev_cluster, [any_cluster.STAGE_CRD])
        ext.create_custom_resource_definition(body)
        created = True
    wait_established(dev_cluster.env, [any_cluster.STAGE_CRD])
    yield
    if created:
        ext.delete_custom_resource_definition(any_cluster.STAGE_CRD)

        def gone() -> bool:
            return all(c.metadata.name != any_cluster.STAGE_CRD for c in ext.list_custom_resource_definition().items)

        wait_for(gone, what=f"CRD {any_cluster.STAGE_CRD} gone")
