"""Fixtures of the e2e suite: one real control plane per session, a fresh namespace per test.

The session starts a dev cluster (:mod:`gpuscaler.devcluster`) once, building its binaries first if
they are not cached (minutes the first time, progress shown), and always stops what it started.
With ``GPUSCALER_E2E_KUBECONFIG`` set, the suite uses that already running cluster instead (for
example one from ``python -m gpuscaler.devcluster up -d``) and leaves it running. Every test in
this directory is marked ``e2e``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.devcluster import build
from gpuscaler.devcluster.cluster import Cluster, apply_crds
from gpuscaler.devcluster.nodes import NodePool, create_node_pool, delete_node_pool, wait_nodes_ready


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def _binaries(pytestconfig: pytest.Config) -> build.Binaries:
    try:
        return build.find_binaries()
    except build.MissingBinariesError:
        capman = pytestconfig.pluginmanager.getplugin("capturemanager")
        print("\nbuilding the dev-cluster binaries (once; cached afterwards) ...")
        if capman is None:
            return build.ensure_all()
        with capman.global_and_fixture_disabled():
            return build.ensure_all()


@pytest.fixture(scope="session")
def dev_cluster(pytestconfig: pytest.Config) -> Iterator[E2ECluster]:
    """The session's cluster: started here (and stopped at the end) or reused from the environment."""
    external = os.environ.get("GPUSCALER_E2E_KUBECONFIG")
    if external:
        try:
            binaries: build.Binaries | None = build.find_binaries()
        except build.MissingBinariesError:
            binaries = None
        env = dict(os.environ, KUBECONFIG=external)
        if binaries is not None:
            env["PATH"] = binaries.path_env(env.get("PATH"))
        api = config.new_client_from_config(config_file=external)
        yield E2ECluster(Path(external), api, env, binaries)
        api.close()
        return
    binaries = _binaries(pytestconfig)
    cluster = Cluster(binaries, name=f"e2e-{os.getpid()}")
    cluster.start()
    try:
        api = cluster.api_client()
        yield E2ECluster(
            cluster.kubeconfig, api, cluster.env(), binaries, cluster, dict(cluster.startup_seconds)
        )
        api.close()
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def core(dev_cluster: E2ECluster) -> Any:
    """``CoreV1Api`` as cluster admin."""
    return client.CoreV1Api(dev_cluster.api)


@pytest.fixture(scope="session")
def batch(dev_cluster: E2ECluster) -> Any:
    """``BatchV1Api`` as cluster admin."""
    return client.BatchV1Api(dev_cluster.api)


@pytest.fixture(scope="session")
def crd(dev_cluster: E2ECluster) -> None:
    """gpuscaler's generated CRDs (TrainingJob, GPUScalingPolicy), installed and Established."""
    root = Path(__file__).resolve().parents[1] / "crds"
    apply_crds(
        dev_cluster.env,
        [root / "trainingjob.yaml", root / "gpuscalingpolicy.yaml"],
        ["trainingjobs.gpuscaler.io", "gpuscalingpolicies.gpuscaler.io"],
    )


@pytest.fixture
def namespace(core: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount ready), deleted after the test."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpuscaler.io/e2e": "true"}}})

    def sa_ready() -> bool:
        return any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items)

    wait_for(sa_ready, what=f"default ServiceAccount in {name}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def p4d_pool(dev_cluster: E2ECluster) -> Iterator[NodePool]:
    """Two Ready fake p4d.24xlarge nodes (8 x A100 each, GPU-tainted) shared by the session."""
    pool = create_node_pool(dev_cluster.api, f"e2e-p4d-{uuid.uuid4().hex[:4]}", "p4d.24xlarge", 2)
    wait_nodes_ready(dev_cluster.api, pool.node_names)
    yield pool
    delete_node_pool(dev_cluster.api, pool.name)
