"""Per-instance capacity rows where an offer's count is small: the new instances of such an offer
are slots, each with its own rows per dimension, so what the model places there packs.

An offer's aggregate rows (`capacity`) sum its instances per dimension: 8 jobs of 14 vCPU and an
item of 80 vCPU that takes a whole 96-vCPU instance pass the 192 vCPU of two, yet need 112 vCPU
of the other one's 96 (the packer then buys a repair or leaves jobs unpacked). Here each slot
says which items it holds (`z`), and whether it is bought (`on`, slots bought first). Only where
counts are small (`per_instance`): a slot costs a variable per group that may land on it, and
at hundreds of instances of one type the aggregate rows with their cuts stay (scale).

Variables (`slot_vars`) and rows (`add_slot_rows`) apart: the rows are a constraint family."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from reconciler.problem import Capacity, Demand, fit
from reconciler.solve.variables import Values, is_zero, scale, wsum

if TYPE_CHECKING:
    from reconciler.greedy import Assignment
    from reconciler.solve.model import Model

SLOTS_MOST = 16  # an offer of at most this many new instances is modelled instance by instance
FIXED_MOST = 128  # ... and one of a fixed pool (min_instances = max_instances), up to this many
# Slot variables (instances x groups that may land on them) at most: the smallest offers first. (The trace-shaped
# fixed cluster, 111 instances of one type and 44 groups, takes 4,884 of them.)
SLOT_VARS = 20_000


def per_instance(o: Capacity, pool_bounds: dict[str, tuple[int, int]]) -> bool:
    """The one definition of which offers get per-instance rows: those whose count is small (at
    most SLOTS_MOST new instances), or fixed by their pool (min = max) and at most FIXED_MOST."""
    lo, hi = pool_bounds.get(o.pool, (0, 0))
    return o.max_new <= SLOTS_MOST or (lo == hi and o.max_new <= FIXED_MOST)


def exact_offers(model: Model) -> list[Capacity]:
    """The offers modelled instance by instance, in model order: `per_instance` ones, and of a zone
    class only when every zone is (a class's items may land in any of its zones); the smallest first
    (slots x groups that may land there) while their variables stay within SLOT_VARS."""
    bounds = model.p.pool_bounds
    groups_at: dict[str, int] = {}
    for _, ck in model.x:
        groups_at[ck] = groups_at.get(ck, 0) + 1
    units: dict[str, list[Capacity]] = {}  # a zone class, or an offer alone -> its offers
    for o in model.offers:
        units.setdefault(model.class_of.get(o.key, o.key), []).append(o)
    sizes = {}
    for uk, offers in units.items():
        if all(per_instance(o, bounds) for o in offers):
            slots = sum(o.max_new for o in offers)
            sizes[uk] = slots * ((groups_at.get(uk, 0) if uk in model.classes else 0) + sum(groups_at.get(o.key, 0) for o in offers))
    chosen, total = set(), 0
    for uk in sorted(sizes, key=lambda k: (sizes[k], k)):
        if total + sizes[uk] > SLOT_VARS:
            break
        chosen.add(uk)
        total += sizes[uk]
    return [o for o in model.offers if model.class_of.get(o.key, o.key) in chosen]


def slot_vars(model: Model) -> None:
    """`model.on[(offer, i)]`: its i-th new instance is bought; `model.z[(group, cap, offer, i)]`: items
    of a group's variable x[group, cap] (the offer's, or its zone class's) on that instance;
    `model.slot_offers`: the offers modelled so (`exact_offers`)."""
    m = model.m
    model.on, model.z = Values(), Values()
    model.slot_x: list[tuple[str, str]] = []  # the x each on an exact offer or class, shared among its slots
    model.slot_offers = exact_offers(model)
    exact = {o.key for o in model.slot_offers}
    for o in model.slot_offers:
        for i in range(o.max_new):
            model.on[(o.key, i)] = m.new_bool_var(f"on[{o.key},{i}]")
    for gk, ck in model.x:
        offers = [ck] if ck in exact else list(model.classes[ck].members) if ck in model.classes else []
        if not offers or not all(k in exact for k in offers):
            continue
        rep = model.demands[model.p.groups[gk][0]]
        model.slot_x.append((gk, ck))
        for ok in offers:
            o = model.caps[ok]
            f = fit(rep, o)
            if f <= 0:
                continue
            for i in range(o.max_new):
                model.z[(gk, ck, ok, i)] = m.new_int_var(0, f, f"z[{gk},{ok},{i}]")


def add_slot_rows(model: Model) -> None:
    """Each exact offer's count is its slots bought (the first ones), each x on it is shared among
    its slots, and each slot holds its items per dimension."""
    m = model.m
    for o in model.slot_offers:
        on = [model.on[(o.key, i)] for i in range(o.max_new)]
        m.add(sum(on) == model.use[o.key])
        for a, b in itertools.pairwise(on):
            m.add(a >= b)  # (identical instances: bought in order, no symmetric answers)
    parts: dict[tuple[str, str], list] = {}
    on_slot: dict[tuple[str, int], list[tuple[int, object]]] = {}
    for (gk, ck, ok, i), v in model.z.items():
        parts.setdefault((gk, ck), []).append(v)
        on_slot.setdefault((ok, i), []).append((gk, v))
    for key in model.slot_x:  # (an x no slot could hold is 0)
        m.add(sum(parts.get(key, [])) == model.x[key])
    for (ok, i), cells in on_slot.items():
        o = model.caps[ok]
        items = [(model.demands[model.p.groups[gk][0]], v) for gk, v in cells]
        dims = sorted({k for d, _ in items for k in d.dims if d.req(k) > 0})
        for dim in dims:
            s = scale(dim)
            terms = [(round(d.req(dim) * s), v) for d, v in items if d.req(dim) > 0]
            m.add(wsum(terms) <= math.floor(o.cap(dim) * s + 1e-6) * model.on[(ok, i)])
        one_group(model, ok, i, [(d, v) for d, v in items if d.gang and d.gang_mode == "placement-group"])


def one_group(model: Model, ok: str, i: int, pg: list[tuple[Demand, object]]) -> None:
    """An instance launches into one placement group: of the placement-group gangs, one at most has
    items on a slot (the gangs family counts their instances per offer only)."""
    if len(pg) < 2:
        return
    m, ys = model.m, []
    for d, v in pg:
        y = m.new_bool_var(f"pg[{d.key},{ok},{i}]")
        m.add(v <= fit(d, model.caps[ok]) * y)
        ys.append(y)
    m.add(sum(ys) <= 1)


def slot_hints(model: Model, a: Assignment) -> list[tuple[int, int]]:
    """Hints for the slots from how greedy packed its new instances (`Assignment.packed`): its
    instances are per-instance feasible, so the hint is too."""
    hints: list[tuple[int, int]] = []
    exact = {o.key for o in model.slot_offers}
    for o in model.slot_offers:
        n = a.use.get(o.key, 0)
        for i in range(o.max_new):
            hints.append((model.on[(o.key, i)].index, 1 if i < n else 0))
    got: dict[tuple, int] = {}
    for ok, insts in a.packed.items():
        if ok not in exact:
            continue
        for i, items in enumerate(insts):
            for dk, n in items.items():
                gk = model.group_of.get(dk)
                if gk is None:
                    continue
                ck = ok if (gk, ok) in model.x else model.class_of.get(ok, ok)
                k = (gk, ck, ok, i)
                got[k] = got.get(k, 0) + n
    for k, v in model.z.items():
        hints.append((v.index, got.get(k, 0)))
    return hints


def slot_contents(model: Model, val) -> dict[str, tuple[tuple[tuple[str, str, int], ...], ...]]:
    """Per exact offer, its bought instances in order, each as (x's capacity key, group, items): what
    the packer fills each instance with."""
    out: dict[str, list[list[tuple[str, str, int]]]] = {}
    for o in model.slot_offers:
        n = sum(val(model.on[(o.key, i)]) for i in range(o.max_new))
        if n:
            out[o.key] = [[] for _ in range(n)]
    for (gk, ck, ok, i), v in model.z.items():
        k = val(v)
        if k > 0 and ok in out and i < len(out[ok]):
            out[ok][i].append((ck, gk, k))
    return {ok: tuple(tuple(sorted(s)) for s in insts) for ok, insts in out.items()}


def slot_variables(model: Model) -> list:
    return model.on.variables() + [v for v in model.z.values() if not is_zero(v)]


__all__ = ["FIXED_MOST", "SLOTS_MOST", "add_slot_rows", "exact_offers", "per_instance", "slot_contents", "slot_hints", "slot_vars",
           "slot_variables"]
