"""The generated parts of the chart's values.schema.json: ``settings`` (from the Settings model) and
``policies`` (from the Policy model), so that a typo in either fails ``helm install``.

:func:`test_schema_settings_and_policies_match_the_models` fails when the committed schema
differs; regenerate with ``python tests/test_helm_schema.py`` (rewrites only those two properties).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pydantic.alias_generators import to_camel

from gpuscaler.cloud.registry import PROVIDERS as REGISTRY
from gpuscaler.policy import Policy
from gpuscaler.settings import Settings

SCHEMA = Path(__file__).resolve().parents[1] / "helm" / "gpuscaler" / "values.schema.json"
PROVIDERS = list(REGISTRY)
"""Providers the chart accepts for settings.providerName: exactly those the operator registers
(``gpuscaler.cloud.registry.PROVIDERS``: kwok, static, eks, gke, karpenter, clusterapi)."""


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline(copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]), defs)
    return {k: _inline(v, defs) for k, v in node.items() if k != "title"}


def settings_schema() -> dict[str, Any]:
    """JSON schema of the chart's ``settings:`` block: the Settings fields in camelCase, all optional."""
    raw = Settings.model_json_schema()
    props = {}
    for name, field in _inline(raw, raw.get("$defs", {}))["properties"].items():
        prop = {k: v for k, v in field.items() if k != "default"}
        if name == "provider_name":
            prop["enum"] = PROVIDERS
            prop["description"] = (
                f"Node-pool provider: {', '.join(PROVIDERS)} (docs/providers.md); also picks the chart's "
                "provider RBAC."
            )
        props[to_camel(name)] = prop
    return {
        "type": "object",
        "description": "Operator settings (gpuscaler.settings.Settings), camelCase -> GPUSCALER_<UPPER_SNAKE>.",
        "additionalProperties": False,
        "properties": props,
    }


def policy_schema() -> dict[str, Any]:
    """JSON schema of one item of the chart's ``policies:`` list (the Policy model, camelCase)."""
    raw = Policy.model_json_schema(by_alias=True)
    schema: dict[str, Any] = _inline(raw, raw.get("$defs", {}))
    schema.pop("$defs", None)
    return schema


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its settings and policies parts replaced by the generated ones."""
    out = copy.deepcopy(schema)
    out["properties"]["settings"] = settings_schema()
    out["properties"]["policies"] = {
        "type": "array",
        "description": "Platform policies mounted as one multi-document file (settings.policyFile).",
        "items": policy_schema(),
    }
    return out


def dump(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def test_schema_settings_and_policies_match_the_models() -> None:
    committed = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert committed == generated(committed), (
        "the chart schema is stale: run python tests/test_helm_schema.py"
    )


def test_schema_accepts_every_registered_provider() -> None:
    props = json.loads(SCHEMA.read_text(encoding="utf-8"))["properties"]["settings"]["properties"]
    assert props["providerName"]["enum"] == PROVIDERS
    assert {"kwok", "static", "eks", "gke", "karpenter", "clusterapi"} <= set(PROVIDERS)


def test_every_settings_field_is_in_the_schema() -> None:
    props = json.loads(SCHEMA.read_text(encoding="utf-8"))["properties"]["settings"]["properties"]
    assert set(props) == {to_camel(f) for f in Settings.model_fields}


if __name__ == "__main__":
    SCHEMA.write_text(dump(generated(json.loads(SCHEMA.read_text(encoding="utf-8")))), encoding="utf-8")
    print(f"wrote {SCHEMA}")
