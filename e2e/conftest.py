"""Fixtures of the e2e suite: one real control plane per session, a fresh namespace per test.

The session starts a dev cluster (:mod:`gpuscaler.devcluster`) once, building its binaries first if
they are not cached (minutes the first time, progress shown), and always stops what it started.
With ``GPUSCALER_E2E_KUBECONFIG=PATH`` set, or ``pytest e2e --kubeconfig PATH``, the suite runs on
that existing cluster instead (a dev cluster from ``gpuscaler dev-cluster up -d``, kind from
``scripts/kind-e2e.sh``, a staging cluster) and leaves it running: it installs what the tests need,
gives every test its own namespace, removes what it made at the end (after failures too), and a
test needing what the cluster lacks (kwok, helm, a private control plane) skips with the reason;
see :mod:`any_cluster` and docs/e2e-on-your-cluster.md. Every test in this directory is marked
``e2e``. ``--shard K/N`` keeps the K-th of N sets of whole modules (:mod:`shards`; CI runs the N
sessions at once, each on its own private cluster: ``scripts/ci-e2e-shards.sh``).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

import any_cluster
import shards
from e2e_helpers import E2ECluster, wait_for
from gpuscaler.devcluster import build
from gpuscaler.devcluster.cluster import Cluster, apply_crds
from gpuscaler.devcluster.nodes import NodePool, create_node_pool, delete_node_pool, wait_nodes_ready
from operator_helpers import OperatorProcess, operators


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubeconfig",
        default=None,
        metavar="PATH",
        help=f"run the e2e suite on the existing cluster of this kubeconfig (as ${any_cluster.KUBECONFIG_ENV})",
    )
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run only the K-th of N shards of the e2e modules, dealt by measured duration (e2e/shards.py); "
        "scripts/test.sh runs the N shards at once, each on its own dev cluster",
    )


def pytest_configure(config: pytest.Config) -> None:
    external = any_cluster.external_kubeconfig(config)
    if external and not Path(external).is_file():
        raise pytest.UsageError(
            f"--kubeconfig / ${any_cluster.KUBECONFIG_ENV}: {external} is not a file (the existing cluster's kubeconfig)"
        )
    shard = config.getoption("--shard")
    if shard is not None:
        try:
            shards.parse(shard)
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None


def pytest_report_header(config: pytest.Config) -> str:
    external = any_cluster.external_kubeconfig(config)
    if external:
        return f"e2e cluster: the existing cluster of {external} (tests needing what it lacks skip, with the reason)"
    return "e2e cluster: a private dev cluster started for this session"


_CLEANUP = pytest.StashKey[str]()
"""What the end-of-session sweep on an existing cluster removed (printed in the summary)."""


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _CLEANUP in config.stash:
        terminalreporter.write_line(config.stash[_CLEANUP])


LAST_MODULES = ("test_kueue.py", "test_karpenter_kwok.py", "test_karpenter_operator.py")
"""Run after the rest: they need controllers beyond the control plane (Kueue and JobSet, Karpenter's
kwok provider), which ``scripts/test.sh`` builds in the background while the other tests run; a
test that gets there first waits on the build's lock."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
    shard = config.getoption("--shard")
    if shard is not None:  # whole modules, the same split in every shard's session (shards.deal)
        k, n = shards.parse(shard)
        mine = set(shards.deal([Path(str(item.fspath)).name for item in items], n)[k - 1])
        kept = [item for item in items if Path(str(item.fspath)).name in mine]
        config.hook.pytest_deselected(items=[item for item in items if Path(str(item.fspath)).name not in mine])
        items[:] = kept
    items.sort(key=lambda item: Path(str(item.fspath)).name in LAST_MODULES)  # stable: order kept otherwise


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
    """The session's cluster: started here (and stopped at the end) or an existing one (left running)."""
    session = any_cluster.new_session_id()
    external = any_cluster.external_kubeconfig(pytestconfig)
    if external:
        try:
            binaries: build.Binaries | None = build.find_binaries()
        except build.MissingBinariesError:
            binaries = None
        env = dict(os.environ, KUBECONFIG=external)
        if binaries is not None:
            env["PATH"] = binaries.path_env(env.get("PATH"))
        api = config.new_client_from_config(config_file=external)  # type: ignore[no-untyped-call]
        existing = E2ECluster(Path(external), api, env, binaries, session=session)
        existing.crds_before = any_cluster.crd_names(existing)
        try:
            yield existing
        finally:
            removed = any_cluster.sweep(existing)
            what = f"removed {', '.join(removed)}" if removed else "nothing was left to remove"
            pytestconfig.stash[_CLEANUP] = f"e2e on {external}: session {session} cleaned up: {what}"
            api.close()
        return
    binaries = _binaries(pytestconfig)
    cluster = Cluster(binaries, name=f"e2e-{os.getpid()}")
    cluster.start()
    try:
        api = cluster.api_client()
        yield E2ECluster(
            cluster.kubeconfig, api, cluster.env(), binaries, cluster, dict(cluster.startup_seconds), session
        )
        api.close()
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kwok(dev_cluster: E2ECluster) -> None:
    """Skips (with the reason) unless kwok plays fake nodes here with gpuscaler's stages."""
    any_cluster.require(dev_cluster, "kwok")


@pytest.fixture(scope="session")
def helm(dev_cluster: E2ECluster) -> str:
    """The helm binary on the tests' PATH; skips (with the reason) without one."""
    any_cluster.require(dev_cluster, "helm")
    return str(shutil.which("helm", path=dev_cluster.env.get("PATH")))


@pytest.fixture(scope="session")
def private_cluster(dev_cluster: E2ECluster) -> Cluster:
    """The dev cluster this session started (for tests that restart its components); skips on an
    existing cluster."""
    any_cluster.require(dev_cluster, "private")
    assert dev_cluster.cluster is not None
    return dev_cluster.cluster


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
    """gpuscaler's generated CRDs (TrainingJob, GPUScalingPolicy, PerformanceProfile), installed and Established."""
    root = Path(__file__).resolve().parents[1] / "crds"
    names = ["trainingjobs.gpuscaler.io", "gpuscalingpolicies.gpuscaler.io", "performanceprofiles.gpuscaler.io"]
    # on an existing cluster: applied like an upgrade; deleted at the end only if this session created them
    any_cluster.track_new_crds(dev_cluster, names)
    apply_crds(dev_cluster.env, [root / "trainingjob.yaml", root / "gpuscalingpolicy.yaml", root / "performanceprofile.yaml"], names)


@pytest.fixture
def namespace(dev_cluster: E2ECluster, core: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount ready), deleted after the test."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    labels = {any_cluster.E2E_LABEL: "true", any_cluster.SESSION_LABEL: dev_cluster.session}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    dev_cluster.namespaces.append(name)

    def sa_ready() -> bool:
        return any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items)

    wait_for(sa_ready, what=f"default ServiceAccount in {name}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def p4d_pool(dev_cluster: E2ECluster, kwok: None) -> Iterator[NodePool]:
    """Two Ready fake p4d.24xlarge nodes (8 x A100 each, GPU-tainted) shared by the session."""
    labels = {any_cluster.SESSION_LABEL: dev_cluster.session} if dev_cluster.external else None
    pool = create_node_pool(dev_cluster.api, f"e2e-p4d-{uuid.uuid4().hex[:4]}", "p4d.24xlarge", 2, labels=labels)
    wait_nodes_ready(dev_cluster.api, pool.node_names)
    yield pool
    delete_node_pool(dev_cluster.api, pool.name)


@pytest.fixture(scope="session")
def custom(dev_cluster: E2ECluster) -> Any:
    return client.CustomObjectsApi(dev_cluster.api)


@pytest.fixture
def operator(dev_cluster: E2ECluster, crd: None, kwok: None, namespace: str, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    """Start an operator for this test's namespace: ``operator(**GPUSCALER_env)``."""
    with operators(dev_cluster, namespace, tmp_path / "operator.log") as start:
        yield start
