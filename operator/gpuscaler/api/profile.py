"""The PerformanceProfile API: what the cluster measured of one configuration of one workload.

The source of truth of the CRD (``gpuscaler crd`` writes ``crds/performanceprofile.yaml``). The
operator writes one when a job succeeds with a measured throughput
(:mod:`gpuscaler.controller.profiles`) and the planner reads them as measured priors
(:mod:`gpuscaler.planner.profiles`, where the maths is). Everything is in ``spec``: a profile is a
record the operator keeps, as a Lease is, not a desired state something reconciles towards, and it
has one writer.

**Namespaced, on purpose.** A profile is a measurement of a team's workload: the declared shape of
its model and how fast it ran. Kept in the job's namespace it respects tenancy: a team's profiles
steer only that team's plans (another team's bad or forged measurement cannot make this team's
plans miss their deadline), they are read with the namespace's own RBAC, and they go with the
namespace. A platform team still sees them all (``kubectl get performanceprofiles -A``,
``gpuscaler profiles list -A``), and shares what it trusts on purpose: ``gpuscaler profiles
export`` from one namespace, ``import`` into another, or into the namespace named by
``GPUSCALER_PROFILES_SHARED_NAMESPACE``, whose profiles every namespace's plans read after their
own. Only the operator (and whoever a platform team grants it) may write them: workers and
namespace users get no verb on them (``helm/gpuscaler/templates/rbac.yaml``).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, Model, PrecisionName, WorkloadSpec

KIND = "PerformanceProfile"
PLURAL = "performanceprofiles"
SINGULAR = "performanceprofile"
SHORT_NAMES = ["pprof"]
MAX_RECENT_JOBS = 8
"""Job uids a profile lists (:data:`gpuscaler.planner.profiles.MAX_RECENT_JOBS`)."""


class ProfileSignature(Model):
    """The workload's declared shape: what the job's ``spec.workload`` says, never code or data."""

    id: str = Field(
        pattern=r"^[0-9a-f]{16}$",
        description="16 hex digits of the SHA-256 of the canonical JSON of shape (also the label gpuscaler.io/signature).",
    )
    workload: str = Field(max_length=253, description="The workload id (the catalog's, or the planner's name for a custom one).")
    shape: WorkloadSpec = Field(
        description="The job's spec.workload as declared, a named model under its catalog id: model, or transformer "
        "shape (layers, hidden, heads, sequence length, vocabulary), or params and flopsPerSample; the input pipeline."
    )


class PerformanceProfileSpec(Model):
    """One configuration of one workload signature, and its throughput measured over runs."""

    signature: ProfileSignature = Field(description="The workload signature measured.")
    gpu_type: str = Field(min_length=1, max_length=64, description="GPU id, e.g. A100-40GB.")
    instance_type: str = Field(default="", max_length=128, description="Instance type of the last run (for people; the GPU type is the key).")
    gpus: int = Field(ge=1, le=4096, description="GPUs in total.")
    nodes: int = Field(ge=1, le=1024, description="Nodes.")
    micro_batch: int = Field(ge=1, description="Micro-batch per GPU.")
    accumulation: int = Field(ge=1, description="Gradient-accumulation steps.")
    precision: PrecisionName = Field(description="Numeric precision trained in.")
    throughput: float = Field(
        gt=0, description="Measured samples/s: the runs' geometric mean, exponentially weighted past memoryRuns."
    )
    unit: str = Field(default="samples", max_length=32, description="What one sample is (images, sequences).")
    model_throughput: float = Field(
        gt=0, description="The performance model's own estimate of this configuration when last measured, samples/s (the base of the ratio near configurations are moved by)."
    )
    spread: float = Field(
        ge=0, le=5, description="Log-space sigma of the next run's throughput (what an exact match plans with: P10/P90 = throughput x exp(-/+1.2816 spread))."
    )
    log_spread: float = Field(ge=0, le=5, description="Standard deviation of ln throughput between runs (0 after one run).")
    measurement_log_sigma: float = Field(ge=0, le=5, description="RMS of the runs' own relative standard errors.")
    runs: int = Field(ge=1, description="Runs measured.")
    last_seen: datetime = Field(description="When the last run was measured (profiles not seen for the TTL are pruned).")
    recent_jobs: list[str] = Field(
        default_factory=list, max_length=MAX_RECENT_JOBS, description="UIDs of the newest jobs counted (a job is counted once)."
    )


class PerformanceProfile(Model):
    """A PerformanceProfile object (apiVersion, kind, metadata, spec)."""

    api_version: str = Field(default=f"{API_GROUP}/{API_VERSION}", description="gpuscaler.io/v1alpha1.")
    kind: str = Field(default=KIND, description="PerformanceProfile.")
    metadata: dict[str, object] = Field(default_factory=dict, description="Object metadata (name, namespace, labels).")
    spec: PerformanceProfileSpec
