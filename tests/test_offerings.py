"""Offerings: what the planner can buy, with each price's source and date carried to the plan."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cli import plan_to_dict
from gpuscaler.controller.reconcile import plan_status
from gpuscaler.planner import Offering, plan, resolve
from gpuscaler.planner.offerings import POLICY_OVERRIDE, SHIPPED_TABLE, offerings
from gpuscaler.policy import Policy

CAT = load_catalog()
T0 = datetime(2026, 12, 6, tzinfo=UTC)


def spec(**kw: Any) -> TrainingJobSpec:
    base: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 10}}
    base.update(kw)
    return TrainingJobSpec.model_validate(base)


def test_offerings_carry_the_catalog_price_its_source_and_date() -> None:
    s = spec()
    found, _ = offerings(resolve(s, CAT, "j", None), s, CAT, Policy())
    assert found and all(isinstance(o, Offering) for o in found)
    for o in found:
        assert o.usd_per_hour == o.instance.price(o.capacity)
        assert (o.price_source, o.price_date, o.zone) == (SHIPPED_TABLE, o.instance.price_date, "")
        assert o.key == (o.instance.name, o.capacity.value)
    assert {o.capacity for o in found} == {CapacityType.ON_DEMAND, CapacityType.SPOT}


def test_a_policy_override_is_named_as_the_price_source() -> None:
    s = spec(constraints={"instanceTypes": ["p4d.24xlarge"]})
    policy = Policy.model_validate({"name": "neg", "priceOverrides": [{"instanceType": "p4d.24xlarge", "onDemandUsdHr": 12.5}]})
    found, _ = offerings(resolve(s, CAT, "j", None), s, CAT, policy)
    by_cap = {o.capacity: o for o in found}
    assert by_cap[CapacityType.ON_DEMAND].usd_per_hour == 12.5
    assert by_cap[CapacityType.ON_DEMAND].price_source == POLICY_OVERRIDE
    assert by_cap[CapacityType.SPOT].price_source == SHIPPED_TABLE


def test_plan_json_and_status_name_the_price_source_date_and_zone() -> None:
    result = plan(spec(), CAT)
    assert result.chosen is not None
    out = plan_to_dict(result)
    for c in [out["chosen"], *out["pareto"]]:
        assert c["priceSource"] == SHIPPED_TABLE
        assert c["priceDate"] == CAT.instance(c["instanceType"]).price_date
        assert c["zone"] == ""
    status = plan_status(result, 1, T0)
    assert (status.price_source, status.price_date, status.zone) == (
        SHIPPED_TABLE,
        result.chosen.instance.price_date,
        "",
    )
    assert status.model_dump(by_alias=True)["priceSource"] == SHIPPED_TABLE
