"""karpenter and clusterapi providers against the real API server with the REAL upstream CRDs.

The CRD YAML ships inside the Go modules ``sigs.k8s.io/karpenter`` and ``sigs.k8s.io/cluster-api``;
``go mod download`` puts them in the Go module cache (no git clone, no internet beyond the module
proxy). The providers then create and scale their objects and the API server validates them with
the upstream OpenAPI schemas and CEL rules: accepted objects are what a real Karpenter / Cluster
API would read, and invalid ones are refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import any_cluster
from e2e_helpers import E2ECluster, GoModuleError, go_module_dir
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JOB_LABEL, JobRef, NodeRequest, ProviderError
from gpuscaler.cloud.clusterapi import ClusterApiProvider
from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef
from gpuscaler.cloud.nodes import node_state
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


def test_karpenter_nodepool_is_accepted_and_updated(
    dev_cluster: E2ECluster, karpenter_crds: list[str], nodepool_name: str
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    p = KarpenterProvider(
        dev_cluster.api,
        node_class=NodeClassRef.parse("karpenter.kwok.sh/KWOKNodeClass/default"),
        instance_types=AWS_TYPES[:3],
        nodepool=nodepool_name,
        gpu_limit=16,
    )
    job = JobRef("ml", "bert")
    req = request("p4d.24xlarge", CapacityType.SPOT, 2, job)
    try:
        assert p.ensure_nodes(req, []) == []
        np = custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool_name)
        spec = np["spec"]
        reqs = {r["key"]: r for r in spec["template"]["spec"]["requirements"]}
        assert "p4d.24xlarge" in reqs["node.kubernetes.io/instance-type"]["values"]
        assert reqs[JOB_LABEL]["operator"] == "Exists"
        # held capacity: Karpenter's own "reserved" capacity type, accepted by its CRD (docs/capacity.md)
        assert reqs["karpenter.sh/capacity-type"]["values"] == ["on-demand", "spot", "reserved"]
        assert spec["limits"] == {"nvidia.com/gpu": "16"}
        assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
        assert spec["disruption"]["budgets"] == [
            {"nodes": "10%"}
        ]  # the CRD's default: the server applied the schema

        # a type outside the pool: the pool is widened in place (same object, new generation)
        p.ensure_nodes(request("p5.48xlarge", CapacityType.ON_DEMAND, 1, job), [])
        np2 = custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool_name)
        assert "p5.48xlarge" in np2["spec"]["template"]["spec"]["requirements"][0]["values"]
        assert np2["metadata"]["generation"] == np["metadata"]["generation"] + 1
        assert p.ensure_nodes(req, []) == []  # idempotent: no further change
        assert (
            custom.get_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool_name)["metadata"][
                "generation"
            ]
            == np2["metadata"]["generation"]
        )

        sched = p.scheduling(req)
        assert sched.node_selector == {
            "node.kubernetes.io/instance-type": "p4d.24xlarge",
            "karpenter.sh/capacity-type": "spot",
            "karpenter.sh/nodepool": nodepool_name,
            JOB_LABEL: job.label,
        }
    finally:
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool_name)


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        (
            {"extra_requirements": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["x"]}]},
            "restricted",
        ),
        ({"consolidate_after": "soon"}, "consolidateAfter"),
    ],
)
def test_karpenter_invalid_nodepool_is_refused(
    dev_cluster: E2ECluster,
    karpenter_crds: list[str],
    nodepool_name: str,
    override: dict[str, Any],
    refusal: str,
) -> None:
    p = KarpenterProvider(
        dev_cluster.api,
        node_class=NodeClassRef("karpenter.kwok.sh", "KWOKNodeClass", "default"),
        instance_types=["p4d.24xlarge"],
        nodepool=nodepool_name,
        **override,
    )
    with pytest.raises(ProviderError, match=refusal) as info:
        p.ensure_nodepool()
    cause = info.value.__cause__
    assert isinstance(cause, ApiException) and cause.status == 422


def machine_deployment(
    name: str, instance: str, capacity: str, replicas: int = 0, node_selector: str | None = None
) -> dict[str, Any]:
    sel = {"cluster.x-k8s.io/cluster-name": "gpu", "gpuscaler.io/pool": name}
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {
            "name": name,
            "labels": {"gpuscaler.io/instance-type": instance, "gpuscaler.io/capacity-type": capacity},
            "annotations": {"gpuscaler.io/node-selector": node_selector} if node_selector else {},
        },
        "spec": {
            "clusterName": "gpu",
            "replicas": replicas,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": sel},
                "spec": {
                    "clusterName": "gpu",
                    "version": "v1.36.3",
                    "bootstrap": {
                        "configRef": {
                            "apiGroup": "bootstrap.cluster.x-k8s.io",
                            "kind": "KubeadmConfigTemplate",
                            "name": "gpu-workers",
                        }
                    },
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "AWSMachineTemplate",
                        "name": f"{name}-template",
                    },
                },
            },
        },
    }


def test_clusterapi_scales_machinedeployment_through_scale_subresource(
    dev_cluster: E2ECluster, capi_crds: list[str], namespace: str
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    core = client.CoreV1Api(dev_cluster.api)
    md = "a100-od"
    # Nodes of this MachineDeployment carry a label of its own (CAPI syncs node.cluster.x-k8s.io/*
    # labels from the Machine template), so other p4d nodes in the cluster are never adopted.
    own_key, own_value = "node.cluster.x-k8s.io/md", namespace
    own = f"{own_key}={own_value}"
    custom.create_namespaced_custom_object(
        "cluster.x-k8s.io",
        "v1beta2",
        namespace,
        "machinedeployments",
        machine_deployment(
            md, "p4d.24xlarge", "on-demand",
            node_selector=f"node.kubernetes.io/instance-type=p4d.24xlarge,karpenter.sh/capacity-type=on-demand,{own}",
        ),
    )  # fmt: skip
    # another offering's deployment, to show the label lookup picks the right one
    custom.create_namespaced_custom_object(
        "cluster.x-k8s.io",
        "v1beta2",
        namespace,
        "machinedeployments",
        machine_deployment("a100-spot", "p4d.24xlarge", "spot"),
    )
    p = ClusterApiProvider(dev_cluster.api, namespace=namespace, cluster="gpu")
    job = JobRef(namespace, "bert")
    req = request("p4d.24xlarge", CapacityType.ON_DEMAND, 2, job)

    assert p.ensure_nodes(req, []) == []
    assert p.replicas(md) == 2
    assert p.replicas("a100-spot") == 0
    got = custom.get_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", namespace, "machinedeployments", md
    )
    assert got["spec"]["replicas"] == 2
    # served as v1beta1 as well (no conversion webhook needed for reading spec.replicas)
    old = custom.get_namespaced_custom_object_scale(
        "cluster.x-k8s.io", "v1beta1", namespace, "machinedeployments", md
    )
    assert old["spec"]["replicas"] == 2
    assert p.ensure_nodes(req, []) == []  # 2 machines launching: nothing more
    assert p.replicas(md) == 2

    # the machines' nodes register (played by plain Node objects with the labels the bootstrap sets)
    names = [f"capi-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    for n in names:
        core.create_node(
            {
                "metadata": {
                    "name": n,
                    "labels": {
                        "node.kubernetes.io/instance-type": "p4d.24xlarge",
                        "karpenter.sh/capacity-type": "on-demand",
                        own_key: own_value,
                    },
                    "annotations": {"cluster.x-k8s.io/machine": f"{n}-machine"},
                }
            }
        )
    try:
        assert sorted(p.ensure_nodes(req, [])) == sorted(names)
        held = [
            node_state(dev_cluster.api.sanitize_for_serialization(x))
            for x in core.list_node(label_selector=f"{JOB_LABEL}={job.label}").items
        ]
        assert sorted(h.name for h in held) == sorted(names)
        assert p.replicas(md) == 2

        assert sorted(p.release_nodes(job, held)) == sorted(names)
        assert p.replicas(md) == 0
        assert core.list_node(label_selector=f"{JOB_LABEL}={job.label}").items == []
    finally:
        for n in names:
            core.delete_node(n)


def test_clusterapi_invalid_machinedeployment_is_refused(
    dev_cluster: E2ECluster, capi_crds: list[str], namespace: str
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    bad = machine_deployment("broken", "p4d.24xlarge", "spot")
    del bad["spec"]["clusterName"]
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta2", namespace, "machinedeployments", bad
        )
    assert info.value.status == 422 and "clusterName" in str(info.value.body)

    p = ClusterApiProvider(dev_cluster.api, namespace=namespace)
    with pytest.raises(ProviderError, match="no MachineDeployment"):
        p.ensure_nodes(request("p4d.24xlarge", CapacityType.SPOT, 1, JobRef(namespace, "x")), [])
    custom.create_namespaced_custom_object(
        "cluster.x-k8s.io",
        "v1beta2",
        namespace,
        "machinedeployments",
        machine_deployment("ok", "p4d.24xlarge", "spot"),
    )
    with pytest.raises(ProviderError, match="scaling MachineDeployment") as err:
        p.scale("ok", -1, "a negative count")
    cause = err.value.__cause__
    assert isinstance(cause, ApiException) and cause.status == 422
