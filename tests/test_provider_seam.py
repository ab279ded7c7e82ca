"""The provider seam: each provider's behaviour methods (which nodes are the plan's, whether the
workers go first, whether its nodes come for them, whether a vanished node is lost), and the
recording fake provider every loop test uses (calls kept, errors injected)."""

from __future__ import annotations

import pytest

from gpuscaler.api.status import Phase
from gpuscaler.catalog import CapacityType
from gpuscaler.cloud import (
    InsufficientCapacityError,
    JobRef,
    NodeRequest,
    NodeState,
    ProviderError,
    node_names,
)
from gpuscaler.cloud.clusterapi import ClusterApiProvider
from gpuscaler.cloud.eks import EksProvider
from gpuscaler.cloud.fake import FakeProvider
from gpuscaler.cloud.gke import GkeProvider
from gpuscaler.cloud.karpenter import KarpenterProvider
from gpuscaler.cloud.kwok import KwokProvider
from gpuscaler.cloud.static import StaticProvider
from gpuscaler.names import ConditionType
from loop_harness import CATALOG, World, make_job

REQUEST = NodeRequest(JobRef("ns", "job"), CATALOG.instance("p4d.24xlarge"), CapacityType.ON_DEMAND, 2, 32.0)


def state(name: str, instance_type: str = "", capacity_type: str = "") -> NodeState:
    return NodeState(name, instance_type, capacity_type, True, None, 0.0)


# provider class -> (owns by name, workers first, launches for workers, a vanished node is lost)
BEHAVIOUR = {
    KwokProvider: ("name", False, False, True),
    EksProvider: ("offering", False, False, True),
    GkeProvider: ("offering", False, False, True),
    ClusterApiProvider: ("offering", False, False, True),
    KarpenterProvider: ("offering", True, True, True),
    StaticProvider: ("offering", True, False, False),
}


@pytest.mark.parametrize("cls", list(BEHAVIOUR), ids=lambda c: c.__name__)
def test_each_provider_states_its_behaviour(cls: type) -> None:
    """The behaviour is the class's: no client is needed to ask it (built without __init__)."""
    owns_by, first, launches, lost = BEHAVIOUR[cls]
    p = cls.__new__(cls)
    named = state(node_names(REQUEST)[0])
    cloud_named = state("ip-10-0-0-1", "p4d.24xlarge", "on-demand")
    other_offering = state("ip-10-0-0-2", "p3.2xlarge", "spot")
    assert p.owns(REQUEST, named) is (owns_by == "name")
    assert p.owns(REQUEST, cloud_named) is (owns_by == "offering")
    assert not p.owns(REQUEST, other_offering)
    assert p.workers_first(REQUEST) is first
    assert p.launches_for_workers(REQUEST) is launches
    assert p.node_gone("gone-node", [named]) is lost
    assert not p.node_gone(named.name, [named])


def test_the_fake_records_every_call_in_order() -> None:
    w = World()
    job = make_job()
    w.step(job)
    w.step(job)  # the nodes made in the first step are observed, not Ready yet
    w.ready()
    w.step(job)
    assert [c.method for c in w.provider.calls][:2] == ["ensure_nodes", "ensure_nodes"]
    assert w.provider.calls[0].nodes == () and len(w.provider.calls[1].nodes) == 2, "existing nodes as observed"
    assert "scheduling" in [c.method for c in w.provider.calls], "the workers' selector asked for"


def test_an_injected_capacity_error_is_reported_on_the_condition() -> None:
    w = World()
    w.provider.fail("ensure_nodes", InsufficientCapacityError("fake: no p4d.24xlarge left"))
    job = make_job()
    w.step(job)
    cond = next(c for c in w.status.conditions if c.type == ConditionType.NODES_READY)
    assert cond.reason == "InsufficientCapacity" and "no p4d.24xlarge left" in cond.message
    assert w.status.phase is Phase.PROVISIONING and w.provider.requests()[0].request == w.loop._request(job, w.status.plan)  # type: ignore[arg-type]


def test_an_injected_provider_error_reaches_the_caller() -> None:
    """A provider failure is not the loop's to hide: the handler maps it (handlers/errors.py)."""
    w = World(provider=FakeProvider())
    job = make_job()
    w.step(job)
    w.provider.fail("ensure_nodes", ProviderError("fake: the cloud refused"))
    with pytest.raises(ProviderError, match="refused"):
        w.step(job)
    assert w.step(job) == [], "the next call succeeds (one error per injection)"
