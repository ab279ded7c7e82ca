"""Worker pods and the headless rendezvous Service of a TrainingJob: manifests and observed state.

One pod per node (a gang), named ``<job>-worker-<rank>``, with the torchrun-style launch env
(``WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``NPROC_PER_NODE``; a one-node
gang's ``MASTER_ADDR`` is the pod itself and it gets no Service) and the plan
(``GPUSCALER_PRECISION``, ``GPUSCALER_MICRO_BATCH``, ``GPUSCALER_ACCUMULATION_STEPS``,
``GPUSCALER_CHECKPOINT_DIR``, ``GPUSCALER_CHECKPOINT_INTERVAL_S``; the names come from
:mod:`gpuscaler.runtime.constants`, the training side of the handshake), ``nvidia.com/gpu``
requests, the provider's node selector and tolerations, a downward-API volume carrying the pod's
annotations (the checkpoint request) and an owner reference to the TrainingJob. Pure functions;
:mod:`gpuscaler.kube.client` sends them.

Worker identity: when the job's template names no ``serviceAccountName``, the workers run as the
ServiceAccount ``gpuscaler-worker`` of the job's namespace, which the operator creates (with a
Role allowing only ``get`` and ``patch`` on ``pods`` and its RoleBinding; :func:`worker_rbac`).
That is what the runtime's :class:`~gpuscaler.runtime.kube_reporter.KubeReporter` needs to write
its progress and checkpoint annotations on its own pod. A template that names its own
ServiceAccount is left as it is: that account must carry ``patch`` on ``pods`` itself.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuscaler.kube.checkpoint_reports import CheckpointTiming, parse_utc
from gpuscaler.kube.reports import Rejected
from gpuscaler.kube.reports import parse as parse_reports
from gpuscaler.names import (
    ATTEMPT_LABEL,
    COMPLETION_INDEX_LABEL,
    DO_NOT_DISRUPT_ANNOTATION,
    GPU_RESOURCE,
    JOB_LABEL,
    PREEMPTION_COST_ANNOTATIONS,
    RANK_LABEL,
)
from gpuscaler.runtime import constants as rc
from gpuscaler.runtime.kube_reporter import ENV_POD_NAME, ENV_POD_NAMESPACE

NO_RANK = -1
"""The rank of a pod whose rank label is missing or not a number: no rank (never the writer)."""
PODINFO_VOLUME = "gpuscaler-podinfo"
PODINFO_DIR = "/etc/gpuscaler/podinfo"
DEFAULT_CONTAINER = "train"
DISRUPTION_TARGET = "DisruptionTarget"
"""Pod condition Kubernetes sets before it deletes a pod for a disruption (eviction, preemption,
taint manager, graceful node shutdown, pod GC): the pod's end is not the workload's failure."""
WORKER_SERVICE_ACCOUNT = "gpuscaler-worker"
"""ServiceAccount, Role and RoleBinding name of the workers in a job's namespace (shared by its jobs)."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuscaler"}
WORKER_RULES: list[dict[str, list[str]]] = [
    # KubeReporter patches its own pod's annotations (progress, checkpoint-step, checkpoint-ack).
    # RBAC cannot narrow this to the caller's own pod: pod names are per job and per attempt.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
]
"""The workers' permissions: nothing else (the operator must hold them too: RBAC's escalation check)."""


@dataclass(frozen=True)
class WorkerPlan:
    """What every worker of one gang start gets."""

    job_name: str
    namespace: str
    job_label: str
    owner: dict[str, Any]
    """An ownerReference to the TrainingJob."""
    nodes: int
    gpus_per_node: int
    precision: str
    micro_batch: int
    accumulation: int
    checkpoint_dir: str
    checkpoint_interval_s: float
    checkpoint_keep: int
    master_port: int
    attempt: int
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]
    default_image: str
    template: dict[str, Any] | None


def _dns_label(text: str, limit: int = 63) -> str:
    v = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return v[:limit].rstrip("-") or "job"


def service_name(job_name: str) -> str:
    """The headless Service: ``<job>-workers`` (a DNS-1035 label)."""
    base = _dns_label(job_name, 55)
    if not base[0].isalpha():
        base = f"j-{base}"[:55]
    return f"{base}-workers"


def worker_name(job_name: str, rank: int) -> str:
    """Pod name of a rank: ``<job>-worker-<rank>``."""
    return f"{job_name}-worker-{rank}"


def worker_hostname(job_name: str, rank: int) -> str:
    """Pod hostname (a DNS label, so at most 63 characters)."""
    suffix = f"-worker-{rank}"
    return _dns_label(job_name, 63 - len(suffix)) + suffix


LOCAL_MASTER_ADDR = "127.0.0.1"
"""``MASTER_ADDR`` of a one-node gang: rank 0 is the pod itself (torchrun's ``--standalone`` does
the same), so no Service is made for it (a Service costs its create and the endpoints
controllers' Endpoints and EndpointSlice writes)."""


def needs_rendezvous_service(plan: WorkerPlan) -> bool:
    """Whether the gang needs the headless Service to find rank 0: more than one node."""
    return plan.nodes > 1


def master_addr(plan: WorkerPlan) -> str:
    """DNS name of rank 0 through the headless Service; the pod itself for a one-node gang."""
    if not needs_rendezvous_service(plan):
        return LOCAL_MASTER_ADDR
    return f"{worker_hostname(plan.job_name, 0)}.{service_name(plan.job_name)}.{plan.namespace}.svc"


def launch_env(plan: WorkerPlan, rank: int) -> list[dict[str, str]]:
    """torchrun-style env and the plan, as a container ``env`` list."""
    values = {
        "WORLD_SIZE": str(plan.nodes),
        "NODE_RANK": str(rank),
        "MASTER_ADDR": master_addr(plan),
        "MASTER_PORT": str(plan.master_port),
        "NPROC_PER_NODE": str(max(plan.gpus_per_node, 1)),
        rc.ENV_PRECISION: plan.precision,
        rc.ENV_MICRO_BATCH: str(plan.micro_batch),
        rc.ENV_ACCUMULATION_STEPS: str(plan.accumulation),
        rc.ENV_CHECKPOINT_DIR: plan.checkpoint_dir,
        rc.ENV_CHECKPOINT_INTERVAL_S: f"{plan.checkpoint_interval_s:g}",
        rc.ENV_CHECKPOINT_KEEP: str(plan.checkpoint_keep),
        rc.ENV_PODINFO_DIR: PODINFO_DIR,
    }
    return [{"name": k, "value": v} for k, v in values.items()]


def pod_identity_env() -> list[dict[str, Any]]:
    """``POD_NAME`` and ``POD_NAMESPACE`` from the downward API: the runtime's
    :class:`~gpuscaler.runtime.kube_reporter.KubeReporter` patches its own pod's annotations with them."""
    return [
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": ENV_POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def uses_worker_account(template: dict[str, Any] | None) -> bool:
    """Whether the workers of this template run as :data:`WORKER_SERVICE_ACCOUNT` (it names no
    ServiceAccount of its own; ``serviceAccount`` is the deprecated alias of ``serviceAccountName``)."""
    spec = (template or {}).get("spec") or {}
    return not (spec.get("serviceAccountName") or spec.get("serviceAccount"))


def worker_rbac(namespace: str) -> list[dict[str, Any]]:
    """The workers' ServiceAccount, Role (``pods``: get, patch) and RoleBinding in ``namespace``.

    No owner reference: every job of the namespace shares them, so they stay when a job goes.
    """
    meta = {"name": WORKER_SERVICE_ACCOUNT, "namespace": namespace, "labels": dict(MANAGED_BY)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": copy.deepcopy(WORKER_RULES),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WORKER_SERVICE_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": WORKER_SERVICE_ACCOUNT, "namespace": namespace}],
        },
    ]


def worker_pod(plan: WorkerPlan, rank: int) -> dict[str, Any]:
    """The Pod of one rank, from the job's template with the operator's fields set over it."""
    template = copy.deepcopy(plan.template or {})
    meta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}
    containers: list[dict[str, Any]] = spec.setdefault("containers", [])
    if not containers:
        containers.append({"name": DEFAULT_CONTAINER, "image": plan.default_image})
    main = containers[0]
    main.setdefault("name", DEFAULT_CONTAINER)
    main.setdefault("image", plan.default_image)
    ours: list[dict[str, Any]] = [*launch_env(plan, rank), *pod_identity_env()]
    names = {e["name"] for e in ours}
    main["env"] = [e for e in main.get("env") or [] if e.get("name") not in names] + ours
    resources = main.setdefault("resources", {})
    if plan.gpus_per_node > 0:
        for kind in ("limits", "requests"):
            resources.setdefault(kind, {})[GPU_RESOURCE] = str(plan.gpus_per_node)
    mounts = [m for m in main.get("volumeMounts") or [] if m.get("name") != PODINFO_VOLUME]
    main["volumeMounts"] = [*mounts, {"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True}]
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != PODINFO_VOLUME]
    spec["volumes"] = [
        *volumes,
        {
            "name": PODINFO_VOLUME,
            "downwardAPI": {
                "items": [
                    {"path": rc.DOWNWARD_ANNOTATIONS_FILE, "fieldRef": {"fieldPath": "metadata.annotations"}}
                ]
            },
        },
    ]
    if uses_worker_account(template):
        spec["serviceAccountName"] = WORKER_SERVICE_ACCOUNT
    spec["restartPolicy"] = "Never"
    spec["hostname"] = worker_hostname(plan.job_name, rank)
    if needs_rendezvous_service(plan):
        spec["subdomain"] = service_name(plan.job_name)
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **plan.node_selector}
    tolerations = list(spec.get("tolerations") or [])
    spec["tolerations"] = tolerations + [t for t in plan.tolerations if t not in tolerations]
    labels = {
        **(meta.get("labels") or {}),
        "app.kubernetes.io/name": "gpuscaler-worker",
        JOB_LABEL: plan.job_label,
        RANK_LABEL: str(rank),
        ATTEMPT_LABEL: str(plan.attempt),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": worker_name(plan.job_name, rank),
            "namespace": plan.namespace,
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [plan.owner],
        },
        "spec": spec,
    }


def headless_service(plan: WorkerPlan) -> dict[str, Any]:
    """The headless Service that gives every worker a DNS name (``MASTER_ADDR``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(plan.job_name),
            "namespace": plan.namespace,
            "labels": {JOB_LABEL: plan.job_label},
            "ownerReferences": [plan.owner],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: plan.job_label},
            "ports": [{"name": "rendezvous", "port": plan.master_port, "targetPort": plan.master_port}],
        },
    }


@dataclass(frozen=True)
class PodState:
    """One worker pod as observed."""

    name: str
    rank: int
    attempt: int
    phase: str
    node: str | None
    owner_uid: str | None
    deleting: bool
    exit_code: int | None
    reason: str
    step: int | None
    samples: float | None
    checkpoint_step: int | None
    checkpoint_ack: str | None
    checkpoint_requested: str | None
    """The request the operator last wrote on the pod (the workers may not change it)."""
    rejected: tuple[Rejected, ...] = ()
    """Reported values that failed their type or range check (:func:`gpuscaler.kube.reports.parse`);
    the fields above are None for them."""
    runtime_phase: str | None = None
    """The runtime's reported phase (``gpuscaler.io/runtime-phase``): running, preempted, finished."""
    disruption: str | None = None
    """The reason of the pod's ``DisruptionTarget`` condition when it is True (the pod is being
    evicted, preempted, or its node is shutting down), else None."""
    timing: CheckpointTiming = field(default_factory=CheckpointTiming)
    """The checkpoint-timing reports (:mod:`gpuscaler.kube.checkpoint_reports`), type- and range-checked."""
    started_at: datetime | None = None
    """``status.startTime``: when the kubelet (kwok) accepted the pod."""
    published: tuple[tuple[str, str], ...] = ()
    """The operator's preemption-cost annotations and ``karpenter.sh/do-not-disrupt`` as on the pod
    now (key, value), for :mod:`gpuscaler.controller.preemption` to patch only what changed."""

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"


def _int(text: object) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


def pod_state(pod: dict[str, Any]) -> PodState:
    """A :class:`PodState` from a Pod as a plain dict (a watch event body); the reported annotations
    are type- and range-checked (:func:`gpuscaler.kube.reports.parse`), the rest of the checks
    need the job's status (:func:`gpuscaler.kube.reports.trusted_report`)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    exit_code: int | None = None
    reason = status.get("reason") or ""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            code = term.get("exitCode")
            if code not in (None, 0) or exit_code is None:
                exit_code = code
                reason = term.get("reason") or reason
    owners = [o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")]
    name = meta.get("name", "")
    reported = parse_reports(name, ann)
    rank = _int(labels.get(RANK_LABEL, labels.get(COMPLETION_INDEX_LABEL)))
    disruption = next(
        (
            str(c.get("reason") or "DisruptionTarget")
            for c in status.get("conditions") or []
            if c.get("type") == DISRUPTION_TARGET and c.get("status") == "True"
        ),
        None,
    )
    return PodState(
        name=name,
        rank=NO_RANK if rank is None else rank,
        attempt=_int(labels.get(ATTEMPT_LABEL)) or 0,
        phase=status.get("phase") or "Pending",
        node=(pod.get("spec") or {}).get("nodeName"),
        owner_uid=owners[0] if owners else None,
        deleting=bool(meta.get("deletionTimestamp")),
        exit_code=exit_code,
        reason=reason,
        step=reported.step,
        samples=reported.samples,
        checkpoint_step=reported.checkpoint_step,
        checkpoint_ack=reported.checkpoint_ack,
        checkpoint_requested=ann.get(rc.ANNOTATION_CHECKPOINT_REQUESTED),
        rejected=reported.rejected,
        # only the one value the operator acts on is believed; anything else reads as no phase
        runtime_phase=rc.RUNTIME_PHASE_PREEMPTED
        if ann.get(rc.ANNOTATION_RUNTIME_PHASE) == rc.RUNTIME_PHASE_PREEMPTED
        else None,
        disruption=disruption,
        timing=reported.timing,
        started_at=parse_utc(str(status.get("startTime") or "")),
        published=tuple(
            (k, str(ann[k])) for k in (*PREEMPTION_COST_ANNOTATIONS, DO_NOT_DISRUPT_ANNOTATION) if k in ann
        ),
    )
