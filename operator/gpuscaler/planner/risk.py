"""Spot risk: interruption rates, the optimal checkpoint interval, expected time, cost and deadline risk.

Pure maths used by the planner (and the simulator):

* AWS Spot Advisor buckets give the share of instances interrupted over the trailing month. Spot
  instances rarely live a whole month, so reading the share as a monthly hazard (``/ 730 h``)
  would make a reclaim look 30x rarer than GPU users see it. gpuscaler reads the bucket's midpoint
  ``p`` as the chance that an instance is reclaimed within a typical spot lifetime of
  ``SPOT_EXPOSURE_HOURS`` (24 h, an assumption on the cautious side for deadlines):
  ``lambda = -ln(1 - p) / 24`` per node-hour, and a job on ``M`` nodes is interrupted at
  ``Lambda = M x lambda``.
* Young/Daly optimal checkpoint interval ``tau = sqrt(2 C / Lambda)`` for checkpoint write time
  ``C`` (Daly 2006, "A higher order estimate of the optimum checkpoint interval"), clamped to the
  policy's bounds.
* Expected wall time for ``W`` hours of work: ``W (1 + C / tau)`` plus, per interruption, the
  restart time ``R`` and on average half an interval of lost work; interruptions are Poisson with
  mean ``Lambda x T``.
* Deadline risk: the probability that more interruptions happen than the slack absorbs, each
  costing ``R + tau`` at worst: ``P(N > floor((D - T0) / (R + tau)))`` with ``N ~ Poisson(Lambda T0)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SPOT_EXPOSURE_HOURS = 24.0
"""Hours over which a Spot Advisor bucket's interruption share is read as a probability (assumption:
a typical spot instance lifetime; see the module docstring)."""
BUCKET_MONTHLY_RATE = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
"""Midpoint of each Spot Advisor bucket (<5%, 5-10%, 10-15%, 15-20%, >20%: 25% assumed for the open bucket)."""


def hourly_rate(bucket: int | None) -> float:
    """Per-node interruptions per hour for a Spot Advisor bucket (bucket 2 when unknown)."""
    p = BUCKET_MONTHLY_RATE.get(2 if bucket is None else bucket, 0.25)
    return -math.log(1.0 - p) / SPOT_EXPOSURE_HOURS


def optimal_interval_s(write_s: float, rate_per_h: float, lo_s: float, hi_s: float) -> float:
    """Young/Daly interval in seconds, clamped to [lo_s, hi_s]; hi_s when there are no interruptions."""
    if rate_per_h <= 0:
        return hi_s
    tau = math.sqrt(2.0 * write_s * 3600.0 / rate_per_h)
    return min(hi_s, max(lo_s, tau))


def poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean)."""
    if k < 0:
        return 0.0
    if mean <= 0:
        return 1.0
    term = math.exp(-mean)
    total = term
    for i in range(1, k + 1):
        term *= mean / i
        total += term
        if term < 1e-16 and i > mean:
            break
    return min(1.0, total)


@dataclass(frozen=True, slots=True)
class RunOutlook:
    """Expected time and risk of running ``work_h`` hours of training with checkpoints."""

    expected_hours: float
    base_hours: float
    """Hours with no interruption (work plus checkpoint writes plus start-up)."""
    interval_s: float
    interruptions: float
    """Expected number of interruptions."""
    deadline_miss_probability: float
    lost_work_hours: float
    """Expected work redone after interruptions."""


def outlook(
    work_h: float,
    rate_per_h: float,
    write_s: float,
    restart_s: float,
    startup_s: float,
    interval_s: float,
    deadline_h: float | None,
) -> RunOutlook:
    """Expected hours and deadline-miss probability for one plan."""
    base = work_h * (1.0 + write_s / interval_s) + startup_s / 3600.0
    per_interruption_h = (restart_s + interval_s / 2.0) / 3600.0
    # Interruptions over the run, solving T = base + Lambda T x per_interruption.
    denom = 1.0 - rate_per_h * per_interruption_h
    expected = base / denom if denom > 0.05 else base * 20.0
    interruptions = rate_per_h * expected
    miss = 0.0
    if deadline_h is not None:
        if base > deadline_h:
            miss = 1.0
        elif rate_per_h > 0:
            worst_each = (restart_s + interval_s) / 3600.0
            allowed = math.floor((deadline_h - base) / worst_each)
            miss = 1.0 - poisson_cdf(allowed, rate_per_h * base)
    return RunOutlook(
        expected, base, interval_s, interruptions, max(0.0, miss), interruptions * interval_s / 7200.0
    )
