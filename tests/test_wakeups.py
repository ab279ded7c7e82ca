"""When jobs are stepped (controller/wakeups.py): lanes, time-based deadlines, wake-ups, the per-job driver."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuscaler.api.events import set_condition
from gpuscaler.api.status import NoticeStatus, Phase, TrainingJobStatus, UnavailableOffering
from gpuscaler.cloud import NodeState
from gpuscaler.cloud.nodes import node_state
from gpuscaler.controller.interruptions import SpotConfig
from gpuscaler.controller.wakeups import (
    Lane,
    Lanes,
    Seen,
    StepGate,
    WakeConfig,
    Wakeups,
    drive,
    lane,
    next_wake,
)
from gpuscaler.kube.admission import RECHECK_S
from gpuscaler.names import INTERRUPTION_ANNOTATION, ConditionType
from gpuscaler.settings import Settings
from loop_harness import node_body

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
CFG = WakeConfig.from_settings(Settings(resync_interval_s=60, reconcile_interval_s=1, gang_timeout_s=600))
SPOT = SpotConfig.from_settings(Settings())


def node(ready: bool = True, notice: bool = False, deleting: bool = False) -> NodeState:
    return node_state(
        node_body(
            "n-0",
            instance_type="p3.2xlarge",
            capacity_type="spot",
            ready="True" if ready else "False",
            annotations={INTERRUPTION_ANNOTATION: "test"} if notice else None,
            deleting=deleting,
        )
    )


def status(phase: Phase, **kw: Any) -> TrainingJobStatus:
    return TrainingJobStatus(phase=phase, **kw)


@pytest.mark.parametrize(
    ("st", "nodes", "want"),
    [
        (status(Phase.PENDING), [], Lane.WAITING),
        (status(Phase.PLANNING), [], Lane.WAITING),
        (status(Phase.PROVISIONING), [node(ready=False)], Lane.ACTIVE),
        (status(Phase.RUNNING), [node()], Lane.ACTIVE),
        (status(Phase.RUNNING), [node(notice=True)], Lane.INTERRUPTION),
        (status(Phase.RUNNING), [node(deleting=True)], Lane.INTERRUPTION),
        (status(Phase.CHECKPOINTING), [node()], Lane.INTERRUPTION),
        (status(Phase.RECOVERING), [], Lane.INTERRUPTION),
        (status(Phase.SUCCEEDED), [node()], Lane.WAITING),
    ],
)
def test_lane_puts_interruptions_first_and_waiting_jobs_last(
    st: TrainingJobStatus, nodes: list[NodeState], want: Lane
) -> None:
    assert lane(st, nodes, NOW, SPOT) is want


def test_a_step_only_a_timer_asked_for_goes_last_unless_it_is_an_interruption() -> None:
    assert lane(status(Phase.RUNNING), [node()], NOW, SPOT, woken=False) is Lane.REFRESH
    assert lane(status(Phase.PENDING), [], NOW, SPOT, woken=False) is Lane.REFRESH
    assert lane(status(Phase.CHECKPOINTING), [node()], NOW, SPOT, woken=False) is Lane.INTERRUPTION
    assert lane(status(Phase.RUNNING), [node(notice=True)], NOW, SPOT, woken=False) is Lane.INTERRUPTION


def test_lanes_age_so_none_starves() -> None:
    now = [0.0]
    lanes = Lanes(1, clock=lambda: now[0])
    gate = threading.Event()
    ran: list[str] = []
    blocker = lanes.submit(Lane.ACTIVE, gate.wait)
    while not blocker.running():
        time.sleep(0.01)
    futures = [
        lanes.submit(Lane.WAITING, lambda: ran.append("plan@0")),
        lanes.submit(Lane.REFRESH, lambda: ran.append("refresh@0")),
    ]
    now[0] = 2.0  # two seconds later: active steps keep coming
    futures += [lanes.submit(Lane.ACTIVE, lambda: ran.append("active@2"))]
    now[0] = 31.0
    futures += [lanes.submit(Lane.ACTIVE, lambda: ran.append("active@31"))]
    futures += [lanes.submit(Lane.INTERRUPTION, lambda: ran.append("notice@31"))]
    gate.set()
    for f in futures:
        f.result(timeout=10)
    lanes.close()
    # the plan queued first goes before active steps queued over a second later; the refresh before
    # those queued more than 30 s after it; the notice before everything
    assert ran == ["notice@31", "plan@0", "active@2", "refresh@0", "active@31"]


def test_next_wake_is_the_resync_unless_time_matters() -> None:
    assert next_wake(status(Phase.PENDING), [], NOW, CFG) == 60.0
    assert next_wake(status(Phase.SUCCEEDED), [], NOW, CFG) == 60.0
    assert next_wake(status(Phase.SUCCEEDED, nodes=["n-0"]), [node()], NOW, CFG) == 1.0  # still to release
    assert CFG.cost_refresh_s == 30.0
    assert next_wake(status(Phase.RUNNING), [node()], NOW, CFG) == 30.0  # cost and ETA refresh
    assert next_wake(status(Phase.RUNNING), [node(ready=False)], NOW, CFG) == 1.0  # NotReady: grace runs
    assert next_wake(status(Phase.CHECKPOINTING), [node()], NOW, CFG) == 1.0
    assert next_wake(status(Phase.RECOVERING), [], NOW, CFG) == 1.0
    notice = NoticeStatus(request_id="r", node="n-0", signal="annotation", noticed_at=NOW)
    assert next_wake(status(Phase.RUNNING, notice=notice), [node()], NOW, CFG) == 1.0


def test_a_job_waiting_for_the_admission_policy_is_stepped_at_its_recheck() -> None:
    st = status(Phase.PENDING)
    set_condition(st, ConditionType.WORKER_ADMISSION, False, "PolicyMissing", "not installed", NOW, 1)
    assert next_wake(st, [], NOW, CFG) == CFG.admission_recheck_s == RECHECK_S


def test_next_wake_meets_the_gang_timeout_and_the_end_of_a_back_off() -> None:
    started = NOW - timedelta(seconds=590)
    got = next_wake(status(Phase.PROVISIONING, provisioning_started_at=started), [], NOW, CFG)
    assert got == pytest.approx(10.0 + CFG.min_s)
    late = NOW - timedelta(seconds=900)
    assert next_wake(status(Phase.STARTING, provisioning_started_at=late), [], NOW, CFG) == CFG.min_s
    back_off = UnavailableOffering(
        instance_type="p3.2xlarge", capacity_type="spot", until=NOW + timedelta(seconds=5), reason="short"
    )
    assert next_wake(status(Phase.PLANNING, unavailable=[back_off]), [], NOW, CFG) == pytest.approx(
        5.0 + CFG.min_s
    )


def test_a_gang_coming_up_is_stepped_when_its_wait_is_to_be_said() -> None:
    assert CFG.progress_event_after_s == 30.0
    asked = NOW - timedelta(seconds=12)  # nodes asked for 12 s ago: said at 30 s (controller/bringup.py)
    got = next_wake(status(Phase.PROVISIONING, provisioning_started_at=asked), [], NOW, CFG)
    assert got == pytest.approx(18.0 + CFG.min_s)
    st = status(Phase.STARTING, provisioning_started_at=asked)
    set_condition(st, ConditionType.NODES_READY, True, "NodesReady", "1 node(s) Ready", NOW - timedelta(seconds=5), 1)
    # the workers' wait counts from their nodes being Ready
    assert next_wake(st, [node()], NOW, CFG) == pytest.approx(25.0 + CFG.min_s)
    said = status(Phase.PROVISIONING, provisioning_started_at=NOW - timedelta(seconds=45))
    assert next_wake(said, [], NOW, CFG) == 30.0  # past: the cost refresh (the wait was said at 30 s)


def test_lanes_run_the_most_urgent_first_and_keep_order_within_a_lane() -> None:
    lanes = Lanes(1)
    gate = threading.Event()
    ran: list[str] = []
    blocker = lanes.submit(Lane.WAITING, gate.wait)  # holds the one thread while the rest queue
    while not blocker.running():
        time.sleep(0.01)
    futures = [
        lanes.submit(Lane.WAITING, lambda: ran.append("plan-a")),
        lanes.submit(Lane.WAITING, lambda: ran.append("plan-b")),
        lanes.submit(Lane.ACTIVE, lambda: ran.append("running")),
        lanes.submit(Lane.INTERRUPTION, lambda: ran.append("notice")),
    ]
    assert lanes.queued() == 4
    gate.set()
    blocker.result(timeout=10)
    for f in futures:
        f.result(timeout=10)
    assert ran == ["notice", "running", "plan-a", "plan-b"]

    def boom() -> None:
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        lanes.submit(Lane.ACTIVE, boom).result(timeout=10)
    lanes.close()
    with pytest.raises(ValueError, match="at least 1"):
        Lanes(0)


def test_seen_tells_a_change_from_a_repeat() -> None:
    seen = Seen()
    assert seen.changed("pod/a", ("Pending", None))  # first sight
    assert not seen.changed("pod/a", ("Pending", None))  # a heartbeat-like repeat
    assert seen.changed("pod/a", ("Running", "n-0"))
    assert seen.changed("pod/a", None)  # deleted
    assert not seen.changed("pod/a", None)  # never known
    assert len(seen) == 0


class Steps:
    """A step that counts its calls and returns a fixed delay (optionally raising first)."""

    def __init__(self, delay: float, fail: int = 0) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = fail

    def __call__(self) -> float:
        self.calls += 1
        if self.calls <= self.fail:
            raise RuntimeError("API server unreachable")
        return self.delay


def test_a_wake_up_steps_the_job_at_once_and_a_burst_is_one_step() -> None:
    async def scenario() -> tuple[int, int, int]:
        wakeups, lanes, stop = Wakeups(), Lanes(2), asyncio.Event()
        step = Steps(delay=3600.0)  # no time-based step within the test
        task = asyncio.ensure_future(
            drive("ns.job", wakeups, lanes, step, lambda woken: Lane.ACTIVE, stop, debounce_s=0.2)
        )
        while step.calls < 1:  # the first step runs at once
            await asyncio.sleep(0.01)
        first = step.calls
        for _ in range(10):  # a burst of watch events of one change, before the driver runs again
            assert wakeups.wake("ns.job")
        await asyncio.sleep(1.0)
        after_burst = step.calls
        threading.Thread(target=wakeups.wake, args=("ns.job",)).start()  # from a kopf executor thread
        await asyncio.sleep(1.0)
        stop.set()
        steps = await asyncio.wait_for(task, 10)
        lanes.close()
        assert not wakeups.wake("ns.job")  # its driver ended: nothing to wake
        return first, after_burst, steps

    first, after_burst, steps = asyncio.run(scenario())
    assert first == 1
    assert after_burst == 2  # ten wake-ups: one step
    assert steps == 3


def test_without_events_the_job_is_stepped_at_its_deadline_and_after_a_failure_at_the_retry_delay() -> None:
    asked: list[bool] = []

    def choose(woken: bool) -> int:
        asked.append(woken)
        return Lane.WAITING

    async def scenario() -> int:
        wakeups, lanes, stop = Wakeups(), Lanes(1), asyncio.Event()
        step = Steps(delay=0.3, fail=1)
        task = asyncio.ensure_future(
            drive("ns.job", wakeups, lanes, step, choose, stop, error_delay=lambda err: 0.1)
        )
        await asyncio.sleep(1.0)  # fail, 0.1 s, then a step every 0.3 s: at most 1 + 3 more
        stop.set()
        await asyncio.wait_for(task, 10)
        lanes.close()
        return step.calls

    calls = asyncio.run(scenario())
    assert 2 <= calls <= 5  # retried after the failure, then stepped on its deadline (no events)
    assert asked[0] is True and not any(
        asked[1:]
    )  # the first step counts as asked for; the rest are the timer's


def test_wake_all_wakes_a_namespaces_jobs() -> None:
    async def scenario() -> tuple[int, int, int]:
        wakeups = Wakeups()
        for key in ("a.one", "a.two", "b.one"):
            wakeups.register(key)
        return wakeups.wake_all("a."), wakeups.wake_all(), len(wakeups)

    assert asyncio.run(scenario()) == (2, 3, 3)


def test_the_gate_narrows_on_slow_steps_and_widens_on_fast_ones() -> None:
    gate = StepGate(8, slow_s=0.2)
    for _ in range(3):
        gate.adapt(0.5)
    assert gate.limit == pytest.approx(8 * 0.8**3)
    for _ in range(50):
        gate.adapt(0.5)
    assert gate.limit == 1.0  # never below the floor
    for _ in range(200):
        gate.adapt(0.01)
    assert gate.limit == 8.0  # never above the step threads
    assert not StepGate(8, slow_s=0).enabled


def test_the_gate_holds_back_steps_but_never_an_interruption() -> None:
    async def scenario() -> tuple[bool, bool, bool, bool]:
        gate = StepGate(8, slow_s=0.2)
        gate.limit = 1.0
        assert await gate.acquire(Lane.ACTIVE)
        second = asyncio.ensure_future(gate.acquire(Lane.WAITING))
        await asyncio.sleep(0.05)
        waited = not second.done()
        urgent = await asyncio.wait_for(gate.acquire(Lane.INTERRUPTION), timeout=1)  # no wait, no place
        await gate.release(0.01)
        got = await asyncio.wait_for(second, timeout=1)
        off = await StepGate(8, slow_s=0).acquire(Lane.ACTIVE)
        return waited, urgent, got, off

    assert asyncio.run(scenario()) == (True, False, True, False)


def test_drive_feeds_the_gate_the_steps_time() -> None:
    lanes = Lanes(2)
    gate = StepGate(8, slow_s=0.05)

    def slow_step() -> float:
        time.sleep(0.1)
        return 60.0

    async def scenario() -> tuple[int, int]:
        wakeups, stop = Wakeups(), asyncio.Event()
        task = asyncio.ensure_future(
            drive("ns.a", wakeups, lanes, slow_step, lambda woken: Lane.ACTIVE, stop, debounce_s=0, gate=gate)
        )
        for _ in range(3):
            await asyncio.sleep(0.15)
            wakeups.wake("ns.a")
        await asyncio.sleep(0.15)
        stop.set()
        return await task, gate.running

    try:
        steps, running = asyncio.run(scenario())
    finally:
        lanes.close()
    assert steps >= 3 and running == 0
    assert gate.limit == pytest.approx(8 * 0.8**steps)
