"""Small helpers shared by the e2e tests: polling, pod/Job manifests for fake GPU nodes, and
kubeconfigs that authenticate as a ServiceAccount."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gpuscaler.devcluster import build
from gpuscaler.devcluster.build import Binaries
from gpuscaler.devcluster.cluster import Cluster
from gpuscaler.devcluster.nodes import GPU_RESOURCE, GPU_TAINT, INSTANCE_TYPE_LABEL

T = TypeVar("T")


@dataclass
class E2ECluster:
    """What tests get: a kubeconfig, an API client, and env for kubectl/helm subprocesses."""

    kubeconfig: Path
    api: Any
    env: dict[str, str]
    binaries: Binaries | None
    cluster: Cluster | None = None
    """The cluster this session started, None when reusing ``GPUSCALER_E2E_KUBECONFIG``."""
    startup_seconds: dict[str, float] = field(default_factory=dict)
    session: str = ""
    """This pytest session's id, the value of ``gpuscaler.io/e2e-session`` on what it creates."""
    missing: dict[str, str | None] = field(default_factory=dict)
    """Capabilities probed so far (:mod:`any_cluster`): the reason one is missing, or None."""
    namespaces: list[str] = field(default_factory=list)
    """Namespaces the ``namespace`` fixture created."""
    created_crds: list[str] = field(default_factory=list)
    """CRDs this session installed on an existing cluster (deleted at the end of the session)."""
    crds_before: set[str] | None = None
    """The CRDs an existing cluster had when the session began (None: not recorded)."""
    created_stages: list[str] = field(default_factory=list)
    """kwok Stage objects this session installed on an existing cluster (deleted at the end)."""

    @property
    def external(self) -> bool:
        """True when the suite runs on a cluster it did not start (``GPUSCALER_E2E_KUBECONFIG``)."""
        return self.cluster is None


def service_account_kubeconfig(
    cluster: E2ECluster, account: str, namespace: str, *, duration: str = "10m", pod: str | None = None
) -> dict[str, Any]:
    """A kubeconfig (as a dict) that authenticates with a fresh token of the ServiceAccount.

    With ``pod``, the token is bound to that pod, as the kubelet-projected token in a pod is. The
    cluster entry is the admin kubeconfig's, with the CA inlined so the result stands alone.
    """
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod] if pod else []
    token = subprocess.run(
        ["kubectl", "create", "token", account, "-n", namespace, f"--duration={duration}", *bound],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.env["KUBECONFIG"]).read_text(encoding="utf-8"))
    cl = admin["clusters"][0]["cluster"]
    if "certificate-authority-data" not in cl and "certificate-authority" in cl:
        ca = base64.b64encode(Path(cl["certificate-authority"]).read_bytes()).decode()
        cl = {"server": cl["server"], "certificate-authority-data": ca}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": cl}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": account, "namespace": namespace}}],
        "current-context": "sa",
    }


class GoModuleError(RuntimeError):
    """``go mod download`` did not give a module's source directory."""


def go_module_dir(module: str, version: str) -> Path:
    """Download a Go module into the module cache (``go mod download -json``) and return its directory.

    Raises :class:`gpuscaler.devcluster.build.BuildError` without a usable Go, :class:`GoModuleError`
    when the download gives no directory.
    """
    go = build._go()
    res = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        env=build._go_env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    info = json.loads(res.stdout or "{}")
    # ``Error`` may only say the local Go is older than the module's go directive: the files are there
    if not info.get("Dir") or not Path(info["Dir"]).is_dir():
        raise GoModuleError(f"go mod download {module}@{version} failed: {res.stdout}{res.stderr}")
    return Path(info["Dir"])


GPU_TOLERATION: dict[str, str] = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15) -> None:
    """SIGTERM a subprocess and give it ``timeout`` seconds to exit, then SIGKILL it."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.contextmanager
def rbac_checked(proc: subprocess.Popen[bytes], log: Path) -> Iterator[None]:
    """Run the body, then stop the operator subprocess and print the end of its log; when the body
    passed, fail if the operator hit an RBAC denial.

    For tests that run the operator under a ServiceAccount with exactly the chart's RBAC: every
    call the operator makes there must be allowed, so a ``Forbidden``/403 in its log is a missing rule.
    """
    try:
        yield
    finally:
        stop_process(proc)
        text = log.read_text(errors="replace")
        print(text[-4000:])
    forbidden = [line for line in text.splitlines() if "Forbidden" in line or " 403" in line]
    assert not forbidden, "the operator hit RBAC denials:\n" + "\n".join(forbidden[:10])


def wait_for(
    predicate: Callable[[], T], timeout: float = 60.0, interval: float = 0.2, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def gpu_pod_spec(
    gpus: int,
    *,
    instance_type: str | None = None,
    tolerate_gpu_taint: bool = True,
    restart_policy: str = "Never",
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod spec with one container asking for ``gpus`` GPUs (kwok never runs the image)."""
    selector = dict(node_selector or {})
    if instance_type:
        selector[INSTANCE_TYPE_LABEL] = instance_type
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "containers": [
            {
                "name": "train",
                "image": "registry.invalid/gpuscaler/trainer:e2e",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {"cpu": "1", "memory": "1Gi"}},
            }
        ],
    }
    if selector:
        spec["nodeSelector"] = selector
    if tolerate_gpu_taint:
        spec["tolerations"] = [GPU_TOLERATION]
    return spec


def gpu_pod(name: str, gpus: int, **kwargs: Any) -> dict[str, Any]:
    """A bare Pod manifest (see :func:`gpu_pod_spec`)."""
    spec = gpu_pod_spec(gpus, **kwargs)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def condition(obj: Any, ctype: str) -> Any:
    """The condition of type ``ctype`` in ``obj.status.conditions``, or None."""
    for c in (obj.status.conditions or []) if obj.status else []:
        if c.type == ctype:
            return c
    return None
