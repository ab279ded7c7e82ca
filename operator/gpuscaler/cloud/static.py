"""The static provider: nodes exist already (a fixed node group); only steer workers onto them.

Sets the node selectors on ``node.kubernetes.io/instance-type`` and ``karpenter.sh/capacity-type``
and the GPU toleration; creates and deletes nothing. The gang timeout then applies to the
workers being scheduled.
"""

from __future__ import annotations

from gpuscaler import names
from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    AdoptsNodes,
    JobRef,
    NodeRequest,
    Scheduling,
)
from gpuscaler.names import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL


class StaticProvider(AdoptsNodes):
    """Existing nodes only."""

    name = "static"

    def workers_first(self, request: NodeRequest) -> bool:
        """See :meth:`NodePoolProvider.workers_first`: the nodes exist."""
        return True

    def node_gone(self, node: str, nodes: list[NodeState]) -> bool:
        """See :meth:`NodePoolProvider.node_gone`: the nodes are not the job's, so never."""
        return False

    def __init__(self, toleration_key: str = names.GPU_RESOURCE) -> None:
        self.toleration_key = toleration_key

    def ensure_nodes(self, request: NodeRequest, existing: list[NodeState]) -> list[str]:
        return []

    def release_nodes(self, job: JobRef, nodes: list[NodeState]) -> list[str]:
        return []

    def scheduling(self, request: NodeRequest) -> Scheduling:
        return Scheduling(
            node_selector={
                INSTANCE_TYPE_LABEL: request.instance.name,
                CAPACITY_TYPE_LABEL: request.capacity.value,
            },
            tolerations=[{"key": self.toleration_key, "operator": "Exists", "effect": "NoSchedule"}],
        )
