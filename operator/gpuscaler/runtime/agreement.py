"""How the ranks of one job agree at a step boundary: an element-wise MAX of small integer flags.

:class:`TrainingGuard` takes an :class:`Agreement` (``agree=``) in a multi-process job. At every
step boundary it snapshots its local flags once (stop requested, checkpoint requested, planned
checkpoint due), reduces them across ranks with :meth:`Agreement.max` and acts only on the agreed
result, so every rank stops or checkpoints at the same step. A signal that lands after the
snapshot is in the next step's snapshot, on every rank at once through the reduction: no rank
re-reads a live flag after agreeing.

:class:`~gpuscaler.runtime.distributed.TorchAgreement` (in the optional, lazily imported
:mod:`gpuscaler.runtime.distributed`) implements it with one ``all_reduce`` of a few int64
values. :class:`SoloAgreement` is the single-process case (the guard needs no agreement there).
This module imports nothing beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Agreement(Protocol):
    """The collective operations the guard needs; every rank calls them in the same order."""

    @property
    def rank(self) -> int:
        """This process's global rank (0 is the writer by default)."""

    @property
    def world_size(self) -> int:
        """Processes in the job."""

    def max(self, values: Sequence[int]) -> list[int]:
        """Element-wise maximum of ``values`` across all ranks (a collective: every rank calls it).

        Args:
            values: This rank's values; the same length on every rank.

        Returns:
            The maxima, the same list on every rank.
        """

    def barrier(self) -> None:
        """Wait until every rank has called it."""


class SoloAgreement:
    """One process: the agreed values are the local ones.

    Args:
        rank: The rank to report (0).
    """

    def __init__(self, rank: int = 0) -> None:
        self._rank = rank

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Always 1."""
        return 1

    def max(self, values: Sequence[int]) -> list[int]:
        """The values themselves.

        Args:
            values: The local values.

        Returns:
            A copy of ``values``.
        """
        return list(values)

    def barrier(self) -> None:
        """Nothing to wait for."""
