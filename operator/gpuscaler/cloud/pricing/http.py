"""A JSON GET over HTTP for the REST price APIs (Azure Retail Prices, GCP Cloud Billing Catalog).

Plain :mod:`urllib.request`: both APIs are simple paged JSON over GET, so no SDK is needed (see
:mod:`~gpuscaler.cloud.pricing.gcp` for why not ``google-cloud-billing``). 429 and 5xx answers and
connection failures are retried with backoff (:func:`~gpuscaler.cloud.pricing.with_retries`,
honouring ``Retry-After``); 401/403 mean credentials (the caller says which); a body that is not
a JSON object is a malformed page.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from gpuscaler.cloud.pricing import DEFAULT_PACING, Pacing, PriceSourceError, RetryableError, with_retries
from gpuscaler.errors import ErrorKind

TIMEOUT_S = 60.0
"""Seconds to wait for one page."""
MAX_RETRY_AFTER_S = 60.0
"""Longest ``Retry-After`` honoured (a longer one is capped)."""


def redact(url: str) -> str:
    """``url`` without the value of a ``key`` query parameter (an API key must not reach a log)."""
    parts = urllib.parse.urlsplit(url)
    query = [
        (k, "REDACTED" if k == "key" else v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query, safe="$,'() ")))


def get_json(
    url: str,
    what: str,
    credentials_hint: str = "",
    headers: Mapping[str, str] | None = None,
    pacing: Pacing = DEFAULT_PACING,
) -> dict[str, Any]:
    """GET ``url`` and parse its JSON object.

    Args:
        url: the page's address.
        what: the API's name, for messages.
        credentials_hint: what a 401/403 needs (e.g. "an API key in GPUSCALER_GCP_API_KEY").
        headers: extra request headers.
        pacing: retries and waits (tests pass a recorder for ``sleep``).

    Raises:
        PriceSourceError: unreachable or throttled after the retries, an error answer, credentials
            refused (``invalid-input``), or a page that is not a JSON object.
    """
    shown = redact(url)

    def once() -> bytes:
        request = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                body: bytes = answer.read()
                return body
        except urllib.error.HTTPError as err:
            detail = err.read(300).decode("utf-8", "replace").strip()
            if err.code == 429 or err.code >= 500:
                wait = _retry_after(err.headers.get("Retry-After"))
                if wait:
                    pacing.sleep(wait)
                raise RetryableError(f"HTTP {err.code} from {shown}") from None
            if err.code in (401, 403):
                raise PriceSourceError(
                    f"{what} refused the request (HTTP {err.code}: {detail[:200]}); it needs {credentials_hint}",
                    ErrorKind.INVALID_INPUT,
                ) from None
            raise PriceSourceError(f"{what}: HTTP {err.code} from {shown}: {detail[:200]}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise RetryableError(f"cannot reach {shown} ({reason})") from None

    body = with_retries(once, what, pacing)
    try:
        page = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PriceSourceError(
            f"{what}: malformed page from {shown}: not JSON ({err}); nothing was written"
        ) from None
    if not isinstance(page, dict):
        raise PriceSourceError(
            f"{what}: malformed page from {shown}: a JSON {type(page).__name__}, not an object"
        )
    return page


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value or 0), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        return 0.0
