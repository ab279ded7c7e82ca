"""End to end: a job pinned to an availability zone gets its nodes and workers in that zone.

Expected of the operator (docs/providers.md, "Zones"): ``constraints.zones`` pins the plan's zone
(``status.plan.zone``); the kwok provider labels the nodes it makes ``topology.kubernetes.io/zone``
with it, and the workers select it, so the scheduler puts them there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e_helpers import E2ECluster
from operator_helpers import OperatorProcess, apply, job_manifest, job_nodes, job_pods, kubectl, wait_phase

pytestmark = pytest.mark.e2e

ZONE = "topology.kubernetes.io/zone"


def test_a_zoned_job_runs_in_its_zone(
    dev_cluster: E2ECluster, crd: None, kwok: None, namespace: str, core: Any, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(dev_cluster.api)
    op = OperatorProcess(dev_cluster, namespace, tmp_path / "operator.log")
    op.start()
    try:
        doc = job_manifest("zoned", instance="p4d.24xlarge", gpus=16)
        doc["spec"]["constraints"]["zones"] = ["us-east-1c", "us-central1-a"]
        apply(dev_cluster, namespace, doc)
        job = wait_phase(custom, namespace, "zoned", "Running", timeout=60)
        assert job["status"]["plan"]["zone"] == "us-east-1c" and job["status"]["plan"]["region"] == "us-east-1"
        nodes = job_nodes(core, namespace, "zoned")
        assert len(nodes) == 2 and {n.metadata.labels[ZONE] for n in nodes} == {"us-east-1c"}
        pods = job_pods(core, namespace, "zoned")
        assert pods and all(p.spec.node_selector.get(ZONE) == "us-east-1c" for p in pods)
        assert {p.spec.node_name for p in pods} == {n.metadata.name for n in nodes}
    finally:
        kubectl(dev_cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s", check=False)
        op.stop()
        print((tmp_path / "operator.log").read_text(errors="replace")[-3000:])
