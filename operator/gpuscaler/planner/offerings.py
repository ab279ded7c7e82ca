"""Stage 1 of the planner, enumerate: which offerings, node counts and precisions are tried.

An offering (:class:`Offering`) is an instance type at a capacity type (on-demand or spot), in a
zone of the instance's region ("" = any zone), with its price after the policy's overrides, and
where that price comes from and how old it is (:func:`offerings`). For each, :func:`node_counts` walks the node counts of
:data:`NODE_COUNTS` that the job's GPU bounds allow and :func:`precisions` the precisions to try;
the GPU cap (:func:`gpu_cap`) is not a filter here: plans over it are still evaluated (up to four
times the cap) so that an infeasible job can be told how many GPUs its deadline needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpuscaler.api import SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType, Catalog, InstanceType, Precision, normalize
from gpuscaler.catalog.models import SHIPPED_SOURCE
from gpuscaler.catalog.prices import POLICY_SOURCE
from gpuscaler.planner.candidate import Reason, Rejection
from gpuscaler.planner.job import ResolvedJob
from gpuscaler.policy import Policy

DEFAULT_MAX_GPUS = 256
"""Largest GPU count considered when neither the job nor the policy sets one."""
NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)
"""Node counts tried per offering (dense where plans differ most, sparse beyond 16)."""
OVER_CAP_FACTOR = 4
"""Plans up to this many times the GPU cap (and at least :data:`OVER_CAP_GPUS`) are evaluated so
that an infeasible job's hint can name the GPU count its deadline needs."""
OVER_CAP_GPUS = 64


SHIPPED_TABLE = SHIPPED_SOURCE
"""Price source of a price read from the catalog shipped with gpuscaler (``catalog/data/instances.csv``)."""
POLICY_OVERRIDE = POLICY_SOURCE
"""Price source of a price a policy's ``priceOverrides`` set."""


@dataclass(frozen=True, slots=True)
class Offering:
    """One thing the planner can buy: an instance type at a capacity type in a zone, at a price.

    Attributes:
        instance: the instance type (its region is the offering's region).
        capacity: on-demand or spot.
        usd_per_hour: price per node-hour after the policy's overrides.
        zone: the availability zone the price is for; "" = any zone of ``instance.region``.
        price_source: where the price comes from (:data:`SHIPPED_TABLE`, :data:`POLICY_OVERRIDE`,
            or a price source's id such as ``aws-spot-price-history``).
        price_date: the ISO day the price was read (the catalog row's ``price_date``).
    """

    instance: InstanceType
    capacity: CapacityType
    usd_per_hour: float
    zone: str = ""
    price_source: str = ""
    price_date: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(instance type, capacity type)``: how rejections and capacity back-offs name it."""
        return (self.instance.name, self.capacity.value)


def _matches(name: str, wanted: list[str], aliases: tuple[str, ...] = ()) -> bool:
    keys = {normalize(name), *(normalize(a) for a in aliases)}
    return any(normalize(w) in keys for w in wanted)


def flagged_price(inst: InstanceType, cap: CapacityType, price: float) -> str:
    """The caveat of a price the catalog flags (empty when it does not, or a policy overrode it)."""
    if cap is not CapacityType.SPOT or not inst.spot_price_suspect or price != inst.spot_usd_hr:
        return ""
    return (
        f"{inst.name} spot ${price:,.2f}/h is {1 - price / inst.ondemand_usd_hr:.0%} below on-demand: "
        "the catalog flags this price as suspiciously deep"
    )


def offerings(
    job: ResolvedJob,
    spec: TrainingJobSpec,
    catalog: Catalog,
    policy: Policy,
    allow_flagged_prices: bool = False,
) -> tuple[list[Offering], list[Rejection]]:
    """Instance x capacity pairs the constraints and policy allow, with their price after overrides.

    The offerings ``O = {(i, c) : i in catalog, c in {on-demand, spot}, price(i, c) exists}``
    minus those a rule leaves out, each rejected once with the first rule that does, checked in
    this order: the job's ``gpuTypes``, ``instanceTypes``, ``providers``, ``regions``; the
    policy's ``allowedGpuTypes``, ``allowedInstanceTypes``, ``providers``, ``regions``; spot
    ``never`` (job or policy) and the policy's ``minHoursToDeadline`` for spot; a flagged price.
    A price the catalog flags (:func:`flagged_price`) is rejected (``Reason.PRICE``) unless
    ``allow_flagged_prices``; a policy price override replaces it and so is never flagged.

    Args:
        job: the resolved job (its deadline, for the spot rule).
        spec: its spec (constraints).
        catalog: every instance type with its catalog price.
        policy: the policy in force (allow lists, spot rules, price overrides).
        allow_flagged_prices: keep prices the catalog flags.

    Returns:
        The allowed offerings in catalog order (on-demand before spot), each with its price per
        node-hour, the price's source (:data:`POLICY_OVERRIDE` when a policy set it) and date,
        and the rejections of the rest.
    """
    c = spec.constraints
    allowed: list[Offering] = []
    rejected: list[Rejection] = []
    gpu_ids_user = {catalog.gpu(g).id for g in c.gpu_types}
    gpu_ids_policy = {catalog.gpu(g).id for g in policy.allowed_gpu_types}
    spot_mode = SpotPolicy(policy.spot.mode) if policy.spot.mode == "never" else c.spot
    for inst in catalog.instances:
        for cap in (CapacityType.ON_DEMAND, CapacityType.SPOT):

            def reject(
                category: Reason, reason: str, inst: InstanceType = inst, cap: CapacityType = cap
            ) -> None:
                rejected.append(Rejection(inst.name, cap.value, category, reason))

            price = policy.price(inst, cap)
            if price is None:
                continue  # the capacity type does not exist for this instance; not worth a line
            if gpu_ids_user and inst.gpu_id not in gpu_ids_user:
                reject(Reason.CONSTRAINT, f"GPU {inst.gpu_id} not in constraints.gpuTypes")
            elif c.instance_types and not _matches(inst.name, c.instance_types):
                reject(Reason.CONSTRAINT, "not in constraints.instanceTypes")
            elif c.providers and inst.provider not in c.providers:
                reject(Reason.CONSTRAINT, f"provider {inst.provider} not in constraints.providers")
            elif c.regions and inst.region not in c.regions:
                reject(Reason.CONSTRAINT, f"region {inst.region} not in constraints.regions")
            elif gpu_ids_policy and inst.gpu_id not in gpu_ids_policy:
                reject(Reason.POLICY, f"policy {policy.name}: GPU {inst.gpu_id} not in allowedGpuTypes")
            elif policy.allowed_instance_types and not _matches(inst.name, policy.allowed_instance_types):
                reject(Reason.POLICY, f"policy {policy.name}: not in allowedInstanceTypes")
            elif policy.providers and inst.provider not in policy.providers:
                reject(Reason.POLICY, f"policy {policy.name}: provider {inst.provider} not allowed")
            elif policy.regions and inst.region not in policy.regions:
                reject(Reason.POLICY, f"policy {policy.name}: region {inst.region} not allowed")
            elif cap is CapacityType.SPOT and spot_mode is SpotPolicy.NEVER:
                who = f"policy {policy.name}" if policy.spot.mode == "never" else "constraints.spot"
                reject(
                    Reason.POLICY if policy.spot.mode == "never" else Reason.CONSTRAINT, f"{who}: spot is never used"
                )
            elif (
                cap is CapacityType.SPOT
                and job.deadline_h is not None
                and job.deadline_h < policy.spot.min_hours_to_deadline
            ):
                reject(
                    Reason.POLICY,
                    f"policy {policy.name}: spot needs >= {policy.spot.min_hours_to_deadline:g} h to the deadline, "
                    f"{job.deadline_h:.1f} h left",
                )
            elif not allow_flagged_prices and (caveat := flagged_price(inst, cap, price)):
                reject(
                    Reason.PRICE,
                    f"{caveat}; left out (set a policy priceOverride for it, or plan with --allow-flagged-prices)",
                )
            else:
                overridden = price != inst.price(cap)
                allowed.append(
                    Offering(
                        inst,
                        cap,
                        price,
                        price_source=POLICY_OVERRIDE if overridden else inst.price_source(cap),
                        price_date="" if overridden else inst.price_date_of(cap),
                    )
                )
    return allowed, rejected


def precisions(spec: TrainingJobSpec, policy: Policy) -> list[Precision]:
    """The precisions to plan: the job's ``constraints.precisions``, else fp32 and amp; within the
    policy's ``allowedPrecisions``."""
    # fp8 training needs Transformer Engine and numerics work of its own: only when the job asks.
    if spec.constraints.precisions:
        wanted = [Precision(p.value) for p in spec.constraints.precisions]
    else:
        wanted = [Precision.FP32, Precision.AMP]
    if policy.allowed_precisions:
        wanted = [p for p in wanted if p.value in policy.allowed_precisions]
    return wanted


def gpu_cap(spec: TrainingJobSpec, policy: Policy) -> tuple[int, str]:
    """The most GPUs a plan may use and who sets it: the lowest of gpuscaler's default limit, the
    job's ``constraints.maxGpus`` and the policy's ``maxGpusPerJob``."""
    caps = [(DEFAULT_MAX_GPUS, "gpuscaler's default limit")]
    if spec.constraints.max_gpus:
        caps.append((spec.constraints.max_gpus, "constraints.maxGpus"))
    if policy.max_gpus_per_job:
        caps.append((policy.max_gpus_per_job, f"policy {policy.name} maxGpusPerJob"))
    return min(caps)


def node_counts(inst: InstanceType, spec: TrainingJobSpec, job: ResolvedJob, cap: int) -> Iterator[int]:
    """The node counts to try for one instance type, smallest first.

    ``n`` in :data:`NODE_COUNTS` with ``g = n x GPUs per node`` and ``g >= minGpus``,
    ``n <= maxNodes``; stopping at the first ``g > max(4 cap, 64)`` or ``g > global batch`` (a
    GPU needs at least one item of the batch).

    Args:
        inst: the instance type.
        spec: the job's spec (``minGpus``, ``maxNodes``).
        job: the resolved job (its global batch).
        cap: the GPU cap from :func:`gpu_cap`.

    Yields:
        Node counts.
    """
    for nodes in NODE_COUNTS:
        gpus = inst.gpu_count * nodes
        if gpus < spec.constraints.min_gpus:
            continue
        if spec.constraints.max_nodes and nodes > spec.constraints.max_nodes:
            continue
        if gpus > max(cap * OVER_CAP_FACTOR, OVER_CAP_GPUS) or gpus > job.global_batch:
            break
        yield nodes
