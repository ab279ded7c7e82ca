"""Performance model: memory and time behave as physics says, and the fit error stays honest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.catalog import Precision, load_catalog
from gpuscaler.perfmodel import ParallelConfig, PrecisionUnsupportedError, constants, estimate, memory_per_gpu
from gpuscaler.perfmodel.calibration import load_rows, report

CAT = load_catalog()
WORKLOADS = [w.id for w in CAT.workloads]
GPUS = [g.id for g in CAT.gpus]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(WORKLOADS),
    st.sampled_from(GPUS),
    st.integers(1, 512),
    st.integers(1, 512),
    st.sampled_from([Precision.FP32, Precision.AMP]),
    st.booleans(),
)
def test_memory_grows_with_batch(wid: str, gid: str, b1: int, b2: int, prec: Precision, ckpt: bool) -> None:
    w, g = CAT.workload(wid), CAT.gpu(gid)
    lo, hi = sorted((b1, b2))
    m_lo = memory_per_gpu(w, g, ParallelConfig(micro_batch=lo, precision=prec, activation_checkpointing=ckpt))
    m_hi = memory_per_gpu(w, g, ParallelConfig(micro_batch=hi, precision=prec, activation_checkpointing=ckpt))
    assert m_hi.total >= m_lo.total
    if hi > lo:
        assert m_hi.activations > m_lo.activations


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(WORKLOADS), st.integers(1, 64), st.sampled_from([2, 4, 8]))
def test_sharding_and_checkpointing_never_add_memory(wid: str, batch: int, gpus: int) -> None:
    """Each ZeRO stage shards more state; stage 3 also gathers whole units (FSDP's all-gather of a
    layer or the embedding before use), so it saves at most what stage 2 keeps, less those units."""
    w, g = CAT.workload(wid), CAT.gpu("A100-80GB")
    base = ParallelConfig(micro_batch=batch, gpus_per_node=gpus)
    mems = [memory_per_gpu(w, g, ParallelConfig(micro_batch=batch, gpus_per_node=gpus, zero_stage=z)) for z in range(4)]
    totals = [m.total for m in mems]
    assert totals[:3] == sorted(totals[:3], reverse=True)
    assert totals[3] - mems[3].gathered * (1 + constants()["memory"]["fragmentation"]) <= totals[2]
    ckpt = ParallelConfig(micro_batch=batch, gpus_per_node=gpus, activation_checkpointing=True)
    assert memory_per_gpu(w, g, ckpt).activations <= memory_per_gpu(w, g, base).activations


def test_amp_memory_has_fp32_master_weights() -> None:
    w, g = CAT.workload("llama-7b"), CAT.gpu("H100")
    m = memory_per_gpu(w, g, ParallelConfig(micro_batch=1, precision=Precision.AMP))
    # ZeRO paper: 16 bytes/param for mixed-precision Adam (2 weights + 2 grads + 4 master + 8 moments).
    assert (m.weights + m.gradients + m.optimizer) / w.params == pytest.approx(16.0)
    assert not m.fits  # a 7B model with Adam cannot be trained unsharded on one 80 GB GPU
    sharded = memory_per_gpu(
        w, g, ParallelConfig(micro_batch=1, gpus_per_node=8, zero_stage=3, activation_checkpointing=True)
    )
    assert sharded.fits


@pytest.mark.parametrize("wid", ["resnet50", "bert-large-seq128", "gpt2-small", "transformerxl-base"])
def test_amp_speedup_comes_from_the_hardware(wid: str) -> None:
    w = CAT.workload(wid)

    def speedup(gid: str) -> float:
        g = CAT.gpu(gid)
        fp32 = estimate(w, g, ParallelConfig(micro_batch=32, precision=Precision.FP32)).throughput
        amp = estimate(w, g, ParallelConfig(micro_batch=32, precision=Precision.AMP)).throughput
        return amp / fp32

    # V100 has no TF32, so AMP gains more there than on A100 (whose "fp32" is TF32 tensor cores).
    assert speedup("V100-32GB") > speedup("A100-80GB") > 1.0
    assert speedup("T4") > 1.0


def test_faster_hardware_is_faster() -> None:
    w = CAT.workload("bert-large-seq128")
    cfg = ParallelConfig(micro_batch=64, precision=Precision.AMP)
    tput = {g: estimate(w, CAT.gpu(g), cfg).throughput for g in ("T4", "V100-32GB", "A100-80GB", "H100", "B200")}
    assert tput["T4"] < tput["V100-32GB"] < tput["A100-80GB"] < tput["H100"] < tput["B200"]


def test_accumulation_amortises_allreduce() -> None:
    w, g = CAT.workload("bert-large-squad"), CAT.gpu("V100-16GB")
    one = estimate(w, g, ParallelConfig(micro_batch=4, gpus_per_node=8, accumulation=1))
    many = estimate(w, g, ParallelConfig(micro_batch=4, gpus_per_node=8, accumulation=16))
    assert many.scaling_efficiency >= one.scaling_efficiency
    multi_node = estimate(w, g, ParallelConfig(micro_batch=4, gpus_per_node=8, nodes=4, network_gbps=25))
    assert multi_node.comm_s > one.comm_s


def test_unsupported_precision_is_a_clear_error() -> None:
    w = CAT.workload("resnet50")
    with pytest.raises(PrecisionUnsupportedError, match="V100-16GB has no bf16"):
        estimate(w, CAT.gpu("V100-16GB"), ParallelConfig(micro_batch=8, precision=Precision.BF16))
    with pytest.raises(PrecisionUnsupportedError, match="fp8"):
        estimate(w, CAT.gpu("A100-80GB"), ParallelConfig(micro_batch=8, precision=Precision.FP8))


def test_every_published_configuration_fits_in_memory() -> None:
    """Those runs happened, so the memory model must say they fit (guards against overestimating)."""
    rows, _ = load_rows()
    misfits = [
        (r.workload.id, r.gpu.id, r.cfg.micro_batch, r.precision)
        for r in rows
        if not memory_per_gpu(r.workload, r.gpu, r.cfg).fits
    ]
    assert len(misfits) <= len(rows) * 0.05, misfits[:10]


def test_fit_error_is_reported_and_bounded() -> None:
    rep = report()
    assert rep.overall.n > 600
    # The committed calibration: if a change to the model makes these worse, recalibrate or explain.
    assert rep.overall.median < 20
    assert rep.scaling.median < 15
    assert set(rep.by["gpu"]) == {"A100-40GB", "A100-80GB", "V100-16GB", "V100-32GB"}


def _grid() -> list[tuple[str, str, ParallelConfig]]:
    """Configurations that differ from each other in one field at a time, across every field the
    model's memos could key on (precision, GPUs, nodes, sharding, checkpointing, links, network)."""
    out = []
    for wid in ("resnet50", "maskrcnn", "bert-large-seq512", "transformerxl-base", "llama-7b"):
        for gid in ("V100-16GB", "A100-80GB", "H100-80GB-SXM", "L4", "MI300X"):
            for prec in (Precision.FP32, Precision.AMP, Precision.FP8):
                for gpn, nodes, net in ((1, 1, None), (8, 1, None), (8, 2, 400.0), (8, 2, 3200.0), (4, 4, 100.0)):
                    for zero, ckpt in ((0, False), (0, True), (3, True)):
                        for link, link_gbs in ((None, None), ("pcie4", 31.5)):
                            out.append((wid, gid, ParallelConfig(
                                micro_batch=4, precision=prec, gpus_per_node=gpn, nodes=nodes, network_gbps=net,
                                zero_stage=zero, activation_checkpointing=ckpt, intra_link=link,
                                intra_link_gbs=link_gbs, accumulation=2,
                            )))  # fmt: skip
    return out


def _outcome(wid: str, gid: str, cfg: ParallelConfig) -> str:
    try:
        return repr(estimate(CAT.workload(wid), CAT.gpu(gid), cfg))
    except PrecisionUnsupportedError as e:
        return str(e)


def test_memoised_terms_never_answer_for_another_configuration() -> None:
    """The model memoises its micro-batch-independent parts for planning speed: every estimate is
    the same whether computed first on empty memos or after all the others filled them in the
    opposite order (a field missing from a memo's key would hand one configuration another's
    answer), and the same as with the memos off."""
    from gpuscaler.perfmodel import memory, model

    memos = (memory._memory_form, memory._headroom, model._rates, model._allreduce_cached)
    grid = _grid()
    cold = []
    for wid, gid, cfg in grid:
        for memo in memos:
            memo.cache_clear()
        cold.append(_outcome(wid, gid, cfg))
    warm = [_outcome(wid, gid, cfg) for wid, gid, cfg in reversed(grid)][::-1]
    assert warm == cold
    assert sum(memo.cache_info().hits for memo in memos) > len(grid)  # the memos were used
    assert len(set(cold)) > len(grid) // 2  # the grid's configurations really differ
