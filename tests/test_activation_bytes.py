"""``scripts/activation_bytes.py`` measures what autograd keeps for the backward pass (real torch on CPU)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

import repo_scripts
from runtime_torch_support import need

need("torch")
need("torchvision")


def _script() -> ModuleType:
    return repo_scripts.load("scripts/activation_bytes.py", "activation_bytes")


def test_saved_inputs_count_and_weights_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """A linear layer saves its input for the weight gradient (2 x 1,000 fp32 = 8,000 bytes), and its
    weight, which is a parameter and not activation memory: 8,000 / 2 (16 bits) / 2 items."""
    import torch

    script = _script()

    def build() -> tuple[Any, Any]:
        model = torch.nn.Linear(1000, 1000)

        def batch(b: int) -> Any:
            return (torch.rand(b, 1000),), lambda out: out.sum()

        return model, batch

    monkeypatch.setattr(script, "models", lambda: {"linear": build})
    assert script.measure("linear") == 2000.0


def test_the_measurement_is_per_item(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()
    at2 = script.measure("resnet50")
    monkeypatch.setattr(script, "MICRO_BATCH", 4)
    assert script.measure("resnet50") == pytest.approx(at2, rel=0.01)


@pytest.mark.parametrize("name", sorted(_script().models()))
def test_the_catalog_figures_are_the_measured_activations(name: str) -> None:
    """``activation_bytes.py --check`` for one workload (and the workloads that share its figure)."""
    script = _script()
    got = script.measure(name)
    catalog = script.catalog_figures()
    for wid in script.SHARED.get(name, (name,)):
        assert abs(catalog[wid] / got - 1) <= script.TOLERANCE, (wid, catalog[wid], got)
