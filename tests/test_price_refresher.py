"""The operator's price refresher: intervals, the last good copy, restart, fallback, staleness, and
the PricesStale condition and Event on the jobs it plans."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.catalog.prices import Price, PriceTable
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.pricing import PriceSourceError
from gpuscaler.controller.prices import PriceConfig, PriceRefresher
from gpuscaler.controller.reconcile import _node_cost
from gpuscaler.kube.prices import PriceCopy, PriceStoreError
from gpuscaler.names import ConditionType
from loop_harness import World, make_job

SHIPPED = load_catalog()
T0 = datetime(2026, 12, 6, 12, tzinfo=UTC)
TYPE = "p4d.24xlarge"
CONFIG = PriceConfig({"aws": ["us-east-1"]}, ondemand_interval_s=12 * 3600, spot_interval_s=3600,
                     ondemand_max_age_s=36 * 3600, spot_max_age_s=3 * 3600, retry_s=300)  # fmt: skip


class Source:
    """A price source answering what the test sets (or failing), counting its calls."""

    provider = "aws"

    def __init__(self) -> None:
        self.ondemand, self.spot = 30.0, 12.0
        self.failing = False
        self.calls = 0
        self.day = "2026-12-06"

    def fetch(self, regions: Sequence[str]) -> PriceTable:
        self.calls += 1
        if self.failing:
            raise PriceSourceError("pricing.us-east-1.amazonaws.com unreachable")
        return PriceTable([
            Price("aws", "us-east-1", "", TYPE, CapacityType.ON_DEMAND, self.ondemand, self.day, "aws-pricing-api"),
            Price("aws", "us-east-1", "us-east-1b", TYPE, CapacityType.SPOT, self.spot, self.day, "aws-spot-price-history"),
        ])  # fmt: skip


class Store:
    """The ConfigMap, in memory."""

    def __init__(self) -> None:
        self.kept: PriceCopy | None = None
        self.broken = False

    def load(self) -> PriceCopy | None:
        if self.broken:
            raise PriceStoreError("ConfigMap gpuscaler/gpuscaler-prices: Forbidden")
        return self.kept

    def save(self, copy: PriceCopy) -> None:
        if self.broken:
            raise PriceStoreError("ConfigMap gpuscaler/gpuscaler-prices: Forbidden")
        table = PriceTable.from_csv(copy.table.to_csv(), "cm")
        self.kept = PriceCopy(table, copy.ondemand_read_at, copy.spot_read_at, copy.log_json)


def refresher(source: Source, store: Store | None = None) -> PriceRefresher:
    return PriceRefresher(SHIPPED, [source], CONFIG, store)


def test_without_a_copy_the_shipped_table_is_in_force_and_stale() -> None:
    r = refresher(Source())
    assert r.catalog is SHIPPED and r.due(T0) == (True, True) and r.next_in_s(T0) == 0
    s = r.staleness(T0)
    assert s.stale and s.reason == "NoLivePrices" and "2026-07-20" in s.message


def test_a_refresh_reprices_the_catalog_and_keeps_the_copy() -> None:
    src, store = Source(), Store()
    r = refresher(src, store)
    seen: list[object] = []
    r.on_change.append(seen.append)
    assert r.refresh(T0)
    inst = r.catalog.instance(TYPE)
    assert (inst.ondemand_usd_hr, inst.spot_usd_hr, inst.spot_zones) == (30.0, 12.0, (("us-east-1b", 12.0),))
    assert inst.price_source(CapacityType.ON_DEMAND) == "aws-pricing-api"
    assert seen == [r.catalog] and store.kept is not None and store.kept.ondemand_read_at == T0
    s = r.staleness(T0 + timedelta(minutes=10))
    assert not s.stale and s.reason == "LivePrices"
    assert r.next_in_s(T0) == 3600 and not r.refresh(T0 + timedelta(minutes=59))  # nothing due
    assert src.calls == 1
    before = r.catalog
    assert r.refresh(T0 + timedelta(hours=1)) and r.catalog is before  # the same prices: the same catalog
    assert r.copy is not None and r.copy.spot_read_at == T0 + timedelta(hours=1)


def test_a_spot_refresh_keeps_the_on_demand_prices_until_theirs_is_due() -> None:
    src = Source()
    r = refresher(src)
    r.refresh(T0)
    src.ondemand, src.spot = 40.0, 10.0
    assert r.due(T0 + timedelta(hours=1)) == (False, True)
    assert r.refresh(T0 + timedelta(hours=1))
    inst = r.catalog.instance(TYPE)
    assert (inst.ondemand_usd_hr, inst.spot_usd_hr) == (30.0, 10.0)
    assert r.copy is not None and r.copy.ondemand_read_at == T0
    assert r.refresh(T0 + timedelta(hours=12))
    assert r.catalog.instance(TYPE).ondemand_usd_hr == 40.0


def test_an_outage_keeps_the_last_good_copy_retries_and_turns_stale() -> None:
    src = Source()
    r = refresher(src)
    r.refresh(T0)
    good = r.catalog
    src.failing = True
    t = T0 + timedelta(hours=1)
    assert not r.refresh(t)
    assert r.catalog is good and "unreachable" in r.last_error
    assert r.next_in_s(t) == 300
    assert not r.staleness(t).stale  # an hour old is within the 3 h allowed for spot
    s = r.staleness(T0 + timedelta(hours=3, seconds=1))
    assert s.stale and s.reason == "PricesOld" and "unreachable" in s.message and "last good copy" in s.message
    src.failing = False
    assert r.refresh(T0 + timedelta(hours=3, seconds=2)) and r.last_error == ""


def test_a_price_vetted_out_keeps_its_last_good_value() -> None:
    src = Source()
    r = refresher(src)
    r.refresh(T0)
    good = r.catalog
    src.ondemand, src.spot = 30000.0, 11.0  # $3,750 per GPU-hour: vetted out
    assert r.refresh(T0 + timedelta(hours=12))
    inst = r.catalog.instance(TYPE)
    assert inst.ondemand_usd_hr == good.instance(TYPE).ondemand_usd_hr == 30.0  # the last good value
    assert inst.spot_usd_hr == 11.0 and any("30000" in d or "30,000" in d for d in r.dropped)


def test_a_restart_plans_on_the_kept_copy_without_asking_the_source() -> None:
    src, store = Source(), Store()
    refresher(src, store).refresh(T0)
    again_src = Source()
    again_src.failing = True
    again = refresher(again_src, store)
    assert again.load()
    assert again.catalog.instance(TYPE).ondemand_usd_hr == 30.0 and again_src.calls == 0
    assert again.due(T0 + timedelta(minutes=5)) == (False, False)
    broken = Store()
    broken.broken = True
    cold = refresher(Source(), broken)
    assert not cold.load() and cold.catalog is SHIPPED and "Forbidden" in cold.last_error


def test_a_good_refresh_that_cannot_be_kept_is_in_force_and_says_so() -> None:
    store = Store()
    store.broken = True
    r = refresher(Source(), store)
    assert r.refresh(T0)
    assert r.catalog.instance(TYPE).ondemand_usd_hr == 30.0 and "was not kept" in r.last_error


@pytest.mark.parametrize("stale", [True, False])
def test_jobs_planned_carry_prices_stale_with_an_event_once(stale: bool) -> None:
    src = Source()
    r = refresher(src)
    r.refresh(T0)
    w = World()
    now = T0 + timedelta(hours=5 if stale else 0.5)
    w.loop.prices = lambda _: r.staleness(now)
    reasons = w.step(make_job())
    cond = next(c for c in w.status.conditions if c.type == ConditionType.PRICES_STALE)
    assert cond.status == ("True" if stale else "False")
    assert cond.reason == ("PricesOld" if stale else "LivePrices")
    assert ("PricesStale" in reasons) is stale


def node(price: float, created: datetime, zone: str = "us-east-1b") -> NodeState:
    return NodeState("n1", TYPE, "spot", True, created, price, zone=zone, region="us-east-1")


def test_cost_so_far_is_each_stretch_at_the_price_in_force() -> None:
    src, store = Source(), Store()
    r = refresher(src, store)
    r.refresh(T0)  # spot 12.0 in us-east-1b
    n = node(12.0, T0 + timedelta(minutes=30))
    src.spot = 15.0
    r.refresh(T0 + timedelta(hours=1))  # 15.0 from 13:00
    now = T0 + timedelta(hours=2)
    expected = 0.5 * 12.0 + 1.0 * 15.0
    assert r.log.node_cost(n, "us-east-1", now) == pytest.approx(expected)
    assert _node_cost(n, now, r.log) == pytest.approx(expected)
    assert _node_cost(n, now) == pytest.approx(1.5 * 12.0)  # without live prices: its own price throughout
    negotiated = node(9.0, T0 + timedelta(minutes=30))  # a policy's price: not the live one, kept
    assert r.log.node_cost(negotiated, "us-east-1", now) is None
    assert _node_cost(negotiated, now, r.log) == pytest.approx(1.5 * 9.0)
    # the history is kept with the copy: a restarted operator costs the same
    again = refresher(Source(), store)
    assert again.load()
    assert _node_cost(n, now, again.log) == pytest.approx(expected)
    assert r.log.record(T0 + timedelta(hours=3), r.log.current()) is False  # nothing changed, nothing noted
