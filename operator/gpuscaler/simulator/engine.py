"""The event-driven engine: a heap of timed events on a simulated clock, and the books it keeps.

Events are (hour, sequence, kind, job, epoch): ``arrive``, ``request`` (ask for capacity),
``interrupt`` (a spot reclaim), ``finish``, ``review`` (a strategy asked to look at its running
allocation), ``observe`` (the simulated operator reads the job's progress, corrects and weighs a
move) and ``move`` (the rest of the job leaves the allocation, at a checkpoint). Every allocation has an epoch; an event of an allocation that has ended is dropped.
Nothing sleeps; the clock jumps from event to event.

Each allocation runs at the world's *true* throughput, the model's prediction times the hidden
factors of its workload family, GPU type and precision and of its scaling over its GPUs and nodes
(:mod:`gpuscaler.simulator.truth`); strategies plan with the prediction and learn only what they
observe.

One allocation of nodes is a :class:`Segment`. Its wall time splits exactly into provisioning,
training compute, checkpoint writes and idle time (after a handshake, until the reclaim); its
training compute splits exactly into work kept (it advanced the job) and work lost (redone later).
Cost is wall hours x the offering's hourly price for the nodes, by capacity type; with a spot
price history (:mod:`gpuscaler.simulator.spot_prices`) a spot segment is billed in pieces at the
price in force in its zone, one piece per price change inside it (:attr:`Segment.charges`). So,
per job and per trace::

    cost            = sum(segment wall hours x price of its nodes)      (no history)
                    = sum over segments and their pieces (piece hours x price in force)
    wall            = provisioning + compute + checkpoint writes + idle
    compute         = work kept + work lost
    work kept x true throughput, summed = the job's samples (when it finished)

Inside a segment, training runs ``interval`` seconds of compute, then writes a checkpoint for
``write`` seconds, and so on; no checkpoint after the last step. A reclaim at run time ``t``:

* without checkpoints: everything computed in the segment is lost (restart from scratch);
* periodic checkpoints, no handshake: the work since the last completed checkpoint is lost;
* handshake, write time <= notice: at the notice training stops and a checkpoint is written;
  nothing is lost, the rest of the notice is idle; when the write does not fit in the notice the
  job behaves as without a handshake (at most one interval lost).

A move loses nothing: at a periodic checkpoint (the operator's re-plan after a correction for cost),
or after writing one (a re-plan for the deadline, from the checkpoint the operator asks for: its
request reaches the workers :data:`~gpuscaler.planner.contingency.RecourseTiming.request_s` later; a
strategy leaving on-demand for spot, at once).

Held capacity (a policy's ``capacity``: reservations, capacity blocks, flex-start;
:mod:`gpuscaler.simulator.pools`): every strategy's run sees the same pools, each keeping who holds
which nodes. A request for a pool the job may not have yet waits without cost (a block until it
opens, flex-start for its drawn delay); one whose nodes are taken is a shortage. A held allocation
is neither reclaimed nor short; where its pool closes before the job ends (a block's end, a
reservation's expiry, flex-start's run limit), a ``window`` event at ``margin_s`` before the close
asks the strategy where the rest goes and moves it there after a checkpoint write (nothing lost).
A held segment is priced at its pool's marginal price (``usd_per_hour`` of its nodes), so the books
above hold unchanged.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from datetime import timedelta

from gpuscaler.catalog import CapacityType, Workload
from gpuscaler.planner import resolve, resolve_workload
from gpuscaler.planner.contingency import TIMING
from gpuscaler.planner.correction import keep_factor
from gpuscaler.planner.held import margin_s
from gpuscaler.planner.planner import STARTUP_S
from gpuscaler.planner.risk import over_risk
from gpuscaler.policy.capacity import HeldCapacity
from gpuscaler.simulator.allocation import Allocation
from gpuscaler.simulator.cloud import Cloud, CloudModel, Draws
from gpuscaler.simulator.observing import (
    ObserveRules,
    correction,
    decide_move,
    miss_probability,
    progress_points,
    record_profile,
)
from gpuscaler.simulator.planning import CachedPlanner, config_key
from gpuscaler.simulator.pools import HeldPools, flex_delay_h
from gpuscaler.simulator.strategies import SHORTAGE_HOLD_H, Decision, JobState, Strategy
from gpuscaler.simulator.trace import Trace
from gpuscaler.simulator.truth import ThroughputTruth

MAX_REQUESTS = 2000
"""Capacity requests after which a job is abandoned (e.g. restart-from-scratch that never finishes; a
strategy that fails over across every spot offering while it waits for spot asks a few dozen times an hour)."""
MAX_JOB_HOURS = 24.0 * 90
"""Hours after arrival after which a job is abandoned."""

ARRIVE, REQUEST, INTERRUPT, FINISH, REVIEW, OBSERVE, MOVE, WINDOW = range(8)


@dataclass(frozen=True, slots=True)
class Segment:
    """One allocation: nodes from a successful capacity request until the job finishes or loses them."""

    instance: str
    capacity: CapacityType
    nodes: int
    gpus: int
    usd_per_hour: float
    """Price of all its nodes per hour."""
    start_h: float
    end_h: float
    provisioning_s: float
    compute_s: float
    kept_s: float
    """Compute that advanced the job."""
    lost_s: float
    """Compute thrown away by an interruption."""
    checkpoint_s: float
    idle_s: float
    samples: float
    """Samples the kept compute trained (at the true throughput)."""
    interrupted: bool
    interval_s: float | None
    write_s: float
    """Seconds per checkpoint write of its plan."""
    zone: str = ""
    """The zone its nodes ran in ("" = not placed in a priced zone)."""
    charges: tuple[tuple[float, float, float], ...] = ()
    """With a spot price history: ``(from_h, to_h, USD per hour of all its nodes)`` pieces covering
    ``[start_h, end_h]``, cut at each price change; empty = ``usd_per_hour`` throughout."""
    pool: str = ""
    """The held pool it ran on ('' = capacity bought by the hour); ``usd_per_hour`` is then the pool's
    marginal price for its nodes."""

    @property
    def wall_s(self) -> float:
        return (self.end_h - self.start_h) * 3600.0

    @property
    def cost_usd(self) -> float:
        if self.charges:
            return sum((b - a) * usd for a, b, usd in self.charges)
        return (self.end_h - self.start_h) * self.usd_per_hour


@dataclass
class JobOutcome:
    """What happened to one job under one strategy."""

    name: str
    arrival_h: float
    deadline_h: float | None
    budget_usd: float | None
    status: str = "running"
    """finished, unplanned (no plan the strategy can run) or abandoned."""
    finish_h: float | None = None
    plan_label: str = ""
    """The first decision's plan."""
    predicted_hours: float = 0.0
    """The first plan's hours without interruption (planner's ``outlook.base_hours``)."""
    predicted_cost_usd: float = 0.0
    cost_usd: float = 0.0
    gpu_hours: float = 0.0
    gpu_hours_lost: float = 0.0
    interruptions: int = 0
    shortages: int = 0
    requests: int = 0
    replans: int = 0
    moves: int = 0
    """Allocations left by choice (a re-plan after a correction, uniform progress leaving on-demand)."""
    corrections: int = 0
    """Times the simulated operator corrected the model's throughput for this job."""
    throughput_source: str = ""
    """What the first plan's throughput came from: ``model`` or a performance profile (``measured in 3 runs``)."""
    profiled: bool = False
    """The simulated operator recorded this run in a performance profile."""
    segments: list[Segment] = field(default_factory=list)
    note: str = ""

    @property
    def completion_h(self) -> float | None:
        """Hours from arrival to finish (None when not finished)."""
        return None if self.finish_h is None else self.finish_h - self.arrival_h

    @property
    def missed_deadline(self) -> bool:
        """A job with a deadline that did not finish within it."""
        if self.deadline_h is None:
            return False
        c = self.completion_h
        return c is None or c > self.deadline_h + 1e-9

    @property
    def over_budget(self) -> bool:
        return self.budget_usd is not None and self.cost_usd > self.budget_usd + 1e-6


@dataclass
class SimulationResult:
    """All jobs of a trace under one strategy."""

    strategy: str
    label: str
    seed: int
    outcomes: list[JobOutcome]
    events: int = 0


def progress(t_s: float, interval_s: float | None, write_s: float) -> tuple[float, float, float]:
    """(compute, checkpointed compute, write time) after ``t_s`` seconds of running.

    Args:
        t_s: seconds since training (re)started in this segment.
        interval_s: compute seconds between checkpoints (None = never checkpoint).
        write_s: seconds per checkpoint write.
    """
    if interval_s is None or t_s <= 0:
        return max(t_s, 0.0), 0.0, 0.0
    cycle = interval_s + write_s
    k = math.floor(t_s / cycle)
    r = t_s - k * cycle
    if r <= interval_s:
        return k * interval_s + r, k * interval_s, k * write_s
    return (k + 1) * interval_s, k * interval_s, k * write_s + (r - interval_s)


def run_wall_s(work_s: float, interval_s: float | None, write_s: float) -> tuple[float, int]:
    """(wall seconds, checkpoints written) to train ``work_s`` seconds of compute without interruption."""
    if interval_s is None or work_s <= 0:
        return max(work_s, 0.0), 0
    writes = max(0, math.ceil(work_s / interval_s - 1e-9) - 1)
    return work_s + writes * write_s, writes


@dataclass
class _Active:
    decision: Decision
    start_h: float
    provisioning_s: float
    work_s: float
    """Compute seconds to finish the job on this allocation."""
    wall_s: float
    """Run seconds (compute + checkpoint writes) to finish."""
    writes: int
    rate: float
    """True samples per second."""
    samples0: float
    """The job's samples done when the allocation started."""
    end_h: float
    """Hour of the scheduled reclaim or finish."""
    moving: tuple[Decision, float, float, float] | None = None
    """(decision, end hour, compute s, checkpoint s) of a scheduled move."""
    closes_h: float | None = None
    """When its held pool's nodes go (None: bought by the hour, or a pool that does not close)."""

    def run_s(self, t_h: float) -> float:
        return (t_h - self.start_h) * 3600.0 - self.provisioning_s


class _Run:
    def __init__(self, trace: Trace, strategy: Strategy, planner: CachedPlanner, cloud: CloudModel, seed: int,
                 keep_segments: bool, truth: ThroughputTruth, rules: ObserveRules) -> None:
        self.trace, self.strategy, self.planner, self.seed = trace, strategy, planner, seed
        self.model, self.cloud = cloud, Cloud(cloud, seed)
        self.truth, self.rules = truth, rules
        self.keep_segments = keep_segments
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        n = len(trace.jobs)
        self.states: list[JobState | None] = [None] * n
        self.outcomes: list[JobOutcome] = []
        self.draws: list[Draws | None] = [None] * n
        self.active: list[_Active | None] = [None] * n
        self.started: list[bool] = [False] * n
        self.epoch: list[int] = [0] * n
        self.workload: list[Workload | None] = [None] * n
        """Each job's resolved workload (the truth's error is per family; profiles key on its id)."""
        self.pools = HeldPools.of(planner.policy, trace.start, seed)
        self.granted: list[float | None] = [None] * n
        """The hour a job's pending flex-start request gets its nodes (None: none pending)."""
        planner.start = trace.start
        for i, job in enumerate(trace.jobs):
            self.outcomes.append(JobOutcome(job.name, job.arrival_h, job.deadline_h(trace.start), job.spec.budget_usd))
            self.push(job.arrival_h, ARRIVE, i)

    def push(self, t_h: float, kind: int, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t_h, self.seq, kind, i, self.epoch[i]))

    def run(self) -> SimulationResult:
        events = 0
        handlers = {ARRIVE: self.arrive, REQUEST: self.request, INTERRUPT: self.interrupt, FINISH: self.finish,
                    REVIEW: self.review, OBSERVE: self.observe, MOVE: self.move, WINDOW: self.window}
        while self.heap:
            t, _, kind, i, epoch = heapq.heappop(self.heap)
            if epoch != self.epoch[i]:
                continue  # an event of an allocation that has ended
            events += 1
            self.planner.now_h = t  # plans are made at the spot prices in force now
            if self.pools:  # and with the held nodes others hold now (a job's own are free to it)
                self.planner.held_in_use = self.pools.in_use(exclude=i)
            handlers[kind](t, i)
        return SimulationResult(self.strategy.name, self.strategy.label, self.seed, self.outcomes, events)

    def _job(self, i: int) -> tuple[JobState, JobOutcome, _Active]:
        st, a = self.states[i], self.active[i]
        assert st is not None and a is not None
        return st, self.outcomes[i], a

    # --------------------------------------------------------------------------------- events

    def arrive(self, t: float, i: int) -> None:
        job, out = self.trace.jobs[i], self.outcomes[i]
        try:
            total = resolve(job.spec, self.planner.catalog, job.name, out.deadline_h).total_samples
        except ValueError as err:
            out.status, out.note = "unplanned", str(err)
            return
        self.workload[i] = resolve_workload(job.spec.workload, self.planner.catalog)
        st = JobState(job.name, job.spec, t, out.deadline_h, total, total, plan_changed_h=t)
        self.states[i] = st
        self.draws[i] = Draws(self.seed, f"{i}|{job.name}")
        decision = self.strategy.initial(st, self.planner, t)
        if decision is None:
            out.status, out.note = "unplanned", "no plan this strategy can run"
            return
        st.current = decision
        out.plan_label = decision.candidate.label
        out.throughput_source = decision.candidate.throughput_source
        out.predicted_hours = decision.candidate.outlook.base_hours
        out.predicted_cost_usd = out.predicted_hours * decision.candidate.usd_per_hour
        self.request(t, i)

    def request(self, t: float, i: int) -> None:
        st, out, draws = self.states[i], self.outcomes[i], self.draws[i]
        assert st is not None and draws is not None and st.current is not None
        out.requests += 1
        if out.requests > MAX_REQUESTS or t - st.arrival_h > MAX_JOB_HOURS:
            out.status, out.note = "abandoned", f"gave up after {out.requests - 1} capacity requests"
            return
        d, pool, wait_h = self._held(i, st.current, t)
        if wait_h is not None:  # a block not open yet, a flex-start queue: no nodes, no cost
            self.push(t + wait_h, REQUEST, i)
            return
        cand = d.candidate
        inst, cap, nodes = cand.instance, cand.capacity, cand.nodes
        # One draw from every stream per request keeps the streams aligned across strategies.
        fails = self.cloud.request_fails(inst, cap, nodes, t, draws.capacity_u())
        irq_s = self.cloud.interruption_s(inst, cap, nodes, t, draws.interruption_u())
        closes_h = None
        if pool is not None:  # the team's nodes: short only when others hold them, never reclaimed
            closes_h = self.pools.closes_h(pool, t)
            fails = self.pools.free(pool, exclude=i) < nodes or (closes_h is not None and closes_h <= t)
            irq_s = math.inf
        nominal = STARTUP_S if not self.started[i] else st.spec.checkpoint.restart_seconds
        prov_s = draws.provisioning_s(nominal, self.model.provisioning_jitter)
        if fails:
            st.shortages += 1
            out.shortages += 1
            if self.strategy.replans_on_shortage:
                st.unavailable[(inst.name, cap.value)] = t + SHORTAGE_HOLD_H
            wait_h = self.model.failed_request_s / 3600.0
            nxt = self.strategy.after_shortage(st, self.planner, t + wait_h)
            if nxt is None:
                out.status, out.note = "unplanned", "no plan after a capacity shortage"
                return
            if nxt is d:
                wait_h += self.model.retry_backoff_s / 3600.0  # the same capacity, after a back-off
            else:
                out.replans += 1
                st.plan_changed_h = t + wait_h
            st.current = nxt
            self.push(t + wait_h, REQUEST, i)
            return
        self.started[i] = True
        workload = self.workload[i]
        family = workload.family if workload is not None else ""
        truth = self.truth.factor(inst.gpu_id, cand.precision.value, family, cand.gpus, nodes)
        rate = cand.estimate.throughput / d.efficiency * truth
        work_s = st.remaining_samples / rate
        wall_s, writes = run_wall_s(work_s, d.interval_s, cand.checkpoint_write_s)
        self.epoch[i] += 1
        interrupted = irq_s < prov_s + wall_s
        end_h = t + (irq_s if interrupted else prov_s + wall_s) / 3600.0
        a = self.active[i] = _Active(d, t, prov_s, work_s, wall_s, writes, rate,
                                     st.total_samples - st.remaining_samples, end_h, closes_h=closes_h)
        self.push(end_h, INTERRUPT if interrupted else FINISH, i)
        if pool is not None:
            self.pools.take(i, pool, nodes)
            if closes_h is not None and closes_h < end_h:  # the checkpoint is asked for a margin before the close
                self.push(max(t, closes_h - margin_s(cand.checkpoint_write_s) / 3600.0), WINDOW, i)
        if self.strategy.corrects:
            at = t + (prov_s + self.rules.first_look_s) / 3600.0
            if at < end_h:
                self.push(at, OBSERVE, i)
        review = self.strategy.review_at_h(st, self._view(a, t, st))
        if review is not None and review < end_h:
            self.push(review, REVIEW, i)

    def _held(self, i: int, d: Decision | None, t: float) -> tuple[Decision, HeldCapacity | None, float | None]:
        """The decision as run, its held pool (None: bought by the hour) and hours to wait for the pool.

        A plan into a pool names it (``candidate.pool``); a strategy that does not plan into the pools
        lands on one when it happens to fit (:meth:`HeldPools.landing`).
        """
        assert d is not None
        cand = d.candidate
        if not self.pools:
            return d, None, None
        if not cand.pool:
            landed = None if self.strategy.plans_held else self.pools.landing(i, cand, t)
            if landed is None:
                return d, None, None
            return replace(d, candidate=landed), self.pools.pools[landed.pool], None
        pool = self.pools.pools[cand.pool]
        opens = self.pools.opens_h(pool)
        if opens > t + 1e-9:
            return d, pool, opens - t
        if pool.type == "flexStart":
            granted = self.granted[i]
            if granted is None:  # queue: the k-th draw of this job on this pool, the same for every strategy
                delay = flex_delay_h(pool, self.pools.flex_z(self.trace.jobs[i].name, pool))
                self.granted[i] = t + delay
                return d, pool, delay
            self.granted[i] = None
        return d, pool, None

    def window(self, t: float, i: int) -> None:
        """A held pool closes soon: checkpoint now and move the rest where the strategy says (planned)."""
        st, out, a = self._job(i)
        if a.moving is not None and a.closes_h is not None and a.moving[1] <= a.closes_h:
            return  # a move already leaves before the close
        d = a.decision
        compute, _, _ = progress(max(a.run_s(t), 0.0), d.interval_s, d.candidate.checkpoint_write_s)
        at_h = t + d.candidate.checkpoint_write_s / 3600.0
        before = st.remaining_samples
        st.remaining_samples = max(before - compute * a.rate, 0.0)  # what is left after the checkpoint
        self.planner.now_h = at_h
        try:
            to = self.strategy.after_window(st, self.planner, at_h)
        finally:
            st.remaining_samples = before
            self.planner.now_h = t
        if to is None:
            out.note = "no plan for the rest after a held pool closed"
            to = st.current
        assert to is not None
        a.moving = None
        self._schedule_move(i, a, t, to, at_checkpoint=False)

    def interrupt(self, t: float, i: int) -> None:
        st, out, a = self._job(i)
        d, cand = a.decision, a.decision.candidate
        elapsed_s = (t - a.start_h) * 3600.0
        write = cand.checkpoint_write_s
        notice = self.model.notice_seconds(cand.instance)
        if elapsed_s <= a.provisioning_s:
            prov, compute, kept, ckpt, idle = elapsed_s, 0.0, 0.0, 0.0, 0.0
        else:
            prov = a.provisioning_s
            run_s = elapsed_s - prov
            if d.handshake and write <= notice:
                tn = max(0.0, run_s - notice)
                compute, saved, ckpt = progress(tn, d.interval_s, write)
                final = min(write, run_s - tn) if compute > saved else 0.0
                kept, ckpt, idle = compute, ckpt + final, run_s - tn - final
            else:
                compute, kept, ckpt = progress(run_s, d.interval_s, write)
                idle = 0.0
        seg = self.close(i, a, t, prov, compute, kept, ckpt, idle, interrupted=True)
        st.remaining_samples = max(0.0, st.remaining_samples - seg.samples)
        st.interruptions += 1
        out.interruptions += 1
        nxt = self.strategy.after_interruption(st, self.planner, t)
        if nxt is None:
            out.status, out.note = "unplanned", "no plan after an interruption"
            return
        if nxt is not d:
            out.replans += 1
        st.current = nxt
        st.plan_changed_h = t
        self.request(t, i)

    def finish(self, t: float, i: int) -> None:
        st, out, a = self._job(i)
        write = a.decision.candidate.checkpoint_write_s
        self.close(i, a, t, a.provisioning_s, a.work_s, a.work_s, a.writes * write, 0.0, interrupted=False,
                   samples=st.remaining_samples)
        st.remaining_samples = 0.0
        out.status, out.finish_h = "finished", t
        store, workload, draws = self.strategy.profiles, self.workload[i], self.draws[i]
        if store is not None and workload is not None and draws is not None:
            since_s = a.start_h * 3600.0 + a.provisioning_s
            points = progress_points(a.rate, a.samples0, since_s, t * 3600.0, self.rules.tick_s,
                                     lambda: draws.noise(self.model.measurement_noise))
            at = self.trace.start + timedelta(hours=t)
            out.profiled = record_profile(store, st.spec, workload, a.decision, points, since_s, t * 3600.0,
                                          st.total_samples, at, st.name, self.rules) is not None

    # ------------------------------------------------------------------- looking and moving

    @staticmethod
    def _view(a: _Active, t: float, st: JobState) -> Allocation:
        d = a.decision
        compute, saved, _ = progress(max(a.run_s(t), 0.0), d.interval_s, d.candidate.checkpoint_write_s)
        if compute > 0:
            st.progress_rate[config_key(d.candidate)] = a.rate  # what the job's progress counter shows
        return Allocation(d, a.start_h, a.provisioning_s, a.samples0 + compute * a.rate,
                          a.samples0 + saved * a.rate, st.total_samples, st.arrival_h)

    def review(self, t: float, i: int) -> None:
        st, _, a = self._job(i)
        r = self.strategy.review(st, self.planner, t, self._view(a, t, st))
        if r is None:
            return
        if r.move is not None:
            self._schedule_move(i, a, t, r.move, at_checkpoint=r.at_checkpoint)
        elif r.again_h is not None and r.again_h < a.end_h:
            self.push(r.again_h, REVIEW, i)

    def observe(self, t: float, i: int) -> None:
        """The operator's look at a running gang: correct, weigh the risk, maybe move (observing)."""
        st, out, a = self._job(i)
        d = a.decision
        gpu = d.candidate.instance.gpu_id
        draws = self.draws[i]
        assert draws is not None
        since_s = a.start_h * 3600.0 + a.provisioning_s
        points = progress_points(a.rate, a.samples0, since_s, t * 3600.0, self.rules.tick_s,
                                 lambda: draws.noise(self.model.measurement_noise))
        c = correction(points, d, since_s, self.rules)
        if not c.ready:
            return
        known = st.efficiency.get(gpu, d.efficiency)
        changed = not keep_factor(known, c.factor, self.rules.correction.divergence)
        if changed:
            st.efficiency[gpu] = round(c.factor, 3)
            out.corrections += 1
        factor = st.efficiency.get(gpu, d.efficiency)
        throughput = d.candidate.estimate.throughput / d.efficiency * factor
        miss = miss_probability(d, st.total_samples - points[-1].samples, throughput, c.log_sigma,
                                st.deadline_left_h(t), st.spec.checkpoint.restart_seconds)
        at_risk = over_risk(miss, st.spec.constraints.max_deadline_risk)
        if not (changed or at_risk or factor != d.efficiency) or a.moving is not None:
            return
        earliest = st.plan_changed_h + self.rules.min_interval_s / 3600.0
        if t < earliest - 1e-12:
            if earliest < a.end_h:
                self.push(earliest, OBSERVE, i)  # look again (with more readings) when a move may come
            return
        # a move for the deadline (should_replan's ``urgent``: at risk) starts from a checkpoint the operator
        # asks for now, which the workers start at a step boundary TIMING.request_s later; one for cost
        # waits for the periodic checkpoint
        at_h = t + TIMING.request_s / 3600.0 if at_risk else t
        at = self._move_point(a, at_h, at_checkpoint=not at_risk)
        if at is None:
            return  # the job finishes before its next checkpoint
        end_h, compute, _ = at
        before = st.remaining_samples
        st.remaining_samples = max(before - compute * a.rate, 0.0)  # what is left at that checkpoint
        try:
            r = self.strategy.replan(st, self.planner, end_h)
        finally:
            st.remaining_samples = before
        decision = decide_move(miss, st.spec.constraints.max_deadline_risk, r.current, r.best, self.rules, r.fallback)
        to = r.fallback if decision.fallback else r.best
        if decision.replan and to is not None:
            assert decision.urgent is at_risk  # the move point above is this decision's
            self._schedule_move(i, a, at_h, to, at_checkpoint=not at_risk)

    def _next_checkpoint(self, a: _Active, t: float) -> tuple[float, float, float] | None:
        """(hour, compute s, checkpoint s) when the next periodic checkpoint is written after ``t``."""
        d = a.decision
        if d.interval_s is None:
            return None
        write = d.candidate.checkpoint_write_s
        cycle = d.interval_s + write
        k = math.floor(max(a.run_s(t), 0.0) / cycle) + 1
        if k > a.writes:
            return None
        return a.start_h + (a.provisioning_s + k * cycle) / 3600.0, k * d.interval_s, k * write

    def _move_point(self, a: _Active, t: float, *, at_checkpoint: bool) -> tuple[float, float, float] | None:
        """(hour, compute s, checkpoint s) where a move decided at ``t`` leaves: the next periodic checkpoint
        (None: none comes before the end), or a checkpoint written from ``t`` (none when nothing ran since
        the last)."""
        if at_checkpoint:
            return self._next_checkpoint(a, t)
        d = a.decision
        compute, saved, ckpt = progress(max(a.run_s(t), 0.0), d.interval_s, d.candidate.checkpoint_write_s)
        final = d.candidate.checkpoint_write_s if compute > saved else 0.0
        return t + final / 3600.0, compute, ckpt + final

    def _schedule_move(self, i: int, a: _Active, t: float, to: Decision, *, at_checkpoint: bool) -> None:
        at = self._move_point(a, t, at_checkpoint=at_checkpoint)
        if at is None:
            return
        end_h, compute, ckpt = at
        if end_h >= a.end_h:
            return  # it finishes or is reclaimed first
        a.moving = (to, end_h, compute, ckpt)
        self.push(end_h, MOVE, i)

    def move(self, t: float, i: int) -> None:
        st, out, a = self._job(i)
        if a.moving is None or a.moving[1] != t:
            return  # a move replaced by an earlier one (a held pool's close)
        to, _, compute, ckpt = a.moving
        prov = min(a.provisioning_s, (t - a.start_h) * 3600.0)  # a move may leave before the nodes are up
        seg = self.close(i, a, t, prov, compute, compute, ckpt, 0.0, interrupted=False)
        st.remaining_samples = max(0.0, st.remaining_samples - seg.samples)
        out.moves += 1
        out.replans += 1
        st.current = to
        st.plan_changed_h = t
        self.request(t, i)

    def close(self, i: int, a: _Active, t: float, prov: float, compute: float, kept: float, ckpt: float,
              idle: float, *, interrupted: bool, samples: float | None = None) -> Segment:
        cand = a.decision.candidate
        zone = cand.zone
        charges: tuple[tuple[float, float, float], ...] = ()
        history = self.model.spot_prices
        if history is not None and cand.capacity is CapacityType.SPOT:
            zone = history.placement(cand.instance.name, cand.zone, a.start_h)
            planned = cand.usd_per_hour / cand.nodes
            charges = tuple(
                (x, y, usd * cand.nodes)
                for x, y, usd in history.pieces(cand.instance.name, zone, a.start_h, t, planned)
            )
        seg = Segment(
            instance=cand.instance.name, capacity=cand.capacity, nodes=cand.nodes, gpus=cand.gpus,
            usd_per_hour=cand.usd_per_hour, start_h=a.start_h, end_h=t, provisioning_s=prov,
            compute_s=compute, kept_s=kept, lost_s=compute - kept, checkpoint_s=ckpt, idle_s=idle,
            samples=kept * a.rate if samples is None else samples,
            interrupted=interrupted, interval_s=a.decision.interval_s,
            write_s=cand.checkpoint_write_s, zone=zone, charges=charges, pool=cand.pool,
        )
        self.pools.release(i)
        out, st = self.outcomes[i], self.states[i]
        assert st is not None
        out.cost_usd += seg.cost_usd
        st.spent_usd = out.cost_usd
        out.gpu_hours += seg.wall_s / 3600.0 * seg.gpus
        out.gpu_hours_lost += seg.lost_s / 3600.0 * seg.gpus
        if compute > 0:
            st.progress_rate[config_key(cand)] = a.rate  # what the job's progress counter showed
        if self.keep_segments:
            out.segments.append(seg)
        self.active[i] = None
        self.epoch[i] += 1
        return seg


def simulate(
    trace: Trace,
    strategy: Strategy,
    planner: CachedPlanner,
    cloud: CloudModel | None = None,
    *,
    seed: int = 0,
    keep_segments: bool = True,
    truth: ThroughputTruth | None = None,
    rules: ObserveRules | None = None,
) -> SimulationResult:
    """Replay ``trace`` under ``strategy`` in ``cloud`` with the random draws of ``seed``.

    Args:
        trace: the jobs and their arrival times.
        strategy: what to run and how to react (see :mod:`gpuscaler.simulator.strategies`).
        planner: the (cached) planner every strategy plans with.
        cloud: the cloud model (the trace's ``cloud`` mapping is not applied here; see the CLI).
        seed: seed of every random draw; the same seed gives every strategy the same draws.
        keep_segments: keep each job's allocations (for audits and tests; off to save memory).
        truth: the world's throughput factors (default: the world is the model).
        rules: the operator's observation settings (default: its shipped defaults).

    Returns:
        One outcome per job, in trace order.
    """
    planner.spot_prices = (cloud or CloudModel()).spot_prices  # every strategy plans at the same prices
    return _Run(trace, strategy, planner, cloud or CloudModel(), seed, keep_segments,
                truth or ThroughputTruth(0.0, seed), rules or ObserveRules.operator_defaults()).run()
