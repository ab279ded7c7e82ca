"""kopf handlers of TrainingJobs: read the object, call the reconcile loop, write status and events.

Registered in :mod:`gpuscaler.main`. The loop itself is :class:`gpuscaler.controller.reconcile.Reconciler`;
these functions only translate: kopf bodies -> models, the indexes of the job's pods and nodes
(kept by watches, so a reconcile makes no list calls) -> observed state, the outcome -> a status
patch, Events and metrics. Domain errors become kopf errors in :mod:`gpuscaler.handlers.errors`.

Event-driven (:mod:`gpuscaler.controller.wakeups`): each unfinished job has one async kopf daemon,
:func:`job_daemon`, that steps it on a lane thread, then sleeps until it is woken or its next
time-based deadline comes. The watch-event handlers :func:`pod_event`, :func:`node_event`,
:func:`job_event` and :func:`policy_event` wake the jobs whose pods, nodes, spec or policies
changed in a way the loop reads (a node's heartbeat is not such a change). A step writes the
status itself (:class:`gpuscaler.kube.client.TrainingJobs`), once, and only what changed; until the
watch brings that write back, the next step starts from the status it wrote, not the older one. A
new job's way up is held a moment (:mod:`gpuscaler.controller.status_writes`): the next step starts
from the held status and writes it with its own change.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from gpuscaler import __version__
from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.events import Event
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.catalog import Catalog, load_catalog
from gpuscaler.cloud import JobRef, NodePoolProvider, job_label_value, make_provider
from gpuscaler.cloud.nodes import node_state
from gpuscaler.controller.outcomes import invalid_spec, policy_invalid, policy_unavailable
from gpuscaler.controller.plan_cache import PlanCache
from gpuscaler.controller.policy import (
    Governance,
    PolicySource,
    PolicyUnavailableError,
    gated_plan,
    held_nodes,
    namespace_usage,
)
from gpuscaler.controller.prices import PriceRefresher
from gpuscaler.controller.profiles import ProfileBook, ProfileConfig, Recorder
from gpuscaler.controller.reconcile import (
    Job,
    LoopConfig,
    Outcome,
    Reconciler,
)
from gpuscaler.controller.status_writes import Write, decide, fold_held_events, hold_left_s
from gpuscaler.controller.wakeups import Lanes, Seen, StepGate, WakeConfig, Wakeups, drive, lane, next_wake
from gpuscaler.handlers import metrics
from gpuscaler.handlers.errors import kopf_errors, retry_delay
from gpuscaler.handlers.prices import make_refresher
from gpuscaler.handlers.prices import start as start_prices
from gpuscaler.kube.admission import KubePolicyApi, WorkerAdmission
from gpuscaler.kube.client import TrainingJobs, Workers, load_config
from gpuscaler.kube.gangs import Gangs
from gpuscaler.kube.profiles import Profiles
from gpuscaler.kube.workers import pod_state, service_name
from gpuscaler.names import FINALIZER, JOB_LABEL
from gpuscaler.observe.controller import from_settings as observer_from_settings
from gpuscaler.planner import PlanResult, plan
from gpuscaler.policy import NamespaceUsage
from gpuscaler.settings import Settings

Logger = logging.Logger | logging.LoggerAdapter[Any]

USER_AGENT = f"gpuscaler-operator/{__version__}"
"""The User-Agent of the operator's own API calls (status writes, nodes, pods: the Kubernetes client);
kopf's watches, finalizer patches and Events go as ``kopf/<version>``. An API server's audit log
tells the operator's requests apart by these two (benchmarks/operator_scale.py does)."""


@dataclass
class Operator:
    """What the handlers share, built once at startup."""

    settings: Settings
    catalog: Catalog
    policies: PolicySource
    provider: NodePoolProvider
    workers: Workers
    reconciler: Reconciler
    last_write: dict[tuple[str, str], float]
    admission: WorkerAdmission
    """The workers' admission policy (installed or checked at start-up; the loop asks it)."""
    jobs: TrainingJobs
    """Status writes (the daemon's own)."""
    plans: PlanCache
    wake: WakeConfig
    lanes: Lanes
    gate: StepGate
    """The client-side limit on steps at once (off unless ``settings.reconcile_slow_step_s``)."""
    wakeups: Wakeups = field(default_factory=Wakeups)
    seen: Seen = field(default_factory=Seen)
    """What the watch-event handlers last saw of each pod, node and job (a change wakes the job)."""
    written: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """Job key -> (resourceVersion, status) of the last status write, until the watch brings it back."""
    held: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    """Job key -> (monotonic time first held, status) of a status not written yet
    (:mod:`gpuscaler.controller.status_writes`): the job's next step starts from it."""
    held_events: dict[str, list[Event]] = field(default_factory=dict)
    """Job key -> the Events held with its held status (``Planned``: :func:`fold_held_events`)."""
    blocked: dict[str, str] = field(default_factory=dict)
    """Job key -> namespace of the jobs a policy stops (PolicyViolation): woken when a job of their
    namespace finishes."""
    prices: PriceRefresher | None = None
    """Live prices (docs/prices.md); None: the shipped table."""


_operator: Operator | None = None
LANE_FIELDS = ("phase", "notice")
"""The status fields :func:`gpuscaler.controller.wakeups.lane` reads (their JSON names)."""


WATCH_HANDLERS = ("pod_event", "node_event", "job_event", "policy_event", "profile_event")
"""The watch-event handlers: kopf logs a line for every call of each, i.e. for every watch event."""


class QuietWatchHandlers(logging.Filter):
    """Drops kopf's "Handler 'pod_event' succeeded." lines (one per watch event of every pod, node
    and job: thousands a minute at a few hundred jobs); their failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a success line of a watch-event handler."""
        msg = str(record.msg)
        return not (msg.endswith(" succeeded.") and any(f"'{h}'" in msg for h in WATCH_HANDLERS))


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff-base (the last-handled configuration) is not kept: no handler here diffs the
    spec (the loop compares ``metadata.generation`` with ``status.plan.generation``), and keeping it
    cost a PATCH of every TrainingJob at its creation and at every spec change, plus the watch event
    of that PATCH to every watcher."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """Nothing: kopf builds the essence of every watch event of every resource (a deep copy of
        the whole object, then another to clear it) only to compare it with the stored one, and none
        is stored; that was about 7% of the operator's CPU in a 200-job run of
        benchmarks/operator_scale.py (py-spy), most of it on the nodes' events."""
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """Nothing is stored, so nothing is fetched."""
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Store nothing."""


def build(settings: Settings, api: Any) -> Operator:
    """The operator's collaborators from settings and an ``ApiClient``."""
    live = make_refresher(settings, api, load_catalog())
    catalog = live.catalog if live else load_catalog()
    policies = PolicySource(settings.policy_file)
    try:
        policies.file_policies()
    except PolicyUnavailableError as err:  # not a crash loop: jobs show PolicyInvalid until it is fixed
        logging.getLogger(__name__).error("no policy in force, jobs are not planned: %s", err)
    provider = make_provider(settings.provider_name, settings, api)
    workers = Workers(api)

    def timed_plan(*args: Any, **kwargs: Any) -> PlanResult:  # a real planning, not a cache hit
        with metrics.PLANNER.time():
            return plan(*args, **kwargs)

    plans = PlanCache(settings.plan_cache_size, timed_plan)

    def cached_plan(*args: Any, **kwargs: Any) -> PlanResult:
        hits = plans.hits
        out = plans.plan(*args, **kwargs)
        metrics.PLAN_CACHE_HITS.inc(plans.hits - hits)
        return out

    def planner(*args: Any, **kwargs: Any) -> PlanResult:  # on the catalog in force (live prices)
        return gated_plan(*args, catalog=live.catalog if live else catalog, plan_fn=cached_plan, **kwargs)

    config = LoopConfig.from_settings(settings)
    admission = WorkerAdmission(
        KubePolicyApi(api), settings.worker_admission_policy, settings.worker_admission_policy_name, settings.namespace
    )
    observer = observer_from_settings(settings, catalog)
    book = ProfileBook(ProfileConfig.from_settings(settings))
    reconciler = Reconciler(
        provider,
        workers,
        planner,
        catalog,
        config,
        observer=observer,
        admission=admission.refusal,
        gangs=Gangs(api),
        profiles=Recorder(Profiles(api), book, catalog, observer.config.correction()) if settings.profiles_enabled else None,
        prices=live.staleness if live else None,
        price_log=live.log if live else None,
    )
    wake = WakeConfig.from_settings(settings)
    return Operator(
        settings,
        catalog,
        policies,
        provider,
        workers,
        reconciler,
        {},
        admission,
        TrainingJobs(api),
        plans,
        wake,
        Lanes(settings.reconcile_workers),
        StepGate(settings.reconcile_workers, settings.reconcile_slow_step_s),
        prices=live,
    )


def _op() -> Operator:
    if _operator is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return _operator


WATCHED_BY_LABEL = ("pods", "nodes")
"""Resources watched only where they carry :data:`gpuscaler.names.JOB_LABEL`, filtered by the API
server: the handlers' ``labels=`` filters are kopf's, on the client, so without this every pod and
node of the cluster (at 2,000 nodes, each node's status updates) went through kopf's processing."""


def watch_selectors(settings: kopf.OperatorSettings) -> None:
    """Server-side label selectors of the pod and node watches (:data:`WATCHED_BY_LABEL`)."""
    for plural in WATCHED_BY_LABEL:
        settings.watching.label_selectors[plural] = JOB_LABEL


def startup(settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> None:
    """Configure kopf (finalizer and bookkeeping under gpuscaler.io), build the operator, serve metrics."""
    global _operator  # noqa: PLW0603  (built once per process, read by every handler)
    ours = Settings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="gpuscaler.io")
    settings.persistence.diffbase_storage = NoDiffBase()
    watch_selectors(settings)
    settings.posting.level = logging.ERROR  # Events are the loop's decisions, not kopf's log lines
    logging.getLogger("kopf.objects").addFilter(QuietWatchHandlers())
    settings.peering.name = ours.peering
    settings.peering.mandatory = False
    settings.execution.max_workers = 16
    with kopf_errors():
        api = load_config()
        api.user_agent = USER_AGENT
        _operator = build(ours, api)
    if (live := _operator.prices) is not None:
        op = _operator

        def installed(catalog: Catalog) -> None:
            op.catalog = op.reconciler.catalog = catalog

        live.on_change.append(installed)
        start_prices(live)
    admitted = _operator.admission.ensure()
    (logger.info if admitted.enforced else logger.warning)("worker admission policy: %s", admitted.detail)
    metrics.serve(ours.metrics_port)
    logger.info(
        "gpuscaler operator: provider %s, policy file %s, GPUScalingPolicy objects %s, jobs stepped on watch "
        "events by %d threads, resync every %gs, time-critical phases every %gs, metrics port %s",
        ours.provider_name,
        ours.policy_file or "none",
        "watched" if ours.watch_policies else "ignored",
        ours.reconcile_workers,
        ours.resync_interval_s,
        ours.reconcile_interval_s,
        ours.metrics_port or "off",
    )


def deleted(type: str | None, **_: Any) -> bool:
    """``when=`` filter of the watch-event handlers of pods, nodes and jobs: a deletion only.

    Every other watch event of a pod, node or TrainingJob reaches its index function, which wakes
    the job itself (:func:`_observed`); kopf calls an index function for every event but a
    deletion. A handler kopf calls costs its per-handler machinery (state, kwargs, the outcome, a
    "succeeded" log record made and dropped): for the 8 pod and node events per job of a burst,
    with the index functions computing the same state again, that was 8.7% of the samples of
    ``py-spy record --gil`` on the operator in a 200-job run of benchmarks/operator_scale.py, 2.4%
    after (the handlers of the deletions and the policies)."""
    return type == "DELETED"


def _observed(source: str, seen_key: str, state: Any, job: str | None, *, deferred: bool) -> None:
    """Count a watch event (``gpuscaler_watch_events_total``) and wake ``job`` when what the loop
    reads of the object (``state``; None: deleted) changed.

    ``deferred``, from an index function: the wake-up is queued on the event loop, so it comes
    after kopf has stored the entry the function returns (the woken step reads the index)."""
    metrics.WATCH_EVENTS.labels(source).inc()
    if _operator is not None and _operator.seen.changed(seen_key, state):
        (_wake_soon if deferred else _wake)(source, job)


def _wake_soon(source: str, key: str | None) -> None:
    """:func:`_wake` queued on the event loop (from an index function: after kopf has stored the
    entry the function returns, which the woken step reads)."""
    asyncio.get_running_loop().call_soon(_wake, source, key)


async def job_pods(
    labels: kopf.Labels, body: kopf.Body, namespace: str | None, name: str | None, **_: Any
) -> dict[str, Any]:
    """Index: worker pods by the job label value; wakes the job when what the loop reads of the pod
    changed (phase, node, reports...; a deletion: :func:`pod_event`).

    The index functions are coroutines, though they never wait: kopf runs a plain function in a
    thread of its executor, a hand-over per watch event of every pod, node and job."""
    state = pod_state(dict(body))
    _observed("pod", f"pod/{namespace}/{name}", state, labels.get(JOB_LABEL), deferred=True)
    return {labels[JOB_LABEL]: state}


async def job_nodes(labels: kopf.Labels, body: kopf.Body, name: str | None, **_: Any) -> dict[str, Any]:
    """Index: nodes by the job label value, with their interruption signals; wakes the job when its
    readiness or a notice changed (not a heartbeat; a deletion: :func:`node_event`)."""
    state = node_state(dict(body))
    _observed("node", f"node/{name}", state, labels.get(JOB_LABEL), deferred=True)
    return {labels[JOB_LABEL]: state}


async def policy_objects(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Index: GPUScalingPolicy bodies by name (cluster-scoped)."""
    return {
        name: {"kind": body.get("kind"), "metadata": {"name": name}, "spec": dict(body.get("spec") or {})}
    }


def job_usage(namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """What a namespace cap and the held capacity count of one TrainingJob, from its status."""
    return {
        "name": name,
        "phase": status.get("phase"),
        "gpus": status.get("gpus"),
        "costUsd": status.get("costUsd"),
        "startTime": status.get("startTime"),
        "namespace": namespace,
        "heldCapacity": (status.get("plan") or {}).get("heldCapacity"),
        "nodes": (status.get("plan") or {}).get("nodes"),
    }


async def namespace_jobs(
    namespace: str | None, name: str, meta: kopf.Meta, status: kopf.Status, **_: Any
) -> dict[str, Any]:
    """Index: every TrainingJob's phase, GPUs and spend by namespace (for namespace caps); wakes the
    job on a new generation or its deletion's start (:func:`_job_seen`; its end: :func:`job_event`)."""
    _job_seen(None, meta, status, namespace, name, deferred=True)
    return {namespace or "": job_usage(namespace or "", name, status)}


def _latest(op: Operator, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Index entries of :func:`namespace_jobs`, each from the status the operator holds or last wrote
    when it has one (newer than the watch's: :mod:`gpuscaler.controller.status_writes`)."""
    out = []
    for e in entries:
        key = job_label_value(e["namespace"], e["name"])
        mine = op.held[key][1] if key in op.held else op.written[key][1] if key in op.written else None
        out.append(e if mine is None else job_usage(e["namespace"], e["name"], mine))
    return out


def governance_for(op: Operator, namespace: str, name: str, kwargs: dict[str, Any]) -> Governance:
    """The merged policy in force for a job and what its namespace already holds (gathered from the
    index, with the statuses the operator holds or has just written, when a step that plans first
    reads it)."""
    bodies = index_entries(kwargs.get("policy_objects"))
    jobs: kopf.Index[str, Any] | None = kwargs.get("namespace_jobs")

    def usage() -> NamespaceUsage:
        mine = namespace_usage(_latest(op, index_entries(jobs, namespace)), exclude=name)
        every = _latest(op, index_entries(jobs))
        return replace(mine, held_nodes=held_nodes(every, (namespace, name)))  # held capacity: cluster-wide

    return Governance(op.policies.for_namespace(namespace, bodies), usage)


def index_entries(index: Mapping[str, Any] | None, key: str | None = None) -> list[Any]:
    """A copy of a kopf index's entries (of one key, or of every key), safe on a step's thread.

    The event loop's thread updates the index meanwhile: a Python loop over one of its stores lets
    that thread in between two items, and the store then changes size under it (a RuntimeError
    that failed a planning step in a 500-job burst, and the job waited out the retry delay). So
    each store is copied whole by ``list()``, which runs in C without letting another thread in."""
    if index is None:
        return []
    keys = [key] if key is not None else list(index)
    return [entry for store in [index.get(k, ()) for k in keys] for entry in list(store)]


def unfinished(status: kopf.Status, **_: Any) -> bool:
    """Daemon filter: no daemon for jobs that are done and hold no nodes."""
    return not (status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED) and not status.get("nodes"))


def _creation(meta: Mapping[str, Any]) -> datetime:
    ts = meta.get("creationTimestamp")
    return datetime.fromisoformat(ts.replace("Z", "+00:00")) if ts else datetime.now(UTC)


def _fresher(op: Operator, key: str, rv: str | None, status: dict[str, Any]) -> dict[str, Any]:
    """The job's status to step from: the watched one, or the one the last step wrote while the watch
    has not brought that write back yet (resourceVersions of one object grow with each write)."""
    got = op.written.get(key)
    if got is None:
        return status
    try:
        behind = int(rv or 0) < int(got[0])
    except ValueError:
        behind = False
    if behind:
        return dict(got[1])
    del op.written[key]
    return status


def step_job(
    op: Operator,
    body: kopf.Body,
    job_pods: Mapping[str, Any],
    job_nodes: Mapping[str, Any],
    kwargs: dict[str, Any],
    logger: Logger,
) -> float:
    """One reconcile step of one job (on a lane thread, for its daemon): the loop, one status patch of
    what changed when something did, the Events and metrics.

    Returns:
        Seconds until the job's next time-based step (:func:`gpuscaler.controller.wakeups.next_wake`).

    Raises:
        KubeError, ProviderError and the planner's input errors: the daemon waits
        :func:`gpuscaler.handlers.errors.retry_delay` and steps again.
    """
    t0 = time.perf_counter()
    meta = body.get("metadata") or {}
    name, namespace, uid = str(meta.get("name")), str(meta.get("namespace")), str(meta.get("uid"))
    generation = int(meta.get("generation") or 0)
    label = job_label_value(namespace, name)
    pods, nodes = list(job_pods.get(label, [])), list(job_nodes.get(label, []))
    status = _fresher(op, label, meta.get("resourceVersion"), dict(body.get("status") or {}))
    held = op.held.get(label)
    current = TrainingJobStatus.model_validate(held[1] if held else status)
    try:
        spec = TrainingJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        out = invalid_spec(current, err, generation)
        _teardown(op, namespace, name, pods, nodes, logger)
    else:
        job = Job(namespace, name, uid, generation, _creation(meta), spec, dict(meta.get("labels") or {}))
        out = _step(op, job, current, pods, nodes, kwargs)
    on_server = TrainingJobStatus.model_validate(status) if held else current
    old = on_server.model_dump(mode="json", by_alias=True, exclude_none=True)
    new = out.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    key = (namespace, name)
    now = time.monotonic()
    held_for = now - held[0] if held else None
    write = decide(
        status,
        new,
        held_for_s=held_for,
        since_write_s=now - op.last_write.get(key, 0),
        refresh_s=op.settings.status_refresh_s,
        hold_s=op.settings.bringup_write_hold_s,
    )
    if write is Write.HOLD:
        op.held[label] = (held[0] if held else now, new)
    else:
        op.held.pop(label, None)
    if write is Write.NOW:
        patch: dict[str, Any] = {k: None for k in old if k not in new}
        patch.update({k: v for k, v in new.items() if status.get(k) != v})
        rv = op.jobs.patch_status(namespace, name, patch)
        op.written[label] = (rv, new)
        op.last_write[key] = now
    post, keep = fold_held_events(op.held_events.pop(label, []), list(out.events), holding=write is Write.HOLD)
    if keep:
        op.held_events[label] = keep
    for ev in post:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)
        logger.info("%s: %s", ev.reason, ev.message)
    if any(c.type == "PolicyViolation" and c.status == "True" for c in out.status.conditions):
        op.blocked[label] = namespace
    else:
        op.blocked.pop(label, None)
    metrics.observe_job(namespace, name, out.status.phase, out.status.gpus or 0, out.status.cost_usd)
    metrics.observe_interruptions(namespace, name, current, out.status)
    seen = out.status.observed
    if seen is not None:
        metrics.observe_performance(namespace, name, seen.predicted, seen.throughput, seen.efficiency_factor)
    metrics.RECONCILE.observe(time.perf_counter() - t0)
    wake = next_wake(out.status, nodes, datetime.now(UTC), op.wake)
    left = hold_left_s(now - op.held[label][0] if label in op.held else None, op.settings.bringup_write_hold_s)
    return wake if left is None else min(wake, left + op.wake.min_s)  # a hold ends with a step that writes it


async def job_daemon(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    name: str,
    namespace: str,
    logger: Logger,
    job_pods: kopf.Index[str, Any],
    job_nodes: kopf.Index[str, Any],
    **kwargs: Any,
) -> None:
    """The job's driver while it is unfinished: a step now, then on every wake-up or deadline
    (:func:`gpuscaler.controller.wakeups.drive`); ``body`` is kopf's live view of the object."""
    op = _op()
    key = job_label_value(namespace, name)
    stop = asyncio.Event()

    async def on_stop() -> None:
        await stopped.wait()
        stop.set()

    watcher = asyncio.ensure_future(on_stop())
    context = contextvars.copy_context()  # kopf.event needs the operator's posting queue

    def step() -> float:
        return context.run(step_job, op, body, job_pods, job_nodes, kwargs, logger)

    def choose_lane(woken: bool) -> int:
        meta = body.get("metadata") or {}
        held = op.held.get(key)
        raw = held[1] if held else _fresher(op, key, meta.get("resourceVersion"), dict(body.get("status") or {}))
        # the lane reads the phase and the notice only: validating the whole status (its plan and
        # conditions) before every step was 3% of the operator's CPU in a 200-job benchmark run
        status = TrainingJobStatus.model_validate({k: raw[k] for k in LANE_FIELDS if k in raw})
        nodes = list(job_nodes.get(key, []))
        return lane(status, nodes, datetime.now(UTC), op.reconciler.config.spot, woken=woken)

    try:
        await drive(
            key,
            op.wakeups,
            op.lanes,
            step,
            choose_lane,
            stop,
            debounce_s=op.settings.reconcile_debounce_s,
            error_delay=lambda err: retry_delay(err, op.wake.resync_s),
            gate=op.gate,
        )
    finally:
        watcher.cancel()


def _wake(source: str, key: str | None) -> None:
    if _operator is not None and key and _operator.wakeups.wake(key):
        metrics.WAKEUPS.labels(source).inc()


async def pod_event(
    type: str | None, body: kopf.Body, labels: kopf.Labels, namespace: str | None, name: str | None, **_: Any
) -> None:
    """A worker pod changed: wake its job when what the loop reads of it did (phase, node, reports...).
    Registered for deletions only (:func:`deleted`): :func:`job_pods` sees every other event."""
    state = None if type == "DELETED" else pod_state(dict(body))
    _observed("pod", f"pod/{namespace}/{name}", state, labels.get(JOB_LABEL), deferred=False)


async def node_event(type: str | None, body: kopf.Body, labels: kopf.Labels, name: str | None, **_: Any) -> None:
    """A job's node changed: wake its job when readiness, a notice or its deletion did (not a heartbeat).
    Registered for deletions only (:func:`deleted`): :func:`job_nodes` sees every other event."""
    state = None if type == "DELETED" else node_state(dict(body))
    _observed("node", f"node/{name}", state, labels.get(JOB_LABEL), deferred=False)


async def job_event(
    type: str | None, meta: kopf.Meta, status: kopf.Status, namespace: str | None, name: str | None, **_: Any
) -> None:
    """A TrainingJob changed (registered for deletions only, :func:`deleted`: :func:`namespace_jobs`
    sees every other event): :func:`_job_seen`."""
    _job_seen(type, meta, status, namespace, name, deferred=False)


def _job_seen(
    type: str | None,
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    namespace: str | None,
    name: str | None,
    *,
    deferred: bool,
) -> None:
    """Wake a TrainingJob on a new generation or deletion (its own status writes do not); when one
    finishes, wake the jobs of its namespace a policy holds back (a namespace cap may allow them
    now). ``deferred``: as in :func:`_observed`."""
    metrics.WATCH_EVENTS.labels("trainingjob").inc()
    if _operator is None or not name or not namespace:
        return
    key = job_label_value(namespace, name)
    gone = type == "DELETED"
    wake = _wake_soon if deferred else _wake
    if _operator.seen.changed(f"job/{key}", None if gone else (meta.get("generation"), meta.get("deletionTimestamp"))):
        wake("trainingjob", key)
    phase = None if gone else status.get("phase")
    if _operator.seen.changed(f"phase/{key}", phase) and (gone or phase in (Phase.SUCCEEDED, Phase.FAILED)):
        for other in [k for k, ns in list(_operator.blocked.items()) if ns == namespace and k != key]:
            wake("trainingjob", other)
    if gone:
        _operator.blocked.pop(key, None)
        _operator.written.pop(key, None)
        _operator.held.pop(key, None)
        _operator.held_events.pop(key, None)


async def profile_event(
    type: str | None, body: kopf.Body, namespace: str | None, name: str | None, logger: Logger, **_: Any
) -> None:
    """A PerformanceProfile changed: the book the planner reads follows it (:class:`ProfileBook`)."""
    if _operator is None or _operator.reconciler.profiles is None or not namespace or not name:
        return
    why = _operator.reconciler.profiles.book.observe(namespace, name, None if type == "DELETED" else dict(body))
    if why:
        logger.warning("PerformanceProfile ignored: %s", why)


async def policy_event(type: str | None, name: str | None, spec: kopf.Spec, **_: Any) -> None:
    """A GPUScalingPolicy changed: wake every job (which namespaces it governs is the policy's to say)."""
    if _operator is not None and _operator.seen.changed(f"policy/{name}", None if type == "DELETED" else repr(dict(spec))):
        metrics.WAKEUPS.labels("policy").inc(_operator.wakeups.wake_all())


def _step(
    op: Operator, job: Job, current: TrainingJobStatus, pods: list[Any], nodes: list[Any], kwargs: dict[str, Any]
) -> Outcome:
    """One reconcile step of a job with a valid spec, under the policies in force."""
    try:
        governance = governance_for(op, job.namespace, job.name, kwargs)
    except PolicyUnavailableError as err:
        out = policy_unavailable(current, err, job.generation)
    else:
        out = op.reconciler.step(job, current, pods, nodes, governance)
    policy_invalid(out.status, op.policies.errors, out, job.generation)
    return out


def _teardown(op: Operator, namespace: str, name: str, pods: list[Any], nodes: list[Any], logger: Logger) -> None:
    """Delete a job's workers and Service and release its nodes (the finalizer, an invalid spec);
    ``pods`` and ``nodes`` are copies of the index entries (the watch updates the index meanwhile)."""
    for p in pods:
        op.workers.delete_pod(namespace, p.name)
    op.workers.delete_service(namespace, service_name(name))
    if isinstance(op.reconciler.gangs, Gangs):  # runtime: jobset and queued jobs: their JobSets, every attempt
        op.reconciler.gangs.delete_jobsets_of(namespace, job_label_value(namespace, name))
    gone = op.provider.release_nodes(JobRef(namespace, name), [n for n in nodes if not n.deleting])
    if gone:
        logger.info("released %d node(s): %s", len(gone), ", ".join(gone))


def delete(
    name: str,
    namespace: str,
    logger: Logger,
    job_pods: kopf.Index[str, Any],
    job_nodes: kopf.Index[str, Any],
    **_: Any,
) -> None:
    """Finalizer: delete the job's workers, Service and nodes before the TrainingJob goes."""
    op = _op()
    label = job_label_value(namespace, name)
    with kopf_errors():
        _teardown(op, namespace, name, list(job_pods.get(label, [])), list(job_nodes.get(label, [])), logger)
    op.last_write.pop((namespace, name), None)
    metrics.forget_job(namespace, name)
