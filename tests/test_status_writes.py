"""When a step's status is written (controller/status_writes.py): at once, held a moment, or not at all."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscaler.controller.status_writes import Write, decide, hold_left_s

PROVISIONING = {"phase": "Provisioning", "message": "0/1 nodes Ready", "costUsd": 0.01}
STARTING = {"phase": "Starting", "message": "0/1 workers running", "costUsd": 0.01}
RUNNING = {"phase": "Running", "message": "1 worker(s) running", "costUsd": 0.01}


def decided(server: dict[str, Any], new: dict[str, Any], held_for_s: float | None = None, since_write_s: float = 1.0) -> Write:
    return decide(server, new, held_for_s=held_for_s, since_write_s=since_write_s, refresh_s=300.0, hold_s=3.0)


def test_a_new_jobs_way_up_is_held_until_the_hold_ends() -> None:
    assert decided({}, PROVISIONING) is Write.HOLD  # planned, nodes asked for: no status yet
    assert decided({"phase": "Pending"}, PROVISIONING, held_for_s=1.0) is Write.HOLD
    assert decided({}, STARTING, held_for_s=2.0) is Write.HOLD  # nodes Ready at once
    assert decided(PROVISIONING, STARTING) is Write.HOLD
    assert decided(PROVISIONING, {**PROVISIONING, "message": "1/2 nodes Ready"}) is Write.HOLD
    assert decided(PROVISIONING, STARTING, held_for_s=2.9) is Write.HOLD
    assert decided(PROVISIONING, STARTING, held_for_s=3.0) is Write.NOW
    assert decided(PROVISIONING, {**STARTING, "message": "1/2 workers running"}, held_for_s=1.0) is Write.HOLD
    # written once Starting, a change within Starting is held as well
    assert decided(STARTING, {**STARTING, "message": "1/2 workers running"}) is Write.HOLD
    assert decide(PROVISIONING, STARTING, held_for_s=None, since_write_s=1, refresh_s=300, hold_s=0) is Write.NOW


@pytest.mark.parametrize(
    ("server", "new"),
    [
        ({}, {"phase": "Pending"}),  # a new job a policy stops, or that waits for its capacity window
        ({}, {"phase": "Failed"}),  # an invalid spec
        ({}, RUNNING),  # the held way up and the workers running: one write
        (PROVISIONING, RUNNING),
        (STARTING, RUNNING),
        ({"phase": "Recovering"}, PROVISIONING),  # a gang's way up again after an interruption
        ({"phase": "Recovering"}, STARTING),
        ({"phase": "Queued"}, PROVISIONING),  # Kueue admitted the gang
        (RUNNING, {**RUNNING, "phase": "Checkpointing"}),
    ],
)
def test_everything_else_is_written_at_once(server: dict[str, Any], new: dict[str, Any]) -> None:
    assert decided(server, new, held_for_s=1.0) is Write.NOW
    assert decided(server, new) is Write.NOW


def test_cost_and_eta_alone_wait_for_their_refresh_and_no_change_is_no_write() -> None:
    assert decided(RUNNING, dict(RUNNING)) is Write.NONE
    moved = {**RUNNING, "costUsd": 0.02}
    assert decided(RUNNING, moved, since_write_s=10) is Write.NONE
    assert decided(RUNNING, moved, since_write_s=300) is Write.NOW
    # a step back to what the server has drops what was held (nothing to write)
    assert decided(PROVISIONING, dict(PROVISIONING), held_for_s=1.0) is Write.NONE


def test_the_time_left_of_a_hold() -> None:
    assert hold_left_s(None, 3.0) is None
    assert hold_left_s(1.0, 3.0) == 2.0
    assert hold_left_s(5.0, 3.0) == 0.0


def test_planned_is_held_with_the_status_and_said_in_started_when_the_gang_runs_within_the_hold() -> None:
    from gpuscaler.api.events import Event
    from gpuscaler.controller.status_writes import fold_held_events

    planned = Event("Normal", "Planned", "1 x p4d.24xlarge on-demand: expected 1.00 h")
    started = Event("Normal", "Started", "all 8 worker(s) started (requested, running +2.1s)")
    other = Event("Warning", "PricesStale", "stale")
    # held: Planned kept, everything else posted
    post, keep = fold_held_events([], [planned, other], holding=True)
    assert post == [other] and keep == [planned]
    # written with the start: one Started Event that says the plan
    post, keep = fold_held_events(keep, [started], holding=False)
    assert keep == [] and [e.reason for e in post] == ["Started"]
    assert post[0].message == f"{started.message}; planned {planned.message}"
    # written before the start (the hold ended): Planned posted first, as it was
    post, keep = fold_held_events([planned], [other], holding=False)
    assert post == [planned, other] and keep == []
    # a re-plan within the hold: the latest plan is the one said
    newer = Event("Normal", "Planned", "2 x g5.12xlarge spot")
    post, _ = fold_held_events([planned, newer], [started], holding=False)
    assert post[0].message.endswith(f"; planned {newer.message}")
    # nothing held: the step's Events as they are
    assert fold_held_events([], [started], holding=False) == ([started], [])
