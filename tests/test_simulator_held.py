"""What planning into held capacity saves against using it only when a job happens to fit it
(gpuscaler.simulator.held): both ways see the same pools, each keeps its own record of what is taken."""

from __future__ import annotations

from datetime import timedelta

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import load_catalog
from gpuscaler.policy import Policy
from gpuscaler.simulator.held import compare_held
from gpuscaler.simulator.trace import DEFAULT_START, Trace, TraceJob

CATALOG = load_catalog()
RESNET = TrainingJobSpec.model_validate(
    {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 90}, "maxDuration": "48h"}
)
POOLS = Policy.model_validate({"name": "team", "capacity": [
    {"name": "team-h100", "type": "reserved", "instanceType": "p5.48xlarge", "count": 1},
    {"name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1,
     "start": (DEFAULT_START + timedelta(hours=1)).isoformat(), "end": (DEFAULT_START + timedelta(hours=30)).isoformat()},
]})  # fmt: skip


def trace(*arrivals: float) -> Trace:
    return Trace("t", tuple(TraceJob(f"j{i}", a, RESNET) for i, a in enumerate(arrivals)))


def test_planning_into_held_capacity_saves_what_the_jobs_would_have_bought() -> None:
    cmp = compare_held(trace(0.0, 0.5, 2.0), CATALOG, POOLS)
    planned = [r for r in cmp.rows if r.way == "planned"]
    fits = [r for r in cmp.rows if r.way == "when-it-fits"]
    # j1 finds the reservation taken and waits half an hour for the block; j2 finds both taken
    assert [r.pool for r in planned] == ["team-h100", "blk", ""]
    assert cmp.on_held("when-it-fits") == 0  # the cheapest bought plan is no p5: it never happens to fit
    assert all(r.cost_usd > 0 for r in fits) and planned[0].cost_usd == 0 == planned[1].cost_usd
    assert cmp.saving_usd == cmp.total("when-it-fits") - cmp.total("planned") > 0


def test_when_the_bought_plan_is_the_pools_type_it_fits_too() -> None:
    only_p5 = RESNET.model_copy(update={"constraints": RESNET.constraints.model_copy(update={"instance_types": ["p5.48xlarge"]})})
    cmp = compare_held(Trace("t", (TraceJob("a", 0.0, only_p5),)), CATALOG, POOLS)
    assert {r.way: r.pool for r in cmp.rows} == {"planned": "team-h100", "when-it-fits": "team-h100"}
    assert cmp.saving_usd == 0
