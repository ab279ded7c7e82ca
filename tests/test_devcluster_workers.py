"""The dev cluster's worker runner: its pure parts (the e2e suite runs it against the real API server)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gpuscaler.cli import main
from gpuscaler.devcluster.workers import (
    Process,
    RunnerConfig,
    RunnerError,
    WorkerRunner,
    annotations_file,
    check_dev_cluster,
    descendants,
    expand,
    signal_tree,
)


def kubeconfig(tmp_path: Path, cluster: str, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": cluster, "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": cluster, "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("cluster", "server"),
    [("gpuscaler-default", "https://127.0.0.1:6443"), ("gpuscaler-e2e-1", "https://localhost:41000"),
     ("gpuscaler-x", "https://[::1]:6443")],
)  # fmt: skip
def test_a_dev_cluster_kubeconfig_is_accepted(tmp_path: Path, cluster: str, server: str) -> None:
    assert check_dev_cluster(kubeconfig(tmp_path, cluster, server)) == server


@pytest.mark.parametrize(
    ("cluster", "server"),
    [("prod", "https://10.0.0.1:6443"), ("gpuscaler-default", "https://10.0.0.1:6443"),
     ("kind-kind", "https://127.0.0.1:6443"), ("gpuscaler-x", "https://k8s.example.com")],
)  # fmt: skip
def test_another_cluster_is_refused(tmp_path: Path, cluster: str, server: str) -> None:
    with pytest.raises(RunnerError, match="not a dev cluster"):
        check_dev_cluster(kubeconfig(tmp_path, cluster, server))


def test_an_unreadable_kubeconfig_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match="cannot read"):
        check_dev_cluster(tmp_path / "missing")
    (tmp_path / "list").write_text("- a\n- b\n")
    with pytest.raises(RunnerError, match="not a kubeconfig"):
        check_dev_cluster(tmp_path / "list")


def test_cli_refuses_another_cluster_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = kubeconfig(tmp_path, "prod", "https://10.0.0.1:6443")
    assert main(["dev-cluster", "workers", "--kubeconfig", str(path)]) == 2
    assert "is not a dev cluster" in capsys.readouterr().err


def test_expand_follows_kubernetes_rules() -> None:
    env = {"WORLD_SIZE": "2", "NODE_RANK": "1"}
    assert expand("--nnodes=$(WORLD_SIZE)", env) == "--nnodes=2"
    assert expand("$(NODE_RANK)/$(WORLD_SIZE)", env) == "1/2"
    assert expand("$(UNDEFINED)", env) == "$(UNDEFINED)"
    assert expand("$$(WORLD_SIZE)", env) == "$(WORLD_SIZE)"
    assert expand("cost $$5", env) == "cost $5"


def test_annotations_file_is_the_downward_api_format() -> None:
    text = annotations_file({"b": 'say "hi"', "a": "1"})
    assert text == 'a="1"\nb="say \\"hi\\""\n'


def runner(tmp_path: Path, maps: dict[str, Path] | None = None) -> WorkerRunner:
    cfg = RunnerConfig(
        work_dir=tmp_path / "work",
        kubeconfig=kubeconfig(tmp_path, "gpuscaler-t", "https://127.0.0.1:1"),
        path_maps=maps or {},
    )
    return WorkerRunner(SimpleNamespace(), cfg)


def test_paths_under_a_mount_are_rewritten(tmp_path: Path) -> None:
    r = runner(tmp_path)
    mounts = [("/checkpoints/sub", tmp_path / "b"), ("/checkpoints", tmp_path / "a")]
    assert r._rewrite("/checkpoints", mounts) == str(tmp_path / "a")
    assert r._rewrite("/checkpoints/x.pt", mounts) == str(tmp_path / "a" / "x.pt")
    assert r._rewrite("/checkpoints/sub/y", mounts) == str(tmp_path / "b" / "y")
    assert r._rewrite("--digest=/checkpoints/d", mounts) == f"--digest={tmp_path / 'a' / 'd'}"
    assert r._rewrite("/checkpointsX", mounts) == "/checkpointsX"  # not under the mount
    assert r._rewrite("/data/x", mounts) == "/data/x"


def test_interpreters_are_the_runners(tmp_path: Path) -> None:
    r = runner(tmp_path)
    assert r._argv(["python", "x.py"]) == [sys.executable, "x.py"]
    assert r._argv(["/usr/bin/python3.11", "x.py"]) == [sys.executable, "x.py"]
    assert r._argv(["torchrun", "--standalone", "t.py"])[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert r._argv(["/bin/sh", "-c", "true"]) == ["/bin/sh", "-c", "true"]


def test_signal_tree_reaches_a_grandchild_in_its_own_session(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True);"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert grandchild in descendants(proc.pid)
    signal_tree(proc, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists() and _state(grandchild) != "Z":
        assert time.monotonic() < deadline, "the grandchild survived"
        time.sleep(0.05)


def _state(pid: int) -> Any:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@contextlib.contextmanager
def followed(tmp_path: Path, proc: subprocess.Popen[bytes], grace_s: float) -> Iterator[Process]:
    """``proc`` as the runner's worker ``w-0`` on node ``n1`` with this grace period; killed on exit if
    it still runs."""
    try:
        yield Process(uid="u", name="w-0", namespace="ns", job="j", rank=0, node="n1", proc=proc,
                      podinfo=tmp_path / "info", log=tmp_path / "log", started=time.monotonic(), grace_s=grace_s)  # fmt: skip
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_deleted_pod_on_its_node_gets_sigterm_then_sigkill_after_its_grace(tmp_path: Path) -> None:
    """The kubelet's order, which the e2e deletion test no longer pins (the node may go in the same look)."""
    r = runner(tmp_path)
    code = "import signal, time; signal.signal(signal.SIGTERM, lambda *_: None); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    deleted = SimpleNamespace(metadata=SimpleNamespace(deletion_timestamp="2026-12-06T00:00:00Z"))
    with followed(tmp_path, proc, grace_s=0.5) as p:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # its SIGTERM handler is set
        r._follow(p, deleted, {"n1"})
        assert p.signalled == "TERM" and p.alive  # it ignores SIGTERM: still running within its grace
        time.sleep(0.6)
        r._follow(p, deleted, {"n1"})
        assert p.signalled == "KILL"
        assert proc.wait(10) == -signal.SIGKILL


def test_a_process_whose_node_is_gone_is_killed_without_sigterm(tmp_path: Path) -> None:
    r = runner(tmp_path)
    with followed(tmp_path, subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]), grace_s=30) as p:
        r._follow(p, None, set())
        assert p.signalled == "KILL"
        assert p.proc is not None and p.proc.wait(10) == -signal.SIGKILL
