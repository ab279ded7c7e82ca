"""The cloud the simulator replays a trace against: interruptions, shortages, delays, prices.

Spot capacity is modelled per offering (instance type x capacity type) and shared by every job on
it, correlated in time, not drawn independently per request:

* **Regimes.** Each offering alternates between *calm* and *storm* periods (exponential durations;
  a storm lasts ``storm_hours`` on average and covers ``storm_share`` of the time). Spot markets
  are reclaimed in bulk and their availability moves together over hours (Wu et al., "Can't Be
  Late", NSDI 2024, section 2: preemptions of several instances at once, availability correlated
  across instances of a type); the regimes are the simplest model of that. Their parameters are
  assumptions, overridable per trace.
* **Spot interruptions.** The per-node reclaim rate is the planner's own,
  :func:`gpuscaler.planner.risk.hourly_rate` of the type's Spot Advisor bucket, times
  ``interruption_scale`` (1 = the buckets as published). A share ``wave_share`` of it arrives as
  *reclaim waves* of the offering: a wave reclaims every node of that offering at once, so it
  interrupts every job running there at the same moment; waves come ``storm_wave_multiplier``
  times as often in a storm as in a calm period (the time average stays at the published rate).
  The rest is independent per node (a job on ``M`` nodes sees ``M`` times it).
* **Capacity shortages.** A request for ``M`` nodes fails when any node cannot be had: with a
  per-node probability ``p``, ``1 - (1 - p)^M``, so larger requests fail more often. ``p`` is 2%
  on-demand and 10% spot by default, doubled for 8-GPU A100/H100/H200 nodes (the scarcest pools),
  set per instance type by ``shortage_overrides``, times ``shortage_scale``; in a storm it is
  ``storm_shortage_multiplier`` times the calm value (time average ``p``). A failed request is
  known after ``failed_request_s``.
* **Provisioning delays.** The planner's start-up time (first start) or the job's
  ``checkpoint.restartSeconds`` (after an interruption or a move), times a uniform factor in
  ``[1 - jitter, 1 + jitter]``.
* **Prices.** The catalog's (after policy overrides), exactly what the planner priced; with a spot
  price history (``spot_prices``, :mod:`gpuscaler.simulator.spot_prices`), spot prices per zone
  move over time as the history says, the same for every strategy, and each allocation is billed
  at the prices in force while it ran.
* **Interruption notice.** 120 s on AWS, 30 s on GCP and Azure.
* **Progress measurements.** The operator reads the training runtime's samples counter once per
  observer interval; each interval's increase is the true rate times ``1 + e``, ``e ~ N(0,
  measurement_noise)`` (step-time jitter, data-loader stalls). The operator sees only these.

``wave_share = 0`` and ``storm_share = 0`` give independent reclaims and shortages (the simulator's
earlier cloud, except that shortages still grow with the request size).

All draws are seeded. The markets are seeded by (seed, offering), so every strategy meets the same
waves and storms; each job's own draws come from :class:`Draws`, seeded by (seed, job), consumed in
order of its capacity requests, so the n-th request of a job sees the same numbers under every
strategy (common random numbers).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuscaler.catalog import CapacityType, InstanceType
from gpuscaler.inputs import InputError
from gpuscaler.planner.risk import hourly_rate
from gpuscaler.simulator.spot_prices import SpotPriceHistory

SCARCE_GPUS = frozenset({"A100-40GB", "A100-80GB", "H100-80GB-SXM", "H200-141GB-SXM"})
NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
MARKET_HORIZON_H = 24.0 * 366
"""A market's timeline is generated at most this far; no wave within it means none at all."""


@dataclass(frozen=True)
class CloudModel:
    """Parameters of the simulated cloud (times in seconds unless named ``_hours``)."""

    interruption_scale: float = 1.0
    """Multiplier on the Spot Advisor interruption rates (0 = no interruptions)."""
    ondemand_shortage: float = 0.02
    """Per-node probability that an on-demand capacity request cannot be served (assumption)."""
    spot_shortage: float = 0.10
    """Per-node probability that a spot capacity request cannot be served (assumption)."""
    scarce_multiplier: float = 2.0
    """Shortage multiplier for 8-GPU A100/H100/H200 nodes."""
    shortage_scale: float = 1.0
    """Multiplier on every shortage probability (0 = capacity always there)."""
    shortage_overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per instance type, per-node probabilities: ``{"p4d.24xlarge": {"spot": 0.3, "on-demand": 0.05}}``."""
    wave_share: float = 0.5
    """Share of the per-node reclaim rate that comes as offering-wide reclaim waves (assumption)."""
    storm_share: float = 0.1
    """Share of the time an offering is in a storm (assumption: about one bad day in ten)."""
    storm_hours: float = 8.0
    """Mean duration of a storm (assumption)."""
    storm_wave_multiplier: float = 10.0
    """Reclaim waves in a storm are this many times as frequent as in a calm period (assumption)."""
    storm_shortage_multiplier: float = 5.0
    """Shortage probabilities in a storm are this many times the calm ones (assumption)."""
    failed_request_s: float = 120.0
    """Time until a failed capacity request is known."""
    retry_backoff_s: float = 600.0
    """How long a strategy that waits for the same capacity waits before asking again."""
    provisioning_jitter: float = 0.5
    """Provisioning delay is the nominal one times U(1 - jitter, 1 + jitter)."""
    notice_s: Mapping[str, float] = field(default_factory=lambda: dict(NOTICE_S))
    """Interruption notice per provider."""
    measurement_noise: float = 0.10
    """Relative standard deviation of the progress measured over one observer interval (assumption)."""
    spot_prices: SpotPriceHistory | None = None
    """Spot prices per zone over time, replayed (None: the planned prices throughout)."""

    def __post_init__(self) -> None:
        probabilities = {"wave_share": self.wave_share, "storm_share": self.storm_share,
                         "ondemand_shortage": self.ondemand_shortage, "spot_shortage": self.spot_shortage,
                         "provisioning_jitter": self.provisioning_jitter}
        for name, value in probabilities.items():
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise ValueError(f"cloud {name} must be a number between 0 and 1, got {value!r}")
        positive = {"interruption_scale": self.interruption_scale, "shortage_scale": self.shortage_scale,
                    "scarce_multiplier": self.scarce_multiplier, "failed_request_s": self.failed_request_s,
                    "retry_backoff_s": self.retry_backoff_s, "measurement_noise": self.measurement_noise}
        for name, value in positive.items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"cloud {name} must be a finite number >= 0, got {value!r}")
        at_least_one = {"storm_wave_multiplier": self.storm_wave_multiplier,
                        "storm_shortage_multiplier": self.storm_shortage_multiplier}
        for name, value in at_least_one.items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 1):
                raise ValueError(f"cloud {name} must be a finite number >= 1, got {value!r}")
        for name, value in {"storm_hours": self.storm_hours}.items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"cloud {name} must be a finite number > 0, got {value!r}")

    # ------------------------------------------------------------------------------ rates

    def node_rate_per_h(self, inst: InstanceType, capacity: CapacityType) -> float:
        """Time-averaged reclaims per node-hour of ``inst`` x ``capacity`` (0 on on-demand)."""
        if capacity is not CapacityType.SPOT:
            return 0.0
        return hourly_rate(inst.interruption_bucket) * self.interruption_scale

    def interruption_rate_per_h(self, inst: InstanceType, capacity: CapacityType, nodes: int) -> float:
        """Time-averaged interruptions per hour of a job on ``nodes`` nodes (waves count once)."""
        lam = self.node_rate_per_h(inst, capacity)
        return lam * self.wave_share + lam * (1.0 - self.wave_share) * nodes

    def _storm_weight(self, multiplier: float) -> float:
        """``1 - f + f m``: the time-average of a quantity that is ``m`` times higher in storms."""
        return 1.0 - self.storm_share + self.storm_share * multiplier

    def wave_rates_per_h(self, inst: InstanceType, capacity: CapacityType) -> tuple[float, float]:
        """Reclaim waves per hour of an offering in (calm, storm)."""
        mean = self.node_rate_per_h(inst, capacity) * self.wave_share
        calm = mean / self._storm_weight(self.storm_wave_multiplier)
        return calm, calm * self.storm_wave_multiplier

    def node_shortage_probability(self, inst: InstanceType, capacity: CapacityType) -> float:
        """Time-averaged probability that one node of ``inst`` x ``capacity`` cannot be had."""
        override = self.shortage_overrides.get(inst.name, {})
        if capacity.value in override:
            p = float(override[capacity.value])
        else:
            p = self.spot_shortage if capacity is CapacityType.SPOT else self.ondemand_shortage
            if inst.gpu_count >= 8 and inst.gpu_id in SCARCE_GPUS:
                p *= self.scarce_multiplier
        return min(1.0, max(0.0, p * self.shortage_scale))

    def shortage_probability(self, inst: InstanceType, capacity: CapacityType, nodes: int = 1,
                             storm: bool | None = None) -> float:
        """Probability that a request for ``nodes`` nodes fails (time-averaged when ``storm`` is None)."""
        p = self.node_shortage_probability(inst, capacity)
        if storm is not None and p < 1.0:
            calm = p / self._storm_weight(self.storm_shortage_multiplier)
            p = min(1.0, calm * self.storm_shortage_multiplier) if storm else calm
        return 1.0 - (1.0 - p) ** max(nodes, 1)

    def notice_seconds(self, inst: InstanceType) -> float:
        """Interruption notice for the instance's provider (30 s when unknown)."""
        return self.notice_s.get(inst.provider, 30.0)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **overrides: Any) -> CloudModel:
        """A cloud model from a trace's ``cloud`` mapping (camelCase keys), then keyword overrides.

        Keys: the camelCase names in :data:`CLOUD_KEYS`.

        Raises:
            InputError: an unknown key or a value out of range (the message names it).
        """
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in CLOUD_KEYS:
                raise InputError(f"cloud.{key}: unknown; known keys are {', '.join(sorted(CLOUD_KEYS))}", field=f"cloud.{key}")
            kwargs[CLOUD_KEYS[key]] = value
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**kwargs)
        except TypeError as err:
            raise InputError(f"cloud: {err}", field="cloud") from err
        except ValueError as err:
            text = str(err)
            for camel, name in CLOUD_KEYS.items():  # name the key as the trace spells it
                text = text.replace(f"cloud {name} ", f"cloud.{camel} ")
            raise InputError(text, field="cloud") from err


CLOUD_KEYS = {
    "interruptionScale": "interruption_scale",
    "onDemandShortage": "ondemand_shortage",
    "spotShortage": "spot_shortage",
    "scarceMultiplier": "scarce_multiplier",
    "shortageScale": "shortage_scale",
    "shortageOverrides": "shortage_overrides",
    "waveShare": "wave_share",
    "stormShare": "storm_share",
    "stormHours": "storm_hours",
    "stormWaveMultiplier": "storm_wave_multiplier",
    "stormShortageMultiplier": "storm_shortage_multiplier",
    "failedRequestSeconds": "failed_request_s",
    "retryBackoffSeconds": "retry_backoff_s",
    "provisioningJitter": "provisioning_jitter",
    "noticeSeconds": "notice_s",
    "measurementNoise": "measurement_noise",
}
"""A trace's ``cloud:`` keys and the :class:`CloudModel` fields they set."""


class Market:
    """One offering over time: calm and storm periods, and its reclaim waves (simulated hours).

    Generated lazily from its own seeded stream, so the timeline is the same whoever asks first.
    """

    __slots__ = ("_boundaries", "_calm_h", "_horizon", "_rates", "_rng", "_storm_h", "_storms", "_waves")

    def __init__(self, rng: random.Random, wave_rates_per_h: tuple[float, float], storm_share: float,
                 storm_hours: float) -> None:
        self._rng = rng
        self._rates = wave_rates_per_h
        self._storm_h = storm_hours
        self._calm_h = math.inf if storm_share <= 0 else storm_hours * (1.0 - storm_share) / storm_share
        self._boundaries: list[float] = [0.0]
        """Start of each period."""
        self._storms: list[bool] = [storm_share >= 1.0 or (storm_share > 0 and rng.random() < storm_share)]
        self._waves: list[float] = []
        self._horizon = 0.0
        """Hours up to which periods and waves are generated."""

    def _extend(self, until_h: float) -> None:
        while self._horizon < until_h and self._horizon < MARKET_HORIZON_H:
            storm = self._storms[-1]
            mean = self._storm_h if storm else self._calm_h
            end = math.inf if math.isinf(mean) else self._horizon + self._rng.expovariate(1.0 / mean)
            end = min(end, MARKET_HORIZON_H)
            rate = self._rates[1] if storm else self._rates[0]
            if rate > 0:
                t = self._horizon + self._rng.expovariate(rate)
                while t < end:
                    self._waves.append(t)
                    t += self._rng.expovariate(rate)
            self._horizon = end
            if end < MARKET_HORIZON_H:
                self._boundaries.append(end)
                self._storms.append(not storm)

    def storm_at(self, t_h: float) -> bool:
        """Whether the offering is in a storm at hour ``t_h``."""
        self._extend(t_h + 1e-9)
        return self._storms[bisect.bisect_right(self._boundaries, t_h) - 1]

    def next_wave_h(self, t_h: float) -> float:
        """The first reclaim wave strictly after ``t_h`` (inf when none within the horizon)."""
        while True:
            k = bisect.bisect_right(self._waves, t_h)
            if k < len(self._waves):
                return self._waves[k]
            if self._horizon >= MARKET_HORIZON_H:
                return math.inf
            self._extend(max(self._horizon, t_h) + 24.0 * 7)


class Cloud:
    """A :class:`CloudModel` with its seeded markets: what one simulated run plays against."""

    def __init__(self, model: CloudModel, seed: int) -> None:
        self.model = model
        self.seed = seed
        self._markets: dict[tuple[str, str], Market] = {}

    def market(self, inst: InstanceType, capacity: CapacityType) -> Market:
        """The shared market of an offering."""
        key = (inst.name, capacity.value)
        m = self._markets.get(key)
        if m is None:
            rng = random.Random(f"{self.seed}|market|{inst.name}|{capacity.value}")
            m = self._markets[key] = Market(rng, self.model.wave_rates_per_h(inst, capacity),
                                            self.model.storm_share, self.model.storm_hours)
        return m

    def request_fails(self, inst: InstanceType, capacity: CapacityType, nodes: int, t_h: float,
                      u: float) -> bool:
        """Whether a request for ``nodes`` nodes at hour ``t_h`` fails, given the job's uniform draw ``u``."""
        storm = self.market(inst, capacity).storm_at(t_h) if self.model.storm_share > 0 else None
        return u < self.model.shortage_probability(inst, capacity, nodes, storm)

    def interruption_s(self, inst: InstanceType, capacity: CapacityType, nodes: int, t_h: float,
                       u: float) -> float:
        """Seconds from ``t_h`` to the allocation's reclaim: the next wave of its offering or its own
        independent reclaim (from the job's uniform draw ``u`` in (0, 1]), whichever comes first."""
        lam = self.model.node_rate_per_h(inst, capacity)
        if lam <= 0:
            return math.inf
        own_rate = lam * (1.0 - self.model.wave_share) * nodes
        own = -math.log(u) / own_rate * 3600.0 if own_rate > 0 else math.inf
        wave = (self.market(inst, capacity).next_wave_h(t_h) - t_h) * 3600.0 if self.model.wave_share > 0 else math.inf
        return min(own, wave)


class Draws:
    """The random draws of one job, in independent named streams seeded by (seed, job).

    Each stream is consumed in order of the job's capacity requests (or, for the measurement
    stream, its observations), so the n-th request of a job sees the same uniform numbers under
    every strategy.
    """

    __slots__ = ("_capacity", "_interrupt", "_measure", "_provision")

    def __init__(self, seed: int, job_key: str) -> None:
        self._interrupt = random.Random(f"{seed}|{job_key}|interrupt")
        self._capacity = random.Random(f"{seed}|{job_key}|capacity")
        self._provision = random.Random(f"{seed}|{job_key}|provision")
        self._measure = random.Random(f"{seed}|{job_key}|measure")

    def interruption_u(self) -> float:
        """A uniform number in (0, 1] for the next independent reclaim."""
        return 1.0 - self._interrupt.random()

    def capacity_u(self) -> float:
        """A uniform number in [0, 1) for the next capacity request."""
        return self._capacity.random()

    def provisioning_s(self, nominal_s: float, jitter: float) -> float:
        """A provisioning delay around ``nominal_s``."""
        u = self._provision.random()
        return nominal_s * (1.0 + jitter * (2.0 * u - 1.0))

    def noise(self, sigma: float) -> float:
        """A relative measurement error ``N(0, sigma)``, kept above -0.9 (a counter never runs backwards)."""
        return max(-0.9, self._measure.gauss(0.0, sigma)) if sigma > 0 else 0.0
