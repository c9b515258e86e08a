"""Decomposition: a problem split into parts no constraint links, each solved alone (exact)."""

from __future__ import annotations

import math

from reconciler.ledger import quota_units
from reconciler.problem.partition import Partition
from reconciler.problem.rules import fit
from reconciler.problem.types import Capacity, Host, Problem, type_class

def components(problem: Problem) -> list[Problem]:
    """Split a problem into parts no constraint links: a demand is tied to every pool that
    could host it and to the other demands of its tenant (quotas, guarantees, budgets); a host
    to its pool and its residents. Fleet-wide rules (budget, spot share, buffer, diversity,
    fair share between borrowing tenants) tie everything: then there is one part. Each part
    is solved alone (exact: the parts share no variable or constraint)."""
    sp = problem.spot
    borrowers = [t for t, r in problem.tenants.items() if any(r.cap.get(k, math.inf) > v + 1e-9 for k, v in r.guarantee.items())]
    if problem.budget is not None or sp.max_spot_fraction < 1 or sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 \
            or sp.min_zones > 1 or len(borrowers) > 1:
        return [problem]
    groups = Partition()
    find, union = groups.find, groups.union

    by_type: dict[tuple, list[Capacity]] = {}
    for c in problem.capacities:
        by_type.setdefault(type_class(c), []).append(c)
        union("p:" + c.pool, "c:" + c.key)
        if c.reservation:  # a Reservation's count ties its instances kept and its offer (one pool today: said anyway)
            union("c:" + c.key, "r:" + c.reservation)
        for dk, _, _ in c.residents if isinstance(c, Host) else ():
            union("c:" + c.key, "d:" + dk)
    for d in problem.demands:
        union("d:" + d.key, "t:" + d.tenant)
        for name, _ in d.licenses:  # a license's count ties every job that holds it
            union("d:" + d.key, "l:" + name)
        for c in by_type.get(type_class(d), []):
            if fit(d, c) > 0:
                union("d:" + d.key, "p:" + c.pool)
    for ks in problem.groups.values():  # a group's demands share placement variables (one fitting no pool, too)
        for k in ks[1:]:
            union("d:" + ks[0], "d:" + k)
    for i, q in enumerate(problem.quotas):  # a cloud quota ties every offer that counts against it
        for c in problem.offers():
            if quota_units(q, c):
                union("c:" + c.key, f"q:{i}")
    for pool in problem.pool_bounds:
        find("p:" + pool)
    parts: dict[str, dict[str, list]] = {}
    for d in problem.demands:
        parts.setdefault(find("d:" + d.key), {"d": [], "c": [], "p": []})["d"].append(d)
    for c in problem.capacities:
        parts.setdefault(find("c:" + c.key), {"d": [], "c": [], "p": []})["c"].append(c)
    for pool in problem.pool_bounds:
        parts.setdefault(find("p:" + pool), {"d": [], "c": [], "p": []})["p"].append(pool)
    if len(parts) <= 1:
        return [problem]
    out = []
    for part in parts.values():
        keys = {d.key for d in part["d"]}
        tenants = {d.tenant for d in part["d"]}
        jobs = {j for d in part["d"] for j in d.jobs}
        out.append(Problem(
            demands=tuple(part["d"]), capacities=tuple(part["c"]),
            groups={g: ks for g, ks in problem.groups.items() if ks[0] in keys},
            pool_bounds={p: problem.pool_bounds[p] for p in part["p"]},
            tenants={t: r for t, r in problem.tenants.items() if t in tenants},
            desired_spot=problem.desired_spot, placement=problem.placement, budget=problem.budget,
            fleet_capacity=problem.fleet_capacity,
            static_pending={j: r for j, r in problem.static_pending.items() if j in jobs},
            job_remaining={j: r for j, r in problem.job_remaining.items() if j in jobs},
            job_end={j: r for j, r in problem.job_end.items() if j in jobs},
            coef={k: v for k, v in problem.coef.items() if k[0] in keys}, now=problem.now, licenses=problem.licenses,
            reservations=problem.reservations, deadlines={j: v for j, v in problem.deadlines.items() if j in jobs},
            quotas=tuple(q for q in problem.quotas if any(not isinstance(c, Host) and quota_units(q, c) for c in part["c"])),
            quota_floors={p: w for p, w in problem.quota_floors.items() if p in part["p"]},
            quota_floor_gaps={p: g for p, g in problem.quota_floor_gaps.items() if p in part["p"]},
            gpu_fleet=problem.gpu_fleet, held={k: n for k, n in problem.held.items() if k in keys},
            stand_in_rooms=problem.stand_in_rooms,
        ))
    return sorted(out, key=lambda q: -(len(q.demands) + len(q.capacities)))
