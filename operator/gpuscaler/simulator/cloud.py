"""The cloud the simulator replays a trace against: interruptions, shortages, delays, prices.

* Spot interruptions: a job on ``M`` nodes of an instance type is reclaimed at the Poisson rate
  the planner itself assumes, :func:`gpuscaler.planner.risk.hourly_rate` of the type's Spot Advisor
  bucket times ``M``, multiplied by ``interruption_scale`` (1 = the buckets as published; larger
  values stress-test, since GPU spot pools are often reclaimed more often than the all-instance
  buckets say).
* Capacity shortages: each capacity request fails with a per-offering probability (assumptions,
  overridable per instance type): 2% on-demand, 10% spot, doubled for 8-GPU A100/H100/H200 nodes,
  the scarcest pools. A failed request is known after ``failed_request_s``.
* Provisioning delays: the planner's start-up time (first start) or the job's
  ``checkpoint.restartSeconds`` (after an interruption), times a uniform factor in
  ``[1 - jitter, 1 + jitter]``.
* Prices: the catalog's (after policy overrides), exactly what the planner priced.
* Interruption notice: 120 s on AWS, 30 s on GCP and Azure.

All draws come from :class:`Draws`, seeded per (seed, job): the same seed gives the same draws to
every strategy (common random numbers), so strategies are compared on the same luck.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuscaler.catalog import CapacityType, InstanceType
from gpuscaler.planner.risk import hourly_rate

SCARCE_GPUS = frozenset({"A100-40GB", "A100-80GB", "H100-80GB-SXM", "H200-141GB-SXM"})
NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}


@dataclass(frozen=True)
class CloudModel:
    """Parameters of the simulated cloud (all times in seconds)."""

    interruption_scale: float = 1.0
    """Multiplier on the Spot Advisor interruption rates (0 = no interruptions)."""
    ondemand_shortage: float = 0.02
    """Probability that an on-demand capacity request fails."""
    spot_shortage: float = 0.10
    """Probability that a spot capacity request fails."""
    scarce_multiplier: float = 2.0
    """Shortage multiplier for 8-GPU A100/H100/H200 nodes."""
    shortage_scale: float = 1.0
    """Multiplier on every shortage probability (0 = capacity always there)."""
    shortage_overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per instance type: ``{"p4d.24xlarge": {"spot": 0.3, "on-demand": 0.05}}``."""
    failed_request_s: float = 120.0
    """Time until a failed capacity request is known."""
    retry_backoff_s: float = 600.0
    """How long a naive strategy waits before asking for the same capacity again."""
    provisioning_jitter: float = 0.5
    """Provisioning delay is the nominal one times U(1 - jitter, 1 + jitter)."""
    notice_s: Mapping[str, float] = field(default_factory=lambda: dict(NOTICE_S))
    """Interruption notice per provider."""

    def interruption_rate_per_h(self, inst: InstanceType, capacity: CapacityType, nodes: int) -> float:
        """Interruptions per hour of a job on ``nodes`` nodes of ``inst`` (0 on on-demand)."""
        if capacity is not CapacityType.SPOT:
            return 0.0
        return hourly_rate(inst.interruption_bucket) * nodes * self.interruption_scale

    def shortage_probability(self, inst: InstanceType, capacity: CapacityType) -> float:
        """Probability that one request for ``inst`` x ``capacity`` fails."""
        override = self.shortage_overrides.get(inst.name, {})
        if capacity.value in override:
            p = float(override[capacity.value])
        else:
            p = self.spot_shortage if capacity is CapacityType.SPOT else self.ondemand_shortage
            if inst.gpu_count >= 8 and inst.gpu_id in SCARCE_GPUS:
                p *= self.scarce_multiplier
        return min(1.0, max(0.0, p * self.shortage_scale))

    def notice_seconds(self, inst: InstanceType) -> float:
        """Interruption notice for the instance's provider (30 s when unknown)."""
        return self.notice_s.get(inst.provider, 30.0)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **overrides: Any) -> CloudModel:
        """A cloud model from a trace's ``cloud`` mapping (camelCase keys), then keyword overrides.

        Keys: interruptionScale, onDemandShortage, spotShortage, scarceMultiplier, shortageScale,
        shortageOverrides, failedRequestSeconds, retryBackoffSeconds, provisioningJitter, noticeSeconds.

        Raises:
            ValueError: an unknown key.
        """
        names = {
            "interruptionScale": "interruption_scale",
            "onDemandShortage": "ondemand_shortage",
            "spotShortage": "spot_shortage",
            "scarceMultiplier": "scarce_multiplier",
            "shortageScale": "shortage_scale",
            "shortageOverrides": "shortage_overrides",
            "failedRequestSeconds": "failed_request_s",
            "retryBackoffSeconds": "retry_backoff_s",
            "provisioningJitter": "provisioning_jitter",
            "noticeSeconds": "notice_s",
        }
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in names:
                raise ValueError(f"cloud.{key}: unknown; known keys are {', '.join(sorted(names))}")
            kwargs[names[key]] = value
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kwargs)


class Draws:
    """The random draws of one job, in independent named streams seeded by (seed, job).

    Each stream is consumed in order of the job's capacity requests, so the n-th request of a job
    sees the same uniform numbers under every strategy.
    """

    __slots__ = ("_capacity", "_interrupt", "_provision")

    def __init__(self, seed: int, job_key: str) -> None:
        self._interrupt = random.Random(f"{seed}|{job_key}|interrupt")
        self._capacity = random.Random(f"{seed}|{job_key}|capacity")
        self._provision = random.Random(f"{seed}|{job_key}|provision")

    def time_to_interruption_s(self, rate_per_h: float) -> float:
        """Seconds until the next reclaim for a Poisson rate (inf when the rate is 0)."""
        u = 1.0 - self._interrupt.random()  # in (0, 1]
        if rate_per_h <= 0:
            return math.inf
        return -math.log(u) / rate_per_h * 3600.0

    def request_fails(self, probability: float) -> bool:
        """Whether a capacity request fails."""
        return self._capacity.random() < probability

    def provisioning_s(self, nominal_s: float, jitter: float) -> float:
        """A provisioning delay around ``nominal_s``."""
        u = self._provision.random()
        return nominal_s * (1.0 + jitter * (2.0 * u - 1.0))
