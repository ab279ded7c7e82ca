"""Performance profiles (:mod:`gpuscaler.planner.profiles`): the signature, the running mean and
spread, the exact and near priors, the bounds, the run measurement's checks, and the planner and
``gpuscaler plan --profiles`` with them."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscaler.api import TrainingJobSpec, WorkloadSpec
from gpuscaler.catalog import load_catalog
from gpuscaler.cli import main, plan_to_dict
from gpuscaler.inputs import InputError
from gpuscaler.perfmodel.uncertainty import Z90
from gpuscaler.planner import plan
from gpuscaler.planner.correction import CorrectionConfig, ProgressPoint
from gpuscaler.planner.profile_docs import (
    dump_profiles,
    from_document,
    load_profiles,
    profile_name,
    to_document,
)
from gpuscaler.planner.profiles import (
    RUN_LOG_SIGMA_FLOOR,
    NotMeasured,
    Profile,
    ProfileKey,
    ProfileStore,
    RunMeasurement,
    measure_run,
    signature_of,
    updated,
)
from gpuscaler.testing import training_job

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = {
    "workload": {"model": "resnet50"},
    "globalBatch": 256,
    "training": {"steps": 20000},
    "constraints": {"instanceTypes": ["g5.xlarge", "p3.2xlarge", "g5.12xlarge"], "spot": "never"},
    "template": {"spec": {"containers": [{"name": "t", "image": "x"}]}},
}


def spec(**changes: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({**SPEC, **changes})


def key(sig: str = "s" * 16, gpu: str = "A100", gpus: int = 8, nodes: int = 1, mb: int = 32, k: int = 1, p: str = "amp") -> ProfileKey:
    return ProfileKey(sig, gpu, gpus, nodes, mb, k, p)


def run(x: float, at: datetime = NOW, job: str = "", sigma: float = 0.0, model: float = 100.0) -> RunMeasurement:
    return RunMeasurement(x, sigma, model, at, job)


# ------------------------------------------------------------------------------------ signature


def test_signature_is_the_declared_shape_under_the_resolved_id() -> None:
    a = signature_of(WorkloadSpec(model="resnet50"), "resnet50")
    b = signature_of(WorkloadSpec(model="ResNet-50"), "resnet50")  # an alias resolves to the same id
    c = signature_of(WorkloadSpec(model="resnet50", data_loader="dali"), "resnet50")
    assert a.id == b.id and a.id != c.id and len(a.id) == 16
    t = {"layers": 12, "hidden": 768, "heads": 12, "seqLen": 512, "vocab": 30000}
    short = signature_of(WorkloadSpec.model_validate({"transformer": t}), "custom")
    long = signature_of(WorkloadSpec.model_validate({"transformer": {**t, "seqLen": 1024}}), "custom")
    assert short.id != long.id and '"seqLen":512' in short.shape


# ------------------------------------------------------------------------------------ running mean


def test_one_run_then_welford_over_runs() -> None:
    k = key()
    p = updated(None, k, run(100.0, job="a"))
    assert (p.runs, p.throughput, p.log_spread) == (1, 100.0, 0.0)
    assert p.log_sigma() == pytest.approx(RUN_LOG_SIGMA_FLOOR * math.sqrt(2))
    xs = [100.0, 110.0, 90.0, 105.0]
    for i, x in enumerate(xs[1:]):
        p = updated(p, k, run(x, NOW + timedelta(hours=i + 1), job=f"j{i}"))
    logs = [math.log(x) for x in xs]
    mean = sum(logs) / 4
    assert p.runs == 4
    assert math.log(p.throughput) == pytest.approx(mean)
    assert p.log_spread == pytest.approx(math.sqrt(sum((y - mean) ** 2 for y in logs) / 4))
    sample_sd = math.sqrt(sum((y - mean) ** 2 for y in logs) / 3)
    assert p.log_sigma() == pytest.approx(max(sample_sd, RUN_LOG_SIGMA_FLOOR) * math.sqrt(1 + 1 / 4))
    assert p.last_seen == NOW + timedelta(hours=3)


def test_a_job_is_counted_once_and_old_runs_fade() -> None:
    k = key()
    p = updated(None, k, run(100.0, job="a"))
    assert updated(p, k, run(500.0, job="a")) is p
    for i in range(50):
        p = updated(p, k, run(200.0, job=f"b{i}"), memory_runs=5)
    assert p.throughput == pytest.approx(200.0, rel=1e-3)  # 100 faded out, as an EWMA of weight 1/5
    assert len(p.jobs) <= 8 and p.jobs[-1] == "b49"


def test_a_bad_throughput_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        updated(None, key(), run(float("nan")))


# ------------------------------------------------------------------------------------ priors


def test_exact_match_replaces_the_model() -> None:
    store = ProfileStore()
    store.record(key(), run(70.0, sigma=0.01))
    got = store.prior_for(key(), 100.0, 0.25, NOW)
    assert got is not None and got.exact and got.source == "measured in 1 run"
    assert got.throughput == 70.0 and got.factor == pytest.approx(0.7)
    assert got.log_sigma == pytest.approx(RUN_LOG_SIGMA_FLOOR * math.sqrt(2))


def test_near_matches_move_the_model_as_far_as_its_errors_go_together() -> None:
    """A profile moves every other configuration of the code by the conditional of the model's errors:
    ``ln f = rho w ln r``, ``s = s_model sqrt(1 - rho^2 w)``, with ``rho`` the model's error correlation on
    two ways to run one code (0.94 on the same GPU type and precision, 0.76 across); a profile of
    another workload says nothing."""
    from gpuscaler.perfmodel.uncertainty import ERROR_CORRELATION_OTHER_GPU, ERROR_CORRELATION_SAME_GPU

    store = ProfileStore()
    store.record(key(gpus=8, mb=32), run(70.0, model=100.0, sigma=0.01))
    s_model = 0.25
    s_pred = RUN_LOG_SIGMA_FLOOR * math.sqrt(2)
    w = s_model**2 / (s_model**2 + s_pred**2)
    for candidate, rho in ((key(gpus=64, mb=32), ERROR_CORRELATION_SAME_GPU),
                           (key(gpus=8, mb=64), ERROR_CORRELATION_SAME_GPU),
                           (key(gpu="H100", gpus=8), ERROR_CORRELATION_OTHER_GPU),
                           (key(p="fp32"), ERROR_CORRELATION_OTHER_GPU)):  # fmt: skip
        got = store.prior_for(candidate, 200.0, s_model, NOW)
        assert got is not None and not got.exact, candidate
        assert got.factor == pytest.approx(math.exp(rho * w * math.log(0.7)))
        assert got.throughput == pytest.approx(200.0 * got.factor)
        assert got.log_sigma == pytest.approx(s_model * math.sqrt(1 - rho * rho * w))
        assert s_pred < got.log_sigma < s_model
        assert f"error correlation {rho:.2f}" in got.source
    same = store.prior_for(key(gpus=64), 200.0, s_model, NOW)
    other = store.prior_for(key(gpu="H100"), 200.0, s_model, NOW)
    assert same is not None and other is not None
    assert same.log_sigma < other.log_sigma and same.factor < other.factor < 1.0  # its own type moves most
    assert "other GPU type" in other.source and "precision" in store.prior_for(key(p="fp32"), 1.0, s_model, NOW).source  # type: ignore[union-attr]
    # another workload: nothing
    assert store.prior_for(key(sig="t" * 16), 100.0, s_model, NOW) is None


def test_the_cap_evicts_the_least_recently_seen_and_the_ttl_ignores_and_prunes() -> None:
    store = ProfileStore(cap_per_workload=2, ttl=timedelta(days=10))
    store.record(key(gpus=1), run(10.0, NOW - timedelta(days=20)))
    store.record(key(gpus=2), run(20.0, NOW - timedelta(days=1)))
    _, evicted = store.record(key(gpus=4), run(40.0, NOW))
    assert [p.key.gpus for p in evicted] == [1] and len(store) == 2
    store.record(key(gpus=8), run(80.0, NOW - timedelta(days=11)))  # older than both kept: it goes itself
    assert sorted(p.key.gpus for p in store.profiles()) == [2, 4]
    old = ProfileStore(ttl=timedelta(days=10))
    old.record(key(), run(50.0, NOW - timedelta(days=11)))
    assert old.prior_for(key(), 100.0, 0.25, NOW) is None  # too old to plan with
    assert old.prior_for(key(), 100.0, 0.25) is not None  # no clock: kept
    assert [p.key for p in old.prune(NOW)] == [key()] and not old
    with pytest.raises(ValueError, match="cap_per_workload"):
        ProfileStore(cap_per_workload=0)


# ------------------------------------------------------------------------------------ one run measured


CFG = CorrectionConfig(warmup_s=10.0, min_window_s=60.0)


def points(rate: float, start: float = 0.0, until: float = 300.0, every: float = 5.0) -> list[ProgressPoint]:
    return [ProgressPoint(start + t, rate * t) for t in [i * every for i in range(int(until / every) + 1)]]


def test_an_honest_run_is_measured() -> None:
    pts = points(70.0)
    got = measure_run(pts, since=0.0, completed=300.0, total_samples=70.0 * 300, model_throughput=100.0, at=NOW, config=CFG)
    assert isinstance(got, RunMeasurement)
    assert got.throughput == pytest.approx(70.0) and got.log_sigma == RUN_LOG_SIGMA_FLOOR


def test_an_inflated_report_is_not_what_the_job_achieved() -> None:
    # the writer reports 140/s, but the workers finished the job at 70/s (the operator saw them succeed)
    total = 70.0 * 600
    pts = [p for p in points(140.0, until=300.0)]
    got = measure_run(pts, since=0.0, completed=600.0, total_samples=total, model_throughput=100.0, at=NOW, config=CFG)
    assert isinstance(got, NotMeasured) and got.suspect and "not what the job achieved" in got.text


def test_too_short_or_unbelievable_runs_are_not_measured() -> None:
    short = measure_run(points(70.0, until=40.0), since=0.0, completed=40.0, total_samples=2800,
                        model_throughput=100.0, at=NOW, config=CFG)
    assert isinstance(short, NotMeasured) and not short.suspect and "not measured long enough" in short.text
    wild = measure_run(points(700.0), since=0.0, completed=300.0, total_samples=700.0 * 300,
                       model_throughput=100.0, at=NOW, config=CFG)
    assert isinstance(wild, NotMeasured) and wild.suspect and "outside" in wild.text


# ------------------------------------------------------------------------------------ the planner


def measured_store(factor: float = 0.7) -> tuple[ProfileStore, Any]:
    s = spec()
    first = plan(s, load_catalog())
    c = first.chosen
    assert c is not None
    sig = signature_of(s.workload, first.job.workload.id)
    k = ProfileKey(sig.id, c.instance.gpu_id, c.gpus, c.nodes, c.micro_batch, c.accumulation, c.precision.value)
    store = ProfileStore()
    store.record(k, run(factor * c.estimate.throughput, model=c.estimate.throughput, job="first"),
                 sig.labels(c.instance.name))
    return store, first


def test_plans_without_profiles_of_the_workload_are_unchanged() -> None:
    s = spec()
    before = plan_to_dict(plan(s, load_catalog()))
    before.pop("planningSeconds")
    other = ProfileStore()
    other.record(key(sig="0" * 16, gpu="A10G", gpus=1, mb=256), run(1.0))
    for profiles in (ProfileStore(), other):
        after = plan_to_dict(plan(s, load_catalog(), profiles=profiles))
        after.pop("planningSeconds")
        assert after == before


def test_the_next_run_plans_from_the_first_runs_profile() -> None:
    store, first = measured_store(0.7)
    c1 = first.chosen
    again = plan(spec(), load_catalog(), profiles=store, now=NOW)
    c2 = again.chosen
    assert c2 is not None and again.profiles
    same = next(c for c in again.feasible if c.label == c1.label and c.micro_batch == c1.micro_batch)
    assert same.throughput_source == "measured in 1 run"
    assert same.estimate.throughput == pytest.approx(0.7 * c1.estimate.throughput)
    width = lambda c: math.log(c.band.p90 / c.band.p10)  # noqa: E731
    assert width(same) <= 0.5 * width(c1)
    assert same.band.log_sigma == pytest.approx(RUN_LOG_SIGMA_FLOOR * math.sqrt(2))
    assert same.work_hours == pytest.approx(c1.work_hours / 0.7)
    assert width(same) == pytest.approx(2 * Z90 * same.band.log_sigma)
    d = plan_to_dict(again)
    assert all("throughputSource" in p for p in d["pareto"]) and d["chosen"]["throughputSource"]


def test_plan_profiles_file_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, first = measured_store(0.7)
    f = tmp_path / "profiles.yaml"
    f.write_text(dump_profiles([to_document(p, "team-a") for p in store.profiles()]))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(training_job("nightly", **SPEC)))
    assert main(["plan", str(job), "--profiles", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    source = out["chosen"]["throughputSource"]
    by_label = {(p["instanceType"], p["nodes"], p["microBatch"]): p for p in out["pareto"]}
    c1 = first.chosen
    assert by_label[(c1.instance.name, c1.nodes, c1.micro_batch)]["throughputSource"] == "measured in 1 run"
    assert main(["plan", str(job), "--profiles", str(f)]) == 0
    assert f"({source})" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    doc = to_document(store.profiles()[0])
    doc["spec"]["gpus"] = 0
    bad.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(job), "--profiles", str(bad)]) == 2
    assert "gpus" in capsys.readouterr().err


def test_documents_round_trip_and_a_forged_signature_is_refused() -> None:
    store, _ = measured_store(0.8)
    p = store.profiles()[0]
    doc = to_document(p, "team-a")
    assert doc["metadata"]["name"] == profile_name(p.key, p.workload) and len(doc["metadata"]["name"]) <= 63
    back = from_document(json.loads(json.dumps(doc)))
    assert back == p
    forged = json.loads(json.dumps(doc))
    forged["spec"]["signature"]["shape"]["model"] = "bert-large-squad"
    with pytest.raises(InputError, match="not the hash of its shape"):
        from_document(forged)
    with pytest.raises(InputError, match="kind"):
        from_document({**doc, "kind": "TrainingJob"})


def test_load_profiles_reads_lists_and_documents(tmp_path: Path) -> None:
    store, _ = measured_store(0.8)
    docs = [to_document(p) for p in store.profiles()]
    f = tmp_path / "p.json"
    f.write_text(dump_profiles(docs, "json"))
    assert load_profiles(f) == store.profiles()
    g = tmp_path / "p.yaml"
    g.write_text("---\n".join(yaml.safe_dump(d) for d in docs))
    assert load_profiles(g) == store.profiles()
    assert isinstance(store.profiles()[0], Profile)


def test_a_new_store_never_takes_a_freed_store_s_fingerprint() -> None:
    """The fingerprint keys the simulator's plan cache, which outlives each run's store: a store made where
    a freed one lived, with as many puts, must not find the freed one's plans (``id()`` would be reused)."""
    import gc

    seen = set()
    for _ in range(50):
        s = ProfileStore()
        s.record(key(), run(70.0))
        assert s.fingerprint() not in seen
        seen.add(s.fingerprint())
        del s
        gc.collect()
