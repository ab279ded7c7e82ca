"""The memory model against configurations documented to run and to run out of memory.

Every row of ``catalog/data/memory_runs.csv`` is one test: a "ran" row must be predicted to fit and
an "oom" row not to; a failure names the row, its source and the predicted bytes. The truth here is
the documents (recipes that trained, out-of-memory reports), never the model's own output.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuscaler.catalog import CatalogError, Precision, load_catalog
from gpuscaler.catalog.loader import read_rows
from gpuscaler.catalog.memory_runs import MEMORY_RUN_COLUMNS, MemoryRun, load_memory_runs, parse_memory_runs
from gpuscaler.catalog.models import transformer_workload
from gpuscaler.catalog.workloads import TransformerShape
from gpuscaler.perfmodel import ParallelConfig, constants, memory_per_gpu
from gpuscaler.perfmodel.memory import GIB, agreement_json, check_run, memory_agreement, visible_bytes

RUNS = load_memory_runs()


@pytest.mark.parametrize("run", RUNS, ids=[r.id for r in RUNS])
def test_documented_configuration_agrees(run: MemoryRun) -> None:
    check = check_run(run)
    m = check.memory
    expected = "fit" if run.outcome == "ran" else "not fit"
    assert check.agrees, (
        f"{run.id} ({run.outcome}: {run.setting}; source {run.source}) should {expected}: predicted peak "
        f"{m.total / 1e9:.2f} GB (states {(m.weights + m.gradients + m.optimizer) / 1e9:.2f}, activations "
        f"{m.activations / 1e9:.2f}, overhead {m.overhead / 1e9:.2f}) against {m.capacity / 1e9:.2f} GB usable"
    )


def test_the_dataset_has_both_outcomes_and_every_source_kind() -> None:
    outcomes = {r.outcome for r in RUNS}
    assert outcomes == {"ran", "oom"}
    sources = {r.source.split("]")[0] + "]" for r in RUNS}
    assert {"[LF]", "[DLE-CFG]", "[DLE]", "[NG]", "[GH]"} <= sources
    assert all(r.setting and r.source for r in RUNS)


def test_both_rates_are_reported_as_the_tests_find_them() -> None:
    a = memory_agreement()
    report = agreement_json(a)
    assert report["ran"] == sum(r.outcome == "ran" for r in RUNS)
    assert report["oom"] == sum(r.outcome == "oom" for r in RUNS)
    assert report["ran_predicted_to_fit"] == sum(check_run(r).agrees for r in RUNS if r.outcome == "ran")
    assert report["misses"] == [] and report["ran_fit_pct"] == 100.0 and report["oom_flagged_pct"] == 100.0


def test_llm_foundry_7b_micro_batch_6_fits_on_80gb_for_its_reasons() -> None:
    """The issue's example: MPT-7B, FSDP FULL_SHARD over 8 GPUs, micro-batch 6 at sequence 2048, no
    activation checkpointing, on 80 GB H100s. It fits because the card has 80 GiB (not 80e9 bytes)
    and the recipe has no dropout and a fused cross-entropy, not by a margin; one more micro-batch of 2
    does not fit."""
    run = next(r for r in RUNS if r.id == "mpt-7b-s2048-8xh100_80gb-mb6-amp_bf16")
    m = check_run(run).memory
    assert m.fits
    assert m.visible == pytest.approx(80 * GIB * 0.986)
    shape = run.workload.shape
    assert shape is not None and not shape.dropout and shape.fused_loss and shape.flash_attention
    # activations: 32 layers x 2048 tokens x (4h + 10h + 2h + 4 x 4h) bytes + 16-bit logits, x 6 sequences
    per_seq = 32 * 2048 * 4096 * 32 + 2048 * 50368 * 2
    assert m.activations == pytest.approx(6 * per_seq)
    cfg = ParallelConfig(micro_batch=8, precision=Precision.BF16, gpus_per_node=8, zero_stage=3)
    assert not memory_per_gpu(run.workload, run.gpu, cfg).fits


def test_dropout_and_an_unfused_loss_cost_what_korthikanti_counts() -> None:
    """With dropout, standard attention and f = 4h the per-layer bytes are Korthikanti et al.'s
    34 sbh + 5 as^2 b; the fp32 softmax of the loss adds 4 bytes per logit."""
    s, h, a = 512, 1024, 16
    plain = TransformerShape(24, h, a, s, 30522, head="none")
    assert plain.layer_activation_bytes() == pytest.approx(s * h * 34 + 5 * a * s * s)
    lean = dataclasses.replace(plain, dropout=False, flash_attention=True)
    assert lean.layer_activation_bytes() == pytest.approx(s * h * 32)
    lm = TransformerShape(12, 768, 12, 1024, 50304, head="lm")
    assert lm.head_activation_bytes() - dataclasses.replace(lm, fused_loss=True).head_activation_bytes() == (
        pytest.approx(4 * 1024 * 50304)
    )
    gated = TransformerShape(32, 4096, 32, 2048, 32000, ffn=11008, gated=True, flash_attention=True)
    assert gated.layer_activation_bytes() == pytest.approx(2048 * (4 * 4096 + 10 * 4096 + 2 * 4096 + 8 * 11008 + 2 * 4096))


def test_headroom_rule_subtracts_context_and_nccl_from_what_the_driver_gives() -> None:
    c = constants()["memory"]
    cat = load_catalog()
    w = cat.workload("resnet50")
    one = memory_per_gpu(w, cat.gpu("T4"), ParallelConfig(micro_batch=32))
    assert one.visible == pytest.approx(16 * GIB * c["visible_fraction"]["gddr_ecc"])
    assert one.capacity == pytest.approx(one.visible - c["cuda_context_gib"] * GIB)
    eight = memory_per_gpu(w, cat.gpu("A100-80GB"), ParallelConfig(micro_batch=32, gpus_per_node=8))
    assert eight.capacity == pytest.approx(visible_bytes(cat.gpu("A100-80GB")) - (c["cuda_context_gib"] + c["nccl_buffers_gib"]) * GIB)
    assert eight.buckets == pytest.approx(w.params * 2)  # DDP's bucket copy of the 16-bit gradients
    assert one.fits == (one.total <= one.capacity)


def test_fsdp_gathers_whole_units_and_ddp_keeps_buckets() -> None:
    cat = load_catalog()
    shape = TransformerShape(32, 4096, 32, 2048, 50368, flash_attention=True)
    w = transformer_workload(shape)
    gpu = cat.gpu("A100-80GB")
    z3 = memory_per_gpu(w, gpu, ParallelConfig(micro_batch=1, precision=Precision.BF16, gpus_per_node=8, zero_stage=3))
    embedding = 50368 * 4096
    assert embedding > shape.layer_params
    assert z3.gathered == pytest.approx(2 * (embedding + shape.layer_params) + 2 * embedding) and z3.buckets == 0
    z0 = memory_per_gpu(w, gpu, ParallelConfig(micro_batch=1, precision=Precision.BF16, gpus_per_node=8))
    assert z0.gathered == 0 and z0.buckets == pytest.approx(2 * w.params)


def _rows(**change: str) -> list[dict[str, str]]:
    text = "# schema: 1\n" + ",".join(MEMORY_RUN_COLUMNS) + "\n"
    row = dict.fromkeys(MEMORY_RUN_COLUMNS, "")
    row.update(id="x", outcome="ran", workload="resnet50", gpu="T4", gpus="1", precision="amp", micro_batch="8",
               zero_stage="0", activation_checkpointing="0", optimizer="sgd", setting="s", source="[GH] u")
    row.update(change)
    return read_rows(text + ",".join(row[c] for c in MEMORY_RUN_COLUMNS) + "\n", "memory_runs.csv")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"outcome": "maybe"}, "outcome 'maybe': use ran or oom"),
        ({"precision": "fp4"}, "precision 'fp4': use one of"),
        ({"gpus": "12"}, "gpus 12"),
        ({"micro_batch": "0"}, "micro_batch 0"),
        ({"source": ""}, "needs its setting and its source"),
        ({"activation_checkpointing": "yes"}, "activation_checkpointing 'yes': use 0 or 1"),
        ({"workload": "transformer", "layers": "2", "hidden": "64", "heads": "2", "seq_len": "8", "vocab": "10",
          "gated": "0", "head": "cls", "flash": "1", "dropout": "0", "fused_loss": "0"}, "head 'cls'"),
    ],
)
def test_malformed_rows_are_refused_with_what_to_change(change: dict[str, str], message: str) -> None:
    with pytest.raises(CatalogError, match=message.replace("(", r"\(")):
        parse_memory_runs(_rows(**change), load_catalog())


def test_a_well_formed_row_parses_with_its_optimizer() -> None:
    (run,) = parse_memory_runs(_rows(optimizer="rmsprop"), load_catalog())
    assert run.workload.optimizer == "rmsprop" and run.gpus_per_node == 1 and run.nodes == 1


def test_validate_prints_both_rates_in_its_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuscaler.cli import main

    ran = sum(r.outcome == "ran" for r in RUNS)
    oom = len(RUNS) - ran
    assert main(["validate", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert (memory["ran"], memory["ran_predicted_to_fit"], memory["oom"], memory["oom_predicted_not_to_fit"]) == (
        ran, ran, oom, oom
    )
    assert main(["validate"]) == 0
    text = capsys.readouterr().out
    section = text[text.index("Memory against documented configurations"):]
    rows = {line.split(" (")[0]: line.split()[-3:] for line in section.splitlines()[3:5]}
    assert rows == {"trained": [str(ran), str(ran), "100.0%"], "out of memory": [str(oom), str(oom), "100.0%"]}
    assert "MISS" not in section
