"""Kueue admission and JobSet workers in the reconcile loop (kopf-free; docs/kueue-jobset.md).

The loop (:mod:`gpuscaler.controller.reconcile`) calls in here at four points:

- :func:`enqueue`, when a gang is to begin: a job that names a LocalQueue (``spec.queueName`` or
  the ``kueue.x-k8s.io/queue-name`` label) does not provision; its gang is created as one
  suspended JobSet (whatever ``spec.runtime`` says: a queued gang is always a JobSet) carrying the queue label (:func:`gpuscaler.kube.jobset.jobset`) and the job
  goes ``Queued``, with the ResourceFlavor matching the plan in ``status.queue.expectedFlavor``.
- :func:`admission`, every step while ``Queued``: the gang's Workload says whether Kueue admitted
  it (then the loop provisions the planned nodes and the JobSet's pods, which Kueue has
  un-suspended, land on them) or why it waits, which goes to ``status.message`` and
  ``status.queue.reason`` (the ``Waiting`` printer column).
- :func:`evicted`, every step while the workers run: a Workload Kueue evicted or preempted is an
  interruption. Kueue suspends the JobSet, so its workers get SIGTERM, on which the runtime
  checkpoints (the same handshake as a spot notice without a notice); the loop counts it, deletes
  the JobSet, and the next gang goes back into the queue from that checkpoint.
- :func:`no_quota`, with the setting ``kueueQuotaFallback``: while the gang waits because the
  planned offering's flavor has no quota left, the loop withdraws it, leaves that offering out of
  plans for the capacity back-off and queues the next plan that meets the deadline (its ``why``
  says so); without a plan that does, the job waits for the back-off to end.
- :func:`start_jobset` / :func:`stop_jobset` instead of creating / deleting worker pods for
  ``runtime: jobset``: one JobSet per gang start, named per attempt, deleted (foreground: its Jobs
  and pods with it) when the gang stops, and re-created with the new shape after a re-plan. The
  JobSet is owned by the TrainingJob, so it is deleted with the job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gpuscaler.api.status import Phase, QueueStatus
from gpuscaler.api.trainingjob import WorkerRuntime, effective_queue
from gpuscaler.cloud import NodeRequest
from gpuscaler.kube import jobset as js
from gpuscaler.kube import kueue
from gpuscaler.kube.workers import WorkerPlan
from gpuscaler.names import EventReason

if TYPE_CHECKING:
    from gpuscaler.controller.reconcile import Job, StepContext


class GangClient(Protocol):
    """What the loop needs from :class:`gpuscaler.kube.gangs.Gangs` (Kueue and JobSet objects)."""

    def create_jobset(self, body: dict[str, Any]) -> bool: ...
    def delete_jobset(self, namespace: str, name: str) -> bool: ...
    def workload_of(self, namespace: str, owner_kind: str, owner_name: str) -> kueue.WorkloadState | None: ...
    def flavors(self) -> list[kueue.Flavor]: ...


def queue_of(job: Job) -> str | None:
    """The LocalQueue the job names, or None (validated with the spec: :func:`effective_queue`)."""
    try:
        return effective_queue(job.spec.queue_name, dict(job.labels))
    except ValueError:
        return None  # the API layer refused it already; a conflicting label never reaches a queue


def uses_jobset(job: Job) -> bool:
    """Whether the job's gang is a JobSet: ``runtime: jobset``, or any job with a queue (Kueue admits
    the gang as one JobSet, all or nothing)."""
    return job.spec.runtime is WorkerRuntime.JOBSET or queue_of(job) is not None


KUEUE_LABEL_PREFIX = "kueue.x-k8s.io/"
"""TrainingJob labels passed on to its JobSet (Kueue reads them there: priority-class, queue-name)."""


def start_jobset(gangs: GangClient, job: Job, wp: WorkerPlan, queue: str | None, max_restarts: int) -> bool:
    """Create the gang's JobSet (suspended for Kueue when ``queue``), with the job's ``kueue.x-k8s.io/``
    labels (a ``kueue.x-k8s.io/priority-class`` on the TrainingJob is the gang's priority); False
    when it was there."""
    labels = {k: v for k, v in job.labels.items() if k.startswith(KUEUE_LABEL_PREFIX)}
    return gangs.create_jobset(js.jobset(wp, queue=queue, max_restarts=max_restarts, labels=labels))


def stop_jobset(gangs: GangClient, job: Job, attempt: int) -> bool:
    """Delete the JobSet of gang start ``attempt`` (and with it its Jobs and pods)."""
    return gangs.delete_jobset(job.namespace, js.jobset_name(job.name, attempt))


def enqueue(
    gangs: GangClient | None, ctx: StepContext, request: NodeRequest, wp: WorkerPlan, max_restarts: int
) -> bool:
    """Submit the gang to the job's LocalQueue (phase ``Queued``); False when it names none.

    Args:
        gangs: the Kueue/JobSet client (None: the operator has none, and the job waits saying so).
        ctx: the step (its status gets the queue and the reason).
        request: the planned offering (instance type, capacity type, node count).
        wp: the worker plan of the gang to begin.
        max_restarts: the JobSet's gang restarts on failures that are not the training code's.

    Returns:
        True when the job is now queued (nothing to provision yet).
    """
    queue = queue_of(ctx.job)
    if queue is None:
        return False
    st = ctx.status
    st.phase = Phase.QUEUED
    expected = None
    if gangs is None:
        st.queue = QueueStatus(name=queue, reason="this operator runs without a Kueue client")
        st.message = kueue.queued_message(queue, None)
        return True
    names = kueue.matching_flavors(gangs.flavors(), request.instance, request.capacity)
    expected = names[0] if names else None
    evictions = st.queue.evictions if st.queue is not None else 0
    st.queue = QueueStatus(
        name=queue,
        workload=None,
        expected_flavor=expected,
        reason="submitted; waiting for Kueue" + ("" if expected else " (no ResourceFlavor matches the plan's offering)"),
        evictions=evictions,
    )
    start_jobset(gangs, ctx.job, wp, queue, max_restarts)
    st.message = kueue.queued_message(queue, None)
    ctx.event("Normal", EventReason.QUEUED, f"gang submitted to LocalQueue {queue} as JobSet {js.jobset_name(ctx.job.name, st.attempt)}")
    return True


def admission(gangs: GangClient | None, ctx: StepContext) -> bool:
    """While ``Queued``: True once Kueue admitted the gang; else ``status`` says why it waits."""
    st = ctx.status
    if gangs is None or st.queue is None:
        return False
    state = _workload(gangs, ctx)
    _note(st.queue, state)
    st.message = kueue.queued_message(st.queue.name, state)
    if state is None or not state.admitted:
        return False
    ctx.event(
        "Normal",
        EventReason.ADMITTED,
        f"Kueue admitted the gang in ClusterQueue {state.cluster_queue} on flavor {state.flavor}"
        + (f" (the plan's is {st.queue.expected_flavor})" if st.queue.expected_flavor not in (None, state.flavor) else ""),
    )
    return True


def evicted(gangs: GangClient | None, ctx: StepContext) -> bool:
    """While the workers run: True when Kueue evicted or preempted the gang (then: recover, requeue)."""
    st = ctx.status
    state = _workload(gangs, ctx)
    if state is None or not state.evicted or st.queue is None:
        return False
    _note(st.queue, state)
    st.queue.evictions += 1
    st.queue.admitted = False
    st.interruptions += 1
    st.phase = Phase.RECOVERING
    st.message = f"Kueue {state.reason}; the workers checkpoint on SIGTERM and the gang goes back into {st.queue.name}"
    ctx.event("Warning", EventReason.EVICTED, st.message)
    return True


def no_quota(ctx: StepContext) -> str | None:
    """Kueue's reason when the gang waits because the planned flavor has no quota left, else None.

    Read from the reason the last step stored (``status.queue``): a gang Kueue could not fit
    ("couldn't assign flavors ... insufficient ... quota ...") and that holds no reservation.
    """
    queue = ctx.status.queue
    if queue is None or queue.admitted or queue.workload is None:
        return None
    reason = queue.reason
    return reason if "insufficient" in reason and "quota" in reason else None


def _workload(gangs: GangClient | None, ctx: StepContext) -> kueue.WorkloadState | None:
    """The Workload of the current gang start's JobSet (None: no client, not queued, or not made yet)."""
    if gangs is None or ctx.status.queue is None:
        return None
    return gangs.workload_of(ctx.job.namespace, js.KIND, js.jobset_name(ctx.job.name, ctx.status.attempt))


def _note(queue: QueueStatus, state: kueue.WorkloadState | None) -> None:
    if state is None:
        queue.reason = "waiting for Kueue to create the Workload"
        return
    queue.workload = state.name
    queue.admitted = state.admitted
    queue.cluster_queue = state.cluster_queue
    queue.flavor = state.flavor
    queue.reason = state.reason
