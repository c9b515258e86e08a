"""`reconcile explain JOB`: where the job landed and what the alternatives cost, or which rule keeps
it pending (diagnosis.pending_reason, as the plan says), and then proof of what would change it: the
fleet planned again with one rule relaxed at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from reconciler.problem.diagnosis import never_keeps, pending_reason  # (re-exported: the plan's pending reasons were long imported from here)
from reconciler.ledger import DIM_UNITS, Ledger, charge, money, plan_ledger, quota_ok, round_up
from reconciler.model import PRIORITY_CLASSES
from reconciler.plan.quality import gap_withheld, proofs_of
from reconciler.problem import DIMS, Capacity, Demand, Host, Problem, fit, held_once_applied, priority_band, rules_allow
from reconciler.whatif import WhatIf
from reconciler.words import amount, gpu_span


def _what(d: Demand) -> str:
    if d.mig:
        return f"{d.replicas * d.bundle}x {d.mig[1] // d.bundle} MIG {d.mig[0]}"
    if d.gpus:
        return f"{d.replicas * d.bundle}x {d.gpus // d.bundle} {d.gpu_type}"
    return f"{d.replicas * d.bundle}x {d.cpu / d.bundle:g} vCPU"


# ---------------------------------------------------------------- reconcile explain JOB


@dataclass(frozen=True)
class Alternative:
    where: str  # pool cloud/zone type market
    per_replica: float  # USD/h per replica, instance share plus egress and latency
    note: str = ""


@dataclass(frozen=True)
class Explanation:
    job: str
    state: str  # running | reserved (kept, no `run`: nothing started) | placed | moved | pending | evicted
    summary: str
    details: tuple[str, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    would_change: tuple[str, ...] = ()  # relaxations that, solved again, place the job
    tried: tuple[str, ...] = field(default=())  # relaxations tried that did not
    unchanged: str = ""  # a pending or evicted job that no change tried places: why, as its reason says


def _band(priority: int | str) -> str:
    """The class of an integer priority that is not a class's own value: preemption and the solver's tiers compare
    classes, so 99 ranks as normal ("class normal: 10-99 rank alike"); "" for a class name or value."""
    if isinstance(priority, str) or priority in PRIORITY_CLASSES.values():
        return ""
    return f"{priority_band(priority)} rank alike"


def _cap_label(c: Capacity) -> str:
    return f"{c.pool} {c.cloud}/{c.zone} {c.instance_type} {c.market}" + (f" (reserved: {c.reservation})" if c.reservation else "")


def explain_job(job: str, desired, observed, problem: Problem, plan, resolve) -> Explanation:
    """`resolve(desired)` plans a modified desired state against the same fleet and returns its
    Plan: used to check what would change a pending job's fate."""
    demand = next((d for d in problem.demands if job in d.jobs), None)
    if demand is None:
        raise KeyError(job)
    change = next(j for j in plan.jobs if j.job == job)
    d = demand
    spec = desired.jobs[job].spec
    cpu = f"{d.cpu / d.bundle:g} vCPU and " if d.gpus or d.mig else ""  # (a CPU job's _what is its vCPU already)
    band, aged_band = _band(spec.priority), _band(d.priority)
    priority = f"priority {spec.priority}" + (f" ({band})" if band else "")
    if d.priority != d.base_priority:
        priority += f" (aged to {d.priority}" + (f", {aged_band}" if aged_band else "") + ")"
    details = [f"asks {_what(d)}{' (nvlink)' if d.nvlink else ''}{', ' if cpu else ' and '}{cpu}{d.memory_gib / d.bundle:g} GiB "
               f"per replica; tenant {d.tenant}; {priority}; spot {d.spot}"]
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
    dl = plan.rules.get("deadlines", {}).get(job)
    if dl is not None:
        details.append(f"deadline {dl['deadline']}: must start by {dl['start_by']}; {dl['condition']}: {dl['message']}"
                       + (" (ranks above work of its class without a deadline)" if d.deadline_rank else ""))
    if d.licenses:
        details.append("holds " + ", ".join(f"{n // d.bundle} {name} license(s) per replica" for name, n in d.licenses) + " while it runs")
    compatible = [c for c in problem.capacities if fit(d, c) > 0 and not (isinstance(c, Host) and c.keep_blocker is not None)]
    by_offer: dict[str, Capacity] = {}
    for c in compatible:
        by_offer.setdefault(c.offer_key, c)
    alts = sorted(
        (Alternative(_cap_label(c), round(charge(d, c) + problem.cost_coef(d, c), 4)) for c in by_offer.values()),
        key=lambda a: (a.per_replica, a.where))
    if change.instances:
        state = {"keep": "running" if spec.run is not None else "reserved", "place": "placed", "move": "moved"}[change.action]
        summary = f"{state} on {_where(change, plan, problem)}"
        if change.reason:
            details.append(change.reason)
        if problem.tenants.get(d.tenant) and problem.tenants[d.tenant].guarantee:
            placed = {j.job for j in plan.jobs if j.instances}
            details.append(_guarantee_text(job, d, placed, held_once_applied(problem, placed, observed), observed))
        of = f" {proofs_of(plan.solver)}" if plan.solver.narrowed or plan.solver.held else ""  # (its bounds are theirs)
        # (the gap as the plan's own line claims it, or why it claims none: plan.quality.gap_withheld)
        withheld = gap_withheld(plan.solver, plan.cost_after)
        gap = (f" (no optimality gap is claimed: {withheld})" if withheld else
               f" (cost gap {plan.solver.gap:.1%}{of})" if not plan.solver.optimal else "")
        details.append(f"the plan is {plan.solver.status.lower()}" + gap + _cheaper_options(plan.solver))
        return Explanation(job, state, summary, tuple(details), tuple(alts[:5]))

    state = "evicted" if change.action == "evict" else "pending"
    summary = f"{state}: {change.reason.removeprefix(f'{state}: ')}"  # (an evicted job's reason starts "evicted: " already)
    ledger = plan_ledger(problem, plan.creates, plan.kept, [(j.job, j.instances) for j in plan.jobs if j.instances])
    would, tried = [], []
    for candidates in _relaxations(desired, d, job, problem, ledger) + _cloud_quota_relaxations(desired, observed, ledger, d):
        last = None
        for label, relaxed, *fleet in candidates:  # amounts in increasing order: the first that places the job is reported
            try:
                p2 = resolve(relaxed, *fleet)
            except Exception as e:  # a relaxation that breaks another rule is simply not an answer
                last = WhatIf(f"{label}: {e}", change=label, outcome="refused", reason=str(e))
                continue
            jc = next((j for j in p2.jobs if j.job == job), None)
            if jc is not None and jc.instances:
                text, lost, moved, delta = _side_effects(plan, p2, job, problem)
                would.append(WhatIf(f"{label}: it would run ({text})", change=label, outcome="runs", fleet_cost_delta=delta,
                                    evicts=tuple(lost), moves=tuple(moved)))
                last = None
                break
            why = jc.reason if jc else "gone"
            last = WhatIf(f"{label}: still pending ({why})", change=label, outcome="still pending", reason=why)
        if last is not None:
            tried.append(last)
    return Explanation(job, state, summary, tuple(details), tuple(alts[:5]), tuple(would), tuple(tried),
                       "" if would else _unchanged(job, change.reason, problem))


def _unchanged(job: str, reason: str, problem: Problem) -> str:
    """Why no single change tried places the job, as true as its reason: what no capacity the fleet could ever have
    allows (problem.static_pending: no instance type large enough, no pool in its regions, ...), or several limits where
    the reason says several bind. (A 3x 2 T4 instance-gang, the largest type 4 T4, was said to be held by "several limits
    bind at once", where its reason named the one: no instance type is large enough.)"""
    static = problem.static_pending.get(job)
    if static:
        return f"No single change tried places it: {static}."
    if "several limits bind" in reason:
        return "No single change tried places it; several limits bind at once."
    return "No single change tried places it."


_BORROWED = "on borrowed capacity (beyond its tenant's guarantee): reclaimable when another tenant needs its guarantee"


def _guarantee_text(job: str, d: Demand, placed: set[str], held: frozenset[str], observed) -> str:
    """Whether a placed job is inside its tenant's guarantee, as the emitted plan leaves it (`held`:
    problem.held_once_applied, the guarantee filled as the plan after the apply fills it). A running job's answer is by
    name. New jobs of one group of identical jobs are alike until they run, so a group split across the guarantee says
    how many of it are inside, not which. (Said of the whole group as one yes/no: all three of tenant a's identical
    1-GPU jobs, a guarantee of 2 GPUs, were each "on borrowed capacity", while two of them were protected. And read
    from the solver's count, where a part greedy best-fit answered, or greedy's whole plan, has none: nothing was said.)"""
    if observed.placements.get(job):
        return "inside its tenant's guarantee" if job in held else _BORROWED
    new = sorted(j for j in d.jobs if j in placed and not observed.placements.get(j))
    fresh = sum(1 for j in new if j in held)
    if fresh == len(new):
        return "inside its tenant's guarantee"
    if fresh == 0:
        return _BORROWED
    return (f"of its identical jobs this plan places {len(new)} anew ({', '.join(new[:5])}{' and more' if len(new) > 5 else ''}): "
            f"{fresh} inside its tenant's guarantee, {len(new) - fresh} on borrowed capacity (beyond the guarantee: reclaimable when "
            f"another tenant needs its guarantee); which of them is which is settled once they run")


def _cheaper_options(solver) -> str:
    """What the plan says of the options cheaper than where the job runs. Only an optimal plan proves each is taken
    by the rules or costs more in the whole plan; greedy best-fit's (--time-limit 0: ml-platform's at $206.83/h, where
    CP-SAT's is $199.00/h) or one the search did not prove may have missed one."""
    if solver.optimal:
        return "; cheaper options are either taken by the rules above or cost more in the whole plan (pool sizes, spot share, budgets, moves)"
    who = "greedy best-fit" if solver.status == "GREEDY_FALLBACK" else "the search"
    return (f"; a cheaper option is taken by the rules above, costs more in the whole plan (pool sizes, spot share, budgets, "
            f"moves), or was not found by {who}: this plan is not proven the cheapest")


def _where(change, plan, problem: Problem) -> str:
    """The instances a placed job's replicas run on: type, market, zone, and the GPUs it holds there."""
    caps = {c.key: c for c in problem.capacities}
    hosts = {}
    for i in change.instances:
        if i.startswith("+"):
            cr = next(c for c in plan.creates if c.ref == i)
            hosts[i] = f"{cr.ref} (new {cr.site.instance_type} {cr.site.market}, {cr.site.cloud}/{cr.site.zone})"
        else:
            c = caps.get(i)
            hosts[i] = f"{i} ({c.instance_type} {c.market}, {c.cloud}/{c.zone})" if c else i
    return ", ".join(hosts[i] + (f" GPUs {gpu_span(g)}" if g else "") for i, g in zip(change.instances, change.gpus or [()] * len(change.instances)))


def _side_effects(plan, p2, job: str, problem: Problem) -> tuple[str, list[str], list[str], float]:
    """What else the re-planned fleet does differently: the $/h, and the other jobs it evicts
    (or no longer places) and the running ones it moves. Identical jobs (one demand) are alike to every
    rule, so a re-plan that keeps one where the plan kept its twin loses nothing: only the jobs a demand
    has fewer of count ("raise max_instances of cpu by 1: ... evicts g1" was said of a re-plan that kept g2
    in g1's stead, both 1-GPU jobs of a tenant whose quota held one)."""
    before = {j.job: j for j in plan.jobs}
    twins = {name: d.key for d in problem.demands for name in d.jobs}
    lost_of: dict[str, list[str]] = {}
    gained: dict[str, int] = {}
    for j in p2.jobs:
        if j.job != job and j.job in before and bool(j.instances) != bool(before[j.job].instances):
            if j.instances:
                gained[twins.get(j.job, j.job)] = gained.get(twins.get(j.job, j.job), 0) + 1
            else:
                lost_of.setdefault(twins.get(j.job, j.job), []).append(j.job)
    lost = sorted(n for dk, names in lost_of.items() for n in sorted(names)[:max(0, len(names) - gained.get(dk, 0))])
    moved = sorted(j.job for j in p2.jobs if j.job != job and j.action == "move" and j.job in before and before[j.job].action == "keep")
    delta = p2.cost_after - plan.cost_after
    out = [f"{'+' if delta >= -0.005 else ''}{money(delta)}/h for the fleet"]
    for verb, names in (("evicts or leaves pending", lost), ("moves", moved)):
        if names:
            out.append(f"{verb} {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
    return "; ".join(out), lost, moved, delta


def _amounts(shortfall: float, fallback: float, unit: float) -> list[float]:
    """Amounts to try, smallest first: what the ledger says is short, then three times that
    (other work may take part of a raise). Rounded up to `unit`; never zero."""
    base = shortfall if shortfall > 1e-9 else fallback
    if base <= 1e-9:
        return []
    return [round_up(base, unit), round_up(3 * base, unit)]  # (the pending reason's shortfall rounds the same way)


def _relaxations(desired, d: Demand, job: str, problem: Problem, ledger: Ledger):
    """One rule relaxed at a time; each a list of increasing amounts, starting from what the
    plan's ledger says is short (for budgets, quotas and pool sizes)."""
    out = []
    options = ledger.options(d, fit)
    refusals = [r for o in options for r in o.refusals]

    def short(rule: str, limit: str | None = None) -> float:
        v = [r.shortfall for r in refusals if r.rule == rule and (limit is None or r.limit == limit)]
        return min(v) if v else 0.0

    t = desired.tenants.get(d.tenant)
    if t is not None:
        q = t.spec.quota
        used = ledger.tenant_use(d.tenant)
        need = {dim: d.replicas * d.req(dim) for dim in DIMS}
        limits = {dim: q.cap(dim) for dim in DIMS if q.cap(dim) is not None}
        lack = {dim: used[dim] + need[dim] - lim for dim, lim in limits.items() if not quota_ok(used[dim], need[dim], lim)}
        if lack:
            cands = []
            for scale in (1, 3):
                more = {dim: math.ceil(v * scale - 1e-9) if dim == "gpus" else v * scale for dim, v in lack.items()}
                new_q = q.model_copy(update={dim: getattr(q, dim) + more[dim] for dim in more if getattr(q, dim) is not None})
                if q.burst is not None:
                    new_q = new_q.model_copy(update={"burst": q.burst.model_copy(update={
                        dim: getattr(q.burst, dim) + more[dim] for dim in more if getattr(q.burst, dim) is not None})})
                label = f"raise tenant {d.tenant} quota by " + ", ".join(amount(more[k], DIM_UNITS[k]) for k in sorted(more))
                cands.append((label, _with_tenant(desired, d.tenant, t.model_copy(update={"spec": t.spec.model_copy(update={"quota": new_q})}))))
            out.append(cands)
    lic = ledger.license_refusal(d)
    if lic is not None and lic.limit in desired.licenses:
        ldoc = desired.licenses[lic.limit]
        cands = []
        for n in sorted({math.ceil(lic.shortfall), math.ceil(3 * lic.shortfall)}):
            if lic.rule == "license":
                spec = ldoc.spec.model_copy(update={"count": ldoc.spec.count + n})
                label = f"raise License {lic.limit} count by {n} (to {ldoc.spec.count + n})"
            else:
                quotas = dict(ldoc.spec.tenant_quotas)
                quotas[d.tenant] += n
                spec = ldoc.spec.model_copy(update={"tenant_quotas": quotas})
                label = f"raise tenant {d.tenant}'s quota of License {lic.limit} by {n} (to {quotas[d.tenant]})"
            lics = dict(desired.licenses)
            lics[lic.limit] = ldoc.model_copy(update={"spec": spec})
            cands.append((label, desired.model_copy(update={"licenses": lics})))
        out.append(cands)
    # Only the pools the ledger says are at their max_instances for it (as the budgets below): explain offered "raise
    # max_instances of aws-a100, gcp-a100" for a job whose pools were at 0 of 3 (audit).
    at_max = {r.limit for r in refusals if r.rule == "pool-max"}
    pools = sorted({c.pool for c in problem.capacities if rules_allow(d, c) and c.pool in at_max})
    if pools:
        cands = []
        for n in sorted({max(1, round(short("pool-max"))), d.replicas}):
            grown = dict(desired.pools)
            for p in pools:
                pool = grown[p]
                grown[p] = pool.model_copy(update={"spec": pool.spec.model_copy(update={"max_instances": pool.spec.max_instances + n})})
            cands.append((f"raise max_instances of {', '.join(pools)} by {n}", desired.model_copy(update={"pools": grown})))
        out.append(cands)
    g = desired.guardrails
    if g.max_hourly_budget is not None and short("fleet-budget"):  # tried only where the ledger says it binds
        cheapest = min((o.price for o in options if o.price > 0), default=0.0)
        out.append([(f"raise max_hourly_budget by {money(a)}/h (to {money(g.max_hourly_budget + a)}/h)",
                     desired.model_copy(update={"guardrails": g.model_copy(update={"max_hourly_budget": g.max_hourly_budget + a})}))
                    for a in _amounts(short("fleet-budget"), cheapest, 0.01)])
    if d.tenant in g.tenant_hourly_budgets and short("tenant-budget"):
        cur = g.tenant_hourly_budgets[d.tenant]
        cheapest = min((charge(d, c) * d.replicas for c in problem.capacities if fit(d, c) > 0), default=0.0)
        cands = []
        for a in _amounts(short("tenant-budget"), cheapest, 0.01):
            tb = dict(g.tenant_hourly_budgets)
            tb[d.tenant] = cur + a
            cands.append((f"raise tenant {d.tenant}'s hourly budget by {money(a)}/h (to {money(cur + a)}/h)",
                          desired.model_copy(update={"guardrails": g.model_copy(update={"tenant_hourly_budgets": tb})})))
        out.append(cands)
    spec = desired.jobs[job].spec
    if spec.spot in ("never", "required"):
        out.append([("let it run on spot or on-demand (spot: eligible)", _with_job(desired, job, spec.model_copy(update={"spot": "eligible"})))])
    if spec.regions is not None or spec.clouds is not None or spec.pools is not None:
        out.append([("drop its region/cloud/pool allowlists", _with_job(desired, job, spec.model_copy(update={"regions": None, "clouds": None, "pools": None})))])
    if never_keeps(d, problem, ledger):  # its tenant's lower-class running jobs, kept: under LowerPriority its class may take their place
        pol = desired.placement
        out.append([("set PlacementPolicy preemption: LowerPriority (a tenant's higher-priority job may take its lower ones' place)",
                     desired.model_copy(update={"placement": pol.model_copy(update={"preemption": "LowerPriority"})}))])
    if spec.priority_weight() < 1000:
        out.append([("give it priority critical", _with_job(desired, job, spec.model_copy(update={"priority": "critical"})))])
    return [c for c in out if c]


def _cloud_quota_relaxations(desired, observed, ledger: Ledger, d: Demand):
    """A cloud account quota raised by what the ledger says is short (then three times that), planned against the same
    fleet with that quota's limit raised: (label, desired, observed) candidates."""
    from reconciler.ledger import quota_scope

    short: dict[str, float] = {}
    for o in ledger.options(d, fit):
        for r in o.refusals:
            if r.rule == "cloud-quota":
                short[r.limit] = min(short.get(r.limit, math.inf), r.shortfall)
    out = []
    for scope, n in sorted(short.items()):
        q = next((q for q in getattr(observed, "quotas", ()) if quota_scope(q) == scope), None)
        if q is None:
            continue
        cands = []
        for more in sorted({math.ceil(n), math.ceil(3 * n)}):
            raised = tuple(replace(x, limit=x.limit + more) if x is q else x for x in observed.quotas)
            cands.append((f"raise cloud quota {scope} by {amount(more, q.unit)} (to {q.limit + more:g})", desired,
                          replace(observed, quotas=raised)))
        out.append(cands)
    return out


def _with_tenant(desired, name, tenant):
    tenants = dict(desired.tenants)
    tenants[name] = tenant
    return desired.model_copy(update={"tenants": tenants})


def _with_job(desired, name, spec):
    jobs = dict(desired.jobs)
    jobs[name] = jobs[name].model_copy(update={"spec": spec})
    return desired.model_copy(update={"jobs": jobs})


__all__ = ["pending_reason", "explain_job", "Explanation", "Alternative", "replace"]
