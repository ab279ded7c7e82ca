"""End to end: every TrainingJob example, applied to the dev cluster as a user would, is accepted and planned.

``kubectl apply -f examples/<file>.yaml`` against the real API server (the CRD's schema validates
it), then the operator (``gpuscaler run``, a subprocess scoped to the test's namespace) plans it:
``status.plan`` appears and is the plan ``gpuscaler plan`` gives for the same file (one planner for
the CLI and the operator) and the one the example's ``# expect:`` line names
(``tests/test_examples.py`` reads the same line). The jobs are deleted with the operator still
running, so its finalizer releases whatever it started.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.api import TrainingJob
from gpuscaler.catalog import load_catalog
from gpuscaler.planner import plan
from operator_helpers import OperatorProcess, get_job, kubectl

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if yaml.safe_load(p.read_text()).get("kind") == "TrainingJob")
PLAN_FIELDS = {"gpuType": "gpu_type", "gpus": "gpus", "capacityType": "capacity_type", "provider": "provider"}
"""``# expect:`` keys (``gpuscaler plan --json`` names) that the job's ``status.plan`` also holds."""


@pytest.fixture
def custom(dev_cluster: E2ECluster) -> Any:
    return client.CustomObjectsApi(dev_cluster.api)


@pytest.fixture
def operator(dev_cluster: E2ECluster, crd: None, kwok: None, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator for this namespace; the jobs are deleted while it runs (its finalizer cleans up)."""
    op = OperatorProcess(dev_cluster, namespace, tmp_path / "operator.log")
    op.start()
    yield op
    kubectl(dev_cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--wait=false")
    try:  # the finalizer releases the nodes and pods it made: slower on a loaded machine than kubectl waits
        wait_for(
            lambda: not kubectl(dev_cluster, "get", "trainingjobs", "-n", namespace, "-o", "name").stdout.strip(),
            timeout=300, interval=2, what="the examples' finalizers",
        )  # fmt: skip
    finally:
        op.stop()
    print((tmp_path / "operator.log").read_text(errors="replace")[-6000:])


def expected(path: Path) -> dict[str, str]:
    """The ``key=value`` pairs of the example's ``# expect:`` line."""
    line = next(x for x in path.read_text().splitlines() if x.startswith("# expect:"))
    return dict(t.split("=", 1) for t in line.split("(")[0].split()[2:] if "=" in t)


@pytest.mark.e2e
def test_every_training_job_example_is_accepted_and_planned(
    dev_cluster: E2ECluster, custom: Any, namespace: str, operator: OperatorProcess
) -> None:
    assert len(EXAMPLES) >= 4
    for path in EXAMPLES:
        done = kubectl(dev_cluster, "apply", "-n", namespace, "-f", str(path))
        assert "created" in done.stdout, (path.name, done.stdout, done.stderr)
    for path in EXAMPLES:
        doc = TrainingJob.model_validate(yaml.safe_load(path.read_text()))
        name = doc.metadata.name

        def planned(name: str = name) -> Any:
            return (get_job(custom, namespace, name).get("status") or {}).get("plan")

        got = wait_for(planned, timeout=120, interval=0.5, what=f"{path.name} planned")
        status = get_job(custom, namespace, name)["status"]
        assert status.get("phase") not in {"Failed", "Infeasible", "Invalid"}, (path.name, status)
        cli = plan(doc.spec, load_catalog(), name=name).chosen
        assert cli is not None, path.name
        assert (got["instanceType"], got["capacityType"], got["gpus"]) == (
            cli.instance.name, cli.capacity.value, cli.gpus,
        ), path.name  # fmt: skip
        for key, value in expected(path).items():
            if key in PLAN_FIELDS:
                assert str(got[key]) == value, (path.name, key, got[key])
    assert operator.proc is not None and operator.proc.poll() is None  # the operator is still up after all of them
