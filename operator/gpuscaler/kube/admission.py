"""The workers' admission policy: what confines ``gpuscaler-worker`` to its own pod, installed or checked.

RBAC gives the workers' ServiceAccount (:data:`gpuscaler.kube.workers.WORKER_SERVICE_ACCOUNT`)
``patch`` on every pod of its namespace: it cannot name "the caller's own pod", as worker pod
names differ per job and per attempt. A ValidatingAdmissionPolicy (Kubernetes >= 1.30, API
``admissionregistration.k8s.io/v1``) narrows it at admission: a request from that account may
change only the runtime's reported annotations (:data:`gpuscaler.runtime.constants.REPORTED_ANNOTATIONS`),
only on the pod its token is bound to (kubelet-projected tokens carry the pod's name), and never a
pod's spec, labels, finalizers or owners.

This module is the one source of those rules: :func:`policy_spec` and :func:`binding_spec`. The
Helm chart's ``templates/worker-admission-policy.yaml`` renders the same spec
(``tests/test_admission.py`` fails when they differ). Where no chart installed it, the operator
does (:class:`WorkerAdmission`, at start-up and every :data:`RECHECK_S`): with
``settings.worker_admission_policy`` ``install`` (default) it creates or updates the policy and
its binding when it may, else checks they are there; ``verify`` only checks; ``off`` is the
documented opt-out (workers run under the broad Role alone). While the policy is not in force the
reconcile loop starts no workers under that account (:meth:`WorkerAdmission.refusal` says why,
in the job's ``WorkerAdmissionPolicy`` condition and an Event). Jobs whose template names its own
ServiceAccount are not affected: that account's rights are the user's.

``python -m gpuscaler.kube.admission [--namespace NS] [--name NAME]`` prints the policy and binding as
YAML, for a cluster admin to ``kubectl apply -f -``.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.inputs import namespace_name
from gpuscaler.kube.client import HTTP_NOT_FOUND
from gpuscaler.kube.workers import MANAGED_BY, WORKER_SERVICE_ACCOUNT
from gpuscaler.runtime.constants import REPORTED_ANNOTATIONS

POLICY_NAME = "gpuscaler-worker-own-pod"
"""Name of the policy the operator installs (the chart's: ``<fullname>-worker-own-pod``); the
binding's is :func:`binding_name`."""
API_VERSION = "admissionregistration.k8s.io/v1"
POLICY_KIND = "ValidatingAdmissionPolicy"
BINDING_KIND = "ValidatingAdmissionPolicyBinding"
BOUND_POD_EXTRA = "authentication.kubernetes.io/pod-name"
"""The user-info extra a pod-bound ServiceAccount token carries (Kubernetes >= 1.30)."""
RECHECK_S = 30.0
"""Seconds between checks of the policy (two GETs): one installed by hand is picked up, and one
deleted is noticed (and, in ``install`` mode, put back), within half a minute."""
HTTP_FORBIDDEN = 403
Mode = Literal["install", "verify", "off"]
MODES: tuple[Mode, ...] = ("install", "verify", "off")


def _quoted(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def policy_spec() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec: who it applies to and what it lets through."""
    unchanged = " && ".join(
        [
            "object.spec == oldObject.spec",
            *(
                f"(has(object.metadata.{f}) ? object.metadata.{f} : {e})"
                f" == (has(oldObject.metadata.{f}) ? oldObject.metadata.{f} : {e})"
                for f, e in (("labels", "{}"), ("finalizers", "[]"), ("ownerReferences", "[]"))
            ),
        ]
    )
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
            ]
        },
        "matchConditions": [
            {
                "name": "is-gpuscaler-worker",
                "expression": "request.userInfo.username == 'system:serviceaccount:' + request.namespace"
                f" + ':{WORKER_SERVICE_ACCOUNT}'",
            }
        ],
        "variables": [
            {"name": "allowed", "expression": _quoted(REPORTED_ANNOTATIONS)},
            {
                "name": "boundPod",
                "expression": f"'{BOUND_POD_EXTRA}' in request.userInfo.extra"
                f" ? request.userInfo.extra['{BOUND_POD_EXTRA}'][0] : ''",
            },
            {"name": "new", "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
            {"name": "old", "expression": "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
            {
                "name": "changed",
                "expression": "variables.new.filter(k, !(k in variables.old) || variables.old[k] != variables.new[k])"
                " + variables.old.filter(k, !(k in variables.new))",
            },
        ],
        "validations": [
            {
                "expression": "variables.boundPod == object.metadata.name",
                "messageExpression": "variables.boundPod == ''"
                " ? 'a gpuscaler worker must use a token bound to its pod (the kubelet-projected"
                " ServiceAccount token, or kubectl create token --bound-object-kind Pod), to patch pod \"'"
                " + object.metadata.name + '\"'"
                " : 'a gpuscaler worker may patch only its own pod: this token is bound to pod \"'"
                " + variables.boundPod + '\", the request is for pod \"' + object.metadata.name + '\"'",
                "reason": "Forbidden",
            },
            {
                "expression": "variables.changed.all(k, k in variables.allowed)",
                "messageExpression": "'a gpuscaler worker may change only the annotations '"
                " + variables.allowed.join(', ') + ', not '"
                " + variables.changed.filter(k, !(k in variables.allowed)).join(', ')",
                "reason": "Forbidden",
            },
            {
                "expression": unchanged,
                "message": "a gpuscaler worker may not change a pod's spec, labels, finalizers or owners",
                "reason": "Forbidden",
            },
        ],
    }


def binding_spec(policy: str, namespace: str | None) -> dict[str, Any]:
    """The binding's spec: deny what the policy refuses, in ``namespace`` only when given."""
    spec: dict[str, Any] = {"policyName": policy, "validationActions": ["Deny"]}
    if namespace:
        spec["matchResources"] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
    return spec


def binding_name(policy: str, namespace: str | None) -> str:
    """The binding's name: the policy's, with ``-<namespace>`` in namespaced mode, so operators
    watching different namespaces each keep their own binding of the one shared policy."""
    return f"{policy}-{namespace}"[:253] if namespace else policy


def manifests(name: str = POLICY_NAME, namespace: str | None = None) -> list[dict[str, Any]]:
    """The policy (named ``name``) and its binding (:func:`binding_name`) as the operator installs them."""
    labels = dict(MANAGED_BY)
    return [
        {"apiVersion": API_VERSION, "kind": POLICY_KIND, "metadata": {"name": name, "labels": labels}, "spec": policy_spec()},
        {
            "apiVersion": API_VERSION,
            "kind": BINDING_KIND,
            "metadata": {"name": binding_name(name, namespace), "labels": dict(labels)},
            "spec": binding_spec(name, namespace),
        },
    ]


def contains(have: object, want: object) -> bool:
    """Whether ``have`` (read from the API server, with its defaults filled in) holds all of ``want``."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list) and len(have) == len(want) and all(contains(h, w) for h, w in zip(have, want, strict=True))
        )
    return have == want


class PolicyApi(Protocol):
    """Reads and writes the two cluster-scoped objects (:class:`KubePolicyApi`; a fake in tests).
    Errors are ``ApiException`` with the HTTP status."""

    def read(self, kind: str, name: str) -> dict[str, Any]: ...
    def create(self, body: dict[str, Any]) -> None: ...
    def replace(self, body: dict[str, Any]) -> None: ...


class KubePolicyApi:
    """:class:`PolicyApi` through ``AdmissionregistrationV1Api``."""

    def __init__(self, api: Any) -> None:
        self.api: Any = api
        self.admission: Any = client.AdmissionregistrationV1Api(api)

    def _call(self, verb: str, kind: str) -> Callable[..., Any]:
        suffix = "validating_admission_policy" if kind == POLICY_KIND else "validating_admission_policy_binding"
        fn: Callable[..., Any] = getattr(self.admission, f"{verb}_{suffix}")
        return fn

    def read(self, kind: str, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.api.sanitize_for_serialization(self._call("read", kind)(name))
        return got

    def create(self, body: dict[str, Any]) -> None:
        self._call("create", body["kind"])(body)

    def replace(self, body: dict[str, Any]) -> None:
        self._call("replace", body["kind"])(body["metadata"]["name"], body)


@dataclass(frozen=True)
class AdmissionState:
    """The outcome of one check."""

    enforced: bool
    """The policy and its binding are in place with these rules."""
    allowed: bool
    """Workers may run under the worker account (enforced, or the opt-out ``off``)."""
    detail: str
    """What was found or done (logged), or why the workers are refused."""


class WorkerAdmission:
    """Installs (or checks) the worker admission policy and says whether workers may run.

    Args:
        api: Access to the policy objects.
        mode: ``install``, ``verify`` or ``off`` (``settings.worker_admission_policy``).
        name: The policy's and binding's name (the chart's, under Helm).
        namespace: Bind to this namespace only (the operator's watched namespace), or all.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        api: PolicyApi,
        mode: Mode = "install",
        name: str = POLICY_NAME,
        namespace: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"worker_admission_policy: {mode!r} is not one of {', '.join(MODES)}")
        self.api = api
        self.mode = mode
        self.name = name
        self.namespace = namespace
        self.clock = clock
        self.state: AdmissionState | None = None
        self._checked = 0.0
        self._done: list[str] = []
        self._lock = threading.Lock()

    def ensure(self) -> AdmissionState:
        """Check now (in ``install`` mode, create or update what is missing or different)."""
        with self._lock:
            self.state = self._check()
            self._checked = self.clock()
            return self.state

    def refusal(self) -> str | None:
        """Why workers may not run under the worker account now, or None (re-checked every
        :data:`RECHECK_S`). The reconcile loop calls it before starting workers."""
        with self._lock:
            stale = self.state is None or self.clock() - self._checked >= RECHECK_S
        state = self.ensure() if stale else self.state
        assert state is not None
        return None if state.allowed else state.detail

    def _refused(self, cause: str) -> AdmissionState:
        return AdmissionState(
            False,
            False,
            f"the worker admission policy {self.name} is not in force ({cause}); without it the "
            f"{WORKER_SERVICE_ACCOUNT} ServiceAccount may patch every pod of its namespace. Install it "
            "(the Helm chart, or as a cluster admin: python -m gpuscaler.kube.admission | kubectl apply -f -), "
            "let the operator install it (create, get, update on validatingadmissionpolicies and "
            "validatingadmissionpolicybindings), or set GPUSCALER_WORKER_ADMISSION_POLICY=off "
            "(Helm: settings.workerAdmissionPolicy) to run workers without it; see docs/security.md",
        )

    def _read(self, kind: str, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """The object (None when absent) or why it could not be read."""
        try:
            return self.api.read(kind, name), None
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return None, None
            return None, f"reading {kind} {name}: {err.status} {err.reason}"
        except Exception as err:  # the API server not reached: say so, try again later
            return None, f"reading {kind} {name}: {err}"

    def _ensure(self, body: dict[str, Any], alternatives: list[tuple[str, dict[str, Any]]]) -> str | None:
        """Make ``body`` be in force (or find an alternative that is); None when it is, else why not."""
        kind, name = body["kind"], body["metadata"]["name"]
        have, unreadable = self._read(kind, name)
        if have is not None and contains(have.get("spec"), body["spec"]):
            return None
        for other, spec in alternatives:  # e.g. a binding for every namespace covers ours
            found, _ = self._read(kind, other)
            if found is not None and contains(found.get("spec"), spec):
                return None
        if unreadable is not None:
            return unreadable
        what = "missing" if have is None else "different from this operator's rules"
        if self.mode == "verify":
            return f"{kind} {name} is {what}; mode verify installs nothing"
        verb = "create" if have is None else "update"
        try:
            if have is None:
                self.api.create(body)
            else:
                body["metadata"]["resourceVersion"] = (have.get("metadata") or {}).get("resourceVersion")
                self.api.replace(body)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return f"the API server does not serve {API_VERSION} {kind} (Kubernetes >= 1.30 does)"
            if err.status == HTTP_FORBIDDEN:
                return f"{kind} {name} is {what} and the operator may not {verb} it"
            return f"{verb[:-1]}ing {kind} {name}: {err.status} {err.reason}"
        except Exception as err:
            return f"{verb[:-1]}ing {kind} {name}: {err}"
        self._done.append(f"{verb}d {kind} {name}")
        return None

    def _check(self) -> AdmissionState:
        if self.mode == "off":
            return AdmissionState(
                False,
                True,
                f"worker admission policy off: {WORKER_SERVICE_ACCOUNT} may patch every pod of its namespace",
            )
        self._done = []
        policy, binding = manifests(self.name, self.namespace)
        everywhere = [(self.name, binding_spec(self.name, None))] if self.namespace else []
        for body, alternatives in ((policy, []), (binding, everywhere)):
            cause = self._ensure(body, alternatives)
            if cause is not None:
                return self._refused(cause)
        return AdmissionState(True, True, "; ".join(self._done) or f"{POLICY_KIND} {self.name} and its binding in force")


def main(argv: list[str] | None = None) -> int:
    """Print the policy and binding as YAML (``python -m gpuscaler.kube.admission``).

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 (2 for a usage error, from argparse).
    """
    import yaml

    ap = argparse.ArgumentParser(prog="python -m gpuscaler.kube.admission", description=main.__doc__)
    ap.add_argument("--name", default=POLICY_NAME, help=f"policy and binding name (default {POLICY_NAME})")
    ap.add_argument("--namespace", type=namespace_name, default=None, help="bind to this namespace only (default: all)")
    args = ap.parse_args(argv)
    print(yaml.safe_dump_all(manifests(args.name, args.namespace), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
