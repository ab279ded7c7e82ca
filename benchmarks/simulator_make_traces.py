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
AWS = {"providers": ["aws"]}


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _job(name: str, arrival_h: float, spec: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arrivalHours": round(arrival_h, 3), "spec": spec}


def _spec(model: str, batch: int, training: dict[str, int], **rest: Any) -> dict[str, Any]:
    """A job's spec: ``model`` at global batch ``batch``, trained for ``training``, then ``rest``'s fields."""
    return {"workload": {"model": model}, "globalBatch": batch, "training": training, **rest}


def _workday_arrival(rng: random.Random, days: int) -> float:
    """An arrival hour on a weekday between 09:00 and 19:00."""
    while True:
        day = rng.randrange(days)
        if day % 7 < 5:
            return day * 24 + rng.uniform(9, 19)


def research_week(rng: random.Random) -> dict[str, Any]:
    """Mixed CNN/BERT experiments of a research team over one week; no deadlines."""
    kinds: list[tuple[str, float, dict[str, Any]]] = [
        ("resnet50-90ep", 4, _spec("resnet50", 1024, {"epochs": 90})),
        ("resnet50-30ep", 6, _spec("resnet50", 1024, {"epochs": 30})),
        ("resnext101-30ep", 3, _spec("resnext101-32x4d", 1024, {"epochs": 30})),
        ("effnet-b0-40ep", 4, _spec("efficientnet-b0", 1024, {"epochs": 40})),
        ("bert-base-squad", 8, _spec("bert-base-squad", 32, {"epochs": 2})),
        ("bert-large-squad", 6, _spec("bert-large-squad", 32, {"epochs": 2})),
        ("bert-large-pretrain", 3, _spec("bert-large-seq128", 4096, {"steps": 20000})),
        ("maskrcnn-12ep", 3, _spec("maskrcnn", 32, {"epochs": 12})),
    ]
    jobs = []
    weights = [k[1] for k in kinds]
    for i in range(40):
        name, _, spec = rng.choices(kinds, weights)[0]
        spec = dict(spec, constraints=AWS)
        jobs.append(_job(f"{name}-{i:02d}", _workday_arrival(rng, 7), spec))
    return {
        "name": "research-week",
        "description": "A research team's week: 40 CNN and BERT experiments on AWS, submitted in working "
        "hours, no hard deadlines.",
        "start": START,
        "jobs": sorted(jobs, key=lambda j: j["arrivalHours"]),
    }


WEEKDAYS, EVERY_DAY = range(5), range(7)
Schedule = list[tuple[str, range | tuple[int, ...], float, tuple[float, float] | None, dict[str, Any]]]
"""A recurring job's name prefix, the days of the week it is submitted on (0 = Monday), the hour, the
range of a random delay after it (None: on the hour), and its spec; each day's jobs in this order."""


def _recurring(rng: random.Random, days: int, schedule: Schedule) -> list[dict[str, Any]]:
    """The jobs of ``schedule`` over ``days`` days, by arrival."""
    jobs = []
    for day in range(days):
        for prefix, weekdays, hour, delay, spec in schedule:
            if day % 7 in weekdays:
                arrival = day * 24 + hour + (rng.uniform(*delay) if delay else 0)
                jobs.append(_job(f"{prefix}-d{day:02d}", arrival, spec))
    return sorted(jobs, key=lambda j: j["arrivalHours"])


PRODUCTION: Schedule = [
    # Nightly ResNet-50 retrain: ready by 08:00 (12 h after submission at 20:00).
    ("nightly-resnet50", EVERY_DAY, 20, (0, 0.5),
     _spec("resnet50", 1024, {"epochs": 90}, maxDuration="12h", budgetUsd=400, constraints=AWS)),
    # Weekday fine-tune of BERT-large on new QA data, in working hours: needed within 4 h.
    ("qa-bert-large", WEEKDAYS, 0, (9, 17),
     _spec("bert-large-squad", 32, {"epochs": 2}, maxDuration="4h", constraints=AWS)),
    # Weekly BERT-large pre-training refresh over the weekend (48 h).
    ("weekly-bert-pretrain", (5,), 8, None,
     _spec("bert-large-seq128", 8192, {"steps": 50000}, maxDuration="48h", budgetUsd=8000, constraints=AWS)),
    # Weekly detection model (Mask R-CNN, 12 epochs) within 24 h.
    ("weekly-maskrcnn", (5,), 10, None,
     _spec("maskrcnn", 64, {"epochs": 12}, maxDuration="24h", budgetUsd=600, constraints=AWS)),
]

RECURRING: Schedule = [
    # Nightly EfficientNet-B0 retrain on the day's images: ready by 04:00 (6 h after 22:00).
    ("nightly-effnet-b0", EVERY_DAY, 22, (0, 0.25),
     _spec("efficientnet-b0", 1024, {"epochs": 30}, maxDuration="6h", constraints=AWS)),
    # Weeknight GPT-2 small fine-tune on the day's text: ready by 09:00 (10 h after 23:00).
    ("nightly-gpt2-ft", WEEKDAYS, 23, (0, 0.25),
     _spec("gpt2-small", 512, {"samples": 8_000_000}, maxDuration="10h", constraints=AWS)),
    # Weekly Transformer-XL base language model over the weekend (48 h from Friday 18:00).
    ("weekly-txl-base", (4,), 18, None,
     _spec("transformerxl-base", 256, {"steps": 40000}, maxDuration="48h", constraints=AWS)),
    # Weekly SSD300 detector refresh, Saturday 08:00, within 24 h.
    ("weekly-ssd300", (5,), 8, None, _spec("ssd300", 256, {"epochs": 40}, maxDuration="24h", constraints=AWS)),
    # Weekly llama-7b instruction fine-tune, Sunday 10:00, within 12 h, AWS or GCP.
    ("weekly-llama7b-ft", (6,), 10, None,
     _spec("llama-7b", 128, {"samples": 400_000}, maxDuration="12h", constraints={"providers": ["aws", "gcp"]})),
]


def production_month(rng: random.Random) -> dict[str, Any]:
    """Scheduled retraining with deadlines and budgets over 30 days."""
    return {
        "name": "production-month",
        "description": "A production team's month on AWS: nightly ResNet-50 retrains (12 h deadline), weekday "
        "BERT-large QA fine-tunes (4 h), weekly BERT-large pre-training (48 h) and Mask R-CNN (24 h).",
        "start": START,
        "jobs": _recurring(rng, 30, PRODUCTION),
    }


def recurring_month(rng: random.Random) -> dict[str, Any]:
    """The same workloads run again and again over 30 days, each with a deadline: nightly and weekly."""
    return {
        "name": "recurring-month",
        "description": "A month of recurring jobs with deadlines, the same workload each time: nightly "
        "EfficientNet-B0 retrains (6 h) and weeknight GPT-2 small fine-tunes (10 h), weekly Transformer-XL "
        "(48 h), SSD300 (24 h) and llama-7b fine-tunes (12 h, AWS or GCP).",
        "start": START,
        "jobs": _recurring(rng, 30, RECURRING),
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
