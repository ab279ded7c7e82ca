"""The one reading of a Node: its state, price and every interruption signal it carries.

:func:`node_state` turns a Node object (a plain dict: a watch event body) into the
:class:`NodeState` every consumer uses: the operator's node index
(:mod:`gpuscaler.handlers.trainingjob`), the reconcile loop and its interruption handling
(:mod:`gpuscaler.controller`), the providers and their tests. The signals come from one table,
:data:`NOTICE_SOURCES`; how urgent each is and what the loop does about it is decided in
:mod:`gpuscaler.controller.interruptions`. Pure: dicts in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from gpuscaler import names

NODE_DELETED: Final = "node-deleted"
"""Signal: the Node object vanished with no notice (or a worker lost its node)."""
WORKER_PREEMPTED: Final = "worker-preempted"
"""Signal: a worker was preempted with no notice seen on its node."""
CAPACITY_WINDOW_END: Final = "capacity-window-end"
"""Signal: the held capacity window the job runs in closes (a planned move, not a failure)."""


@dataclass(frozen=True)
class NoticeSource:
    """One way a node announces its end, and how long the job then has."""

    signal: str
    """Short name recorded in the status and Events."""
    kind: Literal["taint", "annotation", "not-ready", "gone", "exit", "window"]
    key: str
    """Taint key or annotation key (empty when the kind says it all)."""
    notice_s: float | None
    """Seconds from the notice to the node's end; None: a soft notice (no deadline); 0: none at all."""
    meaning: str


NOTICE_SOURCES: tuple[NoticeSource, ...] = (
    # AWS EC2 spot interruption notice, turned into a taint by aws-node-termination-handler (IMDS or
    # queue mode). EC2 stops or terminates the instance two minutes after the notice.
    NoticeSource("aws-spot-itn", "taint", names.AWS_SPOT_ITN_TAINT, 120.0, "AWS spot interruption notice"),
    # GKE spot / preemptible VM preemption: GKE taints the node and the VM gets an ACPI soft-off;
    # it is gone 30 s later. The shortest notice there is: the handshake must fit in it.
    NoticeSource("gke-termination", "taint", names.GKE_TERMINATION_TAINT, 30.0, "GKE node termination (preemption)"),
    # Karpenter tainted the node before draining it (consolidation, drift, expiry, or its own spot
    # interruption handling). The drain SIGTERMs the workers, which then have their
    # terminationGracePeriodSeconds: 30 s by default.
    NoticeSource("karpenter-disrupted", "taint", names.KARPENTER_DISRUPTED_TAINT, 30.0, "Karpenter disruption"),
    # Anything else (a custom handler, a maintenance script, a test): the annotation's value is an
    # RFC 3339 deadline, or a reason; with a reason the notice is settings.annotation_notice_s.
    NoticeSource("annotation", "annotation", names.INTERRUPTION_ANNOTATION, 30.0, "interruption notice annotation"),
    # AWS rebalance recommendation: the instance is at elevated risk of a reclaim, with no deadline.
    # Checkpoint soon and move while moving is cheap (wait at most settings.soft_notice_wait_s).
    NoticeSource("aws-rebalance", "taint", names.AWS_REBALANCE_TAINT, None, "AWS rebalance recommendation"),
    # The node stopped reporting (NotReady past settings.node_not_ready_grace_s): its workers are
    # out of reach, so there is no handshake; resume from the last periodic checkpoint.
    NoticeSource("node-not-ready", "not-ready", "", 0.0, "node NotReady past the grace period"),
    # The Node object vanished with no notice (a hard loss; also a deletion with no taint before
    # it, as the job's nodes in deletion are already out of the gang): resume from the last
    # periodic checkpoint.
    NoticeSource(NODE_DELETED, "gone", "", 0.0, "node deleted without notice"),
    # A worker was preempted by what the operator itself sees (its pod has DisruptionTarget:
    # evicted, or its node drained; the pod deleted; its node going; the operator's own checkpoint
    # request), never by the worker's word alone (exit 75, runtime phase preempted): resume from
    # the last checkpoint (gpuscaler.controller.reconcile.preemption).
    NoticeSource(WORKER_PREEMPTED, "exit", "", 0.0, "worker preempted (DisruptionTarget, pod or node deleted, or the operator's request)"),
    # The capacity block (or expiring reservation) the plan runs in closes: the plan's own segment
    # says when (status.plan.segments[0].checkpointAt, a margin from the checkpoint's write time
    # before the window's end). Not a node's signal: the loop raises it from the plan
    # (gpuscaler.controller.windows); checkpoint, then continue on the next cheapest capacity.
    NoticeSource(CAPACITY_WINDOW_END, "window", "", None, "the held capacity window closes (a planned move)"),
)
"""Every interruption signal gpuscaler understands. When several apply to one node, the earliest
deadline wins (a soft notice has none); on a tie the earlier entry."""

SOURCES = {s.signal: s for s in NOTICE_SOURCES}


@dataclass(frozen=True)
class Signal:
    """One interruption signal on a node, as observed."""

    signal: str
    """The :attr:`NoticeSource.signal` of its source."""
    value: str = ""
    """The annotation's value, or the taint's value."""
    since: datetime | None = None
    """When the signal started, if the object says (taint timeAdded, NotReady transition time)."""


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
    signals: tuple[Signal, ...] = ()
    """Every interruption signal of :data:`NOTICE_SOURCES` the Node carries, in table order."""
    zone: str = ""
    """Its ``topology.kubernetes.io/zone`` label (empty when it has none)."""
    region: str = ""
    """Its ``topology.kubernetes.io/region`` label (empty when it has none)."""

    @property
    def interrupted(self) -> str | None:
        """Why the node is going away (a notice taint's meaning, the annotation's value), None
        when nothing announces its end (NotReady alone is not a notice)."""
        for sig in self.signals:
            src = SOURCES[sig.signal]
            if src.kind == "taint":
                return src.meaning
            if src.kind == "annotation":
                return sig.value or src.meaning
        return None


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 time of a Node's field or annotation (``Z`` or an offset), None when absent or unparsable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _signals(ann: dict[str, str], taints: list[dict[str, str]], conds: list[dict[str, str]]) -> tuple[Signal, ...]:
    found: list[Signal] = []
    for src in NOTICE_SOURCES:
        if src.kind == "taint":
            found += [
                Signal(src.signal, str(t.get("value") or ""), parse_time(t.get("timeAdded")))
                for t in taints
                if t.get("key") == src.key
            ]
        elif src.kind == "annotation" and src.key in ann:
            found.append(Signal(src.signal, str(ann[src.key])))
        elif src.kind == "not-ready":
            # Only acted on while the job runs, when every node of the gang has been Ready.
            ready = next((c for c in conds if c.get("type") == "Ready"), None)
            if ready is not None and ready.get("status") != "True":
                since = parse_time(ready.get("lastTransitionTime"))
                found.append(Signal(src.signal, str(ready.get("reason") or ""), since))
    return tuple(found)


def node_state(node: dict[str, object]) -> NodeState:
    """The :class:`NodeState` of a Node object as a plain dict (a watch event body).

    Args:
        node: The Node (``metadata``, ``spec.taints``, ``status.conditions``).

    Returns:
        Its name, offering (instance and capacity type labels), readiness (Ready and no
        not-ready taint), creation time, price (:data:`gpuscaler.names.PRICE_ANNOTATION`; 0 when
        absent or not a number), deletion, and its interruption signals.
    """
    meta: dict[str, object] = node.get("metadata") or {}  # type: ignore[assignment]
    spec: dict[str, object] = node.get("spec") or {}  # type: ignore[assignment]
    status: dict[str, object] = node.get("status") or {}  # type: ignore[assignment]
    labels: dict[str, str] = meta.get("labels") or {}  # type: ignore[assignment]
    ann: dict[str, str] = meta.get("annotations") or {}  # type: ignore[assignment]
    conds: list[dict[str, str]] = status.get("conditions") or []  # type: ignore[assignment]
    taints: list[dict[str, str]] = spec.get("taints") or []  # type: ignore[assignment]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds) and not any(
        t.get("key") == names.NOT_READY_TAINT_KEY for t in taints
    )
    try:
        price = float(ann.get(names.PRICE_ANNOTATION, "0"))
    except ValueError:
        price = 0.0
    return NodeState(
        name=str(meta.get("name", "")),
        instance_type=labels.get(names.INSTANCE_TYPE_LABEL, ""),
        capacity_type=labels.get(names.CAPACITY_TYPE_LABEL, ""),
        ready=ready,
        created=parse_time(meta.get("creationTimestamp")),
        usd_per_hour=price,
        deleting=bool(meta.get("deletionTimestamp")),
        signals=_signals(ann, taints, conds),
        zone=labels.get(names.ZONE_LABEL, ""),
        region=labels.get(names.REGION_LABEL, ""),
    )
