"""The catalog's kernels per micro-batch are what ``scripts/kernel_counts.py`` counts in real PyTorch
(torch, torchvision and transformers of the ``train`` extra, on CPU)."""

from __future__ import annotations

from types import ModuleType

import pytest

import repo_scripts
from runtime_torch_support import need

need("torch")
need("torchvision")
need("transformers")


def _script() -> ModuleType:
    return repo_scripts.load("scripts/kernel_counts.py", "kernel_counts")


COUNTED = [
    "resnet50",
    "resnext101-32x4d",
    "se-resnext101-32x4d",
    "efficientnet-b0",
    "efficientnet-b4",
    "efficientnet-v2-s",
    "ssd300",
    "bert-large-pretrain",
    "bert-large-squad",
    "bert-base-squad",
    "electra-base-squad",
    "gpt2-small",
    "llama-7b",
]
"""Every counted workload but Mask R-CNN (its own test below): ``kernel_counts.py --check`` in the suite."""


def test_every_counted_workload_is_here() -> None:
    assert sorted([*COUNTED, "maskrcnn"]) == sorted(_script().models())


@pytest.mark.parametrize("name", COUNTED)
def test_the_catalog_figures_are_the_counted_kernels(name: str) -> None:
    m = _script()
    fixed, per_item = m.measure(name)
    assert m.catalog_drift(name, fixed, per_item) == []


def test_detection_launches_more_per_image_and_the_count_is_reproducible() -> None:
    """Mask R-CNN's count depends on its proposals, so on the weights: the script seeds them."""
    m = _script()
    first = m.measure("maskrcnn")
    assert first[1] > 50  # per-image loops in torchvision's detection heads and losses
    assert m.catalog_drift("maskrcnn", *first) == []
    assert m.measure("maskrcnn") == first


def test_a_deeper_network_launches_more_kernels() -> None:
    m = _script()
    assert m.measure("resnext101-32x4d")[0] > m.measure("resnet50")[0] * 1.5


def test_check_names_the_workload_whose_catalog_figure_is_stale() -> None:
    m = _script()
    drift = m.catalog_drift("bert-large-pretrain", 1000, 0.0)
    assert [line.split(":")[0] for line in drift] == ["bert-large-seq128", "bert-large-seq512"]
    assert "counted 1000" in drift[0]


def test_an_unknown_workload_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _script().main(["resnet-5o"])
    assert exit_info.value.code == 2
    assert "unknown workload(s) resnet-5o" in capsys.readouterr().err
