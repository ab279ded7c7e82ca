"""The planner's answers stay what they were: every case of :mod:`plan_cases` against the golden file.

``tests/data/plans_golden.json.gz`` holds the answers of the planner as it stood before it became
named stages with reason codes (how it is made: :mod:`plan_cases`). Every field ``gpuscaler plan
--json`` prints is compared (chosen plan, why, Pareto front, every rejection with its category and
reason, hints, caveats, the number of configurations evaluated) and the order of all feasible plans.
A deliberate change of plans (the performance model, the catalog) rewrites the file; a refactor must not.
"""

from __future__ import annotations

from typing import Any

import pytest

from plan_cases import answer, cases, golden

GOLDEN = golden()
CASES = cases()


def first_difference(old: Any, new: Any, where: str = "") -> str:
    """Where two JSON values first differ, as a path with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if old.get(key, "<missing>") != new.get(key, "<missing>"):
                return first_difference(old.get(key, "<missing>"), new.get(key, "<missing>"), f"{where}.{key}")
    if isinstance(old, list) and isinstance(new, list):
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            if a != b:
                return first_difference(a, b, f"{where}[{i}]")
        if len(old) != len(new):
            return f"{where}: {len(old)} items before, {len(new)} now"
    return f"{where}: {old!r} before, {new!r} now"


def test_the_cases_are_the_golden_cases() -> None:
    assert sorted(CASES) == sorted(GOLDEN)
    assert len(CASES) >= 40
    outcomes = {v["feasible"] for v in GOLDEN.values()}
    categories = {r["category"] for v in GOLDEN.values() for r in v["rejected"]}
    assert outcomes == {True, False}
    assert {"constraint", "policy", "memory", "batch", "precision", "deadline", "budget", "price", "capacity"} <= categories


@pytest.mark.parametrize("name", sorted(CASES))
def test_plans_are_unchanged(name: str) -> None:
    new = answer(*CASES[name])
    old = GOLDEN[name]
    assert new == old, first_difference(old, new)
