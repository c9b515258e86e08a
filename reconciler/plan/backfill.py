"""Phase 3a of a plan: backfill. Work still pending goes into room the packed plan leaves on the
instances it keeps and creates anyway, where every rule allows it, as Slurm's and Kueue's backfill
do: nothing placed or running moves. Where the solver's search stopped unproven, work that room does
not hold gets one new instance where that alone holds it under every rule (`_grow`), as the plan
after the apply would buy it.

The solver counts capacity summed per offer, so the packer can leave jobs it placed unpacked; the
room they were counted in then stands idle. On the trace-shaped fixed cluster (bench/trace.py,
111 nodes of 8 GPUs) 14 such jobs left 14 GPUs idle on 9 nodes while 85 pending jobs were told
"not placed by this plan, although room on +108 ...": the plan said there was room it did not use.

Only new, single-item work is placed here: 1-replica jobs that do not run now (a running job
placed elsewhere would be a move, which needs a rule behind it), never gangs, never spot work a
tenant's spot share took out (phase 2a). Each placement is asked of the one ledger: the job's
placement rules, its tenant's quota and licenses, its tenant's budget and spot share, the on-demand
buffer. Work is tried in the README's order (class, deadline, priority), larger items first, each
on the instance it leaves the least room on. Then pending work may take the room of its own tenant's
new work of a lower class (`_displace`), which is backfilled elsewhere if room holds it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.ledger import Ledger, buffer_use, plan_ledger
from reconciler.pack import Bin
from reconciler.plan.instances import create_action
from reconciler.plan.packing import Packing
from reconciler.problem import Capacity, Demand, Host, OfferFits, Problem

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.solve import Solution


def backfill(problem: Problem, observed, solution: Solution, packing: Packing, creates: list, slots: dict[str, list[str | None]],
             spot_drops: dict[str, str], hosts: dict[str, Capacity], demand_of: dict[str, Demand], pid: str) -> list[str]:
    """Place pending work into the named plan's free room (module docstring): the hosts it keeps and the instances
    it creates, the empty ones a rule bought too (a pool's minimum; the on-demand buffer's, which the ledger then
    guards). Each job placed joins `slots`, `where` and `gpu_of`, and leaves `packing.unpacked`; returns the jobs
    placed, in order."""
    targets = [(b, b.ref) for key, bins in sorted(packing.bins_of.items()) for b in bins
               if isinstance(b.cap, Host) and key in solution.keep and not b.cap.frozen and not b.cap.keep_blocker]
    targets += [(b, packing.named[b.ref]) for key, bins in sorted(packing.bins_of.items()) for b in bins
                if not isinstance(b.cap, Host) and b.ref in packing.named]
    # (Where every tier is proven and everything the solver placed packed, no displacement can rank higher: the model
    # holds any plan the ledger allows. Asked on every plan, the index of a 5k-job cold plan's new work took 0.2 s.)
    settled = solution.status != "GREEDY_FALLBACK" and solution.tiers and all(t.proven for t in solution.tiers) and not (packing.unpacked or spot_drops)
    if not targets and settled:
        return []
    ledger = plan_ledger(problem, creates, solution.keep, _placements(problem, packing, slots, spot_drops))
    by_offer: dict[str, list[tuple[Bin, str]]] = {}
    for b, ref in targets:
        by_offer.setdefault(b.cap.offer_key, []).append((b, ref))
    fits = OfferFits()  # once per (demand shape, offer): a fleet has a few hundred shapes, thousands of hosts

    def fill() -> list[str]:
        placed: list[str] = []
        for d in sorted(_candidates(problem, observed, slots, packing, spot_drops), key=_order):
            if ledger.refuses_job(d):
                continue  # (most pending work of a big fleet waits on its tenant's quota: asked before any instance)
            bins = [t for ok, ts in sorted(by_offer.items()) if fits.at(d, ok, ts[0][0].cap) > 0 for t in ts]
            for job in [j for j in d.jobs if _waiting(j, observed, slots, packing, spot_drops)]:
                at = _place(d, job, bins, ledger, problem)
                if at is None:
                    break  # the demand's jobs are alike: the next one finds no room either
                _took(packing, slots, d, job, *at, ledger)
                placed.append(job)
        return placed

    placed = fill()
    if not settled and _displace(problem, observed, slots, packing, spot_drops, targets, ledger, demand_of, placed, fits):
        placed += fill()  # (the work displaced, where other room holds it)
    if not settled:
        placed += _grow(problem, observed, slots, packing, spot_drops, ledger, creates, pid, fits, by_offer, fill, solution.keep)
    return placed


def _grow(problem: Problem, observed, slots: dict[str, list[str | None]], packing: Packing, spot_drops: dict[str, str], ledger: Ledger,
          creates: list, pid: str, fits: OfferFits, by_offer: dict[str, list[tuple[Bin, str]]], fill, kept) -> list[str]:
    """Pending work the plan's room does not hold, on one new instance each where that alone holds it under every
    rule: the cheapest way the pending reasons would name ("not placed by this plan, although 1 new ... holds it"),
    the one ledger asked (Ledger.options: pool size, cloud quota, budgets, spot share, buffer and diversity, the
    tenant's quota). The search of an unproven tier may stop short of it: trace33's cold plan of 1,000 trace-shaped
    jobs left team-0 at 203 of its 204 GPUs with 37 of its 1-GPU jobs pending so ("borrowed low work" FEASIBLE after
    4.3 s), and the plan after its apply bought one a2-highgpu-1g for one of them. Work is tried in the README's order;
    each new instance takes the job it is bought for, then what else backfill (`fill`) puts in its room. Never an
    instance of an offer the plan deletes one of: that would be a move to an identical instance, which the stability
    phase has already undone where it could (fleet29's answer, the idle repair left out, deleted i78 and bought its
    twin for j0369)."""
    deleted = {h.offer_key for h in problem.hosts() if h.key not in kept}
    offers = {c.key: c for c in problem.offers() if not c.members and c.offer_key not in deleted}
    placed: list[str] = []
    tried: set[str] = set()  # demands no new instance took (the rules, the room or the options refused)
    while True:
        grown = None
        for d in sorted(_candidates(problem, observed, slots, packing, spot_drops), key=_order):
            if d.key in tried or d.replicas != 1 or ledger.refuses_job(d):
                continue
            free = [o for o in ledger.options(d, fits) if not o.refusals]
            if free and free[0].offer in offers and free[0].new == 1:  # (room that holds it, which backfill did not take: not bought for)
                grown = d, offers[free[0].offer]
                break
            # Not asked again after each instance bought: the ledger's options of every pending demand, per instance
            # bought, were quadratic in a big fleet's pending work. (An on-demand instance bought later can widen the
            # spot share a spot job was refused on: that job then waits for the next plan, as before this pass.)
            tried.add(d.key)
        if grown is None:
            return placed
        d, c = grown
        n = len(creates) + 1
        b = Bin.empty(c, f"{c.key}#g{n}")
        creates.append(create_action(pid, n, b))
        ref = packing.named[b.ref] = creates[-1].ref
        ledger.add_instance(ref, c)
        packing.bins_of.setdefault(c.key, []).append(b)
        job = next(j for j in d.jobs if _waiting(j, observed, slots, packing, spot_drops))
        if _place(d, job, [(b, ref)], ledger, problem) is None:  # (as the options count it, it holds: never bought empty)
            ledger.remove_instance(ref)
            creates.pop()
            packing.bins_of[c.key].remove(b)
            del packing.named[b.ref]
            tried.add(d.key)
            continue
        _took(packing, slots, d, job, b, ref, ledger)
        packing.pool_count[c.pool] = packing.pool_count.get(c.pool, 0) + 1
        packing.fleet["all"] += packing.prim(c)
        if c.market == "spot":
            packing.fleet["spot"] += packing.prim(c)
        by_offer.setdefault(c.offer_key, []).append((b, ref))
        placed += [job, *fill()]  # (and what else its room holds)


def _took(packing: Packing, slots: dict[str, list[str | None]], d: Demand, job: str, b: Bin, ref: str, ledger: Ledger) -> None:
    """Job `job` (one item of d) was placed on bin b (instance ref): the ledger and the packed plan say so."""
    ledger.add_item(d, job, ref)
    slots[job] = [ref]
    packing.where[(job, 0)] = ref
    packing.gpu_of[(job, 0)] = tuple(b.gpu_of[(job, 0)])
    packing.unpacked.discard(job)


def _displace(problem: Problem, observed, slots: dict[str, list[str | None]], packing: Packing, spot_drops: dict[str, str],
              targets: list[tuple[Bin, str]], ledger: Ledger, demand_of: dict[str, Demand], placed: list[str], fits: OfferFits) -> bool:
    """Pending work takes the room of its own tenant's new work of a lower class, where that room holds it and every
    rule the ledger keeps allows it: the README's order (a higher class of a tenant before its lower ones) on the plan
    as packed. The solver's search may stop short of it: on a fixed cluster of mixed node sizes (bench.explore_mixed's
    fleet 189) the cold plan left a normal 1-GPU job pending ("capacity goes to higher-priority work first") where its
    tenant's low 1-GPU job, larger in every dimension, was placed, and the plan after that plan's apply evicted the low
    job for it. Only work that does not run now is displaced (stopping running work is an eviction, the solver's to
    choose), single items both, as backfill places. Each displacing job joins `placed`; returns whether any did."""
    # tenant -> (offer, class) -> its new single-item work of that class on the targets of that offer: (bin, ref, job)
    lower: dict[str, dict[tuple[str, int], list[tuple[Bin, str, str]]]] = {}
    for b, ref in targets:
        for dk, job, _ in b.items:
            q = demand_of[job]
            if not q.gang and q.bundle == 1 and q.replicas == 1 and not observed.placements.get(job) and job not in spot_drops:
                lower.setdefault(q.tenant, {}).setdefault((b.cap.offer_key, q.klass), []).append((b, ref, job))
    if not lower:
        return False
    any_ = False
    for d in sorted(_candidates(problem, observed, slots, packing, spot_drops), key=_order):
        mine = [t for (ok, k), ts in sorted(lower.get(d.tenant, {}).items()) if k < d.klass and ts and fits.at(d, ok, ts[0][0].cap) > 0
                for t in ts]
        if not mine:
            continue
        for job in [j for j in d.jobs if _waiting(j, observed, slots, packing, spot_drops)]:
            at = _displacing(d, job, mine, ledger, demand_of)
            if at is None:
                break  # (the demand's jobs are alike)
            b, ref, gone = at
            q = demand_of[gone]
            b.remove(q, gone)
            ledger.remove_item(q, gone, ref)
            del slots[gone], packing.where[(gone, 0)]
            packing.gpu_of.pop((gone, 0), None)
            mine.remove((b, ref, gone))
            lower[d.tenant][(b.cap.offer_key, q.klass)].remove((b, ref, gone))
            if b.place(d, job, 0) is None:
                raise AssertionError(f"internal: {job} does not fit {ref} once {gone} left it, as tried")
            _took(packing, slots, d, job, b, ref, ledger)
            lower[d.tenant].setdefault((b.cap.offer_key, d.klass), []).append((b, ref, job))  # (now new work of its class there)
            placed.append(job)
            any_ = True
    return any_


def _displacing(d: Demand, job: str, mine: list[tuple[Bin, str, str]], ledger: Ledger,
                demand_of: dict[str, Demand]) -> tuple[Bin, str, str] | None:
    """The new work of d's tenant, of a lower class, whose room takes one item of d within every rule: the lowest in the
    README's order first, then the instance d leaves the least room on. Tried on copies: nothing is changed."""
    tried = []
    for b, ref, gone in mine:
        q = demand_of[gone]
        if any(d.req(k) > b.free.get(k, 0.0) + q.req(k) + 1e-9 for k in d.dims if d.req(k) > 0):
            continue
        trial = replace(b, free=dict(b.free), gpus_used=list(b.gpus_used), items=list(b.items), gpu_of=dict(b.gpu_of))
        trial.remove(q, gone)
        if trial.place(d, job, 0) is None:
            continue
        tried.append(((q.klass, q.deadline_rank, q.priority), _room_left(trial, d), ref, gone, b))
    for _, _, ref, gone, b in sorted(tried, key=lambda t: t[:4]):
        q = demand_of[gone]
        ledger.remove_item(q, gone, ref)
        refused = ledger.refuses_job(d) or ledger.refuses_item(d, b.cap) or (
            b.cap.market != "spot" and ledger.refuses_buffer(d, buffer_use(d, ledger.dim)))
        ledger.add_item(q, gone, ref)
        if not refused:
            return b, ref, gone
    return None


def _placements(problem: Problem, packing: Packing, slots: dict[str, list[str | None]],
                spot_drops: dict[str, str]) -> list[tuple[str, tuple[str, ...]]]:
    """(job, instance per replica) of every job the packed plan places, as job_changes will list them."""
    out = []
    for d in problem.demands:
        for job in d.jobs:
            if job in slots and job not in packing.unpacked and job not in spot_drops:
                out.append((job, tuple(packing.where[(job, r)] for r in range(d.replicas) for _ in range(d.bundle))))
    return out


def _candidates(problem: Problem, observed, slots, packing: Packing, spot_drops) -> list[Demand]:
    return [d for d in problem.demands if not d.gang and d.bundle == 1
            and any(_waiting(j, observed, slots, packing, spot_drops) for j in d.jobs)]


def _waiting(job: str, observed, slots, packing: Packing, spot_drops) -> bool:
    """Pending new work backfill may place: not placed (or placed by the solver but left unpacked), not running now,
    not taken out for its tenant's spot share."""
    return (job not in slots or job in packing.unpacked) and not observed.placements.get(job) and job not in spot_drops


def _order(d: Demand) -> tuple:
    """The README's order: class, deadline, priority (higher first); then larger items, which have fewer places."""
    return (-d.klass, -d.deadline_rank, -d.priority, -d.gpus, -(d.mig[1] if d.mig else 0), -d.cpu, -d.memory_gib, d.key)


def _place(d: Demand, job: str, bins: list[tuple[Bin, str]], ledger: Ledger, problem: Problem) -> tuple[Bin, str] | None:
    """The instance that takes one item of d and leaves the least room (then the cheapest data path), within
    every rule the ledger keeps; the item is placed on it (GPUs chosen as the packer chooses them)."""
    if ledger.refuses_job(d):
        return None
    fitting = sorted(((b, ref) for b, ref in bins if b.fits(d)), key=lambda t: (_room_left(t[0], d), problem.cost_coef(d, t[0].cap), t[1]))
    for b, ref in fitting:
        if ledger.refuses_item(d, b.cap):
            continue
        if b.cap.market != "spot" and ledger.refuses_buffer(d, buffer_use(d, ledger.dim)):
            continue
        if b.place(d, job, 0) is not None:
            return b, ref
    return None


def _room_left(b: Bin, d: Demand) -> tuple[float, ...]:
    """What the instance would have free after the item, GPUs (or MIG devices) first, then vCPU and memory, each
    as a share of the instance: the fullest instance that takes it first (best fit), so larger items keep the
    emptier ones."""
    order = sorted(b.free, key=lambda k: (k in ("cpu", "memory_gib"), k != "cpu", k))
    return tuple((b.free[k] - (d.req(k) if k in d.dims else 0.0)) / b.cap.cap(k) if b.cap.cap(k) > 0 else 0.0 for k in order)


__all__ = ["backfill"]
