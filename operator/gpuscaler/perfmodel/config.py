"""How a workload is run: the parallel configuration the performance model and the planner share.

Its own module so that :mod:`gpuscaler.perfmodel.memory` and :mod:`gpuscaler.perfmodel.model` can
both use it; ``gpuscaler.perfmodel`` exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscaler.catalog.models import Precision


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """How a workload is run: GPUs, precision, micro-batch and accumulation, memory savers."""

    micro_batch: int
    """Batch items per GPU per micro-batch (images, sequences, sentence pairs)."""
    precision: Precision = Precision.AMP
    gpus_per_node: int = 1
    nodes: int = 1
    accumulation: int = 1
    zero_stage: int = 0
    """ZeRO/FSDP sharding: 0 none, 1 optimizer state, 2 + gradients, 3 + weights."""
    activation_checkpointing: bool = False
    intra_link_gbs: float | None = None
    """Override of the GPU's intra-node link (e.g. an instance without NVLink)."""
    intra_link: str | None = None
    network_gbps: float | None = None
    """Inter-node network bandwidth of the instance; required when nodes > 1."""
    vcpus_per_node: int | None = None
    """Enables the input-pipeline bound."""
    framework: str = "pytorch"
    channels_last: bool = False
    """Convolutions in channels-last (NHWC) memory format; PyTorch's default is NCHW (False)."""
    data_loader: str = "pytorch"
    """Input pipeline: ``pytorch`` (DataLoader workers on the CPU) or ``dali`` (NVIDIA DALI)."""

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.gpus
