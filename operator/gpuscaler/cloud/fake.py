"""Recording fake node-pool providers for tests: every call kept, errors injected on demand.

After Karpenter's ``pkg/cloudprovider/fake``: one fake shared by every test of the loop instead of
fakes written inside test modules. Nothing is created anywhere; the test harness plays the cloud by
turning what :attr:`FakeProvider.ensured` lists into Node objects and dropping what
:attr:`FakeProvider.released` lists. Three behaviours, one class each:

- :class:`FakeProvider`: makes the job's nodes before the workers and names them
  (:func:`gpuscaler.cloud.provider.node_names`), as kwok does; ``capacity`` caps how many it has;
- :class:`FakeNodeGroup`: scales a node group whose cloud names the nodes (eks, gke, clusterapi);
- :class:`FakePodProvisioner`: prepares its objects and lets nodes come for the pending workers
  (Karpenter).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    AdoptsNodes,
    InsufficientCapacityError,
    JobRef,
    MakesNodes,
    NodeRequest,
    ProviderError,
    Scheduling,
    node_names,
)
from gpuscaler.names import INSTANCE_TYPE_LABEL


@dataclass(frozen=True)
class Call:
    """One call of a provider method, with what it was given."""

    method: str
    """``ensure_nodes``, ``release_nodes`` or ``scheduling``."""
    request: NodeRequest | None = None
    job: JobRef | None = None
    nodes: tuple[str, ...] = ()
    """The names of the ``existing`` (ensure) or given (release) nodes."""


class FakeProvider(MakesNodes):
    """Makes the job's nodes by name (like kwok), records every call, raises injected errors."""

    name = "fake"

    def __init__(self, capacity: int | None = None) -> None:
        """
        Args:
            capacity: Most nodes of a request it can make (None: unlimited); asking for more makes
                what fits and raises :class:`InsufficientCapacityError`.
        """
        self.capacity = capacity
        self.calls: list[Call] = []
        """Every call, in order."""
        self.ensured: list[list[str]] = []
        """Per ensure call, the names it created (the harness makes those nodes, then clears it)."""
        self.released: list[str] = []
        """Names of the nodes it deleted (the harness drops them, then clears it)."""
        self.errors: dict[str, list[ProviderError]] = {}
        """Errors to raise, per method name, one per call in order (:meth:`fail`)."""

    def fail(self, method: str, error: ProviderError) -> None:
        """Make the next call of ``method`` raise ``error`` (after recording the call)."""
        self.errors.setdefault(method, []).append(error)

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        pending = self.errors.get(call.method)
        if pending:
            raise pending.pop(0)

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        self._record(Call("ensure_nodes", request=request, nodes=tuple(n.name for n in existing)))
        have = {n.name for n in existing}
        missing = [n for n in node_names(request) if n not in have]
        room = len(missing) if self.capacity is None else max(0, self.capacity - len(have))
        self.ensured.append(missing[:room])
        if room < len(missing):
            raise InsufficientCapacityError("short")
        return missing[:room]

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        self._record(Call("release_nodes", job=job, nodes=tuple(n.name for n in nodes)))
        self.released += [n.name for n in nodes]
        return [n.name for n in nodes]

    def scheduling(self, request: NodeRequest) -> Scheduling:
        self._record(Call("scheduling", request=request))
        return Scheduling({INSTANCE_TYPE_LABEL: request.instance.name}, [])

    def requests(self, method: str = "ensure_nodes") -> list[Call]:
        """The recorded calls of one method."""
        return [c for c in self.calls if c.method == method]


class FakeNodeGroup(AdoptsNodes, FakeProvider):
    """Like eks, gke and clusterapi: scales a node group; the cloud names the nodes that register
    (the harness adds them), known to the loop by their offering."""

    @property
    def requested(self) -> int:
        """The largest node count asked for."""
        return max((c.request.count for c in self.requests() if c.request), default=0)

    @property
    def prepared(self) -> list[tuple[str, int]]:
        """Per ensure call: the instance type and how many of the job's nodes existed."""
        return [(c.request.instance.name, len(c.nodes)) for c in self.requests() if c.request]

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        self._record(Call("ensure_nodes", request=request, nodes=tuple(n.name for n in existing)))
        return []


class FakePodProvisioner(FakeNodeGroup):
    """Like Karpenter: :meth:`ensure_nodes` prepares its objects; nodes come for the pending
    workers (the harness adds them), named by it."""

    def workers_first(self, request: NodeRequest) -> bool:
        return True

    def launches_for_workers(self, request: NodeRequest) -> bool:
        return True
