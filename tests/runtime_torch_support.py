"""Imports for the runtime's real-framework tests: skip where the framework is absent, fail in CI;
and what the runtime's tests share: the framework callbacks' stop-and-resume check, a payload that
would run code when unpickled.

``scripts/test.sh`` runs the suite in the venv of ``scripts/ci-torch-venv.sh`` (pinned torch,
transformers, Lightning) and sets ``GPUSCALER_REQUIRE_TORCH=1``: there a missing framework is a
failure with this message, never a silent skip. Elsewhere (a developer's venv without the
``train`` extra) the tests that need it are skipped with the same message.
"""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuscaler.runtime import EXIT_PREEMPTED
from gpuscaler.runtime.checkpoint import CheckpointInfo, CheckpointStore

REQUIRE_ENV = "GPUSCALER_REQUIRE_TORCH"


class RunsCode:
    """A pickle that calls os.system (``touch marker``) when loaded: what a safe loader must refuse."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def need(module: str) -> ModuleType:
    """Import ``module`` for a test module, or skip it (fail when ``GPUSCALER_REQUIRE_TORCH=1``).

    Args:
        module: The module to import, e.g. ``torch``.

    Returns:
        The module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        why = (
            f"{module} is not importable ({err}); install the pinned frameworks with "
            "pip install -e '.[dev,train]', or run scripts/test.sh (it uses scripts/ci-torch-venv.sh)"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 and {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)


def callbacks(
    cb: Any,
    at: Callable[[int, Callable[[], None]], Any],
    guard: Any,
    *,
    stop_at: int | None,
    request_at: int | None,
    request_id: str,
) -> list[Any]:
    """A trainer's callbacks: the test's, then the guard's ``cb``.

    Args:
        cb: The guard's framework callback.
        at: The framework's callback doing ``action()`` at the end of global step ``step``: ``at(step, action)``.
        guard: The :class:`~gpuscaler.runtime.TrainingGuard` of ``cb``.
        stop_at: A SIGTERM to this process after this step (None: none).
        request_at: The operator's checkpoint request ``request_id`` after this step (None: none).
        request_id: That request's id.
    """
    made: list[Any] = [cb]
    if stop_at is not None:
        made.insert(0, at(stop_at, lambda: os.kill(os.getpid(), signal.SIGTERM)))
    if request_at is not None:
        made.insert(0, at(request_at, lambda: guard.request_checkpoint(request_id)))
    return made


Run = Callable[..., tuple[bytes, Any]]
"""A framework test's training run: ``run(work, stop_at=None)`` trains in ``work`` (checkpoints in
``work/ck``), with a SIGTERM to this process after step ``stop_at``; returns (the final weights'
bytes, the guard's framework callback, which has ``exit_code``)."""


def checkpoint_steps(work: Path) -> list[int]:
    """The steps of the committed checkpoints in ``work/ck``, newest first."""
    return [s for s, _ in CheckpointStore(work / "ck", writer=False).list_steps()]


def checkpoints(work: Path) -> dict[int, CheckpointInfo]:
    """The checkpoints in ``work/ck`` by step, each verified against its manifest."""
    store = CheckpointStore(work / "ck", writer=False)
    return {s: store.verify(p) for s, p in store.list_steps()}


def check_sigterm_stop_and_resume(
    run: Run, tmp_path: Path, *, stop: int, steps: int, stopped: Callable[[Any, CheckpointInfo], None]
) -> None:
    """A run SIGTERMed after step ``stop`` checkpoints there and exits 75; run again, it resumes and ends
    with the weights of an uninterrupted run (which checkpoints at steps 5, 10 and its end), bit for bit.

    Args:
        run: The framework's training run.
        tmp_path: Where the runs train (``ref`` the uninterrupted one, ``run`` the stopped one).
        stop: The step after which the SIGTERM lands.
        steps: The steps of a whole run.
        stopped: Further checks of the stopped run, given its callback and its newest checkpoint
            (verified), before the resume writes over what it left.
    """
    expected, ref = run(tmp_path / "ref")
    assert ref.exit_code == 0 and checkpoint_steps(tmp_path / "ref") == [steps, 10, 5]
    weights, first = run(tmp_path / "run", stop_at=stop)
    assert first.exit_code == EXIT_PREEMPTED
    assert checkpoint_steps(tmp_path / "run") == [stop, 5]
    store = CheckpointStore(tmp_path / "run" / "ck", writer=False)
    newest = store.verify(store.list_steps()[0][1])
    assert newest.reason == "sigterm"
    stopped(first, newest)
    assert weights != expected
    weights, second = run(tmp_path / "run")
    assert second.exit_code == 0 and checkpoint_steps(tmp_path / "run")[0] == steps
    assert weights == expected
