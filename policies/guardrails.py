"""GuardrailPolicy checks on a finished plan: allowed regions, hourly budget, destroy limit."""

from __future__ import annotations

from reconciler.ledger import budget_ok
from reconciler.model import GuardrailPolicySpec, region_matches
from reconciler.plan import Plan


def violations(plan: Plan, guard: GuardrailPolicySpec, allow_destroy: int | None = None) -> list[str]:
    """Every guardrail the plan breaks, each with the override or fix a user can apply."""
    out = []
    for c in plan.creates:
        if not region_matches(guard.allowed_regions, c.site.cloud, c.site.region):
            out.append(f"allowed_regions: would create {c.site.instance_type} in {c.site.cloud}/{c.site.region}, which is not allowed")
    if not budget_ok(plan.spend, guard.max_hourly_budget):
        out.append(f"max_hourly_budget: the fleet would cost ${plan.cost_after:,.2f}/h, over the ${guard.max_hourly_budget:,.2f}/h budget")
    limit = guard.max_destroy_per_apply
    if limit is not None and len(plan.deletes) > limit and (allow_destroy is None or len(plan.deletes) > allow_destroy):
        out.append(
            f"max_destroy_per_apply: would destroy {len(plan.deletes)} instances, the limit is {limit} "
            f"(review, then apply with --allow-destroy {len(plan.deletes)})"
        )
    return out
