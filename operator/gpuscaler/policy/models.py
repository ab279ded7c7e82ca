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

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gpuscaler.catalog.models import CapacityType, InstanceType, Precision
from gpuscaler.inputs import InputError, StrictModel, check_name, load_yaml_all, shown
from gpuscaler.policy.capacity import HeldCapacity

KIND = "GPUScalingPolicy"
"""Kind of the policy resource (group gpuscaler.io, version v1alpha1, cluster-scoped)."""
PLURAL = "gpuscalingpolicies"

_PRECISIONS = tuple(p.value for p in Precision)


class PolicyModel(StrictModel):
    """Base: camelCase on the wire, unknown fields refused, types as written."""

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
    zones: list[str] = Field(
        default_factory=list,
        description="Availability zones allowed (us-east-1a, us-central1-a, eastus-1); empty = any zone of an allowed region.",
    )
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
    allow_trials: bool = Field(
        default=True,
        description=(
            "Allow trial plans: where no plan meets a job's maxDeadlineRisk but the deadline is inside a plan's "
            "band, the planner may start that plan and judge it as it is measured (the job's "
            "constraints.atRiskLimit: Trial). false refuses such jobs, whatever the job says."
        ),
    )
    checkpoint_write_gbps: float = Field(
        default=8.0,
        gt=0,
        description="Per-node write bandwidth to checkpoint storage, Gbit/s (assumption: EFS/Filestore class).",
    )
    capacity: list[HeldCapacity] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Capacity the team holds or can queue for (reserved, capacityBlock, flexStart): the planner "
            "plans into it at what the team pays at the margin (docs/capacity.md)."
        ),
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
        names = [c.name for c in self.capacity]
        if len(set(names)) != len(names):
            raise ValueError(f"capacity names must be unique: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}")
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
            elif capacity is CapacityType.SPOT and o.spot_usd_hr is not None:
                price = o.spot_usd_hr
            # held capacity: priced by its declaration (Policy.capacity), never by an override
        return price


class PolicyFileError(InputError):
    """A policy file that cannot be read or is not YAML, a document that is not a policy mapping, or
    a file holding a different number of policies than expected."""


def from_document(data: Any) -> Policy:
    """A policy from one YAML document: a plain policy mapping or a ``GPUScalingPolicy`` resource.

    Raises:
        pydantic.ValidationError: the document breaks the schema (the message names the field).
        PolicyFileError: the document (or a resource's ``spec``/``metadata``) is not a mapping.
    """
    if not isinstance(data, Mapping):
        raise PolicyFileError(f"a policy must be a mapping of fields, got {type(data).__name__} {shown(data)}")
    if data.get("kind") == KIND:
        spec, meta = data.get("spec") or {}, data.get("metadata") or {}
        if not isinstance(spec, Mapping):
            raise PolicyFileError(f"{KIND} spec must be a mapping of policy fields, got {type(spec).__name__}")
        if not isinstance(meta, Mapping):
            raise PolicyFileError(f"{KIND} metadata must be a mapping, got {type(meta).__name__}")
        data = dict(spec, name=meta.get("name", "policy"))
    if "name" in data:  # a policy's name is a GPUScalingPolicy's metadata.name: what the API server accepts
        try:
            check_name(data["name"], "name")
        except InputError as err:
            raise PolicyFileError(str(err), field="name", value=err.value) from None
    return Policy.model_validate(data)


def load_policies(path: str | Path) -> list[Policy]:
    """Read and validate every policy of a (possibly multi-document) YAML file, in file order.

    Raises:
        pydantic.ValidationError: a document breaks the schema (the message names the field).
        PolicyFileError: the file cannot be read (missing, a directory, too large, not UTF-8), is not
            YAML (aliases and duplicate keys are refused), holds no policy, or holds a document that
            is not a mapping.
    """
    try:
        docs = load_yaml_all(path, "policy file")
    except InputError as err:
        raise PolicyFileError(str(err), field=err.field, value=err.value) from None
    if not docs:
        raise PolicyFileError(
            f"{path}: holds no policy (an empty file would allow everything); write at least one, e.g. "
            "`name: open` for a policy without restrictions"
        )
    policies: list[Policy] = []
    for i, d in enumerate(docs):
        try:
            policies.append(from_document(d))
        except PolicyFileError as err:
            raise PolicyFileError(f"{path}: document {i + 1}: {err}") from None
        first = next((k for k, p in enumerate(policies[:-1]) if p.name == policies[-1].name), None)
        if first is not None:
            raise PolicyFileError(
                f"{path}: documents {first + 1} and {i + 1} are both named {shown(policies[-1].name)}; "
                "policy names must be unique (the API server keeps one object per name): rename one or merge them",
                field="name",
                value=shown(policies[-1].name),
            )
    return policies


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
