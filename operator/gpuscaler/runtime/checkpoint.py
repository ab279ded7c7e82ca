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

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuscaler.runtime.agreement import Agreement
from gpuscaler.runtime.atomic import atomic_write_text, fsync_dir, temp_name
from gpuscaler.runtime.checkpoint_callbacks import (
    bytes_callbacks,
    data_load,
    data_save,
    pickle_load,
    pickle_save,
)
from gpuscaler.runtime.checkpoint_files import (
    _CORRUPT_DIR,
    _LEFTOVER,
    _NO_SPACE,
    _NOT_WRITABLE,
    _STEP_DIR,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    PAYLOAD_NAME,
    SHARD_STAGING_TAG,
    STEP_DIGITS,
    CheckpointInfo,
    FileDigest,
    LoadFn,
    SaveFn,
    _digest_file,
    _digest_tree,
    _errno_of,
    _free_bytes,
    _manifest_checksum,
    step_dir_name,
    storage_error,
)
from gpuscaler.runtime.checkpoint_safety import (
    DATA_GLOBALS,
    HASH_ALGORITHM,
    CheckpointError,
    CorruptCheckpointError,
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
            "files": [d.to_json() for d in files],
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
        listed = [FileDigest.from_json(item) for item in body["files"]]
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
    doc = [d.to_json() for d in mine]
    atomic_write_text(staging / f"shard-{rank}.json", json.dumps(doc))


def _gather_shares(staging: Path, world: int) -> list[FileDigest]:
    """Every rank's ``shard-<rank>.json``, as one file list sorted by path."""
    files: list[FileDigest] = []
    for r in range(world):
        for item in json.loads((staging / f"shard-{r}.json").read_text(encoding="utf-8")):
            files.append(FileDigest.from_json(item))
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


