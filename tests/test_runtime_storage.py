"""Checkpoint storage failures on real file systems, and the data-only default loader.

Disk full: a 256 KiB tmpfs mounted for the test. Read-only: a tmpfs remounted read-only (root
ignores file modes, so a chmod'ed directory would not do). Both need root (CI and this project's
dev machines run as root); elsewhere those tests are skipped with the reason.
The loader: a pickle that would run code is refused by default, and loads only with
``load=pickle_load`` given explicitly.
"""

from __future__ import annotations

import collections
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpuscaler.runtime import CheckpointError, TrainingGuard, pickle_load, pickle_save
from gpuscaler.runtime.checkpoint import CheckpointStore, UnsafeCheckpointError, data_load, data_save
from runtime_torch_support import RunsCode


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB file system."""
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "256k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_names_the_disk_the_free_space_and_keeps_the_previous_checkpoint(small_fs: Path) -> None:
    guard = TrainingGuard[bytes](small_fs / "ck", interval_s=None, handle_signals=False,
                                 save=lambda s, p: p.write_bytes(s), load=lambda p: p.read_bytes())
    guard.resume(b"")
    guard.checkpoint(b"small" * 100)
    with pytest.raises(CheckpointError) as caught:
        guard.completed(0, b"x" * (1 << 20))  # no checkpoint due: nothing written
        guard.checkpoint(b"x" * (1 << 20))
    msg = str(caught.value)
    assert "the disk is full" in msg and "MiB free" in msg and str(small_fs / "ck") in msg, msg
    assert "previous checkpoint (step 0) is kept" in msg, msg
    store = CheckpointStore(small_fs / "ck")
    assert [s for s, _ in store.list_steps()] == [0]
    assert store.latest() is not None and (store.latest().payload_path).read_bytes() == b"small" * 100  # type: ignore[union-attr]
    assert not [p.name for p in (small_fs / "ck").iterdir() if "staging" in p.name]  # cleaned up


def test_a_framework_error_on_a_full_disk_is_reported_as_disk_full(small_fs: Path) -> None:
    """torch.save on a full disk raises RuntimeError('... file write failed'), not OSError."""
    store = CheckpointStore(small_fs / "ck")
    filler = small_fs / "filler"
    with pytest.raises(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()

    def framework_save(path: Path) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 0 vs 120")

    with pytest.raises(CheckpointError, match="the disk is full") as caught:
        store.save(1, framework_save)
    assert "save callback failed" in str(caught.value)


@pytest.fixture
def read_only_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with one complete checkpoint, then remounted read-only."""
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "1m")
    CheckpointStore(mnt / "ck").save_bytes(4, b"four")
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_read_only_directory_raises_checkpoint_error_and_keeps_the_checkpoint(read_only_fs: Path) -> None:
    store = CheckpointStore(read_only_fs / "ck")  # exists: creating it is not needed
    with pytest.raises(CheckpointError) as caught:
        store.save_bytes(5, b"five")
    msg = str(caught.value)
    assert "is not writable" in msg and "read-write" in msg and "step 4" in msg, msg
    assert store.latest() is not None and store.latest().step == 4  # type: ignore[union-attr]
    assert store.prune() == [] and store.cleanup_leftovers() == []  # best-effort, no raise


def test_read_only_parent_when_creating_the_directory(read_only_fs: Path) -> None:
    with pytest.raises(CheckpointError, match=r"creating the checkpoint directory .* is not writable"):
        TrainingGuard(read_only_fs / "new" / "ck", handle_signals=False)


def test_the_guard_on_a_read_only_volume_resumes_but_cannot_save(read_only_fs: Path) -> None:
    guard = TrainingGuard[bytes](read_only_fs / "ck", handle_signals=False, interval_s=None,
                                 save=lambda s, p: p.write_bytes(s), load=lambda p: p.read_bytes())
    state, start = guard.resume(b"")
    assert (state, start) == (b"four", 4)
    guard.completed(4, b"more")  # no checkpoint due (no interval)
    with pytest.raises(CheckpointError, match="not writable"):
        guard.checkpoint(b"more")


# --- the data-only default loader -----------------------------------------------------------


def test_default_loader_refuses_a_pickle_that_would_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    store = CheckpointStore(tmp_path / "ck")
    store.save_bytes(3, pickle.dumps({"w": [1.0], "evil": RunsCode(marker)}))
    guard = TrainingGuard(tmp_path / "ck", handle_signals=False)
    with pytest.raises(UnsafeCheckpointError, match=r"refers to (posix|os)\.system") as caught:
        guard.resume({"w": [0.0]})
    assert "pickle_load" in str(caught.value)  # says how to opt in
    assert not marker.exists()
    # the same checkpoint with pickle asked for by name: it runs (this is the risk pickle carries)
    TrainingGuard(tmp_path / "ck", handle_signals=False, load=pickle_load).resume({})
    assert marker.exists()


def test_default_save_and_load_round_trip_plain_data_and_numpy(tmp_path: Path) -> None:
    state = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "ids": np.array([1, 2, 3], dtype=np.int64),
        "step": 7,
        "lr": 0.1,
        "names": ("a", "b"),
        "seen": {1, 2},
        "order": collections.OrderedDict(x=1),
        "blob": b"\x00\x01",
        "nothing": None,
    }
    data_save(state, tmp_path / "p")
    back = data_load(tmp_path / "p")
    assert back.keys() == state.keys()
    assert np.array_equal(back["w"], state["w"]) and back["w"].dtype == np.float32
    assert {k: v for k, v in back.items() if k not in ("w", "ids")} == {
        k: v for k, v in state.items() if k not in ("w", "ids")
    }


def test_default_save_refuses_what_it_could_not_load_before_writing(tmp_path: Path) -> None:
    guard = TrainingGuard(tmp_path / "ck", handle_signals=False, interval_s=None)
    guard.resume({})
    with pytest.raises(CheckpointError, match=r"refusing to save .* refers to (posix|os)\.system"):
        guard.checkpoint({"x": RunsCode(tmp_path / "never")})
    assert CheckpointStore(tmp_path / "ck").list_steps() == []
    # an explicit pickle pair stores any object
    explicit = TrainingGuard(tmp_path / "ck2", handle_signals=False, save=pickle_save, load=pickle_load)
    explicit.resume({})
    assert explicit.checkpoint({"when": collections.Counter("ab")}) is not None
