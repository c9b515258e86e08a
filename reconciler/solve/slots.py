"""Per-instance capacity rows where an offer's count is small: the new instances of such an offer
are slots, each with its own rows per dimension, so what the model places there packs.

An offer's aggregate rows (`capacity`) sum its instances per dimension: 8 jobs of 14 vCPU and an
item of 80 vCPU that takes a whole 96-vCPU instance pass the 192 vCPU of two, yet need 112 vCPU
of the other one's 96 (the packer then buys a repair or leaves jobs unpacked). Here each slot
says which items it holds (`z`), and whether it is bought (`on`, slots bought first). Only where
counts are small (`per_instance`): a slot costs a variable per group that may land on it, and
at hundreds of instances of one type the aggregate rows with their cuts stay (scale).

Where an answer's counts on a large offer do not pack after all (vCPU and memory filled to the last
unit in sum), the repair stage (strategy.py) gives that offer slots too (`extend_slots`): as many as
the packer took for those items, for only the groups the answer put there.

Variables (`slot_vars`) and rows (`add_slot_rows`) apart: the rows are a constraint family."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from reconciler.problem import Capacity, Demand, fit
from reconciler.solve.variables import Values, is_zero, room, scale, units, wsum

if TYPE_CHECKING:
    from reconciler.greedy import Assignment
    from reconciler.solve.model import Model

SLOTS_MOST = 16  # an offer of at most this many new instances is modelled instance by instance
FIXED_MOST = 128  # ... and one of a fixed pool (min_instances = max_instances), up to this many
# Slot variables (instances x groups that may land on them) at most: the smallest offers first. (The trace-shaped
# fixed cluster, 111 instances of one type and 44 groups, takes 4,884 of them.)
SLOT_VARS = 20_000


def per_instance(o: Capacity, pool_bounds: dict[str, tuple[int, int]], need: dict[str, int] | None = None) -> bool:
    """The one definition of which offers get per-instance rows: those whose count is small (at
    most SLOTS_MOST new instances), or capped by their pool (`pool_capped`) and at most FIXED_MOST; and
    those whose aggregate counts did not pack in an answer (`need`: the repair stage, strategy.py)."""
    return small(o, pool_bounds) or (need is not None and o.key in need)


def small(o: Capacity, pool_bounds: dict[str, tuple[int, int]]) -> bool:
    """Whether the instances that may hold work are few (an offer's ballast, which stands idle, gets no slot)."""
    return o.work_most <= SLOTS_MOST or (pool_capped(o, pool_bounds) and o.work_most <= FIXED_MOST)


def pool_capped(o: Capacity, pool_bounds: dict[str, tuple[int, int]]) -> bool:
    """Whether the offer's count is its pool's to cap, not its work's: a fixed pool (min_instances = max_instances),
    or one whose max_instances the work that may land there fills, in sum per dimension (`Offer.fills_pool`). There
    a repair cannot buy past the count, so the model counts what packs (slots here, pattern rows past FIXED_MOST:
    patterns.py). (The DLRM trace's g5 pools at 52 and 20 instances, summed: CP-SAT put 20 jobs of 120 GiB and 188
    of 40 GiB on 52 g5.12xlarge, 9,920 of 9,984 GiB, where an instance holding a 120-GiB job holds one 40-GiB job
    beside it; they took 66; searched again within 52, the fair-share tier fell from 158,000 to 116,000, and greedy's plan,
    $132/h dearer, was emitted.)"""
    lo, hi = pool_bounds.get(o.pool, (0, 0))
    return lo == hi or getattr(o, "fills_pool", False)


def slot_count(o: Capacity, pool_bounds: dict[str, tuple[int, int]], need: dict[str, int] | None = None) -> int:
    """How many of a `per_instance` offer's new instances get a slot: all that may hold work where
    their count is small; where it is not, the instances a packing of the answer needed (its count,
    repairs included), so a few dozen slots stand for an offer of hundreds."""
    return o.work_most if small(o, pool_bounds) else min(o.work_most, (need or {}).get(o.key, 0))


def exact_offers(model: Model, need: dict[str, int] | None = None, held: set[tuple[str, str]] | None = None) -> list[Capacity]:
    """The offers modelled instance by instance, in model order: `per_instance` ones, and of a zone
    class only when every zone is (a class's items may land in any of its zones); the smallest first
    (slots x groups that may land there: on a `need` offer, only the x in `held`) while their
    variables stay within SLOT_VARS."""
    bounds = model.p.pool_bounds
    groups_at: dict[str, int] = {}
    for key in model.x:
        if not holds(model, key, need, held):
            continue
        groups_at[key[1]] = groups_at.get(key[1], 0) + 1
    units: dict[str, list[Capacity]] = {}  # a zone class, or an offer alone -> its offers
    for o in model.offers:
        units.setdefault(model.class_of.get(o.key, o.key), []).append(o)
    sizes = {}
    for uk, offers in units.items():
        if all(per_instance(o, bounds, need) for o in offers):
            n = sum(slot_count(o, bounds, need) for o in offers)
            sizes[uk] = n * ((groups_at.get(uk, 0) if uk in model.classes else 0) + sum(groups_at.get(o.key, 0) for o in offers))
    chosen, total = set(), 0
    for uk in sorted(sizes, key=lambda k: (sizes[k], k)):
        if total + sizes[uk] > SLOT_VARS:
            break
        chosen.add(uk)
        total += sizes[uk]
    return [o for o in model.offers if model.class_of.get(o.key, o.key) in chosen]


def holds(model: Model, key: tuple[str, str], need: dict[str, int] | None, held: set[tuple[str, str]] | None) -> bool:
    """Whether x[key] gets a variable on the slots of its capacity: always, but on the offers of the
    repair stage (`need`), where only the x its answer placed there (`held`) do, so a few dozen
    slots of an offer hundreds of groups could land on stay a few thousand variables."""
    if need is None or held is None or key in held:
        return True
    ck = key[1]
    return not any(k in need for k in (model.classes[ck].members if ck in model.classes else [ck]))


def slot_vars(model: Model) -> None:
    """`model.on[(offer, i)]`: its i-th new instance is bought; `model.z[(group, cap, offer, i)]`: items
    of a group's variable x[group, cap] (the offer's, or its zone class's) on that instance;
    `model.slot_offers`: the offers modelled so (`exact_offers`), `model.slots_of`: their slots."""
    model.on, model.z = Values(), Values()
    model.slot_x: list[tuple[str, str]] = []  # the x each on an exact offer or class, shared among its slots
    model.slot_offers, model.slots_of = [], {}
    _new_slots(model, exact_offers(model), {})


def _new_slots(model: Model, offers: list[Capacity], need: dict[str, int],
               held: set[tuple[str, str]] | None = None) -> tuple[list[Capacity], list[tuple[str, str]]]:
    """The slot variables of `offers` (not modelled so yet): returns them and the x keys they share
    (an x with no slot variable, not `held`, is 0 by their rows)."""
    m, bounds = model.m, model.p.pool_bounds
    offers = [o for o in offers if o.key not in model.slots_of]
    for o in offers:
        model.slots_of[o.key] = slot_count(o, bounds, need)
        model.slot_offers.append(o)
        for i in range(model.slots_of[o.key]):
            model.on[(o.key, i)] = m.new_bool_var(f"on[{o.key},{i}]")
    new = {o.key for o in offers}
    exact = set(model.slots_of)
    shared = []
    for gk, ck in model.x:
        members = [ck] if ck in exact else list(model.classes[ck].members) if ck in model.classes else []
        if not members or not all(k in exact for k in members) or not any(k in new for k in members):
            continue
        rep = model.demands[model.p.groups[gk][0]]
        shared.append((gk, ck))
        if not holds(model, (gk, ck), need, held):
            continue
        for ok in members:
            f = fit(rep, model.caps[ok])
            if f <= 0:
                continue
            for i in range(model.slots_of[ok]):
                model.z[(gk, ck, ok, i)] = m.new_int_var(0, f, f"z[{gk},{ok},{i}]")
    model.slot_x += shared
    return offers, shared


def add_slot_rows(model: Model, offers: list[Capacity] | None = None, shared: list[tuple[str, str]] | None = None) -> None:
    """Each exact offer's count is its slots bought (the first ones), and its ballast instances once all its
    slots are (they stand idle: any plan's empty instances can be its last ones), each x on it is shared
    among its slots, and each slot holds its items per dimension. (`offers`, `shared`: only those's rows.)"""
    m = model.m
    offers = model.slot_offers if offers is None else offers
    shared = model.slot_x if shared is None else shared
    mine = {o.key for o in offers}
    for o in offers:
        on = [model.on[(o.key, i)] for i in range(model.slots_of[o.key])]
        if not o.ballast:
            m.add(sum(on) == model.use[o.key])
        elif on:
            m.add(sum(on) <= model.use[o.key])
            m.add(model.use[o.key] <= sum(on) + o.ballast * on[-1])
        for a, b in itertools.pairwise(on):
            m.add(a >= b)  # (identical instances: bought in order, no symmetric answers)
    parts: dict[tuple[str, str], list] = {}
    on_slot: dict[tuple[str, int], list[tuple[int, object]]] = {}
    for (gk, ck, ok, i), v in model.z.items():
        parts.setdefault((gk, ck), []).append(v)
        if ok in mine:
            on_slot.setdefault((ok, i), []).append((gk, v))
    for key in shared:  # (an x no slot could hold is 0)
        m.add(sum(parts.get(key, [])) == model.x[key])
    for (ok, i), cells in on_slot.items():
        o = model.caps[ok]
        items = [(model.demands[model.p.groups[gk][0]], v) for gk, v in cells]
        dims = sorted({k for d, _ in items for k in d.dims if d.req(k) > 0})
        for dim in dims:
            per = scale(dim, (d.req(dim) for d, _ in items))
            terms = [(units(d.req(dim), dim, per), v) for d, v in items if d.req(dim) > 0]
            m.add(wsum(terms) <= room(o.cap(dim), dim, per) * model.on[(ok, i)])
        one_group(model, ok, i, [(d, v) for d, v in items if d.gang and d.gang_mode == "placement-group"])


def extend_slots(model: Model, need: dict[str, int], held: set[tuple[str, str]] | None = None) -> list[Capacity]:
    """Slots, with their rows, for the offers whose aggregate counts did not pack (`need`: offer ->
    the instances its packing took; `held`: the x that may be on them, None: any), where
    `exact_offers` takes them: returns the offers added. The model's other rows stay, so an answer
    of it is one of the model before, that packs there."""
    offers, shared = _new_slots(model, exact_offers(model, need, held), need, held)
    add_slot_rows(model, offers, shared)
    return offers


def extend_idle_slots(model: Model, need: dict[str, int], held: set[tuple[str, str]]) -> list[Capacity]:
    """Slots, with their rows, for idle classes whose kept instances do not hold the items an answer put on them
    (`need`: class -> its instances kept; `held`: the x that may be on them), as `extend_slots` gives an offer's new
    instances: slot i is the class's i-th host (both are kept in order). A class's rows are summed over its hosts
    (index.idle_classes), so an answer may put there what no host holds (fleet29: 24 of 32 vCPU and 108 of 128 GiB
    in sum on two 16-vCPU hosts, but a 60-GiB job fills one alone). Every host of a class gets a slot where SLOT_VARS
    allows, else those kept: an answer that keeps fewer than the class has may need more of them to hold its work
    (fleet29 at 40 times its size: 50 of 80 kept, and 30 jobs waited with 50 slots). Returns the classes added."""
    bounds = model.p.pool_bounds
    at: dict[str, int] = {}
    for _, ck in held:
        at[ck] = at.get(ck, 0) + 1
    need = {ik: model.idle[ik].most if model.idle[ik].most * at.get(ik, 0) <= SLOT_VARS else n for ik, n in need.items()}
    chosen, total = [], 0
    for ik in sorted(need, key=lambda k: (slot_count(model.idle[k], bounds, need) * at.get(k, 0), k)):
        size = slot_count(model.idle[ik], bounds, need) * at.get(ik, 0)
        if ik in model.slots_of or total + size > SLOT_VARS:
            continue
        chosen.append(model.idle[ik])
        total += size
    classes, shared = _new_slots(model, chosen, need, held)
    add_slot_rows(model, classes, shared)
    return classes


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
        for i in range(model.slots_of[o.key]):
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
        n = sum(val(model.on[(o.key, i)]) for i in range(model.slots_of[o.key]))
        if n and o.key not in model.idle:  # (an idle class's are its hosts: extract.unfold_idle reads them)
            out[o.key] = [[] for _ in range(n)]
    for (gk, ck, ok, i), v in model.z.items():
        k = val(v)
        if k > 0 and ok in out and i < len(out[ok]):
            out[ok][i].append((ck, gk, k))
    return {ok: tuple(tuple(sorted(s)) for s in insts) for ok, insts in out.items()}


def slot_variables(model: Model) -> list:
    return model.on.variables() + [v for v in model.z.values() if not is_zero(v)]


__all__ = ["FIXED_MOST", "SLOTS_MOST", "add_slot_rows", "exact_offers", "extend_idle_slots", "extend_slots", "holds", "per_instance", "pool_capped", "slot_contents", "slot_count",
           "slot_hints", "slot_vars", "slot_variables"]
