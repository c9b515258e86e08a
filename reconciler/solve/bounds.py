"""Bounds on a tier that cost less than its LP: where one holds, a warm start that reaches it is proven at once.

Pure. Each bound relaxes the model (it keeps some of its rows, with jobs whole, and drops the rest), so it is never
below the tier's best value. Unlike the LP, which places fractions of jobs, it can be below the LP's optimum: then a
tier is proven that the LP could not prove, and its search (CP-SAT proving what whole jobs allow) is spared."""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import TYPE_CHECKING

from reconciler.solve.tenants import ceiling_rows

if TYPE_CHECKING:
    from reconciler.problem import Demand
    from reconciler.solve.model import Model


def guaranteed_work_bound(model: Model, c: int, full: set[int]) -> int:
    """The most the guaranteed class-c work tier can reach once each class in `full` (classes above c) has its
    guaranteed work tier held at its bound, so that all of that class's jobs are placed inside their tenants'
    guarantees. Per tenant, each of its guarantee's rows and its quota's rows, less what those jobs take of it, is
    filled with the tenant's class-c jobs, whole (`knapsack`); the tenant's bound
    is the least over its rows. (The 10k tier's drift plan: every tenant at its GPU quota, the low work tier 10,957
    of the 39,048 its jobs weigh; the LP that proved 10,957 took 6 of the plan's 15.5 s of CPU.)"""
    p = model.p
    by_tenant: dict[str, list[Demand]] = {}
    for d in p.demands:
        by_tenant.setdefault(d.tenant, []).append(d)
    total = 0
    for t, mine in by_tenant.items():
        ours = [d for d in mine if d.klass == c and not model.g.is_zero(d.key) and not p.never_hosted(d)]
        if not ours:
            continue
        best = sum(d.weight * len(d.jobs) for d in ours)
        r = p.tenants.get(t)
        if r is not None:
            taken = [d for d in mine if d.klass in full and not model.g.is_zero(d.key) and not p.never_hosted(d) and d.weight > 0]
            for coefs, most in ceiling_rows(mine, r.guarantee) + ceiling_rows(mine, r.cap):
                left = most - sum(coefs.get(d.key, 0) * len(d.jobs) for d in taken)
                best = min(best, knapsack(ours, coefs, left))
        total += best
    return total


def tenant_rows_relaxation(model: Model, c: int, held: dict[int, int]):
    """A small CP-SAT model whose optimum bounds the guaranteed class-c work tier when the guaranteed work tiers of
    the classes above are held at `held` (class -> the value its tier is held at): per demand, its jobs placed and,
    of them, guaranteed, whole; every tenant's quota rows over what it places and its guarantee's rows over what is
    guaranteed; each held tier at least its value; the class-c tier maximised. The model has every one of these
    rows (Model._demand_vars, tenants.add_tenant_rules, the holds), and drops the rest (capacity, pools, spot), so the
    optimum, and any bound CP-SAT proves on it, is never below the tier's best. Unlike the knapsack per row, it sees
    which of a higher class's jobs hold the guarantee once that class is held below its bound. (The bench's 100-job
    fleet: the guaranteed normal tier held at 17,750 left room for 243 of the low one, whose LP bound was 530; CP-SAT
    took 3 s on the whole model to prove 243, the relaxation 0.002 s.) None where no tier of class c weighs."""
    from reconciler.cpsat import cp_model

    p = model.p
    m = cp_model.CpModel()
    placed: dict[str, object] = {}
    g: dict[str, object] = {}
    for d in p.demands:
        n = 0 if p.never_hosted(d) else len(d.jobs)
        placed[d.key] = m.new_int_var(0, n, "")
        g[d.key] = m.new_int_var(0, 0 if model.g.is_zero(d.key) else n, "")
        m.add(g[d.key] <= placed[d.key])
    by_tenant: dict[str, list[Demand]] = {}
    for d in p.demands:
        by_tenant.setdefault(d.tenant, []).append(d)
    for t, mine in sorted(by_tenant.items()):
        r = p.tenants.get(t)
        if r is None:
            continue
        for coefs, most in ceiling_rows(mine, r.cap):
            m.add(sum(k * placed[key] for key, k in coefs.items()) <= most)
        for coefs, most in ceiling_rows(mine, r.guarantee):
            m.add(sum(k * g[key] for key, k in coefs.items()) <= most)
    for above, value in sorted(held.items()):
        if above > c:
            m.add(sum(d.weight * g[d.key] for d in p.demands if d.klass == above) >= value)
    ours = [(d.weight, g[d.key]) for d in p.demands if d.klass == c and d.weight]
    if not ours:
        return None
    m.maximize(sum(w * v for w, v in ours))
    return m


# The integer knapsack below fills a table of (room + 1) cells once per piece of each demand's jobs (binary split:
# 1, 2, 4, ... jobs); past this many cells it is the fractional knapsack's optimum instead, which is never below it.
KNAPSACK_CELLS = 20_000_000


def knapsack(items: list[Demand], units: dict[str, int], room: int) -> int:
    """The most weight of whole jobs that fits one row: each demand's jobs (its weight each, `units` of the row each:
    none where it takes none) into `room` units. Exact (a bounded knapsack by dynamic programming over the room, the
    units and room divided by their common divisor first) where the table is small (KNAPSACK_CELLS), else the
    fractional knapsack's optimum rounded down, which is never below it. (The bench's 100-job fleet: a tenant with
    19 GPUs of guarantee left and jobs of 4 and 8 GPUs; the fractional optimum 1,360 was 1,190 above what whole jobs
    reach, so CP-SAT took 3.2 s to prove the warm start's guaranteed normal work tier, 17,750, which whole jobs prove
    at once.)"""
    room = max(0, room)
    free = sum(d.weight * len(d.jobs) for d in items if not units.get(d.key, 0))
    sized = [(units[d.key], d.weight, len(d.jobs)) for d in items if units.get(d.key, 0) and units[d.key] <= room]
    if sum(a * n for a, _, n in sized) <= room:
        return free + sum(w * n for _, w, n in sized)  # every job fits (or none of any demand does)
    div = functools.reduce(math.gcd, (a for a, _, _ in sized), 0)
    room //= div
    pieces = []
    for a, w, n in sized:
        k = 1
        while n > 0:
            take = min(k, n)
            pieces.append((a // div * take, w * take))
            n, k = n - take, k * 2
    if (room + 1) * len(pieces) > KNAPSACK_CELLS or sum(w * n for _, w, n in sized) >= 2**62:  # (int64 cells)
        return free + fractional_knapsack([(a // div, w, n) for a, w, n in sized], room)
    import numpy as np  # (imported with ortools already: cp_model needs it; declared in pyproject.toml)

    best = np.zeros(room + 1, dtype=np.int64)  # best[r]: the most weight in at most r units
    for a, w in pieces:  # (each piece once: the right-hand side is read before the assignment)
        if a <= room:
            best[a:] = np.maximum(best[a:], best[:room + 1 - a] + w)
    return free + int(best[room])


def fractional_knapsack(sized: list[tuple[int, int, int]], room: int) -> int:
    """The fractional knapsack's optimum, rounded down: (units, weight, jobs) of each demand into `room` units, the most
    weight per unit first. Integers throughout: a float's rounding could put an upper bound below the integer optimum."""
    value = 0
    for a, w, n in sorted(sized, key=lambda s: -Fraction(s[1], s[0])):
        if a * n <= room:
            value += w * n
            room -= a * n
        else:
            value += w * room // a
            break
    return value
