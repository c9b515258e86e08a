"""Greedy best-fit: first-fit decreasing by priority and dominant resource.

Three uses: CP-SAT's warm start (its answer is never worse than this), the
fallback when CP-SAT finds nothing in time (said so in the plan), and the
baseline the benchmark compares against. Pure, and it honours every hard rule
the model does, except spot type diversity, which it meets by buying no spot
at all when the policy asks for more than one type."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reconciler.problem import DIMS, Demand, Problem, Unit, fit, units_of


@dataclass
class _Inst:
    unit: Unit
    free: list[float]  # gpus, cpu, memory_gib
    existing: bool


@dataclass
class Greedy:
    use: dict[str, int] = field(default_factory=dict)  # unit key -> instances used (0/1, or a count)
    x: dict[tuple[str, str], int] = field(default_factory=dict)  # (demand, unit) -> replicas
    placed: dict[str, int] = field(default_factory=dict)  # demand -> jobs placed
    cost: float = 0.0  # USD/h of instances
    work: int = 0


def _dominant(d: Demand, units: list[Unit]) -> float:
    """The demand's largest share of a typical instance it fits (for the decreasing order)."""
    shares = [max(d.req(dim) / u.cap.cap(dim) for dim in DIMS if u.cap.cap(dim)) for u in units if fit(d, u.cap)]
    return max(shares, default=0.0)


def greedy(problem: Problem) -> Greedy:
    units = units_of(problem)
    g = Greedy(use={u.key: 0 for u in units}, placed={d.key: 0 for d in problem.demands})
    sp = problem.spot
    allow_spot = sp.min_instance_types <= 1
    pool_count = {p: 0 for p in problem.pool_bounds}
    open_: list[_Inst] = []
    tenant_used: dict[str, dict[str, float]] = {t: {dim: 0.0 for dim in DIMS} for t in problem.tenant_caps}
    fleet = {"gpus": 0.0, "spot_gpus": 0.0}
    dim = "gpus" if any(u.cap.gpus for u in units) else "cpu"

    order = sorted(problem.demands, key=lambda d: (-d.priority, -d.gang, -_dominant(d, units), d.key))
    by_key = {u.key: u for u in units}
    opened: dict[str, _Inst] = {}  # existing instances opened so far

    # Phase 1: what runs stays where it is (whole gangs only), within quotas and pool limits.
    running_of: dict[str, list[tuple[str, int]]] = {}
    for (dk, uk), n in problem.running.items():
        if uk in by_key and by_key[uk].cap.keep_blocker is None:
            running_of.setdefault(dk, []).append((uk, n))
    for d in order:
        cells = sorted(running_of.get(d.key, []))
        if d.gang:
            if sum(n for _, n in cells) == d.replicas and _keep(g, problem, d, cells, by_key, opened, open_, pool_count, fleet, dim, tenant_used):
                g.placed[d.key] = 1
        else:
            for cell in cells:
                if _keep(g, problem, d, [cell], by_key, opened, open_, pool_count, fleet, dim, tenant_used):
                    g.placed[d.key] += cell[1]

    # Pool minimums, before any job: they are owed whatever else happens, so they come out of
    # the budget first (and can host work). Idle existing instances first, then the cheapest.
    for pool, (lo, _) in problem.pool_bounds.items():
        for u in sorted((u for u in units if u.cap.pool == pool), key=lambda u: (not u.cap.existing, u.cap.price, u.cap.key, u.slot)):
            if pool_count[pool] >= lo:
                break
            if (u.cap.existing and u.cap.keep_blocker is None and not g.use[u.key]) or (not u.cap.existing and g.use[u.key] < u.count):
                if u.cap.market == "spot" and not allow_spot:
                    continue
                _open(g, u, open_, pool_count, fleet, dim, existing=u.cap.existing)

    # Phase 2: everything else, by priority and size.
    for d in order:
        for _ in range(len(d.jobs) - g.placed[d.key]):
            need = {k: d.req(k) * d.replicas for k in DIMS}
            caps = problem.tenant_caps.get(d.tenant, {})
            if any(tenant_used.setdefault(d.tenant, {k: 0.0 for k in DIMS})[k] + need[k] > caps[k] + 1e-9 for k in caps):
                break  # identical jobs: none of the rest fits the quota either
            if not _place(g, problem, d, units, open_, pool_count, fleet, dim, allow_spot):
                break
            g.placed[d.key] += 1
            g.work += d.weight * d.replicas
            for k in DIMS:
                tenant_used[d.tenant][k] += need[k]

    return g


def _keep(g: Greedy, problem: Problem, d: Demand, cells: list[tuple[str, int]], by_key: dict[str, Unit],
          opened: dict[str, "_Inst"], open_: list["_Inst"], pool_count: dict, fleet: dict, dim: str, tenant_used: dict) -> bool:
    """Keep replicas of d on the existing instances they run on now (cells: unit key,
    replicas there); all or nothing."""
    replicas = sum(n for _, n in cells)
    caps = problem.tenant_caps.get(d.tenant, {})
    used = tenant_used.setdefault(d.tenant, {k: 0.0 for k in DIMS})
    if any(used[k] + d.req(k) * replicas > caps[k] + 1e-9 for k in caps):
        return False
    new_per_pool: dict[str, int] = {}
    for uk, n in cells:
        inst = opened.get(uk)
        free = inst.free if inst else [by_key[uk].cap.gpus, by_key[uk].cap.cpu, by_key[uk].cap.memory_gib]
        if free[0] < d.gpus * n or free[1] < d.cpu * n - 1e-9 or free[2] < d.memory_gib * n - 1e-9:
            return False
        if inst is None:
            pool = by_key[uk].cap.pool
            new_per_pool[pool] = new_per_pool.get(pool, 0) + 1
    if any(pool_count[p] + k > problem.pool_bounds[p][1] for p, k in new_per_pool.items()):
        return False
    if problem.budget is not None and g.cost + sum(by_key[uk].cap.price for uk, _ in cells if uk not in opened) > problem.budget + 1e-9:
        return False
    for uk, n in cells:
        if uk not in opened:
            opened[uk] = _open(g, by_key[uk], open_, pool_count, fleet, dim, existing=True)
        for _ in range(n):
            _take(d, opened[uk])
        g.x[(d.key, uk)] = g.x.get((d.key, uk), 0) + n
    for k in DIMS:
        used[k] += d.req(k) * replicas
    g.work += d.weight * replicas
    return True


def _open(g: Greedy, u: Unit, open_: list[_Inst], pool_count: dict, fleet: dict, dim: str, existing: bool) -> _Inst:
    g.use[u.key] += 1
    g.cost += u.cap.price
    pool_count[u.cap.pool] += 1
    fleet["gpus"] += u.cap.cap(dim)
    if u.cap.market == "spot":
        fleet["spot_gpus"] += u.cap.cap(dim)
    inst = _Inst(u, [u.cap.gpus, u.cap.cpu, u.cap.memory_gib], existing)
    open_.append(inst)
    return inst


def _fits(d: Demand, inst: _Inst) -> bool:
    return inst.free[0] >= d.gpus and inst.free[1] >= d.cpu - 1e-9 and inst.free[2] >= d.memory_gib - 1e-9


def _take(d: Demand, inst: _Inst) -> None:
    inst.free[0] -= d.gpus
    inst.free[1] -= d.cpu
    inst.free[2] -= d.memory_gib


def _can_buy(problem: Problem, g: Greedy, u: Unit, pool_count: dict, fleet: dict, dim: str, allow_spot: bool, extra_cost: float = 0.0) -> bool:
    c = u.cap
    if c.existing:
        if c.keep_blocker is not None or g.use[u.key]:
            return False
    elif g.use[u.key] >= u.count:
        return False
    if pool_count[c.pool] >= problem.pool_bounds[c.pool][1]:
        return False
    if problem.budget is not None and g.cost + extra_cost + c.price > problem.budget + 1e-9:
        return False
    if c.market == "spot":
        if not allow_spot:
            return False
        f = problem.spot.max_spot_fraction
        if fleet["spot_gpus"] + c.cap(dim) > f * (fleet["gpus"] + c.cap(dim)) + 1e-9:
            return False
    return True


def _place(g: Greedy, problem: Problem, d: Demand, units: list[Unit], open_: list[_Inst], pool_count: dict,
           fleet: dict, dim: str, allow_spot: bool) -> bool:
    """Place one job (all its replicas, in one zone): best fit on open instances, then the
    cheapest instances to buy, zone by zone; all or nothing."""
    zones = sorted({(u.cap.cloud, u.cap.zone) for u in units if fit(d, u.cap)})
    best = None
    for zone in zones:
        trial = _try_zone(g, problem, d, units, open_, pool_count, fleet, dim, allow_spot, zone)
        if trial is not None and (best is None or trial[0] < best[0]):
            best = trial
    if best is None:
        return False
    _, on_open, to_buy = best
    for inst in on_open:
        _take(d, inst)
        g.x[(d.key, inst.unit.key)] = g.x.get((d.key, inst.unit.key), 0) + 1
    for u, n in to_buy:
        for _ in range(math.ceil(n / fit(d, u.cap))):
            inst = _open(g, u, open_, pool_count, fleet, dim, existing=u.cap.existing)
            while n and _fits(d, inst):
                _take(d, inst)
                g.x[(d.key, u.key)] = g.x.get((d.key, u.key), 0) + 1
                n -= 1
    return True


def _try_zone(g, problem, d, units, open_, pool_count, fleet, dim, allow_spot, zone):
    """Cost of placing d's replicas in one zone: (extra $/h, open instances used, (unit, replicas) to buy)."""
    left = d.replicas
    free = {id(i): list(i.free) for i in open_}
    on_open = []
    # Best fit: the open instance with the least room left that still fits.
    here = {uk for (dk, uk) in problem.running if dk == d.key}  # where replicas of this class run now
    cands = sorted((i for i in open_ if (i.unit.cap.cloud, i.unit.cap.zone) == zone and fit(d, i.unit.cap)),
                   key=lambda i: (i.unit.key not in here, i.free[0] - d.gpus, i.free[1] - d.cpu))
    for inst in cands:
        while left and free[id(inst)][0] >= d.gpus and free[id(inst)][1] >= d.cpu - 1e-9 and free[id(inst)][2] >= d.memory_gib - 1e-9:
            f = free[id(inst)]
            f[0] -= d.gpus
            f[1] -= d.cpu
            f[2] -= d.memory_gib
            on_open.append(inst)
            left -= 1
    extra = sum(problem.egress.get((d.key, i.unit.cap.key), 0.0) for i in on_open)
    to_buy = []
    if left:
        # Cheapest per replica first; existing idle instances cost their price like new ones.
        offers = sorted((u for u in units if (u.cap.cloud, u.cap.zone) == zone and fit(d, u.cap)),
                        key=lambda u: (u.cap.price / min(fit(d, u.cap), d.replicas) + problem.egress.get((d.key, u.cap.key), 0.0),
                                       not u.cap.existing, u.cap.key, u.slot))  # at equal price, an idle instance we have
        bought: dict[str, int] = {}
        spent = 0.0
        counts = dict(pool_count)
        fl = dict(fleet)
        for u in offers:
            while left:
                probe = _Probe(g, u, bought)
                if not _can_buy(problem, probe, u, counts, fl, dim, allow_spot, spent):
                    break
                n = min(left, fit(d, u.cap))
                bought[u.key] = bought.get(u.key, 0) + 1
                to_buy.append((u, n))
                spent += u.cap.price
                extra += u.cap.price + n * problem.egress.get((d.key, u.cap.key), 0.0)
                counts[u.cap.pool] += 1
                fl["gpus"] += u.cap.cap(dim)
                if u.cap.market == "spot":
                    fl["spot_gpus"] += u.cap.cap(dim)
                left -= n
        if left:
            return None
        merged: dict[str, tuple[Unit, int]] = {}
        for u, n in to_buy:
            merged[u.key] = (u, merged.get(u.key, (u, 0))[1] + n)
        to_buy = list(merged.values())
    return extra, on_open, to_buy


class _Probe:
    """A view of Greedy.use that also counts instances tentatively bought in a trial."""

    def __init__(self, g: Greedy, u: Unit, bought: dict[str, int]):
        self.use = {u.key: g.use[u.key] + bought.get(u.key, 0)}
        self.cost = g.cost
