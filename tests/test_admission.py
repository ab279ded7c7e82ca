"""The workers' admission policy: one set of rules (the module's, which the chart renders too), the
operator installing or checking it, and the loop starting no worker under the broad account
without it (a documented opt-out aside)."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpuscaler.api.status import Phase
from gpuscaler.controller.reconcile import Reconciler
from gpuscaler.kube import admission
from gpuscaler.kube.admission import POLICY_KIND, RECHECK_S, WorkerAdmission, contains, manifests
from gpuscaler.kube.workers import WORKER_SERVICE_ACCOUNT
from gpuscaler.names import ConditionType
from gpuscaler.runtime.constants import REPORTED_ANNOTATIONS
from gpuscaler.settings import Settings
from helm_helpers import CHART, env_of, one, render
from loop_harness import World, make_job

# ------------------------------------------------------------------------------ one set of rules


def test_the_chart_renders_the_modules_rules() -> None:
    docs = render()
    policy, binding = one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")
    assert policy["spec"] == admission.policy_spec()
    assert binding["spec"] == admission.binding_spec(policy["metadata"]["name"], None)
    # and the operator under the chart looks for the chart's objects, which its Role may read (only)
    name = policy["metadata"]["name"]
    assert env_of(docs)["GPUSCALER_WORKER_ADMISSION_POLICY_NAME"] == name
    assert binding["metadata"]["name"] == admission.binding_name(name, None) == name
    role = one(docs, "ClusterRole")
    (rule,) = [r for r in role["rules"] if r["apiGroups"] == ["admissionregistration.k8s.io"]]
    assert rule == {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        "resourceNames": [name],
        "verbs": ["get"],
    }


def test_namespaced_chart_binds_like_the_operator() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    name = binding["spec"]["policyName"]
    assert binding["spec"] == admission.binding_spec(name, "ml-team")
    assert binding["metadata"]["name"] == admission.binding_name(name, "ml-team") == f"{name}-ml-team"
    (rule,) = [r for r in one(docs, "ClusterRole")["rules"] if r["apiGroups"] == ["admissionregistration.k8s.io"]]
    assert rule["resourceNames"] == [name, f"{name}-ml-team"] and rule["verbs"] == ["get"]


def test_the_rules_name_the_worker_account_and_the_runtimes_annotations() -> None:
    spec = admission.policy_spec()
    assert f":{WORKER_SERVICE_ACCOUNT}'" in spec["matchConditions"][0]["expression"]
    allowed = next(v["expression"] for v in spec["variables"] if v["name"] == "allowed")
    assert allowed == "[" + ", ".join(f"'{a}'" for a in REPORTED_ANNOTATIONS) + "]"
    assert Settings().worker_admission_policy_name == admission.POLICY_NAME


def test_printed_manifests_are_what_the_operator_installs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuscaler.kube.admission", "--namespace", "team-a"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert list(yaml.safe_load_all(out)) == manifests(namespace="team-a")
    bad = subprocess.run([sys.executable, "-m", "gpuscaler.kube.admission", "--nope"],
                         capture_output=True, text=True, check=False, timeout=60)
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


def test_contains_allows_server_defaults_but_not_changed_rules() -> None:
    want = admission.policy_spec()
    have = copy.deepcopy(want)
    have["matchConstraints"]["matchPolicy"] = "Equivalent"
    have["matchConstraints"]["resourceRules"][0]["scope"] = "*"
    assert contains(have, want)
    weaker = copy.deepcopy(have)
    weaker["validations"].pop()
    assert not contains(weaker, want)
    changed = copy.deepcopy(have)
    changed["variables"][0]["expression"] = "['evil']"
    assert not contains(changed, want)


# ------------------------------------------------------------------------------ install or check


class FakePolicyApi:
    """The two cluster-scoped objects in a dict; records writes; ``errors[(verb, kind)]`` is raised."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.errors: dict[tuple[str, str], int] = {}

    def _fail(self, verb: str, kind: str) -> None:
        if (verb, kind) in self.errors:
            raise ApiException(status=self.errors[(verb, kind)], reason="Injected")

    def read(self, kind: str, name: str) -> dict[str, Any]:
        self._fail("read", kind)
        if (kind, name) not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.objects[(kind, name)])

    def create(self, body: dict[str, Any]) -> None:
        self._fail("create", body["kind"])
        self.writes.append(("create", body["kind"]))
        self.objects[(body["kind"], body["metadata"]["name"])] = dict(copy.deepcopy(body), metadata={**body["metadata"], "resourceVersion": "1"})

    def replace(self, body: dict[str, Any]) -> None:
        self._fail("replace", body["kind"])
        assert body["metadata"]["resourceVersion"] == "1"
        self.writes.append(("replace", body["kind"]))
        self.objects[(body["kind"], body["metadata"]["name"])] = copy.deepcopy(body)


def test_install_creates_what_is_missing_then_leaves_it() -> None:
    api = FakePolicyApi()
    wa = WorkerAdmission(api, "install")
    state = wa.ensure()
    assert state.enforced and state.allowed and "created ValidatingAdmissionPolicy" in state.detail
    assert api.writes == [("create", POLICY_KIND), ("create", "ValidatingAdmissionPolicyBinding")]
    assert wa.ensure().enforced and len(api.writes) == 2, "nothing rewritten when it is there"


def test_install_puts_back_rules_that_were_changed() -> None:
    api = FakePolicyApi()
    WorkerAdmission(api, "install").ensure()
    api.objects[(POLICY_KIND, admission.POLICY_NAME)]["spec"]["validations"] = []
    state = WorkerAdmission(api, "install").ensure()
    assert state.enforced and ("replace", POLICY_KIND) in api.writes
    assert api.objects[(POLICY_KIND, admission.POLICY_NAME)]["spec"] == admission.policy_spec()


@pytest.mark.parametrize(
    ("error", "expect"),
    [
        (403, "the operator may not create it"),
        (404, "does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"),
        (500, "creating ValidatingAdmissionPolicy gpuscaler-worker-own-pod: 500"),
    ],
)
def test_refused_when_it_cannot_be_installed_with_what_to_do(error: int, expect: str) -> None:
    api = FakePolicyApi()
    api.errors[("create", POLICY_KIND)] = error
    state = WorkerAdmission(api, "install").ensure()
    assert not state.enforced and not state.allowed
    assert expect in state.detail
    for hint in ("kubectl apply", "GPUSCALER_WORKER_ADMISSION_POLICY=off", "docs/security.md"):
        assert hint in state.detail


def test_verify_never_writes_and_off_allows_without_it() -> None:
    api = FakePolicyApi()
    state = WorkerAdmission(api, "verify").ensure()
    assert not state.allowed and "is missing; mode verify installs nothing" in state.detail and not api.writes
    api.errors[("read", POLICY_KIND)] = 403
    assert "reading ValidatingAdmissionPolicy gpuscaler-worker-own-pod: 403" in WorkerAdmission(api, "verify").ensure().detail
    off = WorkerAdmission(api, "off").ensure()
    assert off.allowed and not off.enforced and "may patch every pod" in off.detail
    with pytest.raises(ValueError, match="not one of install, verify, off"):
        WorkerAdmission(api, "maybe")  # type: ignore[arg-type]


def test_refusal_is_rechecked_so_a_policy_installed_later_is_seen() -> None:
    api = FakePolicyApi()
    now = [0.0]
    wa = WorkerAdmission(api, "verify", clock=lambda: now[0])
    assert wa.refusal() is not None
    for body in manifests():
        api.create(body)
    now[0] += RECHECK_S / 2
    assert wa.refusal() is not None, "cached until the next check"
    now[0] += RECHECK_S
    assert wa.refusal() is None


# ------------------------------------------------------------------------------ the loop


def world_with(gate: list[str | None]) -> World:
    w = World()
    w.loop = Reconciler(w.loop.provider, w.loop.workers, w.loop.planner, w.loop.catalog, w.loop.config,
                        w.loop.clock, admission=lambda: gate[0])
    return w


def test_no_nodes_or_workers_while_the_policy_is_missing() -> None:
    gate: list[str | None] = ["the worker admission policy gpuscaler-worker-own-pod is not in force (test)"]
    w = world_with(gate)
    job = make_job()
    reasons = w.step(job) + w.step(job) + w.step(job)
    assert w.status.phase is Phase.PENDING and w.status.plan is not None
    assert reasons.count("WorkerAdmissionPolicyMissing") == 1
    assert not w.nodes and not w.workers.pods()
    cond = next(c for c in w.status.conditions if c.type == ConditionType.WORKER_ADMISSION)
    assert cond.status == "False" and "not in force (test)" in cond.message
    assert w.status.message.startswith("not starting workers: ")
    gate[0] = None
    w.step(job)
    assert w.status.phase is Phase.PROVISIONING
    assert next(c for c in w.status.conditions if c.type == ConditionType.WORKER_ADMISSION).status == "True"


def test_a_job_with_its_own_service_account_is_not_held() -> None:
    w = world_with(["missing"])
    job = make_job(template={"spec": {"serviceAccountName": "trainer", "containers": [{"name": "t", "image": "x"}]}})
    w.step(job)
    assert w.status.phase is Phase.PROVISIONING
    assert not any(c.type == ConditionType.WORKER_ADMISSION for c in w.status.conditions)


def test_a_gang_already_provisioning_creates_no_workers_once_the_policy_is_gone() -> None:
    gate: list[str | None] = [None]
    w = world_with(gate)
    job = make_job()
    w.step(job)
    w.step(job)
    assert w.status.phase is Phase.PROVISIONING and len(w.nodes) == 2
    gate[0] = "the worker admission policy gpuscaler-worker-own-pod is not in force (deleted)"
    w.ready()
    reasons = w.step(job)
    assert w.status.phase is Phase.STARTING and not w.workers.pods()
    assert "WorkerAdmissionPolicyMissing" in reasons and "(deleted)" in w.status.message
    gate[0] = None
    w.step(job)
    assert sorted(p["metadata"]["name"] for p in w.workers.pods()) == ["job-worker-0", "job-worker-1"]


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({"GPUSCALER_WORKER_ADMISSION_POLICY": "maybe"}, "GPUSCALER_WORKER_ADMISSION_POLICY='maybe': Input should be 'install', 'verify' or 'off'"),
        ({"GPUSCALER_KWOK_CAPACITY": "{bad"}, '"kwok_capacity"'),
    ],
)
def test_run_refuses_an_invalid_setting_with_exit_2(env: dict[str, str], expect: str) -> None:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCALER_")}
    res = subprocess.run([sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env={**clean, **env},
                         capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 2, res.stderr
    assert expect in res.stderr and "Traceback" not in res.stderr
