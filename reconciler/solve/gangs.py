"""Gangs: all or nothing, in one site (a zone; a placement group's one offer), and a placement
group's new instances shared with no other gang's group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.problem import Host, fit
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
        if d.gang_mode == "placement-group":
            keyf = lambda c: c.offer_key  # noqa: E731
        else:
            keyf = lambda c: c.cloud_zone  # noqa: E731
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
            n = m.new_int_var(0, c.most, f"pg_instances[{d.key},{c.key}]")
            m.add(v <= fit(d, c) * n)
            pg_instances.setdefault(c.key, []).append(n)
    for ck, ns in pg_instances.items():
        m.add(sum(ns) <= model.use[ck])


__all__ = ["add_gangs"]
