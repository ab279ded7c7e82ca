"""Start, watch and stop the dev control plane: etcd, kube-apiserver, scheduler, controller-manager, kwok.

All components run as local processes bound to free loopback ports, with their data (etcd, PKI,
kubeconfigs, logs) in a fresh temporary directory. The API server serves TLS with generated certs,
authorizes with Node + RBAC and signs service-account tokens; the controller-manager runs its
default controllers (service accounts and their tokens, garbage collector, Job, root-CA publisher,
node lifecycle, ...); kwok manages only nodes annotated ``kwok.x-k8s.io/node=fake``.

Cleanup: every component is started in its own session (process group) and killed as a group.
A cluster owned by a Python process (``detach=False``: tests, benchmarks, ``up`` in the
foreground) is also stopped by ``atexit``, by SIGTERM/SIGHUP, and, should the owner die without
running any of these (SIGKILL), by the kernel: each component gets ``PR_SET_PDEATHSIG``. Every
cluster records its pids in ``<state dir>/<name>/state.json`` so that ``down`` can stop a
detached or leftover cluster later.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from gpuscaler.devcluster import certs, stages
from gpuscaler.devcluster.build import Binaries, cache_dir, find_binaries
from gpuscaler.devcluster.processes import (
    _die_with_parent,
    _insecure_ctx,
    _probe,
    kubeconfig_yaml,
    pid_alive,
    terminate,
)
from gpuscaler.devcluster.versions import ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION
from gpuscaler.errors import TemporaryError

Log = Callable[[str], None]

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""Nodes with this annotation set to ``fake`` are played by kwok."""

SERVICE_CIDR = "10.96.0.0/12"
SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
"""Fake pod IPs handed out by kwok (never routed anywhere)."""


AUDIT_LOG = "audit.log"
"""The API server's audit log in ``<data dir>/logs`` when the cluster is started with ``audit=True``."""
AUDIT_LOG_ENV = "GPUSCALER_DEVCLUSTER_AUDIT_LOG"
"""Set by :func:`existing_or_private` to the audit log's path when the cluster writes one."""
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}
"""Every request at Metadata level (who, verb, resource, object name, response code; no bodies), one
line per request once answered (the RequestReceived stage is left out; a WATCH also logs when it
starts, stage ResponseStarted). Kubernetes' auditing docs: kubernetes.io/docs/tasks/debug/debug-cluster/audit/."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ClusterError(TemporaryError, RuntimeError):
    """The control plane failed to start (the message carries the failing component's log tail)."""


def state_root() -> Path:
    """Where clusters record their state: ``$GPUSCALER_DEVCLUSTER_STATE_DIR`` or ``<cache>/dev-cluster``."""
    env = os.environ.get("GPUSCALER_DEVCLUSTER_STATE_DIR")
    return Path(env).expanduser() if env else cache_dir() / "dev-cluster"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together, so never the same one twice)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class ClusterState:
    """What ``state.json`` holds: enough to use and to stop a running cluster from another process."""

    name: str
    data_dir: str
    kubeconfig: str
    server: str
    ports: dict[str, int]
    pids: dict[str, int]
    executables: dict[str, str]
    owner_pid: int
    detached: bool
    started_at: float
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        """Read a state file."""
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# the cluster


class Cluster:
    """One local control plane with kwok. Use as a context manager, or ``start()``/``stop()``.

    ``detach=True`` leaves the processes running after this Python process exits (``up
    --detach``); they are then stopped with :func:`down`. Otherwise the cluster dies with its
    owner, whichever way the owner ends.
    """

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        name: str = "default",
        state_dir: Path | None = None,
        detach: bool = False,
        log: Log = _stderr,
        keep_data: bool = False,
        extra_args: dict[str, list[str]] | None = None,
        addons: tuple[str, ...] = (),
        audit: bool = False,
    ) -> None:
        self.binaries = binaries or find_binaries()
        self.addons = addons
        self.audit = audit
        """Whether the API server writes an audit log of every request (:attr:`audit_log`)."""
        """Add-ons (``kueue``, ``jobset``) started with the cluster (:mod:`gpuscaler.devcluster.addons`)."""
        self.name = name
        self.state_dir = (state_dir or state_root()) / name
        self.detach = detach
        self.log = log
        self.keep_data = keep_data or os.environ.get("GPUSCALER_DEVCLUSTER_KEEP") == "1"
        self.extra_args = extra_args or {}
        self.data_dir: Path | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.pki: certs.ClusterPKI | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self.startup_seconds: dict[str, float] = {}

    # -- public API ---------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client cert in ``system:masters``), stable across restarts."""
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def audit_log(self) -> Path | None:
        """The audit log (JSON lines, :data:`AUDIT_POLICY`) of a cluster started with ``audit=True``, else None."""
        if not self.audit or self.data_dir is None:
            return None
        return self.data_dir / "logs" / AUDIT_LOG

    @property
    def state_file(self) -> Path:
        """Where this cluster's pids and ports are recorded."""
        return self.state_dir / "state.json"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for kubectl/helm subprocesses: ``KUBECONFIG`` and a ``PATH`` with helm."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = self.binaries.path_env(env.get("PATH"))
        return env

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> None:
        """Start every component and return when the cluster can schedule pods on kwok nodes."""
        existing = self.state_file
        if existing.exists():
            old = ClusterState.load(existing)
            if any(pid_alive(p, old.executables.get(c)) for c, p in old.pids.items()):
                raise ClusterError(
                    f"dev cluster {self.name!r} is already running (pids {old.pids}); "
                    f"stop it with `python -m gpuscaler.devcluster down --name {self.name}`"
                )
            existing.unlink()
        t0 = time.monotonic()
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"gpuscaler-devcluster-{self.name}-"))
        (self.data_dir / "logs").mkdir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if not self.detach:
            self._install_cleanup()
        try:
            self._start(t0, timeout)
        except BaseException:
            self.log(f"dev cluster {self.name!r} failed to start; logs in {self.data_dir / 'logs'}")
            keep = self.keep_data
            self.keep_data = True  # keep the logs of a failed start for a post-mortem
            self.stop()
            self.keep_data = keep
            raise
        self.startup_seconds["total"] = time.monotonic() - t0
        self.log(
            f"dev cluster {self.name!r} ready in {self.startup_seconds['total']:.1f}s: {self.server}, "
            f"KUBECONFIG={self.kubeconfig}"
        )

    def stop(self) -> None:
        """Stop every component (process groups), forget the state and remove the data dir."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        pids = {c: p.pid for c, p in self.procs.items()}
        execs = {c: str(p.args[0]) for c, p in self.procs.items() if isinstance(p.args, list)}
        terminate(pids, execs)
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            st = ClusterState.load(self.state_file)
            if st.owner_pid == os.getpid() or st.pids == pids:
                self.state_file.unlink()
                with contextlib.suppress(FileNotFoundError):
                    self.kubeconfig.unlink()
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()  # only if empty
        if self.data_dir is not None and not self.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def start_addons(self, names: tuple[str, ...], timeout: float = 180.0) -> None:
        """Start Kueue and/or JobSet controllers in this running cluster (see
        :func:`gpuscaler.devcluster.addons.start`); they stop with the cluster.

        Raises:
            ClusterError: an add-on is unknown, not built, or did not become ready.
        """
        from gpuscaler.devcluster import addons

        try:
            addons.start(self, names, timeout=timeout)
        except addons.AddonError as err:
            raise ClusterError(str(err)) from err
        self._save_state()

    def wait(self) -> str:
        """Block until a component exits (foreground ``up``); return its name."""
        while True:
            for c, p in self.procs.items():
                if p.poll() is not None:
                    return c
            time.sleep(0.5)

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    # -- internals -----------------------------------------------------------------------------

    def _install_cleanup(self) -> None:
        atexit.register(self.stop)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):

                def handler(signum: int, frame: FrameType | None) -> None:
                    raise SystemExit(128 + signum)  # unwinds: finally blocks, fixtures, atexit

                signal.signal(sig, handler)

    def spawn(self, component: str, argv: list[str]) -> None:
        """Start ``argv`` as the cluster's component ``component``: its own session, its log in
        ``<data dir>/logs/<component>.log``, recorded in the state file and stopped with the cluster."""
        assert self.data_dir is not None
        argv = [*argv, *self.extra_args.get(component, [])]
        logf = (self.data_dir / "logs" / f"{component}.log").open("ab")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                # prctl only, no Python-level locking: safe after fork
                preexec_fn=None if self.detach else _die_with_parent,  # noqa: PLW1509
            )
        finally:
            logf.close()
        self.procs[component] = proc
        self._save_state()

    def _save_state(self) -> None:
        assert self.data_dir is not None
        ClusterState(
            name=self.name,
            data_dir=str(self.data_dir),
            kubeconfig=str(self.kubeconfig),
            server=self.server if "kube-apiserver" in self.ports else "",
            ports=self.ports,
            pids={c: p.pid for c, p in self.procs.items()},
            executables={c: str(p.args[0]) for c, p in self.procs.items() if isinstance(p.args, list)},
            owner_pid=os.getpid(),
            detached=self.detach,
            started_at=time.time(),
            versions={"kubernetes": KUBERNETES_VERSION, "etcd": ETCD_VERSION, "kwok": KWOK_VERSION},
        ).save(self.state_file)

    def _log_tail(self, component: str, lines: int = 30) -> str:
        assert self.data_dir is not None
        path = self.data_dir / "logs" / f"{component}.log"
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n".join(f"    {t}" for t in text)

    def wait_for(
        self, component: str, check: Callable[[], bool], deadline: float, label: str | None = None
    ) -> None:
        """Poll ``check`` until it is true; raise :class:`ClusterError` (with the component's log
        tail) if ``component`` exits first or ``deadline`` (``time.monotonic()``) passes."""
        t0 = time.monotonic()
        while True:
            proc = self.procs.get(component)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{component} exited with {proc.returncode} while starting:\n{self._log_tail(component)}"
                )
            if check():
                self.startup_seconds[label or component] = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{component} not ready in time:\n{self._log_tail(component)}")
            time.sleep(0.1)

    def _start(self, t0: float, timeout: float) -> None:
        assert self.data_dir is not None
        d = self.data_dir
        deadline = t0 + timeout
        b = self.binaries
        names = ["etcd", "etcd-peer", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok"]
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        p = self.ports
        self.pki = pki = certs.generate(d / "pki", service_ip=SERVICE_IP)

        # etcd
        etcd_url = f"http://127.0.0.1:{p['etcd']}"
        peer_url = f"http://127.0.0.1:{p['etcd-peer']}"
        self.spawn(
            "etcd",
            [
                str(b.etcd),
                "--name=default",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",  # throwaway data: durability buys nothing, fsync costs a lot
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self.wait_for("etcd", lambda: '"health":"true"' in _probe(f"{etcd_url}/health", None)[1], deadline)

        # kube-apiserver
        audit: list[str] = []
        if self.audit:
            policy = d / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
            audit = [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={d / 'logs' / AUDIT_LOG}",
                "--audit-log-format=json",
                "--audit-log-mode=batch",  # written off the request path: the log costs no latency
                "--audit-log-maxsize=0",  # one file, never rotated (a run's requests, read after it)
            ]
        self.spawn(
            "kube-apiserver",
            [
                str(b.kube_apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p['kube-apiserver']}",
                f"--cert-dir={d / 'apiserver-certs'}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                # aggregation layer (front proxy): lets components verify proxied requests
                f"--requestheader-client-ca-file={pki.ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.clients['front-proxy-client'].cert}",
                f"--proxy-client-key-file={pki.clients['front-proxy-client'].key}",  # 127.0.0.1 is not a valid Endpoints address
                "--profiling=false",
                *audit,
            ],
        )
        admin = pki.clients["admin"]
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        ctx.load_cert_chain(str(admin.cert), str(admin.key))
        self.wait_for(
            "kube-apiserver",
            lambda: _probe(f"{self.server}/readyz", ctx)[0] == 200,
            deadline,
        )

        # kubeconfigs
        kcfg: dict[str, Path] = {}
        for client, user in (("scheduler", "system:kube-scheduler"),
                             ("controller-manager", "system:kube-controller-manager"), ("kwok", "kwok")):
            path = d / f"{client}.kubeconfig"
            text = kubeconfig_yaml(self.server, pki.ca.cert, pki.clients[client], "gpuscaler-dev", user)
            path.write_text(text)
            kcfg[client] = path
        tmp_kc = self.kubeconfig.with_suffix(".tmp")
        tmp_kc.write_text(kubeconfig_yaml(self.server, pki.ca.cert, admin, f"gpuscaler-{self.name}"))
        tmp_kc.chmod(0o600)
        os.replace(tmp_kc, self.kubeconfig)

        # scheduler, controller-manager, kwok: start together
        self.spawn(
            "kube-scheduler",
            [
                str(b.kube_scheduler),
                f"--kubeconfig={kcfg['scheduler']}",
                f"--authentication-kubeconfig={kcfg['scheduler']}",
                f"--authorization-kubeconfig={kcfg['scheduler']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-scheduler']}",
                f"--cert-dir={d / 'scheduler-certs'}",
                "--leader-elect=false",
            ],
        )
        self.spawn(
            "kube-controller-manager",
            [
                str(b.kube_controller_manager),
                f"--kubeconfig={kcfg['controller-manager']}",
                f"--authentication-kubeconfig={kcfg['controller-manager']}",
                f"--authorization-kubeconfig={kcfg['controller-manager']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['kube-controller-manager']}",
                f"--cert-dir={d / 'controller-manager-certs'}",
                "--leader-elect=false",
                "--controllers=*",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca.cert}",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--cluster-name=gpuscaler-dev",
                # The default client rate (20 qps, burst 30, per controller) lifts the not-ready taint
                # off new nodes at ~5 nodes/s; managed control planes run with more, and so do we.
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ],
        )
        kwok_cfg = d / "kwok.yaml"
        kwok_cfg.write_text(stages.kwok_config())
        self.spawn(
            "kwok",
            [
                str(b.kwok),
                f"--config={kwok_cfg}",
                f"--kubeconfig={kcfg['kwok']}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{p['kwok']}",
                f"--cidr={POD_CIDR}",
                "--node-lease-duration-seconds=40",
            ],
        )
        insecure = _insecure_ctx()
        for comp in ("kube-scheduler", "kube-controller-manager"):
            url = f"https://127.0.0.1:{p[comp]}/healthz"
            self.wait_for(comp, lambda url=url: _probe(url, insecure)[0] == 200, deadline)  # type: ignore[misc]
        kwok_url = f"http://127.0.0.1:{p['kwok']}/healthz"
        self.wait_for("kwok", lambda: _probe(kwok_url, None)[0] == 200, deadline)
        # The service-account controller creates "default" in every namespace; pods need it.
        sa_url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        self.wait_for(
            "kube-controller-manager", lambda: _probe(sa_url, ctx)[0] == 200, deadline, "default ServiceAccount"
        )
        self._save_state()
        if self.addons:
            t_addons = time.monotonic()
            self.start_addons(self.addons, timeout=max(60.0, deadline - t_addons))
            self.startup_seconds["addons"] = time.monotonic() - t_addons


# --------------------------------------------------------------------------------------------
# clusters started by other processes


def list_states(root: Path | None = None) -> list[tuple[Path, ClusterState]]:
    """Every recorded cluster under the state root."""
    out: list[tuple[Path, ClusterState]] = []
    for f in sorted((root or state_root()).glob("*/state.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append((f, ClusterState.load(f)))
    return out


def is_running(state: ClusterState) -> bool:
    """True if the recorded API server process still runs."""
    pid = state.pids.get("kube-apiserver")
    return pid is not None and pid_alive(pid, state.executables.get("kube-apiserver"))


def down(name: str = "default", root: Path | None = None, log: Log = _stderr) -> bool:
    """Stop a cluster recorded under ``name`` (detached or leftover); True if one was found."""
    state_file = (root or state_root()) / name / "state.json"
    if not state_file.exists():
        return False
    st = ClusterState.load(state_file)
    alive = {c: p for c, p in st.pids.items() if pid_alive(p, st.executables.get(c))}
    if alive:
        log(f"stopping dev cluster {name!r} (pids {alive})")
    terminate(st.pids, st.executables)
    state_file.unlink(missing_ok=True)
    Path(st.kubeconfig).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        state_file.parent.rmdir()  # only if empty
    if st.data_dir and Path(st.data_dir).name.startswith("gpuscaler-devcluster-"):
        shutil.rmtree(st.data_dir, ignore_errors=True)
    return True


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[Cluster]:
    """``with running_cluster() as c:`` -- a started cluster, stopped on exit."""
    c = Cluster(**kwargs)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@contextlib.contextmanager
def existing_or_private(
    kubeconfig: str | None, name: str, *, audit: bool = False
) -> Iterator[tuple[str, dict[str, str]]]:
    """(kubeconfig path, env) of the cluster ``kubeconfig`` names, or of a private one started here
    (binaries built if missing) and stopped on exit. For benchmarks and scripts that take an
    optional ``--kubeconfig``. ``audit``: the private cluster writes an audit log
    (:attr:`Cluster.audit_log`; its path is in the env as ``GPUSCALER_DEVCLUSTER_AUDIT_LOG``)."""
    if kubeconfig:
        yield kubeconfig, dict(os.environ, KUBECONFIG=kubeconfig)
        return
    from gpuscaler.devcluster.build import ensure_all

    with running_cluster(binaries=ensure_all(), name=name, audit=audit) as c:
        env = c.env()
        if c.audit_log is not None:
            env[AUDIT_LOG_ENV] = str(c.audit_log)
        yield str(c.kubeconfig), env


def apply_crds(env: dict[str, str], paths: list[Path], names: list[str], timeout: float = 60.0) -> None:
    """``kubectl apply`` the CRD files at ``paths``, then wait until every CRD in ``names`` is Established.

    The wait polls ``kubectl get`` rather than using ``kubectl wait``: for a CRD created a moment
    earlier, ``status.conditions`` can still be null and ``kubectl wait`` then exits 1 at once
    (".status.conditions accessor error: <nil> is of the type <nil>") instead of waiting.
    """
    for path in paths:
        res = subprocess.run(["kubectl", "apply", "-f", str(path)], env=env, capture_output=True, text=True, check=False)
        if res.returncode:
            raise RuntimeError(f"kubectl apply -f {path} failed: {res.stderr.strip()}")
    wait_established(env, names, timeout)


def wait_established(env: dict[str, str], names: list[str], timeout: float = 60.0) -> None:
    """Wait until each CustomResourceDefinition in ``names`` has condition Established=True."""
    deadline = time.monotonic() + timeout
    for name in names:
        last = ""
        while True:
            res = subprocess.run(
                ["kubectl", "get", "crd", name, "-o", "json"], env=env, capture_output=True, text=True, check=False
            )
            if res.returncode == 0:
                conditions = (json.loads(res.stdout).get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                    break
                last = f"conditions {conditions}"
            else:
                last = res.stderr.strip()
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s (last: {last})")
            time.sleep(0.2)
