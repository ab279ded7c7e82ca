"""The observe estimators: counter rates through noise, gaps and resets; gauge averages; summaries."""

from __future__ import annotations

import random

import pytest

from gpuscaler.observe.estimators import (
    clean,
    gauge_mean,
    intervals,
    max_of_series,
    mean_of_series,
    median,
    robust_rate,
    since,
)
from gpuscaler.observe.summary import (
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    SAMPLES_METRIC,
    TENSOR_ACTIVE,
    Series,
    summarise,
)


def counter(rate: float, seconds: int, step: float = 1.0, start: float = 1000.0, v0: float = 0.0) -> list[tuple[float, float]]:
    return [(start + i * step, v0 + rate * i * step) for i in range(int(seconds / step) + 1)]


def test_steady_counter_rate() -> None:
    r = robust_rate(counter(100.0, 120), window_s=10)
    assert r is not None
    assert r.rate == pytest.approx(100.0)
    assert r.windows == 12 and r.resets == 0 and r.gaps == 0 and r.spread == pytest.approx(0.0)


def test_noise_in_scrape_times_and_values() -> None:
    rng = random.Random(7)
    pts = []
    total = 0.0
    t = 0.0
    for _ in range(600):
        dt = 1.0 + rng.uniform(-0.2, 0.2)  # scrape jitter
        t += dt
        total += 50.0 * dt * rng.uniform(0.8, 1.2)  # step-time noise
        pts.append((t, total))
    r = robust_rate(pts, window_s=30)
    assert r is not None
    assert r.rate == pytest.approx(50.0, rel=0.03)


def test_one_stalled_window_does_not_move_the_median() -> None:
    pts = counter(100.0, 60)
    stall_end = pts[-1][0] + 10
    pts += [(pts[-1][0] + i, pts[-1][1]) for i in range(1, 11)]  # 10 s evaluation pause, no samples added
    pts += [(stall_end + i, pts[-1][1] + 100.0 * i) for i in range(1, 61)]
    r = robust_rate(pts, window_s=10)
    assert r is not None
    assert r.rate == pytest.approx(100.0)
    assert r.mean_rate < 95.0  # what a plain average would have said


def test_counter_reset_interval_is_left_out() -> None:
    before = counter(100.0, 60)
    # the worker restarts and resumes its counter from an older checkpoint (not from 0)
    after = counter(100.0, 60, start=before[-1][0] + 1, v0=2000.0)
    r = robust_rate(before + after, window_s=10)
    assert r is not None
    assert r.resets == 1
    assert r.rate == pytest.approx(100.0)
    assert r.mean_rate == pytest.approx(100.0)


def test_reset_to_zero_is_left_out_too() -> None:
    pts = counter(10.0, 30) + counter(10.0, 30, start=1031.0, v0=0.0)
    r = robust_rate(pts)
    assert r is not None and r.resets == 1 and r.rate == pytest.approx(10.0)


def test_gap_is_left_out() -> None:
    a = counter(100.0, 60)
    b = counter(100.0, 60, start=a[-1][0] + 300, v0=a[-1][1] + 100.0 * 30)  # 5 min away, only 30 s of work done
    _ivs, resets, gaps = intervals(a + b)
    assert gaps == 1 and resets == 0
    r = robust_rate(a + b, window_s=10)
    assert r is not None and r.rate == pytest.approx(100.0)


def test_duplicates_nan_and_order() -> None:
    pts = [(3.0, 30.0), (1.0, 10.0), (2.0, 20.0), (2.0, 20.0), (4.0, float("nan")), (5.0, 50.0)]
    assert clean(pts) == [(1.0, 10.0), (2.0, 20.0), (3.0, 30.0), (5.0, 50.0)]
    r = robust_rate(pts)
    assert r is not None and r.rate == pytest.approx(10.0)


def test_no_usable_data() -> None:
    assert robust_rate([]) is None
    assert robust_rate([(1.0, 5.0)]) is None
    assert robust_rate([(1.0, 5.0), (2.0, 1.0)]) is None  # only a reset


def test_gauges_and_helpers() -> None:
    assert gauge_mean([(1, 10.0), (2, 20.0), (3, 30.0)]) == pytest.approx(20.0)
    assert gauge_mean([]) is None
    assert mean_of_series([[(1, 10.0)], [(1, 30.0), (2, 30.0), (3, 30.0)]]) == pytest.approx(20.0)
    assert max_of_series([[(1, 10.0)], [(1, 30.0)]]) == pytest.approx(30.0)
    assert since([(1, 1.0), (5, 2.0)], 3) == [(5, 2.0)]
    assert median([3.0, 1.0, 2.0, 4.0]) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        median([])


def test_summarise_joins_pods_and_gpus() -> None:
    runtime = [
        Series(SAMPLES_METRIC, {"pod": "j-worker-0", "namespace": "ns"}, counter(100.0, 60)),
        Series(SAMPLES_METRIC, {"pod": "j-worker-1", "namespace": "ns"}, counter(98.0, 60)),
        Series(SAMPLES_METRIC, {"pod": "j-worker-2", "namespace": "ns"}, counter(101.0, 60)),
    ]
    dcgm = []
    for pod in ("j-worker-0", "j-worker-1", "j-worker-2"):
        for gpu in ("0", "1"):
            labels = {"pod": pod, "namespace": "ns", "gpu": gpu, "UUID": f"GPU-{pod}-{gpu}", "Hostname": pod}
            util = 40.0 if gpu == "0" else 60.0
            dcgm.append(Series(GPU_UTIL, labels, [(1000.0 + i, util) for i in range(60)]))
            dcgm.append(Series(TENSOR_ACTIVE, labels, [(1000.0 + i, 0.3) for i in range(60)]))
            used = 38000.0 if pod == "j-worker-2" and gpu == "1" else 20000.0
            dcgm.append(Series(FB_USED, labels, [(1000.0 + i, used) for i in range(60)]))
            dcgm.append(Series(FB_FREE, labels, [(1000.0 + i, 40960.0 - used) for i in range(60)]))
    m = summarise(runtime, dcgm, start=0.0, rate_window_s=10)
    assert m.throughput == pytest.approx(100.0)  # the median pod, not the sum: every worker counts global samples
    assert m.gpus == 6 and len(m.pods) == 3
    assert m.gpu_util == pytest.approx(50.0)
    assert m.tensor_active == pytest.approx(0.3)
    assert m.memory_used_fraction == pytest.approx(38000 / 40960)
    assert m.memory_used_gb == pytest.approx(38000 * 1024 * 1024 / 1e9)
    assert m.interconnect_gbs is None
    assert {p.pod: p.gpus for p in m.pods} == {"j-worker-0": 2, "j-worker-1": 2, "j-worker-2": 2}


def test_summarise_ignores_samples_before_start() -> None:
    early = [(1000.0 + i, 10.0 * i) for i in range(30)]  # a previous, slow gang
    late = [(1030.0 + i, 300.0 + 100.0 * i) for i in range(60)]
    m = summarise([Series(SAMPLES_METRIC, {"pod": "j-worker-0"}, early + late)], [], start=1030.0, rate_window_s=10)
    assert m.throughput == pytest.approx(100.0)
