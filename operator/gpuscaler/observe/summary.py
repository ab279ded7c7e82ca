"""Pure: Prometheus series of one job (DCGM exporter + the runtime) -> :class:`JobMetrics`.

:mod:`gpuscaler.observe.prometheus` fetches the raw samples; this module groups them by pod and by
GPU and applies the estimators, so the unit tests exercise it without a server.

Label joins (documented in docs/observe.md):

- runtime series ``gpuscaler_runtime_samples_total{namespace, pod}``: the target labels Prometheus'
  Kubernetes service discovery puts on a scraped pod; the pod is a worker when its name is
  ``<job>-worker-<rank>`` (:func:`gpuscaler.kube.workers.worker_name`) in the job's namespace.
- DCGM series ``DCGM_FI_*{Hostname, gpu, UUID, modelName, pod, namespace, container}``: with the
  exporter's Kubernetes pod mapping, ``pod``/``namespace`` name the pod the GPU is allocated to
  (``exported_pod``/``exported_namespace`` when the scrape does not honor labels; settings
  ``dcgm_pod_label``/``dcgm_namespace_label``). One GPU is one ``UUID`` (else ``Hostname``+``gpu``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuscaler.observe.assess import JobMetrics, PodMetrics
from gpuscaler.observe.estimators import (
    Point,
    RateEstimate,
    gauge_mean,
    median,
    robust_rate,
    since,
)

SAMPLES_METRIC = "gpuscaler_runtime_samples_total"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
TRAFFIC = (
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
)
"""Bytes per second over the window (DCGM profiling fields are rates, not counters)."""
DCGM_METRICS = (GPU_UTIL, FB_USED, FB_FREE, TENSOR_ACTIVE, DRAM_ACTIVE, *TRAFFIC)
MIB = 1024 * 1024
"""DCGM reports frame buffer in MiB."""


@dataclass(frozen=True)
class Series:
    """One Prometheus series: its name, labels and raw samples."""

    metric: str
    labels: Mapping[str, str]
    points: list[Point]


def gpu_key(labels: Mapping[str, str]) -> str:
    """One physical GPU: its UUID, else host and index."""
    return labels.get("UUID") or f"{labels.get('Hostname', labels.get('instance', '?'))}/{labels.get('gpu', '?')}"


def _mean(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return sum(vs) / len(vs) if vs else None


@dataclass
class _Gpu:
    pod: str
    values: dict[str, float]


def _gpus(dcgm: Iterable[Series], start: float, pod_label: str) -> dict[str, _Gpu]:
    gpus: dict[str, _Gpu] = {}
    for s in dcgm:
        m = gauge_mean(since(s.points, start))
        if m is None:
            continue
        g = gpus.setdefault(gpu_key(s.labels), _Gpu(s.labels.get(pod_label, ""), {}))
        g.values[s.metric] = m
    return gpus


def _gpu_metrics(gpus: list[_Gpu]) -> dict[str, float | None]:
    def per_gpu(metric: str) -> list[float | None]:
        return [g.values.get(metric) for g in gpus]

    used_frac: list[tuple[float, float]] = []
    for g in gpus:
        used, free = g.values.get(FB_USED), g.values.get(FB_FREE)
        if used is not None:
            total = used + free if free is not None else None
            used_frac.append((used * MIB / 1e9, used / total if total else 0.0))
    traffic = [
        sum(g.values[t] for t in TRAFFIC if t in g.values) / 1e9 if any(t in g.values for t in TRAFFIC) else None
        for g in gpus
    ]
    fullest = max(used_frac, key=lambda x: (x[1], x[0])) if used_frac else None
    return {
        "gpu_util": _mean(per_gpu(GPU_UTIL)),
        "tensor_active": _mean(per_gpu(TENSOR_ACTIVE)),
        "dram_active": _mean(per_gpu(DRAM_ACTIVE)),
        "memory_used_gb": fullest[0] if fullest else None,
        "memory_used_fraction": fullest[1] if fullest and any(g.values.get(FB_FREE) is not None for g in gpus) else None,
        "interconnect_gbs": _mean(traffic),
    }


def summarise(
    runtime: Iterable[Series],
    dcgm: Iterable[Series],
    start: float,
    rate_window_s: float | None,
    pod_label: str = "pod",
    dcgm_pod_label: str = "pod",
) -> JobMetrics:
    """Per pod and per job: throughput (median over windows per pod, median over pods) and GPU use
    (mean over each GPU's samples, then over GPUs; memory of the fullest GPU).

    Args:
        runtime: ``gpuscaler_runtime_samples_total`` series of the job's workers.
        dcgm: ``DCGM_FI_*`` series of the GPUs allocated to the job's workers.
        start: unix seconds; earlier samples are ignored (an earlier gang, the warm-up).
        rate_window_s: seconds per window of the throughput median.
        pod_label: label with the pod name on runtime series.
        dcgm_pod_label: label with the pod name on DCGM series.
    """
    rates: dict[str, RateEstimate] = {}
    for s in runtime:
        pod = s.labels.get(pod_label, "")
        r = robust_rate(since(s.points, start), rate_window_s)
        if r is not None and (pod not in rates or r.seconds > rates[pod].seconds):
            rates[pod] = r
    gpus = _gpus(dcgm, start, dcgm_pod_label)
    by_pod: dict[str, list[_Gpu]] = defaultdict(list)
    for g in gpus.values():
        by_pod[g.pod].append(g)
    pods: list[PodMetrics] = []
    for pod in sorted(set(rates) | set(by_pod)):
        gm = _gpu_metrics(by_pod.get(pod, []))
        pods.append(PodMetrics(pod=pod, throughput=rates.get(pod), gpus=len(by_pod.get(pod, [])), **gm))
    job_rate: RateEstimate | None = None
    throughput: float | None = None
    if rates:
        ordered = sorted(rates.values(), key=lambda r: r.rate)
        throughput = median([r.rate for r in ordered])
        job_rate = ordered[(len(ordered) - 1) // 2]
    return JobMetrics(
        pods=pods, throughput=throughput, rate=job_rate, gpus=len(gpus), **_gpu_metrics(list(gpus.values()))
    )
