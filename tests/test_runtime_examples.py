"""The TrainingJob examples run the example trainer: image, command and the recipe that builds it agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "examples" / "train" / "Dockerfile"
IMAGE = "ghcr.io/gpuscaler/train-example:0.1.0"


@pytest.mark.parametrize("name", ["bert-8gpu", "cnn-1gpu", "llama-7b-spot"])
def test_example_jobs_launch_the_example_trainer_under_torchrun(name: str) -> None:
    job = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    command = container["command"]
    assert command[0] == "torchrun" and "/app/train_ddp.py" in command
    for flag in ("--nnodes=$(WORLD_SIZE)", "--node-rank=$(NODE_RANK)", "--nproc-per-node=$(NPROC_PER_NODE)"):
        assert flag in command


def test_the_recipe_builds_that_image_with_the_pinned_torch_and_the_script() -> None:
    text = DOCKERFILE.read_text()
    assert IMAGE in text  # the build command in its header
    assert re.search(r"^COPY examples/train/train_ddp.py /app/train_ddp.py$", text, re.M)
    assert '["train"]' in text and 'startswith("torch==")' in text  # torch from the pinned extra
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert any(p.startswith("torch==") for p in pins)
    assert (ROOT / "examples" / "train" / "train_ddp.py").is_file()
