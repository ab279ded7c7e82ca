"""Performance profiles: what the cluster measured of a workload, kept as priors for its next plans.

Pure (no I/O, no clock of its own, no Kubernetes). Used by three callers with one rule:

* the planner (:func:`gpuscaler.planner.plan`, ``profiles=``): every configuration it evaluates
  asks :meth:`ProfileStore.prior_for` whether a measurement replaces or moves the model's estimate;
* the operator (:mod:`gpuscaler.controller.profiles`): when a job succeeds, :func:`measure_run`
  turns the progress readings the operator itself kept (``status.observed.progressPoints``, each
  one passed :mod:`gpuscaler.kube.reports`) into a :class:`RunMeasurement`, and
  :meth:`ProfileStore.record` folds it into the profile (stored as a ``PerformanceProfile``);
* the simulator, whose simulated operator records and plans through the same two calls.

**The key.** A profile is the measurement of one configuration of one workload signature:
``(signature, GPU type, GPUs, nodes, micro-batch, accumulation, precision)``
(:class:`ProfileKey`). The signature is the job's *declared* shape (``spec.workload`` as written,
the named model resolved to its catalog id: model id, or transformer layers/hidden/heads/sequence
length/vocabulary, or parameters and FLOPs per sample, plus the input pipeline); never code or data.

**One run.** ``x`` = the run's measured samples/s over its usable window, ``s_m`` = its relative
standard error (at least :data:`RUN_LOG_SIGMA_FLOOR`). **Over runs** (in log space, ``y = ln x``),
an exponentially weighted mean and variance whose weight is ``1/n`` until ``memory_runs`` runs and
``1/memory_runs`` after (old runs fade: a framework upgrade changes the speed)::

    w = 1 / min(n + 1, memory_runs)
    mean' = mean + w (y - mean)
    var'  = (1 - w) (var + w (y - mean)^2)            (Welford's update while w = 1/(n+1))

**What the next run will do** (the predictive band an exact match plans with)::

    s_run  = max(sqrt(var n / (n - 1)) [n >= 2],  s_m (RMS over runs),  RUN_LOG_SIGMA_FLOOR)
    s_pred = s_run sqrt(1 + 1 / n_eff),     n_eff = min(n, memory_runs)
    P50 = exp(mean),  P10/P90 = P50 exp(-/+ 1.2816 s_pred)

**Exact match** (same signature, GPU type, GPUs, nodes, micro-batch, accumulation, precision): the
model's estimate is *replaced* by the measured band above.

**Near match** (same signature; another GPU count, node count, micro-batch, accumulation, GPU type or
precision): the model's estimate ``X_c`` of the candidate is moved by the profile's measured ratio
``r = x / X_p`` (``X_p`` the model's estimate of the profile's own configuration, stored with it) as
far as the model's errors on two ways to run one code go together::

    rho = error_correlation(profile's GPU type and precision, candidate's)
    w   = s_model^2 / (s_model^2 + s_pred^2)                 (s_model: the candidate's model band)
    ln f = rho w ln r,   X = X_c f,   s = s_model sqrt(1 - rho^2 w)

the candidate's log error given the profile's measured one, both drawn from the model's band (a
bivariate normal's conditional; the profile's configuration is taken to have the candidate's band).
``rho`` is :func:`gpuscaler.perfmodel.uncertainty.error_correlation`: the correlation of the model's
cross-validated log errors on two held-out rows of one training code, 0.94 on the same GPU type and
precision and 0.76 across them (:func:`gpuscaler.planner.decisions.error_correlations` recomputes
both from the fold predictions; the contingency reads a fallback's speed from a plan's measurement
by the same numbers). So one run moves *every* configuration of the code, its own GPU type and
precision most: moving only the nearest ones left the others at the model's figures, and where the
model was wrong for the whole workload the planner then preferred the configurations nobody had
measured (the decision scores, ``docs/decision-scores.md``: after one profiled run, mean regret
2.0% and worst 195% that way against 0.2% and 5% this way). Of several near profiles the one giving
the smallest ``s`` is used (then the one with more runs).

**Bounded.** A store keeps at most ``cap_per_workload`` profiles per signature (the least recently
seen goes first) and ignores, and :meth:`ProfileStore.prune` removes, those not seen for ``ttl``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import NamedTuple

from gpuscaler.api import WorkloadSpec
from gpuscaler.perfmodel.uncertainty import Z90, Band, error_correlation
from gpuscaler.planner.correction import (
    MAX_FACTOR,
    MEASURED_LOG_SIGMA_FLOOR,
    MIN_FACTOR,
    CorrectionConfig,
    ProgressPoint,
    measure,
)

RUN_LOG_SIGMA_FLOOR = MEASURED_LOG_SIGMA_FLOOR
"""Least log-space sigma of one run's throughput as a prediction of the next (the same few percent
by which a window differs from a run's average, :data:`~gpuscaler.planner.correction.MEASURED_LOG_SIGMA_FLOOR`)."""
DEFAULT_TTL = timedelta(days=90)
"""Profiles not seen for this long are ignored and pruned (``GPUSCALER_PROFILES_TTL_DAYS``)."""
DEFAULT_CAP_PER_WORKLOAD = 16
"""Profiles kept per workload signature (``GPUSCALER_PROFILES_PER_WORKLOAD``)."""
DEFAULT_MEMORY_RUNS = 20
"""Runs after which the mean becomes an exponential moving average (``GPUSCALER_PROFILES_MEMORY_RUNS``)."""
MAX_RECENT_JOBS = 8
"""Job uids kept on a profile: a job already counted is not counted again (a step repeated after a
crash), and they say where the figures came from."""
DEFAULT_ACHIEVED_TOLERANCE = 0.25
"""A run's window rate and the rate the job achieved from its first report to its completion may
differ by this fraction at most (``GPUSCALER_PROFILES_ACHIEVED_TOLERANCE``); see :func:`measure_run`."""


# ------------------------------------------------------------------------------------ identity


@dataclass(frozen=True, slots=True)
class Signature:
    """A workload's declared shape and its id (a hash of it)."""

    id: str
    """16 hex digits of the SHA-256 of ``shape``."""
    workload: str
    """The workload id (the catalog's, or the planner's name for a custom one), for people."""
    shape: str
    """Canonical JSON of the declared shape."""

    def labels(self, instance_type: str = "", unit: str = "samples") -> ProfileLabels:
        """The labels of a run of this signature on ``instance_type``, counted in ``unit``."""
        return ProfileLabels(self.workload, self.shape, instance_type, unit)


def signature_of(workload: WorkloadSpec, workload_id: str) -> Signature:
    """The signature of a job's ``spec.workload`` (a named model under its resolved catalog id).

    Args:
        workload: The declared workload (model, transformer shape, or parameters and FLOPs).
        workload_id: Its resolved id (:attr:`gpuscaler.planner.ResolvedJob.workload`'s ``id``).

    Returns:
        The signature; two specs that declare the same shape (defaults written out or not) have the same id.
    """
    shape = workload.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    if workload.model is not None:
        shape["model"] = workload_id
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return Signature(hashlib.sha256(text.encode()).hexdigest()[:16], workload_id, text)


class ProfileKey(NamedTuple):
    """What a profile measured: one configuration of one signature."""

    signature: str
    gpu_type: str
    gpus: int
    nodes: int
    micro_batch: int
    accumulation: int
    precision: str

    def describe(self) -> str:
        """``8 x A100 on 2 nodes, micro-batch 64 x 2, amp``."""
        on = f" on {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.gpus} x {self.gpu_type}{on}, micro-batch {self.micro_batch} x {self.accumulation}, {self.precision}"


class ProfileLabels(NamedTuple):
    """What a profile says for people beside its key, from the run folded in last."""

    workload: str = ""
    """The signature's workload id."""
    shape: str = ""
    """The signature's declared shape (canonical JSON)."""
    instance_type: str = ""
    unit: str = "samples"


NO_LABELS = ProfileLabels()
"""A run recorded without labels (a profile keeps the labels it has)."""


# ------------------------------------------------------------------------------------ measurement


@dataclass(frozen=True, slots=True)
class RunMeasurement:
    """One run's throughput as the operator judged it."""

    throughput: float
    """Samples/s over the usable window."""
    log_sigma: float
    """Its relative standard error (at least :data:`RUN_LOG_SIGMA_FLOOR`)."""
    model_throughput: float
    """The model's own estimate of the configuration (no correction, no profile), samples/s."""
    at: datetime
    """When the run finished."""
    job: str = ""
    """The job's uid (a run is counted once)."""
    window_s: float = 0.0
    """Seconds measured."""


@dataclass(frozen=True, slots=True)
class NotMeasured:
    """Why a finished run left no measurement."""

    text: str
    suspect: bool = False
    """The reports contradict what the operator saw (out of bounds, or not what the job achieved)."""


def measure_run(
    points: Iterable[ProgressPoint],
    *,
    since: float,
    completed: float,
    total_samples: float,
    model_throughput: float,
    at: datetime,
    job: str = "",
    config: CorrectionConfig | None = None,
    achieved_tolerance: float = DEFAULT_ACHIEVED_TOLERANCE,
) -> RunMeasurement | NotMeasured:
    """A finished run's throughput from the progress readings the operator kept, or why there is none.

    Three checks on top of those every reading passed (:mod:`gpuscaler.kube.reports`: the writer
    rank of the current gang, within the plan, monotone):

    1. enough: at least ``config.min_points`` readings over ``config.min_window_s`` after
       ``config.warmup_s`` (:func:`gpuscaler.planner.correction.measure`);
    2. believable: ``rate / model_throughput`` within ``[MIN_FACTOR, MAX_FACTOR]`` (the correction's bounds);
    3. achieved: the rate from the first reading to the completion the operator itself saw (the
       pods' phases, its own clock) is ``(total_samples - s_first) / (completed - t_first)``; the
       window's rate may differ from it by ``achieved_tolerance`` at most
       (``|ln(rate / achieved)| <= ln(1 + tolerance)``). A writer reporting faster (or slower) than
       it trains cannot also finish sooner (or later) than it does, so an inflated report fails here.

    Args:
        points: ``(time, cumulative samples)`` of the last gang (``status.observed.progressPoints``).
        since: When that gang started running (same epoch as the points).
        completed: When the operator saw every worker succeed.
        total_samples: The plan's samples (the job trained all of them).
        model_throughput: The model's own estimate of the configuration.
        at: When the run finished (recorded as the profile's last seen).
        job: The job's uid.
        config: Warm-up, window and points (the operator's correction settings).
        achieved_tolerance: See check 3.

    Returns:
        The measurement, or which check failed.
    """
    cfg = config or CorrectionConfig()
    pts = sorted((p for p in points if p.t >= since), key=lambda p: p.t)
    m = measure(pts, since, cfg.warmup_s)
    if m is None or m.points < cfg.min_points or m.seconds < cfg.min_window_s:
        have = 0.0 if m is None else m.seconds
        return NotMeasured(
            f"not measured long enough: {have:.0f} s of progress after the {cfg.warmup_s:g} s warm-up, "
            f"{cfg.min_window_s:g} s needed"
        )
    if model_throughput <= 0 or m.rate <= 0:
        return NotMeasured(f"no throughput to compare: measured {m.rate:g}/s, model {model_throughput:g}/s")
    factor = m.rate / model_throughput
    if not MIN_FACTOR <= factor <= MAX_FACTOR:
        return NotMeasured(
            f"measured {m.rate:,.1f}/s is {factor:.2f}x the model's {model_throughput:,.1f}/s, outside "
            f"[{MIN_FACTOR:g}, {MAX_FACTOR:g}]: the progress count, not the model, is off",
            suspect=True,
        )
    first = pts[0]
    span = completed - first.t
    done = total_samples - first.samples
    if span <= 0 or done <= 0:
        return NotMeasured("no time or samples between the first progress reading and the completion", suspect=True)
    achieved = done / span
    if abs(math.log(m.rate / achieved)) > math.log1p(achieved_tolerance):
        return NotMeasured(
            f"the reported rate {m.rate:,.1f}/s is not what the job achieved: {done:,.0f} samples in "
            f"{span:,.0f} s from its first report to its completion is {achieved:,.1f}/s (more than "
            f"{achieved_tolerance:.0%} apart)",
            suspect=True,
        )
    return RunMeasurement(m.rate, max(m.rel_se, RUN_LOG_SIGMA_FLOOR), model_throughput, at, job, m.seconds)


# ------------------------------------------------------------------------------------ profiles


@dataclass(frozen=True, slots=True)
class Profile:
    """What the runs of one configuration of one signature measured (a ``PerformanceProfile``)."""

    key: ProfileKey
    workload: str
    """The signature's workload id, for people."""
    shape: str
    """The signature's declared shape (canonical JSON)."""
    throughput: float
    """exp(mean of ln samples/s over runs): the runs' geometric mean, exponentially weighted."""
    model_throughput: float
    """The model's estimate of this configuration when last recorded (the near-match ratio's base)."""
    log_spread: float
    """Population standard deviation of ln throughput over the runs (0 after one run)."""
    measurement_log_sigma: float
    """RMS of the runs' own relative standard errors."""
    runs: int
    last_seen: datetime
    instance_type: str = ""
    """The instance type of the last run (for people; the GPU type is the key)."""
    unit: str = "samples"
    jobs: tuple[str, ...] = ()
    """The newest jobs counted (uids), at most :data:`MAX_RECENT_JOBS`."""

    def effective_runs(self, memory_runs: int = DEFAULT_MEMORY_RUNS) -> int:
        return min(self.runs, memory_runs)

    def log_sigma(self, memory_runs: int = DEFAULT_MEMORY_RUNS) -> float:
        """``s_pred``: the log-sigma of the next run's throughput (see the module docstring)."""
        n = self.effective_runs(memory_runs)
        between = self.log_spread * math.sqrt(n / (n - 1)) if n >= 2 else 0.0
        s_run = max(between, self.measurement_log_sigma, RUN_LOG_SIGMA_FLOOR)
        return s_run * math.sqrt(1.0 + 1.0 / max(n, 1))

    @property
    def factor(self) -> float:
        """Measured / model throughput of this configuration."""
        return self.throughput / self.model_throughput if self.model_throughput > 0 else 1.0

    def source(self) -> str:
        """``measured in 7 runs``."""
        return f"measured in {self.runs} run{'s' if self.runs != 1 else ''}"


def _weight(n: int, memory_runs: int) -> float:
    return 1.0 / min(n + 1, max(memory_runs, 1))


def updated(
    profile: Profile | None,
    key: ProfileKey,
    run: RunMeasurement,
    labels: ProfileLabels = NO_LABELS,
    *,
    memory_runs: int = DEFAULT_MEMORY_RUNS,
) -> Profile:
    """The profile with one more run folded in (a new one when ``profile`` is None).

    A run whose job is already among ``profile.jobs`` is not counted again (the profile is returned
    unchanged).

    Raises:
        ValueError: the run's throughput is not a positive finite number.
    """
    if not (math.isfinite(run.throughput) and run.throughput > 0):
        raise ValueError(f"a run's throughput must be a positive number, got {run.throughput!r}")
    s_m = max(run.log_sigma, RUN_LOG_SIGMA_FLOOR)
    y = math.log(run.throughput)
    if profile is None:
        return Profile(
            key, labels.workload, labels.shape, run.throughput, run.model_throughput, 0.0, s_m, 1, run.at,
            labels.instance_type, labels.unit, (run.job,) if run.job else (),
        )  # fmt: skip
    if run.job and run.job in profile.jobs:
        return profile
    n = profile.runs
    w = _weight(n, memory_runs)
    mean = math.log(profile.throughput)
    delta = y - mean
    new_mean = mean + w * delta
    var = (1.0 - w) * (profile.log_spread**2 + w * delta * delta)
    meas = math.sqrt((1.0 - w) * profile.measurement_log_sigma**2 + w * s_m * s_m)
    jobs = ((*profile.jobs, run.job) if run.job else profile.jobs)[-MAX_RECENT_JOBS:]
    return replace(
        profile,
        throughput=math.exp(new_mean),
        model_throughput=run.model_throughput if run.model_throughput > 0 else profile.model_throughput,
        log_spread=math.sqrt(max(var, 0.0)),
        measurement_log_sigma=meas,
        runs=n + 1,
        last_seen=max(profile.last_seen, run.at),
        instance_type=labels.instance_type or profile.instance_type,
        unit=labels.unit,
        jobs=jobs,
        workload=labels.workload or profile.workload,
        shape=labels.shape or profile.shape,
    )


# ------------------------------------------------------------------------------------ priors


@dataclass(frozen=True, slots=True)
class MeasuredPrior:
    """What a profile says of one candidate configuration: its throughput and band, and from what."""

    throughput: float
    """Samples/s the plan uses (P50)."""
    log_sigma: float
    """The band's log-space sigma."""
    factor: float
    """``throughput`` / the model's estimate of the candidate."""
    runs: int
    exact: bool
    """The profile measured this very configuration (else a near match moved the model's estimate)."""
    source: str
    """Where the figure comes from, for people: ``measured in 7 runs``, or how a near match moved it."""
    profile: ProfileKey

    def band(self, model: Band) -> Band:
        """The candidate's band with this prior (the model's widening reasons kept for the record)."""
        s = self.log_sigma
        p50 = self.throughput
        return Band(p50 * math.exp(-Z90 * s), p50, p50 * math.exp(Z90 * s), s, model.widening, model.reasons)


def _differs(profile: ProfileKey, candidate: ProfileKey) -> str:
    what = []
    if candidate.precision != profile.precision:
        what.append("precision")
    if candidate.gpu_type != profile.gpu_type:
        what.append("GPU type")
    if candidate.gpus != profile.gpus or candidate.nodes != profile.nodes:
        what.append("GPU count")
    if candidate.micro_batch != profile.micro_batch or candidate.accumulation != profile.accumulation:
        what.append("micro-batch")
    return ", ".join(what)


def near_prior(
    profile: Profile,
    candidate: ProfileKey,
    model_throughput: float,
    model_log_sigma: float,
    memory_runs: int = DEFAULT_MEMORY_RUNS,
) -> MeasuredPrior | None:
    """The prior a profile of another configuration gives ``candidate`` (None: it says nothing).

    Args:
        profile: A profile of the same signature.
        candidate: The configuration being planned.
        model_throughput: The model's estimate of it, samples/s.
        model_log_sigma: The model's band for it.
        memory_runs: See :class:`ProfileStore`.

    Returns:
        The conditional of the module docstring, or None without a model estimate or band.
    """
    if model_throughput <= 0 or model_log_sigma <= 0:
        return None
    k = profile.key
    rho = error_correlation(k.gpu_type, k.precision, candidate.gpu_type, candidate.precision)
    s_pred = profile.log_sigma(memory_runs)
    w = model_log_sigma**2 / (model_log_sigma**2 + s_pred**2)
    f = math.exp(rho * w * math.log(profile.factor))
    s = model_log_sigma * math.sqrt(max(1.0 - rho * rho * w, 0.0))
    source = (f"model x {f:.2f}: {profile.source()} of {k.describe()} (other {_differs(k, candidate)}; "
              f"error correlation {rho:.2f})")  # fmt: skip
    return MeasuredPrior(model_throughput * f, s, f, profile.runs, False, source, k)


_SERIALS = itertools.count()
"""The numbers :class:`ProfileStore` instances take, in order of creation."""


@dataclass
class ProfileStore:
    """The profiles a plan may use: in memory, bounded, safe to read while another thread records.

    Args:
        ttl: Profiles not seen for this long are ignored and pruned.
        cap_per_workload: Profiles kept per signature (the least recently seen goes first).
        memory_runs: Runs after which the mean is an exponential moving average.
    """

    ttl: timedelta = DEFAULT_TTL
    cap_per_workload: int = DEFAULT_CAP_PER_WORKLOAD
    memory_runs: int = DEFAULT_MEMORY_RUNS
    version: int = 0
    """Grows with every change (the operator's plan cache keys on it)."""
    _by_signature: dict[str, dict[ProfileKey, Profile]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _serial: int = field(default_factory=lambda: next(_SERIALS), repr=False, compare=False)
    """This store's number in the process: never reused, unlike ``id()`` (a plan cache outlives stores)."""

    def __post_init__(self) -> None:
        if self.cap_per_workload < 1:
            raise ValueError(f"cap_per_workload must be at least 1, got {self.cap_per_workload}")
        if self.ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {self.ttl}")

    @classmethod
    def of(cls, profiles: Iterable[Profile], **kwargs: object) -> ProfileStore:
        """A store holding ``profiles`` (the cap applied as they are added)."""
        store = cls(**kwargs)  # type: ignore[arg-type]
        for p in profiles:
            store.put(p)
        return store

    # --- reading

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_signature.values())

    def __bool__(self) -> bool:
        return bool(self._by_signature)

    def profiles(self) -> list[Profile]:
        """Every profile, by signature then configuration."""
        return sorted((p for v in list(self._by_signature.values()) for p in list(v.values())), key=lambda p: p.key)

    def get(self, key: ProfileKey) -> Profile | None:
        return self._by_signature.get(key.signature, {}).get(key)

    def has(self, signature: str) -> bool:
        """Whether any profile of this signature is kept."""
        return signature in self._by_signature

    def fingerprint(self) -> tuple[int, int]:
        """Changes whenever the store does (the store's serial, its version): a plan cache key. Not
        ``id(self)``: a store freed and another made at the same address with as many puts would share
        its cached plans (the simulator's plan cache outlives each run's store)."""
        return self._serial, self.version

    def _fresh(self, p: Profile, now: datetime | None) -> bool:
        return now is None or now - p.last_seen <= self.ttl

    def prior_for(
        self,
        key: ProfileKey,
        model_throughput: float,
        model_log_sigma: float,
        now: datetime | None = None,
    ) -> MeasuredPrior | None:
        """The measured prior of one candidate configuration, or None (the model stands).

        Args:
            key: The candidate's configuration.
            model_throughput: The model's estimate of it, samples/s.
            model_log_sigma: The model's band for it (log-space sigma).
            now: Profiles older than the TTL are ignored (None: none is).

        Returns:
            The exact match's measured band, else the best near match (module docstring), else None.
        """
        group = self._by_signature.get(key.signature)
        if not group:
            return None
        exact = group.get(key)
        if exact is not None and self._fresh(exact, now):
            s = exact.log_sigma(self.memory_runs)
            f = exact.throughput / model_throughput if model_throughput > 0 else 1.0
            return MeasuredPrior(exact.throughput, s, f, exact.runs, True, exact.source(), key)
        best: MeasuredPrior | None = None
        for p in list(group.values()):
            if not self._fresh(p, now):
                continue
            got = near_prior(p, key, model_throughput, model_log_sigma, self.memory_runs)
            if got is not None and (best is None or (got.log_sigma, -got.runs) < (best.log_sigma, -best.runs)):
                best = got
        return best

    # --- writing

    def put(self, profile: Profile) -> list[Profile]:
        """Add or replace a profile; returns those evicted by the cap (least recently seen first)."""
        with self._lock:
            group = dict(self._by_signature.get(profile.key.signature, {}))
            group[profile.key] = profile
            evicted: list[Profile] = []
            while len(group) > self.cap_per_workload:
                oldest = min(group.values(), key=lambda p: (p.last_seen, p.key))
                evicted.append(group.pop(oldest.key))
            self._by_signature = {**self._by_signature, profile.key.signature: group}
            self.version += 1
            return evicted

    def remove(self, key: ProfileKey) -> Profile | None:
        """Forget one profile (returned, or None when it was not kept)."""
        with self._lock:
            group = dict(self._by_signature.get(key.signature, {}))
            gone = group.pop(key, None)
            if gone is None:
                return None
            rest = {k: v for k, v in self._by_signature.items() if k != key.signature}
            self._by_signature = {**rest, key.signature: group} if group else rest
            self.version += 1
            return gone

    def record(
        self, key: ProfileKey, run: RunMeasurement, labels: ProfileLabels = NO_LABELS
    ) -> tuple[Profile, list[Profile]]:
        """Fold one run into the profile of ``key`` (made when absent).

        Returns:
            The profile as it now is, and the profiles evicted to keep the cap.
        """
        new = updated(self.get(key), key, run, labels, memory_runs=self.memory_runs)
        return new, self.put(new)

    def prune(self, now: datetime) -> list[Profile]:
        """Remove the profiles not seen for the TTL; returns them."""
        stale = [p for p in self.profiles() if not self._fresh(p, now)]
        for p in stale:
            self.remove(p.key)
        return stale

