"""The planner: the cheapest plan that meets the deadline, or the fastest within the budget.

A pipeline of named stages (after SkyPilot's optimizer), each a pure function:

1. ``offerings``   instance type x capacity type allowed by the job's constraints and the policy;
2. ``configure``   for each offering, node count and precision: the largest micro-batch that fits
                   in memory with the global batch kept exactly (``global = GPUs x micro x K``),
                   turning on activation checkpointing and then ZeRO sharding only when needed;
3. ``evaluate``    the performance model's step time -> work hours and its throughput band
                   (:mod:`gpuscaler.perfmodel.uncertainty`); spot risk (Young/Daly interval,
                   expected interruptions) and the deadline-miss probability with the model's
                   error (:mod:`gpuscaler.planner.risk`); expected cost, P50 and P90;
4. ``solve``       filter by deadline risk, budget and policy caps; pick by objective; Pareto front
                   of expected cost vs time; for every rejected offering the reason.

Objective ``cheapest``: minimise expected cost subject to P(miss deadline) <= maxDeadlineRisk and
cost <= budget. ``fastest``: minimise expected hours subject to cost <= budget. Spot ``preferred``
restricts the choice to spot when any spot plan is feasible. The CLI, the operator and the
simulator all call :func:`plan`.

Believability: a spot price the catalog itself flags as suspicious (``InstanceType.spot_price_suspect``:
Azure spot listed ~88% below on-demand) is left out of plans with the reason ``price``, unless the
policy overrides that price (the platform team vouches for it) or the caller allows flagged prices
(``gpuscaler plan --allow-flagged-prices``); a plan chosen on such a price carries a caveat.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache

from gpuscaler.api import Objective, SpotPolicy, TrainingJobSpec
from gpuscaler.catalog import CapacityType, Catalog, InstanceType, Precision, Workload, normalize
from gpuscaler.perfmodel import (
    Estimate,
    ParallelConfig,
    PrecisionUnsupportedError,
    constants,
    estimate,
    memory_per_gpu,
)
from gpuscaler.perfmodel.uncertainty import Band, throughput_band
from gpuscaler.planner.correction import MEASURED_LOG_SIGMA_FLOOR
from gpuscaler.planner.job import ResolvedJob, check_constraints, resolve
from gpuscaler.planner.risk import RunOutlook, hourly_rate, optimal_interval_s, outlook
from gpuscaler.policy import Policy

STARTUP_S = 180.0
"""Provisioning plus container start before the first step (assumption; cloud GPU nodes take 2-5 min)."""
CHECKPOINT_FIXED_S = 2.0
"""Fixed cost of one checkpoint on top of the bytes written (sync, rename, metadata)."""
DEFAULT_MAX_GPUS = 256
"""Largest GPU count considered when neither the job nor the policy sets one."""
NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


@dataclass(frozen=True)
class Candidate:
    """One fully specified way of running the job, with its predicted time, cost and risk."""

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

    @property
    def gpus(self) -> int:
        return self.instance.gpu_count * self.nodes

    @property
    def expected_hours(self) -> float:
        return self.outlook.expected_hours

    @property
    def expected_cost_usd(self) -> float:
        return self.outlook.expected_hours * self.usd_per_hour

    @property
    def p90_hours(self) -> float:
        """Expected hours at the band's P10 throughput (9 in 10 finish sooner for model error)."""
        return self.outlook.p90_hours or self.outlook.expected_hours

    @property
    def p90_cost_usd(self) -> float:
        return self.p90_hours * self.usd_per_hour

    @property
    def label(self) -> str:
        return (
            f"{self.nodes} x {self.instance.name} ({self.gpus} x {self.instance.gpu_id}) "
            f"{self.capacity.value} {self.precision.value}"
        )

    def to_dict(self) -> dict[str, object]:
        e = self.estimate
        return {
            "instanceType": self.instance.name,
            "provider": self.instance.provider,
            "region": self.instance.region,
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
        }


@dataclass(frozen=True)
class Rejection:
    """Why an offering (instance type x capacity) has no plan in the result."""

    instance: str
    capacity: str
    category: str
    """policy, constraint, memory, batch, precision, deadline, budget."""
    reason: str


@dataclass
class PlanResult:
    """The planner's answer."""

    job: ResolvedJob
    objective: Objective
    chosen: Candidate | None
    why: str
    feasible: list[Candidate]
    pareto: list[Candidate]
    """Cost-vs-time front over the feasible plans (over all fitting plans when none is feasible)."""
    rejected: list[Rejection]
    hints: list[str] = field(default_factory=list)
    """When infeasible: what would make the job feasible."""
    candidates_evaluated: int = 0
    planning_seconds: float = 0.0
    caveats: list[str] = field(default_factory=list)
    """What the chosen plan's figures rest on that may not hold (a flagged price)."""

    @property
    def ok(self) -> bool:
        return self.chosen is not None


# ----------------------------------------------------------------------------- stage 1: offerings


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
) -> tuple[list[tuple[InstanceType, CapacityType, float]], list[Rejection]]:
    """Instance x capacity pairs the constraints and policy allow, with their price after overrides.

    A price the catalog flags (:func:`flagged_price`) is rejected (category ``price``) unless
    ``allow_flagged_prices``; a policy price override replaces it and so is never flagged.
    """
    c = spec.constraints
    allowed: list[tuple[InstanceType, CapacityType, float]] = []
    rejected: list[Rejection] = []
    gpu_ids_user = {catalog.gpu(g).id for g in c.gpu_types}
    gpu_ids_policy = {catalog.gpu(g).id for g in policy.allowed_gpu_types}
    spot_mode = SpotPolicy(policy.spot.mode) if policy.spot.mode == "never" else c.spot
    for inst in catalog.instances:
        for cap in (CapacityType.ON_DEMAND, CapacityType.SPOT):

            def reject(
                category: str, reason: str, inst: InstanceType = inst, cap: CapacityType = cap
            ) -> None:
                rejected.append(Rejection(inst.name, cap.value, category, reason))

            price = policy.price(inst, cap)
            if price is None:
                continue  # the capacity type does not exist for this instance; not worth a line
            if gpu_ids_user and inst.gpu_id not in gpu_ids_user:
                reject("constraint", f"GPU {inst.gpu_id} not in constraints.gpuTypes")
            elif c.instance_types and not _matches(inst.name, c.instance_types):
                reject("constraint", "not in constraints.instanceTypes")
            elif c.providers and inst.provider not in c.providers:
                reject("constraint", f"provider {inst.provider} not in constraints.providers")
            elif c.regions and inst.region not in c.regions:
                reject("constraint", f"region {inst.region} not in constraints.regions")
            elif gpu_ids_policy and inst.gpu_id not in gpu_ids_policy:
                reject("policy", f"policy {policy.name}: GPU {inst.gpu_id} not in allowedGpuTypes")
            elif policy.allowed_instance_types and not _matches(inst.name, policy.allowed_instance_types):
                reject("policy", f"policy {policy.name}: not in allowedInstanceTypes")
            elif policy.providers and inst.provider not in policy.providers:
                reject("policy", f"policy {policy.name}: provider {inst.provider} not allowed")
            elif policy.regions and inst.region not in policy.regions:
                reject("policy", f"policy {policy.name}: region {inst.region} not allowed")
            elif cap is CapacityType.SPOT and spot_mode is SpotPolicy.NEVER:
                who = f"policy {policy.name}" if policy.spot.mode == "never" else "constraints.spot"
                reject(
                    "policy" if policy.spot.mode == "never" else "constraint", f"{who}: spot is never used"
                )
            elif (
                cap is CapacityType.SPOT
                and job.deadline_h is not None
                and job.deadline_h < policy.spot.min_hours_to_deadline
            ):
                reject(
                    "policy",
                    f"policy {policy.name}: spot needs >= {policy.spot.min_hours_to_deadline:g} h to the deadline, "
                    f"{job.deadline_h:.1f} h left",
                )
            elif not allow_flagged_prices and (caveat := flagged_price(inst, cap, price)):
                reject(
                    "price",
                    f"{caveat}; left out (set a policy priceOverride for it, or plan with --allow-flagged-prices)",
                )
            else:
                allowed.append((inst, cap, price))
    return allowed, rejected


# ----------------------------------------------------------------------------- stage 2: configure


def _precisions(spec: TrainingJobSpec, policy: Policy) -> list[Precision]:
    # fp8 training needs Transformer Engine and numerics work of its own: only when the job asks.
    if spec.constraints.precisions:
        wanted = [Precision(p.value) for p in spec.constraints.precisions]
    else:
        wanted = [Precision.FP32, Precision.AMP]
    if policy.allowed_precisions:
        wanted = [p for p in wanted if p.value in policy.allowed_precisions]
    return wanted


@cache
def _divisors_desc(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}, reverse=True))


def configure(
    workload: Workload,
    inst: InstanceType,
    nodes: int,
    precision: Precision,
    global_batch: int,
    channels_last: bool = False,
    data_loader: str = "pytorch",
) -> tuple[ParallelConfig | None, str]:
    """The fastest-to-run configuration that fits, or None with the reason.

    Prefers, in order: no memory savers, activation checkpointing, then ZeRO stages 1-3; within each,
    the largest micro-batch (fewest accumulation steps) that fits. The micro-batch is chosen per
    precision, so mixed precision's smaller activations buy a larger micro-batch, which the model
    runs more efficiently (fixed host time and wave quantization amortised): the two are coupled.
    """
    gpus = inst.gpu_count * nodes
    if global_batch % gpus:
        return None, f"global batch {global_batch} is not divisible by {gpus} GPUs"
    per_gpu = global_batch // gpus
    options = [(0, False), (0, True)] + ([(1, True), (2, True), (3, True)] if gpus > 1 else [])
    divisors = _divisors_desc(per_gpu)  # largest micro-batch first
    smallest = math.inf
    for zero, ckpt in options:

        def config(micro: int, zero: int = zero, ckpt: bool = ckpt) -> ParallelConfig:
            return ParallelConfig(
                micro_batch=micro,
                precision=precision,
                gpus_per_node=inst.gpu_count,
                nodes=nodes,
                accumulation=per_gpu // micro,
                zero_stage=zero,
                activation_checkpointing=ckpt,
                network_gbps=inst.network_gbps,
                vcpus_per_node=inst.vcpu,
                channels_last=channels_last,
                data_loader=data_loader,
            )

        # Memory grows with the micro-batch, so "fits" flips once along the descending divisors:
        # bisect for the first (largest) micro-batch that fits.
        lowest = memory_per_gpu(workload, inst.gpu, config(divisors[-1]))
        if not lowest.fits:
            smallest = min(smallest, lowest.total)
            continue
        lo, hi = 0, len(divisors) - 1  # divisors[hi] fits
        while lo < hi:
            mid = (lo + hi) // 2
            if memory_per_gpu(workload, inst.gpu, config(divisors[mid])).fits:
                hi = mid
            else:
                lo = mid + 1
        return config(divisors[hi]), ""
    return None, (
        f"does not fit: needs {smallest / 1e9:.1f} GB per GPU even at micro-batch 1 with activation "
        f"checkpointing{' and ZeRO-3' if gpus > 1 else ''}; {inst.gpu_id} has {inst.gpu.memory_gb:g} GB"
    )


# ----------------------------------------------------------------------------- stage 3: evaluate


def checkpoint_write_seconds(
    workload: Workload, cfg: ParallelConfig, policy: Policy, override: float | None
) -> float:
    """Seconds to write one checkpoint: fp32 weights + optimizer state, written in parallel by nodes
    when sharded (ZeRO), by one node otherwise."""
    if override is not None:
        return override
    mem = constants()["memory"]
    per_param = 4.0 + float(mem["optimizer_state_bytes"].get(workload.optimizer, 8))
    writers = cfg.nodes if cfg.zero_stage >= 1 else 1
    return CHECKPOINT_FIXED_S + workload.params * per_param / (
        policy.checkpoint_write_gbps / 8 * 1e9 * writers
    )


def evaluate(
    job: ResolvedJob,
    spec: TrainingJobSpec,
    policy: Policy,
    inst: InstanceType,
    cap: CapacityType,
    price: float,
    cfg: ParallelConfig,
    est: Estimate,
    band: Band | None = None,
) -> Candidate:
    """A configured offering with its predicted time, cost and risk.

    Args:
        job: The resolved job.
        spec: Its spec (checkpoint settings).
        policy: The policy (checkpoint bounds and write speed).
        inst: The instance type.
        cap: The capacity type.
        price: Price per node-hour after overrides.
        cfg: The parallel configuration.
        est: The (possibly corrected) estimate.
        band: The throughput band of ``est`` (None: the model's band for this GPU and precision).

    Returns:
        The candidate; its deadline risk includes the band's model error.
    """
    nodes = cfg.nodes
    if band is None:
        band = throughput_band(job.workload, inst.gpu, cfg.precision, est.throughput)
    work_h = job.total_samples / est.throughput / 3600.0
    write_s = checkpoint_write_seconds(job.workload, cfg, policy, spec.checkpoint.write_seconds)
    rate = hourly_rate(inst.interruption_bucket) * nodes if cap is CapacityType.SPOT else 0.0
    lo, hi = float(policy.min_checkpoint_interval_s), float(policy.max_checkpoint_interval_s)
    interval = (
        float(spec.checkpoint.interval_seconds)
        if spec.checkpoint.interval_seconds
        else optimal_interval_s(write_s, rate, lo, hi)
    )
    out = outlook(
        work_h, rate, write_s, spec.checkpoint.restart_seconds, STARTUP_S, interval, job.deadline_h, band.log_sigma
    )
    return Candidate(
        instance=inst,
        nodes=nodes,
        capacity=cap,
        precision=cfg.precision,
        micro_batch=cfg.micro_batch,
        accumulation=cfg.accumulation,
        zero_stage=cfg.zero_stage,
        activation_checkpointing=cfg.activation_checkpointing,
        estimate=est,
        usd_per_hour=price * nodes,
        work_hours=work_h,
        checkpoint_write_s=write_s,
        outlook=out,
        band=band,
        price_caveat=flagged_price(inst, cap, price),
    )


def corrected(est: Estimate, factor: float) -> Estimate:
    """An estimate with its throughput multiplied by an observed efficiency factor (step time divided)."""
    if factor <= 0:
        raise ValueError(f"efficiency factor must be > 0, got {factor}")
    return replace(est, throughput=est.throughput * factor, step_time_s=est.step_time_s / factor)


# ----------------------------------------------------------------------------- stage 4: solve


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Plans not beaten on both expected cost and expected time, fastest first."""
    front: list[Candidate] = []
    best_cost = math.inf
    for c in sorted(cands, key=lambda c: (c.expected_hours, c.expected_cost_usd)):
        if c.expected_cost_usd < best_cost - 1e-9:
            front.append(c)
            best_cost = c.expected_cost_usd
    return front


def _violations(
    c: Candidate, job: ResolvedJob, spec: TrainingJobSpec, policy: Policy
) -> list[tuple[str, str]]:
    out = []
    risk = spec.constraints.max_deadline_risk
    if job.deadline_h is not None and c.outlook.deadline_miss_probability > risk:
        out.append(
            (
                "deadline",
                f"misses the {job.deadline_h:.1f} h deadline: expected {c.expected_hours:.1f} h, "
                f"P(miss) {c.outlook.deadline_miss_probability:.0%} > {risk:.0%}",
            )
        )
    if job.budget_usd is not None and c.expected_cost_usd > job.budget_usd:
        out.append(("budget", f"over budget: ${c.expected_cost_usd:,.0f} > ${job.budget_usd:,.0f}"))
    if policy.max_usd_per_job is not None and c.expected_cost_usd > policy.max_usd_per_job:
        out.append(
            (
                "policy",
                f"policy {policy.name}: maxUsdPerJob ${policy.max_usd_per_job:,.0f} < "
                f"${c.expected_cost_usd:,.0f}",
            )
        )
    if policy.max_usd_per_hour is not None and c.usd_per_hour > policy.max_usd_per_hour:
        out.append(
            (
                "policy",
                f"policy {policy.name}: maxUsdPerHour ${policy.max_usd_per_hour:,.2f} < "
                f"${c.usd_per_hour:,.2f}/h",
            )
        )
    return out


def _gpu_cap(spec: TrainingJobSpec, policy: Policy) -> tuple[int, str]:
    caps = [(DEFAULT_MAX_GPUS, "gpuscaler's default limit")]
    if spec.constraints.max_gpus:
        caps.append((spec.constraints.max_gpus, "constraints.maxGpus"))
    if policy.max_gpus_per_job:
        caps.append((policy.max_gpus_per_job, f"policy {policy.name} maxGpusPerJob"))
    return min(caps)


def plan(
    spec: TrainingJobSpec,
    catalog: Catalog,
    policy: Policy | None = None,
    *,
    name: str = "trainingjob",
    now: datetime | None = None,
    deadline_h: float | None = None,
    unavailable: frozenset[tuple[str, str]] = frozenset(),
    efficiency: Mapping[str, float] | None = None,
    efficiency_sigma: Mapping[str, float] | None = None,
    allow_flagged_prices: bool = False,
) -> PlanResult:
    """Plan a training job.

    Args:
        spec: the TrainingJob spec.
        catalog: GPUs, instances (with prices) and workloads.
        policy: the platform policy in force; no restrictions when None.
        name: the job's name, for messages.
        now: the time the deadline is measured from (now when None).
        deadline_h: override of the hours left (the operator passes the time left after progress).
        unavailable: (instance type, capacity type) pairs known to lack capacity right now.
        efficiency: observed / predicted throughput of this job per GPU id (the operator's
            ``status.observed.efficiencyByGpu``, see :mod:`gpuscaler.observe.assess`): each
            candidate's predicted throughput on that GPU is multiplied by it; GPUs not listed keep
            the model's prediction.
        efficiency_sigma: how sure each factor of ``efficiency`` is (log-space sigma, from
            :func:`gpuscaler.planner.correction.correct`); a measured GPU's band is drawn with it
            (at least :data:`~gpuscaler.planner.correction.MEASURED_LOG_SIGMA_FLOOR` when not given)
            instead of the model's cross-validated error.
        allow_flagged_prices: plan on spot prices the catalog flags as suspicious (with a caveat).

    Returns:
        The plan result; ``chosen`` is None when no plan is feasible, with ``hints``.

    Raises:
        UnknownIdError: unknown workload or GPU id in the spec or policy.
        JobError: the spec cannot be planned as written.
    """
    t0 = time.perf_counter()
    pol = policy or Policy()
    dl = deadline_h if deadline_h is not None else spec.deadline_hours(now)
    check_constraints(spec, catalog, max(i.gpu_count for i in catalog.instances) * NODE_COUNTS[-1])
    job = resolve(spec, catalog, name, dl)
    offers, rejected = offerings(job, spec, catalog, pol, allow_flagged_prices)
    gpu_cap, cap_source = _gpu_cap(spec, pol)
    precisions = _precisions(spec, pol)

    fitting: list[Candidate] = []
    feasible: list[Candidate] = []
    over_cap: list[Candidate] = []  # beyond the GPU cap: kept only to say what the deadline would need
    reasons: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    evaluated = 0
    estimates: dict[tuple[str, int, Precision], tuple[ParallelConfig, Estimate, Band] | str] = {}
    for inst, cap, price in offers:
        key2 = (inst.name, cap.value)
        if key2 in unavailable:
            rejected.append(
                Rejection(inst.name, cap.value, "capacity", "no capacity right now (recent shortage)")
            )
            continue
        for nodes in NODE_COUNTS:
            gpus = inst.gpu_count * nodes
            if gpus < spec.constraints.min_gpus:
                continue
            if spec.constraints.max_nodes and nodes > spec.constraints.max_nodes:
                continue
            if gpus > max(gpu_cap * 4, 64) or gpus > job.global_batch:
                break
            for precision in precisions:
                ekey = (inst.name, nodes, precision)
                if ekey not in estimates:  # spot and on-demand share the performance
                    try:
                        cfg, why = configure(
                            job.workload,
                            inst,
                            nodes,
                            precision,
                            job.global_batch,
                            job.channels_last,
                            job.data_loader,
                        )
                    except PrecisionUnsupportedError as err:
                        cfg, why = None, str(err)
                    if cfg is None:
                        estimates[ekey] = why
                    else:
                        try:
                            est0 = estimate(job.workload, inst.gpu, cfg)
                            band0 = throughput_band(job.workload, inst.gpu, precision, est0.throughput)
                            if efficiency and inst.gpu_id in efficiency:
                                factor = efficiency[inst.gpu_id]
                                est0 = corrected(est0, factor)
                                measured = (efficiency_sigma or {}).get(inst.gpu_id, MEASURED_LOG_SIGMA_FLOOR)
                                band0 = band0.scaled(factor, max(measured, MEASURED_LOG_SIGMA_FLOOR))
                            estimates[ekey] = (cfg, est0, band0)
                            evaluated += 1
                        except PrecisionUnsupportedError as err:
                            estimates[ekey] = str(err)
                found = estimates[ekey]
                if isinstance(found, str):
                    category = (
                        "precision" if "has no" in found else "batch" if "divisible" in found else "memory"
                    )
                    reasons[key2].setdefault(category, found)
                    continue
                cand = evaluate(job, spec, pol, inst, cap, price, found[0], found[1], found[2])
                if gpus > gpu_cap:
                    over_cap.append(cand)
                    reasons[key2].setdefault("policy", f"{gpus} GPUs > {gpu_cap} ({cap_source})")
                    continue
                fitting.append(cand)
                bad = _violations(cand, job, spec, pol)
                if bad:
                    for category, text in bad:
                        reasons[key2].setdefault(category, text)
                else:
                    feasible.append(cand)

    chosen, why = _solve(feasible, spec, job)
    caveats = [chosen.price_caveat] if chosen is not None and chosen.price_caveat else []
    if caveats:
        why += f"; caveat: {caveats[0]}"
    have = {(c.instance.name, c.capacity.value) for c in feasible}
    order = ("deadline", "budget", "policy", "memory", "batch", "precision")
    for (inst_name, cap_name), by_cat in reasons.items():
        if (inst_name, cap_name) in have:
            continue
        for category in order:
            if category in by_cat:
                rejected.append(Rejection(inst_name, cap_name, category, by_cat[category]))
                break
    hints = [] if chosen else _hints(job, spec, pol, fitting, over_cap, gpu_cap, cap_source)
    front = pareto_front(feasible if feasible else fitting)
    return PlanResult(
        job=job,
        objective=spec.objective,
        chosen=chosen,
        why=why,
        feasible=feasible,
        pareto=front,
        rejected=sorted(rejected, key=lambda r: (r.category, r.instance, r.capacity)),
        hints=hints,
        candidates_evaluated=evaluated,
        planning_seconds=time.perf_counter() - t0,
        caveats=caveats,
    )


def _solve(
    feasible: list[Candidate], spec: TrainingJobSpec, job: ResolvedJob
) -> tuple[Candidate | None, str]:
    if not feasible:
        return None, "no plan meets every requirement"
    pool = feasible
    spot_note = ""
    if spec.constraints.spot is SpotPolicy.PREFERRED:
        spot = [c for c in feasible if c.capacity is CapacityType.SPOT]
        if spot:
            pool, spot_note = spot, "; spot preferred"
    if spec.objective is Objective.FASTEST:
        best = min(pool, key=lambda c: (c.expected_hours, c.expected_cost_usd))
        why = f"fastest plan within the ${job.budget_usd:,.0f} budget" if job.budget_usd else "fastest plan"
    else:
        best = min(pool, key=lambda c: (c.expected_cost_usd, c.expected_hours))
        parts = ["cheapest plan"]
        if job.deadline_h is not None:
            parts.append(
                f"that meets the {job.deadline_h:.1f} h deadline "
                f"(P(miss) {best.outlook.deadline_miss_probability:.1%})"
            )
        if job.budget_usd is not None:
            parts.append(f"within the ${job.budget_usd:,.0f} budget")
        why = " ".join(parts)
    runner_up = [c for c in pool if c.instance.name != best.instance.name or c.capacity != best.capacity]
    if runner_up and spec.objective is Objective.CHEAPEST:
        nxt = min(runner_up, key=lambda c: c.expected_cost_usd)
        why += f"; next best {nxt.label} costs ${nxt.expected_cost_usd:,.0f}"
    return best, why + spot_note


def _hints(
    job: ResolvedJob,
    spec: TrainingJobSpec,
    policy: Policy,
    fitting: list[Candidate],
    over_cap: list[Candidate],
    gpu_cap: int,
    cap_source: str,
) -> list[str]:
    hints: list[str] = []
    if not fitting and not over_cap:
        return [
            f"no allowed instance fits {job.workload.id} in memory at global batch {job.global_batch}: "
            "allow larger-memory GPUs, or change the global batch so it divides by the GPU count"
        ]
    if job.deadline_h is not None:
        ok_time = [
            c for c in fitting if c.outlook.deadline_miss_probability <= spec.constraints.max_deadline_risk
        ]
        if not ok_time:
            fastest = min(fitting, key=lambda c: c.expected_hours) if fitting else None
            if fastest:
                hints.append(
                    f"the fastest allowed plan, {fastest.label}, takes {fastest.expected_hours:.1f} h; "
                    f"the deadline is {job.deadline_h:.1f} h away: extend the deadline"
                )
            meeting = [
                c
                for c in over_cap
                if c.outlook.deadline_miss_probability <= spec.constraints.max_deadline_risk
            ]
            if meeting:
                need = min(meeting, key=lambda c: (c.gpus, c.expected_cost_usd))
                hints.append(
                    f"the deadline needs at least {need.gpus} {need.instance.gpu_id} GPUs "
                    f"({need.label}); {cap_source} allows {gpu_cap}"
                )
        elif job.budget_usd is not None:
            cheapest = min(ok_time, key=lambda c: c.expected_cost_usd)
            hints.append(
                f"the cheapest plan that meets the deadline, {cheapest.label}, costs "
                f"${cheapest.expected_cost_usd:,.0f}: raise the budget to that or relax the deadline"
            )
    elif job.budget_usd is not None or policy.max_usd_per_job is not None:
        cheapest = min(fitting, key=lambda c: c.expected_cost_usd)
        hints.append(f"the cheapest allowed plan, {cheapest.label}, costs ${cheapest.expected_cost_usd:,.0f}")
    if not hints:
        hints.append(
            "no allowed plan meets the policy's spending caps; ask the platform team or shrink the job"
        )
    return hints
