"""Stage 3 of the planner, evaluate: a configured offering's predicted time, cost and risk.

For a configuration (``m`` micro-batch, ``K`` accumulation, savers) on ``g`` GPUs the
performance model predicts the throughput ``X`` (items/s) and its band (P10/P90 from the model's
cross-validated error, log-space sigma ``s``). With ``S`` samples to train:

```
W   = S / X / 3600                       work hours at the predicted throughput
C   = fixed + P x bytes/param / (bandwidth x writers)   seconds per checkpoint (writers: nodes under ZeRO)
tau = sqrt(2 C / lambda)                 Young/Daly interval, lambda = n x hourly rate of the bucket (spot)
T   = (W (1 + C/tau) + startup) / (1 - lambda (restart + tau/2))   expected hours with interruptions
cost = T x price x n                     expected US dollars
P(miss) = sum_k Poisson(k; lambda T0) P(W' / f > D - startup - k (restart + tau)),  ln f ~ N(0, s^2)
```

(:mod:`gpuscaler.planner.risk` derives ``T`` and ``P(miss)``.) A GPU with observed efficiency
``e`` (the operator's correction) has ``X`` multiplied by ``e`` and its band drawn around the
measurement instead of the model's error. Else, with performance profiles (``profiles``), a
configuration the cluster measured takes the measured band, and one near a measured one the
model's estimate moved by the measured ratio (:mod:`gpuscaler.planner.profiles`, the maths there).

The model's answer for an instance type, node count and precision does not depend on the
capacity type, so :class:`Performance` computes it once per such triple and both capacity types
of the offering reuse it (with the work hours and checkpoint seconds, which do not depend on it
either); only the interruption rate and the price differ between them. Nor does it depend on
prices, the deadline or the policy: :func:`predict` keeps it across plans of the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import NamedTuple

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, InstanceType, Precision, Workload
from gpuscaler.perfmodel import Estimate, ParallelConfig, PrecisionUnsupportedError, constants, estimate
from gpuscaler.perfmodel.uncertainty import Band, throughput_band
from gpuscaler.planner.candidate import Candidate, Reason, Refusal
from gpuscaler.planner.configure import configure
from gpuscaler.planner.correction import MEASURED_LOG_SIGMA_FLOOR
from gpuscaler.planner.job import ResolvedJob
from gpuscaler.planner.offerings import Offering
from gpuscaler.planner.profiles import MeasuredPrior, ProfileKey, ProfileStore, signature_of
from gpuscaler.planner.risk import hourly_rate, optimal_interval_s, outlook
from gpuscaler.policy import Policy

STARTUP_S = 180.0
"""Provisioning plus container start before the first step (assumption; cloud GPU nodes take 2-5 min)."""
CHECKPOINT_FIXED_S = 2.0
"""Fixed cost of one checkpoint on top of the bytes written (sync, rename, metadata)."""
PREDICTION_CACHE_SIZE = 65536
"""Predictions kept across plans (:func:`predict`): one plan asks for at most ~600 (33 instance
types x 15 node counts x 2 precisions, most cut short), each entry a few hundred bytes, so about
a hundred different jobs' worth in ~20 MB."""


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


def corrected(est: Estimate, factor: float) -> Estimate:
    """An estimate with its throughput multiplied by an observed efficiency factor (step time divided)."""
    if factor <= 0:
        raise ValueError(f"efficiency factor must be > 0, got {factor}")
    return replace(est, throughput=est.throughput * factor, step_time_s=est.step_time_s / factor)


class Run(NamedTuple):
    """A configuration with the model's prediction: what both capacity types of an offering share.

    A named tuple, as :class:`~gpuscaler.planner.candidate.Candidate`: built hundreds of times per plan.
    """

    cfg: ParallelConfig
    est: Estimate
    band: Band
    work_h: float
    """Training hours at ``est``'s throughput."""
    write_s: float
    """Seconds per checkpoint."""
    prior: MeasuredPrior | None = None
    """The performance profile ``est`` and ``band`` come from (None: the model, or the job's own correction)."""


@dataclass
class Performance:
    """The model's answers for one plan, computed once per (instance type, nodes, precision).

    Attributes:
        job: the resolved job.
        spec: its spec (checkpoint write override).
        policy: the policy (checkpoint write bandwidth).
        efficiency: observed / predicted throughput per GPU id (see :func:`gpuscaler.planner.plan`).
        efficiency_sigma: how sure each factor is (log-space sigma).
        profiles: measured priors (:mod:`gpuscaler.planner.profiles`); a GPU with an observed
            efficiency of this job keeps that instead.
        now: profiles not seen for their TTL before this are ignored (None: none is).
        evaluated: how many configurations the model was asked about.
    """

    job: ResolvedJob
    spec: TrainingJobSpec
    policy: Policy
    efficiency: Mapping[str, float] | None = None
    efficiency_sigma: Mapping[str, float] | None = None
    profiles: ProfileStore | None = None
    now: datetime | None = None
    evaluated: int = 0
    _runs: dict[tuple[str, int, Precision], Run | Refusal] = field(default_factory=dict)
    _signature: str | None = None

    def __post_init__(self) -> None:
        if self.profiles:
            sig = signature_of(self.spec.workload, self.job.workload.id).id
            self._signature = sig if self.profiles.has(sig) else None

    @property
    def profiled(self) -> bool:
        """Profiles of the job's workload were consulted."""
        return self._signature is not None

    def run(self, inst: InstanceType, nodes: int, precision: Precision) -> Run | Refusal:
        """The configuration of ``nodes`` x ``inst`` at ``precision`` with its prediction, or why none.

        A precision the GPU cannot run (the model's ``INVALID_INPUT`` error for this one
        configuration) is a :class:`Refusal` with ``Reason.PRECISION``, not a failed plan.
        """
        key = (inst.name, nodes, precision)
        found = self._runs.get(key)
        if found is None:
            found = self._runs[key] = self._compute(inst, nodes, precision)
        return found

    def _compute(self, inst: InstanceType, nodes: int, precision: Precision) -> Run | Refusal:
        job = self.job
        found = predict(
            job.workload, inst, nodes, precision, job.global_batch, job.channels_last, job.data_loader
        )
        if isinstance(found, Refusal):
            return found
        cfg, est, band = found
        prior: MeasuredPrior | None = None
        if self.efficiency and inst.gpu_id in self.efficiency:
            factor = self.efficiency[inst.gpu_id]
            est = corrected(est, factor)
            measured = (self.efficiency_sigma or {}).get(inst.gpu_id, MEASURED_LOG_SIGMA_FLOOR)
            band = band.scaled(factor, max(measured, MEASURED_LOG_SIGMA_FLOOR))
        elif self._signature is not None and self.profiles is not None:
            key = ProfileKey(
                self._signature, inst.gpu_id, cfg.gpus_per_node * cfg.nodes, cfg.nodes, cfg.micro_batch,
                cfg.accumulation, precision.value,
            )  # fmt: skip
            prior = self.profiles.prior_for(key, est.throughput, band.log_sigma, self.now)
            if prior is not None:
                band = prior.band(band)
                est = corrected(est, prior.factor)
        self.evaluated += 1
        work_h = job.total_samples / est.throughput / 3600.0
        write_s = checkpoint_write_seconds(job.workload, cfg, self.policy, self.spec.checkpoint.write_seconds)
        return Run(cfg, est, band, work_h, write_s, prior)


@lru_cache(maxsize=PREDICTION_CACHE_SIZE)
def predict(
    workload: Workload,
    inst: InstanceType,
    nodes: int,
    precision: Precision,
    global_batch: int,
    channels_last: bool,
    data_loader: str,
) -> tuple[ParallelConfig, Estimate, Band] | Refusal:
    """The configuration of ``nodes`` x ``inst`` at ``precision`` and the model's prediction for it.

    Pure in its arguments (all immutable: the catalog's frozen rows), so it is memoised across
    plans: the operator re-plans the same job (a spec change, a spot notice, an observed
    correction) and the simulator plans the same shapes again and again; a re-plan then costs only
    the stages that depend on prices, the deadline and the policy. The observed efficiency is
    applied by the caller, after the cache.

    Returns:
        ``(config, estimate, band)``, or a refusal: ``Reason.BATCH``, ``Reason.MEMORY``, or
        ``Reason.PRECISION`` for a precision the GPU cannot run (the model's ``INVALID_INPUT``
        error for this one configuration, not a failed plan).
    """
    try:
        cfg, refusal = configure(workload, inst, nodes, precision, global_batch, channels_last, data_loader)
        if cfg is None:
            assert refusal is not None
            return refusal
        est = estimate(workload, inst.gpu, cfg)
    except PrecisionUnsupportedError as err:
        return Refusal(Reason.PRECISION, str(err))
    return cfg, est, throughput_band(workload, inst.gpu, precision, est.throughput)


def evaluate(
    job: ResolvedJob,
    spec: TrainingJobSpec,
    policy: Policy,
    offer: Offering,
    run: Run,
    caveat: str,
) -> Candidate:
    """A configured offering with its predicted time, cost and risk (see the module docstring).

    Args:
        job: the resolved job.
        spec: its spec (checkpoint interval and restart seconds).
        policy: the policy (checkpoint interval bounds).
        offer: the offering (instance type, capacity type, zone, price per node-hour after
            overrides, the price's source and date).
        run: the configuration and its prediction.
        caveat: :func:`~gpuscaler.planner.offerings.flagged_price` of the offering (the same for
            all its configurations, so the caller works it out once).

    Returns:
        The candidate; its deadline risk includes the band's model error.
    """
    inst, cap = offer.instance, offer.capacity
    nodes = run.cfg.nodes
    rate = hourly_rate(inst.interruption_bucket) * nodes if cap is CapacityType.SPOT else 0.0
    lo, hi = float(policy.min_checkpoint_interval_s), float(policy.max_checkpoint_interval_s)
    interval = (
        float(spec.checkpoint.interval_seconds)
        if spec.checkpoint.interval_seconds
        else optimal_interval_s(run.write_s, rate, lo, hi)
    )
    out = outlook(
        run.work_h, rate, run.write_s, spec.checkpoint.restart_seconds, STARTUP_S, interval, job.deadline_h,
        run.band.log_sigma,
    )  # fmt: skip
    cfg = run.cfg
    return Candidate(
        instance=inst,
        nodes=nodes,
        capacity=cap,
        precision=cfg.precision,
        micro_batch=cfg.micro_batch,
        accumulation=cfg.accumulation,
        zero_stage=cfg.zero_stage,
        activation_checkpointing=cfg.activation_checkpointing,
        estimate=run.est,
        usd_per_hour=offer.usd_per_hour * nodes,
        work_hours=run.work_h,
        checkpoint_write_s=run.write_s,
        outlook=out,
        band=run.band,
        price_caveat=caveat,
        zone=offer.zone,
        price_source=offer.price_source,
        price_date=offer.price_date,
        prior=run.prior,
    )
