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
0.9 work-seconds, 1.5 s of CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from reconciler.problem import Capacity
from reconciler.solve.variables import set_full_hints

if TYPE_CHECKING:
    from reconciler.solve.model import Model
    from reconciler.solve.strategy import Search

ROOMY = 16  # instances with the most room whose items are packed again beside those beyond the count
FEWER_WORK = 0.1  # deterministic seconds for the search (trace-buy-1k's: 0.004)


def fewer_instances(search: Search, answer: list[int], value: float, added: list[Capacity],
                    counts: dict[str, int]) -> tuple[list[int], float] | None:
    """The repaired `answer` (cost `value`) on fewer of the `added` offers' instances, if a search finds it:
    (answer, cost), else None. `counts`: each offer's count before the repair. The items on that offer's
    instances beyond the count and on its ROOMY roomiest ones may move among those instances; every other
    placement (instances elsewhere, jobs placed, items per capacity, the other instances' items) is held,
    so every rule the answer met it still meets; the helper variables follow."""
    model = search.model
    free: set[int] = set()
    for o in added:
        n = answer[model.use[o.key].index]
        if n <= counts.get(o.key, 0):
            continue
        pick = set(range(counts.get(o.key, 0), n)) | set(roomiest(model, answer, o, n)[:ROOMY])
        free |= {v.index for (_, _, ok, i), v in model.z.variable_items() if ok == o.key and i in pick}
        free |= {model.on[(o.key, i)].index for i in range(model.slots_of[o.key])}
        free.add(model.use[o.key].index)
    if not free:
        return None
    sub = search.m.clone()
    for v in model.primaries():
        if v.index not in free:
            hold(sub, v, answer[v.index])
    search.objective(sub, search.cost)
    set_full_hints(sub, answer)
    s = search.solver_for()
    st = search.clock.solve(s, sub, FEWER_WORK)
    if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value < value - 0.5:
        return list(s.response_proto.solution), s.objective_value
    return None


def hold(m: cp_model.CpModel, v, value: int) -> None:
    """Fix variable `v` at `value` in model `m` (a clone): its domain, where it is one interval."""
    dom = m.proto.variables[v.index].domain
    if len(dom) == 2:
        dom[0], dom[1] = value, value
    else:
        m.add(v == value)


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
