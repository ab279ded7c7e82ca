"""The operator's plan cache: identical planning inputs plan once; any input that differs plans again."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import Catalog, load_catalog
from gpuscaler.controller.plan_cache import DEADLINE_STEP_H, PlanCache, planned_deadline
from gpuscaler.planner import PlanResult, plan
from gpuscaler.policy import Policy

CATALOG = load_catalog()
SPEC = TrainingJobSpec.model_validate(
    {
        "workload": {"model": "resnet50"},
        "globalBatch": 256,
        "training": {"epochs": 1},
        "constraints": {"instanceTypes": ["p3.2xlarge", "p3.8xlarge"], "spot": "never"},
    }
)


class Counting:
    """The real planner, counting its calls and the deadlines it was given."""

    def __init__(self) -> None:
        self.calls = 0
        self.deadlines: list[float | None] = []

    def __call__(
        self, spec: TrainingJobSpec, catalog: Catalog, policy: Policy | None = None, **kw: Any
    ) -> PlanResult:
        self.calls += 1
        self.deadlines.append(kw.get("deadline_h"))
        return plan(spec, catalog, policy, **kw)


def test_identical_specs_plan_once_and_each_result_carries_its_jobs_name() -> None:
    fn = Counting()
    cache = PlanCache(8, fn)
    results = [cache.plan(SPEC, CATALOG, Policy(), name=f"job-{i}") for i in range(20)]
    assert fn.calls == 1 and (cache.hits, cache.misses) == (19, 1)
    assert [r.job.name for r in results] == [f"job-{i}" for i in range(20)]
    direct = plan(SPEC, CATALOG, Policy(), name="job-7")
    assert results[7].chosen is not None and direct.chosen is not None
    assert results[7].chosen.label == direct.chosen.label and results[7].why == direct.why


@pytest.mark.parametrize(
    "change",
    [
        {"spec": SPEC.model_copy(update={"global_batch": 512})},
        {"policy": Policy.model_validate({"name": "lab", "maxGpusPerJob": 1})},
        {"deadline_h": 5.0},
        {"unavailable": frozenset({("p3.2xlarge", "on-demand")})},
        {"efficiency": {"V100-16GB": 0.8}},
        {"catalog": copy.copy(CATALOG)},  # another catalog (other prices): not the same plan
    ],
)
def test_any_other_input_plans_again(change: dict[str, Any]) -> None:
    fn = Counting()
    cache = PlanCache(8, fn)
    base: dict[str, Any] = {"spec": SPEC, "catalog": CATALOG, "policy": Policy(), "deadline_h": 10.0}
    cache.plan(base["spec"], base["catalog"], base["policy"], deadline_h=base["deadline_h"])
    args = {**base, **change}
    cache.plan(
        args["spec"],
        args["catalog"],
        args["policy"],
        deadline_h=args["deadline_h"],
        unavailable=args.get("unavailable", frozenset()),
        efficiency=args.get("efficiency"),
    )
    assert fn.calls == 2


def test_deadline_is_planned_rounded_down_to_the_step() -> None:
    fn = Counting()
    cache = PlanCache(8, fn)
    cache.plan(SPEC, CATALOG, deadline_h=10.0 + 0.2 * DEADLINE_STEP_H)
    cache.plan(SPEC, CATALOG, deadline_h=10.0 + 0.9 * DEADLINE_STEP_H)  # same minute: a hit
    assert fn.calls == 1 and fn.deadlines == [pytest.approx(10.0)]
    assert planned_deadline(None) is None
    assert planned_deadline(0.01) == 0.01  # under one step: kept as it is, never 0
    assert (planned_deadline(3.999) or 0) <= 3.999  # never more time than the job has


def test_least_recently_used_goes_first_and_size_zero_caches_nothing() -> None:
    fn = Counting()
    cache = PlanCache(2, fn)
    specs = [SPEC.model_copy(update={"global_batch": b}) for b in (128, 256, 512)]
    cache.plan(specs[0], CATALOG)
    cache.plan(specs[1], CATALOG)
    cache.plan(specs[0], CATALOG)  # 0 is now the most recent
    cache.plan(specs[2], CATALOG)  # evicts 1
    assert len(cache) == 2 and fn.calls == 3
    cache.plan(specs[0], CATALOG)
    assert fn.calls == 3
    cache.plan(specs[1], CATALOG)
    assert fn.calls == 4
    off = PlanCache(0, fn)
    off.plan(SPEC, CATALOG)
    off.plan(SPEC, CATALOG)
    assert fn.calls == 6 and len(off) == 0
    with pytest.raises(ValueError, match="at least 0"):
        PlanCache(-1)


def test_a_planner_error_is_not_cached() -> None:
    calls = []

    def failing(*a: Any, **kw: Any) -> PlanResult:
        calls.append(1)
        raise RuntimeError("no")

    cache = PlanCache(4, failing)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            cache.plan(SPEC, CATALOG)
    assert len(calls) == 2 and len(cache) == 0


def test_the_policy_gate_plans_through_the_cache_and_still_checks_every_job() -> None:
    from gpuscaler.controller.policy import Governance, PolicyViolationError, gated_plan
    from gpuscaler.policy import NamespaceUsage

    fn = Counting()
    cache = PlanCache(8, fn)
    for name in ("a", "b", "c"):
        got = gated_plan(SPEC, name, None, frozenset(), catalog=CATALOG, plan_fn=cache.plan)
        assert got.job.name == name and got.chosen is not None
    assert fn.calls == 1
    capped = Governance(Policy.model_validate({"name": "lab", "maxGpusPerNamespace": 1}), NamespaceUsage(gpus=1))
    with pytest.raises(PolicyViolationError, match="maxGpusPerNamespace"):  # the cap is checked per job, hit or not
        gated_plan(SPEC, "d", None, frozenset(), governance=capped, catalog=CATALOG, plan_fn=cache.plan)
