"""Workload traces: jobs arriving over time, each a TrainingJob spec plus an arrival time.

Two file formats, the same content:

* YAML: a mapping with ``name``, ``description``, ``start`` (RFC 3339; absolute ``spec.deadline``
  values are measured against it), an optional ``cloud`` mapping (see
  :meth:`gpuscaler.simulator.cloud.CloudModel.from_mapping`) and ``jobs``: a list of entries.
* JSONL: one entry per line; an optional line ``{"trace": {name, description, start, cloud}}``
  carries the metadata. Blank lines and lines starting with ``#`` are skipped.

An entry is ``{name, arrivalHours, spec}``; a whole TrainingJob document (``apiVersion``, ``kind``,
``metadata.name``, ``spec``) plus ``arrivalHours`` is accepted too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec

DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)


class TraceError(ValueError):
    """The trace file cannot be read as written (the message names the entry and field)."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace."""

    name: str
    arrival_h: float
    """Hours after the trace start when the job is submitted."""
    spec: TrainingJobSpec

    def deadline_h(self, start: datetime) -> float | None:
        """Hours from submission to the job's effective deadline (None without one)."""
        return self.spec.deadline_hours(start + timedelta(hours=self.arrival_h))


@dataclass(frozen=True)
class Trace:
    """A workload trace."""

    name: str
    jobs: tuple[TraceJob, ...]
    description: str = ""
    start: datetime = DEFAULT_START
    cloud: Mapping[str, Any] = field(default_factory=dict)


def _entry(raw: Any, where: str, index: int) -> TraceJob:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: a job entry must be a mapping, got {type(raw).__name__}")
    meta = raw.get("metadata") or {}
    name = str(raw.get("name") or meta.get("name") or f"job-{index:05d}")
    if "arrivalHours" not in raw:
        raise TraceError(f"{where} ({name}): arrivalHours is required")
    try:
        arrival = float(raw["arrivalHours"])
    except (TypeError, ValueError) as err:
        raise TraceError(f"{where} ({name}): arrivalHours must be a number") from err
    if arrival < 0:
        raise TraceError(f"{where} ({name}): arrivalHours must be >= 0")
    if "spec" not in raw:
        raise TraceError(f"{where} ({name}): spec (a TrainingJob spec) is required")
    try:
        spec = TrainingJobSpec.model_validate(raw["spec"])
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        raise TraceError(f"{where} ({name}): spec is invalid: {problems}") from err
    return TraceJob(name, arrival, spec)


def _start(value: Any, where: str) -> datetime:
    if value is None:
        return DEFAULT_START
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError as err:
            raise TraceError(f"{where}: start {value!r} is not an RFC 3339 time") from err
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _unique(jobs: list[TraceJob]) -> tuple[TraceJob, ...]:
    seen: dict[str, int] = {}
    out = []
    for j in jobs:
        n = seen.get(j.name, 0)
        seen[j.name] = n + 1
        out.append(j if n == 0 else TraceJob(f"{j.name}-{n}", j.arrival_h, j.spec))
    return tuple(sorted(out, key=lambda j: j.arrival_h))


def parse_trace(data: Mapping[str, Any], name: str = "trace") -> Trace:
    """A trace from its YAML mapping form.

    Raises:
        TraceError: a missing or invalid field.
    """
    jobs_raw = data.get("jobs")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise TraceError(f"{name}: expected a non-empty list under 'jobs'")
    jobs = [_entry(r, f"{name}: jobs[{i}]", i) for i, r in enumerate(jobs_raw)]
    cloud = data.get("cloud") or {}
    if not isinstance(cloud, dict):
        raise TraceError(f"{name}: cloud must be a mapping")
    return Trace(
        name=str(data.get("name") or name),
        description=str(data.get("description") or ""),
        start=_start(data.get("start"), name),
        cloud=cloud,
        jobs=_unique(jobs),
    )


def load_trace(path: str | Path) -> Trace:
    """Read a YAML (``.yaml``/``.yml``) or JSONL (anything else) trace file.

    Raises:
        TraceError: unreadable file or invalid content (the message says where).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise TraceError(f"{path}: no such file") from err
    if p.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise TraceError(f"{path}: not valid YAML: {err}") from err
        if not isinstance(data, dict):
            raise TraceError(f"{path}: expected a mapping with 'jobs'")
        return parse_trace(data, p.stem)
    meta: dict[str, Any] = {}
    jobs: list[TraceJob] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path}:{lineno}: not valid JSON: {err.msg}") from err
        if isinstance(obj, dict) and "trace" in obj and "spec" not in obj:
            meta = dict(obj["trace"] or {})
            continue
        jobs.append(_entry(obj, f"{path}:{lineno}", len(jobs)))
    if not jobs:
        raise TraceError(f"{path}: no job entries")
    cloud = meta.get("cloud") or {}
    return Trace(
        name=str(meta.get("name") or p.stem),
        description=str(meta.get("description") or ""),
        start=_start(meta.get("start"), str(path)),
        cloud=cloud if isinstance(cloud, dict) else {},
        jobs=_unique(jobs),
    )
