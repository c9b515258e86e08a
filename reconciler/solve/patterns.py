"""Patterns: on the offer of a pool that caps its count (`slots.pool_capped`: a fixed pool, or max_instances below what
the work could take) modelled in sum (more instances than `slots.FIXED_MOST`), the items fit the
instances one pattern each. A pattern is a way one instance holds items of the shapes that may land there (a count
per shape within every dimension, requests rounded up and room down, as the packer counts them: `pack._patterns`);
a count per pattern, within the instances, covers each shape's items. This is the configuration model of cutting
stock: exact for packing where the summed rows are not (with memory or vCPU binding, 1,000 jobs at 120-150 GiB a
GPU on 274 a2-highgpu-8g had counts that did not pack, and the repair stage had to search the answer again), and its
LP relaxation is the Gilmore-Gomory bound, so the tiers are proven against what packs. Only where the shapes give at
most PATTERNS_MOST patterns (else the summed rows alone, as before); the summed rows and their cuts stay beside."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.problem import Capacity
from reconciler.solve.slots import pool_capped
from reconciler.solve.variables import is_zero

if TYPE_CHECKING:
    from reconciler.solve.model import Model

# At most this many patterns per offer or class (each one a variable). On a2-highgpu-8g (8 GPUs, 96 vCPU, 680 GiB) the
# memory-heavy mix's five shapes give 41, the mix at 10 and 16 vCPU a GPU 100, and on a2-highgpu-2g 4.
PATTERNS_MOST = 5_000


def add_patterns(model: Model) -> None:
    """The pattern rows of every capped pool's offer (or zone class) modelled in sum; for a GPU type, only where each
    of its such capacities gets them. (Exact on one pool and summed on another, the answer moved work to the summed
    one, where its counts did not pack: trace-mixed-5k's 2-GPU pool by pattern and its 8-GPU pool, whose shapes give
    more than PATTERNS_MOST, in sum, left 60 jobs unpacked on the latter, and greedy's plan, 76 GPUs fewer than the
    plan before, was emitted.)"""
    from reconciler.solve.capacity import capacity_rows

    found: dict[object, list] = {}  # GPU type -> its capacities' (capacity, items, n, most, patterns), None: too many
    for c, items, n, most in capacity_rows(model):
        if most > 1 and fixed_in_sum(model, c):
            items = [(d, v) for d, v in items if not is_zero(v)]
            found.setdefault(c.gpu_type, []).append((c, items, n, most, patterns_of(c, items)))
    for rows in found.values():
        if all(r[-1] is not None for r in rows):
            for c, items, n, most, (order, shapes, patterns) in rows:
                add_pattern_rows(model, c, order, shapes, patterns, n, most)


def fixed_in_sum(model: Model, c: Capacity) -> bool:
    """A new-instance capacity of pools that cap its count (`slots.pool_capped`: fixed, or max_instances below what
    its work could take) with no per-instance rows (slots)."""
    keys = list(getattr(c, "members", ()) or ()) or [c.key]
    if c.key in model.idle or any(k not in model.caps or k in model.slots_of for k in keys):
        return False
    bounds = model.p.pool_bounds
    return all(model.caps[k].pool in bounds and pool_capped(model.caps[k], bounds) for k in keys)


def patterns_of(c: Capacity, items: list) -> tuple[list, dict, list] | None:
    """The shapes of `items` ((Demand, its variable) on instances of `c`), each shape's variables, and every way one
    instance holds them (`pack._patterns`); None where an item is a MIG slice or takes nothing, or where there are more
    than PATTERNS_MOST. No items: no shape, no pattern."""
    from reconciler.pack import _needs, _patterns, _room, _shape

    if any(d.mig for d, _ in items):
        return None
    shapes: dict[tuple, list] = {}
    rep = {}
    for d, v in items:
        sh = _shape(d)
        shapes.setdefault(sh, []).append(v)
        rep.setdefault(sh, d)
    order = sorted(shapes, key=repr)
    asked = _needs([rep[sh] for sh in order])
    if asked is None:
        return None
    dims, need, per = asked
    patterns = _patterns({k: _room(c.cap(k), k, per) for k in dims}, need, [10**9] * len(need), limit=PATTERNS_MOST) if order else []
    return None if patterns is None else (order, shapes, patterns)


def add_pattern_rows(model: Model, c: Capacity, order: list, shapes: dict, patterns: list, n, most: int) -> None:
    """A count per pattern (`patterns_of`) within the `n` instances of `c` (at most `most`), covering each shape's
    items."""
    if not order:
        return
    m = model.m
    ys = [m.new_int_var(0, most, f"pattern[{c.key},{i}]") for i in range(len(patterns))]
    m.add(sum(ys) <= n)
    for s, sh in enumerate(order):
        m.add(sum(shapes[sh]) <= sum(p[s] * y for p, y in zip(patterns, ys) if p[s]))
    model.pattern_vars[c.key] = (patterns, ys)


__all__ = ["PATTERNS_MOST", "add_pattern_rows", "add_patterns", "fixed_in_sum", "patterns_of"]
