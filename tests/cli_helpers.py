"""Helpers of the CLI's input tests (test_cli_errors.py, test_cli_inputs.py): run ``main`` in-process, expect a clean error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuscaler.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
TRACE = ROOT / "examples" / "traces" / "llm-finetune-burst.jsonl"
JOB = """apiVersion: gpuscaler.io/v1alpha1
kind: TrainingJob
metadata: {name: resnet50-imagenet}
spec:
  workload: {model: resnet50}
  globalBatch: 2048
  training: {epochs: 90}
  maxDuration: 24h
  budgetUsd: 1500
  constraints:
    providers: [aws]
    maxGpus: 64
"""
"""examples/trainingjob.yaml in flow style, for the cases to edit one line of."""


def strict_json(text: str) -> Any:
    """Parse as JSON refusing NaN and Infinity (Python's json accepts them by default)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def invalid(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run, expect exit 2 with a message; with --json also the error object. Returns stderr."""
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("gpuscaler: ")
    if "--json" in args:
        body = strict_json(out)["error"]
        assert body["exitCode"] == 2 and body["message"] and body["message"] in err
    return err


def job_file(tmp_path: Path, text: str, name: str = "job.yaml") -> str:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)
