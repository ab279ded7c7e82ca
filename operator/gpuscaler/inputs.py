"""The input layer: every file, document and number a user gives the tools is read through here.

What it guarantees, for TrainingJob files, policy files, traces and command-line values alike:

* Files: a missing file, a directory, an unreadable file, one over the size cap, a binary file or
  one not in UTF-8 (UTF-16 named as such) is an :class:`InputError` naming the path and what to
  do; never a traceback. A FIFO, a device or a socket (``/dev/zero``, a named pipe with no writer)
  is refused from its ``stat`` before any read, and the file is opened with ``O_NONBLOCK``, so
  nothing blocks. The read itself is capped, so a 56 MB file costs at most the cap.
* Kubernetes names and labels (:func:`check_name`, :func:`check_labels`): the rules the API server
  applies (RFC 1123 DNS subdomain for object names, DNS label for namespaces, qualified names and
  63-character values for labels), with the field, the value and what to write.
* Times (:func:`aware_time`): a deadline or a start must carry a time zone; a time without one,
  or a bare number, is refused with what to write.
* YAML (:func:`parse_yaml`, :func:`parse_yaml_all`): a loader that refuses aliases (so an alias
  "billion laughs" bomb cannot expand), nesting deeper than :data:`MAX_DEPTH`, duplicate mapping
  keys (a second ``constraints:`` would otherwise silently replace the first) and ``.nan``/``.inf``
  numbers, each with the line and column.
* JSON (:func:`parse_json`): duplicate keys, ``NaN``/``Infinity`` and numbers that overflow to
  infinity are refused.
* Models (:class:`StrictModel`): the base of the API and policy models refuses NaN and infinity,
  a boolean where a number is expected (``globalBatch: true`` is not batch 1), a number where a
  boolean is expected, and a quoted number, the same as the CRD's schema does on the API server.
* Messages: values are shown through :func:`shown`, truncated to :data:`MAX_SHOWN_CHARS`.
* Output: :func:`to_json` is the one JSON encoder of the command line; it never emits ``NaN`` or
  ``Infinity`` (not JSON), writing ``null`` for a non-finite number.
* Command-line values: ``argparse`` types (:func:`positive_int`, :func:`positive_float`,
  :func:`non_negative_float`, :func:`output_file`) that reject zero counts, NaN, and output paths
  whose directory does not exist, before any work is done.

Depends on nothing of gpuscaler's own but :mod:`gpuscaler.errors` and :mod:`gpuscaler.nesting` (the
bottom layer, enforced by import-linter), so the pure layers (``api``, ``policy``, ``catalog``,
``simulator``) and the command line all use it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import stat
import typing
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from types import UnionType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from gpuscaler.errors import InvalidInputError
from gpuscaler.nesting import nesting_depth

MAX_DOCUMENT_BYTES = 1_572_864
"""Largest TrainingJob or policy file read: 1.5 MiB, the API server's limit on one object (etcd's
default request size limit, https://etcd.io/docs/v3.5/dev-guide/limit/), so a file the operator
could never receive is not read either."""
MAX_TRACE_BYTES = 32 * 1024 * 1024
"""Largest simulator trace read: 32 MiB, about 140,000 jobs at the size of the shipped traces'
entries (``examples/traces/production-month.yaml``: 60 jobs in 14 kB)."""
MAX_DEPTH = 64
"""Deepest nesting of YAML/JSON collections accepted (a TrainingJob with a pod template needs
about 12 levels)."""
MAX_SHOWN_CHARS = 80
"""Longest rendering of a user's value inside an error message; the rest is elided."""

_UTF16_32_BOMS = {
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe": "UTF-16",
    b"\xfe\xff": "UTF-16",
}


class InputError(InvalidInputError, ValueError):
    """Input that cannot be used as given: the message names the file or field, the value, and what
    to do. The command line prints it and exits 2; the operator turns it into a condition.

    Attributes:
        field: the dotted field or command-line option at fault, when there is one.
        value: the offending value, already shortened for display, when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None, value: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


def shown(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how long it was when cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def _size(n: int) -> str:
    if n < 100_000:
        return f"{n:,} bytes"
    return f"{n / 1e6:.2f} MB" if n < 10_000_000 else f"{n / 1e6:.1f} MB"


def read_text(path: str | Path, what: str = "file", limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of a file, reading at most ``limit`` bytes.

    Args:
        path: the file, as the user gave it (shown in messages).
        what: what the file should be ("TrainingJob file", "policy file"), shown in messages.
        limit: size cap in bytes.

    Returns:
        The text (a UTF-8 byte-order mark removed).

    Raises:
        InputError: missing, a directory, unreadable, over ``limit``, binary or not UTF-8.
    """
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(f"{path}: is a directory; give a {what}", field=str(path))
        special_file(p, what)  # a FIFO or a device: refused from its stat, before any open
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # never waits for a FIFO's writer
        with os.fdopen(fd, "rb") as fh:
            special_file(p, what, os.fstat(fh.fileno()))  # what was opened, not what was stat-ed
            os.set_blocking(fh.fileno(), True)
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file", field=str(path)) from None
    except PermissionError:
        raise InputError(f"{path}: cannot be read (permission denied)", field=str(path)) from None
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror or err})", field=str(path)) from None
    if len(data) > limit:
        try:
            total = _size(p.stat().st_size)
        except OSError:
            total = "larger"
        raise InputError(
            f"{path}: {total} is over the {_size(limit)} limit for a {what}; give a smaller file",
            field=str(path),
        )
    for bom, name in _UTF16_32_BOMS.items():
        if data.startswith(bom):
            raise InputError(f"{path}: is {name} encoded; save it as UTF-8", field=str(path))
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(
            f"{path}: looks binary (a NUL byte at offset {nul}); give a text {what}", field=str(path)
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); save it as UTF-8",
            field=str(path),
        ) from None
    return text.removeprefix("\ufeff")


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))


def special_file(path: str | Path, what: str = "file", st: os.stat_result | None = None) -> None:
    """Refuse a FIFO, a device or a socket (from ``st``, else ``os.stat``): reading one may block
    for ever or never end.

    Raises:
        InputError: it is one; FileNotFoundError/OSError from ``os.stat`` pass through.
    """
    mode = (st or os.stat(path)).st_mode
    for test, kind in _SPECIAL:
        if test(mode):
            raise InputError(f"{path}: is {kind}, not a regular file; give a {what}", field=str(path))


# ------------------------------------------------------------------------------------------ Kubernetes names

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""RFC 1123 label, as the API server checks it (``IsDNS1123Label``): at most 63 characters."""
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""RFC 1123 subdomain (``IsDNS1123Subdomain``), at most 253 characters: the name of a TrainingJob,
a GPUScalingPolicy or any object of a custom resource."""
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]")
"""A label key's name part or a non-empty label value (``IsQualifiedName``, ``IsValidLabelValue``)."""


def check_name(value: object, field: str, *, label: bool = False) -> str:
    """An object name as the API server accepts it: a DNS subdomain (``label``: a DNS label, as a
    namespace's name).

    Raises:
        InputError: naming the field, the value and the rule.
    """
    limit, rule = (63, DNS_LABEL) if label else (253, DNS_SUBDOMAIN)
    chars = "'-'" if label else "'-' and '.'"
    text = value if isinstance(value, str) else ""
    if not isinstance(value, str) or len(text) > limit or not rule.fullmatch(text):
        kind = "DNS label" if label else "DNS subdomain"
        raise InputError(
            f"{field} {shown(value)} is not a valid name (RFC 1123 {kind}, as the API server requires): "
            f"lower-case letters, digits, {chars}, starting and ending with a letter or "
            f"digit, at most {limit} characters; e.g. {shown(_suggest(text, limit))}",
            field=field,
            value=shown(value),
        )
    return text


def _suggest(text: str, limit: int) -> str:
    v = re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")
    return v[:limit].rstrip("-.") or "my-job"


def check_labels(labels: object, field: str) -> None:
    """``metadata.labels`` as the API server accepts them: keys ``[prefix/]name`` (prefix a DNS
    subdomain of at most 253 characters, name at most 63 of ``[A-Za-z0-9_.-]`` starting and ending
    alphanumeric), string values of at most 63 such characters (or empty).

    Raises:
        InputError: naming the key and what is wrong.
    """
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise InputError(f"{field} must be a mapping of label keys to values, got {shown(labels)}", field=field)
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        ok_key = isinstance(key, str) and bool(_LABEL_NAME.fullmatch(name)) and (
            not prefix or (len(prefix) <= 253 and bool(DNS_SUBDOMAIN.fullmatch(prefix)))
        ) and key.count("/") <= 1
        if not ok_key:
            raise InputError(
                f"{field} key {shown(key)} is not a label key: [prefix/]name, the name at most 63 characters of "
                "letters, digits, '-', '_' and '.', starting and ending with a letter or digit; the prefix a DNS subdomain",
                field=f"{field}.{shown(key)}",
            )
        if not isinstance(value, str) or (value and not _LABEL_NAME.fullmatch(value)):
            raise InputError(
                f"{field}[{shown(key)}] value {shown(value)} is not a label value: a string of at most 63 letters, "
                "digits, '-', '_' and '.', starting and ending with a letter or digit (or empty); quote numbers and booleans",
                field=f"{field}.{key}",
                value=shown(value),
            )


def aware_time(value: object, field: str) -> datetime:
    """A point in time that names its zone: an RFC 3339 string with ``Z`` or an offset (or a
    ``datetime`` with one, as YAML reads an unquoted timestamp).

    Raises:
        InputError: a bare number, a time without a zone, or not a time, with what to write.
    """
    example = "e.g. 2026-12-01T18:00:00Z (UTC) or 2026-12-01T18:00:00+01:00"
    said = value.isoformat() if isinstance(value, datetime) else shown(value)
    if isinstance(value, bool | int | float):
        raise InputError(f"{field} {shown(value)} is a bare number, not a time; write an RFC 3339 time with a zone, {example}",
                         field=field, value=shown(value))
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise InputError(f"{field} {shown(value)} is not an RFC 3339 time; {example}", field=field, value=shown(value)) from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise InputError(f"{field} {said} has no time zone (it would be read in some zone); add one, {example}",
                         field=field)
    return dt


# ------------------------------------------------------------------------------------------ YAML


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, deep nesting, duplicate keys or non-finite floats."""

    source = "input"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise InputError(
                f"{self.source}: {_where(event.start_mark)}: YAML aliases (*{event.anchor}) are not "
                "accepted; write the value out in full"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event = self.peek_event()  # type: ignore[no-untyped-call]
                raise InputError(
                    f"{self.source}: {_where(event.start_mark)}: nested deeper than {MAX_DEPTH} levels"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise InputError(
                        f"{self.source}: {_where(key_node.start_mark)}: a mapping key must be a plain value"
                    ) from None
                if key in seen:
                    raise InputError(
                        f"{self.source}: {_where(key_node.start_mark)}: duplicate key {shown(key)} (first at "
                        f"{_where(seen[key])}); keep one and merge their contents",
                        field=str(key),
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_float(self, node: Any) -> float:
        value: float = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise InputError(
                f"{self.source}: {_where(node.start_mark)}: {node.value!r} is not a finite number; give a "
                "number (omit the field for no limit)",
                value=shown(node.value),
            )
        return value


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)
_StrictLoader.add_implicit_resolver(  # YAML 1.2 floats without a dot (5e14), as kubectl reads them
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _yaml_error(source: str, err: yaml.YAMLError) -> InputError:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    text = f"{source}: not valid YAML: {problem}" + (f" at {_where(mark)}" if mark is not None else "")
    return InputError(text[:300])


@contextlib.contextmanager
def _strict_loader(text: str, source: str) -> Iterator[_StrictLoader]:
    """A strict loader over ``text``; YAML and nesting errors leave as :class:`InputError`."""
    loader = _StrictLoader(text)
    loader.source = source
    try:
        yield loader
    except yaml.YAMLError as err:
        raise _yaml_error(source, err) from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply") from None
    finally:
        loader.dispose()


def parse_yaml(text: str, source: str = "input") -> Any:
    """One YAML document under the strict rules (see the module docstring).

    Raises:
        InputError: not YAML, several documents, an alias, too deep, a duplicate key or a NaN.
    """
    with _strict_loader(text, source) as loader:
        return loader.get_single_data()


def parse_yaml_all(text: str, source: str = "input") -> list[Any]:
    """Every YAML document of a stream, in order, empty documents dropped.

    Raises:
        InputError: as :func:`parse_yaml`.
    """
    docs: list[Any] = []
    with _strict_loader(text, source) as loader:
        while loader.check_data():  # type: ignore[no-untyped-call]
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
    return docs


def load_yaml(path: str | Path, what: str = "YAML file", limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """:func:`read_text` then :func:`parse_yaml`.

    Raises:
        InputError: the file cannot be read or parsed (the message names the path).
    """
    return parse_yaml(read_text(path, what, limit), str(path))


def load_yaml_all(path: str | Path, what: str = "YAML file", limit: int = MAX_DOCUMENT_BYTES) -> list[Any]:
    """:func:`read_text` then :func:`parse_yaml_all`.

    Raises:
        InputError: the file cannot be read or parsed (the message names the path).
    """
    return parse_yaml_all(read_text(path, what, limit), str(path))


# ------------------------------------------------------------------------------------------ JSON


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"duplicate key {shown(key)}; keep one", field=key)
        out[key] = value
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"{shown(text)} overflows to infinity; give a finite number", value=shown(text))
    return value


def _no_constant(name: str) -> Any:
    raise InputError(f"{name} is not a number JSON allows; give a finite number", value=name)


def parse_json(text: str, source: str = "input") -> Any:
    """One JSON value, strictly: no duplicate keys, NaN, Infinity or overflowing numbers.

    Raises:
        InputError: not JSON, or one of the above (the message starts with ``source``).
    """
    try:
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_float=_finite, parse_constant=_no_constant
        )
    except InputError as err:
        raise InputError(f"{source}: {err}", field=err.field, value=err.value) from None
    except json.JSONDecodeError as err:
        raise InputError(f"{source}: not valid JSON: {err.msg} at column {err.colno}") from None
    except (ValueError, RecursionError) as err:  # an integer of more than 4,300 digits, deep nesting
        raise InputError(f"{source}: not usable JSON: {str(err)[:120]}") from None
    if nesting_depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise InputError(f"{source}: nested deeper than {MAX_DEPTH} levels")
    return value


# ---------------------------------------------------------------------------------------- output


def _finite_only(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_only(v) for v in value]
    return value


def to_json(value: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``value``: a NaN or infinite number becomes ``null``.

    Raises:
        TypeError: a value JSON cannot hold (a bug in the caller, not the user's input).
    """
    return json.dumps(_finite_only(value), indent=indent, allow_nan=False)


# ---------------------------------------------------------------------------------------- models


def _kind(annotation: Any) -> str | None:
    """ "number", "bool" or None for a field annotation (``int | None`` is "number")."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, UnionType) else ()
    types = {a for a in args if a is not type(None)} if args else {annotation}
    if types and all(t in (int, float) for t in types):
        return "number"
    if types == {bool}:
        return "bool"
    return None


class StrictModel(BaseModel):
    """Base of the models users write (TrainingJob, policy): no NaN or infinity, and a field's type
    is taken as written (no boolean for a number, no number for a boolean, no quoted number)."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _as_written(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        kind = _kind(cls.model_fields[info.field_name].annotation)
        if kind == "number" and isinstance(value, bool | str):
            raise ValueError(
                f"expected a number, got {'a boolean' if isinstance(value, bool) else 'a string'} "
                f"{shown(value)}" + ("; remove the quotes" if isinstance(value, str) else "")
            )
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {shown(value)}")
        return value


# ---------------------------------------------------------------------------- command-line values


def _number(text: str, kind: type[int] | type[float], low: float, *, above: bool) -> Any:
    """``text`` as ``kind``, finite and ``>= low`` (``> low`` when ``above``)."""
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{shown(text)} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a finite number")
    if value < low or (above and value == low):
        raise argparse.ArgumentTypeError(f"{text} must be {'greater than' if above else 'at least'} {low:g}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count of GPUs, nodes, accumulation steps, a batch)."""
    return int(_number(text, int, 1, above=False))


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (an interval, a bandwidth)."""
    return float(_number(text, float, 0, above=True))


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a scale factor; 0 turns the effect off)."""
    return float(_number(text, float, 0, above=False))


def write_output(path: str | Path, data: bytes | str, what: str = "output") -> None:
    """Write a command's output file, checking every step: the write, the flush and the close (a
    full device, ``/dev/full``, fails only there), so an error is named and never reported as written.

    Args:
        path: The file (as the user gave it).
        data: What to write (text is written as UTF-8).
        what: The option that named it (``--plot``), for the message.

    Raises:
        InputError: the file could not be written; the message names it and the reason.
    """
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(path, "wb") as fh:
            fh.write(blob)
            fh.flush()
    except OSError as err:
        raise InputError(f"{what} {path}: cannot write it ({err.strerror or err}); it was not written", field=what) from None


def namespace_name(text: str) -> str:
    """argparse type: a namespace name (an RFC 1123 DNS label), as the API server accepts it."""
    try:
        return check_name(text, "namespace", label=True)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("namespace ")) from None


def object_name(text: str) -> str:
    """argparse type: an object's name (an RFC 1123 DNS subdomain), as the API server accepts it."""
    try:
        return check_name(text, "name")
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("name ")) from None


def output_file(text: str) -> str:
    """argparse type: a file path to write whose directory exists and which is not a directory."""
    p = Path(text)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"directory {parent} is not writable")
    return text


def iter_fields(err: ValidationError) -> Iterator[tuple[str, str, str | None]]:
    """(dotted field, problem, shown value or None) of each error of a pydantic ``ValidationError``."""
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        value = e.get("input")
        yield (
            loc,
            e["msg"].removeprefix("Value error, "),
            (None if value is None or isinstance(value, dict) else shown(value)),
        )


def first_field(err: ValidationError) -> tuple[str | None, str | None]:
    """(dotted field, shown value) of a ``ValidationError``'s first error, for an error's attributes."""
    loc, _, value = next(iter_fields(err), (None, "", None))
    return loc, value


MAX_ERROR_LINES = 20
"""Most field errors listed in one message (a document can break thousands of rules at once)."""


def format_validation(err: ValidationError, what: str) -> str:
    """``what is invalid:`` followed by one line per error: the field's dotted path, the problem and
    the value given (when it is not a mapping), shortened by :func:`shown`."""
    lines = [f"{what} is invalid:"]
    problems = list(iter_fields(err))
    for loc, msg, value in problems[:MAX_ERROR_LINES]:
        lines.append(f"  {loc}: {msg}" + (f" (got {value})" if value is not None else ""))
    if len(problems) > MAX_ERROR_LINES:
        lines.append(f"  ... and {len(problems) - MAX_ERROR_LINES} more")
    return "\n".join(lines)


def validation_error(err: ValidationError, what: str) -> InputError:
    """An :class:`InputError` saying what is invalid in ``what`` (:func:`format_validation`), with the
    first error's field and value as its attributes."""
    loc, value = first_field(err)
    return InputError(format_validation(err, what), field=loc, value=value)
