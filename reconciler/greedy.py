"""Greedy best-fit: first-fit decreasing by priority and dominant resource.

Three uses: CP-SAT's warm start (so its answer is never worse), the fallback when
CP-SAT finds nothing in time (said so in the plan), and the baseline the benchmark
compares against. Pure. It keeps every hard rule the model has. Where the SpotPolicy
asks for diversity or an on-demand buffer, it opens spot capacity (new, or an idle spot
host) beyond the hosts of running work only for work that waits otherwise, with what
keeps the rule beside it (`_place_with_ballast`, `_place_spot_diverse`);
where the kept spot hosts need more on-demand capacity than the fleet has (its
on-demand host must go), it buys that capacity to stand idle rather than stop
running work, as the model ranks running work above cost.

Order: what runs stays where it is (gangs whole, healed around survivors); pool
minimums are bought; then the remaining jobs by class, running-first, then largest
dominant share first, each on the open instance it fits first, else on the offer
with the lowest price per item (gangs zone by zone, cheapest zone wins): every
tenant's guaranteed jobs in that order first, then the borrowed ones, one job at a time
to the tenant borrowing the least share over its weight (the model's fair share).

Its fleet-wide state is a Ledger (reconciler/ledger.py): what it opens and places
is added there (and removed when it gives up a host), and the ledger names the
rule that refuses each step, the rule explain reads off the finished plan.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Collection
import itertools
import math
from dataclasses import dataclass, field

from reconciler.ledger import (Ledger, Pending, buffer_ok, buffer_use, diversity_ok, lending_share, licensed_by, micro, pool_min_ok, quota_ok,
                               rules_broken_now, spot_share_ok, stand_in_units)
from reconciler.problem import (DIMS, Capacity, Demand, Host, Offer, OfferFits, Problem, TenantRules, borrows, gang_split, has_room, refuses, rules_allow,
                                stuck_gangs, type_class)


@dataclass
class Assignment:
    """An answer in the solver's terms (also what greedy returns)."""

    use: dict[str, int] = field(default_factory=dict)  # capacity key -> instances (hosts 0/1, offers a count)
    stay: dict[tuple[str, str], int] = field(default_factory=dict)  # (demand, host id) -> items staying
    x: dict[tuple[str, str], int] = field(default_factory=dict)  # (demand, capacity key) -> new items
    placed: dict[str, int] = field(default_factory=dict)  # demand -> jobs
    cost: float = 0.0  # USD/h of instances
    work: int = 0
    # demand -> the rules (Refusal.rule names, as the Ledger names them) that refused the first of its jobs greedy could
    # not place; (): no fleet-wide rule did, nothing it fits had room
    refused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # offer key -> its new instances in the order bought, each {demand: new items on it}: how greedy packed them
    # (the model's per-instance rows are hinted with it: solve/slots.py)
    packed: dict[str, list[dict[str, int]]] = field(default_factory=dict)


def _drop(lst: list, x) -> None:
    """Take x out of lst, found by identity: `x in lst` on Capacity (a dataclass) compares every field of every
    host before it, a quarter of a 10k-job drift plan's model-building time (5k idle hosts, 8 offers)."""
    for i, y in enumerate(lst):
        if y is x:
            del lst[i]
            return


class _Inst:
    """An open instance as greedy packs it: its free room per dimension (its ref in the ledger is `key`)."""

    __slots__ = ("cap", "free", "key", "gpu_residents", "items")

    def __init__(self, cap: Capacity, free: dict[str, float], key: str):
        self.cap, self.free, self.key = cap, free, key
        self.gpu_residents = False
        self.items: dict[str, int] = {}  # demand -> its items here

    def fits(self, d: Demand) -> bool:
        f = self.free
        for k in d.dims:
            r = d.req(k)
            if r > 0 and f.get(k, 0.0) < r - 1e-9:
                return False
        return True

    def take(self, d: Demand, sign: int = 1) -> None:
        for k in d.dims:
            self.free[k] = self.free.get(k, 0.0) - sign * d.req(k)
        self.items[d.key] = self.items.get(d.key, 0) + sign
        if d.gpus and sign > 0:
            self.gpu_residents = True


_NOTHING = Pending()  # nothing planned yet (never added to)


def _capacity_of(c: Capacity) -> dict[str, float]:
    dims = list(DIMS) + [f"mig:{p}" for p in set(c.mig or ())]
    return {k: c.cap(k) for k in dims}


class _Greedy:
    def __init__(self, problem: Problem, spot_first: bool = False, on_demand_first: bool = False, move_spot: bool = False):
        self.p = problem
        self.on_demand_first = on_demand_first  # keep_running: of running jobs ranked alike, those on on-demand hosts first
        self.move_spot = move_spot  # move_spot_work before settle_spot (`greedy`)
        self.off_spot = False  # plan onto no open spot instance (move_spot_work: settle_spot finds only stays on spot hosts)
        self.a = Assignment(placed={d.key: 0 for d in problem.demands})
        sp = problem.spot
        # (spot_first: spot bought as if neither diversity nor an on-demand buffer were asked, both settled at the end:
        # `greedy`)
        self.buy_spot = spot_first or sp.min_instance_types <= 1 and sp.min_zones <= 1 and sp.on_demand_buffer_percent <= 0
        # Every total a fleet-wide rule reads (spend, pool counts, spot and idle on-demand capacity, tenant charges, use,
        # spot shares, licenses, cloud quotas) is the ledger's; greedy asks it which rule refuses a step.
        self.led = Ledger(problem)
        self._prim = self.led._prim
        self.booked: dict[str, int] = {}  # demand -> its jobs booked in the ledger (tokens "<demand>#<n>")
        self.refused: set[str] = set()  # the rules that refused a step of the job being planned
        self.buckets: dict[str, list[_Inst]] = {}  # offer key -> open instances with room
        self.full: list[_Inst] = []  # open instances with no room for any item
        self.offer: dict[str, Capacity] = {c.offer_key: c for c in problem.offers()}
        self.bought: dict[str, int] = {}
        self.bought_insts: dict[str, list[_Inst]] = {}  # offer key -> its instances bought, in order (`_unbuy`: the last)
        self.idle: dict[str, list[Capacity]] = {}  # offer key -> keepable hosts not yet opened
        self.opened: dict[str, _Inst] = {}  # host id -> its open instance
        self.sparing_buffer = False  # plan onto no open on-demand instance (the on-demand buffer counts the room of each)
        self.freed: set[str] = set()  # open instances whose room stops just freed for the job planned: offered first
        self.ballast_after = False  # the fleet's spot share not asked per instance: idle on-demand bought after mends it
        self.fits = OfferFits()  # fit() by demand shape and offer: asked for every demand against every offer
        self.keys_memo: dict[tuple, list[str]] = {}  # _keys_at's answers
        for c in problem.hosts():
            if c.keep_blocker is None:
                self.idle.setdefault(c.offer_key, []).append(c)
        self.sites: dict[str, list[str]] = {}  # site -> offer keys there
        for k, c in list(self.offer.items()) + [(h.offer_key, h) for hs in self.idle.values() for h in hs]:
            lst = self.sites.setdefault(f"{c.cloud}/{c.zone}", [])
            if k not in lst:
                lst.append(k)
        self.rep = {k: c for k, c in self.offer.items()}
        for k, hs in self.idle.items():
            self.rep.setdefault(k, hs[0])
        self.keeping = False  # phase 1: spot rules are settled after, over the whole fleet kept
        self.log: list[_Inst] | None = None  # where set, every instance an item is recorded on (`_Protected`)
        self.stops = 0  # running jobs stopped and not kept again (`_stop_running`): room `_Protected.retry` offers
        # The smallest item of each GPU model, dimension by dimension: an instance with less free
        # than that is full, and leaves its bucket's open list (so scans stay short at 5k jobs).
        self.smallest: dict[tuple, dict[str, float]] = {}
        for d in problem.demands:
            cur = self.smallest.setdefault(type_class(d), {})
            for k in d.dims:
                cur[k] = min(cur.get(k, math.inf), d.req(k))
        self.to_heal: list[tuple[Demand, list[Capacity]]] = []
        self.kept: set[str] = set()  # running jobs keep_running kept (or left to healing): not asked again
        self.tie: dict[str, int] = {}  # demand -> its rank in the placing order, demands alike to it but for the name tied
        self.order: list[Demand] = []  # the placing order (`_run`)
        self.victims: dict[str, tuple[list[tuple[Demand, str]], list[int]]] = {}  # tenant -> what _place_preempting may stop, their classes
        self.reclaimable: tuple[dict[str, list[Demand]], dict[str, list[str]], dict[str, int]] | None = None  # _reclaimable's answer
        self.running_gangs: list[Demand] | None = None  # _place_reclaiming_gang's candidates, in its order
        # Under a budget, the pool minimums not met yet are owed at least their cheapest instance
        # each: nothing else may spend that (keeping a dear running instance first once left a
        # pool's minimum unbought, a plan that breaks a hard rule). What pool_minimums may open: spot too
        # (`_open_with_ballast`). Priced at on-demand where greedy opens spot for the minimum with its ballast, two
        # `either` pools' minimums owed $51.25/h under a $40/h budget and greedy bought none where CP-SAT met both
        # at $35.35/h (fleet131's random fleet); priced at spot, a kept host the budget then cannot pay beside the
        # minimum gives way (`_give_way`: fleet18, fleet26).
        self.floor_price: dict[str, int] = {}  # pool -> micro-dollars/h (ledger.micro: what the budget counts)
        if problem.budget is not None:
            for c in problem.capacities:
                if not (isinstance(c, Host) and c.keep_blocker is not None) and problem.pool_bounds.get(c.pool, (0, 0))[0] > 0:
                    price = micro(c.price)
                    self.floor_price[c.pool] = min(self.floor_price.get(c.pool, price), price)
        # The hosts kept in each Reservation (at most its count: problem/capacity), which take its room before any new
        # instance is launched into it (`_may_open`).
        self.reserved_hosts: dict[str, list[str]] = {}
        for c in problem.capacities:
            if isinstance(c, Host) and c.reservation:
                self.reserved_hosts.setdefault(c.reservation, []).append(c.key)

    # -- bookkeeping

    def _refuses(self, rule: str | None) -> bool:
        """Note the rule the ledger named (if any): it is what refused the job, should nothing else take it."""
        if rule:
            self.refused.add(rule)
            return True
        return False

    def _may_open(self, c: Capacity, pending: Pending | None = None) -> bool:
        """Pool ceiling, the cloud quotas a new instance counts against, fleet budget (less what unmet pool minimums
        will cost), and (except while keeping what runs, which is settled after as a whole: opening spot hosts first
        would look over the share) the spot share, as the ledger rules them with `pending` (planned, not opened yet)
        on top; then greedy's own restraint on spot."""
        pending = pending or _NOTHING
        reserve = self._owed(c, pending) if self.floor_price else 0
        if self._refuses(self.led.refuses_open(c, 1, pending, reserve, spot_share=not (self.keeping or self.ballast_after))):
            return False
        if isinstance(c, Offer) and c.reservation and self._reservation_held(c):
            return False
        # An idle spot host opened now would escape the buffer and diversity rules too (greedy's restraint, not a rule).
        return not (c.market == "spot" and not self.keeping and not self.buy_spot)

    def _reservation_held(self, c: Offer) -> bool:
        """Greedy's restraint: a new instance of c would launch into its Reservation where the room left is held by the
        Reservation's hosts not opened yet. The ledger counts a host in it once opened, and hosts are opened as greedy
        goes: a gang re-placed across a kept reserved host and a new instance bought the new one into the Reservation
        first, then opened the host, and the plan had 2 instances in a Reservation of 1 (fleet133). Such a host holds
        whatever a new instance of its type there would, so its room goes to it first."""
        waiting = sum(1 for h in self.reserved_hosts.get(c.reservation, ()) if h not in self.opened)
        return waiting > 0 and self.led.reservation_over(c, 1 + waiting) > 0

    def _owed(self, c: Capacity, pending: Pending) -> int:
        """Micro-dollars/h the pool minimums still unmet once c is open will cost at least."""
        owed = 0
        for pool, price in self.floor_price.items():
            n = self.led.pool_count(pool) + pending.pools.get(pool, 0) + (pool == c.pool)
            owed += max(0, self.p.pool_bounds[pool][0] - n) * price
        return owed

    def _open(self, c: Capacity) -> _Inst:
        """Open a host or buy an instance of an offer. The on-demand buffer counts the idle capacity of every on-demand
        instance open (hosts kept, ballast bought to stand idle for the spot rules, and the room left on what is bought
        for work), during the pass as in the finished plan and the next plan (where they are hosts kept): the ledger's
        one reading. (Counted only at the end of the pass, the 2 idle GPUs of the a2-highgpu-4g bought for a 3 x 2-GPU
        gang were not there for a spot-required job ranked after it; with no pool room for ballast beside its spot
        instance it waited, and the plan right after the apply placed it: the lifecycle machine, greedy alone, seed 99.)"""
        if isinstance(c, Host):
            inst = _Inst(c, _capacity_of(c), c.key)
            self.opened[c.key] = inst
            self.a.use[c.key] = 1
            _drop(self.idle.get(c.offer_key, []), c)
        else:
            n = self.bought.get(c.offer_key, 0)
            self.bought[c.offer_key] = n + 1
            self.a.use[c.key] = self.a.use.get(c.key, 0) + 1
            inst = _Inst(c, _capacity_of(c), f"{c.key}#{n}")
            self.bought_insts.setdefault(c.offer_key, []).append(inst)
        self.buckets.setdefault(c.offer_key, []).append(inst)
        self.led.add_instance(inst.key, c)
        return inst

    def _unbuy(self, inst: _Inst) -> None:
        """Undo `_open` of a new instance nothing was placed on."""
        c = inst.cap
        (self.full if inst in self.full else self.buckets[c.offer_key]).remove(inst)
        self.bought[c.offer_key] -= 1
        _drop(self.bought_insts[c.offer_key], inst)
        self.a.use[c.key] -= 1
        self.led.remove_instance(inst.key)

    def _retire_if_full(self, inst: _Inst) -> None:
        need = self.smallest.get(type_class(inst.cap), {})
        if not has_room(inst.free, need):
            lst = self.buckets.get(inst.cap.offer_key, [])
            if inst in lst:
                lst.remove(inst)
                self.full.append(inst)

    def _record(self, d: Demand, inst: _Inst, stay: bool) -> None:
        if self.log is not None:
            self.log.append(inst)
        inst.take(d)
        self._retire_if_full(inst)
        key = (d.key, inst.cap.key)
        if stay:
            self.a.stay[key] = self.a.stay.get(key, 0) + 1
        else:
            self.a.x[key] = self.a.x.get(key, 0) + 1
        self.led.add_item(d, None, inst.key)

    def _quota_ok(self, d: Demand) -> bool:
        """Its tenant's quota, and the licenses it would hold (counts and tenant quotas)."""
        return not self._refuses(self.led.refuses_job(d))

    def _charge_quota(self, d: Demand, jobs: int = 1) -> None:
        """Book `jobs` more jobs of d in the ledger (negative: give them back): their tenant's quota and licenses.
        Identical jobs are alike to every rule, so they are booked by count."""
        n = self.booked.get(d.key, 0)
        for i in range(n, n + jobs):
            self.led.add_job(d, f"{d.key}#{i}")
        for i in range(n - 1, n + jobs - 1, -1):
            self.led.remove_job(f"{d.key}#{i}")
        self.booked[d.key] = n + jobs

    def _compatible(self, d: Demand, okey: str) -> bool:
        return self.fits.at(d, okey, self.rep[okey]) > 0

    def _keys_at(self, d: Demand, sites: list[str] | None) -> list[str]:
        """The offer keys at `sites` (None: every site) that d fits, in site order. One answer per
        demand shape: recomputed per job, this filter was half of greedy's time at 10k jobs."""
        memo = (self.fits.shape(d), None if sites is None else tuple(sites))
        keys = self.keys_memo.get(memo)
        if keys is None:
            keys = self.keys_memo[memo] = [kk for s in (self.sites if sites is None else sites) for kk in self.sites.get(s, [])
                                           if kk in self.rep and self._compatible(d, kk)]
        return keys

    # -- phases

    def keep_running(self, order: list[Demand]) -> None:
        """Every running job where it runs, in `order`; then a job whose resources changed, restarted in place where
        its new shape still fits beside them. It is new work: kept first in the order, it took the room of another
        tenant's guaranteed job (evicted "pools at max_instances": apply's re-check refused the plan) or of its own
        tenant's job of its class, and at short limits CP-SAT kept greedy's answer (audit20 findings 5 and 6). Within
        each, the jobs inside their tenants' guarantees first, as the model's first tier ranks them: kept in `order`
        alone, t3's borrowed low job took a pool's one slot left (max_instances lowered below what runs) before t1's
        guaranteed low job, which the plan evicted and apply's re-check refused (tests/data/findings/fleet91)."""
        hosts = {c.key: c for c in self.p.hosts()}
        protected = {j for r in self.p.tenants.values() for j in r.protected_jobs}
        for reshaped in (False, True):
            for guaranteed in (True, False):
                jobs = [(d, job, iids) for d in order for job, iids in d.running
                        if (job in d.reshaped) == reshaped and (job in protected) == guaranteed and job not in self.kept]
                if self.on_demand_first:  # (stable: in `order` within each)
                    jobs.sort(key=lambda t: (self.tie.get(t[0].key, 0), not _on_demand(t[2], hosts)))
                for d, job, iids in jobs:
                    self._keep(d, job, iids, hosts)

    def _keep(self, d: Demand, job: str, iids: tuple[str, ...], hosts: dict[str, Capacity]) -> None:
        """Keep one running job of d on the hosts it runs on (`iids`), if it still fits and no rule refuses it."""
        if not self._quota_ok(d):
            return
        if d.bundle > 1:  # a same-instance gang is one item: it stays only if whole on one instance
            if len(iids) != d.bundle or len(set(iids)) != 1:
                return
            iids = iids[:1]
        cells = [hosts.get(i) for i in iids]
        if any(c is None or refuses(d, c, self.fits) for c in cells):
            return
        if len(iids) != d.replicas:
            self.to_heal.append((d, cells))  # after the kept fleet is settled
            self.kept.add(job)  # (asked once)
            return
        if gang_split(d, cells):
            return
        trial = []
        pending = Pending()
        ok = True
        free_copy: dict[str, dict] = {}
        for c in cells:
            inst = self.opened.get(c.key)
            free = free_copy.setdefault(c.key, dict(inst.free) if inst else _capacity_of(c))
            if not all(free.get(k, 0) >= d.req(k) - 1e-9 for k in d.dims if d.req(k) > 0):
                ok = False
                break
            for k in d.dims:
                free[k] = free.get(k, 0) - d.req(k)
            if inst is None and c.key not in [t.key for t in trial]:
                if not self._may_open(c, pending):
                    ok = False
                    break
                pending.open(c, self._prim(c))
                trial.append(c)
        if not ok or self._refuses(self.led.refuses_items(d, cells, spot_share=not self.keeping)):
            return
        # Kept again once the spot rules are settled (keep_running after settle_spot), the job's items on open on-demand
        # instances take the idle room the on-demand buffer counts, as new work's do (_breaks_buffer): it stays only
        # where the buffer holds, or holds with on-demand capacity bought to stand idle (_ballast_buys: running work
        # ranks above cost, as in settle_spot). Kept unasked, t1's low job went back onto the idle on-demand host
        # settle_spot had kept for the buffer, and greedy's plan broke it (fleet94).
        taken = 0.0 if self.keeping else sum(buffer_use(d, self.led.dim) for c in cells
                                             if c.key in self.opened and self.led.in_buffer(self.opened[c.key].key))
        short = bool(taken) and self.led.refuses_buffer(d, taken) is not None
        if short and not self._other_spot_rules_hold():
            self._refuses("spot-buffer")
            return
        opened_here: list[_Inst] = []
        kept: list[_Inst] = []
        for c in cells:
            inst = self.opened.get(c.key)
            if inst is None:
                inst = self._open(c)
                opened_here.append(inst)
            self._record(d, inst, stay=True)
            kept.append(inst)
        if short:
            buys = self._ballast_buys()
            if not buys:
                self._refuses("spot-buffer")
                for inst in reversed(kept):
                    self._unrecord(d, inst, stay=True)
                for inst in reversed(opened_here):
                    self._close(inst)
                return
            for b in buys:
                self._open(b)
        self.a.placed[d.key] += 1
        self._charge_quota(d)
        self.kept.add(job)

    def movable_spot_hosts(self) -> list[_Inst]:
        """While the kept fleet breaks the fleet's spot share or on-demand buffer: the open spot hosts whose going
        mends them without buying idle capacity, as the model may move running work a broken rule licenses
        (`_movable`). [] where the rules hold, or where the fleet as it runs breaks no fleet-wide rule: no rule licenses
        a move then (solve/moves.licensed, the one license: ledger.licensed_by of rules_broken_now). The kept fleet
        reads the share broken before the idle on-demand hosts settle_spot keeps are counted: a spot A10G job moved onto
        an idle on-demand A10G beside it, its host deleted, where the fleet as it ran kept every rule, under
        consolidation WhenEmpty too; CP-SAT's plan kept it. And a CPU job moved off a spot n2 onto an on-demand m6i's
        room in a GPU fleet (its host counts 0 GPUs in the share: the move mended nothing), the plan right after an apply
        that had kept it (fleet146)."""
        if self._fleet_spot_rules_hold() or licensed_by(rules_broken_now(self.p)) is not None:
            return []
        return [i for i in self.opened.values() if self._movable(i)]

    def _movable(self, inst: _Inst) -> bool:
        """Is inst an open spot host with running work staying on it and nothing else, none of it spot-required, each
        of it fitting some on-demand capacity, whose going leaves spot diversity no shorter than the SpotPolicy asks?
        (Only stays: `_release` gives up stays, and closes the host.)"""
        c, sp = inst.cap, self.p.spot
        if c.market != "spot" or c.frozen or not any(inst.items.values()) or any(self.a.x.get((k, c.key)) for k in inst.items):
            return False
        types, zones = self.led.spot_sites()
        n_type, n_zone = self.led.spot_site_counts(c.instance_type, c.zone)
        if (sp.min_instance_types > 1 and n_type <= 1 and len(types) <= sp.min_instance_types
                or sp.min_zones > 1 and n_zone <= 1 and len(zones) <= sp.min_zones):
            return False
        return all(d.spot != "required" and any(self.rep[k].market != "spot" for k in self._keys_at(d, None))
                   for d in (self.p.demand(k) for k, n in inst.items.items() if n))

    def move_spot_work(self, order: list[Demand]) -> None:
        """Before settle_spot, where the pass moves spot work (`greedy`): while the kept fleet breaks the fleet's spot
        share or on-demand buffer, give up the movable spot host whose work ranks lowest (`movable_spot_hosts`, in
        `_lowest_ranked`'s order) and place its jobs anew at once, on on-demand room the fleet has or buys (the share
        refuses new spot while broken; and on the spot hosts kept, settle_spot after would give up a host with new work
        on it: it releases stays, and the ledger refused closing the host under the rest). settle_spot buys idle on-demand capacity beside every spot host kept instead:
        trace33 (1,000 trace-shaped jobs applied under max_spot_fraction 0.5, then 0.15) bought idle ballast at
        $3,430/h where CP-SAT's plan moved spot-eligible work onto on-demand at $2,853/h (fleet120 at three jobs).
        Each host is asked once: finite."""
        best = self._host_ranks(order)
        for host in sorted(self.movable_spot_hosts(), key=lambda i: (best.get(i.key, -1), i.key), reverse=True):
            if self._fleet_spot_rules_hold():
                return
            if self.opened.get(host.cap.key) is not host or not self._movable(host):
                continue  # (gone with a gang released from another host, or jobs placed anew landed on it)
            before = dict(self.a.placed)
            self._release(host)
            self.off_spot = True
            try:
                for dk, n in before.items():
                    d = self.p.demand(dk)
                    for _ in range(n - self.a.placed[dk]):
                        if not _place_resolving(self, d):
                            break
            finally:
                self.off_spot = False

    def settle_spot(self, order: list[Demand]) -> None:
        """After keeping what runs: while the kept fleet breaks a spot rule (fleet or tenant spot
        share, on-demand buffer, diversity), keep an idle on-demand host the fleet already has
        where that mends the fleet's spot share (the fleet kept it for that), else buy on-demand
        capacity to stand idle where that mends it (running work ranks above cost), else give up
        the spot host whose work ranks lowest."""
        spare = sorted((h for hs in self.idle.values() for h in hs if h.market != "spot" and self._prim(h) > 0),
                       key=lambda h: (h.price / self._prim(h), h.key))
        tried: set[str] = set()
        refused: set[str] = set()  # (of `tried`: opened and undone, no ballast mended the share with it)
        diverse: list[_Inst] = []  # spot instances bought (not kept: hosts) for diversity, in the order bought
        mends: list[_Inst] = []  # idle on-demand hosts kept, and ballast bought, for the fleet's spot share or buffer
        while True:
            spot_hosts = [i for i in self.opened.values() if i.cap.market == "spot"]
            if not spot_hosts and not self._spot_rules_hold():
                # Every spot host given up, what was bought beside them for diversity is all the spot left, and it breaks
                # the rule alone: it goes too. Kept, a spot A100 bought for a second zone (no second instance type to
                # buy: min_instance_types 2 of the one type the pools have) stood alone once t3's spot host was given
                # up, and t3's j0 was placed on it: greedy's plan broke spot diversity (fleet98).
                for inst in reversed(diverse):
                    self._unbuy(inst)
                diverse.clear()
            if not spot_hosts or self._spot_rules_hold():
                self._drop_mends(mends)
                return
            fleet_ok = self._fleet_spot_rules_hold()
            if fleet_ok or not self._diversity_holds() and not self._tenants_over_spot():
                # Diversity: keep an idle spot host of another type or zone the fleet has, before giving up running
                # work (a guaranteed job was evicted when the host beside it had to go: issue 18).
                # Else a spot instance of a type or zone it asks for, bought (as the model may): giving up a spot host
                # mends diversity only once no spot is left, and the host given up was reopened for new work later,
                # after a spot instance bought elsewhere had mended it; the guaranteed job on it was stopped for
                # another tenant's new job (fleet92).
                # (not while a tenant is over its own spot share: the spot work it gives up may leave the instance bought
                # for diversity alone of its type, and the plan broke min_instance_types; the slow property tier)
                # While the fleet's spot share or on-demand buffer is broken too, diversity first where the on-demand
                # ballast then mends them, as the model may: the ballast was never bought while diversity was broken,
                # so the one spot host with a guaranteed job on it was given up, for a buffer and diversity that a spot
                # instance bought and an idle on-demand one mended (fleet95; CP-SAT's plan kept the job).
                keep = self._diversity_spare(tried)
                if keep is None:
                    # (greedy's restraint on idle spot lifted: a rule asks for it; and the fleet's spot share not asked, as
                    # `_diversity_spare` does not ask it: the ballast asked below mends it or the buy is undone. Asked, a
                    # share broken by t1's guaranteed j5 alone on a spot g5.xlarge refused every spot instance for the
                    # second zone, the host was given up and t2's new j8 took its place: apply's re-check refused greedy's
                    # plan, where CP-SAT's bought a spot A100 in eastus-2 and an on-demand p4d: fleet103)
                    buy_spot, self.buy_spot = self.buy_spot, True
                    ballast_after, self.ballast_after = self.ballast_after, True
                    try:
                        keep = None if self._tenants_over_spot() else _diversity_buy(self, tried)
                    finally:
                        self.buy_spot, self.ballast_after = buy_spot, ballast_after
                if keep is not None and keep.key not in tried:
                    tried.add(keep.key)
                    inst = self._open(keep)
                    if fleet_ok or self._fleet_spot_rules_hold() or self._ballast_buys():
                        if not isinstance(keep, Host):
                            diverse.append(inst)
                        continue
                    if isinstance(keep, Host):  # (nothing mends the share or buffer with it: not bought for nothing)
                        self._close(inst)
                    else:
                        self._unbuy(inst)
                    refused.add(keep.key)
                    # Then the next spot host (or spot instance to buy) for diversity, before running work is given
                    # up: the cheapest may take the pool slot the ballast needs (fleet96: a spot g5.12xlarge kept in
                    # aws-a10g, max 1, left no room for on-demand ballast, and t2's guaranteed j8 was evicted; the spot
                    # a2-highgpu-4g in GCP with an on-demand g5.12xlarge bought kept it, as CP-SAT's plan does).
                    continue
            if not self._fleet_spot_rules_hold():
                # (With an on-demand buffer, work placed later cannot fill the host kept for it: _breaks_buffer.)
                # (a host a pool's max or the budget refuses now is asked again after the next release: dropped for
                # good, the pool slot i5's release freed went to an on-demand A100 bought as ballast, and t2's
                # guaranteed j4 on the idle host i1 beside it was evicted; fleet97)
                spare = [h for h in spare if h.key not in self.opened]
                # (the cheapest host that mends them alone first, as `_ballast_buys` buys: the cheapest per GPU first,
                # an idle g5.xlarge took aws-a10g's last slot (max 2) beside a spot g5.12xlarge, mended nothing, and
                # t1's guaranteed j2 on the spot host was given up where the idle on-demand g5.12xlarge kept it; fleet118)
                (spot, total), idle = self.led.spot(), self.led.idle_on_demand()
                alone = sorted((h for h in spare if self._mends_alone(h, spot, total, idle)), key=lambda h: (h.price, h.key))
                host = next((h for h in (*alone, *spare) if self._may_open(h)), None)
                if host is not None:
                    spare.remove(host)
                    mends.append(self._open(host))
                    continue
                buys = self._ballast_buys() if self._other_spot_rules_hold() else []
                if buys:  # (fleet11: its on-demand host had to go; giving up the spot host took a guarantee)
                    for c in buys:
                        mends.append(self._open(c))
                    continue
            elif self._diversity_holds() and self._release_tenant_spot(order):
                continue
            if not self._fleet_spot_rules_hold():
                # (only a host with capacity in the share's unit mends the fleet's spot share or buffer: a released
                # spot CPU host of a GPU fleet mended nothing, and its job, another tenant's guaranteed one, was then
                # stopped for new work placed on the host reopened later; slow property tier, 2026-12-02)
                spot_hosts = [i for i in spot_hosts if self._prim(i.cap) > 0] or spot_hosts
            self._release(self._lowest_ranked(spot_hosts, order))
            # What no ballast mended is asked again after a release: the release frees a pool slot, quota, budget and
            # spot the ballast may need. Kept tried, the spot A100s to buy in eastus (refused while the spot p4d i1 held
            # aws-a100's one slot the on-demand p4d ballast needs) were not asked again once i1 was given up, and t1's
            # guaranteed j5 on i0 went too; CP-SAT's plan keeps it (fleet104). Only those: what was kept stays tried
            # (asked again, an idle spot host kept for diversity and given up was kept again, without end: 98aef55).
            # Finite: a key is kept at most once, so spot hosts are opened, and released, finitely often, and between
            # two releases each refused key is asked at most once.
            tried -= refused
            refused.clear()

    def _drop_mends(self, mends: list[_Inst]) -> None:
        """Once the spot rules hold: the idle on-demand capacity settle_spot opened for the fleet's spot share or buffer
        that they hold without (the spot host it stood beside given up after), last opened first. Kept, it held the
        budget or a pool's slot that running work kept out needs: settle_spot kept the idle on-demand i2 for the share,
        then gave up the spot i3 all the same, and the $15/h budget left no room for i0 where t2's guaranteed j8 ran,
        so greedy's plan evicted it, and apply's re-check refused it (fleet107; fleet106 alike, t1's guaranteed j2)."""
        for inst in reversed(mends):
            c = inst.cap
            if (inst is not self.opened.get(c.key) if isinstance(c, Host) else inst.key != f"{c.key}#{self.bought.get(c.offer_key, 0) - 1}") \
                    or any(n for (_, hk), n in (*self.a.stay.items(), *self.a.x.items()) if hk == c.key):
                continue  # (gone already, work on it, or not its offer's last bought: opened again, it would be another)
            if isinstance(inst.cap, Host):
                self._close(inst)
            else:
                self._unbuy(inst)
            if not self._spot_rules_hold():
                self._open(inst.cap)  # (the rules need it: back)

    def _diversity_holds(self) -> bool:
        sp = self.p.spot
        types, zones = self.led.spot_sites()
        return not types or diversity_ok(len(types), len(zones), sp.min_instance_types, sp.min_zones)

    def _release_tenant_spot(self, order: list[Demand]) -> bool:
        """Where a tenant's spot share alone is broken: its lowest-ranked job staying on spot no longer stays (a gang
        whole), and a spot host that leaves empty goes; the job is placed anew after, where its rules allow. Giving up
        the whole host stopped another tenant's guaranteed job beside it, which no rule of that tenant required, and
        `apply --plan` refused the plan (fleet42). False if no tenant is over its share with a job on spot."""
        over = self._tenants_over_spot()
        if not over:
            return False
        spot = {k for k, i in self.opened.items() if i.cap.market == "spot"}
        stays_of: dict[str, list[tuple[str, int]]] = {}  # (one pass over the stays, not one per demand)
        for (dk, hk), n in self.a.stay.items():
            if n:
                stays_of.setdefault(dk, []).append((hk, n))
        for d in reversed(order):
            if d.tenant not in over:
                continue
            cells = stays_of.get(d.key, [])
            if not any(hk in spot for hk, _ in cells):
                continue
            if not d.gang:
                cells = [next((hk, 1) for hk, _ in cells if hk in spot)]
            for hk, n in cells:
                for _ in range(n):
                    self._unrecord(d, self.opened[hk], stay=True)
            self.a.placed[d.key] -= 1
            self._charge_quota(d, -1)
            for hk in sorted({hk for hk, _ in cells}):
                if not any(n for (_, h), n in self.a.stay.items() if h == hk):
                    self._close(self.opened[hk])
            return True
        return False

    def _lowest_ranked(self, hosts: list[_Inst], order: list[Demand]) -> _Inst:
        """The host whose best-ranked staying job ranks lowest; a host nothing stays on comes last. Only jobs
        that still stay count: a released job leaves a zero in `stay`, and counting it chose an emptied host
        again and again, forever (fleet14)."""
        best = self._host_ranks(order)
        return max(hosts, key=lambda i: (best.get(i.key, -1), i.key))

    def _host_ranks(self, order: list[Demand]) -> dict[str, int]:
        """Host key -> the rank in `order` of its best-ranked job staying on it (hosts nothing stays on: absent)."""
        rank = {d.key: i for i, d in enumerate(order)}
        best: dict[str, int] = {}
        for (dk, hk), n in self.a.stay.items():
            if n:
                best[hk] = min(best.get(hk, len(rank)), rank.get(dk, 0))
        return best

    def _ballast_buys(self) -> list[Capacity]:
        """The on-demand instances to buy that, standing idle, mend the fleet's spot share and on-demand buffer for the
        spot hosts kept, within max_new, pool ceilings, cloud quotas and the budget; [] if none does. The cheapest of:
        the instances cheapest per GPU (vCPU), one at a time, until they mend them, or any first few of those with the
        cheapest single offer that then mends them alone. Buying the cheapest offer that mends them alone first, a
        g5.12xlarge ($5.67/h) stood idle where two g5.xlarge ($2.01/h) mend the share too (fleet121)."""
        sp = self.p.spot
        (spot, total), idle = self.led.spot(), self.led.idle_on_demand()
        offers = sorted((c for c in self.offer.values() if c.market != "spot" and self._prim(c) > 0),
                        key=lambda c: (c.price / self._prim(c), c.key))
        chain: list[Capacity] = []  # the cheapest per unit, one at a time
        spent = 0.0
        best: tuple[int, Capacity | None] | None = None  # the best set: the first n of `chain`, and the closing offer
        best_price = math.inf
        pending = Pending()
        def openable(c: Capacity) -> bool:
            return self.bought.get(c.offer_key, 0) + pending.buying(c) < c.max_new and self._may_open(c, pending)

        # The rules asked of an offer only until one is found (the cheapest that mends, else the cheapest per unit), and
        # no longer once the instances so far cost as much as the best set: asking every offer for each of the ~500
        # instances a 2k-job fleet's 25% buffer buys one by one was 1.4 s.
        while spent < best_price - 1e-9:
            if spot_share_ok(spot, total, sp.max_spot_fraction) and buffer_ok(idle, spot, sp.on_demand_buffer_percent):
                best = (len(chain), None)
                break
            whole = sorted((c for c in offers if self._mends_alone(c, spot, total, idle)), key=lambda c: (c.price, c.key))
            close = next((c for c in whole if openable(c)), None)
            if close is not None and spent + close.price < best_price - 1e-9:
                best, best_price = (len(chain), close), spent + close.price
            c = next((c for c in offers if openable(c)), None)
            if c is None:
                break
            chain.append(c)
            spent += c.price
            pending.open(c, self._prim(c))
            total, idle = total + self._prim(c), idle + self._prim(c)
        if best is None:
            return []
        n, close = best
        return chain[:n] + ([close] if close is not None else [])

    def _mends_alone(self, c: Capacity, spot: float, total: float, idle: float) -> bool:
        """Does on-demand capacity c, standing idle beside the plan's (spot, total, idle on-demand) share units, keep
        the fleet's spot share and on-demand buffer on its own?"""
        sp = self.p.spot
        return spot_share_ok(spot, total + self._prim(c), sp.max_spot_fraction) \
            and buffer_ok(idle + self._prim(c), spot, sp.on_demand_buffer_percent)

    def _adds_diversity(self) -> Callable[[Capacity], bool]:
        """Does spot capacity c add an instance type or zone the SpotPolicy still asks for (in the plan so far)?"""
        sp = self.p.spot
        types, zones = self.led.spot_sites()
        want_type, want_zone = len(types) < sp.min_instance_types, len(zones) < sp.min_zones
        return lambda c: c.market == "spot" and (want_type and c.instance_type not in types or want_zone and c.zone not in zones)

    def _diversity_spare(self, tried: set[str]) -> Capacity | None:
        """The cheapest idle spot host the fleet has that adds a spot instance type or zone the SpotPolicy
        still asks for, within pool ceilings and the budget."""
        adds = self._adds_diversity()
        cands = [h for hs in self.idle.values() for h in hs if h.key not in self.opened and h.key not in tried and adds(h)]
        keeping, self.keeping = self.keeping, True  # (the spot rules are what this settles: only ceilings and budget)
        try:
            return min((h for h in cands if self._may_open(h)), key=lambda h: (h.price, h.key), default=None)
        finally:
            self.keeping = keeping

    def _fleet_spot_rules_hold(self) -> bool:
        """The fleet's spot share and on-demand buffer: what more on-demand capacity mends."""
        return not self._fleet_spot_rules_broken()

    def _fleet_spot_rules_broken(self) -> tuple[str, ...]:
        """Which of the fleet's spot share and on-demand buffer the plan so far breaks ("spot-share", "spot-buffer")."""
        sp = self.p.spot
        (spot, total), idle = self.led.spot(), self.led.idle_on_demand()
        return (("spot-share",) if not spot_share_ok(spot, total, sp.max_spot_fraction) else ()) \
            + (("spot-buffer",) if not buffer_ok(idle, spot, sp.on_demand_buffer_percent) else ())

    def _spot_rules_hold(self) -> bool:
        return self._fleet_spot_rules_hold() and self._other_spot_rules_hold()

    def _tenants_over_spot(self) -> set[str]:
        """The tenants over their own spot share (tenant_max_spot_fraction)."""
        return {t for t, r in self.p.tenants.items() if r.spot_fraction is not None and not spot_share_ok(*self.led.tenant_spot(t), r.spot_fraction)}

    def _other_spot_rules_hold(self) -> bool:
        """Spot diversity and the tenants' spot shares: what more on-demand capacity does not mend."""
        return self._diversity_holds() and not self._tenants_over_spot()

    def _release(self, inst: _Inst) -> None:
        """Give up a kept host: every job staying on it is no longer placed (whole, for gangs)."""
        hosts_of = {}
        for (dk, hk), n in list(self.a.stay.items()):
            if hk == inst.key and n:
                hosts_of[dk] = n
        emptied: set[str] = set()
        for dk in hosts_of:
            d = self.p.demand(dk)
            # Every item of d kept anywhere goes (a gang is whole or nothing; identical jobs: those here).
            cells = [(hk, n) for (k, hk), n in self.a.stay.items() if k == dk and n and (d.gang or hk == inst.key)]
            jobs_lost = 1 if d.gang else sum(n for _, n in cells)
            for hk, n in cells:
                host = self.opened[hk]
                emptied.add(hk)
                for _ in range(n):
                    self._unrecord(d, host, stay=True)
            self.a.placed[dk] -= jobs_lost
            self._charge_quota(d, -jobs_lost)
        # Only the hosts this leaves empty: an idle on-demand host settle_spot kept for the buffer stays (closing it
        # too gave up the next spot host for a buffer it had mended, or bought an identical host to replace it).
        # The released host itself goes even when nothing stayed on it (a spot host kept idle for diversity): a
        # release that changes nothing would be asked for again.
        for hk in [k for k in sorted(emptied | {inst.key}) if not any(n for (dk, h), n in self.a.stay.items() if h == k)]:
            self._close(self.opened[hk])

    def _heal(self, d: Demand, survivors: list[Capacity]) -> None:
        """A gang that lost replicas: keep the survivors and place the missing ones beside them
        (same zone, or same offer for a placement group). If that fails it is re-placed whole later."""
        if gang_split(d, survivors):
            return
        opened_here, insts = [], []
        for c in survivors:
            inst = self.opened.get(c.key)
            if inst is None:
                if not self._may_open(c):
                    break
                inst = self._open(c)
                opened_here.append(inst)
            if not inst.fits(d) or self._refuses(self.led.refuses_item(d, c, spot_share=not self.keeping)):
                break
            self._record(d, inst, stay=True)
            insts.append(inst)
        else:
            missing = d.replicas - len(survivors)
            plan = (self._plan_items(d, missing, None, only_offer=survivors[0].offer_key) if d.gang_mode == "placement-group"
                    else self._plan_items(d, missing, [f"{survivors[0].cloud}/{survivors[0].zone}"]))
            if plan is not None:
                _commit(self, d, plan)
                self.a.placed[d.key] += 1
                self._charge_quota(d)
                return
        for inst in insts:  # undo
            self._unrecord(d, inst, stay=True)
        for inst in opened_here:
            self._close(inst)

    def _stop_running(self, v: Demand, inst: _Inst) -> None:
        """Stop one running job of v on inst (preempted, reclaimed or displaced): its room, its placement, its quota."""
        self.stops += 1
        self._unrecord(v, inst, stay=True)
        self.a.placed[v.key] -= 1
        self._charge_quota(v, -1)

    def _keep_running_again(self, v: Demand, inst: _Inst) -> None:
        """Undo `_stop_running`."""
        self.stops -= 1
        self._record(v, inst, stay=True)
        self.a.placed[v.key] += 1
        self._charge_quota(v)

    def _unrecord(self, d: Demand, inst: _Inst, stay: bool) -> None:
        inst.take(d, sign=-1)
        if inst in self.full:  # room again
            self.full.remove(inst)
            self.buckets.setdefault(inst.cap.offer_key, []).append(inst)
        book = self.a.stay if stay else self.a.x
        book[(d.key, inst.cap.key)] -= 1
        self.led.remove_item(d, None, inst.key)

    def _close(self, inst: _Inst) -> None:
        c = inst.cap
        (self.full if inst in self.full else self.buckets[c.offer_key]).remove(inst)
        self.opened.pop(c.key, None)
        self.a.use[c.key] -= 1
        self.idle.setdefault(c.offer_key, []).append(c)
        self.led.remove_instance(inst.key)

    def keep_stuck_gangs(self, order: list[Demand], stuck: set[str]) -> None:
        """Once the new work is placed: a running gang that may only stay or stop (`stuck_gangs`, WhenEmpty) and stays
        nowhere is kept again where it runs, where every host it runs on is open (none is opened for it) and no rule
        refuses it now. settle_spot gives up spot before new work is placed: t3's low MIG gang j9 went with its spot
        host for spot diversity and t3's spot share, the host was opened again for t2's j3 beside it, and t3's new
        critical j7 on on-demand then held t3's share; placing anew brings other jobs back, never a gang that may not
        move, and apply's re-check refused greedy's plan, which stopped j9 for no rule (fleet101; CP-SAT's kept it)."""
        hosts = {c.key: c for c in self.p.hosts()}
        for d in order:
            if d.key not in stuck or self.a.placed[d.key] >= d.running_jobs or d.running_items < d.running_jobs * d.replicas:
                continue
            for job, iids in d.running:
                cells = iids[:1] if d.bundle > 1 else iids
                stays = {h: self.a.stay.get((d.key, h), 0) for h in cells}
                if self.a.placed[d.key] >= d.running_jobs:
                    break
                if all(i in self.opened for i in cells) and any(stays[h] < cells.count(h) for h in stays):
                    self._keep(d, job, iids, hosts)

    def drop_idle_hosts(self) -> None:
        """keep_fleet kept every host before placing; one nothing went on goes where no rule needs it (its pool's
        minimum, the spot rules). Kept, a host a grown gang left empty stood idle in greedy's plan, and the plan after
        its apply deleted it ("no longer needed": fleet52)."""
        for key in sorted(k for k, inst in self.opened.items() if isinstance(inst.cap, Host) and not any(inst.items.values())):
            c = self.opened[key].cap
            if not pool_min_ok(self.led.pool_count(c.pool) - 1, self.p.pool_bounds.get(c.pool, (0, 0))[0]):
                continue
            self._close(self.opened[key])
            if not self._spot_rules_hold():
                self._open(c)  # (an idle on-demand host the spot share or the buffer counts, a spot one diversity does)

    def drop_idle(self, inst: _Inst) -> None:
        """An open instance nothing runs on now goes where no rule needs it (its pool's minimum, the spot rules): a host
        closed, an instance bought given back if it is its offer's last (`_unbuy`)."""
        c = inst.cap
        if isinstance(c, Host):
            if self.opened.get(c.key) is not inst:
                return
        elif not self.bought_insts.get(c.offer_key) or self.bought_insts[c.offer_key][-1] is not inst:
            return
        if not pool_min_ok(self.led.pool_count(c.pool) - 1, self.p.pool_bounds.get(c.pool, (0, 0))[0]):
            return
        self._close(inst) if isinstance(c, Host) else self._unbuy(inst)
        if not self._spot_rules_hold():
            self._open(c)  # (the rules need it: back; bought, the same key: its offer's last again)

    def drop_spare_on_demand(self) -> None:
        """Once nothing more is placed: an idle on-demand instance (a host kept or ballast bought for the spot share or
        the buffer) that the fleet's spot rules then hold without (the idle room of on-demand instances bought for work
        later in the pass may cover the buffer), and no pool minimum needs, goes, the dearest per unit first (the next
        plan keeps idle hosts cheapest per unit first: settle_spot). Kept, a g5.12xlarge standing idle for a buffer the
        idle GPUs of an a2-highgpu-4g bought for work in the same plan covered was deleted by the plan right after its
        apply (the lifecycle machine, greedy alone)."""
        sp = self.p.spot
        insts = list(self.opened.values()) + [i for lst in self.buckets.values() for i in lst if not isinstance(i.cap, Host)] \
            + [i for i in self.full if not isinstance(i.cap, Host)]
        idle = [i for i in insts if i.cap.market != "spot" and self._prim(i.cap) > 0 and not any(i.items.values())]
        for inst in sorted(idle, key=lambda i: (self._prim(i.cap) / i.cap.price if i.cap.price else math.inf, i.key)):
            c, prim = inst.cap, self._prim(inst.cap)
            (spot, total), left = self.led.spot(), self.led.idle_on_demand() - prim
            if (pool_min_ok(self.led.pool_count(c.pool) - 1, self.p.pool_bounds.get(c.pool, (0, 0))[0])
                    and spot_share_ok(spot, total - prim, sp.max_spot_fraction) and buffer_ok(left, spot, sp.on_demand_buffer_percent)):
                if isinstance(c, Host):
                    self._close(inst)
                else:
                    self._unbuy(inst)

    def pool_minimums(self, order: list[Demand]) -> None:
        """Open the cheapest instances each pool's min_instances still needs (hosts first). Where the budget alone
        refuses them, give up the kept host whose work ranks lowest among those whose price makes room, and try
        again: its jobs are placed anew after (on cheaper capacity where there is some). A pool minimum and the
        budget are both hard rules; the kept fleet can break them together only where it lost what met the
        minimum (fleet26: a spot m6i that spot diversity gave up was aws-cpu's only instance, and keeping an
        a2-highgpu-4g for a 1-GPU job left no budget for an on-demand one; greedy's answer broke the minimum).
        Spot-only pools first: only the spot rules' help meets their minimums (the spot diversity asks for beside them,
        the on-demand ballast), which may need the slots another pool's minimum would take on-demand (fleet130: gcp-a100's
        minimum, met first on-demand, took the one slot of the only spot in a second zone gcp-cpu's needed). A minimum it cannot buy is left
        unmet, and the next pool's is bought."""
        markets: dict[str, set[str]] = {}
        for c in self.p.capacities:
            markets.setdefault(c.pool, set()).add(c.market)
        for pool, (lo, _) in sorted(self.p.pool_bounds.items(), key=lambda kv: markets.get(kv[0]) != {"spot"}):
            cands = [h for hs in self.idle.values() for h in hs if h.pool == pool]
            cands += [o for o in self.offer.values() if o.pool == pool]
            cands.sort(key=lambda c: (not isinstance(c, Host), c.price, c.key))  # hosts first
            start = 0  # cands before it are opened hosts or offers bought to max_new (so they stay, but for _give_way)
            # (each instance opened scanned them all again: the applied 5k fleet's plain greedy opens its 10,000
            # instances kept warm here, ~600 a pool, 0.15 s of CPU)
            while not pool_min_ok(self.led.pool_count(pool), lo):
                pick, refused = None, []
                for i in range(start, len(cands)):
                    c = cands[i]
                    if isinstance(c, Host) and c.key in self.opened or isinstance(c, Offer) and self.bought.get(c.offer_key, 0) >= c.max_new:
                        if i == start:
                            start += 1
                        continue
                    if self._may_open(c):
                        pick = c
                        break
                    refused.append(c)
                if pick is None:
                    # The cheapest the budget alone refuses, asked only now that it is needed: nothing changed since the
                    # scan (_may_open changes no total), so it is the one the scan would have found. (Asked of every
                    # candidate refused before the pick, the applied 5k fleet's plain greedy asked it 15k times to open
                    # 3.7k instances: ~0.05 s of CPU a PR plan on a quiet core.)
                    short = next((c for c in refused if self.led.refuses_open(c, 1, _NOTHING, self._owed(c, _NOTHING)) == "fleet-budget"), None)
                    if any(self._open_with_ballast(c, lo - self.led.pool_count(pool)) for c in cands[start:]):
                        continue  # (a spot-only pool's minimum beside the on-demand capacity the spot share asks for)
                    if short is None or not self._give_way(short, order):
                        # (the pools after it still get theirs, and the budget keeps nothing for a minimum that cannot be
                        # bought: greedy had returned here, and a later pool's affordable minimum went unbought)
                        self.floor_price.pop(pool, None)
                        break
                    start = 0  # (a host given up may leave one of this pool's empty: closed, it is a candidate again)
                    continue
                self._open(pick)

    def _open_with_ballast(self, c: Capacity, n: int) -> bool:
        """Open spot capacity c for a pool minimum, an idle host or up to n instances of an offer (what the minimum still
        needs), together with the on-demand capacity that, standing idle, keeps the fleet's spot share and on-demand
        buffer (`_ballast_buys`), where every spot rule then holds (diversity and the tenants' shares too); False,
        nothing changed, where none does. (A spot-only MIG pool at min_instances 2 under max_spot_fraction 0.25:
        greedy's plan left it empty, the share refusing its spot instances, where CP-SAT bought on-demand GPUs beside
        them: the h7 hunt. One at a time, the first one's ballast, three g5.xlarge, filled the pool the second one's
        needed. Hosts first: an idle spot host the pool has is kept, not bought again. And the spot instances spot
        diversity asks for beside it: a spot-only CPU pool's minimum under min_zones 2 went unmet where CP-SAT bought a
        spot A100 in a second zone.)"""
        host = isinstance(c, Host)
        if c.market != "spot" or (host and c.key in self.opened):
            return False
        opened: list[_Inst] = []
        for _ in range(1 if host else min(n, c.max_new - self.bought.get(c.offer_key, 0))):
            reserve = self._owed(c, _NOTHING) if self.floor_price else 0  # (as _may_open: unmet pool minimums are owed)
            if self.led.refuses_open(c, 1, _NOTHING, reserve, spot_share=False):
                break
            opened.append(self._open(c))
        if not opened:
            return False
        buy_spot, ballast_after, self.buy_spot, self.ballast_after = self.buy_spot, self.ballast_after, True, True
        try:  # (the spot instances diversity asks for beside it, as _place_spot_diverse buys them: the share mended after)
            while not self._diversity_holds() and (spare := _diversity_buy(self)) is not None:
                opened.append(self._open(spare))
        finally:
            self.buy_spot, self.ballast_after = buy_spot, ballast_after
        buys = self._ballast_buys()
        if buys or self._fleet_spot_rules_hold():
            opened += [self._open(b) for b in buys]
            if self._spot_rules_hold():
                return True
        for inst in reversed(opened):
            if isinstance(inst.cap, Host):
                self._close(inst)
            else:
                self._unbuy(inst)
        return False

    def _give_way(self, c: Capacity, order: list[Demand]) -> bool:
        """Release the kept host, outside c's pool and not frozen, whose work ranks lowest among those whose price
        would let c open under the budget; False if there is none."""
        need = micro(c.price) + self._owed(c, _NOTHING) + self.led.spend() - micro(self.p.budget)
        hosts = [i for i in self.opened.values() if isinstance(i.cap, Host) and not i.cap.frozen and i.cap.pool != c.pool
                 and micro(i.cap.price) >= need]
        if not hosts:
            return False
        self._release(self._lowest_ranked(hosts, order))
        return True

    def _plan_gang(self, d: Demand):
        best, best_cost = None, math.inf
        if d.gang_mode == "placement-group":
            keys = [k for k in self.offer if self._compatible(d, k)]
            for k in keys:
                plan = self._plan_items(d, d.replicas, None, only_offer=k)
                if plan is not None and _plan_cost(self.p, d, plan) < best_cost:
                    best, best_cost = plan, _plan_cost(self.p, d, plan)
            return best
        for site in self.sites:
            plan = self._plan_items(d, d.replicas, [site])
            if plan is not None and _plan_cost(self.p, d, plan) < best_cost - 1e-9:
                best, best_cost = plan, _plan_cost(self.p, d, plan)
        return best

    def _plan_items(self, d: Demand, k: int, sites, only_offer: str | None = None):
        """Where k items of d would go: room on open instances first, then capacity to open, Karpenter's
        order (existing nodes, then new ones). Returns [(offer key, _Inst or _Buy)] or None."""
        if only_offer:
            keys = [only_offer] if only_offer in self.rep and self._compatible(d, only_offer) else []
        else:
            keys = self._keys_at(d, sites)
        pending = Pending()  # the items' tenant charges and spot share, then the instances to open, as planned
        # Not on open instances for placement groups, which launch together.
        plan = [] if d.gang and d.gang_mode == "placement-group" else self._plan_on_open(d, k, keys, pending)
        if len(plan) < k:
            self._plan_buys(d, k, keys, plan, pending)
        return plan if len(plan) >= k else None

    def _plan_on_open(self, d: Demand, k: int, keys: list[str], pending: Pending) -> list:
        """Up to k items of d in the room on open instances of these offers, first fit, the offers in order of
        their egress/latency cost for d."""
        plan: list = []
        taken: dict[int, dict] = {}  # id(inst) -> tentative free
        for kk, inst in self._open_room(d, keys):
            if d.nvlink and isinstance(inst.cap, Host) and inst.gpu_residents and not inst.cap.one_nvlink_domain:
                continue
            if self.sparing_buffer and self.led.in_buffer(inst.key) or self.off_spot and inst.cap.market == "spot":
                continue
            free = taken.get(id(inst), inst.free)
            while len(plan) < k and all(free.get(dd, 0) >= d.req(dd) - 1e-9 for dd in d.dims if d.req(dd) > 0):
                if self._refuses(self.led.plan_item(d, inst.cap, pending)):
                    break
                free = taken.setdefault(id(inst), dict(free))
                for dd in d.dims:
                    free[dd] = free.get(dd, 0) - d.req(dd)
                plan.append((kk, inst))
            if len(plan) >= k:
                return plan
        return plan

    def _open_room(self, d: Demand, keys: list[str]):
        """The open instances of these offers with room, as (offer key, instance), the offers in order of their
        egress/latency cost for d; those in `freed` first."""
        keys = sorted(keys, key=lambda kk: self.p.cost_coef(d, self.rep[kk]))
        if not self.freed:
            yield from ((kk, inst) for kk in keys for inst in self.buckets.get(kk, []))
            return
        yield from ((kk, inst) for kk in keys for inst in self.buckets.get(kk, []) if inst.key in self.freed)
        yield from ((kk, inst) for kk in keys for inst in self.buckets.get(kk, []) if inst.key not in self.freed)

    def _plan_buys(self, d: Demand, k: int, keys: list[str], plan: list, pending: Pending) -> None:
        """Top `plan` up to k items of d on capacity to open: idle hosts and new instances of offers, cheapest
        per item first, each within the rules with what is already planned (`pending`)."""
        cands = []
        for kk in keys:
            if not (d.gang and d.gang_mode == "placement-group"):
                cands += self.idle.get(kk, [])
            if kk in self.offer:
                cands.append(self.offer[kk])
        cands.sort(key=lambda c: (c.price / max(1, min(self.fits(d, c), k - len(plan))) + self.p.cost_coef(d, c), not isinstance(c, Host), c.key))
        used_hosts: set[str] = set()
        for c in cands:
            f, okey = self.fits(d, c), c.offer_key
            while len(plan) < k:
                if isinstance(c, Host):
                    if c.key in used_hosts:
                        break
                elif self.bought.get(okey, 0) + pending.buying(c) >= c.work_most:  # (the offer's ballast stands idle)
                    self._may_open(c, pending)  # (only to note a rule that also refuses: the pool's max_instances bounds max_new)
                    break
                if not self._may_open(c, pending):
                    break
                ok_items = 0
                for _ in range(min(f, k - len(plan))):
                    if self._refuses(self.led.plan_item(d, c, pending)):
                        break
                    ok_items += 1
                if ok_items == 0:
                    break
                pending.open(c, self._prim(c))
                if isinstance(c, Host):
                    used_hosts.add(c.key)
                # One instance bought: its first items go on it, as a marker the caller opens once.
                marker = _Buy(c)
                plan += [(okey, marker)] * ok_items
            if len(plan) >= k:
                break

    def finish(self) -> None:
        # Hosts opened only for pool minimums keep use=1; hosts and offers never opened are released (0).
        for c in self.p.capacities:
            self.a.use.setdefault(c.key, 0)
        self.a.work = sum(d.weight * self.a.placed[d.key] for d in self.p.demands)
        self.a.cost = self.led.cost()
        bought = [i for lst in self.buckets.values() for i in lst if not isinstance(i.cap, Host)]
        bought += [i for i in self.full if not isinstance(i.cap, Host)]
        for inst in sorted(bought, key=lambda i: (i.cap.key, int(i.key.rsplit("#", 1)[1]))):
            self.a.packed.setdefault(inst.cap.key, []).append({k: n for k, n in inst.items.items() if n})


def _plan_cost(p: Problem, d: Demand, plan) -> float:
    """Instances bought plus egress/latency of every item: what a gang's zone choice compares."""
    bought = {id(t): t.price for _, t in plan if isinstance(t, _Buy)}
    return sum(bought.values()) + sum(p.cost_coef(d, t.cap) for _, t in plan)


class _Buy:
    """One instance to open, shared by the items planned onto it."""

    __slots__ = ("cap", "inst")

    def __init__(self, cap: Capacity):
        self.cap, self.inst = cap, None

    @property
    def price(self) -> float:
        return self.cap.price


def _dominant(d: Demand, p: Problem, cache: dict) -> float:
    k = (d.gpus, d.gpu_type, d.mig, d.cpu, d.memory_gib)
    v = cache.get(k)
    if v is None:
        v = 0.0
        if "offers" not in cache:  # instances of one offer are alike: one of each is enough
            cache["offers"] = list({c.offer_key: c for c in p.capacities}.values())
        for c in cache["offers"]:
            if rules_allow(d, c):
                v = max(v, max((d.req(dim) / c.cap(dim) for dim in d.dims if c.cap(dim) > 0), default=0.0))
        cache[k] = v
    return v


def greedy(problem: Problem, keep_fleet: bool = False, move_spot: bool = False) -> Assignment:
    """First-fit decreasing. keep_fleet: once what runs is kept and the spot rules settled, keep
    every other instance the fleet has (within pool ceilings, the budget and the spot share)
    before placing anything: the answer closest to the fleet as it is. move_spot: also plan moving spot work
    (`_Greedy.move_spot_work`) for greedy's own plan, not CP-SAT's warm start (strategy.greedy_plan says why).

    Where the SpotPolicy asks for spot diversity or an on-demand buffer, greedy also plans as it does without them,
    spot bought where it is cheapest, then settles them (`_settle_spot_first`: the idle spot instances of the types and
    zones diversity still asks for, the idle on-demand capacity the buffer keeps); that answer is greedy's where it
    keeps every rule and ranks above the one that buys spot only for work that waits otherwise ((work, -cost), as
    strategy.warm_start compares). A fleet of spot-eligible work under `min_zones: 2` or a 25% buffer ran all of it on
    on-demand in greedy's plan (`--time-limit 0`, the plan a solve falls back to, the warm start), at on-demand prices
    (eight 4-vCPU jobs: $1.54/h against CP-SAT's $1.06/h, eight spot and two idle on-demand).

    Where a pool's maximum kept a running job on on-demand hosts out while the spot work kept breaks the fleet's spot
    share or on-demand buffer (or a tenant's spot share), greedy also plans keeping the on-demand jobs first among
    running jobs ranked alike, and takes that answer where it ranks above ((work, -cost)). Kept in the placing order,
    t1's normal job on a spot A100 took the pool's one slot from t2's normal job on the on-demand A100 beside it, the spot
    share then gave up t2's low job's spot T4 too, and greedy kept one job of three where CP-SAT kept two (fleet100).
    Not always: the spot job kept may be the one spot diversity needs."""
    a, contested, movable = _run(problem, keep_fleet, spot_first=False, ask_movable=move_spot)
    od_first = False
    if contested:
        c, _, _ = _run(problem, keep_fleet, spot_first=False, on_demand_first=True)
        if c is not None and ranks_above(problem, c, a):
            a, od_first = c, True
    if movable:
        m, _, _ = _run(problem, keep_fleet, spot_first=False, on_demand_first=od_first, move_spot=True)
        if m is not None and _ranks_above_keeping_running(problem, m, a):
            a = m
    sp = problem.spot
    if sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 or sp.min_zones > 1:
        b, _, _ = _run(problem, keep_fleet, spot_first=True, on_demand_first=od_first)
        if b is not None and ranks_above(problem, b, a):
            return b
    return a


def ranks_above(p: Problem, b: Assignment, a: Assignment, ties: bool = False) -> bool:
    """(pool minimums met, work, -cost), as greedy's answers are compared (a hair of cost: rounding); `ties`: b ranked
    the same counts too. The minimums first: a hard rule, which the spot-first pass alone met under an on-demand buffer
    (greedy restrains spot elsewhere), and the cheaper answer that broke it won (fleet129)."""
    key_b, key_a = (-pools_short(p, b), b.work), (-pools_short(p, a), a.work)
    if key_b != key_a:
        return key_b > key_a
    return -b.cost >= -a.cost - 1e-9 * max(1.0, a.cost) if ties else -b.cost > -a.cost + 1e-9 * max(1.0, a.cost)


def pools_short(p: Problem, a: Assignment) -> int:
    """Instances the answer leaves its pools short of their min_instances."""
    pool_of = {c.key: c.pool for c in p.capacities}
    count: dict[str, int] = {}
    for k, n in a.use.items():
        if n and k in pool_of:
            count[pool_of[k]] = count.get(pool_of[k], 0) + n
    return sum(max(0, lo - count.get(pool, 0)) for pool, (lo, _) in p.pool_bounds.items())


def _ranks_above_keeping_running(p: Problem, b: Assignment, a: Assignment) -> bool:
    """Does b keep every running job a keeps (per demand: no guarantee traded) and rank above it as the model's tiers
    do: per class, highest first, running jobs kept then work placed, then the cost tier (`_model_cost`)? For a pass
    that moves running work. (On trace33, the pass that moves spot work keeps team-2's five running low spot-eligible jobs that the
    other gave up with their spot hosts, leaving five of its new low jobs pending on its quota instead: the same work
    summed, more of it running work kept.)"""
    classes = sorted({d.klass for d in p.demands}, reverse=True)

    def rank(x: Assignment) -> tuple:
        kept = {c: 0 for c in classes}
        work = {c: 0 for c in classes}
        for d in p.demands:
            kept[d.klass] += _running_kept(d, x)
            work[d.klass] += d.weight * x.placed[d.key]
        return (*((kept[c], work[c]) for c in classes), -_model_cost(p, x))

    if pools_short(p, b) != pools_short(p, a):
        return pools_short(p, b) < pools_short(p, a)  # (a hard rule first, as ranks_above)
    if any(_running_kept(d, b) < _running_kept(d, a) for d in p.demands if d.running_jobs):
        return False
    rb, ra = rank(b), rank(a)
    return rb[:-1] > ra[:-1] or rb[:-1] == ra[:-1] and rb[-1] > ra[-1] + 1e-9 * max(1.0, -ra[-1])


def _running_kept(d: Demand, a: Assignment) -> int:
    """d's running jobs the answer keeps, in place or moved (a placed job of d is one of its running ones first)."""
    return min(a.placed[d.key], d.running_jobs)


def _model_cost(p: Problem, a: Assignment) -> float:
    """$/h as the model's cost tier counts an answer (objective.cost): instances, each item's egress, latency and spot
    preference terms, and every running item moved at its amortised restart (objective.move_weight). On instances
    alone, moving t2's spot T4 job onto the on-demand T4 bought as ballast read $0.06/h cheaper than keeping it, and
    $0.02/h dearer with the move's $2 over 24 h: CP-SAT's plan keeps it (fleet100)."""
    from reconciler.ledger import MILLI
    from reconciler.solve.objective import move_weight

    caps = {c.key: c for c in p.capacities}
    total = a.cost
    stays: dict[str, int] = {}
    for book in (a.stay, a.x):
        for (dk, ck), n in book.items():
            if n:
                total += n * p.cost_coef(p.demand(dk), caps[ck])
    for (dk, _), n in a.stay.items():
        stays[dk] = stays.get(dk, 0) + n
    for d in p.demands:
        if d.running_jobs:
            kept = a.placed[d.key] * min(d.running_items, d.replicas) if d.gang else _running_kept(d, a)
            total += max(0, kept - stays.get(d.key, 0)) * move_weight(d, p.placement) / MILLI
    return total


def _run(problem: Problem, keep_fleet: bool, spot_first: bool, on_demand_first: bool = False,
         move_spot: bool = False, ask_movable: bool = False) -> tuple[Assignment | None, bool, bool]:
    """One greedy pass (`greedy`); spot_first: spot bought as where neither spot diversity nor an on-demand buffer is
    asked, both settled at the end (None if they cannot be); on_demand_first: `_Greedy.on_demand_first`; move_spot:
    `_Greedy.move_spot_work` first. And whether a pass keeping on-demand work first may rank above it
    (`_on_demand_kept_out`), and, where ask_movable, whether one moving spot work may (`_Greedy.movable_spot_hosts`;
    not asked for CP-SAT's warm start, which never runs that pass)."""
    g = _Greedy(problem, spot_first, on_demand_first, move_spot)
    cache: dict = {}

    def rank(d: Demand) -> tuple:
        return -d.klass, -d.deadline_rank, -d.priority, -(d.running_jobs > 0), -d.gang, -_dominant(d, problem, cache)

    order = sorted(problem.demands, key=lambda d: (*rank(d), d.key))
    g.tie = {d.key: i for i, (_, ds) in enumerate(itertools.groupby(order, key=rank)) for d in ds}
    g.order = order
    g.keeping = True
    g.keep_running(order)
    g.keeping = False
    contested = not on_demand_first and _on_demand_kept_out(g)
    movable = ask_movable and not move_spot and bool(g.movable_spot_hosts())
    if move_spot:
        g.move_spot_work(order)
    g.settle_spot(order)
    # Running work a pool's maximum kept out (the room went to the work kept before it) is asked again once the spot
    # rules are settled, now under them: where settle_spot gave up a spot host, an on-demand host with work on it may
    # stay in its place. New work took that room otherwise, a higher class of its tenant under preemption Never
    # (a random fleet: pool at max 1 of 3, spot share broken; CP-SAT kept the on-demand job, greedy evicted it).
    g.keep_running(order)
    for d, cells in g.to_heal:
        if g._quota_ok(d):
            g._heal(d, cells)
    if keep_fleet:  # on-demand first, so the spot share has room for the spot instances after
        for c in sorted((h for hs in g.idle.values() for h in hs), key=lambda h: (h.market == "spot", h.key)):
            if c.key not in g.opened and g._may_open(c):  # (a budget keeps room for unmet pool minimums)
                g._open(c)
    g.pool_minimums(order)
    stuck = stuck_gangs(problem)
    # Every tenant's guaranteed work first, then the borrowed (a job that would take its tenant past its guarantee), each
    # in `order`: the model's tiers rank them so (solve/objective.py), and borrowed work placed new took room guaranteed
    # work needed, which the next plan reclaimed (`_place_reclaiming`: the borrowed job started by one apply stopped by
    # the next; test_stability, a pool's one slot given to t1's borrowed job before t2's guaranteed one).
    done: set[str] = set()  # demands a job of which could not be placed: not asked again
    share = _SpotShareWaits(g, done)
    share.borrowed = False
    protected = _Protected(g, order, stuck, share.retry)
    for d in order:
        # (a stuck demand is skipped as in the model: a running gang's jobs stay where they are or not at all)
        if d.key not in stuck and d.key not in done and not protected.ask(d):
            done.add(d.key)
            share.add(d)
        protected.asked(d)
    share.borrowed = True
    _place_borrowed(g, order, stuck, done, share, protected.retry)
    g.keep_stuck_gangs(order, stuck)
    _place_spot_diverse(g, order)
    if spot_first and not _settle_spot_first(g):
        return None, contested, movable
    if keep_fleet:
        g.drop_idle_hosts()
    g.drop_spare_on_demand()
    g.finish()
    return g.a, contested, movable


def _lending_share(g: _Greedy, d: Demand) -> float:
    """Its tenant's borrowed share half way through one more job of d, as greedy has placed so far (ledger.lending_share,
    of ledger.borrowed_share: what the model's fair-share tier equalises)."""
    r = g.p.tenants.get(d.tenant)
    return 0.0 if r is None else lending_share(r, g.led.tenant_use(d.tenant), d, g.p.fleet_capacity)


def _place_borrowed(g: _Greedy, order: list[Demand], stuck: set[str], done: set[str], share: "_SpotShareWaits",
                    placed: Callable[[], None]) -> None:
    """The jobs left once every tenant's guaranteed work is placed (they borrow, or could not be placed), one job at a
    time to the tenant borrowing the least share over its weight half way through its next job (`_lending_share`), its
    demands in `order` (class first): the model's tiers rank the fair share of borrowed capacity above every class's
    borrowed work (README, How it decides: tier 3, then 4; Tenants: equalised, then the rest by priority). Each
    demand's jobs placed whole in
    `order` gave the tenant of the largest jobs all the borrowed room (bench.dlrm, the emitted plan greedy's: 13 GPUs
    borrowed by one service while 80 waited borrowing none; fleet134); lent class by class, a tenant's high 1-GPU jobs
    took 4 of 6 borrowed GPUs where three tenants asked and CP-SAT split them 2/2/2 (tests/test_rules.py)."""
    at = {d.key: i for i, d in enumerate(order)}
    queues: dict[str, list[Demand]] = {}  # tenant -> its demands left, in reverse `order` (the next one last)
    for d in reversed(order):
        if d.key not in stuck and d.key not in done:
            queues.setdefault(d.tenant, []).append(d)
    heap = [(_lending_share(g, q[-1]), at[q[-1].key], t) for t, q in queues.items()]
    heapq.heapify(heap)
    while heap:
        was, _, t = heapq.heappop(heap)
        q = queues[t]
        now = _lending_share(g, q[-1])
        if now > was + 1e-12:  # it borrowed more since (`placed` placed a job of its): in line at its share now
            heapq.heappush(heap, (now, at[q[-1].key], t))
            continue
        d = q[-1]
        if g.a.placed[d.key] >= len(d.jobs):
            q.pop()
        elif not _place_jobs(g, d, True, placed, most=1):
            done.add(d.key)
            share.add(d)
            q.pop()
        if q:
            heapq.heappush(heap, (_lending_share(g, q[-1]), at[q[-1].key], t))


def _on_demand(iids: tuple[str, ...], hosts: dict[str, Capacity]) -> bool:
    """Does a running job run on on-demand hosts only (of those the problem has)?"""
    return all(i in hosts and hosts[i].market != "spot" for i in iids)


def _on_demand_kept_out(g: _Greedy) -> bool:
    """Once what runs is kept: does the kept spot work break a spot rule more on-demand capacity mends (the fleet's spot
    share or on-demand buffer, a tenant's spot share) while a pool's maximum keeps an on-demand host with running work
    on it closed?"""
    if g._fleet_spot_rules_hold() and not g._tenants_over_spot():
        return False
    hosts = {c.key: c for c in g.p.hosts()}
    return any(job not in g.kept and iids and _on_demand(iids, hosts)
               and any(i not in g.opened and g.led.refuses_open(hosts[i]) == "pool-max" for i in iids)
               for d in g.p.demands for job, iids in d.running)


class _Protected:
    """Before any new work: the running jobs inside their tenants' guarantees (TenantRules.protected_jobs) that are not
    kept where they run (settle_spot gave up their host, a pool's max kept them out), placed anew in `order`, as the
    model's first tier ranks them above all work. Placed in `order` with the new work, t1's new normal j7 went first,
    then t1's protected low j1 took the last room on the pool's one instance left, and t2's protected low j3, whose spot
    host settle_spot gave up, was evicted: apply's re-check refused greedy's plan, where CP-SAT's moved j3 beside j7
    (fleet105).

    Its tenant's new work of a higher class may take such a job's place (`_may_take_place`; not under preemption:
    Never), as the tier counts it. A 1-replica job is placed all the same, and gives way only while that work is asked
    (`ask`): taken off, then placed again where that work left it room and quota. Other work (a gang) is held for it
    instead, until the guaranteed tier has asked it (`asked`). Held until its own turn, t3's protected low j5 (its spot
    host given up for the fleet's spot share) waited for t3's normal 4-GPU j1, which t3's 4-GPU guarantee cannot hold
    beside it; j1 found no room (its pool at max_instances), and t1's new normal j2 took the pool's one A100 slot: greedy
    evicted j5 for no rule and apply's re-check refused the plan (fleet141; a higher class takes a protected job's place
    only where it is placed: plancheck.own_higher_class_units). Held only until j1 was asked, j5 still lost the slot to
    another tenant's work ranked before j1 (tests/test_greedy_preemption.py).

    One that found no room waits for it, and is asked again as soon as a stop frees some (`retry`), before any work
    placed after. az-a100-80 (max 1) ran t2's protected j2 on i1 and t3's on i2; j2 kept first, t3's j3 found no room;
    t2's new high j8 then stopped j2 for t2's quota (lawful), and t1's new normal j6 took the room j2 left on i1: greedy
    evicted j3 and apply's re-check refused the plan, where CP-SAT kept i2 with j3 (fleet142)."""

    def __init__(self, g: _Greedy, order: list[Demand], stuck: set[str], placed: Callable[[], None]):
        self.g, self.stuck, self.placed = g, stuck, placed
        self.protected = {j for r in g.p.tenants.values() for j in r.protected_jobs}
        self.stand_ins = g.p.placement.preemption != "Never"
        self.mine: dict[str, list[Demand]] = {}  # tenant -> its demands, in `order`
        for d in order:
            self.mine.setdefault(d.tenant, []).append(d)
        self.tried: set[str] = set()  # demands the guaranteed tier has asked: what of them is not placed waits no more
        self.held: dict[str, list[Demand]] = {}  # tenant -> its demands held for its waiting higher class, in `order`
        # tenant -> its 1-replica protected demands placed first that may give way (`ask`), and where they were placed
        self.placed_first: dict[str, dict[str, tuple[Demand, list[_Inst]]]] = {}
        self.waiting: list[Demand] = []  # demands some protected jobs of which found no room, in `order`
        self._place(order)
        self.seen = g.stops  # the stops `retry` has offered their room to `waiting`

    def _place(self, ds: list[Demand]) -> None:
        g = self.g
        for d in ds:
            n = sum(j in self.protected for j, _ in d.running) - g.a.placed[d.key]  # (identical jobs stand in for each other)
            if n <= 0 or d.key in self.stuck:
                continue
            if not (self.stand_ins and _may_take_place(g, d, self.mine[d.tenant], self.tried)):
                _place_jobs(g, d, False, self.placed, most=n)
            elif d.gang or d.replicas != 1 or d.bundle != 1:
                self.held.setdefault(d.tenant, []).append(d)
                continue
            else:
                self._place_first(d, n, self.placed)
            if sum(j in self.protected for j, _ in d.running) > g.a.placed[d.key]:
                self.waiting.append(d)

    def retry(self) -> None:
        """After a job is placed: where running jobs were stopped since (net of stops undone), the protected jobs
        waiting for room are asked again (`_place`), in `order`; then `placed` (the spot share's waiting jobs, which
        may stop more); until no more stops. Every job placed calls it, in both tiers, so the room a stop frees goes to
        them before any work placed after."""
        g = self.g
        while True:
            while self.waiting and g.stops != self.seen:
                self.seen = g.stops
                ds, self.waiting = self.waiting, []
                self._place(ds)
            self.placed()
            if not self.waiting or g.stops == self.seen:
                return

    def _place_first(self, d: Demand, n: int, placed: Callable[[], None] | None) -> None:
        """Place up to n jobs of d (1-replica) that may give way (`ask`), noting the instances they land on."""
        g = self.g
        g.log = []
        try:
            _place_jobs(g, d, False, placed, most=n)
            where = [i for i in g.log if i.items.get(d.key, 0) > 0]
        finally:
            g.log = None
        if where:
            self.placed_first.setdefault(d.tenant, {})[d.key] = (d, where)

    def ask(self, q: Demand) -> bool:
        """Place q's jobs in the guaranteed tier (`_place_jobs`), with its tenant's protected jobs placed first
        (`_place_first`) that q may take the place of off while it is asked (their new items there), then, where q
        took none of their room, placed again, first fit, where q left them room and quota (the room they had is left
        open: q's first). Meanwhile no other work is placed (the spot share's waiting jobs are asked after: `placed`).
        An instance they leave idle goes where no rule needs it."""
        g = self.g
        off: list[tuple[Demand, int, list[_Inst]]] = []
        for d, where in list(self.placed_first.get(q.tenant, {}).values()):
            if d.klass >= q.klass or not _may_take_place(g, d, self.mine[q.tenant], self.tried):
                continue
            n = 0
            for inst in where:
                while inst.items.get(d.key, 0) > 0 and g.a.x.get((d.key, inst.cap.key), 0) > 0:
                    g._unrecord(d, inst, stay=False)
                    g.a.placed[d.key] -= 1
                    g._charge_quota(d, -1)
                    n += 1
            if n:
                del self.placed_first[q.tenant][d.key]
                off.append((d, n, where))
        if not off:
            return _place_jobs(g, q, False, self.retry)
        had = {id(inst): inst.items.get(q.key, 0) for _, _, where in off for inst in where}
        ok = _place_jobs(g, q, False, None)
        for d, n, where in off:
            # (where q took their room, it stands in for them, as the tier counts it: they are work of their class now,
            # asked in their turn; placed first again, t's protected low job took a pool's last slot beside t's new
            # normal job, which CP-SAT gives u's new normal job: tests/test_greedy_preemption.py)
            if not any(inst.items.get(q.key, 0) > had[id(inst)] for inst in where):
                self._place_first(d, n, None)
            for inst in where:
                if not any(inst.items.values()):
                    g.drop_idle(inst)
        self.retry()
        return ok

    def asked(self, q: Demand) -> None:
        """The guaranteed tier has just asked q (placed what of it it could): its tenant's protected jobs held for it
        that nothing waiting may take the place of now are placed, before the work ranked after q."""
        self.tried.add(q.key)
        if q.tenant in self.held:
            self._place(self.held.pop(q.tenant))


def _may_take_place(g: _Greedy, d: Demand, mine: list[Demand], asked: Collection[str] = ()) -> bool:
    """May its tenant's waiting work of a higher class (of `mine`, the tenant's demands; not placed whole, nor `asked`
    already by the guaranteed tier: what it could not place then takes no room) take the place of d's protected jobs,
    which then wait for it (`_Protected`)? Only where it could take their room (README, Tenants): some of it fits an
    offer d fits, or the tenant's guarantee cannot hold its protected work and all of it, in a dimension d asks for
    (the job would borrow: problem.borrows, as plancheck's `_guarantee_full_without` reads it). t3's critical A10G j6,
    waiting, held back its protected low A100 j5, whose host settle_spot gave up, and t2's critical j4 took the pool's
    one A100 slot first: greedy evicted j5 and apply's re-check refused the plan (fleet126)."""
    higher = {q.key for q in mine if q.klass > d.klass and g.a.placed[q.key] < len(q.jobs) and q.key not in asked}
    if not higher:
        return False
    room = set(g._keys_at(d, None))
    if any(room.intersection(g._keys_at(q, None)) for q in mine if q.key in higher):
        return True
    rules = g.p.tenants.get(d.tenant)
    if rules is None:
        return False
    protected = set(rules.protected_jobs)
    use = dict.fromkeys(DIMS, 0.0)
    for q in mine:
        n = len(q.jobs) if q.key in higher else sum(j in protected for j in q.jobs)
        for k in DIMS:
            use[k] += q.req(k) * q.replicas * n
    return borrows({k: v for k, v in use.items() if d.req(k)}, rules)


def _place_jobs(g: _Greedy, d: Demand, borrowed: bool, placed: Callable[[], None] | None = None, most: int | None = None) -> bool:
    """Place d's jobs not placed yet (at most `most`), one at a time, in its tier (borrowed: beyond its tenant's
    guarantee too), calling `placed` after each; False at the first job that cannot be placed."""
    for _ in range(min(len(d.jobs) - g.a.placed[d.key], len(d.jobs) if most is None else most)):
        if not borrowed and g.led.borrows_job(d):
            break
        if not (_place_resolving(g, d) or _place_preempting(g, d) or _place_with_ballast(g, d) or _place_reclaiming(g, d)
                or _place_reclaiming_gang(g, d) or _place_displacing(g, d) or _place_upgrading(g, d)):
            return False
        _mend_tenant_spot(g)
        if placed is not None:
            placed()
    return True


def _place_upgrading(g: _Greedy, d: Demand) -> bool:
    """Where a pool's max alone keeps one job of d out: swap an instance bought this pass in that pool (its offer's
    last, holding new 1-replica work only) for the cheapest larger type of the pool, zone and market that holds what
    it holds and d, and place d there. Bought one job at a time, cheapest per item, a pool at its max held a 1-GPU
    g5.xlarge for t1's protected low j0 while t3's critical j6 waited: CP-SAT put both on a g5.12xlarge (fleet140).
    Nothing changes if it cannot be placed so."""
    if d.gang or d.replicas != 1 or not g._quota_ok(d):
        return False
    demands = {q.key: q for q in g.p.demands}
    for kk in g._keys_at(d, None):
        big = g.offer.get(kk)
        if big is None or g.led.refuses_open(big) != "pool-max" or big.market == "spot" and g.p.spot.min_instance_types > 1:
            continue  # (a spot type swapped for another could take one the spot diversity counts)
        for small in _upgradable(g, big, demands):
            items = [(demands[q], n) for q, n in small.items.items() if n]
            if not all(g.fits(q, big) and big.offer_key in g._keys_at(q, None) for q, _ in items) \
                    or not big.one_nvlink_domain and any(q.nvlink for q, _ in [*items, (d, 1)]):
                continue
            room = _capacity_of(big)
            for q, n in [*items, (d, 1)]:
                for k in q.dims:
                    room[k] = room.get(k, 0.0) - n * q.req(k)
            if any(v < -1e-9 for v in room.values()):
                continue
            bucket = g.buckets.get(small.cap.offer_key, [])
            at = next((i for i, x in enumerate(bucket) if x is small), None)
            _move_all(g, items, small, None)
            g._unbuy(small)
            if g._may_open(big):
                inst = g._open(big)
                _move_all(g, items, None, inst)
                if _place_resolving(g, d):
                    g.a.refused.pop(d.key, None)
                    return True
                _move_all(g, items, inst, None)
                g._unbuy(inst)
            again = g._open(small.cap)  # (the same key: its offer's last again)
            _move_all(g, items, None, again)
            if at is not None and again in bucket:  # (where it was: first fit asks the open instances in order)
                _drop(bucket, again)
                bucket.insert(at, again)
    return False


def _upgradable(g: _Greedy, big: Capacity, demands: dict[str, Demand]) -> list[_Inst]:
    """The instances `_place_upgrading` may swap for one of `big`: bought this pass in big's pool, zone and market,
    of a cheaper type, each its offer's last (`_unbuy`), holding only new 1-replica jobs that are no gang."""
    out = []
    for c in g.offer.values():
        if c.pool != big.pool or c.cloud_zone != big.cloud_zone or c.market != big.market or c.price >= big.price \
                or c.reservation or big.reservation or not g.bought_insts.get(c.offer_key):
            continue
        inst = g.bought_insts[c.offer_key][-1]
        if all(demands[q].replicas == 1 and not demands[q].gang for q, n in inst.items.items() if n):
            out.append(inst)
    return sorted(out, key=lambda i: (i.cap.price, i.key))


def _move_all(g: _Greedy, items: list[tuple[Demand, int]], src: _Inst | None, dst: _Inst | None) -> None:
    """Take new items off src and/or put them on dst (`_place_upgrading`)."""
    for q, n in items:
        for _ in range(n):
            if src is not None:
                g._unrecord(q, src, stay=False)
            if dst is not None:
                g._record(q, dst, stay=False)


def _mend_tenant_spot(g: _Greedy) -> None:
    """After a job is placed: where the running work stopped for it (another tenant's borrowed work reclaimed, its own
    tenant's lower class preempted or displaced) was a tenant's on-demand work and left that tenant over its own spot
    share (tenant_max_spot_fraction), its lowest-ranked jobs on spot no longer stay there (`_release_tenant_spot`)
    until the share holds, and each is placed anew at once where its rules allow (every item placed asks the share).
    Nothing else breaks a tenant's share once settle_spot has settled it. Unmended, t2's new high j10 reclaimed the
    on-demand i4 where t1's borrowed j3 ran, t1's CPU j2 stayed on its spot i1, t1 had 1/1 on spot over its 0.5, and
    apply's re-check refused greedy's plan (fleet108; CP-SAT's moved j2 and kept every rule). Finite: each release
    takes one of the tenant's jobs off spot, and none is placed back on spot past its share."""
    if not g._tenants_over_spot():
        return
    before = dict(g.a.placed)
    while g._release_tenant_spot(g.order):
        pass
    for dk, n in before.items():
        for _ in range(n - g.a.placed[dk]):
            if not _place_resolving(g, g.p.demand(dk)):
                break


class _SpotShareWaits:
    """The jobs the fleet's spot share refused (max_spot_fraction), asked again, in `order`, as soon as the on-demand
    capacity placed after them makes room for their spot capacity: the work ranked after them takes none of that room
    first. Refused once and never asked again, a high spot-required job waited beside the on-demand work ranked after
    it that made its room, and the plan right after the apply placed it (the lifecycle machine, greedy alone, seed 99:
    the fleet did not converge)."""

    def __init__(self, g: _Greedy, done: set[str]):
        self.g, self.done = g, done
        self.borrowed = False  # the tier being placed
        self.waits: list[tuple[Demand, Capacity]] = []  # a job, and the spot capacity it needs least of (the ledger asks it)
        self.on_demand = -math.inf  # on-demand capacity (the share's unit) when they were last asked

    def _on_demand(self) -> float:
        spot, total = self.g.led.spot()
        return total - spot

    def _spot_need(self, d: Demand) -> Capacity | None:
        """The spot capacity d fits that holds least of the share's unit, if the spot share refused d's last job."""
        g = self.g
        if "spot-share" not in g.a.refused.get(d.key, ()):
            return None
        return min((c for k in g._keys_at(d, None) if (c := g.rep[k]).market == "spot"), key=lambda c: (g._prim(c), c.key), default=None)

    def add(self, d: Demand) -> None:
        """d's job was just refused: it waits here if the spot share was among what refused it."""
        c = self._spot_need(d)
        if c is not None:
            self.waits.append((d, c))
            self.on_demand = self._on_demand()

    def retry(self) -> None:
        """After a job is placed: where on-demand capacity grew, each waiting job the spot share would no longer refuse
        its spot capacity is asked again (the pass's ways, in the tier being placed), in order, until none is placed."""
        if not self.waits or self._on_demand() <= self.on_demand:
            return
        g, again = self.g, True
        while again:
            again, self.on_demand, left = False, self._on_demand(), []
            for d, c in self.waits:
                if "spot-share" in g.led.open_rules(c, first=False):
                    left.append((d, c))
                    continue
                before = g.a.placed[d.key]
                if _place_jobs(g, d, self.borrowed):
                    self.done.discard(d.key)  # (its borrowed jobs, if it has more, are asked in their tier)
                    if g.a.placed[d.key] >= len(d.jobs):
                        g.a.refused.pop(d.key, None)
                elif (need := self._spot_need(d)) is not None:
                    left.append((d, need))  # (refused again by the share: asked again when more room is made)
                again |= g.a.placed[d.key] > before
            self.waits = left


def _settle_spot_first(g: _Greedy) -> bool:
    """Spot diversity first: move work to, or buy (or keep) the cheapest idle spot instances of, the instance types and
    zones the SpotPolicy still asks for (`_diversity_move`, `_diversity_buy`), until it holds; then the on-demand
    capacity that, standing idle, keeps the buffer and the fleet's spot share (`_ballast_buys`). Whether every spot
    rule holds then."""
    while not g._diversity_holds():
        if _diversity_move(g) or _diversity_move_gang(g):
            continue
        c = _diversity_buy(g)
        if c is None:
            return False
        g._open(c)
    if not g._fleet_spot_rules_hold():
        for b in g._ballast_buys():
            g._open(b)
    return g._spot_rules_hold()


def _index(inst: _Inst) -> int:
    """A bought instance's place among its offer's (its key is "<offer>#<n>")."""
    return int(inst.key.rsplit("#", 1)[1])


def _open_spot(g: _Greedy) -> list[_Inst]:
    """The open spot instances, with room or full (what the diversity moves may take work from)."""
    return [i for lst in g.buckets.values() for i in lst if i.cap.market == "spot"] + [i for i in g.full if i.cap.market == "spot"]


def _diversity_deficit(g: _Greedy, types: set[str], zones: set[str]) -> int:
    sp = g.p.spot
    return max(0, sp.min_instance_types - len(types)) + max(0, sp.min_zones - len(zones))


def _diversity_move(g: _Greedy) -> bool:
    """Move the work of one spot instance bought for it to a new spot instance of a type or zone the SpotPolicy still
    asks for, where that costs no more (the price, its items' egress and latency terms), holds as much of the spot
    share's unit and leaves the spot capacity spanning more of what the rule asks for; the cheapest such move first.
    False if there is none. (Four jobs packed where spot is cheapest took a fifth, idle instance of the other zone;
    one of the four moved there costs nothing: CP-SAT's plan.)"""
    types, zones = g.led.spot_sites()
    deficit = _diversity_deficit(g, types, zones)
    spot = _open_spot(g)
    offers = [c for c in g.offer.values() if c.market == "spot" and (c.instance_type not in types or c.zone not in zones)]
    last: dict[str, _Inst] = {}  # offer -> its instance bought last: the one `_unbuy` may take back (keys stay n#0..n#k)
    for i in spot:
        if not isinstance(i.cap, Host) and (i.cap.offer_key not in last or _index(i) > _index(last[i.cap.offer_key])):
            last[i.cap.offer_key] = i
    best = None
    for inst in sorted(last.values(), key=lambda i: i.key):
        items = [(g.p.demand(k), n) for k, n in sorted(inst.items.items()) if n]
        if not items or any(d.gang for d, _ in items):
            continue  # (a gang's items move together or not at all: not here)
        old = inst.cap
        n_type, n_zone = g.led.spot_site_counts(old.instance_type, old.zone)
        t_after = types - ({old.instance_type} if n_type <= 1 else set())
        z_after = zones - ({old.zone} if n_zone <= 1 else set())
        for c in offers:
            if (c.price > old.price + 1e-12 or g._prim(c) != g._prim(old) or g.bought.get(c.offer_key, 0) >= c.work_most
                    or _diversity_deficit(g, t_after | {c.instance_type}, z_after | {c.zone}) >= deficit
                    or not all(g._compatible(d, c.offer_key) for d, _ in items)):
                continue
            room = _capacity_of(c)
            if any(sum(d.req(k) * n for d, n in items) > room.get(k, 0.0) + 1e-9 for k in {k for d, _ in items for k in d.dims}):
                continue
            delta = c.price - old.price + sum((g.p.cost_coef(d, c) - g.p.cost_coef(d, old)) * n for d, n in items)
            if delta <= 1e-9 and (best is None or (delta, c.key, inst.key) < best[0]):
                best = ((delta, c.key, inst.key), inst, c, items)
    if best is None:
        return False
    _, inst, c, items = best
    for d, n in items:
        for _ in range(n):
            g._unrecord(d, inst, stay=False)
    g._unbuy(inst)
    if not g._may_open(c):  # (the ledger refuses it: the work goes back where it was)
        back = g._open(inst.cap)
        for d, n in items:
            for _ in range(n):
                g._record(d, back, stay=False)
        return False
    new = g._open(c)
    for d, n in items:
        for _ in range(n):
            g._record(d, new, stay=False)
    return True


def _diversity_move_gang(g: _Greedy) -> bool:
    """`_diversity_move` for a gang: move a new gang, whole, from the spot instances bought for it alone to new spot
    instances of one offer of a type or zone the SpotPolicy still asks for, where that costs no more (prices, egress
    and latency terms), holds no more of the spot share's unit, and leaves the spot capacity spanning more of what the
    rule asks for; the cheapest such move first. False if there is none. (Two 2-replica zone gangs under `min_zones:
    2` went where spot was cheapest, beside an idle spot instance bought for the other zone, $0.43/h; one gang in each
    zone is CP-SAT's plan, $0.34/h.)"""
    types, zones = g.led.spot_sites()
    deficit = _diversity_deficit(g, types, zones)
    spot = _open_spot(g)
    bought: dict[str, list[int]] = {}  # offer -> the indices of its instances open
    for i in spot:
        if not isinstance(i.cap, Host):
            bought.setdefault(i.cap.offer_key, []).append(_index(i))
    offers = [c for c in g.offer.values() if c.market == "spot" and (c.instance_type not in types or c.zone not in zones)]
    best = None
    for d in g.p.demands:
        if not d.gang or d.running or g.a.placed[d.key] != 1:
            continue
        insts = [i for i in spot if i.items.get(d.key)]
        if (not insts or sum(i.items[d.key] for i in insts) != d.replicas
                or any(isinstance(i.cap, Host) or any(n for k, n in i.items.items() if k != d.key) for i in insts)):
            continue  # (only instances bought for it alone: nothing else moves, and they can be given back)
        per_offer: dict[str, list[int]] = {}
        for i in insts:
            per_offer.setdefault(i.cap.offer_key, []).append(_index(i))
        if any(sorted(ix) != sorted(bought[o])[-len(ix):] for o, ix in per_offer.items()):
            continue  # (`_unbuy` gives back an offer's last instances only: keys stay n#0..n#k)
        sites = [(i.cap.instance_type, i.cap.zone) for i in insts]
        t_after = {t for t in types if g.led.spot_site_counts(t, "")[0] > sum(1 for tt, _ in sites if tt == t)}
        z_after = {z for z in zones if g.led.spot_site_counts("", z)[1] > sum(1 for _, zz in sites if zz == z)}
        old = sum(i.cap.price + g.p.cost_coef(d, i.cap) * i.items[d.key] for i in insts)
        old_units = sum(g._prim(i.cap) for i in insts)
        for c in offers:
            f = g.fits(d, c) if g._compatible(d, c.offer_key) else 0
            if f <= 0:
                continue
            n = -(-d.replicas // f)
            new = n * c.price + g.p.cost_coef(d, c) * d.replicas
            if (new > old + 1e-9 or n * g._prim(c) > old_units or g.bought.get(c.offer_key, 0) + n > c.work_most
                    or _diversity_deficit(g, t_after | {c.instance_type}, z_after | {c.zone}) >= deficit):
                continue
            if best is None or (new - old, c.key, d.key) < best[0]:
                best = ((new - old, c.key, d.key), d, insts, c, n, f)
    if best is None:
        return False
    _, d, insts, c, n, f = best
    was = [(i.cap, i.items[d.key]) for i in sorted(insts, key=lambda i: (i.cap.offer_key, _index(i)))]
    for i in insts:
        for _ in range(i.items[d.key]):
            g._unrecord(d, i, stay=False)
    for i in sorted(insts, key=_index, reverse=True):
        g._unbuy(i)
    pending = Pending()
    ok = g.led.refuses_items(d, [c] * d.replicas) is None
    for _ in range(n):
        if not ok or not g._may_open(c, pending):
            ok = False
            break
        pending.open(c, g._prim(c))
    moved = [(c, min(f, d.replicas - k * f)) for k in range(n)] if ok else was  # (else back where it was)
    for cap, items in moved:
        inst = g._open(cap)
        for _ in range(items):
            g._record(d, inst, stay=False)
    return ok


def _place_resolving(g: _Greedy, d: Demand) -> bool:
    """Place one job of d (all its items) or nothing; nothing notes the rules that refused it (Assignment.refused)."""
    plan = _plan_job(g, d)
    if plan is None:
        return False
    _place_planned(g, d, plan)
    return True


def _plan_job(g: _Greedy, d: Demand):
    """Where one job of d (all its items) would go, within every rule, or None, noting the rules that refused it."""
    g.refused = set()
    if not g._quota_ok(d):
        g.a.refused[d.key] = tuple(sorted(g.refused))
        return None
    plan = g._plan_gang(d) if d.gang else g._plan_items(d, 1, None)
    if plan is not None and _breaks_buffer(g, d, plan):
        # Its room is the buffer's: plan again past the instances the buffer counts (buying, if it must).
        g.sparing_buffer = True
        try:
            plan = g._plan_gang(d) if d.gang else g._plan_items(d, 1, None)
        finally:
            g.sparing_buffer = False
    if plan is None or _breaks_buffer(g, d, plan):
        g.a.refused[d.key] = tuple(sorted(g.refused))
        return None
    return plan


def _place_planned(g: _Greedy, d: Demand, plan) -> None:
    """Carry out `_plan_job`'s plan: one job of d placed."""
    _commit(g, d, plan)
    g.a.placed[d.key] += 1
    g._charge_quota(d)


def _place_preempting(g: _Greedy, d: Demand) -> bool:
    """Where its tenant's quota alone refuses one more job of d, stop the tenant's own running jobs of a lower class
    (the lowest class first) until the quota has room, and place it (the README: a higher class may take a lower
    one's place in its tenant; as the model's tiers rank it, class by class, unless preemption is Never). Only
    1-replica, non-gang jobs are stopped (for a job or a gang). Nothing changes if it cannot be placed so. (An applied 5k-job fleet where
    a PR added a normal 1-GPU job to a tenant at its GPU quota: greedy left it pending, the guaranteed normal work
    tier's LP bound was one job more, and CP-SAT spent its whole work limit without finding the eviction: 10.7 s
    of CPU and an unproven tier; with 120 s it found it. A high 2 x 8-GPU gang added there stayed pending the same way,
    its tier unproven; now it takes 16 of its tenant's low 1-GPU jobs' quota, every tier proven.)"""
    if g.p.placement.preemption == "Never" or g.led.quota_short(d) is None:
        return False
    victims, classes = _victims(g, d.tenant)
    # (the lower classes are a prefix of the victims' order: scanning every victim of the tenant for each of the 579
    # pending jobs of the applied 5k fleet was 0.1 s of a PR's plan)
    stays = [(v, hk, g.a.stay.get((v.key, hk), 0)) for v, hk in victims[:bisect.bisect_left(classes, d.klass)]]
    stopped: list[tuple[Demand, _Inst]] = []
    took_guarantee = False
    for v, hk, n in stays:
        for _ in range(n):
            short = g.led.quota_short(d)
            if short is None or not v.req(short[0]):  # (a job that frees none of the short dimension stays)
                break
            inst = g.opened[hk]
            took_guarantee |= _stop_takes_protected(g, v)
            g._stop_running(v, inst)
            stopped.append((v, inst))
    # (guaranteed running work gives way to its tenant's higher class only where that work is guaranteed too: every
    # tenant's guaranteed work ranks above any borrowed work, as the model's tiers and `_run`'s order rank them; a
    # critical 2 x 2-GPU gang of t3, borrowed past t3's 2-GPU guarantee, stopped t3's guaranteed low job that greedy's
    # plan before had placed first, and the plan after that took it back: the lifecycle machine, greedy alone)
    if took_guarantee and g.led.borrows_job(d):
        stopped, undo = [], stopped
        for v, inst in reversed(undo):
            g._keep_running_again(v, inst)
    if stopped and g.led.quota_short(d) is None and _place_resolving(g, d):
        g.a.refused.pop(d.key, None)  # (the quota that refused it first is not why anything is pending now)
        return True
    for v, inst in reversed(stopped):  # undo
        g._keep_running_again(v, inst)
    return False


def _place_with_ballast(g: _Greedy, d: Demand) -> bool:
    """Where greedy's restraint alone keeps d off new spot capacity (the SpotPolicy asks for an on-demand buffer, which
    a spot instance bought for work breaks until idle on-demand capacity stands beside it), buy the cheapest spot
    instance d fits together with the on-demand capacity that, standing idle, keeps the buffer and the fleet's spot
    share (`_ballast_buys`: within pool ceilings, cloud quotas and the budget), and place one job of d there. Nothing
    changes if it cannot be placed so. Only for a job whose items one spot instance holds, and not where spot diversity
    (min_instance_types, min_zones) is asked for: one spot instance breaks that rule, so the waiting work goes on spot
    together at the end there (`_place_spot_diverse`). (A SpotPolicy with
    on_demand_buffer_percent 50 and four spot-required 14-vCPU jobs: `--time-limit 0`, and a plan that fell back to
    greedy's, placed none ("on-demand buffer: 0 idle on-demand vCPU in the plan"); CP-SAT bought two on-demand
    instances to stand idle beside four spot ones.) Where greedy buys spot freely (no buffer, no diversity asked), only
    for a job the spot share refused: fleet111's spot-required j5 waited where CP-SAT bought the ballast beside it."""
    sp = g.p.spot
    if g.buy_spot and "spot-share" not in g.a.refused.get(d.key, ()):
        return False
    if sp.min_instance_types > 1 or sp.min_zones > 1 or d.gang or not g._quota_ok(d) or not g._other_spot_rules_hold():
        return False
    cands = sorted((c for k in g._keys_at(d, None) if (c := g.offer.get(k)) is not None and c.market == "spot"),
                   key=lambda c: (c.price + g.p.cost_coef(d, c), c.key))
    refused = g.a.refused.get(d.key)  # (why it waits, if it does: not what a tentative purchase undone met)
    for c in cands:
        reserve = g._owed(c, _NOTHING) if g.floor_price else 0  # (as _may_open: unmet pool minimums are owed)
        if g.bought.get(c.offer_key, 0) >= c.work_most or g.led.refuses_open(c, 1, _NOTHING, reserve, spot_share=False):
            continue
        opened = [g._open(c)]
        buys = g._ballast_buys()
        if buys or g._fleet_spot_rules_hold():
            opened += [g._open(b) for b in buys]
            if g._fleet_spot_rules_hold() and _place_resolving(g, d):
                g.a.refused.pop(d.key, None)  # (the share that refused it first is not why anything is pending now)
                return True
        else:
            # The rule that refused d is the spot share or buffer its spot instance breaks, which no on-demand capacity
            # bought to stand idle mends (the plan's ledger names it for d): not (), "nothing it fits had room".
            refused = tuple(sorted(set(refused or ()) | set(g._fleet_spot_rules_broken())))
        for inst in reversed(opened):
            g._unbuy(inst)
        break  # (the cheapest spot offer d may use could not be bought so: a dearer one needs no less ballast)
    if refused is not None:
        g.a.refused[d.key] = refused
    return False


def _place_spot_diverse(g: _Greedy, order: list[Demand]) -> None:
    """Where greedy's restraint alone kept the waiting work off new spot capacity (the SpotPolicy asks for spot
    diversity, min_instance_types or min_zones, which one spot instance bought for work breaks): place the jobs that
    still wait on spot, each where it adds an instance type or zone the policy still asks for if it can (else where it
    costs least), then, if the spot capacity still spans too few, buy the cheapest spot instances that add one to stand
    idle; all within pool ceilings, cloud quotas, the budgets and the spot shares. If the rule still does not hold,
    nothing changes: all or nothing, as the rule is the fleet's. (Two spot-required jobs under `min_zones: 2`:
    `--time-limit 0`, and a plan that fell back to greedy's, placed neither, "spot diversity: spot in the plan would
    span 1 instance type(s) and 1 zone(s)", where CP-SAT placed one in each zone.) Beside an on-demand buffer, the
    spot goes on no instance the buffer counts, and the on-demand capacity that, standing idle, keeps the buffer and the
    fleet's spot share is bought after (`_ballast_buys`), within the same all or nothing (the two rules together:
    both jobs waited in greedy's plan, where CP-SAT bought a spot instance in each zone and one on-demand to stand
    idle). Not for gangs."""
    sp = g.p.spot
    if g.buy_spot or not (sp.min_instance_types > 1 or sp.min_zones > 1):
        return
    waiting = [d for d in order if not d.gang and d.spot != "never" and g.a.placed[d.key] < len(d.jobs)]
    if not waiting or not g._other_spot_rules_hold() and g.led.spot_sites()[0]:
        return  # (nothing waits; or the spot the fleet keeps breaks a rule settle_spot could not mend)
    refused = dict(g.a.refused)
    placed: list[tuple[Demand, _Inst]] = []  # items, in order
    jobs: dict[str, tuple[Demand, int]] = {}  # demand -> (it, jobs placed here)
    opened: list[_Inst] = []
    buffer = sp.on_demand_buffer_percent > 0
    g.buy_spot = True
    g.sparing_buffer = g.ballast_after = buffer
    try:
        for d in waiting:
            for _ in range(len(d.jobs) - g.a.placed[d.key]):
                plan = _diverse_plan(g, d) or (g._plan_items(d, 1, None) if g._quota_ok(d) else None)
                if plan is None:
                    break
                for _, target in plan:
                    if isinstance(target, _Buy) and target.inst is None:
                        target.inst = g._open(target.cap)
                        opened.append(target.inst)
                    inst = target.inst if isinstance(target, _Buy) else target
                    g._record(d, inst, stay=False)
                    placed.append((d, inst))
                g.a.placed[d.key] += 1
                g._charge_quota(d)
                jobs[d.key] = (d, jobs.get(d.key, (d, 0))[1] + 1)
        while placed and not g._diversity_holds() and (spare := _diversity_buy(g)) is not None:
            opened.append(g._open(spare))
    finally:
        g.buy_spot = g.sparing_buffer = g.ballast_after = False
    if placed and buffer and g._other_spot_rules_hold() and not g._fleet_spot_rules_hold():
        opened += [g._open(b) for b in g._ballast_buys()]
    if placed and g._spot_rules_hold():
        for d, _ in jobs.values():
            if g.a.placed[d.key] >= len(d.jobs):
                g.a.refused.pop(d.key, None)
        return
    for d, inst in reversed(placed):  # undo: the rule is the fleet's, and it does not hold
        g._unrecord(d, inst, stay=False)
    for d, n in jobs.values():
        g.a.placed[d.key] -= n
        g._charge_quota(d, -n)
    for inst in reversed(opened):
        if isinstance(inst.cap, Host):
            g._close(inst)  # (an idle host the fleet has goes back to idle)
        else:
            g._unbuy(inst)
    g.a.refused = refused


def _diverse_plan(g: _Greedy, d: Demand):
    """One job of d on a spot offer that adds an instance type or zone the SpotPolicy still asks for, the cheapest
    such plan; None if there is none (or nothing is still asked for)."""
    if not _diversity_deficit(g, *g.led.spot_sites()) or not g._quota_ok(d):
        return None  # (nothing is still asked for: a plan where it costs least will do)
    adds = g._adds_diversity()
    best, best_cost = None, math.inf
    for k in g._keys_at(d, None):
        c = g.rep.get(k)
        if c is None or not adds(c):
            continue
        plan = g._plan_items(d, 1, None, only_offer=k)
        if plan is not None and (cost := _plan_cost(g.p, d, plan)) < best_cost - 1e-9:
            best, best_cost = plan, cost
    return best


def _diversity_buy(g: _Greedy, tried: Collection[str] = ()) -> Capacity | None:
    """The cheapest spot instance (an idle host the fleet has, else a new one) that adds an instance type or zone the
    SpotPolicy still asks for, within pool ceilings, cloud quotas, the budget and the spot share; None if none. Not one
    in `tried` (settle_spot's, each kept or bought once already): asked again, the idle g5.xlarge tried first (it took
    the pool slot the on-demand ballast needed) was the cheapest again, tied with a spot g5.xlarge to buy in another
    pool, and settle_spot gave up t1's guaranteed job's spot host where buying that one kept it, as CP-SAT's plan does
    (fleet99)."""
    adds = g._adds_diversity()
    cands = [h for hs in g.idle.values() for h in hs if h.key not in g.opened]
    cands += [c for c in g.offer.values() if g.bought.get(c.offer_key, 0) < c.max_new]
    cands = [c for c in cands if adds(c) and c.key not in tried]
    return min((c for c in cands if g._may_open(c)), key=lambda c: (c.price, not isinstance(c, Host), c.key), default=None)


def _place_reclaiming(g: _Greedy, d: Demand) -> bool:
    """Where d's tenant has room in its guarantee for one more job of d that nothing else gives it, stop other tenants'
    running jobs on room they borrow (each such tenant kept at its guarantee or above, none of its protected jobs
    stopped past what its kept identical jobs stand in for: plancheck), instance by instance among those d may use (by
    name), each until an item of d fits there, in the order `_victims` stops them, until d is placed; then the stops on
    instances d does not use are undone (README, Tenants: borrowed work is reclaimed when an owner needs its guarantee
    back; under preemption Never too). Only 1-replica, non-gang jobs are stopped here (a lender's gang:
    `_place_reclaiming_gang`), for a job or a gang (not an instance gang). Nothing changes if it cannot be placed so.
    (A fixed pool of two 8-GPU hosts whose tenant b ran 16 1-GPU
    jobs, 8 guaranteed: greedy left tenant a's 8 guaranteed jobs, or its 2 x 4-GPU gang, pending beside b's borrowed
    ones, and so did every plan that fell back to greedy's.)"""
    lenders = _lenders(g, d)
    if not lenders:
        return False
    on_host, hosts_of, protected = _reclaimable(g)
    stopped: dict[str, list[Demand]] = {}  # instance -> the jobs stopped there, by demand

    def undo(hk: str) -> None:
        inst = g.opened[hk]
        for v in reversed(stopped.pop(hk)):
            g._keep_running_again(v, inst)

    # Hosts whose lenders' lowest class is lowest first, then those where they run fewer protected jobs: by name, of twin
    # hosts each with one job of a class of identical jobs, the one whose job the guarantee holds was stopped while its
    # borrowed twin ran on (the guarantee sweep's seed 2114, fleet144; apply's re-check passes it, one running job of the
    # class standing in for the other), and a borrowed normal job stopped, then moved to the host of its tenant's low job
    # that it evicted (fleet145), where the low job's host was the one to reclaim.
    mine = {j for r in lenders.values() for j in r.protected_jobs}

    def order(hk: str) -> tuple:
        lent = [v for v in on_host[hk] if v.tenant in lenders]
        guarded = sum(j in mine and hk in ids for v in lent for j, ids in v.running)
        return min((v.klass for v in lent), default=float("inf")), guarded, hk

    for hk in sorted(on_host, key=order):
        inst = g.opened.get(hk)
        if inst is None or g.fits.at(d, inst.cap.offer_key, inst.cap) <= 0:
            continue
        here = stopped.setdefault(hk, [])
        for v in on_host[hk]:
            r = lenders.get(v.tenant)
            while r is not None and not inst.fits(d) and g.a.stay.get((v.key, hk), 0) > 0 and _borrowed(g, v, r, hosts_of[v.key], protected[v.key]):
                g._stop_running(v, inst)
                here.append(v)
            if inst.fits(d):
                break
        if not here or not inst.fits(d):
            undo(hk)  # (no room for an item of d here)
            continue
        if _place_in_freed_room(g, d, stopped, undo):
            return True
    for hk in list(stopped):
        undo(hk)
    return False


def _place_reclaiming_gang(g: _Greedy, d: Demand) -> bool:
    """`_place_reclaiming` for a lender's running gang: where d's tenant has room in its guarantee for one more job of d,
    stop one gang (whole: a gang runs whole or not at all) of another tenant that borrows, that its tenant's guarantee
    does not protect and whose stop leaves that tenant at or above its guarantee in every guaranteed dimension the gang
    uses, running on an instance d may use; in `_victims`' order (the lowest class, the least work, the least time
    left), and place d; the stop is undone where d takes none of the gang's room, and nothing changes if d cannot be
    placed so. One gang per job of d. (A fixed pool of two p4d where tenant b, 4 GPUs guaranteed, ran two 2 x 4-GPU
    gangs: greedy left tenant a's 8-GPU job pending within a's guarantee, "pools at max_instances (onprem 2/2)", where
    CP-SAT stopped one gang: `_place_reclaiming` stops only 1-replica jobs.)"""
    lenders = _lenders(g, d)
    if not lenders:
        return False
    if g.running_gangs is None:  # (made once a run: every job that waits within its guarantee asks)
        frozen = {c.key for c in g.p.hosts() if c.frozen}
        protected = {j for r in g.p.tenants.values() for j in r.protected_jobs}
        g.running_gangs = [v for v in sorted((v for v in g.p.demands if v.gang and v.running), key=lambda v: (v.klass, v.job_size, _mean_end(g.p, v), v.key))
                           if not any(j in protected or any(h in frozen for h in hs) for j, hs in v.running)]
    for v in g.running_gangs:
        r = lenders.get(v.tenant)
        if r is None or g.a.placed[v.key] <= 0:
            continue
        cells = sorted((hk, g.a.stay.get((v.key, hk), 0)) for hk in {h for _, hs in v.running for h in hs})
        if any(n <= 0 or hk not in g.opened for hk, n in cells):
            continue  # (not kept whole where it runs: nothing of it to stop here)
        if not any(g.fits.at(d, g.opened[hk].cap.offer_key, g.opened[hk].cap) > 0 for hk, _ in cells):
            continue
        t_use = g.led.tenant_use(v.tenant)
        dims = [k for k in r.guarantee if v.req(k) > 0]
        if not dims or any(t_use[k] - v.replicas * v.req(k) < r.guarantee[k] - 1e-9 for k in dims):
            continue
        for hk, n in cells:
            for _ in range(n):
                g._unrecord(v, g.opened[hk], stay=True)
        g.stops += 1
        g.a.placed[v.key] -= 1
        g._charge_quota(v, -1)
        plan = _plan_in_freed_room(g, d, {hk for hk, _ in cells})
        if plan is not None and any(t is g.opened[hk] for _, t in plan for hk, _ in cells):
            _place_planned(g, d, plan)
            return True
        for hk, n in cells:  # undo, before anything is placed: d takes none of the gang's room (`_place_in_freed_room`)
            for _ in range(n):
                g._record(v, g.opened[hk], stay=True)
        g.stops -= 1
        g.a.placed[v.key] += 1
        g._charge_quota(v)
    return False


def _lenders(g: _Greedy, d: Demand) -> dict[str, TenantRules]:
    """The other tenants that borrow (their rules), where d's tenant has room in its guarantee for one more job of d:
    whose running work `_place_reclaiming` and `_place_reclaiming_gang` may stop for it; {} otherwise (beyond its
    guarantee d borrows too: nothing to reclaim for)."""
    rules = g.p.tenants.get(d.tenant)
    if d.bundle != 1 or rules is None or not rules.guarantee:
        return {}
    use = g.led.tenant_use(d.tenant)
    if not all(quota_ok(use[k], d.replicas * d.req(k), v) for k, v in rules.guarantee.items()):
        return {}
    return {t: r for t, r in g.p.tenants.items() if t != d.tenant and borrows(g.led.tenant_use(t), r)}


def _place_in_freed_room(g: _Greedy, d: Demand, stopped: dict[str, list[Demand]], undo: Callable[[str], None]) -> bool:
    """Place one job of d with the stops made so far (`stopped`: host -> jobs stopped there), taking room on every host
    a stop is left on: the freed hosts are offered first (`_Greedy.freed`), and where the plan takes none of a host's
    room, its stops are undone before anything is placed and d is planned again without them (nothing stops for it
    there). Undone after d was placed, as they were, the stops gave back what d had spent of them besides room, with
    no rule asked: its tenant's budget (fleet89: t3's critical j8 went on a new p4d that t3's $5/h afforded only with
    its high j1 stopped on i0; j1 kept again put t3 at $6.42/h), its spot share, the licenses, the on-demand buffer.
    `_place_reclaiming` and `_place_displacing`."""
    while stopped:
        plan = _plan_in_freed_room(g, d, set(stopped))
        if plan is None:
            return False
        idle = [h for h in stopped if not any(t is g.opened[h] for _, t in plan)]
        if not idle:
            _place_planned(g, d, plan)
            return True
        for h in idle:
            undo(h)
    return False


def _plan_in_freed_room(g: _Greedy, d: Demand, freed: set[str]):
    """`_plan_job` with the room on the hosts in `freed` offered before any other open instance's."""
    g.freed = freed
    try:
        return _plan_job(g, d)
    finally:
        g.freed = set()


def _place_displacing(g: _Greedy, d: Demand) -> bool:
    """Where no room is left for one more job of d and its tenant's quota has room (`_place_preempting` frees quota),
    stop the tenant's own running jobs of a lower class on instances d may use, host by host (hosts in the order of
    `_victims`: the lowest class, least work and time lost first; on a host, its jobs in that order), each until an
    item of d fits there, until d is placed; then the stops on hosts d does not use are undone (README: a higher class
    may take a lower one's place in its tenant, where it lands: plancheck.own_higher_class_room). Not under
    `preemption: Never`; only 1-replica, non-gang jobs are stopped, for a job or a gang (not an instance gang). Nothing
    changes if it cannot be placed so. (A 12-vCPU critical job that fits only on the one instance of a fixed pool,
    where its tenant's two 6-vCPU normal jobs ran, waited in greedy's plan with "pools at max_instances"; CP-SAT
    evicted both and placed it.) Its tenant's protected jobs (TenantRules.protected_jobs) are stopped only as far as
    d stands in for them (ledger.stand_in_units: the guarantees tier, first of the model's): only new work does, so a
    running job that must move takes no protected job's room (it did, in fleet 41 of bench.explore_mixed after a
    shrink: the warm start lost 14 guarantee units, and the tiers the solver then had to reach again stayed unproven).
    But a protected running job of d placed anew keeps its own units, as the model's tier counts a moved protected job
    kept: it may take as many of its tenant's lower protected units (fleet106: t1's high j9, whose spot host had to go,
    was evicted where CP-SAT moved it into t1's low j1's room). Nor for work that borrows beside what it stops (fleet147)."""
    if g.p.placement.preemption == "Never" or d.bundle != 1 or g.led.quota_short(d) is not None:
        return False
    keeps_own = _reclaimable(g)[2].get(d.key, 0) > g.a.placed[d.key]  # (one of d's protected running jobs, not placed yet)
    victims, classes = _victims(g, d.tenant)
    on_host: dict[str, list[Demand]] = {}
    for v, hk in victims[:bisect.bisect_left(classes, d.klass)]:
        on_host.setdefault(hk, []).append(v)
    stopped: dict[str, list[Demand]] = {}  # host -> the jobs stopped there, by demand
    lost: dict[str, list[Demand]] = {}  # host -> the protected jobs among them (their units are the guarantee's)

    def undo(hk: str) -> None:
        inst = g.opened[hk]
        lost.pop(hk, None)
        for v in reversed(stopped.pop(hk)):
            g._keep_running_again(v, inst)

    def stands_in() -> bool:  # d stands in for every protected unit stopped so far
        gone = [v for vs in lost.values() for v in vs]
        # a placed job of d is one of its running ones first (`_running_kept`): past them, this one is new work (a new
        # job identical to running ones shares their demand: taken for a running one, it waited beside its tenant's
        # lower jobs, bench.openb_share's day-2 replan)
        units = stand_in_units(d, gone) if g.a.placed[d.key] >= d.running_jobs else d.job_size if keeps_own else 0
        if gone and g.led.borrows_job(d):
            # d borrows even in the room they free: the model's class tiers count a higher class taking a lower one's
            # place inside the guarantee only, so the stop loses its class a guaranteed running job for borrowed work
            # (fleet147: t3's normal 6-GPU gang, over its 4-GPU guarantee, stopped its low 2-GPU job the plan before
            # had started; CP-SAT kept it, and greedy's plan after each apply was not a no-op)
            return False
        return not gone or sum(v.job_size for v in gone) <= units

    for hk, here_victims in on_host.items():
        inst = g.opened.get(hk)
        if inst is None or g.fits.at(d, inst.cap.offer_key, inst.cap) <= 0:
            continue
        here = stopped.setdefault(hk, [])
        for v in here_victims:
            # only a job holding some of what d is short of here: a 3g.20gb job's stop frees no 4g.20gb device, and
            # stopping such jobs first spent more protected units than d stands in for, so nothing was stopped (a
            # high 4g job waited beside its tenant's low 4g one on the openb sharing pods' day-2 replan)
            while not inst.fits(d) and g.a.stay.get((v.key, hk), 0) > 0 and _frees_short(inst, d, v):
                if _stop_takes_protected(g, v):
                    lost.setdefault(hk, []).append(v)  # (identical jobs stand in for each other: one of v's protected)
                g._stop_running(v, inst)
                here.append(v)
            if inst.fits(d):
                break
        if not here or not inst.fits(d) or not stands_in():
            undo(hk)  # (no room for an item of d here, or not without taking its tenant's guarantee)
            continue
        if _place_in_freed_room(g, d, stopped, undo):
            return True
    for hk in list(stopped):
        undo(hk)
    return False


def _frees_short(inst: _Inst, d: Demand, v: Demand) -> bool:
    """Whether stopping a job of v frees some of a dimension (vCPU, memory, GPUs, a MIG profile's devices) in which
    the instance is short of room for d."""
    return any(v.req(k) > 0 for k in d.dims if d.req(k) > 0 and inst.free.get(k, 0.0) < d.req(k) - 1e-9)


def _borrowed(g: _Greedy, v: Demand, r: TenantRules, hosts: list[str], protected: int) -> bool:
    """Whether one more running job of v may stop for another tenant's guarantee: its tenant (rules r) stays at or above
    its guarantee in every guaranteed dimension v uses (at least one), and v keeps at least as many running jobs as it
    has protected ones, `protected` (identical jobs stand in for each other)."""
    use = g.led.tenant_use(v.tenant)
    dims = [k for k in r.guarantee if v.req(k) > 0]
    if not dims or any(use[k] - v.req(k) < r.guarantee[k] - 1e-9 for k in dims):
        return False
    kept = sum(g.a.stay.get((v.key, hk), 0) for hk in hosts)
    return kept > protected


def _reclaimable(g: _Greedy) -> tuple[dict[str, list[Demand]], dict[str, list[str]], dict[str, int]]:
    """Host -> the running 1-replica, non-gang demands on it, in `_victims`' order (not on a frozen host); each such
    demand's hosts (every one it runs on), and its protected jobs (TenantRules.protected_jobs) counted. Made once a run."""
    if g.reclaimable is None:
        hosts = {c.key: c for c in g.p.hosts()}
        on_host: dict[str, list[Demand]] = {}
        hosts_of: dict[str, list[str]] = {}
        protected: dict[str, int] = {}
        mine = {t: set(r.protected_jobs) for t, r in g.p.tenants.items()}
        for v in sorted((v for v in g.p.demands if v.running and not v.gang and v.replicas == 1 and v.bundle == 1),
                        key=lambda v: (v.klass, v.job_size, _mean_end(g.p, v), v.key)):
            hosts_of[v.key] = sorted({i for _, iids in v.running for i in iids})
            protected[v.key] = sum(j in mine.get(v.tenant, ()) for j, _ in v.running)
            for hk in hosts_of[v.key]:
                if hk in hosts and not hosts[hk].frozen:
                    on_host.setdefault(hk, []).append(v)
        g.reclaimable = (on_host, hosts_of, protected)
    return g.reclaimable


def _stop_takes_protected(g: _Greedy, v: Demand) -> bool:
    """Whether stopping one more running job of v takes one of its tenant's protected jobs: as many of v's kept jobs
    as it protects stand in for each other (identical jobs), so a stop takes one only once no more are kept than that."""
    _, hosts_of, protected = _reclaimable(g)
    return sum(g.a.stay.get((v.key, h), 0) for h in hosts_of.get(v.key, ())) <= protected.get(v.key, 0)


def _victims(g: _Greedy, tenant: str) -> tuple[list[tuple[Demand, str]], list[int]]:
    """The tenant's running 1-replica, non-gang demands and the hosts they run on, in the order _place_preempting
    stops them (the tiers' order: the lowest class, the least work lost, then the least time left, as
    objective.victims_tier ranks them); not on a frozen host (problem.freeze found nothing there that may change,
    and the model holds it so); and their classes, in that order. Made once per tenant."""
    memo = g.victims.get(tenant)
    if memo is None:
        hosts = {c.key: c for c in g.p.hosts()}
        order = sorted(
            ((v, hk) for v in g.p.demands if v.tenant == tenant and v.running and not v.gang and v.replicas == 1 and v.bundle == 1
             for hk in sorted({i for _, iids in v.running for i in iids}) if hk in hosts and not hosts[hk].frozen),
            key=lambda t: (t[0].klass, t[0].job_size, _mean_end(g.p, t[0]), t[0].key, t[1]))
        memo = g.victims[tenant] = (order, [v.klass for v, _ in order])
    return memo


def _mean_end(p: Problem, d: Demand) -> float:
    ends = [p.job_end.get(j, 0.0) for j, _ in d.running]
    return sum(ends) / len(ends) if ends else math.inf


def _breaks_buffer(g: _Greedy, d: Demand, plan) -> bool:
    """Would the plan's items on open on-demand instances (the buffer counts the idle room of each) eat into the
    idle capacity the on-demand buffer keeps for the spot capacity (the rule `settle_spot` established)?"""
    taken = sum(buffer_use(d, g.led.dim) for _, t in plan if isinstance(t, _Inst) and g.led.in_buffer(t.key))
    return g._refuses(g.led.refuses_buffer(d, taken))


def _commit(g: _Greedy, d: Demand, plan) -> None:
    """Carry a plan out, opening each planned purchase once and sharing it between its items."""
    for _, target in plan:
        if isinstance(target, _Buy):
            if target.inst is None:
                target.inst = g._open(target.cap)
            inst = target.inst
        else:
            inst = target
        g._record(d, inst, stay=False)


__all__ = ["Assignment", "greedy"]
