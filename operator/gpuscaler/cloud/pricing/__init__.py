"""Live price sources: one interface (:class:`PriceSource`), one module per cloud.

- :mod:`~gpuscaler.cloud.pricing.aws`: on-demand from the AWS Pricing API, spot per zone from EC2
  ``DescribeSpotPriceHistory`` (boto3; endpoints from botocore's own ``AWS_ENDPOINT_URL_PRICING`` /
  ``AWS_ENDPOINT_URL_EC2``);
- :mod:`~gpuscaler.cloud.pricing.azure`: the public Azure Retail Prices API (``GPUSCALER_AZURE_PRICES_URL``);
- :mod:`~gpuscaler.cloud.pricing.gcp`: the Cloud Billing Catalog API (``GPUSCALER_GCP_BILLING_URL``).

Each source prices only the instance types it is given (the catalog's), in the regions asked, and
answers a :class:`~gpuscaler.catalog.prices.PriceTable` stamped with the day it was read and its
source id, or raises :class:`PriceSourceError`: ``temporary`` when the API is unreachable,
throttled past its retries or answers a malformed page (try again; nothing is written),
``invalid-input`` when credentials are missing or refused (the message names what is needed).
:mod:`gpuscaler.cloud.pricing.refresh` is ``gpuscaler catalog refresh``.
"""

from __future__ import annotations

import difflib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Protocol, TypeVar

from gpuscaler.catalog.prices import PriceTable
from gpuscaler.errors import ErrorKind, TemporaryError

T = TypeVar("T")

ATTEMPTS = 5
"""Calls made to an API before a throttled or failing request is given up (1 + 4 retries)."""
BACKOFF_S = 1.0
"""First wait before a retry; doubled each time, with up to 25% jitter (1, 2, 4, 8 s)."""

Progress = Callable[[str], None]
"""Where a source says what it is doing during a long pull (the CLI prints it on stderr)."""


def quiet(_: str) -> None:
    """A :data:`Progress` that says nothing."""


@dataclass(frozen=True)
class Pacing:
    """How a source talks to its API: where it reports progress, how often it retries and waits."""

    progress: Progress = quiet
    attempts: int = ATTEMPTS
    backoff_s: float = BACKOFF_S
    sleep: Callable[[float], None] = time.sleep


DEFAULT_PACING = Pacing()
"""Quiet, :data:`ATTEMPTS` attempts from :data:`BACKOFF_S`, real sleeps."""


class PriceSourceError(TemporaryError, RuntimeError):
    """A price source failed; ``kind`` is ``temporary`` (unreachable, throttled, a malformed page)
    or ``invalid-input`` (credentials missing or refused, a region the cloud does not have)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.TEMPORARY) -> None:
        super().__init__(message)
        self.kind = kind


class RetryableError(TemporaryError):
    """Raised inside :func:`with_retries` by a call that may pass if tried again (temporary: it never
    leaves :func:`with_retries`, which turns the last one into a :class:`PriceSourceError`)."""


class PriceSource(Protocol):
    """Where live prices come from: one cloud's price API."""

    provider: str
    """aws, azure or gcp."""

    def fetch(self, regions: Sequence[str]) -> PriceTable:
        """The prices of the source's instance types in ``regions``, stamped with today's date.

        Raises:
            PriceSourceError: the API failed or refused (the message says what and what is needed).
        """
        ...


def with_retries(call: Callable[[], T], what: str, pacing: Pacing) -> T:
    """``call()``, retried with exponential backoff while it raises :class:`RetryableError`.

    Waits ``backoff_s x 2^k x (1 + U(0, 0.25))`` before retry ``k + 1``.

    Raises:
        PriceSourceError: still failing after ``attempts`` calls (temporary: try again later).
    """
    delay = pacing.backoff_s
    for attempt in range(1, pacing.attempts + 1):
        try:
            return call()
        except RetryableError as err:
            if attempt == pacing.attempts:
                raise PriceSourceError(f"{what}: {err}; gave up after {pacing.attempts} attempts") from None
            pacing.sleep(delay * (1 + random.uniform(0, 0.25)))
            delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def today() -> str:
    """The ISO day prices read now are stamped with."""
    return date.today().isoformat()


def unknown_regions_error(
    provider: str, missing: Sequence[str], known: Sequence[str], source: str
) -> PriceSourceError:
    """The error for regions a source answered no price in: each with its close known names."""
    parts = []
    for region in missing:
        close = difflib.get_close_matches(region, list(known), n=3, cutoff=0.6)
        parts.append(f"{region!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return PriceSourceError(
        f"{source} has no price for the catalog's {provider} instance types in region(s) {', '.join(parts)}: "
        f"is each a {provider} region where these types are sold? Nothing was written.",
        ErrorKind.INVALID_INPUT,
    )
