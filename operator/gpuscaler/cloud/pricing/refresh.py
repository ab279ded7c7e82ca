"""``gpuscaler catalog refresh``: read today's prices from a cloud's price API into a price file.

Only the instance types the catalog knows are priced (their GPU facts come from the catalog), in
the regions asked (default: the catalog's regions for that cloud; a known type may be priced in a
new region). Before anything is written the pull is checked: a price that is not a positive number
or an on-demand price outside the plausible band is dropped with a warning, a spot price under 10%
of on-demand is kept but flagged (the planner leaves it out), a region with no price at all is an
error naming close region names, and the table must apply to the catalog. Then the file is written
atomically; on any failure nothing is written (an existing file is left as it was).
Exit codes: 0 written; 2 unreachable API, throttled past the retries, a malformed page (kind
``unavailable``), missing or refused credentials, an unknown region (``invalid-input``).
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscaler.catalog import CapacityType, Catalog, load_catalog
from gpuscaler.catalog.models import MIN_SPOT_SHARE
from gpuscaler.catalog.prices import (
    REGION_SHAPE,
    Price,
    PriceFileError,
    PriceTable,
    apply_prices,
    check_ondemand,
)
from gpuscaler.cloud.pricing import Pacing, PriceSource, PriceSourceError, Progress, unknown_regions_error
from gpuscaler.errors import ErrorKind
from gpuscaler.inputs import InputError, shown, to_json

PROVIDERS = ("aws", "azure", "gcp")


@dataclass
class Report:
    """What a refresh read, dropped and flagged."""

    provider: str
    regions: list[str]
    out: str
    table: PriceTable
    dropped: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        rows = self.table.rows
        return {
            "provider": self.provider,
            "regions": self.regions,
            "out": self.out,
            "priceDate": max((p.price_date for p in rows), default=""),
            "sources": sorted({p.source for p in rows}),
            "instanceTypes": len({p.instance_type for p in rows}),
            "onDemandPrices": sum(p.capacity is CapacityType.ON_DEMAND for p in rows),
            "spotPrices": sum(p.capacity is CapacityType.SPOT for p in rows),
            "zones": len({p.zone for p in rows if p.zone}),
            "dropped": self.dropped,
            "flagged": self.flagged,
        }


def parse_regions(text: str | None, provider: str, catalog: Catalog, known: Sequence[str] = ()) -> list[str]:
    """The regions to price: ``--regions`` (comma-separated) or the catalog's for the provider.

    Raises:
        InputError: an empty list, a name not shaped like a region of that cloud, or (where
            ``known`` lists the cloud's regions: botocore's for AWS) one not among them; with
            close names.
    """
    if text is None:
        return sorted({i.region for i in catalog.instances if i.provider == provider})
    regions = list(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
    if not regions:
        raise InputError(
            f"--regions {shown(text)}: give one or more region names, comma-separated", field="--regions"
        )
    pool = [*known, *sorted({i.region for i in catalog.instances if i.provider == provider})]
    for r in regions:
        if not REGION_SHAPE[provider].match(r) or (known and r not in known):
            close = difflib.get_close_matches(r.lower(), pool, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InputError(
                f"--regions: {shown(r)} is not a region of {provider}{hint}", field="--regions", value=r
            )
    return regions


def known_regions(provider: str) -> list[str]:
    """Region names to suggest from: botocore's EC2 regions for AWS, none offline for the others."""
    if provider != "aws":
        return []
    import botocore.session

    return list(botocore.session.get_session().get_available_regions("ec2"))


def make_source(provider: str, catalog: Catalog, progress: Progress) -> PriceSource:
    """The price source of a cloud, for the catalog's instance types of that cloud."""
    instances = [i for i in catalog.instances if i.provider == provider]
    names = list(dict.fromkeys(i.name for i in instances))
    if provider == "aws":
        from gpuscaler.cloud.pricing.aws import AwsPriceSource

        return AwsPriceSource(names, pacing=Pacing(progress))
    if provider == "azure":
        from gpuscaler.cloud.pricing.azure import AzurePriceSource

        return AzurePriceSource(names, pacing=Pacing(progress))
    from gpuscaler.cloud.pricing.gcp import GcpPriceSource

    first = {i.name: i for i in reversed(instances)}  # each type's first region: its facts
    return GcpPriceSource(first.values(), pacing=Pacing(progress))


def vet(table: PriceTable, catalog: Catalog) -> tuple[PriceTable, list[str], list[str]]:
    """The rows fit to write, the dropped ones and the flagged ones, each with its reason.

    Dropped: a price that is not a positive finite number; an on-demand price outside
    :data:`~gpuscaler.catalog.prices.USD_PER_GPU_HOUR` per GPU (and then that type's spot rows in
    that region, which have no on-demand to be judged against). Flagged (kept): a spot price under
    :data:`~gpuscaler.catalog.models.MIN_SPOT_SHARE` of the region's on-demand.
    """
    dropped: list[str] = []
    keep: list[Price] = []
    for p in table.rows:
        if not (math.isfinite(p.usd_per_hour) and p.usd_per_hour > 0):
            dropped.append(
                f"{p.instance_type} {p.capacity.value} in {p.zone or p.region}: ${p.usd_per_hour} is not a price"
            )
            continue
        if p.capacity is CapacityType.ON_DEMAND:
            try:
                check_ondemand(catalog.instance(p.instance_type), p.usd_per_hour, p.source)
            except PriceFileError as err:
                dropped.append(str(err))
                continue
        keep.append(p)
    od = {(p.instance_type, p.region): p.usd_per_hour for p in keep if p.capacity is CapacityType.ON_DEMAND}
    flagged = [
        f"{p.instance_type} spot in {p.zone or p.region}: ${p.usd_per_hour:.6g}/h is under {MIN_SPOT_SHARE:.0%} of "
        f"on-demand ${od[(p.instance_type, p.region)]:.6g}/h: flagged, the planner leaves it out"
        for p in keep
        if p.capacity is CapacityType.SPOT
        and (p.instance_type, p.region) in od
        and p.usd_per_hour < MIN_SPOT_SHARE * od[(p.instance_type, p.region)]
    ]
    shipped = {(i.name, i.region) for i in catalog.instances}
    orphans = [p for p in keep if p.capacity is CapacityType.SPOT and (p.instance_type, p.region) not in od
               and (p.instance_type, p.region) not in shipped]  # fmt: skip
    for p in orphans:
        dropped.append(
            f"{p.instance_type} spot in {p.zone or p.region}: no on-demand price in {p.region} to go with it"
        )
    keep = [p for p in keep if p not in orphans]
    return PriceTable(keep, table.filename), dropped, flagged


def refresh(
    provider: str,
    regions: list[str],
    out: str,
    catalog: Catalog,
    source: PriceSource,
    known: Sequence[str] = (),
) -> Report:
    """Pull, vet, check and write a price file (atomically; nothing on failure).

    Raises:
        PriceSourceError: the source failed, or a region answered no price (with close names).
        PriceFileError: the file cannot be written.
    """
    table = source.fetch(regions)
    vetted, dropped, flagged = vet(table, catalog)
    priced = {p.region for p in vetted.rows}
    missing = [r for r in regions if r not in priced]
    if missing:
        pool = [*known, *sorted({i.region for i in catalog.instances if i.provider == provider})]
        raise unknown_regions_error(
            provider, missing, pool, ", ".join(sorted({p.source for p in table.rows}) or [provider])
        )
    try:
        apply_prices(catalog, vetted)
    except PriceFileError as err:
        raise PriceSourceError(
            f"the prices read cannot be used: {err}; nothing was written", ErrorKind.INTERNAL
        ) from None
    vetted.write_atomic(out, catalog)
    return Report(provider, regions, out, vetted, dropped, flagged)


def cmd_refresh(
    args: argparse.Namespace, make: Callable[[str, Catalog, Progress], PriceSource] = make_source
) -> int:
    """``gpuscaler catalog refresh``."""
    catalog = load_catalog()
    known = known_regions(args.provider)
    regions = parse_regions(args.regions, args.provider, catalog, known)

    def progress(line: str) -> None:
        print(f"refresh: {line}", file=sys.stderr, flush=True)

    report = refresh(args.provider, regions, args.out, catalog, make(args.provider, catalog, progress), known)
    for line in report.dropped:
        print(f"refresh: dropped {line}", file=sys.stderr)
    for line in report.flagged:
        print(f"refresh: {line}", file=sys.stderr)
    data = report.to_dict()
    if args.json:
        print(to_json(data))
    else:
        print(
            f"wrote {data['onDemandPrices']} on-demand and {data['spotPrices']} spot prices"
            + (f" ({data['zones']} zones)" if data["zones"] else "")
            + f" of {data['instanceTypes']} {args.provider} instance types in {', '.join(regions)} to {args.out}, "
            f"read {data['priceDate']} from {', '.join(data['sources'])}; plan on them with --prices {args.out}"
        )
    return 0
