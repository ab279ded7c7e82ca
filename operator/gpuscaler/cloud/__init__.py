"""Node-pool providers: the only code that asks a cloud (or kwok) for nodes.

:mod:`gpuscaler.cloud.provider` is the interface, :mod:`gpuscaler.cloud.registry` chooses one by
name; :mod:`gpuscaler.cloud.kwok` and :mod:`gpuscaler.cloud.static` implement it.
"""

from gpuscaler.cloud.nodes import NodeState
from gpuscaler.cloud.provider import (
    InsufficientCapacityError,
    JobRef,
    NodePoolProvider,
    NodeRequest,
    ProviderError,
    Scheduling,
    UnknownProviderError,
    job_label_value,
    node_names,
)
from gpuscaler.cloud.registry import PROVIDERS, make_provider
from gpuscaler.names import JOB_LABEL, PRICE_ANNOTATION

__all__ = [
    "JOB_LABEL",
    "PRICE_ANNOTATION",
    "PROVIDERS",
    "InsufficientCapacityError",
    "JobRef",
    "NodePoolProvider",
    "NodeRequest",
    "NodeState",
    "ProviderError",
    "Scheduling",
    "UnknownProviderError",
    "job_label_value",
    "make_provider",
    "node_names",
]
