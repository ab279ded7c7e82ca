"""Tests of TrainingGuard in-process (fake clocks), config parsing, schedule, reporters and metrics."""

from __future__ import annotations

import json
import signal
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuscaler.runtime import EXIT_PREEMPTED, PlanEnv, TrainingGuard
from gpuscaler.runtime.checkpoint import CheckpointStore
from gpuscaler.runtime.config import GuardConfig, RuntimeConfigError
from gpuscaler.runtime.constants import (
    ANNOTATION_CHECKPOINT_ACK,
    ANNOTATION_CHECKPOINT_REQUESTED,
    ANNOTATION_CHECKPOINT_STEP,
    ANNOTATION_PROGRESS_STEP,
)
from gpuscaler.runtime.guard import GuardUsageError
from gpuscaler.runtime.metrics import RuntimeMetrics, serve_metrics
from gpuscaler.runtime.progress import CheckpointEvent, FileReporter, Progress, ProgressReporter
from gpuscaler.runtime.schedule import CheckpointSchedule


class FakeClock:
    """Monotonic and wall clock in one, advanced by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1.7e9 + self.now


@dataclass
class RecordingReporter:
    reports: list[Progress] = field(default_factory=list)
    events: list[CheckpointEvent] = field(default_factory=list)

    def report(self, progress: Progress) -> None:
        self.reports.append(progress)

    def checkpointed(self, event: CheckpointEvent, progress: Progress) -> None:
        self.events.append(event)
        self.reports.append(progress)


def make_guard(tmp_path: Path, clock: FakeClock, **kwargs: object) -> TrainingGuard[int]:
    return TrainingGuard(
        tmp_path / "ck",
        clock=clock,
        wall_clock=clock.wall,
        handle_signals=False,
        **kwargs,  # type: ignore[arg-type]
    )


def run(
    guard: TrainingGuard[int], state: int, start: int, stop: int, clock: FakeClock, *, dt: float = 1.0
) -> int:
    for step in guard.steps(start, stop):
        clock.now += dt
        state += 1
        guard.completed(step, state, samples=4)
    return state


# --- schedule -------------------------------------------------------------------------------


def test_schedule_interval_seconds_with_fake_clock() -> None:
    clock = FakeClock()
    schedule = CheckpointSchedule(interval_s=10.0, clock=clock)
    schedule.mark(0)
    clock.now += 9.9
    assert not schedule.due(5)
    clock.now += 0.1
    assert schedule.due(5)
    assert not schedule.due(0)  # nothing new since the last checkpoint
    schedule.mark(5)
    assert not schedule.due(6)
    clock.now += 10
    assert schedule.due(6)


def test_schedule_steps_and_both() -> None:
    clock = FakeClock()
    schedule = CheckpointSchedule(interval_s=100.0, every_steps=3, clock=clock)
    schedule.mark(10)
    assert [schedule.due(s) for s in (11, 12, 13)] == [False, False, True]
    clock.now += 100
    assert schedule.due(11)
    disabled = CheckpointSchedule(interval_s=0, every_steps=None, clock=clock)
    clock.now += 1e9
    assert not disabled.due(1_000_000)


def test_guard_checkpoints_on_interval_with_fake_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, interval_s=5.0, keep=10)
    state, start = guard.resume(0)
    assert (state, start) == (0, 0)
    run(guard, state, start, 12, clock, dt=1.0)
    steps = sorted(s for s, _ in guard.store.list_steps())
    assert steps == [5, 10, 12]  # every 5 s of 1-s steps, plus the final one
    last = guard.store.latest()
    assert last is not None and last.reason == "final" and last.samples == 48


def test_resume_continues_where_the_checkpoint_left_off(tmp_path: Path) -> None:
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, every_steps=4)
    state, start = guard.resume(0)
    for step in guard.steps(start, 100):
        state += 1
        guard.completed(step, state, samples=2)
        if step == 9:
            break  # a crash after step 9: steps 8 and 9 are lost
    guard.close()
    again = make_guard(tmp_path, clock, every_steps=4)
    state, start = again.resume(0)
    assert (state, start, again.samples) == (8, 8, 16)
    assert run(again, state, start, 20, clock) == 20


# --- stop on SIGTERM ------------------------------------------------------------------------


def test_sigterm_checkpoints_current_step_and_exits_75(tmp_path: Path) -> None:
    clock = FakeClock()
    reporter = RecordingReporter()
    guard = make_guard(tmp_path, clock, interval_s=None, reporter=reporter)
    state, start = guard.resume(0)
    with pytest.raises(SystemExit) as exc:
        for step in guard.steps(start, 100):
            state += 1
            clock.now += 0.5
            if step == 6:
                guard.request_stop()  # as the SIGTERM handler does, mid-step
            guard.completed(step, state)
    assert exc.value.code == EXIT_PREEMPTED == 75
    latest = guard.store.latest()
    assert latest is not None and (latest.step, latest.reason) == (7, "sigterm")
    assert reporter.events[-1].notice_latency_s == pytest.approx(0.0)
    assert reporter.reports[-1].phase == "preempted"
    assert guard.metrics.stop_requested


def test_sigterm_with_exit_on_stop_false_ends_the_loop(tmp_path: Path) -> None:
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, exit_on_stop=False)
    state, start = guard.resume(0)
    seen = []
    for step in guard.steps(start, 100):
        seen.append(step)
        if step == 3:
            guard.request_stop()
        assert guard.completed(step, state + step) == (step == 3)
    assert seen == [0, 1, 2, 3] and guard.preempted
    latest = guard.store.latest()
    assert latest is not None and latest.step == 4


def test_real_sigterm_handler_is_installed_and_restored(tmp_path: Path) -> None:
    clock = FakeClock()
    before = signal.getsignal(signal.SIGTERM)
    guard: TrainingGuard[int] = TrainingGuard(tmp_path, clock=clock, exit_on_stop=False)
    state, start = guard.resume(0)
    for step in guard.steps(start, 10):
        if step == 2:
            signal.raise_signal(signal.SIGTERM)
        guard.completed(step, state)
    assert guard.preempted and guard.step == 3
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_after_the_last_step_keeps_final_checkpoint_and_exits_75(tmp_path: Path) -> None:
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, interval_s=None)
    state, start = guard.resume(0)
    with pytest.raises(SystemExit) as exc:
        for step in guard.steps(start, 3):
            guard.completed(step, state + step)
            if step == 2:
                guard.request_stop()  # between the last completed() and the end of the loop
    assert exc.value.code == EXIT_PREEMPTED
    latest = guard.store.latest()
    assert latest is not None and (latest.step, latest.reason) == (3, "final")


def test_reader_guard_loads_but_never_writes(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = make_guard(tmp_path, clock, every_steps=2)
    run(writer, *writer.resume(0), 4, clock)
    reporter = RecordingReporter()
    reader = make_guard(tmp_path, clock, every_steps=1, writer=False, reporter=reporter)
    state, start = reader.resume(0)
    assert (state, start) == (4, 4)
    run(reader, state, start, 8, clock)
    assert reader.store.list_steps()[0][0] == 4
    assert reporter.events == []


def test_sigterm_already_checkpointed_step_is_not_saved_twice(tmp_path: Path) -> None:
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, every_steps=5, exit_on_stop=False)
    state, start = guard.resume(0)
    saved = []
    original = guard.store.save

    def spy(step: int, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        saved.append(step)
        return original(step, *args, **kwargs)  # type: ignore[arg-type]

    guard.store.save = spy  # type: ignore[method-assign]
    for step in guard.steps(start, 10):
        guard.completed(step, state)
        if step == 4:
            guard.request_stop()  # arrives during the interval checkpoint at 5
    # Stopped at the next boundary without running step 5 and without re-saving step 5.
    assert saved == [5]
    assert guard.preempted and guard.step == 5


# --- notice via annotation ------------------------------------------------------------------


def test_annotation_request_checkpoints_and_acks(tmp_path: Path) -> None:
    clock = FakeClock()
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    reporter = RecordingReporter()
    guard = make_guard(tmp_path, clock, interval_s=None, podinfo_dir=podinfo, reporter=reporter)
    state, start = guard.resume(0)
    for step in guard.steps(start, 20):
        state += 1
        if step == 7:
            (podinfo / "annotations").write_text(f'{ANNOTATION_CHECKPOINT_REQUESTED}="req-42"')
        guard.completed(step, state)
    notice = [e for e in reporter.events if e.reason == "notice"]
    assert len(notice) == 1  # answered once, not at every later step
    assert (notice[0].step, notice[0].request_id) == (8, "req-42")
    ack_reports = [p for p in reporter.reports if p.checkpoint_ack == "req-42"]
    assert ack_reports[0].annotations()[ANNOTATION_CHECKPOINT_ACK] == "req-42"
    assert ack_reports[0].annotations()[ANNOTATION_CHECKPOINT_STEP] == "8"
    # A restarted worker that resumes from the notice checkpoint does not answer it again.
    store = CheckpointStore(tmp_path / "ck")
    store.prune()
    info = store.verify(store.directory / "step-000000000008")
    assert info.request_id == "req-42"


def test_resumed_request_id_is_not_answered_again(tmp_path: Path) -> None:
    clock = FakeClock()
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "annotations").write_text(f'{ANNOTATION_CHECKPOINT_REQUESTED}="req-1"')
    first = make_guard(tmp_path, clock, interval_s=None, podinfo_dir=podinfo, exit_on_stop=False)
    state, start = first.resume(0)
    for step in first.steps(start, 3):
        first.completed(step, state)
        if step == 0:
            first.request_stop()
    reporter = RecordingReporter()
    second = make_guard(tmp_path, clock, interval_s=None, podinfo_dir=podinfo, reporter=reporter)
    state, start = second.resume(0)
    assert start == 1  # the notice checkpoint after step 0 (the SIGTERM one was the same step)
    run(second, state, start, 5, clock)
    assert [e.reason for e in reporter.events] == ["final"]


def test_manual_request_checkpoint(tmp_path: Path) -> None:
    clock = FakeClock()
    reporter = RecordingReporter()
    guard = make_guard(tmp_path, clock, interval_s=None, reporter=reporter)
    state, start = guard.resume(0)
    for step in guard.steps(start, 5):
        if step == 2:
            guard.request_checkpoint("mine")
        guard.completed(step, state)
    assert [(e.reason, e.step, e.request_id) for e in reporter.events] == [
        ("notice", 3, "mine"),
        ("final", 5, None),
    ]


# --- usage, reporting -----------------------------------------------------------------------


def test_forgetting_completed_is_an_error(tmp_path: Path) -> None:
    guard = make_guard(tmp_path, FakeClock())
    guard.resume(0)
    with pytest.raises(GuardUsageError, match=r"call guard.completed\(0, state\)"):
        for _ in guard.steps(0, 3):
            pass
    with pytest.raises(GuardUsageError):
        for step in guard.steps(0, 3):
            guard.completed(step + 1, 0)


def test_periodic_reports_are_rate_limited(tmp_path: Path) -> None:
    clock = FakeClock()
    reporter = RecordingReporter()
    guard = make_guard(tmp_path, clock, interval_s=None, reporter=reporter, report_interval_s=10.0)
    state, start = guard.resume(0)
    run(guard, state, start, 50, clock, dt=1.0)
    steps = [p.step for p in reporter.reports]
    assert steps[0] == 0 and steps[-1] == 50 and reporter.reports[-1].phase == "finished"
    writes = 1  # the final checkpoint's write is reported as it begins (gpuscaler.io/checkpoint-writing)
    assert len(steps) <= 1 + 50 // 10 + 2 + writes


def test_failing_reporter_does_not_stop_training(tmp_path: Path) -> None:
    class Broken:
        def report(self, progress: Progress) -> None:
            raise RuntimeError("api server down")

        def checkpointed(self, event: CheckpointEvent, progress: Progress) -> None:
            raise RuntimeError("api server down")

    assert isinstance(Broken(), ProgressReporter)
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, every_steps=2, reporter=Broken())
    state, start = guard.resume(0)
    assert run(guard, state, start, 5, clock) == 5


def test_from_env_file_reporter_and_pickle_default(tmp_path: Path) -> None:
    env = {
        "GPUSCALER_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "GPUSCALER_CHECKPOINT_EVERY_STEPS": "2",
        "GPUSCALER_CHECKPOINT_KEEP": "2",
        "GPUSCALER_PROGRESS_FILE": str(tmp_path / "status" / "progress.json"),
    }
    clock = FakeClock()
    guard: TrainingGuard[dict[str, list[int]]] = TrainingGuard.from_env(
        env=env, clock=clock, wall_clock=clock.wall, handle_signals=False
    )
    state, start = guard.resume({"w": []})
    for step in guard.steps(start, 5):
        state = {"w": [*state["w"], step]}
        guard.completed(step, state, samples=8)
    assert [s for s, _ in guard.store.list_steps()] == [5, 4]
    status = json.loads((tmp_path / "status" / "progress.json").read_text())
    assert status["step"] == 5 and status["samples"] == 40 and status["phase"] == "finished"
    assert status["annotations"][ANNOTATION_PROGRESS_STEP] == "5"
    assert status["last_checkpoint"]["reason"] == "final"
    again: TrainingGuard[dict[str, list[int]]] = TrainingGuard.from_env(env=env, handle_signals=False)
    assert again.resume({"w": []}) == ({"w": [0, 1, 2, 3, 4]}, 5)


def test_file_reporter_writes_atomically(tmp_path: Path) -> None:
    reporter = FileReporter(tmp_path / "p.json")
    reporter.report(Progress(3, 30, None, None, None, "running", 0.0))
    assert json.loads((tmp_path / "p.json").read_text())["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


# --- config -----------------------------------------------------------------------------------


def test_plan_env() -> None:
    env = {"GPUSCALER_PRECISION": "BF16", "GPUSCALER_MICRO_BATCH": "8", "GPUSCALER_ACCUMULATION_STEPS": "4"}
    plan = PlanEnv.from_env(env)
    assert plan == PlanEnv("bf16", 8, 4)
    assert plan.samples_per_step(world_size=2) == 64
    assert PlanEnv.from_env({}) == PlanEnv()
    with pytest.raises(RuntimeConfigError, match="GPUSCALER_PRECISION='fp13'"):
        PlanEnv.from_env({"GPUSCALER_PRECISION": "fp13"})
    with pytest.raises(RuntimeConfigError, match="GPUSCALER_MICRO_BATCH=0 must be >= 1"):
        PlanEnv.from_env({"GPUSCALER_MICRO_BATCH": "0"})


def test_guard_config_from_env() -> None:
    config = GuardConfig.from_env(
        {
            "GPUSCALER_CHECKPOINT_DIR": "/ck",
            "GPUSCALER_CHECKPOINT_INTERVAL_S": "90.5",
            "GPUSCALER_PODINFO_DIR": "/etc/podinfo",
            "GPUSCALER_METRICS_PORT": "9400",
        }
    )
    assert config == GuardConfig(Path("/ck"), 90.5, None, 3, Path("/etc/podinfo"), 9400, None)
    assert GuardConfig.from_env({}, checkpoint_dir="/x").interval_s == 600.0
    assert (
        GuardConfig.from_env({"GPUSCALER_CHECKPOINT_EVERY_STEPS": "5"}, checkpoint_dir="/x").interval_s
        is None
    )
    with pytest.raises(RuntimeConfigError, match="set GPUSCALER_CHECKPOINT_DIR"):
        GuardConfig.from_env({})
    with pytest.raises(RuntimeConfigError, match="'soon' is not a number"):
        GuardConfig.from_env({"GPUSCALER_CHECKPOINT_INTERVAL_S": "soon"}, checkpoint_dir="/x")
    with pytest.raises(RuntimeConfigError, match="unknown guard setting"):
        GuardConfig.from_env({}, checkpoint_dir="/x", bogus=1)


# --- metrics ----------------------------------------------------------------------------------


def test_metrics_render_text_format() -> None:
    metrics = RuntimeMetrics()
    metrics.set_progress(120, 3840)
    metrics.observe_checkpoint(100, 1.7e9, 0.3, 1024, "interval")
    text = metrics.render()
    assert "gpuscaler_runtime_step 120\n" in text
    assert "gpuscaler_runtime_samples_total 3840\n" in text
    assert "gpuscaler_runtime_last_checkpoint_step 100\n" in text
    assert 'gpuscaler_runtime_checkpoint_seconds_bucket{le="0.25"} 0\n' in text
    assert 'gpuscaler_runtime_checkpoint_seconds_bucket{le="0.5"} 1\n' in text
    assert "gpuscaler_runtime_checkpoint_seconds_count 1\n" in text
    assert 'gpuscaler_runtime_checkpoints_total{reason="interval"} 1\n' in text
    assert "# TYPE gpuscaler_runtime_checkpoint_seconds histogram" in text


@pytest.mark.parametrize("prefer_client", [False, True])
def test_metrics_served_over_http(prefer_client: bool) -> None:
    if prefer_client:
        pytest.importorskip("prometheus_client")
    metrics = RuntimeMetrics()
    metrics.set_progress(7, 70)
    metrics.observe_checkpoint(5, 1.7e9, 0.02, 10, "notice")
    server = serve_metrics(metrics, 0, "127.0.0.1", prefer_prometheus_client=prefer_client)
    try:
        metrics.set_progress(8, 80)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        server.close()
    assert "gpuscaler_runtime_step 8" in body
    assert "gpuscaler_runtime_samples_total 80" in body
    assert "gpuscaler_runtime_last_checkpoint_step 5" in body
    assert "gpuscaler_runtime_checkpoint_seconds_count 1" in body


def test_import_pulls_no_framework_client_or_exporter() -> None:
    import subprocess
    import sys

    heavy = ("kubernetes", "kopf", "prometheus_client", "numpy", "torch", "http.server", "pydantic")
    code = f"import sys, gpuscaler.runtime; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
