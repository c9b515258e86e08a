"""Why a job is pending: name the rule that binds, in words a user can act on.

Pure: reads the problem and the solver's answer, never re-solves."""

from __future__ import annotations

from reconciler.problem import DIMS, Demand, Problem, fit
from reconciler.solve import Solution

_UNIT = {"gpus": "GPUs", "cpu": "vCPU", "memory_gib": "GiB memory"}


def tenant_usage(problem: Problem, solution: Solution, tenant: str) -> dict[str, float]:
    use = {dim: 0.0 for dim in DIMS}
    for d in problem.demands:
        if d.tenant == tenant:
            for dim in DIMS:
                use[dim] += solution.placed.get(d.key, 0) * d.replicas * d.req(dim)
    return use


def pending_reason(d: Demand, problem: Problem, solution: Solution) -> str:
    what = f"{d.replicas}x {d.gpus} {d.gpu_type}" if d.gpus else f"{d.replicas}x {d.cpu:g} vCPU"
    # 1. Tenant quota.
    caps = problem.tenant_caps.get(d.tenant, {})
    used = tenant_usage(problem, solution, d.tenant)
    for dim, limit in caps.items():
        need = d.replicas * d.req(dim)
        if need > limit:
            return f"quota: the job needs {need:g} {_UNIT[dim]} but tenant {d.tenant}'s limit is {limit:g}"
        if used[dim] + need > limit + 1e-9:
            return f"quota exhausted: tenant {d.tenant} uses {used[dim]:g}/{limit:g} {_UNIT[dim]}, the job needs {need:g} more"
    units = [u for u in solution.units.values() if fit(d, u.cap) > 0 and u.cap.keep_blocker is None]
    pools = sorted({u.cap.pool for u in units})
    # 2. Pools at their ceiling.
    in_use = {p: 0 for p in pools}
    for u in solution.units.values():
        if u.cap.pool in in_use:
            in_use[u.cap.pool] += (1 if u.cap.instance_id in solution.keep else 0) if u.cap.existing else solution.new_units.get(u.key, 0)
    full = [p for p in pools if in_use[p] >= problem.pool_bounds[p][1]]
    if pools and len(full) == len(pools):
        return f"pools at max_instances: {', '.join(f'{p} ({problem.pool_bounds[p][1]})' for p in full)}"
    # 3. Budget.
    if problem.budget is not None:
        cheapest = min((u.cap.price for u in units if not u.cap.existing), default=None)
        spent = solution.cost_milli / 1000
        if cheapest is not None and spent + cheapest > problem.budget:
            return f"budget: the fleet costs ${spent:,.2f}/h and max_hourly_budget is ${problem.budget:,.2f}/h"
    # 4. Gang that cannot fit in one zone.
    if d.gang:
        zones = {}
        for u in units:
            zones[u.cap.zone] = zones.get(u.cap.zone, 0) + fit(d, u.cap) * u.count
        if zones and max(zones.values()) < d.replicas:
            return f"gang of {d.replicas} needs one zone with room for all replicas; the best zone holds {max(zones.values())}"
    # 5. Spot rules.
    if d.spot == "required" and problem.spot.max_spot_fraction < 1:
        return f"spot: required, and the fleet is at max_spot_fraction {problem.spot.max_spot_fraction:g}"
    higher = [o for o in problem.demands if o.priority > d.priority and solution.placed.get(o.key, 0)]
    if higher:
        return f"outranked: {what} lost to higher-priority work under the pool, quota and budget limits"
    return f"no placement for {what} satisfies every rule at once (pool sizes, spot policy, budget)"
