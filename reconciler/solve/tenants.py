"""Tenants: the quota's ceiling on everything a tenant places, its guarantee on the guaranteed
part, its budget on what its work is charged, its spot fraction on its work units on spot.
The charges and units are the ledger's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.ledger import charge, micro, work_units
from reconciler.problem import Demand
from reconciler.solve.fleet_rules import spot_share_row
from reconciler.solve.variables import room, scale, units, wsum

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def ceiling_rows(mine: list[Demand], cap: dict[str, float]) -> list[tuple[dict[str, int], int]]:
    """The quota's ceiling rows of one tenant (`mine`: its demands): per capped dimension, each demand's units per job
    placed and the most units the tenant may place. The model's rows, and what strategy.place_more reads off an
    answer (is there room for one more job?). Given the tenant's guarantee as `cap`, the guarantee's rows over the
    guaranteed part; bounds.guaranteed_work_bound reads both."""
    rows = []
    for dim, limit in cap.items():
        per = scale(dim, (d.req(dim) for d in mine))  # (exact for the decimals the tenant's requests have)
        coefs = {d.key: units(d.req(dim), dim, per) * d.replicas for d in mine if d.req(dim)}
        if coefs:
            rows.append((coefs, room(limit, dim, per)))
    return rows


def add_tenant_rules(model: Model) -> None:
    m, p = model.m, model.p
    for t, r in p.tenants.items():
        mine = [d for d in p.demands if d.tenant == t]
        for coefs, most in ceiling_rows(mine, r.cap):
            m.add(wsum([(c, model.placed[k]) for k, c in coefs.items()]) <= most)
        for coefs, most in ceiling_rows(mine, r.guarantee):  # (the same rows over the guaranteed part)
            m.add(wsum([(c, model.g[k]) for k, c in coefs.items()]) <= most)
        if r.budget is not None:
            terms = tenant_cost_terms(model, mine)
            if terms:
                m.add(wsum(terms) <= micro(r.budget))
        if r.spot_fraction is not None and r.spot_fraction < 1:
            on_spot, total = [], []
            for d in mine:
                total.append((work_units(d) * d.replicas, model.placed[d.key]))
                for c, v in model.stay_of.get(d.key, []):
                    if c.market == "spot":
                        on_spot.append((work_units(d), v))
            for gk in {model.group_of[d.key] for d in mine}:
                rep = model.demands[p.groups[gk][0]]
                for c, v in model.x_of_group[gk]:
                    if c.market == "spot":
                        on_spot.append((work_units(rep), v))
            m.add(spot_share_row(on_spot, total, r.spot_fraction))


def tenant_cost_terms(model: Model, mine: list[Demand]) -> list[tuple[int, object]]:
    """(micro-dollars per hour charged, as the tenant's budget counts them: ledger.micro; items) of the tenant's
    demands `mine`, staying and new."""
    terms = []
    for d in mine:
        for c, v in model.stay_of.get(d.key, []):
            terms.append((micro(charge(d, c)), v))
    for gk in {model.group_of[d.key] for d in mine}:
        rep = model.demands[model.p.groups[gk][0]]
        for c, v in model.x_of_group[gk]:
            terms.append((micro(charge(rep, c)), v))
    return terms


__all__ = ["add_tenant_rules", "tenant_cost_terms"]
