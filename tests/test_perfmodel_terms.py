"""The performance model's terms one by one: each moves the way its physics says.

Bandwidth, peak and batch make training faster; mixed precision gains at most the tensor peak ratio,
at least nothing on tensor-core GPUs, and less on faster GPUs (host time does not scale); gradients
all-reduce in fp32 also under AMP; NVLink nodes scale better than PCIe ones; memory format, input
pipeline, power limit, wave quantization, depthwise convolutions, stragglers and a workload's own
fixed time act where they should and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.catalog import Precision, load_catalog
from gpuscaler.catalog.loader import CatalogError, parse_workloads, read_rows
from gpuscaler.catalog.models import GPU, Workload
from gpuscaler.perfmodel import ParallelConfig, allreduce_seconds, constants, estimate, fitted
from gpuscaler.perfmodel.calibration import load_rows, predict
from gpuscaler.perfmodel.model import (
    clock_derate,
    expected_max_normal,
    intra_node_busbw,
    kernels_of,
    wave_efficiency,
)

CAT = load_catalog()
WORKLOADS = [w.id for w in CAT.workloads]
GPUS = [g.id for g in CAT.gpus]
WORKLOAD_HEADER = (
    "id,aliases,family,unit,batch_unit,params,flops_per_sample,activation_bytes_per_sample,seq_len,layers,hidden,"
    "heads,vocab,ffn,gated,head,flash,optimizer,default_global_batch,samples_per_epoch,depthwise_flop_share,"
    "variable_inputs,kernels_per_step,kernels_per_item,source"
)
TENSOR_GPUS = [g.id for g in CAT.gpus if g.tf32_tflops is not None]
"""GPUs whose framework-default fp32 runs on TF32 tensor cores (Ampere and newer)."""
CASES = (st.sampled_from(WORKLOADS), st.sampled_from(GPUS), st.sampled_from([Precision.FP32, Precision.AMP]))
"""The property tests' first three arguments: a workload id, a GPU id, a precision."""
PROPERTY = settings(max_examples=120, deadline=None)


def _tput(wid: str, gpu: GPU, **cfg: object) -> float:
    return estimate(CAT.workload(wid), gpu, ParallelConfig(**cfg)).throughput  # type: ignore[arg-type]


def _scaled(gpu: GPU, factor: float) -> GPU:
    """The same GPU with every rate (peaks and memory bandwidth) multiplied by ``factor``."""
    return replace(
        gpu,
        mem_bw_gbs=gpu.mem_bw_gbs * factor,
        fp32_tflops=gpu.fp32_tflops * factor,
        tf32_tflops=gpu.tf32_tflops * factor if gpu.tf32_tflops else None,
        fp16_tflops=gpu.fp16_tflops * factor,
        tdp_w=gpu.tdp_w * factor if gpu.tdp_w else None,
    )


@PROPERTY
@given(*CASES, st.floats(1.05, 4.0), st.integers(1, 64))
def test_throughput_grows_with_bandwidth_and_peak(
    wid: str, gid: str, prec: Precision, factor: float, batch: int
) -> None:
    g = CAT.gpu(gid)
    base = _tput(wid, g, micro_batch=batch, precision=prec)
    more_bw = _tput(wid, replace(g, mem_bw_gbs=g.mem_bw_gbs * factor), micro_batch=batch, precision=prec)
    more_peak = replace(
        g,
        fp16_tflops=g.fp16_tflops * factor,
        tf32_tflops=g.tf32_tflops * factor if g.tf32_tflops else None,
        fp32_tflops=g.fp32_tflops * factor,
    )
    assert more_bw > base
    assert _tput(wid, more_peak, micro_batch=batch, precision=prec) > base


@PROPERTY
@given(*CASES, st.integers(1, 256), st.integers(1, 256))
def test_throughput_grows_with_micro_batch(wid: str, gid: str, prec: Precision, b1: int, b2: int) -> None:
    lo, hi = sorted((b1, b2))
    g = CAT.gpu(gid)
    assert _tput(wid, g, micro_batch=hi, precision=prec) >= _tput(wid, g, micro_batch=lo, precision=prec)


@pytest.mark.parametrize("gid", TENSOR_GPUS)
@pytest.mark.parametrize("wid", WORKLOADS)
def test_amp_speedup_between_one_and_the_peak_ratio(wid: str, gid: str) -> None:
    g = CAT.gpu(gid)
    for channels_last in (False, True):
        fp32 = _tput(wid, g, micro_batch=32, precision=Precision.FP32, channels_last=channels_last)
        amp = _tput(wid, g, micro_batch=32, precision=Precision.AMP, channels_last=channels_last)
        assert g.tf32_tflops is not None
        assert 1.0 <= amp / fp32 <= g.fp16_tflops / g.tf32_tflops + 1e-9


@pytest.mark.parametrize("wid", ["resnet50", "bert-large-seq128", "transformerxl-base", "gnmt"])
def test_faster_gpus_gain_less_from_amp(wid: str) -> None:
    """Host time does not scale with the GPU, so its share, and AMP's shortfall, grow on faster GPUs."""
    a100 = CAT.gpu("A100-80GB")

    def speedup(g: GPU) -> float:
        fp32 = _tput(wid, g, micro_batch=32, precision=Precision.FP32)
        return _tput(wid, g, micro_batch=32, precision=Precision.AMP) / fp32

    assert speedup(_scaled(a100, 4.0)) < speedup(_scaled(a100, 2.0)) < speedup(a100)


def test_host_time_is_the_same_on_every_gpu() -> None:
    w = CAT.workload("bert-large-squad")
    cfg = ParallelConfig(micro_batch=16, precision=Precision.AMP)
    hosts = {estimate(w, CAT.gpu(g), cfg).host_s for g in ("T4", "A100-80GB", "H100", "B200")}
    assert len(hosts) == 1 and hosts.pop() > 0


def test_gradients_all_reduce_in_fp32_under_amp() -> None:
    w, g = CAT.workload("bert-large-seq128"), CAT.gpu("A100-80GB")
    fp32 = allreduce_seconds(w, g, ParallelConfig(micro_batch=8, precision=Precision.FP32, gpus_per_node=8))
    amp = allreduce_seconds(w, g, ParallelConfig(micro_batch=8, precision=Precision.AMP, gpus_per_node=8))
    assert amp == fp32
    # 4 bytes per parameter at the measured bus bandwidth, plus 2 (g-1) ring hops of latency.
    ring = 2 * 7 / 8 * w.params * 4 / ((g.nccl_busbw_gbs or 0) * 1e9)
    ring += 2 * 7 * constants()["communication"]["hop_latency_s"]["intra"]
    assert amp == pytest.approx(ring, rel=1e-9)


def test_measured_bus_bandwidth_is_used_where_published() -> None:
    a100 = CAT.gpu("A100-80GB")
    assert intra_node_busbw(a100, ParallelConfig(micro_batch=1, gpus_per_node=8)) == pytest.approx(234.89e9)
    # A PCIe-only node of 8 GPUs is host-limited below its links' spec.
    l4 = CAT.gpu("L4")
    cap = constants()["communication"]["pcie_host_busbw_gbs"][8] * 1e9
    assert intra_node_busbw(l4, ParallelConfig(micro_batch=1, gpus_per_node=8)) <= cap


@pytest.mark.parametrize("wid", ["bert-large-seq128", "gnmt", "resnet50", "transformerxl-large"])
def test_nvlink_scales_better_than_pcie(wid: str) -> None:
    w = CAT.workload(wid)
    sxm = CAT.gpu("A100-80GB")
    pcie = replace(sxm, intra_link="pcie4", intra_link_gbs=31.5, nccl_busbw_gbs=None)
    cfg = ParallelConfig(micro_batch=16, precision=Precision.AMP, gpus_per_node=8)
    assert estimate(w, sxm, cfg).scaling_efficiency > estimate(w, pcie, cfg).scaling_efficiency
    assert estimate(w, CAT.gpu("A100-80GB-PCIe"), cfg).comm_s > estimate(w, sxm, cfg).comm_s


def test_accumulation_divides_the_allreduce_share() -> None:
    w, g = CAT.workload("bert-large-seq512"), CAT.gpu("A100-80GB-PCIe")
    one = estimate(w, g, ParallelConfig(micro_batch=4, gpus_per_node=8, accumulation=1))
    eight = estimate(w, g, ParallelConfig(micro_batch=4, gpus_per_node=8, accumulation=8))
    assert one.comm_s == eight.comm_s  # once per optimizer step ...
    assert eight.scaling_efficiency > one.scaling_efficiency  # ... over K micro-batches


def test_nchw_transposes_cost_tensor_core_convolutions_only() -> None:
    g = CAT.gpu("A100-80GB")
    cnn = CAT.workload("resnet50")
    extra = {}
    for prec in (Precision.AMP, Precision.FP32):  # 16-bit and TF32 tensor cores
        nchw = estimate(cnn, g, ParallelConfig(micro_batch=128, precision=prec))
        nhwc = estimate(cnn, g, ParallelConfig(micro_batch=128, precision=prec, channels_last=True))
        assert nhwc.throughput > nchw.throughput
        assert nchw.compute_s == nhwc.compute_s  # the transposes are DRAM traffic, not tensor-core time
        extra[prec] = nchw.memory_bound_s - nhwc.memory_bound_s
    # Their bytes follow the element size: 4-byte TF32 tensors move twice the bytes of 16-bit ones.
    assert extra[Precision.FP32] == pytest.approx(2 * extra[Precision.AMP], rel=1e-9)
    # CUDA-core FP32 convolutions (a V100 has no TF32) run NCHW natively; transformers have no convolutions.
    for wid, gpu, prec in (("resnet50", "V100-16GB", Precision.FP32), ("bert-large-squad", "A100-80GB", Precision.AMP)):
        a = _tput(wid, CAT.gpu(gpu), micro_batch=32, precision=prec)
        assert _tput(wid, CAT.gpu(gpu), micro_batch=32, precision=prec, channels_last=True) == a


def test_the_nchw_penalty_is_larger_where_bandwidth_is_short() -> None:
    # The same transposes cost a larger share of the step on a GPU with less bandwidth per tensor FLOP.
    def penalty(gpu: str) -> float:
        g = CAT.gpu(gpu)
        return _tput("resnet50", g, micro_batch=64, precision=Precision.AMP, channels_last=True) / _tput(
            "resnet50", g, micro_batch=64, precision=Precision.AMP
        )

    assert penalty("L4") > penalty("A100-80GB") > 1.0  # 121 TFLOPS on 300 GB/s against 312 on 2,039


def test_dali_lifts_the_cpu_input_bound() -> None:
    g = CAT.gpu("A100-80GB")
    cfg = {"micro_batch": 256, "precision": Precision.AMP, "gpus_per_node": 8, "vcpus_per_node": 16}
    native = estimate(CAT.workload("resnet50"), g, ParallelConfig(**cfg))  # type: ignore[arg-type]
    dali = estimate(CAT.workload("resnet50"), g, ParallelConfig(**cfg, data_loader="dali"))  # type: ignore[arg-type]
    assert native.input_bound and native.bottleneck == "input-pipeline"
    assert dali.throughput > native.throughput
    with pytest.raises(ValueError, match="data_loader"):
        estimate(CAT.workload("resnet50"), g, ParallelConfig(micro_batch=8, data_loader="tfdata"))


def test_power_limited_cards_are_derated() -> None:
    for gid in ("T4", "L4", "A10"):
        assert clock_derate(CAT.gpu(gid)) < 1.0
    for gid in ("V100-16GB", "A100-80GB", "H100", "L40S"):
        assert clock_derate(CAT.gpu(gid)) == 1.0
    t4 = CAT.gpu("T4")
    more_power = replace(t4, tdp_w=(t4.tdp_w or 0) * 3)
    assert _tput("resnet50", more_power, micro_batch=64) > _tput("resnet50", t4, micro_batch=64)


def test_wave_quantization_rises_with_batch_and_falls_with_sms() -> None:
    w, a100 = CAT.workload("transformerxl-base"), CAT.gpu("A100-80GB")
    effs = [wave_efficiency(w, a100, b) for b in (1, 4, 16, 64)]
    assert effs == sorted(effs) and effs[-1] < 1.0
    bigger = replace(a100, sm_count=(a100.sm_count or 0) * 2)
    assert wave_efficiency(w, bigger, 4) < wave_efficiency(w, a100, 4)
    assert wave_efficiency(CAT.workload("resnet50"), a100, 4) == 1.0  # no GEMM shape known


def test_batches_count_items_and_throughput_counts_the_unit() -> None:
    txl = CAT.workload("transformerxl-base")
    assert (txl.unit, txl.item, txl.samples_per_item) == ("tokens", "sequences", txl.seq_len)
    assert CAT.workload("gnmt").item == "sentence pairs"
    g = CAT.gpu("A100-80GB")
    e = estimate(txl, g, ParallelConfig(micro_batch=48, gpus_per_node=2, accumulation=3))
    assert e.throughput * e.step_time_s == pytest.approx(48 * 2 * 3 * (txl.seq_len or 0))
    assert e.batch_unit == "sequences" and e.unit == "tokens"
    # 48 sequences hold 48 x seq_len tokens of activations, not 48 tokens' worth.
    assert e.memory.activations == pytest.approx(48 * txl.activation_bytes_per_sample * (txl.seq_len or 0))


def test_calibration_predicts_with_the_model_itself() -> None:
    """The cached-terms path the fit uses gives exactly what ``estimate`` gives."""
    rows, _ = load_rows()
    cached = predict(rows, fitted())
    direct = [estimate(r.workload, r.gpu, r.cfg).throughput for r in rows]
    assert cached == pytest.approx(direct, rel=1e-12)


def test_calibration_rows_declare_what_dle_ran() -> None:
    rows, _ = load_rows()
    rn50 = [r for r in rows if r.workload.id == "resnet50" and r.cfg.framework == "pytorch"]
    assert {(r.precision, r.cfg.channels_last) for r in rn50} == {("AMP", True), ("TF32", False), ("FP32", False)}
    ssd = [r for r in rows if r.workload.id == "ssd300"]
    assert ssd and all(r.cfg.channels_last == (r.precision == "AMP") for r in ssd)
    assert not any(r.cfg.channels_last for r in rows if r.workload.family == "transformer")
    txl = next(r for r in rows if r.workload.id == "transformerxl-base")
    assert txl.cfg.micro_batch < 1000  # sequences, as the source table gives them


def test_flops_off_the_tensor_cores_cap_the_amp_speedup() -> None:
    """The family's non-convertible share runs at the CUDA-core rate at any precision."""
    p = fitted()
    w, g = CAT.workload("maskrcnn"), CAT.gpu("A100-80GB")

    def speedup(share: float) -> float:
        fam = replace(p.family(w.family), simt_fraction=share)
        params = replace(p, families={**p.families, w.family: fam})
        fp32 = estimate(w, g, ParallelConfig(micro_batch=4, precision=Precision.FP32), params).throughput
        return estimate(w, g, ParallelConfig(micro_batch=4, precision=Precision.AMP), params).throughput / fp32

    assert speedup(0.0) > speedup(0.05) > speedup(0.3) > 1.0


def test_expected_max_of_standard_normals() -> None:
    """Closed forms for 2 and 3 (1/sqrt(pi), 3/(2 sqrt(pi))); Harter's 1961 table for 4 and 8."""
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-8)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-8)
    assert expected_max_normal(4) == pytest.approx(1.02938, abs=1e-5)
    assert expected_max_normal(8) == pytest.approx(1.42360, abs=1e-5)
    z = [expected_max_normal(n) for n in (2, 8, 64, 512, 4096)]
    assert z == sorted(z) and z[-1] < 4.0


def test_stragglers_slow_variable_input_workloads_on_several_gpus_only() -> None:
    """A synchronous step waits for the slowest GPU where the work varies with the input; the wait
    grows with the GPU count, averages out over accumulation, and is absent on one GPU."""
    g = CAT.gpu("A100-80GB")
    mrcnn = CAT.workload("maskrcnn")
    assert mrcnn.variable_inputs and CAT.workload("gnmt").variable_inputs
    assert not CAT.workload("ssd300").variable_inputs and not CAT.workload("resnet50").variable_inputs
    fixed = replace(mrcnn, variable_inputs=False)

    def eff(w: Workload, n: int, k: int = 1) -> float:
        return estimate(w, g, ParallelConfig(micro_batch=4, gpus_per_node=n, accumulation=k)).scaling_efficiency

    assert estimate(mrcnn, g, ParallelConfig(micro_batch=4)) == estimate(fixed, g, ParallelConfig(micro_batch=4))
    effs = [eff(mrcnn, n) for n in (2, 4, 8)]
    assert effs == sorted(effs, reverse=True)
    assert all(e < eff(fixed, n) for e, n in zip(effs, (2, 4, 8), strict=True))
    assert eff(mrcnn, 8, k=4) > eff(mrcnn, 8)
    # Across nodes the slowest of all ranks counts.
    two_nodes = ParallelConfig(micro_batch=4, gpus_per_node=8, nodes=2, network_gbps=400.0)
    assert estimate(mrcnn, g, two_nodes).scaling_efficiency < effs[-1]


def test_depthwise_convolutions_run_on_cuda_cores() -> None:
    """Depthwise FLOPs gain neither from tensor cores between GPUs nor from AMP."""
    b0 = CAT.workload("efficientnet-b0")
    assert 0.05 < b0.depthwise_flop_share < 0.15
    assert CAT.workload("resnet50").depthwise_flop_share == 0.0
    none = replace(b0, depthwise_flop_share=0.0)
    a100, v100 = CAT.gpu("A100-80GB"), CAT.gpu("V100-16GB")

    def ratio(w: Workload) -> float:
        return _tput_w(w, a100, Precision.FP32) / _tput_w(w, v100, Precision.FP32)

    def amp(w: Workload) -> float:
        return _tput_w(w, a100, Precision.AMP) / _tput_w(w, a100, Precision.FP32)

    assert ratio(b0) < ratio(none)
    assert amp(b0) < amp(none)
    # More tensor peak leaves the depthwise time alone: throughput gains less than with no share.
    fast = replace(a100, fp16_tflops=a100.fp16_tflops * 4, tf32_tflops=(a100.tf32_tflops or 0) * 4)
    assert _tput_w(b0, fast, Precision.AMP) / _tput_w(b0, a100, Precision.AMP) < (
        _tput_w(none, fast, Precision.AMP) / _tput_w(none, a100, Precision.AMP)
    )


def _tput_w(w: Workload, g: GPU, prec: Precision) -> float:
    return estimate(w, g, ParallelConfig(micro_batch=64, precision=prec)).throughput


def test_a_workloads_fixed_time_factor_scales_its_launch_time_only() -> None:
    p = fitted()
    w, g = CAT.workload("maskrcnn"), CAT.gpu("A100-80GB")
    cfg = ParallelConfig(micro_batch=2, precision=Precision.AMP)
    fam = p.family(w.family)
    base = estimate(w, g, cfg, p)
    doubled = replace(p, workload_launch_scale={**p.workload_launch_scale, w.id: 2 * p.workload_launch_scale[w.id]})
    more = estimate(w, g, cfg, doubled)
    extra = fam.launch_s_per_kernel * kernels_of(w, 2) * p.workload_launch_scale[w.id]
    assert more.host_s - base.host_s == pytest.approx(extra, rel=1e-9)
    assert more.compute_s == base.compute_s and more.memory_bound_s == base.memory_bound_s
    # A workload the fit never saw (a custom one) uses its family's time per kernel as it is.
    custom = replace(w, id="custom")
    expected = fam.launch_s_per_kernel * kernels_of(custom, 2) + 2 * fam.host_s_per_item
    assert estimate(custom, g, cfg, p).host_s == pytest.approx(expected)


def test_the_fixed_time_follows_the_counted_kernels() -> None:
    """Two workloads of one family and the same fitted factor: the one whose micro-batch launches
    more kernels spends proportionally more fixed time, whatever the GPU."""
    p = fitted()
    w = CAT.workload("resnet50")
    cfg = ParallelConfig(micro_batch=64, precision=Precision.AMP)
    flat = replace(p, workload_launch_scale={})
    for gpu in ("V100-16GB", "H100-80GB"):
        g = CAT.gpu(gpu)
        few = estimate(replace(w, kernels_per_step=400), g, cfg, flat)
        many = estimate(replace(w, kernels_per_step=1200), g, cfg, flat)
        per_kernel = p.family("cnn").launch_s_per_kernel
        assert many.host_s - few.host_s == pytest.approx(800 * per_kernel, rel=1e-9)
        assert many.compute_s == few.compute_s
        assert many.throughput < few.throughput


def test_kernels_per_item_grow_with_the_micro_batch() -> None:
    w = CAT.workload("maskrcnn")
    assert w.kernels_per_step is not None and w.kernels_per_item > 0
    assert kernels_of(w, 4) - kernels_of(w, 2) == pytest.approx(2 * w.kernels_per_item)


def test_uncounted_workloads_estimate_their_kernels_from_layers_or_the_default() -> None:
    cc = constants()["compute"]
    txl = CAT.workload("transformerxl-base")
    assert txl.kernels_per_step is None and txl.layers
    assert kernels_of(txl, 8) == cc["kernels_per_layer"] * txl.layers
    custom = replace(CAT.workload("resnet50"), kernels_per_step=None)
    assert custom.layers is None
    assert kernels_of(custom, 8) == cc["default_kernels_per_step"]
    # The per-layer figure is BERT-large's count per layer.
    bert = CAT.workload("bert-large-seq128")
    assert bert.kernels_per_step is not None and bert.layers
    assert cc["kernels_per_layer"] == round(bert.kernels_per_step / bert.layers)


def test_a_frameworks_factor_scales_the_time_per_kernel_only() -> None:
    p = fitted()
    w, g = CAT.workload("bert-large-seq128"), CAT.gpu("A100-80GB")
    base_cfg = ParallelConfig(micro_batch=32, precision=Precision.AMP)
    tf_cfg = replace(base_cfg, framework="tensorflow1")
    scaled = replace(p, framework_launch_scale={**p.framework_launch_scale, "tensorflow1": 2.0}, framework_scale={})
    plain = replace(p, framework_launch_scale={}, framework_scale={})
    a, b = estimate(w, g, tf_cfg, plain), estimate(w, g, tf_cfg, scaled)
    launch = p.family(w.family).launch_s_per_kernel * kernels_of(w, 32) * p.workload_launch_scale.get(w.id, 1.0)
    assert b.host_s - a.host_s == pytest.approx(launch, rel=1e-9)
    assert b.compute_s == a.compute_s
    # PyTorch (what predictions are for) is the reference: no factor.
    assert estimate(w, g, base_cfg, scaled).host_s == estimate(w, g, base_cfg, plain).host_s


def test_the_catalog_rejects_a_kernel_count_below_one() -> None:
    row = "x,,cnn,images,images,5e6,2e9,3e7,,,,,,,,,,sgd,,,,,0,,src"
    with pytest.raises(CatalogError, match=r"x: kernels_per_step 0 must be >= 1"):
        parse_workloads(read_rows(f"# schema: 1\n{WORKLOAD_HEADER}\n{row}\n", "workloads.csv"))


def test_the_catalog_rejects_a_depthwise_share_out_of_range() -> None:
    row = "x,,cnn-light,images,images,5e6,2e9,3e7,,,,,,,,,,sgd,,,1.5,,,,src"
    with pytest.raises(CatalogError, match=r"x: depthwise_flop_share 1\.5 must be in \[0, 1\)"):
        parse_workloads(read_rows(f"# schema: 1\n{WORKLOAD_HEADER}\n{row}\n", "workloads.csv"))


def test_activation_memory_sets_the_memory_and_the_traffic_base_the_memory_bound_time() -> None:
    """The catalog's measured activation memory decides what fits; the DRAM traffic of the memory-bound
    layers is counted in ``traffic_bytes_per_sample``, so a row can correct one without the other."""
    w, g = CAT.workload("efficientnet-b4"), CAT.gpu("V100-16GB")
    cfg = ParallelConfig(micro_batch=32, precision=Precision.AMP)
    assert w.traffic_bytes_per_sample is not None and w.traffic_bytes != w.activation_bytes_per_sample
    base = estimate(w, g, cfg)
    scale = constants()["memory"]["activation_scale"]["amp"]
    assert base.memory.activations == pytest.approx(32 * w.activation_bytes_per_sample * scale)
    more_memory = estimate(replace(w, activation_bytes_per_sample=2 * w.activation_bytes_per_sample), g, cfg)
    assert more_memory.memory.activations == pytest.approx(2 * base.memory.activations)
    assert more_memory.memory_bound_s == base.memory_bound_s and more_memory.step_time_s == base.step_time_s
    more_traffic = estimate(replace(w, traffic_bytes_per_sample=2 * w.traffic_bytes), g, cfg)
    assert more_traffic.memory_bound_s == pytest.approx(2 * base.memory_bound_s)
    assert more_traffic.memory.total == base.memory.total
    # Without a traffic figure (custom and transformer workloads) the activation memory is the base.
    plain = replace(w, traffic_bytes_per_sample=None)
    assert plain.traffic_bytes == w.activation_bytes_per_sample


@pytest.mark.parametrize("traffic", ["0", "nan", "inf"])
def test_the_catalog_rejects_a_traffic_base_that_is_not_positive_and_finite(traffic: str) -> None:
    header = WORKLOAD_HEADER.replace(",source", ",traffic_bytes_per_sample,source")
    row = f"x,,cnn,images,images,5e6,2e9,3e7,,,,,,,,,,sgd,,,,,,,{traffic},src"
    shown = {"0": r"0\.0", "nan": "nan", "inf": "inf"}[traffic]
    with pytest.raises(
        CatalogError,
        match=rf"x: activation_bytes_per_sample 30000000\.0 and traffic_bytes_per_sample {shown} must be positive and finite",
    ):
        parse_workloads(read_rows(f"# schema: 1\n{header}\n{row}\n", "workloads.csv"))
