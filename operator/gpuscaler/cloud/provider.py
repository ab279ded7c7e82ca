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

from gpuscaler import names
from gpuscaler.catalog import CapacityType, InstanceType
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.errors import ErrorKind, TemporaryError

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


def cloud_error(message: str, *, no_capacity: bool) -> ProviderError:
    """The error of a failed cloud call: :class:`InsufficientCapacityError` when the cloud said it
    has no capacity of the offering (the loop backs off and may plan elsewhere), else
    :class:`ProviderError`."""
    return InsufficientCapacityError(message) if no_capacity else ProviderError(message)


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
    """What the plan needs: ``count`` nodes of ``instance`` at ``capacity``, in ``zone``."""

    job: JobRef
    instance: InstanceType
    capacity: CapacityType
    count: int
    usd_per_hour_per_node: float
    zone: str = ""
    """The availability zone to create the nodes in (the plan's); "" = any zone of the region."""
    pool: str = ""
    """The held capacity pool the nodes come from (a policy's ``capacity``; docs/capacity.md), '' for none."""
    reservation_id: str = ""
    """The cloud's id of that pool (an EC2 capacity reservation), '' when not declared."""
    window_start: datetime | None = None
    """When the pool's window opens (a capacity block), None for capacity usable now."""
    window_end: datetime | None = None
    """When it closes (a block's end, a reservation's expiry), None for no end."""

    @property
    def pool_id(self) -> str:
        """Short stable hash of job + offering (+ zone): a re-plan onto another offering or zone gets
        other names."""
        text = f"{self.job.key}/{self.instance.name}/{self.capacity.value}" + (f"/{self.zone}" if self.zone else "")
        return hashlib.sha256(text.encode()).hexdigest()[:6]

    def held_labels(self) -> dict[str, str]:
        """The labels of a held pool's nodes: the pool and its window in unix seconds (a node
        affinity can compare them with ``Gt``/``Lt``); empty for capacity bought by the hour."""
        if not self.pool:
            return {}
        out = {names.HELD_CAPACITY_LABEL: self.pool, names.CAPACITY_TYPE_KEY: self.capacity.value}
        if self.window_start is not None:
            out[names.CAPACITY_WINDOW_START_LABEL] = str(int(self.window_start.timestamp()))
        if self.window_end is not None:
            out[names.CAPACITY_WINDOW_END_LABEL] = str(int(self.window_end.timestamp()))
        return out

    def zone_selector(self) -> dict[str, str]:
        """The node selector that keeps workers in the request's zone (empty for any zone)."""
        return {names.ZONE_LABEL: self.zone} if self.zone else {}


@dataclass(frozen=True)
class Scheduling:
    """What worker pods need to land on the job's nodes."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, str]] = field(default_factory=list)


class NodePoolProvider(Protocol):
    """Grows and shrinks the nodes of a job."""

    name: str

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        """Create the request's nodes that do not exist yet; return the names created now.

        Called by the loop for every provider when a gang starts and, for providers that make
        their nodes before the workers (:meth:`workers_first` False), on each step until the
        nodes are Ready. A provider whose workers go first prepares its objects here (Karpenter's
        NodePool) and returns ``[]``.

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

    def owns(self, request: NodeRequest, node: NodeState) -> bool:
        """Whether an observed node of the job is one of ``request``'s (the current plan's).

        The loop releases the job's other nodes (an earlier plan's). Providers that name the nodes
        (kwok: :func:`node_names`) answer by name (:func:`owned_by_name`); providers whose cloud
        names them (eks, gke and clusterapi adopt what their node groups register; Karpenter names
        its own) by the offering, instance type and capacity type (:func:`owned_by_offering`).
        """
        ...

    def workers_first(self, request: NodeRequest) -> bool:
        """Whether the loop creates the workers as soon as :meth:`ensure_nodes` returned.

        True when the capacity comes for the pending worker pods (Karpenter) or already exists
        (``static``): the gang timeout then runs on the workers being scheduled and Running.
        False when the provider makes the nodes before the pods (kwok, eks, gke, clusterapi):
        the loop waits for ``request.count`` Ready nodes first.
        """
        ...

    def launches_for_workers(self, request: NodeRequest) -> bool:
        """Whether nodes for ``request`` appear because its workers are pending (Karpenter).

        The loop then reports them while the workers wait (``status.nodes``, the NodesReady
        condition and Event). False for every provider that makes its nodes itself or uses
        existing ones.
        """
        ...

    def node_gone(self, node: str, nodes: list[NodeState]) -> bool:
        """Whether the node a worker ran on is gone, given the job's nodes as observed.

        The loop counts such a worker interrupted (``node-deleted``). Providers whose nodes are
        the job's answer: it is not among them (:func:`gone_unless_observed`). ``static`` answers
        False: the job's workers run on nodes the job does not own and never observes.
        """
        ...


def owned_by_name(request: NodeRequest, node: NodeState) -> bool:
    """:meth:`NodePoolProvider.owns` of a provider that names the nodes (:func:`node_names`)."""
    return node.name in node_names(request)


def owned_by_offering(request: NodeRequest, node: NodeState) -> bool:
    """:meth:`NodePoolProvider.owns` of a provider whose cloud names the nodes: the offering (and
    the zone, when the request names one and the node says its zone)."""
    if request.zone and node.zone and node.zone != request.zone:
        return False
    return node.instance_type == request.instance.name and node.capacity_type in {
        request.capacity.value, karpenter_capacity(request.capacity)
    }


def karpenter_capacity(capacity: CapacityType) -> str:
    """``karpenter.sh/capacity-type`` of a capacity type: Karpenter knows on-demand, spot and
    reserved (a capacity block is reserved capacity of type ``capacity-block`` to it); flex-start
    it does not offer.

    Raises:
        ProviderError: flex-start (no Karpenter capacity type carries it).
    """
    if capacity is CapacityType.CAPACITY_BLOCK:
        return CapacityType.RESERVED.value
    if capacity is CapacityType.FLEX_START:
        raise ProviderError(
            "flex-start capacity has no karpenter.sh/capacity-type: plan it on GKE (a flex-start node pool) "
            "or leave it out of the policy's capacity for this cluster"
        )
    return capacity.value


def gone_unless_observed(node: str, nodes: list[NodeState]) -> bool:
    """:meth:`NodePoolProvider.node_gone` of a provider whose nodes are the job's own."""
    return node not in {n.name for n in nodes}


class MakesNodes:
    """The behaviour of a provider that makes a job's nodes before its workers and names them
    :func:`node_names` (kwok). Providers mix it in and override what differs."""

    def owns(self, request: NodeRequest, node: NodeState) -> bool:
        """See :meth:`NodePoolProvider.owns`: by name."""
        return owned_by_name(request, node)

    def workers_first(self, request: NodeRequest) -> bool:
        """See :meth:`NodePoolProvider.workers_first`: the nodes first."""
        return False

    def launches_for_workers(self, request: NodeRequest) -> bool:
        """See :meth:`NodePoolProvider.launches_for_workers`: no."""
        return False

    def node_gone(self, node: str, nodes: list[NodeState]) -> bool:
        """See :meth:`NodePoolProvider.node_gone`: the job's own nodes."""
        return gone_unless_observed(node, nodes)


class AdoptsNodes(MakesNodes):
    """The behaviour of a provider whose cloud names the job's nodes (a node group's, adopted by
    their offering: eks, gke, clusterapi)."""

    def owns(self, request: NodeRequest, node: NodeState) -> bool:
        """See :meth:`NodePoolProvider.owns`: by offering."""
        return owned_by_offering(request, node)


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
