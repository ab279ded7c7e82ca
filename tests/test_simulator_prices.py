"""The simulator's spot price history: read in describe_spot_price_history's shape, replayed, and a
plan made at one price billed at the prices in force when it ran through a change."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.simulator import CloudModel, Trace, TraceJob, compare
from gpuscaler.simulator.spot_prices import SpotPriceHistory, SpotPriceHistoryError

CATALOG = load_catalog()
QUIET = CloudModel(interruption_scale=0.0, shortage_scale=0.0, provisioning_jitter=0.0)


def record(zone: str, usd: str, at: str, instance: str = "p4d.24xlarge", product: str = "Linux/UNIX") -> dict[str, str]:
    return {"AvailabilityZone": zone, "InstanceType": instance, "ProductDescription": product,
            "SpotPrice": usd, "Timestamp": at}  # fmt: skip


def history(*records: dict[str, str]) -> SpotPriceHistory:
    return SpotPriceHistory.from_json(json.dumps({"SpotPriceHistory": list(records)}), "h.json")


def test_prices_in_force_placement_and_pieces() -> None:
    h = history(
        record("us-east-1a", "10.0", "2026-11-02T00:00:00Z"),
        record("us-east-1b", "9.0", "2026-11-02T00:00:00+00:00"),
        record("us-east-1b", "12.0", "2026-11-02T05:00:00Z"),
        record("us-east-1a", "99.0", "2026-11-02T01:00:00Z", product="Windows"),  # not what is planned
    )
    assert h.zones("p4d.24xlarge") == ("us-east-1a", "us-east-1b")
    assert h.price("p4d.24xlarge", "us-east-1b", 4.99) == 9.0
    assert h.price("p4d.24xlarge", "us-east-1b", 5.0) == 12.0
    assert h.price("p4d.24xlarge", "us-east-1a", 3.0) == 10.0
    assert h.price("g5.xlarge", "us-east-1a", 3.0) is None
    assert h.placement("p4d.24xlarge", "", 1.0) == "us-east-1b"  # cheapest then
    assert h.placement("p4d.24xlarge", "", 6.0) == "us-east-1a"  # cheapest after the change
    assert h.placement("p4d.24xlarge", "us-east-1b", 6.0) == "us-east-1b"  # a zoned plan stays
    assert h.pieces("p4d.24xlarge", "us-east-1b", 2.0, 8.0, 7.0) == ((2.0, 5.0, 9.0), (5.0, 8.0, 12.0))
    assert h.pieces("g5.xlarge", "us-east-1b", 2.0, 8.0, 7.0) == ((2.0, 8.0, 7.0),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ('{"Items": []}', "expected {\"SpotPriceHistory\""),
        (json.dumps({"SpotPriceHistory": [record("us-east-1a", "-1", "2026-11-02T00:00:00Z")]}), "positive price"),
        (json.dumps({"SpotPriceHistory": [record("us-east-1a", "abc", "2026-11-02T00:00:00Z")]}), "not a number"),
        (json.dumps({"SpotPriceHistory": [record("us-east-1a", "1", "yesterday")]}), "not an ISO 8601 time"),
        (json.dumps({"SpotPriceHistory": [record("us-east-1a", "1", "2026-11-02T00:00:00")]}), "needs a UTC offset"),
        (json.dumps({"SpotPriceHistory": [{"InstanceType": "x"}]}), "AvailabilityZone, ProductDescription"),
        (json.dumps({"SpotPriceHistory": [record("us-east-1a", "1", "2026-11-02T00:00:00Z", product="Windows")]}),
         "no Linux/UNIX spot prices"),
        (json.dumps({"SpotPriceHistory": [record("us-east-1a", "1", "2026-11-02T00:00:00Z")] * 2}), "priced twice"),
    ],
)
def test_a_bad_history_is_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SpotPriceHistoryError, match=message.replace("{", r"\{").replace('"', '"')):
        SpotPriceHistory.from_json(text, "h.json")


def spot_job() -> Trace:
    spec: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 90},
                            "constraints": {"instanceTypes": ["p4d.24xlarge"], "spot": "preferred"}}
    return Trace("one", (TraceJob("r", 0.0, TrainingJobSpec.model_validate(spec)),))


def test_a_plan_made_at_one_price_is_billed_at_the_prices_in_force() -> None:
    planned = CATALOG.instance("p4d.24xlarge").spot_usd_hr
    assert planned is not None
    base = compare(spot_job(), CATALOG, cloud=QUIET, strategies=["gpuscaler"], throughput_error=0).results[0]
    seg = base.outcomes[0].segments[0]
    assert seg.capacity is CapacityType.SPOT and seg.zone == "" and seg.charges == ()
    # the price doubles in every zone an hour after the nodes come
    change_h = seg.start_h + 1.0
    h = history(*(r for z in ("us-east-1a", "us-east-1b") for r in (
        record(z, f"{planned:.6f}", "2026-11-02T00:00:00Z"),
        record(z, f"{2 * planned:.6f}", f"2026-11-02T{int(change_h):02d}:{round(change_h % 1 * 60):02d}:00Z"),
    )))  # fmt: skip
    moved = compare(spot_job(), CATALOG, cloud=CloudModel(interruption_scale=0.0, shortage_scale=0.0,
                    provisioning_jitter=0.0, spot_prices=h), strategies=["gpuscaler"], throughput_error=0).results[0]
    out = moved.outcomes[0]
    s = out.segments[0]
    assert (s.start_h, s.end_h) == (seg.start_h, seg.end_h)  # the same run
    assert s.zone == "us-east-1a" and len(s.charges) == 2
    at = h.series[("p4d.24xlarge", "us-east-1a")].hours[1]
    expected = ((at - s.start_h) * planned + (s.end_h - at) * 2 * planned) * s.nodes
    assert out.cost_usd == pytest.approx(expected, rel=1e-9)
    assert out.cost_usd > base.outcomes[0].cost_usd
    assert out.predicted_cost_usd == pytest.approx(base.outcomes[0].predicted_cost_usd)  # planned at the old price


def test_plans_are_made_at_the_prices_in_force_when_asked() -> None:
    h = history(
        record("us-east-1a", "10.0", "2026-11-02T00:00:00Z"),
        record("us-east-1b", "9.0", "2026-11-02T00:00:00Z"),
        record("us-east-1b", "20.0", "2026-11-02T05:00:00Z"),
    )
    job = spot_job().jobs[0]
    trace = Trace("two", (job, TraceJob("late", 6.0, job.spec)))
    cloud = CloudModel(interruption_scale=0.0, shortage_scale=0.0, provisioning_jitter=0.0, spot_prices=h)
    for res in compare(trace, CATALOG, cloud=cloud, strategies=["gpuscaler", "managed-spot"], throughput_error=0).results:
        early, late = (o.segments[0] for o in res.outcomes)
        assert (early.zone, late.zone) == ("us-east-1b", "us-east-1a"), res.strategy  # the cheapest zone then
        assert early.usd_per_hour == pytest.approx(9.0 * early.nodes)  # planned at the price in force
        assert late.usd_per_hour == pytest.approx(10.0 * late.nodes)
