"""Load the shipped catalog data files (GPUs, instance types, workloads) and look ids up.

The files are CSV with a schema-version comment on the first line (``# schema: N``), one row per
item, each with a ``source`` column. Lookups are case-insensitive and accept aliases; an unknown id
raises :class:`UnknownIdError` with the closest known ids. Callers: perfmodel, planner, CLI,
dev-cluster fake nodes.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Generic, TypeVar

from gpuscaler.catalog.models import GPU, InstanceType, Workload
from gpuscaler.catalog.workloads import TransformerShape
from gpuscaler.errors import GpuscalerError, InvalidInputError
from gpuscaler.inputs import shown

SCHEMA_VERSION = 1
"""The schema version these loaders read; a data file with another version is refused."""

T = TypeVar("T")

INSTANCE_COLUMNS = (
    "name", "provider", "region", "gpu_id", "gpu_count", "vcpu", "memory_gib", "network_gbps",
    "ondemand_usd_hr", "spot_usd_hr", "spot_discount_pct", "interruption_bucket", "price_date", "source",
)  # fmt: skip
"""The header of ``instances.csv`` (schema 1), in order; its generator writes exactly these."""


class CatalogError(GpuscalerError, ValueError):
    """A catalog data file is malformed (wrong schema version, bad value)."""


class UnknownIdError(InvalidInputError, KeyError):
    """An id is not in the catalog; carries the closest known ids for the error message."""

    def __init__(self, what: str, value: str, matches: list[str]) -> None:
        self.what = what
        """What kind of name it is: ``gpu``, ``instance``, ``workload``."""
        self.value = value
        self.matches = matches
        super().__init__(value)

    def __str__(self) -> str:
        hint = f"; did you mean {', '.join(self.matches)}?" if self.matches else ""
        return f"unknown {self.what} {shown(self.value)}{hint} (`gpuscaler catalog {self.what}s` lists them)"


class UnknownRegionError(UnknownIdError):
    """A region an instance type (or a cloud) is not known in; carries the close or known regions."""

    def __init__(self, value: str, matches: list[str], where: str) -> None:
        self.where = where
        """What the region was looked up for: an instance type, or a provider's known regions."""
        super().__init__("region", value, matches)

    def __str__(self) -> str:
        hint = f"; did you mean {', '.join(self.matches)}?" if self.matches else ""
        return f"unknown region {shown(self.value)} for {self.where}{hint}"


def normalize(name: str) -> str:
    """Key used for case- and punctuation-insensitive lookups: ``A100_SXM4 80GB`` -> ``a100-sxm4-80gb``."""
    return "-".join(name.strip().lower().replace("_", " ").replace("-", " ").split())


@dataclass
class Index(Generic[T]):
    """Items by normalized id and alias, with close-match suggestions."""

    kind: str
    items: dict[str, T] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    """normalized alias -> canonical id"""

    def add(self, canonical: str, item: T, aliases: Iterable[str] = ()) -> None:
        self.items[canonical] = item
        for name in (canonical, *aliases):
            key = normalize(name)
            if key and key not in self.keys:
                self.keys[key] = canonical

    def get(self, name: str) -> T:
        key = normalize(name)
        if key in self.keys:
            return self.items[self.keys[key]]
        close = difflib.get_close_matches(key, list(self.keys), n=5, cutoff=0.5)
        matches = list(dict.fromkeys(self.keys[c] for c in close))
        raise UnknownIdError(self.kind, name, matches)

    def __contains__(self, name: str) -> bool:
        return normalize(name) in self.keys

    def __iter__(self) -> Iterator[T]:
        return iter(self.items.values())

    def __len__(self) -> int:
        return len(self.items)


class InstanceIndex(Index[InstanceType]):
    """Instance types by (name, region): the same type may be offered in several regions.

    ``get(name)`` answers the type in its first region (the shipped table's, for the shipped types),
    ``get(name, region)`` the type in that region; iteration yields every (type, region) row.
    """

    def __init__(self) -> None:
        super().__init__("instance")
        self.by_region: dict[tuple[str, str], str] = {}
        """(normalized name, region) -> item key"""

    def add(self, canonical: str, item: InstanceType, aliases: Iterable[str] = ()) -> None:
        key = f"{canonical}@{item.region}"
        if key in self.items:
            raise CatalogError(f"instance {canonical} in {item.region} is listed twice")
        self.items[key] = item
        self.by_region[(normalize(canonical), item.region)] = key
        for name in (canonical, *aliases):
            norm = normalize(name)
            if norm and norm not in self.keys:
                self.keys[norm] = key

    def get(self, name: str, region: str | None = None) -> InstanceType:
        """The instance type ``name``, in ``region`` when given, else in its first region.

        Raises:
            UnknownIdError: no such type (with close names), or not offered in that region (with the
                regions it is offered in).
        """
        first = super().get(name)
        if region is None:
            return first
        key = self.by_region.get((normalize(name), region))
        if key is None:
            raise UnknownRegionError(region, self.regions(first.name), f"instance type {first.name}")
        return self.items[key]

    def regions(self, name: str) -> list[str]:
        """The regions a type is offered in, in catalog order (empty for an unknown name)."""
        norm = normalize(name)
        return [region for (n, region) in self.by_region if n == norm]


def read_rows(text: str, filename: str) -> list[dict[str, str]]:
    """Parse a schema-versioned CSV text into rows; comment lines start with ``#``."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# schema:"):
        raise CatalogError(f"{filename}: first line must be '# schema: {SCHEMA_VERSION}'")
    version = int(lines[0].split(":", 1)[1])
    if version != SCHEMA_VERSION:
        raise CatalogError(f"{filename}: schema {version}, this gpuscaler reads {SCHEMA_VERSION}")
    body = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    rows = []
    for n, row in enumerate(csv.DictReader(io.StringIO("\n".join(body))), start=1):
        if None in row:  # csv.DictReader keeps fields beyond the header under the key None
            raise CatalogError(f"{filename}: row {n} has more fields than the header has columns")
        rows.append({k: (v or "").strip() for k, v in row.items()})
    return rows


def _opt_float(value: str) -> float | None:
    return float(value) if value not in ("", "-", "n/a") else None


def _opt_int(value: str) -> int | None:
    return int(value) if value not in ("", "-", "n/a") else None


def _aliases(value: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in value.split(";") if a.strip())


def parse_gpus(rows: list[dict[str, str]]) -> Index[GPU]:
    index: Index[GPU] = Index("gpu")
    for r in rows:
        gpu = GPU(
            id=r["id"],
            aliases=_aliases(r["aliases"]),
            vendor=r["vendor"],
            arch=r["arch"],
            memory_gb=float(r["memory_gb"]),
            mem_bw_gbs=float(r["mem_bw_gbs"]),
            fp32_tflops=float(r["fp32_tflops"]),
            tf32_tflops=_opt_float(r["tf32_tflops"]),
            fp16_tflops=float(r["fp16_tflops"]),
            has_bf16=r["has_bf16"].lower() in ("1", "true", "yes"),
            fp8_tflops=_opt_float(r["fp8_tflops"]),
            intra_link=r["intra_link"],
            intra_link_gbs=float(r["intra_link_gbs"]),
            product_label=r["product_label"],
            tdp_w=_opt_float(r["tdp_w"]),
            matmul_efficiency=_opt_float(r["matmul_efficiency"]),
            source=r["source"],
            sm_count=_opt_int(r.get("sm_count", "")),
            nccl_busbw_gbs=_opt_float(r.get("nccl_busbw_gbs", "")),
        )
        index.add(gpu.id, gpu, (*gpu.aliases, gpu.product_label))
    return index


def parse_instances(rows: list[dict[str, str]], gpus: Index[GPU]) -> InstanceIndex:
    index = InstanceIndex()
    for r in rows:
        if tuple(r) != INSTANCE_COLUMNS:
            raise CatalogError(f"instances.csv: columns {list(r)}, expected {list(INSTANCE_COLUMNS)}")
        gpu = gpus.get(r["gpu_id"])
        spot = _opt_float(r["spot_usd_hr"])
        if spot is None and r.get("spot_discount_pct"):
            spot = round(float(r["ondemand_usd_hr"]) * (1 - float(r["spot_discount_pct"]) / 100), 4)
        inst = InstanceType(
            name=r["name"],
            provider=r["provider"],
            region=r["region"],
            gpu_id=gpu.id,
            gpu_count=int(r["gpu_count"]),
            vcpu=int(r["vcpu"]),
            memory_gib=float(r["memory_gib"]),
            network_gbps=float(r["network_gbps"]),
            ondemand_usd_hr=float(r["ondemand_usd_hr"]),
            spot_usd_hr=spot,
            interruption_bucket=_opt_int(r["interruption_bucket"]),
            price_date=r["price_date"],
            source=r["source"],
            gpu=gpu,
        )
        index.add(inst.name, inst)
    return index


def _bool(value: str, column: str = "") -> bool:
    return value.lower() in ("1", "true", "yes")


def shape_from_row(
    r: dict[str, str], flag: Callable[[str, str], bool], *, head: str, dropout: bool, fused_loss: bool = False
) -> TransformerShape:
    """The :class:`TransformerShape` of a CSV row's shape columns (``workloads.csv``, ``memory_runs.csv``).

    Args:
        r: The row: ``layers``, ``hidden``, ``heads``, ``seq_len``, ``vocab`` (integers), ``ffn``
            (an integer or empty), ``gated`` and ``flash`` (flags).
        flag: Reads a flag column ``(value, column name)``; each file has its own spelling rules.
        head: The loss head (``lm``, ``mlm``, ``none``), as the file gives or defaults it.
        dropout: Whether the model trains with dropout.
        fused_loss: Whether the cross-entropy runs as one fused kernel.

    Returns:
        The shape.
    """
    return TransformerShape(
        layers=int(r["layers"]),
        hidden=int(r["hidden"]),
        heads=int(r["heads"]),
        seq_len=int(r["seq_len"]),
        vocab=int(r["vocab"]),
        ffn=_opt_int(r["ffn"]),
        gated=flag(r["gated"], "gated"),
        head=head,
        flash_attention=flag(r["flash"], "flash"),
        dropout=dropout,
        fused_loss=fused_loss,
    )


def parse_workloads(rows: list[dict[str, str]]) -> Index[Workload]:
    """Workload rows; transformer rows that give a shape and no FLOPs are derived from the shape."""
    index: Index[Workload] = Index("workload")
    for r in rows:
        shape = None
        if not r["flops_per_sample"]:
            shape = shape_from_row(r, _bool, head=r["head"] or "lm", dropout=r.get("dropout", "") != "0")
        w = Workload(
            id=r["id"],
            family=r["family"],
            unit=r["unit"],
            params=float(r["params"]) if r["params"] else shape.params if shape else 0.0,
            flops_per_sample=float(r["flops_per_sample"])
            if shape is None
            else shape.train_flops_per_sequence(),
            activation_bytes_per_sample=float(r["activation_bytes_per_sample"])
            if shape is None
            else shape.activation_bytes_per_sequence(),
            seq_len=_opt_int(r["seq_len"]),
            layers=_opt_int(r["layers"]),
            hidden=_opt_int(r["hidden"]),
            heads=_opt_int(r["heads"]),
            vocab=_opt_int(r["vocab"]),
            aliases=_aliases(r["aliases"]),
            optimizer=r["optimizer"] or "adam",
            default_global_batch=_opt_int(r["default_global_batch"]),
            samples_per_epoch=_opt_int(r["samples_per_epoch"]),
            source=r["source"],
            shape=shape,
            batch_unit=r.get("batch_unit", ""),
            depthwise_flop_share=_opt_float(r.get("depthwise_flop_share", "")) or 0.0,
            variable_inputs=_bool(r.get("variable_inputs", "")),
            kernels_per_step=_opt_int(r.get("kernels_per_step", "")),
            kernels_per_item=_opt_float(r.get("kernels_per_item", "")) or 0.0,
            traffic_bytes_per_sample=_opt_float(r.get("traffic_bytes_per_sample", "")),
        )
        if w.params <= 0 or w.flops_per_sample <= 0:
            raise CatalogError(f"workloads.csv: {w.id}: params and flops_per_sample must be positive")
        if not 0.0 <= w.depthwise_flop_share < 1.0:
            raise CatalogError(
                f"workloads.csv: {w.id}: depthwise_flop_share {w.depthwise_flop_share} must be in [0, 1)"
            )
        if (w.kernels_per_step is not None and w.kernels_per_step < 1) or w.kernels_per_item < 0:
            raise CatalogError(
                f"workloads.csv: {w.id}: kernels_per_step {w.kernels_per_step} must be >= 1 and "
                f"kernels_per_item {w.kernels_per_item} >= 0"
            )
        if not all(0 < b < math.inf for b in (w.activation_bytes_per_sample, w.traffic_bytes)):
            raise CatalogError(
                f"workloads.csv: {w.id}: activation_bytes_per_sample {w.activation_bytes_per_sample} and "
                f"traffic_bytes_per_sample {w.traffic_bytes_per_sample} must be positive and finite"
            )
        index.add(w.id, w, w.aliases)
    return index


@dataclass(frozen=True)
class Catalog:
    """The GPU, instance and workload catalogs, indexed for lookup."""

    gpus: Index[GPU]
    instances: InstanceIndex
    workloads: Index[Workload]

    def gpu(self, name: str) -> GPU:
        """The GPU for an id or alias. Raises UnknownIdError with close matches."""
        return self.gpus.get(name)

    def instance(self, name: str, region: str | None = None) -> InstanceType:
        """The instance type for a name, in ``region`` or else its first region. Raises
        UnknownIdError with close matches."""
        return self.instances.get(name, region)

    def workload(self, name: str) -> Workload:
        """The named workload profile. Raises UnknownIdError with close matches."""
        return self.workloads.get(name)


def data_text(name: str) -> str:
    """The text of a data file shipped in ``catalog/data``."""
    return _data(name)


def _data(name: str) -> str:
    return (resources.files("gpuscaler.catalog") / "data" / name).read_text(encoding="utf-8")


@cache
def load_catalog() -> Catalog:
    """The catalog shipped with the package (cached: the files are read once per process)."""
    gpus = parse_gpus(read_rows(_data("gpus.csv"), "gpus.csv"))
    instances = parse_instances(read_rows(_data("instances.csv"), "instances.csv"), gpus)
    workloads = parse_workloads(read_rows(_data("workloads.csv"), "workloads.csv"))
    return Catalog(gpus=gpus, instances=instances, workloads=workloads)
