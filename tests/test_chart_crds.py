"""The Helm chart's CRDs are the generated ones: ``helm/gpuscaler/crds/*`` == ``crds/*``, and the
GPUScalingPolicy CRD in ``crds/`` is what the Policy model generates.

On failure: regenerate with ``gpuscaler crd`` and copy ``crds/*`` into ``helm/gpuscaler/crds/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuscaler.api.crd import openapi_schema
from gpuscaler.policy import crd as policy_crd

ROOT = Path(__file__).resolve().parents[1]
REPO_CRDS = ROOT / "crds"
CHART_CRDS = ROOT / "helm" / "gpuscaler" / "crds"


def _names(d: Path) -> set[str]:
    return {p.name for p in d.glob("*.yaml")}


def test_chart_has_the_same_crd_files() -> None:
    assert _names(CHART_CRDS) == _names(REPO_CRDS), "copy crds/*.yaml into helm/gpuscaler/crds/"


@pytest.mark.parametrize("name", sorted(_names(REPO_CRDS)))
def test_chart_crd_is_identical(name: str) -> None:
    chart = CHART_CRDS / name
    assert chart.exists(), f"helm/gpuscaler/crds/{name} missing: cp crds/{name} helm/gpuscaler/crds/"
    assert chart.read_bytes() == (REPO_CRDS / name).read_bytes(), (
        f"helm/gpuscaler/crds/{name} differs from crds/{name}: cp crds/{name} helm/gpuscaler/crds/"
    )


def test_policy_crd_is_generated_from_the_model() -> None:
    for name, text in policy_crd.render(openapi_schema).items():
        assert (REPO_CRDS / name).read_text(encoding="utf-8") == text, (
            f"crds/{name} differs from the Policy model: regenerate it (gpuscaler crd)"
        )


def test_every_crd_parses_and_is_served() -> None:
    for path in sorted(REPO_CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert doc["kind"] == "CustomResourceDefinition", path
            assert any(v["served"] and v["storage"] for v in doc["spec"]["versions"]), path


def test_policy_crd_is_cluster_scoped_without_defaults() -> None:
    doc = policy_crd.gpuscalingpolicy_crd(openapi_schema)
    assert doc["spec"]["scope"] == "Cluster"
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "name" not in spec["properties"]  # metadata.name is the policy's name
    assert not _has_default(spec)  # the API server must not fill in fields (merge is by fields set)


def _has_default(node: object) -> bool:
    if isinstance(node, dict):
        if "default" in node:
            return True
        return any(_has_default(v) for k, v in node.items() if k != "properties") or any(
            _has_default(v) for v in (node.get("properties") or {}).values()
        )
    if isinstance(node, list):
        return any(_has_default(x) for x in node)
    return False
