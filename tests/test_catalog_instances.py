"""The shipped instance catalog (catalog/data/instances.csv) parses and its rows are sane."""

from __future__ import annotations

import csv
import io
from importlib import resources

import pytest

from gpuscaler.catalog.loader import INSTANCE_COLUMNS, Index, parse_gpus, parse_instances, read_rows
from gpuscaler.catalog.models import GPU, CapacityType, InstanceType

COLUMNS = list(INSTANCE_COLUMNS)

GPU_IDS = [
    "V100-16GB",
    "V100-32GB",
    "T4",
    "A10",
    "A10G",
    "L4",
    "L40S",
    "A40",
    "A100-40GB",
    "A100-80GB",
    "A100-40GB-PCIe",
    "A100-80GB-PCIe",
    "H100-80GB-SXM",
    "H100-80GB-PCIe",
    "H200-141GB-SXM",
    "GH200-96GB",
    "B200-192GB",
    "RTX-A6000",
    "RTX-6000-Ada",
    "RTX-4090",
    "MI300X",
]

REQUIRED = {
    "aws": [
        "p3.2xlarge",
        "p3.8xlarge",
        "p3.16xlarge",
        "p3dn.24xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5en.48xlarge",
        "g4dn.xlarge",
        "g4dn.12xlarge",
        "g5.xlarge",
        "g5.12xlarge",
        "g5.48xlarge",
        "g6.xlarge",
        "g6.12xlarge",
        "g6.48xlarge",
        "g6e.xlarge",
        "g6e.12xlarge",
        "g6e.48xlarge",
    ],
    "gcp": [
        "a2-highgpu-1g",
        "a2-highgpu-2g",
        "a2-highgpu-4g",
        "a2-highgpu-8g",
        "a3-highgpu-8g",
        "g2-standard-4",
    ],
    "azure": [
        "Standard_NC24ads_A100_v4",
        "Standard_NC48ads_A100_v4",
        "Standard_NC96ads_A100_v4",
        "Standard_ND96asr_v4",
        "Standard_ND96amsr_A100_v4",
        "Standard_NC40ads_H100_v5",
        "Standard_NC4as_T4_v3",
    ],
}
REGION = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}


def _data(name: str) -> str | None:
    path = resources.files("gpuscaler.catalog") / "data" / name
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _gpu_index() -> Index[GPU]:
    """The shipped GPU catalog; a stub with the allowed ids if gpus.csv is not there yet."""
    text = _data("gpus.csv")
    if text is not None:
        return parse_gpus(read_rows(text, "gpus.csv"))
    index: Index[GPU] = Index("gpu")
    for gid in GPU_IDS:
        index.add(
            gid, GPU(gid, (), "nvidia", "x", 1, 1, 1, None, 1, True, None, "pcie4", 1, gid, None, "stub")
        )
    return index


@pytest.fixture(scope="module")
def text() -> str:
    content = _data("instances.csv")
    assert content is not None, "catalog/data/instances.csv is missing"
    return content


@pytest.fixture(scope="module")
def rows(text: str) -> list[dict[str, str]]:
    return read_rows(text, "instances.csv")


@pytest.fixture(scope="module")
def instances(rows: list[dict[str, str]]) -> list[InstanceType]:
    index = parse_instances(rows, _gpu_index())
    return [index.get(r["name"]) for r in rows]


def test_schema_line_and_header(text: str) -> None:
    lines = text.splitlines()
    assert lines[0] == "# schema: 1"
    header = next(ln for ln in lines if not ln.startswith("#"))
    assert next(csv.reader(io.StringIO(header))) == COLUMNS


def test_every_row_parses(rows: list[dict[str, str]], instances: list[InstanceType]) -> None:
    assert len(rows) >= sum(len(v) for v in REQUIRED.values())
    assert len(instances) == len(rows)
    for r in rows:
        assert None not in r, f"{r.get('name')}: more cells than columns"
        assert set(r) == set(COLUMNS)
        assert r["gpu_id"] in GPU_IDS, r["name"]


def test_required_rows_present(instances: list[InstanceType]) -> None:
    by_provider: dict[str, set[str]] = {}
    for i in instances:
        by_provider.setdefault(i.provider, set()).add(i.name)
    for provider, names in REQUIRED.items():
        missing = set(names) - by_provider.get(provider, set())
        assert not missing, f"{provider}: missing {sorted(missing)}"


def test_no_duplicate_names(rows: list[dict[str, str]]) -> None:
    names = [r["name"].lower() for r in rows]
    assert len(names) == len(set(names))


def test_positive_shapes_and_prices(instances: list[InstanceType]) -> None:
    for i in instances:
        assert i.gpu_count >= 1, i.name
        assert i.vcpu > 0 and i.memory_gib > 0 and i.network_gbps > 0, i.name
        assert i.ondemand_usd_hr > 0, i.name
        assert i.spot_usd_hr is None or 0 < i.spot_usd_hr < i.ondemand_usd_hr, i.name
        assert i.region == REGION[i.provider], i.name
        assert i.gpu.id == i.gpu_id


def test_aws_spot_from_advisor_discount(rows: list[dict[str, str]], instances: list[InstanceType]) -> None:
    by_name = {i.name: i for i in instances}
    aws = [r for r in rows if r["provider"] == "aws"]
    assert aws
    for r in aws:
        inst = by_name[r["name"]]
        assert r["spot_usd_hr"] == "" and r["spot_discount_pct"] != "", r["name"]
        pct = float(r["spot_discount_pct"])
        assert 0 < pct < 100
        assert inst.spot_usd_hr is not None
        assert inst.spot_usd_hr == pytest.approx(inst.ondemand_usd_hr * (1 - pct / 100), abs=1e-3)
        assert inst.spot_usd_hr < inst.ondemand_usd_hr
        assert inst.price(CapacityType.SPOT) == inst.spot_usd_hr
        assert inst.interruption_bucket is not None
        assert inst.price_date == "2026-07-20"


def test_interruption_buckets(instances: list[InstanceType]) -> None:
    for i in instances:
        if i.spot_usd_hr is None:
            assert i.interruption_bucket is None, f"{i.name}: bucket without a spot price"
        else:
            assert i.interruption_bucket in range(5), i.name
    # Spot Advisor facts that the planner's choices hinge on (us-east-1 Linux).
    by_name = {i.name: i for i in instances}
    assert by_name["p4de.24xlarge"].interruption_bucket == 0
    assert by_name["p5.48xlarge"].interruption_bucket == 4


def test_sources_present_and_marked(instances: list[InstanceType]) -> None:
    for i in instances:
        assert i.source.strip(), i.name
        if i.provider in ("gcp", "azure") and i.spot_usd_hr is not None:
            assert "assumed bucket 2" in i.source, i.name
        if i.provider == "azure" and i.spot_usd_hr is not None:
            assert "suspiciously deep" in i.source, i.name
    by_name = {i.name: i for i in instances}
    for derived in ("a2-highgpu-2g", "a2-highgpu-4g"):
        assert "derived" in by_name[derived].source


def test_gcp_totals_are_host_plus_gpu(instances: list[InstanceType]) -> None:
    by_name = {i.name: i for i in instances}
    one, eight = by_name["a2-highgpu-1g"], by_name["a2-highgpu-8g"]
    assert one.ondemand_usd_hr == pytest.approx(0.73948 + 2.93391)
    assert eight.spot_usd_hr == pytest.approx(2.36604 + 9.1776)
    for k in (2, 4):
        derived = by_name[f"a2-highgpu-{k}g"]
        assert derived.gpu_count == k
        assert derived.ondemand_usd_hr == pytest.approx(k * one.ondemand_usd_hr, rel=1e-6)
        assert derived.ondemand_usd_hr / k == pytest.approx(eight.ondemand_usd_hr / 8, rel=1e-4)
