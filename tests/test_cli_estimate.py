"""``gpuscaler estimate`` and ``gpuscaler validate`` as a user runs them: batch units, memory format
and input pipeline flags, clear errors with exit 2, and the cross-validated errors in ``--json``."""

from __future__ import annotations

import json
import math

import pytest

from gpuscaler.cli import main


def estimate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["estimate", *args, "--json"]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_estimate_reports_what_batch_and_throughput_count(capsys: pytest.CaptureFixture[str]) -> None:
    txl = estimate_json(capsys, "--workload", "transformerxl-base", "--gpu", "a100", "--batch-per-gpu", "48")
    assert (txl["batch_unit"], txl["unit"], txl["batch_per_gpu"]) == ("sequences", "tokens", 48)
    # 48 sequences of 192 tokens per step: throughput x step time counts tokens.
    assert float(txl["throughput"]) * float(txl["step_time_s"]) == pytest.approx(48 * 192)  # type: ignore[arg-type]
    rn = estimate_json(capsys, "--workload", "resnet50", "--gpu", "a100")
    assert (rn["batch_unit"], rn["unit"]) == ("images", "images")
    assert estimate_json(capsys, "--workload", "gnmt", "--gpu", "a100")["batch_unit"] == "sentence pairs"


def test_estimate_shows_the_kernels_behind_the_host_time(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("--workload", "maskrcnn", "--gpu", "a100", "--precision", "amp")
    two = estimate_json(capsys, *base, "--batch-per-gpu", "2")
    four = estimate_json(capsys, *base, "--batch-per-gpu", "4")
    per_item = float(four["kernels_per_micro_batch"]) - float(two["kernels_per_micro_batch"])  # type: ignore[arg-type]
    assert per_item > 2 * 50  # detection launches kernels per image
    host2, host4 = (float(d["time_breakdown_s"]["host"]) for d in (two, four))  # type: ignore[index]
    assert host4 > host2 > 0
    assert main(["estimate", *base, "--batch-per-gpu", "4"]) == 0
    text = capsys.readouterr().out
    assert f"{float(four['kernels_per_micro_batch']):,.0f} kernels per micro-batch" in text  # type: ignore[arg-type]
    assert "host " in text and "compute " in text


def test_channels_last_and_dali_flags(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("--workload", "resnet50", "--gpu", "a100", "--precision", "amp", "--batch-per-gpu", "128")
    nchw = estimate_json(capsys, *base)
    nhwc = estimate_json(capsys, *base, "--channels-last")
    assert (nchw["channels_last"], nhwc["channels_last"]) == (False, True)
    assert float(nhwc["throughput"]) > float(nchw["throughput"])  # type: ignore[arg-type]
    dali = estimate_json(capsys, *base, "--data-loader", "dali")
    assert dali["data_loader"] == "dali"


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--batch-per-gpu", "0"], "argument --batch-per-gpu: 0 must be at least 1"),
        (["--accumulation", "-2"], "argument --accumulation: -2 must be at least 1"),
        (["--gpus", "0"], "argument --gpus: 0 must be at least 1"),
        (["--nodes", "0"], "argument --nodes: 0 must be at least 1"),
        (["--gpus", "6", "--nodes", "4"], "--gpus 6 must be a multiple of --nodes 4"),
        (["--network-gbps", "-1"], "argument --network-gbps: -1 must be greater than 0"),
        (["--precision", "bf16", "--gpu", "v100"], "V100-16GB has no bf16"),
        # Past what a TrainingJob may ask for: said, not computed (a 1e23-GPU ring, a 1e26 batch).
        (["--gpus", "99999999999999999999999"], "--gpus 99,999,999,999,999,999,999,999: at most 4,096"),
        (["--gpus", "2048", "--nodes", "2048"], "--nodes 2,048: at most 1,024"),
        (["--gpus", "64"], "64 GPUs per node; no node has more than 16: spread them over more nodes, e.g. --gpus 64 --nodes 8"),
        (["--batch-per-gpu", "10000000", "--gpus", "16"], "is a global batch of 160,000,000 images: at most 100,000,000"),
        (["--accumulation", "200000000"], "a micro-batch of 1 (the least) x --accumulation 200,000,000 x --gpus 1 is a global batch of 200,000,000 images"),
        (["--accumulation", "100000", "--gpus", "8"], "the default micro-batch of 256 (the largest that fits) x --accumulation 100,000 x --gpus 8 is a global batch of 204,800,000 images"),
    ],
)
def test_bad_estimate_input_exits_2_with_the_value(
    args: list[str], expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A later --gpu overrides the first (argparse keeps the last value).
    assert main(["estimate", "--workload", "resnet50", "--gpu", "a100", *args, "--json"]) == 2
    captured = capsys.readouterr()
    assert expect in captured.err and "Traceback" not in captured.err
    error = json.loads(captured.out)["error"]  # under --json the error is a JSON object on stdout
    assert error["exitCode"] == 2 and expect in error["message"]


def test_unknown_data_loader_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--workload", "resnet50", "--gpu", "a100", "--data-loader", "tfdata"]) == 2
    err = capsys.readouterr().err
    assert "tfdata" in err and "dali" in err  # the value and the choices


def test_validate_json_has_cross_validated_fractions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cv = data["cross_validation"]
    for metric in ("gpu_ratio", "amp_speedup", "scaling", "throughput"):
        m = cv[metric]
        assert 0 < m["mape"] < 1 and 0 < m["median_ape"] <= m["mape"] * 3 and m["n"] > 10
        assert m["log_sigma"] > 0 and not math.isnan(m["log_sigma"])
    assert {"gpu_transfer", "leave_one_workload_out", "leave_one_precision_out"} <= set(cv["schemes"])
    assert "scripts/calibrate.py" in cv["source"]
    # The model-free baseline on the same held-out pairs, the replicate spread and the in-sample lookup.
    for metric in ("gpu_ratio", "amp_speedup", "scaling"):
        assert cv["baseline"]["metrics"][metric]["n"] == cv[metric]["n"]
        assert 0 < cv["replicates"][metric]["mape"] < 1 and cv["replicates"][metric]["n"] > 10
        assert 0 < cv["lookup_in_sample"][metric]["mape"] < 1
        for level in ("workload", "workload_framework"):
            assert 0 < cv["own_parameters_in_sample"][level][metric]["mape"] < 1
    assert set(cv["baseline"]["schemes"]) == set(cv["schemes"])


def test_validate_table_shows_fit_and_cross_validation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    assert "CV MAPE %" in out and "leave_one_workload_out" in out and "GPU speed ratio" in out
    assert "baseline CV %" in out and "replicates %" in out and "Model-free baseline" in out
    assert "own params %" in out
