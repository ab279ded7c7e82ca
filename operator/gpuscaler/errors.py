"""The one error taxonomy of gpuscaler: every error it raises is a :class:`GpuscalerError` of a kind.

The kind says what the caller can do about it, and each caller maps kinds onto its own outcome in
one place:

==================  ======================================  ==========================  ============================
kind                meaning                                 CLI (``cli.describe_error``)  operator (``handlers/errors``)
==================  ======================================  ==========================  ============================
``INVALID_INPUT``   the input (a spec, file, option, name)  exit 2                      ``kopf.PermanentError``
                    is wrong; the message says what to
                    change; retrying the same input fails
``INFEASIBLE``      the input is valid but nothing meets    exit 1                      ``kopf.PermanentError``
                    it (no plan, a policy forbids it)
``TEMPORARY``       something outside gpuscaler failed and  exit 2 (try again)          ``kopf.TemporaryError``
                    may pass (cloud, API server, Prometheus)                            after ``retry_delay_s``
``INTERNAL``        a bug or a broken install               exit 3                      kopf's own retry
==================  ======================================  ==========================  ============================

The planner maps them too: an ``INVALID_INPUT`` error of the performance model for one configuration
(a precision the GPU lacks) becomes a rejection of that configuration, not a failed plan; the
simulator's command line turns anything its options or trace get wrong into ``INVALID_INPUT``.

Classes derive from :class:`InvalidInputError`, :class:`InfeasibleError` or :class:`TemporaryError`
when their kind is fixed, and may also derive from the built-in they always were (``ValueError``,
``KeyError``, ``RuntimeError``) so existing ``except`` clauses keep working. An error whose kind depends on the
instance (an API call that failed with a 5xx or a 4xx) sets ``kind`` in its ``__init__``: callers
map on ``err.kind``, never on the class.

This module imports nothing: it is the lowest layer, importable by :mod:`gpuscaler.inputs` and
everything above it, the training container's :mod:`gpuscaler.runtime` included.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """What the caller can do about an error (see the module docstring for each caller's mapping)."""

    INVALID_INPUT = "invalid-input"
    """Change the input: a spec, a file, an option or a name is wrong."""
    INFEASIBLE = "infeasible"
    """The input is valid but cannot be met: relax it (the message says what would work)."""
    TEMPORARY = "temporary"
    """A service gpuscaler depends on failed in a way that may pass: retry later."""
    INTERNAL = "internal"
    """A bug in gpuscaler or a broken install: report it."""


DEFAULT_RETRY_DELAY_S = 10.0
"""Seconds to wait before retrying after a temporary error that names no delay of its own (a
cloud or API server hiccup usually passes within seconds; kopf's own default backoff is 60 s)."""


class GpuscalerError(Exception):
    """Base of every error gpuscaler raises on purpose.

    Attributes:
        kind: what the caller can do about it; :attr:`ErrorKind.INTERNAL` unless a subclass or the
            instance says otherwise.
        retry_delay_s: for a temporary error, seconds before a retry may succeed.
        field: the dotted field, file or command-line option at fault, when there is one.
        value: the offending value as shown to the user, when there is one.
    """

    kind: ErrorKind = ErrorKind.INTERNAL
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S
    field: str | None = None
    value: str | None = None


class InvalidInputError(GpuscalerError):
    """The input is wrong; the message names it, its value and what to do instead."""

    kind = ErrorKind.INVALID_INPUT


class InfeasibleError(GpuscalerError):
    """The input is valid but cannot be met; the message says what would make it feasible."""

    kind = ErrorKind.INFEASIBLE


class TemporaryError(GpuscalerError):
    """Something outside gpuscaler failed and may pass; retry after :attr:`retry_delay_s`."""

    kind = ErrorKind.TEMPORARY


def kind_of(err: BaseException) -> ErrorKind:
    """The kind of any exception: its own for a :class:`GpuscalerError`, else ``INTERNAL``.

    Args:
        err: the exception.

    Returns:
        Its kind.
    """
    return err.kind if isinstance(err, GpuscalerError) else ErrorKind.INTERNAL
