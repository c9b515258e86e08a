"""Capacity: per dimension (GPUs, MIG devices, vCPU, memory), the items on a capacity fit it.
Exact on one instance (a host); on an offer, a zone class or an idle class, aggregate over
its instances, tightened by valid cuts (at most k items over 1/(k+1) of an instance per
instance; Fekete-Schepers for items over half of one) that close most of the gap between the
count and a packing (`pack.py` packs the count and adds an instance where it must). An offer
whose count is small also gets rows per instance (`slots`): exact there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.problem import Capacity, Demand
from reconciler.solve.variables import add_at_most_count, is_zero, room, scale, units

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def add_capacity(model: Model) -> None:
    for c, items, n, most in capacity_rows(model):
        items = [(d, v) for d, v in items if not is_zero(v)]
        if items:
            add_row(model.m, c, items, n, most)


def capacity_rows(model: Model) -> list[tuple[Capacity, list, object, int]]:
    """(shape, its items, its instances, most instances) per row: one per instance (host), per zone
    offer for the work pinned to its zone, per zone class for everything its zones hold
    together, and per idle class."""
    resident_load: dict[str, list[tuple[Demand, object]]] = {}
    for (dk, hk), v in model.stay.items():
        resident_load.setdefault(hk, []).append((model.demands[dk], v))
    rows: list[tuple[Capacity, list, object, int]] = []
    for h in model.hosts:  # (the problem's hosts come before its offers: the rows' order is the model's)
        if not h.frozen and h.key not in model.idle_of:
            rows.append((h, model.x_at.get(h.key, []) + resident_load.get(h.key, []), model.use[h.key], 1))
    for o in model.offers:
        items = model.x_at.get(o.key, [])
        if o.key not in model.class_of or items:
            rows.append((o, items, model.use[o.key], o.max_new))
    for ck, cls in model.classes.items():
        items = model.x_at.get(ck, []) + [it for k in cls.members for it in model.x_at.get(k, [])]
        rows.append((cls, items, sum(model.use[k] for k in cls.members), cls.max_new))
    for ik, cls in model.idle.items():
        rows.append((cls, model.x_at.get(ik, []), model.use[ik], cls.most))
    return rows


def add_row(m, c: Capacity, items: list[tuple[Demand, object]], n, most: int) -> None:
    """`items` on `n` instances of shape `c` (at most `most` of them), per dimension they use.
    (Each item's size is read once per dimension and the cuts' big items are taken from the items over a
    quarter of an instance: asking every item again per cut was most of the model's build, 3 of 7.4 s at 20k jobs.)"""
    dims = sorted({k for d, _ in items for k in d.dims if d.req(k) > 0})
    for dim in dims:
        cap = c.cap(dim)
        sized = [(r, v) for d, v in items if (r := d.req(dim)) > 0]
        sizes = {r for r, _ in sized}  # (a row's items come in a few sizes: each counted once, not once an item)
        per = scale(dim, sizes)  # (the row's integer units: exact for the decimals its requests have)
        unit = {r: units(r, dim, per) for r in sizes}
        terms = [(unit[r], v) for r, v in sized]
        add_at_most_count(m, terms, room(cap, dim, per), n)
        if most > 1:  # (an offer's, a zone or idle class's: a host's is 1)
            # Valid cuts: at most k items bigger than 1/(k+1) of an instance fit on one,
            # in any dimension. They close most of the gap between the count and packing.
            over = [(r, v) for r, v in sized if r * 4 > cap + 1e-9]  # (over a quarter: every cut's items, in order)
            for k in (1, 2, 3):
                big = [v for r, v in over if r * (k + 1) > cap + 1e-9]
                if len(big) > k - 1 and (k == 1 or len(big) > 1):
                    add_at_most_count(m, [(1, v) for v in big], k, n, summed=True)
            big_item_cuts(m, terms, room(cap, dim, per), n)


def big_item_cuts(m, terms: list[tuple[int, object]], cap: int, n) -> None:
    """Fekete-Schepers cuts: for each size t over half an instance, an item of size >= t
    fills its instance for anything bigger than cap - t, so count it as a whole instance,
    the items that cannot share with it at their size, and the items that can at zero.
    (6+6+4 GPUs pass the 16-GPU count of two 8-GPU instances; this cut says 8+8+4 > 16.)"""
    for t in sorted({w for w, _ in terms if 2 * w > cap}):
        mid = [(w, v) for w, v in terms if cap - t < w < t]
        if mid:
            big = [(cap, v) for w, v in terms if w >= t]
            add_at_most_count(m, big + mid, cap, n)


__all__ = ["add_capacity", "add_row", "big_item_cuts", "capacity_rows"]
