"""Every label, annotation, taint, finalizer and condition type the operator reads or writes.

One home for names (as :mod:`gpuscaler.runtime.constants` is for the training container, and
Karpenter's ``pkg/apis/v1/labels.go`` and ``taints.go`` are for Karpenter): code never spells them
inline. The well-known keys of others (Kubernetes, clouds, Karpenter, NVIDIA) are listed with who
sets them. Imports nothing: every layer may use it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

GROUP: Final = "gpuscaler.io"
"""The API group, and the prefix of the operator's labels and annotations."""

# ------------------------------------------------------------------------- gpuscaler's own labels

JOB_LABEL: Final = "gpuscaler.io/job"
"""On nodes and pods of a job: ``<namespace>.<name>`` (shortened with a hash when too long)."""
POOL_LABEL: Final = "gpuscaler.io/pool"
"""On kwok's fake nodes: the node pool they were made in."""
GPU_LABEL: Final = "gpuscaler.io/gpu"
"""On kwok's fake nodes: the catalog's GPU id."""
PROVIDER_LABEL: Final = "gpuscaler.io/provider"
"""On kwok's fake nodes: the cloud of the instance type (aws, gcp, azure)."""
MANAGED_LABEL: Final = "gpuscaler.io/managed"
"""On cloud objects the operator made (a Karpenter NodeClaim template, EKS node group tags): ``true``."""
INSTANCE_TYPE_KEY: Final = "gpuscaler.io/instance-type"
"""The catalog's instance type name: a node label of GKE and Cluster API pools, an EKS node
group tag, an annotation of kwok's nodes."""
CAPACITY_TYPE_KEY: Final = "gpuscaler.io/capacity-type"
"""The capacity type (on-demand, spot, reserved, capacity-block, flex-start): a node label of GKE,
Cluster API and held-capacity pools, an EKS node group tag."""
ZONE_KEY: Final = "gpuscaler.io/zone"
"""The availability zone an EKS node group gpuscaler made serves (a tag; its subnets are in it)."""
HELD_CAPACITY_LABEL: Final = "gpuscaler.io/held-capacity"
"""On nodes of a held capacity pool (kwok's, and the pools gpuscaler makes): the pool's name (docs/capacity.md)."""
CAPACITY_WINDOW_START_LABEL: Final = "gpuscaler.io/capacity-window-start"
"""On nodes of a capacity block: when its window opens, unix seconds (node affinity can use Gt/Lt)."""
CAPACITY_WINDOW_END_LABEL: Final = "gpuscaler.io/capacity-window-end"
"""On nodes of a capacity block or an expiring reservation: when it closes, unix seconds."""
RANK_LABEL: Final = "gpuscaler.io/rank"
"""On worker pods: the node rank of the worker."""
ATTEMPT_LABEL: Final = "gpuscaler.io/attempt"
"""On worker pods: the gang attempt that created it."""

# -------------------------------------------------------------------- gpuscaler's own annotations

PRICE_ANNOTATION: Final = "gpuscaler.io/usd-per-hour"
"""On nodes a provider created: the node's price per hour at its capacity type (for cost so far)."""
INTERRUPTION_ANNOTATION: Final = "gpuscaler.io/interruption-notice"
"""On a node, for any notice no taint carries: an RFC 3339 deadline, or a reason."""
NODE_SELECTOR_ANNOTATION: Final = "gpuscaler.io/node-selector"
"""On a Cluster API MachineDeployment: the node selector of its nodes."""
LAST_CHECKPOINT_TIME_ANNOTATION: Final = "gpuscaler.io/last-checkpoint-time"
"""On worker pods, by the operator: when the job's newest complete checkpoint was committed (RFC 3339).
The preemption-cost annotations (this and the four below) are the operator's, checked and bounded;
workers cannot write them (docs/preemption-cost.md)."""
LAST_CHECKPOINT_STEP_ANNOTATION: Final = "gpuscaler.io/last-checkpoint-step"
"""On worker pods, by the operator: the step of the job's newest complete checkpoint."""
WORK_AT_RISK_ANNOTATION: Final = "gpuscaler.io/work-at-risk-seconds"
"""On worker pods, by the operator: seconds of training a preemption now would lose (since the newer
of the last checkpoint and the gang's start), as of :data:`PREEMPTION_COST_TIME_ANNOTATION`."""
CHECKPOINT_SECONDS_ANNOTATION: Final = "gpuscaler.io/checkpoint-seconds"
"""On worker pods, by the operator: measured seconds of the job's last checkpoint write (what a
graceful stop costs on top of the work at risk)."""
PREEMPTION_COST_TIME_ANNOTATION: Final = "gpuscaler.io/preemption-cost-time"
"""On worker pods, by the operator: when the preemption-cost annotations were computed (RFC 3339);
the work at risk grows by the time since while the job runs."""
PREEMPTION_COST_ANNOTATIONS: Final = (
    LAST_CHECKPOINT_TIME_ANNOTATION,
    LAST_CHECKPOINT_STEP_ANNOTATION,
    WORK_AT_RISK_ANNOTATION,
    CHECKPOINT_SECONDS_ANNOTATION,
    PREEMPTION_COST_TIME_ANNOTATION,
)
"""The annotations the operator publishes on each worker pod of a running job for schedulers."""
FINALIZER: Final = "gpuscaler.io/finalizer"
"""On TrainingJobs: the operator releases the workers and nodes before the object goes."""

# --------------------------------------------------------------------- well-known labels of others

INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"
"""Kubernetes: the cloud's instance type of a node (the kubelet's cloud provider sets it)."""
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
REGION_LABEL: Final = "topology.kubernetes.io/region"
CAPACITY_TYPE_LABEL: Final = "karpenter.sh/capacity-type"
"""Karpenter: ``spot``, ``on-demand`` or ``reserved`` (capacity reservations and blocks)."""
KARPENTER_RESERVATION_ID_LABEL: Final = "karpenter.k8s.aws/capacity-reservation-id"
"""Karpenter on AWS: the EC2 capacity reservation of a ``reserved`` node."""
KARPENTER_RESERVATION_TYPE_LABEL: Final = "karpenter.k8s.aws/capacity-reservation-type"
"""Karpenter on AWS: ``default`` (an ODCR) or ``capacity-block`` for a ``reserved`` node."""
KARPENTER_NODEPOOL_LABEL: Final = "karpenter.sh/nodepool"
DO_NOT_DISRUPT_ANNOTATION: Final = "karpenter.sh/do-not-disrupt"
"""Karpenter: on a pod, ``"true"`` blocks voluntary disruption (consolidation, drift, expiry) of its
node. The operator sets it on a job's workers only while a checkpoint is being written."""
EKS_CAPACITY_LABEL: Final = "eks.amazonaws.com/capacityType"
"""EKS managed node groups: ``SPOT`` or ``ON_DEMAND``."""
EKS_NODEGROUP_LABEL: Final = "eks.amazonaws.com/nodegroup"
GKE_SPOT_LABEL: Final = "cloud.google.com/gke-spot"
GKE_NODEPOOL_LABEL: Final = "cloud.google.com/gke-nodepool"
GKE_FLEX_START_LABEL: Final = "cloud.google.com/gke-flex-start"
"""GKE: ``"true"`` on nodes of a flex-start (DWS) node pool."""
GKE_ACCELERATOR_LABEL: Final = "cloud.google.com/gke-accelerator"
AZURE_PRIORITY_LABEL: Final = "kubernetes.azure.com/scalesetpriority"
"""AKS: ``spot`` or ``regular``."""
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
"""NVIDIA GPU feature discovery: the GPU's product name."""
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource of the NVIDIA device plugin, and the key of the GPU nodes' taint."""

COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
"""Kubernetes (Indexed Jobs): a pod's completion index, as a label and an annotation; the rank of a
``runtime: jobset`` worker."""
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
"""JobSet controller: on the Jobs and pods of a JobSet, its name."""
QUEUE_NAME_LABEL: Final = "kueue.x-k8s.io/queue-name"
"""Kueue: the LocalQueue of a job (set by users; honoured on a TrainingJob like ``spec.queueName``)."""

PROFILE_SIGNATURE_LABEL: Final = "gpuscaler.io/signature"
"""On a PerformanceProfile: the id of the workload signature it measured (list one workload's by selector)."""
PROFILE_GPU_LABEL: Final = "gpuscaler.io/gpu-type"
"""On a PerformanceProfile: its GPU type (made label-safe)."""

# ---------------------------------------------------------------------------------------- taints

GPU_TAINT_KEY: Final = GPU_RESOURCE
"""The taint EKS, GKE and AKS GPU node groups carry (``nvidia.com/gpu=present:NoSchedule``)."""
NOT_READY_TAINT_KEY: Final = "node.kubernetes.io/not-ready"
"""Kubernetes (TaintNodesByCondition): a node that is not Ready; the scheduler keeps pods off it."""
AWS_SPOT_ITN_TAINT: Final = "aws-node-termination-handler/spot-itn"
"""AWS Node Termination Handler: an EC2 spot interruption notice (2 minutes)."""
AWS_REBALANCE_TAINT: Final = "aws-node-termination-handler/rebalance-recommendation"
"""AWS Node Termination Handler: an EC2 rebalance recommendation (no deadline)."""
KARPENTER_DISRUPTED_TAINT: Final = "karpenter.sh/disrupted"
"""Karpenter: the node is being disrupted (consolidation, drift, expiry, interruption)."""
GKE_TERMINATION_TAINT: Final = "cloud.google.com/impending-node-termination"
"""GKE: the node's VM is being preempted (30 s)."""


# ------------------------------------------------------------------------------ condition types


class ConditionType(StrEnum):
    """The ``type`` of every condition the operator sets on a TrainingJob's status."""

    PLANNED = "Planned"
    """True once a plan is chosen (reason Planned or Replanned); False: Infeasible, InvalidSpec."""
    SUSPENDED = "Suspended"
    """True while spec.suspend holds the job at its plan."""
    NODES_READY = "NodesReady"
    """True when every node of the plan is Ready."""
    RUNNING = "Running"
    """True while every worker runs; False with why it stopped (Interrupted, WorkerFailed, ...)."""
    COMPLETE = "Complete"
    """True when every worker succeeded."""
    FAILED = "Failed"
    """True when the job failed for good (Infeasible, InvalidSpec, BackoffLimitExceeded)."""
    POLICY_VIOLATION = "PolicyViolation"
    """True while a policy rule stops the job; False (Compliant) once it meets them."""
    POLICY_INVALID = "PolicyInvalid"
    """True while a policy source is invalid (its last good version is in force, or none)."""
    WORKER_ADMISSION = "WorkerAdmissionPolicy"
    """False while workers wait for the admission policy that confines their account."""
    WORKER_REPORTS = "WorkerReports"
    """False while a worker's annotation values are being ignored (gpuscaler.kube.reports)."""
    PRICES_STALE = "PricesStale"
    """Set when a job is planned with live prices configured: True (NoLivePrices, PricesOld) when the
    prices in force are older than the settings allow, False (LivePrices) when they are fresh."""

class EventReason(StrEnum):
    """The ``reason`` of every Event the operator posts on a TrainingJob (the observer also posts
    its findings' types, :mod:`gpuscaler.observe`). Events are built by :class:`gpuscaler.api.events.Event`."""

    PLANNED = "Planned"
    """Normal: a plan was chosen (the message is its summary)."""
    REPLANNED = "Replanned"
    """Normal: the rest of the job was planned again (after an interruption, a shortage, or a model correction at a checkpoint)."""
    REPLANNED_WITHIN_QUOTA = "ReplannedWithinQuota"
    """Normal: the plan was changed to fit the namespace's quota."""
    REPLAN_PENDING = "ReplanPending"
    """Normal: a re-plan is decided and waits for a checkpoint (for the deadline, one the operator asks for at once)."""
    REPLAN_CANCELLED = "ReplanCancelled"
    """Normal: a pending re-plan no longer pays at the checkpoint and is dropped."""
    PLANNED_MOVE = "PlannedMove"
    """Normal: the job moves to another plan by its own decision (not an interruption)."""
    INFEASIBLE = "Infeasible"
    """Warning: no plan meets the job's constraints (the message says which rule binds)."""
    TRIAL = "Trial"
    """Normal: no plan met the deadline's risk limit; one inside its band starts as a trial (:mod:`gpuscaler.planner.trial`)."""
    TRIAL_KEPT = "TrialKept"
    """Normal: a trial's measured P(miss) is within maxDeadlineRisk: the plan is kept."""
    TRIAL_CONTINUED = "TrialContinued"
    """Normal: a trial's measured P(miss) is over maxDeadlineRisk but below one half: it runs on, judged at each estimate."""
    TRIAL_UNMEASURED = "TrialUnmeasured"
    """Warning: a trial's workers report no progress, so it cannot be judged and runs on at its planned P(miss)."""
    DEADLINE_INFEASIBLE = "DeadlineInfeasible"
    """Warning: a trial measured a speed at which the deadline would probably be missed and no plan meets its risk: the job stopped at a checkpoint."""
    INVALID_SPEC = "InvalidSpec"
    """Warning: the spec cannot be planned as written."""
    INVALID_POLICY = "InvalidPolicy"
    """Warning: a policy source is invalid (its last good version stays in force)."""
    POLICY_VIOLATION = "PolicyViolation"
    """Warning: a policy rule stops the job."""
    PRICES_STALE = "PricesStale"
    """Warning: the plan was made on prices older than the configured limit."""
    SUSPENDED = "Suspended"
    """Normal: spec.suspend holds the job at its plan."""
    QUEUED = "Queued"
    """Normal: the job waits in a Kueue queue."""
    ADMITTED = "Admitted"
    """Normal: Kueue admitted the gang."""
    EVICTED = "Evicted"
    """Warning: Kueue evicted the gang."""
    NODES_READY = "NodesReady"
    """Normal: every node of the plan is Ready."""
    SCALED_UP = "ScaledUp"
    """Normal: nodes were requested for the plan."""
    SCALED_DOWN = "ScaledDown"
    """Normal: the job's nodes were released."""
    GANG_TIMEOUT = "GangTimeout"
    """Warning: the gang did not become ready in time."""
    WORKERS_CREATED = "WorkersCreated"
    """Normal: the worker pods (or JobSet) were created."""
    WORKER_ADMISSION_POLICY_MISSING = "WorkerAdmissionPolicyMissing"
    """Warning: the admission policy that guards worker reports is missing."""
    STARTED = "Started"
    """Normal: every worker runs (first start)."""
    RECOVERED = "Recovered"
    """Normal: every worker runs again after an interruption, resumed from its checkpoint."""
    INTERRUPTED = "Interrupted"
    """Warning: the job lost capacity (a spot reclaim, a node gone)."""
    CHECKPOINTED = "Checkpointed"
    """Normal: the workers acknowledged a checkpoint request."""
    CHECKPOINT_MISSED = "CheckpointMissed"
    """Warning: a checkpoint request was not acknowledged in time."""
    WORKER_FAILED = "WorkerFailed"
    """Warning: a worker failed (the job retries within its backoff limit)."""
    FAILED = "Failed"
    """Warning: the job failed for good."""
    SUCCEEDED = "Succeeded"
    """Normal: every worker succeeded."""
    REPORT_REJECTED = "ReportRejected"
    """Warning: values a worker reported were rejected (kept in the WorkerReports condition)."""
    MODEL_CORRECTED = "ModelCorrected"
    """Normal: the observed throughput moved the job's efficiency factor."""
    OBSERVE_FAILED = "ObserveFailed"
    """Warning: the observer could not read the job's progress."""
    PROFILE_RECORDED = "ProfileRecorded"
    """Normal: a finished job's measured throughput was folded into a PerformanceProfile."""
    PROFILE_NOT_RECORDED = "ProfileNotRecorded"
    """A finished job left no profile (Normal: measured too briefly; Warning: its reports contradict what the operator saw, or the write failed)."""
    PROFILE_NOT_PRUNED = "ProfileNotPruned"
    """Warning: a PerformanceProfile past the TTL or the cap could not be deleted."""
