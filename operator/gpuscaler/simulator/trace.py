"""Workload traces: jobs arriving over time, each a TrainingJob spec plus an arrival time.

Two file formats, the same content:

* YAML: a mapping with ``name``, ``description``, ``start`` (RFC 3339; absolute ``spec.deadline``
  values are measured against it), an optional ``cloud`` mapping (see
  :meth:`gpuscaler.simulator.cloud.CloudModel.from_mapping`), an optional ``capacity`` list (held
  capacity the team has over the trace: a policy's ``capacity`` entries, docs/capacity.md, their
  windows in absolute time like ``start``; :mod:`gpuscaler.simulator.pools`) and ``jobs``: a list
  of entries.
* JSONL: one entry per line; an optional line ``{"trace": {name, description, start, cloud, capacity}}``
  carries the metadata. Blank lines and lines starting with ``#`` are skipped.

An entry is ``{name, arrivalHours, spec}``; a whole TrainingJob document (``apiVersion``, ``kind``,
``metadata.name``, ``spec``) plus ``arrivalHours`` is accepted too. Names follow the API server's
rule for a TrainingJob's name and are unique (a second use is refused naming both places); a
``start`` or ``deadline`` carries its time zone; a trace holds at most :data:`MAX_TRACE_JOBS` jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.inputs import (
    MAX_TRACE_BYTES,
    InputError,
    aware_time,
    check_name,
    iter_fields,
    parse_json,
    parse_yaml,
    read_text,
    shown,
)
from gpuscaler.policy.capacity import HeldCapacity

DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)
MAX_TRACE_JOBS = 10_000
"""Most jobs a trace may hold. ``gpuscaler simulate`` took 30 s for the 60 jobs of
examples/traces/production-month.yaml (5 seeds, every strategy, on a loaded 2-core machine), so
10,000 jobs is hours; a longer trace is refused before it is parsed, with what to do."""


class TraceError(InputError):
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
    capacity: tuple[HeldCapacity, ...] = ()
    """Held capacity declared by the trace (added to the policy's; :mod:`gpuscaler.simulator.pools`)."""


def _capacity(value: Any, where: str) -> tuple[HeldCapacity, ...]:
    """The trace's ``capacity`` list, each entry a policy's held capacity entry (names unique)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TraceError(f"{where}: capacity must be a list of held capacity entries, got {type(value).__name__}",
                         field="capacity")
    out: list[HeldCapacity] = []
    for k, raw in enumerate(value):
        try:
            out.append(HeldCapacity.model_validate(raw))
        except ValidationError as err:
            problems = "; ".join(f"{loc}: {msg}" + (f" (got {v})" if v else "") for loc, msg, v in iter_fields(err))
            raise TraceError(f"{where}: capacity[{k}] is invalid: {problems}", field=f"capacity[{k}]") from None
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TraceError(f"{where}: capacity names must be unique: {', '.join(twice)}", field="capacity")
    return tuple(out)


def _entry(raw: Any, where: str, index: int) -> TraceJob:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: a job entry must be a mapping, got {type(raw).__name__}")
    meta = raw.get("metadata") or {}
    if not isinstance(meta, dict):
        raise TraceError(f"{where}: metadata must be a mapping, got {type(meta).__name__}")
    given = raw.get("name") or meta.get("name")
    name = f"job-{index:05d}" if given is None else str(given)[:253]
    if given is not None:
        try:
            check_name(given, f"{where}: name")
        except InputError as err:
            raise TraceError(str(err), field="name", value=err.value) from None
    if "arrivalHours" not in raw:
        raise TraceError(f"{where} ({name}): arrivalHours is required")
    arrival = raw["arrivalHours"]
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or not math.isfinite(arrival):
        raise TraceError(
            f"{where} ({name}): arrivalHours must be a finite number of hours, got {shown(arrival)}",
            field="arrivalHours",
            value=shown(arrival),
        )
    if arrival < 0:
        raise TraceError(f"{where} ({name}): arrivalHours must be >= 0, got {arrival:g}", field="arrivalHours")
    if "spec" not in raw:
        raise TraceError(f"{where} ({name}): spec (a TrainingJob spec) is required")
    try:
        spec = TrainingJobSpec.model_validate(raw["spec"])
    except ValidationError as err:
        problems = "; ".join(
            f"{loc}: {msg}" + (f" (got {value})" if value else "") for loc, msg, value in iter_fields(err)
        )
        raise TraceError(f"{where} ({name}): spec is invalid: {problems}") from None
    return TraceJob(name, float(arrival), spec)


def _start(value: Any, where: str) -> datetime:
    if value is None:
        return DEFAULT_START
    try:
        return aware_time(value, f"{where}: start")  # a zone is required, as for a deadline
    except InputError as err:
        raise TraceError(str(err), field="start", value=err.value) from None


CLOUD_TABLES = frozenset({"shortageOverrides", "noticeSeconds"})
"""``cloud`` keys whose value is a table (instance type or provider -> numbers); the rest are numbers."""


def _cloud(value: Any, where: str) -> dict[str, Any]:
    """The trace's ``cloud`` mapping with every value a finite number >= 0 (tables of them for
    :data:`CLOUD_TABLES`); which keys exist is checked by the cloud model itself."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceError(f"{where}: cloud must be a mapping, got {type(value).__name__}")

    def number(x: Any, field: str) -> float:
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
            raise TraceError(
                f"{where}: cloud.{field} must be a finite number >= 0, got {shown(x)}",
                field=f"cloud.{field}",
                value=shown(x),
            )
        return float(x)

    def table(x: Any, field: str, depth: int) -> Any:
        if not isinstance(x, dict):
            raise TraceError(f"{where}: cloud.{field} must be a mapping, got {shown(x)}", field=f"cloud.{field}")
        return {
            str(k): table(v, f"{field}.{k}", depth - 1) if depth > 1 else number(v, f"{field}.{k}")
            for k, v in x.items()
        }

    return {
        key: table(v, key, 2 if key == "shortageOverrides" else 1) if key in CLOUD_TABLES else number(v, key)
        for key, v in value.items()
    }


def _cap(count: int, where: str) -> None:
    """Refuse a trace of more than :data:`MAX_TRACE_JOBS` jobs, before the rest is parsed."""
    if count > MAX_TRACE_JOBS:
        raise TraceError(
            f"{where}: more than {MAX_TRACE_JOBS:,} jobs, the most a trace may hold (a simulation plans every "
            "job at every event of every seed: a trace this long would run for hours without an answer); "
            "split the trace or sample it"
        )


def _unique(jobs: list[TraceJob], wheres: list[str]) -> tuple[TraceJob, ...]:
    """The jobs in arrival order; a name used twice is refused with both places (a trace is a
    namespace's worth of TrainingJobs: the API server keeps one object per name)."""
    seen: dict[str, str] = {}
    for j, where in zip(jobs, wheres, strict=True):
        if j.name in seen:
            raise TraceError(
                f"{where}: job name {shown(j.name)} is already used at {seen[j.name]}; job names must be unique",
                field="name",
                value=shown(j.name),
            )
        seen[j.name] = where
    return tuple(sorted(jobs, key=lambda j: j.arrival_h))


def parse_trace(data: Mapping[str, Any], name: str = "trace") -> Trace:
    """A trace from its YAML mapping form.

    Raises:
        TraceError: a missing or invalid field.
    """
    jobs_raw = data.get("jobs")
    if not isinstance(jobs_raw, list) or not jobs_raw:
        raise TraceError(f"{name}: expected a non-empty list under 'jobs'")
    _cap(len(jobs_raw), name)
    wheres = [f"{name}: jobs[{i}]" for i in range(len(jobs_raw))]
    jobs = [_entry(r, wheres[i], i) for i, r in enumerate(jobs_raw)]
    cloud = _cloud(data.get("cloud"), name)
    return Trace(
        name=str(data.get("name") or name),
        description=str(data.get("description") or ""),
        start=_start(data.get("start"), name),
        cloud=cloud,
        jobs=_unique(jobs, wheres),
        capacity=_capacity(data.get("capacity"), name),
    )


def load_trace(path: str | Path) -> Trace:
    """Read a YAML (``.yaml``/``.yml``) or JSONL (anything else) trace file.

    Files are read through :mod:`gpuscaler.inputs`: at most :data:`gpuscaler.inputs.MAX_TRACE_BYTES`,
    UTF-8, YAML without aliases or duplicate keys, JSON without NaN or Infinity.

    Raises:
        TraceError: unreadable file or invalid content (the message says where).
    """
    p = Path(path)
    try:
        text = read_text(p, "trace file", MAX_TRACE_BYTES)
        data = parse_yaml(text, str(path)) if p.suffix in (".yaml", ".yml") else None
    except InputError as err:
        raise TraceError(str(err), field=err.field, value=err.value) from None
    if p.suffix in (".yaml", ".yml"):
        if not isinstance(data, dict):
            raise TraceError(f"{path}: expected a mapping with 'jobs'")
        return parse_trace(data, p.stem)
    meta: dict[str, Any] = {}
    jobs: list[TraceJob] = []
    wheres: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        _cap(len(jobs) + 1, f"{path}:{lineno}")
        try:
            obj = parse_json(line, f"{path}:{lineno}")
        except InputError as err:
            raise TraceError(str(err), field=err.field, value=err.value) from None
        if isinstance(obj, dict) and "trace" in obj and "spec" not in obj:
            if not isinstance(obj["trace"] or {}, dict):
                raise TraceError(f"{path}:{lineno}: trace must be a mapping of name, description, start, cloud, capacity")
            meta = dict(obj["trace"] or {})
            continue
        wheres.append(f"{path}:{lineno}")
        jobs.append(_entry(obj, wheres[-1], len(jobs)))
    if not jobs:
        raise TraceError(f"{path}: no job entries")
    return Trace(
        name=str(meta.get("name") or p.stem),
        description=str(meta.get("description") or ""),
        start=_start(meta.get("start"), str(path)),
        cloud=_cloud(meta.get("cloud"), str(path)),
        jobs=_unique(jobs, wheres),
        capacity=_capacity(meta.get("capacity"), str(path)),
    )


def scale_deadlines(trace: Trace, factor: float) -> Trace:
    """The trace with every job's hours to its deadline multiplied by ``factor`` (a stress test).

    A job's effective deadline (the earlier of ``deadline`` and ``maxDuration``, from its arrival)
    becomes ``maxDuration`` = that many hours x ``factor`` (in minutes, to 0.001); ``deadline`` is
    dropped. Jobs without one keep none. ``factor`` 1 returns the trace unchanged.

    Raises:
        ValueError: ``factor`` is not a finite number > 0.
    """
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"deadline scale must be a finite number > 0, got {factor}")
    if factor == 1:
        return trace
    def scaled(job: TraceJob) -> TraceJob:
        hours = job.deadline_h(trace.start)
        if hours is None:
            return job
        minutes = f"{max(hours * factor * 60, 0.001):.3f}m"
        return TraceJob(job.name, job.arrival_h, job.spec.model_copy(update={"deadline": None, "max_duration": minutes}))

    return Trace(trace.name, tuple(scaled(j) for j in trace.jobs), trace.description, trace.start, trace.cloud,
                 trace.capacity)
