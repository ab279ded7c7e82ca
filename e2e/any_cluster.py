"""The e2e suite on a cluster it did not start (``GPUSCALER_E2E_KUBECONFIG`` / ``--kubeconfig``).

Used by ``e2e/conftest.py`` and by test modules that install or need something of their own. On a
private dev cluster (the default) every function here either does nothing or always finds what a
test needs. On an existing cluster (kind, a staging cluster, a dev cluster started by hand):

- **Capabilities.** :func:`require` skips a test, with a one-line reason, when the cluster lacks
  what it needs: ``kwok`` (a controller that plays Nodes annotated ``kwok.x-k8s.io/node=fake``
  with gpuscaler's stages, found by a probe node), ``helm`` (on PATH), ``private`` (a control plane
  this session started and may restart). The probe runs once per session.
- **Installing.** Where kwok reads its stages from ``Stage`` objects (kwok in the cluster, as
  ``e2e/kind/kwok.yaml`` installs it) and gpuscaler's are missing, :func:`install_kwok_stages`
  creates them. CRDs the suite installs (:func:`claim_crds`) are labelled
  :data:`MANAGED_BY_LABEL`; third-party CRDs that are already there and not labelled so (a real
  Karpenter's, Cluster API's) are never replaced: the test skips instead.
- **Cleaning up.** Every namespace a test gets carries :data:`SESSION_LABEL`; :func:`sweep` runs
  at the end of the session (after failures too) and removes what is left: the session's
  namespaces (first releasing TrainingJob finalizers no operator is left to release), the nodes
  the operator's kwok provider or Karpenter made for their jobs, the probe node, the cluster-scoped
  objects of Helm releases in its namespaces, and the CRDs (the chart's that Helm installed too)
  and Stage objects this session created. What was there before the session is left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import E2ECluster
from gpuscaler.api import trainingjob
from gpuscaler.cloud import JOB_LABEL
from gpuscaler.devcluster.cluster import KWOK_NODE_ANNOTATION
from gpuscaler.devcluster.stages import NODE_READY_DELAY_ANNOTATION, STAGES_YAML

KUBECONFIG_ENV = "GPUSCALER_E2E_KUBECONFIG"
"""Environment variable naming the kubeconfig of an existing cluster to run the suite against."""
KWOK_PROBE_TIMEOUT_ENV = "GPUSCALER_E2E_KWOK_TIMEOUT"
"""Seconds the kwok probe node may take to turn Ready (default :data:`KWOK_PROBE_TIMEOUT_S`)."""
KWOK_PROBE_TIMEOUT_S = 30.0
"""Default: kwok in a fresh kind cluster makes a node Ready within a few seconds."""
KWOK_PROBE_DELAY_S = 3
"""The probe node's ``node-initialize`` delay: Ready sooner than :data:`KWOK_PROBE_EARLY_S` means
kwok ignores gpuscaler's delay annotations (its stock stages), which the suite's timing tests need."""
KWOK_PROBE_EARLY_S = 2.0

E2E_LABEL = "gpuscaler.io/e2e"
"""On every namespace the suite creates (value ``"true"``)."""
SESSION_LABEL = "gpuscaler.io/e2e-session"
"""On every namespace (and probe node) of one pytest session; :func:`sweep` removes them by it."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuscaler-e2e"
"""``MANAGED_BY_LABEL`` value on CRDs and Stage objects the suite installed on an existing cluster."""

STAGE_CRD = "stages.kwok.x-k8s.io"
STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL = "kwok.x-k8s.io", "v1alpha1", "stages"

CAPABILITIES = ("kwok", "helm", "private")


def _api(kind: Any, cluster: E2ECluster) -> Any:
    """A ``kubernetes.client`` API object on the cluster (typed ``Any``, as the tests use them)."""
    return kind(cluster.api)


def external_kubeconfig(config: pytest.Config) -> str | None:
    """The existing cluster's kubeconfig: ``--kubeconfig``, else ``$GPUSCALER_E2E_KUBECONFIG``, else None."""
    option = config.getoption("--kubeconfig", default=None)
    value = option or os.environ.get(KUBECONFIG_ENV)
    return str(Path(value).expanduser().absolute()) if value else None


def new_session_id() -> str:
    """A label value that names one pytest session (host-independent, unique enough)."""
    return f"s{os.getpid()}-{uuid.uuid4().hex[:6]}"


# -------------------------------------------------------------------------------- capabilities


def require(cluster: E2ECluster, capability: str) -> None:
    """Skip the calling test, with the reason, if the cluster lacks ``capability`` (see :data:`CAPABILITIES`)."""
    reason = missing(cluster, capability)
    if reason is not None:
        pytest.skip(reason)


def missing(cluster: E2ECluster, capability: str) -> str | None:
    """Why the cluster lacks ``capability``, or None when it has it. Probed once per session."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; known: {', '.join(CAPABILITIES)}")
    if capability not in cluster.missing:
        cluster.missing[capability] = _probe(cluster, capability)
    return cluster.missing[capability]


def _probe(cluster: E2ECluster, capability: str) -> str | None:
    if capability == "helm":
        if shutil.which("helm", path=cluster.env.get("PATH")) is None:
            return "needs helm on PATH (gpuscaler dev-cluster build puts one in the binary cache)"
        return None
    if cluster.cluster is not None:  # the private dev cluster has kwok with gpuscaler's stages
        return None
    if capability == "private":
        return f"restarts the control plane: runs only on a private dev cluster, not with {KUBECONFIG_ENV}"
    return probe_kwok(cluster)


def probe_kwok(cluster: E2ECluster, *, timeout: float | None = None, annotation_value: str = "fake") -> str | None:
    """Install gpuscaler's stages where kwok reads Stage objects, then watch a probe node turn Ready.

    Returns why kwok is missing, or None. ``annotation_value`` is the probe node's
    ``kwok.x-k8s.io/node`` value (kwok manages ``fake``); ``timeout`` defaults to
    ``$GPUSCALER_E2E_KWOK_TIMEOUT`` or :data:`KWOK_PROBE_TIMEOUT_S`.
    """
    install_kwok_stages(cluster)
    core = _api(client.CoreV1Api, cluster)
    name = f"gpuscaler-e2e-kwok-probe-{cluster.session}"
    if timeout is None:
        timeout = float(os.environ.get(KWOK_PROBE_TIMEOUT_ENV, KWOK_PROBE_TIMEOUT_S))
    core.create_node(
        {
            "metadata": {
                "name": name,
                "labels": {"type": "kwok", E2E_LABEL: "true", SESSION_LABEL: cluster.session},
                "annotations": {
                    KWOK_NODE_ANNOTATION: annotation_value,
                    NODE_READY_DELAY_ANNOTATION: f"{KWOK_PROBE_DELAY_S}s",
                },
            },
            # nothing but this probe's own checks should ever land here
            "spec": {"taints": [{"key": "gpuscaler.io/e2e-probe", "effect": "NoSchedule"}]},
        }
    )
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            node = core.read_node(name)
            ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
            if ready:
                if time.monotonic() - t0 < KWOK_PROBE_EARLY_S:
                    return (
                        "kwok here ignores the delay annotations of gpuscaler's stages "
                        "(apply e2e/kind/stages.yaml over its Stage objects)"
                    )
                return None
            time.sleep(0.25)
        return (
            f"needs kwok: a Node annotated {KWOK_NODE_ANNOTATION}=fake did not turn Ready in {timeout:.0f}s "
            "(install it: e2e/kind/kwok.yaml, then e2e/kind/stages.yaml)"
        )
    finally:
        with contextlib.suppress(ApiException):
            core.delete_node(name)


# ------------------------------------------------------------------------------------ installing


def stage_documents() -> list[dict[str, Any]]:
    """gpuscaler's kwok Stage objects (:data:`gpuscaler.devcluster.stages.STAGES_YAML`)."""
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(STAGES_YAML) if d]
    return docs


def install_kwok_stages(cluster: E2ECluster) -> list[str]:
    """Create those of gpuscaler's Stage objects the cluster lacks, if it has kwok's Stage CRD.

    Returns the names created (removed again by :func:`sweep`). Stage objects that exist are left
    as they are, whoever made them.
    """
    ext = _api(client.ApiextensionsV1Api, cluster)
    try:
        if ext.read_custom_resource_definition(STAGE_CRD).metadata.deletion_timestamp is not None:
            return []  # on its way out: no kwok reads Stage objects here
    except ApiException as err:
        if err.status == 404:
            return []
        raise
    custom = _api(client.CustomObjectsApi, cluster)
    created: list[str] = []
    for doc in stage_documents():
        doc["metadata"].setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY
        try:
            custom.create_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, doc)
        except ApiException as err:
            if err.status == 404:  # the CRD went away meanwhile
                break
            if err.status != 409:
                raise
            continue
        created.append(doc["metadata"]["name"])
    cluster.created_stages.extend(created)
    return created


def track_new_crds(cluster: E2ECluster, names: Iterable[str]) -> list[str]:
    """On an existing cluster, record which of the CRDs ``names`` are not there yet, so that
    :func:`sweep` deletes them once the session has installed them. Returns the ones that exist."""
    if cluster.cluster is not None:
        return []
    ext = _api(client.ApiextensionsV1Api, cluster)
    existing = []
    for name in names:
        try:
            crd = ext.read_custom_resource_definition(name)
        except ApiException as err:
            if err.status != 404:
                raise
            if name not in cluster.created_crds:
                cluster.created_crds.append(name)
        else:
            if name not in cluster.created_crds and (crd.metadata.labels or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
                existing.append(name)
    return existing


def claim_crds(cluster: E2ECluster, bodies: Iterable[dict[str, Any]]) -> None:
    """Before the suite installs third-party CRDs on an existing cluster: skip if any is the cluster's.

    A CRD that exists and was not installed by this suite (no :data:`MANAGED_BY_LABEL`) belongs to
    the cluster: a real Karpenter's or Cluster API's. Replacing it could break what runs there (and
    a second controller would fight the first), so the test skips. Otherwise each body gets the
    label and the new CRDs are recorded for :func:`sweep`. On the private dev cluster: nothing.
    """
    if cluster.cluster is not None:
        return
    bodies = list(bodies)
    theirs = track_new_crds(cluster, [b["metadata"]["name"] for b in bodies])
    if theirs:
        pytest.skip(f"the cluster has its own CRD {theirs[0]} (not installed by this suite): not replacing it")
    for body in bodies:
        body["metadata"].setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY


# ------------------------------------------------------------------------------------ cleaning up


def session_namespaces(cluster: E2ECluster) -> list[str]:
    """The namespaces this session created that still exist (Terminating ones included)."""
    core = _api(client.CoreV1Api, cluster)
    items = core.list_namespace(label_selector=f"{SESSION_LABEL}={cluster.session}").items
    return sorted(ns.metadata.name for ns in items)


def _release_trainingjobs(cluster: E2ECluster, namespace: str) -> int:
    """Drop the finalizer of every TrainingJob left in ``namespace`` (no operator will release them now)."""
    custom = _api(client.CustomObjectsApi, cluster)
    try:
        jobs = custom.list_namespaced_custom_object(
            trainingjob.API_GROUP, trainingjob.API_VERSION, namespace, trainingjob.PLURAL
        )["items"]
    except ApiException as err:
        if err.status == 404:  # no TrainingJob CRD (any more)
            return 0
        raise
    for job in jobs:
        if job["metadata"].get("finalizers"):
            with contextlib.suppress(ApiException):
                custom.patch_namespaced_custom_object(
                    trainingjob.API_GROUP,
                    trainingjob.API_VERSION,
                    namespace,
                    trainingjob.PLURAL,
                    job["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )
    return len(jobs)


def _session_nodes(cluster: E2ECluster, namespaces: Iterable[str]) -> list[str]:
    """Nodes made for the session's jobs (job label ``<namespace>.<name>``) and its probe nodes."""
    core = _api(client.CoreV1Api, cluster)
    prefixes = tuple(f"{ns}." for ns in namespaces)
    names = []
    for node in core.list_node(label_selector=JOB_LABEL).items:
        if prefixes and node.metadata.labels[JOB_LABEL].startswith(prefixes):
            names.append(node.metadata.name)
    for node in core.list_node(label_selector=f"{SESSION_LABEL}={cluster.session}").items:
        names.append(node.metadata.name)
    return sorted(set(names))


HELM_RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
"""Annotation Helm puts on every object of a release, cluster-scoped ones included."""
HELM_CLUSTER_SCOPED = (
    ("clusterrole", client.RbacAuthorizationV1Api, "cluster_role"),
    ("clusterrolebinding", client.RbacAuthorizationV1Api, "cluster_role_binding"),
    ("validatingadmissionpolicy", client.AdmissionregistrationV1Api, "validating_admission_policy"),
    ("validatingadmissionpolicybinding", client.AdmissionregistrationV1Api, "validating_admission_policy_binding"),
    ("mutatingadmissionpolicy", client.AdmissionregistrationV1Api, "mutating_admission_policy"),
    ("mutatingadmissionpolicybinding", client.AdmissionregistrationV1Api, "mutating_admission_policy_binding"),
)
"""The cluster-scoped kinds the chart installs: (name, API class, method suffix of list_/delete_); the
mutating ones only where the API server serves them (Kubernetes >= 1.36)."""


CHART_CRDS_DIR = Path(__file__).resolve().parents[1] / "helm" / "gpuscaler" / "crds"
"""The CRDs ``helm install`` of the chart creates when they are missing (gpuscaler's, kopf's peering)."""


def chart_crd_names() -> set[str]:
    """The names of the CRDs in the chart's ``crds/`` directory."""
    names = set()
    for path in CHART_CRDS_DIR.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                names.add(str(doc["metadata"]["name"]))
    return names


def crd_names(cluster: E2ECluster) -> set[str]:
    """Every CRD on the cluster."""
    ext = _api(client.ApiextensionsV1Api, cluster)
    return {c.metadata.name for c in ext.list_custom_resource_definition().items}


def _helm_leftovers(cluster: E2ECluster, namespaces: Iterable[str]) -> list[str]:
    """Delete the cluster-scoped objects of Helm releases in ``namespaces`` (an uninstall that never ran)."""
    wanted = set(namespaces)
    removed = []
    for kind, api_class, suffix in HELM_CLUSTER_SCOPED:
        api = _api(api_class, cluster)
        try:
            found = getattr(api, f"list_{suffix}")().items
        except ApiException:  # a kind this API server does not serve
            continue
        for obj in found:
            if (obj.metadata.annotations or {}).get(HELM_RELEASE_NAMESPACE) in wanted:
                with contextlib.suppress(ApiException):
                    getattr(api, f"delete_{suffix}")(obj.metadata.name)
                    removed.append(f"{kind}/{obj.metadata.name}")
    return removed


def sweep(cluster: E2ECluster, timeout: float = 120.0) -> list[str]:
    """Remove what this session left on the cluster; returns what was removed (for the summary).

    Waits up to ``timeout`` for the namespaces to be gone, so that a script checking the cluster
    right after pytest finds it as it was.
    """
    core = _api(client.CoreV1Api, cluster)
    removed: list[str] = []
    namespaces = sorted(set(session_namespaces(cluster)) | set(cluster.namespaces))
    for node in _session_nodes(cluster, namespaces):
        with contextlib.suppress(ApiException):
            core.delete_node(node)
            removed.append(f"node/{node}")
    for ns in namespaces:
        _release_trainingjobs(cluster, ns)
        try:
            if core.read_namespace(ns).metadata.deletion_timestamp is None:  # else: already on its way
                core.delete_namespace(ns, propagation_policy="Background")
                removed.append(f"namespace/{ns}")
        except ApiException as err:
            if err.status not in (404, 409):
                raise
    removed += _helm_leftovers(cluster, namespaces)
    custom = _api(client.CustomObjectsApi, cluster)
    for stage in cluster.created_stages:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(STAGE_GROUP, STAGE_VERSION, STAGE_PLURAL, stage)
            removed.append(f"stage/{stage}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [ns for ns in session_namespaces(cluster) if ns in namespaces]
        if not left:
            break
        for ns in left:  # a job created while the namespace was terminating holds it again
            _release_trainingjobs(cluster, ns)
        time.sleep(0.5)
    ext = _api(client.ApiextensionsV1Api, cluster)
    crds = list(cluster.created_crds)
    if cluster.crds_before is not None:  # the chart's CRDs Helm installed during the session
        crds += sorted((crd_names(cluster) - cluster.crds_before) & chart_crd_names())
    for crd in dict.fromkeys(crds):
        with contextlib.suppress(ApiException):
            ext.delete_custom_resource_definition(crd)
            removed.append(f"crd/{crd}")
    while time.monotonic() < deadline:  # the API server removes a CRD once its objects are gone
        if not crd_names(cluster) & set(crds):
            break
        time.sleep(0.5)
    return removed
