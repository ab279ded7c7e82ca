"""Shared test factories and the one harness of the reconcile loop.

Factories with defaults plus overrides (after Karpenter's test factories): :func:`spec`,
:func:`make_job`, :func:`node_body`, :func:`planner_with`; the fake worker client
:class:`FakeWorkers`; and :class:`World`, the loop with a clock and the cluster it observes, used
by every test that drives :class:`gpuscaler.controller.reconcile.Reconciler`. The fake providers
are the package's own (:mod:`gpuscaler.cloud.fake`); :class:`FakeCore` stands in for the
Kubernetes API of the providers that adopt nodes. Test modules import these from here, never
from one another. It is not named ``conftest``: ``pytest tests e2e`` puts both folders on
``sys.path``, and ``e2e/conftest.py`` would answer ``import conftest`` first.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase, PlanStatus, TrainingJobStatus
from gpuscaler.catalog import load_catalog
from gpuscaler.cloud.fake import FakeProvider
from gpuscaler.cloud.nodes import node_state
from gpuscaler.controller.interruptions import Planner
from gpuscaler.controller.policy import Governance
from gpuscaler.controller.reconcile import Job, LoopConfig, Reconciler, plan_status
from gpuscaler.kube.client import KubeError
from gpuscaler.kube.workers import pod_state
from gpuscaler.names import CAPACITY_TYPE_LABEL, EKS_NODEGROUP_LABEL, INSTANCE_TYPE_LABEL, PRICE_ANNOTATION
from gpuscaler.planner import PlanResult, plan
from gpuscaler.policy import Policy
from gpuscaler.settings import Settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""The harness's start time."""
CATALOG = load_catalog()

RESNET_SPEC: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 1}}
"""A small job any planner call can plan."""
GANG_SPEC: dict[str, Any] = {
    **RESNET_SPEC,
    "constraints": {"instanceTypes": ["p4d.24xlarge", "p4de.24xlarge"], "minGpus": 16, "maxGpus": 16, "spot": "never"},
}
"""A gang of two 8-GPU on-demand nodes (two workers): the loop's phases."""
SPOT_SPEC: dict[str, Any] = {
    "workload": {"model": "resnet50"},
    "globalBatch": 256,
    "training": {"steps": 400},
    "maxDuration": "2h",
    "constraints": {
        "instanceTypes": ["p3.2xlarge", "g5.xlarge", "g4dn.xlarge", "g6.xlarge"],
        "minGpus": 1,
        "maxGpus": 1,
        "spot": "preferred",
    },
    "checkpoint": {"intervalSeconds": 10, "restartSeconds": 20},
}
"""One spot GPU (g4dn.xlarge first) with a checkpoint every 10 s: interruptions and re-plans."""


def spec(base: Mapping[str, Any] = RESNET_SPEC, **changes: Any) -> TrainingJobSpec:
    """A TrainingJob spec: ``base`` with top-level fields replaced by ``changes``."""
    return TrainingJobSpec.model_validate({**base, **changes})


def make_job(
    base: Mapping[str, Any] = GANG_SPEC,
    *,
    namespace: str = "ns",
    name: str = "job",
    uid: str = "uid-1",
    generation: int = 1,
    **changes: Any,
) -> Job:
    """The loop's view of a TrainingJob created at :data:`T0` with the spec ``spec(base, **changes)``."""
    return Job(namespace, name, uid, generation, T0, spec(base, **changes))


def node_body(
    name: str,
    *,
    instance_type: str = "",
    capacity_type: str = "",
    ready: str | None = None,
    since: datetime = T0,
    created: datetime = T0,
    price: float | None = None,
    taints: Iterable[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Node object as a watch delivers it.

    Args:
        name: The node's name.
        instance_type: Its instance type label (empty: none; the loop then prices it by annotation).
        capacity_type: Its capacity type label.
        ready: The Ready condition's status (``True``, ``False``, ``Unknown``); None: no
            condition yet (a node registering).
        since: The Ready condition's lastTransitionTime.
        created: Its creationTimestamp.
        price: The price annotation in USD per hour (None: none).
        taints: Its taints.
        annotations: Further annotations.
        deleting: Whether it carries a deletionTimestamp.
    """
    labels = {k: v for k, v in ((INSTANCE_TYPE_LABEL, instance_type), (CAPACITY_TYPE_LABEL, capacity_type)) if v}
    ann = dict(annotations or {})
    if price is not None:
        ann[PRICE_ANNOTATION] = str(price)
    meta: dict[str, Any] = {"name": name, "creationTimestamp": _rfc3339(created), "labels": labels, "annotations": ann}
    if deleting:
        meta["deletionTimestamp"] = _rfc3339(created)
    conds = [] if ready is None else [
        {"type": "Ready", "status": ready, "reason": "KubeletStopped", "lastTransitionTime": _rfc3339(since)}
    ]
    return {"metadata": meta, "spec": {"taints": [dict(t) for t in taints]}, "status": {"conditions": conds}}


def _rfc3339(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def planner_with(policy: Policy) -> Planner:
    """The loop's planner in its four-argument shape: the real planner under ``policy``."""

    def planner(s: TrainingJobSpec, name: str, dl: float | None, un: frozenset[tuple[str, str]]) -> PlanResult:
        return plan(s, CATALOG, policy, name=name, deadline_h=dl, unavailable=un)

    return planner


def first_plan(s: TrainingJobSpec) -> PlanStatus:
    """The status form of the plan the real planner (no policy) chooses for ``s`` at :data:`T0`."""
    return plan_status(plan(s, CATALOG, Policy(), name="j"), 1, T0)


def create_once(objects: dict[str, dict[str, Any]], key: str, body: dict[str, Any]) -> bool:
    """A fake client's create: store ``body`` under ``key`` unless an object is there already (the API
    server's AlreadyExists). True if it was created."""
    if key in objects:
        return False
    objects[key] = body
    return True


class FakeWorkers:
    """The loop's worker client (:class:`gpuscaler.controller.reconcile.WorkerClient`) over a dict
    of created objects; records deletions."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        """Created objects by ``<kind>/<name>``."""
        self.deleted: list[str] = []
        """Names of the pods deleted, in order."""

    def create_if_absent(self, body: dict[str, Any]) -> bool:
        return create_once(self.objects, f"{body['kind']}/{body['metadata']['name']}", body)

    def delete_pod(self, namespace: str, name: str) -> bool:
        self.deleted.append(name)
        return self.objects.pop(f"Pod/{name}", None) is not None

    def delete_service(self, namespace: str, name: str) -> bool:
        return self.objects.pop(f"Service/{name}", None) is not None

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        have = self.objects[f"Pod/{name}"].setdefault("metadata", {}).setdefault("annotations", {})
        have.update({k: v for k, v in annotations.items() if v is not None})
        for key in [k for k, v in annotations.items() if v is None]:  # a merge patch's null removes the key
            have.pop(key, None)

    def pods(self) -> list[dict[str, Any]]:
        """The worker pods created and not deleted."""
        return [o for k, o in self.objects.items() if k.startswith("Pod/")]


class World:
    """The reconcile loop plus a clock and the cluster it observes.

    The cluster: Node objects (:attr:`nodes`, read by :func:`gpuscaler.cloud.nodes.node_state`
    on every step, as the operator's node index reads them) that the harness adds for what the
    provider made and drops for what it released, and the worker pods the fake worker client
    holds, each with this world's phase, status and annotations (:meth:`pod_body`).
    """

    def __init__(
        self,
        provider: FakeProvider | None = None,
        *,
        planner: Planner | None = None,
        pod_phase: str = "Pending",
        node: Mapping[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        """
        Args:
            provider: The provider (a :class:`gpuscaler.cloud.fake.FakeProvider` by default).
            planner: The loop's planner (:func:`planner_with` no policy by default).
            pod_phase: The phase of a worker pod :attr:`phases` does not name.
            node: :func:`node_body` arguments of a node the provider made (default: registering,
                not Ready, priced $10/h).
            settings: :class:`gpuscaler.settings.Settings` fields the loop's config derives from.
        """
        self.now = T0
        self.provider = provider or FakeProvider()
        self.workers = FakeWorkers()
        self.status = TrainingJobStatus()
        self.nodes: dict[str, dict[str, Any]] = {}
        """Node bodies by name."""
        self.phases: dict[str, str] = {}
        """Worker pod phases by pod name."""
        self.statuses: dict[str, dict[str, Any]] = {}
        """Further pod status fields (exit codes, conditions) by pod name."""
        self.annotations: dict[str, dict[str, str]] = {}
        """Further pod annotations by pod name."""
        self.pod_phase = pod_phase
        self.node = dict(node) if node is not None else {"price": 10.0}
        self.governance: Governance | None = None
        """The policy the handler would pass to each step (None: no policy)."""
        self.events: list[Any] = []
        """The events of the last step."""
        config = LoopConfig.from_settings(Settings(**settings))
        self.loop = Reconciler(self.provider, self.workers, planner or planner_with(Policy()), CATALOG, config,
                               lambda: self.now)

    def step(self, job: Job, seconds: float = 1.0) -> list[str]:
        """Advance the clock, play the cloud, run one step; returns the reasons of its events."""
        self.now += timedelta(seconds=seconds)
        for names in self.provider.ensured:
            for n in names:
                self.nodes.setdefault(n, node_body(n, **{"created": self.now, **self.node}))
        self.provider.ensured.clear()
        for n in self.provider.released:
            self.nodes.pop(n, None)
        self.provider.released.clear()
        pods = [pod_state(self.pod_body(body)) for body in self.workers.pods()]
        nodes = [node_state(b) for b in self.nodes.values()]
        out = self.loop.step(job, self.status, pods, nodes, self.governance)
        self.status = out.status
        self.events = out.events
        return [e.reason for e in out.events]

    def pod_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """The pod as the API server would return it: the created body with this world's state."""
        name = body["metadata"]["name"]
        status = {"phase": self.phases.get(name, self.pod_phase), **self.statuses.get(name, {})}
        meta = dict(body["metadata"])
        meta["annotations"] = {**(meta.get("annotations") or {}), **self.annotations.get(name, {})}
        return dict(body, metadata=meta, status=status)

    def ready(self) -> None:
        """Every node turns Ready."""
        for b in self.nodes.values():
            b["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": _rfc3339(self.now)}]

    def annotate(self, **ann: str) -> None:
        """Annotate every worker pod (what the runtime writes)."""
        for b in self.workers.pods():
            b["metadata"].setdefault("annotations", {}).update(ann)

    def lose_nodes(self) -> None:
        """Every node vanishes without a notice (a reclaimed spot node), with the worker pods bound to
        it (to the last one, where there are several)."""
        for name in list(self.nodes):
            for b in self.workers.pods():
                b.setdefault("spec", {})["nodeName"] = name
            del self.nodes[name]

    def two_workers_running(self, job: Job) -> None:
        """Plan, provision (nodes Ready), start, and see both workers (``job-worker-0``, ``-1``) Running."""
        self.step(job)
        self.step(job)
        self.ready()
        self.step(job)
        self.phases = {"job-worker-0": "Running", "job-worker-1": "Running"}
        self.step(job)
        assert self.status.phase is Phase.RUNNING

    def run_to(self, job: Job, phase: Phase, limit: int = 20) -> list[str]:
        """Step until the job is in ``phase``; returns every event reason on the way."""
        seen: list[str] = []
        for _ in range(limit):
            seen += self.step(job)
            if self.status.phase is phase:
                return seen
        raise AssertionError(f"never reached {phase}: {self.status.phase} {self.status.message}")


SPOT_NODE: dict[str, Any] = {"instance_type": "g4dn.xlarge", "capacity_type": "spot", "ready": "True", "created": T0}
"""A node the provider made for :data:`SPOT_SPEC`: Ready at once, priced from the catalog."""


def spot_world(**settings: Any) -> World:
    """The world of the interruption tests: workers Running at once on Ready spot nodes."""
    return World(pod_phase="Running", node=SPOT_NODE, **settings)


class FakeCore:
    """A CoreV1Api stand-in holding Node objects (client models), for the providers that adopt
    nodes (eks, gke); records patches, refuses a stale resourceVersion."""

    def __init__(self) -> None:
        self.nodes: dict[str, client.V1Node] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def register(self, name: str, group: str, instance_id: str) -> None:
        """What a kubelet does when an instance of the group boots."""
        self.nodes[name] = client.V1Node(
            metadata=client.V1ObjectMeta(
                name=name, labels={EKS_NODEGROUP_LABEL: group}, annotations={}, resource_version="1"
            ),
            spec=client.V1NodeSpec(provider_id=f"aws:///us-east-1a/{instance_id}"),
        )

    def list_node(self, label_selector: str = "") -> Any:
        want = dict(kv.split("=", 1) for kv in label_selector.split(",") if kv)
        items = [
            n
            for n in self.nodes.values()
            if all((n.metadata.labels or {}).get(k) == v for k, v in want.items())
        ]
        return client.V1NodeList(items=items)

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self.patches.append((name, body))
        node = self.nodes.get(name)
        if node is None:
            raise ApiException(status=404, reason="Not Found")
        meta = body["metadata"]
        if meta.get("resourceVersion") not in (None, node.metadata.resource_version):
            raise ApiException(status=409, reason="Conflict")
        for k, v in (meta.get("labels") or {}).items():
            if v is None:
                node.metadata.labels.pop(k, None)
            else:
                node.metadata.labels[k] = v
        for k, v in (meta.get("annotations") or {}).items():
            if v is None:
                node.metadata.annotations.pop(k, None)
            else:
                node.metadata.annotations[k] = v
        node.metadata.resource_version = str(int(node.metadata.resource_version) + 1)


class FakeProfileApi:
    """PerformanceProfiles in memory, with resourceVersions, the calls recorded, errors injectable."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self.fail: KubeError | None = None
        self._rv = 0

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {name}")
        got = self.objects.get((namespace, name))
        return copy.deepcopy(got) if got else None

    def put(self, namespace: str, body: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        self.calls.append(f"put {body['metadata']['name']} {resource_version}")
        if self.fail is not None:
            raise self.fail
        key = (namespace, body["metadata"]["name"])
        have = self.objects.get(key)
        if (have is None) != (resource_version is None) or (have and have["metadata"]["resourceVersion"] != resource_version):
            raise KubeError("conflict", 409, retry=True)
        self._rv += 1
        self.objects[key] = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self._rv)}}
        return self.objects[key]

    def delete(self, namespace: str, name: str) -> bool:
        self.calls.append(f"delete {name}")
        return self.objects.pop((namespace, name), None) is not None

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        self.calls.append(f"list {namespace}")
        return [copy.deepcopy(b) for (ns, _), b in sorted(self.objects.items()) if namespace in (None, ns)]
