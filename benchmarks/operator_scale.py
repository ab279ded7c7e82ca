"""Operator scale: apply N TrainingJobs at once; where the API requests, status writes, planner calls and CPU go.

Starts a dev cluster (or uses ``--kubeconfig``), installs the CRD and, in one run:

1. **background**: ``--idle`` seconds with no operator and nothing applied (the control plane's
   own request rate);
2. **apply without the operator**: one ``kubectl apply`` of the N one-node jobs into a fresh
   namespace, the operator not running;
3. starts ``gpuscaler run`` as a subprocess (kwok provider, namespaced to a second fresh namespace),
   with the Helm chart's finalizer policy for that namespace where the API server serves the kind,
   as the chart installs it (rendered from the chart: :mod:`gpuscaler.devcluster.chart`; the
   finalizer is put on at creation, so kopf sends no PATCH; ``--no-finalizer-policy``: kopf adds it);
4. **apply with the operator**: the same N objects, one ``kubectl apply``, into that namespace;
5. **apply -> all Running**: from the apply's return until every job is Running (or ``--timeout``).

Before and after each phase it reads, as the dev cluster's admin, the API server's ``/metrics``:
``apiserver_request_total`` (by verb and resource) and
``apiserver_flowcontrol_dispatched_requests_total`` (by API priority-and-fairness flow schema,
i.e. by client identity). ``apiserver_request_total`` has no client or user-agent label, so the
operator's share of it is separated by running the phase without the operator (phase 2 against
phase 4; the background rate of phase 1 against phase 5). It also reads the operator's own
``/metrics`` (planner calls: ``gpuscaler_planner_latency_seconds_count``; reconcile steps:
``gpuscaler_reconcile_duration_seconds_count``) and CPU seconds from ``/proc/<pid>/stat`` of the
operator and, when the cluster's ``state.json`` is next to the kubeconfig, of each control-plane
component. Prints every figure per phase and per job, the creation-to-Running median and p95, the
apply time with and without the operator, and the operator's peak RSS (``VmHWM``).

``--nodes N`` first creates N Ready fake GPU nodes of the jobs' instance type (p3.2xlarge, one GPU,
on-demand) and runs the operator with the static provider, so the jobs run on those nodes and the
operator watches N nodes it did not make (``--provider kwok`` keeps the kwok provider, which then
makes a node per job beside the N). ``--spot-notice`` (kwok provider) first runs one job to
Running, then, ``--notice-after`` seconds into the apply of the N jobs, puts the
``gpuscaler.io/interruption-notice`` annotation on its node and prints how long the operator took
to write ``gpuscaler.io/checkpoint-requested`` on its worker (the budget: 2 s while 500 jobs are
being planned).

Requests by client: the private dev cluster's API server writes an audit log (every request at
Metadata level; ``--no-audit`` turns it off), and the benchmark prints, from the apply's start until
all are Running, the requests of each client (the operator by its User-Agents ``gpuscaler-operator/``
and ``kopf/``, kwok, kubectl, the scheduler, each controller of the controller-manager by its
service account) and by (client, verb, resource): the operator's own requests per job are measured,
not bounded.

``--baseline ideal`` runs, in place of the operator, the least any operator must do
(:class:`IdealOperator`: per job one kwok node and, once it is Ready, one pod; no planning, status or
Events) and prints the same figures: the floor of the apply's slow-down on this machine.

``--against-ideal`` measures the scale target in one run: after the apply without the operator,
the ideal baseline answers the same N jobs in a third fresh namespace (apply, then until all its
pods are Running; its nodes and namespace are then deleted and the cluster left to settle), then
the operator's phases run as above, and the run ends with the line

    apply with operator X s = R x the ideal baseline's Y s (target <= 1.5x); p95 Z s (target <= 10 s)

(the target: ``kubectl apply`` of 500 jobs with the operator at most 1.5x the same apply with the
least possible operator, and creation-to-Running p95 at most 10 s).
``--apf SHARES`` runs the operator as the Helm chart's ServiceAccount (a token kubeconfig) under the
chart's FlowSchema and PriorityLevelConfiguration (``apiPriority`` values) with that many shares, so
API Priority and Fairness applies to it (system:masters is exempt).

    python benchmarks/operator_scale.py --jobs 100
    python benchmarks/operator_scale.py --jobs 1000 --nodes 2000
    python benchmarks/operator_scale.py --jobs 500 --spot-notice
    python benchmarks/operator_scale.py --jobs 500 --baseline ideal
    python benchmarks/operator_scale.py --jobs 500 --against-ideal
    python benchmarks/operator_scale.py --jobs 500 --apf 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuscaler.cloud import job_label_value
from gpuscaler.devcluster import chart
from gpuscaler.devcluster.cluster import (
    AUDIT_LOG_ENV,
    ClusterState,
    apply_crds,
    existing_or_private,
    free_ports,
)
from gpuscaler.devcluster.nodes import create_node_pool, wait_nodes_ready
from gpuscaler.devcluster.watch import RawWatch
from gpuscaler.handlers.trainingjob import USER_AGENT as OPERATOR_AGENT
from gpuscaler.names import INTERRUPTION_ANNOTATION, JOB_LABEL
from gpuscaler.runtime.constants import ANNOTATION_CHECKPOINT_REQUESTED
from gpuscaler.testing import pinned, training_job

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
REQUESTS = "apiserver_request_total"
FLOWS = "apiserver_flowcontrol_dispatched_requests_total"
PLANNER = "gpuscaler_planner_latency_seconds"
RECONCILE = "gpuscaler_reconcile_duration_seconds"
WATCH_EVENTS = "gpuscaler_watch_events_total"
STATUS_WRITE = ("PATCH", "trainingjobs.gpuscaler.io/status")
APF_NAMESPACE = "gpuscaler-system"
APF_RELEASE = "gs"
"""``--apf``: the chart is rendered as release ``gs`` in this namespace (its ServiceAccount ``gs-gpuscaler``)."""


FLOW_NOTE = {
    "exempt": "system:masters: operator, kwok, kubectl, this benchmark, API server loopback",
    "kube-scheduler": "kube-scheduler",
    "kube-controller-manager": "kube-controller-manager",
    "kube-system-service-accounts": "controllers (service-account credentials)",
    f"{APF_RELEASE}-gpuscaler": "operator (--apf: the chart's FlowSchema)",
}
KWOK_WRITES = {
    ("PATCH", "pods/status"),
    ("PATCH", "nodes/status"),
    ("POST", "leases.coordination.k8s.io"),
    ("PUT", "leases.coordination.k8s.io"),
}
"""Rows only kwok writes on the dev cluster (pod phases, node status and heartbeats); kwok shares the
exempt flow schema with the operator."""
AUDIT_VERBS = {
    "get": "GET",
    "list": "LIST",
    "watch": "WATCH",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
    "deletecollection": "DELETE",
}
"""The audit log's verbs as the request tables spell them (HTTP method; LIST and WATCH for collection GETs)."""
BENCH_AGENT = "gpuscaler-benchmark"
"""User-Agent of this benchmark's own API calls (its watches, the spot notice, reading /metrics)."""
IDEAL_AGENT = "gpuscaler-ideal-baseline"
"""User-Agent of ``--baseline ideal``: the least an operator must do (:class:`IdealOperator`)."""
INSTANCE_TYPE = "p3.2xlarge"
"""The jobs' one instance type (1 x V100-16GB), also that of the ``--nodes`` pre-created nodes."""
VICTIM = "spot-victim"
"""The job that gets the spot notice in ``--spot-notice`` (left out of the latency figures)."""
IDEAL_RATIO_TARGET = 1.5
"""Target: ``kubectl apply`` of the jobs takes at most this many times as long with the operator as
with the ideal baseline (the least any operator must do), measured in one run (``--against-ideal``)."""
P95_TARGET_S = 10.0
"""Target: creation-to-Running p95 of the applied jobs (500 at once), seconds."""
OWN_REQUESTS_TARGET = 15.0
"""Target: API requests per job from creation to Running."""
NOTICE_BUDGET_S = 2.0
"""Target: a spot notice on a running job is answered (checkpoint requested) within this, under load."""


def job(i: int | str) -> dict[str, Any]:
    return training_job(i if isinstance(i, str) else f"bench-{i}", constraints=pinned(INSTANCE_TYPE))


# --------------------------------------------------------------------------------------------
# pure helpers (tests/test_operator_scale_bench.py)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called ``name`` in a Prometheus text exposition."""
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def requests_by_verb_resource(text: str, failed: bool = False) -> Counter[tuple[str, str]]:
    """``apiserver_request_total`` summed over codes and versions, by (verb, resource): the resource is
    ``resource[.group][/subresource]``; non-resource requests (``/metrics``, ``/healthz``, discovery) are
    left out. ``failed``: only the answers with an HTTP code of 400 or more (e.g. 409 Conflict)."""
    out: Counter[tuple[str, str]] = Counter()
    for labels, value in samples(text, REQUESTS):
        resource = labels.get("resource", "")
        if not resource or (failed and not labels.get("code", "").isdigit()):
            continue
        if failed and int(labels["code"]) < 400:
            continue
        group, sub = labels.get("group", ""), labels.get("subresource", "")
        key = resource + (f".{group}" if group else "") + (f"/{sub}" if sub else "")
        out[(labels.get("verb", ""), key)] += int(value)
    return out


def by_label(text: str, name: str, label: str) -> Counter[str]:
    """A metric's samples summed by one label."""
    out: Counter[str] = Counter()
    for labels, value in samples(text, name):
        out[labels.get(label, "")] += int(value)
    return out


def total(text: str, name: str) -> float:
    """Sum of a metric's samples (e.g. a histogram's ``_count`` or ``_sum``); 0 when absent."""
    return sum(v for _, v in samples(text, name))


def delta(after: Mapping[Any, int], before: Mapping[Any, int]) -> Counter[Any]:
    """after - before per key, keeping negative and dropping zero entries (counters only grow, but a
    subtraction of two runs may go below zero)."""
    out: Counter[Any] = Counter()
    for k in set(after) | set(before):
        d = after.get(k, 0) - before.get(k, 0)
        if d:
            out[k] = d
    return out


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (as the benchmark always printed it)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def verdict(op_apply_s: float, ideal_apply_s: float, p95_s: float) -> str:
    """The scale target's line: the apply with the operator against the ideal baseline's, and the p95.

    ``R = op_apply_s / ideal_apply_s``; met when ``R <= IDEAL_RATIO_TARGET`` and ``p95_s <= P95_TARGET_S``.
    """
    ratio = op_apply_s / ideal_apply_s if ideal_apply_s > 0 else float("inf")
    met = ratio <= IDEAL_RATIO_TARGET and p95_s <= P95_TARGET_S
    return (
        f"apply with operator {op_apply_s:.1f} s = {ratio:.2f} x the ideal baseline's {ideal_apply_s:.1f} s "
        f"(target <= {IDEAL_RATIO_TARGET:g}x); p95 {p95_s:.1f} s (target <= {P95_TARGET_S:g} s): "
        + ("met" if met else "NOT met")
    )


def audit_client(event: Mapping[str, Any]) -> str:
    """Who made an audited request, from its user and User-Agent: ``operator`` (kopf's and the
    operator's own client), ``operator (ideal)``, ``kwok``, ``kubectl``, ``benchmark``, ``scheduler``,
    ``kcm/<controller>`` (the controller-manager's per-controller service accounts), ``apiserver``,
    else the User-Agent's product (or the user name)."""
    user = str((event.get("user") or {}).get("username") or "")
    agent = str(event.get("userAgent") or "")
    if agent.startswith((OPERATOR_AGENT, "kopf/")):
        return "operator"
    if agent.startswith(IDEAL_AGENT):
        return "operator (ideal)"
    if agent.startswith(BENCH_AGENT):
        return "benchmark"
    if user.startswith("system:serviceaccount:kube-system:"):
        return "kcm/" + user.rsplit(":", 1)[1]
    if user == "system:kube-scheduler":
        return "scheduler"
    if user == "system:kube-controller-manager":
        return "kcm"
    if agent.startswith("kwok"):
        return "kwok"
    if agent.startswith("kubectl"):
        return "kubectl"
    if user.startswith("system:apiserver"):
        return "apiserver"
    return agent.split("/", 1)[0] or user or "?"


def audit_request(event: Mapping[str, Any]) -> tuple[str, str, str, int] | None:
    """(client, verb, resource, HTTP code) of one audit event, or None when it is not one request's
    record: a resource request is counted once, when answered (``ResponseComplete``, ``Panic``), a
    WATCH when it starts (``ResponseStarted``); non-resource requests (/metrics, discovery) are left out.
    The resource is spelt as in :func:`requests_by_verb_resource`."""
    verb = str(event.get("verb") or "")
    stage = event.get("stage")
    if (verb == "watch" and stage != "ResponseStarted") or (verb != "watch" and stage not in ("ResponseComplete", "Panic")):
        return None
    ref = event.get("objectRef") or {}
    resource = ref.get("resource")
    if not resource:
        return None
    group, sub = ref.get("apiGroup") or "", ref.get("subresource") or ""
    key = resource + (f".{group}" if group else "") + (f"/{sub}" if sub else "")
    code = int((event.get("responseStatus") or {}).get("code") or 0)
    return audit_client(event), AUDIT_VERBS.get(verb, verb.upper()), key, code


def audit_counts(
    lines: Iterable[str], start: float, end: float
) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str, str]]]:
    """Requests received in ``[start, end)`` (Unix seconds) by (client, verb, resource), and those of
    them answered with a code of 400 or more, from an audit log's JSON lines."""
    counts: Counter[tuple[str, str, str]] = Counter()
    failed: Counter[tuple[str, str, str]] = Counter()
    for line in lines:
        if not line.strip():
            continue
        ev = json.loads(line)
        req = audit_request(ev)
        if req is None:
            continue
        at = datetime.fromisoformat(str(ev.get("requestReceivedTimestamp")).replace("Z", "+00:00")).timestamp()
        if not start <= at < end:
            continue
        key = req[:3]
        counts[key] += 1
        if req[3] >= 400:
            failed[key] += 1
    return counts, failed


# --------------------------------------------------------------------------------------------
# reading the cluster and the operator


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, seconds (NaN when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def rss_mib(pid: int, field: str = "VmHWM") -> float:
    """A process's peak (``VmHWM``) or current (``VmRSS``) resident set, MiB (NaN when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return float("nan")
    for line in lines:
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class NoticeProbe(threading.Thread):
    """The spot-notice scenario: ``after`` seconds after :meth:`start`, annotate a running job's node with
    an interruption notice, then watch its worker pods until the operator writes its checkpoint request.
    ``answered`` is the seconds from the annotation's write to the request (None until seen)."""

    def __init__(
        self, core: Any, namespace: str, job_name: str, node: str, after: float, timeout: float
    ) -> None:
        super().__init__(daemon=True)
        self.core = core
        self.namespace = namespace
        self.selector = f"{JOB_LABEL}={job_label_value(namespace, job_name)}"
        self.node = node
        self.after = after
        self.timeout = timeout
        self.answered: float | None = None
        self.error = ""
        self.requests: Counter[tuple[str, str]] = Counter()

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # a figure is missing then, and the report says why
            self.error = repr(e)

    def _run(self) -> None:
        time.sleep(self.after)
        self.requests["PATCH", "nodes"] += 1
        self.core.patch_node(self.node, {"metadata": {"annotations": {INTERRUPTION_ANNOTATION: "benchmark"}}})
        t0 = time.monotonic()
        while self.answered is None and time.monotonic() - t0 < self.timeout:
            self.requests["LIST", "pods"] += 1
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
            rv = pods.metadata.resource_version
            if any(ANNOTATION_CHECKPOINT_REQUESTED in (p.metadata.annotations or {}) for p in pods.items):
                self.answered = time.monotonic() - t0
                return
            self.requests["WATCH", "pods"] += 1
            resp = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=self.selector,
                watch=True,
                resource_version=rv,
                timeout_seconds=max(1, int(self.timeout)),
                _preload_content=False,
            )
            for line in resp:
                ann = (json.loads(line)["object"].get("metadata") or {}).get("annotations") or {}
                if ANNOTATION_CHECKPOINT_REQUESTED in ann:
                    self.answered = time.monotonic() - t0
                    break
            resp.release_conn()


@dataclass
class Snapshot:
    """What one reading of the metrics and /proc gives."""

    at: float
    wall: float
    """Unix time of the reading (the audit log's clock)."""
    requests: Counter[tuple[str, str]]
    failed: Counter[tuple[str, str]]
    flows: Counter[str]
    op_metrics: str
    op_cpu: float
    cluster_cpu: dict[str, float]


@dataclass
class Probe:
    api: Any
    op_port: int
    cluster_pids: dict[str, int]
    op_pid: int | None = None
    scrapes: int = 0

    def snap(self) -> Snapshot:
        resp = self.api.call_api("GET", f"{self.api.configuration.host}/metrics", {"Accept": "text/plain"})
        text = resp.read().decode()
        self.scrapes += 1
        op_text = ""
        if self.op_pid is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.op_port}/metrics", timeout=10) as r:
                    op_text = r.read().decode()
            except OSError:
                pass
        return Snapshot(
            time.monotonic(),
            time.time(),
            requests_by_verb_resource(text),
            requests_by_verb_resource(text, failed=True),
            by_label(text, FLOWS, "flow_schema"),
            op_text,
            cpu_seconds(self.op_pid) if self.op_pid is not None else 0.0,
            {c: cpu_seconds(p) for c, p in self.cluster_pids.items()},
        )


@dataclass
class Phase:
    name: str
    before: Snapshot
    after: Snapshot
    own: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests this benchmark made itself during the phase (besides kubectl apply)."""

    @property
    def seconds(self) -> float:
        return self.after.at - self.before.at

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        return delta(delta(self.after.requests, self.before.requests), self.own)

    @property
    def failed(self) -> Counter[tuple[str, str]]:
        return delta(self.after.failed, self.before.failed)

    @property
    def flows(self) -> Counter[str]:
        return delta(self.after.flows, self.before.flows)

    def op(self, name: str) -> float:
        return total(self.after.op_metrics, name) - total(self.before.op_metrics, name)

    def op_by(self, name: str, label: str, value: str) -> float:
        """The change of the operator's metric ``name`` where ``label`` is ``value``."""
        return by_label(self.after.op_metrics, name, label)[value] - by_label(self.before.op_metrics, name, label)[value]

    @property
    def op_cpu(self) -> float:
        return self.after.op_cpu - self.before.op_cpu

    def cluster_cpu(self) -> dict[str, float]:
        return {c: self.after.cluster_cpu[c] - self.before.cluster_cpu[c] for c in self.after.cluster_cpu}


class JobWatcher(RawWatch):
    """Watch a namespace's TrainingJobs (raw JSON stream) and record when each was first seen Running,
    as seconds after its API-server creation timestamp (1 s resolution)."""

    def __init__(self, custom: Any, namespace: str) -> None:
        super().__init__("trainingjob")
        self.custom = custom
        self.namespace = namespace
        self.running: dict[str, float] = {}
        self.requests: Counter[tuple[str, str]] = Counter()

    def list_call(self, **kw: Any) -> Any:
        self.requests["WATCH" if kw.get("watch") else "LIST", "trainingjobs.gpuscaler.io"] += 1
        return self.custom.list_namespaced_custom_object(
            "gpuscaler.io", "v1alpha1", self.namespace, "trainingjobs", **kw
        )

    def _running(self, obj: dict[str, Any]) -> tuple[str, float] | None:
        """(job name, its creation as Unix time) when ``obj`` shows the job Running, else None."""
        if (obj.get("status") or {}).get("phase") != "Running":
            return None
        born = datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        return str(obj["metadata"]["name"]), born.timestamp()

    def seen(self, obj: dict[str, Any]) -> None:
        got = self._running(obj)
        if got is not None and got[0] not in self.running:
            self.running[got[0]] = time.time() - got[1]


JOB_ANNOTATION = "benchmark.gpuscaler.io/job"
JOB_CREATED_ANNOTATION = "benchmark.gpuscaler.io/job-created"
"""On the ideal baseline's pods: the TrainingJob's name and creationTimestamp (for the latency)."""


class PodWatcher(JobWatcher):
    """``--baseline ideal``: no status says Running, so a job counts as Running when its pod does,
    timed from the job's creation (the annotations :class:`IdealOperator` puts on the pod)."""

    def list_call(self, **kw: Any) -> Any:
        self.requests["WATCH" if kw.get("watch") else "LIST", "pods"] += 1
        return self.custom.list_namespaced_pod(self.namespace, **kw)

    def _running(self, obj: dict[str, Any]) -> tuple[str, float] | None:
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        if (obj.get("status") or {}).get("phase") != "Running" or JOB_ANNOTATION not in ann:
            return None
        born = datetime.fromisoformat(ann[JOB_CREATED_ANNOTATION].replace("Z", "+00:00"))
        return str(ann[JOB_ANNOTATION]), born.timestamp()


class IdealOperator(threading.Thread):
    """``--baseline ideal``: the least any operator must do for a one-node job, run in place of
    gpuscaler. For each TrainingJob that appears in the namespace: one node through the same kwok
    (the kwok provider's node, :class:`gpuscaler.cloud.kwok.KwokProvider`) and, once that node is
    Ready, one pod for it, which the scheduler binds there (as the operator does: a pod made before its
    node is Ready costs the scheduler a FailedScheduling Event and status patch per attempt). It
    watches the namespace's TrainingJobs and the job nodes (one LIST and WATCH each, opened before the
    apply). Nothing else: no planning, no status, no Events, no Service, no worker identity, no
    finalizer. ``threads`` creates run at once, as many as the operator's step threads."""

    def __init__(self, api: Any, namespace: str, delay_s: float, threads: int = 8) -> None:
        super().__init__(daemon=True)
        from kubernetes import client

        from gpuscaler.catalog import load_catalog
        from gpuscaler.cloud.kwok import KwokProvider

        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.provider = KwokProvider(api, provisioning_delay_s=delay_s)
        self.instance = load_catalog().instance(INSTANCE_TYPE)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="ideal")
        self.jobs: dict[str, dict[str, Any]] = {}
        """Job label value -> the TrainingJob's metadata, until its pod is made."""
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.nodes_ready = threading.Event()

    def run(self) -> None:
        threading.Thread(target=self._guard, args=(self._watch_nodes,), daemon=True).start()
        self.nodes_ready.wait(30)
        self._guard(self._watch_jobs)

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except Exception as e:  # the stream breaks when the cluster stops: expected then
            if not self.stop.is_set():
                self.errors.append(repr(e))

    def _stream(self, list_fn: Any, ready: threading.Event, *args: Any, **kw: Any) -> Any:
        rv = list_fn(*args, limit=1, _preload_content=False)
        rv = json.loads(rv.data)["metadata"]["resourceVersion"]
        while not self.stop.is_set():
            resp = list_fn(*args, **kw, watch=True, resource_version=rv, timeout_seconds=60, _preload_content=False)
            ready.set()
            for line in resp:
                ev = json.loads(line)
                rv = ev["object"]["metadata"].get("resourceVersion", rv)
                yield ev
            resp.release_conn()

    def _watch_jobs(self) -> None:
        for ev in self._stream(
            self.custom.list_namespaced_custom_object, self.ready, "gpuscaler.io", "v1alpha1", self.namespace, "trainingjobs"
        ):
            if ev["type"] == "ADDED":
                self.pool.submit(self.start_job, ev["object"]["metadata"])

    def _watch_nodes(self) -> None:
        for ev in self._stream(self.core.list_node, self.nodes_ready, label_selector=JOB_LABEL):
            node = ev["object"]
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or []
            )
            label = (node["metadata"].get("labels") or {}).get(JOB_LABEL)
            if ready and label:
                with self.lock:
                    meta = self.jobs.pop(label, None)
                if meta is not None:
                    self.pool.submit(self.start_pod, meta)

    def _request(self, name: str) -> Any:
        from gpuscaler.catalog import CapacityType
        from gpuscaler.cloud import JobRef, NodeRequest

        price = self.instance.price(CapacityType.ON_DEMAND) or 0.0
        return NodeRequest(JobRef(self.namespace, name), self.instance, CapacityType.ON_DEMAND, 1, price)

    def start_job(self, meta: dict[str, Any]) -> None:
        """The job's node (its pod follows when the node is Ready)."""
        request = self._request(meta["name"])
        with self.lock:
            self.jobs[request.job.label] = meta
        try:
            self.provider.ensure_nodes(request, [])
        except Exception as e:  # reported with the figures
            self.errors.append(f"{meta['name']}: {e!r}")

    def start_pod(self, meta: dict[str, Any]) -> None:
        """The job's one pod, for its Ready node."""
        request = self._request(meta["name"])
        sched = self.provider.scheduling(request)
        try:
            self.core.create_namespaced_pod(
                self.namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{meta['name']}-worker-0",
                        "labels": {JOB_LABEL: request.job.label},
                        "annotations": {JOB_ANNOTATION: meta["name"], JOB_CREATED_ANNOTATION: meta["creationTimestamp"]},
                    },
                    "spec": {
                        "containers": [
                            {
                                "name": "train",
                                "image": "train",
                                "resources": {"limits": {"nvidia.com/gpu": str(self.instance.gpu_count)}},
                            }
                        ],
                        "nodeSelector": sched.node_selector,
                        "tolerations": sched.tolerations,
                        "restartPolicy": "Never",
                    },
                },
            )
        except Exception as e:  # reported with the figures
            self.errors.append(f"{meta['name']}: {e!r}")


@dataclass
class IdealRun:
    """``--against-ideal``: the ideal baseline's apply of the same jobs, in the same run."""

    apply: Phase
    wait: Phase
    latencies: list[float]
    """Creation-to-Running of each job (its pod Running), sorted."""
    errors: list[str]


def against_ideal(
    kubeconfig: str, api: Any, probe: Probe, run: Any, namespace: str, docs: str, n: int, delay: str, timeout: float
) -> IdealRun:
    """The ideal baseline's phase of ``--against-ideal``: the N jobs applied into ``namespace`` and
    answered by :class:`IdealOperator` until all their pods are Running; then the namespace and the
    baseline's nodes are deleted and waited for, so the operator's phases start without them."""
    _, baseline, watcher = _launch(True, kubeconfig, api, namespace, delay, {}, None, probe)
    assert baseline is not None
    try:
        watcher.start()
        watcher.ready.wait(30)
        s0 = probe.snap()
        run("apply", "-n", namespace, "-f", "-", input=docs)
        s1 = probe.snap()
        while len(watcher.running) < n and time.monotonic() - s0.at < timeout:
            time.sleep(0.2)
        s2 = probe.snap()
    finally:
        watcher.stop.set()
        baseline.stop.set()
    t0 = time.monotonic()
    run("delete", "namespace", namespace, "--wait=true", "--timeout=300s")  # kwok ends its pods while the nodes exist
    run("delete", "nodes", "-l", JOB_LABEL, "--wait=true", "--timeout=300s")
    print(f"ideal baseline's namespace and {n} nodes deleted in {time.monotonic() - t0:.1f}s", flush=True)
    return IdealRun(Phase("apply with the ideal baseline", s0, s1), Phase("ideal: apply -> all Running", s1, s2),
                    sorted(watcher.running.values()), baseline.errors)


def _ideal_phase(
    args: argparse.Namespace, kubeconfig: str, api: Any, probe: Probe, run: Any, namespace: str, docs: str
) -> IdealRun | None:
    """``--against-ideal``: the ideal baseline's phase (:func:`against_ideal`), then ``--idle`` seconds for
    the deletions' wave to settle before the operator starts; None without the flag."""
    if not args.against_ideal:
        return None
    run("create", "namespace", namespace)
    out = against_ideal(kubeconfig, api, probe, run, namespace, docs, args.jobs, args.delay, args.timeout)
    time.sleep(args.idle)
    return out


def _print_verdict(ideal: IdealRun | None, with_op: Phase, lat: list[float], n: int) -> bool:
    """``--against-ideal``: the target's line (:func:`verdict`), last; whether all the ideal's jobs ran."""
    if ideal is None:
        return True
    print("\n" + verdict(with_op.seconds, ideal.apply.seconds, quantile(lat, 0.95)))
    return len(ideal.latencies) == n


def _print_ideal(ideal: IdealRun | None, audit_log: str | None, n: int) -> None:
    """The ideal baseline's figures of ``--against-ideal`` (nothing without it)."""
    if ideal is None:
        return
    lat = ideal.latencies
    own = ""
    if audit_log:
        with Path(audit_log).open(encoding="utf-8") as fh:
            counts, _ = audit_counts(fh, ideal.apply.before.wall, ideal.wait.after.wall)
        mine = sum(k for (c, _, _), k in counts.items() if c == "operator (ideal)")
        own = f"; its own requests {mine / n:.1f} per job (audit log)"
    cpu = ideal.apply.cluster_cpu().get("kube-apiserver")
    print(
        f"ideal baseline, same run (namespace of its own, before the operator started): apply {ideal.apply.seconds:.1f}s, "
        f"Running: {len(lat)}"
        + (f", creation-to-Running median {statistics.median(lat):.1f}s, p95 {quantile(lat, 0.95):.1f}s" if lat else "")
        + own
        + (f"; kube-apiserver CPU during its apply {cpu:.1f}s" if cpu is not None else "")
        + (f"; errors: {ideal.errors[:3]}" if ideal.errors else "")
    )


# --------------------------------------------------------------------------------------------
# printing


def table(header: list[str], rows: Iterable[list[str]], indent: str = "  ") -> str:
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        indent
        + "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def fmt(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    ap.add_argument("--delay", default="1", help="kwok provisioning delay, seconds")
    ap.add_argument("--interval", default="1", help="the operator's reconcile interval, seconds")
    ap.add_argument("--idle", type=float, default=10, help="seconds of the no-operator background window")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--nodes",
        type=int,
        default=0,
        help=f"pre-create this many Ready {INSTANCE_TYPE} fake nodes (static provider)",
    )
    ap.add_argument(
        "--provider",
        choices=("kwok", "static"),
        help="the operator's provider (default: static with --nodes, else kwok)",
    )
    ap.add_argument(
        "--spot-notice",
        action="store_true",
        help="one running job gets a spot notice during the apply (kwok provider)",
    )
    ap.add_argument(
        "--notice-after", type=float, default=1.0, help="seconds into the apply the notice is given"
    )
    ap.add_argument(
        "--baseline",
        choices=("operator", "ideal"),
        default="operator",
        help="ideal: in place of gpuscaler, only one node and one pod per job (the floor any operator costs)",
    )
    ap.add_argument(
        "--against-ideal",
        action="store_true",
        help=(
            "in the same run, first the ideal baseline's apply of the same jobs; ends with the target's line: the apply "
            f"with the operator against the ideal's (<= {IDEAL_RATIO_TARGET:g}x) and the p95 (<= {P95_TARGET_S:g} s)"
        ),
    )
    ap.add_argument(
        "--apf",
        type=int,
        metavar="SHARES",
        help=(
            "run the operator as the chart's ServiceAccount (a token kubeconfig, not system:masters) under the "
            "chart's API Priority and Fairness objects with this nominalConcurrencyShares"
        ),
    )
    ap.add_argument(
        "--no-finalizer-policy",
        action="store_true",
        help=(
            "do not install the chart's finalizer policy (templates/finalizer-policy.yaml) for the operator's "
            "namespace: kopf then adds its finalizer with a PATCH of each job, as where the API server lacks the kind"
        ),
    )
    ap.add_argument(
        "--no-audit",
        action="store_true",
        help="no audit log (then no requests by client; the private cluster's API server writes one otherwise)",
    )
    args = ap.parse_args()
    n = args.jobs
    provider = args.provider or ("static" if args.nodes else "kwok")
    _check_args(ap, args, provider)
    ns = f"bench-{os.getpid()}"
    ns_without = f"{ns}-no-operator"
    ns_ideal = f"{ns}-ideal"
    from kubernetes import client, config

    ideal = args.baseline == "ideal"
    who = "the ideal baseline" if ideal else "the operator"
    with existing_or_private(args.kubeconfig, f"bench-op-{os.getpid()}", audit=not args.no_audit) as (kubeconfig, env):

        def run(*a: str, **kw: Any) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["kubectl", *a], env=env, check=True, capture_output=True, text=True, **kw)

        state = Path(kubeconfig).parent / "state.json"
        pids = ClusterState.load(state).pids if state.exists() else {}
        api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        api.user_agent = BENCH_AGENT
        audit_log = env.get(AUDIT_LOG_ENV)
        (op_port,) = free_ports(1)
        probe = Probe(api, op_port, pids)
        core = client.CoreV1Api(api)
        _node_pool(api, args.nodes)
        load_start = os.getloadavg()
        apply_crds(env, [ROOT / "crds" / "trainingjob.yaml"], ["trainingjobs.gpuscaler.io"])
        run("create", "namespace", ns)
        run("create", "namespace", ns_without)
        finalizer_policy = _finalizer_policy(env, ns, ideal or args.no_finalizer_policy)
        docs = yaml.safe_dump_all([job(i) for i in range(n)])
        run(
            "apply", "--dry-run=client", "-n", ns_without, "-f", "-", input=docs
        )  # fills kubectl's discovery cache

        # 1. background, 2. apply without the operator
        s = probe.snap()
        time.sleep(args.idle)
        idle = Phase("background", s, probe.snap())
        s = probe.snap()
        run("apply", "-n", ns_without, "-f", "-", input=docs)
        without = Phase("apply without operator", s, probe.snap())
        ideal_run = _ideal_phase(args, kubeconfig, api, probe, run, ns_ideal, docs)

        # 3. the operator
        op_env = dict(
            env,
            GPUSCALER_NAMESPACE=ns,
            GPUSCALER_METRICS_PORT=str(op_port),
            GPUSCALER_HEALTH_PORT="0",
            GPUSCALER_KWOK_PROVISIONING_DELAY_S=args.delay,
            GPUSCALER_RECONCILE_INTERVAL_S=args.interval,
            GPUSCALER_PROVIDER_NAME=provider,
        )
        _apf_identity(op_env, run, env, kubeconfig, args.apf)
        log = tempfile.NamedTemporaryFile(prefix="operator-", suffix=".log", delete=False)  # noqa: SIM115
        op, baseline, watcher = _launch(ideal, kubeconfig, api, ns, args.delay, op_env, log, probe)

        def alive() -> bool:
            return op is None or op.poll() is None

        startup_cpu = 0.0
        try:
            if op is not None:
                startup_cpu = _started(op, op_port)
            watcher.start()
            watcher.ready.wait(30)
            notice: NoticeProbe | None = None
            if args.spot_notice:
                notice = NoticeProbe(
                    core, ns, VICTIM, victim_node(run, ns, watcher, args.timeout), args.notice_after, args.timeout
                )
            load_apply = os.getloadavg()

            # 4. apply with the operator, 5. until all Running
            s0 = probe.snap()
            if notice is not None:
                notice.start()
            run("apply", "-n", ns, "-f", "-", input=docs)
            s1 = probe.snap()
            own_watch = Counter(watcher.requests)
            jobs_running = lambda: len(watcher.running) - (VICTIM in watcher.running)  # noqa: E731
            while jobs_running() < n and time.monotonic() - s0.at < args.timeout and alive():
                time.sleep(0.2)
            if notice is not None:
                notice.join(max(0.0, args.timeout - (time.monotonic() - s0.at)))
            s2 = probe.snap()
            watcher.stop.set()
            own_notice = notice.requests if notice is not None else Counter()
            with_op = Phase("apply with operator", s0, s1)
            wait = Phase("apply -> all Running", s1, s2, delta(watcher.requests, own_watch) + own_notice)
            peak, rss_end = (rss_mib(op.pid), rss_mib(op.pid, "VmRSS")) if op is not None else (0.0, 0.0)
            lat = sorted(v for k, v in watcher.running.items() if k != VICTIM)
        finally:
            _stop(op, baseline)
        load_end = os.getloadavg()
        time.sleep(2)  # the audit log is written in batches: the last requests' records

        if not lat:
            print("no job reached Running; operator log:", log.name)
            return 1
        _print_header(args, provider, baseline)
        print(f"finalizer policy: {finalizer_policy}")
        print(
            f"machine: {os.cpu_count()} cores; load average (1/5/15 min) {' '.join(f'{x:.2f}' for x in load_start)} "
            f"at start, {' '.join(f'{x:.2f}' for x in load_apply)} before the apply, "
            f"{' '.join(f'{x:.2f}' for x in load_end)} at the end"
        )
        print(f"jobs: {n} applied in {with_op.seconds:.1f}s (one kubectl apply); Running: {len(lat)}")
        print(
            f"creation-to-Running latency (1 s timestamp resolution): median {statistics.median(lat):.1f}s, "
            f"p95 {quantile(lat, 0.95):.1f}s, all {lat[-1]:.1f}s"
        )
        ratio = with_op.seconds / without.seconds if without.seconds > 0 else float("nan")
        print(
            f"apply with {'the ideal baseline' if ideal else 'operator'} {with_op.seconds:.1f}s, without {without.seconds:.1f}s, "
            f"{ratio:.1f}x (same {n} objects, fresh namespaces, same run; without first, before {who} started; "
            f"the target is against the ideal baseline, --against-ideal)"
        )
        if ideal:
            _print_floor(ratio)
        _print_ideal(ideal_run, audit_log, n)
        if op is not None:
            print(
                f"operator peak RSS {peak:.0f} MiB, {rss_end:.0f} MiB at the end (VmHWM, VmRSS; {n} jobs, "
                f"{args.nodes + (n if provider == 'kwok' else 0)} nodes); log {log.name}"
            )
        if notice is not None:
            _print_notice(notice, n, args.timeout)
        print()
        print(
            f"API requests: {REQUESTS} (by verb and resource) and {FLOWS} (by client identity) from the API\n"
            "server's /metrics, read as the admin before and after each phase. The request metric has no client\n"
            "label: the operator's share is separated by running the phase without the operator (the apply into a\n"
            f"fresh namespace with the operator not running; for the wait, the background rate of a {args.idle:g} s\n"
            "window with no operator and nothing applied). 'caused by operator' therefore also counts what the\n"
            "scheduler, kwok and the controllers do because of the operator's pods and nodes; the flow-schema\n"
            "table separates the scheduler's and controllers' requests from the operator's and kwok's (both exempt).\n"
            "Left out: non-resource requests (/metrics, discovery). A WATCH is counted when it ends, so the\n"
            "long-running watches (the operator's, the controllers', this benchmark's own of the TrainingJobs, all\n"
            "opened before the apply) are not in the tables."
        )
        rate = {k: v / idle.seconds for k, v in idle.requests.items()}
        frate = {k: v / idle.seconds for k, v in idle.flows.items()}
        bg_wait = Counter({k: round(r * wait.seconds) for k, r in rate.items()})
        fbg_wait = Counter({k: round(r * wait.seconds) for k, r in frate.items()})
        caused_apply = delta(with_op.requests, without.requests)
        caused_wait = delta(wait.requests, bg_wait)

        keys = sorted(set(with_op.requests) | set(without.requests), key=lambda k: (-with_op.requests[k], k))
        print(
            f"\nphase 'apply' (one kubectl apply of {n} objects): {without.seconds:.1f}s without operator, {with_op.seconds:.1f}s with"
        )
        print(
            table(
                [
                    "verb",
                    "resource",
                    "without op",
                    "with op",
                    "caused by op",
                    "per job",
                    "of which >=400 (with op)",
                ],
                [
                    [
                        v,
                        r,
                        str(without.requests[(v, r)]),
                        str(with_op.requests[(v, r)]),
                        str(caused_apply[(v, r)]),
                        f"{caused_apply[(v, r)] / n:.2f}",
                        str(with_op.failed[(v, r)] or ""),
                    ]
                    for v, r in keys
                ],
            )
        )
        keys = sorted(set(wait.requests) | set(bg_wait), key=lambda k: (-wait.requests[k], k))
        print(
            f"\nphase 'apply -> all Running' ({wait.seconds:.1f}s; background: {idle.seconds:.0f}s window scaled to {wait.seconds:.1f}s)"
        )
        print(
            table(
                [
                    "verb",
                    "resource",
                    "all clients",
                    "background",
                    "caused by op",
                    "per job",
                    "of which >=400",
                ],
                [
                    [
                        v,
                        r,
                        str(wait.requests[(v, r)]),
                        str(bg_wait[(v, r)]),
                        str(caused_wait[(v, r)]),
                        f"{caused_wait[(v, r)] / n:.2f}",
                        str(wait.failed[(v, r)] or ""),
                    ]
                    for v, r in keys
                ],
            )
        )
        caused_total = caused_apply + caused_wait
        t_apply, t_wait = sum(caused_apply.values()), sum(caused_wait.values())
        print(
            f"\nrequests caused by the operator, creation to all Running: {t_apply + t_wait} "
            f"({t_apply} during the apply + {t_wait} after), {(t_apply + t_wait) / n:.1f} per job"
        )
        by_verb: Counter[str] = Counter()
        for (v, _), c in caused_total.items():
            by_verb[v] += c
        print("  by verb: " + ", ".join(f"{v} {c}" for v, c in by_verb.most_common()))

        flows = sorted(
            set(with_op.flows) | set(without.flows) | set(wait.flows), key=lambda f: -wait.flows[f]
        )
        own_wait = sum(wait.own.values()) + 2  # its watch, and the two /metrics reads that bound the phase
        print("\nrequests by client identity (API priority-and-fairness flow schema)")
        print(
            table(
                [
                    "flow schema",
                    "who",
                    "apply w/o op",
                    "apply with op",
                    "wait",
                    "wait bg",
                    "per job (with op)",
                ],
                [
                    [
                        f,
                        FLOW_NOTE.get(f, ""),
                        str(without.flows[f]),
                        str(with_op.flows[f]),
                        str(wait.flows[f]),
                        str(fbg_wait[f]),
                        f"{(with_op.flows[f] - without.flows[f] + wait.flows[f] - fbg_wait[f]) / n:.2f}",
                    ]
                    for f in flows
                ],
            )
        )
        op_own = (with_op.flows["exempt"] - without.flows["exempt"]) + (
            wait.flows["exempt"] - fbg_wait["exempt"] - own_wait
        )
        kwok = sum(c for k, c in caused_total.items() if k in KWOK_WRITES)
        print(
            f"  operator + kwok (exempt, less kubectl, this benchmark and the background): {op_own}, "
            f"{op_own / n:.1f} per job;\n  less kwok's writes (PATCH pods/status and nodes/status, POST/PUT leases): "
            f"{op_own - kwok}, {(op_own - kwok) / n:.1f} per job for the operator (an upper bound: kwok's reads remain)"
        )

        print_audit(audit_log, s0.wall, s2.wall, n, wait.seconds + with_op.seconds)
        if op is None:
            print_cpu(pids, idle, without, with_op, wait, None)
        else:
            _print_operator(op, caused_apply, caused_wait, with_op, wait, n, startup_cpu)
            print_cpu(pids, idle, without, with_op, wait, (with_op.op_cpu, wait.op_cpu))
        if args.kubeconfig:
            run("delete", "namespace", ns, ns_without, "--wait=false")
        # (the ideal baseline takes no --spot-notice: notice is None there)
        ideal_ok = _print_verdict(ideal_run, with_op, lat, n)
        return 0 if len(lat) == n and ideal_ok and (notice is None or notice.answered is not None) else 1


def _print_operator(
    op: subprocess.Popen[bytes],
    caused_apply: Counter[tuple[str, str]],
    caused_wait: Counter[tuple[str, str]],
    with_op: Phase,
    wait: Phase,
    n: int,
    startup_cpu: float,
) -> None:
    """The operator's status writes, planner calls, reconcile steps and CPU seconds."""
    sw_apply, sw_wait = caused_apply[STATUS_WRITE], caused_wait[STATUS_WRITE]
    print(
        f"\noperator status writes (PATCH trainingjobs/status; no other client writes it): "
        f"{sw_apply} during the apply, {sw_wait} after, {(sw_apply + sw_wait) / n:.1f} per job"
    )
    pc = [p.op(f"{PLANNER}_count") for p in (with_op, wait)]
    ps = [p.op(f"{PLANNER}_sum") for p in (with_op, wait)]
    rc = [p.op(f"{RECONCILE}_count") for p in (with_op, wait)]
    rs = [p.op(f"{RECONCILE}_sum") for p in (with_op, wait)]
    print(
        f"planner calls ({PLANNER}_count on the operator's /metrics): {fmt(pc[0])} during the apply, "
        f"{fmt(pc[1])} after, {sum(pc) / n:.1f} per job; {sum(ps):.1f}s in the planner"
    )
    print(
        f"reconcile steps ({RECONCILE}_count): {fmt(rc[0])} during the apply, {fmt(rc[1])} after, "
        f"{sum(rc) / n:.1f} per job; {sum(rs):.1f}s inside steps (wall time summed over the step threads)"
    )
    events = {
        r: sum(p.op_by(WATCH_EVENTS, "resource", r) for p in (with_op, wait)) for r in ("node", "pod", "trainingjob")
    }
    print(
        f"watch events the operator handled ({WATCH_EVENTS}), apply -> all Running, per job: "
        + ", ".join(f"{r} {k / n:.1f}" for r, k in events.items())
    )
    print(
        f"operator CPU seconds (/proc/{op.pid}/stat utime+stime): start-up {startup_cpu:.1f}, "
        f"apply {with_op.op_cpu:.1f} ({with_op.op_cpu / with_op.seconds:.2f} cores), "
        f"apply -> all Running {wait.op_cpu:.1f} ({wait.op_cpu / wait.seconds:.2f} cores), "
        f"{(with_op.op_cpu + wait.op_cpu) / n:.2f} per job"
    )


def _launch(
    ideal: bool, kubeconfig: str, api: Any, ns: str, delay: str, op_env: dict[str, str], log: Any, probe: Probe
) -> tuple[subprocess.Popen[bytes] | None, IdealOperator | None, JobWatcher]:
    """Start the operator process (or, ``--baseline ideal``, the ideal baseline's thread) and the
    watcher that sees jobs reach Running (TrainingJobs, or the baseline's pods); the probe reads the
    operator process's CPU."""
    from kubernetes import client, config

    if ideal:
        ideal_api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        ideal_api.user_agent = IDEAL_AGENT
        baseline = IdealOperator(ideal_api, ns, float(delay))
        baseline.start()
        baseline.ready.wait(30)
        return None, baseline, PodWatcher(client.CoreV1Api(api), ns)
    op = subprocess.Popen(
        [sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=op_env, stdout=log, stderr=log
    )
    probe.op_pid = op.pid
    return op, None, JobWatcher(client.CustomObjectsApi(api), ns)


def _node_pool(api: Any, nodes: int) -> None:
    """``--nodes``: that many Ready fake nodes, before anything is applied."""
    if not nodes:
        return
    t_nodes = time.monotonic()
    pool = create_node_pool(api, "bench-nodes", INSTANCE_TYPE, nodes)
    wait_nodes_ready(api, pool.node_names, timeout=max(120.0, nodes / 5))
    print(f"{nodes} Ready {INSTANCE_TYPE} nodes in {time.monotonic() - t_nodes:.1f}s", flush=True)


def _apf_identity(op_env: dict[str, str], run: Any, env: Mapping[str, str], kubeconfig: str, apf: int | None) -> None:
    """``--apf``: the operator runs with the chart's ServiceAccount's kubeconfig (:func:`operator_identity`)."""
    if apf is None:
        return
    op_env["KUBECONFIG"] = operator_identity(run, env, kubeconfig, apf)
    print(
        f"operator identity: ServiceAccount {APF_NAMESPACE}/{APF_RELEASE}-gpuscaler (token kubeconfig), "
        f"the chart's FlowSchema and PriorityLevelConfiguration with nominalConcurrencyShares {apf}",
        flush=True,
    )


def _finalizer_policy(env: Mapping[str, str], namespace: str, off: bool) -> str:
    """The chart's finalizer policy for the operator's namespace, as the chart installs it where the
    API server serves the kind (:mod:`gpuscaler.devcluster.chart`); what the run had, for its header."""
    if off:
        return "not installed (--no-finalizer-policy or --baseline ideal): kopf PATCHes its finalizer onto each job"
    installed = chart.install_finalizer_policy(env, namespace)
    if installed is None:
        return "not served by this API server (kopf PATCHes its finalizer onto each job)"
    return f"the chart's {installed.policy} (binding {installed.binding}) puts the finalizer on each job at creation"


def _print_header(args: argparse.Namespace, provider: str, baseline: IdealOperator | None) -> None:
    """What ran: the ideal baseline, or the operator with its provider and settings."""
    n = args.jobs
    if args.baseline == "ideal":
        print(
            f"ideal baseline (no gpuscaler): {n} one-node TrainingJobs, each answered by one kwok node and one "
            f"pod and nothing else; kwok provisioning delay {args.delay}s"
            + (f"; errors: {baseline.errors[:3]}" if baseline is not None and baseline.errors else "")
        )
        return
    nodes_note = f", on {args.nodes} pre-created nodes" if args.nodes else ""
    overrides = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("GPUSCALER_"))
    print(
        f"operator scale: {n} one-node TrainingJobs{nodes_note}, provider {provider}, "
        f"kwok provisioning delay {args.delay}s, reconcile interval {args.interval}s"
        + (f"; settings from the environment: {', '.join(overrides)}" if overrides else "")
    )


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace, provider: str) -> None:
    """Refuse (``ap.error``) option combinations the benchmark cannot run."""
    if args.jobs < 1 or args.nodes < 0:
        ap.error(f"--jobs must be at least 1 and --nodes at least 0 (got --jobs {args.jobs}, --nodes {args.nodes})")
    if args.baseline == "ideal" and (args.nodes or args.spot_notice or provider != "kwok"):
        ap.error("--baseline ideal makes a kwok node per job: it takes no --nodes, --provider static or --spot-notice")
    if args.against_ideal and (args.baseline == "ideal" or args.nodes or provider != "kwok"):
        ap.error(
            "--against-ideal compares the operator with the ideal baseline, both making a kwok node per job: "
            "it takes no --baseline ideal, --nodes or --provider static"
        )
    if args.spot_notice and provider != "kwok":
        ap.error(
            "--spot-notice needs the kwok provider: the operator sees notices on the nodes it made (add --provider kwok)"
        )


def _started(op: subprocess.Popen[bytes], op_port: int) -> float:
    """Wait (up to 60 s) until the operator serves /metrics, and its watches start; its CPU seconds then."""
    t_start = time.monotonic()
    while time.monotonic() - t_start < 60:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{op_port}/metrics", timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)
    time.sleep(2)  # kopf's watches start after the startup handler
    return cpu_seconds(op.pid)


def _stop(op: subprocess.Popen[bytes] | None, baseline: IdealOperator | None) -> None:
    """Stop the operator process (or the ideal baseline's thread)."""
    if op is not None:
        op.terminate()
        op.wait(30)
    if baseline is not None:
        baseline.stop.set()


def _print_floor(ratio: float) -> None:
    """The ideal baseline's apply against the apply without it: what the control plane's reaction costs."""
    print(
        f"floor: the least an operator must do (one node and one pod per job) makes the apply {ratio:.1f}x "
        "slower than without here: the control plane's own reaction to the nodes and pods shares these cores "
        f"with the apply (the target measures the operator against this: <= {IDEAL_RATIO_TARGET:g}x, --against-ideal)"
    )


def _print_notice(notice: NoticeProbe, n: int, timeout: float) -> None:
    """How long the operator took to ask for a checkpoint after the spot notice."""
    got = f"{notice.answered:.2f}s" if notice.answered is not None else f"not within {timeout:g}s"
    print(
        f"spot notice on {VICTIM}'s node {notice.after:g}s into the apply of {n} jobs: checkpoint requested "
        f"after {got} (budget {NOTICE_BUDGET_S:g}s){'; ' + notice.error if notice.error else ''}"
    )


def operator_identity(run: Any, env: Mapping[str, str], kubeconfig: str, shares: int) -> str:
    """``--apf``: the chart's ServiceAccount, FlowSchema and PriorityLevelConfiguration (``helm
    template``), the account bound to cluster-admin (what it may do is not what this measures), and a
    kubeconfig with a token of it; returns that kubeconfig's path."""
    run("create", "namespace", APF_NAMESPACE)
    rendered = chart.render(
        env,
        "--set", "apiPriority.enabled=true", "--set", f"apiPriority.nominalConcurrencyShares={shares}",
        "--show-only", "templates/flowcontrol.yaml", "--show-only", "templates/serviceaccount.yaml",
        release=APF_RELEASE, namespace=APF_NAMESPACE,
    )  # fmt: skip
    run("apply", "-f", "-", input=rendered)
    account = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceAccount")["metadata"]["name"]
    run(
        "create", "clusterrolebinding", f"{APF_RELEASE}-bench-admin", "--clusterrole=cluster-admin",
        f"--serviceaccount={APF_NAMESPACE}:{account}",
    )
    token = run("create", "token", account, "-n", APF_NAMESPACE, "--duration=4h").stdout.strip()
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    cfg["users"] = [{"name": account, "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = account
    path = Path(kubeconfig).with_name("operator.kubeconfig")
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return str(path)


def print_cpu(
    pids: Mapping[str, int], idle: Phase, without: Phase, with_op: Phase, wait: Phase, op_cpu: tuple[float, float] | None
) -> None:
    """The control plane's CPU seconds per phase (and the operator's, when it ran as a process)."""
    if not pids:
        return
    print("control-plane CPU seconds (/proc/<pid>/stat) per phase")
    rows = [
        [
            c,
            "",
            f"{idle.cluster_cpu()[c]:.1f}",
            f"{without.cluster_cpu()[c]:.1f}",
            f"{with_op.cluster_cpu()[c]:.1f}",
            f"{wait.cluster_cpu()[c]:.1f}",
        ]
        for c in pids
    ]
    if op_cpu is not None:
        rows.append(["operator", "", "-", "-", f"{op_cpu[0]:.1f}", f"{op_cpu[1]:.1f}"])
    print(table(["component", "", "background", "apply w/o op", "apply with op", "wait"], rows))


def print_audit(audit_log: str | None, start: float, end: float, n: int, seconds: float) -> None:
    """Requests by client, and by (client, verb, resource), from the audit log: from the apply's start
    to all Running, every client, each request once (:func:`audit_request`); nothing without a log."""
    if not audit_log:
        return
    path = Path(audit_log)
    with path.open(encoding="utf-8") as fh:
        counts, failed = audit_counts(fh, start, end)
    clients: Counter[str] = Counter()
    for (c, _, _), k in counts.items():
        clients[c] += k
    print(
        f"\nrequests by client, from the API server's audit log ({path.name}: every request at Metadata level;\n"
        f"client from user and User-Agent; a WATCH counted when it starts), apply start -> all Running ({seconds:.1f}s)"
    )
    print(
        table(
            ["client", "", "requests", "per job"],
            [[c, "", str(k), f"{k / n:.2f}"] for c, k in clients.most_common()],
        )
    )
    own = clients["operator"] + clients["operator (ideal)"]
    print(
        f"  the operator's own requests (User-Agent {OPERATOR_AGENT.split('/')[0]}/ and kopf/, or {IDEAL_AGENT}): "
        f"{own}, {own / n:.1f} per job (target <= {OWN_REQUESTS_TARGET:g})"
    )
    print(
        "\n"
        + table(
            ["client", "verb", "resource", "requests", "per job", "of which >=400"],
            [
                [c, v, r, str(k), f"{k / n:.2f}", str(failed[(c, v, r)] or "")]
                for (c, v, r), k in sorted(counts.items(), key=lambda kv: (-clients[kv[0][0]], -kv[1], kv[0]))
            ],
        )
    )


def victim_node(run: Any, namespace: str, watcher: JobWatcher, timeout: float) -> str:
    """Apply the spot-notice job alone and wait until it is Running; the name of its node."""
    run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job(VICTIM)))
    t0 = time.monotonic()
    while VICTIM not in watcher.running:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{VICTIM} not Running within {timeout:g}s")
        time.sleep(0.2)
    out = run(
        "get",
        "nodes",
        "-l",
        f"{JOB_LABEL}={job_label_value(namespace, VICTIM)}",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    )
    return str(out.stdout).strip()


if __name__ == "__main__":
    sys.exit(main())
