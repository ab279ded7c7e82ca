"""TrainingGuard: resume, checkpoint on schedule and on notice, stop cleanly on SIGTERM, report progress.

The one object a training script uses::

    guard = TrainingGuard.from_env(save=save_fn, load=load_fn)
    state, start = guard.resume(initial_state)
    for step in guard.steps(start, total_steps):
        state = train_step(state, step)
        guard.completed(step, state, samples=batch_size)

At every step boundary (:meth:`TrainingGuard.completed`) the guard, in this order:

1. if SIGTERM arrived: checkpoints (unless the newest checkpoint already holds this step), reports
   phase ``preempted`` and exits with :data:`~gpuscaler.runtime.constants.EXIT_PREEMPTED` (or, with
   ``exit_on_stop=False``, makes ``completed`` return True and ``steps`` end);
2. if the operator asked for a checkpoint (a new ``gpuscaler.io/checkpoint-requested`` value in the
   downward API file, or :meth:`TrainingGuard.request_checkpoint`): checkpoints and reports the
   request id as acknowledged, then carries on;
3. if the planned interval (seconds and/or steps) has passed: checkpoints;
4. reports progress when ``report_interval_s`` has passed.

In a job of several processes, pass ``agree=`` (e.g.
:class:`gpuscaler.runtime.distributed.TorchAgreement`): at every boundary each rank snapshots its
flags for 1-3 once, the ranks reduce them (MAX) in one tiny collective, and every rank acts on the
agreed result, so all ranks stop or checkpoint at the same step. Only the writer (rank 0 by
default) saves, acknowledges and reports, unless ``sharded=True``: then every rank writes its own
shard and the writer commits the manifest last (:meth:`CheckpointStore.save_sharded`).

When ``steps`` runs to the end, a final checkpoint is written and the signal handler removed.
Steps are counted as *steps completed*: the checkpoint taken after step index ``i`` is named
``i + 1`` and a resume from it starts the loop at index ``i + 1``, so no step runs twice.

Nothing here imports a framework or a Kubernetes client; PyTorch & co. plug in through the save
and load callbacks, which receive a path inside a staging directory the guard commits atomically.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import gpuscaler.runtime.guard_checkpoint as checkpointing
import gpuscaler.runtime.guard_resume as resuming
from gpuscaler.errors import InvalidInputError
from gpuscaler.runtime.agreement import Agreement
from gpuscaler.runtime.checkpoint import (
    CheckpointInfo,
    CheckpointStore,
    LoadFn,
    SaveFn,
    data_load,
    data_save,
)
from gpuscaler.runtime.config import GuardConfig
from gpuscaler.runtime.constants import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_KEEP,
    DEFAULT_REPORT_INTERVAL_S,
    DOWNWARD_ANNOTATIONS_FILE,
    EXIT_PREEMPTED,
)
from gpuscaler.runtime.metrics import MetricsServer, RuntimeMetrics, serve_metrics
from gpuscaler.runtime.notice import AnnotationWatcher, StopSignal
from gpuscaler.runtime.progress import (
    PHASE_FINISHED,
    PHASE_PREEMPTED,
    PHASE_RUNNING,
    FanoutReporter,
    FileReporter,
    Progress,
    ProgressReporter,
)
from gpuscaler.runtime.schedule import CheckpointSchedule

log = logging.getLogger(__name__)

S = TypeVar("S")


def payload_path(path: Path) -> Path:
    """Load callback of a guard whose checkpoints a framework reads itself: the payload's path.

    Args:
        path: The payload path.

    Returns:
        ``path``.
    """
    return path

class GuardUsageError(InvalidInputError, RuntimeError):
    """The guard is used out of order (e.g. a step yielded by ``steps`` was not reported done)."""


@dataclass(frozen=True)
class Boundary:
    """What one step boundary needs (:meth:`TrainingGuard.boundary`), the same on every rank."""

    stop: bool
    """Checkpoint, then stop and exit with :data:`EXIT_PREEMPTED`."""
    checkpoint: bool
    """Take a checkpoint now (always True when ``stop``)."""
    reason: str
    """``sigterm``, ``notice`` or ``interval`` (empty when nothing is due)."""
    request_id: str | None
    """The operator's request this checkpoint answers (acknowledged on commit)."""
    notice_at: float | None
    """Monotonic time the notice arrived, for the latency metric."""


class TrainingGuard(Generic[S]):
    """Checkpoint/resume/notice handling around a training loop.

    Args:
        checkpoint_dir: Directory of checkpoints (created if missing).
        save: ``save(state, path)`` writes the state to the file or new directory ``path``;
            default: :func:`~gpuscaler.runtime.checkpoint.data_save`. Atomicity, fsync and
            checksums are the guard's job, not the callback's. With ``sharded=True`` every rank
            calls it with the same directory ``path`` (e.g. ``torch.distributed.checkpoint.save``).
        load: ``load(path) -> state`` reads it back; default:
            :func:`~gpuscaler.runtime.checkpoint.data_load`, which loads data only and refuses a
            payload that would run code. Pass :func:`~gpuscaler.runtime.checkpoint.pickle_load`
            explicitly only for checkpoints nobody else can write (see docs/runtime.md).
        interval_s: Seconds between planned checkpoints; None disables the time limit.
        every_steps: Steps between planned checkpoints; None disables the step limit.
        keep: Complete checkpoints to keep.
        podinfo_dir: Downward API volume directory with the ``annotations`` file; None: only
            SIGTERM and :meth:`request_checkpoint` trigger notice checkpoints.
        reporter: Progress reporter; default: none.
        metrics: Metric values to update (one is created when None).
        metrics_port: Serve Prometheus metrics on this port (None: do not serve).
        report_interval_s: Minimum seconds between periodic progress reports.
        exit_on_stop: After the SIGTERM checkpoint, raise ``SystemExit(EXIT_PREEMPTED)``. When
            False, :meth:`completed` returns True, :meth:`steps` ends, :attr:`preempted` is True,
            and the caller must exit (with :data:`EXIT_PREEMPTED`).
        writer: Whether this process commits checkpoints (saves, acknowledges requests, prunes).
            Default: rank 0 of ``agree`` (True without one).
        agree: How the ranks agree at each step boundary (:mod:`gpuscaler.runtime.agreement`);
            None: a single process. Every rank must then call :meth:`resume`, :meth:`steps`,
            :meth:`completed` and :meth:`finish` in the same order (they are collectives).
        sharded: Every rank writes its own shard of each checkpoint (FSDP, ZeRO,
            ``torch.distributed.checkpoint``); needs ``agree``.
        reports: Whether this process reports progress (one reporter per pod, so ranks never
            overwrite each other). Default: the writer.
        handle_signals: Install the SIGTERM handler (main thread only).
        clock: Monotonic seconds (injectable for tests).
        wall_clock: Unix seconds (injectable for tests).
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        *,
        save: SaveFn[S] | None = None,
        load: LoadFn[S] | None = None,
        interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S,
        every_steps: int | None = None,
        keep: int = DEFAULT_CHECKPOINT_KEEP,
        podinfo_dir: str | os.PathLike[str] | None = None,
        reporter: ProgressReporter | None = None,
        metrics: RuntimeMetrics | None = None,
        metrics_port: int | None = None,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        exit_on_stop: bool = True,
        writer: bool | None = None,
        agree: Agreement | None = None,
        sharded: bool = False,
        reports: bool | None = None,
        handle_signals: bool = True,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if sharded and agree is None:
            raise GuardUsageError("sharded=True needs agree= (the ranks must agree on each checkpoint)")
        self.agree = agree if agree is not None and agree.world_size > 1 else None
        """The agreement among ranks; None for a single process."""
        if writer is None:
            writer = agree is None or agree.rank == 0
        self.sharded = sharded and self.agree is not None
        self.reports = writer if reports is None else reports
        self.store = CheckpointStore(checkpoint_dir, keep, writer=writer, wall_clock=wall_clock)
        self._save: SaveFn[S] = save if save is not None else data_save
        self._load: LoadFn[S] = load if load is not None else data_load
        self.schedule = CheckpointSchedule(interval_s, every_steps, clock=clock)
        self.watcher = (
            AnnotationWatcher(Path(podinfo_dir) / DOWNWARD_ANNOTATIONS_FILE, clock=clock)
            if podinfo_dir is not None
            else None
        )
        self.reporter: ProgressReporter = reporter if reporter is not None else FanoutReporter()
        self.metrics = metrics if metrics is not None else RuntimeMetrics()
        self.metrics_port = metrics_port
        self.metrics_server: MetricsServer | None = None
        self.report_interval_s = report_interval_s
        self.exit_on_stop = exit_on_stop
        self.stop_signal = StopSignal(clock=clock)
        self._handle_signals = handle_signals
        self._clock = clock
        self._wall_clock = wall_clock

        self._started = False
        self._closed = False
        self._step = 0
        self._samples = 0
        self._state: S | None = None
        self._has_state = False
        self._expected: int | None = None
        self._last: CheckpointInfo | None = None
        self._ack: str | None = None
        self._writing_since: float | None = None
        """Wall time the checkpoint being written began (reported: the operator keeps the pod's
        node from voluntary disruption meanwhile); None between checkpoints."""
        self._write_seconds: float | None = None
        self._manual_request: tuple[str, float] | None = None
        self._last_report: float | None = None
        self._phase = PHASE_RUNNING
        self._stop_handled = False
        self._agreed_stop = False

    @classmethod
    def from_env(
        cls,
        save: SaveFn[S] | None = None,
        load: LoadFn[S] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        reporter: ProgressReporter | None = None,
        **kwargs: Any,
    ) -> TrainingGuard[S]:
        """Build a guard from the ``GPUSCALER_*`` variables the operator sets.

        Reads ``GPUSCALER_CHECKPOINT_DIR``, ``_CHECKPOINT_INTERVAL_S``, ``_CHECKPOINT_EVERY_STEPS``,
        ``_CHECKPOINT_KEEP``, ``_PODINFO_DIR``, ``_METRICS_PORT`` and ``_PROGRESS_FILE``. A progress
        file adds a :class:`~gpuscaler.runtime.progress.FileReporter` next to ``reporter``. Only a
        process that reports has reporters: by default the writer, and in every other pod its
        first process (``LOCAL_RANK`` 0 with ``RANK`` > 0: the node's pod is reported on, once).

        Args:
            save: Save callback (default: :func:`~gpuscaler.runtime.checkpoint.data_save`).
            load: Load callback (default: :func:`~gpuscaler.runtime.checkpoint.data_load`).
            env: The environment; ``os.environ`` when None.
            reporter: An extra progress reporter.
            **kwargs: :class:`~gpuscaler.runtime.config.GuardConfig` fields (``checkpoint_dir``,
                ``interval_s``...) override the env; other :class:`TrainingGuard` arguments
                (``exit_on_stop``, ``clock``...) are passed through.

        Returns:
            The guard; the metrics server (if any) starts on first use.

        Raises:
            RuntimeConfigError: A variable is missing or does not parse.
        """
        fields = set(GuardConfig.__dataclass_fields__)
        config = GuardConfig.from_env(env, **{k: v for k, v in kwargs.items() if k in fields})
        passthrough = {k: v for k, v in kwargs.items() if k not in fields}
        agree: Agreement | None = passthrough.get("agree")
        writer = passthrough.get("writer")
        if writer is None:
            writer = agree is None or agree.rank == 0
        if passthrough.get("reports") is None:
            local_rank = (os.environ if env is None else env).get("LOCAL_RANK", "0").strip()
            passthrough["reports"] = bool(writer) or local_rank in ("", "0")
        reporters: list[ProgressReporter] = []
        if passthrough["reports"]:
            if config.progress_file is not None:
                reporters.append(FileReporter(config.progress_file))
            if reporter is not None:
                reporters.append(reporter)
        combined: ProgressReporter | None = (
            reporters[0] if len(reporters) == 1 else FanoutReporter(*reporters) if reporters else None
        )
        # every GuardConfig field but the progress file (a reporter, above) is a guard argument of that name
        settings = {name: getattr(config, name) for name in fields if name != "progress_file"}
        return cls(save=save, load=load, reporter=combined, **settings, **passthrough)

    # --- state --------------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """Steps completed (the index of the next step to run)."""
        return self._step

    @property
    def samples(self) -> int:
        """Samples processed, cumulative over restarts."""
        return self._samples

    @property
    def last_checkpoint(self) -> CheckpointInfo | None:
        """The newest checkpoint written or resumed from."""
        return self._last

    @property
    def stop_requested(self) -> bool:
        """Whether SIGTERM (or :meth:`request_stop`) arrived at this process (a live flag).

        Do not all-reduce it yourself to decide when to stop: it may change between your
        reduction and the guard's next look. Pass ``agree=`` and the guard agrees on it race-free.
        """
        return self.stop_signal.received

    @property
    def preempted(self) -> bool:
        """Whether the guard stopped training after a stop request (with ``exit_on_stop=False``)."""
        return self._phase == PHASE_PREEMPTED

    def progress(self) -> Progress:
        """A snapshot of progress for reporters.

        Returns:
            The current :class:`~gpuscaler.runtime.progress.Progress`.
        """
        return Progress(
            step=self._step,
            samples=self._samples,
            last_checkpoint_step=self._last.step if self._last else None,
            last_checkpoint_time=self._last.created_at if self._last else None,
            checkpoint_ack=self._ack,
            phase=self._phase,
            updated_at=self._wall_clock(),
            checkpoint_writing_since=self._writing_since,
            checkpoint_write_seconds=self._write_seconds,
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Install the SIGTERM handler, start the metrics server, remove torn leftovers.

        Called by :meth:`resume`, :meth:`steps` and ``with``; calling it again does nothing.
        """
        if self._started:
            return
        self._started = True
        if self._handle_signals:
            self.stop_signal.install()
        if self.metrics_port is not None and self.metrics_server is None:
            try:
                self.metrics_server = serve_metrics(self.metrics, self.metrics_port)
            except OSError as err:
                log.warning(
                    "cannot serve metrics on port %s: %s; training continues without", self.metrics_port, err
                )
        removed = self.store.cleanup_leftovers()
        if removed:
            log.info("removed %d torn checkpoint leftover(s): %s", len(removed), [p.name for p in removed])

    def reclaim_signals(self) -> None:
        """Install the SIGTERM handler again over a framework's own (Lightning's raises mid-step);
        nothing when the guard was built with ``handle_signals=False``."""
        if self._handle_signals and self._started and not self._closed:
            self.stop_signal.reinstall()

    def close(self) -> None:
        """Restore the signal handler and stop the metrics server.

        A SIGTERM that arrived and was not acted on (e.g. after the loop ended) is re-delivered
        with the previous handler, so the process still terminates as the kubelet expects.
        """
        if self._closed:
            return
        self._closed = True
        self.stop_signal.restore()
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        if self.stop_signal.received and not self._stop_handled and self.stop_signal.signum is not None:
            self._stop_handled = True
            signal.raise_signal(self.stop_signal.signum)

    def __enter__(self) -> TrainingGuard[S]:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- resume -------------------------------------------------------------------------------

    # --- the loop -----------------------------------------------------------------------------

    def steps(self, start: int, stop: int) -> Iterator[int]:
        """Yield step indices ``start .. stop-1``, stopping early after a SIGTERM checkpoint.

        Call :meth:`completed` for each yielded step before the next one. When the range is
        exhausted a final checkpoint is written (if the newest is older) and the guard closes.

        Args:
            start: First step index (usually what :meth:`resume` returned).
            stop: One past the last step index (the total number of steps).

        Yields:
            Step indices.

        Raises:
            GuardUsageError: A yielded step was not reported with :meth:`completed`.
            SystemExit: With :data:`EXIT_PREEMPTED`, after the SIGTERM checkpoint
                (``exit_on_stop=True``).
        """
        self.start()
        if not self._has_state:
            self._step = start
        step = start
        first = True
        try:
            while step < stop:
                if self._phase == PHASE_PREEMPTED:
                    return
                if self._stop_before_step(first):
                    # Signal before the first step (e.g. while loading), or, for a single
                    # process, between completed() and here: stop at this boundary; _stop saves
                    # only if the step is new.
                    self._stop(self._state if self._has_state else None)
                    return
                first = False
                self._expected = step
                yield step
                if self._step != step + 1:
                    raise GuardUsageError(
                        f"step {step} was yielded but not reported: call guard.completed({step}, state) "
                        "inside the loop body"
                    )
                if self._phase == PHASE_PREEMPTED:
                    return
                step += 1
        finally:
            self._expected = None
        self.finish()

    def _stop_before_step(self, first: bool) -> bool:
        """Whether to stop before running the next step.

        A single process looks at the live flag. Ranks that agree do so only before the first step
        (one collective); later they act only on what :meth:`completed` agreed, never on a flag
        re-read after the agreement.
        """
        if self.agree is None:
            return self.stop_signal.received
        if not first:
            return self._agreed_stop
        (stop,) = self.agree.max([int(self.stop_signal.received)])
        self._agreed_stop = bool(stop)
        return self._agreed_stop

    def completed(self, step: int, state: S, samples: int = 0) -> bool:
        """Report step ``step`` done with the resulting ``state``; checkpoint and stop if needed.

        With ``agree``, this is a collective: every rank calls it for every step.

        Args:
            step: The step index just completed (the value :meth:`steps` yielded).
            state: The state after the step (kept by reference until the next call; it is passed
                to the save callback only when a checkpoint is taken).
            samples: Samples processed in this step (by this rank: the writer's count is reported,
                so pass the global batch, or the rank's share times the world size).

        Returns:
            True when training must stop (only with ``exit_on_stop=False``); else False.

        Raises:
            GuardUsageError: ``step`` is not the step :meth:`steps` yielded.
            CheckpointError: A checkpoint was due and could not be written.
            SystemExit: With :data:`EXIT_PREEMPTED` after the SIGTERM checkpoint
                (``exit_on_stop=True``).
        """
        if self._expected is not None and step != self._expected:
            raise GuardUsageError(f"guard.completed({step}) inside the loop at step {self._expected}")
        self._state, self._has_state = state, True
        todo = self.boundary(step + 1, samples)
        if todo.stop:
            self._stop(state)
            return True
        if todo.checkpoint:
            self.checkpoint(state, reason=todo.reason, request_id=todo.request_id, notice_at=todo.notice_at)
        self._report()
        return False

    def boundary(self, steps_done: int, samples: int = 0) -> Boundary:
        """Record progress and decide what this step boundary needs, agreed among ranks; act on nothing.

        :meth:`completed` is this plus the acting. Framework hooks (the Trainer and Lightning
        callbacks) call it from their step-end hook and then let the framework save, committing
        with :meth:`commit` and ending with :meth:`stopped`. With ``agree``, a collective.

        Args:
            steps_done: Steps completed so far (the framework's global step).
            samples: Samples processed since the previous boundary.

        Returns:
            What to do: stop (after a checkpoint), checkpoint (why, answering which request), or
            nothing.
        """
        self._step = steps_done
        self._samples += samples
        self.metrics.set_progress(self._step, self._samples)
        stop, request, wanted, due = self._decide()
        request_id, seen_at = request if request is not None else (None, None)
        if stop:
            return Boundary(True, True, "sigterm", None, self.stop_signal.received_at)
        if wanted:
            self._manual_request = None
            return Boundary(False, True, "notice", request_id, seen_at)
        if due:
            return Boundary(False, True, "interval", None, None)
        self._report()
        return Boundary(False, False, "", None, None)

    def commit(
        self, write: Callable[[Path], None], todo: Boundary | None = None, *, reason: str = "manual"
    ) -> CheckpointInfo | None:
        """Checkpoint what ``write(path)`` writes, as of :attr:`step`: for a framework that saves itself.

        ``write`` gets the payload path (a directory to create, or a file; sharded: the shared
        directory, on every rank). Acknowledges ``todo.request_id`` and reports like
        :meth:`checkpoint`.

        Args:
            write: Writes the checkpoint (e.g. moves the framework's checkpoint directory there).
            todo: The boundary that asked for it (reason, request, notice time); None: ``reason``.
            reason: The reason when ``todo`` is None.

        Returns:
            The committed checkpoint (None for a reader that has none).

        Raises:
            CheckpointError: Writing failed.
        """
        if todo is not None:
            return self._checkpoint(write, reason=todo.reason, request_id=todo.request_id, notice_at=todo.notice_at)
        return self._checkpoint(write, reason=reason)

    def finished(self) -> None:
        """Mark training finished (framework hooks that committed the final checkpoint with
        :meth:`commit`): report ``finished`` and close."""
        self._phase = PHASE_FINISHED
        self._report(force=True)
        self.close()

    def stopped(self) -> int:
        """Mark the guard stopped after the stop checkpoint (framework hooks); report and close.

        Returns:
            The exit code the process must end with: :data:`EXIT_PREEMPTED`.
        """
        self.metrics.stop_requested = True
        self._phase = PHASE_PREEMPTED
        self._stop_handled = True
        self._report(force=True)
        self.close()
        return EXIT_PREEMPTED

    step_done = completed
    """Alias of :meth:`completed`."""

    def _decide(self) -> tuple[bool, tuple[str, float] | None, bool, bool]:
        """This boundary's (stop, local request, checkpoint requested, interval due), agreed.

        The local flags are read exactly once; with ``agree`` the decision is the ranks' MAX of
        them, the same on every rank.
        """
        stop = self.stop_signal.received
        request = None if stop else self._pending_request()
        due = not stop and request is None and self.schedule.due(self._step)
        wanted = request is not None
        if self.agree is not None:
            stop_i, wanted_i, due_i = self.agree.max([int(stop), int(wanted), int(due)])
            stop, wanted, due = bool(stop_i), bool(wanted_i), bool(due_i)
            self._agreed_stop = stop
        return stop, request, wanted, due

    def _pending_request(self) -> tuple[str, float] | None:
        if self._manual_request is not None:
            return self._manual_request
        if self.watcher is None:
            return None
        request_id = self.watcher.poll()
        return (request_id, self._clock()) if request_id is not None else None

    def request_checkpoint(self, request_id: str | None = None) -> None:
        """Ask for a checkpoint at the next step boundary (as the annotation does).

        Args:
            request_id: Reported back as the acknowledgement; default: a timestamp.
        """
        self._manual_request = (request_id or f"manual-{int(self._wall_clock())}", self._clock())

    def request_stop(self) -> None:
        """Checkpoint and stop at the next step boundary, as on SIGTERM."""
        self.stop_signal.trigger(signal.SIGTERM)

    def finish(self) -> CheckpointInfo | None:
        """Write the final checkpoint (if the newest is older), report ``finished`` and close.

        Called by :meth:`steps` when the range is exhausted; call it yourself when not using
        :meth:`steps` (with ``agree``, on every rank).

        Returns:
            The final checkpoint, or None when no state is known.

        Raises:
            SystemExit: With :data:`EXIT_PREEMPTED` when SIGTERM arrived after the last step
                (``exit_on_stop=True``; with ``agree``, on any rank): the final checkpoint is
                complete, the kubelet wants the process gone, and a restart resumes at the end
                and carries on after the loop.
        """
        info = None
        if self._has_state:
            info = self.checkpoint(self._state, reason="final")  # type: ignore[arg-type]
        self._phase = PHASE_FINISHED
        self._report(force=True)
        stopping = self.stop_signal.received and not self._stop_handled
        if self.agree is not None:
            (agreed,) = self.agree.max([int(stopping)])
            stopping = bool(agreed)
        self._stop_handled = self._stop_handled or (stopping and self.exit_on_stop)
        self.close()
        if stopping and self.exit_on_stop:
            raise SystemExit(EXIT_PREEMPTED)
        return info

    def _stop(self, state: S | None) -> None:
        self.metrics.stop_requested = True
        signum = self.stop_signal.signum
        log.info("stop requested (signal %s) at step %d: checkpointing and stopping", signum, self._step)
        if state is not None:
            self.checkpoint(state, reason="sigterm", notice_at=self.stop_signal.received_at)
        self._phase = PHASE_PREEMPTED
        self._stop_handled = True
        self._report(force=True)
        self.close()
        if self.exit_on_stop:
            raise SystemExit(EXIT_PREEMPTED)

    # --- reporting ----------------------------------------------------------------------------

    def _report(self, *, force: bool = False) -> None:
        if not self.reports:
            return
        now = self._clock()
        if not force and self._last_report is not None and now - self._last_report < self.report_interval_s:
            return
        self._last_report = now
        snapshot = self.progress()
        self._call_reporter(lambda r: r.report(snapshot))

    def _call_reporter(self, call: Callable[[ProgressReporter], None]) -> None:
        try:
            call(self.reporter)
        except Exception:
            log.exception("progress reporter %r failed; training continues", self.reporter)

    # bound from the modules that hold them (each a function of the guard, its ``self``)
    resume = resuming.resume
    _newest_checkpoint = resuming._newest_checkpoint
    _agreed_checkpoint = resuming._agreed_checkpoint
    checkpoint = checkpointing.checkpoint
    _checkpoint = checkpointing._checkpoint
    _begin_write = checkpointing._begin_write
    _save_checkpoint = checkpointing._save_checkpoint
