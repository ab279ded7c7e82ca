"""Spot prices that move: a price history per instance type and zone, replayed by the simulated cloud.

The history is read in the shape EC2's ``DescribeSpotPriceHistory`` answers (boto3's
``describe_spot_price_history``; a recorded answer, or one made in its shape)::

    {"SpotPriceHistory": [
        {"AvailabilityZone": "us-east-1b", "InstanceType": "p4d.24xlarge",
         "ProductDescription": "Linux/UNIX", "SpotPrice": "9.830500",
         "Timestamp": "2026-11-02T06:00:00+00:00"}, ...]}

``SpotPrice`` is a string of USD per instance-hour (as EC2 writes it); only ``Linux/UNIX`` rows are
kept (the product the planner prices; Karpenter's pricing provider keeps the same). Each
record is a price change: the price of that type in that zone from its ``Timestamp`` until the
next record of the same type and zone.

**Replay.** The history is laid on the simulated clock by its first timestamp: hour ``t`` of the
simulation is ``first timestamp + t``. Every strategy meets the same prices at the same hour, and
plans at the prices in force when it plans (:class:`gpuscaler.simulator.planning.CachedPlanner`
re-prices the catalog per zone, once per set of prices in force).

**Prices in force.** For a spot allocation of type ``i`` in zone ``z`` (the plan's zone; for a
plan for any zone, the zone cheapest at the hour the nodes are granted: where a price-capacity
allocation would put them) running from ``t0`` to ``t1``, the price per node-hour is the history's
price in force at each hour; before the first record of ``(i, z)`` (and for a type or zone the
history does not name, and on-demand) it is the price the plan was made at. So an allocation is
billed in pieces, one per price change inside it:

```
cost = sum_k (t_{k+1} - t_k) x nodes x p(i, z, t_k),    t_0 = t0 < t_1 < ... < t_K = t1
```

where ``t_1..t_{K-1}`` are the history's changes of ``(i, z)`` inside ``(t0, t1)``.

Pure: parsing and arithmetic; the file is read by :meth:`SpotPriceHistory.read`.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuscaler.inputs import MAX_TRACE_BYTES, InputError, read_text, shown

HISTORY_SOURCE = "spot-price-history"
"""The price source of a plan made at a replayed history's price."""
LINUX = "Linux/UNIX"
"""The ``ProductDescription`` kept (Linux, no pre-installed software: what the catalog prices)."""


class SpotPriceHistoryError(InputError):
    """A spot price history that cannot be used; the message names the file, record and value."""


@dataclass(frozen=True, slots=True)
class _Series:
    """One (instance type, zone): the hours of its price changes and the price from each on."""

    hours: tuple[float, ...]
    usd: tuple[float, ...]

    def at(self, t_h: float) -> float | None:
        k = bisect.bisect_right(self.hours, t_h) - 1
        return self.usd[k] if k >= 0 else None


@dataclass(frozen=True)
class SpotPriceHistory:
    """Per-zone spot prices over time (see the module docstring).

    Attributes:
        series: per ``(instance type, zone)`` its price changes, hours after :attr:`start`.
        start: the first timestamp of the history: hour 0 of the simulation.
        source: where it was read from, for messages.
    """

    series: dict[tuple[str, str], _Series]
    start: datetime
    source: str = "spot price history"
    _zones: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        zones: dict[str, list[str]] = {}
        for name, zone in sorted(self.series):
            zones.setdefault(name, []).append(zone)
        self._zones.update({k: tuple(v) for k, v in zones.items()})

    @classmethod
    def from_json(cls, text: str, source: str) -> SpotPriceHistory:
        """Parse a ``describe_spot_price_history`` answer.

        Raises:
            SpotPriceHistoryError: not JSON, no ``SpotPriceHistory`` list, a record without a field,
                a price that is not a positive number in a string, a time that is not ISO 8601 with
                a zone, the same type, zone and time twice, or no Linux/UNIX record at all.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpotPriceHistoryError(f"{source}: not JSON ({err.msg}, line {err.lineno})") from None
        records = data.get("SpotPriceHistory") if isinstance(data, dict) else None
        if not isinstance(records, list):
            raise SpotPriceHistoryError(
                f"{source}: not a spot price history: expected {{\"SpotPriceHistory\": [...]}} as "
                "describe_spot_price_history answers"
            )
        rows: dict[tuple[str, str], dict[datetime, float]] = {}
        for n, r in enumerate(records):
            where = f"{source}: SpotPriceHistory[{n}]"
            if not isinstance(r, dict):
                raise SpotPriceHistoryError(f"{where}: a record must be a mapping, got {type(r).__name__}")
            missing = [k for k in ("AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice", "Timestamp")
                       if not isinstance(r.get(k), str) or not r.get(k)]  # fmt: skip
            if missing:
                raise SpotPriceHistoryError(f"{where}: {', '.join(missing)} missing or not a string")
            if r["ProductDescription"] != LINUX:
                continue
            usd = _price(r["SpotPrice"], where)
            at = _time(r["Timestamp"], where)
            key = (r["InstanceType"], r["AvailabilityZone"])
            if at in rows.setdefault(key, {}):
                raise SpotPriceHistoryError(f"{where}: {key[0]} in {key[1]} is priced twice at {r['Timestamp']}")
            rows[key][at] = usd
        if not rows:
            raise SpotPriceHistoryError(f"{source}: no {LINUX} spot prices in it")
        start = min(t for series in rows.values() for t in series)
        series = {
            key: _Series(
                tuple((t - start).total_seconds() / 3600.0 for t in sorted(s)), tuple(s[t] for t in sorted(s))
            )
            for key, s in rows.items()
        }
        return cls(series, start, source)

    @classmethod
    def read(cls, path: str) -> SpotPriceHistory:
        """Read and parse a history file.

        Raises:
            SpotPriceHistoryError: unreadable, or not a history (see :meth:`from_json`).
        """
        try:  # the input layer: a FIFO or a device refused unread, the size capped, UTF-8 checked
            text = read_text(path, "spot price history", MAX_TRACE_BYTES)
        except InputError as err:
            raise SpotPriceHistoryError(f"cannot read the spot price history: {err}") from None
        return cls.from_json(text, path)

    def zones(self, instance: str) -> tuple[str, ...]:
        """The zones the history prices ``instance`` in, by name."""
        return self._zones.get(instance, ())

    def price(self, instance: str, zone: str, t_h: float) -> float | None:
        """The price per node-hour of ``instance`` in ``zone`` at hour ``t_h``; None before its
        first record or when the history does not price it there."""
        s = self.series.get((instance, zone))
        return None if s is None else s.at(t_h)

    def epoch(self, t_h: float) -> tuple[int, ...]:
        """Which records are in force at ``t_h`` (one index per series): equal epochs, equal prices."""
        return tuple(bisect.bisect_right(s.hours, t_h) for _, s in sorted(self.series.items()))

    def in_force(self, t_h: float) -> list[tuple[str, str, float]]:
        """``(instance type, zone, USD per node-hour)`` of every series priced at ``t_h``."""
        return [(name, zone, p) for (name, zone), s in sorted(self.series.items()) if (p := s.at(t_h)) is not None]

    def placement(self, instance: str, zone: str, t_h: float) -> str:
        """The zone nodes of a plan land in: the plan's zone, or for any zone ("") the zone with the
        lowest price in force at ``t_h`` (the first by name on a tie; "" when none is priced yet)."""
        if zone:
            return zone
        priced = [(p, z) for z in self.zones(instance) if (p := self.price(instance, z, t_h)) is not None]
        return min(priced)[1] if priced else ""

    def pieces(
        self, instance: str, zone: str, start_h: float, end_h: float, planned_usd: float
    ) -> tuple[tuple[float, float, float], ...]:
        """An allocation's billing pieces: ``(from_h, to_h, USD per node-hour)`` covering
        ``[start_h, end_h]``, cut at each price change of ``(instance, zone)`` inside it; the
        planned price where the history has none yet."""
        s = self.series.get((instance, zone))
        if s is None or end_h <= start_h:
            return ((start_h, end_h, planned_usd),)
        cuts = [h for h in s.hours if start_h < h < end_h]
        bounds = [start_h, *cuts, end_h]
        out = []
        for a, b in itertools.pairwise(bounds):
            p = s.at(a)
            out.append((a, b, planned_usd if p is None else p))
        return tuple(out)


def _price(value: str, where: str) -> float:
    try:
        usd = float(value)
    except ValueError:
        raise SpotPriceHistoryError(f"{where}: SpotPrice {shown(value)} is not a number (USD per hour)") from None
    if not math.isfinite(usd) or usd <= 0:
        raise SpotPriceHistoryError(f"{where}: SpotPrice {shown(value)} must be a positive price in USD per hour")
    return usd


def _time(value: str, where: str) -> datetime:
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SpotPriceHistoryError(f"{where}: Timestamp {shown(value)} is not an ISO 8601 time") from None
    if at.tzinfo is None:
        raise SpotPriceHistoryError(f"{where}: Timestamp {shown(value)} needs a UTC offset (like +00:00 or Z)")
    return at


def describe(history: SpotPriceHistory) -> dict[str, Any]:
    """A summary for ``--json`` output: file, start, types, zones and price changes."""
    return {
        "file": history.source,
        "start": history.start.isoformat(),
        "instanceTypes": sorted({name for name, _ in history.series}),
        "zones": sorted({zone for _, zone in history.series}),
        "priceChanges": sum(len(s.hours) for s in history.series.values()),
    }
