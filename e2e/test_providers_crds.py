"""karpenter and clusterapi providers against the real API server with the REAL upstream CRDs.

The CRD YAML ships inside the Go modules ``sigs.k8s.io/karpenter`` and ``sigs.k8s.io/cluster-api``;
``go mod download`` puts them in the Go module cache (no git clone, no internet beyond the module
proxy). The providers then create and scale their objects and the API server validates them with
the upstream OpenAPI schemas and CEL rules: accepted objects are what a real Karpenter / Cluster
API would read, and invalid ones are refused.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import upstream_crds
from e2e_helpers import E2ECluster
from gpuscaler.catalog import CapacityType
from gpuscaler.cloud import JOB_LABEL, JobRef, ProviderError
from gpuscaler.cloud.clusterapi import ClusterApiProvider
from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef
from gpuscaler.cloud.nodes import node_state
from upstream_crds import (
    AWS_TYPES,
    request,
)

capi_crds = upstream_crds.capi_crds
karpenter_crds = upstream_crds.karpenter_crds
nodepool_name = upstream_crds.nodepool_name


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
