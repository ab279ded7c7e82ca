"""The generated CRD: committed copy up to date, structural, with CEL rules and printer columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuscaler.api import crd
from gpuscaler.operator_cli import cmd_crd

ROOT = Path(__file__).resolve().parents[1]


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for p, v in (node.get("properties") or {}).items():
            out += _walk(v, f"{path}.{p}")
        if isinstance(node.get("items"), dict):
            out += _walk(node["items"], f"{path}[]")
    return out


def test_committed_crds_match_the_models() -> None:
    assert crd.drift(ROOT / "crds") == [], "run `gpuscaler crd` and commit crds/"


def test_check_flag_reports_drift(tmp_path: Path) -> None:
    import argparse

    assert cmd_crd(argparse.Namespace(output=str(tmp_path), check=True)) == 1
    assert cmd_crd(argparse.Namespace(output=str(tmp_path), check=False)) == 0
    assert cmd_crd(argparse.Namespace(output=str(tmp_path), check=True)) == 0


def test_schema_is_structural() -> None:
    schema = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for bad in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs"):
            assert bad not in node, f"{path}: {bad}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if "properties" in node:
            assert node.get("additionalProperties") in (None,), path


def test_nullable_bounds_enums_and_descriptions() -> None:
    spec = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["budgetUsd"] == {
        "type": "number",
        "description": "Spend at most this many US dollars.",
        "nullable": True,
        "minimum": 0,
        "exclusiveMinimum": True,
    }
    assert props["objective"]["enum"] == ["cheapest", "fastest"] and props["objective"]["type"] == "string"
    assert props["template"]["x-kubernetes-preserve-unknown-fields"] is True
    assert set(spec["required"]) == {"workload", "globalBatch", "training"}
    for path, node in _walk(spec, "spec"):
        if path.count(".") >= 1 and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"


def test_cel_rules_mirror_the_model_validators() -> None:
    spec = crd.trainingjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert any("budgetUsd" in m for m in rules)
    training = spec["properties"]["training"]["x-kubernetes-validations"]
    assert "exactly one of samples, epochs or steps" in training[0]["message"]
    workload = spec["properties"]["workload"]["x-kubernetes-validations"]
    assert len(workload) == 4  # one kind; params needs flopsPerSample; custom traits on custom workloads only
    assert {r["message"] for r in workload} == {r["message"] for r in crd.CEL_RULES["WorkloadSpec"]}


def test_status_subresource_and_printer_columns() -> None:
    version = crd.trainingjob_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Phase", "GPUs", "Type", "Capacity", "Cost", "ETA", "Waiting", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"][0] == "Pending"
    assert set(status["conditions"]["items"]["required"]) >= {"type", "status", "lastTransitionTime"}
