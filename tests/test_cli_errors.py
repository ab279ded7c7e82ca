"""Every bad input gets a clear error: each case a new user hit, run in-process through ``main``.

Exit codes as documented (0 ok, 1 infeasible, 2 invalid input or usage), the message naming the
file or field and the value, never a traceback, and under ``--json`` a JSON error object on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import EXAMPLE, JOB, TRACE, invalid, job_file, run, strict_json
from gpuscaler.cli import EXIT_CODES

# ------------------------------------------------------------------------------ were tracebacks


@pytest.mark.parametrize("flag", ["--gpus", "--nodes", "--accumulation", "--batch-per-gpu"])
def test_estimate_counts_below_one(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    err = invalid(capsys, "estimate", "--workload", "resnet50", "--gpu", "a100", flag, "0", "--json")
    assert f"argument {flag}: 0 must be at least 1" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-3", "fast"])
def test_estimate_network_must_be_a_finite_positive_number(capsys: pytest.CaptureFixture[str], value: str) -> None:
    err = invalid(capsys, "estimate", "--workload", "resnet50", "--gpu", "a100", "--gpus", "16", "--nodes", "2",
                  "--network-gbps", value, "--json")  # fmt: skip
    assert "--network-gbps" in err and value in err


def test_plan_on_a_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert f"{tmp_path}: is a directory" in invalid(capsys, "plan", str(tmp_path))


def test_plan_on_a_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "job.bin"
    p.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00" + bytes(range(256)))
    assert "looks binary" in invalid(capsys, "plan", str(p))


def test_plan_on_a_utf16_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_text(JOB, encoding="utf-16")
    assert "is UTF-16 encoded; save it as UTF-8" in invalid(capsys, "plan", str(p))


def test_plan_on_latin1_bytes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_bytes(JOB.replace("resnet50-imagenet", "r\xe9seau").encode("latin-1"))
    assert "not UTF-8 text (byte 0xe9" in invalid(capsys, "plan", str(p))


def test_plan_on_an_unreadable_file(capsys: pytest.CaptureFixture[str]) -> None:
    # /proc/self/mem opens but its first page cannot be read (EIO): a real unreadable file.
    assert "/proc/self/mem: cannot be read" in invalid(capsys, "plan", "/proc/self/mem")


def test_plan_on_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "no-such.yaml: no such file" in invalid(capsys, "plan", str(tmp_path / "no-such.yaml"), "--json")


def test_policy_check_on_a_directory_and_a_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "is a directory" in invalid(capsys, "policy", "check", str(tmp_path))
    p = tmp_path / "p.bin"
    p.write_bytes(b"\x00\x01\x02name: x")
    assert "looks binary" in invalid(capsys, "policy", "check", str(p), "--json")


def test_policy_resource_whose_spec_is_a_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = job_file(tmp_path, "kind: GPUScalingPolicy\nmetadata: {name: x}\nspec: [1, 2]\n", "p.yaml")
    assert "spec must be a mapping" in invalid(capsys, "policy", "check", p)
    q = job_file(tmp_path, "- maxGpusPerJob: 4\n", "q.yaml")
    assert "a policy must be a mapping" in invalid(capsys, "policy", "check", q)


def trace(tmp_path: Path, job: dict[str, Any], cloud: dict[str, Any] | None = None) -> str:
    lines = [json.dumps({"trace": {"name": "t", "cloud": cloud or {}}}), json.dumps(job)]
    return job_file(tmp_path, "\n".join(lines) + "\n", "t.jsonl")


SPEC = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 1}}


def test_simulate_arrival_nan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("jobs:\n- {name: a, arrivalHours: .nan, spec: {workload: {model: resnet50}, globalBatch: 8, "
                 "training: {steps: 1}}}\n")  # fmt: skip
    assert "'.nan' is not a finite number" in invalid(capsys, "simulate", str(p))
    # JSONL cannot spell NaN as JSON, but Python's json would read it
    bad = job_file(tmp_path, '{"name": "a", "arrivalHours": NaN, "spec": {}}\n', "n.jsonl")
    assert "NaN is not a number JSON allows" in invalid(capsys, "simulate", bad)


@pytest.mark.parametrize(
    ("cloud", "field"),
    [
        ({"spotShortage": "high"}, "cloud.spotShortage"),
        ({"interruptionScale": True}, "cloud.interruptionScale"),
        ({"noticeSeconds": 30}, "cloud.noticeSeconds"),
        ({"shortageOverrides": {"p4d.24xlarge": {"spot": -1}}}, "cloud.shortageOverrides.p4d.24xlarge.spot"),
    ],
)
def test_simulate_badly_typed_cloud(capsys: pytest.CaptureFixture[str], tmp_path: Path, cloud: dict[str, Any],
                                    field: str) -> None:  # fmt: skip
    err = invalid(capsys, "simulate", trace(tmp_path, {"name": "a", "arrivalHours": 0, "spec": SPEC}, cloud), "--json")
    assert field in err


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--checkpoint-interval", "0", "must be greater than 0"),
        ("--checkpoint-interval", "nan", "not a finite number"),
        ("--interruption-scale", "-1", "must be at least 0"),
        ("--shortage-scale", "inf", "not a finite number"),
        ("--scaling-error", "-0.1", "must be at least 0"),
        ("--deadline-scale", "0", "must be greater than 0"),
    ],
)
def test_simulate_flags(capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str) -> None:
    assert says in invalid(capsys, "simulate", str(TRACE), flag, value, "--json")


def test_simulate_jobs_out_into_a_missing_directory_fails_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    t0 = time.perf_counter()
    err = invalid(capsys, "simulate", str(TRACE), "--jobs-out", str(tmp_path / "nope" / "jobs.jsonl"))
    assert "does not exist" in err and time.perf_counter() - t0 < 5  # no replay ran (it takes minutes)


def test_crd_output_onto_an_existing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    assert "is a file" in invalid(capsys, "crd", "-o", str(f))
    assert f.read_text() == "x"


@pytest.mark.parametrize(("command", "module", "extra"), [
    (["run"], "kopf", "operator"),
    (["report", "job"], "kubernetes", "operator"),
])  # fmt: skip
def test_operator_commands_without_the_operator_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str], module: str, extra: str
) -> None:
    for name in list(sys.modules):  # the import system's own "not installed" (None in sys.modules)
        if name == module or name.startswith(module + "."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)
    assert f"pip install 'gpuscaler[{extra}]'" in invalid(capsys, *command)


def test_plot_without_matplotlib_says_so_before_planning(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(capsys, "plan", str(EXAMPLE), "--plot", str(tmp_path / "p.png"))
    assert code == 2 and "pip install matplotlib" in err and out == ""


def test_plot_into_a_missing_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "plan", str(EXAMPLE), "--plot", str(tmp_path / "no" / "p.png"))
    assert code == 2 and "does not exist" in err and out == ""


def test_plot_of_an_infeasible_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    code, _, _ = run(capsys, "plan", job_file(tmp_path, JOB.replace("maxDuration: 24h", "maxDuration: 10m")),
                     "--plot", str(png))  # fmt: skip
    assert code == 1 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------- were silently accepted


def test_duplicate_key_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = JOB + "  constraints: {providers: [azure]}\n"
    assert text.count("constraints:") == 2
    err = invalid(capsys, "plan", job_file(tmp_path, text))
    assert "duplicate key 'constraints'" in err and "first at line" in err


@pytest.mark.parametrize(("old", "new", "field"), [
    ("globalBatch: 2048", "globalBatch: true", "spec.globalBatch: expected a number, got a boolean True"),
    ("globalBatch: 2048", 'globalBatch: "2048"', "spec.globalBatch: expected a number, got a string"),
    ("budgetUsd: 1500", "budgetUsd: false", "spec.budgetUsd: expected a number, got a boolean"),
])  # fmt: skip
def test_bool_and_quoted_numbers_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, old: str, new: str,
                                             field: str) -> None:  # fmt: skip
    assert field in invalid(capsys, "plan", job_file(tmp_path, JOB.replace(old, new)), "--json")


def test_transformer_shape_must_divide(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = JOB.replace("workload: {model: resnet50}",
                       "workload: {transformer: {layers: 12, hidden: 1000, heads: 7, seqLen: 512, vocab: 30000}}")  # fmt: skip
    err = invalid(capsys, "plan", job_file(tmp_path, text))
    assert "spec.workload.transformer" in err and "hidden 1000 is not divisible by heads 7" in err
    assert "heads 8" in err  # the divisor of 1000 nearest 7


def test_empty_policy_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = job_file(tmp_path, "# nothing yet\n", "p.yaml")
    assert "holds no policy" in invalid(capsys, "policy", "check", empty)
    assert "holds no policy" in invalid(capsys, "plan", str(EXAMPLE), "--policy", empty)


# ------------------------------------------------------------------------- were wrong advice


@pytest.mark.parametrize(("constraint", "says"), [
    ("regions: [us-east-l]", "no instance type in region 'us-east-l'; did you mean us-east-1"),
    ("instanceTypes: [p4d.24xlage]", "unknown instance 'p4d.24xlage'; did you mean p4d.24xlarge"),
    ("minGpus: 4096", "constraints.minGpus 4096: no plan has that many GPUs (the largest has 2048)"),
])  # fmt: skip
def test_unknown_names_and_impossible_counts_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    constraint: str, says: str) -> None:  # fmt: skip
    text = JOB.replace("    maxGpus: 64", f"    {constraint}")
    err = invalid(capsys, "plan", job_file(tmp_path, text), "--json")
    assert says in err


def test_unknown_provider_in_a_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = job_file(tmp_path, "name: lab\nproviders: [ibm]\n", "p.yaml")
    assert "unknown provider 'ibm'" in invalid(capsys, "plan", str(EXAMPLE), "--policy", p)
    assert "unknown provider 'ibm'" in invalid(capsys, "policy", "check", p, "--json")


def test_unknown_command_gets_close_matches(capsys: pytest.CaptureFixture[str]) -> None:
    err = invalid(capsys, "plna", str(EXAMPLE))
    assert "invalid choice 'plna'" in err and "did you mean plan?" in err and "usage:" in err


# ---------------------------------------------------------------------------- were not JSON


def test_simulate_json_has_no_nan_when_a_strategy_finishes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    huge = {"workload": {"params": 1e13, "flopsPerSample": 1e15}, "globalBatch": 8, "training": {"samples": 1000}}
    code, out, _ = run(capsys, "simulate", trace(tmp_path, {"name": "a", "arrivalHours": 0, "spec": huge}), "--json")
    assert code == 0
    rows = strict_json(out)["strategies"]
    assert rows and all(r["unfinished"]["min"] == r["jobs"] and r["mean_completion_h"] is None for r in rows)


def test_usage_errors_under_json_are_error_objects(capsys: pytest.CaptureFixture[str]) -> None:
    err = invalid(capsys, "estimate", "--workload", "resnet50", "--json")  # --gpu missing
    assert "the following arguments are required: --gpu" in err


def test_unknown_ids_under_json_carry_close_matches(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--workload", "resnet5", "--gpu", "a100", "--json")
    body = strict_json(out)["error"]
    assert code == 2 and body["kind"] == "unknown-name" and "resnet50" in body["closeMatches"]


# ------------------------------------------------------------------------------- exhaustion


def test_alias_bomb_is_refused_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = ["apiVersion: gpuscaler.io/v1alpha1", "kind: TrainingJob", "spec:", "  workload: {model: resnet50}",
             "  training: {epochs: 90}", "  x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]  # fmt: skip
    lines += [f"  x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = job_file(tmp_path, "\n".join([*lines, "  globalBatch: *x8"]) + "\n")
    assert len(Path(bomb).read_bytes()) < 700
    assert "YAML aliases (*x0) are not accepted" in invalid(capsys, "plan", bomb, "--json")
    assert "YAML aliases" in invalid(capsys, "policy", "check", bomb)


def test_oversized_file_is_refused_unread(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(JOB + "#" + "x" * 2_000_000 + "\n")
    assert "is over the 1.57 MB limit for a TrainingJob file" in invalid(capsys, "plan", str(big))


def test_deeply_nested_document(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    deep = job_file(tmp_path, JOB + "  template: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested deeper than 64 levels" in invalid(capsys, "plan", deep)


def test_absurd_work_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = JOB.replace("training: {epochs: 90}", "training: {samples: 5e14}").replace("24h", "99999999d")
    assert "beyond the 8,784 h (one year) planning horizon" in invalid(capsys, "plan", job_file(tmp_path, text))
    too_many = JOB.replace("epochs: 90", "samples: 2e15")
    assert "spec.training.samples: Input should be less than or equal to" in invalid(capsys, "plan", job_file(tmp_path, too_many))
    epochs = JOB.replace("epochs: 90", "epochs: 1000000, samplesPerEpoch: 2000000000")
    assert "2e+15 samples is over 1e+15" in invalid(capsys, "plan", job_file(tmp_path, epochs))
    steps = JOB.replace("epochs: 90", "steps: 1000000000000")
    assert "training.steps 1,000,000,000,000 x globalBatch 2,048" in invalid(capsys, "plan", job_file(tmp_path, steps))
    far = JOB.replace("maxDuration: 24h", "deadline: 9999-12-31T00:00:00Z")
    assert "beyond the 8,784 h (one year) planning horizon" in invalid(capsys, "plan", job_file(tmp_path, far))


def test_huge_but_allowed_work_plans_in_bounded_time(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = JOB.replace("training: {epochs: 90}", "training: {samples: 5e14}").replace("24h", "366d")
    code, out, _ = run(capsys, "plan", job_file(tmp_path, text), "--json")
    data = strict_json(out)
    assert code in (0, 1) and data["job"]["totalSamples"] == 5e14


# --------------------------------------------------------------------------------- messages


def test_max_duration_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = invalid(capsys, "plan", job_file(tmp_path, JOB.replace("24h", "one day")))
    assert "write days, hours and/or minutes" in err and "\\d" not in err
    err = invalid(capsys, "plan", job_file(tmp_path, JOB.replace("24h", "0h")))
    assert "duration '0h' is zero" in err and "-0.0" not in err


def test_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ([], ["plan"], ["simulate"], ["policy", "check"]):
        code, out, _ = run(capsys, *command, "--help")
        assert code == 0
        for c, what in EXIT_CODES.items():
            assert f"{c}  {what}" in " ".join(out.split()) or f"{c}  {what.split(':')[0]}" in out


@pytest.mark.parametrize(("env", "value"), [("GPUSCALER_RECONCILE_INTERVAL_S", "nan"), ("GPUSCALER_MASTER_PORT", "0")])
def test_run_with_invalid_settings(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: str,
                                   value: str) -> None:  # fmt: skip
    monkeypatch.setenv(env, value)
    err = invalid(capsys, "run")
    assert "settings (GPUSCALER_* environment variables) is invalid" in err
    assert f"{env}=" in err  # named as the user set it


def test_long_values_are_shortened_in_messages(capsys: pytest.CaptureFixture[str]) -> None:
    err = invalid(capsys, "estimate", "--workload", "x" * 100_000, "--gpu", "a100", "--json")
    assert len(err) < 1000 and "(100,002 characters)" in err


def test_closed_pipe_is_quiet() -> None:
    import subprocess

    r = subprocess.run(f"{sys.executable} -m gpuscaler.cli catalog instances | head -1", shell=True,
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0 and "instance" in r.stdout and r.stderr == ""
