"""PerformanceProfile documents <-> :class:`~gpuscaler.planner.profiles.Profile`, and profile files.

Pure. Used by the operator's recorder (:mod:`gpuscaler.controller.profiles`, the objects it writes
and reads), ``gpuscaler profiles export|import`` and ``gpuscaler plan --profiles FILE`` (files of
PerformanceProfile objects: YAML, one or several documents, or a ``List``; or JSON).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuscaler.api.profile import (
    KIND,
    MAX_RECENT_JOBS,
    PerformanceProfile,
    PerformanceProfileSpec,
    ProfileSignature,
)
from gpuscaler.api.trainingjob import API_GROUP, API_VERSION
from gpuscaler.inputs import InputError, load_yaml_all, validation_error
from gpuscaler.names import PROFILE_GPU_LABEL, PROFILE_SIGNATURE_LABEL
from gpuscaler.planner.profiles import DEFAULT_MEMORY_RUNS, Profile, ProfileKey, signature_of

MAX_PROFILE_FILE_BYTES = 16 * 1024 * 1024
"""Largest profile file read (about 10,000 profiles)."""


def _label_safe(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    return s or "x"


def profile_name(key: ProfileKey, workload: str) -> str:
    """The object name of a profile: readable, unique per key, a DNS-1123 subdomain.

    ``<workload>-<gpu>-<gpus>g-<10 hex of the key's hash>``, e.g. ``resnet50-a10g-1g-3f2a9c81d0``.
    """
    digest = hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9]+", "-", f"{workload}-{key.gpu_type}".lower()).strip("-")[:40].strip("-")
    return f"{stem or 'workload'}-{key.gpus}g-{digest}"


def to_document(profile: Profile, namespace: str | None = None, memory_runs: int = DEFAULT_MEMORY_RUNS) -> dict[str, Any]:
    """The PerformanceProfile object of a profile (camelCase, as the API server stores it)."""
    k = profile.key
    shape = json.loads(profile.shape) if profile.shape else {"model": profile.workload}
    spec = PerformanceProfileSpec(
        signature=ProfileSignature(id=k.signature, workload=profile.workload, shape=shape),
        gpu_type=k.gpu_type,
        instance_type=profile.instance_type,
        gpus=k.gpus,
        nodes=k.nodes,
        micro_batch=k.micro_batch,
        accumulation=k.accumulation,
        precision=k.precision,
        throughput=profile.throughput,
        unit=profile.unit,
        model_throughput=profile.model_throughput,
        spread=profile.log_sigma(memory_runs),
        log_spread=profile.log_spread,
        measurement_log_sigma=profile.measurement_log_sigma,
        runs=profile.runs,
        last_seen=profile.last_seen.astimezone(UTC),
        recent_jobs=list(profile.jobs[-MAX_RECENT_JOBS:]),
    )
    meta: dict[str, Any] = {
        "name": profile_name(k, profile.workload),
        "labels": {PROFILE_SIGNATURE_LABEL: k.signature, PROFILE_GPU_LABEL: _label_safe(k.gpu_type)},
    }
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": meta,
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def from_document(doc: Mapping[str, Any], where: str = "profile") -> Profile:
    """The profile of a PerformanceProfile object.

    The signature id is recomputed from the shape (the planner computes a job's the same way), so an
    edited shape cannot pass for another workload's.

    Raises:
        InputError: not a PerformanceProfile, or a field is missing or out of range (named).
    """
    if not isinstance(doc, Mapping):
        raise InputError(f"{where}: expected a PerformanceProfile object, got {type(doc).__name__}")
    if doc.get("kind") != KIND:
        raise InputError(f"{where}: kind {doc.get('kind')!r}, expected {KIND}", field="kind")
    body = {k: v for k, v in doc.items() if k != "status"}
    meta = body.get("metadata")
    if isinstance(meta, Mapping):  # what the server adds (uid, resourceVersion...) is not the profile's
        body["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}
    try:
        obj = PerformanceProfile.model_validate(body)
    except ValidationError as err:
        raise validation_error(err, where) from err
    s = obj.spec
    shape = s.signature.shape
    sig = signature_of(shape, shape.model or s.signature.workload)  # the shape's model id as stored
    if sig.id != s.signature.id:
        raise InputError(
            f"{where}: spec.signature.id {s.signature.id} is not the hash of its shape ({sig.id}); "
            "export the profile again instead of editing its shape",
            field="spec.signature.id",
            value=s.signature.id,
        )
    key = ProfileKey(sig.id, s.gpu_type, s.gpus, s.nodes, s.micro_batch, s.accumulation, s.precision.value)
    return Profile(
        key=key,
        workload=s.signature.workload,
        shape=sig.shape,
        throughput=s.throughput,
        model_throughput=s.model_throughput,
        log_spread=s.log_spread,
        measurement_log_sigma=s.measurement_log_sigma,
        runs=s.runs,
        last_seen=s.last_seen if s.last_seen.tzinfo else s.last_seen.replace(tzinfo=UTC),
        instance_type=s.instance_type,
        unit=s.unit,
        jobs=tuple(s.recent_jobs),
    )


def documents(raw: Iterable[Any], source: str) -> list[Mapping[str, Any]]:
    """The PerformanceProfile objects of parsed documents (a ``List``'s items flattened; empty ones skipped)."""
    out: list[Mapping[str, Any]] = []
    for i, doc in enumerate(raw):
        if doc is None:
            continue
        if isinstance(doc, Mapping) and (doc.get("kind") == "List" or str(doc.get("kind", "")).endswith("List")):
            items = doc.get("items")
            if not isinstance(items, list):
                raise InputError(f"{source}: document {i + 1} is a List without items", field="items")
            out.extend(items)
        else:
            out.append(doc)
    return out


def load_profiles(path: str | Path) -> list[Profile]:
    """Every profile in a file of PerformanceProfile objects (YAML or JSON).

    Raises:
        InputError: unreadable, not YAML/JSON, or a profile that does not validate (which one, which field).
    """
    raw = load_yaml_all(path, "profile file", MAX_PROFILE_FILE_BYTES)  # JSON is YAML
    docs = documents(raw, str(path))
    return [from_document(d, f"{path}: profile {i + 1}") for i, d in enumerate(docs)]


def dump_profiles(docs: list[dict[str, Any]], fmt: str = "yaml") -> str:
    """A ``List`` of PerformanceProfile objects as YAML or JSON text (what ``profiles export`` writes)."""
    listing = {"apiVersion": "v1", "kind": "List", "items": docs}
    if fmt == "json":
        return json.dumps(listing, indent=2) + "\n"
    return yaml.safe_dump(listing, sort_keys=False, width=120)
