"""The strategy interface, the reference and naive strategies, and gpuscaler's.

* ``ondemand-8xa100`` (reference): the common fixed choice, one 8 x A100 node per job
  (``p4d.24xlarge``) on-demand, fp32 as users leave it (more nodes or AMP only when that does not fit).
* ``cheapest-fits``: the cheapest $/h on-demand instance whose GPU memory fits by the rule of thumb
  "parameters x 16 bytes (Adam; 12 with SGD) + 20%", one node, fp32; no performance model.
* ``deadline-blind-spot-restart``: the planner's best spot plan *with the deadline removed*, no
  checkpoints: an interruption restarts the job from scratch on the same offering.
* ``deadline-blind-spot-checkpoint``: the same plan with a fixed checkpoint every hour and no
  handshake: an interruption loses the work since the last checkpoint + the restart.
* ``gpuscaler``: the planner's choice under the deadline, budget and policy; on a notice a
  checkpoint handshake (nothing lost when the write fits in the notice), then the operator's own
  recovery decision (:func:`gpuscaler.planner.recovery.recover`): the remaining work, deadline
  and budget; on-demand after the policy's ``spot.maxInterruptions`` or when another reclaim
  would miss the deadline; on a capacity shortage it re-plans without the short offering instead
  of waiting for it. It learns the true throughput as the operator does, through the operator's
  early-correction code (:mod:`gpuscaler.simulator.observing`), and plans with what it learnt;
  found behind with no plan meeting the risk, it moves to the plan's contingency target (the
  planner's ``fallback``, :func:`gpuscaler.planner.contingency.fallback`), as the operator does.
  When a job finishes, the simulated operator records its measured throughput as a performance
  profile (:func:`gpuscaler.simulator.observing.record_profile`, the operator's
  :func:`~gpuscaler.planner.profiles.measure_run` and :class:`~gpuscaler.planner.profiles.ProfileStore`),
  and every later plan of the same workload plans with it (``gpuscaler-no-profiles``: without).

The baselines a careful team would run (``ondemand-best``, ``managed-spot``, ``uniform-progress``)
are in :mod:`gpuscaler.simulator.baselines`; the registry of names in
:mod:`gpuscaler.simulator.registry`. Strategies decide; :mod:`gpuscaler.simulator.engine` plays
the cloud and keeps the books.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuscaler.api import PrecisionName, SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType, Catalog
from gpuscaler.planner import Candidate, Interrupted, Situation, recover, resolve_workload
from gpuscaler.planner.correction import PlanOption
from gpuscaler.planner.profiles import ProfileStore
from gpuscaler.simulator.planning import CachedPlanner, PlanKey, plan_key, with_remaining

if TYPE_CHECKING:
    from gpuscaler.simulator.allocation import Allocation, Review

SHORTAGE_HOLD_H = 1.0
"""How long gpuscaler avoids an offering after a failed capacity request."""


@dataclass(frozen=True, slots=True)
class Decision:
    """How to run (the rest of) a job on one allocation."""

    candidate: Candidate
    interval_s: float | None
    """Seconds of training between periodic checkpoints; None = no checkpoints."""
    handshake: bool
    """Checkpoint within the interruption notice."""
    efficiency: float = 1.0
    """The factor the candidate's throughput carries over the model's prediction (the observed
    correction of its GPU type, or a performance profile's measured ratio; 1 = the model's). The
    engine and the correction divide it out to find the model's figure."""


@dataclass(frozen=True, slots=True)
class Replan:
    """A strategy's plan for the rest of a running job, as the operator's observer weighs a move."""

    best: Decision | None
    """The corrected planner's choice for the rest (None: nothing)."""
    current: PlanOption | None
    """The running plan's figures in the same result (None: no longer feasible there)."""
    fallback: Decision | None = None
    """The contingency's target (the planner's ``fallback``), where a job behind moves when no plan
    meets the risk (:func:`gpuscaler.planner.correction.should_replan`)."""


@dataclass
class JobState:
    """A job's progress as strategies see it (the engine updates it)."""

    name: str
    spec: TrainingJobSpec
    arrival_h: float
    deadline_h: float | None
    """Hours from arrival to the deadline."""
    total_samples: float
    remaining_samples: float
    interruptions: int = 0
    shortages: int = 0
    spent_usd: float = 0.0
    current: Decision | None = None
    unavailable: dict[tuple[str, str], float] = field(default_factory=dict)
    """(instance, capacity) -> simulated hour until which it is avoided."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Observed / model throughput per GPU id, as the simulated operator has corrected it (the
    operator's ``status.observed.efficiencyByGpu``); empty until a correction."""
    plan_changed_h: float = 0.0
    """Simulated hour of the last plan change (first plan, recovery or move)."""
    progress_rate: dict[tuple[str, int, str], float] = field(default_factory=dict)
    """Samples per second of training the job's progress counter showed per configuration
    (instance type, nodes, precision) it has run on: what a team watching its job sees."""
    note: str = ""

    def deadline_left_h(self, now_h: float) -> float | None:
        """Hours left to the deadline at ``now_h`` (None without a deadline)."""
        return None if self.deadline_h is None else self.deadline_h - (now_h - self.arrival_h)

    def avoided(self, now_h: float) -> frozenset[tuple[str, ...]]:
        """Offerings to avoid at ``now_h``."""
        return frozenset(k for k, until in self.unavailable.items() if until > now_h)


class Strategy:
    """Base: run one decision for the whole job, retry the same capacity after a shortage."""

    name = "base"
    label = "base"
    replans_on_shortage = False
    """After a failed capacity request, avoid that offering for ``SHORTAGE_HOLD_H``."""
    corrects = False
    """Observes running allocations and corrects the model as the operator does (gpuscaler only)."""
    profiles: ProfileStore | None = None
    """Performance profiles it records finished runs into and plans with, as the operator does (gpuscaler)."""
    plans_held = False
    """Plans into the policy's held capacity (gpuscaler); False: it buys by the hour and the engine lands
    a plan on a held pool only when the pool happens to fit it (Karpenter's behaviour, :mod:`~gpuscaler.simulator.pools`)."""

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        """The first decision for a job arriving at ``now_h``; None when it cannot be planned."""
        raise NotImplementedError

    def after_interruption(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        """The decision after a spot reclaim (default: the same again)."""
        return st.current

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        """The decision after a failed capacity request (the same object: ask again after a back-off)."""
        return st.current

    def after_window(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        """Where the rest goes when its held pool closes (a planned move; default: its own decision again,
        bought by the hour unless a pool happens to fit it)."""
        return st.current

    def replan(self, st: JobState, planner: CachedPlanner, now_h: float) -> Replan:
        """The plan for the rest of a running job with the corrected model (``corrects`` only)."""
        return Replan(None, None)

    def review_at_h(self, st: JobState, alloc: Allocation) -> float | None:
        """Simulated hour at which to :meth:`review` the running allocation; None (default): never."""
        return None

    def review(self, st: JobState, planner: CachedPlanner, now_h: float, alloc: Allocation) -> Review | None:
        """Look at a running allocation (progress in ``alloc``); None: carry on, no further review."""
        return None


def _first(planner: CachedPlanner, st: JobState, specs: Sequence[TrainingJobSpec]) -> Candidate | None:
    for spec in specs:
        choice = planner.choose(spec, None, name=st.name)
        if choice.chosen is not None:
            return choice.chosen
    return None


class OnDemandFixed(Strategy):
    """One fixed instance type on-demand, fp32, one node (more nodes or AMP only if needed)."""

    name = "ondemand-8xa100"
    label = "on-demand 8xA100 fp32"

    def __init__(self, instance_type: str = "p4d.24xlarge") -> None:
        self.instance_type = instance_type

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        fixed = {"instance_types": [self.instance_type], "gpu_types": [], "providers": [], "regions": [],
                 "min_gpus": 1, "max_gpus": None}
        tries: list[dict[str, object]] = [
            {"precisions": [PrecisionName.FP32], "max_nodes": 1},
            {"precisions": [PrecisionName.FP32], "max_nodes": None},
            {"precisions": [], "max_nodes": None},
        ]
        specs = [with_remaining(st.spec, spot=SpotPolicy.NEVER, budget_usd=None, constraints={**fixed, **t})
                 for t in tries]
        cand = _first(planner, st, specs)
        return None if cand is None else Decision(cand, cand.outlook.interval_s, handshake=False)


def rule_of_thumb_gb(params: float, optimizer: str) -> float:
    """GPU memory a user expects a model to need: weights, gradients, optimizer state + 20%."""
    per_param = 16 if optimizer == "adam" else 12
    return params * per_param * 1.2 / 1e9


class CheapestFits(Strategy):
    """The cheapest on-demand instance whose GPU memory fits by the rule of thumb; no performance model."""

    name = "cheapest-fits"
    label = "cheapest $/h that fits"

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        workload = resolve_workload(st.spec.workload, self.catalog)
        need = rule_of_thumb_gb(workload.params, workload.optimizer)
        providers = set(st.spec.constraints.providers)
        options = []
        for inst in self.catalog.instances:
            price = planner.policy.price(inst, CapacityType.ON_DEMAND)
            if price is None or (providers and inst.provider not in providers):
                continue
            options.append((price, inst.gpu.memory_gb < need, inst.name))
        # Cheapest that fits by the rule; then (rule says nothing fits) the rest by price.
        for _, _, name in sorted(options, key=lambda o: (o[1], o[0], o[2]))[:8]:
            fixed = {"instance_types": [name], "gpu_types": [], "min_gpus": 1, "max_gpus": None,
                     "precisions": [PrecisionName.FP32]}
            cand = _first(planner, st, [
                with_remaining(st.spec, spot=SpotPolicy.NEVER, budget_usd=None, constraints={**fixed, "max_nodes": n})
                for n in (1, None)
            ])
            if cand is not None:
                return Decision(cand, cand.outlook.interval_s, handshake=False)
        return None


class SpotRestart(Strategy):
    """The planner's best spot plan with the deadline removed; restart from scratch after a reclaim."""

    name = "deadline-blind-spot-restart"
    label = "spot, deadline ignored, restart from scratch"
    interval_s: float | None = None

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        spec = with_remaining(st.spec, spot=SpotPolicy.PREFERRED, budget_usd=None)
        cand = _first(planner, st, [spec])
        return None if cand is None else Decision(cand, self.interval_s, handshake=False)


class SpotCheckpoint(SpotRestart):
    """The planner's best spot plan, deadline removed, with a fixed checkpoint interval and no handshake."""

    name = "deadline-blind-spot-checkpoint"
    label = "spot, deadline ignored, hourly checkpoints"

    def __init__(self, interval_s: float = 3600.0) -> None:
        self.interval_s = interval_s


class Gpuscaler(Strategy):
    """The planner's plan, a checkpoint handshake on notice, and the operator's recovery rule.

    Every decision (the first plan, after a reclaim, after a shortage) is
    :func:`gpuscaler.planner.recovery.recover`, the function the operator calls after an
    interruption: remaining work, hours and budget left, on-demand after ``spot.maxInterruptions``
    or when spot puts the deadline at risk, the fastest sensible finish when the deadline cannot
    be met. The simulated allocation is lost whole, so there are no survivors to continue on.
    """

    name = "gpuscaler"
    label = "gpuscaler"
    replans_on_shortage = True
    corrects = True
    plans_held = True

    def __init__(self, profiles: bool = True, *, held: bool = True) -> None:
        """A fresh strategy; ``profiles`` False: without performance profiles (``gpuscaler-no-profiles``);
        ``held`` False: its plans bought by the hour, on held capacity only when it fits (``when-it-fits``)."""
        self.profiles = ProfileStore() if profiles else None
        if not profiles:
            self.name, self.label = "gpuscaler-no-profiles", "gpuscaler without performance profiles"
        if not held:
            self.plans_held = False
            self.name, self.label = "when-it-fits", "gpuscaler's plans, held capacity when it fits (Karpenter)"

    def initial(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h).best

    def after_interruption(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h).best

    def after_shortage(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h).best

    def after_window(self, st: JobState, planner: CachedPlanner, now_h: float) -> Decision | None:
        return self._decide(st, planner, now_h).best

    def replan(self, st: JobState, planner: CachedPlanner, now_h: float) -> Replan:
        cur = st.current.candidate if st.current is not None else None
        key = None if cur is None else plan_key(cur)
        return self._decide(st, planner, now_h, current=key)

    def _decide(self, st: JobState, planner: CachedPlanner, now_h: float, current: PlanKey | None = None) -> Replan:
        cur = st.current.candidate if st.current is not None else None
        situation = Situation(
            spec=st.spec,
            total_samples=st.total_samples,
            done_samples=st.total_samples - st.remaining_samples,
            interrupted=None if cur is None else Interrupted(
                cur.instance.name, cur.capacity.value, cur.nodes, cur.instance.gpu_count
            ),
            interruptions=st.interruptions,
            deadline_h=st.deadline_left_h(now_h),
            spent_usd=st.spent_usd,
            unavailable=st.avoided(now_h),
            rules=planner.policy.spot,
        )
        eff = st.efficiency  # the operator plans with status.observed.efficiencyByGpu
        rec = recover(situation, lambda spec, dl, un: planner.choose(spec, dl, un, st.name, efficiency=eff,
                                                                     current=current, profiles=self.profiles,
                                                                     held=self.plans_held))
        found = rec.result.current if rec.result is not None else None
        fallback = rec.result.fallback if rec.result is not None else None
        return Replan(self._decision(rec.chosen, eff), found, self._decision(fallback, eff))

    @staticmethod
    def _decision(cand: Candidate | None, eff: dict[str, float]) -> Decision | None:
        if cand is None:
            return None
        # A correction replaces a profile's prior in the planner; either way the candidate's figure is
        # the model's x this factor, which the engine and the correction divide out.
        factor = eff.get(cand.instance.gpu_id, cand.prior.factor if cand.prior is not None else 1.0)
        return Decision(cand, cand.outlook.interval_s, handshake=True, efficiency=factor)


