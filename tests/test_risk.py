"""Deadline risk with interruptions and model error; the Poisson sum at thousands of interruptions."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
from scipy import stats

from gpuscaler.planner.risk import deadline_miss_probability, outlook, poisson_cdf


@pytest.mark.parametrize(("k", "mean"), [(0, 1.0), (3, 0.5), (740, 745.0), (760, 800.0), (5100, 5000.0),
                                         (40, 60.0), (100000, 100000.0)])
def test_poisson_cdf_matches_scipy_at_any_mean(k: int, mean: float) -> None:
    assert poisson_cdf(k, mean) == pytest.approx(float(stats.poisson.cdf(k, mean)), abs=1e-9)


def test_thousands_of_interruptions_with_ample_slack_do_not_miss() -> None:
    # 1,000 expected interruptions of 0.01 h each on a 10 h job, 40 h of slack: the old sum
    # (exp(-mean) underflows past 745) said P(miss) = 100%.
    o = outlook(10.0, 100.0, 0.0, 18.0, 0.0, 18.0, 50.0)
    assert o.interruptions > 745
    assert o.deadline_miss_probability < 1e-6
    # and a deadline it cannot make is still a certain miss
    assert outlook(10.0, 100.0, 0.0, 18.0, 0.0, 18.0, 15.0).deadline_miss_probability == pytest.approx(1.0)


def test_without_model_error_it_is_the_interruption_count_risk() -> None:
    work, rate, write, restart, interval, deadline = 10.0, 0.3, 30.0, 300.0, 1800.0, 14.0
    o = outlook(work, rate, write, restart, 180.0, interval, deadline)
    base = work * (1 + write / interval) + 180.0 / 3600
    allowed = math.floor((deadline - base) / ((restart + interval) / 3600))
    assert o.deadline_miss_probability == pytest.approx(1 - float(stats.poisson.cdf(allowed, rate * base)), abs=1e-12)


def test_on_demand_risk_is_the_lognormal_tail() -> None:
    s = 0.2
    o = outlook(10.0, 0.0, 0.0, 300.0, 0.0, 1800.0, 12.0, log_sigma=s)
    # misses when the true speed is below 10/12 of the prediction
    assert o.deadline_miss_probability == pytest.approx(statistics.NormalDist(0, s).cdf(math.log(10 / 12)), rel=1e-9)
    assert o.p90_hours == pytest.approx(10.0 * math.exp(1.2815515655 * s), rel=1e-6)


def test_risk_is_monotone_in_slack_and_in_model_error() -> None:
    deadlines = np.linspace(10.5, 30.0, 40)
    for sigma in (0.0, 0.1, 0.3):
        miss = [outlook(10.0, 0.5, 30.0, 300.0, 180.0, 1800.0, float(d), sigma).deadline_miss_probability
                for d in deadlines]
        assert all(b <= a + 1e-12 for a, b in itertools.pairwise(miss)), (sigma, miss)
    # more model error, more risk, for a plan that meets its deadline more often than not (any plan
    # the planner may choose: maxDeadlineRisk < 1/2); past 1/2, a wider band also brings the chance
    # of being faster, and the risk falls towards 1/2
    for deadline in (11.0, 12.0, 15.0, 20.0):
        miss = [outlook(10.0, 0.05, 30.0, 300.0, 180.0, 1800.0, deadline, s).deadline_miss_probability
                for s in (0.0, 0.05, 0.1, 0.2, 0.4)]
        assert miss[0] < 0.5
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(miss)), (deadline, miss)
        assert miss[-1] > miss[0]


def test_risk_matches_a_monte_carlo_of_the_same_world() -> None:
    # Independent check of the formula: draw the true speed and the interruption count.
    rng = np.random.default_rng(7)
    work_eff, fixed, rate, worst, deadline, sigma = 8.0, 0.05, 0.6, 0.55, 11.0, 0.15
    n = 400_000
    f = np.exp(rng.normal(0, sigma, n))
    base = work_eff + fixed
    interruptions = rng.poisson(rate * base, n)
    simulated = float(np.mean(work_eff / f + fixed + interruptions * worst > deadline))
    assert deadline_miss_probability(work_eff, fixed, rate, base, worst, deadline, sigma) == pytest.approx(
        simulated, abs=0.003
    )


def full_sum(work_eff: float, fixed: float, rate: float, base: float, worst: float, deadline: float,
             sigma: float) -> float:
    """The formula summed over every Poisson term scipy gives mass to, with no shortcut."""
    mean = rate * base
    n = np.arange(0, int(mean + 40 * math.sqrt(mean) + 60))
    room = deadline - fixed - n * worst
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(room > 0, stats.norm.cdf(np.log(work_eff / np.where(room > 0, room, 1.0)) / sigma), 1.0)
    return float(np.sum(stats.poisson.pmf(n, mean) * g))


@pytest.mark.parametrize(
    ("work_eff", "rate", "worst", "deadline", "sigma"),
    [
        (10.0, 0.02, 0.55, 11.0, 0.15),  # under one interruption expected: the near-zero terms skipped
        (10.0, 0.02, 0.55, 30.0, 0.05),  # ample slack: every term's miss negligible
        (8.0, 0.6, 0.55, 11.0, 0.15),  # a few interruptions, the risk in between
        (8.0, 0.6, 0.55, 8.5, 0.02),  # tight: g reaches 1 after a few terms
        (40.0, 2.0, 0.1, 60.0, 0.1),  # 80 interruptions: the log-space start below the mean
        (40.0, 2.0, 0.1, 52.0, 0.1),
        (100.0, 30.0, 0.005, 130.0, 0.3),  # 3,000 interruptions
    ],
)
def test_the_shortcuts_of_the_sum_change_no_figure(work_eff: float, rate: float, worst: float, deadline: float,
                                                  sigma: float) -> None:
    # deadline_miss_probability skips the terms whose miss is negligible and stops once every later
    # term is a miss; both must leave the answer where the full sum has it
    fixed = 0.05
    base = work_eff + fixed
    got = deadline_miss_probability(work_eff, fixed, rate, base, worst, deadline, sigma)
    assert got == pytest.approx(full_sum(work_eff, fixed, rate, base, worst, deadline, sigma), abs=2e-7)
