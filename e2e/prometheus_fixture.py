"""A real Prometheus (Debian's ``prometheus`` package) scraping a test exporter, for the e2e suite.

Used by ``e2e/test_observe.py`` through ``pytest_plugins``. The exporter is a small HTTP server in
the test process that serves, for the fake worker pods the tests register, what the NVIDIA DCGM
exporter (with Kubernetes pod mapping) and the training runtime would serve: ``DCGM_FI_*`` gauges
labelled ``Hostname``, ``gpu``, ``UUID``, ``modelName``, ``pod``, ``namespace``, ``container``,
and ``gpuscaler_runtime_samples_total`` / ``gpuscaler_runtime_last_checkpoint_step`` labelled
``pod``/``namespace`` (the labels Kubernetes service discovery gives a scraped pod). Prometheus
scrapes it every second with ``honor_labels: true`` (so the exporter's pod labels are kept, as in
a DCGM ServiceMonitor with ``honorLabels``). ``scripts/ci-prometheus.sh`` installs the binary.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import any_cluster
from e2e_helpers import stop_process
from gpuscaler.runtime.metrics import serve_text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeWorker:
    """What one worker pod's GPUs and runtime report; edit the fields while the test runs."""

    namespace: str
    pod: str
    samples_per_s: float
    gpus: int = 1
    gpu_util: float = 95.0
    tensor_active: float = 0.45
    dram_active: float = 0.3
    fb_used_mib: float = 12000.0
    fb_total_mib: float = 24000.0
    pcie_bytes_s: float = 1e9
    checkpoint_step: int = 0
    started: float = field(default_factory=time.time)
    model: str = "NVIDIA A10G"

    def samples(self, now: float) -> float:
        return max(now - self.started, 0.0) * self.samples_per_s


class FakeExporter:
    """Serves DCGM-format and runtime metrics of the registered :class:`FakeWorker` s (through the
    training runtime's own stdlib exporter, :func:`gpuscaler.runtime.metrics.serve_text`)."""

    def __init__(self) -> None:
        self.workers: dict[tuple[str, str], FakeWorker] = {}
        self._lock = threading.Lock()
        self.server = serve_text(self.render)
        self.port = self.server.port

    def worker(self, namespace: str, pod: str, samples_per_s: float, **fields: Any) -> FakeWorker:
        """A :class:`FakeWorker` (not yet added)."""
        return FakeWorker(namespace, pod, samples_per_s, **fields)

    def add(self, worker: FakeWorker) -> FakeWorker:
        with self._lock:
            self.workers[(worker.namespace, worker.pod)] = worker
        return worker

    def render(self) -> str:
        now = time.time()
        lines = [
            "# TYPE gpuscaler_runtime_samples_total counter",
            "# TYPE gpuscaler_runtime_last_checkpoint_step gauge",
        ]
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            pod = f'namespace="{w.namespace}",pod="{w.pod}"'
            lines.append(f"gpuscaler_runtime_samples_total{{{pod}}} {w.samples(now):.3f}")
            lines.append(f"gpuscaler_runtime_last_checkpoint_step{{{pod}}} {w.checkpoint_step}")
            for g in range(w.gpus):
                labels = (
                    f'gpu="{g}",UUID="GPU-{w.namespace}-{w.pod}-{g}",Hostname="{w.pod}-node",'
                    f'modelName="{w.model}",container="train",{pod}'
                )
                values = {
                    "DCGM_FI_DEV_GPU_UTIL": w.gpu_util,
                    "DCGM_FI_DEV_FB_USED": w.fb_used_mib,
                    "DCGM_FI_DEV_FB_FREE": w.fb_total_mib - w.fb_used_mib,
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": w.tensor_active,
                    "DCGM_FI_PROF_DRAM_ACTIVE": w.dram_active,
                    "DCGM_FI_PROF_PCIE_TX_BYTES": w.pcie_bytes_s / 2,
                    "DCGM_FI_PROF_PCIE_RX_BYTES": w.pcie_bytes_s / 2,
                }
                lines += [f"{name}{{{labels}}} {v}" for name, v in values.items()]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.server.close()


@dataclass
class PrometheusServer:
    url: str
    exporter: FakeExporter
    proc: subprocess.Popen[bytes]
    log: Path


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="session")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[PrometheusServer]:
    """A Prometheus server (1 s scrape interval) scraping a :class:`FakeExporter`; both stopped at the end.

    Without the binary: a failure on the private dev cluster (CI installs it), a skip on an
    existing cluster (a laptop with kind may not have it).
    """
    binary = shutil.which("prometheus")
    if binary is None:
        if any_cluster.external_kubeconfig(pytestconfig):
            pytest.skip("needs prometheus on PATH (scripts/ci-prometheus.sh installs Debian's package)")
        pytest.fail("prometheus is not on PATH: run scripts/ci-prometheus.sh (installs Debian's prometheus package)")
    exporter = FakeExporter()
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: fake-gpus\n    honor_labels: true\n    scrape_interval: 1s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exporter.port}']\n"
    )
    port = free_port()
    log = tmp / "prometheus.log"
    out = log.open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        stdout=out,
        stderr=out,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not _ready(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            exporter.close()
            pytest.fail(f"prometheus did not become ready: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)
    try:
        yield PrometheusServer(url, exporter, proc, log)
    finally:
        stop_process(proc)
        exporter.close()
        out.close()
