"""The operator's settings: one pydantic-settings object read from ``GPUSCALER_*`` environment variables.

The Helm chart's ``settings:`` block maps one-to-one onto these fields (``providerName`` ->
``GPUSCALER_PROVIDER_NAME``). Grouped by concern; every field says what it does. The only place
the defaults are written: the reconcile loop's configs are derived from this object
(:meth:`gpuscaler.controller.reconcile.LoopConfig.from_settings`,
:meth:`gpuscaler.controller.interruptions.SpotConfig.from_settings`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuscaler import names


class Settings(BaseSettings):
    """Operator settings (env prefix ``GPUSCALER_``)."""

    model_config = SettingsConfigDict(env_prefix="GPUSCALER_", extra="ignore", allow_inf_nan=False)

    # --- Node pools
    provider_name: str = Field(
        default="kwok",
        description="Node-pool provider: kwok (fake nodes), static (existing nodes), eks, gke, karpenter, clusterapi.",
    )
    kwok_provisioning_delay_s: float = Field(
        default=2.0, ge=0, description="Seconds the kwok provider waits before a fake node appears."
    )
    gang_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for all planned nodes before releasing them and re-planning.",
    )
    progress_event_after_s: float = Field(
        default=30.0,
        ge=0,
        description=(
            "A gang that runs within this many seconds of its request posts no Event between Planned and "
            "Started (or Recovered): that Event carries the way there as a timeline. A slower gang says where "
            "it waits at this point (ScaledUp or WorkersCreated) and then posts each step (0: every step)."
        ),
    )
    capacity_backoff_s: float = Field(
        default=900.0,
        ge=0,
        description="Seconds an offering that ran short of capacity is left out of plans.",
    )
    kueue_quota_fallback: bool = Field(
        default=False,
        description=(
            "Queued jobs: when Kueue has no quota left for the planned offering's flavor, re-plan without it "
            "(for capacityBackoffS) and take the next plan that meets the deadline, saying so in the plan's why."
        ),
    )
    gpu_toleration_key: str = Field(
        default=names.GPU_RESOURCE, description="Taint key of GPU nodes that workers tolerate."
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
        description=(
            "Seconds between steps of a job in a time-critical phase (Checkpointing, Recovering, a node under "
            "notice or NotReady); otherwise a job is stepped on the watch events it depends on (controller/wakeups.py)."
        ),
    )
    resync_interval_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Longest time a job goes without a step when no watch event wakes it (catches a policy file changed "
            "on disk, a missed event); controller-runtime operators resync rarely for the same reason."
        ),
    )
    reconcile_workers: int = Field(
        default=8,
        ge=1,
        le=64,
        description=(
            "Threads that run steps, most urgent first. Steps mostly wait on the API server: at 500 jobs a "
            "step took 0.3 s of wall time, so 4 threads (about 14 steps/s) were all busy during the apply."
        ),
    )
    reconcile_slow_step_s: float = Field(
        default=0.0,
        ge=0,
        description=(
            "A client-side limit (controller/wakeups.py StepGate): when above 0, a step slower than this many "
            "seconds (the API server is slow to answer) lowers how many steps run at once, a fast one raises it, "
            "between 1 and reconcileWorkers; interruptions are never held back. 0 = off."
        ),
    )
    reconcile_debounce_s: float = Field(
        default=0.1,
        ge=0,
        description="Seconds a woken job waits before its step is queued, so one change's burst of events is one step.",
    )
    bringup_write_hold_s: float = Field(
        default=3.0,
        ge=0,
        description=(
            "Seconds a new job's way up (Provisioning, Starting) may wait before it is written: a gang running "
            "by then is one status write (Running) instead of three, and its Started Event says the plan (no "
            "Planned Event). Nothing else waits (controller/status_writes.py); 0: written at once."
        ),
    )
    status_refresh_s: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Seconds between status writes that only move a job's cost or ETA (the COST and ETA columns, to the "
            "cent and as shown); a change of anything else is written at once. Each write is an API call and a "
            "watch event to every watcher: at 30 s, 500 running jobs wrote 17 times a second."
        ),
    )
    plan_cache_size: int = Field(
        default=128,
        ge=0,
        description="Plans of identical planning inputs kept in memory (controller/plan_cache.py); 0 = off.",
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
    worker_admission_policy: Literal["install", "verify", "off"] = Field(
        default="install",
        description=(
            "The admission policy confining the gpuscaler-worker account to its own pod (docs/security.md): "
            "install (create or update it when permitted, else check it is there), verify (only check), or off "
            "(opt-out: run workers under the broad Role without it). Unless off, workers under that account "
            "start only while the policy is in force."
        ),
    )
    worker_admission_policy_name: str = Field(
        default="gpuscaler-worker-own-pod",
        min_length=1,
        max_length=253,
        description="Name of that ValidatingAdmissionPolicy and its binding (the Helm chart sets its own).",
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

    # --- Real clouds: eks, gke, karpenter, clusterapi (docs/providers.md)
    cloud_api_retries: int = Field(
        default=5, ge=1, description="Attempts of a throttled cloud API call (exponential backoff) before failing."
    )
    cloud_api_backoff_s: float = Field(
        default=0.5, gt=0, description="First backoff of a throttled cloud API call, doubled per attempt."
    )
    aws_region: str | None = Field(
        default=None, description="eks: AWS region (none = boto3's default chain, e.g. AWS_REGION from IRSA)."
    )
    eks_cluster_name: str = Field(default="", description="eks: name of the EKS cluster (required for eks).")
    eks_subnets: list[str] = Field(
        default_factory=list,
        description="eks: subnets of node groups gpuscaler creates (JSON list); empty = only use tagged groups.",
    )
    eks_node_role_arn: str | None = Field(
        default=None, description="eks: IAM node role of node groups gpuscaler creates (with eks_subnets)."
    )
    eks_ami_type: str = Field(
        default="AL2023_x86_64_NVIDIA", description="eks: AMI type of created node groups (an NVIDIA one)."
    )
    eks_disk_size_gb: int = Field(default=200, ge=20, description="eks: root disk of created node groups, GiB.")
    eks_max_nodes: int = Field(
        default=16, ge=1, description="eks: maxSize of created node groups (raised when a plan needs more)."
    )
    eks_targeted_scale_down: bool = Field(
        default=True,
        description="eks: terminate exactly the released nodes' instances via Auto Scaling (else lower desiredSize).",
    )
    gke_project: str = Field(default="", description="gke: Google Cloud project of the cluster (required for gke).")
    gke_location: str = Field(default="", description="gke: zone or region of the cluster (required for gke).")
    gke_cluster: str = Field(default="", description="gke: GKE cluster name (required for gke).")
    gke_operation_timeout_s: float = Field(
        default=30.0, ge=0, description="gke: seconds one call waits for its operation before the next reconcile."
    )
    karpenter_nodepool: str = Field(default="gpuscaler", description="karpenter: name of the gpuscaler-owned NodePool.")
    karpenter_node_class: str = Field(
        default="karpenter.k8s.aws/EC2NodeClass/default",
        description="karpenter: <group>/<kind>/<name> of the NodeClass the pool launches with (must exist).",
    )
    karpenter_cloud: str = Field(
        default="aws", description="karpenter: catalog provider (aws, gcp, azure) whose instance types the pool admits."
    )
    karpenter_gpu_limit: int | None = Field(
        default=None, ge=0, description="karpenter: limits.nvidia.com/gpu of the NodePool (none = unlimited)."
    )
    karpenter_consolidate_after: str = Field(
        default="60s", description="karpenter: how long an empty gpuscaler node stays (disruption.consolidateAfter)."
    )
    clusterapi_namespace: str = Field(default="default", description="clusterapi: namespace of the MachineDeployments.")
    clusterapi_cluster: str | None = Field(
        default=None, description="clusterapi: only MachineDeployments of this Cluster (none = any)."
    )

    # --- Spot interruptions (controller/interruptions.py SpotConfig, docs/operator.md "Spot interruptions")
    interruption_backoff_s: float = Field(
        default=1800.0,
        ge=0,
        description=(
            "Seconds a reclaimed spot offering is left out of re-plans (a reclaim usually means the pool "
            "is short, and AWS/GCP reclaim in waves)."
        ),
    )
    node_not_ready_grace_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds a job's node may be NotReady before it counts as lost (the node controller itself "
            "marks a silent node NotReady after 40 s)."
        ),
    )
    soft_notice_wait_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Longest wait for the checkpoint ack after a notice with no deadline (rebalance "
            "recommendation); 30 s is GKE's notice, the shortest the handshake must fit."
        ),
    )
    annotation_notice_s: float = Field(
        default=30.0,
        ge=0,
        description="Notice of a gpuscaler.io/interruption-notice annotation that gives no deadline timestamp.",
    )
    checkpoint_write_max_s: float = Field(
        default=900.0,
        gt=0,
        description=(
            "Longest a worker's reported checkpoint write (gpuscaler.io/checkpoint-writing) keeps "
            "karpenter.sh/do-not-disrupt on the job's pods: a bound, so a worker cannot pin its node; "
            "15 min is above the write of a 70B model's full state at 1 GB/s (docs/preemption-cost.md)."
        ),
    )
    preemption_cost_refresh_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Oldest the published gpuscaler.io/work-at-risk-seconds may get before it is rewritten "
            "(it is also rewritten at every new checkpoint); readers add the time since "
            "gpuscaler.io/preemption-cost-time."
        ),
    )

    # --- Observed performance (gpuscaler.observe, docs/observe.md): progress annotations always, Prometheus when prometheus_url is set
    observe_interval_s: float = Field(
        default=60.0, gt=0, description="Seconds between assessments of a running job's metrics (2 Prometheus queries each)."
    )
    observe_window_s: float = Field(
        default=600.0, gt=0, description="Seconds of samples one assessment reads (range selector length)."
    )
    observe_rate_window_s: float = Field(
        default=60.0, gt=0, description="Seconds per window of the median-of-windows throughput estimate."
    )
    observe_warmup_s: float = Field(
        default=120.0,
        ge=0,
        description="Seconds after the gang starts before its samples count (data-loader warm-up, compilation).",
    )
    observe_divergence: float = Field(
        default=0.15,
        gt=0,
        lt=1,
        description="Observed vs predicted throughput differing by more than this fraction corrects the job's model.",
    )
    correction_min_window_s: float = Field(
        default=120.0,
        gt=0,
        description=(
            "Seconds of the workers' progress annotations (after the warm-up) before the estimate is "
            "corrected without Prometheus (gpuscaler.planner.correction)."
        ),
    )
    replan_margin: float = Field(
        default=0.10,
        ge=0,
        lt=1,
        description="A re-plan after a correction must save more than this fraction of the remaining cost.",
    )
    replan_min_interval_s: float = Field(
        default=1800.0,
        ge=0,
        description="Least seconds between a plan change and a re-plan found by observation (no thrashing).",
    )
    replan_restart_s: float = Field(
        default=300.0,
        ge=0,
        description="Seconds a move to another plan costs (provisioning, start, resume), charged at the new plan's price.",
    )
    observe_query_timeout_s: float = Field(default=10.0, gt=0, description="Timeout of one Prometheus query.")
    dcgm_pod_label: str = Field(
        default="pod",
        description="Label carrying the pod name on DCGM series (exported_pod when the scrape does not honor labels).",
    )
    dcgm_namespace_label: str = Field(
        default="namespace",
        description="Label carrying the pod's namespace on DCGM series (exported_namespace when labels are not honored).",
    )

    # --- Performance profiles (gpuscaler.planner.profiles, controller/profiles.py, docs/profiles.md)
    profiles_enabled: bool = Field(
        default=True,
        description=(
            "Record a PerformanceProfile when a job succeeds with a measured throughput, and plan with the "
            "profiles of the job's namespace as measured priors."
        ),
    )
    profiles_ttl_days: float = Field(
        default=90.0,
        gt=0,
        description="Days a profile not measured again is still planned with; older ones are pruned (a framework or driver upgrade changes speed).",
    )
    profiles_per_workload: int = Field(
        default=16,
        ge=1,
        le=1000,
        description="Profiles kept per workload signature and namespace (configurations); the least recently seen goes first.",
    )
    profiles_memory_runs: int = Field(
        default=20,
        ge=1,
        description="Runs after which a profile's mean becomes an exponential moving average of this many runs.",
    )
    profiles_achieved_tolerance: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description=(
            "Most a run's measured rate may differ from the rate it achieved from its first report to its "
            "completion (as the operator saw it) for the run to be recorded; a forged progress report fails this."
        ),
    )
    profiles_shared_namespace: str = Field(
        default="",
        max_length=63,
        description=(
            "A namespace whose profiles every namespace's plans read after their own (a platform team's "
            "curated profiles, gpuscaler profiles import); empty: none."
        ),
    )

    # --- Live prices (docs/prices.md): the operator's price refresher
    prices_providers: list[Literal["aws", "azure", "gcp"]] = Field(
        default_factory=list,
        description=(
            "Clouds whose live prices the operator refreshes (aws, azure, gcp); empty = plan on the shipped "
            "table (and a policy's priceOverrides) only."
        ),
    )
    prices_regions: list[str] = Field(
        default_factory=list, description="Regions to price; empty = the catalog's regions of each provider."
    )
    prices_ondemand_interval_s: float = Field(
        default=43200.0, ge=1, description="Seconds between refreshes of on-demand prices (12 h, as Karpenter)."
    )
    prices_spot_interval_s: float = Field(
        default=3600.0, ge=1, description="Seconds between refreshes of spot prices (1 h)."
    )
    prices_ondemand_max_age_s: float = Field(
        default=129600.0, ge=1, description="On-demand prices older than this (36 h) are stale: PricesStale on the jobs planned."
    )
    prices_spot_max_age_s: float = Field(
        default=10800.0, ge=1, description="Spot prices older than this (3 h) are stale: PricesStale on the jobs planned."
    )
    prices_retry_s: float = Field(
        default=300.0, ge=1, description="Seconds before a failed refresh is tried again (the last good copy is kept)."
    )
    prices_configmap: str = Field(
        default="gpuscaler-prices", description="ConfigMap that keeps the last good copy of the live prices."
    )
    prices_namespace: str | None = Field(
        default=None,
        description="Namespace of that ConfigMap (the operator's; the chart sets it); unset = the watched namespace, else default.",
    )
