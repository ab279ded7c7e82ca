"""The operator and bad input: a spec the models refuse, a bad policy file or GPUScalingPolicy object."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpuscaler.api import TrainingJobSpec
from gpuscaler.api.status import Phase, TrainingJobStatus
from gpuscaler.controller.outcomes import invalid_spec, policy_invalid, policy_unavailable
from gpuscaler.controller.policy import PolicySource, PolicyUnavailableError
from gpuscaler.controller.reconcile import Outcome
from gpuscaler.names import ConditionType


def rewrite(path: Path, text: str) -> None:
    """Write ``text`` and move the modification time on (the source re-reads on a changed mtime)."""
    path.write_text(text)
    later = time.time() + 5 + os.stat(path).st_mtime % 1
    os.utime(path, (later, later))


def test_bad_policy_file_keeps_the_last_good_one(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("name: one\nmaxGpusPerJob: 8\n")
    src = PolicySource(str(f))
    assert src.for_namespace("team").max_gpus_per_job == 8 and not src.errors
    rewrite(f, "name: two\nmaxGpusPerJob: 8\nmaxGpusPerJob: 16\n")
    assert src.for_namespace("team").max_gpus_per_job == 8  # the last good one
    (message,) = src.errors.values()
    assert "duplicate key 'maxGpusPerJob'" in message and "the last good version stays in force" in message
    rewrite(f, "name: three\nmaxGpusPerJob: true\n")
    assert src.for_namespace("team").max_gpus_per_job == 8
    assert "maxGpusPerJob: expected a number, got a boolean" in next(iter(src.errors.values()))
    rewrite(f, "name: four\nmaxGpusPerJob: 4\n")
    assert src.for_namespace("team").max_gpus_per_job == 4 and not src.errors


def test_bad_policy_file_with_no_good_version_fails_closed(tmp_path: Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("")
    src = PolicySource(str(f))
    with pytest.raises(PolicyUnavailableError, match="holds no policy"):
        src.for_namespace("team")
    with pytest.raises(PolicyUnavailableError, match="no good version to use"):
        src.file_policies()  # not re-read (same mtime), still refused
    missing = PolicySource(str(tmp_path / "gone.yaml"))
    with pytest.raises(PolicyUnavailableError, match="cannot be read"):
        missing.file_policies()


def obj(name: str, spec: Any) -> dict[str, Any]:
    return {"kind": "GPUScalingPolicy", "metadata": {"name": name}, "spec": spec}


def test_bad_policy_object_keeps_its_last_good_version() -> None:
    src = PolicySource(None)
    good = obj("vision", {"namespaces": ["team-vision"], "maxGpusPerJob": 4})
    assert src.for_namespace("team-vision", [good]).max_gpus_per_job == 4
    bad = obj("vision", {"namespaces": ["team-vision"], "maxGpusPerJob": -4})
    assert src.for_namespace("team-vision", [bad]).max_gpus_per_job == 4
    assert "GPUScalingPolicy vision is invalid" in src.errors["GPUScalingPolicy vision"]
    assert src.for_namespace("team-vision", []).max_gpus_per_job is None  # deleted: forgotten
    assert not src.errors
    with pytest.raises(PolicyUnavailableError, match="spec must be a mapping"):
        src.for_namespace("team-vision", [obj("new", ["not", "a", "mapping"])])


def refused(spec: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        TrainingJobSpec.model_validate(spec)
    return info.value


def test_invalid_spec_is_failed_naming_the_field_once() -> None:
    err = refused({"workload": {"transformer": {"layers": 2, "hidden": 1000, "heads": 7, "seqLen": 8, "vocab": 10}},
                   "globalBatch": 8, "training": {"steps": 1}, "priority": "high"})  # fmt: skip
    out = invalid_spec(TrainingJobStatus(), err, generation=3)
    st = out.status
    assert st.phase is Phase.FAILED and st.observed_generation == 3
    assert "workload.transformer" in st.message and "priority" in st.message
    failed = next(c for c in st.conditions if c.type == "Failed")
    assert failed.status == "True" and failed.reason == "InvalidSpec"
    assert "hidden 1000 is not divisible by heads 7" in failed.message
    assert [e.reason for e in out.events] == ["InvalidSpec"]
    again = invalid_spec(st, err, generation=3)
    assert again.events == [] and again.status.phase is Phase.FAILED


def test_policy_invalid_condition_and_event() -> None:
    st = TrainingJobStatus()
    out = Outcome(st)
    policy_invalid(st, {"policy file p": "policy file p: not valid YAML"}, out, 1)
    c = next(c for c in st.conditions if c.type == ConditionType.POLICY_INVALID)
    assert c.status == "True" and "not valid YAML" in c.message and [e.reason for e in out.events] == ["InvalidPolicy"]
    policy_invalid(st, {"policy file p": "policy file p: not valid YAML"}, out, 1)
    assert len(out.events) == 1
    policy_invalid(st, {}, out, 1)
    assert next(c for c in st.conditions if c.type == ConditionType.POLICY_INVALID).status == "False"


def test_no_policy_in_force_keeps_the_job_pending() -> None:
    out = policy_unavailable(TrainingJobStatus(), PolicyUnavailableError("policy file p: holds no policy"), 2)
    assert out.status.phase is Phase.PENDING and "no valid policy in force" in (out.status.message or "")
