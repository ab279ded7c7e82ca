"""Platform policies: what a platform team allows gpuscaler to do, cluster-wide or per namespace.

Validated pydantic models, loaded from YAML files (``policies/*.yaml``, the chart's ConfigMap) or a
``GPUScalingPolicy`` resource. The planner applies them to every candidate; a rule that rejects a
candidate says which rule and which values, so a user sees why. A policy with ``namespaces`` applies
to those namespaces only; :func:`gpuscaler.policy.evaluate.policy_for_namespace` merges the
cluster-wide and namespace policies into the one the planner gets.

Callers: the planner (``Policy``), ``gpuscaler plan --policy``, ``gpuscaler policy check``, the
operator (``load_policies`` on ``settings.policy_file``, GPUScalingPolicy objects via ``from_document``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gpuscaler.catalog.models import CapacityType, InstanceType, Precision

KIND = "GPUScalingPolicy"
"""Kind of the policy resource (group gpuscaler.io, version v1alpha1, cluster-scoped)."""
PLURAL = "gpuscalingpolicies"

_PRECISIONS = tuple(p.value for p in Precision)


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
    """When spot capacity may be used, and when a job falls back to on-demand."""

    mode: Literal["never", "allowed", "preferred"] = Field(
        default="allowed", description="never, allowed, preferred."
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
    namespaces: list[str] = Field(
        default_factory=list,
        description=(
            "Namespaces this policy applies to (names or shell patterns like team-*); empty = every "
            "namespace. Fields set here override the cluster-wide policy's for those namespaces."
        ),
    )
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
        default_factory=list, description="Precisions allowed (fp32, tf32, amp, bf16, fp8); empty = any."
    )
    default_precisions: list[str] = Field(
        default_factory=list,
        description="Precisions planned when a job names none; empty = the planner's default (fp32, amp, fp8).",
    )
    checkpoint_write_gbps: float = Field(
        default=8.0,
        gt=0,
        description="Per-node write bandwidth to checkpoint storage, Gbit/s (assumption: EFS/Filestore class).",
    )

    @field_validator("allowed_precisions", "default_precisions")
    @classmethod
    def _known_precisions(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if p not in _PRECISIONS]
        if bad:
            raise ValueError(f"unknown precision {', '.join(bad)}: use {', '.join(_PRECISIONS)}")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> Policy:
        if self.min_checkpoint_interval_s > self.max_checkpoint_interval_s:
            raise ValueError(
                f"minCheckpointIntervalS {self.min_checkpoint_interval_s} > maxCheckpointIntervalS "
                f"{self.max_checkpoint_interval_s}"
            )
        if self.allowed_precisions and self.default_precisions:
            outside = [p for p in self.default_precisions if p not in self.allowed_precisions]
            if outside:
                raise ValueError(f"defaultPrecisions {', '.join(outside)} not in allowedPrecisions")
        return self

    def applies_to(self, namespace: str | None) -> bool:
        """Whether this policy governs jobs in ``namespace`` (a cluster-wide policy governs all)."""
        if not self.namespaces:
            return True
        return namespace is not None and any(fnmatch.fnmatchcase(namespace, p) for p in self.namespaces)

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


class PolicyFileError(ValueError):
    """A policy file that is not YAML, or holds a different number of policies than expected."""


def from_document(data: Any) -> Policy:
    """A policy from one YAML document: a plain policy mapping or a ``GPUScalingPolicy`` resource.

    Raises:
        pydantic.ValidationError: the document breaks the schema (the message names the field).
    """
    if isinstance(data, Mapping) and data.get("kind") == KIND:
        data = dict(data.get("spec") or {}, name=(data.get("metadata") or {}).get("name", "policy"))
    return Policy.model_validate(data or {})


def load_policies(path: str | Path) -> list[Policy]:
    """Read and validate every policy of a (possibly multi-document) YAML file, in file order.

    Raises:
        pydantic.ValidationError: a document breaks the schema (the message names the field).
        PolicyFileError: the file is not YAML.
        FileNotFoundError: no such file.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise PolicyFileError(f"{path}: not valid YAML: {err}") from err
    return [from_document(d) for d in docs] or [Policy()]


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy YAML file holding one policy.

    Raises:
        pydantic.ValidationError: the file breaks the schema (the message names the field).
        PolicyFileError: not YAML, or several documents (use :func:`load_policies` and
            :func:`gpuscaler.policy.evaluate.policy_for_namespace`).
        FileNotFoundError: no such file.
    """
    policies = load_policies(path)
    if len(policies) != 1:
        raise PolicyFileError(
            f"{path}: holds {len(policies)} policies; load it with load_policies() and merge them "
            "for a namespace with policy_for_namespace()"
        )
    return policies[0]
