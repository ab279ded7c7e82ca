"""Deadline risk with recourse: what the operator does when a plan turns out slow, and what that is worth.

A plan's static P(miss) (:mod:`gpuscaler.planner.risk`) counts the model's error band as if the job
could never learn its real speed. It can: the operator measures the running gang's throughput
(:mod:`gpuscaler.planner.correction`), and a job found behind asks its workers for a checkpoint (the
spot handshake's request) and moves, once it is written, to the
*fallback* (:func:`fallback`: the fastest on-demand plan costing at most
:data:`FALLBACK_COST_FACTOR` x the cheapest, the rule the operator's recovery uses when a deadline
cannot be met; or at most :data:`WIDER_FALLBACK_COST_FACTOR` x where that lets a cheaper plan meet
the job, :func:`with_fallback`). A job already on the fallback moves to its *alternate*: the fastest plan on another
GPU type within :data:`ALTERNATE_COST_FACTOR` x the cheapest (its measurement corrects its own GPU
type's plans, so that is the corrected planner's fallback then). This module prices that
contingency for one plan (:meth:`Recourse.of`); the planner attaches it to every plan it evaluates,
so a plan's P(miss) and cost include it.

Timeline of plan ``c`` (hours from the plan's start; defaults from :class:`RecourseTiming`, the
operator's shipped settings):

```
t_dec = max(startup + warmup + window, min_interval)     the correction is known and a move may come
t_move = t_dec + request + write(c)                      the checkpoint the operator asks for is written
overhead = write(c) + restart + startup                  checkpoint, restart, provisioning of the move
```

The true speed is ``f`` times the prediction, ``ln f ~ N(0, s^2)`` (``s``: the plan's band); the
operator measures ``f_hat = f e^eps``, ``eps ~ N(0, s_obs^2)`` (``s_obs``:
:data:`~gpuscaler.planner.correction.MEASURED_LOG_SIGMA_FLOOR`), and its correction is the posterior
of :func:`gpuscaler.planner.correction.posterior` (prior: the plan's band):
``ln f_post = w ln f_hat``, ``s_post = sqrt(w) s_obs``, ``w = s^2 / (s^2 + s_obs^2)``. It moves when its
corrected P(miss) exceeds ``r`` (``maxDeadlineRisk``). With ``E`` the plan's expected training hours
at the predicted speed (interruptions at their expectation) and ``D`` the deadline:

```
f0  = E / (D - startup)                      the speed at which the plan finishes exactly at D
cut = (ln f0 + s_post z_{1-r}) / w           the operator moves when ln f_hat < cut
X*  = X exp(cut)                             the threshold, items/s (X: the predicted throughput)
P_move = Phi(cut / sqrt(s^2 + s_obs^2))
P_slow = Phi(ln f0 / s)                      the static risk from the speed alone
P_stay = P(ln f < ln f0, ln f + eps >= cut)  slow, yet measured fast enough to stay (slow_and_stays)
P_int  = max(0, P_static - P_slow)           the static risk from interruptions (recourse not counted on)
P_MF   = P(ln f + eps < cut, the fallback misses)       measured slow, moved, and still late (moved_and_misses)
P(miss with recourse) = min(P_static, P_stay + P_int + P_MF)
```

``P_MF`` follows the run through its true speed ``x = ln f``: by the move the plan has done
``d(x) = min(1, (t_move - startup - write) e^x / W)`` of the job (``W``: its training hours at the
predicted speed), and the fallback, started at ``t_move + overhead``, must do the rest, ``W_F (1 - d(x))``
hours at its predicted speed, before ``D``. Its own speed factor is not independent of the plan's: one
model predicted both, so ``ln f_F = rho (s_F / s) x + sqrt(1 - rho^2) s_F z`` with ``rho`` the correlation
of the model's cross-validated errors on two ways to run one code
(:func:`gpuscaler.perfmodel.uncertainty.error_correlation`: 0.94 on the same GPU type and precision,
0.76 across them). A plan measured slow therefore expects its fallback slower too, and a run that was
only a little slow leaves less for the fallback to do. ``P_MF`` is the one-dimensional integral over
``x`` of :func:`moved_and_misses`. The fallback is on-demand (its interruptions are not counted).
Recourse never raises P(miss) above the static figure.

Recourse applies only to a plan the model expects to finish (``f0 < 1``) that would stay where it is
at its predicted speed (``cut < 0``): a plan is not chosen in order to be moved off it. And only when
a move can finish at all: the **slack**, the latest hour a move can start and still finish at the
fallback's predicted speed when the run went at the threshold's speed until then, solves
``m + overhead + W_F (1 - (m - startup - write) min(f*, 1) / W) = D``. A plan whose correction window
``t_move`` is longer than its slack gains nothing (``P = P_static``).

**The fallback itself** moves to its *alternate* ``A`` (:class:`Recourse`'s ``alternate``: the fastest
plan on another GPU type within :data:`ALTERNATE_COST_FACTOR` x the cheapest), the same maths with ``A``
as the target, and only once its corrected speed is below ``A``'s predicted one: the operator's
corrected planner has lowered the running GPU type's plans only, so ``A`` is its fallback from then on
(:func:`gpuscaler.planner.correction.fallback_for`). The trigger is then
``cut = min(cut, ln(W / W_A) / w)``. With no such plan it gains nothing (``P = P_static``).

Expected extra cost of the contingency (added to the plan's expected cost):

```
left = 1 - clamp((t_move - startup) min(f*, 1) / W, 0, 1)      share of the job left at the move
extra = P_move max(0, left cost(F) + overhead price(F) - left cost(c))
```

Callers: :func:`gpuscaler.planner.plan` (every plan, the fallback of the plan's own candidates);
:func:`fallback` is also what the operator's recovery (:func:`gpuscaler.planner.recovery.recover`:
the simulator's gpuscaler strategy and the operator after an interruption or a correction) moves
to when no plan meets the deadline, and what :func:`gpuscaler.planner.correction.should_replan`
moves to when the running plan is behind and nothing meets the risk (the operator's observer and
the simulator's simulated operator): one rule decides where a late job goes, when it is planned
and when it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from gpuscaler.perfmodel.uncertainty import error_correlation
from gpuscaler.planner.correction import MEASURED_LOG_SIGMA_FLOOR, CorrectionConfig

if TYPE_CHECKING:  # the candidate module imports this one for the Contingency type
    from gpuscaler.planner.candidate import Candidate

FALLBACK_COST_FACTOR = 2.0
"""The fallback is the fastest plan costing at most this multiple of the cheapest one (finish as
early as is sensible rather than at any price)."""
WIDER_FALLBACK_COST_FACTOR = 4.0
"""The fallback may reach this multiple of the cheapest plan only where that lets a cheaper plan meet
the job (:func:`with_fallback`). As the one rule (every plan's fallback within 4x) it took the decision
scores' mean regret (:mod:`gpuscaler.planner.decisions`) from 3.0% to 1.8% with no more misses, but every
plan then paid in expectation for a move to a larger, dearer fallback, which turned near-ties the other
way (a job planned into a capacity block went to spot; e2e/test_capacity_block.py). Kept for the cases
where it makes a cheaper plan feasible: since the fallback has its own recourse (:data:`ALTERNATE_COST_FACTOR`)
it changes no decision score, but it still saves 1.9% on the simulator's llm-finetune-burst trace
(``benchmarks/simulator_compare.py``: $3,694 against $3,764 without it)."""
FALLBACK_COST_FACTORS = (FALLBACK_COST_FACTOR, WIDER_FALLBACK_COST_FACTOR)
"""The fallbacks :func:`with_fallback` tries, in order."""
ALTERNATE_COST_FACTOR = WIDER_FALLBACK_COST_FACTOR
"""The fallback's alternate (where a job already on the fallback goes when it measures slow) is the
fastest plan on another GPU type costing at most this multiple of the cheapest: it is paid only when
the fastest sensible plan itself turned out slow."""
NEGLIGIBLE_RISK = 1e-6
"""A static risk below this is kept as it is: recourse could lower it in no printed digit (figures are
printed to 0.01%; a ``maxDeadlineRisk`` below it is met only by plans whose static figure meets it),
and working it out for the hundreds of comfortable plans of a call would double the planning time."""
NEGLIGIBLE_Z = -9.0
"""``Phi(z)`` is below 1e-19 under this: a plan this far from its trigger never moves."""
EXPECTED_MISS = "it is expected to miss the deadline (a plan is not chosen in order to be moved off it)"
ITSELF = "it is the fastest sensible plan itself"
NO_TARGET = "no plan to move to"
MOVES_AS_PLANNED = ("it would move even at its predicted speed (the measurement cannot make its deadline sure enough): "
                    "a plan is not chosen in order to be moved off it")
EXACT = "its throughput is taken as exact (no band): there is nothing to learn"
PASSED = "the deadline has passed"
SQRT2 = math.sqrt(2.0)
MIN_RISK = 1e-6
"""``maxDeadlineRisk`` is read as at least this when the trigger ``z_{1-r}`` is computed (r = 0
would ask the operator to move on any measurement)."""


@dataclass(frozen=True)
class RecourseTiming:
    """When the operator can know a plan's speed and move (its shipped settings, see :mod:`gpuscaler.settings`)."""

    warmup_s: float = CorrectionConfig.warmup_s
    """Seconds after the gang starts before its progress counts (``GPUSCALER_OBSERVE_WARMUP_S``)."""
    window_s: float = CorrectionConfig.min_window_s
    """Seconds of progress a correction needs (``GPUSCALER_CORRECTION_MIN_WINDOW_S``)."""
    min_interval_s: float = 1800.0
    """No move within this many seconds of a plan change (``GPUSCALER_REPLAN_MIN_INTERVAL_S``)."""
    request_s: float = 60.0
    """Seconds from the operator's checkpoint request to the step boundary where the workers start writing
    it (the request reaches them through their pod watch in seconds; a step of up to a minute)."""
    measured_log_sigma: float = MEASURED_LOG_SIGMA_FLOOR
    """How sure a correction is, log-space sigma (the floor: a window of minutes early in a run)."""


TIMING = RecourseTiming()


class Contingency(NamedTuple):
    """What the operator does if plan ``c`` measures slow, and what that does to its risk and cost.

    A named tuple, as :class:`~gpuscaler.planner.candidate.Candidate`: the planner makes one per candidate.
    """

    target: Candidate | None
    """The plan the job moves to (the fallback); None when there is none to move to."""
    decide_h: float
    """Hours from the plan's start when the correction is known and a move may be decided."""
    move_h: float
    """Hours from the plan's start by which the move is made (the checkpoint the operator asks for is written)."""
    slack_h: float
    """The latest hour a move can start and still finish at the fallback's predicted speed."""
    threshold: float
    """Items/s: below this measured throughput the operator moves (``X*``)."""
    move_probability: float
    miss_probability: float
    """P(miss deadline) with the recourse."""
    static_miss_probability: float
    """P(miss deadline) if the job could never move (:mod:`gpuscaler.planner.risk`)."""
    extra_cost_usd: float
    """Expected extra cost of the move (included in the plan's expected cost)."""
    reason: str = ""
    """Why the recourse does not help (empty when it applies)."""

    @property
    def applies(self) -> bool:
        return not self.reason

    def to_dict(self) -> dict[str, object]:
        t = self.target
        return {
            "applies": self.applies,
            "reason": self.reason,
            "decideHours": round(self.decide_h, 3),
            "moveByHours": round(self.move_h, 3),
            "slackHours": round(self.slack_h, 3),
            "thresholdThroughput": round(self.threshold, 3),
            "moveTo": None if t is None else {
                "instanceType": t.instance.name, "nodes": t.nodes, "gpus": t.gpus,
                "capacityType": t.capacity.value, "precision": t.precision.value, "label": t.label,
            },
            "moveProbability": round(self.move_probability, 4),
            "deadlineMissProbability": round(self.miss_probability, 4),
            "staticDeadlineMissProbability": round(self.static_miss_probability, 4),
            "expectedExtraCostUsd": round(self.extra_cost_usd, 2),
        }  # fmt: skip

    def sentence(self, unit: str) -> str:
        """One line for people: ``if the first 30 min measure below X items/s, move to ...``."""
        if not self.applies or self.target is None:
            return f"no contingency: {self.reason}"
        return (
            f"if the first {self.decide_h * 60:.0f} min measure below {self.threshold:,.1f} {unit}/s, move to "
            f"{self.target.label} (by {self.move_h:.1f} h, from a checkpoint asked for then): P(miss) "
            f"{self.miss_probability:.1%} ({self.static_miss_probability:.1%} if it could not move), expected "
            f"extra cost ${self.extra_cost_usd:,.2f} (moves with P {self.move_probability:.0%})"
        )


def fallback(
    cands: Sequence[Candidate], factor: float = FALLBACK_COST_FACTOR, besides: Candidate | None = None
) -> Candidate | None:
    """Where a job that is behind goes: the fastest plan costing at most ``factor`` x the cheapest.

    The one rule for it: the planner's contingencies (over the on-demand plans that fit and keep the
    policy's caps; ``factor`` as :func:`with_fallback` chooses it; the alternate with ``besides``), the
    operator's recovery when no
    plan meets the deadline (:func:`gpuscaler.planner.recovery.recover`, over a deadline-free
    on-demand plan's front) and the correction's re-plan (:func:`gpuscaler.planner.correction.should_replan`,
    the corrected planner's fallback).

    Args:
        cands: the plans to choose from (any order; a Pareto front gives the same answer as all plans).
        factor: the most the fallback may cost, as a multiple of the cheapest plan's expected cost.
        besides: leave out the plans on this plan's GPU type: where a job already on the fallback goes
            when it measures slow (the fallback's *alternate*, :class:`Recourse`). Its measurement corrects
            the plans of its own GPU type, not the others', so the corrected planner's fallback is then the
            fastest plan on another type.

    Returns:
        The plan, or None when ``cands`` is empty (or has no plan on another GPU type than ``besides``).
    """
    if not cands:
        return None
    cheapest = min(c.expected_cost_usd for c in cands)
    gpu = None if besides is None else besides.instance.gpu_id
    ok = [c for c in cands if c.expected_cost_usd <= factor * cheapest and c.instance.gpu_id != gpu]
    if not ok:
        return None
    return min(ok, key=lambda c: (c.expected_hours, c.expected_cost_usd))


def with_fallback(
    cands: Sequence[Candidate],
    target_at: Callable[[float], Candidate | None],
    attach: Callable[[Candidate | None], list[Candidate]],
    feasible: Callable[[Candidate], bool],
) -> tuple[list[Candidate], Candidate | None]:
    """Every plan with its contingency, and the fallback they share: the fastest plan within
    :data:`FALLBACK_COST_FACTOR` x the cheapest, or within :data:`WIDER_FALLBACK_COST_FACTOR` x where
    that lets a cheaper plan meet the job.

    Rule: for each factor of :data:`FALLBACK_COST_FACTORS` in turn, the fallback ``F = target_at(factor)``
    and every plan with recourse to it (``attach(F)``); keep the first whose cheapest feasible plan
    (expected cost, contingency included) no later factor undercuts. A wider fallback costs every plan
    that may move more in expectation, so it is taken only where it turns a cheaper plan feasible
    that a 2x move could not save (the plan's P(miss) with the nearer fallback over
    ``maxDeadlineRisk``); elsewhere the plans and their fallback are as with :data:`FALLBACK_COST_FACTOR`.

    Args:
        cands: the plans, each without a contingency.
        target_at: the fallback within a cost factor (:func:`fallback` over the caller's candidates).
        attach: ``cands`` in the same order, each with its contingency to that fallback.
        feasible: a plan with its contingency meets the job (deadline risk, budget, caps).

    Returns:
        The plans with their contingencies, and the fallback as one of them (None when there is none).
    """
    best: tuple[float, list[Candidate], Candidate | None] | None = None
    tried: list[Candidate | None] = []
    for factor in FALLBACK_COST_FACTORS:
        target = target_at(factor)
        if any(target is t for t in tried):
            continue
        tried.append(target)
        out = attach(target)
        cheapest = min((c.expected_cost_usd for c in out if feasible(c)), default=math.inf)
        if best is None or cheapest < best[0]:
            at = next((i for i, c in enumerate(cands) if c is target), None)
            best = (cheapest, out, None if at is None else out[at])
    assert best is not None  # FALLBACK_COST_FACTORS is not empty
    return best[1], best[2]


def trigger_risk(max_risk: float) -> float:
    """``r`` as the trigger reads it: ``maxDeadlineRisk`` clamped to ``[MIN_RISK, 0.5]``."""
    return min(max(max_risk, MIN_RISK), 0.5)


@lru_cache(maxsize=64)
def trigger_z(max_risk: float) -> float:
    """``z_{1-r}``: how many measurement sigmas above the exact-finish speed the operator's trigger sits."""
    return NormalDist().inv_cdf(1.0 - trigger_risk(max_risk))


_NODES, _WEIGHTS = ([float(x) for x in a] for a in np.polynomial.legendre.leggauss(20))
SLOW_SPAN = 9.0
"""The integral of :func:`slow_and_stays` runs over this many sigmas of ``ln f`` below ``ln f0``
(the mass further down is below ``Phi(-9)``, 1e-19)."""


def slow_and_stays(a: float, cut: float, s: float, s_obs: float) -> float:
    """``P(ln f < a, ln f + eps >= cut)``, ``ln f ~ N(0, s^2)``, ``eps ~ N(0, s_obs^2)``: the run is too
    slow and its measurement reads fast enough to stay.

    ``= int_{-inf}^{a/s} phi(x) Phi((s x - cut) / s_obs) dx``, by 20-point Gauss-Legendre (relative error under 1e-4 where it matters) over the
    last :data:`SLOW_SPAN` sigmas below ``a / s``.
    """
    hi = a / s
    half = SLOW_SPAN / 2.0
    mid = hi - half
    total = 0.0
    for x, wt in zip(_NODES, _WEIGHTS, strict=True):
        u = mid + half * x
        total += wt * math.exp(-0.5 * u * u) * math.erfc((cut - s * u) / (s_obs * SQRT2))
    return total * half * 0.5 / math.sqrt(2.0 * math.pi)


def moved_and_misses(
    cut: float, s: float, s_obs: float, s_f: float, rho: float, pace: float, target_work_h: float, room_h: float
) -> float:
    """``P(ln f + eps < cut, the fallback misses)``: the run is measured slow, moves, and the fallback
    does not finish the rest in time.

    ``ln f ~ N(0, s^2)`` is the plan's true speed factor and ``eps ~ N(0, s_obs^2)`` the measurement's
    error, as in :func:`slow_and_stays`. Given ``ln f = x``:

    * the plan has done ``d(x) = min(1, pace e^x)`` of the job by the move (``pace``: the hours it ran
      before the checkpoint over its hours of work at the predicted speed);
    * the fallback's log speed factor is ``y = rho (s_f / s) x + sqrt(1 - rho^2) s_f z`` (one model made
      both predictions: ``rho`` is :func:`gpuscaler.perfmodel.uncertainty.error_correlation`), and it
      misses when ``y < ln(W_F (1 - d(x)) / room)`` (``W_F``: its hours for the whole job at the predicted
      speed; ``room``: hours from its start to the deadline).

    ``= int phi_s(x) Phi((cut - x) / s_obs) G(x) dx`` with ``G(x) = Phi((ln(W_F (1 - d) / room) - rho s_f x / s)
    / (s_f sqrt(1 - rho^2)))``, by 20-point Gauss-Legendre on each side of ``cut - 4 s_obs`` (the
    measurement's step), over ``[-9 s, cut + 9 s_obs]``.
    """
    if room_h <= 0:  # no time left after the move: every move misses
        return 0.5 * math.erfc(-cut / (math.sqrt(s * s + s_obs * s_obs) * SQRT2))
    if target_work_h <= 0:  # nothing for the fallback to do: no move misses
        return 0.0
    lo, hi = -SLOW_SPAN * s, min(SLOW_SPAN * s, cut + SLOW_SPAN * s_obs)
    if hi <= lo:
        return 0.0
    beta = rho * s_f / s
    sd = max(s_f * math.sqrt(max(1.0 - rho * rho, 0.0)), 1e-9) * SQRT2
    inv_obs, inv_s = 1.0 / (s_obs * SQRT2), 1.0 / s
    log_w = math.log(target_work_h / room_h)

    def piece(a: float, b: float) -> float:
        half, mid, total = 0.5 * (b - a), 0.5 * (a + b), 0.0
        for u, wt in zip(_NODES, _WEIGHTS, strict=True):
            x = mid + half * u
            left = 1.0 - min(pace * math.exp(x), 1.0)
            if left <= 0.0:
                continue
            z = x * inv_s
            g = 0.5 * math.erfc(-(log_w + math.log(left) - beta * x) / sd)
            total += wt * math.exp(-0.5 * z * z) * math.erfc((x - cut) * inv_obs) * g
        return total * half * 0.5 * inv_s / math.sqrt(2.0 * math.pi)

    step = min(max(cut - 4.0 * s_obs, lo), hi)
    return piece(lo, step) + piece(step, hi)


def _trigger(cut: float, s: float, s_obs: float, throughput: float) -> tuple[float, float, float, float]:
    """The operator's trigger at ``cut`` (it moves when ``ln f_hat < cut``): ``f*``, the threshold in
    items/s (``X*``), how many sigmas of the measurement it sits at, and ``P_move``."""
    f_star = math.exp(cut)
    z_move = cut / math.sqrt(s * s + s_obs * s_obs)
    return f_star, f_star * throughput, z_move, 0.5 * math.erfc(-z_move / SQRT2)


class Recourse:
    """The contingencies of one planner call: one fallback, one deadline, one job (:meth:`of` per plan).

    The one computation of a contingency: the planner makes one per call and asks it for every plan;
    its infeasibility analysis (:mod:`gpuscaler.planner.binding`), the operator's re-plans after a
    correction or an interruption and the simulator's gpuscaler strategy plan through it, and the move
    it names is the one :func:`fallback` makes at run time. ``target`` is the fallback (None when there
    is none), ``deadline_h`` the hours to the deadline, ``max_risk`` the job's ``maxDeadlineRisk`` (it
    sets the operator's trigger), ``restart_s`` the job's ``checkpoint.restartSeconds``, ``startup_s``
    the planner's provisioning and start seconds, ``timing`` when a correction is known and a move may come.

    What does not depend on the plan is worked out once here (the planner prices hundreds of plans
    per call).
    """

    __slots__ = ("_decide_h", "_request_h", "_room", "_s_obs", "_startup_h", "_z", "alternate", "deadline_h",
                 "max_risk", "restart_s", "startup_s", "target")  # fmt: skip

    def __init__(
        self,
        target: Candidate | None,
        *,
        deadline_h: float,
        max_risk: float,
        restart_s: float,
        startup_s: float,
        timing: RecourseTiming = TIMING,
        alternate: Candidate | None = None,
    ) -> None:
        self.target = target
        self.alternate = alternate
        self.deadline_h = deadline_h
        self.max_risk = max_risk
        self.restart_s = restart_s
        self.startup_s = startup_s
        self._startup_h = startup_s / 3600.0
        self._decide_h = max(self._startup_h + (timing.warmup_s + timing.window_s) / 3600.0,
                             timing.min_interval_s / 3600.0)  # fmt: skip
        self._request_h = timing.request_s / 3600.0
        self._room = deadline_h - self._startup_h
        self._z = trigger_z(max_risk)
        self._s_obs = timing.measured_log_sigma

    def of(self, c: Candidate) -> Contingency:
        """The contingency of plan ``c`` (the maths is in the module docstring)."""
        o = c.outlook
        static = o.deadline_miss_probability
        target = self.target
        decide_h = self._decide_h
        move_h = decide_h + self._request_h + c.checkpoint_write_s / 3600.0
        run_h = o.expected_hours - self._startup_h
        if self._room <= 0 or run_h <= 0:
            return Contingency(target, decide_h, move_h, 0.0, 0.0, 0.0, static, static, 0.0, PASSED)
        f0 = run_h / self._room
        s, s_obs = o.log_sigma, self._s_obs
        if f0 >= 1.0 or s <= 0:
            why = EXPECTED_MISS if f0 >= 1.0 else EXACT
            return Contingency(target, decide_h, move_h, 0.0, 0.0, float(f0 >= 1.0), static, static, 0.0, why)
        # the operator's posterior (correction.posterior): ln f_post = w ln f_hat, sigma_post = sqrt(w) s_obs
        w = s * s / (s * s + s_obs * s_obs)
        cut = (math.log(f0) + math.sqrt(w) * s_obs * self._z) / w  # it moves when ln f_hat < cut
        f_star, threshold, z_move, p_move = _trigger(cut, s, s_obs, c.estimate.throughput)
        if target is None:
            return Contingency(None, decide_h, move_h, 0.0, threshold, 0.0, static, static, 0.0, NO_TARGET)
        if cut >= 0.0:
            return Contingency(target, decide_h, move_h, 0.0, threshold, p_move, static, static, 0.0, MOVES_AS_PLANNED)
        if target.instance is c.instance and target.nodes == c.nodes and target.capacity is c.capacity and (
            target.precision is c.precision
        ):
            if self.alternate is None:
                return Contingency(target, decide_h, move_h, 0.0, threshold, 0.0, static, static, 0.0, ITSELF)
            # the fallback itself: measured slow, it goes where the corrected planner's fallback is, the
            # fastest plan on another GPU type, once its corrected speed is below that plan's predicted one
            target = self.alternate
            switch = math.log((o.base_hours - self._startup_h) / (target.outlook.base_hours - self._startup_h)) / w
            cut = min(cut, switch)
            f_star, threshold, z_move, p_move = _trigger(cut, s, s_obs, c.estimate.throughput)
        if z_move < NEGLIGIBLE_Z and static <= NEGLIGIBLE_RISK:  # nothing to hedge, nothing to pay
            return Contingency(target, decide_h, move_h, 0.0, threshold, 0.0, static, static, 0.0)
        t = target.outlook
        startup_h = self._startup_h
        overhead_h = (c.checkpoint_write_s + self.restart_s + self.startup_s) / 3600.0
        target_work = t.base_hours - startup_h
        work_h = o.base_hours - startup_h
        write_h = c.checkpoint_write_s / 3600.0
        # the latest move hour m with m + overhead + W_F (1 - (m - startup - write) min(f*, 1) / W) <= D: the
        # run moved has gone at most at the threshold's speed, and the fallback does the rest
        q = min(f_star, 1.0) / work_h if work_h > 0 else 0.0
        den = 1.0 - target_work * q
        slack = (self.deadline_h - overhead_h - target_work * (1.0 + (startup_h + write_h) * q)) / den if den > 0 else -1.0
        if move_h > slack:
            return Contingency(
                target, decide_h, move_h, slack, threshold, p_move, static, static, 0.0,
                f"the correction window ({move_h:.2f} h to a move) is longer than the slack ({max(slack, 0.0):.2f} h: "
                f"the latest a move to {target.label} can start)",
            )  # fmt: skip
        left = 1.0 - min(max((move_h - startup_h) * min(f_star, 1.0) / work_h, 0.0), 1.0) if work_h > 0 else 1.0
        own = o.expected_hours * c.usd_per_hour
        theirs = t.expected_hours * target.usd_per_hour
        extra = p_move * max(0.0, left * theirs + overhead_h * target.usd_per_hour - left * own)
        miss = static
        if static > NEGLIGIBLE_RISK:
            a = math.log(f0)
            p_slow = 0.5 * math.erfc(-a / (s * SQRT2))
            held = slow_and_stays(a, cut, s, s_obs) + max(0.0, static - p_slow)
            corr = error_correlation(c.instance.gpu_id, c.precision, target.instance.gpu_id, target.precision)
            room_h = self.deadline_h - move_h - overhead_h
            ran_h = move_h - startup_h - write_h
            moved = moved_and_misses(cut, s, s_obs, t.log_sigma, corr, ran_h / work_h if work_h > 0 else 0.0,
                                     target_work, room_h)  # fmt: skip
            miss = min(static, held + moved)
        return Contingency(target, decide_h, move_h, slack, threshold, p_move, miss, static, extra)
