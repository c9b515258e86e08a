"""Phase 2a of a plan: a tenant's spot share on what was actually packed.

The solver holds each tenant's tenant_max_spot_fraction on its counts, which include on-demand
work the packer may then leave out; the spot work stayed while the tenant's total shrank, so the
packed plan took the tenant over its share (fleet12, issue 18). Spot work goes too, here.
"""

from __future__ import annotations

from reconciler.ledger import tenant_spot_drops, work_units
from reconciler.observe import Observed
from reconciler.pack import Bin
from reconciler.problem import Capacity, Demand, Problem


def settle_tenant_spot(problem: Problem, observed: Observed, slots: dict[str, list[str | None]], unpacked: set[str],
                       bins_of: dict[str, list[Bin]], hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> dict[str, str]:
    """Take spot work out of the packed plan where a tenant is over its tenant_max_spot_fraction
    (the solver held it, counting work the packer then left out): new spot work first, lowest
    priority first. Returns job -> its pending reason; their items leave the bins."""
    market: dict[tuple[str, int], str] = {}
    for bins in bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                market[(job, r)] = b.cap.market
    per_tenant: dict[str, list[tuple[tuple, str, int, int]]] = {}
    for job, items in slots.items():
        d = demand_of[job]
        r_ = problem.tenants.get(d.tenant)
        if job in unpacked or r_ is None or r_.spot_fraction is None:
            continue
        on = sum(work_units(d) for r, at in enumerate(items) if (hosts[at].market if at is not None else market.get((job, r))) == "spot")
        running = bool(observed.placements.get(job))
        per_tenant.setdefault(d.tenant, []).append(((running, d.priority, -on, job), job, on, work_units(d) * len(items)))
    drops: dict[str, str] = {}
    for tenant, rows in sorted(per_tenant.items()):
        rows.sort()
        frac = problem.tenants[tenant].spot_fraction
        on, tot = sum(r[2] for r in rows), sum(r[3] for r in rows)
        for job in tenant_spot_drops([(job, s, t) for _, job, s, t in rows], frac):
            drops[job] = (f"tenant spot share: {tenant}'s placed work would be {on:g} of {tot:g} work units on spot, over its "
                          f"max_spot_fraction {frac:g}, as on-demand work the solver placed could not be packed")
    for bins in bins_of.values():
        for b in bins:
            for job in {j for _, j, _ in b.items if j in drops}:
                b.remove(demand_of[job], job)
    return drops
