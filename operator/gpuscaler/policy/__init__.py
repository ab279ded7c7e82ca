"""Platform policies (budgets, allowed types, spot rules, price overrides) as validated models.

``models``: the Policy model and its loaders; ``evaluate``: merging the policies in force for a
namespace and checking jobs and plans against them; ``crd``: the GPUScalingPolicy CRD; ``cli``:
``gpuscaler policy check``.
"""

from gpuscaler.policy.evaluate import (
    NamespaceUsage,
    PolicyConflictError,
    Violation,
    check_job,
    check_plan,
    effective_precisions,
    policy_for_namespace,
)
from gpuscaler.policy.models import (
    KIND,
    PLURAL,
    Policy,
    PolicyFileError,
    PriceOverride,
    SpotRules,
    from_document,
    load_policies,
    load_policy,
)

__all__ = [
    "KIND",
    "PLURAL",
    "NamespaceUsage",
    "Policy",
    "PolicyConflictError",
    "PolicyFileError",
    "PriceOverride",
    "SpotRules",
    "Violation",
    "check_job",
    "check_plan",
    "effective_precisions",
    "from_document",
    "load_policies",
    "load_policy",
    "policy_for_namespace",
]
