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
* Deadline risk, with the performance model's own error: the true throughput is the predicted
  one times ``f``, ``ln f ~ N(0, s^2)`` (``s`` is the candidate's throughput band,
  :mod:`gpuscaler.perfmodel.uncertainty`), so the interruption-free time is
  ``T0(f) = W (1 + C / tau) / f + startup``. Each interruption costs ``R + tau`` at worst, and
  ``N ~ Poisson(Lambda T0)``. The job misses the deadline ``D`` when ``T0(f) + N (R + tau) > D``::

      P(miss) = sum_n P(N = n) P(f < W' / (D - startup - n (R + tau)))
              = sum_n P(N = n) Phi(ln(W' / S_n) / s)            (S_n <= 0: the term is P(N = n))

  with ``W' = W (1 + C / tau)``. ``s = 0`` gives back the interruption-only risk
  ``P(N > floor((D - T0) / (R + tau)))``. The Poisson terms are summed in log space from nine
  standard deviations below the mean, so a mean of thousands of interruptions (where ``exp(-mean)``
  underflows to 0 past 745) still gives the right answer.
* P50/P90: the expected hours at the band's P50 and P10 throughput (the slow end makes the long
  time), interruptions at their expectation; cost is hours x the plan's price.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gpuscaler.perfmodel.uncertainty import Z90

SPOT_EXPOSURE_HOURS = 24.0
"""Hours over which a Spot Advisor bucket's interruption share is read as a probability (assumption:
a typical spot instance lifetime; see the module docstring)."""
BUCKET_MONTHLY_RATE = {0: 0.025, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
"""Midpoint of each Spot Advisor bucket (<5%, 5-10%, 10-15%, 15-20%, >20%: 25% assumed for the open bucket)."""


def over_risk(miss_probability: float, max_deadline_risk: float) -> bool:
    """Whether a plan's P(miss deadline) breaks the job's ``maxDeadlineRisk``: the one place the test is
    written (the planner's feasibility, its infeasibility analysis, the correction's re-plan, the
    observers of the operator and the simulator)."""
    return miss_probability > max_deadline_risk


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


POISSON_SPAN_SIGMAS = 12.0
"""Poisson terms more than this many standard deviations above the mean are left out (their mass is
below 1e-30)."""
POISSON_START_SIGMAS = 9.0
"""Poisson terms more than this many standard deviations below the mean are left out: by the Chernoff
bound ``P(N <= mean - t) <= exp(-t^2 / (2 mean))`` their mass is below ``exp(-40.5) = 2.6e-18``."""
NEGLIGIBLE_Z = 6.5
"""``g(n) = erfc(z) / 2`` is below 2e-20 for ``z`` above this: such a term adds its Poisson mass to
what is summed but nothing to the risk, so its logarithm and ``erfc`` are not computed."""
POISSON_TAIL = 1e-7
"""Poisson mass left unsummed (counted as a miss, so the risk is never understated by more)."""
DIRECT_POISSON_MEAN = 50.0
"""Up to this mean the Poisson terms start at ``exp(-mean)``; above it, in log space."""


def _poisson_start(mean: float) -> tuple[int, float]:
    """The first Poisson term worth summing: (n0, P(N = n0))."""
    if mean <= DIRECT_POISSON_MEAN:
        return 0, math.exp(-mean)
    n0 = max(0, math.floor(mean - POISSON_START_SIGMAS * math.sqrt(mean)))
    return n0, math.exp(-mean + n0 * math.log(mean) - math.lgamma(n0 + 1))


def poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean), accurate for any mean (no underflow past 745)."""
    if k < 0:
        return 0.0
    if mean <= 0:
        return 1.0
    if k > mean + POISSON_SPAN_SIGMAS * math.sqrt(mean) + 20:
        return 1.0
    n, term = _poisson_start(mean)
    total = 0.0
    while n <= k:
        total += term
        n += 1
        term *= mean / n
    return min(1.0, total)


def deadline_miss_probability(
    work_eff_h: float, fixed_h: float, rate_per_h: float, base_h: float, worst_each_h: float,
    deadline_h: float, log_sigma: float = 0.0,
) -> float:
    """P(miss deadline) with interruptions and model error (see the module docstring).

    Args:
        work_eff_h: ``W (1 + C / tau)``: training plus checkpoint writes at the predicted speed.
        fixed_h: Hours that do not scale with throughput (start-up).
        rate_per_h: Interruptions per hour of the whole allocation (0 on-demand).
        base_h: Interruption-free hours at the predicted speed (sets the Poisson mean).
        worst_each_h: Hours one interruption costs at worst (restart + one interval).
        deadline_h: Hours to the deadline.
        log_sigma: The throughput band's log-space sigma (0: the model taken as exact).

    Returns:
        The probability, in [0, 1].
    """
    mean = rate_per_h * base_h if rate_per_h > 0 else 0.0
    inv = 1.0 / (log_sigma * math.sqrt(2.0)) if log_sigma > 0 else 0.0
    # g(n) = P(miss | n interruptions) = P(f < W' / room_n), ln f ~ N(0, s^2); it grows with n
    if mean <= 0:
        room = deadline_h - fixed_h
        if room <= 0:
            return 1.0
        if inv == 0.0:
            return 1.0 if work_eff_h > room else 0.0
        return 0.5 * math.erfc(math.log(room / work_eff_h) * inv) if work_eff_h > 0 else 0.0
    last = mean + POISSON_SPAN_SIGMAS * math.sqrt(mean) + 20
    n, term = _poisson_start(mean)
    total = covered = 0.0
    room0 = deadline_h - fixed_h
    # Below n_safe g(n) is negligible (exactly 0 when s = 0): only the mass is summed.
    n_safe = -math.inf
    if work_eff_h > 0 and worst_each_h > 0:
        edge = work_eff_h if inv == 0.0 else work_eff_h * math.exp(min(700.0, NEGLIGIBLE_Z / inv))
        n_safe = (room0 - edge) / worst_each_h
    while n < n_safe and n <= last:
        covered += term
        if covered >= 1.0 - POISSON_TAIL and n >= mean:
            return min(1.0, max(0.0, 1.0 - covered))
        n += 1
        term *= mean / n
    while n <= last:
        room = room0 - n * worst_each_h
        if room <= 0:  # this many interruptions miss whatever the speed: so do all the more
            return min(1.0, total + max(0.0, 1.0 - covered))
        if inv == 0.0:
            g = 1.0 if work_eff_h > room else 0.0
        else:
            g = 0.5 * math.erfc(math.log(room / work_eff_h) * inv) if work_eff_h > 0 else 0.0
        total += term * g
        covered += term
        if g == 1.0 or (covered >= 1.0 - POISSON_TAIL and n >= mean):
            # g(n) grows with n: once it is 1 every later term is a miss, and the rest is that mass
            return min(1.0, total + max(0.0, 1.0 - covered))
        n += 1
        term *= mean / n
    return min(1.0, total)


class RunOutlook(NamedTuple):
    """Expected time and risk of running ``work_h`` hours of training with checkpoints.

    A named tuple, not a frozen dataclass: the planner makes one per candidate (a thousand per
    plan), and a frozen dataclass takes 5x as long to build (1.7 us against 0.4 us here).
    """

    expected_hours: float
    """At the predicted (P50) throughput, interruptions at their expectation."""
    base_hours: float
    """Hours with no interruption (work plus checkpoint writes plus start-up)."""
    interval_s: float
    interruptions: float
    """Expected number of interruptions."""
    deadline_miss_probability: float
    """Interruptions and the model's error together (see the module docstring)."""
    lost_work_hours: float
    """Expected work redone after interruptions."""
    p90_hours: float = 0.0
    """Expected hours at the band's P10 throughput: 9 in 10 runs finish sooner for model error."""
    log_sigma: float = 0.0
    """The throughput band's sigma the risk was computed with."""


def outlook(
    work_h: float,
    rate_per_h: float,
    write_s: float,
    restart_s: float,
    startup_s: float,
    interval_s: float,
    deadline_h: float | None,
    log_sigma: float = 0.0,
) -> RunOutlook:
    """Expected hours (P50, P90) and deadline-miss probability for one plan.

    Args:
        work_h: Training hours at the predicted throughput.
        rate_per_h: Interruptions per hour of the allocation (0 on-demand).
        write_s: Seconds per checkpoint write.
        restart_s: Seconds to restart after an interruption.
        startup_s: Seconds before the first step.
        interval_s: Seconds of training between checkpoints.
        deadline_h: Hours to the deadline (None: none).
        log_sigma: The throughput band's log-space sigma (0: the prediction taken as exact).

    Returns:
        The outlook.
    """
    work_eff = work_h * (1.0 + write_s / interval_s)
    fixed = startup_s / 3600.0
    base = work_eff + fixed
    per_interruption_h = (restart_s + interval_s / 2.0) / 3600.0
    # Interruptions over the run, solving T = base + Lambda T x per_interruption.
    denom = 1.0 - rate_per_h * per_interruption_h
    stretch = 1.0 / denom if denom > 0.05 else 20.0
    expected = base * stretch
    p90 = (work_eff * math.exp(Z90 * log_sigma) + fixed) * stretch
    interruptions = rate_per_h * expected
    miss = 0.0
    if deadline_h is not None:
        worst_each = (restart_s + interval_s) / 3600.0
        miss = deadline_miss_probability(work_eff, fixed, rate_per_h, base, worst_each, deadline_h, log_sigma)
    return RunOutlook(
        expected, base, interval_s, interruptions, max(0.0, miss), interruptions * interval_s / 7200.0,
        p90, log_sigma,
    )
