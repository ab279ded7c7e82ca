"""Prices from any source, the price file they travel in, and the catalog re-priced by them.

A :class:`Price` is one hourly price of one instance type, capacity type and region (and zone, for
a per-zone spot price), with the day it was read and a short id of its source. A
:class:`PriceTable` holds the rows of one pull; it is written and read as a **price file**: a CSV in
the schema of the shipped ``catalog/data/instances.csv`` (:data:`PRICE_COLUMNS` = its columns plus
``zone``), one row per instance type and region (``zone`` empty) plus one per zone for per-zone spot
prices. A row carries the prices that share its zone, day and source; the GPU facts in it are
informative (the catalog's own facts are used).

:func:`apply_prices` makes a catalog whose instance types carry a table's prices. Precedence, per
price: a policy's ``priceOverrides`` (applied later, by the planner) > the table's price > the
shipped table's. A region's spot price is the cheapest of its zones' (the zones stay in
``InstanceType.spot_zones``). Plausibility: a price that is not a positive finite number, or an
on-demand price outside :data:`USD_PER_GPU_HOUR` per GPU, is refused; a spot price under
:data:`~gpuscaler.catalog.models.MIN_SPOT_SHARE` of on-demand is kept but flagged (the planner
leaves flagged prices out), which is how moto's $0.00001 spot prices are caught.

Pure: reads and writes local files only; the sources that fetch prices live in
:mod:`gpuscaler.cloud.pricing`.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import date

from gpuscaler.catalog.loader import (
    INSTANCE_COLUMNS,
    SCHEMA_VERSION,
    Catalog,
    CatalogError,
    InstanceIndex,
    UnknownIdError,
    normalize,
    read_rows,
)
from gpuscaler.catalog.models import SHIPPED_SOURCE, CapacityType, InstanceType
from gpuscaler.errors import InvalidInputError
from gpuscaler.inputs import MAX_TRACE_BYTES, InputError, read_text, shown

PRICE_COLUMNS = (*INSTANCE_COLUMNS[:3], "zone", *INSTANCE_COLUMNS[3:])
"""The header of a price file: ``instances.csv``'s columns with ``zone`` after ``region``."""
REQUIRED_COLUMNS = (
    "name",
    "provider",
    "region",
    "zone",
    "ondemand_usd_hr",
    "spot_usd_hr",
    "price_date",
    "source",
)
"""Columns a price file must have (the others are informative and may be empty)."""
PROVIDERS = ("aws", "azure", "gcp")
REGION_SHAPE = {
    "aws": re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+$"),
    "azure": re.compile(r"^[a-z][a-z0-9]+$"),
    "gcp": re.compile(r"^[a-z]+-[a-z]+\d+$"),
}
"""What a region name of each cloud looks like (us-east-1, eastus, us-central1)."""
POLICY_SOURCE = "policy-override"
"""The ``source`` id of a price a policy's ``priceOverrides`` set."""
HELD_CAPACITY_SOURCE = "policy-capacity"
"""Source of the price of held capacity (a policy's ``capacity``: reserved, capacity blocks, flex-start)."""
USD_PER_GPU_HOUR = (0.05, 100.0)
"""Plausible on-demand price per GPU-hour, USD: outside it a price is refused as a data error. The
shipped catalog spans $0.53 (one T4) to $7.91 (one H200 of p5en.48xlarge); the band leaves an order
of magnitude either side for dearer regions and newer parts."""
MAX_FUTURE_DAYS = 1
"""A price read more than this many days after today is refused (a clock or file error)."""


class PriceFileError(InvalidInputError, ValueError):
    """A price file (or price rows) that cannot be used: the message names the file, line and value."""


@dataclass(frozen=True, slots=True)
class Price:
    """One hourly price of an instance type in a region (and zone), as read from one source."""

    provider: str
    """aws, gcp or azure."""
    region: str
    zone: str
    """The availability zone of a per-zone (spot) price; empty for a region-wide price."""
    instance_type: str
    capacity: CapacityType
    usd_per_hour: float
    """Price of one node per hour, USD."""
    price_date: str
    """The ISO day the price was read, e.g. ``2026-12-06``."""
    source: str
    """Short id of the source: ``aws-pricing-api``, ``aws-spot-price-history``, ``azure-retail-prices``,
    ``gcp-cloud-billing``, ``shipped-table``, ``policy-override``, ..."""

    @property
    def key(self) -> tuple[str, str, str, str, CapacityType]:
        """What makes a price unique in a table: provider, region, zone, type (normalized), capacity."""
        return (self.provider, self.region, self.zone, normalize(self.instance_type), self.capacity)


def age_days(price_date: str, today: date | None = None) -> int | None:
    """Whole days since ``price_date`` (an ISO day); None when it is not one (the shipped table's
    ``undated-...`` labels)."""
    try:
        day = date.fromisoformat(price_date)
    except ValueError:
        return None
    return ((today or date.today()) - day).days


def describe_age(price_date: str, today: date | None = None) -> str:
    """``2026-12-05, 1 day old`` / ``undated-skypilot-v6, age unknown`` for messages and tables."""
    days = age_days(price_date, today)
    if days is None:
        return f"{price_date}, age unknown"
    return f"{price_date}, {days} day{'' if days == 1 else 's'} old"


def _number(value: str, where: str, column: str) -> float | None:
    if value in ("", "-", "n/a"):
        return None
    try:
        x = float(value)
    except ValueError:
        raise PriceFileError(f"{where}: {column} {shown(value)} is not a number (USD per hour)") from None
    if not math.isfinite(x) or x <= 0:
        raise PriceFileError(
            f"{where}: {column} {shown(value)} must be a positive price in USD per hour "
            "(leave it empty where there is no price)"
        )
    return x


def check_price_date(value: str, where: str, today: date | None = None) -> None:
    """An ISO day not in the future.

    Raises:
        PriceFileError: otherwise.
    """
    days = age_days(value, today)
    if days is None:
        raise PriceFileError(f"{where}: price_date {shown(value)} is not a day (YYYY-MM-DD)")
    if days < -MAX_FUTURE_DAYS:
        raise PriceFileError(
            f"{where}: price_date {value} is in the future (today is {today or date.today()})"
        )


@dataclass
class PriceTable:
    """Rows of prices (one pull, or one price file)."""

    rows: list[Price] = field(default_factory=list)
    filename: str = "prices"
    """Where the rows came from, for messages."""

    def __post_init__(self) -> None:
        seen: set[tuple[str, str, str, str, CapacityType]] = set()
        for p in self.rows:
            if p.key in seen:
                zone = f" zone {p.zone}" if p.zone else ""
                raise PriceFileError(
                    f"{self.filename}: {p.instance_type} {p.capacity.value} in {p.region}{zone} is priced twice"
                )
            seen.add(p.key)

    @classmethod
    def from_csv(cls, text: str, filename: str, today: date | None = None) -> PriceTable:
        """Parse a price file.

        Raises:
            PriceFileError: not a price file (no schema line, missing columns, a bad number, day,
                provider or capacity, a row priced twice, no rows); the message names line and value.
        """
        if "\x00" in text:
            raise PriceFileError(f"{filename}: not a price file (binary data)")
        try:
            records = read_rows(text, filename)
        except CatalogError as err:
            raise PriceFileError(
                f"{err} (is {filename} a price file? `gpuscaler catalog refresh` writes one)"
            ) from None
        except csv.Error as err:
            raise PriceFileError(f"{filename}: not a CSV price file: {err}") from None
        if not records:
            raise PriceFileError(f"{filename}: no prices in it")
        missing = [c for c in REQUIRED_COLUMNS if c not in records[0]]
        if missing:
            raise PriceFileError(
                f"{filename}: not a price file: missing column(s) {', '.join(missing)} "
                f"(a price file has the columns {', '.join(PRICE_COLUMNS)})"
            )
        rows: list[Price] = []
        for n, r in enumerate(records, start=1):
            rows.extend(_parse_row(r, f"{filename}: price row {n} ({r.get('name') or '?'})", today))
        return cls(rows, filename)

    @classmethod
    def read(cls, path: str, today: date | None = None) -> PriceTable:
        """Read and parse a price file.

        Raises:
            PriceFileError: unreadable, not text, or not a price file.
        """
        try:  # the input layer: a FIFO or a device refused unread, the size capped, UTF-8 checked
            text = read_text(path, "price file", MAX_TRACE_BYTES)
        except InputError as err:
            raise PriceFileError(f"cannot read the price file: {err}") from None
        return cls.from_csv(text, path, today)

    def to_csv(self, catalog: Catalog | None = None) -> str:
        """The price file's text; with a catalog, the GPU facts and interruption bucket are filled in.

        Rows are grouped by (instance type, region, zone, day, source): a region-wide row carries
        the on-demand and region-wide spot prices when they share day and source.
        """
        groups: dict[tuple[str, str, str, str, str, str], dict[CapacityType, float]] = {}
        for p in self.rows:
            key = (p.provider, p.instance_type, p.region, p.zone, p.price_date, p.source)
            groups.setdefault(key, {})[p.capacity] = p.usd_per_hour
        out = io.StringIO()
        out.write(
            f"# schema: {SCHEMA_VERSION}\n"
            "# gpuscaler price file (instances.csv columns + zone): one row per instance type x region,\n"
            "# plus one per zone for per-zone spot prices; written by `gpuscaler catalog refresh`.\n"
        )
        w = csv.writer(out, lineterminator="\n")
        w.writerow(PRICE_COLUMNS)
        for (provider, name, region, zone, day, source), prices in sorted(groups.items(), key=_row_order):
            facts = _facts(catalog, name, region)
            od, spot = prices.get(CapacityType.ON_DEMAND), prices.get(CapacityType.SPOT)
            discount = f"{(1 - spot / od) * 100:.0f}" if od and spot else ""
            w.writerow(
                [
                    name,
                    provider,
                    region,
                    zone,
                    *facts[:5],
                    _fmt(od),
                    _fmt(spot),
                    discount,
                    facts[5],
                    day,
                    source,
                ]
            )
        return out.getvalue()

    def write_atomic(self, path: str, catalog: Catalog | None = None) -> None:
        """Write the price file so that ``path`` holds either its old content or all of the new.

        The text goes to a temporary file in the same folder, is flushed to disk and renamed over
        ``path`` (``os.replace`` is atomic on POSIX); on any failure the temporary file is removed.

        Raises:
            PriceFileError: the folder cannot be written.
        """
        text = self.to_csv(catalog)
        folder = os.path.dirname(os.path.abspath(path))
        try:
            fd, tmp = tempfile.mkstemp(prefix=".prices-", suffix=".tmp", dir=folder)
        except OSError as err:
            raise PriceFileError(f"{path}: cannot write the price file: {err.strerror or err}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as err:
            os.unlink(tmp)
            raise PriceFileError(f"{path}: cannot write the price file: {err.strerror or err}") from None
        except BaseException:
            os.unlink(tmp)
            raise


def _row_order(
    item: tuple[tuple[str, str, str, str, str, str], dict[CapacityType, float]],
) -> tuple[str, ...]:
    provider, name, region, zone, day, source = item[0]
    return (provider, name, region, zone, source, day)


def _fmt(x: float | None) -> str:
    """A price to 10 significant digits (more than any price API quotes)."""
    return "" if x is None else f"{x:.10g}"


def _facts(catalog: Catalog | None, name: str, region: str) -> list[str]:
    """gpu_id, gpu_count, vcpu, memory_gib, network_gbps, interruption_bucket of a type (empty without
    a catalog or for an unknown type)."""
    if catalog is None or name not in catalog.instances:
        return [""] * 6
    regions = catalog.instances.regions(name)
    inst = catalog.instance(name, region if region in regions else None)
    bucket = "" if inst.interruption_bucket is None else str(inst.interruption_bucket)
    return [
        inst.gpu_id,
        str(inst.gpu_count),
        str(inst.vcpu),
        f"{inst.memory_gib:g}",
        f"{inst.network_gbps:g}",
        bucket,
    ]


def _parse_row(r: dict[str, str], where: str, today: date | None) -> list[Price]:
    name, provider, region, zone = r["name"], r["provider"].lower(), r["region"], r["zone"]
    if not name or not region:
        raise PriceFileError(f"{where}: name and region must not be empty")
    if provider not in PROVIDERS:
        raise PriceFileError(f"{where}: provider {shown(r['provider'])} is not one of {', '.join(PROVIDERS)}")
    if not REGION_SHAPE[provider].match(region):
        raise PriceFileError(f"{where}: region {shown(region)} is not a region name of {provider}")
    if zone and provider != "azure" and not zone.startswith(region):
        raise PriceFileError(f"{where}: zone {shown(zone)} is not in region {region}")
    if not r["source"]:
        raise PriceFileError(f"{where}: source must name where the price came from (e.g. aws-pricing-api)")
    if r["source"] != SHIPPED_SOURCE:  # the shipped table's days may be labels (undated-skypilot-v6)
        check_price_date(r["price_date"], where, today)
    od = _number(r["ondemand_usd_hr"], where, "ondemand_usd_hr")
    spot = _number(r["spot_usd_hr"], where, "spot_usd_hr")
    if spot is None and od is not None and r.get("spot_discount_pct"):
        discount = _number(r["spot_discount_pct"], where, "spot_discount_pct")
        if discount is not None and discount < 100:
            spot = round(od * (1 - discount / 100), 6)
    if od is None and spot is None:
        raise PriceFileError(f"{where}: neither ondemand_usd_hr nor spot_usd_hr is given")
    if od is not None and zone:
        raise PriceFileError(f"{where}: an on-demand price is region-wide: leave zone empty on its row")
    out = []
    for cap, price in ((CapacityType.ON_DEMAND, od), (CapacityType.SPOT, spot)):
        if price is not None:
            out.append(Price(provider, region, zone, name, cap, price, r["price_date"], r["source"]))
    return out


def check_ondemand(inst: InstanceType, price: float, where: str) -> None:
    """An on-demand price within :data:`USD_PER_GPU_HOUR` per GPU.

    Raises:
        PriceFileError: outside it (a data error, not a price).
    """
    low, high = USD_PER_GPU_HOUR
    per_gpu = price / inst.gpu_count
    if not low <= per_gpu <= high:
        raise PriceFileError(
            f"{where}: {inst.name} on-demand ${price:,.6g}/h is ${per_gpu:,.4g} per GPU-hour, outside the "
            f"plausible ${low:g}-{high:g}: refused as a data error"
        )


def _group(rows: Iterable[Price]) -> dict[tuple[str, str], list[Price]]:
    groups: dict[tuple[str, str], list[Price]] = {}
    for p in rows:
        groups.setdefault((normalize(p.instance_type), p.region), []).append(p)
    return groups


def apply_prices(catalog: Catalog, table: PriceTable) -> Catalog:
    """A catalog whose instance types carry the table's prices.

    For each (instance type, region) the table prices: the on-demand price is the table's
    region-wide one, else the catalog's; the spot price is the table's region-wide one, else the
    cheapest of its zones' (all kept in ``spot_zones``), else the catalog's. A region the catalog
    lacks for a known type is added with the type's facts from the catalog (the table must give
    its on-demand price). Each price keeps its own source and day.

    Args:
        catalog: the catalog (its GPU facts and, where the table is silent, its prices).
        table: the prices.

    Returns:
        A new catalog; ``catalog`` is not changed.

    Raises:
        PriceFileError: a type the catalog does not know, of another provider; a new region without
            an on-demand price; an on-demand price outside the plausible band.
    """
    rows: dict[tuple[str, str], InstanceType] = {(normalize(i.name), i.region): i for i in catalog.instances}
    for (norm, region), prices in _group(table.rows).items():
        where = f"{table.filename}: {prices[0].instance_type} in {region}"
        try:
            first = catalog.instance(prices[0].instance_type)
        except UnknownIdError as err:
            raise PriceFileError(
                f"{table.filename}: {err}: prices are read only for types the catalog knows"
            ) from None
        if prices[0].provider != first.provider:
            raise PriceFileError(
                f"{where}: provider {prices[0].provider}, the catalog has it on {first.provider}"
            )
        base = rows.get((norm, region))
        od = next((p for p in prices if p.capacity is CapacityType.ON_DEMAND), None)
        if base is None and od is None:
            raise PriceFileError(f"{where}: a region the catalog lacks needs an on-demand price in the file")
        region_spot = next((p for p in prices if p.capacity is CapacityType.SPOT and not p.zone), None)
        zones = sorted(
            (p for p in prices if p.capacity is CapacityType.SPOT and p.zone), key=lambda p: p.zone
        )
        spot = region_spot or min(zones, key=lambda p: p.usd_per_hour, default=None)
        inst = base or replace(first, region=region, spot_usd_hr=None, spot_zones=())
        if od is not None:
            check_ondemand(inst, od.usd_per_hour, where)
            inst = replace(
                inst, ondemand_usd_hr=od.usd_per_hour, price_date=od.price_date, ondemand_source=od.source
            )
        if spot is not None:
            inst = replace(
                inst,
                spot_usd_hr=spot.usd_per_hour,
                spot_price_date=spot.price_date,
                spot_source=spot.source,
                spot_zones=tuple((p.zone, p.usd_per_hour) for p in zones),
            )
        rows[(norm, region)] = replace(inst, source=_provenance(inst, first))
    index = InstanceIndex()
    for inst in sorted(rows.values(), key=_catalog_order(catalog)):
        index.add(inst.name, inst)
    return Catalog(gpus=catalog.gpus, instances=index, workloads=catalog.workloads)


def _provenance(inst: InstanceType, first: InstanceType) -> str:
    """The ``source`` text of a re-priced row: its facts from the catalog, each price from its source
    (the shipped row's text, and its suspicious-price mark, stay only while both prices are shipped)."""
    if inst.ondemand_source == SHIPPED_SOURCE and inst.spot_source == SHIPPED_SOURCE:
        return first.source if inst.region == first.region else inst.source
    spot = f"{inst.spot_source} {inst.spot_price_date or inst.price_date}" if inst.spot_usd_hr else "none"
    return (
        f"GPU, vCPU, RAM, network: the catalog's {first.name} ({first.region}); "
        f"on-demand: {inst.ondemand_source} {inst.price_date}; spot: {spot}"
    )


def _catalog_order(catalog: Catalog) -> Callable[[InstanceType], tuple[int, int, int, str]]:
    """Sort key: the catalog's own rows in their order, a type's new regions after its known ones."""
    first: dict[str, int] = {}
    known: dict[tuple[str, str], int] = {}
    for n, i in enumerate(catalog.instances):
        first.setdefault(normalize(i.name), n)
        known[(normalize(i.name), i.region)] = n

    def key(inst: InstanceType) -> tuple[int, int, int, str]:
        norm = normalize(inst.name)
        row = known.get((norm, inst.region))
        return (first[norm], row is None, row or 0, inst.region)

    return key


def shipped_prices(catalog: Catalog) -> PriceTable:
    """The catalog's own prices as rows (source ``shipped-table`` or what re-priced them)."""
    rows: list[Price] = []
    for i in catalog.instances:
        rows.append(Price(i.provider, i.region, "", i.name, CapacityType.ON_DEMAND, i.ondemand_usd_hr,
                          i.price_date, i.ondemand_source))  # fmt: skip
        if i.spot_usd_hr is not None and not i.spot_zones:
            rows.append(Price(i.provider, i.region, "", i.name, CapacityType.SPOT, i.spot_usd_hr,
                              i.price_date_of(CapacityType.SPOT), i.spot_source))  # fmt: skip
        for zone, usd in i.spot_zones:
            rows.append(Price(i.provider, i.region, zone, i.name, CapacityType.SPOT, usd,
                              i.price_date_of(CapacityType.SPOT), i.spot_source))  # fmt: skip
    return PriceTable(rows, "catalog")


STALE_AFTER_DAYS = 7
"""A price older than this many days (or undated) is called stale by the CLI, with the command that
reads today's."""


def is_stale(price_date: str, today: date | None = None) -> bool:
    """Older than :data:`STALE_AFTER_DAYS`, or undated."""
    days = age_days(price_date, today)
    return days is None or days > STALE_AFTER_DAYS


def price_note(source: str, price_date: str, today: date | None = None, hint: bool = True) -> str:
    """One line on where a price came from and how old it is, e.g. ``aws-pricing-api, read
    2026-12-05, 1 day old`` or ``shipped-table, dated 2026-07-20, 139 days old: stale, ...``."""
    if source == POLICY_SOURCE:
        return f"{POLICY_SOURCE} (the policy's negotiated price; no date)"
    if source == HELD_CAPACITY_SOURCE:
        return f"{HELD_CAPACITY_SOURCE} (held capacity: what the policy declares the team pays at the margin; no date)"
    days = age_days(price_date, today)
    verb = "dated" if source == SHIPPED_SOURCE else "read"
    note = f"{source}, {verb} {price_date}, " + (
        "age unknown" if days is None else f"{days} day{'' if days == 1 else 's'} old"
    )
    if hint and is_stale(price_date, today):
        note += ": stale (`gpuscaler catalog refresh` reads today's prices; plan with --prices FILE)"
    return note


def priced_catalog(path: str | None, catalog: Catalog, today: date | None = None) -> Catalog:
    """``catalog`` re-priced by the price file at ``path``; ``catalog`` itself when ``path`` is None.

    Raises:
        PriceFileError: the file is not a usable price file.
    """
    if path is None:
        return catalog
    return apply_prices(catalog, PriceTable.read(path, today))
