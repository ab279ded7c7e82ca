"""Performance profiles in the reconcile loop (:mod:`gpuscaler.controller.profiles`): a finished job
records one from the progress the operator checked, the next job of the same workload plans from it,
a run is counted once, a forged or failed write never fails the job, and the watch keeps the book."""

from __future__ import annotations

import functools
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from gpuscaler.api.status import Phase
from gpuscaler.controller.policy import gated_plan
from gpuscaler.controller.profiles import ProfileBook, ProfileConfig, Recorder
from gpuscaler.kube.client import KubeError
from gpuscaler.observe.controller import ObserveConfig, Observer
from gpuscaler.planner.correction import CorrectionConfig
from gpuscaler.planner.profile_docs import from_document, to_document
from gpuscaler.runtime import constants as rc
from loop_harness import CATALOG, T0, FakeProfileApi, World, make_job

SPEC: dict[str, Any] = {
    "workload": {"model": "resnet50"},
    "globalBatch": 256,
    "training": {"steps": 400},
    "constraints": {"instanceTypes": ["g5.xlarge"], "minGpus": 1, "maxGpus": 1, "spot": "never"},
}
NODE = {"instance_type": "g5.xlarge", "capacity_type": "on-demand", "ready": "True", "created": T0}
OBSERVE = ObserveConfig(interval_s=5, warmup_s=10, min_window_s=60, min_interval_s=1e9)


def world(recorder: Recorder) -> World:
    w = World(planner=functools.partial(gated_plan, catalog=CATALOG), pod_phase="Running", node=NODE)
    w.loop.observer = Observer(None, OBSERVE, CATALOG)
    w.loop.profiles = recorder
    return w


def recorder(api: FakeProfileApi | None = None, **config: Any) -> Recorder:
    book = ProfileBook(ProfileConfig(**config))
    return Recorder(api or FakeProfileApi(), book, CATALOG, CorrectionConfig(warmup_s=10, min_window_s=60))


def train(w: World, job: Any, rate: float, seconds: int = 300, report: float | None = None) -> list[str]:
    """Run the job: the writer reports ``report`` samples/s (default: ``rate``), the workers finish
    the job's samples at ``rate`` (the time the operator sees them succeed)."""
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None
    total = w.status.plan.total_samples
    shown = report or rate
    t = 0
    for t in range(5, seconds + 1, 5):
        w.annotate(**{rc.ANNOTATION_PROGRESS_SAMPLES: f"{min(shown * t, total):.0f}"})
        w.step(job, 5)
    done_at = total / rate
    w.phases = {p["metadata"]["name"]: "Succeeded" for p in w.workers.pods()}
    return w.step(job, max(done_at - t, 1))


def test_a_finished_job_leaves_a_profile_and_the_next_run_plans_from_it() -> None:
    api = FakeProfileApi()
    rec = recorder(api)
    w = world(rec)
    job = make_job(SPEC, uid="run-1")
    w.run_to(job, Phase.RUNNING)
    first = w.status.plan
    assert first is not None and first.throughput_source is None and first.efficiency_factor == 1.0
    rate = 0.7 * first.throughput
    total = first.total_samples
    reasons = train(w, job, rate, seconds=int(total / rate) - 5)
    assert w.status.phase is Phase.SUCCEEDED and "ProfileRecorded" in reasons
    assert len(api.objects) == 1
    (body,) = api.objects.values()
    p = from_document(body)
    assert p.runs == 1 and p.throughput == pytest.approx(rate, rel=0.02) and p.jobs == ("run-1",)
    assert p.key.gpu_type == "A10G" and p.key.micro_batch == first.micro_batch and p.key.precision == first.precision
    assert p.model_throughput == pytest.approx(first.throughput, rel=1e-3)

    # the same job applied again: planned from the profile, and its status says so
    w2 = world(rec)
    job2 = make_job(SPEC, uid="run-2", name="job-2")
    w2.step(job2)
    second = w2.status.plan
    assert second is not None and second.throughput_source == "measured in 1 run"
    assert second.throughput == pytest.approx(rate, rel=0.02)
    assert second.efficiency_factor == pytest.approx(0.7, rel=0.02)
    width = lambda s: s.throughput_p90 / s.throughput_p10  # noqa: E731
    import math

    assert math.log(width(second)) <= 0.5 * math.log(width(first))
    # its run is counted as a second one; repeating the finishing step counts nothing more
    reasons = train(w2, job2, rate, seconds=int(total / rate) - 5)
    assert "ProfileRecorded" in reasons
    assert from_document(next(iter(api.objects.values()))).runs == 2
    assert rec.finished("ns", "run-2", job2.spec, w2.status, w2.now) != []
    assert from_document(next(iter(api.objects.values()))).runs == 2


def test_an_inflated_progress_report_does_not_reach_a_profile() -> None:
    api = FakeProfileApi()
    w = world(recorder(api))
    job = make_job(SPEC, uid="forged")
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None
    rate = 0.7 * w.status.plan.throughput
    reasons = train(w, job, rate, seconds=120, report=2 * rate)
    assert w.status.phase is Phase.SUCCEEDED
    assert "ProfileNotRecorded" in reasons and "ProfileRecorded" not in reasons
    ev = next(e for e in w.events if e.reason == "ProfileNotRecorded")
    assert ev.type == "Warning" and "not what the job achieved" in ev.message
    assert api.objects == {} and not any(c.startswith("put") for c in api.calls)


def test_a_short_run_or_a_failed_write_leaves_no_profile_and_the_job_succeeds() -> None:
    api = FakeProfileApi()
    w = world(recorder(api))
    job = make_job(SPEC, uid="short")
    w.run_to(job, Phase.RUNNING)
    w.phases = {p["metadata"]["name"]: "Succeeded" for p in w.workers.pods()}
    assert "ProfileNotRecorded" in w.step(job) and w.status.phase is Phase.SUCCEEDED
    assert next(e for e in w.events if e.reason == "ProfileNotRecorded").type == "Normal"
    api.fail = KubeError("writing PerformanceProfile, 403 Forbidden", 403)
    w = world(recorder(api))
    job = make_job(SPEC, uid="denied")
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None
    rate = w.status.plan.throughput
    reasons = train(w, job, rate, seconds=int(w.status.plan.total_samples / rate) - 5)
    assert w.status.phase is Phase.SUCCEEDED and "ProfileNotRecorded" in reasons
    assert "403" in next(e for e in w.events if e.reason == "ProfileNotRecorded").message


def test_disabled_records_nothing() -> None:
    api = FakeProfileApi()
    w = world(recorder(api, enabled=False))
    job = make_job(SPEC, uid="off")
    w.run_to(job, Phase.RUNNING)
    w.phases = {p["metadata"]["name"]: "Succeeded" for p in w.workers.pods()}
    assert not {"ProfileRecorded", "ProfileNotRecorded"} & set(w.step(job)) and api.calls == []


def test_the_cap_deletes_the_least_recently_seen_object() -> None:
    api = FakeProfileApi()
    rec = recorder(api, per_workload=1)
    for i, gpus in enumerate((1, 4)):
        spec = {**SPEC, "training": {"steps": 4000}, "constraints": {"instanceTypes": ["g5.xlarge", "g5.12xlarge"], "minGpus": gpus,
                                        "maxGpus": gpus, "spot": "never"}}
        w = world(rec)
        w.now = T0 + timedelta(hours=i)
        w.node = {**NODE, "instance_type": "g5.xlarge" if gpus == 1 else "g5.12xlarge"}
        job = make_job(spec, uid=f"cap-{i}")
        w.run_to(job, Phase.RUNNING)
        assert w.status.plan is not None and w.status.plan.gpus == gpus
        rate = w.status.plan.throughput
        train(w, job, rate, seconds=int(w.status.plan.total_samples / rate) - 5)
        assert "ProfileRecorded" in [e.reason for e in w.events]
    assert [from_document(b).key.gpus for b in api.objects.values()] == [4]
    assert any(c.startswith("delete") for c in api.calls)


def test_the_book_follows_the_watch_and_reads_the_shared_namespace() -> None:
    rec = recorder()
    api = rec.api
    assert isinstance(api, FakeProfileApi)
    w = world(rec)
    job = make_job(SPEC, uid="a")
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None
    rate = w.status.plan.throughput
    train(w, job, rate, seconds=int(w.status.plan.total_samples / rate) - 5)
    (body,) = api.objects.values()
    name = body["metadata"]["name"]
    book = ProfileBook(ProfileConfig(shared_namespace="platform"))
    assert book.store_for("team-a") is None
    assert book.observe("platform", name, body) is None
    shared = book.store_for("team-a")
    assert shared is not None and len(shared) == 1
    assert "not the hash" in (book.observe("team-a", "bad", {**body, "spec": {**body["spec"], "signature": {
        **body["spec"]["signature"], "id": "0" * 16}}}) or "")
    assert book.observe("team-a", name, to_document(from_document(body), "team-a")) is None
    merged = book.store_for("team-a")
    assert merged is not None and len(merged) == 1  # its own replaces the shared one of the same key
    assert book.store_for("team-a") is merged  # kept until either changes
    book.observe("platform", name, None)
    own = book.store_for("team-a")
    assert own is not None and own is not merged and len(own) == 1
    book.observe("team-a", name, None)
    assert book.store_for("team-a") is None


# ------------------------------------------------------------------------------------ gpuscaler profiles


def recorded(api: FakeProfileApi, namespace: str = "ns") -> None:
    """One profile recorded by the loop, moved to ``namespace``."""
    w = world(recorder(api))
    job = make_job(SPEC, uid=f"cli-{namespace}")
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None
    rate = w.status.plan.throughput
    train(w, job, rate, seconds=int(w.status.plan.total_samples / rate) - 5)
    if namespace != "ns":
        ((_, name), body) = api.objects.popitem()
        api.objects[(namespace, name)] = {**body, "metadata": {**body["metadata"], "namespace": namespace}}


def test_profiles_cli_lists_exports_imports_and_prunes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuscaler import profiles_cli
    from gpuscaler.cli import main

    api = FakeProfileApi()
    recorded(api)
    monkeypatch.setattr(profiles_cli, "_client", lambda: api)
    assert main(["profiles", "list", "-n", "ns"]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "1 x A10G" in out and out.splitlines()[0].startswith("NAMESPACE")
    ((_, name),) = api.objects
    assert main(["profiles", "show", name, "-n", "ns", "--json"]) == 0
    shown = __import__("json").loads(capsys.readouterr().out)
    assert shown["source"] == "measured in 1 run" and shown["throughputP10"] < shown["spec"]["throughput"]
    assert main(["profiles", "show", "nope", "-n", "ns"]) == 2
    assert "no PerformanceProfile 'nope'" in capsys.readouterr().err
    f = tmp_path / "p.yaml"
    assert main(["profiles", "export", "-n", "ns", "-o", str(f)]) == 0
    before = dict(api.objects)
    api.objects.clear()
    assert main(["profiles", "import", str(f)]) == 0
    assert "1 created, 0 replaced" in capsys.readouterr().out
    assert {k: from_document(v) for k, v in api.objects.items()} == {k: from_document(v) for k, v in before.items()}
    assert main(["profiles", "import", str(f), "-n", "team-b"]) == 0
    assert ("team-b", name) in api.objects
    assert main(["profiles", "prune", "-A", "--ttl-days", "1", "--dry-run"]) == 0
    assert "2 of 2 profile(s) to prune" in capsys.readouterr().out and len(api.objects) == 2
    assert main(["profiles", "prune", "-n", "team-b", "--ttl-days", "1"]) == 0
    assert list(api.objects) == [("ns", name)]
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: TrainingJob\n")
    assert main(["profiles", "import", str(bad)]) == 2
    assert "expected PerformanceProfile" in capsys.readouterr().err


def test_the_plan_cache_keys_on_the_profiles() -> None:
    from gpuscaler.api import TrainingJobSpec
    from gpuscaler.controller.plan_cache import PlanCache
    from gpuscaler.planner.profiles import ProfileKey, RunMeasurement, signature_of

    cache = PlanCache(8)
    s = TrainingJobSpec.model_validate(SPEC)
    store = ProfileBook().config.store()
    model = cache.plan(s, CATALOG)
    assert cache.plan(s, CATALOG, profiles=store).chosen is model.chosen  # an empty store: the same plan
    c = model.chosen
    assert c is not None
    sig = signature_of(s.workload, "resnet50")
    key = ProfileKey(sig.id, "A10G", 1, 1, c.micro_batch, c.accumulation, c.precision.value)
    store.record(key, RunMeasurement(0.9 * c.estimate.throughput, 0.0, c.estimate.throughput, T0),
                 sig.labels())
    got = cache.plan(s, CATALOG, profiles=store)
    assert got.chosen is not None and got.chosen.throughput_source == "measured in 1 run" and cache.misses == 2
    assert cache.plan(s, CATALOG, profiles=store) is got and cache.hits == 2


def test_a_profile_past_the_ttl_is_not_planned_with_and_a_new_run_starts_it_again() -> None:
    api = FakeProfileApi()
    rec = recorder(api, ttl=timedelta(days=10))
    w = world(rec)
    job = make_job(SPEC, uid="old")
    w.run_to(job, Phase.RUNNING)
    assert w.status.plan is not None
    rate = 0.7 * w.status.plan.throughput
    train(w, job, rate, seconds=int(w.status.plan.total_samples / rate) - 5)
    assert from_document(next(iter(api.objects.values()))).runs == 1
    later = world(rec)
    later.now = w.now + timedelta(days=11)
    job2 = make_job(SPEC, uid="new", name="job-2")
    later.run_to(job2, Phase.RUNNING)
    assert later.status.plan is not None and later.status.plan.throughput_source is None  # the model again
    rate2 = later.status.plan.throughput
    assert "ProfileRecorded" in train(later, job2, rate2, seconds=int(later.status.plan.total_samples / rate2) - 5)
    (body,) = api.objects.values()
    fresh = from_document(body)
    assert fresh.runs == 1 and fresh.jobs == ("new",) and fresh.throughput == pytest.approx(rate2, rel=0.02)
    assert not any(c.startswith("delete") for c in api.calls)  # measured again: kept, not deleted
    # a stale profile of another configuration is deleted at the next record
    book = rec.book
    stale_doc = to_document(replace(fresh, key=fresh.key._replace(gpus=8), last_seen=fresh.last_seen - timedelta(days=30)), "ns")
    api.objects[("ns", stale_doc["metadata"]["name"])] = {**stale_doc, "metadata": {**stale_doc["metadata"], "resourceVersion": "1"}}
    assert book.observe("ns", stale_doc["metadata"]["name"], stale_doc) is None
    store = book.store_for("ns", later.now)
    assert store is not None and [p.key.gpus for p in store.profiles()] == [1]
    job3 = make_job(SPEC, uid="third", name="job-3")
    w3 = world(rec)
    w3.now = later.now
    w3.run_to(job3, Phase.RUNNING)
    assert w3.status.plan is not None
    rate3 = w3.status.plan.throughput
    train(w3, job3, rate3, seconds=int(w3.status.plan.total_samples / rate3) - 5)
    assert f"delete {stale_doc['metadata']['name']}" in api.calls and len(api.objects) == 1
