"""Held capacity: reservations, capacity blocks and flex-start, declared by the platform team in a policy.

A policy's ``capacity`` lists what the team already holds or can queue for, each entry one pool
(docs/capacity.md):

* ``reserved``: capacity held for a period (an EC2 On-Demand Capacity Reservation, a GCP or Azure
  reservation, or a committed-use price): instance type, zone, node count, the price the team pays
  for it **at the margin** (0 when it is paid whether used or not: the default) and an optional
  expiry (``end``);
* ``capacityBlock``: a fixed window (``start``, ``end``) of N prepaid instances (AWS Capacity
  Blocks for ML, GKE DWS calendar mode); a job runs in it only inside the window;
* ``flexStart``: queued capacity (GKE DWS flex-start): it starts after a delay with a stated
  distribution (``startDelay``: P50 and P90 minutes, read as a log-normal) and runs for at most
  ``maxRunHours`` (GKE: 7 days), at the price stated (default: the catalog's on-demand price, the
  conservative assumption).

Why a policy and not a ``CapacityPool`` resource of its own: the platform team declares both; the
planner already receives the policy in force everywhere it plans (the CLI's ``--policy``, the
operator, the simulator), merged per namespace with its last good version kept; and what is in use
is derived from the jobs' own ``status.plan`` (the one record of what runs where), so no second
object's status can drift from it. Pure pydantic, imported by :mod:`gpuscaler.policy.models`.
"""

from __future__ import annotations

import math
from datetime import datetime
from statistics import NormalDist
from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpuscaler.catalog.models import CapacityType
from gpuscaler.inputs import StrictModel

HeldKind = Literal["reserved", "capacityBlock", "flexStart"]
"""The declared types, as written in a policy (camelCase)."""

KIND_CAPACITY: dict[str, CapacityType] = {
    "reserved": CapacityType.RESERVED,
    "capacityBlock": CapacityType.CAPACITY_BLOCK,
    "flexStart": CapacityType.FLEX_START,
}
"""Each declared type's capacity type (what plans, nodes and ``status.plan`` carry)."""

GKE_FLEX_START_MAX_RUN_HOURS = 168.0
"""GKE DWS flex-start: a node runs for at most 7 days (cloud.google.com/kubernetes-engine/docs/concepts/dws)."""
Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: a log-normal's sigma is ``ln(P90 / P50) / Z90``."""


class _Model(StrictModel):
    """camelCase on the wire, unknown fields refused (as :class:`gpuscaler.policy.models.PolicyModel`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class StartDelay(_Model):
    """How long a flex-start request waits for its capacity: P50 and P90 minutes (a log-normal)."""

    p50_minutes: float = Field(gt=0, description="Median wait for the capacity, minutes.")
    p90_minutes: float = Field(gt=0, description="9 in 10 requests get their capacity within this many minutes.")

    @model_validator(mode="after")
    def _ordered(self) -> StartDelay:
        if self.p90_minutes < self.p50_minutes:
            raise ValueError(f"startDelay p90Minutes {self.p90_minutes:g} < p50Minutes {self.p50_minutes:g}")
        return self

    @property
    def log_sigma(self) -> float:
        """Sigma of ``ln(delay)``: ``ln(P90 / P50) / z_0.9``."""
        return math.log(self.p90_minutes / self.p50_minutes) / Z90

    def quantile_hours(self, q: float) -> float:
        """The delay's ``q`` quantile in hours: ``P50 exp(sigma Phi^-1(q)) / 60``."""
        return self.p50_minutes * math.exp(self.log_sigma * NormalDist().inv_cdf(q)) / 60.0

    @property
    def mean_hours(self) -> float:
        """The mean delay in hours: ``P50 exp(sigma^2 / 2) / 60``."""
        return self.p50_minutes * math.exp(self.log_sigma**2 / 2) / 60.0


class HeldCapacity(_Model):
    """One pool of capacity the team holds (or can queue for), as the planner plans into it."""

    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Name of the pool (a DNS label): shown in plans and in status.plan.heldCapacity.",
    )  # fmt: skip
    type: HeldKind = Field(description="reserved, capacityBlock or flexStart.")
    instance_type: str = Field(min_length=1, description="Instance type of the pool (a catalog name).")
    zone: str = Field(default="", description="Availability zone of the pool ('' = any zone of the instance's region).")
    count: int = Field(ge=1, description="Nodes in the pool (flexStart: the most one request may get).")
    usd_per_hour: float | None = Field(
        default=None, ge=0,
        description=(
            "What the team pays per node-hour at the margin for using it: 0 for capacity paid whether "
            "used or not (reserved and capacityBlock default); flexStart defaults to the catalog's on-demand price."
        ),
    )  # fmt: skip
    start: datetime | None = Field(default=None, description="capacityBlock: when the window opens (RFC 3339).")
    end: datetime | None = Field(
        default=None,
        description="capacityBlock: when the window closes (the instances go); reserved: when the reservation expires.",
    )
    reservation_id: str = Field(
        default="", max_length=128,
        description="The cloud's id (an EC2 capacity reservation cr-..., a GCP reservation name): node selection and cloud reads.",
    )  # fmt: skip
    start_delay: StartDelay | None = Field(default=None, description="flexStart: the wait for capacity (P50, P90 minutes).")
    max_run_hours: float = Field(
        default=GKE_FLEX_START_MAX_RUN_HOURS, gt=0,
        description="flexStart: longest a node runs once started (GKE DWS: 168 h, 7 days).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _shape(self) -> HeldCapacity:
        if any(t is not None and t.tzinfo is None for t in (self.start, self.end)):
            raise ValueError(f"capacity {self.name}: start and end need a time zone (e.g. 2026-12-06T18:00:00Z)")
        if self.type == "capacityBlock" and (self.start is None or self.end is None):
            raise ValueError(f"capacity {self.name}: a capacityBlock needs start and end (its window)")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"capacity {self.name}: end {self.end.isoformat()} is not after start {self.start.isoformat()}")
        if self.type == "flexStart" and self.start_delay is None:
            raise ValueError(f"capacity {self.name}: a flexStart pool needs startDelay (p50Minutes, p90Minutes)")
        if self.type != "flexStart" and self.start_delay is not None:
            raise ValueError(f"capacity {self.name}: startDelay is for flexStart pools only")
        if self.type == "reserved" and self.start is not None:
            raise ValueError(f"capacity {self.name}: a reserved pool is usable now; give only its expiry (end)")
        return self

    @property
    def capacity(self) -> CapacityType:
        """The capacity type plans on this pool carry."""
        return KIND_CAPACITY[self.type]
