"""Gangs: all or nothing, in one site (a zone; a placement group's one offer), and a placement
group's new instances shared with no other gang's group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.problem import Demand, Host, fit, gang_split
from reconciler.solve.variables import is_zero

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def add_gangs(model: Model) -> None:
    m = model.m
    for d in model.p.demands:
        if not d.gang:
            continue
        gk = model.group_of[d.key]
        cells = list(model.x_of_group[gk]) + [(c, v) for c, v in model.stay_of.get(d.key, [])]
        keyf = _site_of(d, [h for h, _ in model.stay_of.get(d.key, [])])
        sites = sorted({keyf(c) for c, _ in cells}, key=str)
        if not sites:
            continue
        if len(sites) == 1 and d.gang_mode != "placement-group":
            continue
        y = {s: m.new_bool_var(f"site[{d.key},{s}]") for s in sites}
        m.add(sum(y.values()) == model.placed[d.key])
        for c, v in cells:
            if is_zero(v):
                continue
            m.add(v <= d.replicas * y[keyf(c)])
    # An instance launches into one placement group: a placement-group gang's new items take
    # whole instances of their offer, which no other gang's group shares (other work may).
    pg_instances: dict[str, list] = {}
    for d in model.p.demands:
        if not (d.gang and d.gang_mode == "placement-group"):
            continue
        for c, v in model.x_of_group[model.group_of[d.key]]:
            if isinstance(c, Host):
                continue
            n = m.new_int_var(0, c.work_most, f"pg_instances[{d.key},{c.key}]")
            m.add(v <= fit(d, c) * n)
            pg_instances.setdefault(c.key, []).append(n)
    for ck, ns in pg_instances.items():
        m.add(sum(ns) <= model.use[ck])


def _site_of(d: Demand, hosts: list[Host]):
    """The site a gang's items must share: its zone; for a placement group, its offer (new instances launch together),
    except that the offers of the hosts it runs on now are one site where they break no gang rule (one zone, one
    type: problem.gang_split). A gang running on a spot and an on-demand instance of one zone and type may stay as
    it runs, and heal onto either offer: keyed per offer it could not (fleet19: greedy evicted the protected j4 for
    'pools at max_instances', and once greedy kept it the model could not complete greedy's answer)."""
    if d.gang_mode != "placement-group":
        return lambda c: c.cloud_zone
    running = {h.offer_key for h in hosts}
    if len(running) < 2 or gang_split(d, hosts):
        return lambda c: c.offer_key
    site = min(running)
    return lambda c: site if c.offer_key in running else c.offer_key


__all__ = ["add_gangs"]
