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
from reconciler.problem import DIMS, Capacity, Demand, Problem, fit

MILLI = 1000  # costs are integers in milli-dollars per hour
SCALE = {"gpus": 1, "cpu": 1000, "memory_gib": 1000}  # CPU and memory in thousandths


@dataclass(frozen=True)
class Unit:
    """One decision unit: an existing instance, one slot of an offer, or a whole aggregated offer."""

    key: str
    cap: Capacity
    count: int  # how many instances this unit may stand for (1 unless aggregate)


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


def _units(problem: Problem) -> list[Unit]:
    units = []
    for c in problem.capacities:
        if c.existing:
            units.append(Unit(c.key, c, 1))
        elif c.aggregate:
            units.append(Unit(c.key, c, c.max_new))
        else:
            units.extend(Unit(f"{c.key}#{k}", c, 1) for k in range(c.max_new))
    return units


def solve(problem: Problem, time_limit: float = 20.0, workers: int | None = None, seed: int = 0) -> Solution:
    t0 = time.monotonic()
    m = cp_model.CpModel()
    units = _units(problem)
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

    x: dict[tuple[str, str], cp_model.IntVar] = {}
    by_unit: dict[str, list[tuple[Demand, cp_model.IntVar]]] = {u.key: [] for u in units}
    by_demand: dict[str, list[tuple[Unit, cp_model.IntVar]]] = {d.key: [] for d in demands}
    for d in demands:
        total = len(d.jobs) * d.replicas
        for u in units:
            f = fit(d, u.cap)
            if f <= 0 or (u.cap.existing and u.cap.keep_blocker is not None):
                continue
            v = m.new_int_var(0, min(total, f * u.count), f"x[{d.key},{u.key}]")
            x[(d.key, u.key)] = v
            by_unit[u.key].append((d, v))
            by_demand[d.key].append((u, v))

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
    for d in demands:
        pairs = by_demand[d.key]
        if d.gang:
            p = m.new_bool_var(f"placed[{d.key}]")
            m.add(sum(v for _, v in pairs) == d.replicas * p)
            zones = sorted({(u.cap.cloud, u.cap.zone) for u, _ in pairs})
            if len(zones) > 1:
                y = {z: m.new_bool_var(f"zone[{d.key},{z}]") for z in zones}
                m.add(sum(y.values()) == p)
                for u, v in pairs:
                    m.add(v <= d.replicas * y[(u.cap.cloud, u.cap.zone)])
        else:
            p = m.new_int_var(0, len(d.jobs), f"placed[{d.key}]")
            m.add(sum(v for _, v in pairs) == p)
        placed[d.key] = p

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
    for (dk, uk), v in x.items():
        e = problem.egress.get((dk, unit_by_key[uk].cap.key))
        if e:
            egress_terms.append(round(e * MILLI) * v)
    total_cost = cost + sum(egress_terms)
    if problem.budget is not None:
        m.add(cost <= round(problem.budget * MILLI))

    work = sum(d.weight * d.replicas * placed[d.key] for d in demands)

    # Stage 1: most priority-weighted work. Hint: what runs now stays.
    for (dk, uk), n in problem.running.items():
        if (dk, uk) in x:
            m.add_hint(x[(dk, uk)], n)
    for u in units:
        if u.cap.existing:
            m.add_hint(use[u.key], 1 if u.cap.keep_blocker is None else 0)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers or max(1, min(8, os.cpu_count() or 1))
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = max(0.1, time_limit / 2)
    m.maximize(work)
    st1 = solver.solve(m)
    if st1 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if st1 == cp_model.INFEASIBLE:
            raise SolverError(
                "the fleet's hard rules contradict each other even with no job placed: check pool min_instances "
                "against max_hourly_budget, max_spot_fraction and pools that can buy nothing"
            )
        raise SolverError(f"CP-SAT found no solution within {time_limit:.0f}s; raise --time-limit")
    best_work = round(solver.objective_value)
    stage1_optimal = st1 == cp_model.OPTIMAL

    # Stage 2: cheapest, then least churn, among answers placing that much work.
    kept_terms = []
    for (dk, uk), n in problem.running.items():
        if (dk, uk) in x:
            k = m.new_int_var(0, n, f"kept[{dk},{uk}]")
            m.add(k <= x[(dk, uk)])
            kept_terms.append(k)
    running_total = sum(problem.running.values())
    created = sum(use[u.key] for u in units if not u.cap.existing)
    churn_max = running_total + sum(u.count for u in units if not u.cap.existing) + 1
    m.add(work >= best_work)
    m.clear_hints()
    for v in [*use.values(), *x.values(), *placed.values()]:
        m.add_hint(v, solver.value(v))
    m.minimize(total_cost * churn_max + (running_total - sum(kept_terms)) + created)
    solver.parameters.max_time_in_seconds = max(0.1, time_limit - (time.monotonic() - t0))
    st2 = solver.solve(m)
    if st2 not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SolverError(f"CP-SAT lost its stage-1 answer in stage 2 (status {solver.status_name(st2)})")
    obj, bound = solver.objective_value, solver.best_objective_bound
    gap = 0.0 if st2 == cp_model.OPTIMAL or obj <= 0 else max(0.0, (obj - bound) / obj)

    x_val = {k: solver.value(v) for k, v in x.items() if solver.value(v) > 0}
    return Solution(
        status="OPTIMAL" if (st2 == cp_model.OPTIMAL and stage1_optimal) else "FEASIBLE",
        optimal=st2 == cp_model.OPTIMAL and stage1_optimal,
        gap=gap, seconds=time.monotonic() - t0,
        keep=frozenset(u.cap.instance_id for u in units if u.cap.existing and solver.value(use[u.key])),
        new_units={u.key: solver.value(use[u.key]) for u in units if not u.cap.existing and solver.value(use[u.key]) > 0},
        x=x_val, placed={d.key: solver.value(placed[d.key]) for d in demands},
        units=unit_by_key, work=best_work, cost_milli=solver.value(cost),
    )

