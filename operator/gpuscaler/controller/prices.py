"""The operator's price refresher: live prices on a schedule, a last good copy, a dated fallback.

After Karpenter's AWS pricing provider (on-demand every 12 h, spot every hour, the last good copy
kept when a call fails, a table compiled into the release as the fallback), for every cloud that
``settings.prices_providers`` names:

- **Refresh.** Each price source (:class:`gpuscaler.cloud.pricing.PriceSource`, one per cloud)
  is asked for the configured regions when on-demand prices are older than
  ``prices_ondemand_interval_s`` or spot prices older than ``prices_spot_interval_s``. The sources
  answer both kinds in one call; a refresh that is due for spot only takes the answer's spot
  prices and keeps the on-demand prices in force. New prices replace the copy's price by price: a
  price the answer lacks, or that was vetted out, keeps its last good value and date. The answer is vetted
  (:func:`gpuscaler.cloud.pricing.refresh.vet`: non-prices and implausible on-demand prices
  dropped, spot under 10% of on-demand flagged) and must apply to the catalog
  (:func:`gpuscaler.catalog.prices.apply_prices`).
- **Last good copy.** A refresh that fails (unreachable, throttled past the source's retries, a
  malformed page, a table that does not apply) changes nothing: the copy in force stays, and the
  next try comes ``prices_retry_s`` later. A good refresh is written to a ConfigMap
  (:class:`PriceStore`) with the times each kind was read, and read back at start-up, so a
  restarted operator plans on it at once.
- **Fallback.** With no copy at all (first start, no ConfigMap, every source failing) the shipped
  table is in force.
- **Precedence**, per price: a policy's ``priceOverrides`` (applied by the planner) > the live
  copy > the shipped table.
- **Cost so far at the prices in force.** Every copy put in force is recorded in a :class:`PriceLog`
  (the prices that changed, with the time; kept with the copy). A node created at the live price in
  force for its instance type, region, capacity type and zone is costed at each price in force
  while it ran, ``sum_k (t_{k+1} - t_k) x p_k``; a node created at another price (a policy's
  negotiated price, the shipped table's) keeps its own.
- **Staleness.** :meth:`PriceRefresher.staleness`: the live copy's on-demand prices older than
  ``prices_ondemand_max_age_s`` or its spot prices older than ``prices_spot_max_age_s``, or no live
  copy at all, is stale. The loop then sets ``PricesStale`` on the jobs it plans and posts an Event;
  the handlers export the ages as metrics.

Kopf-free: the store and the sources are injected; :mod:`gpuscaler.kube.prices` is the ConfigMap.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from gpuscaler.catalog import CapacityType, Catalog
from gpuscaler.catalog.models import SHIPPED_SOURCE
from gpuscaler.catalog.prices import PriceFileError, PriceTable, apply_prices
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.pricing import PriceSource, PriceSourceError
from gpuscaler.cloud.pricing.refresh import vet
from gpuscaler.kube.prices import PriceCopy, PriceStoreError

LOG_ENTRIES = 48
"""Price changes the log keeps (two days of hourly spot refreshes; the log travels in the
ConfigMap, whose data is limited to 1 MiB); older ones are folded into the oldest kept, so a node
that ran longer is costed at that price before it."""


def price_key(name: str, region: str, capacity: str, zone: str) -> str:
    """How the log names one price: ``name|region|capacity|zone`` (zone "" = region-wide)."""
    return f"{name}|{region}|{capacity}|{zone}"


def price_map(table: PriceTable) -> dict[str, float]:
    """Every price of a table by :func:`price_key`."""
    return {price_key(p.instance_type, p.region, p.capacity.value, p.zone): p.usd_per_hour for p in table.rows}


@dataclass
class PriceLog:
    """The live prices in force over time: per change, its time and the prices that changed.

    Attributes:
        entries: ``(time, {price key: USD per node-hour})`` oldest first; the first holds every
            price, each later one what changed.
    """

    entries: list[tuple[datetime, dict[str, float]]] = field(default_factory=list)

    def record(self, at: datetime, prices: dict[str, float]) -> bool:
        """Note the prices in force from ``at``; False when nothing changed."""
        now = self.current()
        diff = {k: v for k, v in prices.items() if now.get(k) != v}
        if not diff:
            return False
        self.entries.append((at, diff))
        while len(self.entries) > LOG_ENTRIES:
            (t0, first), (_, second) = self.entries[0], self.entries[1]
            self.entries[:2] = [(t0, {**first, **second})]
        return True

    def current(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for _, diff in self.entries:
            out.update(diff)
        return out

    def at(self, key: str, t: datetime) -> float | None:
        """The price of ``key`` in force at ``t`` (None before the log knew it)."""
        found = None
        for when, diff in list(self.entries):  # a snapshot: the refresher's thread may append
            if when > t:
                break
            found = diff.get(key, found)
        return found

    def node_cost(self, node: NodeState, region: str, now: datetime) -> float | None:
        """The cost of ``node`` up to ``now`` at the prices in force while it ran; None when it was
        not created at a logged live price (its own price then holds)."""
        if node.created is None:
            return None
        keys = [price_key(node.instance_type, region, node.capacity_type, z) for z in dict.fromkeys((node.zone, ""))]
        for key in keys:
            start = self.at(key, node.created)
            if start is not None and abs(start - node.usd_per_hour) <= 1e-6 * max(start, 1.0):
                break
        else:
            return None
        cuts = [(when, diff[key]) for when, diff in list(self.entries) if node.created < when < now and key in diff]
        total, t, usd = 0.0, node.created, start
        for when, price in cuts:
            total += (when - t).total_seconds() / 3600 * usd
            t, usd = when, price
        return total + max((now - t).total_seconds(), 0) / 3600 * usd

    def to_json(self) -> str:
        return json.dumps([{"at": t.isoformat(), "prices": d} for t, d in self.entries], sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PriceLog:
        """Raises ValueError when ``text`` is not a log."""
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError("a price log is a JSON list")
        return cls([(datetime.fromisoformat(e["at"]), {str(k): float(v) for k, v in e["prices"].items()}) for e in data])


class PriceStore(Protocol):
    """Where the last good copy lives across restarts (:class:`gpuscaler.kube.prices.ConfigMapPriceStore`)."""

    def load(self) -> PriceCopy | None:
        """The copy kept, or None when there is none.

        Raises:
            PriceStoreError: it cannot be read, or what is kept is not a copy.
        """
        ...

    def save(self, copy: PriceCopy) -> None:
        """Keep ``copy``, replacing the one kept.

        Raises:
            PriceStoreError: it cannot be written.
        """
        ...


@dataclass(frozen=True)
class PriceConfig:
    """The refresher's settings (``GPUSCALER_PRICES_*``)."""

    regions: dict[str, list[str]]
    """Regions to price per provider."""
    ondemand_interval_s: float = 43200.0
    spot_interval_s: float = 3600.0
    ondemand_max_age_s: float = 129600.0
    spot_max_age_s: float = 10800.0
    retry_s: float = 300.0


@dataclass(frozen=True)
class Staleness:
    """Whether the prices in force are older than the settings allow, and the sentence that says so."""

    stale: bool
    reason: str
    """``LivePrices``, ``PricesOld`` or ``NoLivePrices``."""
    message: str


@dataclass
class PriceRefresher:
    """Live prices for the planner: :attr:`catalog` is the catalog in force (see the module docstring).

    Attributes:
        shipped: the catalog shipped with gpuscaler (facts, and the fallback prices).
        sources: one price source per configured cloud.
        config: intervals, maximum ages, regions.
        store: where the last good copy is kept (None: in memory only).
        clock: the time.
        catalog: the catalog in force: ``shipped`` re-priced by :attr:`copy`, or ``shipped``.
        copy: the last good live copy (None: none yet).
        last_error: why the last refresh or load failed ("" after a good one).
        on_change: called with the new catalog after each good refresh.
    """

    shipped: Catalog
    sources: Sequence[PriceSource]
    config: PriceConfig
    store: PriceStore | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    catalog: Catalog = field(init=False)
    copy: PriceCopy | None = field(default=None, init=False)
    last_error: str = field(default="", init=False)
    failed_at: datetime | None = field(default=None, init=False)
    on_change: list[Callable[[Catalog], None]] = field(default_factory=list)
    log: PriceLog = field(default_factory=PriceLog, init=False)
    """The live prices in force over time (for the cost so far)."""
    dropped: list[str] = field(default_factory=list, init=False)
    """Prices the last answer gave that were vetted out (their last good values stay in force)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.catalog = self.shipped

    # ------------------------------------------------------------------ start-up

    def load(self) -> bool:
        """Put the kept copy in force (at start-up); False when there is none usable (the shipped
        table stays in force and :attr:`last_error` says why when it could not be read)."""
        if self.store is None:
            return False
        try:
            kept = self.store.load()
            if kept is None:
                return False
            self._install(kept)
        except (PriceStoreError, PriceFileError) as err:
            self.last_error = f"the kept copy could not be used: {err}"
            return False
        return True

    # ------------------------------------------------------------------ refresh

    def due(self, now: datetime) -> tuple[bool, bool]:
        """Whether on-demand and spot prices are due for a refresh at ``now``."""
        if self.copy is None:
            return True, True
        od = (now - self.copy.ondemand_read_at).total_seconds() >= self.config.ondemand_interval_s
        spot = (now - self.copy.spot_read_at).total_seconds() >= self.config.spot_interval_s
        return od, spot

    def next_in_s(self, now: datetime) -> float:
        """Seconds until the next refresh is due (a failed one is retried after ``retry_s``)."""
        if self.failed_at is not None:
            return max(0.0, self.config.retry_s - (now - self.failed_at).total_seconds())
        if self.copy is None:
            return 0.0
        waits = (
            self.config.ondemand_interval_s - (now - self.copy.ondemand_read_at).total_seconds(),
            self.config.spot_interval_s - (now - self.copy.spot_read_at).total_seconds(),
        )
        return max(0.0, min(waits))

    def refresh(self, now: datetime | None = None) -> bool:
        """Refresh what is due; True when a new copy is in force.

        Every source is asked; when any fails, nothing changes (the copy in force stays, and the
        failure is :attr:`last_error`, retried after ``retry_s``).
        """
        now = now or self.clock()
        od_due, spot_due = self.due(now)
        if not (od_due or spot_due):
            return False
        fresh: list[PriceTable] = []
        try:
            for source in self.sources:
                table = source.fetch(self.config.regions.get(source.provider, []))
                kept, dropped, _ = vet(table, self.shipped)
                fresh.append(kept)
                self.dropped = dropped
            merged = self._merge(fresh, od_due)
            copy = PriceCopy(
                merged,
                now if od_due else self.copy.ondemand_read_at if self.copy else now,
                now,
            )
            self._install(copy, now)
            copy = replace(copy, log_json=self.log.to_json())
        except (PriceSourceError, PriceFileError) as err:
            self.last_error = str(err)
            self.failed_at = now
            return False
        self.last_error, self.failed_at = "", None
        if self.store is not None:
            try:
                self.store.save(copy)
            except PriceStoreError as err:  # in force now; kept across a restart only once it is written
                self.last_error = f"the new copy is in force but was not kept: {err}"
        return True

    def _merge(self, fresh: list[PriceTable], with_ondemand: bool) -> PriceTable:
        """The copy in force with the new prices over it, price by price: a price the answer lacks
        (or that was vetted out) keeps its last good value and date; with only spot due, the new
        on-demand prices are not taken."""
        rows = {p.key: p for p in (self.copy.table.rows if self.copy else [])}
        for p in (p for t in fresh for p in t.rows):
            if with_ondemand or p.capacity is CapacityType.SPOT:
                rows[p.key] = p
        return PriceTable(list(rows.values()), "live prices")

    def _install(self, copy: PriceCopy, at: datetime | None = None) -> None:
        same = self.copy is not None and _rows(self.copy.table) == _rows(copy.table)
        # the same prices keep the same catalog object: the operator's plan cache (keyed by it) stays warm
        catalog = self.catalog if same else apply_prices(self.shipped, copy.table)
        with self._lock:
            self.copy, self.catalog = copy, catalog
            if copy.log_json and not self.log.entries:
                try:
                    self.log = PriceLog.from_json(copy.log_json)
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.last_error = "the kept price history is not readable: costs so far restart from now"
            self.log.record(at or max(copy.ondemand_read_at, copy.spot_read_at), price_map(copy.table))
        for notify in self.on_change:
            notify(catalog)

    # ------------------------------------------------------------------ staleness

    def ages_s(self, now: datetime) -> tuple[float | None, float | None]:
        """Seconds since on-demand and spot prices were last read (None: no live copy)."""
        if self.copy is None:
            return None, None
        return (now - self.copy.ondemand_read_at).total_seconds(), (now - self.copy.spot_read_at).total_seconds()

    def staleness(self, now: datetime | None = None) -> Staleness:
        """Whether the prices in force are stale, with a sentence naming their age and the last error."""
        now = now or self.clock()
        error = f"; last error: {self.last_error}" if self.last_error else ""
        if self.copy is None:
            dates = sorted({i.price_date for i in self.shipped.instances if i.ondemand_source == SHIPPED_SOURCE})
            return Staleness(
                True,
                "NoLivePrices",
                f"no live prices read yet: planning on the shipped price table ({', '.join(dates)}){error}",
            )
        od, spot = self.ages_s(now)
        assert od is not None and spot is not None
        old = od > self.config.ondemand_max_age_s or spot > self.config.spot_max_age_s
        text = (
            f"live prices read {_hours(od)} ago (on-demand) and {_hours(spot)} ago (spot); allowed "
            f"{_hours(self.config.ondemand_max_age_s)} and {_hours(self.config.spot_max_age_s)}"
        )
        if old:
            return Staleness(True, "PricesOld", f"{text}: planning on the last good copy{error}")
        return Staleness(False, "LivePrices", text + error)


def _rows(table: PriceTable) -> set[tuple[object, ...]]:
    return {(p.key, p.usd_per_hour, p.price_date, p.source) for p in table.rows}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds:.0f} s"

