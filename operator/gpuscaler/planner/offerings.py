"""Stage 1 of the planner, enumerate: which offerings, node counts and precisions are tried.

An offering (:class:`Offering`) is an instance type at a capacity type (on-demand or spot), in a
zone of the instance's region ("" = any zone), with its price after the policy's overrides, and
where that price comes from and how old it is (:func:`offerings`). For each, :func:`node_counts` walks the node counts of
:data:`NODE_COUNTS` that the job's GPU bounds allow and :func:`precisions` the precisions to try;
the GPU cap (:func:`gpu_cap`) is not a filter here: plans over it are still evaluated (up to four
times the cap) so that an infeasible job can be told how many GPUs its deadline needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuscaler.api import SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType, Catalog, InstanceType, Precision, normalize
from gpuscaler.catalog.models import MIN_SPOT_SHARE, SHIPPED_SOURCE, SUSPECT_PRICE_MARK
from gpuscaler.catalog.prices import POLICY_SOURCE
from gpuscaler.catalog.zones import in_region
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


def flagged_price(offer: Offering) -> str:
    """The caveat of a spot price the catalog flags (empty when it does not, or a policy set it):
    the catalog row marks it (:data:`~gpuscaler.catalog.models.SUSPECT_PRICE_MARK`), or the
    offering's own price (a zone's, or the region's) is under
    :data:`~gpuscaler.catalog.models.MIN_SPOT_SHARE` of on-demand: the rule of
    :attr:`InstanceType.spot_price_suspect`, applied to each zone's price."""
    inst = offer.instance
    if offer.capacity is not CapacityType.SPOT or offer.price_source == POLICY_OVERRIDE:
        return ""
    if SUSPECT_PRICE_MARK not in inst.source and offer.usd_per_hour >= MIN_SPOT_SHARE * inst.ondemand_usd_hr:
        return ""
    return (
        f"{inst.name} spot ${offer.usd_per_hour:,.2f}/h is {1 - offer.usd_per_hour / inst.ondemand_usd_hr:.0%} "
        "below on-demand: the catalog flags this price as suspiciously deep"
    )


def priced_zones(inst: InstanceType, capacity: CapacityType) -> list[tuple[str, float]]:
    """The zones the price data prices ``inst`` x ``capacity`` in, with their prices, by zone;
    empty when it has one price for the whole region (the shipped table; on-demand everywhere).

    Spot prices per zone come from a price file or live source that has them (``zone`` rows:
    AWS ``DescribeSpotPriceHistory``), kept by :func:`~gpuscaler.catalog.prices.apply_prices` in
    ``InstanceType.spot_zones``.
    """
    if capacity is CapacityType.SPOT and inst.spot_usd_hr is not None:
        return list(inst.spot_zones)
    return []


def _zoned(
    inst: InstanceType,
    cap: CapacityType,
    price: float,
    wanted: list[str],
    policy: Policy,
    reject: Callable[[Reason, str, str], None],
) -> list[Offering]:
    """The offerings of ``inst`` x ``cap`` per zone, within the job's and the policy's zones.

    Where the price data prices zones (:func:`priced_zones`) there is one offering per zone at its
    own price (a policy override replaces every zone's); else one for the whole region (zone "",
    any zone). A zone list (``constraints.zones``, the policy's ``zones``) keeps the zones it names
    and pins a region-wide offering to each named zone of its region (the same price in each: the
    capacity back-off then moves a plan from one zone to the next); a zone it leaves out is rejected
    (``constraint`` for the job's list, checked first, ``policy`` for the policy's).
    """
    overridden = price != inst.price(cap)
    source, day = (POLICY_OVERRIDE, "") if overridden else (inst.price_source(cap), inst.price_date_of(cap))
    zones = [(z, price if overridden else p) for z, p in priced_zones(inst, cap)] or [("", price)]
    out: list[Offering] = []
    for zone, usd in zones:
        if zone:
            if wanted and zone not in wanted:
                reject(Reason.CONSTRAINT, f"zone {zone} not in constraints.zones", zone)
            elif policy.zones and zone not in policy.zones:
                reject(Reason.POLICY, f"policy {policy.name}: zone {zone} not allowed", zone)
            else:
                out.append(Offering(inst, cap, usd, zone, source, day))
            continue
        mine = [z for z in wanted if in_region(inst.provider, inst.region, z)]
        theirs = [z for z in policy.zones if in_region(inst.provider, inst.region, z)]
        if wanted and not mine:
            reject(Reason.CONSTRAINT, f"no zone of constraints.zones is in {inst.region}", "")
            continue
        if policy.zones and not theirs:
            reject(Reason.POLICY, f"policy {policy.name}: no allowed zone is in {inst.region}", "")
            continue
        pinned = [z for z in mine if not policy.zones or z in theirs] if wanted else theirs
        if (wanted or policy.zones) and not pinned:
            reject(Reason.POLICY, f"policy {policy.name}: none of constraints.zones {mine} is allowed", "")
            continue
        out.extend(Offering(inst, cap, usd, z, source, day) for z in pinned or [""])
    return out


@dataclass(frozen=True, slots=True)
class _Scope:
    """What the offering rules read: the job's constraints and deadline, and the policy."""

    job: ResolvedJob
    spec: TrainingJobSpec
    policy: Policy
    gpu_ids_user: frozenset[str]
    """GPU ids of the job's ``constraints.gpuTypes`` (empty: any)."""
    gpu_ids_policy: frozenset[str]
    """GPU ids of the policy's ``allowedGpuTypes`` (empty: any)."""


Verdict = tuple[Reason, str] | None
"""A rule's verdict on one offering: why it is left out, or None (this rule keeps it)."""
OfferingRule = Callable[[_Scope, InstanceType, CapacityType], Verdict]


def job_gpu_types(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``gpu(i) in constraints.gpuTypes`` (when set)."""
    if sc.gpu_ids_user and inst.gpu_id not in sc.gpu_ids_user:
        return Reason.CONSTRAINT, f"GPU {inst.gpu_id} not in constraints.gpuTypes"
    return None


def job_instance_types(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``i in constraints.instanceTypes`` (when set; names compared normalised)."""
    wanted = sc.spec.constraints.instance_types
    if wanted and not _matches(inst.name, wanted):
        return Reason.CONSTRAINT, "not in constraints.instanceTypes"
    return None


def job_providers(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``provider(i) in constraints.providers`` (when set)."""
    if sc.spec.constraints.providers and inst.provider not in sc.spec.constraints.providers:
        return Reason.CONSTRAINT, f"provider {inst.provider} not in constraints.providers"
    return None


def job_regions(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``region(i) in constraints.regions`` (when set)."""
    if sc.spec.constraints.regions and inst.region not in sc.spec.constraints.regions:
        return Reason.CONSTRAINT, f"region {inst.region} not in constraints.regions"
    return None


def policy_gpu_types(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``gpu(i) in policy.allowedGpuTypes`` (when set)."""
    if sc.gpu_ids_policy and inst.gpu_id not in sc.gpu_ids_policy:
        return Reason.POLICY, f"policy {sc.policy.name}: GPU {inst.gpu_id} not in allowedGpuTypes"
    return None


def policy_instance_types(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``i in policy.allowedInstanceTypes`` (when set; names compared normalised)."""
    allowed = sc.policy.allowed_instance_types
    if allowed and not _matches(inst.name, allowed):
        return Reason.POLICY, f"policy {sc.policy.name}: not in allowedInstanceTypes"
    return None


def policy_providers(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``provider(i) in policy.providers`` (when set)."""
    if sc.policy.providers and inst.provider not in sc.policy.providers:
        return Reason.POLICY, f"policy {sc.policy.name}: provider {inst.provider} not allowed"
    return None


def policy_regions(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """``region(i) in policy.regions`` (when set)."""
    if sc.policy.regions and inst.region not in sc.policy.regions:
        return Reason.POLICY, f"policy {sc.policy.name}: region {inst.region} not allowed"
    return None


def spot_never(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """No spot when the policy's ``spot.mode`` is ``never`` (said as the policy's), else when the
    job's ``constraints.spot`` is ``never``."""
    if cap is not CapacityType.SPOT:
        return None
    if sc.policy.spot.mode == "never":
        return Reason.POLICY, f"policy {sc.policy.name}: spot is never used"
    if sc.spec.constraints.spot is SpotPolicy.NEVER:
        return Reason.CONSTRAINT, "constraints.spot: spot is never used"
    return None


def spot_deadline(sc: _Scope, inst: InstanceType, cap: CapacityType) -> Verdict:
    """No spot when ``hours to the deadline < policy.spot.minHoursToDeadline``."""
    left, need = sc.job.deadline_h, sc.policy.spot.min_hours_to_deadline
    if cap is CapacityType.SPOT and left is not None and left < need:
        return Reason.POLICY, f"policy {sc.policy.name}: spot needs >= {need:g} h to the deadline, {left:.1f} h left"
    return None


OFFERING_RULES: tuple[OfferingRule, ...] = (
    # The job's own constraints first: a rejection then names what the user wrote.
    job_gpu_types,
    job_instance_types,
    job_providers,
    job_regions,
    # Then the policy's allow lists: what the cluster's owner allows, whatever the job asks.
    policy_gpu_types,
    policy_instance_types,
    policy_providers,
    policy_regions,
    # Spot rules last: they depend on the capacity type (and the deadline), not on the instance.
    spot_never,
    spot_deadline,
)
"""The rules an offering must pass, in order; it is rejected once, with the first that fails. The
zones (:func:`_zoned`) and a flagged price (:func:`flagged_price`) are checked after them, per zone."""


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
    the order of :data:`OFFERING_RULES`: the job's ``gpuTypes``, ``instanceTypes``, ``providers``,
    ``regions``; the policy's ``allowedGpuTypes``, ``allowedInstanceTypes``, ``providers``,
    ``regions``; spot ``never`` (job or policy) and the policy's ``minHoursToDeadline`` for spot;
    then the zones (:func:`_zoned`) and a flagged price.
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
    sc = _Scope(
        job,
        spec,
        policy,
        frozenset(catalog.gpu(g).id for g in spec.constraints.gpu_types),
        frozenset(catalog.gpu(g).id for g in policy.allowed_gpu_types),
    )
    allowed: list[Offering] = []
    rejected: list[Rejection] = []
    for inst in catalog.instances:
        for cap in (CapacityType.ON_DEMAND, CapacityType.SPOT):

            def reject(
                category: Reason, reason: str, zone: str = "", inst: InstanceType = inst, cap: CapacityType = cap
            ) -> None:
                rejected.append(Rejection(inst.name, cap.value, category, reason, zone))

            price = policy.price(inst, cap)
            if price is None:
                continue  # the capacity type does not exist for this instance; not worth a line
            verdict = next((v for rule in OFFERING_RULES if (v := rule(sc, inst, cap)) is not None), None)
            if verdict is not None:
                reject(*verdict)
                continue
            for offer in _zoned(inst, cap, price, spec.constraints.zones, policy, reject):
                if not allow_flagged_prices and (caveat := flagged_price(offer)):
                    reject(
                        Reason.PRICE,
                        f"{caveat}; left out (set a policy priceOverride for it, or plan with "
                        "--allow-flagged-prices)",
                        offer.zone,
                    )
                else:
                    allowed.append(offer)
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
