"""Generate the CustomResourceDefinitions from the pydantic models (``gpuscaler crd``).

TrainingJob and PerformanceProfile (:mod:`gpuscaler.api.profile`) here; GPUScalingPolicy in :mod:`gpuscaler.policy.crd`, which gets this module's
converter passed in (the policy layer sits below this one).

Pydantic's JSON schema is turned into a *structural* OpenAPI v3 schema, the form the API server
requires: ``$defs``/``$ref`` inlined, ``anyOf: [X, null]`` turned into ``X`` with
``nullable: true``, JSON-Schema-2020 ``exclusiveMinimum: n`` into OpenAPI 3.0's
``minimum: n, exclusiveMinimum: true``, ``const`` into a one-value ``enum``, titles dropped and
descriptions kept. The worker pod ``template`` keeps unknown fields
(``x-kubernetes-preserve-unknown-fields``). The rules pydantic checks in model validators are
repeated as CEL rules (``x-kubernetes-validations``) in :data:`CEL_RULES`, next to each other's
messages, so the API server refuses a bad spec with the same message before the operator sees it.

Callers: ``gpuscaler crd`` (writes ``crds/``), the drift test, the Helm chart's copy check.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.api import profile
from gpuscaler.api.status import TrainingJobStatus
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION, KIND, PLURAL, TrainingJobSpec
from gpuscaler.errors import GpuscalerError
from gpuscaler.policy import crd as policy_crd

SINGULAR = "trainingjob"
SHORT_NAMES = ["tj", "tjob"]
CRD_FILE = "trainingjob.yaml"

CEL_RULES: dict[str, list[dict[str, str]]] = {
    # Key: the pydantic model's name (its $defs key). Each mirrors a model validator in api/.
    "TrainingJobSpec": [
        {
            "rule": "!has(self.objective) || self.objective != 'fastest' || has(self.budgetUsd)",
            "message": "objective fastest needs budgetUsd (the fastest plan within what budget?)",
            "fieldPath": ".budgetUsd",
            "reason": "FieldValueRequired",
        },
    ],
    "TrainingAmount": [
        {
            "rule": "[has(self.samples), has(self.epochs), has(self.steps)].filter(x, x).size() == 1",
            "message": "training: give exactly one of samples, epochs or steps",
        },
    ],
    "WorkloadSpec": [
        {
            "rule": "[has(self.model), has(self.transformer), has(self.params)].filter(x, x).size() == 1",
            "message": "workload: give exactly one of model, transformer, or params + flopsPerSample",
        },
        {
            "rule": "!has(self.params) || has(self.flopsPerSample)",
            "message": "workload: a custom workload with params also needs flopsPerSample",
            "fieldPath": ".flopsPerSample",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "!has(self.model) || (!has(self.depthwiseFlopShare) && !has(self.variableInputs))",
            "message": (
                "workload: depthwiseFlopShare and variableInputs describe a custom workload; a named "
                "workload has its own (gpuscaler catalog workloads): remove them"
            ),
        },
        {
            "rule": "!has(self.transformer) || !has(self.depthwiseFlopShare)",
            "message": "workload.depthwiseFlopShare: a transformer has no convolutions; remove it",
            "fieldPath": ".depthwiseFlopShare",
        },
    ],
    "TransformerSpec": [
        {
            "rule": "self.hidden % self.heads == 0",
            "message": "transformer: hidden must be divisible by heads (each head gets hidden / heads dimensions)",
            "fieldPath": ".heads",
        },
    ],
    "Constraints": [
        {
            "rule": "!has(self.maxGpus) || !has(self.minGpus) || self.minGpus <= self.maxGpus",
            "message": "constraints: minGpus must not exceed maxGpus",
            "fieldPath": ".minGpus",
        },
    ],
}
"""CEL rules per model, the API server's copy of the pydantic model validators."""

PRESERVE_UNKNOWN = {"TrainingJobSpec.template"}
"""Fields kept as free-form objects (the worker pod template is a whole core/v1 PodTemplateSpec)."""

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Where the job is."},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus", "description": "GPUs of the plan."},
    {"name": "Type", "type": "string", "jsonPath": ".status.instanceType", "description": "Instance type."},
    {"name": "Capacity", "type": "string", "jsonPath": ".status.capacityType", "description": "on-demand or spot."},
    {"name": "Cost", "type": "number", "jsonPath": ".status.costUsd", "description": "US dollars so far."},
    {"name": "ETA", "type": "string", "jsonPath": ".status.eta", "description": "Time left."},
    {"name": "Waiting", "type": "string", "jsonPath": ".status.queue.reason", "description": "Why Kueue has not admitted the gang (queued jobs only)."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


class SchemaError(GpuscalerError, ValueError):
    """The pydantic schema has a construct with no structural OpenAPI equivalent."""


def _inline(node: Any, defs: dict[str, Any], owner: str, path: str) -> Any:
    """Resolve refs, recursively, remembering which model each object schema came from."""
    if isinstance(node, list):
        return [_inline(x, defs, owner, path) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        target = _inline(copy.deepcopy(defs[name]), defs, name, name)
        target = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return target
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {p: _inline(v, defs, owner, f"{owner}.{p}") for p, v in value.items()}
        else:
            out[key] = _inline(value, defs, owner, path)
    if out.get("type") == "object" and "properties" in out:
        out["x-gpuscaler-model"] = owner
    return out


def _single_type(node: dict[str, Any], field: str) -> dict[str, Any]:
    """``anyOf``/``oneOf`` of one type and null -> that type, ``nullable``; several types: an error."""
    for variant in ("anyOf", "oneOf"):
        if variant in node:
            alternatives = node.pop(variant)
            options = [o for o in alternatives if o.get("type") != "null"]
            if len(options) != 1:
                raise SchemaError(f"{field or 'schema'}: {variant} of several types has no structural form")
            node = {**options[0], **node}
            if len(options) < len(alternatives):
                node["nullable"] = True
    return node


def _openapi_keywords(node: dict[str, Any]) -> dict[str, Any]:
    """JSON schema keywords -> their OpenAPI v3 forms (no title, no null default, const as enum,
    exclusive bounds as booleans); ``additionalProperties: false`` dropped (the server prunes)."""
    node.pop("title", None)
    if node.get("additionalProperties") is False:
        node.pop("additionalProperties")  # unknown fields: pruned by the server, refused by kubectl (strict)
    if node.get("default", 0) is None:
        node.pop("default")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    return node


def _structural_property(v: dict[str, Any], name: str) -> Any:
    """One property of a model: structural, or free-form where :data:`PRESERVE_UNKNOWN` names it."""
    if name not in PRESERVE_UNKNOWN:
        return _structural(v, name)
    out: dict[str, Any] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": v.get("description", ""),
    }
    if any(o.get("type") == "null" for o in v.get("anyOf", [])):
        out["nullable"] = True
    return out


def _structural(node: Any, field: str = "") -> Any:
    """Rewrite one (inlined) JSON schema node into structural OpenAPI v3."""
    if isinstance(node, list):
        return [_structural(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = _openapi_keywords(_single_type(dict(node), field))
    model = node.pop("x-gpuscaler-model", None)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {p: _structural_property(v, f"{model}.{p}") for p, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, field)
        else:
            out[key] = value
    if model in CEL_RULES:
        out["x-kubernetes-validations"] = copy.deepcopy(CEL_RULES[model])
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def openapi_schema(model: type[Any], name: str) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model (camelCase names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    inlined = _inline(raw, defs, name, name)
    schema: dict[str, Any] = _structural(inlined, name)
    _check_structural(schema, name)
    return schema


def _check_structural(node: Any, path: str) -> None:
    if isinstance(node, dict):
        for bad in ("$ref", "anyOf", "oneOf", "allOf", "$defs", "title"):
            if bad in node:
                raise SchemaError(f"{path}: {bad} left in the generated schema")
        if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            raise SchemaError(f"{path}: no type")
        for key, value in node.items():
            if key == "properties":
                for p, v in value.items():
                    _check_structural(v, f"{path}.{p}")
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                _check_structural(value, f"{path}[]")


def trainingjob_crd() -> dict[str, Any]:
    """The TrainingJob CRD as a plain dict."""
    return policy_crd.crd_document(
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short_names=SHORT_NAMES,
        scope="Namespaced",
        description=(
            "A deep-learning training job that gpuscaler plans (GPU type and count, "
            "spot or on-demand, precision, batch), provisions nodes for, runs and reports on."
        ),
        properties={
            "spec": openapi_schema(TrainingJobSpec, "TrainingJobSpec"),
            "status": openapi_schema(TrainingJobStatus, "TrainingJobStatus"),
        },
        printer_columns=PRINTER_COLUMNS,
        status_subresource=True,
        group=API_GROUP,
        version_name=API_VERSION,
    )


PROFILE_FILE = "performanceprofile.yaml"
PROFILE_COLUMNS: list[dict[str, Any]] = [
    {"name": "Workload", "type": "string", "jsonPath": ".spec.signature.workload", "description": "Workload id."},
    {"name": "GPU", "type": "string", "jsonPath": ".spec.gpuType", "description": "GPU type."},
    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpus", "description": "GPUs in total."},
    {"name": "Precision", "type": "string", "jsonPath": ".spec.precision", "description": "Precision."},
    {"name": "Throughput", "type": "number", "jsonPath": ".spec.throughput", "description": "Measured samples/s."},
    {"name": "Runs", "type": "integer", "jsonPath": ".spec.runs", "description": "Runs measured."},
    {"name": "Last-Seen", "type": "date", "jsonPath": ".spec.lastSeen", "description": "Last run measured."},
]


def performanceprofile_crd() -> dict[str, Any]:
    """The PerformanceProfile CRD as a plain dict (namespaced: see :mod:`gpuscaler.api.profile`)."""
    return policy_crd.crd_document(
        kind=profile.KIND,
        plural=profile.PLURAL,
        singular=profile.SINGULAR,
        short_names=profile.SHORT_NAMES,
        scope="Namespaced",
        description=(
            "Throughput the cluster measured for one configuration (GPU type and count, nodes, micro-batch, "
            "accumulation, precision) of one workload signature (its declared shape, never code or data), over "
            "runs; the planner uses it as a measured prior. Written by the gpuscaler operator only. Namespaced: "
            "a team's measurements steer only its own plans and follow its namespace's RBAC; a platform team "
            "shares profiles on purpose by export/import or a shared namespace (docs/profiles.md)."
        ),
        properties={"spec": openapi_schema(profile.PerformanceProfileSpec, "PerformanceProfileSpec")},
        printer_columns=PROFILE_COLUMNS,
        group=API_GROUP,
        version_name=API_VERSION,
    )


HEADER = "# Generated by `gpuscaler crd` from operator/gpuscaler/api/; do not edit by hand.\n"


def render() -> dict[str, str]:
    """File name -> YAML text of every generated CRD: TrainingJob, PerformanceProfile and GPUScalingPolicy."""
    text = yaml.safe_dump(trainingjob_crd(), sort_keys=False, width=100, allow_unicode=True)
    prof = yaml.safe_dump(performanceprofile_crd(), sort_keys=False, width=100, allow_unicode=True)
    return {CRD_FILE: HEADER + text, PROFILE_FILE: HEADER + prof, **policy_crd.render(openapi_schema)}


def write(directory: Path) -> list[Path]:
    """Write the CRDs into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def drift(directory: Path) -> list[str]:
    """Names of the CRD files in ``directory`` that differ from what the models generate."""
    return [
        name
        for name, text in render().items()
        if not (directory / name).exists() or (directory / name).read_text(encoding="utf-8") != text
    ]
