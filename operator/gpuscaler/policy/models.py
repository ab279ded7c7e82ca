"""Platform policies: what a platform team allows gpuscaler to do, cluster-wide or per namespace.

Validated pydantic models, loaded from YAML files (``policies/*.yaml``) or a ``GPUScalingPolicy``
resource. The planner applies them to every candidate; a rule that rejects a candidate says which
rule and which values, so a user sees why.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuscaler.catalog.models import CapacityType, InstanceType


class PolicyModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class PriceOverride(PolicyModel):
    """A negotiated price or discount for an instance type (or all of a provider's with ``*``)."""

    instance_type: str = Field(description="Instance type name, or '*' for all.")
    provider: str | None = Field(default=None, description="Limit a '*' override to one cloud.")
    on_demand_usd_hr: float | None = Field(default=None, gt=0, description="Replaces the on-demand price.")
    spot_usd_hr: float | None = Field(default=None, gt=0, description="Replaces the spot price.")
    discount_pct: float | None = Field(
        default=None, ge=0, lt=100, description="Discount on on-demand (savings plan, EDP), in percent."
    )


class SpotRules(PolicyModel):
    mode: str = Field(
        default="allowed", pattern="^(never|allowed|preferred)$", description="never, allowed, preferred."
    )
    max_interruptions: int = Field(
        default=3, ge=0, description="Interruptions before falling back to on-demand."
    )
    min_hours_to_deadline: float = Field(
        default=0.0, ge=0, description="Below this slack before the deadline, plan on-demand only."
    )


class Policy(PolicyModel):
    """The rules. Empty lists mean no restriction."""

    name: str = Field(default="default", description="Name shown in reasons.")
    allowed_gpu_types: list[str] = Field(default_factory=list, description="GPU ids or aliases allowed.")
    allowed_instance_types: list[str] = Field(default_factory=list, description="Instance types allowed.")
    providers: list[str] = Field(default_factory=list, description="Clouds allowed.")
    regions: list[str] = Field(default_factory=list, description="Regions allowed.")
    max_gpus_per_job: int | None = Field(default=None, ge=1, description="Most GPUs one job may use.")
    max_gpus_per_namespace: int | None = Field(
        default=None, ge=1, description="Most GPUs a namespace may hold."
    )
    max_usd_per_hour: float | None = Field(default=None, gt=0, description="Highest hourly spend of one job.")
    max_usd_per_job: float | None = Field(default=None, gt=0, description="Highest expected cost of one job.")
    max_usd_per_month: float | None = Field(default=None, gt=0, description="Namespace monthly budget.")
    spot: SpotRules = Field(default_factory=SpotRules, description="Spot rules.")
    price_overrides: list[PriceOverride] = Field(default_factory=list, description="Negotiated prices.")
    min_checkpoint_interval_s: int = Field(
        default=300, ge=10, description="Shortest checkpoint interval allowed."
    )
    max_checkpoint_interval_s: int = Field(
        default=7200, ge=10, description="Longest checkpoint interval allowed."
    )
    allowed_precisions: list[str] = Field(
        default_factory=list, description="Precisions allowed (fp32, amp, ...)."
    )
    checkpoint_write_gbps: float = Field(
        default=8.0,
        gt=0,
        description="Per-node write bandwidth to checkpoint storage, Gbit/s (assumption: EFS/Filestore class).",
    )

    def price(self, inst: InstanceType, capacity: CapacityType) -> float | None:
        """The hourly price of an instance after overrides; None when that capacity does not exist."""
        price = inst.price(capacity)
        for o in self.price_overrides:
            if o.instance_type not in ("*", inst.name) or (o.provider and o.provider != inst.provider):
                continue
            if capacity is CapacityType.ON_DEMAND:
                if o.on_demand_usd_hr is not None:
                    price = o.on_demand_usd_hr
                if o.discount_pct is not None and price is not None:
                    price = price * (1 - o.discount_pct / 100)
            elif o.spot_usd_hr is not None:
                price = o.spot_usd_hr
        return price


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy YAML file.

    Raises:
        pydantic.ValidationError: the file breaks the schema (the message names the field).
        FileNotFoundError: no such file.
    """
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if isinstance(data, dict) and data.get("kind") == "GPUScalingPolicy":
        data = dict(data.get("spec") or {}, name=(data.get("metadata") or {}).get("name", "policy"))
    return Policy.model_validate(data)
