"""End to end: a TrainingJob the CRD schema let through but the models refuse gets a condition.

A cluster can run an older or looser CRD than the operator's models (an upgrade applied in the wrong
order, a hand-edited CRD). Here the TrainingJob CRD is replaced by one whose spec schema accepts
anything; a job whose transformer's hidden size does not divide by its heads, and one with a field
this version does not know, reach the operator. Each must end Failed with the ``InvalidSpec``
condition naming the field and one Warning Event, and the operator keeps running (no crash loop).
The generated CRD is put back afterwards for the rest of the session.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.devcluster.cluster import apply_crds
from gpuscaler.testing import training_job
from operator_helpers import OperatorProcess, kubectl

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "gpuscaler.io", "v1alpha1", "trainingjobs"
CRD_NAME = "trainingjobs.gpuscaler.io"


def loose_crd() -> dict[str, Any]:
    """The generated TrainingJob CRD with a spec schema that accepts any object (as an old one might)."""
    crd: dict[str, Any] = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
    loose = copy.deepcopy(crd)
    for version in loose["spec"]["versions"]:
        props = version["schema"]["openAPIV3Schema"]["properties"]
        props["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return loose


@pytest.fixture
def loose(dev_cluster: E2ECluster, crd: None, tmp_path: Path) -> Iterator[None]:
    path = tmp_path / "loose-crd.yaml"
    path.write_text(yaml.safe_dump(loose_crd()))
    apply_crds(dev_cluster.env, [path], [CRD_NAME])
    try:
        yield
    finally:
        apply_crds(dev_cluster.env, [ROOT / "crds" / "trainingjob.yaml"], [CRD_NAME])


def job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return training_job(name, **spec)


BASE = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 1},
        "constraints": {"instanceTypes": ["p3.2xlarge"], "spot": "never"}}  # fmt: skip
SHAPE = {"workload": {"transformer": {"layers": 12, "hidden": 1000, "heads": 7, "seqLen": 512, "vocab": 30000}},
         "globalBatch": 64, "training": {"steps": 100}}  # fmt: skip


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)


def test_spec_the_models_refuse_is_failed_with_invalid_spec(
    dev_cluster: E2ECluster, namespace: str, loose: None, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    core = client.CoreV1Api(dev_cluster.api)
    future = dict(BASE, priority="high")  # a field of a newer version
    kubectl(dev_cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(
        [job("bad-shape", SHAPE), job("future-field", future)]))  # fmt: skip
    op = OperatorProcess(dev_cluster, namespace, tmp_path / "operator.log")
    op.start()
    try:
        expect = {"bad-shape": "hidden 1000 is not divisible by heads 7", "future-field": "priority"}
        for name, words in expect.items():

            def failed(name: str = name) -> bool:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                c = condition(obj, "Failed")
                return bool(c and c["status"] == "True" and c["reason"] == "InvalidSpec")

            wait_for(failed, timeout=90, interval=0.5, what=f"{name} Failed/InvalidSpec")
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            c = condition(obj, "Failed")
            assert c is not None and words in c["message"], c
            assert obj["status"]["phase"] == "Failed" and words in obj["status"]["message"]

        def events() -> list[Any]:
            return [e for e in core.list_namespaced_event(namespace).items if e.reason == "InvalidSpec"]

        wait_for(lambda: len({e.involved_object.name for e in events()}) == 2, timeout=30, what="InvalidSpec events")
        time.sleep(3)  # several reconcile intervals: still one Event per job, and the operator still up
        assert sorted(e.involved_object.name for e in events()) == ["bad-shape", "future-field"]
        assert all((e.count or 1) == 1 for e in events())
        assert op.proc is not None and op.proc.poll() is None, op.log.read_text(errors="replace")[-3000:]
        log = op.log.read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]
    finally:
        kubectl(dev_cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s", check=False)
        op.stop()
