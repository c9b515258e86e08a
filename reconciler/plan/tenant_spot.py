"""Phase 2a of a plan: a tenant's spot share on what was actually packed.

The solver holds each tenant's tenant_max_spot_fraction on its counts, which include on-demand
work the packer may then leave out; the spot work stayed while the tenant's total shrank, so the
packed plan took the tenant over its share (fleet12, issue 18). Spot work goes too, here.

Its last resort, running spot work, never takes a job inside its tenant's guarantee for a share the
fleet as it runs keeps (README, Tenants; apply's re-check refuses such an evict): that job moves onto
on-demand room instead, the plan's or a repair instance, where a rule allows it; else it stays, and
the tenant's other spot work waits.
"""

from __future__ import annotations

from reconciler.ledger import rules_broken_now, spot_share_ok, tenant_spot_drops, work_units
from reconciler.observe import Observed
from reconciler.pack import Bin
from reconciler.plan.instances import spare
from reconciler.plan.packing import Packing
from reconciler.problem import Capacity, Demand, Problem, fit, rules_allow
from reconciler.words import amount


def settle_tenant_spot(problem: Problem, observed: Observed, slots: dict[str, list[str | None]], packing: Packing,
                       hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> dict[str, str]:
    """Take spot work out of the packed plan where a tenant is over its tenant_max_spot_fraction
    (the solver held it, counting work the packer then left out): new spot work first, lowest
    priority first. A protected job it would take moves onto on-demand room instead, where it can
    (`packing.moved`). Returns job -> its pending reason; their items leave the bins."""
    bins_of = packing.bins_of
    market: dict[tuple[str, int], str] = {}
    for bins in bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                market[(job, r)] = b.cap.market
    per_tenant: dict[str, list[tuple[tuple, str, int, int]]] = {}
    for job, items in slots.items():
        d = demand_of[job]
        r_ = problem.tenants.get(d.tenant)
        if job in packing.unpacked or r_ is None or r_.spot_fraction is None:
            continue
        on = sum(work_units(d) for r, at in enumerate(items) if (hosts[at].market if at is not None else market.get((job, r))) == "spot")
        running = bool(observed.placements.get(job))
        per_tenant.setdefault(d.tenant, []).append(((running, d.priority, -on, job), job, on, work_units(d) * len(items)))
    drops: dict[str, str] = {}
    for tenant, rows in sorted(per_tenant.items()):
        rows.sort()
        frac = problem.tenants[tenant].spot_fraction
        on, tot = sum(r[2] for r in rows), sum(r[3] for r in rows)
        order = [(job, s, t) for _, job, s, t in rows]
        chosen = tenant_spot_drops(order, frac)
        protected = set(problem.tenants[tenant].protected_jobs)
        stays = ""
        if protected.intersection(chosen) and not _share_broken_now(problem, tenant):
            # Running on on-demand room, a protected job keeps the share the fleet as it runs keeps (fleet12 reduced).
            for job in [job for job in chosen if job in protected]:
                if protected.intersection(chosen) and _onto_on_demand(problem, job, slots, packing, hosts, demand_of):
                    packing.moved[job] = (f"tenant spot share: moves onto on-demand room, as {tenant}'s placed work would be over its "
                                          f"max_spot_fraction {frac:g} on spot (on-demand work the solver placed could not be packed)")
                    order = [(j, 0 if j == job else s, t) for j, s, t in order]
                    on = sum(s for _, s, _ in order)
                    chosen = tenant_spot_drops(order, frac)
        if protected.intersection(chosen) and not _share_broken_now(problem, tenant):
            # The rest goes instead, in its order, until the share holds or none is left; the protected work stays.
            rest = [r for r in order if r[0] not in protected]
            chosen = [job for job in tenant_spot_drops(rest + [r for r in order if r[0] in protected], frac) if job not in protected]
            gone = [r for r in order if r[0] in chosen]
            if not spot_share_ok(on - sum(r[1] for r in gone), tot - sum(r[2] for r in gone), frac):
                spared = sorted(job for job, s, _ in order if job in protected and s)
                stays = f"; its running spot work inside its guarantee stays ({', '.join(spared)})"
        for job in chosen:
            drops[job] = (f"tenant spot share: {tenant}'s placed work would be {on:g} of {amount(tot, 'work units')} on spot, over its "
                          f"max_spot_fraction {frac:g}, as on-demand work the solver placed could not be packed{stays}")
    for bins in bins_of.values():
        for b in bins:
            for job in {j for _, j, _ in b.items if j in drops}:
                b.remove(demand_of[job], job)
    return drops


def _share_broken_now(problem: Problem, tenant: str) -> bool:
    """Does the fleet as it runs (or as it can stay) break the tenant's spot share? Then the rule requires something
    to give, and work inside the guarantee may (README, Tenants): the one reading apply's re-check makes."""
    return f"tenant-spot:{tenant}" in rules_broken_now(problem)


def _onto_on_demand(problem: Problem, job: str, slots: dict[str, list[str | None]], packing: Packing, hosts: dict[str, Capacity],
                    demand_of: dict[str, Demand]) -> bool:
    """Move a job's spot replicas onto on-demand room its placement rules allow: an instance the plan keeps or buys,
    else a repair instance of the cheapest offer that holds it (if its pool, the quotas and the budget allow). A host
    it leaves empty goes where no rule keeps it (`spare`, as for an empty new instance). Only a job whose replicas run
    apart (no gang), of a tenant without a budget (on-demand charges it more), with no on-demand buffer (its room
    would be taken). True if every spot replica moved; else nothing changes."""
    d = demand_of[job]
    if d.gang or d.bundle > 1 or problem.tenants[d.tenant].budget is not None or problem.spot.on_demand_buffer_percent > 0:
        return False
    at = {(job, r): b for bins in packing.bins_of.values() for b in bins for _, j, r in b.items if j == job}
    spot = [r for r, h in enumerate(slots[job]) if (hosts[h] if h is not None else at[(job, r)].cap).market == "spot"]
    targets = [b for bins in packing.bins_of.values() for b in bins if b.cap.market == "on-demand" and b.group is None and rules_allow(d, b.cap)]
    offers = sorted((c for c in problem.offers() if c.market == "on-demand" and fit(d, c) > 0), key=lambda c: (c.price, c.key))
    placed: list[Bin] = []
    for r in spot:
        b = next((b for b in targets if b.place(d, job, r) is not None), None)
        for c in offers if b is None and packing.more_of is not None else ():
            nb = packing.more_of(c, c.key)()
            if nb is not None:
                targets.append(nb)
                b = nb if nb.place(d, job, r) is not None else None
                break
        if b is None:
            for done, pb in zip(spot, placed):
                pb.unplace(d, job, done)
            return False
        placed.append(b)
    for r in spot:
        h = slots[job][r]
        if h is None:
            at[(job, r)].unplace(d, job, r)
            continue
        slots[job][r] = None  # (its room on the host it leaves stays taken: the backfill after sees less room, never too much)
        if not any(h in items for items in slots.values()) and not packing.bins_of[h][0].items and \
                spare(hosts[h], problem, packing.pool_count, packing.fleet, packing.prim):
            packing.released.add(h)
            del packing.bins_of[h]
            packing.pool_count[hosts[h].pool] -= 1
            packing.fleet["all"] -= packing.prim(hosts[h])
            packing.fleet["spot"] -= packing.prim(hosts[h])
    return True
