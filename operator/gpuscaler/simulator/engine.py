"""The event-driven engine: a heap of timed events on a simulated clock, and the books it keeps.

Events are (hour, sequence, kind, job): ``arrive``, ``request`` (ask for capacity), ``interrupt``
(a spot reclaim) and ``finish``. Nothing sleeps; the clock jumps from event to event.

One allocation of nodes is a :class:`Segment`. Its wall time splits exactly into provisioning,
training compute, checkpoint writes and idle time (after a handshake, until the reclaim); its
training compute splits exactly into work kept (it advanced the job) and work lost (redone later).
Cost is wall hours x the offering's hourly price for the nodes, by capacity type. So, per job and
per trace::

    cost            = sum(segment wall hours x price of its nodes)
    wall            = provisioning + compute + checkpoint writes + idle
    compute         = work kept + work lost
    work kept x throughput, summed = the job's samples (when it finished)

Inside a segment, training runs ``interval`` seconds of compute, then writes a checkpoint for
``write`` seconds, and so on; no checkpoint after the last step. A reclaim at run time ``t``:

* without checkpoints: everything computed in the segment is lost (restart from scratch);
* periodic checkpoints, no handshake: the work since the last completed checkpoint is lost;
* handshake, write time <= notice: at the notice training stops and a checkpoint is written;
  nothing is lost, the rest of the notice is idle; when the write does not fit in the notice the
  job behaves as without a handshake (at most one interval lost).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from gpuscaler.catalog import CapacityType
from gpuscaler.planner import resolve
from gpuscaler.planner.planner import STARTUP_S
from gpuscaler.simulator.cloud import CloudModel, Draws
from gpuscaler.simulator.planning import CachedPlanner
from gpuscaler.simulator.strategies import SHORTAGE_HOLD_H, Decision, JobState, Strategy
from gpuscaler.simulator.trace import Trace

MAX_REQUESTS = 400
"""Capacity requests after which a job is abandoned (e.g. restart-from-scratch that never finishes)."""
MAX_JOB_HOURS = 24.0 * 90
"""Hours after arrival after which a job is abandoned."""

ARRIVE, REQUEST, INTERRUPT, FINISH = 0, 1, 2, 3


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
    """Samples the kept compute trained."""
    interrupted: bool
    interval_s: float | None
    write_s: float
    """Seconds per checkpoint write of its plan."""

    @property
    def wall_s(self) -> float:
        return (self.end_h - self.start_h) * 3600.0

    @property
    def cost_usd(self) -> float:
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
    wall_s: float
    writes: int


class _Run:
    def __init__(self, trace: Trace, strategy: Strategy, planner: CachedPlanner, cloud: CloudModel, seed: int,
                 keep_segments: bool) -> None:
        self.trace, self.strategy, self.planner, self.cloud, self.seed = trace, strategy, planner, cloud, seed
        self.keep_segments = keep_segments
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.states: list[JobState | None] = [None] * len(trace.jobs)
        self.outcomes: list[JobOutcome] = []
        self.draws: list[Draws | None] = [None] * len(trace.jobs)
        self.active: list[_Active | None] = [None] * len(trace.jobs)
        self.started: list[bool] = [False] * len(trace.jobs)
        for i, job in enumerate(trace.jobs):
            self.outcomes.append(JobOutcome(job.name, job.arrival_h, job.deadline_h(trace.start), job.spec.budget_usd))
            self.push(job.arrival_h, ARRIVE, i)

    def push(self, t_h: float, kind: int, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t_h, self.seq, kind, i))

    def run(self) -> SimulationResult:
        events = 0
        while self.heap:
            t, _, kind, i = heapq.heappop(self.heap)
            events += 1
            if kind == ARRIVE:
                self.arrive(t, i)
            elif kind == REQUEST:
                self.request(t, i)
            elif kind == INTERRUPT:
                self.interrupt(t, i)
            else:
                self.finish(t, i)
        return SimulationResult(self.strategy.name, self.strategy.label, self.seed, self.outcomes, events)

    # --------------------------------------------------------------------------------- events

    def arrive(self, t: float, i: int) -> None:
        job, out = self.trace.jobs[i], self.outcomes[i]
        try:
            total = resolve(job.spec, self.planner.catalog, job.name, out.deadline_h).total_samples
        except ValueError as err:
            out.status, out.note = "unplanned", str(err)
            return
        st = JobState(job.name, job.spec, t, out.deadline_h, total, total)
        self.states[i] = st
        self.draws[i] = Draws(self.seed, f"{i}|{job.name}")
        decision = self.strategy.initial(st, self.planner, t)
        if decision is None:
            out.status, out.note = "unplanned", "no plan this strategy can run"
            return
        st.current = decision
        out.plan_label = decision.candidate.label
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
        d = st.current
        cand = d.candidate
        # One draw from every stream per request keeps the streams aligned across strategies.
        fails = draws.request_fails(self.cloud.shortage_probability(cand.instance, cand.capacity))
        irq_s = draws.time_to_interruption_s(
            self.cloud.interruption_rate_per_h(cand.instance, cand.capacity, cand.nodes))
        nominal = STARTUP_S if not self.started[i] else st.spec.checkpoint.restart_seconds
        prov_s = draws.provisioning_s(nominal, self.cloud.provisioning_jitter)
        if fails:
            st.shortages += 1
            out.shortages += 1
            key = (cand.instance.name, cand.capacity.value)
            wait_h = self.cloud.failed_request_s / 3600.0
            if self.strategy.replans_on_shortage:
                st.unavailable[key] = t + SHORTAGE_HOLD_H
            else:
                wait_h += self.cloud.retry_backoff_s / 3600.0
            nxt = self.strategy.after_shortage(st, self.planner, t + wait_h)
            if nxt is None:
                out.status, out.note = "unplanned", "no plan after a capacity shortage"
                return
            if nxt is not d:
                out.replans += 1
            st.current = nxt
            self.push(t + wait_h, REQUEST, i)
            return
        self.started[i] = True
        work_s = st.remaining_samples / cand.estimate.throughput
        wall_s, writes = run_wall_s(work_s, d.interval_s, cand.checkpoint_write_s)
        self.active[i] = _Active(d, t, prov_s, work_s, wall_s, writes)
        if irq_s < prov_s + wall_s:
            self.push(t + irq_s / 3600.0, INTERRUPT, i)
        else:
            self.push(t + (prov_s + wall_s) / 3600.0, FINISH, i)

    def interrupt(self, t: float, i: int) -> None:
        st, out, a = self.states[i], self.outcomes[i], self.active[i]
        assert st is not None and a is not None
        d, cand = a.decision, a.decision.candidate
        elapsed_s = (t - a.start_h) * 3600.0
        write = cand.checkpoint_write_s
        notice = self.cloud.notice_seconds(cand.instance)
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
        self.request(t, i)

    def finish(self, t: float, i: int) -> None:
        st, out, a = self.states[i], self.outcomes[i], self.active[i]
        assert st is not None and a is not None
        write = a.decision.candidate.checkpoint_write_s
        self.close(i, a, t, a.provisioning_s, a.work_s, a.work_s, a.writes * write, 0.0, interrupted=False,
                   samples=st.remaining_samples)
        st.remaining_samples = 0.0
        out.status, out.finish_h = "finished", t

    def close(self, i: int, a: _Active, t: float, prov: float, compute: float, kept: float, ckpt: float,
              idle: float, *, interrupted: bool, samples: float | None = None) -> Segment:
        cand = a.decision.candidate
        seg = Segment(
            instance=cand.instance.name, capacity=cand.capacity, nodes=cand.nodes, gpus=cand.gpus,
            usd_per_hour=cand.usd_per_hour, start_h=a.start_h, end_h=t, provisioning_s=prov,
            compute_s=compute, kept_s=kept, lost_s=compute - kept, checkpoint_s=ckpt, idle_s=idle,
            samples=kept * cand.estimate.throughput if samples is None else samples,
            interrupted=interrupted, interval_s=a.decision.interval_s,
            write_s=cand.checkpoint_write_s,
        )
        out, st = self.outcomes[i], self.states[i]
        assert st is not None
        out.cost_usd += seg.cost_usd
        st.spent_usd = out.cost_usd
        out.gpu_hours += seg.wall_s / 3600.0 * seg.gpus
        out.gpu_hours_lost += seg.lost_s / 3600.0 * seg.gpus
        if self.keep_segments:
            out.segments.append(seg)
        self.active[i] = None
        return seg


def simulate(
    trace: Trace,
    strategy: Strategy,
    planner: CachedPlanner,
    cloud: CloudModel | None = None,
    *,
    seed: int = 0,
    keep_segments: bool = True,
) -> SimulationResult:
    """Replay ``trace`` under ``strategy`` in ``cloud`` with the random draws of ``seed``.

    Args:
        trace: the jobs and their arrival times.
        strategy: what to run and how to react (see :mod:`gpuscaler.simulator.strategies`).
        planner: the (cached) planner every strategy plans with.
        cloud: the cloud model (the trace's ``cloud`` mapping is not applied here; see the CLI).
        seed: seed of every random draw; the same seed gives every strategy the same draws.
        keep_segments: keep each job's allocations (for audits and tests; off to save memory).

    Returns:
        One outcome per job, in trace order.
    """
    return _Run(trace, strategy, planner, cloud or CloudModel(), seed, keep_segments).run()
