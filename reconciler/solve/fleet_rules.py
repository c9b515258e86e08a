"""Fleet-wide rules on instances: pool bounds, reservations' counts, the fleet budget, the spot share, the on-demand
buffer beside spot capacity, and spot diversity (instance types, zones). They count offers,
hosts and idle classes (`Model.units`); the measures are the ledger's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.ledger import buffer_row, buffer_use, micro, share_row
from reconciler.problem import spot_measure
from reconciler.solve.variables import is_variable, wsum

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def add_fleet_rules(model: Model) -> None:
    add_pool_bounds(model)
    add_reservations(model)
    add_fleet_budget(model)
    add_spot_rules(model)


def pool_units(model: Model, pool: str | None = None) -> dict[str, list] | list:
    """What counts toward a pool's max_instances (offers, hosts, idle classes: Model.units): per pool, or one pool's."""
    by_pool = model.__dict__.get("_pool_units")
    if by_pool is None:  # (built once: objective.stand_in_room asks per tenant)
        by_pool = model.__dict__["_pool_units"] = {}
        for c in model.units:
            by_pool.setdefault(c.pool, []).append(c)
    return by_pool if pool is None else by_pool.get(pool, [])


def add_pool_bounds(model: Model) -> None:
    m, p = model.m, model.p
    by_pool = pool_units(model)
    for pool, (lo, hi) in p.pool_bounds.items():
        vs = [model.use[c.key] for c in by_pool.get(pool, [])]
        if any(is_variable(v) for v in vs):
            m.add(sum(vs) >= lo)
            m.add(sum(vs) <= hi)
        elif not lo <= sum(vs) <= hi:
            m.add(m.new_constant(0) >= 1)  # e.g. nothing can be bought for this pool, yet it needs lo instances


def add_reservations(model: Model) -> None:
    """A Reservation's instances kept and launched into it: at most its count. Its offer is sized to the whole
    count (problem.capacity.reserved_offers), so a plan may delete a holder and launch another into it."""
    by_name: dict[str, list] = {}
    for c in model.units:
        if c.reservation:
            by_name.setdefault(c.reservation, []).append(c)
    for name, cs in sorted(by_name.items()):
        r = model.p.reservations.get(name)
        vs = [model.use[c.key] for c in cs]
        # (only where it can bind: with no instance of its own running, the offer's size already holds it)
        if r is not None and any(is_variable(v) for v in vs) and sum(c.most for c in cs) > r.count:
            model.m.add(sum(vs) <= r.count)


def add_fleet_budget(model: Model) -> None:
    p = model.p
    if p.budget is not None:  # the budget's own integers (ledger.micro): the row accepts what greedy and apply accept
        model.m.add(wsum([(micro(c.price), model.use[c.key]) for c in model.units]) <= micro(p.budget))


def add_spot_rules(model: Model) -> None:
    m, p = model.m, model.p
    sp = p.spot
    caps = model.units
    dim, measure = spot_measure(caps, p.gpu_fleet)
    prim = lambda c: round(measure(c))  # noqa: E731 - integer coefficients
    spot = [c for c in caps if c.market == "spot"]
    if spot and sp.max_spot_fraction < 1:
        m.add(spot_share_row([(prim(c), model.use[c.key]) for c in spot], [(prim(c), model.use[c.key]) for c in caps], sp.max_spot_fraction))
    if spot and sp.on_demand_buffer_percent > 0:
        idle = [(prim(c), model.use[c.key]) for c in caps if c.market != "spot"]
        used = [(buffer_use(model.demands[p.groups[gk][0]], dim), v) for (gk, ck), v in model.x.items() if model.caps[ck].market != "spot"]
        used += [(buffer_use(model.demands[dk], dim), v) for (dk, hk), v in model.stay.items() if model.caps[hk].market != "spot"]
        m.add(buffer_row_of(idle, [(prim(c), model.use[c.key]) for c in spot], sp.on_demand_buffer_percent, used))
    if spot and (sp.min_instance_types > 1 or sp.min_zones > 1):
        add_spot_diversity(model, spot)


def spot_share_row(spot: list, every: list, fraction: float):
    """The spot share (max_spot_fraction, or a tenant's) as one linear row: `spot` and `every` (spot among it) are
    (integer units, value) terms. The solver's fleet rules, its tenant rules and load's bound on what pool minimums
    cost (load._least_cost) all build it here, on the ledger's coefficients (ledger.share_row)."""
    scale, coef = share_row(fraction)
    return scale * wsum(spot) <= coef * wsum(every)


def buffer_row_of(idle: list, spot: list, percent: float, used: list = ()):
    """The on-demand buffer (on_demand_buffer_percent) as one linear row: `idle` the on-demand capacity and `spot` the
    spot capacity, (integer units, value) terms; `used` what work takes of the on-demand capacity, (units, value) with
    fractional units (a MIG item's slices / 7 of a GPU: ledger.buffer_use). The solver and load._least_cost (which
    counts every instance idle) build it here, on the ledger's coefficients (ledger.buffer_row)."""
    scale, coef = buffer_row(percent)
    return wsum([(scale * u, v) for u, v in idle] + [(-round(scale * u), v) for u, v in used]) >= wsum([(coef * u, v) for u, v in spot])


def add_spot_diversity(model: Model, spot: list) -> None:
    """Spot spread over at least min_instance_types types and min_zones zones, once any spot is used."""
    m, sp = model.m, model.p.spot
    any_spot = m.new_bool_var("any_spot")
    for c in spot:
        m.add(model.use[c.key] <= c.most * any_spot)
    for attr, need in (("instance_type", sp.min_instance_types), ("zone", sp.min_zones)):
        if need <= 1:
            continue
        values = sorted({getattr(c, attr) for c in spot})
        used = {v: m.new_bool_var(f"spot_{attr}[{v}]") for v in values}
        for v in values:
            m.add(used[v] <= sum(model.use[c.key] for c in spot if getattr(c, attr) == v))
        m.add(sum(used.values()) >= need * any_spot)


__all__ = ["add_fleet_budget", "buffer_row_of", "spot_share_row", "add_fleet_rules", "add_pool_bounds", "add_reservations", "add_spot_diversity", "add_spot_rules", "pool_units"]
