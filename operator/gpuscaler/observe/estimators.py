"""Pure estimators over Prometheus samples: counter rates that survive resets, gaps and noise.

Called by :mod:`gpuscaler.observe.prometheus` on the raw samples of a range selector
(``metric[10m]`` returns every scraped sample, unlike ``query_range``, which resamples), and by the
unit tests. No I/O, no clock: every function takes ``(unix seconds, value)`` points.

Why not PromQL's ``rate()``: ``rate`` treats every drop as a reset to zero and adds the new value,
so a runtime that resumes from a checkpoint (its samples counter restarts at the checkpoint's
count, not at 0) shows a spike of a whole run's samples; and one slow scrape window moves the
average. Here an interval with a drop is left out, an interval longer than a few scrape intervals
(a gap: the pod was gone, Prometheus was down) is left out, and the rate is the median of the
rates of several consecutive windows, so one noisy window does not move it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Point = tuple[float, float]
"""``(unix seconds, value)``, as Prometheus returns it."""

GAP_FACTOR = 5.0
"""An interval longer than this many typical scrape intervals is a gap and is left out. Five
tolerates a missed scrape or two (Prometheus marks series stale after 5 minutes anyway)."""
MIN_WINDOWS = 3
"""Fewest windows a median is taken over; with fewer the rate is the plain ratio over all intervals."""


@dataclass(frozen=True)
class Interval:
    """Two consecutive samples of a counter whose increase is usable."""

    start: float
    end: float
    increase: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class RateEstimate:
    """A counter's rate with how it was obtained."""

    rate: float
    """Per second: the median of the window rates (or the overall ratio with few windows)."""
    mean_rate: float
    """Total increase / total usable seconds (what ``rate()`` would say without resets and gaps)."""
    windows: int
    """Windows the median was taken over (1 = plain ratio)."""
    seconds: float
    """Usable seconds covered."""
    resets: int
    """Intervals left out because the counter went down."""
    gaps: int
    """Intervals left out because they were too long."""
    spread: float
    """Median absolute deviation of the window rates, relative to the rate (0 = steady)."""


def median(values: Sequence[float]) -> float:
    """The median; raises ValueError on an empty sequence."""
    if not values:
        raise ValueError("median of no values")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def clean(points: Iterable[Point]) -> list[Point]:
    """Sorted by time, one point per timestamp (the last), NaN and infinite values dropped."""
    by_time: dict[float, float] = {}
    for t, v in points:
        if math.isfinite(t) and math.isfinite(v):
            by_time[float(t)] = float(v)
    return sorted(by_time.items())


def typical_step(points: Sequence[Point]) -> float | None:
    """The median time between consecutive points (the scrape interval), None with fewer than 2."""
    if len(points) < 2:
        return None
    return median([b[0] - a[0] for a, b in itertools.pairwise(points)])


def intervals(points: Iterable[Point], max_gap_s: float | None = None) -> tuple[list[Interval], int, int]:
    """Usable intervals of a counter, with the number left out for resets and for gaps.

    Args:
        points: the counter's samples, in any order.
        max_gap_s: longest usable interval; :data:`GAP_FACTOR` x the typical step when None.

    Returns:
        (intervals, resets, gaps).
    """
    pts = clean(points)
    step = typical_step(pts)
    if step is None:
        return [], 0, 0
    limit = max_gap_s if max_gap_s is not None else GAP_FACTOR * step
    out: list[Interval] = []
    resets = gaps = 0
    for (t0, v0), (t1, v1) in itertools.pairwise(pts):
        if v1 < v0:
            resets += 1
        elif t1 - t0 > limit:
            gaps += 1
        else:
            out.append(Interval(t0, t1, v1 - v0))
    return out, resets, gaps


def robust_rate(
    points: Iterable[Point], window_s: float | None = None, max_gap_s: float | None = None
) -> RateEstimate | None:
    """The per-second rate of a counter, robust to resets, gaps and noise.

    The usable intervals are cut, in time order, into consecutive windows of about ``window_s``
    usable seconds; the rate is the median of the windows' rates. With fewer than
    :data:`MIN_WINDOWS` windows it is the total increase over the total usable time.

    Args:
        points: the counter's samples (``(unix seconds, value)``), in any order.
        window_s: usable seconds per window; a fifth of the covered time when None.
        max_gap_s: longest usable interval (see :func:`intervals`).

    Returns:
        The estimate, or None when no usable interval remains.
    """
    ivs, resets, gaps = intervals(points, max_gap_s)
    covered = sum(i.seconds for i in ivs)
    if not ivs or covered <= 0:
        return None
    total = sum(i.increase for i in ivs)
    mean = total / covered
    width = window_s if window_s and window_s > 0 else covered / 5
    rates: list[float] = []
    inc = secs = 0.0
    for i in ivs:
        inc += i.increase
        secs += i.seconds
        if secs >= width * (1 - 1e-9):
            rates.append(inc / secs)
            inc = secs = 0.0
    if secs >= width / 2:  # a tail of at least half a window counts; a shorter one is dropped
        rates.append(inc / secs)
    if len(rates) < MIN_WINDOWS:
        return RateEstimate(mean, mean, 1, covered, resets, gaps, 0.0)
    rate = median(rates)
    mad = median([abs(r - rate) for r in rates])
    return RateEstimate(rate, mean, len(rates), covered, resets, gaps, mad / rate if rate > 0 else 0.0)


def gauge_mean(points: Iterable[Point]) -> float | None:
    """The mean of a gauge's samples (scrapes are evenly spaced, so this is the time average)."""
    values = [v for _, v in clean(points)]
    return sum(values) / len(values) if values else None


def mean_of_series(series: Iterable[Iterable[Point]]) -> float | None:
    """The mean over series (one per GPU) of each series' mean: every GPU weighs the same,
    however many samples it has."""
    means = [m for m in (gauge_mean(s) for s in series) if m is not None]
    return sum(means) / len(means) if means else None


def max_of_series(series: Iterable[Iterable[Point]]) -> float | None:
    """The largest per-series mean (the fullest GPU, for memory)."""
    means = [m for m in (gauge_mean(s) for s in series) if m is not None]
    return max(means) if means else None


def since(points: Iterable[Point], start: float) -> list[Point]:
    """The points at or after ``start`` (drops what an earlier gang or a warm-up reported)."""
    return [(t, v) for t, v in points if t >= start]
