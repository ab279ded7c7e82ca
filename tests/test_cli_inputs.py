"""Bad input, by class, through the command line (issue 38): each refused with exit code 2 and a
message naming the cause, never a traceback, never a hang, never "written" when it was not.

Classes: Kubernetes names and labels (the API server's rules, the CLI's ``--namespace`` too);
numbers that are not finite (said at their line and column);
duplicates (trace job names, policy names: both places named); deadlines and trace starts without
a time zone or as a bare number; special files (a FIFO with no writer, a device) refused before any
read; outputs to a full device; traces over the documented cap; arguments checked before
prerequisites (built binaries); a region of another provider.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import EXAMPLE, JOB, invalid, job_file
from gpuscaler.simulator.trace import MAX_TRACE_JOBS

pytestmark = pytest.mark.timeout(120)  # a FIFO opened blocking would hang: fail instead
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- names, labels and numbers


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: ResNet_50}", "metadata.name 'ResNet_50' is not a valid name"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: '" + "a" * 254 + "'}", "at most 253 characters"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: -x}", "metadata.name '-x'"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: ok, namespace: Team.A}", "metadata.namespace 'Team.A'"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: ok, labels: {team: a b}}", "is not a label value"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: ok, labels: {team: 12}}", "quote numbers"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: ok, labels: {'-bad': x}}", "is not a label key"),
        ("metadata: {name: resnet50-imagenet}", "metadata: {name: ok, labels: {'a/b/c': x}}", "is not a label key"),
        # numbers that are not finite, at their line and column
        ("training: {epochs: 90}", "training: {epochs: .inf}", "line 7, column 22: '.inf' is not a finite number"),
        ("budgetUsd: 1500", "budgetUsd: .inf", "line 9, column 14: '.inf' is not a finite number"),
        ("workload: {model: resnet50}", "workload: {params: 1e9, flopsPerSample: .inf}", "line 5, column 43: '.inf'"),
        ("budgetUsd: 1500", "budgetUsd: .nan", "line 9, column 14: '.nan' is not a finite number"),
    ],
)
def test_names_labels_and_numbers_the_api_server_would_refuse(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, old: str, new: str, said: str
) -> None:
    assert old in JOB
    err = invalid(capsys, "plan", job_file(tmp_path, JOB.replace(old, new)), "--json")
    assert said in err


@pytest.mark.parametrize("ns", ["Team_A", "a.b", "-x", "x" * 64])
def test_the_cli_namespace_follows_the_same_rule(capsys: pytest.CaptureFixture[str], ns: str) -> None:
    err = invalid(capsys, "plan", str(EXAMPLE), f"--namespace={ns}")
    assert "argument --namespace" in err and "DNS label" in err


# ------------------------------------------------------------------------------ duplicates


def trace_line(name: str, hours: float = 1.0) -> str:
    spec = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 1}}
    return json.dumps({"name": name, "arrivalHours": hours, "spec": spec})


def test_a_trace_job_name_used_twice_names_both_places(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join([trace_line("a"), trace_line("b"), trace_line("a", 3)]) + "\n")
    err = invalid(capsys, "simulate", str(p), "--seeds", "1")
    assert f"{p}:3: job name 'a' is already used at {p}:1" in err
    y = tmp_path / "t.yaml"
    jobs = [json.loads(trace_line(n)) for n in ("x", "x")]
    y.write_text(json.dumps({"start": "2026-03-02T00:00:00Z", "jobs": jobs}))
    assert "t: jobs[1]: job name 'x' is already used at t: jobs[0]" in invalid(capsys, "simulate", str(y))


def test_a_trace_job_name_the_api_server_would_refuse(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(trace_line("Job_1") + "\n")
    assert "name 'Job_1' is not a valid name" in invalid(capsys, "simulate", str(p))


def test_a_policy_name_used_twice_names_both_documents(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("name: team\nmaxGpusPerJob: 8\n---\nname: other\n---\nname: team\nmaxGpusPerJob: 16\n")
    err = invalid(capsys, "plan", str(EXAMPLE), "--policy", str(pol))
    assert "documents 1 and 3 are both named 'team'" in err
    pol.write_text("apiVersion: gpuscaler.io/v1alpha1\nkind: GPUScalingPolicy\nmetadata: {name: Team}\nspec: {}\n")
    assert "name 'Team' is not a valid name" in invalid(capsys, "plan", str(EXAMPLE), "--policy", str(pol))


# ------------------------------------------------------------------------------ time zones


@pytest.mark.parametrize(
    ("deadline", "said"),
    [
        ("2026-12-01T18:00:00", "has no time zone"),
        ("'2026-12-01T18:00:00'", "has no time zone"),
        ("2026-12-01", "has no time zone"),
        ("1796140800", "is a bare number"),
        ("1796140800.5", "is a bare number"),
        ("next tuesday", "is not an RFC 3339 time"),
    ],
)
def test_a_deadline_must_carry_a_time_zone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, deadline: str, said: str
) -> None:
    text = JOB.replace("  maxDuration: 24h\n", f"  deadline: {deadline}\n")
    err = invalid(capsys, "plan", job_file(tmp_path, text), "--json")
    assert said in err and "2026-12-01T18:00:00Z" in err, err


def test_a_zoned_deadline_is_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from cli_helpers import run

    at = (datetime.now(UTC) + timedelta(days=30)).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")  # an offset, not Z
    text = JOB.replace("  maxDuration: 24h\n", f"  deadline: '{at}'\n")
    code, out, err = run(capsys, "plan", job_file(tmp_path, text), "--json")
    assert code in (0, 1) and json.loads(out), err


def test_a_trace_start_must_carry_a_time_zone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"trace": {"start": "2026-03-02T00:00:00"}}) + "\n" + trace_line("a") + "\n")
    assert "start '2026-03-02T00:00:00' has no time zone" in invalid(capsys, "simulate", str(p))


# ------------------------------------------------------------------------------ special files


@pytest.mark.parametrize("command", [["plan", "{f}"], ["simulate", "{f}"], ["plan", str(EXAMPLE), "--policy", "{f}"],
                                     ["simulate", str(ROOT / "examples/traces/llm-finetune-burst.jsonl"), "--spot-prices", "{f}"]])
def test_a_fifo_with_no_writer_is_refused_without_blocking(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    err = invalid(capsys, *[c.format(f=fifo) for c in command])
    assert "is a FIFO (named pipe), not a regular file" in err


def test_a_device_is_refused_before_any_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a character device, not a regular file" in invalid(capsys, "plan", "/dev/zero")
    assert "is a character device" in invalid(capsys, "simulate", "/dev/urandom")


# ------------------------------------------------------------------------------ outputs


def test_a_plot_to_a_full_device_is_an_error_not_written(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    err = invalid(capsys, "plan", str(EXAMPLE), "--plot", "/dev/full")
    assert "--plot /dev/full: cannot write it (No space left on device); it was not written" in err
    assert "plot written" not in err


def test_standard_output_to_a_full_device_is_an_error() -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gpuscaler.cli", "plan", str(EXAMPLE), "--json"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=110, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT / "operator")},
        )
    assert done.returncode == 2, done.stderr
    assert "writing the output: No space left on device" in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ large traces


def test_a_trace_over_the_documented_cap_is_refused_before_it_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "huge.jsonl"
    with p.open("w") as f:
        for i in range(100_000):
            f.write(trace_line(f"job-{i}", i / 100) + "\n")
    err = invalid(capsys, "simulate", str(p), "--json")
    assert f"{p}:{MAX_TRACE_JOBS + 1}: more than {MAX_TRACE_JOBS:,} jobs" in err and "split the trace" in err
    assert f"{MAX_TRACE_JOBS:,}" in (ROOT / "docs" / "inputs.md").read_text()  # documented


# ------------------------------------------------------------------------------ order and causes


@pytest.mark.parametrize(("pool", "said"), [("a=p4d.24xlargeX:2", "unknown instance 'p4d.24xlargeX'"),
                                             ("A_B=p4d.24xlarge:2", "pool name 'A_B'"),
                                             ("a=p4d.24xlarge:0", "at least 1")])
def test_arguments_are_checked_before_the_binaries(capsys: pytest.CaptureFixture[str], pool: str, said: str,
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUSCALER_CACHE_DIR", str(tmp_path / "empty-cache"))  # nothing built: a bad argument must win
    err = invalid(capsys, "dev-cluster", "up", "--no-build", "--pool", pool)
    assert said in err and "not built" not in err


def test_a_region_of_another_provider_is_named_as_such(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = JOB.replace("    providers: [aws]\n", "    providers: [aws]\n    regions: [us-central1]\n")
    err = invalid(capsys, "plan", job_file(tmp_path, text), "--json")
    assert "region 'us-central1' is a region of gcp, not of constraints.providers (aws)" in err
    assert "memory" not in err


@pytest.mark.parametrize("args", [["report", "Job_1"], ["report", "ok", "-n", "Team_A"]])
def test_report_checks_the_job_and_namespace_names(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    err = invalid(capsys, *args)
    assert "is not a valid name" in err or "DNS label" in err
