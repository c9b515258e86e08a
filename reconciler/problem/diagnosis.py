"""Why work is pending, in words a user can act on: the rule that binds, with the plan's numbers.

Two questions. Before solving: what keeps a job off every capacity the fleet could ever have
(`why_nothing_fits`, the problem's static_pending). After: what keeps it out of this plan
(`pending_reason`, read off the finished plan's ledger). Both are pure, ask the rules (problem.rules,
ledger.py) for their refusals and never re-solve (the plan asks for every pending job).
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.ledger import Ledger, Refusal, money, plan_ledger
from reconciler.model import DesiredState, region_matches
from reconciler.observe import Observed
from reconciler.problem.rules import fit, stuck_gangs
from reconciler.problem.types import Capacity, Demand, Problem

# The order a user would look at the rules in, when several each block a way of placing the job.
_RULE_ORDER = ("quota", "license", "license-quota", "reservation", "cloud-quota", "pool-max", "fleet-budget", "tenant-budget", "spot-share", "tenant-spot-share", "spot-buffer", "spot-diversity")


def _rule_text(refusals: list[Refusal], ledger: Ledger) -> str:
    """One rule's refusals (one kind, maybe several pools) as one clause with the plan's numbers."""
    first = refusals[0]
    if first.rule == "pool-max":
        bounds = ledger.problem.pool_bounds
        parts = ", ".join(f"{p} {ledger.pool_count(p)}/{bounds[p][1]}" for p in sorted({r.limit for r in refusals}))
        n = min(r.instances for r in refusals)
        need = f"; the job needs {n} new instances" if n > 1 else ""
        return f"pools at max_instances ({parts}){need}"
    return min(refusals, key=lambda r: r.shortfall).message


def pending_reason(d: Demand, problem: Problem, ledger: Ledger, job: str | None = None) -> str:
    """The rule that binds for this job in this plan, with the plan's own numbers (the ledger
    of the finished plan: its instances, charges, spot share). Every way of placing the job is
    tried against the ledger: on new instances of each offer, or in room left on an instance.
    The reason names the rule that alone blocks the cheapest of them (lifting it would let the
    job be placed), or says that several bind at once."""
    evicted = job is not None and any(j == job for j, _ in d.running)
    head = "evicted: " if evicted else ""
    if evicted and d.key in stuck_gangs(problem):
        return head + _stuck_reason(problem)
    blanket = [r for r in (ledger.quota_refusal(d), ledger.license_refusal(d)) if r is not None]
    options = ledger.options(d, fit)
    if blanket:  # a quota or a license refuses every way alike
        options = [replace(o, refusals=(*blanket, *o.refusals)) for o in options]
    if not options:
        lead = f"{'; '.join(r.message for r in blanket)}; several limits bind at once with it: " if blanket else ""
        return head + lead + ("the instances that could hold it are full and no new one can be bought for it "
                       "(its zones are short of capacity or in cool-off, or spot is over max_price_fraction)") + _outranked(d, ledger)
    open_ = [o for o in options if not o.refusals]
    if open_:
        o = open_[0]
        return head + (f"not placed by this plan, although {o.label} would hold it under every pool, budget, quota and spot rule "
                       f"(+{money(o.price)}/h); the solver did not find that placement: the next run retries "
                       "(a longer --time-limit searches more)")
    single: dict[str, list[Refusal]] = {}
    for o in options:
        kinds = {r.rule for r in o.refusals}
        if len(kinds) == 1:
            single.setdefault(kinds.pop(), []).extend(o.refusals)
    if single:
        kind = min(single, key=_RULE_ORDER.index)
        text = _rule_text(single[kind], ledger)
        others = [k for k in sorted(single, key=_RULE_ORDER.index) if k != kind]
        also = f"; other capacity is blocked by {', '.join(_RULE_NAMES[k] for k in others)}" if others else ""
        return head + text + also + (_outranked(d, ledger) if kind in _SHARED else "")
    cheapest = options[0]
    kinds = sorted({r.rule for r in cheapest.refusals}, key=_RULE_ORDER.index)
    texts = [_rule_text([r for r in cheapest.refusals if r.rule == k], ledger) for k in kinds]
    # The first rule in a user's order leads (a quota the job alone exceeds reads as that), then the others.
    return (head + texts[0] + f"; several limits bind at once with it for {cheapest.label}: " + "; ".join(texts[1:])
            + (_outranked(d, ledger) if _SHARED.intersection(kinds) else ""))


def _stuck_reason(problem: Problem) -> str:
    """A running gang under WhenEmpty may stay or stop, never move (problem.stuck_gangs): no other placement was
    open to it, so what stopped it is what the fleet as it runs breaks, which this plan had to mend."""
    hosts = sorted(c.key for c in problem.capacities if c.existing)
    running = plan_ledger(problem, (), hosts, [(j, ids) for dd in problem.demands for j, ids in dd.running])
    broken = running.broken_rules()
    why = ("; ".join(broken[k] for k in sorted(broken)) + ", so the plan gives up running work") if broken else \
        "its capacity goes to work that ranks above it in this plan (the tiers in README, How it decides)"
    return f"under consolidation: WhenEmpty a running gang stays where it runs or stops, never moves, and it cannot stay: {why}"


# Rules over capacity all tenants share: only there does higher-priority work take it first.
_SHARED = {"reservation", "cloud-quota", "pool-max", "fleet-budget", "spot-share", "spot-buffer", "spot-diversity"}


_RULE_NAMES = {"quota": "its tenant's quota", "reservation": "a reservation's count", "cloud-quota": "a cloud account quota", "license": "a license's count", "license-quota": "its tenant's license quota", "pool-max": "max_instances", "fleet-budget": "max_hourly_budget", "tenant-budget": "its tenant's budget",
               "spot-share": "max_spot_fraction", "tenant-spot-share": "its tenant's max spot fraction",
               "spot-buffer": "the on-demand buffer", "spot-diversity": "spot diversity"}


def _outranked(d: Demand, ledger: Ledger) -> str:
    """Higher-class jobs of the same kind of capacity that this plan places (never pending ones)."""
    names = ledger.higher(d)
    if not names:
        return ""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f" (capacity goes to higher-priority work first: {', '.join(names[:3])}{more})"



def why_nothing_fits(d: Demand, desired: DesiredState, observed: Observed, offers: list[Capacity]) -> str:
    """The first rule, in the order a user would check them, that leaves no capacity."""
    if d.mig:
        what = f"{d.mig[1]}x MIG {d.mig[0]} of {d.gpu_type}"
    else:
        what = f"{d.gpus}x {d.gpu_type}" if d.gpus else f"{d.cpu:g} vCPU / {d.memory_gib:g} GiB (CPU-only)"
    shapes: dict[str, list] = {}  # pool -> the offerings its provider reports
    for po in observed.offerings:
        shapes.setdefault(po.pool, []).append(po.offering)
    pools = [p for p in desired.pools.values() if d.pools is None or p.name in d.pools]

    def serves(p, o) -> bool:
        if d.mig:
            return o.gpu_type == d.gpu_type and bool(p.spec.mig) and d.mig[0] in p.spec.mig
        if d.gpus:
            return o.gpu_type == d.gpu_type and not p.spec.mig
        return o.gpus == 0

    typed = [p for p in pools if any(serves(p, o) for o in shapes.get(p.name, []))]
    if not typed:
        return f"no pool offers {what}" + (" (CPU jobs do not run on GPU instances)" if not d.gpus and not d.mig else "")
    guard = desired.guardrails
    in_region = [p for p in typed if region_matches(list(d.regions) if d.regions else None, p.spec.cloud, p.spec.region)
                 and region_matches(guard.allowed_regions, p.spec.cloud, p.spec.region)
                 and (d.clouds is None or p.spec.cloud in d.clouds)
                 and (guard.allowed_clouds is None or p.spec.cloud in guard.allowed_clouds)]
    if not in_region:
        where = ", ".join((d.regions or ()) + tuple(sorted(d.clouds or ()))) or "any"
        return f"no pool offers {what} in an allowed region or cloud (job allows: {where})"
    if d.zones is not None and not any((p.spec.cloud, z) in d.zones for p in in_region for z in p.spec.zones):
        return f"no pool offering {what} has a zone within the data's max_latency_ms"
    per_gpu = d.gpus // d.bundle if d.gpus else 0

    def large(p, o) -> bool:
        return (serves(p, o) and o.cpu >= d.cpu and o.memory_gib >= d.memory_gib and (not d.gpus or o.gpus >= d.gpus)
                and (not d.nvlink or getattr(o, "nvlink_domain", 1) >= per_gpu)
                # (MIG: as many devices of the profile as the pool's layout makes on its GPUs; a same-instance gang
                # of 4x 2g.20gb on a 1-GPU type with two per GPU was said to find every zone out of capacity)
                and (not d.mig or o.gpus * list(p.spec.mig).count(d.mig[0]) >= d.mig[1]))

    big = [p for p in in_region if any(large(p, o) for o in shapes.get(p.name, []))]
    if not big:
        nv = f", {per_gpu} GPUs in one NVLink domain" if d.nvlink else ""
        return f"no instance type in an allowed pool is large enough for one {'instance-gang' if d.bundle > 1 else 'replica'} ({what}, {d.cpu:g} vCPU, {d.memory_gib:g} GiB{nv})"
    markets = {m for p in big for m in p.spec.markets()}
    if d.spot == "never" and markets == {"spot"}:
        return "spot: never, but every matching pool is spot-only"
    if d.spot == "required" and "spot" not in markets:
        return "spot: required, but no matching pool allows spot"
    names = {p.name for p in big}
    if not any(o.pool in names for o in offers):
        # Spot offers over the price cap are left out too: say so when that, not capacity, is why (a spot-only
        # A10G pool at 0.3 was said to find 'every matching zone out of capacity': property tier).
        usable = {"never": {"on-demand"}, "required": {"spot"}}.get(d.spot, {"spot", "on-demand"})
        frac = desired.spot_policy.max_price_fraction
        short, priced_out = 0, 0
        for p in big:
            for o in (o for o in shapes.get(p.name, []) if large(p, o)):
                for market in set(p.spec.markets()) & usable:
                    if not o.available or (o.cloud, o.zone, o.instance_type, market) in observed.short:
                        short += 1
                    elif market == "spot" and (o.spot_price is None or o.spot_price > frac * o.on_demand_price + 1e-9):
                        priced_out += 1
        if priced_out and not short:
            return f"spot: every matching spot price is over max_price_fraction {frac:g} of on-demand, and the job cannot run on on-demand there"
        return "every matching zone is out of capacity or in cool-off after a capacity error; retry later or add zones"
    return f"no capacity matches {what} under the pool, market and spot price rules"
