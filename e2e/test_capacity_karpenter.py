"""Held capacity against Karpenter's own CRDs (v1.14.1, the version the e2e builds): a NodePool for
reserved and capacity-block capacity and an EC2NodeClass whose capacityReservationSelectorTerms
admit the policy's reservations are accepted by the real API server; a malformed term is refused
by the CRD's own rule (docs/capacity.md, "Providers")."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import upstream_crds
from e2e_helpers import E2ECluster
from gpuscaler.cloud.karpenter import capacity_reservation_selector_terms
from gpuscaler.policy import Policy
from upstream_crds import (
    KARPENTER_VERSION,
    install_crds,
    module_dir,
)

karpenter_crds = upstream_crds.karpenter_crds

AWS_MODULE = "github.com/aws/karpenter-provider-aws"
AWS_VERSION = KARPENTER_VERSION
"""Karpenter's AWS provider of the same release as the core the e2e builds."""
EC2NODECLASS_CRD = "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml"

__all__ = ["karpenter_crds"]  # the core CRDs' fixture (NodePool)

POLICY = Policy.model_validate({"capacity": [
    {"name": "team-h100", "type": "reserved", "instanceType": "p5.48xlarge", "count": 2, "reservationId": "cr-0123456789abcdef0"},
    {"name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1, "reservationId": "cr-0fedcba9876543210",
     "start": "2026-12-06T18:00:00Z", "end": "2026-12-07T18:00:00Z"},
    {"name": "flex", "type": "flexStart", "instanceType": "a3-highgpu-8g", "count": 1, "startDelay": {"p50Minutes": 5, "p90Minutes": 30}},
]})  # fmt: skip


@pytest.fixture(scope="module")
def ec2nodeclass_crd(dev_cluster: E2ECluster) -> list[str]:
    return install_crds(dev_cluster, [module_dir(AWS_MODULE, AWS_VERSION) / EC2NODECLASS_CRD])


def nodeclass(name: str, terms: list[dict[str, Any]]) -> dict[str, Any]:
    sel = [{"tags": {"karpenter.sh/discovery": "e2e"}}]
    return {
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name},
        "spec": {"role": "KarpenterNodeRole-e2e", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": sel, "securityGroupSelectorTerms": sel,
                 "capacityReservationSelectorTerms": terms},
    }  # fmt: skip


def test_reserved_nodepool_and_reservation_terms_are_accepted(
    dev_cluster: E2ECluster, karpenter_crds: list[str], ec2nodeclass_crd: list[str]
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    name = f"gpuscaler-{uuid.uuid4().hex[:5]}"
    terms = capacity_reservation_selector_terms(POLICY.capacity)
    assert terms == [{"id": "cr-0123456789abcdef0"}, {"id": "cr-0fedcba9876543210"}]  # no flex-start: EC2 has none
    made = custom.create_cluster_custom_object("karpenter.k8s.aws", "v1", "ec2nodeclasses", nodeclass(name, terms))
    assert made["spec"]["capacityReservationSelectorTerms"] == terms
    pool = {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": name},
            "requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["reserved"]},
                {"key": "karpenter.k8s.aws/capacity-reservation-type", "operator": "In", "values": ["default", "capacity-block"]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]},
            ],
        }}},
    }  # fmt: skip
    try:
        got = custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool)
        reqs = {r["key"]: r["values"] for r in got["spec"]["template"]["spec"]["requirements"]}
        assert reqs["karpenter.sh/capacity-type"] == ["reserved"]
        with pytest.raises(ApiException) as bad:  # a term must say which reservations: the CRD's own rule
            custom.create_cluster_custom_object("karpenter.k8s.aws", "v1", "ec2nodeclasses", nodeclass(name + "-bad", [{}]))
        assert bad.value.status == 422 and "expected at least one" in str(bad.value.body)
    finally:
        for plural in ("nodepools",):
            custom.delete_cluster_custom_object("karpenter.sh", "v1", plural, name)
        custom.delete_cluster_custom_object("karpenter.k8s.aws", "v1", "ec2nodeclasses", name)
