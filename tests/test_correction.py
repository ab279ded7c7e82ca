"""Early correction (gpuscaler.planner.correction): measurement, posterior factor, the re-plan verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscaler.planner.correction import (
    MEASURED_LOG_SIGMA_FLOOR,
    CorrectionConfig,
    PlanOption,
    ProgressPoint,
    correct,
    fallback_for,
    measure,
    posterior,
    remaining_miss_probability,
    should_replan,
)

CFG = CorrectionConfig(warmup_s=30, min_window_s=120, min_points=3)


def series(rate: float, seconds: float, every: float = 10.0, start: float = 0.0, offset: float = 0.0,
           noise: float = 0.0, seed: int = 0) -> list[ProgressPoint]:
    rng = np.random.default_rng(seed)
    ts = np.arange(start, start + seconds + 1e-9, every)
    jitter = rng.normal(0, noise, len(ts)) if noise else np.zeros(len(ts))
    return [ProgressPoint(float(t), offset + rate * float(t - start) + float(j)) for t, j in zip(ts, jitter, strict=True)]


def test_measure_leaves_out_the_warm_up_and_restarts() -> None:
    pts = series(500.0, 60) + series(70.0, 300, start=100, offset=10_000)
    # a restart from a checkpoint: the counter falls back to an earlier count
    pts += series(70.0, 100, start=410, offset=9_000)
    m = measure(pts, since=100.0, warmup_s=0.0)
    assert m is not None and m.rate == pytest.approx(70.0, rel=1e-9)
    assert m.resets == 1 and m.seconds == pytest.approx(400.0)
    assert measure(pts[:1], since=0.0) is None


def test_correction_waits_for_the_window_then_believes_the_measurement() -> None:
    model = 100.0
    early = correct(series(70.0, 100), gpu_type="A10G", predicted=model, running_since=0.0,
                    prior_log_sigma=0.2, config=CFG)
    assert not early.ready and early.factor == 1.0 and "measuring" in early.reason
    c = correct(series(70.0, 600), gpu_type="A10G", predicted=model, running_since=0.0,
                prior_log_sigma=0.2, config=CFG)
    assert c.ready and c.observed == pytest.approx(70.0)
    # the posterior leans on the measurement (sigma 0.05) far more than on the model's prior (0.2)
    assert 0.70 < c.factor < 0.73 and c.throughput == pytest.approx(model * c.factor)
    assert c.log_sigma < MEASURED_LOG_SIGMA_FLOOR < 0.2
    # a plan made with factor 0.7 that then runs at 70/s is not corrected twice
    again = correct(series(70.0, 600), gpu_type="A10G", predicted=70.0, running_since=0.0,
                    prior_log_sigma=0.2, plan_factor=0.7, config=CFG)
    assert again.factor == pytest.approx(0.7, rel=1e-9)


def test_an_implausible_measurement_corrects_nothing() -> None:
    c = correct(series(800.0, 600), gpu_type="T4", predicted=100.0, running_since=0.0, prior_log_sigma=0.3, config=CFG)
    assert not c.ready and c.factor == 1.0 and "outside" in c.reason


def test_a_noisier_measurement_is_less_sure() -> None:
    steady = correct(series(70.0, 600), gpu_type="L4", predicted=100.0, running_since=0.0,
                     prior_log_sigma=0.3, config=CFG)
    noisy = correct(series(70.0, 600, noise=250.0, seed=3), gpu_type="L4", predicted=100.0, running_since=0.0,
                    prior_log_sigma=0.3, config=CFG)
    assert noisy.ready and noisy.log_sigma > steady.log_sigma


def test_posterior_is_the_precision_weighted_mean_in_log_space() -> None:
    f, s = posterior(1.0, 0.2, 0.5, 0.2)
    assert f == pytest.approx(math.sqrt(0.5)) and s == pytest.approx(0.2 / math.sqrt(2))


def test_remaining_risk_rises_when_the_job_is_slower() -> None:
    # 30 h of work left at the prediction, 36 h to the deadline
    samples = 100.0 * 3600 * 30
    on_time = remaining_miss_probability(samples, 100.0, 0.05, 36.0)
    late = remaining_miss_probability(samples, 70.0, 0.05, 36.0)
    assert on_time < 0.01 and late > 0.99
    assert remaining_miss_probability(samples, 70.0, 0.05, None) == 0.0


A = PlanOption(("g5.xlarge", 1, "spot", "amp"), "1 x g5.xlarge", 1.0, 10.0, 10.0)
B = PlanOption(("g6.xlarge", 1, "spot", "amp"), "1 x g6.xlarge", 0.8, 9.5, 12.0)


def test_should_replan_when_the_deadline_is_at_risk_even_if_not_cheaper() -> None:
    d = should_replan(0.4, 0.05, A, B, CorrectionConfig(restart_s=300, margin=0.10))
    assert d.replan and "P(miss deadline) 40.0% > maxDeadlineRisk 5.0%" in d.reason
    assert d.urgent  # for the deadline: from a checkpoint asked for at once
    # at risk, but the corrected planner has nothing better: stay
    d = should_replan(0.4, 0.05, A, A, CorrectionConfig(restart_s=300, margin=0.10))
    assert not d.replan and "still finds" in d.reason
    # within the risk: only a saving beyond the margin moves the job (B saves 5% - restart)
    d = should_replan(0.01, 0.05, A, B, CorrectionConfig(restart_s=300, margin=0.10))
    assert not d.replan and "margin" in d.reason


def test_only_a_move_for_the_deadline_is_urgent() -> None:
    """A move for the deadline does not wait for the next periodic checkpoint (``urgent``), whether to the
    corrected planner's choice or, with nothing meeting the risk, to the contingency's fallback; a move for
    cost does (nothing is lost by waiting)."""
    cfg = CorrectionConfig(restart_s=300, margin=0.10)
    to_fallback = should_replan(0.4, 0.05, A, None, cfg, fallback=B)
    assert to_fallback.replan and to_fallback.fallback and to_fallback.urgent
    cheap = PlanOption(("g6.xlarge", 1, "spot", "amp"), "1 x g6.xlarge", 0.5, 5.0, 9.5)
    for_cost = should_replan(0.01, 0.05, A, cheap, cfg)
    assert for_cost.replan and not for_cost.urgent, for_cost
    stay = should_replan(0.01, 0.05, A, A, cfg)
    assert not stay.replan and not stay.urgent


def test_a_job_on_the_fallback_moves_to_its_alternate_only_when_that_is_sooner() -> None:
    """``fallback_for``: the planner's fallback, unless the job runs it; then the fallback's alternate (the
    fastest plan on another GPU type), once the corrected model puts it sooner than the running plan."""
    from types import SimpleNamespace

    running = SimpleNamespace(name="a100", expected_hours=6.0)
    other = SimpleNamespace(name="v100", expected_hours=5.0)
    on_it = lambda c: c is running  # noqa: E731
    assert fallback_for(other, None, on_it) is other  # not on the fallback: go there
    assert fallback_for(running, other, on_it) is other  # on it, and the alternate is now sooner
    assert fallback_for(running, SimpleNamespace(name="v100", expected_hours=6.5), on_it) is None  # slower: stay
    assert fallback_for(running, None, on_it) is None
    assert fallback_for(None, other, on_it) is None
