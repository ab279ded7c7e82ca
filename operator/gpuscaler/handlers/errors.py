"""The one place domain errors become kopf's ``TemporaryError`` (retry) or ``PermanentError`` (stop).

Handlers wrap their body in :func:`kopf_errors`. Retried: provider failures (a cloud hiccup,
no capacity), API server errors that may pass (5xx, 429, connection). Permanent: a spec the
planner cannot read (unknown workload or GPU id), an unknown provider, a 4xx the API server will
answer the same way again. The reconcile daemon, which kopf does not retry, waits
:func:`retry_delay` after a failed step instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import kopf
from pydantic import ValidationError

from gpuscaler.catalog import UnknownIdError
from gpuscaler.cloud import InsufficientCapacityError, ProviderError, UnknownProviderError
from gpuscaler.kube.client import KubeError
from gpuscaler.planner import JobError

RETRY_DELAY_S = 10.0
"""Seconds before kopf retries a handler after a temporary error."""
CAPACITY_RETRY_DELAY_S = 30.0
"""Seconds before retrying after the cloud ran out of capacity."""


@contextmanager
def kopf_errors() -> Iterator[None]:
    """Map domain errors raised inside the block onto kopf errors (causes kept with ``from``)."""
    try:
        yield
    except (UnknownIdError, JobError, ValidationError, UnknownProviderError) as err:
        raise kopf.PermanentError(str(err)) from err
    except InsufficientCapacityError as err:
        raise kopf.TemporaryError(str(err), delay=CAPACITY_RETRY_DELAY_S) from err
    except ProviderError as err:
        raise kopf.TemporaryError(str(err), delay=RETRY_DELAY_S) from err
    except KubeError as err:
        if err.retriable:
            raise kopf.TemporaryError(str(err), delay=RETRY_DELAY_S) from err
        raise kopf.PermanentError(str(err)) from err


def retry_delay(err: BaseException, permanent_s: float) -> float:
    """Seconds before a job's daemon steps again after its step raised ``err``: the delays above
    for what may pass, ``permanent_s`` (the resync interval) for what will not."""
    if isinstance(err, InsufficientCapacityError):
        return CAPACITY_RETRY_DELAY_S
    if isinstance(err, ProviderError) or (isinstance(err, KubeError) and err.retriable):
        return RETRY_DELAY_S
    return permanent_s
