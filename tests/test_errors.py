"""The error taxonomy: every error class of the package has a kind, and each caller maps kinds in one place.

The CLI (``cli.describe_error``: exit codes and the ``--json`` error object), the kopf handlers
(``handlers.errors``: retry or stop), the simulator's command line and the planner (a configuration
the model refuses becomes a rejection) are checked with the package's real error classes.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import kopf
import pytest
from pydantic import ValidationError

import gpuscaler
from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CatalogError, UnknownIdError, load_catalog
from gpuscaler.cli import EXIT_INFEASIBLE, EXIT_INTERNAL, EXIT_USAGE, describe_error, main
from gpuscaler.cloud import InsufficientCapacityError, ProviderError, UnknownProviderError
from gpuscaler.errors import (
    DEFAULT_RETRY_DELAY_S,
    ErrorKind,
    GpuscalerError,
    InfeasibleError,
    InvalidInputError,
    TemporaryError,
    kind_of,
)
from gpuscaler.handlers.errors import kopf_errors, to_kopf
from gpuscaler.inputs import InputError
from gpuscaler.kube.client import KubeError
from gpuscaler.observe.prometheus import PrometheusError
from gpuscaler.perfmodel import PrecisionUnsupportedError
from gpuscaler.perfmodel.uncertainty import CrossValidationError
from gpuscaler.planner import JobError, plan
from gpuscaler.policy import PolicyConflictError
from gpuscaler.runtime.checkpoint import CheckpointError, CorruptCheckpointError

ROOT = Path(__file__).resolve().parents[1]
NOT_YET: set[str] = set()
"""Modules left outside the taxonomy (none today)."""


def package_errors() -> list[type[BaseException]]:
    """Every exception class defined in the package (modules whose optional imports are missing skipped)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(gpuscaler.__path__, "gpuscaler."):
        if info.name in NOT_YET or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (torch, boto3) that is not installed
            continue
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = obj
    return list(found.values())


def test_every_error_class_of_the_package_is_a_gpuscaler_error_of_a_kind() -> None:
    classes = package_errors()
    assert len(classes) >= 20  # the walk found the package's errors (22 when this was written)
    outside = [c.__qualname__ for c in classes if not issubclass(c, GpuscalerError)]
    assert outside == []
    for cls in classes:
        assert isinstance(cls.kind, ErrorKind), cls


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (JobError("globalBatch 0"), ErrorKind.INVALID_INPUT),
        (UnknownIdError("gpu", "a1000", ["a100"]), ErrorKind.INVALID_INPUT),
        (PolicyConflictError("nothing in common"), ErrorKind.INVALID_INPUT),
        (PrecisionUnsupportedError("V100 has no bf16"), ErrorKind.INVALID_INPUT),
        (ProviderError("throttled"), ErrorKind.TEMPORARY),
        (InsufficientCapacityError("no p4d"), ErrorKind.TEMPORARY),
        (UnknownProviderError("no provider 'foo'"), ErrorKind.INVALID_INPUT),
        (KubeError("create pod: 503", 503), ErrorKind.TEMPORARY),
        (KubeError("no answer", 0), ErrorKind.TEMPORARY),
        (KubeError("create pod: 429", 429), ErrorKind.TEMPORARY),
        (KubeError("create pod: 403 forbidden", 403), ErrorKind.INVALID_INPUT),
        (PrometheusError("unreachable"), ErrorKind.TEMPORARY),
        (CheckpointError("disk full"), ErrorKind.TEMPORARY),
        (CorruptCheckpointError("manifest missing"), ErrorKind.INVALID_INPUT),
        (CrossValidationError("missing sigma"), ErrorKind.INTERNAL),
        (CatalogError("schema 2"), ErrorKind.INTERNAL),
        (ValueError("not ours"), ErrorKind.INTERNAL),
    ],
)
def test_kinds(err: BaseException, kind: ErrorKind) -> None:
    assert kind_of(err) is kind


def test_errors_keep_their_builtin_bases_so_existing_handlers_still_catch_them() -> None:
    assert issubclass(InputError, ValueError) and issubclass(UnknownIdError, KeyError)
    assert issubclass(ProviderError, RuntimeError) and issubclass(KubeError, RuntimeError)
    assert str(UnknownIdError("gpu", "a1000", ["a100"])).startswith("unknown gpu 'a1000'; did you mean a100?")


# ----------------------------------------------------------------------------- CLI


@pytest.mark.parametrize(
    ("err", "code", "kind"),
    [
        (InvalidInputError("bad"), EXIT_USAGE, "invalid-input"),
        (InputError("spec.globalBatch: 0", field="spec.globalBatch", value="0"), EXIT_USAGE, "invalid-input"),
        (PrecisionUnsupportedError("V100-16GB has no bf16"), EXIT_USAGE, "invalid-input"),
        (UnknownIdError("workload", "resnet5", ["resnet50"]), EXIT_USAGE, "unknown-name"),
        (InfeasibleError("no plan"), EXIT_INFEASIBLE, "infeasible"),
        (TemporaryError("Prometheus timed out"), EXIT_USAGE, "unavailable"),
        (KubeError("list nodes: connection refused"), EXIT_USAGE, "unavailable"),
        (KubeError("get trainingjob: 404 not found", 404), EXIT_USAGE, "invalid-input"),
        (CrossValidationError("no sigma"), EXIT_INTERNAL, "broken-install"),
        (CatalogError("instances.csv: schema 9"), EXIT_INTERNAL, "broken-install"),
        (GpuscalerError("an unexpected state"), EXIT_INTERNAL, "internal-error"),
        (ZeroDivisionError("division by zero"), EXIT_INTERNAL, "internal-error"),
    ],
)
def test_cli_maps_each_kind_onto_its_exit_code(err: BaseException, code: int, kind: str) -> None:
    failure = describe_error(err)
    assert (failure.code, failure.kind) == (code, kind)
    assert str(err).split(":")[0] in failure.message


def test_cli_keeps_field_value_and_close_matches() -> None:
    body = describe_error(InputError("spec.globalBatch: 0", field="spec.globalBatch", value="0")).to_dict()["error"]
    assert (body["field"], body["value"]) == ("spec.globalBatch", "0")
    body = describe_error(UnknownIdError("workload", "resnet5", ["resnet50"])).to_dict()["error"]
    assert (body["field"], body["value"], body["closeMatches"]) == ("workload", "'resnet5'", ["resnet50"])
    assert "try again" in describe_error(PrometheusError("timed out")).message


def test_cli_precision_a_gpu_lacks_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--workload", "resnet50", "--gpu", "v100", "--gpus", "1", "--precision", "bf16", "--json"])
    out, err = capsys.readouterr()
    assert code == EXIT_USAGE and "Traceback" not in err
    body = json.loads(out)["error"]
    assert body["kind"] == "invalid-input" and "bf16" in body["message"]


# ----------------------------------------------------------------------------- kopf handlers


def test_handlers_retry_temporary_errors_after_their_own_delay() -> None:
    retry = to_kopf(ProviderError("throttled"))
    assert isinstance(retry, kopf.TemporaryError) and retry.delay == DEFAULT_RETRY_DELAY_S
    capacity = to_kopf(InsufficientCapacityError("no p4d.24xlarge in us-east-1a"))
    assert isinstance(capacity, kopf.TemporaryError) and capacity.delay == InsufficientCapacityError.retry_delay_s
    assert capacity.delay > retry.delay  # capacity comes back in minutes
    assert isinstance(to_kopf(KubeError("patch: 500", 500)), kopf.TemporaryError)


def test_handlers_stop_on_invalid_input_and_infeasible() -> None:
    for err in (
        JobError("globalBatch 7 not divisible"),
        UnknownIdError("gpu", "a1000", ["a100"]),
        UnknownProviderError("no provider 'foo'"),
        KubeError("create: 422 invalid", 422),
        InfeasibleError("no plan meets the deadline"),
    ):
        mapped = to_kopf(err)
        assert isinstance(mapped, kopf.PermanentError) and str(mapped) == str(err), err
    with pytest.raises(ValidationError) as caught:
        TrainingJobSpec.model_validate({"globalBatch": 0})
    assert isinstance(to_kopf(caught.value), kopf.PermanentError)


def test_handlers_leave_internal_errors_to_kopf_with_the_original_exception() -> None:
    for err in (CrossValidationError("broken"), GpuscalerError("bug"), ZeroDivisionError()):
        assert to_kopf(err) is None
        with pytest.raises(type(err)), kopf_errors():
            raise err


def test_kopf_errors_keeps_the_cause() -> None:
    with pytest.raises(kopf.TemporaryError) as caught, kopf_errors():
        raise InsufficientCapacityError("no capacity")
    assert isinstance(caught.value.__cause__, InsufficientCapacityError)


# ----------------------------------------------------------------------------- simulator CLI


def test_simulator_names_the_option_and_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = ROOT / "examples" / "traces" / "research-week.yaml"
    code = main(["simulate", str(trace), "--strategies", "gpuscaler,nope", "--json"])
    out, _ = capsys.readouterr()
    body = json.loads(out)["error"]
    assert code == EXIT_USAGE and body["field"] == "--strategies"
    assert body["message"].startswith("simulate: --strategies: unknown nope")
    bad_cloud = tmp_path / "t.yaml"
    bad_cloud.write_text(trace.read_text() + "\ncloud: {stormShare: 2}\n")
    code = main(["simulate", str(bad_cloud), "--json"])
    body = json.loads(capsys.readouterr()[0])["error"]
    assert code == EXIT_USAGE and body["field"] == "cloud" and "cloud.stormShare" in body["message"]


# ----------------------------------------------------------------------------- planner


def test_planner_turns_a_refused_precision_into_a_rejection_not_a_failed_plan() -> None:
    spec = TrainingJobSpec.model_validate(
        {
            "workload": {"model": "resnet50"},
            "globalBatch": 1536,  # divisible by every GPU count planned, so only the precision is wrong
            "training": {"epochs": 1},
            "constraints": {"precisions": ["bf16"], "gpuTypes": ["V100-16GB", "A100-80GB"], "maxGpus": 16},
        }
    )
    result = plan(spec, load_catalog())
    assert result.ok and result.chosen is not None and result.chosen.instance.gpu_id == "A100-80GB"
    v100 = [r for r in result.rejected if r.instance.startswith("p3.")]
    assert v100 and {r.category for r in v100} == {"precision"}
