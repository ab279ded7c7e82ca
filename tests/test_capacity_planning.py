"""Held capacity in plans (gpuscaler.planner.held): a free reservation wins when it fits, a job
twice a capacity block's window runs half in it and checkpoints before its end at the margin from
the checkpoint's write time, and flex-start is refused, with that reason, when its start delay
breaks the deadline risk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.planner import plan
from gpuscaler.planner.candidate import Reason
from gpuscaler.planner.evaluate import STARTUP_S
from gpuscaler.planner.held import MARGIN_SLACK_S, MARGIN_WRITES, margin_s
from gpuscaler.policy import Policy

CATALOG = load_catalog()
NOW = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)
RESNET = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 90}, "maxDuration": "48h"}


def spec(**changes: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({**RESNET, **changes})


def policy(*pools: dict[str, Any]) -> Policy:
    return Policy.model_validate({"name": "team", "capacity": list(pools)})


RESERVED = {"name": "team-h100", "type": "reserved", "instanceType": "p5.48xlarge", "count": 2}


# ------------------------------------------------------------------------------ reserved


def test_a_free_reservation_wins_when_it_fits_at_the_teams_marginal_cost() -> None:
    bought = plan(spec(), CATALOG, Policy(), now=NOW).chosen
    assert bought is not None and bought.capacity is not CapacityType.RESERVED and bought.expected_cost_usd > 0
    r = plan(spec(), CATALOG, policy(RESERVED), now=NOW)
    assert r.chosen is not None and r.chosen.capacity is CapacityType.RESERVED and r.chosen.pool == "team-h100"
    assert r.chosen.expected_cost_usd == 0 and r.chosen.nodes <= 2
    assert "team-h100" in r.why and "$0.00/node-hour, what the team pays at the margin" in r.why
    assert r.chosen.to_dict()["heldCapacity"] == "team-h100"


def test_a_reservation_in_use_or_priced_above_the_market_is_not_taken() -> None:
    r = plan(spec(), CATALOG, policy(RESERVED), now=NOW, held_in_use={"team-h100": 2})
    assert r.chosen is not None and r.chosen.capacity is not CapacityType.RESERVED
    assert any(x.capacity == "reserved" and x.category is Reason.CAPACITY and "in use" in x.reason for x in r.rejected)
    dear = {**RESERVED, "usdPerHour": 500.0}  # a committed-use price above what spot costs
    r = plan(spec(), CATALOG, policy(dear), now=NOW)
    assert r.chosen is not None and r.chosen.capacity is not CapacityType.RESERVED


def test_a_reservation_that_misses_the_deadline_is_not_taken() -> None:
    slow = {**RESERVED, "instanceType": "g4dn.xlarge", "count": 1}  # one T4: far slower than the deadline needs
    r = plan(spec(maxDuration="6h"), CATALOG, policy(slow), now=NOW)
    assert r.chosen is not None and r.chosen.capacity is not CapacityType.RESERVED
    assert any(x.capacity == "reserved" and x.category is Reason.DEADLINE for x in r.rejected)


# ------------------------------------------------------------------------------ capacity blocks


def block(hours: float, count: int = 1, start: datetime = NOW) -> dict[str, Any]:
    return {
        "name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": count,
        "start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat(),
    }  # fmt: skip


def test_a_job_twice_the_blocks_window_runs_half_in_it_and_checkpoints_at_the_margin() -> None:
    # The job's run on the block's one p5 node, unbounded (a reservation of the same node): its hours.
    one = {**RESERVED, "count": 1}
    whole = plan(spec(), CATALOG, policy(one), now=NOW).chosen
    assert whole is not None and whole.pool == "team-h100"
    train_h = whole.outlook.base_hours - STARTUP_S / 3600  # work and checkpoint writes
    margin = margin_s(whole.checkpoint_write_s)
    assert margin == MARGIN_WRITES * whole.checkpoint_write_s + MARGIN_SLACK_S  # from the write time, not 40 min
    window_h = STARTUP_S / 3600 + train_h / 2 + margin / 3600  # half the job's training fits
    r = plan(spec(), CATALOG, policy(block(window_h)), now=NOW)
    c = r.chosen
    assert c is not None and c.capacity is CapacityType.CAPACITY_BLOCK and len(c.segments) == 2, r.why
    first, rest = c.segments
    total = whole.work_hours * whole.estimate.throughput * 3600
    assert first.samples == pytest.approx(total / 2, abs=256) and first.samples + rest.samples == pytest.approx(total, abs=1)
    assert first.checkpoint_at_h == pytest.approx(window_h - margin / 3600)
    assert first.margin_s == pytest.approx(margin) and first.cost_usd == 0
    assert rest.start_h == pytest.approx(window_h) and rest.capacity is not CapacityType.CAPACITY_BLOCK
    assert c.expected_cost_usd == pytest.approx(rest.cost_usd) and rest.cost_usd > 0
    assert c.outlook.deadline_miss_probability <= 0.05  # the whole plan within the deadline risk
    assert "checkpoint" in r.why and "before its end" in r.why
    assert [s["capacityType"] for s in c.to_dict()["segments"]] == ["capacity-block", rest.capacity.value]  # type: ignore[index]


def test_a_job_that_fits_the_window_runs_in_it_in_one_piece_and_a_closed_block_is_not_planned() -> None:
    c = plan(spec(), CATALOG, policy(block(24)), now=NOW).chosen
    assert c is not None and c.capacity is CapacityType.CAPACITY_BLOCK and c.segments == () and c.expected_cost_usd == 0
    r = plan(spec(), CATALOG, policy(block(2, start=NOW - timedelta(hours=3))), now=NOW)
    assert r.chosen is not None and r.chosen.capacity is not CapacityType.CAPACITY_BLOCK
    assert any(x.capacity == "capacity-block" and "closed" in x.reason for x in r.rejected)


def test_a_later_block_waits_for_its_window_within_the_deadline() -> None:
    later = plan(spec(), CATALOG, policy(block(24, start=NOW + timedelta(hours=3))), now=NOW).chosen
    assert later is not None and later.capacity is CapacityType.CAPACITY_BLOCK
    assert later.expected_hours > 3  # the wait counts against the deadline
    too_late = plan(spec(maxDuration="4h"), CATALOG, policy(block(24, start=NOW + timedelta(hours=3.9))), now=NOW)
    assert too_late.chosen is None or too_late.chosen.capacity is not CapacityType.CAPACITY_BLOCK


# ------------------------------------------------------------------------------ flex-start


def flex(p50: float, p90: float) -> dict[str, Any]:
    return {
        "name": "flex", "type": "flexStart", "instanceType": "p4d.24xlarge", "count": 1, "usdPerHour": 1.0,
        "startDelay": {"p50Minutes": p50, "p90Minutes": p90},
    }  # fmt: skip


ONLY_P4D = {"instanceTypes": ["p4d.24xlarge"], "spot": "never", "maxDeadlineRisk": 0.05}


def test_flex_start_is_chosen_when_its_delay_still_meets_the_deadline_risk() -> None:
    r = plan(spec(maxDuration="12h", constraints=ONLY_P4D), CATALOG, policy(flex(10, 30)), now=NOW)
    assert r.chosen is not None and r.chosen.capacity is CapacityType.FLEX_START
    assert r.chosen.expected_hours > r.chosen.outlook.base_hours  # the mean delay is in the hours


def test_a_flex_start_delay_beyond_the_deadline_risk_is_refused_with_that_reason() -> None:
    on_demand = plan(spec(maxDuration="12h", constraints=ONLY_P4D), CATALOG, Policy(), now=NOW).chosen
    assert on_demand is not None
    hours = on_demand.expected_hours
    # a P50 delay that leaves the job past its deadline half the time
    r = plan(spec(maxDuration="12h", constraints=ONLY_P4D), CATALOG, policy(flex((12 - hours) * 60, 24 * 60)), now=NOW)
    assert r.chosen is not None and r.chosen.capacity is CapacityType.ON_DEMAND
    (why,) = [x for x in r.rejected if x.capacity == "flex-start"]
    assert why.category is Reason.DEADLINE and "start delay" in why.reason and "maxDeadlineRisk 5%" in why.reason


def test_a_flex_start_run_beyond_its_max_run_time_is_refused() -> None:
    short = {**flex(1, 2), "maxRunHours": 0.1}
    r = plan(spec(constraints=ONLY_P4D), CATALOG, policy(short), now=NOW)
    (why,) = [x for x in r.rejected if x.capacity == "flex-start"]
    assert "flex-start's 0.1 h limit" in why.reason


# ------------------------------------------------------------------------------ declarations


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({"name": "b", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1}, "needs start and end"),
        ({**block(1), "end": NOW.isoformat()}, "is not after start"),
        ({"name": "f", "type": "flexStart", "instanceType": "p5.48xlarge", "count": 1}, "needs startDelay"),
        ({**flex(60, 30)}, "p90Minutes 30 < p50Minutes 60"),
        ({**RESERVED, "start": NOW.isoformat()}, "usable now"),
        ({**block(1), "start": "2026-12-06T17:00:00"}, "time zone"),
        ({**RESERVED, "count": 0}, "greater than or equal to 1"),
    ],
)
def test_a_bad_declaration_says_what_is_wrong(pool: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        policy(pool)


def test_pool_names_are_unique_and_the_catalog_prices_no_held_capacity() -> None:
    with pytest.raises(ValidationError, match="unique"):
        policy(RESERVED, RESERVED)
    p5 = CATALOG.instance("p5.48xlarge")
    assert [p5.price(c) for c in (CapacityType.RESERVED, CapacityType.CAPACITY_BLOCK, CapacityType.FLEX_START)] == [None] * 3
