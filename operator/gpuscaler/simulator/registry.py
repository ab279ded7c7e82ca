"""The strategies by name: the default comparison, the optional ones, and their constructors.

Default, in table order (the first is the baseline of the savings column):

* ``ondemand-best``, ``managed-spot``, ``managed-spot-padded``, ``uniform-progress``: what a
  careful team would run (:mod:`gpuscaler.simulator.baselines`);
* ``ondemand-8xa100``: the on-demand 8 x A100 fp32 habit, kept as a reference;
* ``managed-spot-padded+correction``: the ablation, ``managed-spot-padded`` with the operator's
  correction loop (what gpuscaler adds beyond it is the planner's risk model and the handshake);
* ``gpuscaler``.

Optional (``--strategies``): ``gpuscaler-no-profiles`` (gpuscaler without performance profiles: what
they buy), ``when-it-fits`` (gpuscaler's plans bought by the hour, on a policy's held capacity only
when a plan happens to fit a pool: Karpenter's behaviour, what planning into it saves against),
``cheapest-fits`` (no performance model) and the naive spot
strategies that plan with the deadline removed, ``deadline-blind-spot-restart`` and
``deadline-blind-spot-checkpoint`` (:mod:`gpuscaler.simulator.strategies`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuscaler.catalog import Catalog
from gpuscaler.simulator.baselines import (
    ManagedSpot,
    ManagedSpotPadded,
    ManagedSpotPaddedCorrection,
    OnDemandBest,
    UniformProgress,
)
from gpuscaler.simulator.strategies import (
    CheapestFits,
    Gpuscaler,
    OnDemandFixed,
    SpotCheckpoint,
    SpotRestart,
    Strategy,
)

STRATEGIES = ("ondemand-best", "managed-spot", "managed-spot-padded", "uniform-progress", "ondemand-8xa100",
              "managed-spot-padded+correction", "gpuscaler")
"""The default comparison."""
OPTIONAL = ("gpuscaler-no-profiles", "when-it-fits", "cheapest-fits", "deadline-blind-spot-restart", "deadline-blind-spot-checkpoint")
ALL_STRATEGIES = STRATEGIES + OPTIONAL
BASELINES = ("ondemand-best", "managed-spot", "managed-spot-padded", "uniform-progress")
"""The careful baselines gpuscaler's targets are measured against."""
STRONGEST = "managed-spot-padded"
"""The strongest careful baseline (issue 36): gpuscaler no dearer, with no more misses, on every trace."""
ABLATION = "managed-spot-padded+correction"
"""The strongest baseline plus the operator's correction loop: what the planner itself adds."""


def make_strategies(catalog: Catalog, names: Sequence[str] = STRATEGIES,
                    checkpoint_interval_s: float = 3600.0) -> list[Strategy]:
    """Fresh strategy objects by name, in the order given (strategies keep per-job state).

    Args:
        catalog: the catalog (``cheapest-fits`` reads it).
        names: strategy names.
        checkpoint_interval_s: the fixed interval of ``deadline-blind-spot-checkpoint``.

    Raises:
        ValueError: an unknown name.
    """
    makers: dict[str, Callable[[], Strategy]] = {
        "ondemand-best": OnDemandBest,
        "managed-spot": ManagedSpot,
        "managed-spot-padded": ManagedSpotPadded,
        "managed-spot-padded+correction": ManagedSpotPaddedCorrection,
        "uniform-progress": UniformProgress,
        "ondemand-8xa100": OnDemandFixed,
        "gpuscaler": Gpuscaler,
        "gpuscaler-no-profiles": lambda: Gpuscaler(profiles=False),
        "when-it-fits": lambda: Gpuscaler(held=False),
        "cheapest-fits": lambda: CheapestFits(catalog),
        "deadline-blind-spot-restart": SpotRestart,
        "deadline-blind-spot-checkpoint": lambda: SpotCheckpoint(checkpoint_interval_s),
    }
    out: list[Strategy] = []
    for n in names:
        if n not in makers:
            raise ValueError(f"unknown strategy {n!r}; choose from {', '.join(ALL_STRATEGIES)}")
        out.append(makers[n]())
    return out
