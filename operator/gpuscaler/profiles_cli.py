"""``gpuscaler profiles list|show|export|import|prune``: the cluster's PerformanceProfiles.

Registered by :mod:`gpuscaler.cli` (``EXTENSIONS``) through :func:`register`. Talks to the API
server as the other cluster commands do (``KUBECONFIG``, else in-cluster;
:class:`gpuscaler.kube.profiles.Profiles`), with the caller's own RBAC: reading needs ``get, list``
on ``performanceprofiles``; ``import`` and ``prune`` write, which a platform team grants on purpose
(the operator is their only writer otherwise). ``export`` writes a ``List`` of the objects (YAML or
JSON) that ``import`` and ``gpuscaler plan --profiles FILE`` read. Exit codes: 0 done, 2 a bad
file, an unknown profile or the API server refused or was not reached (the message says which).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuscaler.errors import GpuscalerError
from gpuscaler.inputs import InputError, output_file, positive_float, positive_int, to_json
from gpuscaler.planner.profile_docs import (
    dump_profiles,
    from_document,
    load_profiles,
    profile_name,
    to_document,
)
from gpuscaler.planner.profiles import Profile, ProfileStore

TABLE_COLUMNS = ("NAMESPACE", "NAME", "WORKLOAD", "CONFIGURATION", "THROUGHPUT", "P10-P90", "RUNS", "LAST SEEN")


def _client() -> Any:
    from kubernetes.config.config_exception import ConfigException

    from gpuscaler.kube.client import load_config
    from gpuscaler.kube.profiles import Profiles

    try:
        return Profiles(load_config())
    except (ConfigException, FileNotFoundError) as err:
        raise InputError(f"profiles: no cluster to talk to: {err} (set KUBECONFIG)") from None


def _profiles(args: argparse.Namespace) -> list[tuple[str, str, Profile]]:
    """(namespace, name, profile) of every valid profile in scope; invalid ones are reported on stderr."""
    out = []
    for body in _client().list(None if args.all_namespaces else args.namespace):
        meta = body.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            out.append((ns, name, from_document(body, f"PerformanceProfile {ns}/{name}")))
        except GpuscalerError as err:
            print(f"gpuscaler: skipped: {err}", file=sys.stderr)
    return sorted(out, key=lambda t: (t[0], t[2].workload, t[2].key))


def _row(ns: str, name: str, p: Profile) -> list[str]:
    s = p.log_sigma()
    k = p.key
    return [
        ns, name, p.workload, k.describe(), f"{p.throughput:,.1f} {p.unit}/s",
        f"{p.throughput * _exp(-s):,.0f}-{p.throughput * _exp(s):,.0f}", str(p.runs),
        p.last_seen.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
    ]  # fmt: skip


def _exp(s: float) -> float:
    import math

    from gpuscaler.perfmodel.uncertainty import Z90

    return math.exp(Z90 * s)


def _summary(ns: str, name: str, p: Profile) -> dict[str, Any]:
    d = to_document(p, ns)
    d["metadata"]["name"] = name
    s = p.log_sigma()
    d["throughputP10"] = p.throughput / _exp(s)
    d["throughputP90"] = p.throughput * _exp(s)
    d["source"] = p.source()
    return d


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [list(TABLE_COLUMNS), *rows]) for i in range(len(TABLE_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [list(TABLE_COLUMNS), *rows])


def cmd_list(args: argparse.Namespace) -> int:
    found = _profiles(args)
    if args.json:
        print(to_json([_summary(ns, name, p) for ns, name, p in found]))
    elif not found:
        where = "any namespace" if args.all_namespaces else f"namespace {args.namespace}"
        print(f"no PerformanceProfiles in {where}")
    else:
        print(_table([_row(ns, name, p) for ns, name, p in found]))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    body = _client().get(args.namespace, args.name)
    if body is None:
        raise InputError(
            f"profiles show: no PerformanceProfile {args.name!r} in namespace {args.namespace} "
            "(gpuscaler profiles list -A lists them)",
            field="name",
            value=args.name,
        )
    p = from_document(body, f"PerformanceProfile {args.namespace}/{args.name}")
    d = _summary(args.namespace, args.name, p)
    if args.json:
        print(to_json(d))
        return 0
    k = p.key
    print(f"PerformanceProfile {args.namespace}/{args.name}: {p.workload} on {k.describe()}")
    print(f"  signature  {k.signature}  {p.shape}")
    print(f"  throughput {p.throughput:,.1f} {p.unit}/s, P10-P90 {d['throughputP10']:,.1f}-{d['throughputP90']:,.1f} "
          f"(spread {p.log_sigma():.3f}; {p.source()})")
    print(f"  model      {p.model_throughput:,.1f} {p.unit}/s: measured/model {p.factor:.3f}")
    print(f"  last seen  {p.last_seen.astimezone(UTC).isoformat()} on {p.instance_type or '?'}; jobs {', '.join(p.jobs) or '-'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    found = [t for t in _profiles(args) if args.workload is None or t[2].workload == args.workload]
    text = dump_profiles([to_document(p, None if args.strip_namespace else ns) for ns, _, p in found], args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"exported {len(found)} profile(s) to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from gpuscaler.kube.profiles import Profiles

    profiles = load_profiles(args.file)
    raw_ns = [None] * len(profiles)
    if args.namespace is None:  # each document's own namespace, else default
        from gpuscaler.inputs import load_yaml_all
        from gpuscaler.planner.profile_docs import MAX_PROFILE_FILE_BYTES, documents

        docs = documents(load_yaml_all(args.file, "profile file", MAX_PROFILE_FILE_BYTES), args.file)
        raw_ns = [((d.get("metadata") or {}).get("namespace")) for d in docs]
    api: Profiles = _client()
    created = replaced = 0
    for p, doc_ns in zip(profiles, raw_ns, strict=True):
        ns = args.namespace or doc_ns or "default"
        name = profile_name(p.key, p.workload)
        have = api.get(ns, name)
        version = str((have.get("metadata") or {}).get("resourceVersion")) if have else None
        api.put(ns, to_document(p, ns), version)
        created += have is None
        replaced += have is not None
    print(f"imported {len(profiles)} profile(s): {created} created, {replaced} replaced")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from gpuscaler.settings import Settings

    s = Settings()
    ttl = timedelta(days=args.ttl_days if args.ttl_days is not None else s.profiles_ttl_days)
    cap = args.per_workload or s.profiles_per_workload
    found = _profiles(args)
    now = datetime.now(UTC)
    gone: list[tuple[str, str, Profile, str]] = []
    by_ns: dict[str, list[tuple[str, Profile]]] = {}
    for ns, name, p in found:
        by_ns.setdefault(ns, []).append((name, p))
    for ns, items in by_ns.items():
        store = ProfileStore(ttl=ttl, cap_per_workload=cap)
        names = {p.key: name for name, p in items}
        for name, p in sorted(items, key=lambda t: t[1].last_seen):
            if now - p.last_seen > ttl:
                gone.append((ns, name, p, f"not seen for {(now - p.last_seen).days} days"))
                continue
            gone += [(ns, names[e.key], e, f"over {cap} per workload") for e in store.put(p)]
    api = _client() if gone and not args.dry_run else None
    for ns, name, p, why in gone:
        if api is not None:
            api.delete(ns, name)
        print(f"{'would delete' if args.dry_run else 'deleted'} {ns}/{name} ({p.workload} on {p.key.describe()}): {why}")
    print(f"{len(gone)} of {len(found)} profile(s) {'to prune' if args.dry_run else 'pruned'}")
    return 0


def _scope(p: argparse.ArgumentParser, default: str | None = "default") -> None:
    p.add_argument("-n", "--namespace", default=default, help=f"namespace (default: {default or 'each document'})")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")


def register(sub: Any) -> None:
    """Add ``profiles`` to the ``gpuscaler`` subcommands."""
    top = sub.add_parser("profiles", help="performance profiles the cluster measured (list, show, export, import, prune)")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="the profiles of a namespace (or all) with their throughput band and runs")
    _scope(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    sh = verbs.add_parser("show", help="one profile")
    sh.add_argument("name")
    sh.add_argument("-n", "--namespace", default="default")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)
    ex = verbs.add_parser("export", help="write the profiles as a List (YAML or JSON) for import or plan --profiles")
    _scope(ex)
    ex.add_argument("-o", "--output", type=output_file, help="file to write (default: stdout)")
    ex.add_argument("--format", choices=("yaml", "json"), default="yaml")
    ex.add_argument("--workload", help="only this workload id")
    ex.add_argument("--strip-namespace", action="store_true", help="leave the namespace out (import decides)")
    ex.set_defaults(func=cmd_export)
    im = verbs.add_parser("import", help="create or replace the profiles of a file (gpuscaler profiles export)")
    im.add_argument("file")
    im.add_argument("-n", "--namespace", default=None, help="namespace (default: each document's, else default)")
    im.set_defaults(func=cmd_import)
    pr = verbs.add_parser("prune", help="delete profiles past the TTL or the cap per workload")
    _scope(pr)
    pr.add_argument("--ttl-days", type=positive_float, help="days (default: GPUSCALER_PROFILES_TTL_DAYS)")
    pr.add_argument("--per-workload", type=positive_int, help="cap (default: GPUSCALER_PROFILES_PER_WORKLOAD)")
    pr.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    pr.set_defaults(func=cmd_prune)
