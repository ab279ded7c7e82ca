"""A custom workload declares what the catalog says of a named one: depthwise convolutions and
inputs that vary in size (``workload.depthwiseFlopShare``, ``workload.variableInputs``), and the
model uses them; a named workload refuses them, in pydantic and in the CRD's CEL rules alike."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpuscaler.api.crd import CEL_RULES
from gpuscaler.api.trainingjob import WorkloadSpec
from gpuscaler.catalog import load_catalog
from gpuscaler.perfmodel import ParallelConfig, estimate
from gpuscaler.planner.job import resolve_workload

CAT = load_catalog()
CNN: dict[str, Any] = {"params": 5.3e6, "flopsPerSample": 1.2e9, "family": "cnn-light", "unit": "images"}


def _workload(**extra: Any) -> Any:
    return resolve_workload(WorkloadSpec.model_validate({**CNN, **extra}), CAT)


def test_a_custom_workload_carries_its_traits_to_the_model() -> None:
    plain, depthwise = _workload(), _workload(depthwiseFlopShare=0.09)
    assert (plain.depthwise_flop_share, plain.variable_inputs) == (0.0, False)
    assert depthwise.depthwise_flop_share == 0.09
    a100, v100 = CAT.gpu("A100-80GB"), CAT.gpu("V100-16GB")
    one = ParallelConfig(micro_batch=64)
    # A micro-batch where the GPU's work sets the step, not the fixed time per kernel (which is the
    # same on both GPUs and would pull the ratio below the CUDA-core ratio at a small batch).
    big = ParallelConfig(micro_batch=1024)

    def ratio(w: Any) -> float:
        return estimate(w, a100, big).throughput / estimate(w, v100, big).throughput

    # depthwise FLOPs run on CUDA cores: the tensor-core GPU's lead shrinks
    assert ratio(depthwise) < ratio(plain)
    varying = _workload(variableInputs=True)
    assert varying.variable_inputs
    eight = ParallelConfig(micro_batch=64, gpus_per_node=8)
    assert estimate(varying, a100, eight).scaling_efficiency < estimate(plain, a100, eight).scaling_efficiency
    assert estimate(varying, a100, one) == estimate(plain, a100, one), "one GPU waits for nobody"
    shape = {"layers": 12, "hidden": 768, "heads": 12, "seqLen": 512, "vocab": 30522}
    assert resolve_workload(WorkloadSpec.model_validate({"transformer": shape, "variableInputs": True}), CAT).variable_inputs


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": "resnet50", "variableInputs": True}, "a named workload has its own"),
        ({"model": "resnet50", "depthwiseFlopShare": 0.1}, "a named workload has its own"),
        (
            {"transformer": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 8, "vocab": 100}, "depthwiseFlopShare": 0.1},
            "a transformer has no convolutions",
        ),
        ({**CNN, "depthwiseFlopShare": 1.0}, "less than 1"),
        ({**CNN, "depthwiseFlopShare": -0.1}, "greater than or equal to 0"),
    ],
)
def test_traits_where_they_do_not_belong_are_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkloadSpec.model_validate(spec)


def test_the_crd_refuses_them_with_the_same_messages() -> None:
    messages = {r["message"] for r in CEL_RULES["WorkloadSpec"]}
    for spec in ({"model": "resnet50", "variableInputs": True}, {"transformer": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 8, "vocab": 100}, "depthwiseFlopShare": 0.1}):
        with pytest.raises(ValidationError) as err:
            WorkloadSpec.model_validate(spec)
        [error] = err.value.errors()
        assert str(error["msg"]).removeprefix("Value error, ") in messages
