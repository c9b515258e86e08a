"""Fewer instances for a repaired answer: where the packer's packing of an offer's count took more
instances than the count (the repair stage, strategy.py), a small search packs the items of the
instances beyond the count and of the instances with the most room again, every other placement
held, so the plan reaches the count the model proved when a packing on it is near the packer's.

Why: the model counts an offer's capacity summed over its instances (with valid cuts), so its cost
bound is for that count; the packer's first fit may need one more. On trace-buy-1k (bench/trace.py:
1,046 GPUs of 1-GPU to 8-GPU jobs on 8-GPU instances, 2 GPUs to spare in 131) the packer took 132
where the model proved 131: the plan cost $2,898.41/h, and the plan right after its apply moved 13
jobs to give the 132nd back ($2,876.45/h). Packing the items of the 132nd and of the 16 roomiest
instances again found the 131 in 0.004 work-seconds (8 instances did not; the whole offer's 132:
0.9 work-seconds, 1.5 s of CPU).

The search is a bin packing of its own (`_Packing`: those items, those instances, each instance's rows as
slots.add_slot_rows writes them), not a copy of the whole model with the rest fixed: at 10k jobs the copy
took 0.5 s of CPU (83k variables cloned and 60k of them fixed one by one) to find nothing, beside the model's
check of the packer's packing (strategy.repack). Now the packing found goes to that check in its place (and the
packer's where the model refuses it), so every rule (pool minimums, the spot share, the on-demand buffer,
budgets) is asked of it by the model itself, and a plan that finds none pays one check, as before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.cpsat import cp_model

from reconciler.problem import Capacity, fit
from reconciler.solve.variables import room, scale, set_hints, units

if TYPE_CHECKING:
    from reconciler.solve.model import Model
    from reconciler.solve.strategy import Search

ROOMY = 16  # instances with the most room whose items are packed again beside those beyond the count
FEWER_WORK = 0.1  # deterministic seconds for the search (trace-buy-1k's: 0.004)


def fewer_instances(search: Search, answer: list[int], added: list[Capacity], counts: dict[str, int]) -> list[int] | None:
    """The packed `answer` (strategy.packed_answer: the packer's packing on the `added` offers' slots) on fewer of
    those offers' instances, if a search finds it, else None; the caller asks the model whether it is an answer
    (strategy.repack). `counts`: each offer's count before the repair. The items on that offer's instances beyond
    the count and on its ROOMY roomiest ones may move among those instances; every other placement (instances
    elsewhere, jobs placed, items per capacity, the other instances' items) is held. Offer by offer, each with an
    even share of the work the ones before it left: one search of them all found none of those this finds at 10k
    jobs in the same work (its one worker spent it on the first offers it branched on)."""
    model = search.model
    todo = []
    for o in added:
        n = min(answer[model.use[o.key].index], model.slots_of[o.key])  # (past its slots: its ballast, idle, left so)
        if n > counts.get(o.key, 0):
            pick = sorted(set(range(counts.get(o.key, 0), n)) | set(roomiest(model, answer, o, n)[:ROOMY]))
            if len(pick) > 1:
                todo.append((o, pick))
    out, spent = None, 0.0
    for k, (o, pick) in enumerate(todo):
        packing = _Packing(model, o, pick, answer)
        s = search.solver_for(linearization_level=2)  # (its LP finds the packings: 3 of 4 offers short at 10k jobs, 1 of 4 without)
        st = search.clock.solve(s, packing.m, (FEWER_WORK - spent) / (len(todo) - k))
        spent += s.response_proto.deterministic_time
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value < len(pick) - 0.5:
            out = packing.answer(list(s.response_proto.solution), out or answer)
    return out


class _Packing:
    """The items on offer o's picked instances (`pick`), packed again onto as few of them as hold them: the
    picked instances are bins, bought in order, with items per (x's group and capacity) and bin, and each bin's
    rows per dimension and its one placement group (slots.add_slot_rows' rows). Hinted with the answer's packing."""

    def __init__(self, model: Model, o: Capacity, pick: list[int], answer: list[int]):
        self.model, self.o, self.pick = model, o, pick
        m = self.m = cp_model.CpModel()
        where = set(pick)
        total: dict[tuple[str, str], int] = {}
        now: dict[tuple[str, str, int], int] = {}
        for (gk, ck, ok, i), v in model.z.variable_items():
            if ok == o.key and i in where and answer[v.index]:
                total[(gk, ck)] = total.get((gk, ck), 0) + answer[v.index]
                now[(gk, ck, i)] = answer[v.index]
        self.bins = [m.new_bool_var(f"bin[{i}]") for i in pick]
        for a, b in zip(self.bins, self.bins[1:]):
            m.add(a >= b)
        self.items: dict[tuple[str, str], list] = {}
        per_bin: list[list[tuple[object, object]]] = [[] for _ in pick]
        hints = [(b.index, 1) for b in self.bins]
        for (gk, ck), n in sorted(total.items()):
            d = model.demands[model.p.groups[gk][0]]
            row = [m.new_int_var(0, min(n, fit(d, o)), f"y[{gk},{ck},{j}]") for j in range(len(pick))]
            m.add(sum(row) == n)
            self.items[(gk, ck)] = row
            for j, i in enumerate(pick):
                per_bin[j].append((d, row[j]))
                hints.append((row[j].index, now.get((gk, ck, i), 0)))
        for j, cells in enumerate(per_bin):
            for dim in sorted({k for d, _ in cells for k in d.dims if d.req(k) > 0}):
                per = scale(dim, (d.req(dim) for d, _ in cells))
                m.add(sum(units(d.req(dim), dim, per) * v for d, v in cells if d.req(dim) > 0) <= room(o.cap(dim), dim, per) * self.bins[j])
            pg = [(d, v) for d, v in cells if d.gang and d.gang_mode == "placement-group"]
            if len(pg) > 1:
                ys = [m.new_bool_var(f"pg[{d.key},{j}]") for d, _ in pg]
                for (d, v), y in zip(pg, ys):
                    m.add(v <= fit(d, o) * y)
                m.add(sum(ys) <= 1)
        m.minimize(sum(self.bins))
        set_hints(m, hints)

    def answer(self, packed: list[int], answer: list[int]) -> list[int]:
        """`answer` with the offer's picked instances as packed here: the bins bought take the picked instances'
        places in order, and the instances so left empty go (slots are bought in order: the later ones move up)."""
        model, ok = self.model, self.o.key
        n = min(answer[model.use[ok].index], model.slots_of[ok])
        contents: list[dict[tuple[str, str], int]] = [{} for _ in range(n)]
        mine = [((gk, ck), i, v) for (gk, ck, o, i), v in model.z.variable_items() if o == ok]
        for key, i, v in mine:
            if i < n and answer[v.index]:
                contents[i][key] = answer[v.index]
        bins = iter([{key: packed[row[j].index] for key, row in self.items.items() if packed[row[j].index]}
                     for j, b in enumerate(self.bins) if packed[b.index]])
        where = set(self.pick)
        slots = [c for c in (contents[i] if i not in where else next(bins, None) for i in range(n)) if c is not None]
        out = list(answer)
        for key, i, v in mine:
            out[v.index] = slots[i].get(key, 0) if i < len(slots) else 0
        for i in range(model.slots_of[ok]):
            out[model.on[(ok, i)].index] = 1 if i < len(slots) else 0
        out[model.use[ok].index] -= n - len(slots)
        return out


def roomiest(model: Model, answer: list[int], o: Capacity, n: int) -> list[int]:
    """Offer o's first n instances (slots) in `answer`, the most room first: per dimension its items use,
    each instance's free share of the offer's free total in that dimension, summed (so the scarce
    dimension's room counts most: on trace-buy-1k GPUs, 10 free in 132 instances, beside 600 vCPU)."""
    demands, groups = model.demands, model.p.groups
    used: list[dict[str, float]] = [{} for _ in range(n)]
    for (gk, _, ok, i), v in model.z.variable_items():
        k = answer[v.index]
        if ok != o.key or i >= n or not k:
            continue
        d = demands[groups[gk][0]]
        for dim in d.dims:
            used[i][dim] = used[i].get(dim, 0.0) + d.req(dim) * k
    dims = sorted({dim for u in used for dim in u})
    free = [{dim: max(0.0, o.cap(dim) - u.get(dim, 0.0)) for dim in dims} for u in used]
    total = {dim: sum(f[dim] for f in free) for dim in dims}
    score = [sum(f[dim] / total[dim] for dim in dims if total[dim] > 0) for f in free]
    return sorted(range(n), key=lambda i: (-score[i], i))


__all__ = ["FEWER_WORK", "ROOMY", "fewer_instances", "roomiest"]
