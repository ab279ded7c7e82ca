"""Platform policies (budgets, allowed types, spot rules, price overrides) as validated models."""

from gpuscaler.policy.models import Policy, PriceOverride, SpotRules, load_policy

__all__ = ["Policy", "PriceOverride", "SpotRules", "load_policy"]
