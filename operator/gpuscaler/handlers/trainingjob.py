"""kopf handlers of TrainingJobs: read the object, call the reconcile loop, write status and events.

Registered in :mod:`gpuscaler.main`. The loop itself is :class:`gpuscaler.controller.reconcile.Reconciler`;
these functions only translate: kopf bodies -> models, the indexes of the job's pods and nodes
(kept by watches, so a reconcile makes no list calls) -> observed state, the outcome -> a status
patch, Events and metrics. Domain errors become kopf errors in :mod:`gpuscaler.handlers.errors`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.catalog import Catalog, load_catalog
from gpuscaler.cloud import JOB_LABEL, JobRef, NodePoolProvider, job_label_value, make_provider
from gpuscaler.controller.interruptions import SpotConfig, observe_node
from gpuscaler.controller.outcomes import invalid_spec, policy_invalid, policy_unavailable
from gpuscaler.controller.policy import (
    Governance,
    PolicySource,
    PolicyUnavailableError,
    gated_plan,
    namespace_usage,
)
from gpuscaler.controller.reconcile import (
    COST_REFRESH_S,
    Job,
    LoopConfig,
    Outcome,
    Reconciler,
    status_change,
)
from gpuscaler.handlers import metrics
from gpuscaler.handlers.errors import kopf_errors
from gpuscaler.kube.admission import KubePolicyApi, WorkerAdmission
from gpuscaler.kube.client import Workers, load_config
from gpuscaler.kube.workers import pod_state, service_name
from gpuscaler.observe.controller import from_settings as observer_from_settings
from gpuscaler.planner import PlanResult
from gpuscaler.settings import Settings

FINALIZER = "gpuscaler.io/finalizer"
Logger = logging.Logger | logging.LoggerAdapter[Any]


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


_operator: Operator | None = None


def build(settings: Settings, api: Any) -> Operator:
    """The operator's collaborators from settings and an ``ApiClient``."""
    catalog = load_catalog()
    policies = PolicySource(settings.policy_file)
    try:
        policies.file_policies()
    except PolicyUnavailableError as err:  # not a crash loop: jobs show PolicyInvalid until it is fixed
        logging.getLogger(__name__).error("no policy in force, jobs are not planned: %s", err)
    provider = make_provider(settings.provider_name, settings, api)
    workers = Workers(api)

    def planner(
        spec: TrainingJobSpec,
        name: str,
        deadline_h: float | None,
        unavailable: frozenset[tuple[str, str]],
        /,
        efficiency: Mapping[str, float] | None = None,
        governance: Governance | None = None,
    ) -> PlanResult:
        with metrics.PLANNER.time():
            return gated_plan(spec, catalog, name, deadline_h, unavailable, efficiency, governance)

    config = LoopConfig(
        gang_timeout_s=settings.gang_timeout_s,
        capacity_backoff_s=settings.capacity_backoff_s,
        backoff_limit=settings.backoff_limit,
        master_port=settings.master_port,
        default_image=settings.default_image,
        spot=SpotConfig(
            interruption_backoff_s=settings.interruption_backoff_s,
            node_not_ready_grace_s=settings.node_not_ready_grace_s,
            soft_notice_wait_s=settings.soft_notice_wait_s,
            annotation_notice_s=settings.annotation_notice_s,
        ),
    )
    admission = WorkerAdmission(
        KubePolicyApi(api), settings.worker_admission_policy, settings.worker_admission_policy_name, settings.namespace
    )
    reconciler = Reconciler(
        provider,
        workers,
        planner,
        catalog,
        config,
        observer=observer_from_settings(settings, catalog),
        admission=admission.refusal,
    )
    return Operator(settings, catalog, policies, provider, workers, reconciler, {}, admission)


def _op() -> Operator:
    if _operator is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return _operator


def startup(settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> None:
    """Configure kopf (finalizer and bookkeeping under gpuscaler.io), build the operator, serve metrics."""
    global _operator  # noqa: PLW0603  (built once per process, read by every handler)
    ours = Settings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="gpuscaler.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="gpuscaler.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.ERROR  # Events are the loop's decisions, not kopf's log lines
    settings.peering.name = ours.peering
    settings.peering.mandatory = False
    settings.execution.max_workers = 16
    with kopf_errors():
        _operator = build(ours, load_config())
    admitted = _operator.admission.ensure()
    (logger.info if admitted.enforced else logger.warning)("worker admission policy: %s", admitted.detail)
    metrics.serve(ours.metrics_port)
    logger.info(
        "gpuscaler operator: provider %s, policy file %s, GPUScalingPolicy objects %s, reconcile every %gs, "
        "metrics port %s",
        ours.provider_name,
        ours.policy_file or "none",
        "watched" if ours.watch_policies else "ignored",
        ours.reconcile_interval_s,
        ours.metrics_port or "off",
    )


def job_pods(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Index: worker pods by the job label value."""
    return {labels[JOB_LABEL]: pod_state(dict(body))}


def job_nodes(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Index: nodes by the job label value, with their interruption signals."""
    return {labels[JOB_LABEL]: observe_node(dict(body))}


def policy_objects(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Index: GPUScalingPolicy bodies by name (cluster-scoped)."""
    return {
        name: {"kind": body.get("kind"), "metadata": {"name": name}, "spec": dict(body.get("spec") or {})}
    }


def namespace_jobs(namespace: str | None, name: str, status: kopf.Status, **_: Any) -> dict[str, Any]:
    """Index: every TrainingJob's phase, GPUs and spend by namespace (for namespace caps)."""
    return {
        namespace or "": {
            "name": name,
            "phase": status.get("phase"),
            "gpus": status.get("gpus"),
            "costUsd": status.get("costUsd"),
            "startTime": status.get("startTime"),
        }
    }


def governance_for(op: Operator, namespace: str, name: str, kwargs: dict[str, Any]) -> Governance:
    """The merged policy in force for a job and what its namespace already holds."""
    objects: kopf.Index[str, Any] | None = kwargs.get("policy_objects")
    bodies = [b for key in (objects or {}) for b in objects[key]] if objects is not None else []
    jobs: kopf.Index[str, Any] | None = kwargs.get("namespace_jobs")
    usage = namespace_usage(list(jobs.get(namespace, [])) if jobs is not None else [], exclude=name)
    return Governance(op.policies.for_namespace(namespace, bodies), usage)


def unfinished(status: kopf.Status, **_: Any) -> bool:
    """Timer filter: skip jobs that are done and hold no nodes."""
    return not (status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED) and not status.get("nodes"))


def _creation(meta: kopf.Meta) -> datetime:
    ts = meta.get("creationTimestamp")
    return datetime.fromisoformat(ts.replace("Z", "+00:00")) if ts else datetime.now(UTC)


def reconcile(
    body: kopf.Body,
    meta: kopf.Meta,
    status: kopf.Status,
    name: str,
    namespace: str,
    uid: str,
    patch: kopf.Patch,
    logger: Logger,
    job_pods: kopf.Index[str, Any],
    job_nodes: kopf.Index[str, Any],
    **kwargs: Any,
) -> None:
    """One reconcile step of one job (a kopf timer, every ``reconcile_interval_s``)."""
    op = _op()
    t0 = time.perf_counter()
    generation = int(meta.get("generation") or 0)
    label = job_label_value(namespace, name)
    pods, nodes = list(job_pods.get(label, [])), list(job_nodes.get(label, []))
    with kopf_errors():
        current = TrainingJobStatus.model_validate(dict(status))
        try:
            spec = TrainingJobSpec.model_validate(body.get("spec") or {})
        except ValidationError as err:
            out = invalid_spec(current, err, generation)
            _teardown(op, namespace, name, pods, nodes, logger)
        else:
            out = _step(op, Job(namespace, name, uid, generation, _creation(meta), spec), current, pods, nodes, kwargs)
    old = current.model_dump(mode="json", by_alias=True, exclude_none=True)
    new = out.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    change = status_change(dict(status), new) if status else "state"
    key = (namespace, name)
    now = time.monotonic()
    if change == "state" or (change == "clock" and now - op.last_write.get(key, 0) >= COST_REFRESH_S):
        for k in old:
            if k not in new:
                patch.status[k] = None
        for k, v in new.items():
            patch.status[k] = v
        op.last_write[key] = now
    for ev in out.events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)
        logger.info("%s: %s", ev.reason, ev.message)
    metrics.observe_job(namespace, name, out.status.phase, out.status.gpus or 0, out.status.cost_usd)
    metrics.observe_interruptions(namespace, name, current, out.status)
    seen = out.status.observed
    if seen is not None:
        metrics.observe_performance(namespace, name, seen.predicted, seen.throughput, seen.efficiency_factor)
    metrics.RECONCILE.observe(time.perf_counter() - t0)


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
