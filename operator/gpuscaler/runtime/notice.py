"""Interruption notices inside the container: SIGTERM, and the operator's checkpoint-request annotation.

Two ways the worker learns it should checkpoint now:

* **SIGTERM** from the kubelet when the pod is deleted (the node is being reclaimed). The handler
  only sets a flag; the guard checkpoints at the next step boundary and exits with
  :data:`~gpuscaler.runtime.constants.EXIT_PREEMPTED`.
* **The annotation** ``gpuscaler.io/checkpoint-requested`` that the operator sets on the pod as soon
  as it sees an interruption notice on the node (often before any SIGTERM). Kubernetes projects
  the pod's annotations into a downward API volume file, ``$GPUSCALER_PODINFO_DIR/annotations``,
  one ``key="value"`` line per annotation with the value quoted as Go's ``%q`` does. The watcher
  polls that file cheaply (one ``stat``) at step boundaries and re-parses it only when it changed.

Called by :class:`gpuscaler.runtime.TrainingGuard`; the parser is also what the tests exercise.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from gpuscaler.errors import InvalidInputError
from gpuscaler.runtime.constants import ANNOTATION_CHECKPOINT_ACK, ANNOTATION_CHECKPOINT_REQUESTED

log = logging.getLogger(__name__)


class AnnotationsFormatError(InvalidInputError, ValueError):
    """The downward API annotations file is not ``key="value"`` lines."""


_SIMPLE_ESCAPES = {
    "a": 0x07,
    "b": 0x08,
    "f": 0x0C,
    "n": 0x0A,
    "r": 0x0D,
    "t": 0x09,
    "v": 0x0B,
    "\\": 0x5C,
    "'": 0x27,
    '"': 0x22,
}


def _unquote(text: str, start: int) -> tuple[str, int]:
    """Decode a Go-quoted string whose opening quote is at ``text[start]``; return (value, end)."""
    out = bytearray()
    i = start + 1
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            return out.decode("utf-8", errors="replace"), i + 1
        if ch != "\\":
            out += ch.encode("utf-8", errors="surrogatepass")
            i += 1
            continue
        if i + 1 >= n:
            break
        esc = text[i + 1]
        if esc in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[esc])
            i += 2
        elif esc in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[esc]
            digits = text[i + 2 : i + 2 + width]
            try:
                value = int(digits, 16)
                if len(digits) != width:
                    raise ValueError(digits)
            except ValueError as err:
                raise AnnotationsFormatError(f"bad \\{esc} escape at offset {i}: {digits!r}") from err
            if esc == "x":
                out.append(value)
            else:
                out += chr(value).encode("utf-8", errors="surrogatepass")
            i += 2 + width
        elif esc in "01234567":
            digits = text[i + 1 : i + 4]
            try:
                out.append(int(digits, 8))
            except ValueError as err:
                raise AnnotationsFormatError(f"bad octal escape at offset {i}: {digits!r}") from err
            i += 4
        else:
            raise AnnotationsFormatError(f"unknown escape \\{esc} at offset {i}")
    raise AnnotationsFormatError(f"unterminated quoted value starting at offset {start}")


def parse_downward_annotations(text: str) -> dict[str, str]:
    """Parse the downward API ``annotations`` file.

    The kubelet writes ``key="value"`` lines sorted by key, each value quoted like Go's ``%q``
    (``\\"``, ``\\\\``, ``\\n``, ``\\t``, ``\\xHH``, ``\\uHHHH``...), so a multi-line value stays on
    one line as ``\\n`` escapes. Tolerated too: a raw newline inside the quotes (hand-written
    files), unquoted values (taken to the end of the line), blank lines and CRLF line ends.

    Args:
        text: The file's content.

    Returns:
        Annotation key -> decoded value.

    Raises:
        AnnotationsFormatError: A line has no ``=``, a quote is not closed, or an escape is invalid.
    """
    result: dict[str, str] = {}
    i = 0
    n = len(text)
    while i < n:
        if text[i] in " \t\r\n":
            i += 1
            continue
        eq = text.find("=", i)
        eol = text.find("\n", i)
        if eol < 0:
            eol = n
        if eq < 0 or eq > eol:
            raise AnnotationsFormatError(f"line without '=' at offset {i}: {text[i:eol]!r}")
        key = text[i:eq].strip()
        if eq + 1 < n and text[eq + 1] == '"':
            value, i = _unquote(text, eq + 1)
            rest = text.find("\n", i)
            rest = n if rest < 0 else rest
            if text[i:rest].strip():
                raise AnnotationsFormatError(f"text after the closing quote of {key!r}: {text[i:rest]!r}")
            i = rest
        else:
            value = text[eq + 1 : eol].rstrip("\r")
            i = eol
        result[key] = value
    return result


class AnnotationWatcher:
    """Polls the downward API annotations file for a new checkpoint request.

    Each :meth:`poll` costs one ``stat`` unless the file changed (inode, mtime or size), then one
    read and parse. A request is pending while its id differs from the acknowledged one in the
    file (``gpuscaler.io/checkpoint-ack``, written back by the operator from our reports) and was
    not acknowledged by this process.

    Args:
        path: The annotations file, usually ``$GPUSCALER_PODINFO_DIR/annotations``.
        min_interval_s: Stat at most this often (0: at every poll).
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last_poll: float | None = None
        self._stat_key: tuple[int, int, int, int] | None = None
        self._annotations: dict[str, str] = {}
        self._acked: set[str] = set()

    @property
    def annotations(self) -> dict[str, str]:
        """The annotations as of the last poll that saw a change."""
        return dict(self._annotations)

    def acknowledge(self, request_id: str) -> None:
        """Mark a request as answered so it is not pending again.

        Args:
            request_id: The value of ``gpuscaler.io/checkpoint-requested`` that was answered.
        """
        self._acked.add(request_id)

    def refresh(self) -> bool:
        """Re-read the file if it changed since the last look.

        Returns:
            True when the content was re-read.
        """
        now = self._clock()
        if self._last_poll is not None and now - self._last_poll < self.min_interval_s:
            return False
        self._last_poll = now
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._stat_key is not None:
                self._stat_key, self._annotations = None, {}
                return True
            return False
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._stat_key:
            return False
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
            annotations = parse_downward_annotations(text)
        except (OSError, AnnotationsFormatError) as err:
            log.warning("cannot read checkpoint requests from %s: %s", self.path, err)
            return False
        self._stat_key = key
        self._annotations = annotations
        return True

    def poll(self) -> str | None:
        """Check for a checkpoint request not yet answered.

        Returns:
            The pending request id, or None.
        """
        self.refresh()
        request = self._annotations.get(ANNOTATION_CHECKPOINT_REQUESTED, "").strip()
        if not request or request in self._acked:
            return None
        if request == self._annotations.get(ANNOTATION_CHECKPOINT_ACK, "").strip():
            return None
        return request


class StopSignal:
    """A flag set by SIGTERM (or other signals): stop after checkpointing at the next step boundary.

    Args:
        signals: Signals to catch.
        clock: Monotonic clock stamped when the signal arrives.
    """

    def __init__(
        self,
        signals: Iterable[signal.Signals] = (signal.SIGTERM,),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.signals = tuple(signals)
        self._clock = clock
        self.signum: int | None = None
        """The first signal received."""
        self.received_at: float | None = None
        """Monotonic time of the first signal."""
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def received(self) -> bool:
        """Whether a stop signal arrived."""
        return self.signum is not None

    def trigger(self, signum: int) -> None:
        """Record a stop request as if the signal had arrived (tests, or a custom notice source).

        Args:
            signum: The signal number to record.
        """
        if self.signum is None:
            self.signum = signum
            self.received_at = self._clock()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.trigger(signum)

    def install(self) -> bool:
        """Install the handlers (main thread only).

        Returns:
            True when installed; False (with a warning logged) off the main thread, where Python
            cannot install signal handlers.
        """
        if self._previous:
            return True
        try:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError as err:
            log.warning(
                "cannot catch %s outside the main thread (%s); SIGTERM will kill without a checkpoint",
                [s.name for s in self.signals],
                err,
            )
            self.restore()
            return False
        return True

    def reinstall(self) -> bool:
        """Install the handlers again over whatever replaced them since :meth:`install` (a
        framework's own SIGTERM handler), keeping the original handlers for :meth:`restore`.

        Returns:
            True when installed (see :meth:`install`).
        """
        if not self._previous:
            return self.install()
        try:
            for sig in self.signals:
                signal.signal(sig, self._handle)
        except ValueError:
            return False
        return True

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, previous in self._previous.items():
            try:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except ValueError:
                log.debug("could not restore the %s handler off the main thread", sig.name)
        self._previous.clear()
