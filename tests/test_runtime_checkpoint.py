"""Tests of the checkpoint store and atomic file primitives: commit, keep-last-K, torn and corrupt data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuscaler.runtime import CheckpointError
from gpuscaler.runtime.atomic import atomic_write_bytes, atomic_write_text
from gpuscaler.runtime.checkpoint import (
    MANIFEST_NAME,
    PAYLOAD_NAME,
    CheckpointStore,
    CorruptCheckpointError,
    bytes_callbacks,
    step_dir_name,
)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    atomic_write_text(target, "one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert names(tmp_path) == ["status.json"]


def test_atomic_write_failure_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    atomic_write_text(target, "old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert names(tmp_path) == ["f"]


def test_save_commits_manifest_with_step_and_checksums(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    info = store.save_bytes(7, b"hello", samples=70, reason="interval", extra={"lr": 0.1})
    assert info.path == tmp_path / "step-000000000007"
    assert names(tmp_path) == ["step-000000000007"]
    assert names(info.path) == [MANIFEST_NAME, PAYLOAD_NAME]
    manifest = json.loads((info.path / MANIFEST_NAME).read_text())
    assert manifest["step"] == 7
    assert manifest["samples"] == 70
    assert manifest["files"][0]["size"] == 5
    assert len(manifest["checksum"]) == 64
    again = store.verify(info.path)
    assert (again.step, again.samples, again.reason, dict(again.extra)) == (7, 70, "interval", {"lr": 0.1})
    assert store.latest() == again


def test_directory_payload_is_hashed_recursively(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)

    def write(path: Path) -> None:
        (path / "shard").mkdir(parents=True)
        (path / "model.bin").write_bytes(b"m" * 100)
        (path / "shard" / "opt.bin").write_bytes(b"o" * 10)

    info = store.save(3, write)
    assert sorted(d.path for d in info.files) == ["payload/model.bin", "payload/shard/opt.bin"]
    (info.path / "payload" / "shard" / "opt.bin").write_bytes(b"x" * 10)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        store.verify(info.path)


def test_keep_last_k_deletes_only_older_after_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    for step in range(1, 7):
        store.save_bytes(step * 10, bytes([step]))
        kept = [s for s, _ in store.list_steps()]
        assert kept == sorted(range(10, step * 10 + 1, 10), reverse=True)[:3]
    assert names(tmp_path) == [step_dir_name(s) for s in (40, 50, 60)]


def test_failed_save_commits_nothing_and_keeps_previous(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    store.save_bytes(1, b"good")

    def failing(path: Path) -> None:
        path.write_bytes(b"partial")
        raise RuntimeError("out of memory")

    with pytest.raises(CheckpointError, match="save callback failed: out of memory"):
        store.save(2, failing)
    with pytest.raises(CheckpointError, match="wrote nothing"):
        store.save(2, lambda path: None)
    assert names(tmp_path) == ["step-000000000001"]
    latest = store.latest()
    assert latest is not None and latest.step == 1


def test_torn_staging_dir_is_never_loaded_and_is_cleaned_up(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save_bytes(10, b"ten")
    # What SIGKILL in the middle of a save leaves behind: a staging dir without a manifest.
    torn = tmp_path / ".step-000000000020.staging-999-abcd"
    torn.mkdir()
    (torn / PAYLOAD_NAME).write_bytes(b"tw")
    latest = store.latest()
    assert latest is not None and latest.step == 10
    assert store.cleanup_leftovers() == [torn]
    assert names(tmp_path) == ["step-000000000010"]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip", "no-manifest", "bad-json", "manifest-edit", "missing-payload"],
)
def test_corrupt_newest_falls_back_to_previous(tmp_path: Path, damage: str) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    store.save_bytes(10, b"a" * 1000)
    newest = store.save_bytes(20, b"b" * 1000)
    payload, manifest = newest.path / PAYLOAD_NAME, newest.path / MANIFEST_NAME
    if damage == "truncate":
        with open(payload, "r+b") as f:
            f.truncate(500)
    elif damage == "flip":
        data = bytearray(payload.read_bytes())
        data[123] ^= 1
        payload.write_bytes(bytes(data))
    elif damage == "no-manifest":
        manifest.unlink()
    elif damage == "bad-json":
        manifest.write_text(manifest.read_text()[:40])
    elif damage == "manifest-edit":
        manifest.write_text(manifest.read_text().replace('"samples": 0', '"samples": 1'))
    elif damage == "missing-payload":
        payload.unlink()
    with pytest.raises(CorruptCheckpointError):
        store.verify(newest.path)
    latest = store.latest()
    assert latest is not None and latest.step == 10
    # The corrupt one is set aside, so the same step can be written again.
    assert [s for s, _ in store.list_steps()] == [10]
    assert any(n.startswith("corrupt-step-000000000020-") for n in names(tmp_path))
    assert store.save_bytes(20, b"c").step == 20


def test_resaving_same_step_replaces_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save_bytes(5, b"first")
    info = store.save_bytes(5, b"second")
    assert (info.path / PAYLOAD_NAME).read_bytes() == b"second"
    assert names(tmp_path) == ["step-000000000005"]


def test_no_checkpoint_and_reader_store(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "missing", writer=False).latest() is None
    reader = CheckpointStore(tmp_path, writer=False)
    with pytest.raises(CheckpointError, match="read-only"):
        reader.save_bytes(1, b"x")
    with pytest.raises(ValueError, match="keep must be >= 1"):
        CheckpointStore(tmp_path, keep=0)


def test_bytes_callbacks_round_trip(tmp_path: Path) -> None:
    save, load = bytes_callbacks(lambda s: s.encode(), lambda b: b.decode())
    store = CheckpointStore(tmp_path)
    info = store.save(1, lambda path: save("state", path))
    assert load(info.payload_path) == "state"
