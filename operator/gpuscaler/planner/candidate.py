"""What the planner's stages hand each other: a candidate plan, and why an offering has none.

:class:`Candidate` is one fully specified way of running a job with its predicted time, cost and
risk (made by :mod:`gpuscaler.planner.evaluate`). :class:`Reason` is the code of every rejection,
so callers (the CLI's table, the operator's PolicyViolation condition, tests) group and pick by
code, never by a message's wording; :data:`REPORT_ORDER` is which code an offering is reported
under when several of its configurations failed for different reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from gpuscaler.catalog import CapacityType, InstanceType, Precision
from gpuscaler.perfmodel import Estimate
from gpuscaler.perfmodel.uncertainty import Band
from gpuscaler.planner.contingency import Contingency
from gpuscaler.planner.profiles import MeasuredPrior
from gpuscaler.planner.risk import RunOutlook


class Reason(StrEnum):
    """Why an offering (instance type x capacity type) has no plan; the value is what ``--json`` prints."""

    CONSTRAINT = "constraint"
    """The job's own constraints leave it out (GPU or instance type, provider, region, spot never)."""
    POLICY = "policy"
    """A platform policy rule leaves it out (allow lists, spot rules, GPU and spending caps)."""
    PRICE = "price"
    """Its spot price is one the catalog flags as suspicious."""
    CAPACITY = "capacity"
    """The cloud recently had no capacity for it."""
    MEMORY = "memory"
    """The job does not fit in GPU memory even with every memory saver."""
    BATCH = "batch"
    """The global batch does not divide by the GPU count."""
    PRECISION = "precision"
    """The GPU cannot run the precision."""
    DEADLINE = "deadline"
    """Its plans miss the deadline at the allowed risk."""
    BUDGET = "budget"
    """Its plans cost more than the job's budget."""


REPORT_ORDER = (
    Reason.DEADLINE, Reason.BUDGET, Reason.POLICY, Reason.MEMORY, Reason.BATCH, Reason.PRECISION, Reason.CAPACITY,
)  # fmt: skip
"""When an offering's configurations failed for several reasons, the one it is reported under: the
first in this order (a plan that runs but is too slow says more than one that does not fit). A
held pool's configuration can fail for its capacity (a window too short, a flex-start run past
its limit): last."""


@dataclass(frozen=True)
class Refusal:
    """Why one configuration (offering x node count x precision) cannot run: a code and a sentence."""

    reason: Reason
    text: str


@dataclass(frozen=True)
class Segment:
    """One stretch of a segmented plan: a capacity block's window, then what continues after it.

    A plan that starts in a window shorter than the job (a capacity block, a reservation that
    expires) runs in it, checkpoints ``margin_s`` before the window closes and continues on the
    next cheapest capacity (:mod:`gpuscaler.planner.held`): one segment per stretch, in order.
    """

    label: str
    """The segment's offering (nodes x instance, capacity, pool)."""
    capacity: CapacityType
    pool: str
    """The held pool it runs on ('' for capacity bought by the hour)."""
    start_h: float
    """Hours from now the segment starts."""
    hours: float
    """Its expected hours (start-up and checkpoint writes included)."""
    samples: float
    """Samples trained in it."""
    cost_usd: float
    """What the team pays for it at the margin."""
    checkpoint_at_h: float | None = None
    """Hours from now of the planned checkpoint before the window closes (None: the segment runs to the end)."""
    margin_s: float = 0.0
    """Seconds before the window closes the checkpoint is asked for (from the checkpoint's write time)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "offering": self.label,
            "capacityType": self.capacity.value,
            "heldCapacity": self.pool,
            "startHours": round(self.start_h, 3),
            "hours": round(self.hours, 3),
            "samples": round(self.samples),
            "costUsd": round(self.cost_usd, 2),
            "checkpointAtHours": None if self.checkpoint_at_h is None else round(self.checkpoint_at_h, 3),
            "marginSeconds": round(self.margin_s),
        }


class Candidate(NamedTuple):
    """One fully specified way of running the job, with its predicted time, cost and risk.

    A named tuple (immutable, as the frozen dataclass it was): the planner builds a thousand per
    plan, and a frozen dataclass of 15 fields takes 4.7 us to build here, a named tuple under 1 us.
    """

    instance: InstanceType
    nodes: int
    capacity: CapacityType
    precision: Precision
    micro_batch: int
    accumulation: int
    zero_stage: int
    activation_checkpointing: bool
    estimate: Estimate
    usd_per_hour: float
    work_hours: float
    checkpoint_write_s: float
    outlook: RunOutlook
    band: Band | None = None
    """The throughput band of ``estimate`` (P10/P50/P90); None only for hand-built candidates."""
    price_caveat: str = ""
    """Why its price may not hold (a price the catalog flags), empty when none."""
    zone: str = ""
    """The availability zone its price is for ("" = any zone of the instance's region)."""
    price_source: str = ""
    """Where its price comes from (see :class:`~gpuscaler.planner.offerings.Offering`)."""
    price_date: str = ""
    """The ISO day its price was read."""
    pool: str = ""
    """The held capacity pool it runs on (a policy's ``capacity``), '' for capacity bought by the hour."""
    segments: tuple[Segment, ...] = ()
    """A segmented plan's stretches (:class:`Segment`), in order; empty for a plan in one piece."""
    prior: MeasuredPrior | None = None
    """The performance profile its throughput and band come from (None: the model's, or the job's
    own observed correction)."""
    contingency: Contingency | None = None
    """What the operator does if it measures slow (:mod:`gpuscaler.planner.contingency`); when set,
    ``outlook.deadline_miss_probability`` is the risk with that recourse and the expected cost
    includes the move's expected extra cost. None without a deadline."""

    def with_contingency(self, k: Contingency) -> Candidate:
        """This candidate with its contingency, its risk the one with recourse (built directly: a
        named tuple's ``_replace`` takes 4x as long, and the planner does this for every candidate)."""
        o = self.outlook
        if k.miss_probability != o.deadline_miss_probability:
            o = RunOutlook._make((*o[:_RISK], k.miss_probability, *o[_RISK + 1 :]))
        return Candidate._make((*self[:_OUTLOOK], o, *self[_OUTLOOK + 1 : _CONTINGENCY], k))

    @property
    def throughput_source(self) -> str:
        """What the throughput comes from: ``measured in 7 runs``, a near profile, or ``model``."""
        return self.prior.source if self.prior is not None else "model"

    @property
    def gpus(self) -> int:
        return self.instance.gpu_count * self.nodes

    @property
    def expected_hours(self) -> float:
        return self.outlook.expected_hours

    @property
    def expected_cost_usd(self) -> float:
        """Expected hours x price, plus the contingency's expected extra cost (a segmented plan: the
        sum of its segments', each carrying its own)."""
        if self.segments:
            return sum(seg.cost_usd for seg in self.segments)
        extra = self.contingency.extra_cost_usd if self.contingency is not None else 0.0
        return self.outlook.expected_hours * self.usd_per_hour + extra

    @property
    def p90_hours(self) -> float:
        """Expected hours at the band's P10 throughput (9 in 10 finish sooner for model error)."""
        return self.outlook.p90_hours or self.outlook.expected_hours

    @property
    def p90_cost_usd(self) -> float:
        if self.segments:  # the slow end stretches the segments alike (the last one pays for it)
            return self.expected_cost_usd * self.p90_hours / max(self.expected_hours, 1e-9)
        return self.p90_hours * self.usd_per_hour

    @property
    def label(self) -> str:
        return (
            f"{self.nodes} x {self.instance.name} ({self.gpus} x {self.instance.gpu_id}) "
            f"{self.capacity.value}{f' {self.pool}' if self.pool else ''}"
            f"{f' in {self.zone}' if self.zone else ''} {self.precision.value}"
        )

    def to_dict(self, source: bool = False) -> dict[str, object]:
        """The plan as ``gpuscaler plan --json`` prints it; with ``source``, ``throughputSource`` too
        (plans made with profiles of the workload: :attr:`throughput_source`)."""
        e = self.estimate
        out: dict[str, object] = {
            "instanceType": self.instance.name,
            "provider": self.instance.provider,
            "region": self.instance.region,
            "zone": self.zone,
            "gpuType": self.instance.gpu_id,
            "gpusPerNode": self.instance.gpu_count,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "capacityType": self.capacity.value,
            "precision": self.precision.value,
            "precisionOnHardware": e.precision_used,
            "microBatch": self.micro_batch,
            "accumulation": self.accumulation,
            "zeroStage": self.zero_stage,
            "activationCheckpointing": self.activation_checkpointing,
            "throughput": round(e.throughput, 3),
            "throughputP10": round(self.band.p10, 3) if self.band else round(e.throughput, 3),
            "throughputP90": round(self.band.p90, 3) if self.band else round(e.throughput, 3),
            "throughputLogSigma": round(self.outlook.log_sigma, 4),
            "unit": e.unit,
            "stepTimeSeconds": round(e.step_time_s, 5),
            "memoryPerGpuGb": round(e.memory_per_gpu_gb, 2),
            "scalingEfficiency": round(e.scaling_efficiency, 3),
            "bottleneck": e.bottleneck,
            "usdPerHour": round(self.usd_per_hour, 4),
            "priceSource": self.price_source,
            "priceDate": self.price_date,
            "workHours": round(self.work_hours, 3),
            "expectedHours": round(self.expected_hours, 3),
            "expectedCostUsd": round(self.expected_cost_usd, 2),
            "p50Hours": round(self.expected_hours, 3),
            "p90Hours": round(self.p90_hours, 3),
            "p50CostUsd": round(self.expected_cost_usd, 2),
            "p90CostUsd": round(self.p90_cost_usd, 2),
            "checkpointIntervalSeconds": round(self.outlook.interval_s),
            "checkpointWriteSeconds": round(self.checkpoint_write_s, 1),
            "expectedInterruptions": round(self.outlook.interruptions, 3),
            "deadlineMissProbability": round(self.outlook.deadline_miss_probability, 4),
            "priceCaveat": self.price_caveat,
            "contingency": self.contingency.to_dict() if self.contingency is not None else None,
            "heldCapacity": self.pool,
            "segments": [seg.to_dict() for seg in self.segments],
        }
        if source:
            out["throughputSource"] = self.throughput_source
        return out



_RISK = RunOutlook._fields.index("deadline_miss_probability")
_OUTLOOK = Candidate._fields.index("outlook")
_CONTINGENCY = Candidate._fields.index("contingency")
assert len(Candidate._fields) - 1 == _CONTINGENCY, "with_contingency() rebuilds the tuple up to its last field"


@dataclass(frozen=True)
class Rejection:
    """Why an offering (instance type x capacity) has no plan in the result."""

    instance: str
    capacity: str
    category: Reason
    """The reason code (printed as its value: policy, constraint, memory, batch, precision, ...)."""
    reason: str
    zone: str = ""
    """The zone of a per-zone offering; empty when the rejection holds for the whole region."""
