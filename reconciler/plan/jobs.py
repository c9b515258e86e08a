"""Phase 4 of a plan: per job, what happens to it and why.

Kept, placed, moved (with what the move is for: healing lost capacity, leaving an instance that
must go, a rule of the job's own, or consolidation), evicted or pending. Pending reasons are
read off the finished plan: its instances, charges and spot share.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from dataclasses import replace

from reconciler.problem.diagnosis import pending_reason
from reconciler.ledger import Ledger, rules_broken_now, spot_share_ok
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.plan.packing import Packing
from reconciler.plan.quality import UNPACKED
from reconciler.plan.types import JobAction, JobChange
from reconciler.problem import Capacity, Demand, OfferFits, Problem, gang_split, placement_refusal, shape_changes, spot_measure

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.solve import Solution


def job_changes(desired: DesiredState, observed: Observed, problem: Problem, solution: Solution, slots: dict[str, list[str | None]],
                packing: Packing, spot_drops: dict[str, str], hosts: dict[str, Capacity]) -> list[JobChange]:
    """Every job of the problem, in the problem's order; a job without instances has a reason only
    where the plan knows it already (a tenant's spot share, a static one): with_pending_reasons."""
    unpacked, where, gpu_of = packing.unpacked, packing.where, packing.gpu_of
    klass = {job: d.klass for d in problem.demands for job in d.jobs}
    arrivals: dict[str, list[str]] = {}  # instance -> the jobs that come onto it in this plan
    for (job, _), inst in where.items():
        if inst not in observed.placements.get(job, ()):
            arrivals.setdefault(inst, []).append(job)
    tenant_of = {job: d.tenant for d in problem.demands for job in d.jobs}
    jobs: list[JobChange] = []

    @functools.cache
    def broken() -> dict[str, str]:  # (read once, where a move asks: the fleet as it runs, at 10k a tenth of a second)
        return rules_broken_now(problem)

    @functools.cache
    def pool_room() -> dict[str, tuple[int, list[str]]]:  # pool -> (instances it runs, the jobs that come into it)
        pool_of = {packing.named.get(b.ref, b.ref): b.cap.pool for bins in packing.bins_of.values() for b in bins}
        out: dict[str, tuple[int, list[str]]] = {}
        for h in hosts.values():
            out[h.pool] = (out.get(h.pool, (0, []))[0] + 1, [])
        for ref, came in arrivals.items():
            p = pool_of.get(ref)
            if p is not None:
                out.setdefault(p, (0, []))[1].extend(j for j in came if all(i not in hosts or hosts[i].pool != p for i in observed.placements.get(j, ())))
        return out

    for d in problem.demands:
        for job in d.jobs:
            prev = tuple(observed.placements.get(job, ()))
            if job in spot_drops:
                jobs.append(JobChange(job, d.tenant, "evict" if prev else "pending", (), prev, spot_drops[job]))
            elif job in slots and job not in unpacked:
                now, gpus = [], []
                for r in range(d.replicas):
                    for k in range(d.bundle):
                        now.append(where[(job, r)])
                        g = gpu_of.get((job, r), ((),))
                        gpus.append(g[k] if k < len(g) else ())
                now_t = tuple(now)
                action: JobAction = "keep" if sorted(now_t) == sorted(prev) and len(prev) == len(now_t) else ("move" if prev else "place")
                note = (packing.moved.get(job) or move_note(d, job, prev, now_t, observed, hosts, solution, arrivals, klass, broken, problem, tenant_of,
                                                               pool_room)) \
                    if action == "move" else ""
                if job in d.reshaped:  # a resource change is a change: the job restarts
                    where_to = "restarts in place" if action == "keep" else "restarts on other instances"
                    gone = [h for h in prev if h not in now_t and h in hosts and hosts[h].keep_blocker]
                    if gone:  # (and the instance it ran on must go: its MIG layout drifted from its pool's, its pool removed)
                        where_to += f"; it leaves {gone[0]}: {hosts[gone[0]].keep_blocker}"
                    action, note = "move", f"resources changed ({'; '.join(shape_changes(desired.jobs[job], observed))}): {where_to}"
                elif action == "move" and d.gang and len(prev) != len(now_t) and not observed.lost.get(job):
                    # (a gang grown or shrunk restarts at its new size: it read "consolidation: a cheaper packing", audit21 finding 5)
                    where_to = "restarts where it runs" if set(now_t) <= set(prev) else "restarts, on other instances too"
                    note = f"replicas changed ({len(prev) // d.bundle} -> {d.replicas}): {where_to}"
                if action == "place" and observed.lost.get(job):
                    note = f"replaces {', '.join(observed.lost[job])}: gone (spot interruption or lost capacity)"
                jobs.append(JobChange(job, d.tenant, action, now_t, prev, note, tuple(gpus)))
            else:
                jobs.append(JobChange(job, d.tenant, "evict" if prev else "pending", (), prev, problem.static_pending.get(job, "")))
    return jobs


def with_pending_reasons(jobs: list[JobChange], problem: Problem, ledger: Ledger, unpacked: set[str],
                         demand_of: dict[str, Demand], greedy: bool = False) -> list[JobChange]:
    """Each job left without instances and a reason gets its reason from the finished plan's
    ledger (its instances, charges and spot share); sorted by name. One OfferFits for them all:
    a 10k-job cold plan has ~900 pending jobs of ~800 demands but a few hundred shapes (fit()
    asked 25k times otherwise). `greedy`: the plan is greedy best-fit's (diagnosis.pending_reason)."""
    fits = OfferFits()
    jobs = [replace(j, reason=(UNPACKED + "; " if j.job in unpacked else "") + pending_reason(demand_of[j.job], problem, ledger, j.job, fits, greedy))
            if not j.instances and not j.reason else j for j in jobs]
    jobs.sort(key=lambda j: j.job)
    return jobs


def spot_share_moves(jobs: list[JobChange], problem: Problem, ledger: Ledger, hosts: dict[str, Capacity],
                     keep: frozenset[str]) -> list[JobChange]:
    """A move said to be for cost (_claims_cost) that takes a job off spot onto on-demand only, where the finished plan (`ledger`)
    with the job left on its spot instances (kept, and its new on-demand instances holding nothing else not bought)
    breaks max_spot_fraction: the spot share moves it, not a saving. move_note reads the rules the fleet breaks now, and
    this one broke only once the plan stopped other on-demand work: a pool's max_instances lowered under a running gang
    of 16 on-demand GPUs left the fleet 90% spot, and a job moved from a $2.00/h spot instance to a $5.67/h on-demand
    one read "consolidation: its instance is removed", its old instance "consolidated: ... more cheaply" (s36)."""
    fraction = problem.spot.max_spot_fraction
    if fraction >= 1:
        return jobs
    spot, total = ledger.spot()
    _, units = spot_measure(list(hosts.values()) + list(ledger.instances.values()), problem.gpu_fleet)
    out = []
    for j in jobs:
        left = [h for h in dict.fromkeys(j.previous) if h not in j.instances and h in hosts]
        now = [ledger.instances.get(ref) for ref in dict.fromkeys(j.instances)]
        if (j.action == "move" and left and _claims_cost(j.reason, left, problem) and all(hosts[h].market == "spot" for h in left)
                and all(c is not None and c.market == "on-demand" for c in now)):
            back = sum(units(hosts[h]) for h in left if h not in keep)  # its spot instances, kept
            unbought = sum(units(ledger.instances[ref]) for ref in dict.fromkeys(j.instances)
                           if ref not in hosts and all(job == j.job for _, job in ledger.items[ref]))
            stay_spot, stay_total = spot + back, total + back - unbought
            if stay_total and not spot_share_ok(stay_spot, stay_total, fraction):
                j = replace(j, reason=f"leaves spot ({left[0]}): left there, the fleet after this plan would be "
                                      f"{stay_spot / stay_total:.1%} spot, over max_spot_fraction {fraction:g}")
        out.append(j)
    return out


def _claims_cost(reason: str, left: list[str], problem: Problem) -> bool:
    """Whether a move's reason (move_note's) says it is for cost: a consolidation, or the fleet's budget, which the fleet
    breaks now (a move off spot to dearer on-demand read "leaves ...: the fleet costs $53.40/h, over max_hourly_budget")."""
    budget = rules_broken_now(problem).get("budget")
    return reason.startswith("consolidation") or (budget is not None and any(reason == f"leaves {h}: {budget}" for h in left))


def move_note(d: Demand, job: str, prev: tuple[str, ...], now: tuple[str, ...], observed: Observed, hosts: dict[str, Capacity],
              solution: Solution, arrivals: dict[str, list[str]] | None = None, klass: dict[str, int] | None = None,
              broken=None, problem: Problem | None = None, tenant_of: dict[str, str] | None = None, pool_room=None) -> str:
    """Why a running job moves: what it replaces, the instance or rule that makes it leave, the higher-priority work
    that takes its room (a running job moves for no other work: solve/objective.moves_tier), or consolidation, named
    only where the solver moved work for cost (`Solution.consolidated`, or a saving it measured: stay_value); else it
    says the plan cannot name why. (Forced moves read "consolidation: its instance is removed": a pool past its
    max_instances, a higher class's room, at $/h more; audit.) `broken()`: the rules the fleet breaks now
    (ledger.rules_broken_now: a pool past its max, the budget, a tenant's spot share: a job leaving spot for it is no
    consolidation, audit20 finding 2). `pool_room()`: pool -> (instances it runs, the jobs that come into it)."""
    gone = observed.lost.get(job)
    if gone:
        return f"replaces {', '.join(gone)}: gone (spot interruption or lost capacity)"
    left = [h for h in prev if h not in now]
    blocked = [h for h in left if h in hosts and hosts[h].keep_blocker]
    if blocked:
        return f"leaves {blocked[0]}: {hosts[blocked[0]].keep_blocker}"
    refused = [(h, placement_refusal(d, hosts[h])) for h in left if h in hosts]
    refused = [(h, why) for h, why in refused if why]
    if refused:  # the job's own rules changed (an allowlist, spot mode): the rule forces it, not a saving
        return f"leaves {refused[0][0]}: {refused[0][1]}"
    split = _split(d, [hosts.get(h) for h in prev])
    if split:
        return split
    spot_left = [h for h in left if h in hosts and hosts[h].market == "spot"]
    removed = [h for h in left if h not in solution.keep and h in hosts]
    rules = broken() if broken is not None and (spot_left or removed) else {}
    why = rules.get(f"tenant-spot:{d.tenant}") if spot_left else None
    if why:
        return f"leaves spot ({spot_left[0]}): {why}"
    consolidated = (solution.consolidated or solution.stay_value is not None) and \
        (solution.moves_measured is None or d.key in solution.moves_measured)  # (not a part greedy best-fit answered)
    for h in removed:  # its instance goes: the rule that shrinks its pool or the fleet, else the work that takes the room
        pool = hosts[h].pool
        most = problem.pool_bounds.get(pool, (0, math.inf))[1] if problem is not None else math.inf
        if f"pool:{pool}" in rules:
            return f"leaves {h}: {rules[f'pool:{pool}']} {most}"
        for rule in ("budget", "spot-share") if hosts[h].market == "spot" else ("budget",):
            if rule in rules:
                return f"leaves {h}: {rules[rule]}"
        if f"tenant-budget:{d.tenant}" in rules:
            return f"leaves {h}: {rules[f'tenant-budget:{d.tenant}']}"
        running, came = pool_room()[pool] if pool_room is not None else (0, [])
        above = sorted({j for j in came if (klass or {}).get(j, -1) > d.klass}) if running >= most else []
        if above:  # (no slot left in its pool: the room the higher class takes is the instance)
            return f"makes room in pool {pool}, at its max_instances {most}, for {_whose(above, d, tenant_of)}higher-priority work: {_few(above)}"
    if removed and consolidated:
        return "consolidation: its instance is removed"
    for h in left:
        came = sorted(set((arrivals or {}).get(h, ())))
        above = [j for j in came if (klass or {}).get(j, -1) > d.klass]
        if above:
            return f"makes room on {h} for {_whose(above, d, tenant_of)}higher-priority work: {_few(above)}"
        if came and consolidated:  # (a consolidation that pays freed it, and pending work took it: solve/strategy.consolidate)
            return f"consolidation: its room on {h} goes to {_few(came)}"
    if consolidated:
        return "consolidation: a cheaper packing"
    # No rule above and no saving: a rule the fleet breaks now licenses the move (README, Stability), or nothing the plan can name.
    rules = broken() if broken is not None else {}
    why = next((w for r, w in rules.items() if not r.startswith("tenant-") or r.split(":", 1)[1] == d.tenant), None)
    taken = next(((h, came) for h in left if (came := sorted(set((arrivals or {}).get(h, ()))))), None)
    head = f"leaves {removed[0]}: its instance is removed" if removed else \
        f"leaves {taken[0]}: its room goes to {_few(taken[1])}" if taken else f"leaves {left[0]}" if left else "moves"
    return f"{head} under a rule the fleet breaks now ({why})" if why else \
        f"{head} (the plan cannot name the rule or saving that moves it)"


def _split(d: Demand, hosts: list) -> str | None:
    """How a running gang breaks its gang mode as it runs (rules.gang_split): split over zones, instances or types, or,
    a placement-group gang, outside its placement group (a zone gang before: its instances are in none)."""
    if not gang_split(d, hosts):
        return None
    if len({(h.cloud, h.zone) for h in hosts}) > 1:
        over = "zones"
    elif d.gang_mode == "instance":
        over = "instances"
    elif len({h.instance_type for h in hosts}) > 1:
        over = "instance types"
    else:
        return ("gang: placement-group, but its instances are not all in its placement group: it moves whole onto new "
                "instances launched into one")
    return f"its gang runs split over {over}, which its gang mode forbids: it moves whole"


def _whose(jobs: list[str], d: Demand, tenant_of: dict[str, str] | None) -> str:
    """"<tenant>'s " where all of `jobs` are another tenant's than d's, else nothing."""
    tenants = {(tenant_of or {}).get(j) for j in jobs}
    t = tenants.pop() if len(tenants) == 1 else None
    return f"{t}'s " if t is not None and t != d.tenant else ""


def _few(jobs: list[str]) -> str:
    return ", ".join(jobs[:3]) + (f" (+{len(jobs) - 3} more)" if len(jobs) > 3 else "")
