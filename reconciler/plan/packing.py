"""Phase 2 of a plan: pack the items onto GPUs. Kept instances keep their residents' GPUs; new
instances of an offer the model packed one by one are filled as it says (`_pack_slots`); the
others first-fit decreasing, with a repair instance bought where the solver's counts (capacity
summed per offer) do not pack, if every fleet rule allows one more. The solver's repair stage packs
the new instances the same way first (`new_instances`), so a plan buys repairs only where it could
not model the offer instance by instance or its rules refused the instances that packing took.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from reconciler.ledger import QuotaBook, budget_ok, micro, pool_ok, reservation_over, spot_share_ok
from reconciler.observe import Observed
from reconciler.pack import Bin, pack_items
from reconciler.plan.assign import Assignment, assign_items
from reconciler.plan.file import placement_group_name
from reconciler.problem import Capacity, Demand, Problem, spot_measure

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.solve import Solution


@dataclass
class Packing:
    """The packed plan as it is built. Mutable: the later phases (a tenant's spot share, the
    stability rules) take items out of its bins or move them, and naming the new instances
    fills `where` and `gpu_of` for the items on them."""

    bins_of: dict[str, list[Bin]]  # host id or offer key -> its bins
    gpu_of: dict[tuple[str, int], tuple[tuple[int, ...], ...]]  # (job, item) -> GPU indices per replica
    where: dict[tuple[str, int], str]  # (job, item) -> instance id or create ref
    unpacked: set[str]  # jobs the solver placed whose items did not all pack
    pool_count: dict[str, int]  # instances per pool, repairs included
    fleet: dict[str, float]  # the plan's spot measure: "all" and "spot"
    prim: Callable[[Capacity], float]  # an instance's size in that measure
    repairs: int = 0  # instances bought beyond the solver's counts
    named: dict[str, str] = field(default_factory=dict)  # new bin ref -> the create ref ("+n") naming gave it
    more_of: Callable[[Capacity, str], Callable[[], Bin | None]] | None = None  # a repair instance of an offer, for the later phases
    moved: dict[str, str] = field(default_factory=dict)  # job -> why a later phase moved it (a tenant's spot share)
    released: set[str] = field(default_factory=set)  # hosts the solver kept that a later phase emptied and no rule keeps


def resident_gpus(host: Capacity, problem: Problem, observed: Observed) -> dict[tuple[str, int], tuple[int, ...]]:
    """GPU indices of the replicas running on a host: as recorded, else as the packer would have
    given them (deterministic, so two runs agree)."""
    recorded = getattr(observed, "gpu_indices", {}) or {}
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    missing = []
    for dk, job, _ in sorted(set(host.residents)):
        hosts = observed.placements.get(job, ())
        for r, iid in enumerate(hosts):
            if iid != host.key:
                continue
            rec = recorded.get(job)
            if rec and r < len(rec):
                out[(job, r)] = tuple(rec[r])
            else:
                missing.append((problem.demand(dk), job, r))
    if missing:
        b = Bin.empty(host, host.key)
        for (job, r), idx in out.items():
            b.reserve(problem.demand(next(dk for dk, j, _ in host.residents if j == job)), [idx])
        for d, job, r in sorted(missing, key=lambda m: (-m[0].gpus, m[1], m[2])):
            single = replace(d, bundle=1, gpus=d.gpus // d.bundle) if d.bundle > 1 else d  # (fields only: klass, size are cached in __dict__)
            idx = b.gpus_for(single) or [()]
            out[(job, r)] = idx[0]
    return out


def pack(fleet_name: str, problem: Problem, observed: Observed, solution: Solution, caps: dict[str, Capacity],
         hosts: dict[str, Capacity], demand_of: dict[str, Demand], assigned: Assignment) -> Packing:
    """Every item onto an instance and its GPUs; a gang is whole or nothing (a job with an item
    that did not pack is taken out entirely and counted in `unpacked`)."""
    group = _group_namer(fleet_name, problem)
    pool_count = {p: 0 for p in problem.pool_bounds}
    for hk in solution.keep:
        pool_count[hosts[hk].pool] = pool_count.get(hosts[hk].pool, 0) + 1
    for ok, n in solution.new.items():
        pool_count[caps[ok].pool] = pool_count.get(caps[ok].pool, 0) + n
    _, prim = spot_measure(caps.values(), problem.gpu_fleet)
    fleet = {"all": sum(prim(hosts[h]) for h in solution.keep) + sum(prim(caps[k]) * n for k, n in solution.new.items())}
    fleet["spot"] = sum(prim(hosts[h]) for h in solution.keep if hosts[h].market == "spot") + \
        sum(prim(caps[k]) * n for k, n in solution.new.items() if caps[k].market == "spot")
    packing = Packing({}, {}, {}, set(), pool_count, fleet, prim)
    _pack_hosts(packing, problem, observed, solution, hosts, demand_of, assigned, group)
    repairs = _Repairs(problem, solution, caps, hosts, packing)
    packing.more_of = repairs.more_of
    handed = getattr(solution, "packed", None)
    parts = _parts(solution, caps, assigned.to_offer) if handed is not None else {}
    reuse = {keys for keys, inputs in parts.items() if handed.same(keys, inputs)}
    if reuse:
        fresh = {k for keys in parts if keys not in reuse for k in keys}
        _pack_rest(packing, problem, solution, caps, assigned.to_offer, group, repairs, fresh, handed.rebuilt(reuse, caps, fleet_name))
    else:
        _pack_offers(packing, solution, caps, _pack_slots(packing, problem, solution, caps, assigned.to_offer, group), group,
                     repairs.more_of)
    for bins in packing.bins_of.values():
        for b in bins:
            for job in {j for _, j, _ in b.items if j in packing.unpacked}:
                b.remove(demand_of[job], job)
    return packing


def new_instances(problem: Problem, solution: Solution) -> dict[str, tuple[tuple[tuple[str, str, int], ...], ...]]:
    """The new instances of every offer as `pack` fills them from this answer, each as (x's capacity
    key, group, items) like `Solution.slots`, with as many more instances as the packing takes (no
    fleet rule asked): an offer with more than `solution.new` of them is one whose counts did not
    pack, and this is a per-instance packing of it. What the solver's repair stage reads (strategy.py)."""
    return offer_packing(problem, solution).instances


@dataclass(frozen=True)
class OfferPacking:
    """The new instances of every offer as packed from one answer (`offer_packing`), as plain data. The solver's
    repair stage packs them anyway and hands this on with its answer (`Solution.packed`, also on the answer it
    repairs), so `pack` rebuilds the bins of each part whose inputs are the same instead of packing it again."""

    instances: dict[str, tuple[tuple[tuple[str, str, int], ...], ...]]  # what new_instances returns
    parts: dict[frozenset, tuple[tuple, tuple]]  # a part's keys -> (its inputs, its bins' states per offer); none that bought

    def same(self, keys: frozenset, inputs: tuple) -> bool:
        """Is this part packed here from the same inputs, buying nothing? (What it bought, `pack` buys only
        where every fleet rule allows: a part that bought is packed again.)"""
        kept = self.parts.get(keys)
        return kept is not None and kept[0] == inputs

    def rebuilt(self, parts: set[frozenset], caps: dict[str, Capacity], fleet_name: str) -> dict[str, list[Bin]]:
        """The bins of these parts as packed, fresh (the plan's later phases change them), with the fleet's placement groups."""
        out = {}
        for keys in parts:
            for ok, states in self.parts[keys][1]:
                out[ok] = [Bin(caps[ok], ref, dict(free), list(used), list(items),
                               None if group is None else placement_group_name(fleet_name, *group),
                               {k: list(v) for k, v in gpu_of}, touched, before)
                           for ref, free, used, items, group, gpu_of, touched, before in states]
        return out


def offer_packing(problem: Problem, solution: Solution) -> OfferPacking:
    """The new instances of every offer packed from this answer as `pack` packs them, buying an instance
    wherever the packing needs one (no fleet rule asked). A gang's placement group is kept as its
    (job, zone), which `OfferPacking.rebuilt` names for the fleet (pack compares groups only for equality)."""
    caps = capacities_of(problem, solution)
    assigned = assign_items(problem, Observed((), (), {}), solution, caps)
    packing = Packing({}, {}, {}, set(), {}, {"all": 0.0, "spot": 0.0}, lambda c: 0.0)

    def more_of(cap: Capacity, ok: str) -> Callable[[], Bin | None]:
        def more() -> Bin:
            b = Bin.empty(cap, f"{ok}#r")
            packing.bins_of.setdefault(ok, []).append(b)
            return b
        return more

    group = _group_namer("", problem, lambda fleet, job, zone: (job, zone))
    _pack_offers(packing, solution, caps, _pack_slots(packing, problem, solution, caps, assigned.to_offer, group), group, more_of)
    origin = {(job, r): ck for ck, items in assigned.to_offer.items() for _, job, r in items}
    group_of = _group_of(problem)
    out = {}
    for ok, bins in packing.bins_of.items():
        insts = []
        for b in bins:
            cells: dict[tuple[str, str], int] = {}
            for dk, job, r in b.items:
                k = (origin[(job, r)], group_of[dk])
                cells[k] = cells.get(k, 0) + 1
            insts.append(tuple(sorted((ck, gk, n) for (ck, gk), n in cells.items())))
        out[ok] = tuple(insts)
    kept = {}
    for keys, inputs in _parts(solution, caps, assigned.to_offer).items():
        mine = [(ok, packing.bins_of[ok]) for ok in sorted(keys) if ok in packing.bins_of]
        if all(len(bins) <= solution.new.get(ok, 0) for ok, bins in mine):
            kept[keys] = (inputs, tuple((ok, tuple(_state(b) for b in bins)) for ok, bins in mine))
    return OfferPacking(out, kept)


def _state(b: Bin) -> tuple:
    return (b.ref, tuple(b.free.items()), tuple(b.gpus_used), tuple(b.items), b.group, tuple((k, tuple(v)) for k, v in b.gpu_of.items()),
            b.touched, b.touched_before)


def _parts(solution: Solution, caps: dict[str, Capacity], to_offer: dict[str, list]) -> dict[frozenset, tuple]:
    """The parts of the new instances' packing no step links (a zone class with its zones, an offer modelled
    instance by instance with the capacities its slots name, any other offer alone), each with all that its
    packing reads: per key its count, slots, capacity and items, in order."""
    parent: dict[str, str] = {}

    def root(k: str) -> str:
        parent.setdefault(k, k)
        while parent[k] != k:
            k = parent[k]
        return k

    for k in [*solution.new, *solution.slots, *to_offer]:
        links = list(caps[k].members or ()) + [ck for inst in solution.slots.get(k, ()) for ck, _, _ in inst]
        for m in links:
            parent[root(m)] = root(k)
        root(k)
    members: dict[str, list[str]] = {}
    for k in list(parent):
        members.setdefault(root(k), []).append(k)
    return {frozenset(ks): tuple((k, solution.new.get(k, 0), solution.slots.get(k), caps.get(k),
                                  tuple((d.key, job, r) for d, job, r in to_offer.get(k, ()))) for k in sorted(ks))
            for ks in members.values()}


def _pack_rest(packing: Packing, problem: Problem, solution: Solution, caps: dict[str, Capacity], to_offer: dict[str, list],
               group: Callable[[Demand, str], str | None], repairs: "_Repairs", fresh: set[str],
               reused: dict[str, list[Bin]]) -> None:
    """The new instances with the parts the hand-off holds rebuilt (`reused`) and the others' keys (`fresh`)
    packed as `_pack_slots` and `_pack_offers` pack them, the offers' bins in the order packing them all gives."""
    hosts = list(packing.bins_of)
    if fresh:
        sub = replace(solution, new={k: n for k, n in solution.new.items() if k in fresh},
                      slots={k: v for k, v in solution.slots.items() if k in fresh})
        mine = {k: v for k, v in to_offer.items() if k in fresh}
        _pack_offers(packing, sub, caps, _pack_slots(packing, problem, sub, caps, mine, group), group, repairs.more_of)
    had = set(hosts)  # (built once: `not in set(hosts)` per key rebuilt it 11,700 times, 1.8 s of a 10k drift plan)
    made = {k: v for k, v in packing.bins_of.items() if k not in had}
    out = {k: packing.bins_of[k] for k in hosts}
    for k in sorted(solution.slots) + sorted(k for k in solution.new if k not in solution.slots):
        if k in reused or k in made:
            out[k] = reused[k] if k in reused else made[k]
    for k, bins in made.items():
        out.setdefault(k, bins)
    packing.bins_of = out


def capacities_of(problem: Problem, solution: Solution) -> dict[str, Capacity]:
    """Every capacity by key, the solver's zone classes with them: what an answer's keys name."""
    return {**{c.key: c for c in problem.capacities}, **solution.capacities}


def _group_of(problem: Problem) -> dict[str, str]:
    """Demand key -> its group's key (demands alike share the model's variables)."""
    return {dk: gk for gk, ks in problem.groups.items() for dk in ks}


def _group_namer(fleet_name: str, problem: Problem, name: Callable = placement_group_name) -> Callable[[Demand, str], str | None]:
    in_group = {d.key for d in problem.demands if d.gang and d.gang_mode == "placement-group"}

    def group(d: Demand, zone: str) -> str | None:
        """A gang's cluster placement group, one per zone: a group lives in the zone of its first
        instance, so a gang whose allowlist moved it elsewhere needs another (with one name per
        gang, every create in the new zone failed, every run)."""
        return name(fleet_name, d.jobs[0], zone) if d.key in in_group else None

    return group


def _pack_hosts(packing: Packing, problem: Problem, observed: Observed, solution: Solution, hosts: dict[str, Capacity],
                demand_of: dict[str, Demand], assigned: Assignment, group: Callable[[Demand, str], str | None]) -> None:
    """The instances the plan keeps: staying items on their recorded GPUs, then the new items."""
    staying_at: dict[str, list[tuple[str, int]]] = {}
    for job, items in assigned.slots.items():
        for r, at in enumerate(items):
            if at is not None:
                staying_at.setdefault(at, []).append((job, r))
    for hk in sorted(solution.keep):
        h = hosts[hk]
        b = Bin.empty(h, hk)
        known = resident_gpus(h, problem, observed) if h.gpus else {}
        fresh = []
        taken: set[tuple[str, int]] = set()
        for job, r in staying_at.get(hk, []):
            d = demand_of[job]
            if job in d.reshaped:  # restarts here in its new shape: GPUs given afresh, after the others'
                fresh.append((d, job, r, group(d, h.zone)))
                continue
            if d.bundle > 1:
                idx = [known.get((job, k), ()) for k in range(d.bundle)]
            else:  # (the GPUs of a replica that ran here: a shrunk gang keeps a replica past its count in a lower slot)
                ran = observed.placements.get(job, ())
                at = r if r < len(ran) and ran[r] == hk else next((k for k, i in enumerate(ran) if i == hk and (job, k) not in taken), r)
                taken.add((job, at))
                idx = [known.get((job, at), ())]
            b.reserve(d, idx)
            packing.gpu_of[(job, r)] = tuple(idx)
            packing.where[(job, r)] = hk
        # A replica placed anew on the instance it runs on takes its own GPUs again when they
        # are free, so a job that ends where it was is really kept (apply records these GPUs).
        for d, job, r in assigned.to_host.get(hk, []):
            idx = _own_gpus(known, observed, d, job, r, hk)
            if idx is not None and not any(b.gpus_used[i] for g in idx for i in g if i < len(b.gpus_used)):
                b.reserve(d, idx)
                packing.gpu_of[(job, r)] = tuple(idx)
                packing.where[(job, r)] = hk
            else:
                fresh.append((d, job, r, group(d, h.zone)))
        # (what the instance cannot hold is dropped: the least important work, not the greedy pass's last item, a
        # critical running job beside a low one that could give way, which the plan evicted inside its guarantee: fleet29)
        left = pack_items([b], fresh, least_left=True, exact=True)
        packing.unpacked.update(job for _, job, _, _ in left)
        packing.bins_of[hk] = [b]


def _own_gpus(known: dict, observed: Observed, d: Demand, job: str, r: int, hk: str) -> list[tuple[int, ...]] | None:
    """The GPUs item r of `job` had on host hk, one tuple per replica of the item (a same-instance gang's item has
    `bundle` of them); None unless every replica of the item ran there with its GPUs known. (Asked only of
    1-replica items, a same-instance gang placed anew where it ran got fresh GPUs though the plan keeps it:
    fleet23, the slow tier.)"""
    ran = tuple(observed.placements.get(job, ()))
    reps = range(r * d.bundle, (r + 1) * d.bundle)
    if any(k >= len(ran) or ran[k] != hk for k in reps):
        return None
    idx = [known.get((job, k)) for k in reps]
    if any(i is None or len(i) != d.gpus // d.bundle for i in idx):
        return None
    return idx


class _Repairs:
    """Buys one more instance of an offer where the packer needs it, if its pool, the cloud
    quotas, the budget and the spot share allow. A spot repair is refused when the SpotPolicy
    asks for a buffer or diversity the solver, not the packer, must keep."""

    def __init__(self, problem: Problem, solution: Solution, caps: dict[str, Capacity], hosts: dict[str, Capacity],
                 packing: Packing):
        self.problem, self.packing = problem, packing
        # what the fleet budget counts (ledger.micro), of the instances the packing keeps and buys
        self.spend = sum(micro(hosts[h].price) for h in solution.keep) + sum(micro(caps[k].price) * n for k, n in solution.new.items())
        self.cloud_quotas = QuotaBook(problem.quotas)  # what the solver's new instances take of the account's quotas
        self.reserved_kept = Counter(hosts[h].reservation for h in solution.keep if hosts[h].reservation)  # (a Reservation's count holds them too)
        for ok, n in solution.new.items():
            self.cloud_quotas.take(caps[ok], n)

    def more_of(self, cap: Capacity, ok: str) -> Callable[[], Bin | None]:
        return lambda: self._buy(cap, ok)

    def _buy(self, cap: Capacity, ok: str) -> Bin | None:
        problem, p = self.problem, self.packing
        lo, hi = problem.pool_bounds.get(cap.pool, (0, 0))
        if not pool_ok(p.pool_count.get(cap.pool, 0), 1, hi) or not budget_ok(self.spend + micro(cap.price), problem.budget):
            return None
        if self.cloud_quotas.short(cap) is not None:
            return None
        r = problem.reservations.get(cap.reservation) if cap.reservation else None
        if r is not None and (reservation_over(self.reserved_kept[cap.reservation] + len(p.bins_of.get(ok, [])), 1, r.count)
                              or len(p.bins_of.get(ok, [])) >= cap.max_new):
            return None  # the reservation has no more instances
        sp = problem.spot
        if cap.market == "spot":
            if sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 or sp.min_zones > 1:
                return None
            if not spot_share_ok(p.fleet["spot"] + p.prim(cap), p.fleet["all"] + p.prim(cap), sp.max_spot_fraction):
                return None
            p.fleet["spot"] += p.prim(cap)
        p.fleet["all"] += p.prim(cap)
        self.cloud_quotas.take(cap)
        p.pool_count[cap.pool] = p.pool_count.get(cap.pool, 0) + 1
        self.spend += micro(cap.price)
        p.repairs += 1
        b = Bin.empty(cap, f"{ok}#r{p.repairs}")
        p.bins_of.setdefault(ok, []).append(b)
        return b


def _pack_slots(packing: Packing, problem: Problem, solution: Solution, caps: dict[str, Capacity], to_offer: dict[str, list],
                group: Callable[[Demand, str], str | None]) -> dict[str, list]:
    """The new instances of offers the model packed instance by instance (`Solution.slots`): each
    filled with the items the model gave it. Returns the items left to pack as any offer's: the
    others, and any a slot's GPUs could not take after all (GPU blocks are not in the model)."""
    if not solution.slots:
        return to_offer
    group_of = _group_of(problem)
    queue: dict[tuple[str, str], list] = {}  # (capacity key, group) -> its items, in order
    for ck, items in to_offer.items():
        for it in items:
            queue.setdefault((ck, group_of.get(it[0].key, "")), []).append(it)
    taken: set[tuple[str, int]] = set()
    for ok in sorted(solution.slots):
        bins = packing.bins_of[ok] = [Bin.empty(caps[ok], f"{ok}#{i}") for i in range(solution.new.get(ok, 0))]
        for b, cells in zip(bins, solution.slots[ok]):
            mine = []
            for ck, gk, n in cells:
                q = queue.get((ck, gk), [])
                mine += [(d, job, r, group(d, caps[ok].zone)) for d, job, r in q[:n]]
                del q[:n]
            pack_items([b], mine)
            taken.update((job, r) for _, job, r in b.items)
    return {ck: left for ck, items in to_offer.items() if (left := [it for it in items if (it[1], it[2]) not in taken])}


def _pack_offers(packing: Packing, solution: Solution, caps: dict[str, Capacity], to_offer: dict[str, list],
                 group: Callable[[Demand, str], str | None], more_of: Callable[[Capacity, str], Callable[[], Bin | None]]) -> None:
    """The new instances. Work pinned to a zone first, on its zone's instances; then work placed
    on a zone class, on any instance of its zones (cheapest zone first); then repairs for what did
    not fit. Pinned work that shares its zone with a class's work is packed compactly (fullest
    instance first), so it strands none of the room the class's larger items need."""
    bins_of = packing.bins_of
    for ok in sorted(solution.new):
        if ok not in solution.slots:  # (those bins are filled already: _pack_slots)
            bins_of[ok] = [Bin.empty(caps[ok], f"{ok}#{i}") for i in range(solution.new[ok])]
    pinned = {ok: [(d, job, r, group(d, caps[ok].zone)) for d, job, r in items] for ok, items in to_offer.items() if not caps[ok].members}
    shared = {m for ck in to_offer if caps[ck].members for m in caps[ck].members}
    leftover: dict[str, list] = {}
    for ok in sorted(k for k in pinned if k in shared):
        leftover[ok] = pack_items(list(bins_of.setdefault(ok, [])), pinned.pop(ok), compact=True)
    for ck in sorted(k for k in to_offer if caps[k].members):
        zones = sorted(caps[ck].members, key=lambda k: (caps[k].price, k))
        view = [b for k in zones for b in bins_of.get(k, [])]
        leftover[ck] = pack_items(view, [(d, job, r, group(d, caps[ck].zone)) for d, job, r in to_offer[ck]])  # (gangs are never on a zone class)
    for ok in sorted(set(pinned) | {k for k in leftover if not caps[k].members}):
        bins_of.setdefault(ok, [])
        left = pack_items(list(bins_of[ok]), pinned.get(ok, []) + leftover.get(ok, []), more_of(caps[ok], ok), exact=True)
        packing.unpacked.update(job for _, job, _, _ in left)
    for ck in sorted(k for k in leftover if caps[k].members and leftover[k]):
        zones = sorted(caps[ck].members, key=lambda k: (caps[k].price, k))
        view = [b for k in zones for b in bins_of.get(k, [])]
        left = pack_items(view, leftover[ck], more_of(caps[zones[0]], zones[0]), exact=True)
        packing.unpacked.update(job for _, job, _, _ in left)
