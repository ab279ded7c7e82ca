"""The workers' identity: ServiceAccount ``gpuscaler-worker`` with a Role allowing pods get/patch
(what the runtime's KubeReporter needs), created by the loop before the worker pods; and the
runtime exporting KubeReporter without importing a Kubernetes client."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from gpuscaler.api.status import Phase
from gpuscaler.kube.client import SHARED_RECHECK_S, KubeError, Workers
from gpuscaler.kube.workers import (
    WORKER_SERVICE_ACCOUNT,
    WorkerPlan,
    uses_worker_account,
    worker_pod,
    worker_rbac,
)
from loop_harness import World, make_job

IDENTITY = ["ServiceAccount/gpuscaler-worker", "Role/gpuscaler-worker", "RoleBinding/gpuscaler-worker"]


def plan_with(template: dict[str, Any] | None) -> WorkerPlan:
    return WorkerPlan(
        job_name="j", namespace="ns", job_label="ns.j", owner={}, nodes=1, gpus_per_node=1,
        precision="amp", micro_batch=8, accumulation=1, checkpoint_dir="/c", checkpoint_interval_s=600,
        checkpoint_keep=2, master_port=29500, attempt=1, node_selector={}, tolerations=[],
        default_image="python:3.11-slim", template=template,
    )


@pytest.mark.parametrize(
    ("template", "account"),
    [
        (None, WORKER_SERVICE_ACCOUNT),
        ({"spec": {"containers": [{"name": "train", "image": "x"}]}}, WORKER_SERVICE_ACCOUNT),
        ({"spec": {"serviceAccountName": "trainer"}}, "trainer"),
        ({"spec": {"serviceAccount": "legacy"}}, None),  # the deprecated alias: left to the API server
    ],
)
def test_worker_pod_runs_as_gpuscaler_worker_unless_the_template_names_an_account(
    template: dict[str, Any] | None, account: str | None
) -> None:
    pod = worker_pod(plan_with(template), 0)
    assert pod["spec"].get("serviceAccountName") == account
    assert uses_worker_account(template) is (account == WORKER_SERVICE_ACCOUNT)


def test_worker_rbac_objects() -> None:
    sa, role, binding = worker_rbac("team-a")
    for obj in (sa, role, binding):
        assert obj["metadata"] == {
            "name": "gpuscaler-worker",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "gpuscaler"},
        }
        assert "ownerReferences" not in obj["metadata"], "shared by the namespace's jobs"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuscaler-worker"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuscaler-worker", "namespace": "team-a"}]


class Recording:
    def __init__(self, world: World) -> None:
        self.created: list[str] = []
        inner = world.workers.create_if_absent

        def create(body: dict[str, Any]) -> bool:
            self.created.append(f"{body['kind']}/{body['metadata']['name']}")
            return inner(body)

        world.workers.create_if_absent = create  # type: ignore[method-assign]


def to_starting(w: World, template: dict[str, Any] | None) -> Any:
    job = make_job(template=template) if template is not None else make_job()
    w.step(job)
    w.step(job)
    w.ready()
    w.step(job)
    assert w.status.phase is Phase.STARTING
    return job


def test_the_loop_creates_the_identity_before_the_workers_and_only_while_some_are_missing() -> None:
    w = World()
    rec = Recording(w)
    job = to_starting(w, None)
    kinds = [c for c in rec.created if not c.startswith("Service/")]
    assert kinds[:3] == IDENTITY and kinds[3:] == ["Pod/job-worker-0", "Pod/job-worker-1"]
    assert all(p["spec"]["serviceAccountName"] == WORKER_SERVICE_ACCOUNT for p in w.workers.pods())
    rec.created.clear()
    w.step(job)  # every worker exists: no more calls for the identity
    assert not [c for c in rec.created if c in IDENTITY]


def test_a_template_with_its_own_account_gets_no_identity() -> None:
    w = World()
    rec = Recording(w)
    to_starting(w, {"spec": {"serviceAccountName": "trainer", "containers": [{"name": "train", "image": "x"}]}})
    assert not [c for c in rec.created if c in IDENTITY]
    assert all(p["spec"]["serviceAccountName"] == "trainer" for p in w.workers.pods())


class FakeApi:
    def __init__(self, status: int | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.status = status

    def __getattr__(self, method: str) -> Any:
        def call(namespace: str, body: dict[str, Any]) -> None:
            self.calls.append((method, namespace))
            if self.status is not None:
                raise ApiException(status=self.status, reason="x")

        return call


def test_client_creates_the_identity_if_absent() -> None:
    w = Workers(ApiClient())
    w.core, w.rbac = FakeApi(), FakeApi()
    assert all(w.create_if_absent(b) for b in worker_rbac("ns"))
    assert w.core.calls == [("create_namespaced_service_account", "ns")]
    assert w.rbac.calls == [("create_namespaced_role", "ns"), ("create_namespaced_role_binding", "ns")]
    w.core, w.rbac = FakeApi(409), FakeApi(409)
    assert not any(w.create_if_absent(b) for b in worker_rbac("ns2"))  # there from before: fine
    w.rbac = FakeApi(403)
    with pytest.raises(KubeError, match="creating Role ns3/gpuscaler-worker, 403") as err:
        w.create_if_absent(worker_rbac("ns3")[1])
    assert not err.value.retriable


def test_client_sends_the_shared_identity_once_per_namespace_and_period() -> None:
    now = [0.0]
    w = Workers(ApiClient(), clock=lambda: now[0])
    w.core, w.rbac = FakeApi(), FakeApi()
    for _ in range(50):  # fifty gang starts in one namespace
        for b in worker_rbac("ns"):
            w.create_if_absent(b)
    assert len(w.core.calls) + len(w.rbac.calls) == 3
    w.core, w.rbac = FakeApi(409), FakeApi(409)
    for b in worker_rbac("other"):  # found there (409): remembered as well
        w.create_if_absent(b)
    for b in worker_rbac("other"):
        w.create_if_absent(b)
    assert len(w.core.calls) + len(w.rbac.calls) == 3
    now[0] = SHARED_RECHECK_S + 1  # later, sent again once (deleted meanwhile? made again)
    for _ in range(3):
        for b in worker_rbac("ns"):
            w.create_if_absent(b)
    assert len(w.core.calls) + len(w.rbac.calls) == 6


def test_a_pod_refused_for_its_missing_account_makes_the_client_forget_it() -> None:
    w = Workers(ApiClient())
    w.core, w.rbac = FakeApi(), FakeApi()
    for b in worker_rbac("ns"):
        w.create_if_absent(b)

    class Refusing(FakeApi):
        def __getattr__(self, method: str) -> Any:
            def call(namespace: str, body: dict[str, Any]) -> None:
                self.calls.append((method, namespace))
                err = ApiException(status=403, reason="Forbidden")
                err.body = (
                    'pods "j-worker-0" is forbidden: error looking up service account ns/gpuscaler-worker: '
                    'serviceaccount "gpuscaler-worker" not found'
                )
                raise err

            return call

    w.creates = Refusing()
    pod = {"kind": "Pod", "metadata": {"namespace": "ns", "name": "j-worker-0"}}
    with pytest.raises(KubeError, match="403") as err:
        w.create_if_absent(pod)
    assert err.value.retriable  # the next step makes the account again and retries
    w.core, w.rbac = FakeApi(), FakeApi()
    for b in worker_rbac("ns"):
        w.create_if_absent(b)
    assert len(w.core.calls) + len(w.rbac.calls) == 3


def test_runtime_exports_kube_reporter_lazily() -> None:
    code = (
        "import sys, gpuscaler.runtime as r\n"
        "print('gpuscaler.runtime.kube_reporter' in sys.modules)\n"
        "from gpuscaler.runtime import KubeReporter\n"
        "from gpuscaler.runtime.kube_reporter import KubeReporter as K\n"
        "print(KubeReporter is K is r.KubeReporter, 'KubeReporter' in r.__all__, 'kubernetes' in sys.modules)\n"
        "print(KubeReporter.from_env({}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["False", "True True False", "None"]
