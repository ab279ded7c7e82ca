"""kopf handlers of TrainingJobs: read the object, call the reconcile loop, write status and events.

Registered in :mod:`gpuscaler.main`. The loop itself is :class:`gpuscaler.handlers.reconcile.Reconciler`;
these functions only translate: kopf bodies -> models, the indexes of the job's pods and nodes
(kept by watches, so a reconcile makes no list calls) -> observed state, the outcome -> a status
patch, Events and metrics. Domain errors become kopf errors in :mod:`gpuscaler.handlers.errors`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.catalog import Catalog, load_catalog
from gpuscaler.cloud import JOB_LABEL, JobRef, NodePoolProvider, job_label_value, make_provider
from gpuscaler.cloud.provider import node_state
from gpuscaler.handlers import metrics
from gpuscaler.handlers.errors import kopf_errors
from gpuscaler.handlers.reconcile import COST_REFRESH_S, Job, LoopConfig, Reconciler, status_change
from gpuscaler.kube.client import Workers, load_config
from gpuscaler.kube.workers import pod_state, service_name
from gpuscaler.planner import PlanResult, plan
from gpuscaler.policy import Policy, load_policy
from gpuscaler.settings import Settings

FINALIZER = "gpuscaler.io/finalizer"
Logger = logging.Logger | logging.LoggerAdapter[Any]


@dataclass
class Operator:
    """What the handlers share, built once at startup."""

    settings: Settings
    catalog: Catalog
    policy: Policy
    provider: NodePoolProvider
    workers: Workers
    reconciler: Reconciler
    last_write: dict[tuple[str, str], float]


_operator: Operator | None = None


def build(settings: Settings, api: Any) -> Operator:
    """The operator's collaborators from settings and an ``ApiClient``."""
    catalog = load_catalog()
    policy = load_policy(settings.policy_file) if settings.policy_file else Policy()
    provider = make_provider(settings.provider_name, settings, api)
    workers = Workers(api)

    def planner(
        spec: TrainingJobSpec, name: str, deadline_h: float | None, unavailable: frozenset[tuple[str, str]]
    ) -> PlanResult:
        with metrics.PLANNER.time():
            return plan(spec, catalog, policy, name=name, deadline_h=deadline_h, unavailable=unavailable)

    config = LoopConfig(
        gang_timeout_s=settings.gang_timeout_s,
        capacity_backoff_s=settings.capacity_backoff_s,
        backoff_limit=settings.backoff_limit,
        master_port=settings.master_port,
        default_image=settings.default_image,
    )
    reconciler = Reconciler(provider, workers, planner, catalog, config)
    return Operator(settings, catalog, policy, provider, workers, reconciler, {})


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
    metrics.serve(ours.metrics_port)
    logger.info(
        "gpuscaler operator: provider %s, policy %s, reconcile every %gs, metrics port %s",
        ours.provider_name,
        _operator.policy.name,
        ours.reconcile_interval_s,
        ours.metrics_port or "off",
    )


def job_pods(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Index: worker pods by the job label value."""
    return {labels[JOB_LABEL]: pod_state(dict(body))}


def job_nodes(labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Index: nodes by the job label value."""
    return {labels[JOB_LABEL]: node_state(dict(body))}


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
    **_: Any,
) -> None:
    """One reconcile step of one job (a kopf timer, every ``reconcile_interval_s``)."""
    op = _op()
    t0 = time.perf_counter()
    with kopf_errors():
        job = Job(
            namespace=namespace,
            name=name,
            uid=uid,
            generation=int(meta.get("generation") or 0),
            created=_creation(meta),
            spec=TrainingJobSpec.model_validate(body["spec"]),
        )
        current = TrainingJobStatus.model_validate(dict(status))
        label = job_label_value(namespace, name)
        pods = list(job_pods.get(label, []))
        nodes = list(job_nodes.get(label, []))
        out = op.reconciler.step(job, current, pods, nodes)
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
    metrics.RECONCILE.observe(time.perf_counter() - t0)


def delete(
    name: str, namespace: str, logger: Logger, job_pods: kopf.Index[str, Any], job_nodes: kopf.Index[str, Any], **_: Any
) -> None:
    """Finalizer: delete the job's workers, Service and nodes before the TrainingJob goes."""
    op = _op()
    label = job_label_value(namespace, name)
    with kopf_errors():
        for p in list(job_pods.get(label, [])):  # a copy: the watch updates the index meanwhile
            op.workers.delete_pod(namespace, p.name)
        op.workers.delete_service(namespace, service_name(name))
        nodes = [n for n in list(job_nodes.get(label, [])) if not n.deleting]
        gone = op.provider.release_nodes(JobRef(namespace, name), nodes)
    if gone:
        logger.info("released %d node(s): %s", len(gone), ", ".join(gone))
    op.last_write.pop((namespace, name), None)
    metrics.forget_job(namespace, name)

