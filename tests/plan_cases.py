"""A fixed set of planning cases and the planner's full answer to each, for the golden-plan test.

Every example TrainingJob under each shipped policy, plus specs that exercise each stage of the
planner: objectives, spot modes, budgets and deadlines that cannot be met, constraint lists,
node and GPU caps, fp8, capacity known to be short, observed efficiency, flagged prices and a
custom transformer. :func:`answer` is what ``gpuscaler plan --json`` prints (without the timing)
plus the order of every feasible plan, so a change to the planner that changes any plan, its
order, a rejection or a hint shows up in ``tests/data/plans_golden.json.gz`` (gzip: 1.5 MB of JSON).

That file was first written by the planner as it stood before it was split into named stages
(commit 98cde79, with this module and the examples and policies of this tree); the split left all
47 answers identical. It was rewritten twice since: for the calibration refit to solver tolerance
(fitted values moved by up to 8%): every chosen plan stayed the same, the order of the feasible
alternatives moved in 36 of the 47 cases; and for the model's straggler, depthwise-convolution and
per-workload fixed-time terms: 2 of the 47 chosen plans changed, both the single-GPU EfficientNet-B0
example (with and without the research policy), from a T4 (g4dn.xlarge, $4.57) to an A10G
(g5.xlarge, $4.53), whose 3.9x the T4's CUDA-core FP32 rate now speeds up the depthwise
convolutions. A third time for the robust (pseudo-Huber) loss of the calibration and the DRAM-traffic
start at 4 bytes per stored activation byte: 5 of the 47 chosen plans changed in instance, GPU count or
capacity type (custom-params 8 -> 16 H100s; custom-transformer an L40S g6e.xlarge at $6.95 -> 4 V100s
on a p3.8xlarge at $7.71; resnet-fastest-budget the H200 nodes on-demand instead of spot, the model
now predicting 24% more speed so on-demand fits the $400 budget; resnet-spot-never 4 T4s -> 2 A10Gs;
resnet-unavailable a V100-32GB p3dn -> an A100 p4d), the others in cost and order. A fourth time for
the NCHW transposes as DRAM traffic at every tensor-core precision (instead of a 1.22x factor on the
16-bit convolution time) and the DRAM traffic bounded below at 4: 5 of the 47 chosen plans changed, the
four ResNet-50 jobs (NCHW, as the examples run) each because NCHW AMP convolutions now cost 1.45x on an
A100 and 1.9x on an L4 (resnet-gpu-types 2 L4s at $15.69 -> 8 A100s at $20.75; resnet-risk-strict a
p3.8xlarge -> a p3dn.24xlarge, 8 V100s both; resnet-unavailable an A100 p4d -> a V100-32GB p3dn;
resnet-deadline-override 8 -> 16 A100s), and custom-params 16 -> 8 H100s at $580 instead of $629.
A fifth time for three corrections of what the calibration rows mean (six single-GPU EfficientNet rows
that their own table's 8-GPU rows outrun 1.8-2.2x linearly dropped; the sequence-binned BERT phase-2
tables their own workload; Mask R-CNN's training FLOPs derived from its layer shapes): 1 of the 47
chosen plans changed, resnet-deadline-override from 16 A100-40GBs on two p4d.24xlarge nodes ($25.58,
1.77 h) to 8 A100-80GBs on one p4de.24xlarge ($23.75, 2.47 h). A sixth time for the fixed time per
micro-batch as counted kernels x a fitted time per kernel (scripts/kernel_counts.py) instead of a fitted
time per family: 7 of the 47 chosen plans changed, each between options that were within a few percent
in cost (bert-batch-not-divisible an A10G -> a T4, $0.50 both; llama-7b-spot 8 H200s at micro-batch 2, $152 -> 8 H100s on a GCP a3-highgpu-8g at 16, $155, and
with the production policy -> 8 A100-40GBs at 8, $155 (GPT-2 and LLaMA counted with flash
attention, as the catalog assumes for them); llama-fp8 8 H200s -> 8 H100s, $107 -> $111; resnet-azure and
resnet-flagged-prices 8 T4s -> 2 A100-80GB-PCIe, $60 -> $67 on-demand; resnet-risk-strict and
resnet-unavailable a V100 p3dn -> an A100 p4d, $20.42 -> $20.79); custom-params kept its 8 H100s
at $625 instead of $608, 31 h against its deadline's limit (16 H100s, $649, are chosen when it is a
little slower). A seventh time for the CNN and detection rows' activation memory as measured by
scripts/activation_bytes.py (ResNet-50 45 -> 42.3 MB per image, the EfficientNets and SSD300 up 20-50%,
Mask R-CNN 1,200 -> 541 MB), with the DRAM-traffic base of the performance model kept: none of the 47
chosen plans changed; 29 answers changed in their memory figures and the micro-batches of alternatives.
An eighth time for the memory model checked against documented runs (perfmodel/memory.py: capacity in
GiB less the CUDA context and NCCL buffers instead of 95% of GB, DDP's gradient buckets, FSDP's gathered
units, the transformer activations itemised by feed-forward size and dropout, LLaMA without dropout):
4 of the 47 chosen plans changed in instance or GPU count, 45 answers in memory figures and micro-batches.
bert-batch-not-divisible a T4 (micro-batch 10, $0.50) -> an A10G (25, $0.49) and bert-precisions an L4
-> an L40S at fp8 ($0.51 -> $0.50), each card's usable memory now its GiB less context, which admits
a larger, faster micro-batch; llama-7b-spot with the production policy 8 -> 32 A100-40GBs ($149 ->
$150) and with the research policy 8 -> 16 ($156 -> $159): one p4d's 40 GiB now fits ZeRO-1 with
checkpointing at micro-batch 2, which configure prefers to ZeRO-2 at micro-batch 8 (its order of
memory savers), and that slower configuration loses to more nodes.
A ninth time for deadline risk with recourse (:mod:`gpuscaler.planner.contingency`: every plan with
a deadline carries its contingency, its P(miss) is the one with the move, its expected cost includes
the move's expected extra cost): 6 of the 47 chosen plans changed. Four plans near their risk limit
now pay for their likely move and lose to a safer one: custom-params 8 -> 16 H100s spot ($625 ->
$649), resnet-deadline-override a p4de -> 2 p4d spot ($23.94 -> $24.97), resnet-efficiency 2 A10G
g5 spot (a measured band, so a move to 8 H100s is likely) -> a p4d spot ($17.69 -> $20.79),
resnet-fp8-only 4 -> 8 L4s spot ($24.46 -> $26.26); two plans over the static limit meet it with
their contingency and are cheaper: resnet-azure 2 A100-80GB -> 8 T4s on-demand ($66.59 -> $65.43,
P(miss) 5.5% static, 0.06% with the move), resnet-risk-strict a p4d -> 2 p3.8xlarge spot ($20.79 ->
$20.36). A tenth time for honest infeasibility (:mod:`gpuscaler.planner.binding`): the answers of the
5 infeasible cases gained ``binding`` and ``closest`` and their hints now name the rule that binds;
no chosen plan changed. An eleventh time for the departures from the model's own cheapest option
said in ``why`` (:mod:`gpuscaler.planner.departures`): 12 answers' ``why`` gained the reason, no chosen
plan changed. A twelfth time only to add the four cases of the dev-cluster demo's example
(``examples/demo-spot.yaml``, alone and under each policy): no existing answer changed; and again
for its two feasible cases when the example left its checkpoint interval to the planner (the demo
sets 10 s itself, under its own policy). A thirteenth time for recourse that follows the run
(:func:`gpuscaler.planner.contingency.moved_and_misses`: the first segment's progress counted, the
fallback's error correlated with the plan's as the model's cross-validated errors are, instead of the
whole job redone and the larger joint probability): no chosen plan changed; 24 answers changed in
their contingencies, risks and expected costs. (A fallback within 4x the cheapest instead of 2x, tried
with it, changed 3 chosen plans to dearer ones and was not kept.) Each time as

    PYTHONPATH=<that tree>/operator python tests/plan_cases.py --write

run from the repository root. Rewrite it only for a change that is meant to change plans (the
performance model, the catalog, prices), from the tree just before the change, then apply the
change: the test then shows every plan it moved.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.api import TrainingJob, TrainingJobSpec
from gpuscaler.catalog import load_catalog
from gpuscaler.cli import plan_to_dict
from gpuscaler.planner import plan
from gpuscaler.policy import Policy, load_policies, policy_for_namespace

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "plans_golden.json.gz"

POLICIES: dict[str, tuple[str, str | None]] = {
    "research": ("cost-first-research.yaml", "team-vision"),
    "production": ("deadline-first-production.yaml", "prod-ranking"),
    "regulated": ("on-demand-only-regulated.yaml", None),
}
"""Each shipped policy file with the namespace it is planned for."""

RESNET = {"workload": {"model": "resnet50"}, "globalBatch": 2048, "training": {"epochs": 90}}
BERT = {"workload": {"model": "bert-large-squad"}, "globalBatch": 256, "training": {"epochs": 2, "samplesPerEpoch": 88000}}

SPECS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "resnet-fastest-budget": ({**RESNET, "budgetUsd": 400, "objective": "fastest"}, {}),
    "resnet-fastest-gcp": ({**RESNET, "objective": "fastest", "budgetUsd": 5000, "constraints": {"providers": ["gcp"]}}, {}),
    "resnet-spot-preferred": ({**RESNET, "maxDuration": "2d", "constraints": {"spot": "preferred"}}, {}),
    "resnet-spot-never": ({**RESNET, "maxDuration": "2d", "constraints": {"spot": "never", "providers": ["aws"]}}, {}),
    "resnet-deadline-too-short": ({**RESNET, "maxDuration": "20m", "constraints": {"maxGpus": 16}}, {}),
    "resnet-budget-too-small": ({**RESNET, "maxDuration": "24h", "budgetUsd": 5}, {}),
    "resnet-no-deadline-budget": ({**RESNET, "budgetUsd": 3}, {}),
    "resnet-gpu-types": ({**RESNET, "maxDuration": "3d", "constraints": {"gpuTypes": ["a100", "L4"]}}, {}),
    "resnet-instance-regions": (
        {**RESNET, "maxDuration": "3d", "constraints": {"instanceTypes": ["p4d.24xlarge", "g5.xlarge", "a2-highgpu-1g"], "regions": ["us-east-1"]}},
        {},
    ),
    "resnet-max-nodes-min-gpus": ({**RESNET, "maxDuration": "1d", "constraints": {"minGpus": 8, "maxNodes": 2}}, {}),
    "resnet-risk-strict": ({**RESNET, "maxDuration": "10h", "constraints": {"maxDeadlineRisk": 0.001}}, {}),
    "resnet-checkpoint-fixed": ({**RESNET, "maxDuration": "1d", "checkpoint": {"intervalSeconds": 900, "writeSeconds": 30}}, {}),
    "resnet-unavailable": (
        {**RESNET, "maxDuration": "1d", "constraints": {"providers": ["aws"]}},
        {"unavailable": [["p3.8xlarge", "spot"], ["g5.xlarge", "spot"], ["p3.2xlarge", "on-demand"]]},
    ),
    "resnet-efficiency": (
        {**RESNET, "maxDuration": "1d"},
        {"efficiency": {"V100-16GB": 0.6, "A10G": 1.3}, "efficiency_sigma": {"V100-16GB": 0.05}},
    ),
    "resnet-deadline-override": ({**RESNET, "maxDuration": "1d"}, {"deadline_h": 3.5}),
    "resnet-flagged-prices": ({**RESNET, "maxDuration": "1d", "constraints": {"providers": ["azure"]}}, {"allow_flagged_prices": True}),
    "resnet-azure": ({**RESNET, "maxDuration": "1d", "constraints": {"providers": ["azure"]}}, {}),
    "bert-batch-not-divisible": ({**BERT, "globalBatch": 100, "maxDuration": "1d"}, {}),
    "bert-precisions": ({**BERT, "maxDuration": "1d", "constraints": {"precisions": ["fp32", "tf32", "bf16", "fp8"]}}, {}),
    "llama-fp8": (
        {"workload": {"model": "llama-7b"}, "globalBatch": 512, "training": {"steps": 2000}, "maxDuration": "4d",
         "constraints": {"precisions": ["amp", "fp8"], "maxGpus": 64}},
        {},
    ),
    "llama-too-big": (
        {"workload": {"model": "llama-7b"}, "globalBatch": 512, "training": {"steps": 2000}, "constraints": {"gpuTypes": ["T4"]}},
        {},
    ),
    "llama-memory": (
        {"workload": {"model": "llama-7b"}, "globalBatch": 512, "training": {"steps": 2000},
         "constraints": {"gpuTypes": ["T4", "A10G", "L4", "V100-16GB"], "maxNodes": 1}},
        {},
    ),
    "resnet-bf16-old-gpus": ({**RESNET, "maxDuration": "3d", "constraints": {"precisions": ["bf16"], "gpuTypes": ["V100-16GB", "T4", "A10G"]}}, {}),
    "resnet-bf16-v100": (
        {**RESNET, "globalBatch": 1536, "maxDuration": "3d",
         "constraints": {"precisions": ["bf16"], "gpuTypes": ["V100-16GB", "A100-80GB"], "maxGpus": 16}},
        {},
    ),
    "resnet-fp8-only": ({**RESNET, "maxDuration": "2d", "constraints": {"precisions": ["fp8"]}}, {}),
    "gpt2-steps": ({"workload": {"model": "gpt2-small"}, "globalBatch": 256, "training": {"steps": 10000}, "maxDuration": "2d"}, {}),
    "custom-transformer": (
        {"workload": {"transformer": {"layers": 12, "hidden": 1024, "heads": 16, "seqLen": 1024, "vocab": 50257}},
         "globalBatch": 128, "training": {"samples": 2000000}, "maxDuration": "3d", "budgetUsd": 2000},
        {},
    ),
    "custom-params": (
        {"workload": {"params": 3.0e8, "flopsPerSample": 5.0e12, "family": "cnn", "unit": "images/s"},
         "globalBatch": 512, "training": {"samples": 5.0e7}, "maxDuration": "2d"},
        {},
    ),
}
"""Generated specs by case name: the spec (camelCase) and the keyword arguments of ``plan``."""


def examples() -> dict[str, TrainingJobSpec]:
    """The TrainingJob examples under ``examples/``, by file name."""
    out = {}
    for f in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "TrainingJob":
            out[f.name] = TrainingJob.model_validate(doc).spec
    return out


def policies() -> dict[str, Policy]:
    """The merged policy of each shipped policy file for its namespace."""
    return {
        key: policy_for_namespace(load_policies(ROOT / "policies" / file), namespace)
        for key, (file, namespace) in POLICIES.items()
    }


def cases() -> dict[str, tuple[TrainingJobSpec, Policy | None, dict[str, Any]]]:
    """Every case by name: spec, policy (None: none) and keyword arguments of ``plan``."""
    out: dict[str, tuple[TrainingJobSpec, Policy | None, dict[str, Any]]] = {}
    pols = policies()
    for file, spec in examples().items():
        out[file] = (spec, None, {})
        for key, pol in pols.items():
            out[f"{file}+{key}"] = (spec, pol, {})
    for name, (body, kwargs) in SPECS.items():
        kw = dict(kwargs)
        if "unavailable" in kw:
            kw["unavailable"] = frozenset(tuple(pair) for pair in kw["unavailable"])
        out[name] = (TrainingJobSpec.model_validate(body), None, kw)
    spec = TrainingJobSpec.model_validate({**RESNET, "maxDuration": "30h", "budgetUsd": 3000})
    for key, pol in pols.items():
        out[f"resnet-30h+{key}"] = (spec, pol, {})
    return out


PRICE_PROVENANCE = ("zone", "priceSource", "priceDate")
"""Fields of each plan in ``plan --json`` that say where its price comes from, not what the plan is."""


def answer(spec: TrainingJobSpec, policy: Policy | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The planner's answer as ``gpuscaler plan --json`` prints it, without the timing, plus the
    feasible plans in the planner's order."""
    result = plan(spec, load_catalog(), policy, **kwargs)
    out = plan_to_dict(result)
    out.pop("planningSeconds")
    for c in [*([out["chosen"]] if out["chosen"] else []), *out["pareto"], *out["rejected"]]:
        # Where each price comes from (issue 34) was added after the golden file was made: not a plan.
        for key in PRICE_PROVENANCE:
            c.pop(key, None)
        # Held capacity (issue 37) came after it too: the golden policies declare none.
        assert c.pop("heldCapacity", "") == "" and c.pop("segments", []) == []
    out["feasibleOrder"] = [
        f"{c.nodes} {c.instance.name} {c.capacity.value} {c.precision.value} {c.micro_batch}x{c.accumulation} "
        f"z{c.zero_stage}{'c' if c.activation_checkpointing else ''} {c.expected_cost_usd:.2f} {c.expected_hours:.3f}"
        for c in result.feasible
    ]
    return out


def golden() -> dict[str, Any]:
    """The reference answers, by case name."""
    data: dict[str, Any] = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    return data


def main() -> int:
    """Print the answers, or write them to the golden file with ``--write``."""
    ap = argparse.ArgumentParser(description="the planner's answers to the golden cases")
    ap.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)}")
    args = ap.parse_args()
    answers = {name: answer(*case) for name, case in cases().items()}
    text = json.dumps(answers, indent=1, sort_keys=True) + "\n"
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(gzip.compress(text.encode(), mtime=0))
        print(f"wrote {len(answers)} cases to {GOLDEN}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
