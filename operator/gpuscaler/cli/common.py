"""What every command of the ``gpuscaler`` command line shares: the exit codes, error descriptions, the parser that raises, tables, reading a job and a policy."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as _field
from typing import Any

from pydantic import ValidationError

from gpuscaler.api import TrainingJob
from gpuscaler.catalog import Catalog, CatalogError, UnknownIdError, load_catalog
from gpuscaler.errors import ErrorKind, GpuscalerError
from gpuscaler.inputs import InputError, format_validation, iter_fields, load_yaml, shown, validation_error
from gpuscaler.perfmodel.uncertainty import CrossValidationError
from gpuscaler.policy import Policy, load_policies, policy_for_namespace

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_INFEASIBLE: "infeasible: the job is valid but no plan meets it; the output says what would",
    EXIT_USAGE: "invalid input or usage: the message names the field or option, the value and what to do; "
    "or a service it needs failed in a way that may pass (try again)",
    EXIT_INTERNAL: "internal error: a bug in gpuscaler or a broken install, please report it "
    "(GPUSCALER_DEBUG=1 shows the traceback)",
}
"""The exit codes of every command, as ``gpuscaler --help`` and docs/inputs.md list them."""

EXTRAS = {
    "kopf": "operator",
    "kubernetes": "operator",
    "cryptography": "operator",
    "prometheus_client": "operator",
    "boto3": "aws",
    "botocore": "aws",
    "google": "gcp",
    "prometheus_api_client": "observe",
}
"""Optional packages by the pip extra that installs them (for the "needs ..." message)."""


class UsageError(InputError):
    """Bad input from the user; printed without a traceback, exit 2.

    Attributes:
        usage: the command's usage line, printed after the message on stderr (not in ``--json``).
    """

    usage: str = ""


@dataclass
class Failure:
    """An error as the user sees it: exit code, message, and the fields of the ``--json`` object."""

    code: int
    kind: str
    message: str
    field: str | None = None
    value: str | None = None
    matches: list[str] = _field(default_factory=list)
    problems: list[dict[str, str | None]] = _field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``{"error": ...}`` object printed under ``--json``."""
        body: dict[str, Any] = {"exitCode": self.code, "kind": self.kind, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.value is not None:
            body["value"] = self.value
        if self.matches:
            body["closeMatches"] = self.matches
        if self.problems:
            body["problems"] = self.problems
        return {"error": body}


def describe_error(err: BaseException) -> Failure:
    """The one mapping of errors onto exit codes and messages, for every command.

    A :class:`~gpuscaler.errors.GpuscalerError` maps by its kind: ``INVALID_INPUT`` exit 2 (an
    unknown name with its close matches), ``INFEASIBLE`` exit 1, ``TEMPORARY`` exit 2 (a service
    it needs failed: try again), ``INTERNAL`` exit 3. Of the rest, a pydantic ``ValidationError``,
    a missing optional package, a file error and an input too large to process are the user's to
    fix (exit 2); anything else is a bug (exit 3).

    Args:
        err: what a command raised.

    Returns:
        The failure to print.
    """
    if isinstance(err, GpuscalerError):
        return _describe_domain_error(err)
    if isinstance(err, ValidationError):
        problems = [{"field": loc, "problem": msg, "value": value} for loc, msg, value in iter_fields(err)]
        first = problems[0] if problems else {}
        return Failure(
            EXIT_USAGE, "invalid-input", format_validation(err, "input"), first.get("field"), first.get("value"),
            problems=problems,
        )  # fmt: skip
    if isinstance(err, ModuleNotFoundError):
        top = (err.name or "").split(".")[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'gpuscaler[{extra}]'" if extra else f"pip install {top}"
        return Failure(EXIT_USAGE, "missing-dependency", f"this command needs the Python package {top!r}: {how}")
    if isinstance(err, OSError):
        where = f"{err.filename}: " if err.filename else "writing the output: "  # no file named: stdout
        return Failure(EXIT_USAGE, "io-error", f"{where}{err.strerror or err}", err.filename and str(err.filename))
    if isinstance(err, MemoryError | RecursionError):
        return Failure(EXIT_USAGE, "too-large", "the input is too large or too deeply nested to process")
    return _internal(err)


def _describe_domain_error(err: GpuscalerError) -> Failure:
    if err.kind is ErrorKind.INVALID_INPUT:
        if isinstance(err, UnknownIdError):
            return Failure(EXIT_USAGE, "unknown-name", str(err), err.what, shown(err.value), list(err.matches))
        return Failure(EXIT_USAGE, "invalid-input", str(err), err.field, err.value)
    if err.kind is ErrorKind.INFEASIBLE:
        return Failure(EXIT_INFEASIBLE, "infeasible", str(err), err.field, err.value)
    if err.kind is ErrorKind.TEMPORARY:
        return Failure(EXIT_USAGE, "unavailable", f"{err} (this may pass: try again)", err.field, err.value)
    if isinstance(err, CatalogError | CrossValidationError):  # shipped data files: a broken install
        what = "catalog" if isinstance(err, CatalogError) else "performance model's data"
        return Failure(EXIT_INTERNAL, "broken-install", f"the {what} is broken: {err}; reinstall gpuscaler")
    return _internal(err)


def _internal(err: BaseException) -> Failure:
    return Failure(
        EXIT_INTERNAL,
        "internal-error",
        f"internal error {type(err).__name__}: {str(err)[:300]} (a bug; please report it with the command; "
        "GPUSCALER_DEBUG=1 prints the traceback)",
    )


EXIT_CODES_HELP = "exit codes:\n" + "\n".join(f"  {code}  {what}" for code, what in EXIT_CODES.items())


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors raised as :class:`UsageError` (so ``--json`` gets an error object),
    an unknown choice answered with its close matches, and the exit codes in every ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn
        """Raise the usage error instead of printing and exiting.

        Raises:
            UsageError: always.
        """
        hint = ""
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:
            choices = re.findall(r"'([^']*)'", bad.group(2)) or [c.strip() for c in bad.group(2).split(",")]
            close = difflib.get_close_matches(bad.group(1), choices, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            message = f"invalid choice {shown(bad.group(1))} (choose from {', '.join(choices)})"
        command = self.prog.removeprefix("gpuscaler").strip()
        err = UsageError(f"{command + ': ' if command else ''}{message}{hint}")
        err.usage = self.format_usage().rstrip()
        raise err


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _money(x: float) -> str:
    return f"${x:,.2f}" if x < 100 else f"${x:,.0f}"


def load_job(path: str) -> TrainingJob:
    """Read a TrainingJob YAML file (the same document ``kubectl apply`` takes).

    Raises:
        InputError: unreadable, not YAML (see :mod:`gpuscaler.inputs`), not a TrainingJob, or a field
            the models refuse (the message names each field and its value).
    """
    raw = load_yaml(path, "TrainingJob file")
    if not isinstance(raw, dict) or raw.get("kind") != "TrainingJob":
        raise UsageError(f"{path}: expected a document with kind: TrainingJob")
    try:
        return TrainingJob.model_validate(raw)
    except ValidationError as err:
        raise validation_error(err, path) from None


def _load_policy(path: str | None, namespace: str | None, catalog: Catalog | None = None) -> Policy | None:
    """The policy in force for ``namespace`` from a (possibly multi-document) policy file.

    Raises:
        InputError: the file cannot be read, breaks the schema, or names unknown GPU or instance
            types, providers or regions.
    """
    if path is None:
        return None
    from gpuscaler.policy.cli import unknown_ids

    try:
        policies = load_policies(path)
    except ValidationError as err:
        raise validation_error(err, f"policy {path}") from None
    catalog = catalog or load_catalog()
    errors = [f"policy {p.name}: {e}" for p in policies for e in unknown_ids(p, catalog)]
    if errors:
        raise UsageError(f"policy {path} is invalid:\n  " + "\n  ".join(errors))
    return policy_for_namespace(policies, namespace)
