"""Applying policies to a job: merge the policies in force for a namespace, and list violations.

The planner filters offerings by a policy's allow lists and spot rules, and candidates by its
spending caps through the cap rules here. What it cannot see
is a request that no candidate could ever satisfy because it contradicts a policy outright (a job
asking for 16 GPUs where 8 is the most), and namespace-wide budgets, which depend on what else runs.
This module answers those, with the rule name and the values, so the operator can set a
``PolicyViolation`` condition and provision nothing:

- :func:`policy_for_namespace` merges cluster-wide and per-namespace policies into one ``Policy``;
- :func:`check_job` checks a TrainingJob spec (the camelCase mapping, as kopf hands it over)
  against a policy and the namespace's usage, before planning;
- :func:`check_plan` checks a chosen plan's GPUs and cost against the caps, after planning, with
  the cap rules the planner uses (:data:`MAX_USD_PER_JOB`, :data:`MAX_USD_PER_HOUR`), so each
  cap is checked in one place;
- :func:`effective_precisions` fills in the policy's default precisions for a job that names none.

Pure: no Kubernetes client; the operator gathers :class:`NamespaceUsage` itself.
Callers: the operator's TrainingJob handlers, ``gpuscaler policy check --namespace``, tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscaler.catalog.loader import Catalog, UnknownIdError, load_catalog, normalize
from gpuscaler.errors import InvalidInputError
from gpuscaler.policy.models import Policy, SpotRules

SPOT_ORDER = ("never", "allowed", "preferred")
"""Spot modes from strictest to most permissive (used when two policies at one level disagree)."""

_ALLOW_LISTS = ("allowed_gpu_types", "allowed_instance_types", "providers", "regions", "zones", "allowed_precisions")
_LOWEST = (
    "max_gpus_per_job",
    "max_gpus_per_namespace",
    "max_usd_per_hour",
    "max_usd_per_job",
    "max_usd_per_month",
    "max_checkpoint_interval_s",
    "checkpoint_write_gbps",
)


class PolicyConflictError(InvalidInputError, ValueError):
    """Two policies at the same level leave nothing allowed (e.g. disjoint allowedGpuTypes)."""


@dataclass(frozen=True)
class Violation:
    """A rule a job or plan breaks: which rule of which policy, the job's value and the limit."""

    rule: str
    """The policy field, camelCase as in the policy file: ``maxGpusPerJob``, ``maxUsdPerMonth``."""
    policy: str
    """Name of the (merged) policy."""
    field: str
    """What in the job breaks it: ``spec.constraints.minGpus``, ``plan.gpus``, ``namespace.gpus``."""
    value: Any
    """The job's (or namespace's) value."""
    limit: Any
    """The policy's limit."""
    message: str
    """One sentence for a condition message or an event."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "policy": self.policy,
            "field": self.field,
            "value": self.value,
            "limit": self.limit,
            "message": self.message,
        }


@dataclass(frozen=True)
class NamespaceUsage:
    """What a namespace already holds, gathered by the operator from its other TrainingJobs."""

    gpus: int = 0
    """GPUs held by the namespace's other active jobs."""
    usd_this_month: float = 0.0
    """Spend of the namespace's jobs this calendar month (costUsd of jobs active or finished in it)."""
    held_nodes: Mapping[str, int] = field(default_factory=dict)
    """Nodes of each held capacity pool (a policy's ``capacity``) other active jobs hold, in every namespace."""


# ------------------------------------------------------------------------------------------ merge


def _fields_set(p: Policy) -> set[str]:
    return set(p.model_fields_set) - {"name", "namespaces"}


def _intersect(name: str, lists: Sequence[tuple[str, list[str]]]) -> list[str]:
    """Intersection of the non-empty allow lists (case/punctuation-insensitive), in first-list order."""
    nonempty = [(who, xs) for who, xs in lists if xs]
    if not nonempty:
        return []
    result = list(nonempty[0][1])
    for _who, xs in nonempty[1:]:
        keys = {normalize(x) for x in xs}
        result = [x for x in result if normalize(x) in keys]
    if not result:
        who = ", ".join(f"{w} {xs}" for w, xs in nonempty)
        raise PolicyConflictError(
            f"{name}: the policies {who} have nothing in common; nothing would be allowed"
        )
    return result


def _strictest(policies: Sequence[Policy]) -> tuple[dict[str, Any], set[str], set[str]]:
    """Combine policies of one level: lowest caps, intersected allow lists, strictest spot rules.

    Returns the combined values of the fields any of them set, those field names, and the spot
    sub-fields any of them set.
    """
    fields: set[str] = set().union(*(_fields_set(p) for p in policies))
    spot_fields: set[str] = set().union(
        *(p.spot.model_fields_set for p in policies if "spot" in _fields_set(p))
    )
    out: dict[str, Any] = {}
    setters = {f: [p for p in policies if f in _fields_set(p)] for f in fields}
    for f in fields:
        ps = setters[f]
        if f in _ALLOW_LISTS or f == "default_precisions":
            out[f] = _intersect(f, [(p.name, getattr(p, f)) for p in ps])
        elif f in _LOWEST:
            values = [getattr(p, f) for p in ps if getattr(p, f) is not None]
            out[f] = min(values) if values else None
        elif f == "min_checkpoint_interval_s":
            out[f] = max(p.min_checkpoint_interval_s for p in ps)
        elif f == "allow_trials":  # one policy's "no" is the level's
            out[f] = all(p.allow_trials for p in ps)
        elif f == "price_overrides":
            out[f] = [o for p in ps for o in p.price_overrides]
        elif f == "capacity":  # held capacity adds up: every pool declared at this level (names unique)
            pools = [c for p in ps for c in p.capacity]
            seen = [c.name for c in pools]
            twice = sorted({n for n in seen if seen.count(n) > 1})
            if twice:
                raise PolicyConflictError(
                    f"capacity {', '.join(twice)} is declared by several policies "
                    f"({', '.join(p.name for p in ps)}): give each pool one name"
                )
            out[f] = pools
        elif f == "spot":
            spot_setters = [p.spot for p in ps]
            out[f] = {
                "mode": min(
                    (s.mode for s in spot_setters if "mode" in s.model_fields_set),
                    key=SPOT_ORDER.index,
                    default="allowed",
                ),
                "max_interruptions": min(
                    (s.max_interruptions for s in spot_setters if "max_interruptions" in s.model_fields_set),
                    default=3,
                ),
                "min_hours_to_deadline": max(
                    (
                        s.min_hours_to_deadline
                        for s in spot_setters
                        if "min_hours_to_deadline" in s.model_fields_set
                    ),
                    default=0.0,
                ),
            }
        else:  # pragma: no cover - a new Policy field needs a rule here
            raise NotImplementedError(f"no merge rule for Policy.{f}")
    return out, fields, spot_fields


def policy_for_namespace(policies: Iterable[Policy], namespace: str | None) -> Policy:
    """The one policy in force for jobs in ``namespace``.

    Policies that do not apply (their ``namespaces`` do not match) are ignored. The rest are taken
    in two levels: cluster-wide policies (no ``namespaces``), then namespace policies. Within a level
    the strictest value of each field wins (lowest cap, intersection of allow lists, ``never`` over
    ``allowed`` over ``preferred``); a field a namespace policy sets replaces the cluster-wide value,
    so a platform team can give one namespace more (or less) than the default. Fields nobody sets
    keep the Policy defaults. The merged policy is named ``a+b`` after the policies it came from.

    Raises:
        PolicyConflictError: policies at one level leave an allow list empty.
    """
    applicable = [p for p in policies if p.applies_to(namespace)]
    if not applicable:
        return Policy()
    merged: dict[str, Any] = {}
    spot: dict[str, Any] = {}
    for level in ([p for p in applicable if not p.namespaces], [p for p in applicable if p.namespaces]):
        if not level:
            continue
        values, fields, spot_fields = _strictest(level)
        for f in fields - {"spot"}:
            merged[f] = values[f]
        if "spot" in fields:
            spot.update({k: v for k, v in values["spot"].items() if k in spot_fields})
    merged["spot"] = SpotRules(**spot)
    names = [p.name for p in applicable]
    merged["name"] = "+".join(dict.fromkeys(names))
    if namespace is not None and any(p.namespaces for p in applicable):
        merged["namespaces"] = [namespace]
    return Policy(**merged)


# ------------------------------------------------------------------------------------------ check


def _gpu_ids(names: Iterable[str], catalog: Catalog) -> set[str]:
    out = set()
    for n in names:
        try:
            out.add(catalog.gpu(n).id)
        except UnknownIdError:
            out.add(normalize(n))
    return out


def _disjoint(wanted: Iterable[str], allowed: Iterable[str]) -> bool:
    w = {normalize(x) for x in wanted}
    a = {normalize(x) for x in allowed}
    return bool(w) and bool(a) and not (w & a)


def check_job(
    spec: Mapping[str, Any],
    policy: Policy,
    usage: NamespaceUsage | None = None,
    catalog: Catalog | None = None,
) -> list[Violation]:
    """The policy rules a TrainingJob spec breaks before any planning (empty: none).

    Args:
        spec: the job's ``spec``, camelCase as on the wire (kopf's ``spec``, or
            ``TrainingJobSpec.model_dump(by_alias=True)``).
        policy: the policy in force (see :func:`policy_for_namespace`).
        usage: what the namespace already holds and spent; namespace caps are not checked without it.
        catalog: for GPU aliases; the shipped catalog by default.

    Returns:
        One :class:`Violation` per broken rule, in a stable order.
    """
    cat = catalog or load_catalog()
    c: Mapping[str, Any] = spec.get("constraints") or {}
    out: list[Violation] = []

    def add(rule: str, field: str, value: Any, limit: Any, message: str) -> None:
        out.append(Violation(rule, policy.name, field, value, limit, f"policy {policy.name}: {message}"))

    gpu_types = list(c.get("gpuTypes") or [])
    if gpu_types and policy.allowed_gpu_types:
        wanted, allowed = _gpu_ids(gpu_types, cat), _gpu_ids(policy.allowed_gpu_types, cat)
        if not wanted & allowed:
            add(
                "allowedGpuTypes",
                "spec.constraints.gpuTypes",
                gpu_types,
                policy.allowed_gpu_types,
                f"none of the GPU types {gpu_types} is allowed (allowedGpuTypes {policy.allowed_gpu_types})",
            )
    for key, rule, allowed_list in (
        ("instanceTypes", "allowedInstanceTypes", policy.allowed_instance_types),
        ("providers", "providers", policy.providers),
        ("regions", "regions", policy.regions),
        ("zones", "zones", policy.zones),
        ("precisions", "allowedPrecisions", policy.allowed_precisions),
    ):
        wanted_list = [str(x) for x in c.get(key) or []]
        if _disjoint(wanted_list, allowed_list):
            add(
                rule,
                f"spec.constraints.{key}",
                wanted_list,
                allowed_list,
                f"none of constraints.{key} {wanted_list} is allowed ({rule} {allowed_list})",
            )
    min_gpus = int(c.get("minGpus") or 1)
    if policy.max_gpus_per_job is not None and min_gpus > policy.max_gpus_per_job:
        add(
            "maxGpusPerJob",
            "spec.constraints.minGpus",
            min_gpus,
            policy.max_gpus_per_job,
            f"minGpus {min_gpus} > maxGpusPerJob {policy.max_gpus_per_job}",
        )
    interval = (spec.get("checkpoint") or {}).get("intervalSeconds")
    if interval is not None:
        lo, hi = policy.min_checkpoint_interval_s, policy.max_checkpoint_interval_s
        if not lo <= int(interval) <= hi:
            add(
                "minCheckpointIntervalS" if int(interval) < lo else "maxCheckpointIntervalS",
                "spec.checkpoint.intervalSeconds",
                int(interval),
                [lo, hi],
                f"checkpoint interval {interval} s outside the allowed {lo}..{hi} s",
            )
    if usage is not None:
        out.extend(_namespace_caps(policy, usage, min_gpus, 0.0, "spec.constraints.minGpus"))
    return out


@dataclass(frozen=True)
class CapRule:
    """A per-job spending cap of a policy: a plan's value at most the policy's cap.

    The one check of each such rule (:data:`MAX_USD_PER_JOB`, :data:`MAX_USD_PER_HOUR`): the
    planner's solve stage and :func:`check_plan` both call :meth:`violation`.
    """

    rule: str
    """The policy field, camelCase: ``maxUsdPerJob``."""
    field: str
    """The plan's value it bounds: ``plan.expectedCostUsd``."""
    cap: Callable[[Policy], float | None]
    """The policy's cap (None: uncapped)."""
    template: str
    """The message, ``str.format`` with ``name``, ``cap`` and ``value``."""

    def violation(self, policy: Policy, value: float) -> Violation | None:
        """The violation of the cap, None when kept or uncapped. The message is formatted only for
        a violation: the planner asks for every candidate."""
        cap = self.cap(policy)
        if cap is None or value <= cap:
            return None
        message = self.template.format(name=policy.name, cap=cap, value=value)
        return Violation(self.rule, policy.name, self.field, round(value, 2), cap, message)


MAX_USD_PER_JOB = CapRule(
    "maxUsdPerJob", "plan.expectedCostUsd", lambda p: p.max_usd_per_job,
    "policy {name}: maxUsdPerJob ${cap:,.0f} < ${value:,.0f}",
)  # fmt: skip
"""The ``maxUsdPerJob`` rule: a plan's expected cost at most the cap."""

MAX_USD_PER_HOUR = CapRule(
    "maxUsdPerHour", "plan.usdPerHour", lambda p: p.max_usd_per_hour,
    "policy {name}: maxUsdPerHour ${cap:,.2f} < ${value:,.2f}/h",
)  # fmt: skip
"""The ``maxUsdPerHour`` rule: a plan's price per hour (all nodes) at most the cap."""


def check_plan(
    gpus: int,
    usd_per_hour: float,
    expected_cost_usd: float,
    policy: Policy,
    usage: NamespaceUsage | None = None,
) -> list[Violation]:
    """The caps a chosen plan breaks (empty: none): per job, and per namespace given its usage.

    The planner keeps per-job caps with the same cap rules; this applies them again so that
    a plan made under an older policy is caught when the policy changes, and adds the namespace
    caps the planner cannot see.
    """
    out: list[Violation] = []
    if policy.max_gpus_per_job is not None and gpus > policy.max_gpus_per_job:
        out.append(
            Violation(
                "maxGpusPerJob", policy.name, "plan.gpus", gpus, policy.max_gpus_per_job,
                f"policy {policy.name}: {gpus} GPUs > maxGpusPerJob {policy.max_gpus_per_job}",
            )
        )  # fmt: skip
    for broken in (MAX_USD_PER_HOUR.violation(policy, usd_per_hour), MAX_USD_PER_JOB.violation(policy, expected_cost_usd)):
        if broken is not None:
            out.append(broken)
    if usage is not None:
        out.extend(_namespace_caps(policy, usage, gpus, expected_cost_usd, "plan.gpus"))
    return out


def _namespace_caps(
    policy: Policy, usage: NamespaceUsage, gpus: int, cost: float, gpu_field: str
) -> list[Violation]:
    out = []
    cap = policy.max_gpus_per_namespace
    if cap is not None and usage.gpus + gpus > cap:
        out.append(
            Violation(
                "maxGpusPerNamespace",
                policy.name,
                gpu_field,
                usage.gpus + gpus,
                cap,
                f"policy {policy.name}: {gpus} GPUs + {usage.gpus} already held in the namespace > "
                f"maxGpusPerNamespace {cap}",
            )
        )
    budget = policy.max_usd_per_month
    # Before planning (cost 0) a budget that is used up stops the job; after, the plan must fit.
    exhausted = usage.usd_this_month >= budget if budget is not None and not cost else False
    if budget is not None and (exhausted or usage.usd_this_month + cost > budget):
        left = max(budget - usage.usd_this_month, 0.0)
        out.append(
            Violation(
                "maxUsdPerMonth",
                policy.name,
                "namespace.usdThisMonth",
                round(usage.usd_this_month + cost, 2),
                budget,
                f"policy {policy.name}: the namespace spent ${usage.usd_this_month:,.2f} this month"
                + (f", this job would add ${cost:,.2f}" if cost else "")
                + f"; maxUsdPerMonth ${budget:,.2f} leaves ${left:,.2f}",
            )
        )
    return out


def effective_precisions(spec: Mapping[str, Any], policy: Policy) -> list[str]:
    """The precisions to plan: the job's own, else the policy's ``defaultPrecisions`` (empty = planner default).

    The operator sets ``constraints.precisions`` to this before planning when the job names none.
    """
    own = [str(p) for p in ((spec.get("constraints") or {}).get("precisions") or [])]
    return own or list(policy.default_precisions)
