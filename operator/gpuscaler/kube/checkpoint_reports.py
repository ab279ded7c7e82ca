"""The workers' checkpoint-timing reports: when a write began, when the newest one committed, how long it took.

:class:`~gpuscaler.runtime.kube_reporter.KubeReporter` writes, besides the progress
(:mod:`gpuscaler.kube.reports`), ``gpuscaler.io/checkpoint-writing`` (the start of the write in
progress, empty between writes), ``gpuscaler.io/checkpoint-time`` (the newest checkpoint's commit)
and ``gpuscaler.io/checkpoint-duration`` (its write seconds). The operator acts on them in
:mod:`gpuscaler.controller.preemption`: it keeps ``karpenter.sh/do-not-disrupt`` on the job's pods
while a write is in progress and publishes what a preemption would cost. As every worker-written
value, each is checked for its type and range by :func:`gpuscaler.kube.reports.parse`, with the
other reports (a strict RFC 3339 UTC time, :func:`parse_utc`; a finite non-negative number of
seconds up to :data:`MAX_SECONDS`); what fails is dropped and listed with the other rejections
(:class:`~gpuscaler.kube.reports.Rejected`). Who wrote it (the writer rank of the current attempt)
and how long a write is believed are checked by the controller. This module holds what a timing
report is; pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

MAX_SECONDS = 7 * 86400.0
"""Longest checkpoint write taken at all (a week): anything longer is not a measurement."""
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")
"""What :func:`gpuscaler.runtime.progress.rfc3339` writes (fractions accepted)."""


@dataclass(frozen=True)
class CheckpointTiming:
    """A pod's checkpoint-timing reports that passed the type and range checks (None: absent or rejected)."""

    writing_since: datetime | None = None
    """When the write in progress began; None when none is reported."""
    committed_at: datetime | None = None
    """When the newest checkpoint reported with it committed."""
    write_seconds: float | None = None
    """Seconds the newest checkpoint took to write."""


def parse_utc(text: str) -> datetime | None:
    """A strict RFC 3339 UTC time (``2026-12-06T17:00:00Z``), None when it is not one."""
    if not _TIME.fullmatch(text):
        return None
    try:
        return datetime.fromisoformat(text[:-1][:26]).replace(tzinfo=UTC)
    except ValueError:
        return None

