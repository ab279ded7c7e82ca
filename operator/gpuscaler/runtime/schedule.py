"""When the next planned checkpoint is due: every ``interval_s`` seconds and/or every N steps.

Pure logic with an injectable clock, so the tests drive it with a fake one. The guard calls
:meth:`CheckpointSchedule.due` at each step boundary and :meth:`CheckpointSchedule.mark` after each
checkpoint, whatever triggered it (a notice-triggered checkpoint restarts the interval too).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class CheckpointSchedule:
    """Interval and step-count checkpoint schedule.

    The interval counts from the last checkpoint, or from :meth:`mark` at start-up (a freshly
    resumed worker has lost nothing yet). Both limits may be set; the first one reached triggers.

    Args:
        interval_s: Seconds between checkpoints; None or <= 0 disables the time limit.
        every_steps: Steps between checkpoints; None or <= 0 disables the step limit.
        clock: Monotonic seconds, injectable for tests.
    """

    def __init__(
        self,
        interval_s: float | None = None,
        every_steps: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s if interval_s and interval_s > 0 else None
        self.every_steps = every_steps if every_steps and every_steps > 0 else None
        self._clock = clock
        self.last_time = clock()
        self.last_step = 0

    def mark(self, step: int) -> None:
        """Record that state up to ``step`` is safe on disk now (a checkpoint, or a resume).

        Args:
            step: Steps completed at the checkpoint.
        """
        self.last_time = self._clock()
        self.last_step = step

    def due(self, step: int) -> bool:
        """Whether a planned checkpoint is due after ``step`` steps are completed.

        Args:
            step: Steps completed so far.

        Returns:
            True when the step or time limit is reached and there is new work to save.
        """
        if step <= self.last_step:
            return False
        if self.every_steps is not None and step - self.last_step >= self.every_steps:
            return True
        return self.interval_s is not None and self._clock() - self.last_time >= self.interval_s

    def seconds_since(self) -> float:
        """Seconds since the last checkpoint (or start).

        Returns:
            Elapsed monotonic seconds.
        """
        return self._clock() - self.last_time
