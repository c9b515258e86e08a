"""Pack items onto concrete instances and give every replica its GPU indices.

Pure. The solver decides counts (so many items of a demand on an offer's new
instances, so many on a host); this decides which instance and which GPUs:
first-fit decreasing by dominant share, each multi-GPU replica in one aligned
block of GPUs inside one NVLink domain when it fits in one (always, when the job
asks for nvlink). A large offer is aggregate in the model, so fragmentation can leave
an item without room in the bought instances: the packer then opens one more
instance of the offer (a "repair", counted in the plan). A small offer's instances
the model packs one by one (solve/slots.py), and each is filled as it says; so are a large
offer's where the solver's repair stage found that its counts did not pack (solve/strategy.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from reconciler.problem import DIMS, Capacity, Demand, has_room
from reconciler import units as exact


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass
class Bin:
    """One instance being filled: free resources and which GPUs are taken."""

    cap: Capacity
    ref: str  # instance id, or the plan's create ref
    free: dict[str, float]
    gpus_used: list[bool]
    items: list[tuple[str, str, int]] = field(default_factory=list)  # (demand key, job, replica index)
    group: str | None = None  # the placement group the instance launches into (one per instance)
    gpu_of: dict = field(default_factory=dict)  # (job, replica) -> GPU index tuples
    touched: bool = False  # anything taken here yet (untouched instances of one offer are interchangeable)
    touched_before: bool = False  # touched before the current pack_items call (unplace restores it)

    @classmethod
    def empty(cls, cap: Capacity, ref: str) -> "Bin":
        dims = list(DIMS) + [f"mig:{p}" for p in set(cap.mig or ())]
        return cls(cap, ref, {k: cap.cap(k) for k in dims}, [False] * (0 if cap.mig else cap.gpus))

    def fits(self, d: Demand) -> bool:
        # (a loop, not all() over a generator: asked 53k times packing a 10k-job plan's new instances)
        free = self.free
        for k in d.dims:
            r = d.req(k)
            if r > 0 and not free.get(k, 0.0) >= r - 1e-9:
                return False
        return True

    def take_resources(self, d: Demand) -> None:
        self.touched = True
        for k in d.dims:
            self.free[k] = self.free.get(k, 0.0) - d.req(k)

    # -- GPUs

    def _block(self, size: int, nvlink_only: bool) -> list[int] | None:
        """The aligned free block of `size` GPUs (rounded up to a power of two) inside one
        NVLink domain that leaves the most room elsewhere; None if there is none."""
        n = len(self.gpus_used)
        dom = max(1, min(self.cap.nvlink_domain, n))
        block = _pow2(size)
        if block <= dom and dom % block == 0:
            best, best_score = None, None
            for start in range(0, n - block + 1, block):
                if any(self.gpus_used[start:start + block]):
                    continue
                # Prefer the block whose surrounding (next larger aligned block) is most used.
                outer = min(dom, block * 2)
                o = (start // outer) * outer
                score = sum(self.gpus_used[o:o + outer])
                if best_score is None or score > best_score:
                    best, best_score = start, score
            if best is not None:
                return list(range(best, best + size))
        if nvlink_only:
            # Unaligned but inside one domain.
            for d0 in range(0, n, dom):
                free = [i for i in range(d0, min(n, d0 + dom)) if not self.gpus_used[i]]
                if len(free) >= size:
                    return free[:size]
            return None
        free = [i for i in range(n) if not self.gpus_used[i]]
        return free[:size] if len(free) >= size else None

    def gpus_for(self, d: Demand) -> list[tuple[int, ...]] | None:
        """GPU indices per replica of one item (a bundle has several replicas), or None."""
        if not d.gpus or not self.gpus_used:
            return [()] * d.bundle
        per = d.gpus // d.bundle
        got, taken = [], []
        for _ in range(d.bundle):
            idx = self._block(per, d.nvlink)
            if idx is None:
                for i in taken:
                    self.gpus_used[i] = False
                return None
            for i in idx:
                self.gpus_used[i] = True
            taken += idx
            got.append(tuple(idx))
        return got

    def place(self, d: Demand, job: str, replica: int, group: str | None = None) -> list[tuple[int, ...]] | None:
        if not self.fits(d) or (group is not None and self.group not in (None, group)):
            return None
        idx = self.gpus_for(d)
        if idx is None:
            return None
        self.take_resources(d)
        self.items.append((d.key, job, replica))
        if group is not None:
            self.group = group
        self.gpu_of[(job, replica)] = idx
        return idx

    def remove(self, d: Demand, job: str) -> None:
        """Take every item of `job` off this instance again (its gang could not be placed whole)."""
        for it in [it for it in self.items if it[1] == job]:
            self.items.remove(it)
            for k in d.dims:
                self.free[k] = self.free.get(k, 0.0) + d.req(k)
            for t in self.gpu_of.pop((job, it[2]), []):
                for i in t:
                    self.gpus_used[i] = False

    def unplace(self, d: Demand, job: str, replica: int) -> None:
        """Take one item placed here by the current pack_items call off again."""
        self.items.remove((d.key, job, replica))
        for k in d.dims:
            self.free[k] = self.free.get(k, 0.0) + d.req(k)
        for t in self.gpu_of.pop((job, replica), []):
            for i in t:
                self.gpus_used[i] = False
        self.touched = bool(self.items) or self.touched_before

    def reserve(self, d: Demand, gpus: list[tuple[int, ...]]) -> None:
        """A resident that stays: its resources and its GPUs are taken as they are."""
        self.take_resources(d)
        for t in gpus:
            for i in t:
                if 0 <= i < len(self.gpus_used):
                    self.gpus_used[i] = True


def dominant(d: Demand, c: Capacity) -> float:
    return max((d.req(k) / c.cap(k) for k in d.dims if c.cap(k) > 0), default=0.0)


def pack_items(bins: list[Bin], items: list[tuple[Demand, str, int, str | None]], more=None,
               compact: bool = False, least_left: bool = False, exact: bool = False) -> list[tuple[Demand, str, int, str | None]]:
    """`_pack_greedy`; where it leaves items over on the instances there are, `_pack_filling`
    too (from the same start), and the better of the two (fewer GPUs, then items, left over);
    then, with `exact` (the plan's last call for these instances: what is left now is bought for or left out), an
    exact re-pack of the instances with the most room (`_repack`); then more() for what is left. least_left: what is left over at the end traded up (`_trade_up`), so it is the
    least important work whichever pass packed (for a packing whose leftovers the plan drops, not one that says what
    to buy: traded, two low items left where one normal was took one more repair instance). Summed capacity packs item by item far more often than the
    greedy pass finds: on the trace-shaped fixed cluster (1-GPU jobs of 4 to 25 vCPU on 8-GPU,
    96-vCPU nodes, bench/trace.py) the solver's 850 jobs filled the 111 nodes' GPUs and vCPU to
    the last unit in sum; the greedy pass left 92 of them over, filling left 7."""
    for b in bins:
        b.touched_before = b.touched
    left = _pack_greedy(bins, items, None, compact)
    if left and len(items) > 1 and all(g is None for *_, g in items):
        greedy_left = _left_size(left)
        _unplace_all(bins, items)
        left = _pack_filling(bins, items)
        if _left_size(left) >= greedy_left:  # no better: the greedy pass's packing, as it was
            _unplace_all(bins, items)
            left = _pack_greedy(bins, items, None, compact)
    # (only in the plan's last call for these instances: in the solver's repair stage, which models a class that did not
    # pack instance by instance, a re-pack per item in every call saved $4/h of $37,422 on the 5k tier for 3 s of its
    # 6.6 s cold plan)
    if left and exact and len(items) > 1 and all(g is None for *_, g in items):
        left = _repack(bins, items, left)
        if left:
            left = _pattern_pack(bins, items, left)
    if left and more is not None:
        left = _pack_greedy(bins, left, more, compact)
    if left and least_left and len(items) > 1 and all(g is None for *_, g in items):
        left = _trade_up(bins, items, left)
    return left


# The exact re-pack's neighbourhood: the instances with the most room, the items they hold and the items left over.
# (A pass's leftovers are a handful where counts summed per offer pack at all: 1 of 4,256 and 5 of 8,652 jobs on the
# trace-shaped fixed clusters of 563 and 1,147 nodes, bench/README.md; a neighbourhood this size has room for them.)
REPACK_BINS = 32  # at least, and more while their free room is short of twice what the leftovers ask
REPACK_MAX_BINS = 96
REPACK_ITEMS = 800
REPACK_LEFT = 64
REPACK_WORK = 0.5  # CP-SAT deterministic seconds per re-pack: deterministic, so two plans of one input agree
def _per(items: list[Demand], dims: list[str]) -> dict[str, int]:
    """Each dimension's integer units per vCPU, GiB or GPU over these items, as the model's rows count them
    (reconciler.units.scale: exact for the decimals the requests have)."""
    return {k: exact.scale(k, {d.req(k) for d in items}) for k in dims}


def _units(d: Demand, k: str, per: dict[str, int]) -> int:
    """What an item asks of dimension k in the exact passes' integers (`per`: `_per`): the model's (reconciler.units),
    so a pattern the model counts is one these passes pack. (Their own ceil without a tolerance counted 4.03 vCPU as
    4031.)"""
    return exact.units(d.req(k), k, per[k])


def _needs(shapes: list[Demand]) -> tuple[list[str], list[dict[str, int]], dict[str, int]] | None:
    """The dimensions these shapes ask for, each one's integer requests in them (`_units`) and the units they are in
    (`_per`), as the pattern passes count them; None where a shape asks for nothing (no pattern bounds how many one
    instance holds)."""
    dims = sorted({k for d in shapes for k in d.dims if d.req(k) > 0})
    per = _per(shapes, dims)
    need = [{k: _units(d, k, per) for k in dims} for d in shapes]
    return None if any(all(v == 0 for v in n.values()) for n in need) else (dims, need, per)


def _room(v: float, k: str, per: dict[str, int]) -> int:
    """Free room `v` of dimension k in the exact passes' integers (down), in the units `per` (`_per`) counts."""
    return exact.room(v, k, per[k])


def _repack(bins: list[Bin], items: list[tuple[Demand, str, int, str | None]],
            left: list[tuple[Demand, str, int, str | None]]) -> list[tuple[Demand, str, int, str | None]]:
    """Items left over placed by packing a neighbourhood exactly: the instances with the most free room (below),
    this call's items on them moved freely among them, every one of those staying placed, and as many jobs of the
    leftovers (each whole: all its leftover items or none; the higher class first, then more work) as fit. The greedy and filling passes pack item by item; summed room that no order of theirs uses (a
    CPU-heavy item beside a GPU with no vCPU left) is found here. The instances are changed only if the exact
    packing places more and every item then gets its GPUs (aligned blocks, as `place` gives them); else they
    stay as they were. Returns what is still left."""
    mine = {(job, rep): d for d, job, rep, _ in items}
    pending = sorted(left, key=lambda it: (-it[0].klass, -it[0].weight, it[1], it[2]))[:REPACK_LEFT]
    dims = sorted({k for d, *_ in pending for k in d.dims if d.req(k) > 0})
    if not pending or not dims:
        return left

    def room(b: Bin) -> float:  # the shares of the dimensions the leftovers ask for that are free here, summed
        return sum(min(b.free.get(k, 0.0) / b.cap.cap(k), 1.0) for k in dims if b.cap.cap(k) > 0)

    # The instances with free GPUs (the leftovers' GPUs are the room that is scarce: ranked by room summed, 32 instances
    # with free vCPU and memory and none of the 8 free GPUs held a fixed cluster's 8-GPU leftover out), then those with
    # the most of the dimension the leftovers are shortest of, until the neighbourhood's free room is at least twice
    # what they ask in every dimension, or all there is (at 1,147 nodes, 32 instances' free vCPU was short of five 1-GPU jobs').
    need = {k: sum(d.req(k) for d, *_ in pending) for k in dims}
    total = {k: sum(b.free.get(k, 0.0) for b in bins) for k in dims}
    scarce = max((k for k in dims if k != "gpus"), key=lambda k: (need[k] / max(total[k], 1e-9), k), default="gpus")
    has_gpu = {i for i in range(len(bins)) if bins[i].free.get("gpus", 0.0) >= 1 - 1e-9} if "gpus" in dims else set()
    ranked = sorted(has_gpu, key=lambda i: (-bins[i].free.get("gpus", 0.0), -room(bins[i]), i)) + sorted(
        (i for i in range(len(bins)) if i not in has_gpu and any(bins[i].free.get(k, 0.0) > 1e-9 for k in dims)),
        key=lambda i: (-bins[i].free.get(scarce, 0.0) / max(bins[i].cap.cap(scarce), 1e-9), -room(bins[i]), i))
    chosen: list[int] = []
    movable: list[tuple[Demand, str, int]] = []
    at: list[int] = []  # the instance each movable item is on
    got = dict.fromkeys(dims, 0.0)
    for i in ranked:
        if len(chosen) >= REPACK_BINS and all(got[k] >= min(2 * need[k], total[k]) - 1e-9 for k in dims):
            break
        here = [(mine[(j, r)], j, r) for _, j, r in bins[i].items if (j, r) in mine]
        if len(chosen) >= REPACK_MAX_BINS or len(movable) + len(here) > REPACK_ITEMS:
            break
        chosen.append(i)
        movable += here
        at += [i] * len(here)
        for k in dims:
            got[k] += bins[i].free.get(k, 0.0)
    if not chosen:
        return left
    from reconciler.cpsat import cp_model  # (only where a pass left items over: the plan phase imports no solver otherwise)

    every = movable + [(d, j, r) for d, j, r, _ in pending]  # (the items the model places: those it moves, then the leftovers)
    need_dims = sorted({k for d, *_ in every for k in d.dims if d.req(k) > 0})

    free = {i: {k: bins[i].free.get(k, 0.0) for k in need_dims} for i in chosen}  # with this call's movable items taken off
    for (d, _, _), i in zip(movable, at):
        for k in need_dims:
            free[i][k] += d.req(k)
    per = _per([d for d, *_ in every], need_dims)
    base = {i: {k: _room(v, k, per) for k, v in f.items()} for i, f in free.items()}

    # Items of one shape are interchangeable here (`place` reads only the shape): the model counts items of each shape
    # per instance, so thousands of alike items are not thousands of symmetric variables (per item, 32 instances' 212
    # items found no better packing in the work; counted per shape, the few shapes on 32 instances are a small model).
    shape_of = {_shape(d): d for d, *_ in every}
    shapes = sorted(shape_of, key=repr)
    sid = {sh: n for n, sh in enumerate(shapes)}
    moving = Counter(sid[_shape(d)] for d, *_ in movable)
    jobs_left = sorted({j for _, j, _, _ in pending})
    per_job: dict[str, Counter] = {j: Counter() for j in jobs_left}
    for d, j, _, _ in pending:
        per_job[j][sid[_shape(d)]] += 1
    now_at = Counter((sid[_shape(d)], i) for (d, _, _), i in zip(movable, at))

    m = cp_model.CpModel()
    cnt: dict[tuple[int, int], cp_model.IntVar] = {}
    for n, sh in enumerate(shapes):
        d = shape_of[sh]
        most = moving[n] + sum(c[n] for c in per_job.values())
        for i in chosen:
            fit = min((base[i][k] // _units(d, k, per) for k in need_dims if _units(d, k, per) > 0), default=most)
            if min(fit, most) > 0:
                cnt[(n, i)] = m.new_int_var(0, min(fit, most), f"n{n}_{i}")
    y = {j: m.new_bool_var(f"y_{j}") for j in jobs_left}
    for n in range(len(shapes)):  # every movable item placed, and the leftovers of the jobs taken
        m.add(sum(v for (nn, _), v in cnt.items() if nn == n) == moving[n] + sum(c[n] * y[j] for j, c in per_job.items() if c[n]))
    for i in chosen:
        for k in need_dims:
            terms = [(u, v) for (n, ii), v in cnt.items() if ii == i and (u := _units(shape_of[shapes[n]], k, per))]
            if terms:
                m.add(sum(c * v for c, v in terms) <= base[i][k])
    for j, v in y.items():  # a job's leftover items together or not at all (its other items are placed, or it is a 1-item job)
        if sum(1 for _, jj, _, _ in left if jj == j) > sum(per_job[j].values()):
            m.add(v == 0)
    klass = {j: d.klass for d, j, _, _ in pending}
    work = {j: d.weight for d, j, _, _ in pending}
    step = sum(work.values()) + 1
    m.maximize(sum((klass[j] * step + work[j]) * v for j, v in y.items()))
    for key, v in cnt.items():  # the packing as it is: a feasible start
        m.add_hint(v, now_at.get(key, 0))
    for v in y.values():
        m.add_hint(v, False)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = REPACK_WORK
    st = solver.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or not any(solver.value(v) for v in y.values()):
        return left
    # Apply: the items to place per shape (each instance keeps its own items of a shape first: fewest GPU changes),
    # every chosen instance emptied of this call's items, then filled as the counts say, largest first.
    queue: dict[int, list[tuple[Demand, str, int]]] = {n: [] for n in range(len(shapes))}
    wants = {key: solver.value(v) for key, v in cnt.items() if solver.value(v)}
    mine_at: dict[tuple[int, int], list] = {}
    for (d, j, r), i in zip(movable, at):
        mine_at.setdefault((sid[_shape(d)], i), []).append((d, j, r))
    fill: dict[int, list[tuple[Demand, str, int]]] = {i: [] for i in chosen}
    for (n, i), own in sorted(mine_at.items()):
        k = wants.get((n, i), 0)
        fill[i] += own[:k]
        queue[n] += own[k:]
        if k:
            wants[(n, i)] = k - len(own[:k])
    for d, j, r, _ in pending:
        if solver.value(y[j]):
            queue[sid[_shape(d)]].append((d, j, r))
    for (n, i), k in sorted(wants.items()):
        fill[i] += queue[n][:k]
        queue[n] = queue[n][k:]
    restore = _kept([bins[i] for i in chosen])
    for (d, j, r), i in zip(movable, at):
        bins[i].unplace(d, j, r)
    placed: set[tuple[str, int]] = set()
    ok = not any(queue.values()) and sum(len(f) for f in fill.values()) == len(movable) + sum(
        1 for _, j, _, _ in pending if solver.value(y[j]))  # (every item found its instance, once)
    for i in chosen if ok else ():
        for d, j, r in sorted(fill[i], key=lambda e: (-e[0].gpus, e[1], e[2])):
            if bins[i].place(d, j, r) is None:
                ok = False
                break
            placed.add((j, r))
        if not ok:
            break
    if not ok:  # (GPU blocks the sums do not see): as they were
        restore()
        return left
    return [it for it in left if (it[1], it[2]) not in placed]


# The pattern packing (below): at most this many ways to fill one instance, and CP-SAT's deterministic seconds.
PATTERNS_MOST = 20_000
PATTERN_WORK = 0.5


def _pattern_pack(bins: list[Bin], items: list[tuple[Demand, str, int, str | None]],
                  left: list[tuple[Demand, str, int, str | None]]) -> list[tuple[Demand, str, int, str | None]]:
    """Every item of this call on instances of one offer that held nothing before it, found by counting patterns:
    the ways one instance can hold items of this call's shapes (a count per shape within every dimension), and how
    many instances take each (a configuration model, as for cutting stock). Alike empty instances are where the
    greedy, filling and neighbourhood passes lose most: item by item, or on 32-96 instances, they cannot see that the
    whole set packs. (Buying for 1,000 jobs of 1-GPU at 10 and 16 vCPU and 2/4/8-GPU at 10 a GPU on 96-vCPU 8-GPU
    instances: the passes took 254 instances for the count of 246 the model proved, which an exact packing reaches;
    1,000 jobs of 1-GPU at 14-18 vCPU on a fixed pool of 209 such instances: they left 32 GPUs idle that jobs waited
    for.) Only where the shapes give at most PATTERNS_MOST patterns and CP-SAT finds a packing of them all within
    PATTERN_WORK; else, or where an instance's GPU blocks refuse a pattern (`place`), the instances stay as they were.
    (Where not every item fits, the most of them by class was tried here: it valued an item by its class, then its
    work, so it counted a class's items, not its work (forty-six 1-GPU jobs kept for eleven 8-GPU ones), and on mixed
    node sizes the plan lost normal work: not kept. The repair stage's start on a pool at its count now takes the
    most work by class: `most_by_pattern`.)"""
    cap = bins[0].cap if bins else None
    if cap is None or len(bins) < 2 or any(b.cap.key != cap.key or b.touched_before for b in bins):
        return left
    shape_of: dict[tuple, Demand] = {}
    of_shape: dict[tuple, list[tuple[Demand, str, int, str | None]]] = {}
    for it in sorted(items, key=lambda it: (-it[0].gpus, it[1], it[2])):
        sh = _shape(it[0])
        shape_of.setdefault(sh, it[0])
        of_shape.setdefault(sh, []).append(it)
    shapes = sorted(shape_of, key=lambda sh: (-shape_of[sh].gpus, repr(sh)))
    asked = _needs([shape_of[sh] for sh in shapes])
    if asked is None:
        return left
    dims, need, per = asked
    room = {k: _room(cap.cap(k), k, per) for k in dims}
    avail = [len(of_shape[sh]) for sh in shapes]
    if any(sum(n[k] * a for n, a in zip(need, avail)) > room[k] * len(bins) for k in dims):
        return left  # (more than the instances hold in sum)
    patterns = _patterns(room, need, avail)
    if patterns is None:
        return left
    from reconciler.cpsat import cp_model  # (only where the passes left items over)

    m, use = _pattern_model(patterns, avail, len(bins))
    for i in range(len(shapes)):
        m.add(sum(p[i] * u for p, u in zip(patterns, use) if p[i]) == avail[i])
    solver = _pattern_solver()
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return left
    restore = _kept(bins)
    _unplace_all(bins, items)
    queue = {sh: list(its) for sh, its in of_shape.items()}
    at = iter(bins)
    ok = True
    for p, u in sorted(((p, solver.value(u)) for p, u in zip(patterns, use)), key=lambda e: e[0], reverse=True):
        for _ in range(u):
            b = next(at)
            for i, sh in enumerate(shapes):  # (the largest GPU shapes first: aligned blocks of 1, 2, 4, 8 fit so)
                for _ in range(p[i]):
                    d, job, rep, group = queue[sh].pop(0)
                    ok = ok and b.place(d, job, rep, group) is not None
    if not ok or any(queue.values()):
        restore()
        return left
    return []


def _patterns(room: dict[str, int], need: list[dict[str, int]], avail: list[int],
              limit: int | None = None) -> list[tuple[int, ...]] | None:
    """Every way one instance with `room` holds items of these shapes (`need`: each one's integer requests; `avail`:
    at most so many of each), as a count per shape, fullest first; None where there are more than `limit`
    (PATTERNS_MOST)."""
    dims = sorted(room)
    patterns: list[tuple[int, ...]] = []
    limit = PATTERNS_MOST if limit is None else limit

    def walk(i: int, free: dict[str, int], counts: list[int]) -> bool:
        if len(patterns) > limit:
            return False
        if i == len(need):
            if any(counts):
                patterns.append(tuple(counts))
            return True
        most = min([avail[i]] + [free[k] // need[i][k] for k in dims if need[i].get(k)])
        for n in range(most, -1, -1):
            counts.append(n)
            ok = walk(i + 1, {k: free[k] - n * need[i].get(k, 0) for k in dims}, counts)
            counts.pop()
            if not ok:
                return False
        return True

    return patterns if walk(0, room, []) else None


def _pattern_model(patterns: list[tuple[int, ...]], avail: list[int], instances: int):
    """The configuration model: how many of the `instances` take each pattern (its variables returned beside it)."""
    from reconciler.cpsat import cp_model

    m = cp_model.CpModel()
    use = [m.new_int_var(0, min(instances, min(avail[i] // p[i] for i in range(len(p)) if p[i])), f"p{n}")
           for n, p in enumerate(patterns)]
    m.add(sum(use) <= instances)
    return m, use


def _pattern_solver():
    from reconciler.cpsat import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = PATTERN_WORK
    return solver


def most_by_pattern(cap: Capacity, count: int, kinds: list[tuple[Demand, list[tuple[int, int]]]]) -> list[tuple[int, ...]] | None:
    """The most valued items that `count` alike empty instances of `cap` hold, by counting patterns (as
    `_pattern_pack`): `kinds` are a shape (a Demand) and its items' values, (class, work), highest first; the most work
    of the highest class, then of the next, and so on (the tiers' order: one 8-GPU job is eight 1-GPU jobs' work, not
    one item). The answer is each instance's pattern (how many items of each kind it holds, a kind's highest valued
    taken first), fullest first; None where the shapes give more than PATTERNS_MOST patterns, CP-SAT finds no answer
    within PATTERN_WORK, or an instance's GPU blocks refuse a pattern. For the solver's repair stage, where an offer's
    count is all it may have (a pool at its max_instances): which items its instances hold, not the packer's first
    instances. (A fixed pool of 274 8-GPU nodes and 1,000 jobs at 120-150 GiB a GPU: the packer's first 274
    instances left 72 low GPUs and 20 normal ones of the exact optimum idle; greedy's plan was emitted, 95% of the
    GPUs the optimum places.)"""
    if count < 1 or not kinds or any(d.replicas != 1 or d.mig for d, _ in kinds):
        return None
    asked = _needs([d for d, _ in kinds])
    if asked is None:
        return None
    dims, need, per = asked
    room = {k: _room(cap.cap(k), k, per) for k in dims}
    avail = [len(v) for _, v in kinds]
    patterns = _patterns(room, need, avail)
    if not patterns:
        return None
    from reconciler.cpsat import cp_model

    m, use = _pattern_model(patterns, avail, count)
    gain: dict[int, list] = {}  # class -> its work's terms
    for i, (_, values) in enumerate(kinds):
        runs: dict[tuple[int, int], int] = {}
        for v in values:
            runs[v] = runs.get(v, 0) + 1
        parts = [(v, m.new_int_var(0, n, f"k{i}c{v[0]}w{v[1]}")) for v, n in sorted(runs.items(), reverse=True)]
        m.add(sum(p[i] * u for p, u in zip(patterns, use) if p[i]) == sum(x for _, x in parts))
        for (klass, work), x in parts:
            gain.setdefault(klass, []).append(work * x)
    solver, answer = _pattern_solver(), None
    solver.parameters.max_deterministic_time = PATTERN_WORK / len(gain)
    for klass in sorted(gain, reverse=True):  # (each class's best held while the next is sought)
        m.maximize(sum(gain[klass]))
        if answer is not None:
            m.clear_hints()
            for v, a in zip(use, answer):
                m.add_hint(v, a)
        if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        answer = [solver.value(u) for u in use]
        m.add(sum(gain[klass]) >= int(solver.objective_value))
    chosen = sorted(((p, n) for p, n in zip(patterns, answer) if n), reverse=True)
    order = sorted(range(len(kinds)), key=lambda i: -kinds[i][0].gpus)  # (the largest GPU shapes first: aligned blocks)
    for p, _ in chosen:
        b = Bin.empty(cap, "pattern")
        for i in order:
            for n in range(p[i]):
                if b.place(kinds[i][0], f"k{i}", n) is None:
                    return None
    return [p for p, n in chosen for _ in range(n)]


def _kept(bins: list[Bin]):
    """The instances as they are now: returns what puts them back so (an exact pass that fails half-way)."""
    saved = [(b, dict(b.free), list(b.gpus_used), list(b.items), dict(b.gpu_of), b.group, b.touched) for b in bins]

    def restore() -> None:
        for b, free, used, its, gpu_of, group, touched in saved:
            b.free, b.gpus_used, b.items, b.gpu_of, b.group, b.touched = free, used, its, gpu_of, group, touched
    return restore


def _left_size(left: list) -> tuple[int, int]:
    return (sum(d.gpus for d, *_ in left), len(left))


def _unplace_all(bins: list[Bin], items: list[tuple[Demand, str, int, str | None]]) -> None:
    """Take this call's items off the instances again."""
    mine = {(job, rep): d for d, job, rep, _ in items}
    for b in bins:
        for _, job, rep in [it for it in b.items if (it[1], it[2]) in mine]:
            b.unplace(mine[(job, rep)], job, rep)


def _pack_filling(bins: list[Bin], items: list[tuple[Demand, str, int, str | None]]) -> list[tuple[Demand, str, int, str | None]]:
    """Instance by instance (those already in use first), each filled with the largest items
    (GPUs, then dominant share) that leave its free vCPU and memory enough for its free GPUs to
    take the leanest items left (per GPU): CPU-heavy work is paired with lean work on each
    instance instead of stranding GPUs where the vCPU ran out. Items of one shape are alike,
    so each step looks at shapes, not items."""
    cap = bins[0].cap if bins else None
    shapes: dict[tuple, list] = {}
    # (Within a shape, the highest priority first: what is left over is the least important.)
    for it in sorted(items, key=lambda it: (-it[0].gpus, -(dominant(it[0], cap) if cap else 0), -it[0].priority, it[1], it[2])):
        shapes.setdefault(_shape(it[0]), []).append(it)
    order = list(shapes)  # largest first (the items were sorted)
    for b in sorted(bins, key=lambda b: not b.touched):  # (a stable sort: in their order otherwise)
        live = [k for k in order if shapes[k]]
        if not live:
            break
        lean = {k: min(shapes[s][0][0].req(k) / max(shapes[s][0][0].gpus, 1) for s in live) for k in ("cpu", "memory_gib")}
        refused: set[tuple] = set()
        while True:
            pick = None
            for k in live:
                if k in refused or not shapes[k] or not b.fits(shapes[k][0][0]):
                    continue
                d = shapes[k][0][0]
                gpus_after = b.free.get("gpus", 0.0) - d.gpus
                if all(b.free.get(dim, 0.0) - d.req(dim) + 1e-9 >= gpus_after * lean[dim] for dim in lean):
                    pick = k
                    break
                pick = k if pick is None else pick  # (none leaves room for the lean ones: the largest that fits)
            if pick is None:
                break
            d, job, rep, group = shapes[pick][0]
            if b.place(d, job, rep, group) is None:
                refused.add(pick)  # no free GPU block of its size here
                continue
            shapes[pick].pop(0)
    return _trade_up(bins, items, [it for k in order for it in shapes[k]])


def _trade_up(bins: list[Bin], items: list, left: list) -> list:
    """Each item left over (highest priority first) takes the place of items of this call of a
    lower priority class on one instance (the lowest class first, then the least important,
    as few as it needs); what it displaces gets the same chance, a few rounds: the plan's
    order ranks work by class first, so what is left over should be the least important."""
    mine = {(job, rep): d for d, job, rep, _ in items}
    for _ in range(4):
        out, traded = [], False
        for d, job, rep, group in sorted(left, key=lambda it: (-it[0].priority, it[1], it[2])):
            displaced = None
            for worst in range(d.klass):  # victims of class <= worst: the lowest classes first
                for b in bins:
                    displaced = _displace(b, mine, worst, d, job, rep, group)
                    if displaced is not None:
                        break
                if displaced is not None:
                    break
            if displaced is None:
                out.append((d, job, rep, group))
            else:
                out += displaced
                traded = True
        left = out
        if not traded:
            break
    return left


def _displace(b: Bin, mine: dict, worst: int, d: Demand, job: str, rep: int, group) -> list | None:
    """Take items of class <= worst off b (least important first) until d fits there; None (and
    b as it was) if it does not."""
    lower = sorted((it for it in b.items if (it[1], it[2]) in mine and mine[(it[1], it[2])].klass <= worst),
                   key=lambda it: (mine[(it[1], it[2])].priority, it[1], it[2]))
    if not lower or sum(mine[(it[1], it[2])].gpus for it in lower) + b.free.get("gpus", 0.0) < d.gpus:
        return None
    taken = []
    for _, j, r in lower:
        taken.append((mine[(j, r)], j, r, b.gpu_of.get((j, r), [])))
        b.unplace(mine[(j, r)], j, r)
        if b.fits(d) and b.place(d, job, rep, group) is not None:
            return [(low, j2, r2, None) for low, j2, r2, _ in taken]
    for low, j, r, gpus in reversed(taken):
        _put_back(b, low, j, r, gpus)
    return None


def _put_back(b: Bin, d: Demand, job: str, rep: int, gpus) -> None:
    """An item taken off for a trade that did not fit goes back on its own GPUs."""
    b.take_resources(d)
    b.items.append((d.key, job, rep))
    b.gpu_of[(job, rep)] = gpus
    for t in gpus:
        for i in t:
            b.gpus_used[i] = True


def _shape(d: Demand) -> tuple:
    """What packing sees of a demand: its requests, GPU count, bundle and NVLink need."""
    return (d.gpus, d.bundle, d.nvlink, tuple(sorted((k, d.req(k)) for k in d.dims if d.req(k) > 0)))


def _pack_greedy(bins: list[Bin], items: list[tuple[Demand, str, int, str | None]], more=None,
                 compact: bool = False) -> list[tuple[Demand, str, int, str | None]]:
    """Largest first (GPUs per replica, then dominant share), each onto the instance whose free
    room points most the way the item does (the dot product of the two, normalised per
    dimension): that pairs CPU-heavy with memory-heavy work, where first fit strands room
    (at 95% aggregate fill, first fit left 21 of 69 CPU jobs over; this left none). When an item
    fits no instance, more() may return one more empty one (None: no more). compact: each item
    onto the instance with the least room its way instead (best fit), leaving whole instances
    free for what comes after. Returns what is left."""
    cap = bins[0].cap if bins else None
    # An instance-gang is one item of all its replicas' GPUs: it goes by that size, not a replica's.
    order = sorted(items, key=lambda it: (-it[0].gpus, -(dominant(it[0], cap) if cap else 0), it[1], it[2]))
    smallest: dict[str, float] = {}  # what the smallest item needs, dimension by dimension
    for d, *_ in order:
        for k in d.dims:
            smallest[k] = min(smallest.get(k, float("inf")), d.req(k))
    active = [b for b in bins if b.touched and _has_room(b, smallest)]  # full instances are skipped at once
    # Untouched instances of one offer are alike: only the first of each is a candidate (at 10k
    # warm instances, scanning them all for every item was most of the plan's time).
    spare: dict[str, list[Bin]] = {}
    for b in bins:
        if not b.touched:
            spare.setdefault(b.cap.offer_key, []).append(b)
    left = []
    for d, job, rep, group in order:
        cands = [b for b in active if b.fits(d) and (group is None or b.group in (None, group))]
        cands += [q[0] for q in spare.values() if q and q[0].fits(d)]  # (untouched: in no placement group yet)
        # A gang's placement group fills its own instances before it claims another; an empty
        # instance is taken only when no used one fits, so spare instances (a pool minimum, idle
        # hosts) stay whole instead of each holding one replica.
        cands.sort(key=lambda b: (group is not None and b.group != group, not b.items, (1 if compact else -1) * _alignment(b, d)))
        placed = next((b for b in cands if b.place(d, job, rep, group) is not None), None)
        q = spare.get(placed.cap.offer_key) if placed is not None else None
        if q and q[0] is placed:
            q.pop(0)
            active.append(placed)
        if placed is None:
            b = more() if more is not None else None
            if b is None or b.place(d, job, rep, group) is None:
                left.append((d, job, rep, group))
                continue
            bins.append(b)
            active.append(b)
            placed = b
        if not _has_room(placed, smallest):
            active.remove(placed)
    return left


def _has_room(b: Bin, smallest: dict[str, float]) -> bool:
    return has_room(b.free, smallest)


def _alignment(b: Bin, d: Demand) -> float:
    return sum((b.free.get(k, 0.0) / c) * (d.req(k) / c) for k in d.dims if (c := b.cap.cap(k)) > 0)
