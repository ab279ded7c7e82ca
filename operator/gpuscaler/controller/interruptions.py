"""Spot interruptions: detect a node's notice, checkpoint within it, re-plan what is left, resume.

Called by :class:`gpuscaler.controller.reconcile.Reconciler` (its Running, Checkpointing, Recovering
and Starting phases). The signals on a node are read by :func:`gpuscaler.cloud.nodes.node_state`
from its table :data:`~gpuscaler.cloud.nodes.NOTICE_SOURCES`; here is what they mean for the job. Nothing here talks to the API server except through the worker client the
loop passes in; what is decided is kept in the job's status (``notice``, ``interruptionHistory``,
``unavailable``), so a restarted operator carries on where it was.

The sequence, for a notice with a deadline (AWS spot-itn: 2 min; GKE: 30 s)::

    Running --notice--> Checkpointing: gpuscaler.io/checkpoint-requested=<id> on every worker
            --rank 0 acks <id> (or the workers exit, or the deadline passes)--> Recovering:
              record {time, node, signal, checkpointStep}, leave the reclaimed spot offering out
              of plans for settings.interruption_backoff_s, delete the workers (SIGTERM: the
              runtime saves once more and exits 75), release the noticed node
            --old workers gone--> re-plan the REMAINING samples in the REMAINING hours within the
              REMAINING budget by the one recovery rule (gpuscaler.planner.recovery, shared with
              the simulator): same capacity elsewhere, another instance type, on-demand (after
              policy.spot.maxInterruptions, below policy.spot.minHoursToDeadline, or when another
              reclaim would miss the deadline), the surviving nodes with more accumulation, or
              the fastest sensible finish when no plan meets the deadline
            --> Provisioning --> Starting --> Running ("Recovered": recoverySeconds, lostSteps)

A hard loss (the node deleted or NotReady past the grace period, a worker exiting 75 with no
notice) skips the handshake and resumes from the last periodic checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Protocol

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.events import Event
from gpuscaler.api.status import (
    InterruptionRecord,
    NoticeStatus,
    PlanStatus,
    TrainingJobStatus,
    UnavailableOffering,
)
from gpuscaler.catalog import CapacityType
from gpuscaler.cloud.nodes import (
    CAPACITY_WINDOW_END,
    NOTICE_SOURCES,
    SOURCES,
    NodeState,
    NoticeSource,
    Signal,
    parse_time,
)
from gpuscaler.controller.policy import Governance
from gpuscaler.kube.reports import asked_step, trusted_report
from gpuscaler.kube.workers import PodState
from gpuscaler.names import EventReason
from gpuscaler.planner import Interrupted, PlanResult, Situation, recover
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.policy.models import SpotRules
from gpuscaler.runtime import constants as rc
from gpuscaler.settings import Settings

HISTORY_LIMIT = 20
"""Interruption records kept in the status (the count keeps going)."""




class Planner(Protocol):
    """The loop's planner (the reconcile loop and the re-plan after a notice share it).

    (spec, name, hours left to the deadline, unavailable offerings[, efficiency per GPU id]
    [, governance]) -> plan. ``efficiency`` (observed / model throughput per GPU id, from
    ``status.observed``) is passed only when the job has one, so a four-argument planner still
    serves jobs that were never observed; ``governance`` (the policy in force and the namespace's
    usage, :class:`gpuscaler.controller.policy.Governance`) only when the handler passed one to
    the step, so a planner that knows no policy serves an ungoverned loop; ``profiles`` (the
    performance profiles of the job's namespace, :mod:`gpuscaler.planner.profiles`) only when there are some.
    """

    def __call__(  # implemented by gpuscaler.controller.policy.gated_plan (with its catalog bound)
        self, spec: TrainingJobSpec, name: str, deadline_h: float | None, unavailable: frozenset[tuple[str, ...]], /,
        efficiency: Mapping[str, float] | None = None, governance: Governance | None = None,
        profiles: ProfileStore | None = None,
    ) -> PlanResult: ...


@dataclass(frozen=True)
class SpotConfig:
    """The settings of interruption handling: the "Spot interruptions" group of
    :class:`gpuscaler.settings.Settings`, where their defaults and reasons are (built by
    :meth:`from_settings`, never spelled again here)."""

    interruption_backoff_s: float
    """Seconds a reclaimed spot offering is left out of re-plans."""
    node_not_ready_grace_s: float
    """Seconds a job's node may be NotReady before it counts as lost."""
    soft_notice_wait_s: float
    """Longest wait for the checkpoint ack after a notice with no deadline."""
    annotation_notice_s: float
    """Notice of an interruption annotation that gives no deadline timestamp."""
    checkpoint_write_max_s: float
    """Longest a worker's reported checkpoint write keeps ``karpenter.sh/do-not-disrupt`` on its pods."""
    preemption_cost_refresh_s: float
    """Oldest the published work at risk may get (:mod:`gpuscaler.controller.preemption`)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> SpotConfig:
        """The group's values in ``settings``."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


# ------------------------------------------------------------------------------ detection


@dataclass(frozen=True)
class Notice:
    """The interruption of one node, as the loop acts on it."""

    node: str
    source: NoticeSource
    detail: str
    deadline: datetime | None
    """When the node goes; None for a soft notice."""

    @property
    def hard(self) -> bool:
        """No time for a checkpoint (notice 0): resume from the last periodic one."""
        return self.source.notice_s == 0

    def describe(self) -> str:
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.source.meaning}{extra}"


def _deadline(sig: Signal, src: NoticeSource, now: datetime, cfg: SpotConfig) -> datetime | None:
    if src.kind == "annotation":
        at = parse_time(sig.value)
        return at if at is not None else now + timedelta(seconds=cfg.annotation_notice_s)
    if src.notice_s is None:
        return None
    return (sig.since or now) + timedelta(seconds=src.notice_s) if src.notice_s else now


def node_notice(node: NodeState, now: datetime, cfg: SpotConfig) -> Notice | None:
    """The most urgent interruption of one node now, or None (see :data:`NOTICE_SOURCES`)."""
    signals = node.signals
    best: tuple[float, int, Notice] | None = None
    for sig in signals:
        src = SOURCES[sig.signal]
        if src.kind == "not-ready":
            since = sig.since or now
            if (now - since).total_seconds() < cfg.node_not_ready_grace_s:
                continue
        dl = _deadline(sig, src, now, cfg)
        detail = sig.value if src.kind in ("annotation", "not-ready") else ""
        key = (dl.timestamp() if dl else float("inf"), NOTICE_SOURCES.index(src))
        if best is None or key < best[:2]:
            best = (*key, Notice(node.name, src, detail, dl))
    return best[2] if best else None


def detect(nodes: Iterable[NodeState], now: datetime, cfg: SpotConfig) -> Notice | None:
    """The most urgent notice among the job's nodes (earliest deadline), or None."""
    found = [n for n in (node_notice(x, now, cfg) for x in nodes) if n is not None]
    if not found:
        return None
    return min(found, key=lambda n: (n.deadline.timestamp() if n.deadline else float("inf"), n.node))


# ------------------------------------------------------------------------------ the handshake


def request_id(now: datetime, attempt: int) -> str:
    """The checkpoint request id: time and gang attempt, unique per notice."""
    return f"{now.strftime('%Y%m%dT%H%M%S')}-{now.microsecond // 1000:03d}-a{attempt}"


def ask_for_checkpoint(pods: list[PodState], rid: str, annotate: Callable[[str, dict[str, str]], None]) -> None:
    """Write the checkpoint request ``rid`` (``gpuscaler.io/checkpoint-requested``) on every worker still
    running; the runtime answers it at its next step boundary. A spot notice's handshake asks so, and
    so does a re-plan for the deadline (:mod:`gpuscaler.controller.phases.plan`)."""
    for p in pods:
        if not p.deleting and not p.succeeded and not p.failed:
            annotate(p.name, {rc.ANNOTATION_CHECKPOINT_REQUESTED: rid})


def begin_handshake(
    st: TrainingJobStatus,
    notice: Notice,
    pods: list[PodState],
    annotate: Callable[[str, dict[str, str]], None],
    now: datetime,
) -> list[Event]:
    """Ask every live worker for a checkpoint now (phase Checkpointing), or note a hard loss.

    Args:
        st: The status (``notice`` is set).
        notice: What was detected.
        pods: The job's worker pods.
        annotate: ``annotate(pod_name, annotations)``.
        now: The time.

    Returns:
        The Interrupted event.
    """
    rid = request_id(now, st.attempt)
    asked = asked_step(st, pods, now)  # this attempt's step, not the highest ever (after a node loss it is lower)
    st.notice = NoticeStatus(
        node=notice.node,
        signal=notice.source.signal,
        reason=notice.describe(),
        noticed_at=now,
        deadline=notice.deadline,
        request_id="" if notice.hard else rid,
        progress_step=asked,
    )
    when = (
        "no notice: resuming from the last periodic checkpoint"
        if notice.hard
        else f"checkpoint requested ({rid}), "
        + (
            f"{(notice.deadline - now).total_seconds():.0f} s to the deadline"
            if notice.deadline
            else "no deadline"
        )
    )
    if not notice.hard:
        ask_for_checkpoint(pods, rid, annotate)
    st.message = f"node {notice.node}: {notice.describe()}; {when}"
    if notice.source.kind == "window":  # the end of a held capacity window: planned, not a failure
        return [Event("Normal", EventReason.PLANNED_MOVE, st.message)]
    return [Event("Warning", EventReason.INTERRUPTED, st.message)]


def handshake_done(
    st: TrainingJobStatus, pods: list[PodState], now: datetime, cfg: SpotConfig
) -> tuple[bool, bool]:
    """Whether to stop waiting for the checkpoint, and whether it was acknowledged.

    Done when the writer rank (it answers for the job) acknowledged the request with a checkpoint
    that answers it: at or after the step it asked at, or completed after the request
    (:func:`gpuscaler.kube.reports.trusted_report`: an ack with no checkpoint since does not
    count), when every worker has exited, or when the notice's deadline (a soft notice:
    ``soft_notice_wait_s``) passed.
    """
    n = st.notice
    if n is None or not n.request_id:
        return True, False
    live = [p for p in pods if not p.deleting and not p.succeeded]
    acked = trusted_report(st, pods, now).acked
    exited = all(p.failed for p in live)
    limit = n.deadline or n.noticed_at + timedelta(seconds=cfg.soft_notice_wait_s)
    return acked or exited or now >= limit, acked


def record(
    st: TrainingJobStatus,
    *,
    node: str,
    signal: str,
    acked: bool,
    now: datetime,
    cfg: SpotConfig,
) -> list[Event]:
    """Count the interruption, add its record and back off the reclaimed spot offering.

    The record's ``checkpointStep``/``lostSteps`` are filled when the old workers are gone
    (:func:`settle_loss`) and refined when the new ones report where they resumed.
    """
    plan = st.plan
    when = st.notice.noticed_at if st.notice is not None else now
    if signal != CAPACITY_WINDOW_END:  # a planned move does not count against spot.maxInterruptions
        st.interruptions += 1
    st.interruption_history.append(
        InterruptionRecord(
            time=when,
            node=node,
            signal=signal,
            instance_type=plan.instance_type if plan else "",
            capacity_type=plan.capacity_type if plan else "",
            checkpoint_acked=acked,
            checkpoint_step=st.progress.checkpoint_step,
            step_reached=st.progress.step,
        )
    )
    st.interruption_history = st.interruption_history[-HISTORY_LIMIT:]
    st.notice = None
    if plan is not None and plan.capacity_type == CapacityType.SPOT.value and cfg.interruption_backoff_s > 0:
        st.unavailable = [
            u
            for u in st.unavailable
            if (u.instance_type, u.capacity_type, u.zone) != (plan.instance_type, plan.capacity_type, plan.zone)
        ]
        st.unavailable.append(
            UnavailableOffering(
                instance_type=plan.instance_type,
                capacity_type=plan.capacity_type,
                zone=plan.zone,
                until=now + timedelta(seconds=cfg.interruption_backoff_s),
                reason=f"spot reclaim of {node} ({signal})",
            )
        )
    step = st.progress.checkpoint_step
    text = f"{signal} on {node}: " + (
        f"checkpoint at step {step} confirmed"
        if acked
        else f"resuming from the last checkpoint (step {step or 0})"
    )
    return [Event("Normal" if acked else "Warning", EventReason.CHECKPOINTED if acked else "CheckpointMissed", text)]


def open_record(st: TrainingJobStatus) -> InterruptionRecord | None:
    """The latest interruption not recovered from yet."""
    last = st.interruption_history[-1] if st.interruption_history else None
    return last if last is not None and last.recovery_seconds is None else None


def settle_loss(st: TrainingJobStatus) -> None:
    """With the old workers gone: the checkpoint resumed from and the steps lost, as reported."""
    rec = open_record(st)
    if rec is None:
        return
    rec.step_reached = max(rec.step_reached, st.progress.step)
    rec.checkpoint_step = st.progress.checkpoint_step
    rec.lost_steps = max(rec.step_reached - (rec.checkpoint_step or 0), 0)


def refine_loss(st: TrainingJobStatus, pods: list[PodState], now: datetime) -> None:
    """The new gang reports the checkpoint it resumed from: the exact loss of the latest record.

    A worker's ``checkpoint-step`` is the step it resumed from until its next checkpoint, one
    interval later; so this looks only until 0.9 of an interval after the recovery. It matters
    when the workers' last checkpoint (the one on SIGTERM) was saved but not reported.
    """
    if not st.interruption_history or st.plan is None:
        return
    rec = st.interruption_history[-1]
    if rec.lost_steps is None:
        return
    if rec.recovery_seconds is not None:
        settled = rec.time + timedelta(
            seconds=rec.recovery_seconds + 0.9 * st.plan.checkpoint_interval_seconds
        )
        if now > settled:
            return
    resumed = trusted_report(st, pods, now).checkpoint_step  # the writer's, of this attempt, within the plan
    if resumed is None or (rec.checkpoint_step is not None and resumed <= rec.checkpoint_step):
        return
    before = rec.lost_steps
    rec.checkpoint_step = resumed
    rec.lost_steps = max(rec.step_reached - rec.checkpoint_step, 0)
    if rec.recovery_seconds is not None:
        st.lost_steps = max(st.lost_steps + rec.lost_steps - before, 0)


def recovered(st: TrainingJobStatus, now: datetime) -> str:
    """The new gang runs: close the open record (recovery time, lost work). Returns a summary."""
    rec = open_record(st)
    if rec is None:
        return ""
    if rec.lost_steps is None:
        settle_loss(st)
    rec.recovery_seconds = round(max((now - rec.time).total_seconds(), 0.0), 1)
    st.recovery_seconds = round(st.recovery_seconds + rec.recovery_seconds, 1)
    st.lost_steps += rec.lost_steps or 0
    return f"{rec.recovery_seconds:.0f} s after the {rec.signal} notice, {rec.lost_steps or 0} step(s) lost"


# ------------------------------------------------------------------------------ re-planning


@dataclass
class Replan:
    """The outcome of re-planning after an interruption."""

    result: PlanResult | None
    """The planner result whose ``chosen`` runs the rest (None, or ``chosen`` None: no plan now)."""
    action: str
    """What was chosen and why (the record's ``action``, the Replanned event)."""
    elastic: bool = False


def replan(
    spec: TrainingJobSpec,
    name: str,
    plan: PlanStatus,
    *,
    interruptions: int,
    done_samples: float,
    deadline_h: float | None,
    unavailable: frozenset[tuple[str, ...]],
    planner: Planner,
    survivors: int = 0,
    rules: SpotRules | None = None,
    efficiency: Mapping[str, float] | None = None,
    spent_usd: float = 0.0,
) -> Replan:
    """Plan the remaining work after an interruption: :func:`gpuscaler.planner.recovery.recover`.

    The rule (spot or on-demand, the budget left, the deadline-risk fallback, the survivors, the
    fastest finish when the deadline cannot be met) is the one the simulator's ``gpuscaler``
    strategy uses; this adapts the loop's planner and status to it.

    Args:
        spec: The job's spec.
        name: The job's name.
        plan: The plan that was interrupted (its total samples and offering).
        interruptions: Interruptions so far, this one included.
        done_samples: Samples in the checkpoint the job resumes from.
        deadline_h: Hours left to the deadline (None: no deadline).
        unavailable: Offerings in back-off, the reclaimed one included.
        planner: The loop's planner.
        survivors: Ready nodes of the plan not under notice (0: none to continue on).
        rules: Spot rules of the governing policy (None: the defaults).
        efficiency: Observed/model efficiency factors per GPU id (``status.observed.efficiency_by_gpu``):
            every planner call of the re-plan uses the corrected model (None or empty: the model as is).
        spent_usd: What the job has cost so far (``status.costUsd``): the budget left is the rest's.

    Returns:
        The new plan result (None when no plan) and the reason.
    """
    factors = dict(efficiency or {})

    def call(s: TrainingJobSpec, dl: float | None, un: frozenset[tuple[str, ...]]) -> PlanResult:
        if factors:
            return planner(s, name, dl, un, efficiency=factors)
        return planner(s, name, dl, un)

    situation = Situation(
        spec=spec,
        total_samples=plan.total_samples,
        done_samples=done_samples,
        interrupted=Interrupted(plan.instance_type, plan.capacity_type, plan.nodes, plan.gpus_per_node),
        interruptions=interruptions,
        deadline_h=deadline_h,
        spent_usd=spent_usd,
        unavailable=unavailable,
        survivors=survivors,
        rules=rules or SpotRules(),
    )
    rec = recover(situation, call)
    result = rec.result
    if result is not None and rec.chosen is not None and rec.chosen is not result.chosen:
        result = replace(result, chosen=rec.chosen, why=rec.action)
    return Replan(result, rec.action, elastic=rec.elastic)
