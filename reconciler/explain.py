"""Why a job is where it is, or why it is pending: name the rule that binds, in words a
user can act on.

`pending_reason` is pure: it reads the problem and the solver's answer and never
re-solves (the plan calls it for every pending job). `explain_job` backs
`reconcile explain JOB`: it says where the job landed and what the alternatives
cost, or which rule keeps it pending, and then proves what would change it by
solving again with one rule relaxed at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from reconciler.ledger import money
from reconciler.problem import DIMS, Capacity, Demand, Problem, TenantRules, fit, rules_allow, share
from reconciler.whatif import WhatIf

_UNIT = {"gpus": "GPUs", "cpu": "vCPU", "memory_gib": "GiB memory"}


_USAGE: dict[tuple[int, int, str], dict[str, dict[str, float]]] = {}


def tenant_usage(problem: Problem, solution, tenant: str, part: str = "placed") -> dict[str, float]:
    """Requested resources of a tenant's placed jobs (part="guaranteed": only those inside its guarantee)."""
    key = (id(problem), id(solution), part)
    table = _USAGE.get(key)
    if table is None:
        _USAGE.clear()  # one plan at a time: keep the memo small
        src = solution.guaranteed if part == "guaranteed" and solution.guaranteed else solution.placed
        table = {}
        for d in problem.demands:
            use = table.setdefault(d.tenant, {dim: 0.0 for dim in DIMS})
            for dim in DIMS:
                use[dim] += src.get(d.key, 0) * d.replicas * d.req(dim)
        _USAGE[key] = table
    return dict(table.get(tenant, {dim: 0.0 for dim in DIMS}))


def _what(d: Demand) -> str:
    if d.mig:
        return f"{d.replicas * d.bundle}x {d.mig[1] // d.bundle} MIG {d.mig[0]}"
    if d.gpus:
        return f"{d.replicas * d.bundle}x {d.gpus // d.bundle} {d.gpu_type}"
    return f"{d.replicas * d.bundle}x {d.cpu / d.bundle:g} vCPU"


def _in_use(problem: Problem, solution) -> dict[str, int]:
    n: dict[str, int] = {}
    for c in problem.capacities:
        k = (1 if c.instance_id in solution.keep else 0) if c.existing else solution.new.get(c.key, 0)
        n[c.pool] = n.get(c.pool, 0) + k
    return n


def pending_reason(d: Demand, problem: Problem, solution, job: str | None = None) -> str:
    evicted = job is not None and any(j == job for j, _ in d.running)
    what = _what(d)
    r: TenantRules | None = problem.tenants.get(d.tenant)
    # 1. Tenant quota (the hard ceiling).
    if r is not None:
        used = tenant_usage(problem, solution, d.tenant)
        for dim, limit in r.cap.items():
            need = d.replicas * d.req(dim)
            if need > limit:
                return f"quota: the job needs {need:g} {_UNIT[dim]} but tenant {d.tenant}'s limit is {limit:g}"
            if used[dim] + need > limit + 1e-9:
                return f"quota exhausted: tenant {d.tenant} uses {used[dim]:g}/{limit:g} {_UNIT[dim]}, the job needs {need:g} more"
        if r.budget is not None:
            spent = _tenant_cost(problem, solution, d.tenant)
            cheapest = min((c.price * share(d, c) * d.replicas for c in problem.capacities if fit(d, c) > 0), default=None)
            if cheapest is not None and spent + cheapest > r.budget + 1e-9:
                return f"tenant budget: {d.tenant} spends ${spent:,.2f}/h of its ${r.budget:,.2f}/h; the job needs at least ${cheapest:,.2f}/h more"
    caps = [c for c in problem.capacities if fit(d, c) > 0 and c.keep_blocker is None]
    pools = sorted({c.pool for c in caps})
    # 2. Pools at (or too near) their ceiling for this job.
    in_use = _in_use(problem, solution)
    room = {p: problem.pool_bounds[p][1] - in_use.get(p, 0) for p in pools}
    best_fit = {p: max((fit(d, c) for c in caps if c.pool == p and not c.existing), default=0) for p in pools}
    can_hold = sum(max(0, room[p]) * best_fit[p] for p in pools)
    if pools and can_hold < d.replicas:
        head = "evicted: " if evicted else ""
        parts = ", ".join(f"{p} {in_use.get(p, 0)}/{problem.pool_bounds[p][1]}" for p in pools)
        need = f"; the job needs room for {d.replicas} {'replicas' if d.replicas > 1 else 'replica'}" if d.replicas > 1 else ""
        return head + f"pools at max_instances ({parts}){need}" + _outranked(d, problem, solution)
    # 3. Fleet budget.
    if problem.budget is not None:
        cheapest = min((c.price for c in caps if not c.existing), default=None)
        spent = solution.cost_milli / 1000
        if cheapest is not None and spent + cheapest > problem.budget:
            return f"budget: the fleet costs ${spent:,.2f}/h and max_hourly_budget is ${problem.budget:,.2f}/h" + _outranked(d, problem, solution)
    # 4. A gang that cannot fit in one zone.
    if d.gang:
        zones: dict[str, int] = {}
        for c in caps:
            zones[c.zone] = zones.get(c.zone, 0) + fit(d, c) * (c.max_new if not c.existing else 1)
        if zones and max(zones.values()) < d.replicas:
            return f"gang of {d.replicas} needs one zone with room for all replicas; the best zone holds {max(zones.values())}"
    # 5. Spot rules.
    sp = problem.spot
    if d.spot == "required":
        if sp.max_spot_fraction < 1:
            return f"spot: required, and the fleet is at max_spot_fraction {sp.max_spot_fraction:g}"
        if sp.min_instance_types > 1 or sp.min_zones > 1 or sp.on_demand_buffer_percent > 0:
            return "spot: required, and the SpotPolicy's diversification or on-demand buffer leaves no room for it"
        if r is not None and r.spot_fraction is not None:
            return f"spot: required, and tenant {d.tenant} is at its max spot fraction {r.spot_fraction:g}"
    # 6. Borrowing beyond the guarantee.
    if r is not None and r.guarantee:
        g_used = tenant_usage(problem, solution, d.tenant, "guaranteed")
        over = [dim for dim, lim in r.guarantee.items() if g_used[dim] + d.replicas * d.req(dim) > lim + 1e-9 and d.req(dim)]
        if over:
            dim = over[0]
            lead = "reclaimed: " if evicted else ""
            return (lead + f"beyond tenant {d.tenant}'s guarantee ({g_used[dim]:g}/{r.guarantee[dim]:g} {_UNIT[dim]} guaranteed in use): "
                    "it can only borrow idle capacity, shared by weighted fair share and priority" + _outranked(d, problem, solution))
    out = _outranked(d, problem, solution)
    if out:
        return ("preempted" if evicted else "outranked") + out
    return f"no placement for {what} satisfies every rule at once (pool sizes, spot policy, budgets)"


def _outranked(d: Demand, problem: Problem, solution) -> str:
    higher = [o for o in problem.demands if o.klass > d.klass and solution.placed.get(o.key, 0)
              and o.gpu_type == d.gpu_type and (o.gpus > 0) == (d.gpus > 0)]
    if not higher:
        return ""
    names = sorted(j for o in higher for j in o.jobs[: solution.placed.get(o.key, 0)])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f" (capacity goes to higher-priority work first: {', '.join(names[:3])}{more})"


def _tenant_cost(problem: Problem, solution, tenant: str) -> float:
    caps = {**{c.key: c for c in problem.capacities}, **solution.capacities}  # with the solver's zone classes
    total = 0.0
    for (dk, ck), n in list(solution.stay.items()) + list(solution.x.items()):
        d = problem.demand(dk)
        if d.tenant == tenant:
            total += caps[ck].price * share(d, caps[ck]) * n
    return total


# ---------------------------------------------------------------- reconcile explain JOB


@dataclass(frozen=True)
class Alternative:
    where: str  # pool cloud/zone type market
    per_replica: float  # USD/h per replica, instance share plus egress and latency
    note: str = ""


@dataclass(frozen=True)
class Explanation:
    job: str
    state: str  # running | placed | moved | pending | evicted
    summary: str
    details: tuple[str, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    would_change: tuple[str, ...] = ()  # relaxations that, solved again, place the job
    tried: tuple[str, ...] = field(default=())  # relaxations tried that did not


def _span(g) -> str:
    g = sorted(g)
    return f"{g[0]}-{g[-1]}" if len(g) > 1 and g[-1] - g[0] == len(g) - 1 else ",".join(map(str, g))


def _cap_label(c: Capacity) -> str:
    return f"{c.pool} {c.cloud}/{c.zone} {c.instance_type} {c.market}"


def explain_job(job: str, desired, observed, problem: Problem, solution, plan, resolve) -> Explanation:
    """`resolve(desired)` plans a modified desired state against the same fleet and returns its
    Plan: used to check what would change a pending job's fate."""
    demand = next((d for d in problem.demands if job in d.jobs), None)
    if demand is None:
        raise KeyError(job)
    change = next(j for j in plan.jobs if j.job == job)
    d = demand
    spec = desired.jobs[job].spec
    details = [f"asks {_what(d)}{' (nvlink)' if d.nvlink else ''}, {d.cpu / d.bundle:g} vCPU and {d.memory_gib / d.bundle:g} GiB "
               f"per replica; tenant {d.tenant}; priority {spec.priority}"
               + (f" (aged to {d.priority})" if d.priority != d.base_priority else "") + f"; spot {d.spot}"]
    rules = []
    if d.pools is not None:
        rules.append(f"pools {', '.join(sorted(d.pools))}")
    if d.regions is not None:
        rules.append(f"regions {', '.join(d.regions)}")
    if d.clouds is not None:
        rules.append(f"clouds {', '.join(sorted(d.clouds))}")
    if d.zones is not None:
        rules.append(f"{len(d.zones)} zones within {spec.data.max_latency_ms:g} ms of {d.data_location}")
    if rules:
        details.append("allowed: " + "; ".join(rules))
    compatible = [c for c in problem.capacities if fit(d, c) > 0 and c.keep_blocker is None]
    by_offer: dict[str, Capacity] = {}
    for c in compatible:
        by_offer.setdefault(c.offer_key, c)
    alts = sorted(
        (Alternative(_cap_label(c), round(c.price * share(d, c) + problem.cost_coef(d, c), 4)) for c in by_offer.values()),
        key=lambda a: (a.per_replica, a.where))
    if change.instances:
        caps = {c.key: c for c in problem.capacities}
        hosts = {}
        for i in change.instances:
            if i.startswith("+"):
                cr = next(c for c in plan.creates if c.ref == i)
                hosts[i] = f"{cr.ref} (new {cr.instance_type} {cr.market}, {cr.cloud}/{cr.zone})"
            else:
                c = caps.get(i)
                hosts[i] = f"{i} ({c.instance_type} {c.market}, {c.cloud}/{c.zone})" if c else i
        where = ", ".join(hosts[i] + (f" GPUs {_span(g)}" if g else "") for i, g in zip(change.instances, change.gpus or [()] * len(change.instances)))
        state = {"keep": "running", "place": "placed", "move": "moved"}[change.action]
        summary = f"{state} on {where}"
        if change.reason:
            details.append(change.reason)
        g = solution.guaranteed.get(d.key) if solution.guaranteed else None
        if g is not None and problem.tenants.get(d.tenant) and problem.tenants[d.tenant].guarantee:
            details.append("inside its tenant's guarantee" if g >= solution.placed.get(d.key, 0)
                           else "on borrowed capacity (beyond its tenant's guarantee): reclaimable when another tenant needs its guarantee")
        details.append(f"the plan is {plan.solver.status.lower()}" + (f" (cost gap {plan.solver.gap:.1%})" if not plan.solver.optimal else "")
                       + "; cheaper options are either taken by the rules above or cost more in the whole plan (pool sizes, spot share, budgets, moves)")
        return Explanation(job, state, summary, tuple(details), tuple(alts[:5]))

    state = "evicted" if change.action == "evict" else "pending"
    summary = f"{state}: {change.reason}"
    would, tried = [], []
    for label, relaxed in _relaxations(desired, d, job, problem):
        try:
            p2 = resolve(relaxed)
        except Exception as e:  # a relaxation that breaks another rule is simply not an answer
            tried.append(WhatIf(f"{label}: {e}", change=label, outcome="refused", reason=str(e)))
            continue
        jc = next((j for j in p2.jobs if j.job == job), None)
        if jc is not None and jc.instances:
            delta = p2.cost_after - plan.cost_after
            would.append(WhatIf(f"{label}: it would run ({'+' if delta >= -0.005 else ''}{money(delta)}/h for the fleet)",
                                change=label, outcome="runs", fleet_cost_delta=delta))
        else:
            why = jc.reason if jc else "gone"
            tried.append(WhatIf(f"{label}: still pending ({why})", change=label, outcome="still pending", reason=why))
    return Explanation(job, state, summary, tuple(details), tuple(alts[:5]), tuple(would), tuple(tried))


def _relaxations(desired, d: Demand, job: str, problem: Problem):
    """One rule relaxed at a time, each just enough for this job (where that can be told)."""
    out = []
    t = desired.tenants.get(d.tenant)
    if t is not None:
        q = t.spec.quota
        need = {dim: d.replicas * d.req(dim) for dim in DIMS}
        limits = {dim: q.cap(dim) for dim in DIMS if q.cap(dim) is not None}
        if limits:
            new_q = q.model_copy(update={dim: (getattr(q, dim) + need[dim]) if getattr(q, dim) is not None else None for dim in DIMS})
            if q.burst is not None:
                new_q = new_q.model_copy(update={"burst": q.burst.model_copy(update={
                    dim: getattr(q.burst, dim) + need[dim] for dim in DIMS if getattr(q.burst, dim) is not None})})
            label = "raise tenant " + d.tenant + " quota by " + ", ".join(f"{need[k]:g} {_UNIT[k]}" for k in limits)
            out.append((label, _with_tenant(desired, d.tenant, t.model_copy(update={"spec": t.spec.model_copy(update={"quota": new_q})}))))
    pools = sorted({c.pool for c in problem.capacities if rules_allow(d, c)})
    if pools:
        grown = dict(desired.pools)
        for p in pools:
            pool = grown[p]
            grown[p] = pool.model_copy(update={"spec": pool.spec.model_copy(update={"max_instances": pool.spec.max_instances + d.replicas})})
        out.append((f"raise max_instances of {', '.join(pools)} by {d.replicas}", desired.model_copy(update={"pools": grown})))
    g = desired.guardrails
    if g.max_hourly_budget is not None:
        out.append(("raise max_hourly_budget by 50%", desired.model_copy(update={"guardrails": g.model_copy(update={"max_hourly_budget": g.max_hourly_budget * 1.5})})))
    if d.tenant in g.tenant_hourly_budgets:
        tb = dict(g.tenant_hourly_budgets)
        tb[d.tenant] = tb[d.tenant] * 1.5
        out.append((f"raise tenant {d.tenant}'s hourly budget by 50%", desired.model_copy(update={"guardrails": g.model_copy(update={"tenant_hourly_budgets": tb})})))
    spec = desired.jobs[job].spec
    if spec.spot in ("never", "required"):
        out.append(("let it run on spot or on-demand (spot: eligible)", _with_job(desired, job, spec.model_copy(update={"spot": "eligible"}))))
    if spec.regions is not None or spec.clouds is not None or spec.pools is not None:
        out.append(("drop its region/cloud/pool allowlists", _with_job(desired, job, spec.model_copy(update={"regions": None, "clouds": None, "pools": None}))))
    if spec.priority_weight() < 1000:
        out.append(("give it priority critical", _with_job(desired, job, spec.model_copy(update={"priority": "critical"}))))
    return out


def _with_tenant(desired, name, tenant):
    tenants = dict(desired.tenants)
    tenants[name] = tenant
    return desired.model_copy(update={"tenants": tenants})


def _with_job(desired, name, spec):
    jobs = dict(desired.jobs)
    jobs[name] = jobs[name].model_copy(update={"spec": spec})
    return desired.model_copy(update={"jobs": jobs})


__all__ = ["pending_reason", "explain_job", "Explanation", "Alternative", "tenant_usage", "replace"]
