"""GuardrailPolicy checks on a finished plan: allowed regions, hourly budget, destroy limit."""

from __future__ import annotations

from collections.abc import Mapping

from providers.catalog import PriceOverride, load_catalog, price_override
from reconciler.ledger import MICRO, budget_ok, micro, replica_charge
from reconciler.model import DesiredState, GuardrailPolicySpec, region_matches
from reconciler.plan import Plan
from reconciler.site import Site


def price_overrides(plan: Plan, sites: Mapping[str, Site]) -> list[tuple[str, float, PriceOverride]]:
    """(the instance's id or create ref, the price the plan counts, its override) for each instance the plan keeps or creates whose price is a pinned
    catalog.json's below the public one or not public at all (providers.catalog.price_override). `sites`: the kept
    instances' sites (observed), by id. A reservation's 0 is its committed cost, not a catalog price."""
    out = []
    for c in plan.creates:
        if c.reservation is None and c.price_source.startswith("catalog:") and (o := _override(c.site, c.price)):
            out.append((c.ref, c.price, o))
    for iid, price in plan.kept.items():
        if price > 0 and (site := sites.get(iid)) is not None and (o := _override(site, price)):
            out.append((iid, price, o))
    return out


def _override(site: Site, price: float) -> PriceOverride | None:
    return price_override(site.cloud, site.region, site.zone, site.instance_type, site.market, price)


def override_notes(overrides: list[tuple[str, float, PriceOverride]], guard: GuardrailPolicySpec) -> list[str]:
    """What a reviewer is told of the plan's catalog.json prices: each distinct site once, with how many instances."""
    count: dict[PriceOverride, int] = {}
    for _, _, o in overrides:
        count[o] = count.get(o, 0) + 1
    budgeted = ("the budget guardrail counts them (allow_negotiated_prices)" if guard.allow_negotiated_prices else
                "the budget guardrail counts the public price where there is one")
    return [f"priced from catalog.json: {n} x {o.describe()}; {budgeted}" for o, n in sorted(count.items(), key=lambda x: x[0].describe())]


def violations(plan: Plan, guard: GuardrailPolicySpec, allow_destroy: int | None = None,
               sites: Mapping[str, Site] | None = None, desired: DesiredState | None = None) -> list[str]:
    """Every guardrail the plan breaks, each with the override or fix a user can apply. `sites` (the observed instances'
    by id) lets the budgets see the kept instances' catalog.json prices, the creates carry theirs; `desired` (its jobs'
    resources) lets the tenants' budgets see them."""
    out = []
    lowered = [] if guard.allow_negotiated_prices else [x for x in price_overrides(plan, sites or {}) if x[2].public is not None]
    for c in plan.creates:
        if not region_matches(guard.allowed_regions, c.site.cloud, c.site.region):
            out.append(f"allowed_regions: would create {c.site.instance_type} in {c.site.cloud}/{c.site.region}, which is not allowed")
    if not budget_ok(plan.spend, guard.max_hourly_budget):
        out.append(f"max_hourly_budget: the fleet would cost ${plan.cost_after:,.2f}/h, over the ${guard.max_hourly_budget:,.2f}/h budget")
    elif guard.max_hourly_budget is not None and lowered:
        # A pull request that lowered catalog.json's prices passed the budget while the bill went past it: the budget
        # takes the public price of each instance catalog.json prices below it.
        public = plan.spend + sum(micro(o.public) - micro(p) for _, p, o in lowered)
        if not budget_ok(public, guard.max_hourly_budget):
            first = min(lowered, key=lambda x: x[1] - x[2].public)[2]
            out.append(f"max_hourly_budget: the fleet would cost ${public / MICRO:,.2f}/h at public prices, over the "
                       f"${guard.max_hourly_budget:,.2f}/h budget (${plan.cost_after:,.2f}/h at catalog.json's prices, which "
                       f"price {len(lowered)} instance(s) below the public price, e.g. {first.describe()}); if those are "
                       "negotiated prices, set `allow_negotiated_prices: true` in the GuardrailPolicy")
    if lowered and desired is not None and guard.tenant_hourly_budgets:
        out += _tenant_budgets_at_public_prices(plan, guard, sites or {}, desired, lowered)
    limit = guard.max_destroy_per_apply
    if limit is not None and len(plan.deletes) > limit and (allow_destroy is None or len(plan.deletes) > allow_destroy):
        out.append(
            f"max_destroy_per_apply: would destroy {len(plan.deletes)} instances, the limit is {limit} "
            f"(review, then apply with --allow-destroy {len(plan.deletes)})"
        )
    return out


def _tenant_budgets_at_public_prices(plan: Plan, guard: GuardrailPolicySpec, sites: Mapping[str, Site],
                                     desired: DesiredState, lowered: list[tuple[str, float, PriceOverride]]) -> list[str]:
    """The tenant budgets the plan breaks when the instances catalog.json prices below the public price are charged at
    it: each replica's charge (ledger.replica_charge, in whole micro-dollars as the ledger sums them) on every instance
    it runs on. Only a tenant with a replica on such an instance is counted; a plugin's type the catalog lacks, not."""
    public = {ref: o.public for ref, _, o in lowered}
    where = {c.ref: (c.site, c.price) for c in plan.creates} | {i: (sites[i], p) for i, p in plan.kept.items() if i in sites}
    catalog, spend, touched = load_catalog(), {}, set()
    for j in plan.jobs:
        job = desired.jobs.get(j.job)
        if job is None or j.action not in ("keep", "place", "move") or j.tenant not in guard.tenant_hourly_budgets:
            continue
        for ref in j.instances:
            site, price = where.get(ref, (None, 0.0))
            shape = catalog.shape(site.cloud, site.instance_type) if site is not None else None
            if shape is None:
                continue
            touched |= {j.tenant} if ref in public else set()
            spend[j.tenant] = spend.get(j.tenant, 0) + micro(replica_charge(job.spec.resources, shape.gpus, shape.cpu,
                                                                            public.get(ref, price)))
    return [f"tenant_hourly_budgets: tenant {t} would cost ${spend[t] / MICRO:,.2f}/h at public prices, over its "
            f"${guard.tenant_hourly_budgets[t]:,.2f}/h budget (catalog.json prices instances its replicas run on below the "
            "public price); if those are negotiated prices, set `allow_negotiated_prices: true` in the GuardrailPolicy"
            for t in sorted(touched) if not budget_ok(spend[t], guard.tenant_hourly_budgets[t])]
