"""Durable file primitives: fsync of files and directories, atomic replace of a small file.

Used by the checkpoint store (manifests, payload trees) and the file progress reporter. The
pattern is the POSIX one: write a temp file in the destination's directory, flush and fsync it,
``rename`` it over the destination, fsync the directory so the rename itself is durable.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

_IGNORED_DIR_FSYNC_ERRORS = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR})
"""Some file systems (and platforms) refuse fsync on a directory; durability there is best effort."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (creations, renames, deletions) to stable storage.

    Args:
        path: The directory.

    Raises:
        OSError: The directory cannot be opened, or fsync fails with an error other than "not
            supported on this file system".
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _IGNORED_DIR_FSYNC_ERRORS:
            raise
    finally:
        os.close(fd)


def temp_name(final: Path, tag: str = "tmp") -> Path:
    """A unique hidden sibling of ``final`` for staging a write (same directory, same file system).

    Args:
        final: The path the staged file or directory will be renamed to.
        tag: A word naming what the temp is for, kept in the name for whoever lists the directory.

    Returns:
        ``<dir>/.<name>.<tag>-<pid>-<random>``.
    """
    return final.with_name(f".{final.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that readers see either the old or the new content.

    Args:
        path: Destination file; its directory must exist.
        data: The complete new content.
        durable: Also fsync the file and the directory (survives a power loss, not only a crash
            of this process). Off only for files whose loss is harmless.

    Raises:
        OSError: Writing, syncing or renaming failed; the destination is then left unchanged and
            the temp file removed.
    """
    final = Path(path)
    tmp = temp_name(final)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(final.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically; see :func:`atomic_write_bytes`.

    Args:
        path: Destination file; its directory must exist.
        text: The complete new content.
        durable: Also fsync the file and the directory.

    Raises:
        OSError: Writing, syncing or renaming failed.
    """
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file someone else wrote (and maybe did not sync) to stable storage.

    Args:
        path: A regular file.

    Raises:
        OSError: The file cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
