"""What a strategy sees of a running allocation, and what it may ask the engine to do about it.

The engine (:mod:`gpuscaler.simulator.engine`) calls :meth:`Strategy.review
<gpuscaler.simulator.strategies.Strategy.review>` at the hour the strategy asked for
(:meth:`~gpuscaler.simulator.strategies.Strategy.review_at_h`) with an :class:`Allocation`: the
decision running, when it started, and the job's progress as its own samples counter shows it
(work since the last checkpoint included). The strategy answers with a :class:`Review`: carry
on, look again later, or move the rest of the job to another decision, now (after writing a
checkpoint) or at the next periodic checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscaler.simulator.strategies import Decision


@dataclass(frozen=True, slots=True)
class Allocation:
    """A running allocation as a strategy may know it."""

    decision: Decision
    start_h: float
    """Hour the capacity request succeeded (provisioning starts)."""
    provisioning_s: float
    samples_done: float
    """The job's samples trained so far, by its progress counter (unsaved work included)."""
    samples_saved: float
    """The job's samples in its newest checkpoint."""
    total_samples: float
    arrival_h: float


@dataclass(frozen=True, slots=True)
class Review:
    """A strategy's answer to a review."""

    move: Decision | None = None
    """Move the rest of the job to this decision (None: carry on)."""
    at_checkpoint: bool = False
    """Move when the next periodic checkpoint is written (nothing lost, no extra write); else now,
    after writing a checkpoint."""
    again_h: float | None = None
    """Review again at this hour (None: no further review of this allocation)."""
