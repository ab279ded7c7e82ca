"""The REAL Karpenter controller (its kwok cloud provider) on the local control plane, for e2e tests.

Karpenter ships a fake cloud, the ``kwok`` main package of ``sigs.k8s.io/karpenter``: it launches
NodeClaims as Node objects annotated ``kwok.x-k8s.io/node=fake``, which the dev cluster's kwok
then plays (Ready, runs pods). It is built once with the dev cluster's build machinery and cached
as ``karpenter-kwok-<version>``, and given an instance-type file made from gpuscaler's catalog
(``INSTANCE_TYPES_FILE_PATH``: GPU capacity, spot and on-demand prices), so the names and prices
Karpenter offers are the ones the planner chose from.

A test module wraps :func:`run_karpenter` in a module-scoped fixture, so one controller runs at a
time (two would both act on every NodePool).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import any_cluster
from e2e_helpers import E2ECluster
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.cloud import JOB_LABEL, JobRef
from gpuscaler.devcluster import build
from upstream_crds import KARPENTER_CRDS, KARPENTER_MODULE, KARPENTER_VERSION, install_crds, module_dir

KARPENTER_KWOK = build.Component("karpenter-kwok", KARPENTER_VERSION, ("karpenter-kwok",))
"""The cache entry of Karpenter's kwok-provider controller (7-8 minutes to build on 2 cores, once)."""

INSTANCE_TYPES = ("p4d.24xlarge", "g5.xlarge", "g5.12xlarge")
"""The catalog rows Karpenter-kwok offers (and only these)."""
ZONE = "test-zone-a"
NODE_CLASS = "karpenter.kwok.sh/KWOKNodeClass/default"
"""``GPUSCALER_KARPENTER_NODE_CLASS`` of the kwok provider's node class (created by the fixture)."""
CAT = load_catalog()


def _build_karpenter_kwok(tmp: Path, log: build.Log, logfile: Path) -> None:
    build._wrapper_build(
        KARPENTER_KWOK,
        tmp=tmp,
        requires={KARPENTER_MODULE: KARPENTER_VERSION},
        packages=[f"{KARPENTER_MODULE}/kwok"],
        ldflags="-s -w",
        log=log,
        logfile=logfile,
    )
    (tmp / "out" / "kwok").rename(tmp / "out" / "karpenter-kwok")


build.BUILDERS.setdefault(KARPENTER_KWOK.name, _build_karpenter_kwok)


def instance_types_json() -> list[dict[str, Any]]:
    """Karpenter-kwok's instance-type file from the catalog rows (resources and prices)."""
    out = []
    for name in INSTANCE_TYPES:
        inst = CAT.instance(name)
        offerings = []
        for cap in CapacityType:
            price = inst.price(cap)
            if price is None:
                continue
            offerings.append(
                {
                    "Price": price,
                    "Available": True,
                    "Requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [cap.value]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                    ],
                }
            )
        out.append(
            {
                "name": name,
                "offerings": offerings,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": {
                    "cpu": str(inst.vcpu),
                    "memory": f"{int(inst.memory_gib)}Gi",
                    "nvidia.com/gpu": str(inst.gpu_count),
                    "pods": "110",
                },
            }
        )
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def run_karpenter(dev_cluster: E2ECluster, work: Path) -> Iterator[Path]:
    """Karpenter (kwok provider) running against the dev cluster, files in ``work``; yields its log file.

    Installs the Karpenter CRDs and the kwok node class :data:`NODE_CLASS`; stops the controller on exit.
    On an existing cluster, skips without kwok or when the cluster has a Karpenter of its own.
    """
    any_cluster.require(dev_cluster, "kwok")
    install_crds(
        dev_cluster, [module_dir(KARPENTER_MODULE, KARPENTER_VERSION) / f for f in KARPENTER_CRDS]
    )
    binary = build.ensure(KARPENTER_KWOK) / "karpenter-kwok"
    types = work / "instance-types.json"
    types.write_text(json.dumps(instance_types_json()))
    log = work / "karpenter.log"
    env = dict(
        dev_cluster.env,
        KUBECONFIG=str(dev_cluster.kubeconfig),
        SYSTEM_NAMESPACE="kube-system",
        DISABLE_LEADER_ELECTION="true",
        METRICS_PORT=str(_free_port()),
        HEALTH_PROBE_PORT=str(_free_port()),
        INSTANCE_TYPES_FILE_PATH=str(types),
        BATCH_IDLE_DURATION="1s",
        BATCH_MAX_DURATION="3s",
        LOG_LEVEL="info",
    )
    with log.open("w") as fh:
        proc = subprocess.Popen([str(binary)], env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        time.sleep(2)
        if proc.poll() is not None:
            pytest.fail(f"karpenter-kwok exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        custom = client.CustomObjectsApi(dev_cluster.api)
        group, kind, name = NODE_CLASS.split("/")
        try:
            custom.create_cluster_custom_object(
                group,
                "v1alpha1",
                "kwoknodeclasses",
                {"apiVersion": f"{group}/v1alpha1", "kind": kind, "metadata": {"name": name}},
            )
        except ApiException as err:
            if err.status != 409:
                raise
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def job_nodes(core: Any, job: JobRef) -> list[Any]:
    """The job's nodes (Karpenter copies the pod's job label onto the node it launches)."""
    return list(core.list_node(label_selector=f"{JOB_LABEL}={job.label}").items)


def tail(log: Path, lines: int = 30) -> str:
    """The last lines of Karpenter's log (for failure messages)."""
    return "\n".join(log.read_text().splitlines()[-lines:])
