"""Held capacity replayed by the simulator's engine (gpuscaler.simulator.pools): every strategy sees the
same pools; gpuscaler plans into them, ``when-it-fits`` (and every other strategy) lands on a pool only
when its own plan happens to fit it; a block's end is a planned move after a checkpoint; flex-start's
delay is drawn once per request, the same under every strategy; the books balance."""

from __future__ import annotations

import math
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.planner import plan, resolve
from gpuscaler.planner.held import margin_s
from gpuscaler.policy import Policy, load_policy
from gpuscaler.simulator import CloudModel, compare
from gpuscaler.simulator.engine import JobOutcome, Segment, SimulationResult
from gpuscaler.simulator.pools import HeldPools, flex_delay_h, held_policy
from gpuscaler.simulator.registry import ALL_STRATEGIES
from gpuscaler.simulator.trace import DEFAULT_START, Trace, TraceError, TraceJob, load_trace

CATALOG = load_catalog()
QUIET = CloudModel(interruption_scale=0.0, shortage_scale=0.0, provisioning_jitter=0.0)
RESNET = TrainingJobSpec.model_validate(
    {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 90}, "maxDuration": "48h",
     "constraints": {"providers": ["aws"]}}
)  # fmt: skip


def at(hours: float) -> str:
    return (DEFAULT_START + timedelta(hours=hours)).isoformat()


def policy(*pools: dict[str, Any]) -> Policy:
    return Policy.model_validate({"name": "team", "capacity": list(pools)})


RESERVED = {"name": "team-h100", "type": "reserved", "instanceType": "p5.48xlarge", "count": 1}
BLOCK = {"name": "blk", "type": "capacityBlock", "instanceType": "p5.48xlarge", "count": 1,
         "start": at(0.0), "end": at(1.0)}  # fmt: skip
FLEX = {"name": "flex", "type": "flexStart", "instanceType": "p5.48xlarge", "count": 1, "usdPerHour": 1.0,
        "startDelay": {"p50Minutes": 30, "p90Minutes": 120}}  # fmt: skip


def trace(*jobs: tuple[str, float, TrainingJobSpec]) -> Trace:
    return Trace("t", tuple(TraceJob(n, a, s) for n, a, s in jobs))


def run(tr: Trace, pol: Policy, strategies: tuple[str, ...], seed: int = 0, **kw: Any) -> dict[str, SimulationResult]:
    cmp = compare(tr, CATALOG, policy=pol, cloud=kw.pop("cloud", QUIET), seed=seed, strategies=strategies, **kw)
    return {r.strategy: r for r in cmp.results}


def test_a_free_reservation_is_used_by_gpuscaler_when_it_fits() -> None:
    res = run(trace(("a", 0.0, RESNET), ("b", 0.5, RESNET)), policy(RESERVED), ("when-it-fits", "gpuscaler"))
    a, b = res["gpuscaler"].outcomes
    assert [s.pool for s in a.segments] == ["team-h100"] and a.cost_usd == 0.0  # paid whether used or not
    assert a.segments[0].capacity is CapacityType.RESERVED and a.status == "finished"
    assert all(s.pool == "" for s in b.segments) and b.cost_usd > 0  # the one node is a's until it finishes
    fits = res["when-it-fits"].outcomes
    assert all(s.pool == "" for o in fits for s in o.segments)  # its cheapest bought plan is no p5: never fits
    assert res["when-it-fits"].outcomes[0].cost_usd > a.cost_usd


def test_when_it_fits_lands_on_a_pool_of_its_plans_type_at_the_pools_price() -> None:
    only_p5 = RESNET.model_copy(update={"constraints": RESNET.constraints.model_copy(update={"instance_types": ["p5.48xlarge"]})})
    res = run(trace(("a", 0.0, only_p5)), policy({**RESERVED, "usdPerHour": 3.0}), ("when-it-fits", "gpuscaler"))
    for r in res.values():
        (seg,) = r.outcomes[0].segments
        assert seg.pool == "team-h100" and seg.usd_per_hour == 3.0 * seg.nodes
        assert r.outcomes[0].cost_usd == pytest.approx((seg.end_h - seg.start_h) * 3.0 * seg.nodes)


def test_a_blocks_end_moves_the_job_after_a_checkpoint_before_it() -> None:
    (out,) = run(trace(("a", 0.0, RESNET)), policy(BLOCK), ("gpuscaler",))["gpuscaler"].outcomes
    first, *rest = out.segments
    assert first.pool == "blk" and first.capacity is CapacityType.CAPACITY_BLOCK and rest
    margin_h = margin_s(first.write_s) / 3600.0
    # asked for at the margin before the end, written, gone before the nodes go: nothing lost
    assert first.end_h == pytest.approx(1.0 - margin_h + first.write_s / 3600.0)
    assert first.end_h < 1.0 and first.lost_s == 0.0 and not first.interrupted and first.samples > 0
    assert all(s.pool == "" for s in rest) and rest[0].start_h == first.end_h
    assert out.status == "finished" and out.moves >= 1 and out.gpu_hours_lost == 0.0
    assert sum(s.samples for s in out.segments) == pytest.approx(resolve(RESNET, CATALOG, "a").total_samples)


def test_flex_start_draws_the_same_delay_under_every_strategy() -> None:
    pol = policy(FLEX)
    pools = HeldPools.of(pol, DEFAULT_START, seed=3)
    z = random.Random("3|a|flex|flex").gauss(0.0, 1.0)
    assert pools.flex_z("a", pol.capacity[0]) == z  # a stream of its own: (seed, job, pool)
    only_p5 = RESNET.model_copy(update={"constraints": RESNET.constraints.model_copy(update={"instance_types": ["p5.48xlarge"]})})
    tr = trace(("a", 2.0, only_p5))
    res = run(tr, pol, ("gpuscaler", "gpuscaler-no-profiles"), seed=3)
    starts = {name: r.outcomes[0].segments[0] for name, r in res.items()}
    assert all(s.pool == "flex" for s in starts.values())
    delay = flex_delay_h(pol.capacity[0], z)
    assert [s.start_h for s in starts.values()] == pytest.approx([2.0 + delay] * 2) and delay > 0
    other = run(tr, pol, ("gpuscaler",), seed=4)["gpuscaler"].outcomes[0].segments[0]
    assert other.start_h != starts["gpuscaler"].start_h  # another seed, another draw


def _held_books(out: JobOutcome, pol: Policy) -> None:
    pools = {p.name: p for p in pol.capacity}
    assert math.isclose(out.cost_usd, sum((s.end_h - s.start_h) * s.usd_per_hour for s in out.segments), abs_tol=1e-9)
    for s in out.segments:
        parts = s.provisioning_s + s.compute_s + s.checkpoint_s + s.idle_s
        assert math.isclose(s.wall_s, parts, rel_tol=1e-9, abs_tol=1e-6)
        if s.pool:
            p = pools[s.pool]
            assert s.usd_per_hour == (p.usd_per_hour or 0.0) * s.nodes and s.capacity is p.capacity
            assert not s.interrupted and s.lost_s == 0.0
            if p.end is not None:  # inside the window (hours from the trace's start)
                assert s.end_h <= (p.end - DEFAULT_START).total_seconds() / 3600.0 + 1e-9


def _never_over(results: list[SimulationResult], pol: Policy) -> None:
    for r in results:
        for p in pol.capacity:
            segs: list[Segment] = [s for o in r.outcomes for s in o.segments if s.pool == p.name]
            for s in segs:  # at each segment's start, the nodes held are within the pool
                held = sum(x.nodes for x in segs if x.start_h <= s.start_h < x.end_h)
                assert held <= p.count, (r.strategy, p.name, s.start_h)


def test_books_balance_with_held_capacity_under_every_strategy() -> None:
    pol = policy({**RESERVED, "count": 2}, {**BLOCK, "count": 2, "start": at(1.0), "end": at(9.0)},
                 {**FLEX, "usdPerHour": 20.0})  # fmt: skip
    jobs = [(f"j{i}", 0.7 * i, RESNET) for i in range(6)]
    cmp = compare(trace(*jobs), CATALOG, policy=pol, cloud=CloudModel(interruption_scale=50.0), seed=1,
                  strategies=ALL_STRATEGIES, throughput_error=0.26, scaling_error=0.1)
    assert any(s.pool for r in cmp.results for o in r.outcomes for s in o.segments)
    for r in cmp.results:
        for o in r.outcomes:
            _held_books(o, pol)
            if o.status == "finished":
                assert sum(s.samples for s in o.segments) == pytest.approx(resolve(RESNET, CATALOG, o.name).total_samples)
    _never_over(cmp.results, pol)
    by = {r.strategy: r for r in cmp.results}
    assert all(o.status == "finished" for o in by["gpuscaler"].outcomes)
    assert sum(o.cost_usd for o in by["gpuscaler"].outcomes) < sum(o.cost_usd for o in by["when-it-fits"].outcomes)


def test_a_trace_declares_held_capacity_as_a_policy_does(tmp_path: Path) -> None:
    body = {"name": "t", "start": DEFAULT_START.isoformat(), "capacity": [RESERVED],
            "jobs": [{"name": "a", "arrivalHours": 0.0, "spec": RESNET.model_dump(mode="json", by_alias=True, exclude_none=True)}]}  # fmt: skip
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(body))
    tr = load_trace(tmp_path / "t.yaml")
    assert [p.name for p in tr.capacity] == ["team-h100"]
    from_trace = run(tr, Policy(), ("gpuscaler",))["gpuscaler"].outcomes[0]
    from_policy = run(trace(("a", 0.0, RESNET)), policy(RESERVED), ("gpuscaler",))["gpuscaler"].outcomes[0]
    assert [s.pool for s in from_trace.segments] == [s.pool for s in from_policy.segments] == ["team-h100"]
    assert held_policy(policy(RESERVED), tr) == policy(RESERVED)  # the same pool twice is one pool
    with pytest.raises(TraceError, match="declared differently by the trace and the policy"):
        held_policy(policy({**RESERVED, "count": 3}), tr)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**body, "capacity": [{**RESERVED, "count": 0}]}))
    with pytest.raises(TraceError, match=r"capacity\[0\] is invalid: count"):
        load_trace(tmp_path / "bad.yaml")


def test_a_job_that_fits_a_block_only_at_its_expected_speed_still_plans() -> None:
    """A segmented plan with nothing left after the window is refused, not an error that leaves the job unplanned."""
    root = Path(__file__).resolve().parents[1]
    tr = load_trace(root / "examples" / "traces" / "production-month.yaml")
    pol = load_policy(root / "examples" / "policies" / "production-month-held.yaml")
    job = next(j for j in tr.jobs if j.name == "weekly-bert-pretrain-d05")
    r = plan(job.spec, CATALOG, pol, name=job.name, now=tr.start + timedelta(hours=job.arrival_h), held_in_use={})
    assert r.ok and r.chosen is not None, r.why


@pytest.mark.parametrize("name", ["research-week-held.yaml", "production-month-held.yaml"])
def test_the_example_policies_declare_the_pools_they_say(name: str) -> None:
    path = Path(__file__).resolve().parents[1] / "examples" / "policies" / name
    (line,) = [x for x in path.read_text().splitlines() if x.startswith("# expect:")]
    assert len(load_policy(path).capacity) == int(line.split("pools=")[1])


def test_a_job_planned_into_a_block_not_open_yet_waits_for_it_without_cost() -> None:
    later = {**BLOCK, "start": at(2.0), "end": at(30.0)}
    (out,) = run(trace(("a", 0.5, RESNET)), policy(later), ("gpuscaler",))["gpuscaler"].outcomes
    assert out.segments[0].pool == "blk" and out.segments[0].start_h == pytest.approx(2.0)
    assert out.cost_usd == 0.0 and out.status == "finished"
