"""The CLI as a user runs it: plan, estimate, validate, catalog; exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscaler.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trainingjob.yaml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuscaler.cli", *args], capture_output=True, text=True, check=False)


def test_plan_example_is_the_main_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "Chosen:" in out and "Pareto front" in out and "why:" in out


def test_plan_json_is_consistent(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    chosen = data["chosen"]
    assert chosen["microBatch"] * chosen["accumulation"] * chosen["gpus"] == data["job"]["globalBatch"]
    assert chosen["expectedHours"] <= data["job"]["deadlineHours"]
    assert chosen["expectedCostUsd"] <= data["job"]["budgetUsd"]
    assert data["pareto"] and data["feasible"]


def test_plan_plot_writes_png(tmp_path: Path) -> None:
    out = tmp_path / "plan.png"
    assert main(["plan", str(EXAMPLE), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_infeasible_plan_exits_1_with_hints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(EXAMPLE.read_text().replace("maxDuration: 24h", "maxDuration: 10m"))
    assert main(["plan", str(job)]) == 1
    assert "No feasible plan" in capsys.readouterr().out


def test_invalid_job_names_the_field(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(EXAMPLE.read_text().replace("globalBatch: 2048", "globalBatch: -5"))
    r = run("plan", str(job))
    assert r.returncode == 2
    assert "spec.globalBatch" in r.stderr and "-5" in r.stderr


def test_estimate_json_interface() -> None:
    r = run("estimate", "--workload", "resnet50", "--gpu", "a100", "--gpus", "8", "--precision", "amp", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for key in ("throughput", "unit", "step_time_s", "memory_per_gpu_gb", "fits", "scaling_efficiency"):
        assert key in data
    assert data["unit"] == "images" and data["fits"] is True and 0 < data["scaling_efficiency"] <= 1
    two = json.loads(run("estimate", "--workload", "resnet50", "--gpu", "a100", "--gpus", "16", "--nodes", "2",
                         "--precision", "amp", "--json").stdout)  # fmt: skip
    assert two["throughput"] > data["throughput"]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--workload", "resnet5", "--gpu", "a100"], "resnet50"),
        (["--workload", "resnet50", "--gpu", "h10"], "H100-80GB-SXM"),
    ],
)
def test_estimate_unknown_ids_exit_2_with_close_matches(args: list[str], expect: str) -> None:
    r = run("estimate", *args, "--json")
    assert r.returncode == 2
    assert expect in r.stderr


def test_validate_reports_the_three_relative_errors() -> None:
    r = run("validate", "--json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert set(data["relative"]) == {"gpu_speed_ratio", "amp_speedup", "scaling_efficiency"}
    assert data["overall"]["n"] > 600
    assert {"gpu", "precision", "family", "gpus"} <= set(data["by"])


def test_catalog_lists(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "instances"]) == 0
    assert "p4d.24xlarge" in capsys.readouterr().out


def test_catalog_workloads_show_what_a_batch_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """Token-unit workloads take batches in sequences or sentence pairs, and the catalog says so."""
    assert main(["catalog", "workloads"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "batch unit" in table[0]
    gnmt = next(line for line in table if line.startswith("gnmt "))
    assert "tokens" in gnmt and "sentence pairs" in gnmt
    assert main(["catalog", "workloads", "--json"]) == 0
    rows = {w["id"]: w for w in json.loads(capsys.readouterr().out)["workloads"]}
    assert (rows["transformerxl-base"]["batch_unit"], rows["transformerxl-base"]["unit"]) == ("sequences", "tokens")
    assert rows["transformerxl-base"]["samples_per_item"] == rows["transformerxl-base"]["seq_len"] == 192
    assert (rows["resnet50"]["batch_unit"], rows["resnet50"]["samples_per_item"]) == ("images", 1)
    # Counted kernels where scripts/kernel_counts.py counts them, null where it does not (GNMT).
    assert rows["maskrcnn"]["kernels_per_step"] > rows["resnet50"]["kernels_per_step"] > 0
    assert rows["maskrcnn"]["kernels_per_item"] > 0 and rows["gnmt"]["kernels_per_step"] is None
    for what in ("gpus", "instances"):
        assert main(["catalog", what, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[what]
