"""Prometheus metrics of the training container: step, samples, checkpoints, notice latency.

:class:`RuntimeMetrics` holds the values (the guard updates them) and renders the Prometheus text
exposition format itself, so it needs no dependency. :func:`serve_metrics` exposes them on a port
(``GPUSCALER_METRICS_PORT``): through ``prometheus_client`` when it is importable (imported only
then, never at module import), else through a small ``http.server`` exporter. Either way the
values come from the same :class:`RuntimeMetrics`, so both exporters print the same series.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from http.server import HTTPServer

log = logging.getLogger(__name__)

PREFIX: Final = "gpuscaler_runtime_"

CHECKPOINT_SECONDS_BUCKETS: Final = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""Histogram buckets for checkpoint duration. 30 s and 120 s are the GKE and AWS spot notice
lengths: a checkpoint slower than the notice is lost on reclaim."""


@dataclass(frozen=True)
class Sample:
    """One exposition line: ``name{labels} value``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Family:
    """One metric family: HELP, TYPE and its samples."""

    name: str
    kind: str
    """``gauge``, ``counter`` or ``histogram``."""
    help: str
    samples: tuple[Sample, ...]


def _format_value(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class RuntimeMetrics:
    """The runtime's metric values; thread-safe, rendered on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.step = 0
        self.samples = 0
        self.last_checkpoint_step: int | None = None
        self.last_checkpoint_time: float | None = None
        self.last_checkpoint_bytes = 0
        self.resumed_step: int | None = None
        self.notice_to_checkpoint_seconds: float | None = None
        self.stop_requested = False
        self.corrupt_checkpoints = 0
        self.checkpoints_by_reason: dict[str, int] = {}
        self._bucket_counts = [0] * len(CHECKPOINT_SECONDS_BUCKETS)
        self._duration_sum = 0.0
        self._duration_count = 0

    def set_progress(self, step: int, samples: int) -> None:
        """Record steps completed and samples processed.

        Args:
            step: Steps completed.
            samples: Samples processed (cumulative).
        """
        self.step = step
        self.samples = samples

    def observe_checkpoint(
        self, step: int, unix_time: float, seconds: float, payload_bytes: int, reason: str
    ) -> None:
        """Record a committed checkpoint.

        Args:
            step: Its step.
            unix_time: When it was committed.
            seconds: How long writing it took.
            payload_bytes: Its payload size.
            reason: What triggered it.
        """
        with self._lock:
            self.last_checkpoint_step = step
            self.last_checkpoint_time = unix_time
            self.last_checkpoint_bytes = payload_bytes
            self.checkpoints_by_reason[reason] = self.checkpoints_by_reason.get(reason, 0) + 1
            index = bisect.bisect_left(CHECKPOINT_SECONDS_BUCKETS, seconds)
            if index < len(self._bucket_counts):
                self._bucket_counts[index] += 1
            self._duration_sum += seconds
            self._duration_count += 1

    def families(self) -> list[Family]:
        """Snapshot all metrics.

        Returns:
            The metric families, in a stable order.
        """
        with self._lock:

            def gauge(name: str, text: str, value: float) -> Family:
                return Family(PREFIX + name, "gauge", text, (Sample(PREFIX + name, (), value),))

            out = [
                gauge("step", "Training steps completed.", self.step),
                Family(
                    PREFIX + "samples_total",
                    "counter",
                    "Samples processed, cumulative over restarts.",
                    (Sample(PREFIX + "samples_total", (), self.samples),),
                ),
            ]
            if self.last_checkpoint_step is not None:
                out.append(
                    gauge(
                        "last_checkpoint_step",
                        "Step of the newest complete checkpoint.",
                        self.last_checkpoint_step,
                    )
                )
            if self.last_checkpoint_time is not None:
                out.append(
                    gauge(
                        "last_checkpoint_timestamp_seconds",
                        "Unix time the newest checkpoint was committed.",
                        self.last_checkpoint_time,
                    )
                )
            out.append(
                gauge(
                    "last_checkpoint_bytes",
                    "Payload size of the newest checkpoint written by this process.",
                    self.last_checkpoint_bytes,
                )
            )
            if self.resumed_step is not None:
                out.append(
                    gauge(
                        "resumed_step", "Step this process resumed from (0: fresh start).", self.resumed_step
                    )
                )
            if self.notice_to_checkpoint_seconds is not None:
                out.append(
                    gauge(
                        "notice_to_checkpoint_seconds",
                        "Seconds from the last notice (SIGTERM or request) to its checkpoint committed.",
                        self.notice_to_checkpoint_seconds,
                    )
                )
            out.append(
                gauge(
                    "stop_requested",
                    "1 once SIGTERM arrived: checkpointing and stopping.",
                    1.0 if self.stop_requested else 0.0,
                )
            )
            out.append(
                Family(
                    PREFIX + "corrupt_checkpoints_total",
                    "counter",
                    "Checkpoints skipped on resume because they failed verification.",
                    (Sample(PREFIX + "corrupt_checkpoints_total", (), self.corrupt_checkpoints),),
                )
            )
            out.append(
                Family(
                    PREFIX + "checkpoints_total",
                    "counter",
                    "Checkpoints committed by this process, by trigger.",
                    tuple(
                        Sample(PREFIX + "checkpoints_total", (("reason", r),), n)
                        for r, n in sorted(self.checkpoints_by_reason.items())
                    ),
                )
            )
            name = PREFIX + "checkpoint_seconds"
            buckets = []
            cumulative = 0
            for bound, count in zip(CHECKPOINT_SECONDS_BUCKETS, self._bucket_counts, strict=True):
                cumulative += count
                buckets.append(Sample(name + "_bucket", (("le", _format_value(bound)),), cumulative))
            buckets.append(Sample(name + "_bucket", (("le", "+Inf"),), self._duration_count))
            buckets.append(Sample(name + "_sum", (), self._duration_sum))
            buckets.append(Sample(name + "_count", (), self._duration_count))
            out.append(
                Family(name, "histogram", "Time to write, sync and commit a checkpoint.", tuple(buckets))
            )
            return out

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4).

        Returns:
            The metrics page.
        """
        lines = []
        for family in self.families():
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            for sample in family.samples:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels)
                label_text = "{" + labels + "}" if labels else ""
                lines.append(f"{sample.name}{label_text} {_format_value(sample.value)}")
        return "\n".join(lines) + "\n"


class MetricsServer(Protocol):
    """A running exporter."""

    @property
    def port(self) -> int:
        """The bound port."""
        ...

    def close(self) -> None:
        """Stop serving."""
        ...


class _ThreadedServer:
    """An HTTP server run by a daemon thread: the bound port, and how to stop it (both exporters)."""

    _httpd: HTTPServer

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _StdlibServer(_ThreadedServer):
    def __init__(self, render: Callable[[], str], port: int, addr: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # lazy: ~50 ms of imports

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/", "/metrics"):
                    self.send_error(404)
                    return
                body = render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer((addr, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gpuscaler-metrics", daemon=True
        )
        self._thread.start()


class _PrometheusClientServer(_ThreadedServer):
    def __init__(self, metrics: RuntimeMetrics, port: int, addr: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        class Collector:
            def collect(self) -> Iterator[Any]:
                for family in metrics.families():
                    if family.kind == "histogram":
                        buckets = [
                            (dict(s.labels)["le"], s.value)
                            for s in family.samples
                            if s.name.endswith("_bucket")
                        ]
                        total = next(s.value for s in family.samples if s.name.endswith("_sum"))
                        yield HistogramMetricFamily(
                            family.name, family.help, buckets=buckets, sum_value=total
                        )
                        continue
                    cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                    label_names = [k for k, _ in family.samples[0].labels] if family.samples else []
                    out = cls(family.name, family.help, labels=label_names)
                    for sample in family.samples:
                        out.add_metric([v for _, v in sample.labels], sample.value)
                    yield out

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector())
        self._httpd, self._thread = start_http_server(port, addr, registry)


def serve_metrics(
    metrics: RuntimeMetrics, port: int, addr: str = "0.0.0.0", *, prefer_prometheus_client: bool = True
) -> MetricsServer:
    """Serve ``metrics`` at ``http://addr:port/metrics`` from a daemon thread.

    Args:
        metrics: The values to expose.
        port: TCP port (0 picks a free one; read it back from ``.port``).
        addr: Bind address.
        prefer_prometheus_client: Use ``prometheus_client`` when importable; otherwise, or when
            False, the stdlib exporter.

    Returns:
        The running server; call ``close()`` to stop it.

    Raises:
        OSError: The port cannot be bound.
    """
    if prefer_prometheus_client:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            log.debug("prometheus_client not importable; serving metrics with http.server")
        else:
            return _PrometheusClientServer(metrics, port, addr)
    return _StdlibServer(metrics.render, port, addr)


def serve_text(render: Callable[[], str], port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve what ``render()`` returns (Prometheus text format) at ``http://addr:port/metrics``.

    The stdlib exporter of :func:`serve_metrics`, for any source of exposition text (the e2e
    suite's fake DCGM exporter serves through it).

    Args:
        render: Called on every scrape; returns the exposition text.
        port: TCP port (0 picks a free one; read it back from ``.port``).
        addr: Bind address.

    Returns:
        The running server; call ``close()`` to stop it.

    Raises:
        OSError: The port cannot be bound.
    """
    return _StdlibServer(render, port, addr)
