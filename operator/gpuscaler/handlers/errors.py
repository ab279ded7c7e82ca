"""The one place domain errors become kopf's ``TemporaryError`` (retry) or ``PermanentError`` (stop).

Handlers wrap their body in :func:`kopf_errors`, which maps on the error's kind
(:class:`gpuscaler.errors.ErrorKind`), never on its class:

- ``TEMPORARY`` (a cloud hiccup, no capacity, an API server 5xx/429 or no answer, Prometheus
  down): ``kopf.TemporaryError`` after the error's own ``retry_delay_s`` (30 s when the cloud ran
  out of capacity, else 10 s);
- ``INVALID_INPUT`` (a spec the planner cannot read, an unknown workload, GPU or provider, a 4xx
  the API server will answer the same way again) and ``INFEASIBLE``: ``kopf.PermanentError``;
  a pydantic ``ValidationError`` of an object's body is invalid input too;
- ``INTERNAL`` (a bug, a broken install) and anything that is not a gpuscaler error: left to
  kopf's own retry with backoff, the traceback in the log.

The reconcile daemon, which kopf does not retry, waits :func:`retry_delay` after a failed step
instead: the error's own delay for a temporary error, the resync interval for anything else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import kopf
from pydantic import ValidationError

from gpuscaler.errors import ErrorKind, GpuscalerError


def to_kopf(err: BaseException) -> kopf.TemporaryError | kopf.PermanentError | None:
    """The kopf error a domain error becomes.

    Args:
        err: what a handler's body raised.

    Returns:
        ``TemporaryError`` (with the error's delay) or ``PermanentError``; None when kopf should
        see the error itself (internal errors and exceptions that are not gpuscaler's).
    """
    if isinstance(err, ValidationError):
        return kopf.PermanentError(str(err))
    if not isinstance(err, GpuscalerError):
        return None
    if err.kind is ErrorKind.TEMPORARY:
        return kopf.TemporaryError(str(err), delay=err.retry_delay_s)
    if err.kind in {ErrorKind.INVALID_INPUT, ErrorKind.INFEASIBLE}:
        return kopf.PermanentError(str(err))
    return None


@contextmanager
def kopf_errors() -> Iterator[None]:
    """Map domain errors raised inside the block onto kopf errors (causes kept with ``from``)."""
    try:
        yield
    except (GpuscalerError, ValidationError) as err:
        mapped = to_kopf(err)
        if mapped is None:
            raise
        raise mapped from err


def retry_delay(err: BaseException, permanent_s: float) -> float:
    """Seconds before a job's daemon steps again after its step raised ``err``.

    Args:
        err: what the step raised.
        permanent_s: the delay for what will not pass by waiting (the resync interval).

    Returns:
        The error's own ``retry_delay_s`` for a temporary error, else ``permanent_s``.
    """
    if isinstance(err, GpuscalerError) and err.kind is ErrorKind.TEMPORARY:
        return err.retry_delay_s
    return permanent_s
