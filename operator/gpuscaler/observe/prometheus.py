"""The Prometheus adapter: raw samples of a job's DCGM and runtime series, and range queries.

The only module of :mod:`gpuscaler.observe` that does I/O (``prometheus-api-client``, the extra
``observe``). Called by :mod:`gpuscaler.observe.controller` (the operator, every
``observe_interval_s`` per running job: two instant queries with range selectors) and by
``gpuscaler report``. Range selectors (``metric[600s]``) return every scraped sample, which the
estimators need (``query_range`` would resample them onto a grid).

Which series belong to a job (see :mod:`gpuscaler.observe.summary` for the label joins): the
worker pods are ``<job>-worker-<rank>`` in the job's namespace, so the selector is
``{namespace="<ns>", pod=~"<job>-worker-[0-9]+"}`` (Prometheus anchors regexes, so job ``a`` does
not match the pods of job ``a-worker-0``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuscaler.errors import TemporaryError
from gpuscaler.observe.assess import JobMetrics
from gpuscaler.observe.estimators import Point
from gpuscaler.observe.summary import DCGM_METRICS, SAMPLES_METRIC, Series, summarise


class PrometheusError(TemporaryError):
    """Prometheus could not be queried (unreachable, timeout, bad query); the message says which."""


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def worker_pod_regex(job: str) -> str:
    """An RE2 regex matching exactly the job's worker pod names (``<job>-worker-<rank>``)."""
    escaped = "".join("\\" + c if c in ".+*?()[]{}|^$\\" else c for c in job)
    return f"{escaped}-worker-[0-9]+"


def job_selector(namespace: str, job: str, namespace_label: str = "namespace", pod_label: str = "pod") -> str:
    """Label matchers of the job's worker pods, without braces."""
    return f"{namespace_label}={_quote(namespace)}, {pod_label}=~{_quote(worker_pod_regex(job))}"


def _series(raw: Iterable[dict[str, Any]]) -> list[Series]:
    out: list[Series] = []
    for item in raw:
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        values = item.get("values")
        if values is None and item.get("value") is not None:
            values = [item["value"]]
        points: list[Point] = []
        for t, v in values or []:
            try:
                points.append((float(t), float(v)))
            except (TypeError, ValueError):
                continue
        out.append(Series(labels.get("__name__", ""), labels, points))
    return out


@dataclass
class PrometheusSource:
    """Reads a job's series from one Prometheus server.

    Raises:
        ImportError: on construction, without ``prometheus-api-client`` (the optional extra ``observe``).
    """

    url: str
    """The server, e.g. ``http://prometheus-operated.monitoring:9090``."""
    timeout_s: float = 10.0
    """Seconds per query."""
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    """The labels naming the pod on the runtime's series."""
    dcgm_pod_label: str = "pod"
    dcgm_namespace_label: str = "namespace"
    """The labels naming the pod on DCGM series."""
    _prom: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from prometheus_api_client import PrometheusConnect  # the optional extra `observe`

        self._prom = PrometheusConnect(url=self.url, disable_ssl=True)

    def query(self, promql: str) -> list[Series]:
        """An instant query (range selectors give every raw sample).

        Raises:
            PrometheusError: the server is unreachable, timed out or refused the query.
        """
        try:
            raw = self._prom.custom_query(promql, timeout=self.timeout_s)
        except Exception as err:  # requests, urllib3 and the client's own errors: one typed error
            raise PrometheusError(f"querying Prometheus at {self.url}: {promql}: {err}") from err
        return _series(raw if isinstance(raw, list) else [])

    def query_range(self, promql: str, start: datetime, end: datetime, step_s: float) -> list[Series]:
        """A range query (for plots).

        Raises:
            PrometheusError: as :meth:`query`.
        """
        try:
            raw = self._prom.custom_query_range(
                promql, start_time=start, end_time=end, step=f"{max(step_s, 1):.0f}s", timeout=self.timeout_s
            )
        except Exception as err:
            raise PrometheusError(f"querying Prometheus at {self.url}: {promql}: {err}") from err
        return _series(raw if isinstance(raw, list) else [])

    def job_series(self, namespace: str, job: str, window_s: float) -> tuple[list[Series], list[Series]]:
        """Raw samples of the last ``window_s`` seconds: (runtime samples counters, DCGM series)."""
        w = f"{max(int(window_s), 1)}s"
        runtime = self.query(
            f"{SAMPLES_METRIC}{{{job_selector(namespace, job, self.namespace_label, self.pod_label)}}}[{w}]"
        )
        names = "|".join(DCGM_METRICS)
        sel = job_selector(namespace, job, self.dcgm_namespace_label, self.dcgm_pod_label)
        dcgm = self.query(f'{{__name__=~"{names}", {sel}}}[{w}]')
        return runtime, dcgm

    def job_metrics(
        self, namespace: str, job: str, window_s: float, start: float, rate_window_s: float | None
    ) -> JobMetrics:
        """The job's summarised metrics since ``start`` (unix seconds) within the last ``window_s``.

        Raises:
            PrometheusError: as :meth:`query`.
        """
        runtime, dcgm = self.job_series(namespace, job, window_s)
        return summarise(runtime, dcgm, start, rate_window_s, self.pod_label, self.dcgm_pod_label)
