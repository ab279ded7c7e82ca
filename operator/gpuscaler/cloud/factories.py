"""Factories of the real-cloud providers (eks, gke, karpenter, clusterapi) from the settings.

:mod:`gpuscaler.cloud.registry` lists them next to kwok and static. Each imports its SDK lazily,
checks that the settings it needs are set (saying which variable to set when not) and builds its
clients: boto3 and Google clients take their credentials from the pod's identity (IRSA / EKS Pod
Identity, GKE Workload Identity); the Kubernetes ones use the operator's ``api`` client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuscaler.cloud.provider import NodePoolProvider, ProviderError
from gpuscaler.settings import Settings


def _need(settings: Settings, provider: str, *fields: str) -> None:
    missing = [f for f in fields if not getattr(settings, f)]
    if missing:
        env = ", ".join(f"GPUSCALER_{f.upper()}" for f in missing)
        raise ProviderError(f"provider {provider!r} needs {env} set (docs/providers.md)")


def eks(settings: Settings, api: Any) -> NodePoolProvider:
    import boto3
    from botocore.config import Config

    from gpuscaler.cloud.adoption import core_api
    from gpuscaler.cloud.eks import EksProvider, EksTemplate

    _need(settings, "eks", "eks_cluster_name")
    # botocore's own retries stay on for connection errors; throttling is retried by the provider
    cfg = Config(region_name=settings.aws_region, retries={"max_attempts": 1, "mode": "standard"})
    template = None
    if settings.eks_subnets and settings.eks_node_role_arn:
        template = EksTemplate(
            subnets=settings.eks_subnets,
            node_role_arn=settings.eks_node_role_arn,
            ami_type=settings.eks_ami_type,
            disk_size_gb=settings.eks_disk_size_gb,
            max_nodes=settings.eks_max_nodes,
            taint_key=settings.gpu_toleration_key,
        )
    return EksProvider(
        boto3.client("eks", config=cfg),
        core_api(api),
        cluster=settings.eks_cluster_name,
        autoscaling=boto3.client("autoscaling", config=cfg) if settings.eks_targeted_scale_down else None,
        template=template,
        ec2=boto3.client("ec2", config=cfg) if template is not None else None,
        retries=settings.cloud_api_retries,
        backoff_s=settings.cloud_api_backoff_s,
        toleration_key=settings.gpu_toleration_key,
    )


def gke(settings: Settings, api: Any) -> NodePoolProvider:
    from google.cloud.container_v1 import ClusterManagerClient

    from gpuscaler.cloud.adoption import core_api
    from gpuscaler.cloud.gke import GkeProvider

    _need(settings, "gke", "gke_project", "gke_location", "gke_cluster")
    return GkeProvider(
        ClusterManagerClient(),
        core_api(api),
        project=settings.gke_project,
        location=settings.gke_location,
        cluster=settings.gke_cluster,
        operation_timeout_s=settings.gke_operation_timeout_s,
        toleration_key=settings.gpu_toleration_key,
    )


def karpenter(settings: Settings, api: Any) -> NodePoolProvider:
    from gpuscaler.catalog import load_catalog
    from gpuscaler.cloud.karpenter import KarpenterProvider, NodeClassRef

    try:
        node_class = NodeClassRef.parse(settings.karpenter_node_class)
    except ValueError as err:
        raise ProviderError(f"GPUSCALER_KARPENTER_NODE_CLASS: {err}") from err
    types = [
        i.name for i in load_catalog().instances.items.values() if i.provider == settings.karpenter_cloud
    ]
    return KarpenterProvider(
        api,
        node_class=node_class,
        instance_types=types,
        nodepool=settings.karpenter_nodepool,
        gpu_limit=settings.karpenter_gpu_limit,
        taint_key=settings.gpu_toleration_key,
        consolidate_after=settings.karpenter_consolidate_after,
    )


def clusterapi(settings: Settings, api: Any) -> NodePoolProvider:
    from gpuscaler.cloud.clusterapi import ClusterApiProvider

    return ClusterApiProvider(
        api,
        namespace=settings.clusterapi_namespace,
        cluster=settings.clusterapi_cluster,
        toleration_key=settings.gpu_toleration_key,
    )


REAL_CLOUDS: dict[str, Callable[[Settings, Any], NodePoolProvider]] = {
    "eks": eks,  # EKS managed node groups (boto3)
    "gke": gke,  # GKE node pools (google-cloud-container)
    "karpenter": karpenter,  # a gpuscaler NodePool; Karpenter provisions for the pods
    "clusterapi": clusterapi,  # Cluster API MachineDeployments via the scale subresource
}
