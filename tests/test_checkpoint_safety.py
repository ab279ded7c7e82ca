"""Checkpoints an attacker (or a broken disk) wrote: each attack class is refused before anything
is read or built, and the resume falls back to the previous checkpoint with a clear log line.

Every test writes a good checkpoint at step 10 and a hostile one at step 20 through the store, then
resumes a real :class:`gpuscaler.runtime.TrainingGuard` with the default (data-only) loader: it
must start from step 10's state, having set step 20 aside. A memory bomb that were built would
take the test process down (the CI machine has far less than a terabyte); a FIFO or device that
were opened blocking would hang it (``pytest.mark.timeout``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuscaler.runtime import TrainingGuard
from gpuscaler.runtime.checkpoint import (
    MANIFEST_NAME,
    PAYLOAD_NAME,
    CheckpointStore,
    UnsafeCheckpointError,
    data_load,
    data_save,
)
from gpuscaler.runtime.checkpoint_safety import MAX_MANIFEST_DEPTH, DataUnpickler

RECONSTRUCT = (getattr(np, "_core", None) or np.core).multiarray._reconstruct
GOOD = {"w": np.arange(4, dtype=np.float32), "step": 10}

pytestmark = pytest.mark.timeout(60)


def two_checkpoints(tmp_path: Path, payload: bytes | None = None) -> tuple[CheckpointStore, Path]:
    """Step 10 good; step 20 with ``payload`` (default: a good one); returns step 20's directory."""
    store = CheckpointStore(tmp_path / "ck")
    store.save(10, lambda p: data_save(GOOD, p))
    if payload is None:
        info = store.save(20, lambda p: data_save({"w": np.zeros(4, dtype=np.float32), "step": 20}, p))
    else:
        info = store.save_bytes(20, payload)
    return store, info.path


def resumes_from_10(tmp_path: Path, caplog: pytest.LogCaptureFixture, why: str) -> None:
    caplog.set_level(logging.WARNING)
    guard = TrainingGuard(tmp_path / "ck", handle_signals=False)
    state, step = guard.resume({})
    assert step == 10 and np.array_equal(state["w"], GOOD["w"])
    assert [s for s, _ in guard.store.list_steps()] == [10], "the hostile checkpoint is set aside"
    text = caplog.text
    assert "20" in text and why in text, text


def rewrite_manifest(ckpt: Path, change: Any) -> None:
    """Edit the manifest and give it a matching checksum (what an attacker who can write the directory does)."""
    body = json.loads((ckpt / MANIFEST_NAME).read_text())
    body.pop("checksum")
    change(body)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    body["checksum"] = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    (ckpt / MANIFEST_NAME).write_text(json.dumps(body))


def relist(ckpt: Path) -> None:
    """Make the manifest list the payload as it now is (size and sha256), so only the new check can catch it."""
    def change(body: dict[str, Any]) -> None:
        data = (ckpt / PAYLOAD_NAME).read_bytes() if (ckpt / PAYLOAD_NAME).is_file() else b""
        body["files"] = [{"path": PAYLOAD_NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]
    rewrite_manifest(ckpt, change)


# ------------------------------------------------------------------------------ memory bombs


class Reduce:
    """Pickles as ``func(*args)`` (and ``state`` for BUILD): a hostile pickle without writing opcodes by hand."""

    def __init__(self, func: Any, args: tuple[Any, ...], state: Any = None) -> None:
        self.r = (func, args) if state is None else (func, args, state)

    def __reduce__(self) -> Any:
        return self.r


def nested(depth: int) -> list[Any]:
    inner: list[Any] = [0] * 10
    for _ in range(depth):
        inner = [inner] * 10
    return inner


BOMBS = {
    "list-of-range": Reduce(list, (range(10**11),)),
    "tuple-of-range": Reduce(tuple, (range(10**11),)),
    "bytearray-of-int": Reduce(bytearray, (10**12,)),
    "bytes-of-int": Reduce(bytes, (10**12,)),
    "copies-of-one-list": [Reduce(list, (big,)) for big in [[0] * 100_000] for _ in range(2000)],
    "array-of-a-terabyte": Reduce(np.ndarray, ((10**6, 10**6),)),
    "reconstruct-a-terabyte": Reduce(RECONSTRUCT, (np.ndarray, (10**12,), b"b")),
    "object-array-state-mismatch": Reduce(
        RECONSTRUCT, (np.ndarray, (0,), b"b"), (1, (10**6,), np.dtype(object), False, [1])
    ),
    "str-of-shared-lists": Reduce(str, (nested(9),)),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_tiny_pickle_that_expands_is_refused_before_it_allocates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    blob = pickle.dumps({"w": BOMBS[name]}, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < 2_000_000
    two_checkpoints(tmp_path, blob)
    why = {"object-array-state-mismatch": "does not match its shape", "str-of-shared-lists": "str() of a container"}
    resumes_from_10(tmp_path, caplog, why.get(name, "refused before allocating"))


def test_a_length_field_longer_than_the_file_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for opcode in (b"\x96", b"\x8e"):  # BYTEARRAY8, BINBYTES8: a terabyte claimed, nine bytes held
        blob = b"\x80\x05" + opcode + struct.pack("<Q", 10**12) + b"."
        path = tmp_path / f"p{opcode.hex()}"
        path.write_bytes(blob)
        with pytest.raises(UnsafeCheckpointError):
            data_load(path)
    two_checkpoints(tmp_path, b"\x80\x05\x96" + struct.pack("<Q", 10**12) + b".")
    resumes_from_10(tmp_path, caplog, "refused before allocating")


def test_plain_data_still_loads_and_a_refusal_without_an_older_checkpoint_is_raised(tmp_path: Path) -> None:
    state = {"a": np.ones((3, 4), dtype=np.float64), "o": np.array([1, "x"], dtype=object), "l": list(range(1000)),
             "s": {1, 2}, "b": bytearray(b"xy"), "n": np.float32(2.5)}
    for protocol in (4, 5):  # data_save writes the highest; protocol 2 pickles bytes through _codecs.encode
        blob = pickle.dumps(state, protocol=protocol)
        path = tmp_path / f"p{protocol}"
        path.write_bytes(blob)
        back = data_load(path)
        assert np.array_equal(back["a"], state["a"]) and back["l"] == state["l"] and back["n"] == state["n"]
    store = CheckpointStore(tmp_path / "only")
    store.save_bytes(5, pickle.dumps(BOMBS["list-of-range"], protocol=4))
    with pytest.raises(UnsafeCheckpointError, match="more than it could hold"):
        TrainingGuard(tmp_path / "only", handle_signals=False).resume({})


def test_the_unpickler_budget_scales_with_the_payload() -> None:
    import io

    blob = pickle.dumps(Reduce(list, (range(10_000_000),)), protocol=4)  # 80 MB from ~60 bytes
    with pytest.raises(UnsafeCheckpointError):
        DataUnpickler(io.BytesIO(blob), len(blob)).load()
    small = pickle.dumps(Reduce(list, (range(1000),)), protocol=4)
    assert DataUnpickler(io.BytesIO(small), len(small)).load() == list(range(1000))


# ------------------------------------------------------------------------------ files


def test_a_payload_symlink_to_a_file_outside_is_not_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, ckpt = two_checkpoints(tmp_path)
    outside = tmp_path / "secret"
    outside.write_bytes(pickle.dumps({"w": np.zeros(4, dtype=np.float32), "step": 99}))
    (ckpt / PAYLOAD_NAME).unlink()
    (ckpt / PAYLOAD_NAME).symlink_to(outside)
    data = outside.read_bytes()
    rewrite_manifest(ckpt, lambda b: b.update(files=[{"path": PAYLOAD_NAME, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]))
    resumes_from_10(tmp_path, caplog, "symlink")


@pytest.mark.parametrize("target", ["fifo", "device", "fifo-link"])
def test_a_special_file_in_a_checkpoint_does_not_hang_the_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, target: str
) -> None:
    _, ckpt = two_checkpoints(tmp_path)
    payload = ckpt / PAYLOAD_NAME
    payload.unlink()
    if target == "fifo":
        os.mkfifo(payload)  # no writer: a blocking open would wait forever
    elif target == "device":
        payload.symlink_to("/dev/zero")  # endless: hashing it would never end
    else:
        os.mkfifo(tmp_path / "pipe")
        payload.symlink_to(tmp_path / "pipe")
    rewrite_manifest(ckpt, lambda b: b.update(files=[{"path": PAYLOAD_NAME, "size": 0, "sha256": hashlib.sha256(b"").hexdigest()}]))
    resumes_from_10(tmp_path, caplog, "FIFO" if target == "fifo" else "symlink")


def test_a_file_the_manifest_does_not_list_or_a_symlinked_directory_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path / "ck")
    store.save(10, lambda p: data_save(GOOD, p))

    def tree(p: Path) -> None:
        p.mkdir()
        (p / "a").write_bytes(b"x")

    info = store.save(20, tree)
    (info.path / PAYLOAD_NAME / "extra").symlink_to("/etc/hostname")
    with pytest.raises(Exception, match="symlink"):
        store.verify(info.path)
    (info.path / PAYLOAD_NAME / "extra").unlink()
    (info.path / PAYLOAD_NAME / "extra").write_bytes(b"unlisted")
    with pytest.raises(Exception, match="not in the manifest"):
        store.verify(info.path)
    (info.path / PAYLOAD_NAME / "extra").unlink()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "a").write_bytes(b"x")
    (info.path / PAYLOAD_NAME / "a").unlink()
    (info.path / PAYLOAD_NAME).rmdir()
    (info.path / PAYLOAD_NAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Exception, match="symlink"):
        store.verify(info.path)
    assert store.latest() is not None and store.latest().step == 10  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ the manifest


def weak_hash(body: dict[str, Any]) -> None:
    body["hash"] = "md5"
    for f in body["files"]:
        f["sha256"] = hashlib.md5(b"anything").hexdigest()


MANIFESTS = {
    "lists-no-files": lambda b: b.update(files=[]),
    "weak-hash": weak_hash,
    "nan": lambda b: b.update(created_at=float("nan")),
    "infinite": lambda b: b.update(write_seconds=float("inf")),
    "bool-size": lambda b: b["files"][0].update(size=True),
    "repeated-file": lambda b: b.update(files=b["files"] * 2),
}
WHY = {"lists-no-files": "lists no payload files", "weak-hash": "only sha256", "nan": "NaN",
       "infinite": "Infinity", "bool-size": "malformed", "repeated-file": "repeated"}


@pytest.mark.parametrize("attack", sorted(MANIFESTS))
def test_a_manifest_the_loader_cannot_trust_is_an_incomplete_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, attack: str
) -> None:
    _, ckpt = two_checkpoints(tmp_path)
    rewrite_manifest(ckpt, MANIFESTS[attack])
    caplog.set_level(logging.WARNING)
    resumes_from_10(tmp_path, caplog, WHY[attack])


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,  # deeper than the JSON parser's recursion
    '{"x": ' + "[" * (MAX_MANIFEST_DEPTH + 1) + "]" * (MAX_MANIFEST_DEPTH + 1) + "}",
    '{"created_at": 1e999}',
    "{not json",
    "\udcff",
])
def test_a_manifest_that_is_too_deep_or_not_strict_json_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    _, ckpt = two_checkpoints(tmp_path)
    (ckpt / MANIFEST_NAME).write_bytes(text.encode("utf-8", "surrogateescape"))
    caplog.set_level(logging.WARNING)
    resumes_from_10(tmp_path, caplog, MANIFEST_NAME)
