"""The objective: a sequence of tiers, each maximised (or minimised) and then held while the next
is solved (strategy.py), and the cost last.

Tiers, in order: protected guarantees; per priority class, running work then all work inside
the tenants' guarantees (deadline work first within its class); the fair share of borrowed
capacity (weighted DRF); per class, borrowed work; the cheapest victims. Cost: $/hour of
instances, data egress and latency, plus the amortised cost of every move, in milli-dollars.
Each tier is an expression with a bound (its best value possible), exchangeable as CP-SAT's
objective: the strategy sets one at a time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconciler.deadlines import tier_terms as deadline_tier_terms
from reconciler.ledger import MILLI, borrow_room, fair_share_level, licensed_by, milli_down, rules_broken_now, share_capacity, stand_in_item_units, stand_in_units
from reconciler.problem import Demand, pools_over_max, settled_jobs
from reconciler.problem.types import GUARANTEES_TIER, RUNNING_GUARANTEES_TIER
from reconciler.solve.fleet_rules import pool_units
from reconciler.solve.tenants import ceiling_rows
from reconciler.solve.variables import Values, constant, is_variable, is_zero, scale, units, wsum

if TYPE_CHECKING:
    from reconciler.solve.model import Model

SEGMENTS = 20  # steps of the concave fair-share utility
CLASS_NAMES = ("low", "normal", "high", "critical")


@dataclass
class Tier:
    name: str
    expr: object
    sense: str  # max | min
    bound: float  # best possible value (max: upper bound; min: lower bound)
    # Held only while the tiers after it are solved, then let go: an order on what the work tiers may use, not a
    # goal of the plan (moves_tier); the cost stage and the comparisons with greedy do not see it.
    released: bool = False
    swaps: bool = False  # a swaps tier (swaps_tier): `strategy.place_more`'s probe lets it go, and the tiers after it
    klass: int | None = None  # a swaps tier's class
    work: tuple[str, int] | None = None  # a work tier's part ("guaranteed" or "borrowed") and class (not a deadline tier)


def tiers(model: Model) -> list[Tier]:
    p = model.p
    classes = sorted({d.klass for d in p.demands}, reverse=True)
    out: list[Tier] = []
    out += guarantees_tiers(model)
    # Inside guarantees, by class: what runs first (no same-class preemption), then all.
    # A class's running jobs are moved only for work of a higher class (moves_tier), as only a higher class may evict.
    limit = model.licensed
    if p.placement.preemption == "Never":
        for c in classes:
            out += running_tiers(model, c, model.krg, "guaranteed")
        for c in classes:
            out += moves_tier(model, c, limit)
            out += swaps_tier(model, c, limit)
        for c in classes:
            out += work_tiers(model, c, model.g, "guaranteed")
    else:
        for c in classes:
            out += running_tiers(model, c, model.krg, "guaranteed")
            out += moves_tier(model, c, limit)
            out += swaps_tier(model, c, limit)
            out += work_tiers(model, c, model.g, "guaranteed")
    # Borrowed capacity: weighted dominant-resource fair share first, then by class.
    fair = fair_share_tier(model)
    if fair is not None:
        out.append(fair)
    for c in classes:
        out += running_tiers(model, c, model.krb, "borrowed")
        out += work_tiers(model, c, model.b, "borrowed")
    victims = victims_tier(model)
    if victims is not None:
        out.append(victims)
    return out


def guarantees_tiers(model: Model) -> list[Tier]:
    """Guarantees are never taken by another tenant: each keeps the guaranteed work it runs.

    First its protected units (`protected_tier`). Then, as the next tier, the same count with its running
    jobs that must move (TenantRules.moving_jobs: their instance must go or no longer allows them, or a gang
    runs split) counted as its own units, kept when they run anywhere, and no longer as new work that may
    stand in for a lower protected job. In the first tier such a job must be new work: counted as a
    protected unit there, a tier summed over tenants traded another tenant's protected job for a larger
    gang that must move (fleet15). But as new work alone it stood in for its tenant's protected job while
    another tenant's work took that job's room, whether or not it needed that room (fleet22: t1's normal
    j6 left its spot instance, t1's protected low j5 was evicted, t2's j12 took the room). The second tier
    tells the two apart: a tenant's running work kept whole counts once, moved or not, so evicting j5 loses
    a unit there, while a gang that must move into its own tenant's low job's room keeps more units than
    that job (a higher class of its tenant may take a lower job's place: the README).

    Where a tenant's spot share is broken now (`spot_shares_broken`), the share may take its running work, so the
    first tier counts only the other tenants' units: summed with theirs, its spot job tied with another tenant's
    guaranteed job whose room its on-demand work could take to hold the share, and the tiers below chose that
    (fleet37). The next tier counts every tenant's; only its spot work left out of the first, its low jobs outweighed
    its normal spot job that had to move onto their room (fleet39)."""
    shares = spot_shares_broken(model)
    first = protected_tier(model, GUARANTEES_TIER, lambda r: r.protected_jobs, shares)
    whole = protected_tier(model, f"{GUARANTEES_TIER}, with tenants over their spot share", lambda r: r.protected_jobs) if shares else None
    second = None
    if any(r.moving_jobs for r in model.p.tenants.values()):
        second = protected_tier(model, RUNNING_GUARANTEES_TIER, lambda r: r.protected_jobs + r.moving_jobs)
    return [t for t in (first, whole, second) if t is not None]


def protected_tier(model: Model, name: str, units_of, skip: set[str] = frozenset()) -> Tier | None:
    """The units of each tenant's running jobs `units_of(rules)` (protected: TenantRules.protected_jobs), but those
    of the tenants in `skip`.

    A tenant's protected units of class c are kept by its running jobs of class c kept inside the
    guarantee, or replaced by its new guaranteed work of a higher class (the README lets a tenant's
    higher class take its lower jobs' place); never by pending work of the same class (counting any
    placed guaranteed work let such a job stand in for a running one while another tenant's higher
    class took its capacity: property tier). The tier is the most units such a matching covers, one
    count per unit: by Hall's theorem (each kept job serves its own class, new work of class k every
    class below k: intervals), at most total - units(a..b) + kept(a..b) + new work above a, for
    every interval a..b of the tenant's protected classes. (Kept is what its demands holding protected jobs
    keep of their protected jobs, per demand (`protected_kept`): a cap per class made the warm start's
    completion search, 0.5 deterministic s and 3x the wall time of a 1k-job warm plan; uncapped, a kept
    identical job stood in for a protected one, stopped to delete its host: fleet117. A count per class counted a low unit once
    per class above it, so CP-SAT kept a tenant's normal job against another's high one; and a count
    of classes <= c did not let a new normal job stand in for a low one beside a running normal job:
    both found by the property tier.)"""
    p, m = model.p, model.m
    prot = []
    bound = 0
    stand_ins = p.placement.preemption != "Never"
    for t, r in p.tenants.items():
        # (a tenant with no quota at all is unlimited: all it runs is guaranteed; a set, not a scan per job at 10k)
        protected_jobs = set(units_of(r))
        if not protected_jobs or t in skip:
            continue
        mine = [d for d in p.demands if d.tenant == t]
        units: dict[int, int] = {}
        for d in mine:
            n = d.job_size * sum(j in protected_jobs for j, _ in d.running)
            if n:
                units[d.klass] = units.get(d.klass, 0) + n
        if not units:
            continue
        total = sum(units.values())
        levels = sorted(units)
        # (only demands with protected jobs keep protected units: a gang that must move whole, kept by moving,
        # stood in for the tenant's protected job of its class, which another job's work then took: property tier)
        holds = {d.key for d in mine if any(j in protected_jobs for j, _ in d.running)}
        kept = {c: [(d.job_size, protected_kept(model, d, protected_jobs)) for d in mine if d.klass == c and d.key in model.krg and d.key in holds]
                for c in levels}
        pt = m.new_int_var(0, total, f"{name}[{t}]")
        room = stand_in_room(model, t, mine, holds, levels[0]) if stand_ins and p.stand_in_rooms else None
        for i, a in enumerate(levels):
            # (its new work above a, one variable: rows of every demand per interval made a 1k-job warm plan slower)
            # (running jobs that are not protected, e.g. a gang that must move whole, need capacity anew: new work)
            # (under preemption: Never no class takes another's place, so nothing stands in for a protected job: its
            # tenant's new normal job counted for its evicted low one, fleet27)
            terms = []
            if stand_ins:
                lower = [q for q in mine if q.key in holds and q.klass >= a]
                terms = [(stand_in_units(d, lower), model.g[d.key]) for d in mine if d.klass > a]
                terms += [(-stand_in_units(d, lower), model.krg[d.key]) for d in mine if d.klass > a and d.key in model.krg and d.key in holds]
            new_above = m.new_int_var(0, total, f"{name}: new[{t},{a}]")
            if terms:
                m.add(new_above <= wsum(terms))
                if room is not None:
                    m.add(new_above <= room)
            else:
                m.add(new_above == 0)
            for b in levels[i:]:
                span = [c for c in levels if a <= c <= b]
                m.add(pt <= total - sum(units[c] for c in span) + wsum([x for c in span for x in kept[c]]) + new_above)
        prot.append(pt)
        bound += total
    return Tier(name, sum(prot), "max", bound) if prot else None


def protected_kept(model: Model, d: Demand, protected_jobs: set[str]):
    """Of demand d's running jobs, the protected ones (`protected_jobs`) the answer keeps: its running jobs kept in the
    guaranteed part (krg), but no more than those staying on a host they run on, one per job there (each host's stay
    goes to its protected jobs first: plan.assign.choose_jobs), plus the kept ones that move (those go to its
    protected jobs first too). A class of identical jobs counted as one (krg alone), a kept unprotected job stood in
    for a protected one stopped elsewhere: CP-SAT stopped t1's guaranteed j0 to delete its instance and kept its
    identical j2, claiming the tier at its bound (fleet117). Rows only where d runs unprotected jobs beside protected
    ones; one variable per host where both run. Made once per demand and set."""
    kg = model.krg[d.key]
    if d.gang or not any(j not in protected_jobs for j, _ in d.running):
        return kg  # (one job, or every running job protected: any kept running job is a protected one)
    memo = model.protected_kept
    key = (d.key, frozenset(j for j, _ in d.running if j in protected_jobs))
    if key in memo:
        return memo[key]
    m = model.m
    mine, others = {}, {}  # host key -> items of d's protected jobs there, of its other running jobs
    for h, _ in model.stay_of.get(d.key, []):
        for dk, job, n in h.residents:
            if dk == d.key:
                side = mine if job in protected_jobs else others
                side[h.key] = side.get(h.key, 0) + n
    # (a stay beyond a host's protected jobs keeps an unprotected one: it counts against the kept running jobs)
    spent = []
    for h, v in model.stay_of.get(d.key, []):
        if h.key not in others:
            continue
        if h.key not in mine:
            spent.append((1, v))
        elif not is_variable(v):
            spent.append((1, max(0, v - mine[h.key])))
        else:
            e = m.new_int_var(0, others[h.key], f"unprotected stay[{d.key},{h.key}]")
            m.add(e >= v - mine[h.key])
            spent.append((1, e))
    total = sum(mine.values())
    pk = m.new_int_var(0, total, f"protected kept[{d.key}]")
    m.add(pk <= kg)
    m.add(pk <= wsum([(1, model.krj[d.key])] + [(-c, v) for c, v in spent]))
    memo[key] = pk
    return pk


def stand_in_room(model: Model, t: str, mine: list[Demand], holds: set[str], lowest: int):
    """The most units of tenant t's new higher-class work that may stand in for its lost protected ones
    (`protected_tier`): only what takes their room, or any where its guarantee is full without them (plancheck's
    rule, plancheck.own_higher_class_room). Per host where t's work holding protected jobs runs, the least of the
    units of that work leaving it and of the units placed there by groups with t's work above its lowest protected
    class (a group may mix tenants: extract.split_groups gives such a host's items to the tenant whose lower work
    leaves it first: Model.stand_in_shares); plus, where t's guaranteed part could not hold its smallest protected job beside what it
    places, any. (Counted wherever the work landed, t's critical job on a new instance stood in for its normal job
    whose room another tenant's job took: the plan evicted it, tests/test_rules.py.) Made once per tenant."""
    memo = model.stand_in_rooms
    if t in memo:
        return memo[t]
    m, p = model.m, model.p
    total = sum(d.job_size * len(d.jobs) for d in mine)
    higher = [d for d in mine if d.klass > lowest and d.key in model.group_of]
    if not any(settled_jobs(d) < len(d.jobs) for d in higher):
        memo[t] = 0  # (no new work above its lowest protected class: nothing of it stands in, wherever it lands)
        return 0
    groups = sorted({model.group_of[d.key] for d in higher})
    # (t's share of a group's items per host, `share`, at most the items of t's higher work in it that do not stay
    # where they run: a group may hold other tenants' work, and t's running jobs stay. Counted per group alone, one
    # item of t's stood in for two rooms, and t's running high job's group, its item kept, counted another tenant's
    # new item in t's lost room: bench's kept fixed cluster)
    own = {gk: [d for d in higher if model.group_of[d.key] == gk] for gk in groups}
    share: dict[str, list] = {gk: [] for gk in groups}
    lower = [q for q in mine if q.key in holds]
    parts = []
    hosts_of = model.__dict__.get("_hosts_of_tenant")
    if hosts_of is None:  # (tenant -> the hosts its work runs on that the model may change: built once, not per tenant)
        hosts_of = model.__dict__["_hosts_of_tenant"] = {}
        for h in model.hosts:
            if not h.frozen:
                for tenant in {model.demands[dk].tenant for dk, _, _ in h.residents if dk in model.demands}:
                    hosts_of.setdefault(tenant, []).append(h)
    stopped = _stopped_items(model, hosts_of.get(t, ()), holds)
    for h in hosts_of.get(t, ()):
        lost = [(model.demands[dk].size, v) for (dk, hk), v in stopped.items() if hk == h.key]
        if not lost:
            continue
        here = _stand_in_shares(model, t, groups, h.key, own, lower, share)
        if not here:
            continue
        s = m.new_int_var(0, total, f"stand-in room[{t},{h.key}]")
        m.add(s <= wsum(lost))
        m.add(s <= wsum(here))
        parts.append(s)
    parts += _bought_again_rooms(model, t, hosts_of.get(t, ()), holds, groups, own, lower, share, total, stopped)
    for gk, ys in share.items():
        if ys:
            anew = [(d.replicas, model.placed[d.key]) for d in own[gk]] + [(-1, v) for d in own[gk] for _, v in model.stay_of.get(d.key, [])]
            m.add(wsum([(1, y) for y in ys]) <= wsum(anew))
            # (nor the items of its running jobs kept as they run and moved for no rule: such a job is no new work, as
            # plancheck's _arriving reads it; only those a rule moves, `forced`. Counted, t2's running high job moved
            # into its low job's room was the room its new high job, placed on a new instance, stood in for, and t1's
            # guaranteed job was stopped for that new job: fleet109)
            fresh = [(d.replicas, model.placed[d.key]) for d in own[gk]] + [(-d.replicas, model.krs[d.key]) for d in own[gk] if d.key in model.krs]
            m.add(wsum([(1, y) for y in ys]) <= wsum(fresh) + sum(model.forced.get(d.key, 0) for d in own[gk]))
    rules = p.tenants.get(t)
    protected = set(rules.protected_jobs) if rules is not None else set()
    small = [d for d in mine if d.key in holds and any(j in protected for j, _ in d.running)]
    full = []
    for coefs, most in (ceiling_rows(mine, rules.guarantee) if rules is not None and small else []):
        least = min((coefs[d.key] for d in small if coefs.get(d.key)), default=None)
        if least is None:
            continue  # (no protected job asks for this dimension: none would borrow in it)
        f = m.new_bool_var(f"guarantee full[{t}]")
        # (what it places above its lowest protected class, and of the rest only the running jobs kept: its new work of
        # that class or below ranks below a protected job and would give way; as plancheck counts it)
        held = [(c, model.placed[k] if model.demands[k].klass > lowest else model.krj.get(k, 0)) for k, c in coefs.items()]
        m.add(wsum(held) >= most - least + 1).only_enforce_if(f)
        # (the units of its protected jobs that ask for the dimension: only they would borrow in it; counted as
        # `total`, t's GPUs over their guarantee let its CPU job's room go to another tenant's work)
        full.append((sum(d.job_size * sum(j in protected for j, _ in d.running) for d in small if coefs.get(d.key)), f))
    room = wsum([(1, v) for v in parts] + full)
    memo[t] = room
    return room


def _stopped_items(model: Model, hosts, holds: set[str]) -> dict[tuple[str, str], object]:
    """(demand, host) -> items of its running jobs on the host that stop (neither stay nor move): at most those that
    leave it, and per demand at most its running items not kept. A stopped job's room is where it ran
    (stand_in_room); counted as the items leaving a host, a job moved elsewhere left a room its tenant's new work
    stood in for the job stopped on another host: t1's normal job on its low j8's A100-80GB host, j8 moved to a new
    one, for its low jobs on an instance its pool, over max_instances, gave up (fleet136: 126 claimed, 119 kept)."""
    m = model.m
    out: dict[tuple[str, str], object] = {}
    of_demand: dict[str, list] = {}
    for h in hosts:
        here: dict[str, int] = {}
        for dk, _, n in h.residents:
            if dk in holds:
                here[dk] = here.get(dk, 0) + n
        for dk, n in sorted(here.items()):
            v = m.new_int_var(0, n, f"stopped[{dk},{h.key}]")
            m.add(v <= n - model.stay.get((dk, h.key), 0))
            out[(dk, h.key)] = v
            of_demand.setdefault(dk, []).append(v)
    for dk, vs in of_demand.items():
        d = model.demands[dk]
        m.add(wsum([(1, v) for v in vs]) <= d.running_items - model.kept_items(d))
    return out


def _stand_in_shares(model: Model, t: str, groups, ck: str, own: dict[str, list[Demand]], lower: list[Demand],
                     share: dict[str, list]) -> list:
    """`_stand_in_share` of each of t's higher groups that capacity ck can hold (its x variable not fixed at 0)."""
    out = []
    for gk in groups:
        v = model.x.get((gk, ck), 0)
        if not is_zero(v):
            out.append(_stand_in_share(model, t, gk, ck, v, own[gk], lower, share))
    return out


def _stand_in_share(model: Model, t: str, gk: str, ck: str, v, own: list[Demand], lower: list[Demand], share: dict[str, list]):
    """Of the items group gk places on capacity ck (`v`), t's higher work's share (extract.split_groups honours it), as
    (units each item stands in for, the share) for a room's sum."""
    y = model.m.new_int_var(0, sum(len(d.jobs) * d.replicas for d in own), f"stand-in share[{t},{gk},{ck}]")
    model.m.add(y <= v)
    share[gk].append(y)
    model.stand_in_shares.append((gk, ck, tuple(d.key for d in own), y))
    return max(stand_in_item_units(d, lower) for d in own), y


def _bought_again_rooms(model: Model, t: str, hosts, holds: set[str], groups: list[str], own: dict[str, list[Demand]],
                        lower: list[Demand], share: dict[str, list], total: int, stopped: dict[tuple[str, str], object]) -> list:
    """stand_in_room's room in a host's slot bought again (plancheck.slots_bought_again): a host of t's the plan deletes, in
    a pool that ends at its max_instances, leaves its room in the pool's new instances. Per pool: the least of the units
    of t's work holding protected jobs on its deleted hosts (a deleted host keeps nothing) and of t's higher items on
    its new instances (shares counted with the hosts', so no item stands in twice). (Uncounted, the repeat search put
    t1's critical job on its high job's spot instance with an idle on-demand one for the spot share, $20.56/h, not on
    an on-demand one bought in its slot, $18.19/h, which plancheck accepts: fleet111.)"""
    m, p = model.m, model.p
    out = []
    deleted: dict[str, list] = {}
    gone_items: dict[str, list] = {}  # pool -> the items stopped on its deleted hosts (`_stopped_items`)
    like: dict[str, set[str]] = {}  # pool -> the offer and zone-class keys of those hosts
    # (not in a pool over its max_instances now: some of its instances must go, and a new one there is in no one deleted
    # host's slot. Counted, t2's new high job bought there stood in for its low job, and t1's low job, whose host went
    # for it, was stopped for another tenant's new work: fleet109. plancheck counts it, so this is the stricter count)
    over = model.__dict__.get("_pools_over_max")
    if over is None:  # (built once, not per tenant)
        over = model.__dict__["_pools_over_max"] = pools_over_max(model.hosts, p.pool_bounds)
    for h in hosts:
        units = sum(model.demands[dk].size * n for dk, _, n in h.residents if dk in holds)
        if units and h.pool in p.pool_bounds and h.pool not in over and not (isinstance(model.use[h.key], int) and model.use[h.key]):
            deleted.setdefault(h.pool, []).extend([(units, 1), (-units, model.use[h.key])])
            gone_items.setdefault(h.pool, []).extend((model.demands[dk].size, v) for (dk, hk), v in stopped.items() if hk == h.key)
            like.setdefault(h.pool, set()).update((h.offer_key, h.class_key))
    for pool, gone in sorted(deleted.items()):
        here = []
        for c in [*model.offers, *model.classes.values()]:
            # (not new instances like those hosts, the same site, or zone-free work on their zone class: the higher work
            # there has the room of keeping such a host, counted by stand_in_room's hosts. Counted, every pool of a fixed
            # cluster is at its max and every host can be bought again: 306 more shares on fleet 210's repeat search,
            # whose high work tier then ended FEASIBLE at 72,800 of its 73,500, where it is proven without them)
            if c.pool != pool or (c.key if c.key in model.classes else c.offer_key) in like[pool]:
                continue
            here += _stand_in_shares(model, t, groups, c.key, own, lower, share)
        if not here:
            continue
        at_max = m.new_bool_var(f"bought again[{t},{pool}]")
        # (rows, not enforced ones: the LP relaxation, LpMirror, reads a row's enforcement literal as true)
        m.add(wsum([(1, model.use[c.key]) for c in pool_units(model, pool)] + [(-p.pool_bounds[pool][1], at_max)]) >= 0)
        s = m.new_int_var(0, total, f"stand-in room[{t},{pool} bought again]")
        m.add(s <= wsum(gone))
        m.add(s <= wsum(gone_items[pool]))
        m.add(s <= wsum(here))
        m.add(s <= total * at_max)
        out.append(s)
    return out


def spot_shares_broken(model: Model) -> set[str]:
    """Tenants with protected jobs whose spot share the fleet breaks now, as it runs or as it can stay
    (ledger.rules_broken_now): the share may take their running work (README, Spot policy), so they count in the
    second guarantees tier, not the first (guarantees_tiers). Only where no fleet-wide rule is broken: then anyone's
    work may go, and a tenant over its share left out of the first tier lost two protected jobs where greedy's
    plan lost another tenant's one (fleet41: the pool over its max_instances, one instance left)."""
    p = model.p
    asked = [t for t, r in p.tenants.items() if r.spot_fraction is not None and r.spot_fraction < 1 and (r.protected_jobs or r.moving_jobs)]
    if not asked:
        return set()
    broken = rules_broken_now(p)
    if licensed_by(broken) is None:
        return set()  # (a fleet-wide rule broken: anyone's work may go, and the most guarantees kept decide: fleet41)
    return {t for t in asked if f"tenant-spot:{t}" in broken}


def running_tiers(model: Model, c: int, kept: Values, label: str) -> list[Tier]:
    """Running jobs of class c kept (in the guaranteed or the borrowed part: `kept`)."""
    ds = [d for d in model.p.demands if d.klass == c and d.running_jobs and not kept.is_zero(d.key)]
    if not ds:
        return []
    return [Tier(f"{label} running {CLASS_NAMES[c]} jobs kept", wsum([(d.job_size, kept[d.key]) for d in ds]), "max",
                 sum(d.job_size * min(settled_jobs(d), len(d.jobs)) for d in ds))]


def moves_tier(model: Model, c: int, limit: dict[str, int | None]) -> list[Tier]:
    """Items of running class-c jobs moved beyond those a rule moves (`moves.licensed`), at their least, held
    through the tiers after it and then released (Tier.released). It comes after the tiers of the classes above c
    and the tier keeping c's running jobs, before c's own work: a running job may move to keep itself, or to make
    room for work of a higher class (kinder than the eviction a higher class may make), never for work of its own
    class or below. Without it a work tier bought its gain with moves: an applied 1k-job fleet under a $6,000/h
    budget, whose cold plan's tiers the work limit cut short, re-planned unchanged moved 8 normal and low running
    jobs and deleted an instance to fund 15 more normal and low jobs, labelled a consolidation at $2.10/h more.
    Released before the cost stage, where a move is priced and made only where it pays (consolidation)."""
    m = model.m
    terms = []
    for dk, mv in model.moved.items():
        d = model.demands[dk]
        if d.klass != c or constant(mv) is not None or limit[dk] is None:
            continue
        if not limit[dk]:
            terms.append(mv)
            continue
        beyond = m.new_int_var(0, d.running_items, f"moved beyond forced[{dk}]")
        m.add(beyond >= mv - limit[dk])
        terms.append(beyond)
    if not terms:
        return []
    return [Tier(f"running {CLASS_NAMES[c]} jobs moved for other work", sum(terms), "min", 0, released=True)]


def swap_sides(model: Model, c: int, limit: dict[str, int | None]) -> dict[str, tuple[list, list]]:
    """Per tenant, the two sides of a swap at class c (`swaps_tier`): its running class-c demands that could stay,
    as (demand, jobs that could stay, kept, whether it keeps jobs past those: a rule moves some, or some are exempt),
    and its demands with new work of class c or below (any class,
    under preemption: Never), as (demand, most new work, new work placed) in job sizes. Running jobs a rule moves,
    and those `Model.exempt` names (stopped in an answer that held their tenant's new work back: `swap_exemptions`),
    are not on the first side."""
    # (under preemption: Never no class takes another's place: its new work of any class counts; fleet40: t1's running
    # j30 was stopped for its budget's room while t1's new work was placed, in the plan after an apply)
    above = model.p.placement.preemption == "Never"
    by_tenant: dict[str, tuple[list, list]] = {}
    for d in model.p.demands:
        if d.klass > c and not above or limit.get(d.key, 0) is None:
            continue
        stoppable, new = by_tenant.setdefault(d.tenant, ([], []))
        kept = model.krs[d.key] if d.running_jobs else 0  # (kept as they run: rules.settled_jobs)
        running = min(settled_jobs(d), len(d.jobs))
        # (only jobs that could stay where they run: one a rule moves, kept nowhere, is not stopped for new work; counted,
        # a low job whose latency cap its instance broke, with no room left in reach, held its tenant's every new low
        # job at 0 through the work tiers: 6 of 7 came back after the release, a CPU job stayed pending)
        forced = limit.get(d.key) or 0
        could_stay = 0 if d.gang and forced else max(0, min(running, d.running_jobs - forced) - model.exempt.get(d.key, 0))
        if d.klass == c and could_stay and constant(kept) is None:
            stoppable.append((d, could_stay, kept, bool(forced) or d.key in model.exempt))
        # (new work: jobs not running, and those that run but not as they may run on: a new shape, a gang grown or short.
        # A job a rule moves is not counted here, though apply's re-check counts it as arriving: counted, its placement
        # beside a stop its tenant's higher tiers made kept the stop from `swap_exemptions`, and the tenant's new work
        # waited a plan (fleet67); a consolidation no longer stops running work for it (strategy.keep_running, fleet64).)
        if len(d.jobs) > running and not model.placed.is_zero(d.key):
            new.append((d, d.job_size * len(d.jobs), d.job_size * (model.placed[d.key] - kept)))
    return by_tenant


def swaps_tier(model: Model, c: int, limit: dict[str, int | None]) -> list[Tier]:
    """Per tenant, its running class-c work stopped while its new work of class c or below (any class, under preemption:
    Never) is placed (the less of the two, in job sizes: `swap_sides`), at its least, held through the tiers after it
    and then released (Tier.released), as `moves_tier`: a running job is never stopped for work of its own class or
    below of its own tenant (Kueue's withinClusterQueue: LowerPriority). Another tenant may still reclaim the room it
    borrows (its stopped work counts here only beside new work of its own). Without it a tenant's running job counted
    as borrowed (its guarantee held by other running jobs with 3 GPUs left) was stopped for its own pending job of its
    class that fit in those 3 GPUs, by a plan right after an apply of the same config (fleet30). Tenants breaking a rule
    of their own, and every tenant where the fleet breaks a fleet-wide one (`moves.licensed`: None), are left to the
    tiers."""
    m = model.m
    terms = []
    for t, (stoppable, new) in sorted(swap_sides(model, c, limit).items()):
        if not stoppable or not new:
            continue  # (no variable for a tenant with nothing to swap: most of an applied fleet's running demands)
        stopped = []
        for d, could_stay, kept, forced in stoppable:
            if forced:  # (its kept jobs may be movers beyond those that could stay: stopped is at least 0)
                over = m.new_int_var(0, could_stay, f"stopped[{d.key}]")
                m.add(over >= could_stay - kept)
                stopped.append(d.job_size * over)
            else:
                stopped.append(d.job_size * (could_stay - kept))
        most = (sum(d.job_size * k for d, k, _, _ in stoppable), sum(n for _, n, _ in new))
        swapped = m.new_int_var(0, min(most), f"swapped[{t},{c}]")
        by_new = m.new_bool_var(f"swapped by new[{t},{c}]")
        m.add(swapped >= sum(stopped) - most[0] * by_new)
        m.add(swapped >= sum(e for _, _, e in new) - most[1] * (1 - by_new))
        terms.append(swapped)
    if not terms:
        return []
    return [Tier(f"running {CLASS_NAMES[c]} jobs stopped for their own tenant's work", sum(terms), "min", 0, released=True, swaps=True, klass=c)]


def swap_exemptions(model: Model, value) -> tuple[dict[str, int], list]:
    """Running jobs an answer stops while their tenant's new work (the other side of `swap_sides`) waits, none of it
    placed: (demand key -> jobs, that new work as (demand, its placed work)). `value(expr)`: an expression's value in
    the answer. Their stop is not for that work (it all waits, and they stop all the same: a rule, a higher tier,
    another tenant's reclaim, a change that no longer fits), so it is no swap, and a solve with them in `Model.exempt`
    lets the work take the room left. Counted as swaps, they held it back for one plan: the plan after the apply placed
    it (fleet47: another tenant's critical job took the room of t3's borrowed j6, and t3's new j1 waited; fleet52: a
    grown gang no longer fit, and its tenant's 1-GPU jobs waited)."""
    out: dict[str, int] = {}
    waiting: list = []
    if not model.krj:
        return out, waiting  # (nothing runs: nothing stops; 0.36 s of passes over the demands at 50k jobs cold)
    classes = sorted({d.klass for d in model.p.demands if d.running_jobs})
    for c in classes:
        for stoppable, new in swap_sides(model, c, model.licensed).values():
            if not stoppable or not new or any(value(e) > 0 for _, _, e in new):
                continue  # (a tenant that places new work beside the stops: they may be its swaps, which the tier weighs)
            stops = {d.key: could_stay - value(kept) for d, could_stay, kept, _ in stoppable if could_stay - value(kept) > 0}
            for dk, n in stops.items():
                out[dk] = model.exempt.get(dk, 0) + n
            if stops:
                waiting += [(d, e) for d, _, e in new]
    return out, waiting


def work_tiers(model: Model, c: int, var: Values, label: str) -> list[Tier]:
    """Work of class c placed (in the guaranteed or the borrowed part: `var`): deadline work first, within its class."""
    out = []
    dl = deadline_tier_terms(model.p.demands, c, var)
    if dl is not None:
        out.append(Tier(f"{label} {CLASS_NAMES[c]} deadline work", wsum(dl[0]), "max", dl[1]))
    ds = [d for d in model.p.demands if d.klass == c and not var.is_zero(d.key)]
    if ds:
        # (its bound leaves out work no capacity the fleet could have ever hosts, Problem.never_hosted: none of it is
        # ever placed. Counted, a critical job pinned to regions without a large enough T4 type on the applied 5k fleet
        # kept the critical work tier from its bound: an LP and a CP-SAT search, 0.2 s of each PR's plan, to prove it.)
        out.append(Tier(f"{label} {CLASS_NAMES[c]} work", wsum([(d.weight, var[d.key]) for d in ds]), "max",
                        sum(d.weight * len(d.jobs) for d in ds if not model.p.never_hosted(d)), work=(label, c)))
    return out


def victims_tier(model: Model) -> Tier | None:
    """Among equally good answers, evict the jobs with the least time left: weighed by the rank of when a
    demand's running jobs are expected to end (their mean), which orders them as their time left does and
    does not move with the clock. Weights of hours left did: a model an hour later was another search, and
    on an applied 1k-job fleet whose tiers the work limit cuts short, the same config and fleet planned an
    hour apart gave $7,957.79/h with 69 moves, then $7,961.13/h with 63 (and ranks of hours left, clamped
    at none, still moved as jobs passed their expected_hours)."""
    p = model.p
    left = {}
    for d in p.demands:
        if d.running_jobs:
            ends = [p.job_end.get(j, 0.0) for j, _ in d.running]
            left[d.key] = sum(ends) / len(ends)
    rank = {v: n for n, v in enumerate(sorted(set(left.values())), 1)}
    ev = []
    for d in p.demands:
        if d.running_jobs:
            ev.append((d.job_size * rank[left[d.key]], d.running_jobs - model.krj[d.key] if not d.gang else 1 - model.placed[d.key]))
    return Tier("victims' remaining time", wsum([(w, e) for w, e in ev]), "min", 0) if ev else None


def fair_share_tier(model: Model) -> Tier | None:
    """Weighted dominant-resource fair share of borrowed capacity: a concave utility of each
    borrowing tenant's share / weight, in SEGMENTS steps (two borrowers at least, else None).

    The steps are sized by the level the borrowers can reach (`fair_share_step`), the rest of a share past them at the
    last step's worth: sized by the whole fleet (50 per mille), shares below one step were not equalised (the utility is
    linear there): the Philly replan split its 63 borrowable GPUs of 830 44/19, as 21/21/21 scored the same (bench/README,
    s37-fair)."""
    p, m = model.p, model.m
    borrowers = []
    for t, r in p.tenants.items():
        mine = [d for d in p.demands if d.tenant == t and model.b.is_variable(d.key)]
        if not mine:
            continue
        dim, cap = r.dominant, share_capacity(r, p.fleet_capacity)
        if cap <= 0:
            continue
        beta = [(units(d.req(dim), dim) * d.replicas, model.b[d.key]) for d in mine if d.req(dim)]
        if not beta:
            continue
        most = sum(units(d.req(dim), dim) * d.replicas * len(d.jobs) for d in mine)
        room = borrow_room(r, dim)
        most = min(most, room * scale(dim)) if math.isfinite(room) else most
        borrowers.append((t, r, beta, cap * scale(dim), most))
    if len(borrowers) < 2:
        return None
    step = fair_share_step(model, [(t, r, denom, most) for t, r, _, denom, most in borrowers])
    terms, bound = [], 0
    for t, r, beta, denom, most in borrowers:
        # (at most the share its room above the guarantee is: the split of a tenant's work between its guarantee and
        # its borrowed part is the model's choice, and a share counting guaranteed work as borrowed outweighed the
        # guaranteed tiers in the warm start's completion: fleet73's cold plan put 252 of t2's critical units on
        # borrowed capacity, the tiers held that floor and the plan after the apply placed 5 more jobs)
        # (in whole per mille rounded down, as the bound counts it: rounded up, the share passed the tier's bound where
        # guaranteed work counts as borrowed; never below a real share, whose beta is at most `most`)
        top_share = min(1000, math.floor(1000 * most / denom + 1e-6))
        s = m.new_int_var(0, top_share, f"share[{t}]")
        m.add(round(denom) * s <= 1000 * wsum(beta))
        w = max(1, round(r.weight * 100))
        x_max = 100 * top_share / w  # (the segments' row's weight, w / 100: at r.weight 0.333 they passed the bound)
        sizes = fair_steps(step, x_max)
        segs = [m.new_int_var(0, size, f"fair[{t},{k}]") for k, size in enumerate(sizes)]
        m.add(w * sum(segs) <= 100 * s)  # the segments fill up to share / weight
        # Weighted utility, weight x f(share / weight): its slope in share is f' alone, so the
        # optimum equalises share / weight (without the factor the heavier tenant got less).
        terms += [(w * (SEGMENTS - k), v) for k, v in enumerate(segs)]
        left = x_max
        for k, size in enumerate(sizes):
            take = max(0.0, min(size, left))
            bound += w * (SEGMENTS - k) * take
            left -= take
    return Tier("fair share of borrowed capacity", wsum(terms), "max", math.floor(bound))


def fair_steps(step: int, x_max: float) -> list[int]:
    """A tenant's SEGMENTS steps of the fair-share utility, of share / weight in whole per mille: `step` each, the last
    the rest up to `x_max` (what its share can reach over its weight), so every borrowed per mille still counts."""
    return [step] * (SEGMENTS - 1) + [max(step, math.ceil(x_max - (SEGMENTS - 1) * step))]


def fair_share_step(model: Model, borrowers: list[tuple]) -> int:
    """The fair-share utility's step (per mille of share / weight): twice the level the borrowers reach when the
    capacity the guarantees do not hold is water-filled over them (ledger.fair_share_level), in SEGMENTS steps, so the
    utility is concave where the borrowed shares fall. The capacity the guarantees hold, per dimension: each tenant's
    ask there up to its guarantee (all of it where the dimension is not guaranteed: nothing of it is borrowed); an
    estimate (a guaranteed job that cannot be placed leaves more), which bounds no value: a share past the steps still
    counts at the last step's worth. `borrowers`: (tenant, rules, capacity of its dimension in units, most it borrows)."""
    p = model.p
    asked: dict[tuple[str, str], float] = {}
    for d in p.demands:
        for dim in {r.dominant for _, r, _, _ in borrowers}:
            asked[d.tenant, dim] = asked.get((d.tenant, dim), 0.0) + d.req(dim) * d.replicas * len(d.jobs)
    reach, free = [], 0.0
    for _, r, denom, most in borrowers:
        dim = r.dominant
        held = 0.0
        for (t, dm), a in asked.items():
            if dm == dim:
                rules = p.tenants.get(t)
                held += min(a, rules.guarantee.get(dim, math.inf) if rules is not None else math.inf)
        left = 1000 * max(0.0, p.fleet_capacity.get(dim, 0.0) - held) / (denom / scale(dim))
        reach.append((min(1000 * most / denom, left), r.weight))
        free = max(free, left)
    return max(1, math.ceil(2 * fair_share_level(reach, free) / SEGMENTS))


def cost(model: Model):
    """$/h of instances, egress, latency and spot preference, plus amortised moves, in milli-dollars."""
    p = model.p
    terms = [(round(c.price * MILLI), model.use[c.key]) for c in model.units]
    for (gk, ck), v in model.x.items():
        e = p.cost_coef(model.demands[p.groups[gk][0]], model.caps[ck])
        if e:
            terms.append((round(e * MILLI), v))
    for (dk, hk), v in model.stay.items():
        e = p.cost_coef(model.demands[dk], model.caps[hk])
        if e:
            terms.append((round(e * MILLI), v))
    for dk, mv in model.moved.items():
        w = move_weight(model.demands[dk], p.placement)
        if w:
            terms.append((w, mv))
    created = [(1, model.use[c.key]) for c in model.offers]
    return wsum(terms) + wsum(created)


def move_weight(d: Demand, pol) -> int:
    """Milli-dollars per hour one moved item of `d` costs (a move's cost amortised over the payback
    hours); 0 when its running jobs all restart in a new shape anyway (moving them costs no more)."""
    if len(d.reshaped) == d.running_jobs:
        return 0
    per_item = pol.move_cost_per_gpu * (d.gpus or 0) if (d.gpus or d.mig) else pol.move_cost_per_replica
    if d.mig:
        per_item = pol.move_cost_per_gpu * d.size / 7
    return max(1, round(per_item / pol.payback_hours * MILLI))


def instance_cost(model: Model):
    """$/h of instances in milli-dollars at prices rounded down: the benchmark's bounds are on it, and a plan's $/h
    is at its exact prices, which a bound at prices rounded to the nearest milli-dollar (as `cost`'s) can pass (131
    p4d.24xlarge at $21.957642: bound $2,876.50, plan $2,876.45)."""
    return wsum([(milli_down(c.price), model.use[c.key]) for c in model.units])


__all__ = ["CLASS_NAMES", "SEGMENTS", "Tier", "cost", "fair_share_step", "fair_share_tier", "fair_steps", "guarantees_tiers", "instance_cost", "moves_tier", "protected_tier", "running_tiers", "spot_shares_broken",
           "tiers", "victims_tier", "work_tiers"]
