"""Bounds on a tier that cost less than its LP: where one holds, a warm start that reaches it is proven at once.

Pure. Each bound relaxes the model (it keeps some of its rows and drops the rest), so it is never below the LP's
optimum: where the warm start reaches it, the LP would have said the same, and the plan is the same."""

from __future__ import annotations

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
    filled with the tenant's class-c jobs as a fractional knapsack (most weight per unit first); the tenant's bound
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


def knapsack(items: list[Demand], units: dict[str, int], room: int) -> int:
    """The fractional knapsack's optimum, rounded down: each demand's jobs (its weight each, `units` of the row each:
    none where it takes none) into `room` units, the most weight per unit first. Integers throughout: a float's
    rounding could put an upper bound below the integer optimum."""
    value = sum(d.weight * len(d.jobs) for d in items if not units.get(d.key, 0))
    room = max(0, room)
    for d in sorted((d for d in items if units.get(d.key, 0)), key=lambda d: (-Fraction(d.weight, units[d.key]), d.key)):
        a, n = units[d.key], len(d.jobs)
        if a * n <= room:
            value += d.weight * n
            room -= a * n
        else:
            value += d.weight * room // a
            break
    return value
