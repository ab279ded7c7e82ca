"""Ranks that agree: two guards in two threads, joined by an in-process MAX agreement.

The threads stand in for the ranks of a torchrun job (the real one is tests/test_runtime_torch_ddp.py);
here the stop request can be injected at the exact moment the race needs: right after a rank's
agreement returned, where Python runs a signal handler (a blocking collective just returned).
Also: sharded checkpoints (every rank writes a part, the manifest is written last), a failing
rank, the agreed choice of the checkpoint to resume from, and who reports.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuscaler.runtime import CheckpointError, TrainingGuard
from gpuscaler.runtime.agreement import Agreement, SoloAgreement
from gpuscaler.runtime.checkpoint import MANIFEST_NAME, PAYLOAD_NAME, CheckpointStore
from gpuscaler.runtime.progress import FileReporter, Progress

pytestmark = pytest.mark.timeout(60)


class Table:
    """What the threads share: a barrier and one slot per rank."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=20)
        self.slots: list[list[int]] = [[] for _ in range(world)]
        self.calls = 0


class ThreadAgreement:
    """Element-wise MAX among threads; ``after`` runs on this rank once each reduction returned."""

    def __init__(self, table: Table, rank: int, after: Callable[[int], None] | None = None) -> None:
        self.table, self._rank, self.after, self.calls = table, rank, after, 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self.table.world

    def max(self, values: Sequence[int]) -> list[int]:
        self.table.slots[self._rank] = list(values)
        self.table.barrier.wait()
        out = [max(col) for col in zip(*self.table.slots, strict=True)]
        self.table.barrier.wait()
        self.calls += 1
        if self.after is not None:
            self.after(self.calls)
        return out

    def barrier(self) -> None:
        self.table.barrier.wait()


def run_ranks(world: int, body: Callable[[int], Any]) -> list[Any]:
    """Run ``body(rank)`` in ``world`` threads; re-raise the first error."""
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = body(rank)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a rank hung"
    if errors:
        raise errors[0]
    return results


def make_guard(tmp_path: Path, agree: Agreement, **kwargs: Any) -> TrainingGuard[dict[str, int]]:
    return TrainingGuard(
        tmp_path / "ck", agree=agree, interval_s=None, handle_signals=False, exit_on_stop=False, **kwargs
    )


def test_stop_injected_right_after_an_agreement_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    table = Table(2)
    guards: list[TrainingGuard[dict[str, int]]] = []
    inject_at = 7
    # Reductions: resume() 1st, steps() before step 0 2nd, completed(k) the (k+3)th: the stop lands
    # after completed(4) agreed "go on" (5 steps done), and is agreed in completed(5).
    stop_step = 6

    def after(calls: int) -> None:
        if calls == inject_at:
            guards[1].request_stop()  # the "signal" lands on rank 1 just after it agreed

    agrees = [ThreadAgreement(table, 0), ThreadAgreement(table, 1, after)]
    guards.extend(make_guard(tmp_path, a, every_steps=100) for a in agrees)

    def body(rank: int) -> tuple[int, bool, list[int]]:
        g = guards[rank]
        state, start = g.resume({"w": 0})
        done = []
        for step in g.steps(start, 50):
            state = {"w": state["w"] + step}
            g.completed(step, state)
            done.append(step)
        return g.step, g.preempted, done

    (s0, p0, d0), (s1, p1, d1) = run_ranks(2, body)
    assert p0 and p1, "both ranks must stop"
    assert s0 == s1 == stop_step, (s0, s1)  # agreed at the next boundary, on both
    assert d0 == d1 == list(range(stop_step))  # completed(5) returned True, then steps() ended
    store = CheckpointStore(tmp_path / "ck", writer=False)
    assert [s for s, _ in store.list_steps()] == [stop_step]


def test_without_agreement_the_same_injection_splits_the_ranks(tmp_path: Path) -> None:
    """The failure the agreement prevents: each rank deciding on its own live flag."""
    guards = [
        TrainingGuard(tmp_path / f"ck{r}", interval_s=None, handle_signals=False, exit_on_stop=False)
        for r in range(2)
    ]
    for g in guards:
        g.resume({"w": 0})
    steps = [iter(g.steps(0, 50)) for g in guards]
    stopped_at: list[int | None] = [None, None]
    for _ in range(50):
        for r in (0, 1):
            if stopped_at[r] is not None:
                continue
            step = next(steps[r], None)
            if step is None:
                stopped_at[r] = guards[r].step
                continue
            guards[r].completed(step, {"w": step})
            if r == 1 and step == 4:
                guards[1].request_stop()
    assert stopped_at[0] != stopped_at[1]


def test_checkpoint_request_seen_by_one_rank_checkpoints_all_once(tmp_path: Path) -> None:
    table = Table(2)
    guards = [make_guard(tmp_path, ThreadAgreement(table, r)) for r in range(2)]

    def body(rank: int) -> list[int]:
        g = guards[rank]
        g.resume({"w": 0})
        for step in g.steps(0, 12):
            if rank == 1 and step == 4:
                g.request_checkpoint("req-1")  # only rank 1 saw the operator's request
            g.completed(step, {"w": step})
        return [s for s, _ in g.store.list_steps()]

    listed = run_ranks(2, body)
    assert listed[0] == listed[1] == [12, 5]  # the agreed notice checkpoint at step 5, the final one


def test_sharded_checkpoint_has_every_rank_part_and_a_manifest_written_last(tmp_path: Path) -> None:
    table = Table(2)

    def save(state: dict[str, int], path: Path) -> None:
        path.mkdir(exist_ok=True)
        rank = state["rank"]
        (path / f"part-{rank}.bin").write_bytes(bytes([rank]) * (1000 + rank))

    def load(path: Path) -> dict[str, int]:
        return {"parts": len(list(path.iterdir()))}

    guards = [
        make_guard(tmp_path, ThreadAgreement(table, r), every_steps=3, sharded=True, save=save, load=load)
        for r in range(2)
    ]

    def body(rank: int) -> tuple[int, dict[str, int]]:
        g = guards[rank]
        g.resume({"rank": rank})
        for step in g.steps(0, 6):
            g.completed(step, {"rank": rank})
        again = make_guard(tmp_path, ThreadAgreement(Table(1), 0))  # a rank alone sees it complete
        return g.step, again.store.verify(g.store.directory / "step-000000000006").files.__len__()

    (s0, n0), (s1, n1) = run_ranks(2, body)
    assert s0 == s1 == 6 and n0 == n1 == 2
    manifest = json.loads((tmp_path / "ck" / "step-000000000006" / MANIFEST_NAME).read_text())
    assert manifest["shards"] == 2
    assert sorted(f["path"] for f in manifest["files"]) == [f"{PAYLOAD_NAME}/part-0.bin", f"{PAYLOAD_NAME}/part-1.bin"]
    # resume: both ranks load the same complete checkpoint
    table2 = Table(2)
    again = [
        make_guard(tmp_path, ThreadAgreement(table2, r), sharded=True, save=save, load=load) for r in range(2)
    ]
    resumed = run_ranks(2, lambda r: again[r].resume({"parts": -1}))
    assert resumed[0] == resumed[1] == ({"parts": 2}, 6)


def test_a_rank_failing_its_shard_fails_every_rank_and_commits_nothing(tmp_path: Path) -> None:
    table = Table(2)

    def save(state: dict[str, int], path: Path) -> None:
        path.mkdir(exist_ok=True)
        if state["rank"] == 1 and state["step"] == 4:
            raise RuntimeError("shard writer broke")
        (path / f"part-{state['rank']}.bin").write_bytes(b"x")

    guards = [
        make_guard(tmp_path, ThreadAgreement(table, r), every_steps=2, sharded=True, save=save) for r in range(2)
    ]

    def body(rank: int) -> str:
        g = guards[rank]
        g.resume({"rank": rank, "step": 0})
        try:
            for step in g.steps(0, 10):
                g.completed(step, {"rank": rank, "step": step + 1})
        except CheckpointError as err:
            return str(err)
        return "no error"

    messages = run_ranks(2, body)
    assert "rank 1" in messages[0] and "nothing was committed" in messages[0], messages
    assert "shard writer broke" in messages[1], messages
    store = CheckpointStore(tmp_path / "ck")
    assert [s for s, _ in store.list_steps()] == [2]  # the earlier one is kept
    assert not [p for p in (tmp_path / "ck").iterdir() if "staging" in p.name]


def test_ranks_agree_to_resume_below_a_checkpoint_one_of_them_finds_corrupt(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")

    def write_two(path: Path) -> None:
        path.mkdir()
        (path / "a").write_bytes(b"A" * 10)
        (path / "b").write_bytes(b"B" * 10)

    store.save(3, write_two)
    newest = store.save(6, write_two)
    # Corrupt the file only rank 1 re-hashes (file 1 of 2); sizes stay, so rank 0 sees nothing wrong.
    (newest.path / PAYLOAD_NAME / "b").write_bytes(b"b" * 10)
    table = Table(2)
    guards = [
        TrainingGuard[Path](
            tmp_path / "ck", agree=ThreadAgreement(table, r), load=lambda p: p, handle_signals=False
        )
        for r in range(2)
    ]
    starts = run_ranks(2, lambda r: guards[r].resume(Path("none"))[1])
    assert starts == [3, 3]
    assert [s for s, _ in store.list_steps()] == [3]  # the writer set step 6 aside


def test_only_the_writer_reports_by_default(tmp_path: Path) -> None:
    seen: list[Progress] = []

    class Recorder:
        def report(self, progress: Progress) -> None:
            seen.append(progress)

        def checkpointed(self, event: object, progress: Progress) -> None:
            seen.append(progress)

    reader = TrainingGuard(tmp_path / "ck", writer=False, reporter=Recorder(), handle_signals=False)
    reader.resume({"w": 0})
    for step in reader.steps(0, 3):
        reader.completed(step, {"w": step})
    assert seen == []
    progress = tmp_path / "progress.json"
    env = {"GPUSCALER_CHECKPOINT_DIR": str(tmp_path / "ck"), "GPUSCALER_PROGRESS_FILE": str(progress)}
    second = TrainingGuard.from_env(env={**env, "LOCAL_RANK": "1"}, writer=False, handle_signals=False)
    assert not second.reports and not progress.exists()
    # the first process of another pod (LOCAL_RANK 0, not the writer) reports on that pod
    first_of_pod = TrainingGuard.from_env(env={**env, "LOCAL_RANK": "0"}, writer=False, handle_signals=False)
    assert first_of_pod.reports and isinstance(first_of_pod.reporter, FileReporter)
    solo = TrainingGuard(tmp_path / "ck2", agree=SoloAgreement(), handle_signals=False)
    assert solo.agree is None and solo.store.writer and solo.reports
