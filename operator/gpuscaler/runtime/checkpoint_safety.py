"""What the checkpoint loader refuses before it reads or builds anything: a checkpoint is untrusted input.

Anyone who can write the checkpoint volume or bucket can put anything there (docs/security.md,
"Checkpoint loading"). The store's checksums catch torn and bit-rotted files, not a writer who
writes a matching manifest. So, before a byte of payload is deserialized:

* **Files** (:func:`open_regular`, :func:`check_tree`): every file of a checkpoint is opened
  component by component with ``O_NOFOLLOW`` (a symlink anywhere on the path is refused, so
  nothing outside the checkpoint directory is read) and ``O_NONBLOCK`` (a FIFO or a device opens
  without waiting for a writer), then ``fstat``-ed: only regular files are read. The payload tree
  may hold only directories and regular files, exactly the files its manifest lists.
* **The manifest** (:func:`read_manifest`): at most :data:`MAX_MANIFEST_BYTES`, strict JSON (no
  ``NaN``/``Infinity``, no number that overflows to infinity), nested at most
  :data:`MAX_MANIFEST_DEPTH` deep, naming the one hash algorithm :data:`HASH_ALGORITHM` (a manifest
  may not choose a weaker one), listing at least one and at most :data:`MAX_FILES` payload files,
  each with a relative path, a size and a SHA-256. Anything else is an incomplete checkpoint
  (:class:`CorruptCheckpointError`): the loader falls back to the previous one.
* **The pickle** (:class:`DataUnpickler`, the default loader's): only the plain-data globals of
  :data:`DATA_GLOBALS`, and a budget on what it may build. A pickle can ask a constructor for far
  more memory than it holds (``list(range(10**10))``, ``bytearray(10**12)``, an array whose shape
  says a terabyte, a length field larger than the file); every such request is charged before the
  call, against ``8 x payload bytes + 64 MiB`` (:func:`budget_for`), and a pickle that asks for
  more is refused (:class:`UnsafeCheckpointError`) before it allocates. numpy array states are
  checked against their shape and dtype (a mismatched object-array state crashes numpy).

Errors are defined here and re-exported by :mod:`gpuscaler.runtime.checkpoint`.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import pickle
import stat
import struct
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Final

from gpuscaler.errors import ErrorKind, TemporaryError
from gpuscaler.nesting import nesting_depth
from gpuscaler.runtime.agreement import Agreement

HASH_ALGORITHM: Final = "sha256"
"""The only hash a manifest may name."""
MAX_MANIFEST_BYTES: Final = 64 * 2**20
"""A manifest larger than this (64 MiB: about 300,000 file entries) is refused unread."""
MAX_MANIFEST_DEPTH: Final = 32
"""Deepest nesting of JSON arrays and objects in a manifest (the store writes 3; ``extra`` is the caller's)."""
MAX_FILES: Final = 100_000
"""Most payload files one checkpoint may list (a sharded checkpoint of a large job has thousands)."""
EXPANSION: Final = 8
"""What a pickle may build per byte it holds (one DUP opcode, one byte, adds an 8-byte list slot)."""
BUDGET_FLOOR: Final = 64 * 2**20
"""What any pickle may build regardless of its size."""
_SHA256_HEX = frozenset("0123456789abcdef")


class CheckpointError(TemporaryError):
    """A checkpoint could not be written, or the store is misused (kind ``TEMPORARY``: storage that
    was full or unreachable may recover; the subclasses below are ``INVALID_INPUT``)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint directory failed verification: incomplete, truncated, altered or holding what a
    checkpoint never holds (kind ``INVALID_INPUT``: reading it again gives the same answer; an
    older checkpoint may do)."""

    kind = ErrorKind.INVALID_INPUT


class UnsafeCheckpointError(CheckpointError):
    """The data-only loader met a payload that would run code, build an object it does not know, or
    build far more than it holds; kind ``INVALID_INPUT``."""

    kind = ErrorKind.INVALID_INPUT


# ------------------------------------------------------------------------------ files


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


@contextmanager
def open_regular(root: Path, rel: str, *, max_bytes: int | None = None) -> Iterator[io.BufferedReader]:
    """Open ``root/rel`` for reading, refusing symlinks on the way and anything but a regular file.

    Each directory of ``rel`` is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the one
    before; the file with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO without a writer or a device does not
    block the open) and checked with ``fstat`` before a byte is read.

    Args:
        root: The checkpoint directory (itself not a symlink).
        rel: A ``/``-separated path inside it, without ``..`` or a leading ``/``.
        max_bytes: Refuse a file larger than this.

    Yields:
        The open file (blocking mode restored).

    Raises:
        CorruptCheckpointError: A symlink, a special file, a path outside ``root``, too large, or
            it cannot be opened.
    """
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CorruptCheckpointError(f"{root}: a path outside the checkpoint: {rel!r}")
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | nofollow))
            for part in parts[:-1]:
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fds[-1]))
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=fds[-1])
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CorruptCheckpointError(f"{root}: {rel}: a symlink or not a directory on the path (refused)") from err
            raise CorruptCheckpointError(f"{root}: cannot open {rel}: {err.strerror or err}") from err
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise CorruptCheckpointError(f"{root}: {rel} is {_kind(info.st_mode)}, not a regular file (refused unread)")
        if max_bytes is not None and info.st_size > max_bytes:
            os.close(fd)
            raise CorruptCheckpointError(f"{root}: {rel} has {info.st_size:,} bytes, more than the {max_bytes:,} allowed")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            yield f
    finally:
        for d in fds:
            os.close(d)


def check_tree(ckpt: Path, payload: str, listed: set[str]) -> None:
    """The payload (``ckpt/payload``: a file or a tree) holds only directories and regular files,
    and exactly the files the manifest lists (``lstat``: no symlink is followed).

    Raises:
        CorruptCheckpointError: A symlink, a special file, or a file the manifest does not list.
    """
    for where in (ckpt, ckpt / payload):
        try:
            mode = os.lstat(where).st_mode
        except OSError as err:
            raise CorruptCheckpointError(f"{ckpt}: cannot read {where.name}: {err.strerror or err}") from err
        if not (stat.S_ISDIR(mode) or (where != ckpt and stat.S_ISREG(mode))):
            raise CorruptCheckpointError(f"{ckpt}: {where.name} is {_kind(mode)} (refused)")
    if not stat.S_ISDIR(os.lstat(ckpt / payload).st_mode):
        found = {payload}
    else:
        found = set()
        stack = [ckpt / payload]
        while stack:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    mode = entry.stat(follow_symlinks=False).st_mode
                    rel = Path(entry.path).relative_to(ckpt).as_posix()
                    if stat.S_ISDIR(mode):
                        stack.append(Path(entry.path))
                    elif stat.S_ISREG(mode):
                        found.add(rel)
                    else:
                        raise CorruptCheckpointError(f"{ckpt}: {rel} is {_kind(mode)}; a checkpoint holds regular files only")
                    if len(found) > MAX_FILES:
                        raise CorruptCheckpointError(f"{ckpt}: more than {MAX_FILES:,} payload files")
    extra = sorted(found - listed)
    if extra:
        raise CorruptCheckpointError(f"{ckpt}: {extra[0]} is not in the manifest ({len(extra)} unlisted file(s))")


# ------------------------------------------------------------------------------ the manifest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is not finite")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number JSON allows")


def read_manifest(ckpt: Path, name: str) -> dict[str, Any]:
    """The manifest of ``ckpt``, parsed strictly and checked for shape (see the module docstring).

    Args:
        ckpt: The checkpoint directory.
        name: The manifest's file name.

    Returns:
        The manifest (its ``files`` a non-empty list of ``{path, size, sha256}``).

    Raises:
        CorruptCheckpointError: Missing, unreadable, too large, not strict JSON, too deep, naming
            another hash, or listing no files or malformed ones: an incomplete checkpoint.
    """
    try:
        with open_regular(ckpt, name, max_bytes=MAX_MANIFEST_BYTES) as f:
            raw = f.read()
    except CorruptCheckpointError as err:
        if isinstance(err.__cause__, FileNotFoundError):
            raise CorruptCheckpointError(f"{ckpt}: no {name} (incomplete checkpoint)") from err
        raise
    try:
        body = json.loads(raw.decode("utf-8"), parse_float=_finite, parse_constant=_no_constant)
    except RecursionError as err:
        raise CorruptCheckpointError(f"{ckpt}: {name} is nested too deeply (incomplete checkpoint)") from err
    except (UnicodeDecodeError, ValueError) as err:
        raise CorruptCheckpointError(f"{ckpt}: unreadable {name}: {err}") from err
    if nesting_depth(body, MAX_MANIFEST_DEPTH) > MAX_MANIFEST_DEPTH:
        raise CorruptCheckpointError(f"{ckpt}: {name} is nested more than {MAX_MANIFEST_DEPTH} deep")
    if not isinstance(body, dict):
        raise CorruptCheckpointError(f"{ckpt}: {name} is not a JSON object")
    if body.get("hash") != HASH_ALGORITHM:
        raise CorruptCheckpointError(f"{ckpt}: {name} names hash {str(body.get('hash'))[:20]!r}; only {HASH_ALGORITHM} is accepted")
    files = body.get("files")
    if not isinstance(files, list) or not files:
        raise CorruptCheckpointError(f"{ckpt}: {name} lists no payload files (incomplete checkpoint)")
    if len(files) > MAX_FILES:
        raise CorruptCheckpointError(f"{ckpt}: {name} lists {len(files):,} files, more than {MAX_FILES:,}")
    seen: set[str] = set()
    for item in files:
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("path"), str)
            and isinstance(item.get("size"), int) and not isinstance(item.get("size"), bool) and item["size"] >= 0
            and isinstance(item.get("sha256"), str) and len(item["sha256"]) == 64 and set(item["sha256"]) <= _SHA256_HEX
        )
        if not ok or item["path"] in seen:
            raise CorruptCheckpointError(f"{ckpt}: {name} has a malformed or repeated file entry: {str(item)[:80]}")
        seen.add(item["path"])
    return body


# ------------------------------------------------------------------------------ the pickle

DATA_GLOBALS: Final = frozenset(
    {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
        ("builtins", "bytearray"),
        ("builtins", "slice"),
        ("builtins", "range"),
        ("builtins", "list"),
        ("builtins", "dict"),
        ("builtins", "tuple"),
        ("builtins", "int"),
        ("builtins", "float"),
        ("builtins", "str"),
        ("builtins", "bytes"),
        ("builtins", "bool"),
        ("collections", "OrderedDict"),
        ("collections", "deque"),
        ("collections", "defaultdict"),
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
    }
)
"""What :func:`gpuscaler.runtime.checkpoint.data_load` lets a pickle name: value types and
containers whose construction runs no code of the payload's choosing (the "restricting globals"
recipe of the :mod:`pickle` docs, as ``torch.load(weights_only=True)`` does). numpy arrays are
data here: an object array's elements are unpickled under the same restriction. ``numpy.dtypes.*``
classes (numpy 2) are allowed by the name pattern in :meth:`DataUnpickler.find_class`."""

_SCALARS = (str, int, float, complex, bool, bytes, bytearray, type(None))


def budget_for(size: int) -> int:
    """Bytes a pickle of ``size`` bytes may build: ``EXPANSION * size + BUDGET_FLOOR``."""
    return EXPANSION * size + BUDGET_FLOOR


class _Bounded(io.RawIOBase):
    """The payload, refusing a read longer than what is left (a length field may claim terabytes)."""

    def __init__(self, f: io.BufferedIOBase, size: int) -> None:
        self._f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        if n > self.left:
            raise UnsafeCheckpointError(f"the pickle asks to read {n:,} bytes where {self.left:,} are left")
        data = self._f.read(self.left if n < 0 else n)
        self.left -= len(data)
        return data

    def readline(self, size: int | None = -1, /) -> bytes:
        data = self._f.readline(self.left)
        self.left -= len(data)
        return data

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def _check_name(module: str, name: str) -> None:
    """Refuse a global outside :data:`DATA_GLOBALS` (and numpy's dtype classes)."""
    if (module, name) in DATA_GLOBALS or (module == "numpy.dtypes" and name.endswith("DType")):
        return
    raise UnsafeCheckpointError(
        f"the checkpoint refers to {module}.{name}, which the data-only loader does not build "
        "(a pickle can run any code through such a reference); save plain data (dict, list, "
        "numbers, str, bytes, numpy arrays), use torch.load(weights_only=True) through "
        "gpuscaler.runtime.distributed.torch_load, or, only if nobody else can write the "
        "checkpoint directory, pass load=gpuscaler.runtime.pickle_load"
    )


_PurePythonUnpickler: Any = pickle._Unpickler
"""The pure-Python unpickler (its opcode methods are not in the type stubs)."""


class DataUnpickler(_PurePythonUnpickler):  # type: ignore[misc]
    """Builds only :data:`DATA_GLOBALS` (and numpy dtype classes), within a byte budget.

    The pure-Python unpickler, so that every opcode that calls a constructor (REDUCE, NEWOBJ,
    NEWOBJ_EX, INST, OBJ, BUILD) and every length field is checked before it runs.

    Args:
        file: The pickle, opened for reading.
        size: Its size in bytes (what it may read and what it may build: :func:`budget_for`).
    """

    dispatch: ClassVar[dict[int, Any]] = dict(_PurePythonUnpickler.dispatch)

    def __init__(self, file: io.BufferedIOBase, size: int) -> None:
        super().__init__(_Bounded(file, size))
        self.left = budget_for(size)

    def find_class(self, module: str, name: str) -> Any:
        _check_name(module, name)
        return super().find_class(module, name)

    def _charge(self, n: int, what: str) -> None:
        self.left -= max(n, 0)
        if self.left < 0:
            raise UnsafeCheckpointError(
                f"the checkpoint's pickle asks to build {what}, more than it could hold "
                f"(at most {EXPANSION}x its size plus {BUDGET_FLOOR // 2**20} MiB): refused before allocating"
            )

    def _check_call(self, func: Any, args: Any, kwargs: Any = None) -> None:
        if not isinstance(args, tuple) or (kwargs is not None and not isinstance(kwargs, dict)):
            raise UnsafeCheckpointError("the checkpoint's pickle calls a constructor with malformed arguments")
        values = [*args, *(kwargs or {}).values()]
        if func is str and not all(isinstance(a, _SCALARS) for a in values):
            raise UnsafeCheckpointError("the checkpoint's pickle asks for str() of a container (its text can be any size)")
        cost = 0
        for a in values:
            if isinstance(a, int) and not isinstance(a, bool) and func in (bytes, bytearray):
                cost += a
            elif isinstance(a, range | list | tuple | set | frozenset | dict | deque | str | bytes | bytearray):
                try:
                    cost += len(a) * (1 if isinstance(a, str | bytes | bytearray) else 8)
                except OverflowError as err:
                    raise UnsafeCheckpointError("the checkpoint's pickle holds a range too long to count") from err
        cost += _array_cost(func, args)
        self._charge(cost, f"{getattr(func, '__name__', 'a constructor')}() of {cost:,} bytes")

    def load_reduce(self) -> None:
        self._check_call(self.stack[-2], self.stack[-1])
        _PurePythonUnpickler.load_reduce(self)

    def load_newobj(self) -> None:
        self._check_call(self.stack[-2], self.stack[-1])
        _PurePythonUnpickler.load_newobj(self)

    def load_newobj_ex(self) -> None:
        self._check_call(self.stack[-3], self.stack[-2], self.stack[-1])
        _PurePythonUnpickler.load_newobj_ex(self)

    def _instantiate(self, klass: Any, args: Any) -> None:
        self._check_call(klass, tuple(args))
        _PurePythonUnpickler._instantiate(self, klass, args)

    def load_build(self) -> None:
        _check_state(self.stack[-2], self.stack[-1], self._charge)
        _PurePythonUnpickler.load_build(self)

    def load_bytearray8(self) -> None:
        (n,) = struct.unpack("<Q", self.read(8))
        self._charge(n, f"a bytearray of {n:,} bytes")  # before bytearray(n) allocates it
        b = bytearray(n)
        self.readinto(b)
        self.append(b)

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8


class NamesOnlyUnpickler(pickle.Unpickler):
    """The C unpickler with :class:`DataUnpickler`'s name check and no budget: for checking a pickle
    this process just made (:func:`gpuscaler.runtime.checkpoint.data_save`), at C speed."""

    def find_class(self, module: str, name: str) -> Any:
        _check_name(module, name)
        return super().find_class(module, name)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a runtime dependency
        return None
    return numpy


def _shape_bytes(np: Any, shape: Any, dtype: Any) -> int:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise UnsafeCheckpointError(f"the checkpoint's pickle gives an array the shape {str(shape)[:40]}")
    try:
        itemsize = np.dtype(dtype).itemsize
    except (TypeError, ValueError) as err:
        raise UnsafeCheckpointError(f"the checkpoint's pickle gives an array the dtype {str(dtype)[:40]}") from err
    return int(math.prod(shape)) * max(int(itemsize), 1)


def _array_cost(func: Any, args: tuple[Any, ...]) -> int:
    """Bytes a numpy constructor call allocates (0 for anything else)."""
    np = _numpy()
    if np is None:
        return 0
    if func is np.ndarray and args:
        return _shape_bytes(np, args[0], args[1] if len(args) > 1 else float)
    if getattr(func, "__name__", "") == "_reconstruct" and len(args) == 3:
        return _shape_bytes(np, args[1], args[2])
    return 0


def _check_state(inst: Any, state: Any, charge: Any) -> None:
    """A numpy array's or dtype's pickled state must match itself (numpy trusts it, and crashes)."""
    np = _numpy()
    if np is None:
        return
    if isinstance(inst, np.ndarray):
        parts = state if isinstance(state, tuple) else ()
        if len(parts) == 5:
            parts = parts[1:]
        if len(parts) != 4 or not isinstance(parts[1], np.dtype):
            raise UnsafeCheckpointError("the checkpoint's pickle gives an array a malformed state")
        shape, dtype, _, data = parts
        n = _shape_bytes(np, shape, dtype)
        count = n // max(dtype.itemsize, 1)
        if dtype.hasobject:
            ok = isinstance(data, list) and len(data) == count
        else:
            ok = isinstance(data, bytes | bytearray) and len(data) == n
        if not ok:
            raise UnsafeCheckpointError("the checkpoint's pickle gives an array data that does not match its shape and dtype")
        charge(n, f"an array of {n:,} bytes")
    elif isinstance(inst, np.dtype):
        if not isinstance(state, tuple) or len(state) not in (8, 9) or not all(isinstance(x, int) for x in state[5:8]):
            raise UnsafeCheckpointError("the checkpoint's pickle gives a dtype a malformed state")
        charge(state[5], f"a dtype of {state[5]:,} bytes per item")


# ------------------------------------------------------------------------------ loading


def load_agreed(
    load: Callable[[Path], Any], ckpt: Path, payload: Path, agree: Agreement | None
) -> tuple[Any, UnsafeCheckpointError | None]:
    """Load a verified checkpoint's payload; the ranks agree on the verdict.

    A payload the data-only loader refuses (:class:`UnsafeCheckpointError`: it would run code or
    build far more than it holds) is one :func:`gpuscaler.runtime.checkpoint.data_save` never
    writes: the checkpoint was tampered with, and the caller falls back to an older one. Any other
    failure of the load callback is a code or format problem, raised (falling back would hide it).

    Args:
        load: The load callback.
        ckpt: The checkpoint directory (for messages).
        payload: Its payload path.
        agree: The ranks' agreement (None: a single process).

    Returns:
        ``(state, None)``, or ``(None, why)`` when this rank's or another rank's loader refused it.

    Raises:
        CheckpointError: The load callback failed otherwise, on this rank or another.
    """
    state: Any = None
    refused: UnsafeCheckpointError | None = None
    failed: CheckpointError | None = None
    try:
        state = load(payload)
    except UnsafeCheckpointError as err:
        refused = UnsafeCheckpointError(f"loading verified checkpoint {ckpt}: {err}")
    except CheckpointError as err:  # keep the type
        failed = type(err)(f"loading verified checkpoint {ckpt}: {err}")
    except Exception as err:
        failed = CheckpointError(f"loading verified checkpoint {ckpt}: load callback failed: {err}")
    verdict = 2 if failed is not None else int(refused is not None)
    if agree is not None:  # every rank votes, also the one that failed: no rank waits for it
        (verdict,) = agree.max([verdict])
    if failed is not None:
        raise failed
    if verdict == 2:
        raise CheckpointError(f"loading verified checkpoint {ckpt} failed on another rank")
    if verdict == 1 and refused is None:
        refused = UnsafeCheckpointError(f"another rank's data-only loader refused {ckpt}")
    return state, refused
