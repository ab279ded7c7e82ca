"""PyTorch glue for the guard: rank agreement over torch.distributed, data-only torch.save/load, DCP.

Optional: this module imports torch when it is imported, so import it only in a training script
(``gpuscaler.runtime`` itself never does). Typical DDP worker under ``torchrun``::

    import torch.distributed as dist
    from gpuscaler.runtime import KubeReporter, TrainingGuard
    from gpuscaler.runtime.distributed import TorchAgreement, torch_load, torch_save

    dist.init_process_group("gloo")            # or "nccl"
    guard = TrainingGuard.from_env(save=torch_save, load=torch_load,
                                   agree=TorchAgreement(), reporter=KubeReporter.from_env())
    state, start = guard.resume(initial_state)      # every rank loads the same checkpoint
    for step in guard.steps(start, total_steps):    # every rank stops at the same step
        ...
        guard.completed(step, state, samples=global_batch)

With FSDP or ZeRO, every rank holds a part of the state: pass ``sharded=True`` and the callbacks
of :func:`dcp_callbacks` (``torch.distributed.checkpoint``); each rank writes its shard and the
checkpoint is complete only when the writer has committed the manifest, after every shard.

:class:`TorchAgreement` costs one ``all_reduce`` of three int64 values per step, on a gloo group
(a CPU one is made beside an NCCL default group, so the step's CUDA stream is not synchronised);
``benchmarks/runtime_checkpoint.py`` measures it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuscaler.runtime.checkpoint import LoadFn, SaveFn, UnsafeCheckpointError


class TorchAgreement:
    """The guard's :class:`~gpuscaler.runtime.agreement.Agreement` over ``torch.distributed``.

    Construct it on every rank at the same point (it may create a process group, a collective).

    Args:
        group: The process group of the ranks that train together (default: the world).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised (call ``init_process_group`` first).
    """

    def __init__(self, group: Any = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchAgreement needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) before building the guard"
            )
        backend = str(dist.get_backend(group))
        self._group = group if backend == "gloo" else dist.new_group(backend="gloo")
        self._rank = int(dist.get_rank(group))
        self._world = int(dist.get_world_size(group))

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return self._world

    def max(self, values: Sequence[int]) -> list[int]:
        """Element-wise MAX across the ranks (one ``all_reduce`` on CPU).

        Args:
            values: This rank's values.

        Returns:
            The maxima, the same on every rank.
        """
        tensor = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)
        return [int(v) for v in tensor.tolist()]

    def barrier(self) -> None:
        """Wait for every rank of the group."""
        dist.barrier(group=self._group)


def torch_save(state: Any, path: Path) -> None:
    """Save callback: ``torch.save(state, path)`` (state dicts, tensors, plain data).

    Args:
        state: What to save; keep to tensors and plain data so :func:`torch_load` can read it.
        path: The payload path.
    """
    torch.save(state, path)


def torch_load(path: Path) -> Any:
    """Load callback: ``torch.load(path, weights_only=True, map_location="cpu")``.

    ``weights_only`` unpickles tensors and plain data only, never code (torch's own default since
    2.6); tensors come back on the CPU (``load_state_dict`` copies them to the model's device).

    Args:
        path: The payload path.

    Returns:
        The state.

    Raises:
        UnsafeCheckpointError: The payload holds anything but tensors and plain data.
    """
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise UnsafeCheckpointError(
            f"torch.load(weights_only=True) refused {path}: {err}; save tensors and plain data only"
        ) from err


_DCP_MODULES = ("torch.distributed.checkpoint.", "torch.distributed.tensor.")
_DCP_EXTRA_GLOBALS = frozenset(
    {
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        # a layout by name (torch.serialization keeps a name -> torch.layout table), and the
        # checkpoint's own path as DCP records it: neither runs code
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only what a DCP ``.metadata`` file is made of: its dataclasses, enums, torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if module.startswith(_DCP_MODULES) and isinstance(found, type):
            return found
        if module == "torch" and (
            found is torch.Size or isinstance(found, (torch.dtype, torch.layout, torch.memory_format))
        ):
            return found
        if (module, name) in _DCP_EXTRA_GLOBALS:
            return found
        raise UnsafeCheckpointError(
            f"the checkpoint's DCP metadata refers to {module}.{name}, which DCP metadata never "
            "holds: refusing to load it (torch.distributed.checkpoint unpickles .metadata as is)"
        )


def check_dcp_metadata(directory: Path) -> None:
    """Refuse a DCP checkpoint whose ``.metadata`` pickle would run code, before DCP unpickles it.

    Args:
        directory: The DCP checkpoint directory.

    Raises:
        UnsafeCheckpointError: The metadata names anything else than DCP's own types.
    """
    blob = (directory / ".metadata").read_bytes()
    _MetadataUnpickler(io.BytesIO(blob)).load()


def dcp_callbacks(
    template: Callable[[], dict[str, Any]],
) -> tuple[SaveFn[dict[str, Any]], LoadFn[dict[str, Any]]]:
    """Save and load callbacks for a sharded state with ``torch.distributed.checkpoint``.

    Use with ``TrainingGuard(..., sharded=True, agree=TorchAgreement())``: every rank saves its
    shard into the shared payload directory, and every rank loads its part in place.

    Args:
        template: Returns the state dict to load into (e.g. ``{"model": model.state_dict(),
            "optim": ...}`` from ``torch.distributed.checkpoint.state_dict.get_state_dict``);
            DCP loads in place, so the tensors it holds receive the checkpoint.

    Returns:
        ``(save, load)``.
    """
    import torch.distributed.checkpoint as dcp

    def save(state: dict[str, Any], path: Path) -> None:
        dcp.save(state, checkpoint_id=str(path))

    def load(path: Path) -> dict[str, Any]:
        check_dcp_metadata(path)
        state = template()
        dcp.load(state, checkpoint_id=str(path))
        return state

    return save, load
