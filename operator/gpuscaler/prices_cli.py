"""The command line's price options: ``--prices FILE`` of ``plan``, ``estimate`` and ``catalog
instances``, the price columns of ``catalog instances``, the prices of an ``estimate``, and
``gpuscaler catalog refresh`` (:mod:`gpuscaler.cloud.pricing.refresh`), wired from :mod:`gpuscaler.cli`.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuscaler.catalog import CapacityType, Catalog, InstanceType, load_catalog
from gpuscaler.catalog.prices import age_days, is_stale, price_note, priced_catalog
from gpuscaler.inputs import output_file

__all__ = [
    "add_prices_option",
    "age_label",
    "catalog_for",
    "estimate_prices",
    "instance_price_fields",
    "price_note",
    "register_refresh",
    "render_estimate_prices",
    "source_label",
]


def add_prices_option(parser: argparse.ArgumentParser) -> None:
    """``--prices FILE``: plan on a price file instead of the shipped prices."""
    parser.add_argument(
        "--prices",
        metavar="FILE",
        help="price file to use instead of the shipped prices (`gpuscaler catalog refresh --out FILE` writes one)",
    )


def catalog_for(args: argparse.Namespace) -> Catalog:
    """The shipped catalog, re-priced by ``--prices`` when the command has it and it is given."""
    return priced_catalog(getattr(args, "prices", None), load_catalog())


def source_label(inst: InstanceType) -> str:
    """Where an instance type's prices came from: one source, or ``on-demand-source / spot-source``."""
    if inst.spot_usd_hr is None or inst.spot_source == inst.ondemand_source:
        return inst.ondemand_source
    return f"{inst.ondemand_source} / {inst.spot_source}"


def age_label(inst: InstanceType) -> str:
    """Age in days of an instance type's oldest price (``?`` for an undated one)."""
    ages = [age_days(inst.price_date_of(c)) for c in CapacityType if inst.price(c) is not None]
    return "?" if None in ages else f"{max(a for a in ages if a is not None)} d"


def instance_price_fields(inst: InstanceType) -> dict[str, Any]:
    """The price provenance of ``catalog instances --json`` beside the instance's own fields."""
    return {
        "ondemand_age_days": age_days(inst.price_date),
        "spot_age_days": age_days(inst.price_date_of(CapacityType.SPOT)) if inst.spot_usd_hr else None,
    }


def estimate_prices(
    catalog: Catalog, gpu_id: str, per_node: int, nodes: int, throughput: float
) -> list[dict[str, Any]]:
    """What an estimated configuration costs on each instance type that has ``per_node`` of the GPU.

    ``usdPerHour = nodes x price``, ``usdPerMillion = usdPerHour / (3600 x throughput) x 10^6`` (per
    million throughput units), for each priced capacity type.
    """
    out: list[dict[str, Any]] = []
    for inst in catalog.instances:
        if inst.gpu_id != gpu_id or inst.gpu_count != per_node:
            continue
        for cap in CapacityType:
            price = inst.price(cap)
            if price is None:
                continue
            hourly = price * nodes
            out.append({
                "instanceType": inst.name,
                "region": inst.region,
                "capacityType": cap.value,
                "usdPerHour": round(hourly, 4),
                "usdPerMillion": round(hourly / (3600 * throughput) * 1e6, 4) if throughput > 0 else None,
                "priceSource": inst.price_source(cap),
                "priceDate": inst.price_date_of(cap),
                "priceFlagged": cap is CapacityType.SPOT and inst.spot_price_suspect,
            })  # fmt: skip
    return out


def render_estimate_prices(rows: list[dict[str, Any]], unit: str) -> str:
    """The text lines of :func:`estimate_prices`: the cheapest on-demand and unflagged spot offer."""
    lines = []
    stale = False
    for cap in CapacityType:
        offers = [r for r in rows if r["capacityType"] == cap.value and not r["priceFlagged"]]
        if not offers:
            continue
        best = min(offers, key=lambda r: r["usdPerHour"])
        per = (
            f", ${best['usdPerMillion']:,.4f} per million {unit}" if best["usdPerMillion"] is not None else ""
        )
        lines.append(
            f"  {cap.value} on {best['instanceType']} ({best['region']}): ${best['usdPerHour']:,.2f}/h{per}; "
            f"price {price_note(best['priceSource'], best['priceDate'], hint=False)}"
        )
        stale = stale or is_stale(best["priceDate"])
    if stale:
        lines.append("  prices are stale: `gpuscaler catalog refresh` reads today's; estimate with --prices FILE")
    return "\n".join(lines)


def register_refresh(catalog_commands: Any) -> None:
    """Add ``gpuscaler catalog refresh`` under ``gpuscaler catalog``."""
    from gpuscaler.cloud.pricing.refresh import PROVIDERS

    sr = catalog_commands.add_parser(
        "refresh",
        help="read today's prices from a cloud's price API into a price file (see docs/prices.md)",
        description="Read today's on-demand and spot prices of the catalog's instance types from a cloud's "
        "price API (aws: Pricing API + EC2 spot price history, needs IAM pricing:GetProducts and "
        "ec2:DescribeSpotPriceHistory; azure: the public Retail Prices API; gcp: the Cloud Billing Catalog "
        "API, needs GPUSCALER_GCP_API_KEY or GPUSCALER_GCP_ACCESS_TOKEN) and write them atomically to a "
        "price file for --prices. Nothing is written on failure.",
    )
    sr.add_argument("--provider", required=True, choices=PROVIDERS, help="the cloud whose prices to read")
    sr.add_argument(
        "--regions", metavar="R1,R2", help="regions to price (default: the catalog's regions of that cloud)"
    )
    sr.add_argument("--out", required=True, metavar="FILE", type=output_file, help="price file to write")
    sr.add_argument("--json", action="store_true", help="print a JSON summary")
    sr.set_defaults(func=_cmd_refresh)


def _cmd_refresh(args: argparse.Namespace) -> int:
    from gpuscaler.cloud.pricing.refresh import cmd_refresh

    return cmd_refresh(args)
