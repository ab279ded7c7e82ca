"""Splitting the e2e suite into shards that run at once, each on its own dev cluster (``--shard K/N``).

The e2e suite mostly waits (on the API server, kwok's delays, checkpoint intervals, a capacity
block's window): run alone on the 2-core CI machine it kept the load average under 1 for its
30 minutes. ``scripts/test.sh`` therefore runs it as ``E2E_SHARDS`` (2) pytest sessions side by
side, ``pytest e2e --shard K/N`` for K = 1..N, each starting its own private dev cluster
(``conftest.dev_cluster``: a name of its own, free ports). A shard is a set of whole modules, so
module-scoped fixtures (test_kueue.py's cluster with Kueue and JobSet) are started once, and every
test runs in exactly one shard.

Modules are dealt by their measured duration (:data:`SECONDS`), longest first, each to the shard
with the least so far (the LPT rule: within 4/3 of the best split); a module not in the table
counts :data:`UNMEASURED_S`. The table only balances the shards: a stale figure makes them uneven,
never skips a test.
"""

from __future__ import annotations

import re

SECONDS: dict[str, float] = {
    "test_spot.py": 328,
    "test_capacity_block.py": 318,
    "test_performance_profiles.py": 206,
    "test_kueue.py": 178,
    "test_observe.py": 159,
    "test_dev_cluster_workers.py": 155,
    "test_operator.py": 72,
    "test_karpenter_operator.py": 71,
    "test_early_correction.py": 68,
    "test_live_prices.py": 51,
    "test_worker_admission.py": 54,
    "test_karpenter_kwok.py": 76,
    "test_worker_rbac.py": 27,
    "test_helm_install.py": 32,
    "test_any_cluster.py": 25,
    "test_examples_applied.py": 18,
    "test_invalid_spec.py": 18,
    "test_nodes.py": 19,
    "test_zones_kwok.py": 15,
    "test_policy_budget.py": 15,
    "test_providers_crds.py": 11,
    "test_capacity_karpenter.py": 11,
    "test_kind_manifests.py": 15,
    "test_jobs_gc.py": 14,
    "test_devcluster_up.py": 10,
    "test_scheduling.py": 8,
    "test_tools.py": 7,
}
"""Seconds each module took alone (``pytest e2e/MODULE --durations=0``), on the 2-core machine beside
other work, 2026-12-07, at the newest commit measured (b8d4ddc, d162ad5; 3c2c756, whose e2e suite
is the same, for the modules measured only there): docs/benchmarks.md, "Per-module e2e durations"."""

UNMEASURED_S = 30.0
"""What a module missing from :data:`SECONDS` counts (about the median module)."""

_SHARD = re.compile(r"^([1-9][0-9]*)/([1-9][0-9]*)$")


def parse(value: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)`` with ``1 <= K <= N``.

    Raises:
        ValueError: with the value and the expected form.
    """
    m = _SHARD.match(value.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {value!r}: expected K/N with 1 <= K <= N, e.g. --shard 1/2")
    return int(m.group(1)), int(m.group(2))


def deal(modules: list[str], n: int) -> list[list[str]]:
    """The modules of each of ``n`` shards (by file name), longest first onto the least loaded.

    Ties go to the lower shard, and modules of equal duration are dealt by name, so every
    session computes the same split from the same modules.

    Args:
        modules: File names (``test_x.py``) of the collected modules.
        n: The number of shards (>= 1).

    Returns:
        ``n`` lists of module names; together they hold each module exactly once.
    """
    shards: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for module in sorted(set(modules), key=lambda m: (-SECONDS.get(m, UNMEASURED_S), m)):
        k = min(range(n), key=lambda i: (load[i], i))
        shards[k].append(module)
        load[k] += SECONDS.get(module, UNMEASURED_S)
    return shards
