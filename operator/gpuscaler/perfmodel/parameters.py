"""The performance model's numbers: fixed constants (``data/constants.yaml``) and fitted values.

The fitted values (``data/fitted.json``) are written by ``scripts/calibrate.py`` from
``published_throughput.jsonl`` (NVIDIA DeepLearningExamples tables); nothing else writes them.
Loaded once per process; the planner, CLI and operator all read the same values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True)
class FamilyParams:
    """Fitted efficiency of one workload family (cnn, transformer, ...)."""

    tensor_efficiency: float
    """Fraction of the tensor-core peak (TF32/FP16/BF16) that the family's compute reaches."""
    simt_efficiency: float
    """Fraction of the non-tensor FP32 peak reached (FP32 on pre-Ampere GPUs)."""
    memory_traffic: float
    """DRAM bytes moved per byte of stored activation (elementwise, normalisation, pooling layers)."""
    launch_s_per_kernel: float
    """Fixed time per kernel a micro-batch launches: launch, dispatch, Python (does not scale with the GPU)."""
    update_overhead_s: float = 0.0
    """Fixed time per optimizer step, independent of accumulation (gradient norms, optimizer kernels)."""
    fp32_memory_fraction: float = 1.0
    """Share of the memory-bound traffic that autocast keeps in fp32 (softmax, norms, losses)."""
    host_s_per_item: float = 0.0
    """Host time per batch item that does not scale with the GPU (collation, copies, Python)."""
    simt_fraction: float = 0.0
    """Share of the FLOPs that never run on tensor cores (non-tensor FP32 at any precision)."""
    straggler_cv: float = 0.0
    """Coefficient of variation of one GPU's micro-batch time for workloads with variable inputs
    (``Workload.variable_inputs``); a synchronous step waits for the slowest of the GPUs."""


@dataclass(frozen=True)
class FittedParams:
    """Everything ``scripts/calibrate.py`` fits."""

    families: dict[str, FamilyParams]
    workload_scale: dict[str, float]
    """Per named workload throughput correction (regularised towards 1); custom workloads use 1."""
    framework_scale: dict[str, float]
    """Per framework throughput factor relative to PyTorch (predictions are for PyTorch)."""
    workload_launch_scale: dict[str, float]
    """Per named workload factor on its fixed time per micro-batch (regularised towards 1): what its
    counted kernels (``Workload.kernels_per_step``, PyTorch eager) do not say, such as fusion or
    host synchronisation in the framework it was measured in; custom workloads use 1."""
    overlap: float
    """Fraction of the last micro-batch's backward pass that hides gradient communication."""
    sync_overhead_s: float
    """Per-step straggler/synchronisation cost per doubling of the GPU count."""
    depthwise_efficiency: float = 1.0
    """Fraction of the CUDA-core FP32 peak that depthwise convolutions reach, at any precision (they
    do not run on tensor cores)."""
    nchw_traffic: float = 0.0
    """DRAM bytes per stored activation byte (at 16 bits) of the layout transposes cuDNN puts around tensor-core
    convolutions of NCHW tensors, x2 at TF32."""
    framework_launch_scale: dict[str, float] = field(default_factory=dict)
    """Per framework factor on the time per kernel relative to PyTorch's eager dispatch (regularised
    towards 1): a graph executor's cost per op differs from PyTorch's; predictions are for PyTorch."""
    meta: dict[str, Any] = field(default_factory=dict)
    """How the fit was made: data file hash, rows used, date, residual summary."""

    def family(self, name: str) -> FamilyParams:
        if name in self.families:
            return self.families[name]
        return self.families["default"]


def _read(name: str) -> str:
    return (resources.files("gpuscaler.perfmodel") / "data" / name).read_text(encoding="utf-8")


@cache
def constants() -> dict[str, Any]:
    """The fixed constants (facts and stated assumptions) from constants.yaml."""
    data: dict[str, Any] = yaml.safe_load(_read("constants.yaml"))
    return data


def fitted_from_dict(raw: dict[str, Any]) -> FittedParams:
    """The parameters from their JSON form (``fitted.json``)."""
    families = {name: FamilyParams(**vals) for name, vals in raw["families"].items()}
    return FittedParams(
        families=families,
        workload_scale=dict(raw.get("workload_scale", {})),
        framework_scale=dict(raw.get("framework_scale", {})),
        workload_launch_scale=dict(raw.get("workload_launch_scale", {})),
        overlap=float(raw["overlap"]),
        sync_overhead_s=float(raw["sync_overhead_s"]),
        depthwise_efficiency=float(raw.get("depthwise_efficiency", 1.0)),
        nchw_traffic=float(raw.get("nchw_traffic", 0.0)),
        framework_launch_scale=dict(raw.get("framework_launch_scale", {})),
        meta=dict(raw.get("meta", {})),
    )


def fitted_to_dict(p: FittedParams) -> dict[str, Any]:
    """The JSON form of the parameters, keys sorted (what ``scripts/calibrate.py`` writes)."""
    return {
        "families": {
            name: {
                "tensor_efficiency": f.tensor_efficiency,
                "simt_efficiency": f.simt_efficiency,
                "memory_traffic": f.memory_traffic,
                "launch_s_per_kernel": f.launch_s_per_kernel,
                "update_overhead_s": f.update_overhead_s,
                "fp32_memory_fraction": f.fp32_memory_fraction,
                "host_s_per_item": f.host_s_per_item,
                "simt_fraction": f.simt_fraction,
                "straggler_cv": f.straggler_cv,
            }
            for name, f in sorted(p.families.items())
        },
        "workload_scale": dict(sorted(p.workload_scale.items())),
        "framework_scale": dict(sorted(p.framework_scale.items())),
        "workload_launch_scale": dict(sorted(p.workload_launch_scale.items())),
        "framework_launch_scale": dict(sorted(p.framework_launch_scale.items())),
        "overlap": p.overlap,
        "sync_overhead_s": p.sync_overhead_s,
        "depthwise_efficiency": p.depthwise_efficiency,
        "nchw_traffic": p.nchw_traffic,
        "meta": p.meta,
    }


@cache
def fitted() -> FittedParams:
    """The committed fitted parameters."""
    return fitted_from_dict(json.loads(_read("fitted.json")))
