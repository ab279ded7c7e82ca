"""Performance profiles in the operator: record a finished job's measured throughput, plan with them.

kopf-free. :class:`ProfileBook` holds the ``PerformanceProfile`` objects the operator plans with,
one :class:`~gpuscaler.planner.profiles.ProfileStore` per namespace, kept current by the watch
(:func:`gpuscaler.handlers.profiles.profile_event` calls :meth:`ProfileBook.observe`) and by the
recorder's own writes; the reconcile loop asks :meth:`ProfileBook.store_for` the job's namespace
(its own profiles, then those of ``settings.profiles_shared_namespace``) and passes it to the planner.

:class:`Recorder` is called by the loop once, when a job's workers all succeed
(:meth:`Recorder.finished`). It records only what the operator itself judged: the progress
readings it kept in ``status.observed.progressPoints`` (each one passed :mod:`gpuscaler.kube.reports`:
the writer rank of the current gang, within the plan, monotone), measured by
:func:`gpuscaler.planner.profiles.measure_run` (enough of them, a believable factor, and the rate
the job achieved by its completion as the operator saw it). Workers never write a profile: their
account has no verb on PerformanceProfiles, and nothing they report is copied into one unchecked.
A run is counted once per job uid (a step repeated after a crash adds nothing), the profile is
written with its resourceVersion (a concurrent write is retried once), the cap per workload
deletes the least recently seen, and nothing here fails the job: an error is a Warning Event.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.events import Event
from gpuscaler.api.status import TrainingJobStatus
from gpuscaler.catalog import Catalog, UnknownIdError
from gpuscaler.errors import GpuscalerError
from gpuscaler.names import ConditionType, EventReason
from gpuscaler.planner.correction import CorrectionConfig, ProgressPoint
from gpuscaler.planner.job import resolve_workload
from gpuscaler.planner.profile_docs import from_document, profile_name, to_document
from gpuscaler.planner.profiles import (
    NotMeasured,
    Profile,
    ProfileKey,
    ProfileLabels,
    ProfileStore,
    RunMeasurement,
    measure_run,
    signature_of,
    updated,
)
from gpuscaler.settings import Settings


class ProfileApi(Protocol):
    """What the recorder needs of :class:`gpuscaler.kube.profiles.Profiles`."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def put(self, namespace: str, body: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]: ...
    def delete(self, namespace: str, name: str) -> bool: ...


@dataclass(frozen=True)
class ProfileConfig:
    """The "Performance profiles" settings (:class:`gpuscaler.settings.Settings`, where they are explained)."""

    enabled: bool = True
    ttl: timedelta = timedelta(days=90)
    per_workload: int = 16
    memory_runs: int = 20
    achieved_tolerance: float = 0.25
    shared_namespace: str = ""

    @classmethod
    def from_settings(cls, s: Settings) -> ProfileConfig:
        return cls(
            s.profiles_enabled, timedelta(days=s.profiles_ttl_days), s.profiles_per_workload, s.profiles_memory_runs,
            s.profiles_achieved_tolerance, s.profiles_shared_namespace,
        )  # fmt: skip

    def store(self) -> ProfileStore:
        """An empty store with these bounds."""
        return ProfileStore(ttl=self.ttl, cap_per_workload=self.per_workload, memory_runs=self.memory_runs)


@dataclass
class ProfileBook:
    """The profiles of every namespace the operator serves, as planner stores (see the module docstring)."""

    config: ProfileConfig = field(default_factory=ProfileConfig)
    _stores: dict[str, ProfileStore] = field(default_factory=dict)
    _names: dict[tuple[str, str], ProfileKey] = field(default_factory=dict)
    """(namespace, object name) -> the key it holds (a deleted object is known by name only)."""
    _merged: dict[str, tuple[tuple[int, int], tuple[int, int], ProfileStore]] = field(default_factory=dict)
    _stale: dict[str, list[Profile]] = field(default_factory=dict)
    """Profiles past the TTL, dropped from planning, whose objects the recorder deletes next."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _store(self, namespace: str) -> ProfileStore:
        with self._lock:
            got = self._stores.get(namespace)
            if got is None:
                got = self._stores[namespace] = self.config.store()
            return got

    def observe(self, namespace: str, name: str, body: dict[str, Any] | None) -> str | None:
        """A profile object as the watch saw it (None: deleted). Returns why it was ignored, if it was."""
        old = self._names.pop((namespace, name), None)
        if old is not None:
            self._store(namespace).remove(old)
        if body is None:
            return None
        try:
            profile = from_document(body, f"PerformanceProfile {namespace}/{name}")
        except GpuscalerError as err:
            return str(err)
        self._names[(namespace, name)] = profile.key
        self._store(namespace).put(profile)
        return None

    def put(self, namespace: str, profile: Profile) -> list[Profile]:
        """A profile the recorder wrote (before its watch event arrives); returns those the cap evicted."""
        self._names[(namespace, profile_name(profile.key, profile.workload))] = profile.key
        evicted = self._store(namespace).put(profile)
        for p in evicted:
            self._names.pop((namespace, profile_name(p.key, p.workload)), None)
        return evicted

    def expire(self, namespace: str, now: datetime) -> None:
        """Drop the namespace's profiles past the TTL from planning (their objects go at the next record)."""
        store = self._stores.get(namespace)
        if store is None:
            return
        for p in store.prune(now):
            self._names.pop((namespace, profile_name(p.key, p.workload)), None)
            self._stale.setdefault(namespace, []).append(p)

    def take_stale(self, namespace: str) -> list[Profile]:
        """The expired profiles of a namespace not deleted yet (forgotten here once taken)."""
        return self._stale.pop(namespace, [])

    def store_for(self, namespace: str, now: datetime | None = None) -> ProfileStore | None:
        """The profiles a job of ``namespace`` plans with (its own, then the shared namespace's), or None.

        With ``now``, profiles past the TTL are dropped first (:meth:`expire`).
        """
        shared_ns = self.config.shared_namespace
        if now is not None:
            for ns in {namespace, shared_ns} - {""}:
                self.expire(ns, now)
        own = self._stores.get(namespace)
        shared = self._stores.get(shared_ns) if shared_ns and shared_ns != namespace else None
        if not shared:
            return own if own else None
        if not own:
            return shared
        fp = (own.fingerprint(), shared.fingerprint())
        got = self._merged.get(namespace)
        if got is not None and (got[0], got[1]) == fp:
            return got[2]
        merged = ProfileStore.of(
            [*shared.profiles(), *own.profiles()],  # the namespace's own replace the shared ones of the same key
            ttl=self.config.ttl, cap_per_workload=self.config.per_workload * 2, memory_runs=self.config.memory_runs,
        )  # fmt: skip
        self._merged[namespace] = (fp[0], fp[1], merged)
        return merged


def _running_since(st: TrainingJobStatus) -> datetime | None:
    for c in st.conditions:
        if c.type == ConditionType.RUNNING and c.status == "True":
            return c.last_transition_time
    return st.start_time


@dataclass
class Recorder:
    """Records a finished job's measured throughput (see the module docstring)."""

    api: ProfileApi
    book: ProfileBook
    catalog: Catalog
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)

    @property
    def config(self) -> ProfileConfig:
        return self.book.config

    def finished(
        self, namespace: str, uid: str, spec: TrainingJobSpec, st: TrainingJobStatus, now: datetime
    ) -> list[Event]:
        """Record the run of a job whose workers all succeeded (call before the Running condition turns False).

        Args:
            namespace: The job's namespace (where its profile lives).
            uid: The job's uid (a run is counted once).
            spec: Its spec (the workload signature).
            st: Its status (plan, progress points), not changed.
            now: When the operator saw the workers succeed.

        Returns:
            The Events to post: ProfileRecorded, or why none was (ProfileNotRecorded).
        """
        plan, obs = st.plan, st.observed
        if not self.config.enabled or plan is None:
            return []
        since = _running_since(st)
        points = [ProgressPoint(p.at.timestamp(), p.samples) for p in (obs.progress_points if obs else [])]
        model = plan.throughput / plan.efficiency_factor if plan.efficiency_factor > 0 else plan.throughput
        got = measure_run(
            points,
            since=since.timestamp() if since is not None else (points[0].t if points else now.timestamp()),
            completed=now.timestamp(),
            total_samples=plan.total_samples,
            model_throughput=model,
            at=now,
            job=uid,
            config=self.correction,
            achieved_tolerance=self.config.achieved_tolerance,
        )
        if isinstance(got, NotMeasured):
            kind = "Warning" if got.suspect else "Normal"
            return [Event(kind, EventReason.PROFILE_NOT_RECORDED, f"no performance profile from this run: {got.text}")]
        try:
            workload = resolve_workload(spec.workload, self.catalog)
        except UnknownIdError as err:
            return [Event("Warning", EventReason.PROFILE_NOT_RECORDED, f"no performance profile: {err}")]
        sig = signature_of(spec.workload, workload.id)
        key = ProfileKey(sig.id, plan.gpu_type, plan.gpus, plan.nodes, plan.micro_batch, plan.accumulation, plan.precision)
        try:
            profile, name = self._write(namespace, key, got, sig.labels(plan.instance_type, workload.unit))
        except GpuscalerError as err:
            return [Event("Warning", EventReason.PROFILE_NOT_RECORDED, f"writing the performance profile: {err}")]
        events = [
            Event(
                "Normal",
                EventReason.PROFILE_RECORDED,
                f"PerformanceProfile {name}: {got.throughput:,.1f} {workload.unit}/s measured over {got.window_s:.0f} s "
                f"on {key.describe()} ({got.throughput / model:.2f}x the model); {profile.source()}, "
                f"{profile.throughput:,.1f}/s +-{profile.log_sigma(self.config.memory_runs):.0%}",
            )
        ]
        gone = [*self.book.put(namespace, profile), *self.book.take_stale(namespace)]
        for p in gone:
            old_name = profile_name(p.key, p.workload)
            if old_name == name:
                continue  # past the TTL, and measured again just now
            try:
                self.api.delete(namespace, old_name)
            except GpuscalerError as err:
                events.append(Event("Warning", EventReason.PROFILE_NOT_PRUNED, f"{err}"))
        return events

    def _write(
        self, namespace: str, key: ProfileKey, run: RunMeasurement, labels: ProfileLabels
    ) -> tuple[Profile, str]:
        """Fold the run into the stored profile and write it (retried once when it changed meanwhile)."""
        name = profile_name(key, labels.workload)
        for attempt in (1, 2):
            body = self.api.get(namespace, name)
            old: Profile | None = None
            version: str | None = None
            if body is not None:
                version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
                try:
                    old = from_document(body, f"PerformanceProfile {namespace}/{name}")
                except GpuscalerError:
                    old = None  # unreadable (edited by hand): started again from this run
                if old is not None and (old.key != key or run.at - old.last_seen > self.config.ttl):
                    old = None  # another key under this name, or past the TTL: this run starts it again
            new = updated(old, key, run, labels, memory_runs=self.config.memory_runs)
            if old is not None and new is old:
                return new, name  # this job was counted already
            try:
                self.api.put(namespace, to_document(new, namespace, self.config.memory_runs), version)
            except GpuscalerError as err:
                if attempt == 1 and getattr(err, "retriable", False):
                    continue
                raise
            return new, name
        raise AssertionError("unreachable")  # pragma: no cover
