"""Phase 2b of a plan: no move without a rule behind it.

The solver stops within its gap of the best cost, so its answer may move running work for
nothing: buy an instance identical to one it deletes, or move a replica off an instance the plan
keeps. Both are undone here where every fleet and tenant rule still holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import replace

from reconciler.ledger import charge, within
from reconciler.observe import Observed
from reconciler.pack import Bin
from reconciler.plan.packing import resident_gpus
from reconciler.problem import Capacity, Demand, Problem, fit, rules_allow

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.solve import Solution


def keep_identical(problem: Problem, observed: Observed, solution: Solution, bins_of: dict[str, list[Bin]],
                   hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> Solution:
    """The solver stops within its gap of the best cost, and one such answer deleted an instance
    while buying an identical one for the same work ("consolidated", $6.13/h -> $6.13/h), every
    plan again (issue 18). Here each such new instance is replaced by the deleted one when all its items fit there
    and it is of the deleted one's offer or a job of it ran there: its old residents on their recorded GPUs, the others packed as usual.
    Pool counts, prices and markets are the same, so every fleet and tenant rule holds; a twin in another zone
    of the pool only where its zone is nothing to its work (`zone_free`). (The solver's choice between two
    zones at one price is a tie: it replaced a host running an instance gang by a twin in the pool's other
    zone, a move of the gang for nothing, once small offers got per-instance rows: test_gpu_indices.)"""
    keep = set(solution.keep)
    for h in sorted((h for h in hosts.values() if h.key not in keep and h.keep_blocker is None and not h.frozen), key=lambda h: h.key):
        twins = [b for ok, bins in sorted(bins_of.items()) if ok not in hosts for b in bins
                 if b.items and b.group is None and b.cap.class_key == h.class_key and abs(b.cap.price - h.price) < 1e-9
                 and (b.cap.offer_key == h.offer_key or zone_free(problem, b, h, demand_of))]
        twins.sort(key=lambda b: b.cap.offer_key != h.offer_key)  # (its own zone's first)
        known = resident_gpus(h, problem, observed) if h.gpus else {}
        for b in twins:
            nb = Bin.empty(h, h.key)
            # (A same-instance gang's item is `bundle` replicas, each back on its own GPUs: before, such a gang
            # was re-packed onto new GPUs of the instance it runs on, under a running job: property tier.)
            home = [(dk, job, r) for dk, job, r in b.items if job not in demand_of[job].reshaped
                    and tuple(observed.placements.get(job, ()))[r * demand_of[job].bundle:(r + 1) * demand_of[job].bundle]
                    == (h.key,) * demand_of[job].bundle]
            ok = True
            for dk, job, r in home:  # back where it runs, on its own GPUs
                d = demand_of[job]
                idxs = [known.get((job, k), ()) for k in range(r * d.bundle, (r + 1) * d.bundle)]
                used = [i for idx in idxs for i in idx]
                if not nb.fits(d) or any(len(idx) != d.gpus // d.bundle for idx in idxs) or len(set(used)) != len(used) \
                        or any(nb.gpus_used[i] for i in used if i < len(nb.gpus_used)):
                    ok = False
                    break
                nb.reserve(d, idxs)
                nb.items.append((dk, job, r))
                nb.gpu_of[(job, r)] = tuple(tuple(idx) for idx in idxs)
            rest = sorted((it for it in b.items if it not in home), key=lambda it: (-demand_of[it[1]].gpus, it[1], it[2]))
            # (a job that ran there in part is enough: a same-instance gang running split runs whole nowhere, and it
            # moved from both its instances to a new twin of one: fleet17. A twin of its own offer needs none: the
            # host left empty takes the new instance's work, where deleting it and buying its twin for pending work
            # was churn, once a consolidation's freed room went to pending work: solve/strategy.consolidate)
            ran_here = b.cap.offer_key == h.offer_key or any(h.key in observed.placements.get(job, ()) for _, job, _ in b.items)
            if not ok or not ran_here or any(nb.place(demand_of[job], job, r) is None for _, job, r in rest):
                continue
            for bins in bins_of.values():
                if b in bins:
                    bins.remove(b)
            bins_of[h.key] = [nb]
            keep.add(h.key)
            break
    return solution if keep == set(solution.keep) else replace(solution, keep=frozenset(keep))


def zone_free(problem: Problem, b: Bin, h: Capacity, demand_of: dict[str, Demand]) -> bool:
    """Whether the work on new instance b could as well run on h in another zone of its pool: every rule
    allows h, egress and latency cost the same there, every gang on b is all on b, and the SpotPolicy asks
    for no spread over zones (the pool's region, type, market and price are b's: the quotas and budgets too)."""
    sp = problem.spot
    if h.market == "spot" and (sp.min_zones > 1 or sp.min_instance_types > 1):
        return False
    on_b: dict[str, int] = {}
    for _, job, _ in b.items:
        on_b[job] = on_b.get(job, 0) + 1
    for job, n in on_b.items():
        d = demand_of[job]
        if not rules_allow(d, h) or abs(problem.cost_coef(d, h) - problem.cost_coef(d, b.cap)) > 1e-9 \
                or (d.gang and n != d.replicas // d.bundle):
            return False
    return True


def return_home(problem: Problem, observed: Observed, solution: Solution, bins_of: dict[str, list[Bin]],
                hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> None:
    """A replica moved off an instance the plan keeps goes back when it still fits there on its
    own GPUs, in the same market, at no higher price share or egress/latency cost: a move with
    no rule behind it (the solver's answer, stopped within its gap, moved running work for
    nothing). Fleet and tenant rules hold: same market (spot shares, buffer), no dearer."""
    bin_at: dict[tuple[str, int], Bin] = {}
    for bins in bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                bin_at[(job, r)] = b
    known_at: dict[str, dict] = {}
    for job, prev in sorted(observed.placements.items()):
        d = demand_of.get(job)
        if d is None or d.gang or d.bundle > 1 or job in d.reshaped:
            continue
        for r, hk in enumerate(prev[:d.replicas]):
            b, home = bin_at.get((job, r)), bins_of.get(hk)
            h = hosts.get(hk)
            if b is None or b.ref == hk or not home or h is None or hk not in solution.keep or fit(d, h) == 0:
                continue
            c = b.cap
            budget = d.tenant in problem.tenants and problem.tenants[d.tenant].budget is not None
            if h.market != c.market or problem.cost_coef(d, h) > problem.cost_coef(d, c) + 1e-9 or \
                    budget and not within(charge(d, h), charge(d, c)):
                continue
            hb = home[0]
            if hk not in known_at:
                known_at[hk] = resident_gpus(h, problem, observed) if h.gpus else {}
            idx = known_at[hk].get((job, r), ())
            if not hb.fits(d) or len(idx) != d.gpus or any(hb.gpus_used[i] for i in idx if i < len(hb.gpus_used)):
                continue
            b.remove(d, job)
            hb.reserve(d, [idx])
            hb.items.append((d.key, job, r))
            hb.gpu_of[(job, r)] = (tuple(idx),)


def keep_protected_twins(problem: Problem, solution: Solution) -> Solution:
    """Greedy counts a class of identical jobs, so a kept identical job counts for a protected one (as the model did
    before objective.protected_kept): of two twin hosts (one offer, one price), each running one job of the class alone, it may keep the
    one whose job its tenant's guarantee does not hold, and the plan stopped the guaranteed job (fleet116: t1's j0
    stopped, j2 kept; the plan's "guarantees kept" tier claimed 14, the plan it emitted keeps 7). Here the twin the
    protected job runs on is kept instead, its stay with it: pool counts, markets and prices are the same, so every
    fleet and tenant rule holds as the solver counted it."""
    protected = {j for r in problem.tenants.values() for j in r.protected_jobs}
    if not protected:
        return solution
    hosts = {h.key: h for h in problem.hosts()}
    given = {ck for (_, ck), n in solution.x.items() if n}  # (hosts new work lands on: not twins)
    keep, stay = set(solution.keep), dict(solution.stay)
    for d in problem.demands:
        if d.gang or d.bundle != 1 or d.replicas != 1:
            continue

        def alone(job: str, ids: tuple[str, ...]) -> Capacity | None:
            h = hosts.get(ids[0]) if len(ids) == 1 else None
            return h if h is not None and h.residents == ((d.key, job, 1),) and h.key not in given and not h.frozen else None

        lost = [h for j, ids in d.running if j in protected and (h := alone(j, ids)) is not None
                and h.key not in keep and h.keep_blocker is None]
        spare = [h for j, ids in d.running if j not in protected and (h := alone(j, ids)) is not None
                 and h.key in keep and stay.get((d.key, h.key), 0) == 1]
        for h in lost:
            twin = next((t for t in spare if t.offer_key == h.offer_key and abs(t.price - h.price) < 1e-9 and t.group_of == h.group_of), None)
            if twin is None:
                continue
            spare.remove(twin)
            keep.symmetric_difference_update({h.key, twin.key})
            stay[(d.key, h.key)] = stay.pop((d.key, twin.key))
    return solution if keep == set(solution.keep) else replace(solution, keep=frozenset(keep), stay=stay)


def protected_take_twin_stays(problem: Problem, solution: Solution) -> Solution:
    """Of a class of identical 1-replica jobs, an answer may keep an unprotected job where it runs and stop a protected
    one whose host it gives up (greedy counts the class alike, and so does the model but per host: objective.
    protected_kept): t1's guaranteed j2 was stopped to delete its spot host for the budget while its borrowed twin j3 ran
    on (the h5 sweep, fleet123). Where moves are allowed (not WhenEmpty, or a rule the fleet breaks now licenses the
    tenant's, as the model's moves.licensed reads it), such an unprotected stay becomes a new item on its host: the plan
    moves the protected job into that room and stops the unprotected one (assign.choose_jobs gives moves to protected
    jobs first). The same host, shape and count: every capacity, fleet and tenant rule holds as the answer counted it."""
    protected = {j for r in problem.tenants.values() for j in r.protected_jobs}
    if not protected:
        return solution
    stay, x = dict(solution.stay), dict(solution.x)
    open_hosts = {h.key for h in problem.hosts() if not h.frozen}  # (a frozen host's residents all stay: nothing lands)
    licensed: list = []  # (rules_broken_now read once, where a swap asks)
    staying: dict[str, int] = {}
    for (dk, _), n in stay.items():
        staying[dk] = staying.get(dk, 0) + n
    for d in problem.demands:
        if d.gang or d.bundle != 1 or d.replicas != 1 or not d.running:
            continue
        mine: dict[str, int] = {}  # host -> d's protected jobs there, and its unprotected ones
        others: dict[str, int] = {}
        for j, ids in d.running:
            side = mine if j in protected else others
            side[ids[0]] = side.get(ids[0], 0) + 1
        if not mine or not others:
            continue
        kept_here = sum(min(n, stay.get((d.key, h), 0)) for h, n in mine.items())
        lost = sum(mine.values()) - kept_here - max(0, solution.placed.get(d.key, 0) - staying.get(d.key, 0))
        spare = sorted((h, stay.get((d.key, h), 0) - mine.get(h, 0)) for h in others
                       if h in open_hosts and stay.get((d.key, h), 0) > mine.get(h, 0))
        if lost <= 0 or not spare or not _may_move(problem, d, licensed):
            continue
        for h, n in spare:
            take = min(n, lost)
            stay[(d.key, h)] -= take
            x[(d.key, h)] = x.get((d.key, h), 0) + take
            lost -= take
            if not lost:
                break
    if stay == solution.stay:
        return solution
    return replace(solution, stay={k: n for k, n in stay.items() if n}, x=x)


def _may_move(problem: Problem, d: Demand, licensed: list) -> bool:
    """May d's running work move for no rule of its own: not under consolidation WhenEmpty, or a rule the fleet breaks
    now licenses its tenant's (moves.licensed's reading)."""
    if problem.placement.consolidation != "WhenEmpty":
        return True
    from reconciler.ledger import licensed_by, rules_broken_now

    if not licensed:
        licensed.append(licensed_by(rules_broken_now(problem)))
    return licensed[0] is None or d.tenant in licensed[0]
