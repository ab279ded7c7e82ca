"""The operator's settings: one pydantic-settings object read from ``GPUSCALER_*`` environment variables.

The Helm chart's ``settings:`` block maps one-to-one onto these fields (``providerName`` ->
``GPUSCALER_PROVIDER_NAME``). Grouped by concern; every field says what it does.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Operator settings (env prefix ``GPUSCALER_``)."""

    model_config = SettingsConfigDict(env_prefix="GPUSCALER_", extra="ignore")

    # --- Node pools
    provider_name: str = Field(
        default="kwok",
        description="Node-pool provider: kwok, static (later eks, gke, karpenter, clusterapi).",
    )
    kwok_provisioning_delay_s: float = Field(
        default=2.0, ge=0, description="Seconds the kwok provider waits before a fake node appears."
    )
    gang_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for all planned nodes before releasing them and re-planning.",
    )
    capacity_backoff_s: float = Field(
        default=900.0,
        ge=0,
        description="Seconds an offering that ran short of capacity is left out of plans.",
    )
    gpu_toleration_key: str = Field(
        default="nvidia.com/gpu", description="Taint key of GPU nodes that workers tolerate."
    )
    kwok_capacity: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "kwok provider: most nodes of an instance type the fake cloud has, e.g. "
            '\'{"p4d.24xlarge": 2}\' (JSON); unlisted types are unlimited. Plays a capacity shortage.'
        ),
    )

    # --- Reconcile loop
    reconcile_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between reconciles of an unfinished job (the level-triggered loop's period).",
    )
    master_port: int = Field(
        default=29500, ge=1, le=65535, description="Rendezvous port of worker rank 0 (torchrun's default)."
    )

    # --- Policies and prices
    policy_file: str | None = Field(
        default=None, description="Cluster-wide policy YAML (a mounted ConfigMap); none = no restrictions."
    )
    watch_policies: bool = Field(
        default=True, description="Also apply GPUScalingPolicy resources (cluster-wide and per namespace)."
    )

    # --- Workers
    backoff_limit: int = Field(
        default=3, ge=0, description="Worker failures retried before the job is Failed."
    )
    default_image: str = Field(
        default="python:3.11-slim", description="Worker image when the job's template gives none."
    )

    # --- Observability
    metrics_port: int = Field(
        default=9090, ge=0, le=65535, description="Port of the operator's Prometheus metrics (0 = off)."
    )
    health_port: int = Field(default=8080, ge=0, le=65535, description="Port of kopf's liveness endpoint.")
    prometheus_url: str | None = Field(
        default=None, description="Cluster Prometheus for observed GPU metrics (none = off)."
    )

    # --- Scope
    namespace: str | None = Field(
        default=None, description="Watch only this namespace (namespaced mode); all when unset."
    )
    peering: str = Field(
        default="gpuscaler", description="kopf peering object name, for safe failover between replicas."
    )
