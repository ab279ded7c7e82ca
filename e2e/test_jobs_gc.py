"""The real Job controller and garbage collector work with kwok-run pods."""

from __future__ import annotations

from typing import Any

import pytest

from e2e_helpers import condition, gpu_pod, gpu_pod_spec, wait_for
from gpuscaler.devcluster.nodes import POOL_LABEL, NodePool
from gpuscaler.devcluster.stages import POD_COMPLETE_DELAY_ANNOTATION

pytestmark = pytest.mark.e2e


def _job(name: str, pool: NodePool, completions: int = 1, run_for: str | None = None) -> dict[str, Any]:
    annotations = {POD_COMPLETE_DELAY_ANNOTATION: run_for} if run_for else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": gpu_pod_spec(4, node_selector={POOL_LABEL: pool.name}),
            },
        },
    }


def _job_pods(core: Any, namespace: str, job: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items)


def test_job_pods_complete_and_job_reaches_complete(
    core: Any, batch: Any, namespace: str, p4d_pool: NodePool
) -> None:
    batch.create_namespaced_job(namespace, _job("train", p4d_pool, completions=2))

    def complete() -> Any:
        job = batch.read_namespaced_job("train", namespace)
        c = condition(job, "Complete")
        return job if c is not None and c.status == "True" else None

    job = wait_for(complete, timeout=90, what="Job Complete")
    assert job.status.succeeded == 2
    pods = _job_pods(core, namespace, "train")
    assert len(pods) == 2
    assert {p.status.phase for p in pods} == {"Succeeded"}
    assert all(p.spec.node_name in p4d_pool.node_names for p in pods)


def test_deleting_a_configmap_owner_garbage_collects_its_pods(core: Any, namespace: str) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}, "data": {"a": "b"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for i in range(3):
        pod = gpu_pod(f"owned-{i}", 1)
        pod["metadata"]["ownerReferences"] = [ref]
        core.create_namespaced_pod(namespace, pod)
    assert len(core.list_namespaced_pod(namespace).items) == 3
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, what="owned pods garbage-collected")


def test_deleting_a_running_job_in_background_removes_its_pods(
    core: Any, batch: Any, namespace: str, p4d_pool: NodePool
) -> None:
    batch.create_namespaced_job(namespace, _job("long", p4d_pool, completions=2, run_for="1h"))

    def running() -> bool:
        pods = _job_pods(core, namespace, "long")
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    wait_for(running, what="2 Job pods Running")
    batch.delete_namespaced_job("long", namespace, propagation_policy="Background")
    wait_for(lambda: not _job_pods(core, namespace, "long"), timeout=90, what="Job pods garbage-collected")
    assert not batch.list_namespaced_job(namespace).items
