"""``gpuscaler dev-cluster up`` as a user runs it: a detached cluster, used with kubectl, stopped again."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e


def _devcluster(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuscaler.devcluster", *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_up_with_audit_logs_each_request_with_its_client(tmp_path: Path) -> None:
    """``up --detach --audit`` prints where the audit log is, and a kubectl request made as the user
    is there with its verb, resource and user agent; ``down`` stops the cluster."""
    name = f"audit-{os.getpid()}"
    up = _devcluster("up", "--detach", "--no-build", "--audit", "--name", name)
    try:
        assert up.returncode == 0, up.stderr
        [log] = [line.split("audit log: ", 1)[1] for line in up.stderr.splitlines() if line.startswith("audit log: ")]
        [kubeconfig] = [
            shlex.split(line)[1].split("=", 1)[1] for line in up.stdout.splitlines() if line.startswith("export KUBECONFIG=")
        ]
        env = {**os.environ, "KUBECONFIG": kubeconfig}
        got = subprocess.run(
            ["kubectl", "get", "configmaps", "-n", "kube-system", "-o", "name"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert got.returncode == 0, got.stderr
        # batch mode writes the log off the request path: wait for the entry
        deadline = time.monotonic() + 30
        entries: list[dict[str, Any]] = []
        mine: list[dict[str, Any]] = []
        while not mine and time.monotonic() < deadline:
            time.sleep(0.5)
            lines = Path(log).read_text().splitlines() if Path(log).exists() else []
            entries = [json.loads(line) for line in lines]
            mine = [
                e for e in entries
                if str(e.get("userAgent", "")).startswith("kubectl")
                and e.get("verb") == "list"
                and (e.get("objectRef") or {}).get("resource") == "configmaps"
            ]
        assert mine, f"no kubectl list of configmaps among {len(entries)} audit entries"
        assert mine[0]["objectRef"].get("namespace") == "kube-system"
        assert mine[0]["user"]["username"]
        assert "requestObject" not in mine[0], "Metadata level: no request bodies"
    finally:
        down = _devcluster("down", "--name", name, timeout=120)
        assert down.returncode == 0, down.stderr
