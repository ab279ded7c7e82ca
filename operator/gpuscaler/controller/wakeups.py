"""When each TrainingJob is stepped: on the watch events it depends on, and by a timer only where time matters.

A job is stepped when something it depends on changes: its spec (a new generation), one of its
worker pods, one of its nodes, a ``GPUScalingPolicy``. The kopf adapters in
:mod:`gpuscaler.handlers.trainingjob` call :meth:`Wakeups.wake` from the watch-event handlers of
those objects; a burst of events before the job's turn is one step (the wake-up is a flag, and a
woken job waits ``debounce_s`` before it is queued, so the events of one change arrive together).
Otherwise a job sleeps until the next time-based deadline :func:`next_wake` finds in its status:
its gang timeout, a checkpoint deadline, the end of a capacity back-off, the cost/ETA refresh of
a job holding nodes, and a resync at a long interval (``settings.resync_interval_s``) that
catches what no event announces (a policy file changed on disk, a missed watch event).

Steps run on a few threads (:class:`Lanes`), most urgent lane first: a job handling an
interruption (a node's notice, Checkpointing, Recovering) before jobs that are starting or
running, those before jobs that are only being planned or waiting, and steps only a timer asked
for last, so a burst of new jobs does not delay a spot notice's checkpoint request
(:func:`lane`); the lanes age (:data:`LANE_DELAY_S`), so none starves. Nothing here talks to the API
server or imports kopf; :func:`drive` is the per-job loop the kopf daemon runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum
from typing import TypeVar

from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.cloud import NodeState
from gpuscaler.controller import bringup
from gpuscaler.controller import interruptions as spot
from gpuscaler.controller.reconcile import COST_REFRESH_S
from gpuscaler.controller.windows import seconds_to_move, window_opens_in
from gpuscaler.kube.admission import RECHECK_S
from gpuscaler.names import ConditionType
from gpuscaler.settings import Settings

T = TypeVar("T")
log = logging.getLogger(__name__)


class Lane(IntEnum):
    """How urgent a job's next step is (lower first)."""

    INTERRUPTION = 0
    """A node's notice or loss, Checkpointing, Recovering: the checkpoint handshake has a deadline."""
    ACTIVE = 1
    """Provisioning, Starting, Running, woken by a change: holds or is getting nodes."""
    WAITING = 2
    """Pending or Planning (planned once per generation), or finished: nothing is running yet."""
    REFRESH = 3
    """A step only a timer asked for (cost/ETA refresh, resync, a back-off's end) outside the
    interruption lane: nothing changed, so it goes after the jobs something happened to."""


LANE_DELAY_S: dict[Lane, float] = {
    Lane.INTERRUPTION: -3600.0,
    Lane.ACTIVE: 0.0,
    Lane.WAITING: 1.0,
    Lane.REFRESH: 30.0,
}
"""Steps are served in order of (time queued + this): an interruption before anything queued in
the hour before it (in practice, first); a waiting job's step after the active steps queued up to
1 s after it; a timer's step after everything queued up to 30 s after it (the cost refresh period:
late by at most one period). So no lane starves. Strict priorities did: the 30 s cost refresh of
480 running jobs, arriving faster than 4 threads served it under load, kept 20 of 500 new jobs
from ever being planned (measured with benchmarks/operator_scale.py --jobs 500)."""


@dataclass(frozen=True)
class WakeConfig:
    """The times :func:`next_wake` works with (:meth:`from_settings`)."""

    resync_s: float
    """Longest sleep of any job (``settings.resync_interval_s``)."""
    urgent_s: float
    """Period of a job in a time-critical phase: Checkpointing, Recovering, a node under notice or
    NotReady (``settings.reconcile_interval_s``)."""
    gang_timeout_s: float
    """The loop's gang timeout (``settings.gang_timeout_s``): a gang not up by then is re-planned."""
    progress_event_after_s: float = 30.0
    """A gang not up this long after its request says where it waits (``settings.progress_event_after_s``)."""
    cost_refresh_s: float = COST_REFRESH_S
    """Cost and ETA of a job holding nodes are refreshed this often (the loop's write throttle)."""
    min_s: float = 0.05
    """Shortest sleep (a deadline just passed is stepped at once, but not in a busy loop)."""
    admission_recheck_s: float = RECHECK_S
    """A job whose workers wait for the worker admission policy is stepped this often: the
    policy's presence is re-read at most this often (:data:`gpuscaler.kube.admission.RECHECK_S`)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> WakeConfig:
        """The operator's values in ``settings``."""
        return cls(
            resync_s=settings.resync_interval_s,
            urgent_s=settings.reconcile_interval_s,
            gang_timeout_s=settings.gang_timeout_s,
            progress_event_after_s=settings.progress_event_after_s,
        )


TIME_CRITICAL = frozenset({Phase.CHECKPOINTING, Phase.RECOVERING})
HOLDING = frozenset({Phase.PROVISIONING, Phase.STARTING, Phase.RUNNING})


def lane(
    status: TrainingJobStatus, nodes: Sequence[NodeState], now: datetime, cfg: spot.SpotConfig, *, woken: bool = True
) -> Lane:
    """The lane of a job's next step, from its status and its nodes as the watches last saw them.

    Args:
        status: The job's status before the step.
        nodes: The job's nodes (from the node index).
        now: The current time.
        cfg: The loop's interruption settings (what counts as a notice).
        woken: Whether a watch event asked for the step (False: only a timer did).

    Returns:
        :attr:`Lane.INTERRUPTION` while a notice is open or any node of a Running job carries one
        (or is being deleted); else :attr:`Lane.REFRESH` for a step only a timer asked for;
        :attr:`Lane.ACTIVE` for the other phases that hold nodes, :attr:`Lane.WAITING` otherwise.
    """
    if status.phase in TIME_CRITICAL or status.notice is not None:
        return Lane.INTERRUPTION
    if status.phase is Phase.RUNNING and (
        any(n.deleting for n in nodes) or spot.detect(nodes, now, cfg) is not None
    ):
        return Lane.INTERRUPTION  # the loop acts on notices while Running (a gang coming up is NotReady)
    if not woken:
        return Lane.REFRESH
    if status.phase in HOLDING:
        return Lane.ACTIVE
    return Lane.WAITING


def next_wake(status: TrainingJobStatus, nodes: Sequence[NodeState], now: datetime, cfg: WakeConfig) -> float:
    """Seconds until a job must be stepped again although no watch event woke it.

    Args:
        status: The job's status after its step.
        nodes: The job's nodes (from the node index).
        now: The current time.
        cfg: The periods and timeouts.

    Returns:
        The earliest of: ``urgent_s`` in a time-critical phase, with a notice open, with a node
        NotReady or deleting while the job holds nodes, or for a finished job still holding nodes;
        the gang timeout of a gang being brought up, and the moment it says where it waits
        (``progress_event_after_s``); the end of the earliest capacity back-off; ``cost_refresh_s``
        while nodes are held; ``admission_recheck_s`` while the workers wait for the admission
        policy; ``resync_s`` always. Never below ``min_s``.
    """
    phase = status.phase
    if phase in TIME_CRITICAL or status.notice is not None:
        return cfg.urgent_s
    if phase.finished:
        return cfg.urgent_s if status.nodes else cfg.resync_s
    times = [cfg.resync_s]
    if phase in HOLDING:
        times.append(cfg.cost_refresh_s)
        if any(n.deleting or not n.ready for n in nodes) and phase is Phase.RUNNING:
            times.append(cfg.urgent_s)  # a node NotReady counts as lost after its grace period
    if phase in (Phase.PROVISIONING, Phase.STARTING) and status.provisioning_started_at is not None:
        since = (status.provisioning_started_at - now).total_seconds()
        times.append(since + cfg.gang_timeout_s + cfg.min_s)  # just after the timeout, so the step sees it passed
        wait = ConditionType.NODES_READY if phase is Phase.PROVISIONING else ConditionType.RUNNING
        began = bringup.waiting_since(status, wait)
        said = (began - now).total_seconds() + cfg.progress_event_after_s if began is not None else 0.0
        if said > 0:  # the gang says where it waits (controller/bringup.py)
            times.append(said + cfg.min_s)
    if status.unavailable:
        times.append(min((u.until - now).total_seconds() for u in status.unavailable) + cfg.min_s)
    move = seconds_to_move(status, now) if phase is Phase.RUNNING else None
    if move is not None:  # a held capacity window closes: the planned move's checkpoint
        times.append(move + cfg.min_s)
    opens = window_opens_in(status, now) if phase is Phase.PENDING else None
    if opens is not None:  # the plan waits for its capacity block to open
        times.append(opens + cfg.min_s)
    if any(c.type == ConditionType.WORKER_ADMISSION and c.status == "False" for c in status.conditions):
        times.append(cfg.admission_recheck_s)  # no watch event tells when the policy is installed
    return max(min(times), cfg.min_s)


class Lanes:
    """Runs steps on ``workers`` threads in order of time queued plus their lane's delay
    (:data:`LANE_DELAY_S`), in submission order on ties.

    Args:
        workers: Threads (steps mostly wait on the API server, so a few serve hundreds of jobs).
        name: Thread name prefix.
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(self, workers: int, name: str = "reconcile", clock: Callable[[], float] = time.monotonic) -> None:
        if workers < 1:
            raise ValueError(f"reconcile workers must be at least 1, got {workers}")
        self._queue: queue.PriorityQueue[
            tuple[float, int, Callable[[], object] | None, Future[object] | None]
        ] = queue.PriorityQueue()
        self.clock = clock
        self._seq = itertools.count()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, lane: int, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` in ``lane``; its future holds the result or the exception."""
        fut: Future[T] = Future()
        due = self.clock() + LANE_DELAY_S[Lane(lane)]
        self._queue.put((due, next(self._seq), fn, fut))  # type: ignore[arg-type]
        return fut

    def queued(self) -> int:
        """Steps waiting for a thread."""
        return self._queue.qsize()

    def close(self) -> None:
        """Let the threads finish what they run and stop (queued steps after this are not run)."""
        for _ in self._threads:
            self._queue.put((-math.inf, next(self._seq), None, None))
        for t in self._threads:
            t.join(timeout=30)

    def _work(self) -> None:
        while True:
            _, _, fn, fut = self._queue.get()
            if fn is None or fut is None:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as err:
                fut.set_exception(err)


GATE_DECREASE = 0.8
"""A slow step multiplies :class:`StepGate`'s limit by this (multiplicative decrease)."""
GATE_INCREASE = 1.0
"""A fast step adds this divided by the limit (about one more step at once per limit-many fast steps:
additive increase, as TCP's congestion window grows by one segment per round trip)."""


class StepGate:
    """How many steps outside the interruption lane may run at once, adapted to how long steps take:
    a client-side limit that leaves a busy API server's CPU to its other clients.

    Steps mostly wait on the API server, so a step that takes longer than ``slow_s`` says the server
    is slow to answer (its CPU is taken). Each such step lowers the limit (x :data:`GATE_DECREASE`,
    never below ``floor``); each fast one raises it (+ :data:`GATE_INCREASE` / limit, never above
    ``ceiling``, the step threads). The interruption lane is never held back, so a spot notice's
    checkpoint request keeps its budget. ``slow_s`` 0 turns the gate off. Used by :func:`drive`
    from one event loop (the operator's).

    Args:
        ceiling: Most steps at once (``settings.reconcile_workers``).
        slow_s: A step slower than this lowers the limit (``settings.reconcile_slow_step_s``).
        floor: Fewest steps at once.
    """

    def __init__(self, ceiling: int, slow_s: float, floor: int = 1) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.slow_s = slow_s
        self.limit = float(ceiling)
        self.running = 0
        self._cond: asyncio.Condition | None = None

    @property
    def enabled(self) -> bool:
        """Whether steps are held back at all."""
        return self.slow_s > 0

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def adapt(self, seconds: float) -> None:
        """Move the limit after a step of ``seconds``."""
        if seconds > self.slow_s:
            self.limit = max(float(self.floor), self.limit * GATE_DECREASE)
        else:
            self.limit = min(float(self.ceiling), self.limit + GATE_INCREASE / self.limit)

    async def acquire(self, lane: int) -> bool:
        """Wait until a step of ``lane`` may run; whether it took a place (release it after the step).
        The interruption lane, and every lane when the gate is off, never waits and takes none."""
        if not self.enabled or lane == Lane.INTERRUPTION:
            return False
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self.running < max(self.floor, int(self.limit)))
            self.running += 1
        return True

    async def release(self, seconds: float) -> None:
        """A step that took a place ended after ``seconds``: free it and adapt the limit."""
        cond = self._condition()
        async with cond:
            self.running -= 1
            self.adapt(seconds)
            cond.notify_all()


class Wakeups:
    """The wake-up flag of every job being driven, by key (the job label value ``<ns>.<name>``).

    :meth:`wake` may be called from any thread (kopf runs sync index handlers on its executor).
    """

    def __init__(self) -> None:
        self._flags: dict[str, tuple[asyncio.Event, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()
        self.woken = 0
        """Wake-ups delivered to a registered job (for the metrics)."""

    def __len__(self) -> int:
        return len(self._flags)

    def __contains__(self, key: object) -> bool:
        return key in self._flags

    def register(self, key: str) -> asyncio.Event:
        """The flag of a job (called in its driver's event loop)."""
        flag = asyncio.Event()
        with self._lock:
            self._flags[key] = (flag, asyncio.get_running_loop())
        return flag

    def unregister(self, key: str, flag: asyncio.Event) -> None:
        """Forget a job's flag (its driver ended); a newer registration of the key is kept."""
        with self._lock:
            if key in self._flags and self._flags[key][0] is flag:
                del self._flags[key]

    def wake(self, key: str) -> bool:
        """Wake a job; False when no driver runs for it (a finished job, or one not seen yet)."""
        with self._lock:
            got = self._flags.get(key)
            if got is not None:
                self.woken += 1
        if got is None:
            return False
        flag, loop = got
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            flag.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the operator is exiting
                loop.call_soon_threadsafe(flag.set)
        return True

    def wake_all(self, prefix: str = "") -> int:
        """Wake every job whose key starts with ``prefix`` (``"<ns>."``: a namespace's); how many."""
        with self._lock:
            keys = [k for k in self._flags if k.startswith(prefix)]
        return sum(self.wake(k) for k in keys)


class Seen:
    """The last value seen of each watched object, so a watch event that changes nothing the loop
    reads (a node's heartbeat, a pod's resourceVersion) wakes no job. Thread-safe."""

    def __init__(self) -> None:
        self._last: dict[str, object] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._last)

    def changed(self, key: str, value: object) -> bool:
        """Remember ``value`` for ``key`` (None: the object is gone, forget it); whether it differs
        from the value seen before (a first sight and a deletion are changes)."""
        with self._lock:
            if value is None:
                return self._last.pop(key, None) is not None
            before = self._last.get(key)
            self._last[key] = value
            return before != value


async def drive(
    key: str,
    wakeups: Wakeups,
    lanes: Lanes,
    step: Callable[[], float],
    choose_lane: Callable[[bool], int],
    stop: asyncio.Event,
    *,
    debounce_s: float = 0.1,
    error_delay: Callable[[BaseException], float] = lambda err: 10.0,
    gate: StepGate | None = None,
) -> int:
    """Step one job now, then each time it is woken or its next deadline comes, until ``stop`` is set.

    Args:
        key: The job's key in ``wakeups``.
        wakeups: Where the watch-event handlers wake it.
        lanes: The threads that run the steps.
        step: One step (blocking; run on a lane thread); returns the seconds until the next
            time-based deadline (:func:`next_wake`).
        choose_lane: The lane of the next step (:func:`lane`), asked just before it is queued, with
            whether an event asked for the step (the first step counts as one) or only a timer.
        stop: Set when the job is gone, finished, or the operator exits.
        debounce_s: Wait this long after a wake-up before queueing the step (a burst is one step).
        error_delay: Seconds to wait after a step raised (it is logged), from the error.
        gate: Holds the step back while too many run at once (:class:`StepGate`); None: never.

    Returns:
        The number of steps run.
    """
    flag = wakeups.register(key)
    steps = 0
    woken = True
    try:
        while not stop.is_set():
            flag.clear()  # a wake-up during the step sets it again: no event is lost
            chosen = choose_lane(woken)
            held = gate is not None and await gate.acquire(chosen)
            took = [0.0]
            try:
                delay = await asyncio.wrap_future(lanes.submit(chosen, functools.partial(_timed, step, took)))
            except Exception as err:  # the job's step failed: logged, retried after the delay
                log.warning("step of %s failed: %s", key, err, exc_info=not isinstance(err, RuntimeError))
                delay = error_delay(err)
            finally:
                if held and gate is not None:
                    await gate.release(took[0])
            steps += 1
            woken = await _woken(flag, stop, delay)
            if woken and debounce_s > 0:
                await asyncio.sleep(debounce_s)
    finally:
        wakeups.unregister(key, flag)
    return steps


def _timed(step: Callable[[], float], took: list[float]) -> float:
    """Run ``step`` (on a lane thread) and put its wall time in ``took[0]``."""
    t0 = time.perf_counter()
    try:
        return step()
    finally:
        took[0] = time.perf_counter() - t0


async def _woken(flag: asyncio.Event, stop: asyncio.Event, timeout: float) -> bool:
    """Wait for the flag, ``stop`` or the timeout; whether the flag was set."""
    waits = {asyncio.ensure_future(flag.wait()), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return flag.is_set() and not stop.is_set()
