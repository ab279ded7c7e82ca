"""The static provider: nodes exist already (a fixed node group); only steer workers onto them.

Sets the node selectors on ``node.kubernetes.io/instance-type`` and ``karpenter.sh/capacity-type``
and the GPU toleration; creates and deletes nothing. The gang timeout then applies to the
workers being scheduled.
"""

from __future__ import annotations

from gpuscaler.cloud.provider import (
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    JobRef,
    NodeRequest,
    NodeState,
    Scheduling,
)


class StaticProvider:
    """Existing nodes only."""

    name = "static"
    manages_nodes = False
    names_nodes = False
    provisions_for_pods = False

    def __init__(self, toleration_key: str = "nvidia.com/gpu") -> None:
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
