"""The providers' upstream CRDs (Karpenter, Cluster API) at pinned versions, installed on the e2e cluster: shared by test_providers_crds.py, test_helm_install.py, test_capacity_karpenter.py and karpenter_helpers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import any_cluster
from e2e_helpers import E2ECluster, GoModuleError, go_module_dir
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JobRef, NodeRequest
from gpuscaler.devcluster.cluster import wait_established

KARPENTER_MODULE = "sigs.k8s.io/karpenter"
KARPENTER_VERSION = "v1.14.1"
"""Newest Karpenter whose go.mod builds with the local Go 1.26.8 (v1.14.3 wants 1.26.10, v1.15.0 1.26.9)."""
CLUSTER_API_MODULE = "sigs.k8s.io/cluster-api"
CLUSTER_API_VERSION = "v1.14.2"

KARPENTER_CRDS = (
    "pkg/apis/crds/karpenter.sh_nodepools.yaml",
    "pkg/apis/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)
CLUSTER_API_CRDS = ("core/config/crd/bases/cluster.x-k8s.io_machinedeployments.yaml",)

CAT = load_catalog()


def module_dir(module: str, version: str) -> Path:
    """Download a Go module into the module cache (``go mod download -json``) and return its directory."""
    try:
        return go_module_dir(module, version)
    except GoModuleError as err:
        pytest.fail(str(err))


def install_crds(cluster: E2ECluster, files: list[Path]) -> list[str]:
    """Create (or replace) CRDs from YAML files and wait until each is Established.

    On an existing cluster, skips rather than replace CRDs the cluster has of its own
    (:func:`any_cluster.claim_crds`).
    """
    ext = client.ApiextensionsV1Api(cluster.api)
    names: list[str] = []
    bodies = [yaml.safe_load(f.read_text()) for f in files]
    any_cluster.claim_crds(cluster, bodies)
    for body in bodies:
        name = body["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as err:
            if err.status != 409:
                raise
            body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
                name
            ).metadata.resource_version
            ext.replace_custom_resource_definition(name, body)
        names.append(name)
    wait_established(cluster.env, names)
    return names


@pytest.fixture(scope="module")
def karpenter_crds(dev_cluster: E2ECluster) -> list[str]:
    root = module_dir(KARPENTER_MODULE, KARPENTER_VERSION)
    return install_crds(dev_cluster, [root / f for f in KARPENTER_CRDS])


@pytest.fixture(scope="module")
def capi_crds(dev_cluster: E2ECluster) -> list[str]:
    root = module_dir(CLUSTER_API_MODULE, CLUSTER_API_VERSION)
    return install_crds(dev_cluster, [root / f for f in CLUSTER_API_CRDS])


def request(instance: str, capacity: CapacityType, count: int, job: JobRef) -> NodeRequest:
    inst = CAT.instance(instance)
    return NodeRequest(job, inst, capacity, count, inst.price(capacity) or 0.0)


AWS_TYPES = sorted(i.name for i in CAT.instances.items.values() if i.provider == "aws")


@pytest.fixture
def nodepool_name() -> Iterator[str]:
    yield f"gpuscaler-{uuid.uuid4().hex[:5]}"
