"""Placement and provisioning in one OR-Tools CP-SAT model.

Decides together which existing instances to keep, which new ones to create
(type, zone, market) and how many replicas of each demand run on each. The
objective is lexicographic, solved in two stages:
  1. place the most priority-weighted work;
  2. holding that, minimise $/hour (instances plus data egress), then churn
     (running replicas moved, instances created).
Pure: a function of the Problem; the result says whether it is optimal and the gap.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from reconciler.errors import SolverError
from reconciler.greedy import Greedy, greedy
from reconciler.problem import DIMS, Demand, Problem, Unit, fit, units_of

MILLI = 1000  # costs are integers in milli-dollars per hour
SCALE = {"gpus": 1, "cpu": 1000, "memory_gib": 1000}  # CPU and memory in thousandths


@dataclass(frozen=True)
class Solution:
    status: str
    optimal: bool
    gap: float  # relative gap on the cost stage (0 when optimal)
    seconds: float
    keep: frozenset[str]  # existing instance ids kept
    new_units: dict[str, int]  # unit key -> instances to create
    x: dict[tuple[str, str], int]  # (demand key, unit key) -> replicas
    placed: dict[str, int]  # demand key -> jobs placed
    units: dict[str, Unit] = field(default_factory=dict)
    work: int = 0
    cost_milli: int = 0


def solve(problem: Problem, time_limit: float = 20.0, workers: int | None = None, seed: int = 0) -> Solution:
    t0 = time.monotonic()
    m = cp_model.CpModel()
    units = units_of(problem)
    demands = problem.demands

    use: dict[str, cp_model.IntVar] = {}
    for u in units:
        if u.cap.existing:
            use[u.key] = m.new_bool_var(f"keep[{u.key}]")
            if u.cap.keep_blocker is not None:
                m.add(use[u.key] == 0)
        else:
            use[u.key] = m.new_int_var(0, u.count, f"new[{u.key}]")
    # Symmetry: slots of one offer are used in order.
    prev: dict[str, str] = {}
    for u in units:
        if not u.cap.existing and not u.cap.aggregate:
            if u.cap.key in prev:
                m.add(use[prev[u.cap.key]] >= use[u.key])
            prev[u.cap.key] = u.key

    # Placement variables per shape, not per demand: demands that differ only in tenant or
    # priority are interchangeable for capacity, so one x per (shape, unit) is exact and
    # the per-demand counts (quotas, objective) are tied to it by one equation per shape.
    groups = _shape_groups(demands)
    x: dict[tuple[str, str], cp_model.IntVar] = {}
    by_unit: dict[str, list[tuple[Demand, cp_model.IntVar]]] = {u.key: [] for u in units}
    by_group: dict[str, list[tuple[Unit, cp_model.IntVar]]] = {gk: [] for gk in groups}
    for gk, members in groups.items():
        rep = members[0]
        total = sum(len(d.jobs) * d.replicas for d in members)
        for u in units:
            f = fit(rep, u.cap)
            if f <= 0 or (u.cap.existing and u.cap.keep_blocker is not None):
                continue
            v = m.new_int_var(0, min(total, f * u.count), f"x[{gk},{u.key}]")
            x[(gk, u.key)] = v
            by_unit[u.key].append((rep, v))
            by_group[gk].append((u, v))

    # Capacity in every dimension; GPUs can never be overcommitted.
    for u in units:
        items = by_unit[u.key]
        if not items:
            continue
        for dim in DIMS:
            if any(d.req(dim) for d, _ in items):
                s = SCALE[dim]
                m.add(sum(round(d.req(dim) * s) * v for d, v in items) <= math.floor(u.cap.cap(dim) * s) * use[u.key])

    # Demands: all replicas of a gang or none, in one zone; identical jobs counted.
    placed: dict[str, cp_model.IntVar] = {}
    for gk, members in groups.items():
        pairs = by_group[gk]
        if members[0].gang:
            d = members[0]
            p = m.new_bool_var(f"placed[{d.key}]")
            m.add(sum(v for _, v in pairs) == d.replicas * p)
            zones = sorted({(u.cap.cloud, u.cap.zone) for u, _ in pairs})
            if len(zones) > 1:
                y = {z: m.new_bool_var(f"zone[{d.key},{z}]") for z in zones}
                m.add(sum(y.values()) == p)
                for u, v in pairs:
                    m.add(v <= d.replicas * y[(u.cap.cloud, u.cap.zone)])
            placed[d.key] = p
        else:
            for d in members:
                placed[d.key] = m.new_int_var(0, len(d.jobs), f"placed[{d.key}]")
            m.add(sum(v for _, v in pairs) == sum(placed[d.key] for d in members))

    # Tenant quotas: exact, on requested resources.
    for tenant, caps in problem.tenant_caps.items():
        mine = [d for d in demands if d.tenant == tenant]
        for dim, limit in caps.items():
            terms = [round(d.req(dim) * SCALE[dim]) * d.replicas * placed[d.key] for d in mine if d.req(dim)]
            if terms:
                m.add(sum(terms) <= math.floor(limit * SCALE[dim] + 1e-6))

    # Pools: min/max instances.
    for pool, (lo, hi) in problem.pool_bounds.items():
        vs = [use[u.key] for u in units if u.cap.pool == pool]
        if vs:
            m.add(sum(vs) >= lo)
            m.add(sum(vs) <= hi)
        elif lo > 0:
            m.add(0 >= 1)  # nothing can be bought for this pool, yet it needs lo instances

    # Spot policy: spot share of the fleet's GPUs (vCPUs for a CPU-only fleet) and type diversity.
    sp = problem.spot
    dim = "gpus" if any(u.cap.gpus for u in units) else "cpu"
    spot_units = [u for u in units if u.cap.market == "spot"]
    if spot_units and sp.max_spot_fraction < 1:
        frac = round(sp.max_spot_fraction * 1000)
        total = sum(round(u.cap.cap(dim)) * use[u.key] for u in units)
        spot_total = sum(round(u.cap.cap(dim)) * use[u.key] for u in spot_units)
        m.add(1000 * spot_total <= frac * total)
    if spot_units and sp.min_instance_types > 1:
        any_spot = m.new_bool_var("any_spot")
        for u in spot_units:
            m.add(use[u.key] <= u.count * any_spot)
        types = sorted({u.cap.instance_type for u in spot_units})
        used_type = {t: m.new_bool_var(f"spot_type[{t}]") for t in types}
        for t in types:
            m.add(used_type[t] <= sum(use[u.key] for u in spot_units if u.cap.instance_type == t))
        m.add(sum(used_type.values()) >= sp.min_instance_types * any_spot)

    cost = sum(round(u.cap.price * MILLI) * use[u.key] for u in units)
    unit_by_key = {u.key: u for u in units}
    egress_terms = []
    for (gk, uk), v in x.items():
        e = problem.egress.get((groups[gk][0].key, unit_by_key[uk].cap.key))
        if e:
            egress_terms.append(round(e * MILLI) * v)
    total_cost = cost + sum(egress_terms)
    if problem.budget is not None:  # prices rounded up, budget down: never over by a fraction of a cent
        m.add(sum(math.ceil(u.cap.price * MILLI) * use[u.key] for u in units) <= math.floor(problem.budget * MILLI))

    work = sum(d.weight * d.replicas * placed[d.key] for d in demands)

    # Stage 1: most priority-weighted work, warm-started from greedy best-fit (which
    # itself keeps running replicas where they are), so CP-SAT never does worse.
    g = greedy(problem)
    if time_limit <= 0:  # --time-limit 0: greedy best-fit only
        return _from_greedy(g, units, problem, None, t0)
    for uk, v in use.items():
        m.add_hint(v, g.use.get(uk, 0))
    gx = _by_group(g.x, groups)
    for key, v in x.items():  # a complete hint: CP-SAT ignores most of a partial one at this size
        m.add_hint(v, gx.get(key, 0))
    for dk, v in placed.items():
        m.add_hint(v, g.placed.get(dk, 0))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers or max(1, min(8, os.cpu_count() or 1))
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = max(0.1, time_limit / 2)
    # Presolve costs more than it saves on this model: at 1k jobs it took the whole stage-1
    # budget, while without it the warm-start hint is a solution in under a second
    # (bench/README.md). Slots are already ordered, so symmetry detection is not needed either.
    solver.parameters.cp_model_presolve = False
    solver.parameters.symmetry_level = 0
    m.maximize(work)
    st1 = solver.solve(m)
    if st1 == cp_model.INFEASIBLE:
        raise SolverError(
            "the fleet's hard rules contradict each other even with no job placed: check pool min_instances "
            "against max_hourly_budget, max_spot_fraction and pools that can buy nothing"
        )
    if st1 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _from_greedy(g, units, problem, solver, t0)
    best_work = round(solver.objective_value)
    stage1_optimal = st1 == cp_model.OPTIMAL

    # Stage 2: cheapest, then least churn, among answers placing that much work.
    kept_terms = []
    for (gk, uk), n in _by_group(problem.running, groups).items():
        if (gk, uk) in x:
            k = m.new_int_var(0, n, f"kept[{gk},{uk}]")
            m.add(k <= x[(gk, uk)])
            kept_terms.append(k)
    running_total = sum(problem.running.values())
    created = sum(use[u.key] for u in units if not u.cap.existing)
    churn_max = running_total + sum(u.count for u in units if not u.cap.existing) + 1
    m.add(work >= best_work)
    m.clear_hints()
    if g.work >= best_work:
        # Greedy already places that much work and, unlike stage 1's answer, it chose
        # cheap capacity and kept what runs: a far better start for the cost stage.
        hint_use, hint_x, hint_placed = g.use, _by_group(g.x, groups), g.placed
    else:
        hint_use = {k: solver.value(v) for k, v in use.items()}
        hint_x = {k: solver.value(v) for k, v in x.items()}
        hint_placed = {k: solver.value(v) for k, v in placed.items()}
    for k, v in use.items():
        m.add_hint(v, hint_use.get(k, 0))
    for k, v in x.items():
        m.add_hint(v, hint_x.get(k, 0))
    for k, v in placed.items():
        m.add_hint(v, hint_placed.get(k, 0))
    m.minimize(total_cost * churn_max + (running_total - sum(kept_terms)) + created)
    solver.parameters.max_time_in_seconds = max(0.1, time_limit - (time.monotonic() - t0))
    st2 = solver.solve(m)
    if st2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        value = solver.value
        obj, bound = solver.objective_value, solver.best_objective_bound
        gap = 0.0 if st2 == cp_model.OPTIMAL or obj <= 0 else max(0.0, (obj - bound) / obj)
    else:  # no time left to improve on the hint: it is a valid answer, with an unknown cost gap
        hints = {**{use[k].index: n for k, n in hint_use.items() if k in use}, **{x[k].index: n for k, n in hint_x.items() if k in x},
                 **{placed[k].index: n for k, n in hint_placed.items() if k in placed}}
        value = lambda v: hints.get(v.index, 0)  # noqa: E731
        gap = 1.0

    placed_val = {d.key: value(placed[d.key]) for d in demands}
    x_val = _split({k: value(v) for k, v in x.items() if value(v) > 0}, groups, placed_val, problem.running)
    cost_val = sum(round(u.cap.price * MILLI) * value(use[u.key]) for u in units)
    return Solution(
        status="OPTIMAL" if (st2 == cp_model.OPTIMAL and stage1_optimal) else "FEASIBLE",
        optimal=st2 == cp_model.OPTIMAL and stage1_optimal,
        gap=gap, seconds=time.monotonic() - t0,
        keep=frozenset(u.cap.instance_id for u in units if u.cap.existing and value(use[u.key])),
        new_units={u.key: value(use[u.key]) for u in units if not u.cap.existing and value(use[u.key]) > 0},
        x=x_val, placed=placed_val,
        units=unit_by_key, work=best_work, cost_milli=cost_val,
    )



def _from_greedy(g: Greedy, units: list[Unit], problem: Problem, solver: cp_model.CpSolver | None, t0: float) -> Solution:
    """CP-SAT found nothing in time (or had no time): answer with greedy best-fit, and say so."""
    bound = solver.best_objective_bound if solver is not None else None
    gap = max(0.0, (bound - g.work) / bound) if bound and bound > 0 and math.isfinite(bound) else 1.0
    by_key = {u.key: u for u in units}
    return Solution(
        status="GREEDY_FALLBACK", optimal=False, gap=gap, seconds=time.monotonic() - t0,
        keep=frozenset(by_key[k].cap.instance_id for k, n in g.use.items() if n and by_key[k].cap.existing),
        new_units={k: n for k, n in g.use.items() if n and not by_key[k].cap.existing},
        x={k: n for k, n in g.x.items() if n}, placed=dict(g.placed), units=by_key, work=g.work,
        cost_milli=round(g.cost * MILLI),
    )


def _shape_groups(demands: tuple[Demand, ...]) -> dict[str, list[Demand]]:
    """Demands interchangeable for capacity: same resources and placement rules.
    Gangs stay alone (each picks its own zone)."""
    out: dict[tuple, list[Demand]] = {}
    for d in demands:
        key = ("gang", d.key) if d.gang else (d.gpus, d.gpu_type, d.cpu, d.memory_gib, d.spot, d.pools, d.regions,
                                             d.data_location, d.data_gib, d.hours)
        out.setdefault(key, []).append(d)
    return {f"s{i}": members for i, members in enumerate(out.values())}


def _by_group(per_demand: dict[tuple[str, str], int], groups: dict[str, list[Demand]]) -> dict[tuple[str, str], int]:
    of = {d.key: gk for gk, members in groups.items() for d in members}
    out: dict[tuple[str, str], int] = {}
    for (dk, uk), n in per_demand.items():
        out[(of[dk], uk)] = out.get((of[dk], uk), 0) + n
    return out


def _split(xg: dict[tuple[str, str], int], groups: dict[str, list[Demand]], placed: dict[str, int],
           running: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Share each shape's replicas per unit among its demands: replicas go back where their
    demand runs now first, so the plan's moves are the ones the solver counted."""
    out: dict[tuple[str, str], int] = {}
    for gk, members in groups.items():
        left = {d.key: placed.get(d.key, 0) * d.replicas for d in members}
        cells = [(uk, n) for (g, uk), n in xg.items() if g == gk]
        room = dict(cells)
        for uk, _ in cells:  # pass 1: running replicas stay
            for d in members:
                take = min(running.get((d.key, uk), 0), left[d.key], room[uk])
                if take:
                    out[(d.key, uk)] = out.get((d.key, uk), 0) + take
                    left[d.key] -= take
                    room[uk] -= take
        for uk, _ in cells:  # pass 2: the rest, in demand order
            for d in members:
                take = min(left[d.key], room[uk])
                if take:
                    out[(d.key, uk)] = out.get((d.key, uk), 0) + take
                    left[d.key] -= take
                    room[uk] -= take
    return out
