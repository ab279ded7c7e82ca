"""Typed views of the environment the operator gives a worker: the guard's settings and the plan.

:class:`GuardConfig` is what :meth:`gpuscaler.runtime.TrainingGuard.from_env` reads (checkpoint
directory, interval, keep count, downward API dir, metrics port, progress file). :class:`PlanEnv`
is the slice of the operator's plan the training script applies itself (precision, micro-batch,
accumulation steps). Both parse ``os.environ`` (or a given mapping) and fail with the variable
name and value when something does not parse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpuscaler.errors import InvalidInputError
from gpuscaler.runtime.constants import (
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_KEEP,
    ENV_ACCUMULATION_STEPS,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_STEPS,
    ENV_CHECKPOINT_INTERVAL_S,
    ENV_CHECKPOINT_KEEP,
    ENV_METRICS_PORT,
    ENV_MICRO_BATCH,
    ENV_PODINFO_DIR,
    ENV_PRECISION,
    ENV_PROGRESS_FILE,
    PRECISIONS,
)


class RuntimeConfigError(InvalidInputError, ValueError):
    """An environment variable (or argument) of the runtime has an invalid value."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


N = TypeVar("N", int, float)
_KIND = {int: "an integer", float: "a number (seconds)"}


def env_number(env: Mapping[str, str], name: str, kind: type[N], *, minimum: N | None = None) -> N | None:
    """Read a numeric variable: an integer count or port, or a float of seconds.

    Args:
        env: The environment.
        name: Variable name.
        kind: ``int`` or ``float``.
        minimum: Smallest accepted value; 0 when None.

    Returns:
        The value, or None when unset or empty.

    Raises:
        RuntimeConfigError: Not of ``kind``, or below ``minimum`` (or NaN).
    """
    raw = _get(env, name)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError as err:
        raise RuntimeConfigError(f"{name}={raw!r} is not {_KIND[kind]}") from err
    least = kind(0) if minimum is None else minimum
    if not value >= least:  # also rejects NaN
        raise RuntimeConfigError(f"{name}={raw} must be >= {least}")
    return value


@dataclass(frozen=True)
class PlanEnv:
    """The plan's training settings, as the operator passes them to every worker.

    Fields are None when the operator did not set them (e.g. a run outside the operator); the
    training script then keeps its own defaults.
    """

    precision: str | None = None
    """One of ``fp32``, ``tf32``, ``amp``, ``bf16``, ``fp8`` (see ``gpuscaler estimate``)."""
    micro_batch: int | None = None
    """Samples per GPU per forward/backward pass."""
    accumulation_steps: int | None = None
    """Micro-batches accumulated per optimizer step."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PlanEnv:
        """Parse ``GPUSCALER_PRECISION``, ``GPUSCALER_MICRO_BATCH`` and ``GPUSCALER_ACCUMULATION_STEPS``.

        Args:
            env: The environment; ``os.environ`` when None.

        Returns:
            The plan settings.

        Raises:
            RuntimeConfigError: An unknown precision or a non-positive integer.
        """
        env = os.environ if env is None else env
        precision = _get(env, ENV_PRECISION)
        if precision is not None:
            precision = precision.lower()
            if precision not in PRECISIONS:
                raise RuntimeConfigError(
                    f"{ENV_PRECISION}={precision!r} is not a known precision; "
                    f"use one of {', '.join(PRECISIONS)}"
                )
        return cls(
            precision=precision,
            micro_batch=env_number(env, ENV_MICRO_BATCH, int, minimum=1),
            accumulation_steps=env_number(env, ENV_ACCUMULATION_STEPS, int, minimum=1),
        )

    def samples_per_step(self, world_size: int = 1) -> int | None:
        """Samples per optimizer step: micro-batch x accumulation x data-parallel workers.

        Args:
            world_size: Data-parallel workers.

        Returns:
            The global batch, or None when the micro-batch is not set.
        """
        if self.micro_batch is None:
            return None
        return self.micro_batch * (self.accumulation_steps or 1) * world_size


@dataclass(frozen=True)
class GuardConfig:
    """Settings of a :class:`~gpuscaler.runtime.TrainingGuard`, grouped as the env gives them."""

    checkpoint_dir: Path
    """Where checkpoints live (``GPUSCALER_CHECKPOINT_DIR``)."""
    interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S
    """Seconds between planned checkpoints (``GPUSCALER_CHECKPOINT_INTERVAL_S``); None: no time limit."""
    every_steps: int | None = None
    """Steps between planned checkpoints (``GPUSCALER_CHECKPOINT_EVERY_STEPS``); None: no step limit."""
    keep: int = DEFAULT_CHECKPOINT_KEEP
    """Complete checkpoints kept (``GPUSCALER_CHECKPOINT_KEEP``)."""
    podinfo_dir: Path | None = None
    """Downward API volume with the ``annotations`` file (``GPUSCALER_PODINFO_DIR``); None: no requests."""
    metrics_port: int | None = None
    """Prometheus port (``GPUSCALER_METRICS_PORT``); None: no exporter."""
    progress_file: Path | None = None
    """JSON status file (``GPUSCALER_PROGRESS_FILE``); None: no file reporter."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GuardConfig:
        """Read the guard settings from the environment; keyword arguments win over the env.

        When only ``GPUSCALER_CHECKPOINT_EVERY_STEPS`` is set, there is no time limit; when neither
        it nor the interval is set, the interval is :data:`DEFAULT_CHECKPOINT_INTERVAL_S`.

        Args:
            env: The environment; ``os.environ`` when None.
            **overrides: Field values to use instead of the env (``checkpoint_dir=...``...).

        Returns:
            The settings.

        Raises:
            RuntimeConfigError: The checkpoint directory is given nowhere, a value does not parse,
                or an override names no field.
        """
        env = os.environ if env is None else env
        unknown = set(overrides) - set(cls.__dataclass_fields__)
        if unknown:
            raise RuntimeConfigError(
                f"unknown guard setting(s) {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}"
            )
        every_steps = env_number(env, ENV_CHECKPOINT_EVERY_STEPS, int, minimum=1)
        interval_s = env_number(env, ENV_CHECKPOINT_INTERVAL_S, float)
        if interval_s == 0:
            interval_s = None
        elif interval_s is None and every_steps is None:
            interval_s = DEFAULT_CHECKPOINT_INTERVAL_S
        port = env_number(env, ENV_METRICS_PORT, int)
        values: dict[str, object] = {
            "checkpoint_dir": _get(env, ENV_CHECKPOINT_DIR),
            "interval_s": interval_s,
            "every_steps": every_steps,
            "keep": env_number(env, ENV_CHECKPOINT_KEEP, int, minimum=1) or DEFAULT_CHECKPOINT_KEEP,
            "podinfo_dir": _get(env, ENV_PODINFO_DIR),
            "metrics_port": port or None,
            "progress_file": _get(env, ENV_PROGRESS_FILE),
        }
        values.update(overrides)
        if values["checkpoint_dir"] is None:
            raise RuntimeConfigError(
                f"no checkpoint directory: set {ENV_CHECKPOINT_DIR} (the operator does) "
                "or pass checkpoint_dir="
            )
        keep = values["keep"]
        if not isinstance(keep, int) or keep < 1:
            raise RuntimeConfigError(f"keep={keep!r} must be an integer >= 1")
        for name in ("checkpoint_dir", "podinfo_dir", "progress_file"):
            if values[name] is not None:
                values[name] = Path(str(values[name]))
        return cls(**values)  # type: ignore[arg-type]
