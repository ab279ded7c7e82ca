"""``gpuscaler catalog capacity`` and the segments of a plan in ``gpuscaler plan``.

``catalog capacity`` lists the held capacity (docs/capacity.md) a policy file declares
(``--policy FILE [--namespace NS]``: the pools the planner plans into, at what the team pays at
the margin) and what an AWS account holds (``--aws-region R``: EC2 capacity reservations and
capacity blocks, read by :func:`gpuscaler.cloud.capacity.read_aws`); ``--as-policy`` prints the
cloud's pools as a policy's ``capacity`` list to paste, ``--json`` as JSON. Registered from
:mod:`gpuscaler.cli` in two lines; :func:`segment_lines` is what ``plan`` prints under a
segmented plan.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

import yaml

from gpuscaler.inputs import to_json
from gpuscaler.planner.candidate import Candidate
from gpuscaler.policy.capacity import HeldCapacity


def segment_lines(c: Candidate, planned_at: datetime | None = None) -> list[str]:
    """The lines ``plan`` prints under a segmented plan: each stretch, and the planned checkpoint."""
    out = []
    for i, seg in enumerate(c.segments, 1):
        line = (
            f"  segment {i}: {seg.label} from +{seg.start_h:.2f} h for {seg.hours:.2f} h, "
            f"{seg.samples:,.0f} samples, ${seg.cost_usd:,.2f}"
        )
        if seg.checkpoint_at_h is not None:
            line += f"; checkpoint at +{seg.checkpoint_at_h:.2f} h ({seg.margin_s:.0f} s before the window closes), then move"
        out.append(line)
    return out


def _window(p: HeldCapacity) -> str:
    if p.type == "flexStart" and p.start_delay is not None:
        d = p.start_delay
        return f"starts after P50 {d.p50_minutes:g} / P90 {d.p90_minutes:g} min, runs <= {p.max_run_hours:g} h"
    if p.start is not None and p.end is not None:
        return f"{p.start:%Y-%m-%d %H:%M} - {p.end:%Y-%m-%d %H:%M} UTC"
    return f"until {p.end:%Y-%m-%d %H:%M} UTC" if p.end is not None else "no expiry"


def _price(p: HeldCapacity) -> str:
    if p.usd_per_hour is not None:
        return f"${p.usd_per_hour:,.2f}"
    return "on-demand" if p.type == "flexStart" else "$0.00 (prepaid)"


def cmd_capacity(args: argparse.Namespace) -> int:
    """List held capacity from a policy file and/or an AWS account."""
    from gpuscaler.cli import UsageError, _load_policy, _table

    if not args.policy and not args.aws_region:
        raise UsageError("catalog capacity: give --policy FILE (what a policy declares) or --aws-region REGION (what EC2 holds)")
    rows: list[tuple[str, HeldCapacity, str]] = []
    pol = _load_policy(args.policy, args.namespace)
    if pol is not None:
        rows += [(f"policy {pol.name}", p, "") for p in pol.capacity]
    if args.aws_region:
        import boto3

        from gpuscaler.cloud.capacity import read_aws

        found = read_aws(boto3.client("ec2", region_name=args.aws_region))
        rows += [(f"aws {args.aws_region} ({c.state})", c.pool, str(c.available)) for c in found]
    if args.as_policy:
        pools = [p.model_dump(mode="json", by_alias=True, exclude_defaults=True) for _, p, _ in rows]
        print(yaml.safe_dump({"capacity": pools}, sort_keys=False).rstrip())
        return 0
    if args.json:
        items: list[dict[str, Any]] = [
            {**p.model_dump(mode="json", by_alias=True), "source": src, "cloudAvailable": int(free) if free else None}
            for src, p, free in rows
        ]
        print(to_json({"capacity": items}))
        return 0
    if not rows:
        print("no held capacity: the policy declares none" + (" and EC2 reports none" if args.aws_region else ""))
        return 0
    headers = ["name", "type", "instance", "zone", "nodes", "free (cloud)", "$/node-h at margin", "window", "id", "source"]
    table = [
        [p.name, p.type, p.instance_type, p.zone or "-", p.count, free or "-", _price(p), _window(p), p.reservation_id or "-", src]
        for src, p, free in rows
    ]
    print(_table(headers, table))
    return 0


def register_catalog(catalog_commands: Any) -> None:
    """Add ``capacity`` to ``gpuscaler catalog``'s subcommands."""
    sc = catalog_commands.add_parser("capacity", help="list held capacity: a policy's reservations, blocks, flex-start; EC2's")
    sc.add_argument("--policy", help="policy YAML whose capacity to list")
    sc.add_argument("--namespace", help="the namespace whose merged policy to list (with --policy)")
    sc.add_argument("--aws-region", help="also read EC2 capacity reservations and capacity blocks in this region")
    sc.add_argument("--json", action="store_true", help="print JSON ({capacity: [...]})")
    sc.add_argument("--as-policy", action="store_true", help="print the pools as a policy's capacity list (YAML)")
    sc.set_defaults(func=cmd_capacity)
