"""``gpuscaler policy check FILE``: validate a policy file and print what it would allow.

Registered by ``gpuscaler.cli`` through :func:`register`. Exit codes: 0 valid, 2 invalid (each
broken field printed with its value), the same as the rest of the CLI: errors are raised and
:func:`gpuscaler.cli.main` prints them (as a JSON error object under ``--json``). Pure: imports
neither kopf nor a Kubernetes client (this package is a pure layer, enforced by import-linter).
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any

from pydantic import ValidationError

from gpuscaler.catalog import CapacityType, Catalog, InstanceType, UnknownIdError, load_catalog, normalize
from gpuscaler.catalog.zones import unknown_zone
from gpuscaler.inputs import first_field, format_validation, namespace_name, shown, to_json
from gpuscaler.policy.evaluate import policy_for_namespace
from gpuscaler.policy.models import Policy, PolicyFileError, load_policies


def _close(value: str, known: list[str]) -> str:
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else ""


def _unknown_instance_types(policy: Policy, catalog: Catalog) -> list[str]:
    """Errors for the instance types the policy names (allow list, price overrides, held capacity)
    that the catalog does not know, each with the closest names it does."""
    names = {normalize(i.name): i.name for i in catalog.instances}

    def instance(t: str) -> str:
        close = difflib.get_close_matches(normalize(t), list(names), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(names[c] for c in close)}?" if close else ""
        return f"unknown instance type {shown(t)}{hint}"

    named = [(f"allowedInstanceTypes.{i}", t) for i, t in enumerate(policy.allowed_instance_types)]
    named += [
        (f"priceOverrides.{i}.instanceType", o.instance_type)
        for i, o in enumerate(policy.price_overrides)
        if o.instance_type != "*"
    ]
    named += [(f"capacity.{i}.instanceType", pool.instance_type) for i, pool in enumerate(policy.capacity)]
    return [f"{where}: {instance(t)}" for where, t in named if normalize(t) not in names]


def unknown_ids(policy: Policy, catalog: Catalog) -> list[str]:
    """Errors for GPU types, instance types, providers, regions or zones the catalog does not know."""
    errors = []
    for i, g in enumerate(policy.allowed_gpu_types):
        try:
            catalog.gpu(g)
        except UnknownIdError as err:
            errors.append(f"allowedGpuTypes.{i}: {err.args[0] if err.args else g}")
    errors += _unknown_instance_types(policy, catalog)
    providers = sorted({i.provider for i in catalog.instances})
    for i, p in enumerate(policy.providers):
        if p not in providers:
            errors.append(f"providers.{i}: unknown provider {shown(p)}{_close(p, providers)} (known: {', '.join(providers)})")
    regions = sorted({i.region for i in catalog.instances})
    for i, r in enumerate(policy.regions):
        if r not in regions:
            errors.append(
                f"regions.{i}: no instance type in region {shown(r)}{_close(r, regions)} (known: {', '.join(regions)})"
            )
    for i, z in enumerate(policy.zones):
        if (problem := unknown_zone(z, catalog.instances)) is not None:
            errors.append(f"zones.{i}: {problem}")
    return errors


def allowed_instances(policy: Policy, catalog: Catalog) -> list[tuple[InstanceType, float, float | None]]:
    """Instance types the policy allows, with on-demand and spot prices after overrides.

    Spot is None where the instance has no spot price or the policy never allows spot. The same
    filters as the planner's ``offerings`` stage (its policy half).
    """
    gpu_ids = {catalog.gpu(g).id for g in policy.allowed_gpu_types}
    types = {normalize(t) for t in policy.allowed_instance_types}
    out = []
    for inst in catalog.instances:
        if gpu_ids and inst.gpu_id not in gpu_ids:
            continue
        if types and normalize(inst.name) not in types:
            continue
        if policy.providers and inst.provider not in policy.providers:
            continue
        if policy.regions and inst.region not in policy.regions:
            continue
        on_demand = policy.price(inst, CapacityType.ON_DEMAND)
        if on_demand is None:
            continue
        spot = None if policy.spot.mode == "never" else policy.price(inst, CapacityType.SPOT)
        out.append((inst, on_demand, spot))
    return out


def describe(policy: Policy, catalog: Catalog) -> dict[str, Any]:
    """What a policy allows, as plain data (what ``policy check --json`` prints)."""
    insts = allowed_instances(policy, catalog)
    return {
        "name": policy.name,
        "namespaces": policy.namespaces or ["*"],
        "gpuTypes": sorted({i.gpu_id for i, _, _ in insts}),
        "instanceTypes": [
            {
                "name": i.name,
                "provider": i.provider,
                "region": i.region,
                "gpus": f"{i.gpu_count} x {i.gpu_id}",
                "onDemandUsdHr": round(od, 4),
                "spotUsdHr": round(sp, 4) if sp is not None else None,
                "catalogOnDemandUsdHr": i.ondemand_usd_hr,
            }
            for i, od, sp in insts
        ],
        "caps": {
            "maxGpusPerJob": policy.max_gpus_per_job,
            "maxGpusPerNamespace": policy.max_gpus_per_namespace,
            "maxUsdPerHour": policy.max_usd_per_hour,
            "maxUsdPerJob": policy.max_usd_per_job,
            "maxUsdPerMonth": policy.max_usd_per_month,
        },
        "spot": policy.spot.model_dump(by_alias=True),
        "checkpointIntervalS": [policy.min_checkpoint_interval_s, policy.max_checkpoint_interval_s],
        "allowedPrecisions": policy.allowed_precisions or ["any"],
        "defaultPrecisions": policy.default_precisions or ["planner default"],
    }


def _render(d: dict[str, Any]) -> str:
    def cap(v: Any, money: bool = False) -> str:
        if v is None:
            return "none"
        return f"${v:,.2f}" if money else str(v)

    c = d["caps"]
    lines = [
        f"Policy {d['name']} (namespaces: {', '.join(d['namespaces'])})",
        f"  GPU types: {', '.join(d['gpuTypes']) or 'none'}",
        f"  caps: {cap(c['maxGpusPerJob'])} GPUs/job, {cap(c['maxGpusPerNamespace'])} GPUs/namespace, "
        f"{cap(c['maxUsdPerHour'], True)}/h per job, {cap(c['maxUsdPerJob'], True)}/job, "
        f"{cap(c['maxUsdPerMonth'], True)}/month per namespace",
        "  spot: never (on-demand only)"
        if d["spot"]["mode"] == "never"
        else f"  spot: {d['spot']['mode']}, on-demand after {d['spot']['maxInterruptions']} interruptions, "
        f"on-demand only within {d['spot']['minHoursToDeadline']:g} h of the deadline",
        f"  checkpoint interval: {d['checkpointIntervalS'][0]}..{d['checkpointIntervalS'][1]} s",
        f"  precisions: {', '.join(d['allowedPrecisions'])}; default {', '.join(d['defaultPrecisions'])}",
        f"  instance types ({len(d['instanceTypes'])}), $/h after overrides:",
    ]
    rows = [["instance", "cloud", "region", "GPUs", "on-demand", "spot", "catalog on-demand"]]
    for i in d["instanceTypes"]:
        rows.append(
            [
                i["name"],
                i["provider"],
                i["region"],
                i["gpus"],
                f"{i['onDemandUsdHr']:.3f}",
                f"{i['spotUsdHr']:.3f}" if i["spotUsdHr"] is not None else "-",
                f"{i['catalogOnDemandUsdHr']:.3f}",
            ]
        )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines += ["    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    """Validate FILE; print each policy (or the merged one for --namespace).

    Raises:
        PolicyFileError: the file cannot be read, breaks the schema or names unknown types, providers
            or regions (exit 2, printed by the CLI's ``main``).
        PolicyConflictError: the namespace's policies contradict each other.
    """
    try:
        policies = load_policies(args.file)
    except ValidationError as err:
        loc, value = first_field(err)
        raise PolicyFileError(format_validation(err, f"policy {args.file}"), field=loc, value=value) from None
    catalog = load_catalog()
    errors = [f"policy {p.name}: {e}" for p in policies for e in unknown_ids(p, catalog)]
    if errors:
        raise PolicyFileError(f"{args.file} is invalid:\n  " + "\n  ".join(errors))
    if args.namespace is not None:
        policies = [policy_for_namespace(policies, args.namespace)]
    described = [describe(p, catalog) for p in policies]
    if args.json:
        print(to_json(described if len(described) > 1 else described[0]))
    else:
        print(f"{args.file}: valid, {len(policies)} polic{'y' if len(policies) == 1 else 'ies'}\n")
        print("\n\n".join(_render(d) for d in described))
    return 0


def register(subparsers: Any) -> None:
    """Add ``policy check`` to the ``gpuscaler`` command line."""
    sp = subparsers.add_parser("policy", help="platform policies: check a policy file")
    sub = sp.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    sc = sub.add_parser(
        "check", help="validate a policy file and print what it allows (GPU and instance types, prices, caps)"
    )
    sc.add_argument("file", help="policy YAML: plain policies or GPUScalingPolicy documents, one or more")
    sc.add_argument("--namespace", type=namespace_name, help="print the merged policy in force for this namespace")
    sc.add_argument("--json", action="store_true", help="print JSON instead of text")
    sc.set_defaults(func=cmd_check)
