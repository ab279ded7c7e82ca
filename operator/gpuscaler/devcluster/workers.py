"""The dev cluster's worker runner: it plays the kubelet for TrainingJob pods on kwok's fake nodes.

kwok marks a pod Running but never runs its container. For every worker pod of a TrainingJob
(label ``gpuscaler.io/job``) that is Running on a kwok node, :class:`WorkerRunner` runs the pod's
container ``command`` + ``args`` as a local process, the way a kubelet would run the container:

* **Environment**: the container's ``env`` (plain values, and ``valueFrom`` field references to
  the pod's name, namespace, uid, node, IP, labels and annotations), ``$(VAR)`` references in the
  command and args expanded as Kubernetes does (``$$`` escapes, an undefined reference stays as
  written), a rendezvous on loopback: ``MASTER_ADDR`` becomes ``127.0.0.1`` when it names a cluster
  DNS name, and ``MASTER_PORT`` a free local port shared by the gang (one per job and attempt).
* **Volumes**: every mounted volume is a local directory under the runner's work directory, and
  every path in the env, command, args and working directory under a mount path is rewritten to it.
  A ``persistentVolumeClaim`` is one directory per claim that outlives the pod (the checkpoint
  directory, as a real persistent volume would be); ``emptyDir`` is one per pod; a ``downwardAPI``
  volume holds the pod's annotations and labels in the kubelet's format (``key="value"`` lines),
  kept in sync with the API server (the runtime reads checkpoint requests there); ``configMap`` and
  ``secret`` volumes hold their keys. A checkpoint directory that is on no volume is the container's
  own file system: a directory of the pod's, lost with it. ``--path-map /app=examples/train`` maps an
  image's own paths onto the host (the image is not pulled); ``python`` and ``python3`` run with the
  runner's interpreter and ``torchrun`` as ``python -m torch.distributed.run``.
* **Identity**: the process talks to the API server as the pod's ServiceAccount, with a token
  bound to the pod (TokenRequest), in a kubeconfig of its own: the same rights as in a real pod,
  and none once the pod is gone.
* **Life**: exit 0 turns the pod Succeeded, another code Failed with that code (reason ``Error``),
  a command that cannot start Failed with exit code 128 and reason ``StartError`` (as the kubelet
  reports a missing executable); a deleted pod gets SIGTERM and, after its
  ``terminationGracePeriodSeconds``, SIGKILL; a deleted node SIGKILLs its processes at once (a lost
  machine). Signals go to the whole process tree (torchrun starts its workers in sessions of their
  own). Stopping the runner stops every process it started.

It runs pod commands on this machine, so it refuses a kubeconfig that is not a dev cluster's
(:func:`check_dev_cluster`: a loopback server and a context made by ``gpuscaler dev-cluster up``).
The e2e suite's spot harness is a user of this runner (``e2e/spot_harness.py``), so the tests run
the code the demo runs.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from gpuscaler import names
from gpuscaler.errors import InvalidInputError

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""kwok manages the nodes annotated with it (value ``fake``): the runner plays the kubelet there only."""
DEV_CONTEXT_PREFIX = "gpuscaler-"
"""The dev cluster's kubeconfig names its cluster ``gpuscaler-<name>`` (:mod:`gpuscaler.devcluster.cluster`)."""
DEFAULT_GRACE_S = 30.0
"""A pod's ``terminationGracePeriodSeconds`` when it sets none (the Kubernetes default)."""
START_ERROR_CODE = 128
"""The exit code the kubelet reports for a container that could not start."""
TOKEN_SECONDS = 3600
"""Lifetime asked for the pod-bound ServiceAccount token (renewed by a new process, not in place)."""
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class RunnerError(InvalidInputError):
    """The runner cannot run here (not a dev cluster, a bad option); the message says what to do
    (invalid input: ``dev-cluster workers`` exits 2)."""


def check_dev_cluster(kubeconfig: str | Path) -> str:
    """Refuse a kubeconfig that is not a dev cluster's; return its API server's URL.

    A dev cluster's kubeconfig (``gpuscaler dev-cluster up``) names its cluster ``gpuscaler-<name>``
    and serves on a loopback address. Anything else could be a real cluster, whose pods must never
    run on this machine.

    Raises:
        RunnerError: the file is missing or unreadable, or names another cluster.
    """
    path = Path(kubeconfig)
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise RunnerError(f"kubeconfig {path}: cannot read it ({err})") from err
    if not isinstance(cfg, dict):
        raise RunnerError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping)")
    current = cfg.get("current-context")
    context: dict[str, Any] = next(
        (c.get("context", {}) for c in cfg.get("contexts") or [] if c.get("name") == current), {}
    )
    cluster_name = str(context.get("cluster", ""))
    cluster: dict[str, Any] = next(
        (c.get("cluster", {}) for c in cfg.get("clusters") or [] if c.get("name") == cluster_name), {}
    )
    server = str(cluster.get("server", ""))
    host = urlparse(server).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not cluster_name.startswith(DEV_CONTEXT_PREFIX) or not loopback:
        raise RunnerError(
            f"kubeconfig {path}: cluster {cluster_name or '(none)'!r} at {server or '(no server)'} is not a dev "
            "cluster; the worker runner runs pod commands on this machine, so it only runs against a cluster "
            "from `gpuscaler dev-cluster up` (eval \"$(gpuscaler dev-cluster env)\")"
        )
    return server


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a command or argument: ``$$`` is a literal ``$``, a
    reference to an undefined variable stays as written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def annotations_file(values: Mapping[str, str]) -> str:
    """The downward API's projection of annotations or labels: ``key="value"`` lines sorted by key,
    values quoted as Go's ``%q`` does (JSON string quoting for the characters that occur)."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(values.items()))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc``), children first; empty where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name is in parentheses and may contain spaces: the ppid is the 2nd field after it
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def signal_tree(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to ``proc`` and every process it started (its group and any session of their own)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass
class Process:
    """One pod played by one local process."""

    uid: str
    name: str
    namespace: str
    job: str
    rank: int
    node: str
    proc: subprocess.Popen[bytes] | None
    """None when the command could not start."""
    podinfo: Path
    log: Path
    started: float
    grace_s: float
    signalled: str = ""
    """``TERM`` or ``KILL`` once the runner signalled it."""
    term_at: float = 0.0
    last_annotations: str = ""
    exit_code: int | None = None
    finished: bool = False
    """Its pod's end is written (or the pod is gone)."""

    @property
    def alive(self) -> bool:
        """The process runs."""
        return self.proc is not None and self.proc.poll() is None


CommandHook = Callable[[Any, list[str], dict[str, str]], list[str]]
"""``(pod, argv, env) -> argv``: replaces the command a pod runs (the e2e harness runs its own worker)."""


@dataclass
class RunnerConfig:
    """What the runner runs and where."""

    work_dir: Path
    """Volumes, pod-info files, logs and kubeconfigs go under it."""
    kubeconfig: Path
    """The dev cluster's admin kubeconfig (its server and CA are copied into the workers' kubeconfigs)."""
    namespace: str | None = None
    """Only this namespace (None: all)."""
    selector: str = names.JOB_LABEL
    """Label selector of the pods it runs (default: every TrainingJob's workers)."""
    path_maps: dict[str, Path] = field(default_factory=dict)
    """Image path -> host path (``/app`` -> ``examples/train``)."""
    poll_s: float = 0.2
    env: dict[str, str] = field(default_factory=dict)
    """Set in every process after the pod's own env (``OMP_NUM_THREADS=1`` and the like)."""
    command: CommandHook | None = None
    log: Callable[[str], None] = lambda _line: None
    """Where the runner says what it does (one line per start, stop and end)."""


class WorkerRunner:
    """Runs one local process per Running worker pod on a kwok node, until stopped."""

    def __init__(self, core: Any, config: RunnerConfig) -> None:
        self.core = core
        self.config = config
        self.server = check_dev_cluster(config.kubeconfig)
        self.processes: dict[str, Process] = {}
        self.errors: list[str] = []
        self._ports: dict[tuple[str, str, str], int] = {}
        self._syncers: dict[str, list[Callable[[Any], None]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> WorkerRunner:
        """Play the pods in a background thread."""
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="worker-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the loop, then every process it started: SIGTERM, SIGKILL after ``grace_s``."""
        self._stop.set()
        if self._thread:
            self._thread.join(30)
        with self._lock:
            live = [p.proc for p in self.processes.values() if p.proc is not None and p.alive]
            for proc in live:
                signal_tree(proc, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for proc in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
            for p in self.processes.values():
                if p.proc is not None:
                    signal_tree(p.proc, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.proc.wait(5)

    def run_forever(self) -> None:
        """Play the pods in this thread until SIGINT/SIGTERM; then stop every process."""
        self.config.work_dir.mkdir(parents=True, exist_ok=True)

        def handler(signum: int, frame: object) -> None:
            self._stop.set()

        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._loop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.tick()
            except Exception as err:  # keep playing: a failed API call is retried on the next tick
                self.errors.append(repr(err))
                self.config.log(f"runner: {err!r}")
            self._stop.wait(self.config.poll_s)

    # ------------------------------------------------------------------------------ one pass

    def tick(self) -> None:
        """One pass: signal what lost its pod or node, sync annotations, write ends, start new pods."""
        if self.config.namespace:
            listed = self.core.list_namespaced_pod(self.config.namespace, label_selector=self.config.selector)
        else:
            listed = self.core.list_pod_for_all_namespaces(label_selector=self.config.selector)
        pods = {p.metadata.uid: p for p in listed.items}
        nodes = {
            n.metadata.name
            for n in self.core.list_node().items
            if (n.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == "fake" and not n.metadata.deletion_timestamp
        }
        for proc in self.processes.values():
            self._follow(proc, pods.get(proc.uid), nodes)
        busy = {(p.namespace, p.job, p.rank) for p in self.processes.values() if p.alive}
        for uid, pod in pods.items():
            if uid in self.processes or pod.metadata.deletion_timestamp or pod.status.phase != "Running":
                continue
            if pod.spec.node_name not in nodes:
                continue
            key = (pod.metadata.namespace, self._job(pod), self._rank(pod))
            if key in busy:
                continue  # the previous process of this rank still runs (a shared volume: one at a time)
            self._spawn(pod)

    def _follow(self, p: Process, pod: Any, nodes: set[str]) -> None:
        if p.proc is None:
            return
        alive = p.alive
        if alive and p.node not in nodes and p.signalled != "KILL":
            signal_tree(p.proc, signal.SIGKILL)  # the machine is gone: no SIGTERM, no last checkpoint
            p.signalled = "KILL"
            self.config.log(f"{p.namespace}/{p.name}: node {p.node} is gone: killed")
        elif alive and (pod is None or pod.metadata.deletion_timestamp):
            if not p.signalled:
                signal_tree(p.proc, signal.SIGTERM)  # the kubelet stops a deleted pod
                p.signalled, p.term_at = "TERM", time.monotonic()
                self.config.log(f"{p.namespace}/{p.name}: pod deleted: SIGTERM (grace {p.grace_s:g} s)")
            elif p.signalled == "TERM" and time.monotonic() - p.term_at > p.grace_s:
                signal_tree(p.proc, signal.SIGKILL)
                p.signalled = "KILL"
                self.config.log(f"{p.namespace}/{p.name}: grace period over: SIGKILL")
        elif alive and pod is not None:
            self._sync_podinfo(p, pod)
        if not alive and p.exit_code is None:
            p.exit_code = p.proc.returncode
            self.config.log(f"{p.namespace}/{p.name}: exited {p.exit_code}")
        if p.exit_code is not None and not p.finished:
            p.finished = True
            if pod is not None and not pod.metadata.deletion_timestamp and p.node in nodes:
                code = p.exit_code if p.exit_code >= 0 else 128 - p.exit_code  # killed by signal N: 128+N
                self._terminate_pod(pod, code, "Completed" if code == 0 else "Error", self._tail(p.log))

    # ------------------------------------------------------------------------------ starting

    @staticmethod
    def _job(pod: Any) -> str:
        return str((pod.metadata.labels or {}).get(names.JOB_LABEL, pod.metadata.name))

    @staticmethod
    def _rank(pod: Any) -> int:
        try:
            return int((pod.metadata.labels or {}).get(names.RANK_LABEL, "0"))
        except ValueError:
            return 0

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """The local directory of a persistentVolumeClaim: shared by the pods that mount it, kept after them."""
        return self.config.work_dir / namespace / "volumes" / claim

    def _pod_dir(self, pod: Any) -> Path:
        ns, name, uid = str(pod.metadata.namespace), str(pod.metadata.name), str(pod.metadata.uid)
        return self.config.work_dir / ns / "pods" / f"{name}-{uid[:8]}"

    def _volumes(self, pod: Any, pod_dir: Path) -> tuple[dict[str, Path], list[Callable[[Any], None]]]:
        """Each volume's local directory, and the writers that keep projected volumes current."""
        ns = pod.metadata.namespace
        dirs: dict[str, Path] = {}
        syncers: list[Callable[[Any], None]] = []
        for vol in pod.spec.volumes or []:
            if vol.persistent_volume_claim is not None:
                d = self.claim_dir(ns, vol.persistent_volume_claim.claim_name)
            elif vol.downward_api is not None:
                d = pod_dir / "downward" / vol.name
                syncers.append(functools.partial(self._write_downward, d, list(vol.downward_api.items or [])))
            elif vol.config_map is not None:
                d = pod_dir / "configmap" / vol.name
                data = self.core.read_namespaced_config_map(vol.config_map.name, ns).data or {}
                self._write_keys(d, data)
            elif vol.secret is not None:
                d = pod_dir / "secret" / vol.name
                raw = self.core.read_namespaced_secret(vol.secret.secret_name, ns).data or {}
                self._write_keys(d, {k: base64.b64decode(v).decode(errors="replace") for k, v in raw.items()})
            elif vol.host_path is not None:
                raise RunnerError(f"volume {vol.name}: hostPath is not run by the dev-cluster runner (use a claim)")
            else:  # emptyDir and anything else: the pod's own directory
                d = pod_dir / "volumes" / vol.name
            d.mkdir(parents=True, exist_ok=True)
            dirs[vol.name] = d
        return dirs, syncers

    @staticmethod
    def _write_keys(d: Path, data: Mapping[str, str]) -> None:
        d.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            _write_atomic(d / key, value)

    @staticmethod
    def _write_downward(d: Path, items: list[Any], pod: Any) -> None:
        d.mkdir(parents=True, exist_ok=True)
        for item in items:
            path = item.field_ref.field_path if item.field_ref else ""
            if path == "metadata.annotations":
                text = annotations_file(dict(pod.metadata.annotations or {}))
            elif path == "metadata.labels":
                text = annotations_file(dict(pod.metadata.labels or {}))
            else:
                text = _field_value(pod, path)
            target = d / item.path
            if not target.exists() or target.read_text() != text:
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_atomic(target, text)

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUSCALER_", "KUBERNETES_")) and k not in ("KUBECONFIG", "MASTER_ADDR", "MASTER_PORT")
        }
        env: dict[str, str] = {}
        for e in container.env or []:
            if e.value is not None:
                env[e.name] = expand(e.value, env)
            elif e.value_from is not None and e.value_from.field_ref is not None:
                env[e.name] = _field_value(pod, e.value_from.field_ref.field_path)
            elif e.value_from is not None and e.value_from.config_map_key_ref is not None:
                ref = e.value_from.config_map_key_ref
                env[e.name] = (self.core.read_namespaced_config_map(ref.name, pod.metadata.namespace).data or {})[ref.key]
            elif e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                raw = (self.core.read_namespaced_secret(ref.name, pod.metadata.namespace).data or {})[ref.key]
                env[e.name] = base64.b64decode(raw).decode(errors="replace")
        return {**base, **env}

    def _rewrite(self, value: str, mounts: list[tuple[str, Path]]) -> str:
        """A path under a mount (or a path map) as the local directory it is here."""
        for prefix, local in mounts:
            for lead in ("", "="):
                i = value.find(lead + prefix) if lead else (0 if value.startswith(prefix) else -1)
                if i < 0:
                    continue
                start = i + len(lead)
                end = start + len(prefix)
                if end == len(value) or value[end] == "/":
                    return value[:start] + str(local) + value[end:]
        return value

    def _argv(self, argv: list[str]) -> list[str]:
        """The image's interpreters as the runner's: ``python``/``python3`` -> this Python, ``torchrun``
        -> ``python -m torch.distributed.run``."""
        if not argv:
            return argv
        head = os.path.basename(argv[0])
        if head in ("python", "python3") or re.fullmatch(r"python3\.\d+", head):
            return [sys.executable, *argv[1:]]
        if head == "torchrun":
            return [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
        return argv

    def _kubeconfig_for(self, pod: Any, pod_dir: Path) -> Path:
        """A kubeconfig with a token of the pod's ServiceAccount bound to the pod."""
        from kubernetes import client

        account = pod.spec.service_account_name or "default"
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=TOKEN_SECONDS,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        token = self.core.create_namespaced_service_account_token(account, pod.metadata.namespace, body).status.token
        admin = yaml.safe_load(self.config.kubeconfig.read_text())
        current = admin.get("current-context")
        context = next(c["context"] for c in admin["contexts"] if c["name"] == current)
        cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": cluster["name"], "user": account,
                                                    "namespace": pod.metadata.namespace}}],
            "current-context": "pod",
        }
        path = pod_dir / "kubeconfig"
        _write_atomic(path, yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def _spawn(self, pod: Any) -> None:
        pod_dir = self._pod_dir(pod)
        pod_dir.mkdir(parents=True, exist_ok=True)
        log: Path = pod_dir / "container.log"
        container = pod.spec.containers[0]
        grace = pod.spec.termination_grace_period_seconds
        try:
            volumes, syncers = self._volumes(pod, pod_dir)
            for sync in syncers:
                sync(pod)
            mounts = sorted(
                ((m.mount_path.rstrip("/") or "/", volumes[m.name]) for m in container.volume_mounts or [] if m.name in volumes),
                key=lambda m: -len(m[0]),
            )
            mounts += sorted(((k.rstrip("/"), v) for k, v in self.config.path_maps.items()), key=lambda m: -len(m[0]))
            env = self._env(pod, container)
            env = {k: self._rewrite(v, mounts) for k, v in env.items()}
            ckpt = env.get("GPUSCALER_CHECKPOINT_DIR")
            if ckpt and not Path(ckpt).is_relative_to(self.config.work_dir):
                env["GPUSCALER_CHECKPOINT_DIR"] = str(pod_dir / "rootfs" / ckpt.lstrip("/"))  # the container's own FS
            if env.get("MASTER_ADDR") and not _is_loopback(env["MASTER_ADDR"]):
                env["MASTER_ADDR"] = "127.0.0.1"  # no cluster DNS here: the gang meets on loopback
            if "MASTER_PORT" in env:
                key = (pod.metadata.namespace, self._job(pod), (pod.metadata.labels or {}).get(names.ATTEMPT_LABEL, ""))
                env["MASTER_PORT"] = str(self._ports.setdefault(key, free_port()))
            env.update(self.config.env)
            env["KUBECONFIG"] = str(self._kubeconfig_for(pod, pod_dir))
            argv = [expand(a, env) for a in [*(container.command or []), *(container.args or [])]]
            if self.config.command is not None:
                argv = self.config.command(pod, argv, env)
            if not argv:
                raise RunnerError("the container names no command: the runner cannot read an image's entrypoint")
            argv = [self._rewrite(a, mounts) for a in self._argv(argv)]
            cwd = self._rewrite(container.working_dir, mounts) if container.working_dir else str(pod_dir)
            Path(cwd).mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:
                proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except (OSError, RunnerError, KeyError) as err:
            message = f"{type(err).__name__}: {err}" if isinstance(err, KeyError) else str(err)
            self.config.log(f"{pod.metadata.namespace}/{pod.metadata.name}: cannot start: {message}")
            self._terminate_pod(pod, START_ERROR_CODE, "StartError", message)
            self.processes[pod.metadata.uid] = Process(
                pod.metadata.uid, pod.metadata.name, pod.metadata.namespace, self._job(pod), self._rank(pod),
                pod.spec.node_name, None, pod_dir, log, time.time(), DEFAULT_GRACE_S,
                exit_code=START_ERROR_CODE, finished=True,
            )
            return
        p = Process(
            pod.metadata.uid, pod.metadata.name, pod.metadata.namespace, self._job(pod), self._rank(pod),
            pod.spec.node_name, proc, pod_dir, log, time.time(), float(DEFAULT_GRACE_S if grace is None else grace),
        )
        p.last_annotations = annotations_file(dict(pod.metadata.annotations or {}))
        self._syncers[pod.metadata.uid] = syncers
        self.processes[pod.metadata.uid] = p
        self.config.log(f"{p.namespace}/{p.name}: started on {p.node} (pid {proc.pid}): {' '.join(argv)}")

    def _sync_podinfo(self, p: Process, pod: Any) -> None:
        text = annotations_file(dict(pod.metadata.annotations or {}))
        if text == p.last_annotations:
            return
        for sync in self._syncers.get(p.uid, []):
            sync(pod)
        p.last_annotations = text

    # ------------------------------------------------------------------------------ ending

    @staticmethod
    def _tail(log: Path, lines: int = 5) -> str:
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])[-1000:]
        except OSError:
            return ""

    def _terminate_pod(self, pod: Any, code: int, reason: str, message: str) -> None:
        """Write the pod's end as the kubelet does: phase and the container's terminated state."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        term: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": stamp, "finishedAt": stamp}
        if message:
            term["message"] = message
        statuses = [
            {"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": term}}
            for c in pod.spec.containers
        ]
        phase = "Succeeded" if code == 0 else "Failed"
        self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace,
            {"status": {"phase": phase, "reason": reason if code else None, "containerStatuses": statuses}},
        )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _field_value(pod: Any, path: str) -> str:
    """The value of a downward-API field path of ``pod`` (``metadata.name``, ``metadata.labels['k']``...)."""
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path in simple:
        return str(simple[path] or "")
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        values = (pod.metadata.labels if m.group(1) == "labels" else pod.metadata.annotations) or {}
        return str(values.get(m.group(2), ""))
    return ""


def bind_claim(core: Any, namespace: str, claim: str, directory: Path) -> None:
    """Create a PersistentVolumeClaim ``claim`` bound to a PersistentVolume of ``directory``.

    The scheduler places a pod only once its claims are bound; the runner maps the claim to its own
    directory (:meth:`WorkerRunner.claim_dir`), which is what ``directory`` should be. The volume is
    pre-bound to the claim (``claimRef`` and ``volumeName``), so the control plane's volume binder
    binds the pair at once.
    """
    volume = f"{namespace}-{claim}"
    pv: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(directory)},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }  # fmt: skip
    pvc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    core.create_persistent_volume(pv)
    core.create_namespaced_persistent_volume_claim(namespace, pvc)
