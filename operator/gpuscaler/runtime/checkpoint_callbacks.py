"""Ready-made save and load callbacks of :class:`gpuscaler.runtime.checkpoint.CheckpointStore` (re-exported there): plain data as a pickle the bounded loader reads back, any pickle, and bytes."""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuscaler.runtime.checkpoint_files import S
from gpuscaler.runtime.checkpoint_safety import (
    DataUnpickler,
    NamesOnlyUnpickler,
    UnsafeCheckpointError,
    open_regular,
)


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
