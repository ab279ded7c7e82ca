"""The node-pool provider interface: how the operator grows and shrinks the GPU nodes of a job.

The reconcile loop depends on this one Protocol (after Karpenter's ``CloudProvider``). Providers
are registered by name in :mod:`gpuscaler.cloud.registry` and chosen by
``GPUSCALER_PROVIDER_NAME``: ``kwok`` (fake nodes in the dev cluster and tests) and ``static``
(existing nodes; only node selectors and tolerations); eks, gke, karpenter and clusterapi plug in
the same way.

Contract shared by every method:

- idempotent and restart-safe: node names are deterministic (:func:`node_names`), creation is
  create-if-absent, so calling again after a crash never doubles nodes;
- non-blocking: a method asks the cloud and returns; the loop observes readiness on later calls;
- errors are typed (:class:`ProviderError` and subclasses), wrapping their cause with
  ``raise ... from err``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from gpuscaler.catalog import CapacityType, InstanceType
from gpuscaler.errors import ErrorKind, TemporaryError

JOB_LABEL = "gpuscaler.io/job"
"""On nodes and pods of a job: ``<namespace>.<name>`` (shortened with a hash when too long)."""
PRICE_ANNOTATION = "gpuscaler.io/usd-per-hour"
"""On nodes a provider created: the node's price per hour at its capacity type (for cost so far)."""
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"


CAPACITY_RETRY_DELAY_S = 30.0
"""Seconds before retrying after the cloud ran out of capacity (capacity comes back in minutes,
not seconds; a shorter retry only spends API calls)."""


class ProviderError(TemporaryError, RuntimeError):
    """The provider could not do what was asked; the message says what and why."""


class InsufficientCapacityError(ProviderError):
    """The cloud has fewer nodes of the offering than asked for (retry later or elsewhere)."""

    retry_delay_s = CAPACITY_RETRY_DELAY_S


class UnknownProviderError(ProviderError):
    """No provider registered under that name (kind ``INVALID_INPUT``: the setting must change)."""

    kind = ErrorKind.INVALID_INPUT


@dataclass(frozen=True)
class JobRef:
    """The job a node pool belongs to."""

    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def label(self) -> str:
        """The value of :data:`JOB_LABEL` (a label value: at most 63 characters)."""
        return job_label_value(self.namespace, self.name)


@dataclass(frozen=True)
class NodeRequest:
    """What the plan needs: ``count`` nodes of ``instance`` at ``capacity``."""

    job: JobRef
    instance: InstanceType
    capacity: CapacityType
    count: int
    usd_per_hour_per_node: float

    @property
    def pool_id(self) -> str:
        """Short stable hash of job + offering: a re-plan onto another offering gets other names."""
        text = f"{self.job.key}/{self.instance.name}/{self.capacity.value}"
        return hashlib.sha256(text.encode()).hexdigest()[:6]


@dataclass(frozen=True)
class NodeState:
    """One node of a job as observed."""

    name: str
    instance_type: str
    capacity_type: str
    ready: bool
    created: datetime | None
    usd_per_hour: float
    deleting: bool = False
    interrupted: str | None = None
    """Why the node is going away (spot reclaim taint, annotation), None when it is not."""


@dataclass(frozen=True)
class Scheduling:
    """What worker pods need to land on the job's nodes."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, str]] = field(default_factory=list)


class NodePoolProvider(Protocol):
    """Grows and shrinks the nodes of a job."""

    name: str
    manages_nodes: bool
    """True when the job's nodes are the provider's, made or adopted for the job (kwok, eks, gke,
    clusterapi, karpenter): the loop releases them and treats a worker whose node vanished as
    interrupted. False for providers that only steer pods onto existing nodes (``static``): the
    loop then skips waiting for nodes and measures the gang timeout on pod scheduling instead."""
    names_nodes: bool
    """True when the job's nodes get the names of :func:`node_names` (kwok creates them so); the
    loop then knows them by name. False when the cloud names them (eks, gke and clusterapi adopt
    what their node groups register; Karpenter names its own): the loop knows the job's nodes by
    their offering (instance type and capacity type) instead."""
    provisions_for_pods: bool
    """True when the provider creates capacity in response to *pending pods* (Karpenter): the loop
    still calls :meth:`ensure_nodes` first (to prepare the provider's own objects, e.g. the
    NodePool), then creates the worker pods at once instead of waiting for Ready nodes, and
    measures the gang timeout on the pods being scheduled and Running. False for every provider that makes the nodes itself
    before the pods exist (kwok, eks, gke, clusterapi) and for ``static``."""

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        """Create the request's nodes that do not exist yet; return the names created now.

        Called by the loop for every provider when a gang starts and, for providers that make
        their nodes before the pods (``provisions_for_pods`` False), on each step until the nodes
        are Ready. A provider that provisions for pods prepares its objects here and returns ``[]``.

        Args:
            request: The offering and node count of the plan.
            existing: The job's nodes as observed (from the operator's node index).

        Raises:
            InsufficientCapacityError: the cloud could not supply them all (some may have been made;
                the caller waits for the gang timeout and then releases them).
            ProviderError: any other failure, with its cause.
        """
        ...

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        """Delete the given nodes of ``job`` (already-gone nodes are fine); return the names deleted.

        Raises:
            ProviderError: the cloud refused, with its cause.
        """
        ...

    def scheduling(self, request: NodeRequest) -> Scheduling:
        """Node selector and tolerations that put one worker on each of the request's nodes."""
        ...


_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def job_label_value(namespace: str, name: str) -> str:
    """``<namespace>.<name>`` as a label value; over 63 characters it is cut and given a hash."""
    value = _LABEL_BAD.sub("-", f"{namespace}.{name}")
    if len(value) <= 63:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{value[:54].rstrip('-_.')}-{digest}"


def node_names(request: NodeRequest) -> list[str]:
    """Deterministic node names of a request: ``<job>-<hash>-<i>`` (at most 63 characters)."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", request.job.name.lower())[:48].strip("-")
    return [f"{prefix}-{request.pool_id}-{i}" for i in range(request.count)]


INTERRUPTION_TAINTS = {
    "aws-node-termination-handler/spot-itn": "AWS spot interruption notice",
    "aws-node-termination-handler/rebalance-recommendation": "AWS rebalance recommendation",
    "karpenter.sh/disrupted": "Karpenter disruption",
    "cloud.google.com/impending-node-termination": "GKE node termination",
}
"""Node taints that announce the node's end, and what they mean."""
INTERRUPTION_ANNOTATION = "gpuscaler.io/interruption-notice"
"""Node annotation for any other notice (its value is the reason)."""


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def node_state(node: dict[str, object]) -> NodeState:
    """A :class:`NodeState` from a Node object as a plain dict (a watch event body)."""
    meta: dict[str, object] = node.get("metadata") or {}  # type: ignore[assignment]
    spec: dict[str, object] = node.get("spec") or {}  # type: ignore[assignment]
    status: dict[str, object] = node.get("status") or {}  # type: ignore[assignment]
    labels: dict[str, str] = meta.get("labels") or {}  # type: ignore[assignment]
    ann: dict[str, str] = meta.get("annotations") or {}  # type: ignore[assignment]
    conds: list[dict[str, str]] = status.get("conditions") or []  # type: ignore[assignment]
    taints: list[dict[str, str]] = spec.get("taints") or []  # type: ignore[assignment]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds) and not any(
        t.get("key") == "node.kubernetes.io/not-ready" for t in taints
    )
    interrupted = ann.get(INTERRUPTION_ANNOTATION)
    for t in taints:
        if t.get("key") in INTERRUPTION_TAINTS:
            interrupted = INTERRUPTION_TAINTS[t["key"]]
    try:
        price = float(ann.get(PRICE_ANNOTATION, "0"))
    except ValueError:
        price = 0.0
    return NodeState(
        name=str(meta.get("name", "")),
        instance_type=labels.get(INSTANCE_TYPE_LABEL, ""),
        capacity_type=labels.get(CAPACITY_TYPE_LABEL, ""),
        ready=ready,
        created=_parse_time(meta.get("creationTimestamp")),  # type: ignore[arg-type]
        usd_per_hour=price,
        deleting=bool(meta.get("deletionTimestamp")),
        interrupted=interrupted,
    )
