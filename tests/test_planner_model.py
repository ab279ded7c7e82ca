"""What the planner takes from the performance model: fp8 only when asked, batches in items, the
job's memory format and input pipeline, and mixed precision's freed memory buying a larger and more
efficient micro-batch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.api import TrainingJob, TrainingJobSpec
from gpuscaler.catalog import Precision, load_catalog
from gpuscaler.perfmodel import estimate
from gpuscaler.planner import plan
from gpuscaler.planner.job import resolve
from gpuscaler.planner.planner import configure

CAT = load_catalog()
ROOT = Path(__file__).resolve().parents[1]


def spec(**kw: Any) -> TrainingJobSpec:
    base: dict[str, Any] = {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 10}}
    base.update(kw)
    return TrainingJobSpec.model_validate(base)


def test_fp8_only_when_the_job_names_it() -> None:
    job = TrainingJob.model_validate(yaml.safe_load((ROOT / "examples/llama-7b-spot.yaml").read_text()))
    assert not job.spec.constraints.precisions
    result = plan(job.spec, CAT)
    assert result.chosen is not None
    assert {c.precision for c in result.feasible + result.pareto} <= {Precision.FP32, Precision.AMP}
    raw = job.spec.model_dump(by_alias=True, exclude_none=True)
    raw["constraints"]["precisions"] = ["amp", "fp8"]
    asked = plan(TrainingJobSpec.model_validate(raw), CAT)
    assert Precision.FP8 in {c.precision for c in asked.feasible + asked.pareto}


def test_token_workloads_take_batches_in_sequences() -> None:
    s = spec(workload={"model": "transformerxl-base"}, globalBatch=256, training={"steps": 1000})
    job = resolve(s, CAT)
    seq = job.workload.seq_len or 0
    assert job.total_samples == 1000 * 256 * seq  # tokens: steps x sequences x tokens per sequence
    assert job.steps == 1000
    tokens = resolve(spec(workload={"model": "transformerxl-base"}, globalBatch=256, training={"samples": 256 * seq * 10}), CAT)
    assert tokens.steps == 10
    c = plan(s, CAT).chosen
    assert c is not None and c.micro_batch * c.accumulation * c.gpus == 256
    assert c.estimate.unit == "tokens" and c.estimate.batch_unit == "sequences"


def test_the_jobs_memory_format_and_loader_reach_the_model() -> None:
    one_way = {"instanceTypes": ["p4d.24xlarge"], "precisions": ["amp"], "maxNodes": 1, "spot": "never"}
    chosen = {}
    for layout in (False, True):
        s = spec(workload={"model": "resnet50", "channelsLast": layout, "dataLoader": "dali"}, constraints=one_way)
        c = plan(s, CAT).chosen
        assert c is not None and c.instance.name == "p4d.24xlarge"
        chosen[layout] = c
    assert chosen[True].estimate.throughput > chosen[False].estimate.throughput
    job = resolve(spec(workload={"model": "resnet50", "dataLoader": "dali", "channelsLast": True}), CAT)
    assert (job.channels_last, job.data_loader) == (True, "dali")


def test_amp_frees_memory_for_a_larger_more_efficient_micro_batch() -> None:
    """The planner picks the micro-batch per precision; AMP's gain includes the larger batch's."""
    w = CAT.workload("bert-large-seq512")
    inst = next(i for i in CAT.instances if i.gpu_id == "V100-16GB" and i.gpu_count == 1)
    fp32, _ = configure(w, inst, 1, Precision.FP32, 64)
    amp, _ = configure(w, inst, 1, Precision.AMP, 64)
    assert fp32 is not None and amp is not None
    assert amp.micro_batch > fp32.micro_batch
    base = estimate(w, inst.gpu, fp32).throughput
    coupled = estimate(w, inst.gpu, amp).throughput / base
    same_batch = replace(fp32, precision=Precision.AMP)
    independent = estimate(w, inst.gpu, same_batch).throughput / base
    assert coupled > independent > 1.0
