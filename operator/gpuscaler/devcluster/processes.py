"""The dev cluster's processes: started to die with their parent, found alive or not, stopped as a group; probing a component's endpoint; its kubeconfig (used by :mod:`gpuscaler.devcluster.cluster`)."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import signal
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.devcluster import certs

# --------------------------------------------------------------------------------------------
# process helpers

COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok")
"""Start order; stop runs in reverse."""


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child should not dlopen


def _die_with_parent() -> None:  # runs in the child between fork and exec
    # SIGKILL, not SIGTERM: with etcd gone too, kube-apiserver's graceful shutdown can hang.
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_alive(pid: int, executable: str | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, runs ``executable``."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
        if executable is not None:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0", 1)[0].decode(errors="replace")
            return argv0 == executable
        return True
    except (OSError, IndexError):
        return False


def kill_group(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid`` (each component leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def terminate(pids: dict[str, int], executables: dict[str, str] | None = None, timeout: float = 15.0) -> None:
    """Stop components by pid: SIGTERM everything but etcd, then etcd, then SIGKILL stragglers.

    Only pids still running the recorded executable are signalled, so a reused pid is left alone.
    """
    execs = executables or {}
    # add-ons (Kueue, JobSet: not in COMPONENTS) first, with the components that depend on etcd
    order = [c for c in pids if c not in COMPONENTS] + [c for c in reversed(COMPONENTS) if c in pids]
    waves = [[c for c in order if c != "etcd"], [c for c in order if c == "etcd"]]
    for wave in waves:
        live = {c: pids[c] for c in wave if pid_alive(pids[c], execs.get(c))}
        for pid in live.values():
            kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while live and time.monotonic() < deadline:
            _reap(live.values())
            live = {c: p for c, p in live.items() if pid_alive(p)}
            if live:
                time.sleep(0.1)
        for pid in live.values():
            kill_group(pid, signal.SIGKILL)
        _reap(live.values())


def _reap(pids: Any) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


# --------------------------------------------------------------------------------------------
# HTTP readiness probes


def _probe(url: str, ctx: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (OSError, ssl.SSLError) as e:
        return 0, str(e)


def _insecure_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------------------------
# kubeconfig


def kubeconfig_yaml(server: str, ca: Path, client: certs.CertPair, name: str, user: str = "admin") -> str:
    """A kubeconfig with the CA and the client cert embedded (it works when copied elsewhere)."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user, "namespace": "default"}}],
        "current-context": name,
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)
