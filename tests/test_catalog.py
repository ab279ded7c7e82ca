"""Catalog: every required GPU and workload is there, lookups accept aliases, errors suggest."""

from __future__ import annotations

import pytest

from gpuscaler.catalog import UnknownIdError, load_catalog

REQUIRED_GPUS = [
    "V100-16GB", "V100-32GB", "T4", "A10", "A10G", "L4", "L40S", "A40", "A100-40GB", "A100-80GB",
    "A100-40GB-PCIe", "A100-80GB-PCIe", "H100-80GB-SXM", "H100-80GB-PCIe", "H200-141GB-SXM", "GH200-96GB",
    "B200-192GB", "RTX-A6000", "RTX-6000-Ada", "RTX-4090", "MI300X",
]  # fmt: skip
REQUIRED_WORKLOADS = [
    "resnet50", "ssd300", "maskrcnn", "efficientnet-b0", "bert-base-squad", "bert-large-squad",
    "bert-large-seq128", "bert-large-seq512", "transformerxl-base", "transformerxl-large", "gnmt",
    "gpt2-small", "llama-7b",
]  # fmt: skip


@pytest.mark.parametrize("gpu_id", REQUIRED_GPUS)
def test_required_gpus_present_case_insensitive(gpu_id: str) -> None:
    cat = load_catalog()
    assert cat.gpu(gpu_id.lower()).id == gpu_id
    g = cat.gpu(gpu_id)
    assert g.memory_gb > 0 and g.mem_bw_gbs > 0 and g.fp16_tflops >= g.fp32_tflops
    assert g.source


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("a100", "A100-40GB"),
        ("h100", "H100-80GB-SXM"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("nvidia-tesla-a100", "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),  # nvidia.com/gpu.product value
        ("Tesla-V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB-SXM"),
        ("nvidia_l4", "L4"),
    ],
)
def test_gpu_aliases(alias: str, expected: str) -> None:
    assert load_catalog().gpu(alias).id == expected


def test_unknown_gpu_suggests_close_matches() -> None:
    with pytest.raises(UnknownIdError) as err:
        load_catalog().gpu("h10")
    assert "H100-80GB-SXM" in err.value.matches
    assert "h10" in str(err.value)


@pytest.mark.parametrize("wid", REQUIRED_WORKLOADS)
def test_required_workloads(wid: str) -> None:
    w = load_catalog().workload(wid)
    assert w.params > 0 and w.flops_per_sample > 0 and w.activation_bytes_per_sample > 0
    assert w.unit in {"images", "sequences", "tokens"}
    assert w.source


def test_transformer_shapes_match_published_sizes() -> None:
    cat = load_catalog()
    # Published parameter counts: LLaMA-7B 6.74B, BERT-large 340M (335M without pooler/type emb.), GPT-2 124M.
    assert cat.workload("llama-7b").params == pytest.approx(6.74e9, rel=0.01)
    assert cat.workload("bert-large-squad").params == pytest.approx(335e6, rel=0.02)
    assert cat.workload("gpt2-small").params == pytest.approx(124e6, rel=0.02)
    # 6 N FLOPs per token rule of thumb for a decoder: within 20% at 2k context.
    llama = cat.workload("llama-7b")
    assert llama.flops_per_sample / 2048 == pytest.approx(6 * 6.74e9, rel=0.2)


def test_every_instance_resolves_its_gpu_and_prices_are_sane() -> None:
    cat = load_catalog()
    assert len(cat.instances) >= 30
    for inst in cat.instances:
        assert inst.gpu.id == inst.gpu_id
        assert inst.ondemand_usd_hr > 0
        if inst.spot_usd_hr is not None:
            assert 0 < inst.spot_usd_hr < inst.ondemand_usd_hr
        assert inst.price_date
