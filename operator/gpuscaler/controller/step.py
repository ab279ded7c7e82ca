"""What one reconcile step works on: the job, the step's context and outcome, the loop's settings, and the
pure rules the phases share (plan status, preemption evidence, node cost, which status changes are written).

Split out of :mod:`gpuscaler.controller.reconcile` (which re-exports every name) so that the phase
sub-reconcilers (:mod:`gpuscaler.controller.phases`) import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Protocol

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.events import Event, set_condition
from gpuscaler.api.status import PlanStatus, TrainingJobStatus
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, KIND
from gpuscaler.cloud import JobRef, NodeState
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller.policy import Governance
from gpuscaler.controller.prices import PriceLog
from gpuscaler.kube.workers import PodState
from gpuscaler.planner import PlanResult
from gpuscaler.planner.held import held_placement, plan_segments
from gpuscaler.runtime import constants as rc
from gpuscaler.settings import Settings

COST_REFRESH_S = 30.0
"""A job holding nodes is stepped at least this often (its cost, ETA and observed performance move
with time); the step writes cost and ETA alone at most every ``settings.status_refresh_s``
(:func:`status_change`)."""


class WorkerClient(Protocol):
    """What the loop needs from :class:`gpuscaler.kube.client.Workers`."""

    def create_if_absent(self, body: dict[str, Any]) -> bool: ...
    def delete_pod(self, namespace: str, name: str) -> bool: ...
    def delete_service(self, namespace: str, name: str) -> bool: ...
    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None: ...


@dataclass(frozen=True)
class Job:
    """The TrainingJob as the loop sees it."""

    namespace: str
    name: str
    uid: str
    generation: int
    created: datetime
    spec: TrainingJobSpec
    labels: Mapping[str, str] = field(default_factory=dict)
    """The TrainingJob's labels (the ``kueue.x-k8s.io/queue-name`` label names its queue)."""

    @property
    def ref(self) -> JobRef:
        return JobRef(self.namespace, self.name)

    @property
    def owner(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass
class Outcome:
    """What one step decided: the new status and the events to post."""

    status: TrainingJobStatus
    events: list[Event] = field(default_factory=list)
    planned: bool = False
    plan_seconds: float = 0.0
    released: set[str] = field(default_factory=set)
    """Nodes deleted in this step (their cost moved to ``releasedCostUsd``)."""


@dataclass
class LoopConfig:
    """The settings the loop reads: a subset of :class:`gpuscaler.settings.Settings`, where their
    defaults and reasons are (built by :meth:`from_settings`, never spelled again here)."""

    gang_timeout_s: float
    """Seconds to wait for all planned nodes (or workers) before releasing them and re-planning."""
    progress_event_after_s: float
    """A gang up within this many seconds of its request posts no Event on the way (:mod:`gpuscaler.controller.bringup`)."""
    capacity_backoff_s: float
    """Seconds an offering that ran short of capacity is left out of plans."""
    kueue_quota_fallback: bool
    """Queued jobs: re-plan without an offering whose Kueue flavor has no quota left (queueing.no_quota)."""
    backoff_limit: int
    """Worker failures retried before the job is Failed."""
    master_port: int
    """Rendezvous port of worker rank 0."""
    default_image: str
    """Worker image when the job's template gives none."""
    spot: spot.SpotConfig
    """Interruption handling (:mod:`gpuscaler.controller.interruptions`)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> LoopConfig:
        """The loop's values in ``settings``."""
        values = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name != "spot"}
        return cls(**values, spot=spot.SpotConfig.from_settings(settings))


def format_duration(seconds: float) -> str:
    """``7980`` -> ``2h13m``; ``50`` -> ``50s``."""
    s = max(0, round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s" if m < 10 else f"{m}m"
    return f"{s}s"


def plan_status(result: PlanResult, generation: int, now: datetime) -> PlanStatus:
    """The status form of the planner's chosen candidate."""
    c = result.chosen
    assert c is not None
    return PlanStatus(
        instance_type=c.instance.name,
        provider=c.instance.provider,
        region=c.instance.region,
        zone=c.zone,
        gpu_type=c.instance.gpu_id,
        gpus_per_node=c.instance.gpu_count,
        nodes=c.nodes,
        gpus=c.gpus,
        capacity_type=c.capacity.value,
        held_capacity=c.pool,
        **held_placement(result, c),
        segments=plan_segments(c, now),
        precision=c.precision.value,
        micro_batch=c.micro_batch,
        accumulation=c.accumulation,
        usd_per_hour=round(c.usd_per_hour, 4),
        price_source=c.price_source,
        price_date=c.price_date,
        expected_hours=round(c.expected_hours, 4),
        expected_cost_usd=round(c.expected_cost_usd, 2),
        checkpoint_interval_seconds=round(c.outlook.interval_s),
        total_samples=result.job.total_samples,
        throughput=round(c.estimate.throughput, 3),
        throughput_p10=round(c.band.p10, 3) if c.band else None,
        throughput_p90=round(c.band.p90, 3) if c.band else None,
        throughput_log_sigma=round(c.outlook.log_sigma, 4),
        p90_hours=round(c.p90_hours, 4),
        p90_cost_usd=round(c.p90_cost_usd, 2),
        deadline_miss_probability=round(c.outlook.deadline_miss_probability, 4),
        why=result.why,
        trial=result.trial,
        summary=c.label,
        planned_at=now,
        generation=generation,
        efficiency_factor=round(c.prior.factor, 4) if c.prior else 1.0,
        throughput_source=c.throughput_source if result.profiles else None,
    )


@dataclass
class StepContext:
    """One step of one job: what the loop observed, what it decides, and when.

    Built once by :meth:`Reconciler.step`; every phase method takes it instead of the same
    job, status, pods, nodes, outcome and clock reading.
    """

    job: Job
    status: TrainingJobStatus
    """The status being decided: a deep copy of the one read, the same object as ``out.status``."""
    pods: list[PodState]
    """The job's worker pods (pods another job with the same name owned are left out)."""
    nodes: list[NodeState]
    """Every node of the job as observed, priced (the current plan's and an earlier plan's)."""
    now: datetime
    """The clock, read once per step."""
    out: Outcome
    governance: Governance | None = None
    """The policy governing the job and its namespace's usage (None: no policy, as the CLI plans)."""

    def condition(self, ctype: str, status: bool, reason: str, message: str) -> None:
        """Set a condition of the status now, at the job's generation (:func:`set_condition`)."""
        set_condition(self.status, ctype, status, reason, message, self.now, self.job.generation)

    def event(self, type_: str, reason: str, message: str) -> None:
        """Post an Event with this step's outcome."""
        self.out.events.append(Event(type_, reason, message))


def preemption(pod: PodState, *, node_going: bool = False) -> str | None:
    """Why a failed worker pod was preempted rather than failed, or None for a real failure.

    Only the operator's own evidence counts, never what the worker says of itself: its exit code
    (75, or the launcher's 1 after its workers exited 75) and its ``runtime-phase=preempted``
    annotation are the container's to choose, so a crashing worker could claim them and never
    reach ``backoffLimit``. In this order: the operator's own checkpoint request on the pod (it
    sent the notice; the workers may not write that annotation), answered or not; the pod's
    ``DisruptionTarget`` condition (set by the API server's eviction, the scheduler's preemption,
    the kubelet's graceful node shutdown: pod status the worker's Role cannot write); the pod
    being deleted (``deletionTimestamp``: the worker's Role cannot delete); its node under a
    notice, being deleted or gone. A Kueue eviction is handled before this is asked
    (:func:`gpuscaler.controller.queueing.evicted`). What the worker reported is added to the
    reason as a detail.

    Args:
        pod: A failed worker pod.
        node_going: Whether the pod's node is under an interruption notice or being deleted.

    Returns:
        The reason, for the status message and the Interrupted event.
    """
    said = f", exit code {pod.exit_code}" + (
        f", runtime {rc.RUNTIME_PHASE_PREEMPTED}" if pod.runtime_phase == rc.RUNTIME_PHASE_PREEMPTED else ""
    )
    if pod.checkpoint_requested:
        acked = pod.checkpoint_ack == pod.checkpoint_requested
        return f"after the operator's checkpoint request {pod.checkpoint_requested}" + (" (acknowledged)" if acked else "") + said
    if pod.disruption is not None:
        return f"DisruptionTarget: {pod.disruption}{said}"
    if pod.deleting:
        return f"the pod was being deleted{said}"
    if node_going:
        return f"its node {pod.node} is going{said}"
    return None


def _node_cost(node: NodeState, now: datetime, log: PriceLog | None = None) -> float:
    if node.created is None:
        return 0.0
    if log is not None and (at_prices_in_force := log.node_cost(node, node.region, now)) is not None:
        return at_prices_in_force
    hours = max((now - node.created).total_seconds(), 0) / 3600
    return hours * node.usd_per_hour


SHOWN_CLOCK_FIELDS = ("costUsd", "eta")
"""The status fields that move with time alone and that ``kubectl get`` shows (COST to the cent, as
:meth:`Reconciler._cost` rounds it, and ETA as :func:`format_duration` writes it)."""
CLOCK_FIELDS = (*SHOWN_CLOCK_FIELDS, "estimatedCompletionTime")
"""Every field that moves with time alone; ``estimatedCompletionTime`` shifts by seconds as the
throughput estimate does and is written with the next change of the others."""


def status_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``none``, ``clock`` (only what time moves changed, and cost or ETA as shown did) or ``state``.

    The handler writes ``clock`` changes at most every ``settings.status_refresh_s`` seconds.
    """
    a = {k: v for k, v in old.items() if k not in CLOCK_FIELDS}
    b = {k: v for k, v in new.items() if k not in CLOCK_FIELDS}
    if a != b:
        return "state"
    if all(old.get(k) == new.get(k) for k in SHOWN_CLOCK_FIELDS):
        return "none"
    return "clock"
