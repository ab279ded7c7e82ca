"""The checkpoint format's parts: its names and constants, the file digests and the manifest checksum, a committed checkpoint's description (:class:`CheckpointInfo`) and the storage errors (a full disk, a read-only mount). Re-exported by :mod:`gpuscaler.runtime.checkpoint`, whose store writes and reads them."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from gpuscaler.runtime.atomic import fsync_dir
from gpuscaler.runtime.checkpoint_safety import HASH_ALGORITHM, CheckpointError
from gpuscaler.runtime.constants import DISK_FULL_FREE_BYTES

S = TypeVar("S")

SaveFn = Callable[[S, Path], None]
"""``save(state, path)``: write ``state`` to the file (or new directory) ``path``. The store makes
it atomic and durable; the callback need not fsync, rename or checksum anything."""

LoadFn = Callable[[Path], S]
"""``load(path) -> state``: read back what the save callback wrote at ``path``."""

MANIFEST_NAME: Final = "MANIFEST.json"
PAYLOAD_NAME: Final = "payload"
FORMAT: Final = "gpuscaler-checkpoint"
FORMAT_VERSION: Final = 1
STEP_DIGITS: Final = 12

_STEP_DIR = re.compile(r"^step-(\d+)$")
_CORRUPT_DIR = re.compile(r"^corrupt-step-(\d+)-")
_LEFTOVER = re.compile(r"^\.step-\d+\.(staging|trash)-")
SHARD_STAGING_TAG: Final = "staging-sharded"
"""Suffix of the shared staging directory of a sharded checkpoint (one name all ranks derive)."""
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _errno_of(err: BaseException | None) -> int | None:
    """The errno of the first OSError in an exception's cause/context chain."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno is not None:
            return err.errno
        err = err.__cause__ or err.__context__
        seen += 1
    return None


def _free_bytes(directory: Path) -> int | None:
    """Free bytes on the file system of ``directory`` (or its nearest existing parent)."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def storage_error(action: str, directory: Path, err: BaseException, *, kept: int | None) -> CheckpointError:
    """A :class:`CheckpointError` for a failed write that says why, how much room is left and what to do.

    Args:
        action: What failed, e.g. ``writing checkpoint for step 120``.
        directory: The checkpoint directory.
        err: The cause.
        kept: Step of the newest complete checkpoint still on disk (None: there is none).

    Returns:
        The error to raise (chain ``err`` as its cause).
    """
    code = _errno_of(err)
    free = _free_bytes(directory)
    room = f"{free / 2**20:,.1f} MiB free" if free is not None else "free space unknown"
    full = code in _NO_SPACE or (code not in _NOT_WRITABLE and free is not None and free < DISK_FULL_FREE_BYTES)
    if full:
        why = f"the disk is full ({room} on the file system of {directory})"
        todo = (
            "free space there, keep fewer checkpoints (GPUSCALER_CHECKPOINT_KEEP / spec.checkpoint.keep) "
            "or give the checkpoint volume more room"
        )
    elif code in _NOT_WRITABLE:
        why = f"{directory} is not writable ({os.strerror(code) if code else err})"
        todo = (
            "mount the checkpoint volume read-write and make the directory writable by this "
            "container's user"
        )
    else:
        why = f"{err} ({room} in {directory})"
        todo = "check the checkpoint volume"
    previous = f"the previous checkpoint (step {kept}) is kept" if kept is not None else "no earlier checkpoint exists"
    return CheckpointError(f"{action}: {why}; {todo}; {previous}")


@dataclass(frozen=True)
class FileDigest:
    """Size and checksum of one payload file, as recorded in the manifest."""

    path: str
    """Path relative to the checkpoint directory, ``/``-separated (``payload`` or ``payload/x``)."""
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """Its entry in the manifest's ``files`` (and in a rank's ``shard-<rank>.json``)."""
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> FileDigest:
        """The digest an entry written by :meth:`to_json` records."""
        return cls(str(item["path"]), int(item["size"]), str(item["sha256"]))


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete, verified checkpoint and its metadata."""

    step: int
    """Steps completed when the checkpoint was taken; training resumes at this step index."""
    path: Path
    """The checkpoint directory ``step-N``."""
    created_at: float
    """Unix time the checkpoint was committed."""
    samples: int = 0
    """Samples processed up to ``step`` (cumulative over restarts)."""
    reason: str = "manual"
    """Why it was taken: ``interval``, ``notice``, ``sigterm``, ``final`` or ``manual``."""
    request_id: str | None = None
    """The ``gpuscaler.io/checkpoint-requested`` id it answers, for notice-triggered checkpoints."""
    payload_bytes: int = 0
    write_seconds: float = 0.0
    """Wall time of the save callback plus hashing and syncing."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Caller metadata (JSON-serialisable), stored in the manifest."""
    files: tuple[FileDigest, ...] = ()

    @property
    def payload_path(self) -> Path:
        """Where the save callback wrote; what the load callback receives."""
        return self.path / PAYLOAD_NAME


def step_dir_name(step: int) -> str:
    """Directory name of the checkpoint taken after ``step`` steps: ``step-000000000123``.

    Args:
        step: Steps completed, >= 0.

    Returns:
        The zero-padded name, which sorts in step order.
    """
    return f"step-{step:0{STEP_DIGITS}d}"


def _digest_file(path: Path, rel: str) -> FileDigest:
    """Hash a payload file and fsync it (the save callback may not have)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, HASH_ALGORITHM).hexdigest()
        os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size
    return FileDigest(rel, size, digest)


def _digest_tree(root: Path) -> list[FileDigest]:
    """Digest every file under ``root / payload`` (a file or a tree); fsync files and directories."""
    payload = root / PAYLOAD_NAME
    if payload.is_file():
        return [_digest_file(payload, PAYLOAD_NAME)]
    if not payload.is_dir():
        raise CheckpointError(
            f"the save callback wrote nothing at {payload}; it must create a file or a directory there"
        )
    digests: list[FileDigest] = []
    for dirpath, dirnames, filenames in os.walk(payload):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath, name)
            digests.append(_digest_file(full, full.relative_to(root).as_posix()))
        fsync_dir(dirpath)
    return digests


def _manifest_checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
