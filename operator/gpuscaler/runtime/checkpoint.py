"""Checkpoint store: atomic, checksummed, step-numbered checkpoints in one directory; keep the last K.

Layout of the checkpoint directory (``GPUSCALER_CHECKPOINT_DIR``)::

    step-000000000120/             a complete checkpoint: 120 steps were done when it was taken
        payload                    what the save callback wrote (a file, or a directory tree)
        MANIFEST.json              step, samples, time, reason, sha256 + size of every payload file,
                                   and a checksum of the manifest itself
    .step-000000000130.staging-…   a checkpoint being written (or torn by a crash): never loaded
    corrupt-step-000000000110-…    a checkpoint that failed verification, set aside for inspection

A save writes into a hidden staging directory, fsyncs every payload file, writes the manifest last,
fsyncs the staging directory, renames it to ``step-N`` and fsyncs the parent. The rename is the
commit point, so a process killed at any moment (SIGKILL mid-write) leaves either the previous set
of checkpoints or the new complete one. Loading re-hashes the payload against the manifest and
falls back to the previous checkpoint when anything is missing, truncated or altered. Older
checkpoints are deleted only after the new one is committed.

The training loop does not use this module directly: :class:`gpuscaler.runtime.TrainingGuard` does.
Benchmarks and tests call it to measure and to corrupt checkpoints on purpose.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from gpuscaler.runtime.atomic import fsync_dir, temp_name
from gpuscaler.runtime.constants import DEFAULT_CHECKPOINT_KEEP

log = logging.getLogger(__name__)

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
HASH_ALGORITHM: Final = "sha256"
STEP_DIGITS: Final = 12

_STEP_DIR = re.compile(r"^step-(\d+)$")
_CORRUPT_DIR = re.compile(r"^corrupt-step-(\d+)-")
_LEFTOVER = re.compile(r"^\.step-\d+\.(staging|trash)-")


class CheckpointError(Exception):
    """A checkpoint could not be written, or the store is misused."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint directory failed verification: incomplete, truncated or altered."""


@dataclass(frozen=True)
class FileDigest:
    """Size and checksum of one payload file, as recorded in the manifest."""

    path: str
    """Path relative to the checkpoint directory, ``/``-separated (``payload`` or ``payload/x``)."""
    size: int
    sha256: str


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


class CheckpointStore:
    """Step-numbered checkpoints in one directory, written atomically, verified on load.

    Args:
        directory: The checkpoint directory; created if missing.
        keep: Complete checkpoints to keep (>= 1); older ones are deleted after each save.
        writer: Whether this process writes (saves, prunes, quarantines, cleans leftovers). Readers
            in a multi-worker job pass False and only load.
        wall_clock: Source of unix time for ``created_at`` (injectable for tests).

    Raises:
        ValueError: ``keep`` < 1.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        keep: int = DEFAULT_CHECKPOINT_KEEP,
        *,
        writer: bool = True,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (got {keep}): the newest checkpoint is always kept")
        self.directory = Path(directory)
        self.keep = keep
        self.writer = writer
        self._wall_clock = wall_clock
        if writer:
            self.directory.mkdir(parents=True, exist_ok=True)

    # --- listing ------------------------------------------------------------------------------

    def list_steps(self) -> list[tuple[int, Path]]:
        """Committed checkpoint directories by name (not verified), newest first.

        Returns:
            ``(step, path)`` pairs; empty when the directory does not exist.
        """
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = _STEP_DIR.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                found.append((int(match.group(1)), Path(entry.path)))
        found.sort(reverse=True)
        return found

    # --- writing ------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        write: Callable[[Path], None],
        *,
        samples: int = 0,
        reason: str = "manual",
        request_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Write a checkpoint for ``step`` atomically and prune old ones.

        Args:
            step: Steps completed (>= 0); names the checkpoint. An existing checkpoint with the
                same step is replaced.
            write: Called with the payload path (``<staging>/payload``); must create a file or a
                directory there. It need not sync or rename anything.
            samples: Samples processed up to ``step``, stored in the manifest.
            reason: Why the checkpoint is taken, stored in the manifest.
            request_id: The checkpoint request this answers, if any.
            extra: JSON-serialisable metadata to store in the manifest.

        Returns:
            The committed checkpoint.

        Raises:
            CheckpointError: This store is not a writer, ``step`` is negative, the callback
                failed or wrote nothing, or the file system refused a write (the cause is
                chained). Nothing is committed then and the staging directory is removed.
        """
        if not self.writer:
            raise CheckpointError(f"this store for {self.directory} is read-only (writer=False)")
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0 (got {step})")
        started = time.perf_counter()
        final = self.directory / step_dir_name(step)
        staging = temp_name(final, "staging")
        try:
            staging.mkdir()
            try:
                write(staging / PAYLOAD_NAME)
            except Exception as err:
                raise CheckpointError(
                    f"writing checkpoint for step {step}: save callback failed: {err}"
                ) from err
            files = _digest_tree(staging)
            write_seconds = time.perf_counter() - started
            created_at = self._wall_clock()
            body: dict[str, Any] = {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "step": step,
                "samples": samples,
                "created_at": created_at,
                "reason": reason,
                "request_id": request_id,
                "write_seconds": write_seconds,
                "hash": HASH_ALGORITHM,
                "files": [{"path": d.path, "size": d.size, "sha256": d.sha256} for d in files],
                "extra": dict(extra or {}),
            }
            body["checksum"] = _manifest_checksum(body)
            with open(staging / MANIFEST_NAME, "x", encoding="utf-8") as f:
                json.dump(body, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(staging)
            self._commit(staging, final)
        except CheckpointError:
            self._remove(staging)
            raise
        except (OSError, TypeError, ValueError) as err:
            self._remove(staging)
            raise CheckpointError(f"writing checkpoint for step {step} in {self.directory}: {err}") from err
        info = CheckpointInfo(
            step=step,
            path=final,
            created_at=created_at,
            samples=samples,
            reason=reason,
            request_id=request_id,
            payload_bytes=sum(d.size for d in files),
            write_seconds=write_seconds,
            extra=dict(extra or {}),
            files=tuple(files),
        )
        self.prune()
        return info

    def save_bytes(self, step: int, data: bytes, **kwargs: Any) -> CheckpointInfo:
        """Write ``data`` as the payload of a checkpoint for ``step``; see :meth:`save`.

        Args:
            step: Steps completed.
            data: The payload.
            **kwargs: ``samples``, ``reason``, ``request_id``, ``extra`` as for :meth:`save`.

        Returns:
            The committed checkpoint.

        Raises:
            CheckpointError: As for :meth:`save`.
        """

        def write(path: Path) -> None:
            path.write_bytes(data)

        return self.save(step, write, **kwargs)

    def _commit(self, staging: Path, final: Path) -> None:
        trash: Path | None = None
        if final.exists():
            # Same step written again (a re-run after a fallback): set the old one aside first,
            # because rename() cannot replace a non-empty directory.
            trash = temp_name(final, "trash")
            os.rename(final, trash)
        os.rename(staging, final)
        fsync_dir(self.directory)
        if trash is not None:
            self._remove(trash)

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def prune(self) -> list[Path]:
        """Delete complete checkpoints beyond the newest ``keep``, and quarantined ones older than those.

        A checkpoint is renamed to a hidden trash name before it is deleted, so a crash during
        deletion never leaves a half-deleted ``step-N`` behind.

        Returns:
            The checkpoint directories removed.
        """
        if not self.writer:
            return []
        steps = self.list_steps()
        kept, old = steps[: self.keep], steps[self.keep :]
        removed: list[Path] = []
        for _, path in old:
            trash = temp_name(path, "trash")
            try:
                os.rename(path, trash)
            except FileNotFoundError:
                continue
            self._remove(trash)
            removed.append(path)
        if kept:
            oldest_kept = kept[-1][0]
            for entry in os.scandir(self.directory):
                match = _CORRUPT_DIR.match(entry.name)
                if match and int(match.group(1)) < oldest_kept:
                    self._remove(Path(entry.path))
                    removed.append(Path(entry.path))
        if removed:
            fsync_dir(self.directory)
        return removed

    def cleanup_leftovers(self) -> list[Path]:
        """Remove staging and trash directories left by a process that died mid-save or mid-prune.

        Call it once at start-up, before saving: a torn staging directory can hold gigabytes.

        Returns:
            The paths removed.
        """
        if not self.writer:
            return []
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                if _LEFTOVER.match(entry.name):
                    self._remove(Path(entry.path))
                    removed.append(Path(entry.path))
        return removed

    # --- reading ------------------------------------------------------------------------------

    def verify(self, path: str | os.PathLike[str]) -> CheckpointInfo:
        """Check a checkpoint directory against its manifest (all files present, sizes and hashes).

        Args:
            path: A ``step-N`` directory.

        Returns:
            The checkpoint's metadata.

        Raises:
            CorruptCheckpointError: Manifest missing, unreadable, of another format, with a wrong
                own checksum or step, or a payload file missing, of another size or hash.
        """
        ckpt = Path(path)
        try:
            return self._verify(ckpt)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CorruptCheckpointError(f"{ckpt}: malformed {MANIFEST_NAME}: {err!r}") from err

    def _verify(self, ckpt: Path) -> CheckpointInfo:
        try:
            body = json.loads((ckpt / MANIFEST_NAME).read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise CorruptCheckpointError(f"{ckpt}: no {MANIFEST_NAME} (incomplete checkpoint)") from err
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CorruptCheckpointError(f"{ckpt}: unreadable {MANIFEST_NAME}: {err}") from err
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise CorruptCheckpointError(f"{ckpt}: {MANIFEST_NAME} is not a {FORMAT} manifest")
        if body.get("version") != FORMAT_VERSION:
            raise CorruptCheckpointError(
                f"{ckpt}: manifest version {body.get('version')!r}, this runtime reads {FORMAT_VERSION}"
            )
        claimed = body.pop("checksum", None)
        if claimed != _manifest_checksum(body):
            raise CorruptCheckpointError(f"{ckpt}: manifest checksum mismatch")
        match = _STEP_DIR.match(ckpt.name)
        if match and int(match.group(1)) != body["step"]:
            raise CorruptCheckpointError(f"{ckpt}: manifest says step {body['step']}")
        files = []
        for item in body["files"]:
            rel = str(item["path"])
            if rel.startswith("/") or ".." in rel.split("/"):
                raise CorruptCheckpointError(f"{ckpt}: manifest lists a path outside the checkpoint: {rel!r}")
            digest = FileDigest(rel, int(item["size"]), str(item["sha256"]))
            full = ckpt / rel
            try:
                with open(full, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size != digest.size:
                        raise CorruptCheckpointError(
                            f"{ckpt}: {rel} has {size} bytes, the manifest says {digest.size} (truncated?)"
                        )
                    actual = hashlib.file_digest(f, str(body["hash"])).hexdigest()
            except OSError as err:
                raise CorruptCheckpointError(f"{ckpt}: cannot read {rel}: {err}") from err
            if actual != digest.sha256:
                raise CorruptCheckpointError(f"{ckpt}: {rel} checksum mismatch")
            files.append(digest)
        return CheckpointInfo(
            step=int(body["step"]),
            path=ckpt,
            created_at=float(body["created_at"]),
            samples=int(body.get("samples", 0)),
            reason=str(body.get("reason", "manual")),
            request_id=body.get("request_id"),
            payload_bytes=sum(d.size for d in files),
            write_seconds=float(body.get("write_seconds", 0.0)),
            extra=dict(body.get("extra") or {}),
            files=tuple(files),
        )

    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint that verifies; corrupt newer ones are skipped (and quarantined).

        Returns:
            The newest good checkpoint, or None when there is none.
        """
        for step, path in self.list_steps():
            try:
                return self.verify(path)
            except CorruptCheckpointError as err:
                log.warning("skipping checkpoint at step %d: %s", step, err)
                self.quarantine(path)
        return None

    def quarantine(self, path: Path) -> Path | None:
        """Set a corrupt checkpoint aside as ``corrupt-step-N-<time>`` so it is never listed again.

        Args:
            path: A ``step-N`` directory.

        Returns:
            The new path, or None when this store is not a writer or the rename failed.
        """
        if not self.writer:
            return None
        target = path.with_name(f"corrupt-{path.name}-{int(self._wall_clock())}")
        try:
            os.rename(path, target)
            fsync_dir(self.directory)
        except OSError as err:
            log.warning("could not quarantine corrupt checkpoint %s: %s", path, err)
            return None
        return target


# --- ready-made callbacks ---------------------------------------------------------------------


def pickle_save(state: object, path: Path) -> None:
    """Default save callback: pickle ``state`` to ``path``.

    Args:
        state: Any picklable object.
        path: The payload path.
    """
    with open(path, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)


def pickle_load(path: Path) -> Any:
    """Default load callback: unpickle the payload. Only load checkpoints your own job wrote.

    Args:
        path: The payload path.

    Returns:
        The state object.
    """
    with open(path, "rb") as f:
        return pickle.load(f)


def bytes_callbacks(
    dumps: Callable[[S], bytes], loads: Callable[[bytes], S]
) -> tuple[Callable[[S, Path], None], Callable[[Path], S]]:
    """Adapt a ``state -> bytes`` / ``bytes -> state`` codec to path-based save and load callbacks.

    Args:
        dumps: Serialises a state.
        loads: Deserialises it.

    Returns:
        ``(save, load)`` to pass to :class:`gpuscaler.runtime.TrainingGuard`.
    """

    def save(state: S, path: Path) -> None:
        path.write_bytes(dumps(state))

    def load(path: Path) -> S:
        return loads(path.read_bytes())

    return save, load
