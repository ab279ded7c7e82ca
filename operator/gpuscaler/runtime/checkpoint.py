"""Checkpoint store: atomic, checksummed, step-numbered checkpoints in one directory; keep the last K.

Layout of the checkpoint directory (``GPUSCALER_CHECKPOINT_DIR``)::

    step-000000000120/             a complete checkpoint: 120 steps were done when it was taken
        payload                    what the save callback wrote (a file, or a directory tree)
        MANIFEST.json              step, samples, time, reason, sha256 + size of every payload file,
                                   and a checksum of the manifest itself
    .step-000000000130.staging-…   a checkpoint being written (or torn by a crash): never loaded
    .step-000000000140.staging-sharded   a sharded checkpoint being written by every rank
    corrupt-step-000000000110-…    a checkpoint that failed verification, set aside for inspection

A save writes into a hidden staging directory, fsyncs every payload file, writes the manifest last,
fsyncs the staging directory, renames it to ``step-N`` and fsyncs the parent. The rename is the
commit point, so a process killed at any moment (SIGKILL mid-write) leaves either the previous set
of checkpoints or the new complete one. Loading re-hashes the payload against the manifest and
falls back to the previous checkpoint when anything is missing, truncated or altered. Older
checkpoints are deleted only after the new one is committed.

A sharded checkpoint (:meth:`CheckpointStore.save_sharded`: FSDP, ZeRO,
``torch.distributed.checkpoint``) is written by every rank into one shared staging directory;
each rank then hashes its share of the files into ``shard-<rank>.json``, and only when every rank
has (an agreed vote) does the writer write the manifest, last, and commit by the same rename. So a
checkpoint is complete only when every shard is.

Storage errors (disk full, a read-only or foreign-owned directory) raise :class:`CheckpointError`
naming the directory, the free space and what to do; cleanup after a failure is best-effort and
the previous checkpoint is never touched before the new one is committed.

The checksums detect torn, truncated and bit-rotted files; they are not a signature: whoever can
write the checkpoint directory can write a matching manifest. That is why the default loader
(:func:`data_load`) reads data only and never runs code from a checkpoint; :func:`pickle_load`
must be asked for by name.

The training loop does not use this module directly: :class:`gpuscaler.runtime.TrainingGuard` does.
Benchmarks and tests call it to measure and to corrupt checkpoints on purpose.
"""

from __future__ import annotations

import errno
import hashlib
import io
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

from gpuscaler.runtime.agreement import Agreement
from gpuscaler.runtime.atomic import atomic_write_text, fsync_dir, temp_name
from gpuscaler.runtime.checkpoint_safety import (
    DATA_GLOBALS,
    HASH_ALGORITHM,
    CheckpointError,
    CorruptCheckpointError,
    DataUnpickler,
    NamesOnlyUnpickler,
    UnsafeCheckpointError,
    check_tree,
    open_regular,
    read_manifest,
)
from gpuscaler.runtime.constants import DEFAULT_CHECKPOINT_KEEP, DISK_FULL_FREE_BYTES

__all__ = [  # the loader's safety checks and errors live in checkpoint_safety; imported from here as before
    "DATA_GLOBALS",
    "FORMAT",
    "FORMAT_VERSION",
    "HASH_ALGORITHM",
    "MANIFEST_NAME",
    "PAYLOAD_NAME",
    "SHARD_STAGING_TAG",
    "STEP_DIGITS",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStore",
    "CorruptCheckpointError",
    "FileDigest",
    "LoadFn",
    "SaveFn",
    "UnsafeCheckpointError",
    "bytes_callbacks",
    "data_load",
    "data_save",
    "pickle_load",
    "pickle_save",
    "step_dir_name",
    "storage_error",
]

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
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise storage_error(
                    f"creating the checkpoint directory {self.directory}", self.directory, err, kept=None
                ) from err

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
        except OSError as err:
            raise CheckpointError(f"cannot list the checkpoint directory {self.directory}: {err}") from err
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
                failed or wrote nothing, or the file system refused a write (disk full,
                read-only: the message says which, with the free space; the cause is chained).
                Nothing is committed then, the staging directory is removed (best-effort) and
                the previous checkpoint is kept.
        """
        if not self.writer:
            raise CheckpointError(f"this store for {self.directory} is read-only (writer=False)")
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0 (got {step})")
        started = time.perf_counter()
        final = self.directory / step_dir_name(step)
        staging = temp_name(final, "staging")
        action = f"writing checkpoint for step {step}"
        try:
            staging.mkdir()
            try:
                write(staging / PAYLOAD_NAME)
            except Exception as err:
                raise self._write_error(f"{action}: save callback failed: {err}", err) from err
            files = _digest_tree(staging)
            write_seconds = time.perf_counter() - started
            created_at = self._wall_clock()
            body = self._manifest_body(step, samples, created_at, reason, request_id, write_seconds, files, extra)
            self._write_manifest(staging, body)
            self._commit(staging, final)
        except CheckpointError:
            self._remove(staging)
            raise
        except OSError as err:
            self._remove(staging)
            raise storage_error(action, self.directory, err, kept=self._newest_step()) from err
        except (TypeError, ValueError) as err:
            self._remove(staging)
            raise CheckpointError(f"{action} in {self.directory}: {err}") from err
        info = self._info(final, body, files)
        self.prune()
        return info

    def _newest_step(self) -> int | None:
        try:
            steps = self.list_steps()
        except CheckpointError:
            return None
        return steps[0][0] if steps else None

    def _write_error(self, message: str, err: BaseException) -> CheckpointError:
        """A save callback's failure; a full or read-only disk is named as such (frameworks wrap
        the OSError in their own exceptions, so the errno and the free space are both looked at)."""
        code = _errno_of(err)
        free = _free_bytes(self.directory)
        if code in _NO_SPACE | _NOT_WRITABLE or (free is not None and free < DISK_FULL_FREE_BYTES):
            return storage_error(message, self.directory, err, kept=self._newest_step())
        return CheckpointError(message)

    @staticmethod
    def _manifest_body(
        step: int,
        samples: int,
        created_at: float,
        reason: str,
        request_id: str | None,
        write_seconds: float,
        files: list[FileDigest],
        extra: Mapping[str, Any] | None,
        world_size: int | None = None,
    ) -> dict[str, Any]:
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
        if world_size is not None:
            body["shards"] = world_size
        body["checksum"] = _manifest_checksum(body)
        return body

    @staticmethod
    def _write_manifest(staging: Path, body: Mapping[str, Any]) -> None:
        with open(staging / MANIFEST_NAME, "x", encoding="utf-8") as f:
            json.dump(body, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(staging)

    @staticmethod
    def _info(final: Path, body: Mapping[str, Any], files: list[FileDigest]) -> CheckpointInfo:
        return CheckpointInfo(
            step=int(body["step"]),
            path=final,
            created_at=float(body["created_at"]),
            samples=int(body["samples"]),
            reason=str(body["reason"]),
            request_id=body["request_id"],
            payload_bytes=sum(d.size for d in files),
            write_seconds=float(body["write_seconds"]),
            extra=dict(body["extra"]),
            files=tuple(files),
        )

    def save_sharded(
        self,
        step: int,
        write: Callable[[Path], None],
        agree: Agreement,
        *,
        samples: int = 0,
        reason: str = "manual",
        request_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Write a checkpoint that every rank writes a part of; a collective (every rank calls it).

        1. The writer creates the shared staging directory ``.step-N.staging-sharded/payload``.
        2. Every rank's ``write(payload)`` writes its shard there (e.g.
           ``torch.distributed.checkpoint.save(state, checkpoint_id=payload)``).
        3. Every rank hashes and fsyncs its share of the payload files (file ``i`` of the sorted
           list belongs to rank ``i % world``) into ``shard-<rank>.json``.
        4. The writer writes the manifest listing every file, last, and commits by renaming.

        After each step the ranks vote (:meth:`Agreement.max`), so a failure on any rank makes
        every rank raise instead of waiting for it, and nothing is committed.

        Args:
            step: Steps completed (>= 0), agreed by the ranks.
            write: Writes this rank's shard under the payload directory.
            agree: The ranks' agreement (rank, world size, votes).
            samples: Samples processed up to ``step``.
            reason: Why it is taken.
            request_id: The checkpoint request it answers.
            extra: JSON-serialisable metadata for the manifest.

        Returns:
            The committed checkpoint (the same on every rank).

        Raises:
            CheckpointError: Some rank failed (this rank's own error, or which rank failed);
                storage errors as for :meth:`save`.
        """
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0 (got {step})")
        rank, world = agree.rank, agree.world_size
        final = self.directory / step_dir_name(step)
        staging = self.directory / f".{final.name}.{SHARD_STAGING_TAG}"
        action = f"writing sharded checkpoint for step {step}"
        started = time.perf_counter()
        error: CheckpointError | None = None

        def vote(stage: str) -> None:
            (failed,) = agree.max([rank + 1 if error is not None else 0])
            if not failed:
                return
            if self.writer:
                self._remove(staging)
            if error is not None:
                raise error
            raise CheckpointError(f"{action}: rank {failed - 1} failed while {stage}; nothing was committed")

        if self.writer:
            try:
                self._remove(staging)
                (staging / PAYLOAD_NAME).mkdir(parents=True)
            except OSError as err:
                error = storage_error(action, self.directory, err, kept=self._newest_step())
        vote("creating the staging directory")
        try:
            write(staging / PAYLOAD_NAME)
        except Exception as err:
            error = self._write_error(f"{action}: save callback failed on rank {rank}: {err}", err)
        vote("writing its shard")
        try:
            _hash_share(staging, rank, world)
        except OSError as err:
            error = storage_error(f"{action} (rank {rank} hashing its share)", self.directory, err, kept=None)
        vote("hashing its share")
        body: dict[str, Any] = {}
        files: list[FileDigest] = []
        if self.writer:
            try:
                files = _gather_shares(staging, world)
                for dirpath, _, _ in os.walk(staging / PAYLOAD_NAME):
                    fsync_dir(dirpath)
                body = self._manifest_body(
                    step, samples, self._wall_clock(), reason, request_id,
                    time.perf_counter() - started, files, extra, world_size=world,
                )
                self._write_manifest(staging, body)
                self._commit(staging, final)
            except OSError as err:
                error = storage_error(action, self.directory, err, kept=self._newest_step())
            except (KeyError, TypeError, ValueError) as err:
                error = CheckpointError(f"{action}: a shard list is malformed: {err}")
        vote("committing")
        if self.writer:
            self.prune()
            return self._info(final, body, files)
        return self.verify(final, share=(rank, world), hashes=False)


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
    def _remove(path: Path) -> bool:
        """Delete a file or tree, best-effort: a failure (read-only, vanished) is logged, not raised."""
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            return True
        except OSError as err:
            log.warning("could not remove %s: %s (left in place)", path, err)
            return False
        return True

    def prune(self) -> list[Path]:
        """Delete complete checkpoints beyond the newest ``keep``, and quarantined ones older than those.

        A checkpoint is renamed to a hidden trash name before it is deleted, so a crash during
        deletion never leaves a half-deleted ``step-N`` behind.

        Returns:
            The checkpoint directories removed.
        """
        if not self.writer:
            return []
        try:
            steps = self.list_steps()
            entries = list(os.scandir(self.directory))
        except (CheckpointError, OSError) as err:
            log.warning("not pruning old checkpoints: %s", err)
            return []
        kept, old = steps[: self.keep], steps[self.keep :]
        removed: list[Path] = []
        for _, path in old:
            trash = temp_name(path, "trash")
            try:
                os.rename(path, trash)
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("could not prune old checkpoint %s: %s (left in place)", path, err)
                continue
            self._remove(trash)
            removed.append(path)
        if kept:
            oldest_kept = kept[-1][0]
            for entry in entries:
                match = _CORRUPT_DIR.match(entry.name)
                if match and int(match.group(1)) < oldest_kept and self._remove(Path(entry.path)):
                    removed.append(Path(entry.path))
        if removed:
            try:
                fsync_dir(self.directory)
            except OSError as err:
                log.warning("fsync of %s after pruning failed: %s", self.directory, err)
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
        try:
            entries = list(os.scandir(self.directory))
        except OSError as err:
            log.warning("not cleaning checkpoint leftovers in %s: %s", self.directory, err)
            return []
        for entry in entries:
            if _LEFTOVER.match(entry.name) and self._remove(Path(entry.path)):
                removed.append(Path(entry.path))
        return removed

    # --- reading ------------------------------------------------------------------------------

    def verify(
        self, path: str | os.PathLike[str], *, share: tuple[int, int] | None = None, hashes: bool = True
    ) -> CheckpointInfo:
        """Check a checkpoint directory against its manifest (all files present, sizes and hashes).

        Args:
            path: A ``step-N`` directory.
            share: ``(rank, world)``: re-hash only this rank's share of the files (file ``i`` when
                ``i % world == rank``; every file's size is still checked), so the ranks of a job
                split the reading; they must then agree on the verdict.
            hashes: False: check presence and sizes only (a manifest this process just committed).

        Returns:
            The checkpoint's metadata.

        Raises:
            CorruptCheckpointError: Manifest missing, unreadable, of another format, with a wrong
                own checksum or step, or a payload file missing, of another size or hash.
        """
        ckpt = Path(path)
        try:
            return self._verify(ckpt, share, hashes)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CorruptCheckpointError(f"{ckpt}: malformed {MANIFEST_NAME}: {err!r}") from err

    def _verify(self, ckpt: Path, share: tuple[int, int] | None = None, hashes: bool = True) -> CheckpointInfo:
        body = read_manifest(ckpt, MANIFEST_NAME)  # strict, bounded, sha256, lists files (checkpoint_safety)
        if body.get("format") != FORMAT:
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
        listed = [FileDigest(str(item["path"]), int(item["size"]), str(item["sha256"])) for item in body["files"]]
        check_tree(ckpt, PAYLOAD_NAME, {d.path for d in listed})  # no symlink, no special file, nothing unlisted
        for index, digest in enumerate(listed):
            with open_regular(ckpt, digest.path) as f:  # O_NOFOLLOW on every component, regular files only
                try:
                    size = os.fstat(f.fileno()).st_size
                    if size != digest.size:
                        raise CorruptCheckpointError(
                            f"{ckpt}: {digest.path} has {size} bytes, the manifest says {digest.size} (truncated?)"
                        )
                    mine = hashes and (share is None or index % share[1] == share[0])
                    actual = hashlib.file_digest(f, HASH_ALGORITHM).hexdigest() if mine else digest.sha256
                except OSError as err:
                    raise CorruptCheckpointError(f"{ckpt}: cannot read {digest.path}: {err}") from err
            if actual != digest.sha256:
                raise CorruptCheckpointError(f"{ckpt}: {digest.path} checksum mismatch")
        return CheckpointInfo(
            step=int(body["step"]),
            path=ckpt,
            created_at=float(body["created_at"]),
            samples=int(body.get("samples", 0)),
            reason=str(body.get("reason", "manual")),
            request_id=body.get("request_id"),
            payload_bytes=sum(d.size for d in listed),
            write_seconds=float(body.get("write_seconds", 0.0)),
            extra=dict(body.get("extra") or {}),
            files=tuple(listed),
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


def _hash_share(staging: Path, rank: int, world: int) -> None:
    """Hash and fsync this rank's share of the payload (file ``i`` of the sorted list belongs to
    rank ``i % world``) into ``shard-<rank>.json``."""
    names = _payload_files(staging)
    mine = [_digest_file(staging / rel, rel) for i, rel in enumerate(names) if i % world == rank]
    doc = [{"path": d.path, "size": d.size, "sha256": d.sha256} for d in mine]
    atomic_write_text(staging / f"shard-{rank}.json", json.dumps(doc))


def _gather_shares(staging: Path, world: int) -> list[FileDigest]:
    """Every rank's ``shard-<rank>.json``, as one file list sorted by path."""
    files: list[FileDigest] = []
    for r in range(world):
        for item in json.loads((staging / f"shard-{r}.json").read_text(encoding="utf-8")):
            files.append(FileDigest(item["path"], int(item["size"]), item["sha256"]))
    return sorted(files, key=lambda d: d.path)


def _payload_files(staging: Path) -> list[str]:
    """Every file under ``staging/payload``, as sorted ``/``-separated paths relative to ``staging``."""
    payload = staging / PAYLOAD_NAME
    if payload.is_file():
        return [PAYLOAD_NAME]
    names = [
        Path(dirpath, name).relative_to(staging).as_posix()
        for dirpath, _, filenames in os.walk(payload)
        for name in filenames
    ]
    if not names:
        raise CheckpointError(f"the save callbacks wrote nothing under {payload}")
    return sorted(names)


# --- ready-made callbacks ---------------------------------------------------------------------

def data_save(state: object, path: Path) -> None:
    """Default save callback: ``state`` as a pickle that :func:`data_load` can read back.

    Args:
        state: Plain data: dicts, lists, tuples, numbers, strings, bytes, sets, numpy arrays.
        path: The payload path.

    Raises:
        UnsafeCheckpointError: The state holds something :func:`data_load` would refuse (checked
            before anything is written, so a checkpoint that cannot be resumed is never committed).
    """
    blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        NamesOnlyUnpickler(io.BytesIO(blob)).load()  # our own pickle: the names matter, not the size
    except UnsafeCheckpointError as err:
        raise UnsafeCheckpointError(f"refusing to save a state the default loader could not load back: {err}") from err
    path.write_bytes(blob)


def data_load(path: Path) -> Any:
    """Default load callback: read a payload that is data only; never runs code from it.

    Args:
        path: The payload path.

    Returns:
        The state.

    Raises:
        UnsafeCheckpointError: The payload names anything outside :data:`DATA_GLOBALS` (e.g.
            ``os.system``, or a class of your own), or asks to build far more than it holds (a
            memory bomb: :class:`~gpuscaler.runtime.checkpoint_safety.DataUnpickler`).
        CorruptCheckpointError: The payload is a symlink or a special file, or larger than this
            machine's memory (refused before a byte is read).
    """
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with open_regular(path.parent, path.name, max_bytes=memory) as f:
        return DataUnpickler(f, os.fstat(f.fileno()).st_size).load()



def pickle_save(state: object, path: Path) -> None:
    """Save callback for any picklable state (pair it with :func:`pickle_load`).

    Args:
        state: Any picklable object.
        path: The payload path.
    """
    with open(path, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)


def pickle_load(path: Path) -> Any:
    """Load callback that unpickles anything, and so runs whatever code the payload names.

    Pass it explicitly (``load=pickle_load``) only when nobody but your job can write the
    checkpoint directory: anyone who can write there can then run code in every worker that
    resumes (the manifest's checksums do not prevent that: they are not a signature).

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
