"""The e2e suite's shards (``e2e/shards.py``, ``pytest e2e --shard K/N``): every module in exactly one
shard, the same split whatever the collection order, balanced by measured duration."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_shards_under_test", ROOT / "e2e" / "shards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shards = _load()
MODULES = sorted(p.name for p in (ROOT / "e2e").glob("test_*.py"))


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_module_is_in_exactly_one_shard(n: int) -> None:
    dealt = shards.deal(MODULES, n)
    assert len(dealt) == n
    flat = [m for shard in dealt for m in shard]
    assert sorted(flat) == MODULES  # none lost, none twice
    assert all(dealt), "a shard with no module (the suite has more modules than shards)"


def test_the_split_does_not_depend_on_the_collection_order() -> None:
    shuffled = list(MODULES)
    random.Random(7).shuffle(shuffled)
    assert shards.deal(shuffled, 2) == shards.deal(MODULES, 2)
    assert shards.deal(MODULES + MODULES[:3], 2) == shards.deal(MODULES, 2)  # one module per test item


def test_the_shards_are_balanced_by_measured_duration() -> None:
    """Longest first onto the least loaded: no shard exceeds another by more than the longest module."""

    def seconds(m: str) -> float:
        return float(shards.SECONDS.get(m, shards.UNMEASURED_S))

    for n in (2, 3):
        loads = [sum(seconds(m) for m in shard) for shard in shards.deal(MODULES, n)]
        assert max(loads) - min(loads) <= max(seconds(m) for m in MODULES), loads
    # the three longest modules (each about 5 minutes) are not all in one of two shards
    longest = sorted(MODULES, key=seconds, reverse=True)[:3]
    assert not any(set(longest) <= set(shard) for shard in shards.deal(MODULES, 2))


@pytest.mark.parametrize("value", ["1/2", " 2/2 ", "3/5"])
def test_shard_values_parse(value: str) -> None:
    k, n = shards.parse(value)
    assert (k, n) == tuple(int(x) for x in value.strip().split("/"))


@pytest.mark.parametrize("value", ["0/2", "3/2", "1/0", "1", "a/b", "1/2/3", "-1/2", ""])
def test_bad_shard_values_say_what_is_expected(value: str) -> None:
    with pytest.raises(ValueError, match=r"--shard .*expected K/N with 1 <= K <= N, e\.g\. --shard 1/2"):
        shards.parse(value)
