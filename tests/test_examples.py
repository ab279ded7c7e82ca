"""Every file in ``examples/`` does what it says: each carries an ``# expect:`` line, and this test checks it.

Like kopf's ``tests/e2e/test_examples.py``, the expectation lives in the example, not here:

- a TrainingJob (``examples/*.yaml``): ``feasible`` or ``infeasible`` and ``key=value`` pairs of
  the chosen plan as ``gpuscaler plan --json`` prints them (``gpus``, ``gpuType``,
  ``capacityType``, ``provider``, ...). The file is planned through the CLI, and a feasible plan
  must also keep what the spec itself asks (deadline, budget, GPU bounds, providers, spot);
- a trace (``examples/traces/*``): ``jobs=N plannable=M``, each job planned alone at its arrival;
- the training image (``examples/train/Dockerfile``): ``image=`` and ``script=``, which every
  TrainingJob example with a pod template must run;
- the training script (``examples/train/train_ddp.py``): ``run-by=`` the test that runs it.

The e2e suite applies the TrainingJob examples to the dev cluster (``e2e/test_examples_applied.py``).
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from gpuscaler.api import TrainingJob
from gpuscaler.catalog import load_catalog
from gpuscaler.cli import EXIT_INFEASIBLE, EXIT_OK, main
from gpuscaler.planner import plan
from gpuscaler.simulator.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXPECT = re.compile(r"^(?:#|//)\s*expect:\s*(?P<body>[^(\n]*)", re.M)


def expectation(path: Path) -> tuple[set[str], dict[str, str]]:
    """The words and ``key=value`` pairs of the file's ``# expect:`` line."""
    found = EXPECT.findall(path.read_text())
    assert len(found) == 1, f"{path.relative_to(ROOT)}: needs exactly one '# expect:' line, has {len(found)}"
    tokens = shlex.split(found[0])
    pairs = dict(t.split("=", 1) for t in tokens if "=" in t)
    return {t for t in tokens if "=" not in t}, pairs


def every_file() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def training_jobs() -> list[Path]:
    return [p for p in every_file() if p.parent == EXAMPLES and p.suffix == ".yaml"]


def test_every_example_says_what_to_expect() -> None:
    files = every_file()
    assert len(files) >= 9
    for path in files:
        expectation(path)


@pytest.mark.parametrize("path", training_jobs(), ids=lambda p: p.name)
def test_training_job_example_plans_as_it_says(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    words, pairs = expectation(path)
    assert words in ({"feasible"}, {"infeasible"}), words
    code = main(["plan", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (EXIT_OK if "feasible" in words else EXIT_INFEASIBLE)
    assert out["feasible"] is ("feasible" in words)
    if not out["feasible"]:
        assert out["hints"]
        return
    chosen = out["chosen"]
    for key, value in pairs.items():
        assert str(chosen[key]) == value, f"{path.name}: chosen {key} {chosen[key]!r}, the example says {value!r}"
    spec = TrainingJob.model_validate(yaml.safe_load(path.read_text())).spec
    c = spec.constraints
    if out["job"]["deadlineHours"] is not None:
        assert chosen["deadlineMissProbability"] <= c.max_deadline_risk
    if spec.budget_usd is not None:
        assert chosen["expectedCostUsd"] <= spec.budget_usd
    assert c.min_gpus <= chosen["gpus"] <= (c.max_gpus or chosen["gpus"])
    assert not c.providers or chosen["provider"] in c.providers
    assert c.spot.value != "never" or chosen["capacityType"] == "on-demand"


@pytest.mark.parametrize("path", sorted((EXAMPLES / "traces").iterdir()), ids=lambda p: p.name)
def test_trace_example_jobs_plan_as_it_says(path: Path) -> None:
    _, pairs = expectation(path)
    trace = load_trace(path)
    catalog = load_catalog()
    plannable = sum(
        plan(job.spec, catalog, name=job.name, now=trace.start + timedelta(hours=job.arrival_h)).ok
        for job in trace.jobs
    )
    assert (len(trace.jobs), plannable) == (int(pairs["jobs"]), int(pairs["plannable"]))


def test_training_jobs_run_the_example_image_and_script() -> None:
    _, image = expectation(EXAMPLES / "train" / "Dockerfile")
    dockerfile = (EXAMPLES / "train" / "Dockerfile").read_text()
    assert f"-t {image['image']} " in dockerfile  # the build command in its header
    assert re.search(rf"^COPY examples/train/train_ddp.py {re.escape(image['script'])}$", dockerfile, re.M)
    scripts = set(re.findall(r"^COPY examples/train/\S+\.py (/app/\S+)$", dockerfile, re.M))
    assert image["script"] in scripts and "/app/demo_train.py" in scripts
    with_template = 0
    for path in training_jobs():
        template = yaml.safe_load(path.read_text())["spec"].get("template")
        if template is None:  # the operator's default worker (GPUSCALER_DEFAULT_IMAGE)
            continue
        with_template += 1
        containers = template["spec"]["containers"]
        assert [c["image"] for c in containers] == [image["image"]], path.name
        assert scripts & set(containers[0]["command"]), f"{path.name} runs none of the image's scripts {scripts}"
    assert with_template >= 3


def test_training_script_is_run_by_the_test_it_names() -> None:
    _, pairs = expectation(EXAMPLES / "train" / "train_ddp.py")
    runner = (ROOT / pairs["run-by"]).read_text()
    assert '"examples" / "train" / "train_ddp.py"' in runner and "str(EXAMPLE)" in runner
    _, pairs = expectation(EXAMPLES / "train" / "demo_train.py")
    assert "demo-spot.yaml" in (ROOT / pairs["run-by"]).read_text()
