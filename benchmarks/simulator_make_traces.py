"""Generate the example traces in ``examples/traces/`` (deterministic: same script, same files).

* ``research-week.yaml``: a research team's week, mixed CNN and BERT jobs, no hard deadlines.
* ``production-month.yaml``: a production team's month of retraining with deadlines and budgets.
* ``llm-finetune-burst.jsonl``: a burst of LLM fine-tunes (llama-7b, gpt2-small) in one afternoon.
* ``recurring-month.yaml``: a month of recurring jobs, the same five workloads run nightly or weekly
  with deadlines (where performance profiles carry from one run to the next).

Run ``python benchmarks/simulator_make_traces.py`` from the repository root.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parent.parent / "examples" / "traces"
START = "2026-03-02T00:00:00Z"  # a Monday


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _job(name: str, arrival_h: float, spec: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arrivalHours": round(arrival_h, 3), "spec": spec}


def _workday_arrival(rng: random.Random, days: int) -> float:
    """An arrival hour on a weekday between 09:00 and 19:00."""
    while True:
        day = rng.randrange(days)
        if day % 7 < 5:
            return day * 24 + rng.uniform(9, 19)


def research_week(rng: random.Random) -> dict[str, Any]:
    """Mixed CNN/BERT experiments of a research team over one week; no deadlines."""
    kinds: list[tuple[str, float, dict[str, Any]]] = [
        ("resnet50-90ep", 4, {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 90}}),
        ("resnet50-30ep", 6, {"workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 30}}),
        ("resnext101-30ep", 3,
         {"workload": {"model": "resnext101-32x4d"}, "globalBatch": 1024, "training": {"epochs": 30}}),
        ("effnet-b0-40ep", 4,
         {"workload": {"model": "efficientnet-b0"}, "globalBatch": 1024, "training": {"epochs": 40}}),
        ("bert-base-squad", 8, {"workload": {"model": "bert-base-squad"}, "globalBatch": 32, "training": {"epochs": 2}}),
        ("bert-large-squad", 6,
         {"workload": {"model": "bert-large-squad"}, "globalBatch": 32, "training": {"epochs": 2}}),
        ("bert-large-pretrain", 3,
         {"workload": {"model": "bert-large-seq128"}, "globalBatch": 4096, "training": {"steps": 20000}}),
        ("maskrcnn-12ep", 3, {"workload": {"model": "maskrcnn"}, "globalBatch": 32, "training": {"epochs": 12}}),
    ]
    jobs = []
    weights = [k[1] for k in kinds]
    for i in range(40):
        name, _, spec = rng.choices(kinds, weights)[0]
        spec = dict(spec, constraints={"providers": ["aws"]})
        jobs.append(_job(f"{name}-{i:02d}", _workday_arrival(rng, 7), spec))
    return {
        "name": "research-week",
        "description": "A research team's week: 40 CNN and BERT experiments on AWS, submitted in working "
        "hours, no hard deadlines.",
        "start": START,
        "jobs": sorted(jobs, key=lambda j: j["arrivalHours"]),
    }


def production_month(rng: random.Random) -> dict[str, Any]:
    """Scheduled retraining with deadlines and budgets over 30 days."""
    jobs = []
    for day in range(30):
        # Nightly ResNet-50 retrain: ready by 08:00 (12 h after submission at 20:00).
        jobs.append(_job(f"nightly-resnet50-d{day:02d}", day * 24 + 20 + rng.uniform(0, 0.5), {
            "workload": {"model": "resnet50"}, "globalBatch": 1024, "training": {"epochs": 90},
            "maxDuration": "12h", "budgetUsd": 400, "constraints": {"providers": ["aws"]},
        }))
        if day % 7 < 5:
            # Weekday fine-tune of BERT-large on new QA data: needed within 4 h.
            jobs.append(_job(f"qa-bert-large-d{day:02d}", day * 24 + rng.uniform(9, 17), {
                "workload": {"model": "bert-large-squad"}, "globalBatch": 32, "training": {"epochs": 2},
                "maxDuration": "4h", "constraints": {"providers": ["aws"]},
            }))
        if day % 7 == 5:
            # Weekly BERT-large pre-training refresh over the weekend (48 h).
            jobs.append(_job(f"weekly-bert-pretrain-d{day:02d}", day * 24 + 8, {
                "workload": {"model": "bert-large-seq128"}, "globalBatch": 8192, "training": {"steps": 50000},
                "maxDuration": "48h", "budgetUsd": 8000, "constraints": {"providers": ["aws"]},
            }))
            # Weekly detection model (Mask R-CNN, 12 epochs) within 24 h.
            jobs.append(_job(f"weekly-maskrcnn-d{day:02d}", day * 24 + 10, {
                "workload": {"model": "maskrcnn"}, "globalBatch": 64, "training": {"epochs": 12},
                "maxDuration": "24h", "budgetUsd": 600, "constraints": {"providers": ["aws"]},
            }))
    return {
        "name": "production-month",
        "description": "A production team's month on AWS: nightly ResNet-50 retrains (12 h deadline), weekday "
        "BERT-large QA fine-tunes (4 h), weekly BERT-large pre-training (48 h) and Mask R-CNN (24 h).",
        "start": START,
        "jobs": sorted(jobs, key=lambda j: j["arrivalHours"]),
    }


def recurring_month(rng: random.Random) -> dict[str, Any]:
    """The same workloads run again and again over 30 days, each with a deadline: nightly and weekly."""
    aws = {"providers": ["aws"]}
    jobs = []
    for day in range(30):
        # Nightly EfficientNet-B0 retrain on the day's images: ready by 04:00 (6 h after 22:00).
        jobs.append(_job(f"nightly-effnet-b0-d{day:02d}", day * 24 + 22 + rng.uniform(0, 0.25), {
            "workload": {"model": "efficientnet-b0"}, "globalBatch": 1024, "training": {"epochs": 30},
            "maxDuration": "6h", "constraints": aws,
        }))
        if day % 7 < 5:
            # Weeknight GPT-2 small fine-tune on the day's text: ready by 09:00 (10 h after 23:00).
            jobs.append(_job(f"nightly-gpt2-ft-d{day:02d}", day * 24 + 23 + rng.uniform(0, 0.25), {
                "workload": {"model": "gpt2-small"}, "globalBatch": 512, "training": {"samples": 8_000_000},
                "maxDuration": "10h", "constraints": aws,
            }))
        if day % 7 == 4:
            # Weekly Transformer-XL base language model over the weekend (48 h from Friday 18:00).
            jobs.append(_job(f"weekly-txl-base-d{day:02d}", day * 24 + 18, {
                "workload": {"model": "transformerxl-base"}, "globalBatch": 256, "training": {"steps": 40000},
                "maxDuration": "48h", "constraints": aws,
            }))
        if day % 7 == 5:
            # Weekly SSD300 detector refresh, Saturday 08:00, within 24 h.
            jobs.append(_job(f"weekly-ssd300-d{day:02d}", day * 24 + 8, {
                "workload": {"model": "ssd300"}, "globalBatch": 256, "training": {"epochs": 40},
                "maxDuration": "24h", "constraints": aws,
            }))
        if day % 7 == 6:
            # Weekly llama-7b instruction fine-tune, Sunday 10:00, within 12 h, AWS or GCP.
            jobs.append(_job(f"weekly-llama7b-ft-d{day:02d}", day * 24 + 10, {
                "workload": {"model": "llama-7b"}, "globalBatch": 128, "training": {"samples": 400_000},
                "maxDuration": "12h", "constraints": {"providers": ["aws", "gcp"]},
            }))
    return {
        "name": "recurring-month",
        "description": "A month of recurring jobs with deadlines, the same workload each time: nightly "
        "EfficientNet-B0 retrains (6 h) and weeknight GPT-2 small fine-tunes (10 h), weekly Transformer-XL "
        "(48 h), SSD300 (24 h) and llama-7b fine-tunes (12 h, AWS or GCP).",
        "start": START,
        "jobs": sorted(jobs, key=lambda j: j["arrivalHours"]),
    }


def llm_burst(rng: random.Random) -> list[dict[str, Any]]:
    """Two dozen LLM fine-tunes submitted within one afternoon."""
    lines: list[dict[str, Any]] = [{"trace": {
        "name": "llm-finetune-burst",
        "description": "24 LLM fine-tunes (llama-7b, gpt2-small) submitted between 13:00 and 18:00 on AWS or "
        "GCP; half need the result within a day.",
        "start": START,
    }}]
    jobs = []
    for i in range(24):
        arrival = 13 + rng.uniform(0, 5)
        if rng.random() < 0.5:
            spec: dict[str, Any] = {
                "workload": {"model": "llama-7b"}, "globalBatch": rng.choice([64, 128]),
                "training": {"samples": rng.choice([100_000, 200_000, 400_000])},
            }
            name = f"llama7b-ft-{i:02d}"
        else:
            spec = {
                "workload": {"model": "gpt2-small"}, "globalBatch": rng.choice([256, 512]),
                "training": {"samples": rng.choice([2_000_000, 4_000_000, 8_000_000])},
            }
            name = f"gpt2-ft-{i:02d}"
        spec["constraints"] = {"providers": ["aws", "gcp"]}
        if i % 2 == 0:
            spec["maxDuration"] = "24h"
        jobs.append(_job(name, arrival, spec))
    return lines + sorted(jobs, key=lambda j: j["arrivalHours"])


def _header(jobs: int) -> str:
    """The comment lines of a trace: where it came from, and what ``tests/test_examples.py`` expects of it."""
    return (
        "# Generated by benchmarks/simulator_make_traces.py; run `gpuscaler simulate` on it.\n"
        f"# expect: jobs={jobs} plannable={jobs}   (each job, planned alone at its arrival, has a plan)\n"
    )


def main() -> None:
    """Write the four traces."""
    OUT.mkdir(parents=True, exist_ok=True)
    for name, fn in (("research-week", research_week), ("production-month", production_month),
                     ("recurring-month", recurring_month)):
        data = fn(random.Random(name))
        text = yaml.dump(data, Dumper=_NoAliases, sort_keys=False, width=110)
        (OUT / f"{name}.yaml").write_text(_header(len(data["jobs"])) + text, encoding="utf-8")
    lines = llm_burst(random.Random("llm-finetune-burst"))
    jobs = sum(1 for x in lines if "spec" in x)
    (OUT / "llm-finetune-burst.jsonl").write_text(
        _header(jobs) + "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines), encoding="utf-8")
    print(f"wrote traces to {OUT}")


if __name__ == "__main__":
    main()
