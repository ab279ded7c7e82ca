"""The input layer (gpuscaler.inputs): file reading, strict YAML and JSON, strict models, CLI value types."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.inputs import (
    MAX_DEPTH,
    InputError,
    format_validation,
    non_negative_float,
    output_file,
    parse_json,
    parse_yaml,
    parse_yaml_all,
    positive_float,
    positive_int,
    read_text,
    shown,
    to_json,
)
from gpuscaler.policy import Policy


def test_read_text_caps_the_read(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text("a: 1\n" * 300)
    assert read_text(p, limit=10_000).count("a: 1") == 300
    with pytest.raises(InputError, match=r"1,500 bytes is over the 1,000 bytes limit for a file"):
        read_text(p, limit=1000)
    # a device (endless) or a FIFO (no writer: a blocking open waits for ever) is refused unread
    with pytest.raises(InputError, match="is a character device, not a regular file"):
        read_text("/dev/zero", limit=1000)


def test_read_text_strips_a_utf8_bom(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_text(p) == "a: 1\n"


def test_yaml_refuses_aliases_duplicates_nan_and_depth() -> None:
    with pytest.raises(InputError, match=r"src: line 2, column 4: YAML aliases \(\*a\)"):
        parse_yaml("a: &a 1\nb: *a\n", "src")
    with pytest.raises(InputError, match=r"line 3, column 1: duplicate key 'a' \(first at line 1, column 1\)"):
        parse_yaml("a: 1\nb: 2\na: 3\n")
    with pytest.raises(InputError, match="duplicate key 'x'"):
        parse_yaml("outer: {x: 1, x: 2}\n")
    for bad in (".nan", ".inf", "-.Inf", "1e999"):
        with pytest.raises(InputError, match="is not a finite number"):
            parse_yaml(f"v: {bad}\n")
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_yaml(ok) is not None
    with pytest.raises(InputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_yaml("[" + ok + "]")


def test_yaml_numbers_as_kubectl_reads_them() -> None:
    assert parse_yaml("a: 5e14\nb: 2.5\nc: -1E-3\nd: 7\ne: '5e14'\n") == {
        "a": 5e14, "b": 2.5, "c": -1e-3, "d": 7, "e": "5e14",
    }  # fmt: skip


def test_yaml_all_drops_empty_documents_and_reports_where() -> None:
    assert parse_yaml_all("a: 1\n---\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]
    with pytest.raises(InputError, match=r"p: not valid YAML: .* at line 1"):
        parse_yaml_all("a: [", "p")


def test_json_is_strict() -> None:
    assert parse_json('{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for bad, says in [('{"a": NaN}', "NaN"), ('{"a": Infinity}', "Infinity"), ('{"a": 1e999}', "infinity"),
                      ('{"a": 1, "a": 2}', "duplicate key 'a'"), ('{"a": ', "not valid JSON"),
                      ("[" * 100 + "]" * 100, "nested deeper")]:  # fmt: skip
        with pytest.raises(InputError, match=says):
            parse_json(bad, "line")


def test_to_json_never_writes_nan() -> None:
    text = to_json({"a": math.nan, "b": [math.inf, 1.5], "c": (-math.inf,)})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": [None]}


def test_shown_truncates() -> None:
    assert shown("abc") == "'abc'"
    long = shown("x" * 10_000)
    assert len(long) < 120 and long.endswith("(10,002 characters)")


def test_strict_models_take_types_as_written() -> None:
    base = {"workload": {"model": "resnet50"}, "training": {"epochs": 1}}
    assert TrainingJobSpec.model_validate({**base, "globalBatch": 8}).global_batch == 8
    for bad, says in [(True, "got a boolean"), ("8", "got a string '8'; remove the quotes")]:
        with pytest.raises(ValidationError, match=says):
            TrainingJobSpec.model_validate({**base, "globalBatch": bad})
    with pytest.raises(ValidationError, match="expected true or false"):
        TrainingJobSpec.model_validate({**base, "globalBatch": 8, "suspend": 1})
    with pytest.raises(ValidationError, match="finite number"):
        TrainingJobSpec.model_validate({**base, "globalBatch": 8, "budgetUsd": math.inf})
    with pytest.raises(ValidationError, match="expected a number, got a boolean"):
        Policy.model_validate({"maxGpusPerJob": True})


def test_format_validation_truncates_values_and_lines() -> None:
    with pytest.raises(ValidationError) as info:
        Policy.model_validate({"maxGpusPerJob": ["x" * 5000], **{f"bogus{i}": i for i in range(30)}})
    text = format_validation(info.value, "policy p")
    assert len(text) < 4000 and "... and " in text and "characters)" in text


def test_argument_types(tmp_path: Path) -> None:
    assert positive_int("3") == 3 and positive_float("0.5") == 0.5 and non_negative_float("0") == 0
    for fn, bad, says in [(positive_int, "0", "at least 1"), (positive_int, "1.5", "not an integer"),
                          (positive_float, "0", "greater than 0"), (positive_float, "nan", "not a finite"),
                          (non_negative_float, "-0.1", "at least 0"), (non_negative_float, "inf", "not a finite")]:  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            fn(bad)
    assert output_file(str(tmp_path / "x.png")) == str(tmp_path / "x.png")
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        output_file(str(tmp_path / "no" / "x.png"))
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        output_file(str(tmp_path))
