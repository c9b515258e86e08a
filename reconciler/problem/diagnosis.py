"""Why work is pending, in words a user can act on: the rule that binds, with the plan's numbers.

Two questions. Before solving: what keeps a job off every capacity the fleet could ever have
(`why_nothing_fits`, the problem's static_pending). After: what keeps it out of this plan
(`pending_reason`, read off the finished plan's ledger). Both are pure, ask the rules (problem.rules,
ledger.py) for their refusals and never re-solve (the plan asks for every pending job).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

from reconciler.ledger import (DIM_UNITS, Ledger, Option, Refusal, budget_ok, buffer_ok, capacity_kind, charge, item_units, license_need, micro, money,
                               quota_headroom, quota_ok, quota_scope, quota_units, running_ledger, spot_share_ok, within, work_units)
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.problem.rules import fit, guardrail_refusal, placement_refusal, running_use, size_fit, stuck_gangs
from reconciler.problem.types import DIMS, Capacity, Demand, Host, Offer, Problem, TenantRules, spot_measure
from reconciler.site import Site
from reconciler.words import amount

# The clauses a reason names what holds the job's capacity by, and the gang's own reason: fleetview.REASON_KINDS
# counts pending work by them (it matched "preempted"/"outranked", words no reason said: "priority" was never counted).
OUTRANKED = "capacity goes to higher-priority work first"
OUTRANKED_IN_TENANT = "its tenant's quota goes to its higher-priority work first"
RECLAIMED = "the room it borrowed goes back to"
STUCK_GANG = "under consolidation: WhenEmpty a running gang"

# The order a user would look at the rules in, when several each block a way of placing the job.
_RULE_ORDER = ("quota", "license", "license-quota", "reservation", "cloud-quota", "pool-max", "fleet-budget", "tenant-budget", "spot-share", "tenant-spot-share", "spot-buffer", "spot-diversity",
               "vacated")


def _rule_text(ways: list[tuple[Refusal, ...]], ledger: Ledger) -> str:
    """One rule's refusals (one kind) of each way it refuses (maybe several pools) as one clause with the plan's numbers:
    the way it refuses least, and every limit of that kind that refuses that way (a vCPU and a GPU cloud quota, two
    Licenses: each binds alone, and one named alone, raised, left the job pending on the other)."""
    refusals = [r for way in ways for r in way]
    first = refusals[0]
    if first.rule == "pool-max":
        bounds = ledger.problem.pool_bounds
        pools = sorted({r.limit for r in refusals})
        parts = ", ".join(f"{p} {ledger.pool_count(p)}/{bounds[p][1]}" for p in pools)
        n = min(r.instances for r in refusals)
        need = f"; the job needs {n} new instances" if n > 1 else ""
        return f"pools at max_instances ({parts}){need}{_deleted_with_work(ledger, pools, n)}"
    least = sorted(min(ways, key=lambda way: (len(way), min(r.shortfall for r in way))), key=lambda r: r.shortfall)
    return least[0].message + (f"; several limits bind at once with it: {'; '.join(r.message for r in least[1:])}" if len(least) > 1 else "")


def _deleted_with_work(ledger: Ledger, pools: list[str], n: int) -> str:
    """Where this plan deletes instances of the pools that run work now (and could stay), the clause saying a raise of
    max_instances may keep them first: their work moved off them to fit the max or another fleet rule the room left,
    and running work moves only where a rule makes it. (Raised by the one instance a reason named, a re-plan kept i0
    with j5 on it, where this plan moved j5 to buy on-demand room for the buffer; the job stayed pending.)"""
    gone = [h for h in ledger.problem.hosts() if h.pool in pools and h.keep_blocker is None and h.residents
            and h.key not in ledger.instances]
    if not gone:
        return ""
    jobs = sorted({job for h in gone for _, job, _ in h.residents})
    ids = sorted(h.instance_id for h in gone)
    more = f" and {len(jobs) - 3} more" if len(jobs) > 3 else ""
    return (f"; raised by {amount(n, 'instances')} alone, the plan may keep {', '.join(ids[:3])}{' and more' if len(ids) > 3 else ''} "
            f"instead, which it deletes with work on {'it' if len(ids) == 1 else 'them'} ({', '.join(jobs[:3])}{more}): "
            f"a raise of {amount(n + len(gone), 'instances')} leaves room for both")


def pending_reason(d: Demand, problem: Problem, ledger: Ledger, job: str | None = None, fits: Callable[[Demand, Capacity], int] = fit,
                   greedy: bool = False) -> str:
    """The rule that binds for this job in this plan, with the plan's own numbers (the ledger
    of the finished plan: its instances, charges, spot share). Every way of placing the job is
    tried against the ledger: on new instances of each offer, or in room left on an instance.
    The reason names the rule that alone blocks the cheapest of them (lifting it would let the
    job be placed), or says that several bind at once. `fits`: fit, or an OfferFits shared by
    the reasons of one plan (demands of one shape fit alike). An evicted job whose tenant ran on
    borrowed room says so, and whose work takes the room back (`_reclaimed`). `greedy`: the plan is greedy best-fit's
    (GREEDY_FALLBACK), which no longer search of this run's would have searched differently (`_not_found`)."""
    evicted = job is not None and any(j == job for j, _ in d.running)
    reason = _binding(d, problem, ledger, evicted, fits, job, greedy)
    return reason + _reclaimed(d, problem, ledger) if evicted else reason


_NOTHING_NEW = "its zones are short of capacity or in cool-off, or spot is over max_price_fraction"


def _not_found(greedy: bool) -> str:
    """Who missed a placement every rule allows, and what searches more. A plan of greedy best-fit's was searched by no
    solver: more --time-limit of this run is no promise (`--time-limit 0` asked for greedy's alone; an infeasible model
    or a plan ranking higher than CP-SAT's is no work limit), and its solver line says why it is greedy's and what
    would help (plan.quality.greedy_advice)."""
    if greedy:
        return "greedy best-fit, which made this plan, did not find that placement (the plan's solver line says why it is greedy's)"
    return "the solver did not find that placement: the next run retries (a longer --time-limit searches more)"


def _binding(d: Demand, problem: Problem, ledger: Ledger, evicted: bool, fits: Callable[[Demand, Capacity], int],
             job: str | None = None, greedy: bool = False) -> str:
    """pending_reason's rule that binds (evicted: the job ran before this plan)."""
    head = "evicted: " if evicted else ""
    if evicted and d.key in stuck_gangs(problem):
        return head + _stuck_reason(problem)
    blanket = [r for r in (ledger.quota_refusal(d), *ledger.license_refusals(d)) if r is not None]
    options = _with_vacated(d, problem, ledger, ledger.options(d, fits))
    tail = ""
    if not options and evicted and job is not None:
        # No room and no new instance for it: the instances it ran on, gone in this plan, are the way left. The rules
        # that refuse keeping them are what evicts it (spot diversity's min_zones, with the job's other zone in cool-off,
        # was said to be "the instances that could hold it are full", its own not full but deleted).
        options = _staying(d, problem, ledger, job, fits)
        tail = f" (for keeping it {options[0].label.removeprefix('staying ')}, where it runs; no new instance can be bought for it: " \
               f"{_NOTHING_NEW})" if options else ""
    if blanket:  # a quota or a license refuses every way alike
        options = [replace(o, refusals=(*blanket, *o.refusals)) for o in options]
    if not options:
        lead = f"{'; '.join(r.message for r in blanket)}; several limits bind at once with it: " if blanket else ""
        return head + lead + f"the instances that could hold it are full and no new one can be bought for it ({_NOTHING_NEW})" \
            + _who_holds(d, problem, ledger, evicted, {"full"})
    open_ = [o for o in options if not o.refusals]
    if open_:
        shared = "" if evicted else _room_shared(d, open_, problem, ledger, fits)
        sized = {o.offer: c for o in open_ if (c := _sized_out(o, problem, ledger)) is not None}
        o = next((o for o in open_ if o.offer not in sized), None)
        if o is None:  # every open way needs more new instances of an offer than the problem lets the plan buy
            return head + _offer_size_text(open_[0], sized[open_[0].offer], problem, ledger, shared)
        behind = [] if evicted or d.running else _stopped_beside(d, problem, ledger)
        beside = None  # the cheapest open way outside the Reservation o launches into, where that room is shared
        if not shared and not evicted:
            shared, beside = _reserved_way_shared(d, o, [w for w in open_ if w.offer not in sized], problem, ledger, fits)

        def holds(rules: str) -> str:
            """"<way> would hold it under every <rules> (+$/h)", its room shared: alone, or else the way beside it."""
            if beside is not None:
                return (f"{o.label} would hold it alone ({_price_text(o, ledger)}), else {beside.label} would "
                        f"({_price_text(beside, ledger)}), under every {rules}")
            return f"{o.label} would hold it{' alone' if shared else ''} under every {rules} ({_price_text(o, ledger)})"
        if shared and not behind:
            return head + f"not placed by this plan: {shared}; {holds('pool, budget, quota and spot rule')}; {_not_found(greedy)}"
        if behind:
            return head + (f"waits for the next plan: its tenant's running {', '.join(behind[:3])}{' and more' if len(behind) > 3 else ''} "
                           f"(of its class or above) stop{'s' if len(behind) == 1 else ''} in this plan, and a tenant's new work does not "
                           f"take its running work's place in the plan that stops it (README, How it decides: the swaps tier); "
                           f"{holds('rule')}" + (f"; {shared}" if shared else ""))
        return head + f"not placed by this plan, although {holds('pool, budget, quota and spot rule')}; {_not_found(greedy)}"
    single: dict[str, list[tuple[Refusal, ...]]] = {}  # kind -> the refusals of each way that it alone refuses
    for o in options:
        kinds = {r.rule for r in o.refusals}
        if len(kinds) == 1:
            single.setdefault(kinds.pop(), []).append(o.refusals)
    if single:
        kind = min(single, key=_RULE_ORDER.index)
        text = _rule_text(single[kind], ledger)
        others = [k for k in sorted(single, key=_RULE_ORDER.index) if k != kind]
        also = f"; other capacity is blocked by {', '.join(_RULE_NAMES[k] for k in others)}" if others else ""
        # What holds the room of each shared rule named, the leading one's and those blocking "other capacity".
        shared = _SHARED.intersection(single) if kind in _SHARED else set()
        return head + text + tail + also + (_who_holds(d, problem, ledger, evicted, shared, _quota_scopes(r for k in shared for way in single[k] for r in way))
                                            if shared else _outranked(d, ledger, in_tenant=True) if kind == "quota" else "") \
            + ("" if evicted else _never_keeps(d, problem, ledger, {kind}))
    cheapest = options[0]
    kinds = sorted({r.rule for r in cheapest.refusals}, key=_RULE_ORDER.index)
    texts = [_rule_text([tuple(r for r in cheapest.refusals if r.rule == k)], ledger) for k in kinds]
    # The first rule in a user's order leads (a quota the job alone exceeds reads as that), then the others; "for" the
    # way, unless they refuse every way alike (a License's count and its tenant's quota of it).
    way = "" if set(cheapest.refusals) <= set(blanket) else f" for {cheapest.label}"
    return (head + texts[0] + f"; several limits bind at once with it{way}: " + "; ".join(texts[1:]) + tail
            + (_who_holds(d, problem, ledger, evicted, _SHARED.intersection(kinds), _quota_scopes(cheapest.refusals))
               if _SHARED.intersection(kinds) else "")
            + ("" if evicted else _never_keeps(d, problem, ledger, set(kinds))))


# ledger -> {a limit's key: the needs of the jobs left pending that each alone its room holds, smallest first}
_WAITING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Room:
    """The room one limit leaves in this plan, which pending jobs may share: a tenant's quota, a license's count or a
    tenant's quota of it, a pool's max_instances, the fleet's or a tenant's budget, the fleet's or a tenant's spot
    share. `need(v, ways)`: what one job of demand v takes of it at least (`ways`: v's open ways, asked only where
    `by_ways`; 0: v does not wait for it). Exact where a job takes it wherever it goes (a quota, a license); else a
    bound no placement goes under, jobs sharing new instances too, and the jobs it holds are "at most" so many."""

    rule: str  # as Refusal.rule: the order rooms are named in (_RULE_ORDER)
    key: tuple
    text: str  # "its tenant t has room for 1 more GPU under its quota (0/1 in this plan)"
    ok: Callable[[float], bool]  # whether `more` of it stays within the limit
    need: Callable[[Demand, list[Option]], float]
    tenant: str | None = None  # only this tenant's jobs wait for it
    by_ways: bool = False
    exact: bool = True
    waits: str = "wait for it"  # what the pending jobs it counts do: all their ways take it, or some ("could use it")


def _room_shared(d: Demand, ways: list[Option], problem: Problem, ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> str:
    """Where the room a limit leaves in this plan holds d alone (`ways`: its open ways) but not every pending job that
    waits for it, that clause: how much room, how many wait, how many it holds at most; else "". (A 1000-job trace
    fleet's 37 pending 1-GPU jobs of team-0 each read that a new instance "would hold it under every ... quota ...
    rule", team-0 having room for one of them: true of each job alone, false of the 37; three jobs read it so beside
    one instance left under a pool's max_instances, one license, or $5/h of budget for $3.67/h instances.)"""
    for room in sorted(_rooms(d, ways, problem, ledger, fits), key=lambda r: _RULE_ORDER.index(r.rule)):
        if clause := _room_clause(room, d, ways, problem, ledger, fits):
            return clause
    return ""


def _room_clause(room: _Room, d: Demand, ways: list[Option], problem: Problem, ledger: Ledger,
                 fits: Callable[[Demand, Capacity], int]) -> str:
    """`_room_shared`'s clause for one room: "" where it holds every pending job that needs it (or not d)."""
    memo = _WAITING.get(ledger)
    if memo is None:
        memo = _WAITING[ledger] = {}
    mine = room.need(d, ways)
    if mine <= 0 or not room.ok(mine):
        return ""
    if room.key not in memo:
        memo[room.key] = sorted(
            n for v in problem.demands if room.tenant in (None, v.tenant)
            for job in v.jobs if job not in ledger.job_demand and job not in problem.static_pending
            and (n := room.need(v, _open_ways(v, problem, ledger, fits) if room.by_ways else [])) > 0 and room.ok(n))
    waiting = memo[room.key]
    held, total = 0, 0.0
    for n in waiting:  # the smallest first: the most jobs the room could hold
        if not room.ok(total + n):
            break
        held, total = held + 1, total + n
    if len(waiting) <= held:
        return ""
    whose = "of its pending jobs" if room.tenant else "pending jobs"
    return f"{room.text}: for {'' if room.exact else 'at most '}{held} of the {len(waiting)} {whose} that {room.waits}, this one among them"


def _reserved_way_shared(d: Demand, o: Option, ways: list[Option], problem: Problem, ledger: Ledger,
                         fits: Callable[[Demand, Capacity], int]) -> tuple[str, Option | None]:
    """Where the way named for d (`o`) launches into a Reservation whose room holds fewer of the pending jobs that
    could use it than there are, beside open ways outside it: that clause, and the cheapest of those other ways (a free
    reserved instance beside the pool's on-demand offer was said to hold each of three jobs at $0.00/h, room for one).
    ("", None) where o is not reserved, the reservation holds them all, or it is every open way (`_room_shared`)."""
    offer = _offers_by_key(ledger)
    name = offer[o.offer].reservation if o.offer else None
    r = problem.reservations.get(name) if name else None
    others = [w for w in ways if not (w.offer and offer[w.offer].reservation == name)]
    if r is None or not others:
        return "", None
    have = ledger.reserved(name)

    def need(v: Demand, vs: list[Option]) -> float:
        """At least the part of a reserved instance one job of v takes, on the least of its ways into the reservation."""
        return min((share for _, share in _new_shares(v, [w for w in vs if w.offer and offer[w.offer].reservation == name], ledger, fits)),
                   default=0.0)

    room = _Room("reservation", ("reservation way", name), _reservation_text(r, have), lambda more: within(have + more, r.count),
                 need, by_ways=True, exact=False, waits="could use it")
    clause = _room_clause(room, d, ways, problem, ledger, fits)
    return (clause, others[0]) if clause else ("", None)


def _reservation_text(r, have: int) -> str:
    return (f"reservation {r.name} has room for {amount(r.count - have, 'more instances')} under its "
            f"count ({have}/{r.count} {r.instance_type} in {r.zone} in this plan)")


def _new_shares(v: Demand, vs: list[Option], ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> list[tuple[Capacity, float]]:
    """Per way of v: its offer, and the part of its new instances one job of v takes at least (its GPUs, vCPU for CPU
    work, on them: `_new_items`); [] if a way buys none."""
    if not vs or not all(o.new for o in vs):
        return []
    offer, dim, out = _offers_by_key(ledger), "gpus" if v.gpus or v.mig else "cpu", []
    for o in vs:
        c = offer[o.offer]
        size = c.gpus if dim == "gpus" else c.cpu
        out.append((c, _new_items(v, o, c, fits) * item_units(v, dim) / size if size else 0.0))
    return out


def _price_text(o: Option, ledger: Ledger) -> str:
    """What way o adds to the plan's $/h, and, launched into a Reservation, why that is $0: its cost is committed."""
    r = ledger.problem.reservations.get(_offers_by_key(ledger)[o.offer].reservation or "") if o.offer else None
    committed = f": {r.name}'s {money(r.hourly_cost)}/h per instance is paid, used or not" if r is not None and not o.price else ""
    return f"+{money(o.price)}/h{committed}"


def _open_ways(v: Demand, problem: Problem, ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> list[Option]:
    """The ways of placing one more job of v that no rule refuses in this plan, as `_binding` asks them."""
    def find() -> list[Option]:
        if ledger.quota_refusal(v) is not None or ledger.license_refusal(v) is not None:
            return []
        return [o for o in _with_vacated(v, problem, ledger, ledger.options(v, fits)) if not o.refusals]
    return ledger.once(("open ways", v.key), find)


def _rooms(d: Demand, ways: list[Option], problem: Problem, ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> list[_Room]:
    """The limits whose room every open way of d takes (`_Room`), each with what a pending job needs of it."""
    out: list[_Room] = []
    rules = problem.tenants.get(d.tenant)
    t = d.tenant
    if rules is not None:
        use = ledger.tenant_use(t)
        for dim, limit in rules.cap.items():
            if not d.req(dim) or math.isinf(limit):
                continue
            used = use.get(dim, 0.0)
            ceiling = "burst ceiling" if limit > rules.guarantee.get(dim, limit) + 1e-9 else "quota"
            out.append(_Room("quota", ("quota", t, dim), f"its tenant {t} has room for {amount(limit - used, 'more ' + DIM_UNITS[dim])} under its "
                             f"{ceiling} ({used:g}/{limit:g} in this plan)",
                             lambda more, used=used, limit=limit: quota_ok(used, more, limit),
                             lambda v, _, dim=dim: v.replicas * v.req(dim), tenant=t))
    book = ledger.license_book()
    for name in sorted(license_need(d)):
        r = problem.licenses.get(name)
        if r is None:
            continue
        held = book.held[name]
        out.append(_Room("license", ("license", name), f"license {name} has room for {r.count - held} more held under its count "
                         f"({held}/{r.count} held in this plan)", lambda more, held=held, count=r.count: held + more <= count,
                         lambda v, _, name=name: license_need(v).get(name, 0)))
        q = r.tenant_quotas.get(t)
        if q is not None:
            mine = book.by_tenant.get((name, t), 0)
            out.append(_Room("license-quota", ("license-quota", name, t), f"its tenant {t} has room for {amount(q - mine, f'more {name} licenses')} "
                             f"under its quota of it ({mine}/{q} held in this plan)", lambda more, mine=mine, q=q: mine + more <= q,
                             lambda v, _, name=name: license_need(v).get(name, 0), tenant=t))
    if ways and all(o.new for o in ways):
        out += _new_instance_rooms(d, ways, problem, ledger, fits)
    if rules is not None and rules.budget is not None:
        spent, budget = ledger.tenant_charge(t), rules.budget
        out.append(_Room("tenant-budget", ("tenant-budget", t), f"its tenant {t} has room for {money(max(0.0, budget - spent))}/h "
                         f"more under its budget ({money(spent)}/h of {money(budget)}/h in this plan)",
                         lambda more: budget_ok(ledger.tenant_spend(t) + micro(more), budget),
                         lambda v, vs: min((_charge_at_least(v, o, ledger, fits) for o in vs), default=0.0),
                         tenant=t, by_ways=True, exact=False))
    f = rules.spot_fraction if rules is not None else None
    if f is not None and f < 1 and ways and all(_spot_items(d, o, ledger, fits) for o in ways):
        on, tot = ledger.tenant_spot(t)
        room = max(0.0, (f * tot - on) / (1 - f))
        out.append(_Room("tenant-spot-share", ("tenant-spot-share", t), f"its tenant {t} has room for "
                         f"{amount(room, 'more work units')} on spot under its max spot fraction {f:g} "
                         f"({on:g} of its {tot:g} on spot in this plan)", lambda more: spot_share_ok(on + more, tot + more, f),
                         lambda v, vs: work_units(v) * min((_spot_items(v, o, ledger, fits) for o in vs), default=0),
                         tenant=t, by_ways=True, exact=False))
    return out


def _new_instance_rooms(d: Demand, ways: list[Option], problem: Problem, ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> list[_Room]:
    """For d whose every open way buys new instances, the rooms they take: a reservation's count (every way in it), a
    cloud account quota (every way counted by it), a pool's max_instances (every way in one pool), the fleet's budget,
    the fleet's spot share (every way on spot). Jobs may share a new instance, so what a job needs is a bound: its items
    on new instances (`_new_items`) at the lowest price per GPU (vCPU of CPU work), as a part of the largest instance,
    of its quota units, or in spot units, of its ways."""
    offer = _offers_by_key(ledger)

    def bought(v: Demand, vs: list[Option]) -> list[tuple[Capacity, float]]:
        return _new_shares(v, vs, ledger, fits)

    def counted(units: Callable[[Capacity], float]) -> Callable[[Demand, list[Option]], float]:
        """A job's need of a room its ways' new instances take `units(offer)` each of: the least of its ways, as a part of
        the instance; 0 (it does not wait for the room) where a way of it takes none."""
        def need(v: Demand, vs: list[Option]) -> float:
            per_way = [(units(c), share) for c, share in bought(v, vs)]
            return min(u * share for u, share in per_way) if per_way and all(u > 0 for u, _ in per_way) else 0.0
        return need

    out: list[_Room] = []
    names = {offer[o.offer].reservation for o in ways}
    if len(names) == 1 and (name := names.pop()) and (r := problem.reservations.get(name)) is not None:
        have = ledger.reserved(name)
        out.append(_Room("reservation", ("reservation", name), _reservation_text(r, have), lambda more: within(have + more, r.count),
                         counted(lambda c: 1.0 if c.reservation == name else 0.0), by_ways=True, exact=False))
    out += _cloud_quota_rooms(ways, ledger, counted)
    if problem.budget is not None:
        cost, budget = ledger.cost(), problem.budget
        out.append(_Room("fleet-budget", ("fleet-budget",), f"the fleet has room for {money(max(0.0, budget - cost))}/h more under "
                         f"max_hourly_budget ({money(cost)}/h of {money(budget)}/h in this plan)",
                         lambda more: budget_ok(ledger.spend() + micro(more), budget),
                         lambda v, vs: min((share * c.price for c, share in bought(v, vs)), default=0.0), by_ways=True, exact=False))
    pools = {offer[o.offer].pool for o in ways}
    if len(pools) == 1:
        pool = pools.pop()
        hi, have = problem.pool_bounds.get(pool, (0, 0))[1], ledger.pool_count(pool)
        out.append(_Room("pool-max", ("pool-max", pool), f"pool {pool} has room for {amount(hi - have, 'more instances')} "
                         f"under max_instances ({have}/{hi} in this plan)", lambda more: within(have + more, hi),
                         counted(lambda c: 1.0 if c.pool == pool else 0.0), by_ways=True, exact=False))
    f = problem.spot.max_spot_fraction
    if f < 1 and all(offer[o.offer].market == "spot" for o in ways):
        spot, total = ledger.spot()
        room = max(0.0, (f * total - spot) / (1 - f))
        unit = DIM_UNITS[ledger.dim]
        out.append(_Room("spot-share", ("spot-share",), f"the fleet has room for {amount(room, 'more spot ' + unit)} "
                         f"under max_spot_fraction {f:g} ({spot:g} of {amount(total, unit)} spot in this plan)",
                         lambda more: spot_share_ok(spot + more, total + more, f),
                         lambda v, vs: min((_new_items(v, o, offer[o.offer], fits) * item_units(v, ledger.dim) for o in vs), default=0.0)
                         if vs and all(o.new and offer[o.offer].market == "spot" for o in vs) else 0.0, by_ways=True, exact=False))
    return out


def _cloud_quota_rooms(ways: list[Option], ledger: Ledger, counted) -> list[_Room]:
    """`_new_instance_rooms`' cloud quota rooms: each quota that counts every way, and, for ways in several regions, the
    quotas of one name (a GPU quota per region) that count them between them, as one room: their headroom summed, a
    bound no placement goes past (a job spread over two regions' A100 quotas, with room for one job in each, read that
    each of three jobs "would hold it" in one region: no room was named, no one quota counting every way)."""
    book, offer = ledger.quota_book(), _offers_by_key(ledger)
    counted_by = [{i for i, _ in book.units(offer[o.offer])} for o in ways]
    every = set.intersection(*counted_by) if ways else set()
    groups: dict[tuple, list[int]] = {}
    for i, q in enumerate(book.quotas):
        groups.setdefault((q.cloud, q.name, q.unit), []).append(i)
    rooms = [(i,) for i in sorted(every)]
    for members in groups.values():
        use = tuple(sorted((i for i in members if any(i in c for c in counted_by)), key=lambda i: book.quotas[i].region))
        if len(use) > 1 and not every.intersection(use) and all(c.intersection(use) for c in counted_by):
            rooms.append(use)
    out = []
    for use in rooms:
        quotas = [book.quotas[i] for i in use]
        taken, headroom = sum(book.taken[i] for i in use), sum(quota_headroom(book.quotas[i]) for i in use)

        def used(i: int) -> str:
            q, plan = book.quotas[i], f", and this plan's new instances take {book.taken[i]:g} more" if book.taken[i] else ""
            return f"{q.used:g} of {amount(q.limit, q.unit)} used{plan}"
        q = quotas[0]
        if len(use) == 1:
            scope, uses = quota_scope(q), used(use[0])
        else:
            scope = f"{q.cloud} {q.name} in {' and '.join(x.region or 'all regions' for x in quotas)}"
            uses = "; ".join(f"{x.region or 'all regions'}: {used(i)}" for i, x in zip(use, quotas))
        have = "quota {} has room for {}" if len(use) == 1 else "quotas {} have room for {} between them"
        out.append(_Room("cloud-quota", ("cloud-quota", use), f"cloud {have.format(scope, amount(headroom - taken, 'more ' + q.unit))} ({uses})", lambda more, taken=taken, headroom=headroom: within(taken + more, headroom),
                         counted(lambda c, use=use: sum(n for i, n in book.units(c) if i in use)), by_ways=True, exact=False,
                         waits="wait for it" if len(use) == 1 else "wait for them"))
    return out


def _new_items(v: Demand, o: Option, c: Capacity, fits: Callable[[Demand, Capacity], int]) -> int:
    """Items of one job of v that way o puts on its new instances of offer c, at least: o.new of them are needed, so
    all but the last hold `fits` items each (the rest of the job may be in room left on the plan's instances)."""
    return min(v.replicas, (o.new - 1) * fits(v, c) + 1)


def _charge_at_least(v: Demand, o: Option, ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> float:
    """What way o charges v's tenant for one job of v, at least: its items on o's new instances (`_new_items`), or in
    the room it takes on the plan's instances, at the cheapest of them."""
    if o.new:
        c = _offers_by_key(ledger)[o.offer]
        return _new_items(v, o, c, fits) * charge(v, c)
    return v.replicas * min(charge(v, ledger.instances[refs[0]]) for refs, _ in o.rooms)


def _spot_items(v: Demand, o: Option, ledger: Ledger, fits: Callable[[Demand, Capacity], int]) -> int:
    """Items of one job of v that way o puts on spot, at least: on a spot offer's new instances (`_new_items`), or all of
    them in room on spot instances only."""
    if o.new:
        c = _offers_by_key(ledger)[o.offer]
        return _new_items(v, o, c, fits) if c.market == "spot" else 0
    return v.replicas if all(ledger.instances[refs[0]].market == "spot" for refs, _ in o.rooms) else 0


def _offers_by_key(ledger: Ledger) -> dict[str, Capacity]:
    return ledger.once("offers by key", lambda: {c.key: c for c in ledger.problem.offers()})


def never_keeps(d: Demand, problem: Problem, ledger: Ledger) -> list[str]:
    """Under PlacementPolicy preemption: Never, its tenant's running jobs of a lower class than d's that this plan keeps:
    under LowerPriority d's class could take their place (rules.may_preempt), under Never none is stopped for it."""
    if problem.placement.preemption != "Never":
        return []
    return sorted(j for o in problem.demands if o.tenant == d.tenant and o.klass < d.klass
                  for j, _ in o.running if j in ledger.job_demand)


def _never_keeps(d: Demand, problem: Problem, ledger: Ledger, kinds: set[str]) -> str:
    """Where its tenant's quota or a limit all tenants share binds for a pending job, under preemption: Never: its
    tenant's lower-class running jobs that hold what it needs (for the quota: at least the shortfall in the quota's
    dimension; for a shared limit: its kind of capacity), named. (A critical job at its tenant's 4-GPU quota beside four
    running low jobs on a full fixed pool said only "quota exhausted ...; pools at max_instances"; under LowerPriority
    it took a low job's place.)"""
    quota, shared = "quota" in kinds, bool(_SHARED & kinds)
    if not (quota or shared):
        return ""
    names = never_keeps(d, problem, ledger)
    if not names:
        return ""
    kind = capacity_kind(d)
    held = [j for j in names if any(d.req(k) and ledger.job_demand[j].req(k) for k in DIMS)
            and (not shared or capacity_kind(ledger.job_demand[j]) == kind)]
    if quota:
        short = ledger.quota_short(d)
        if short is None:
            return ""
        dim, used, need, limit = short
        if not quota_ok(0.0, need, limit):  # the job alone exceeds the quota: no stop makes room
            return ""
        if sum(ledger.job_demand[j].req(dim) * ledger.job_demand[j].replicas for j in held) + 1e-9 < used + need - limit:
            return ""
    if not held:
        return ""
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return (f" (preemption: Never keeps its tenant's lower-priority running jobs running, and they hold what it needs: "
            f"{', '.join(held[:3])}{more})")


def _staying(d: Demand, problem: Problem, ledger: Ledger, job: str, fits: Callable[[Demand, Capacity], int]) -> list[Option]:
    """For an evicted job: staying where it runs, on its instances that this plan deletes, as one way of placing it with
    the rules that refuse keeping them (pool size, fleet budget, spot share and diversity, its tenant's budget and spot
    share: as for new instances of their offers); [] where that is not the question (an instance the plan keeps, one
    that must go or no longer holds it) or no rule refuses it."""
    ids = next((ids for j, ids in d.running if j == job), ())
    hosts = {c.instance_id: c for c in problem.capacities if isinstance(c, Host) and c.instance_id in ids}
    if not ids or set(ids) != set(hosts) or any(i in ledger.instances for i in ids) \
            or any(h.keep_blocker is not None or fits(d, h) <= 0 for h in hosts.values()):
        return []
    by_offer: dict[str, list[Host]] = {}
    for h in hosts.values():
        by_offer.setdefault(h.offer_key, []).append(h)
    refusals = [r for hs in by_offer.values() for r in ledger.new_refusals(hs[0], len(hs))]
    refusals += ledger.tenant_refusals(d, [hosts[i] for i in ids])
    if not refusals:
        return []
    return [Option(f"staying on {', '.join(sorted(hosts))}", 0.0, tuple(refusals))]


# ledger -> (what running jobs leave on each host, a set of each room kind's instances by id of its list)
_VACATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _with_vacated(d: Demand, problem: Problem, ledger: Ledger, options: list[Option]) -> list[Option]:
    """Options in room left on the plan's instances that hold the job only in room its running jobs of its class or
    above (any class under preemption: Never) leave in this plan, with a refusal saying so ("vacated"): such a job does
    not move for this one (the moves tier), so the room is there only for the rule that moves it. Without it, a job
    pending for its tenant's spot share, whose room on a spot host a running job of its tenant left for that share, was
    said to be held by the share alone; lifted, the running job stayed and the room was gone (fleet43)."""
    memo = _VACATED.get(ledger)
    if memo is None:
        memo = _VACATED[ledger] = (_vacated(problem, ledger), {})
    left, sets = memo
    if not left:
        return options
    never = problem.placement.preemption == "Never"
    out = []
    for o in options:
        if o.rooms and o.refusals:  # (open room is open: the plan's own answer left it so)
            lost, who = 0, []
            # (a set per room kind, once a plan: the applied 5k fleet's idle instances are a few kinds of thousands)
            rooms = [(sets.get(id(refs)) or sets.setdefault(id(refs), set(refs)), k) for refs, k in o.rooms]
            for ref, gone in left.items():
                mine = [(v, job, n) for v, job, n in gone if never or v.klass >= d.klass]
                k = next((k for refs, k in rooms if ref in refs), 0) if mine else 0
                if not k:
                    continue
                free = ledger.free(ref)
                without = {dim: free.get(dim, 0.0) - sum(v.req(dim) * n for v, _, n in mine) for dim in d.dims}
                lost += k - max(0, min((math.floor(without[dim] / d.req(dim) + 1e-9) for dim in d.dims if d.req(dim) > 0), default=k))
                who += [(ref, job) for _, job, _ in mine]
            if lost and sum(k * len(refs) for refs, k in o.rooms) - lost < d.replicas:
                ref, job = who[0]
                o = replace(o, refusals=(*o.refusals, Refusal("vacated", f"the room it would take on {ref} is running {job}'s, which "
                                                                          "leaves it in this plan (a running job does not move for work of "
                                                                          "its class or below)")))
        out.append(o)
    return out


def _vacated(problem: Problem, ledger: Ledger) -> dict[str, list[tuple[Demand, str, int]]]:
    """Existing host -> the running jobs (as they run, the job, its items there) that leave it in this plan."""
    placed = {ref: {job for _, job in items} for ref, items in ledger.items.items()}
    out: dict[str, list[tuple[Demand, str, int]]] = {}
    for v in problem.demands:
        for job, ids in v.running:
            for ref in sorted(set(ids)):
                if ref in placed and job not in placed[ref]:
                    out.setdefault(ref, []).append((v.as_it_runs(job), job, ids.count(ref) // v.bundle))
    return out


def _stopped_beside(d: Demand, problem: Problem, ledger: Ledger) -> list[str]:
    """The running jobs of d's tenant that this plan stops, of d's class or above (any class under preemption: Never):
    the swaps tier (objective.swaps_tier) holds the tenant's new work of their class or below at none where they
    stop, so a job the rules would hold waits for the next plan rather than "the solver did not find" it (fleet47)."""
    never = problem.placement.preemption == "Never"
    return sorted(job for o in problem.demands if o.tenant == d.tenant and (never or o.klass >= d.klass)
                  for job, _ in o.running if job not in ledger.job_demand)


def _bought(ledger: Ledger, c: Capacity) -> list[str]:
    """The plan's new instances of offer c."""
    return sorted(ref for ref, x in ledger.instances.items() if not isinstance(x, Host) and x.key == c.key)


def _sized_out(o: Option, problem: Problem, ledger: Ledger) -> Capacity | None:
    """The offer an option buys new instances of, if the plan already has as many as the problem offers: an
    offer is sized to the work that fits it (capacity.size_offers), and the plan may use them for something else."""
    c = next((c for c in problem.offers() if o.offer and c.key == o.offer), None)
    return c if c is not None and len(_bought(ledger, c)) + o.new > c.max_new else None


def _offer_size_text(o: Option, c: Capacity, problem: Problem, ledger: Ledger, shared: str = "") -> str:
    """The rules allow the option, the offer's size does not: say what the plan does with the instances it has.
    `shared`: the room the job's pending peers share (`_room_shared`), which the option holds it in alone."""
    _, prim = spot_measure(problem.capacities, problem.gpu_fleet)
    spot, _ = ledger.spot()
    pct = problem.spot.on_demand_buffer_percent
    uses = []
    for ref in _bought(ledger, c):
        jobs = sorted({job for _, job in ledger.items.get(ref, ())})
        if jobs:
            uses.append(f"{ref} runs {', '.join(jobs[:3])}" + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else ""))
        elif c.market != "spot" and not buffer_ok(ledger.idle_on_demand() - prim(c), spot, pct):
            uses.append(f"{ref} stands idle for the on-demand buffer ({pct:g}% of the spot {'GPUs' if ledger.dim == 'gpus' else 'vCPU'})")
        else:
            uses.append(f"{ref} stands idle")
    return (f"not placed by this plan: {shared + '; ' if shared else ''}{o.label} would hold it{' alone' if shared else ''} under every "
            f"pool, budget, quota and spot rule ({_price_text(o, ledger)}), "
            f"but the planner offers at most {c.max_new} new {c.instance_type} {c.market} there (an offer is sized to the work "
            f"that fits it) and this plan's {'; '.join(uses)}")


def _stuck_reason(problem: Problem) -> str:
    """A running gang under WhenEmpty may stay or stop, never move (problem.stuck_gangs): no other placement was
    open to it, so what stopped it is what the fleet as it runs breaks, which this plan had to mend."""
    broken = running_ledger(problem).broken_rules()
    why = ("; ".join(broken[k] for k in sorted(broken)) + ", so the plan gives up running work") if broken else \
        "its capacity goes to work that ranks above it in this plan (the tiers in README, How it decides)"
    return f"{STUCK_GANG} stays where it runs or stops, never moves, and it cannot stay: {why}"


# Rules over capacity all tenants share: only there does higher-priority work take it first.
_SHARED = {"reservation", "cloud-quota", "pool-max", "fleet-budget", "spot-share", "spot-buffer", "spot-diversity"}
# (of them, those the work on the instances a job could use takes: a pool's count, a reservation's; and "full", the
# instances that could hold it full. A budget or a spot share is taken by work anywhere.)
_LOCAL = {"reservation", "pool-max", "full"}


_RULE_NAMES = {"quota": "its tenant's quota", "reservation": "a reservation's count", "cloud-quota": "a cloud account quota", "license": "a license's count", "license-quota": "its tenant's license quota", "pool-max": "max_instances", "fleet-budget": "max_hourly_budget", "tenant-budget": "its tenant's budget",
               "spot-share": "max_spot_fraction", "tenant-spot-share": "its tenant's max spot fraction",
               "spot-buffer": "the on-demand buffer", "spot-diversity": "spot diversity", "vacated": "room a running job leaves in this plan"}


# ledger -> (each tenant's running use before the plan, the hosts each tenant ran on, the jobs the plan places anew by
# capacity kind and tenant with the instances it places them on)
_RECLAIM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _reclaimed(d: Demand, problem: Problem, ledger: Ledger) -> str:
    """For an evicted job whose tenant ran above its guarantee before this plan (it borrowed: rules.borrowing_tenants),
    in a dimension the job uses: that, and the other tenants' jobs this plan places anew, on its kind of capacity and on
    instances its tenant ran on, while their tenants stay within their own guarantees there: the work the borrowed room
    goes back to (Kueue's "reclaimed while borrowing"). "" where any of that is not so. (Reclaimed by tenant a's
    guaranteed jobs on a full fixed pool, tenant b's evicted jobs said only "pools at max_instances (onprem 2/2)": a
    same-priority job of another tenant taking a running one's place, with nothing to say why.)"""
    rules = problem.tenants.get(d.tenant)
    if rules is None:
        return ""
    memo = _RECLAIM.get(ledger)
    if memo is None:
        ran_on: dict[str, set[str]] = {}
        for v in problem.demands:
            for _, ids in v.running:
                ran_on.setdefault(v.tenant, set()).update(ids)
        on: dict[str, set[str]] = {}
        for ref, items in ledger.items.items():
            for _, j in items:
                on.setdefault(j, set()).add(ref)
        placed: dict[tuple, list[tuple[str, set[str]]]] = {}
        for j, o in ledger.job_demand.items():
            if not any(j == r for r, _ in o.running):
                placed.setdefault((capacity_kind(o), o.tenant), []).append((j, on.get(j, set())))
        memo = _RECLAIM[ledger] = (running_use(problem.demands), ran_on, placed, {})
    before, ran_on, placed, said = memo
    key = (d.tenant, capacity_kind(d), tuple(bool(d.req(dim)) for dim in DIMS))
    if key not in said:  # (alike for every evicted job of a tenant, kind and dimensions: a plan may evict hundreds)
        said[key] = _reclaim_text(d, rules, problem, ledger, before, ran_on.get(d.tenant, set()), placed)
    return said[key]


def _reclaim_text(d: Demand, rules: TenantRules, problem: Problem, ledger: Ledger, before: dict, mine: set[str], placed: dict) -> str:
    """`_reclaimed`'s clause for d, from the plan's memo (`_RECLAIM`): mine, the hosts d's tenant ran on."""
    for dim in DIMS:
        g = rules.guarantee.get(dim)
        ran = before.get(d.tenant, {}).get(dim, 0.0)
        if not d.req(dim) or g is None or quota_ok(ran, 0.0, g):
            continue
        takers = sorted(j for (kind, t), jobs in placed.items() if kind == capacity_kind(d) and t != d.tenant
                        and _within_guarantee(t, dim, problem, ledger)
                        for j, refs in jobs if refs & mine and ledger.job_demand[j].req(dim))
        if not takers:
            return ""
        more = f" and {len(takers) - 3} more" if len(takers) > 3 else ""
        return (f" (tenant {d.tenant} ran {amount(ran, DIM_UNITS[dim])}, above its guaranteed {g:g}: {RECLAIMED} "
                f"other tenants' work within their guarantees: {', '.join(takers[:3])}{more})")
    return ""


def _within_guarantee(t: str, dim: str, problem: Problem, ledger: Ledger) -> bool:
    """Whether tenant t's placed work in this plan stays within its guarantee in `dim` (a dimension it guarantees
    nothing in is no borrowing there): work another tenant's borrowing never takes."""
    g = problem.tenants.get(t)
    return g is not None and (g.guarantee.get(dim) is None or quota_ok(ledger.tenant_use(t)[dim], 0.0, g.guarantee[dim]))


def _guaranteed_first(d: Demand, problem: Problem, ledger: Ledger, evicted: bool) -> str:
    """For a pending job whose tenant is at its guarantee in a dimension the job uses (placed within its tenant's
    ceiling, the job would borrow), where shared capacity binds: that, and the other tenants' jobs within their
    guarantees that hold its kind of capacity. (After a reclaim's apply, tenant b's waiting jobs said only "pools at max_instances (onprem 2/2)", beside
    tenant a's jobs of the same priority on what b ran on.) "" for an evicted job (`_reclaimed` says it) or where no
    such job holds the capacity (then the borrowed room goes by the fair share, or to higher classes: `_outranked`)."""
    rules = problem.tenants.get(d.tenant)
    if evicted or rules is None:
        return ""
    use = ledger.tenant_use(d.tenant)
    if not all(quota_ok(use[k], d.req(k), cap) for k, cap in rules.cap.items()):
        return ""  # its tenant's ceiling refuses it: no burst to borrow with (the quota's reason says so)
    for dim in DIMS:
        g = rules.guarantee.get(dim)
        if not d.req(dim) or g is None or quota_ok(use[dim], d.req(dim), g):
            continue
        holders = ledger.once(("guaranteed", capacity_kind(d), d.tenant, dim), lambda: sorted(
            j for j, o in ledger.job_demand.items() if o.tenant != d.tenant and capacity_kind(o) == capacity_kind(d)
            and o.req(dim) and _within_guarantee(o.tenant, dim, problem, ledger)))
        if not holders:
            return ""
        more = f" and {len(holders) - 3} more" if len(holders) > 3 else ""
        return (f" (tenant {d.tenant} runs {amount(use[dim], DIM_UNITS[dim])}, its guaranteed {g:g}, so this job would borrow; "
                f"borrowed room never displaces other tenants' work within their guarantees, which holds {_kind_text(d)}: "
                f"{', '.join(holders[:3])}{more})")
    return ""


def _kind_text(d: Demand) -> str:
    """The kind of capacity `capacity_kind` compares, in words: the holders it names may run anywhere in the fleet (they
    were said to hold "this capacity", after the offer a reason was about, while they ran on another cloud's)."""
    if d.mig:
        return f"{d.gpu_type} MIG devices"
    return f"{d.gpu_type} GPUs" if d.gpus else "CPU-only capacity"


def _quota_scopes(refusals) -> frozenset[str]:
    """The cloud quotas (by quota_scope) among a way's refusals."""
    return frozenset(r.limit for r in refusals if r.rule == "cloud-quota")


def _who_holds(d: Demand, problem: Problem, ledger: Ledger, evicted: bool, kinds: set[str], quotas: frozenset[str] = frozenset()) -> str:
    """What holds the shared capacity d waits for (`kinds`: the rules that bind): higher classes placed (`_outranked`:
    where d could go, where only such rules bind: `_LOCAL`; on instances the refusing cloud quotas count, `quotas`, where
    they bind), then, its tenant at its guarantee, the other tenants' guaranteed work (`_guaranteed_first`), or, a job
    that waits with no higher class there, the other tenants' running work of its class or below kept within their
    guarantees there (`_guarantees_hold`)."""
    local = kinds <= _LOCAL
    anywhere = bool(kinds - _LOCAL - {"cloud-quota"})  # a budget or a spot share: work anywhere takes it
    out = _outranked(d, ledger, local=not anywhere and bool(kinds & _LOCAL),
                     quotas=frozenset() if anywhere or "cloud-quota" not in kinds else quotas) \
        + _guaranteed_first(d, problem, ledger, evicted)
    return out or ("" if evicted or not local else _guarantees_hold(d, ledger))


def _outranked(d: Demand, ledger: Ledger, in_tenant: bool = False, local: bool = False, quotas: frozenset[str] = frozenset()) -> str:
    """Higher-class jobs of the same kind of capacity that this plan places (never pending ones); `local`: on instances
    that could hold d (named wherever placed, u's high job pinned to a full fixed pool read "capacity goes to
    higher-priority work first: crit", t's critical job on a new instance of another pool); `quotas`: or on instances
    those cloud quotas count (a high job on another cloud was named as taking the aws quota its low job waited for);
    in_tenant: its tenant's only, to whom its quota goes first (a higher class may take a lower one's place in its tenant)."""
    names = ledger.higher(d, tenant=d.tenant if in_tenant else None)
    if names and (local or quotas) and not in_tenant:
        names = ledger.once(("higher, could hold", _placement_shape(d), d.klass, local, quotas),
                             lambda: tuple(j for j in names if (local and _on_usable(d, j, ledger)) or _on_counted(j, quotas, ledger)))
    if not names:
        return ""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    what = OUTRANKED_IN_TENANT if in_tenant else OUTRANKED
    return f" ({what}: {', '.join(names[:3])}{more})"


def _placement_shape(d: Demand) -> tuple:
    """What decides where d may go (rules and size), as one key: demands alike are asked once."""
    return (d.gpus, d.gpu_type, d.mig, d.nvlink, d.cpu, d.memory_gib, d.spot, d.pools, d.regions, d.clouds, d.zones, d.bundle)


def _on_usable(d: Demand, job: str, ledger: Ledger) -> bool:
    """Whether placed job `job` holds room on an instance that could hold d (every placement rule and size)."""
    on = ledger.once("instances of jobs", lambda: _instances_of_jobs(ledger))
    return any(fit(d, ledger.instances[ref]) > 0 for ref in on.get(job, ()) if ref in ledger.instances)


def _on_counted(job: str, quotas: frozenset[str], ledger: Ledger) -> bool:
    """Whether placed job `job` runs on an instance one of these cloud quotas (by quota_scope) counts: a new one takes
    its units in this plan, a kept one in the account's use."""
    if not quotas:
        return False
    on = ledger.once("instances of jobs", lambda: _instances_of_jobs(ledger))
    scoped = [q for q in ledger.quota_book().quotas if quota_scope(q) in quotas]
    return any(quota_units(q, ledger.instances[ref]) for ref in on.get(job, ()) if ref in ledger.instances for q in scoped)


def _instances_of_jobs(ledger: Ledger) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for ref, items in ledger.items.items():
        for _, j in items:
            out.setdefault(j, set()).add(ref)
    return out


def _guarantees_hold(d: Demand, ledger: Ledger) -> str:
    """Where no higher class holds the instances that could hold d: other tenants' running work of its class or below
    kept within their guarantees on them, which no other tenant's work displaces (README, Tenants)."""
    problem = ledger.problem
    names = ledger.once(("guaranteed running, could hold", _placement_shape(d), d.tenant, d.klass), lambda: tuple(sorted(
        j for t, r in problem.tenants.items() if t != d.tenant for j in r.protected_jobs
        if j in ledger.job_demand and ledger.job_demand[j].klass <= d.klass and _on_usable(d, j, ledger))))
    if not names:
        return ""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return (f" (the instances that could hold it run other tenants' work within their guarantees, which no other tenant's "
            f"work displaces: {', '.join(names[:3])}{more})")


def why_nothing_fits(d: Demand, desired: DesiredState, observed: Observed, offers: list[Capacity], every: list | None = None) -> str:
    """The first rule, in the order a user would check them, that leaves no capacity. Each step asks the
    placement rules (problem.rules) of every instance the pools could ever run, whatever is available now
    (`every`: pool_instances(desired, observed), built once for all the demands a build asks about)."""
    if d.mig:
        what = f"{d.mig[1]}x MIG {d.mig[0]} of {d.gpu_type}"
    else:
        what = f"{d.gpus}x {d.gpu_type}" if d.gpus else f"{d.cpu:g} vCPU / {d.memory_gib:g} GiB (CPU-only)"
    every = pool_instances(desired, observed) if every is None else every

    def allowed(cands, *rules: str) -> list:
        return [(c, o) for c, o in cands if placement_refusal(d, c, rules) is None]

    typed = allowed(every, "pools", "kind")
    if not typed:
        return f"no pool offers {what}" + (" (CPU jobs do not run on GPU instances)" if not d.gpus and not d.mig else "")
    guard = desired.guardrails
    in_region = [(c, o) for c, o in allowed(typed, "regions", "clouds") if guardrail_refusal(guard, c.cloud, c.region) is None]
    if not in_region:
        where = ", ".join((d.regions or ()) + tuple(sorted(d.clouds or ()))) or ("none" if () in (d.regions, d.clouds) else "any")
        return f"no pool offers {what} in an allowed region or cloud (job allows: {where})"
    # (Any zone of the pool, offered there or not, as before the rules were asked.)
    pools = {c.pool: c for c, _ in in_region}
    if d.zones is not None and not any(placement_refusal(d, replace(c, site=replace(c.site, zone=z)), ("zones",)) is None
                                       for c in pools.values() for z in desired.pools[c.pool].spec.zones):
        return f"no pool offering {what} has a zone within the data's max_latency_ms"
    big = [(c, o) for c, o in allowed(in_region, "gpus", "nvlink") if size_fit(d, c) >= 1]
    if not big:
        per_gpu = d.gpus // d.bundle if d.gpus else 0
        nv = f", {per_gpu} GPUs in one NVLink domain" if d.nvlink else ""
        return f"no instance type in an allowed pool is large enough for one {'instance-gang' if d.bundle > 1 else 'replica'} ({what}, {d.cpu:g} vCPU, {d.memory_gib:g} GiB{nv})"
    usable = allowed(big, "spot")
    if not usable:
        return {"never": "spot: never, but every matching pool is spot-only",
                "required": "spot: required, but no matching pool allows spot"}[d.spot]
    names = {c.pool for c, _ in big}
    if not any(o.pool in names for o in offers):
        # Spot offers over the price cap are left out too: say so when that, not capacity, is why (a spot-only
        # A10G pool at 0.3 was said to find 'every matching zone out of capacity': property tier).
        frac = desired.spot_policy.max_price_fraction
        short = sum(1 for c, o in usable if not o.available or (o.cloud, o.zone, o.instance_type, c.market) in observed.short)
        priced_out = sum(1 for c, o in usable if o.available and (o.cloud, o.zone, o.instance_type, c.market) not in observed.short
                         and c.market == "spot" and (o.spot_price is None or o.spot_price > frac * o.on_demand_price + 1e-9))
        if priced_out and not short:
            return f"spot: every matching spot price is over max_price_fraction {frac:g} of on-demand, and the job cannot run on on-demand there"
        return "every matching zone is out of capacity or in cool-off after a capacity error; retry later or add zones"
    return f"no capacity matches {what} under the pool, market and spot price rules"


def pool_instances(desired: DesiredState, observed: Observed) -> list[tuple[Capacity, object]]:
    """(instance, offering): every instance the pools could run: each offering its provider reports for a pool, in each market
    the pool allows, as the Capacity the rules read (available, priced or not)."""
    out = []
    for po in observed.offerings:
        p, o = desired.pools[po.pool], po.offering
        for market in p.spec.markets():
            out.append((Offer(key="", site=Site(p.name, "", p.spec.cloud, p.spec.region, o.zone, o.instance_type, market), gpus=o.gpus, gpu_type=o.gpu_type, cpu=o.cpu,
                                 memory_gib=o.memory_gib, price=0.0, on_demand_price=o.on_demand_price,
                                 nvlink_domain=getattr(o, "nvlink_domain", 1), mig=tuple(p.spec.mig) if p.spec.mig else None), o))
    return out
