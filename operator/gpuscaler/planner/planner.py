"""The planner: the cheapest plan that meets the deadline, or the fastest within the budget.

A pipeline of four named stages (after SkyPilot's ``sky/optimizer.py``), each a pure function in
a module of its own, composed by :func:`plan`:

1. **enumerate** (:mod:`~gpuscaler.planner.offerings`): the offerings ``O`` (instance type x
   capacity type x zone, :class:`~gpuscaler.planner.offerings.Offering`) the job's constraints and
   the policy allow, with prices after overrides and each price's source and date; per
   offering the node counts ``n`` and precisions ``p`` to try;
2. **configure** (:mod:`~gpuscaler.planner.configure`): for each ``(o, n, p)`` the largest
   micro-batch ``m`` that fits in memory with the global batch kept exactly
   (``B = g m K``, ``g = n x GPUs per node``), activation checkpointing and then ZeRO only
   when needed; or a refusal with its reason code;
3. **evaluate** (:mod:`~gpuscaler.planner.evaluate`): the model's throughput ``X`` and its band,
   work hours ``W = S / X``, the Young/Daly checkpoint interval, expected hours ``T`` and cost
   ``T x price x n`` with interruptions, and ``P(miss deadline)`` with the model's error
   (:mod:`gpuscaler.planner.risk`); the model is asked once per ``(instance, n, p)`` and both
   capacity types reuse the answer; a configuration the cluster measured (a performance profile,
   :mod:`gpuscaler.planner.profiles`) plans with the measured band instead, one near it with the
   model moved by the measured ratio;
4. **solve** (:mod:`~gpuscaler.planner.solve`): the feasible set
   ``F = {c : P(miss | c) <= r, cost(c) <= budget, policy caps, gpus(c) <= cap}``, then

```
cheapest:  c* = argmin_{c in F} (cost(c), T(c))
fastest:   c* = argmin_{c in F} (T(c), cost(c))        (F restricted to spot when spot is preferred)
```

   the Pareto front of expected cost vs time, and for every offering without a plan its reason
   code (:class:`~gpuscaler.planner.candidate.Reason`) and sentence; when ``F`` is empty, hints
   that say what would make the job feasible.

The CLI, the operator and the simulator all call :func:`plan`.

Believability: a spot price the catalog itself flags as suspicious (``InstanceType.spot_price_suspect``:
Azure spot listed ~88% below on-demand) is left out of plans with the reason ``price``, unless the
policy overrides that price (the platform team vouches for it) or the caller allows flagged prices
(``gpuscaler plan --allow-flagged-prices``); a plan chosen on such a price carries a caveat.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuscaler.api import Objective, TrainingJobSpec
from gpuscaler.catalog import CapacityType, Catalog, Precision
from gpuscaler.planner import contingency as recourse
from gpuscaler.planner import departures, trial
from gpuscaler.planner.binding import Binding, Closest, explain
from gpuscaler.planner.candidate import Candidate, Reason, Refusal, Rejection
from gpuscaler.planner.configure import configure
from gpuscaler.planner.evaluate import STARTUP_S, Performance, Run, evaluate
from gpuscaler.planner.held import (
    HeldOffer,
    RestPlanner,
    flex_delay_reason,
    held_candidate,
    held_note,
    held_offers,
    segmented,
)
from gpuscaler.planner.job import ResolvedJob, check_constraints, resolve
from gpuscaler.planner.offerings import (
    NODE_COUNTS,
    Offering,
    flagged_price,
    gpu_cap,
    node_counts,
    offerings,
    precisions,
)
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.planner.solve import Outcomes, pareto_front, solve, violations
from gpuscaler.policy import Policy

__all__ = [
    "STARTUP_S",
    "Candidate",
    "Offering",
    "PlanResult",
    "Reason",
    "Rejection",
    "configure",
    "evaluate",
    "pareto_front",
    "plan",
]


@dataclass
class PlanResult:
    """The planner's answer."""

    job: ResolvedJob
    objective: Objective
    chosen: Candidate | None
    why: str
    feasible: list[Candidate]
    pareto: list[Candidate]
    """Cost-vs-time front over the feasible plans (over all fitting plans when none is feasible)."""
    rejected: list[Rejection]
    hints: list[str] = field(default_factory=list)
    """When infeasible: what would make the job feasible."""
    candidates_evaluated: int = 0
    planning_seconds: float = 0.0
    held: dict[str, HeldOffer] = field(default_factory=dict)
    """The held pools that were plannable, by name (the chosen plan's: ``held[chosen.pool]``)."""
    caveats: list[str] = field(default_factory=list)
    """What the chosen plan's figures rest on that may not hold (a flagged price)."""
    profiles: bool = False
    """Performance profiles of the job's workload were consulted (each candidate's
    ``throughput_source`` then says whether one was used)."""
    binding: Binding | None = None
    """When infeasible: the rule that binds (:mod:`gpuscaler.planner.binding`)."""
    closest: list[Closest] = field(default_factory=list)
    """When infeasible: the plans that come closest, each with what would make it feasible."""
    fallback: Candidate | None = None
    """Where a job behind schedule moves (:func:`gpuscaler.planner.contingency.fallback` over the
    on-demand plans that fit and keep the policy's caps): every plan's contingency target."""
    alternate: Candidate | None = None
    """Where a job already on the fallback moves when it is behind (:func:`alternate_of`: the fastest
    plan on another GPU type); None without a deadline or such a plan."""
    trial: bool = False
    """``chosen`` is a trial (:mod:`gpuscaler.planner.trial`): no plan meets ``maxDeadlineRisk``
    (``binding`` and ``closest`` say so), and this one runs only until its speed is measured, kept
    when the measured P(miss) is within the limit."""

    @property
    def ok(self) -> bool:
        return self.chosen is not None



def _with_contingency(
    evaluated: list[Candidate], cap: int, pol: Policy, job: ResolvedJob, spec: TrainingJobSpec
) -> tuple[list[Candidate], Candidate | None, Candidate | None]:
    """The contingency's fallback of the plans that fit, and every plan with its risk and cost with
    recourse to it (:func:`~gpuscaler.planner.contingency.with_fallback`: within 2x the cheapest, or
    4x where that lets a cheaper plan meet the job; unchanged without a deadline); and the fallback's
    own alternate (:func:`alternate_of`)."""
    deadline_h = job.deadline_h
    if deadline_h is None:
        return evaluated, fallback_of(evaluated, cap, pol), None
    out, target = recourse.with_fallback(
        evaluated,
        lambda factor: fallback_of(evaluated, cap, pol, factor),
        lambda target: with_recourse(evaluated, target, deadline_h, spec, alternate_of(evaluated, cap, pol, target)),
        lambda c: c.gpus <= cap and not violations(c, job, spec, pol),
    )
    return out, target, alternate_of(evaluated, cap, pol, target)


def _in_backoff(offer: Offering, unavailable: frozenset[tuple[str, ...]]) -> bool:
    """The offering lacks capacity right now: in every zone ``(type, capacity)`` or in its own zone
    ``(type, capacity, zone)``."""
    return offer.key in unavailable or (*offer.key, offer.zone) in unavailable


def plan(
    spec: TrainingJobSpec,
    catalog: Catalog,
    policy: Policy | None = None,
    *,
    name: str = "trainingjob",
    now: datetime | None = None,
    deadline_h: float | None = None,
    unavailable: frozenset[tuple[str, ...]] = frozenset(),
    efficiency: Mapping[str, float] | None = None,
    efficiency_sigma: Mapping[str, float] | None = None,
    allow_flagged_prices: bool = False,
    profiles: ProfileStore | None = None,
    held_in_use: Mapping[str, int] | None = None,
) -> PlanResult:
    """Plan a training job.

    Args:
        spec: the TrainingJob spec.
        catalog: GPUs, instances (with prices) and workloads.
        policy: the platform policy in force; no restrictions when None.
        name: the job's name, for messages.
        now: the time the deadline is measured from (now when None).
        deadline_h: override of the hours left (the operator passes the time left after progress).
        unavailable: offerings known to lack capacity right now: ``(instance type, capacity type)``
            in every zone, ``(instance type, capacity type, zone)`` in one zone.
        efficiency: observed / predicted throughput of this job per GPU id (the operator's
            ``status.observed.efficiencyByGpu``, see :mod:`gpuscaler.observe.assess`): each
            candidate's predicted throughput on that GPU is multiplied by it; GPUs not listed keep
            the model's prediction.
        efficiency_sigma: how sure each factor of ``efficiency`` is (log-space sigma, from
            :func:`gpuscaler.planner.correction.correct`); a measured GPU's band is drawn with it
            (at least :data:`~gpuscaler.planner.correction.MEASURED_LOG_SIGMA_FLOOR` when not given)
            instead of the model's cross-validated error.
        allow_flagged_prices: plan on spot prices the catalog flags as suspicious (with a caveat).
        profiles: performance profiles the cluster measured (:mod:`gpuscaler.planner.profiles`):
            a configuration measured before plans with the measured band, one near it with the
            model moved by the measured ratio; a GPU in ``efficiency`` keeps this job's own correction.
        held_in_use: nodes of each held pool (the policy's ``capacity``) other jobs hold: pool
            name -> nodes (:mod:`gpuscaler.planner.held`; none when absent).

    Returns:
        The plan result; ``chosen`` is None when no plan is feasible, with ``hints``.

    Raises:
        UnknownIdError: unknown workload or GPU id in the spec or policy.
        JobError: the spec cannot be planned as written.
    """
    t0 = time.perf_counter()
    pol = policy or Policy()
    dl = deadline_h if deadline_h is not None else spec.deadline_hours(now)
    check_constraints(spec, catalog, max(i.gpu_count for i in catalog.instances) * NODE_COUNTS[-1])
    job = resolve(spec, catalog, name, dl)
    # 1. enumerate: offerings, node counts, precisions
    offers, rejected = offerings(job, spec, catalog, pol, allow_flagged_prices)
    cap, cap_source = gpu_cap(spec, pol)
    wanted = precisions(spec, pol)
    performance = Performance(job, spec, pol, efficiency, efficiency_sigma, profiles, now)
    outcomes = Outcomes(cap, cap_source)
    evaluated: list[Candidate] = []
    for offer in offers:
        inst, offering = offer.instance, offer.key
        if _in_backoff(offer, unavailable):
            rejected.append(
                Rejection(*offering, Reason.CAPACITY, "no capacity right now (recent shortage)", offer.zone)
            )
            continue
        caveat = flagged_price(offer)
        for nodes in node_counts(inst, spec, job, cap):
            for precision in wanted:
                # 2. configure (and the model's prediction), shared by both capacity types
                run = performance.run(inst, nodes, precision)
                if isinstance(run, Refusal):
                    outcomes.refuse(offering, run)
                    continue
                # 3. evaluate
                evaluated.append(evaluate(job, spec, pol, offer, run, caveat))
    # 3b. the contingency: the fallback of the plans that fit, each plan's risk and cost with it
    evaluated, target, alternate = _with_contingency(evaluated, cap, pol, job, spec)
    for c in evaluated:
        outcomes.add(c, job, spec, pol)
    # held capacity (the policy's reservations, blocks, flex-start: gpuscaler.planner.held)
    when = now or datetime.now(UTC)
    held, held_rejected = held_offers(spec, catalog, pol, {o.instance.name for o in offers}, when, held_in_use)
    rejected += held_rejected
    pools: dict[str, HeldOffer] = {}
    for h in held:
        if _in_backoff(h.offer, unavailable):
            rejected.append(
                Rejection(*h.offer.key, Reason.CAPACITY, "no capacity right now (recent shortage)", h.offer.zone)
            )
            continue
        pools[h.pool.name] = h

        def rest(s: TrainingJobSpec, dl: float | None, p: Policy) -> tuple[Candidate | None, str]:
            r = plan(s, catalog, p, name=name, now=when, deadline_h=dl, unavailable=unavailable, efficiency=efficiency,
                     efficiency_sigma=efficiency_sigma, allow_flagged_prices=allow_flagged_prices, profiles=profiles,
                     held_in_use=held_in_use)  # fmt: skip
            return r.chosen, r.why

        _plan_held(h, job, spec, pol, performance, outcomes, node_counts(h.offer.instance, spec, job, cap), wanted, rest)
    # 4. solve
    chosen, why = solve(outcomes.feasible, spec, job)
    if chosen is not None:
        model = departures.argmin(outcomes.fitting, job, lambda c: all(
            reason is Reason.DEADLINE for reason, _ in violations(c, job, spec, pol)))  # fmt: skip
        said = departures.departure(chosen, model, spec)
        if said:
            why += "; " + said
    if chosen is not None and chosen.pool in pools:
        why += "; " + held_note(chosen, pools[chosen.pool])
    caveats = [chosen.price_caveat] if chosen is not None and chosen.price_caveat else []
    if caveats:
        why += f"; caveat: {caveats[0]}"
    rejected += outcomes.rejections()
    fitting = outcomes.fitting
    bound: Binding | None = None
    closest: list[Closest] = []
    tried = False
    if chosen is None:
        bound, closest = explain(job, spec, pol, fitting, outcomes.over_cap, cap, cap_source, rejected, target,
                                 STARTUP_S, alternate)  # fmt: skip
        chosen, why, caveats = _trial(bound, fitting, job, spec, pol, why)
        tried = chosen is not None
    return PlanResult(
        job=job,
        objective=spec.objective,
        chosen=chosen,
        why=why,
        feasible=outcomes.feasible,
        pareto=pareto_front(outcomes.feasible if outcomes.feasible else fitting),
        rejected=sorted(rejected, key=lambda r: (r.category, r.instance, r.capacity)),
        hints=[] if bound is None else [bound.message, *bound.also, *(f"{c.plan.label}: {c.fix}" for c in closest)],
        candidates_evaluated=performance.evaluated,
        planning_seconds=time.perf_counter() - t0,
        caveats=caveats,
        profiles=performance.profiled,
        fallback=target,
        alternate=alternate,
        held=pools,
        binding=bound,
        closest=closest,
        trial=tried,
    )


def _trial(binding: Binding, fitting: list[Candidate], job: ResolvedJob, spec: TrainingJobSpec, policy: Policy,
           why: str) -> tuple[Candidate | None, str, list[str]]:  # fmt: skip
    """Where the risk limit alone binds, the plan to try until measured (:mod:`gpuscaler.planner.trial`),
    its ``why`` and caveats; else None and the refusal's ``why``."""
    tried = trial.offer(binding, fitting, job, spec, policy)
    if tried is None:
        return None, why, []
    said = trial.why(tried, spec, STARTUP_S)
    if tried.price_caveat:
        return tried, f"{said}; caveat: {tried.price_caveat}", [tried.price_caveat]
    return tried, said, []


def fallback_of(
    cands: list[Candidate], cap: int, policy: Policy, factor: float = recourse.FALLBACK_COST_FACTOR,
    besides: Candidate | None = None,
) -> Candidate | None:
    """The contingency target: :func:`~gpuscaler.planner.contingency.fallback` (within ``factor`` x the
    cheapest; on another GPU type than ``besides``) over the on-demand plans within the GPU cap and the
    policy's price cap (any capacity type when none is on-demand)."""
    within = [
        c for c in cands if c.gpus <= cap and (policy.max_usd_per_hour is None or c.usd_per_hour <= policy.max_usd_per_hour)
    ]
    on_demand = [c for c in within if c.capacity is CapacityType.ON_DEMAND]
    return recourse.fallback(on_demand or within, factor, besides)


def alternate_of(cands: list[Candidate], cap: int, policy: Policy, target: Candidate | None) -> Candidate | None:
    """Where a job already on the fallback ``target`` goes when it measures slow: the fastest plan on another
    GPU type within :data:`~gpuscaler.planner.contingency.ALTERNATE_COST_FACTOR` x the cheapest (the
    corrected planner's fallback then; :class:`~gpuscaler.planner.contingency.Recourse`)."""
    return None if target is None else fallback_of(cands, cap, policy, recourse.ALTERNATE_COST_FACTOR, target)


def with_recourse(
    cands: list[Candidate], target: Candidate | None, deadline_h: float, spec: TrainingJobSpec,
    alternate: Candidate | None = None,
) -> list[Candidate]:
    """Every candidate with its contingency: its risk with recourse, its cost with the move's expected cost."""
    of = recourse.Recourse(target, deadline_h=deadline_h, max_risk=spec.constraints.max_deadline_risk,
                           restart_s=spec.checkpoint.restart_seconds, startup_s=STARTUP_S,
                           alternate=alternate).of  # fmt: skip
    return [c.with_contingency(of(c)) for c in cands]
def _plan_held(
    h: HeldOffer,
    job: ResolvedJob,
    spec: TrainingJobSpec,
    pol: Policy,
    performance: Performance,
    outcomes: Outcomes,
    counts: Iterable[int],
    wanted: list[Precision],
    rest: RestPlanner,
) -> None:
    """Every configuration of one held pool (at most its free nodes) into ``outcomes``; a window
    shorter than the job: one segmented plan with the pool's fastest configuration."""
    key = h.offer.key
    fastest: Run | None = None
    for nodes in counts:
        if nodes > h.free:
            break
        for precision in wanted:
            run = performance.run(h.offer.instance, nodes, precision)
            if isinstance(run, Refusal):
                outcomes.refuse(key, run)
                continue
            c = held_candidate(job, spec, pol, h, run)
            if c is None:
                if fastest is None or run.est.throughput > fastest.est.throughput:
                    fastest = run
            elif isinstance(c, Refusal):
                outcomes.refuse(key, c)
            else:
                if h.pool.type == "flexStart" and job.deadline_h is not None:
                    undelayed = evaluate(job, spec, pol, h.offer, run, "").outlook.deadline_miss_probability
                    why = flex_delay_reason(c, h, spec.constraints.max_deadline_risk, undelayed)
                    if why is not None:
                        outcomes.refuse(key, Refusal(Reason.DEADLINE, why))
                outcomes.add(c, job, spec, pol)
    if fastest is not None:
        seg = segmented(job, spec, pol, h, fastest, rest)
        if isinstance(seg, Refusal):
            outcomes.refuse(key, seg)
        else:
            outcomes.add(seg, job, spec, pol)
