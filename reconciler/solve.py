"""Placement and provisioning in one OR-Tools CP-SAT model, solved lexicographically.

One model decides which existing instances to keep, how many new instances of each
offer to buy, which running replicas stay where they are, and how many items of each
demand group land on each capacity. Capacity is per dimension (GPUs, MIG devices,
vCPU, memory): exact on an existing instance, aggregate on the identical instances
of an offer (the planner packs them and adds an instance where fragmentation needs
one; `pack.py`).

The objective is a sequence of tiers, each maximised (or minimised) and then held
while the next is solved (`_Model.tiers`): protected guarantees; per priority class,
running work then all work inside the tenants' guarantees; the fair share of
borrowed capacity (weighted DRF); per class, borrowed work; the cheapest victims.
Then cost: $/hour of instances, data egress and latency, plus the amortised cost of
every move. A tier whose best value the warm start reaches, or whose LP bound the
warm start meets, is held without a search; the cost stage searches near the LP's
answer first and stops within the gap of the LP bound. A quiet fleet costs a few
short CP-SAT calls (completing the warm start, a polish) and no search.

Pure: a function of the Problem.
"""

from __future__ import annotations

import bisect
import math
import os
import time
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from reconciler import parallel
from reconciler.errors import SolverError
from reconciler.greedy import Assignment, greedy
from reconciler.ledger import MILLI, buffer_use, charge, fraction_milli, milli_down, milli_up, work_units
from reconciler.pack import Bin, pack_items
from reconciler.deadlines import tier_terms as deadline_tier_terms
from reconciler.solve_licenses import add_license_constraints
from reconciler.solve_quotas import add_cloud_quota_constraints
from reconciler.problem import (DIMS, Capacity, Demand, OfferFits, Problem, Rival, borrowing_tenants, components, fit, forced_moves, may_preempt, over_cap_tenants,
                                rules_allow, spot_measure, type_class)

SEGMENTS = 20  # steps of the concave fair-share utility


def scale(dim: str) -> int:
    """Integer units per resource unit: GPUs and MIG devices are counted, vCPU and GiB in thousandths."""
    return 1000 if dim in ("cpu", "memory_gib") else 1


@dataclass(frozen=True)
class TierReport:
    name: str
    sense: str  # max | min
    value: int
    bound: float | None  # the best value possible (None: not computed)
    status: str  # HELD (the warm start already reached its bound) | OPTIMAL | FEASIBLE | UNKNOWN
    seconds: float

    @property
    def proven(self) -> bool:
        """Its value is the best possible (held at a bound, or searched to optimality); a
        FEASIBLE or UNKNOWN tier holds at least the warm start's value, which may not be the best."""
        return self.status in ("HELD", "OPTIMAL")


@dataclass(frozen=True)
class Solution:
    status: str  # OPTIMAL | FEASIBLE | GREEDY_FALLBACK
    optimal: bool
    gap: float  # relative gap of the cost stage (0 when optimal)
    seconds: float
    keep: frozenset[str]  # existing instance ids kept
    new: dict[str, int]  # offer key -> instances to create
    stay: dict[tuple[str, str], int]  # (demand key, instance id) -> items that stay where they run
    x: dict[tuple[str, str], int]  # (demand key, capacity key) -> items newly placed there
    placed: dict[str, int]  # demand key -> jobs placed
    guaranteed: dict[str, int] = field(default_factory=dict)  # demand key -> placed jobs inside the guarantee
    tiers: tuple[TierReport, ...] = ()
    work: int = 0
    cost_milli: int = 0
    capacities: dict[str, Capacity] = field(default_factory=dict)
    scope: tuple[int, int] = (0, 0)  # hosts solved, hosts frozen
    variables: int = 0
    constraints: int = 0
    note: str = ""
    lp_bound: float | None = None  # USD/h: the LP relaxation's least instance cost at the same tiers (if asked)
    int_bound: float | None = None  # USD/h: a proven bound on it with whole instances per offer (CP-SAT; if asked)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per solver phase, for the benchmark
    work_spent: float = 0.0  # CP-SAT deterministic seconds spent (the limit is --time-limit of them)
    # The cost objective (milli-dollars: instances, egress, latency, moves) of this answer, and a
    # proven lower bound on it at the tiers reached (the LP's or CP-SAT's): the plan re-measures
    # its gap against the bound after packing (make_plan), since repairs add to the cost.
    cost_value: float | None = None
    cost_bound: float | None = None


# ---------------------------------------------------------------- the model


@dataclass
class _Tier:
    name: str
    expr: object
    sense: str  # max | min
    bound: float  # best possible value (max: upper bound; min: lower bound)


class _Model:
    """The CP-SAT model of one Problem; variables for solved parts, constants for frozen ones."""

    def __init__(self, problem: Problem, warm: Assignment | None = None):
        """`warm`: the warm start; every host it puts new work on gets that work's variable,
        even where the model alone would not look (a host freed by a gang greedy moves away)."""
        self.p = problem
        m = self.m = cp_model.CpModel()
        self.demands = {d.key: d for d in problem.demands}
        self.group_of = {dk: gk for gk, members in problem.groups.items() for dk in members}
        self.caps = {c.key: c for c in problem.capacities}
        hosts = [c for c in problem.capacities if c.existing]
        offers = [c for c in problem.capacities if not c.existing]
        self.hosts, self.offers = hosts, offers

        # Idle hosts: identical instances with nothing on them (pool minimums kept warm) are
        # interchangeable, so a class of them is one count of instances kept, and its new work
        # is placed on the class, like an offer's: at 10k idle instances, per-host variables
        # made a million. `_unfold_idle` keeps the first ones and packs the class's items onto them.
        self.idle: dict[str, Capacity] = {}  # class key -> its shape (max_new: how many)
        self.idle_members: dict[str, list[Capacity]] = {}  # class key -> its hosts, in keep order
        self.idle_of: dict[str, str] = {}  # host key -> class key
        alike: dict[tuple, list[Capacity]] = {}
        for h in hosts:
            if not h.frozen and h.keep_blocker is None and not h.residents:
                alike.setdefault((h.offer_key, h.price, h.on_demand_price, h.mig, h.nvlink_domain), []).append(h)
        for n, hs in enumerate(v for v in alike.values() if len(v) > 1):
            hs.sort(key=lambda h: h.key)
            ik = f"idle#{n}:{hs[0].offer_key}"
            self.idle[ik] = replace(hs[0], key=ik, instance_id=None, max_new=len(hs))
            self.idle_members[ik] = hs
            for h in hs:
                self.idle_of[h.key] = ik
        self.caps.update(self.idle)
        # What the fleet-wide rules and the cost count: offers, hosts, and idle classes.
        self.units = [c for c in problem.capacities if c.key not in self.idle_of] + list(self.idle.values())

        # Instances: new per offer, keep per host, kept per idle class.
        self.use: dict[str, object] = {}
        for o in offers:
            self.use[o.key] = m.new_int_var(0, o.max_new, f"new[{o.key}]")
        for h in hosts:
            if h.key in self.idle_of:
                continue
            if h.frozen:
                self.use[h.key] = 1
            elif h.keep_blocker is not None:
                self.use[h.key] = 0
            else:
                self.use[h.key] = m.new_bool_var(f"keep[{h.key}]")
        for ik, c in self.idle.items():
            self.use[ik] = m.new_int_var(0, c.max_new, f"kept[{ik}]")

        # Residents that stay where they run (items per demand class and host).
        self.stay: dict[tuple[str, str], object] = {}
        self.stay_of: dict[str, list[tuple[Capacity, object]]] = {}
        for h in hosts:
            here: dict[str, int] = {}
            for dk, _, n in h.residents:
                if dk in self.demands:
                    here[dk] = here.get(dk, 0) + n
            for dk, n in here.items():
                d = self.demands[dk]
                if h.frozen:
                    v = n
                elif h.keep_blocker is None and fit(d, h) > 0:
                    v = m.new_int_var(0, n, f"stay[{dk},{h.key}]")
                else:
                    v = 0  # it must move: its instance goes, or it no longer fits there
                self.stay[(dk, h.key)] = v
                self.stay_of.setdefault(dk, []).append((h, v))

        # Zone classes: the offers of one (pool, type, market) across its zones. Work that does
        # not care which zone (no gang, no zone-dependent cost or latency rule) is placed on
        # the class, so it costs one variable per pool and type instead of one per zone.
        self.classes: dict[str, Capacity] = {}
        self.class_of: dict[str, str] = {}
        members: dict[str, list[Capacity]] = {}
        for o in offers:
            members.setdefault(o.class_key, []).append(o)
        for ck, os_ in members.items():
            if len(os_) < 2:
                continue
            rep = min(os_, key=lambda o: (o.price, o.key))
            self.classes[ck] = replace(rep, key=ck, price=max(o.price for o in os_), max_new=sum(o.max_new for o in os_),
                                       members=tuple(o.key for o in os_))
            for o in os_:
                self.class_of[o.key] = ck
        self.caps.update(self.classes)

        # New items per (group, capacity). On a host, only where they could land: in its free
        # room, where pending work may evict a resident (preemption, reclaim), or where a
        # resident's tenant is over its quota now (some of its work must go).
        self.x: dict[tuple[str, str], object] = {}
        self.x_of_group: dict[str, list[tuple[Capacity, object]]] = {gk: [] for gk in problem.groups}
        self.x_at: dict[str, list[tuple[Demand, object]]] = {}
        room = {h.key: _free_room(h, self.demands) for h in hosts if not h.frozen and h.keep_blocker is None}
        warm_hosts: dict[str, list[str]] = {}  # group -> hosts the warm start puts its new items on
        for (dk, ck), n in (warm.x.items() if warm else ()):
            if n and ck in room:
                warm_hosts.setdefault(self.group_of[dk], []).append(ck)
        borrowing = borrowing_tenants(problem.demands, problem.tenants)
        leaving = over_cap_tenants(problem.demands, problem.tenants)  # some of their running work must go
        preemption = problem.placement.preemption
        evicts_memo: dict[tuple, bool] = {}

        def may_evict(pending_pairs: frozenset, resident_pairs: frozenset) -> bool:
            v = evicts_memo.get((pending_pairs, resident_pairs))
            if v is None:
                v = evicts_memo[(pending_pairs, resident_pairs)] = any(
                    may_preempt(Rival(*pp), Rival(*rp), borrowing, preemption) for pp in pending_pairs for rp in resident_pairs)
            return v

        fit_of = OfferFits()  # asked for each group's first demand: the group's shape
        hosts_at = _HostIndex(problem.capacities, list(self.idle.values()), self.idle_of, room, self.demands, leaving)
        pending_of = {gk: frozenset((d.tenant, d.klass) for k in members_ if (d := self.demands[k]).running_jobs < len(d.jobs))
                      for gk, members_ in problem.groups.items()}
        # Room an eviction frees is room for any pending work of the shape, not only the evicting job's: a host
        # where some pending work may evict a resident is offered to every group with pending jobs. (Without it
        # a 4-vCPU job stayed pending beside the 8 vCPU a normal job's eviction of a 12-vCPU one freed, or the
        # plan bought a new instance at 2.6x the spot host's price to hold it: the pending-reason property tier.)
        freed = hosts_at.freed({(type_class(self.demands[problem.groups[gk][0]]), pend) for gk, pend in pending_of.items() if pend}, may_evict)
        for gk, members_ in problem.groups.items():
            rep = self.demands[members_[0]]
            total = sum(len(self.demands[k].jobs) * self.demands[k].replicas for k in members_)
            pending = pending_of[gk]
            done_classes: set[str] = set()
            for c in hosts_at.candidates(rep, pending, warm_hosts.get(gk, []), may_evict, freed):
                if c.key in self.idle and rep.gang_mode == "placement-group" and rep.gang:
                    continue  # (as on any host)
                elif c.key in self.class_of and not rep.gang and fit_of(rep, c) > 1:
                    # Items over half an instance stay per zone: a class's aggregate row cannot
                    # tell that one needs most of a single instance beside work pinned to a zone.
                    ck = self.class_of[c.key]
                    if ck in done_classes:
                        continue
                    zones = [self.caps[k] for k in self.classes[ck].members]
                    # A tenant budget charges a class's items at its dearest zone's price: only where
                    # the zones cost alike (else work that fits the budget in the cheap zone was left out).
                    rules = problem.tenants.get(rep.tenant)
                    priced_alike = rules is None or rules.budget is None or len({z.price for z in zones}) == 1
                    if all(fit_of(rep, z) > 0 for z in zones) and len({round(problem.cost_coef(rep, z), 9) for z in zones}) == 1 and priced_alike:
                        done_classes.add(ck)
                        c = self.classes[ck]  # one variable for every zone of the class
                f = fit_of(rep, c)
                if f <= 0:
                    continue
                v = m.new_int_var(0, min(total, f * (c.max_new if not c.existing else 1)), f"x[{gk},{c.key}]")
                self.x[(gk, c.key)] = v
                self.x_of_group[gk].append((c, v))
                self.x_at.setdefault(c.key, []).append((rep, v))

        self._capacity()
        self._demand_vars()
        self._gangs()
        self._tenants()
        if problem.licenses:
            add_license_constraints(m, problem, self.placed)
        if problem.quotas:
            add_cloud_quota_constraints(m, problem, offers, self.use)
        self._pools_budget_spot()
        self._moves()

    # -- capacity

    def _capacity(self) -> None:
        m = self.m
        resident_load: dict[str, list[tuple[Demand, object]]] = {}
        for (dk, hk), v in self.stay.items():
            resident_load.setdefault(hk, []).append((self.demands[dk], v))
        # One capacity row per instance (host), per zone offer for the work pinned to its zone,
        # and per zone class for everything its zones hold together.
        rows: list[tuple[Capacity, list, object, int]] = []  # (shape, items, instances, most instances)
        for c in self.p.capacities:
            if (c.existing and c.frozen) or c.key in self.idle_of:
                continue
            items = self.x_at.get(c.key, []) + (resident_load.get(c.key, []) if c.existing else [])
            if c.existing or c.key not in self.class_of:
                rows.append((c, items, self.use[c.key], 1 if c.existing else c.max_new))
            elif items:
                rows.append((c, items, self.use[c.key], c.max_new))
        for ck, cls in self.classes.items():
            items = self.x_at.get(ck, []) + [it for k in cls.members for it in self.x_at.get(k, [])]
            rows.append((cls, items, sum(self.use[k] for k in cls.members), cls.max_new))
        for ik, cls in self.idle.items():
            rows.append((cls, self.x_at.get(ik, []), self.use[ik], cls.max_new))
        for c, items, n, most in rows:
            items = [(d, v) for d, v in items if not isinstance(v, int) or v]
            if not items:
                continue
            dims = sorted({k for d, _ in items for k in d.dims if d.req(k) > 0})
            for dim in dims:
                s = scale(dim)
                terms = [(round(d.req(dim) * s), v) for d, v in items if d.req(dim) > 0]
                m.add(_wsum(terms) <= math.floor(c.cap(dim) * s + 1e-6) * n)
                if not c.existing and most > 1:
                    # Valid cuts: at most k items bigger than 1/(k+1) of an instance fit on one,
                    # in any dimension. They close most of the gap between the count and packing.
                    for k in (1, 2, 3):
                        big = [v for d, v in items if d.req(dim) * (k + 1) > c.cap(dim) + 1e-9]
                        if len(big) > k - 1 and (k == 1 or len(big) > 1):
                            m.add(sum(big) <= k * n)
                    self._big_item_cuts(terms, math.floor(c.cap(dim) * s + 1e-6), n)

    def _big_item_cuts(self, terms: list[tuple[int, object]], cap: int, n) -> None:
        """Fekete-Schepers cuts: for each size t over half an instance, an item of size >= t
        fills its instance for anything bigger than cap - t, so count it as a whole instance,
        the items that cannot share with it at their size, and the items that can at zero.
        (6+6+4 GPUs pass the 16-GPU count of two 8-GPU instances; this cut says 8+8+4 > 16.)"""
        for t in sorted({w for w, _ in terms if 2 * w > cap}):
            mid = [(w, v) for w, v in terms if cap - t < w < t]
            if mid:
                big = [(cap, v) for w, v in terms if w >= t]
                self.m.add(_wsum(big + mid) <= cap * n)

    # -- demands, guarantees

    def _demand_vars(self) -> None:
        m, p = self.m, self.p
        self.placed: dict[str, object] = {}
        self.g: dict[str, object] = {}
        self.b: dict[str, object] = {}
        self.krj: dict[str, object] = {}
        self.krg: dict[str, object] = {}
        self.krb: dict[str, object] = {}
        # Tenants that can borrow (a ceiling above the guarantee) get a guaranteed/borrowed split.
        finite = {t for t, r in p.tenants.items()
                  if any(r.cap.get(dim, math.inf) > v + 1e-9 for dim, v in r.guarantee.items())}
        for d in p.demands:
            n = len(d.jobs)
            pl = self.placed[d.key] = m.new_int_var(0, n, f"placed[{d.key}]")
            if d.tenant in finite:
                g = self.g[d.key] = m.new_int_var(0, n, f"g[{d.key}]")
                b = self.b[d.key] = m.new_int_var(0, n, f"b[{d.key}]")
                m.add(g + b == pl)
            else:
                self.g[d.key], self.b[d.key] = pl, 0
            r = d.running_jobs
            if r:
                if d.gang:
                    k = self.krj[d.key] = pl  # a running gang is kept iff it is placed
                else:
                    k = self.krj[d.key] = m.new_int_var(0, min(n, r), f"krj[{d.key}]")
                    m.add(k <= pl)
                if d.tenant in finite:
                    kg = self.krg[d.key] = m.new_int_var(0, min(n, r), f"krg[{d.key}]")
                    kb = self.krb[d.key] = m.new_int_var(0, min(n, r), f"krb[{d.key}]")
                    m.add(kg <= self.g[d.key])
                    m.add(kb <= self.b[d.key])
                    m.add(kg + kb <= k)
                else:
                    self.krg[d.key], self.krb[d.key] = k, 0
        # Items of a group: every placed item either stays where it runs or is placed anew.
        for gk, members in p.groups.items():
            new = [v for _, v in self.x_of_group[gk]]
            lhs = []
            for dk in members:
                d = self.demands[dk]
                lhs.append((d.replicas, self.placed[dk]))
                for _, v in self.stay_of.get(dk, []):
                    lhs.append((-1, v))
            m.add(_wsum(lhs) == sum(new))
        # Staying items belong to kept running jobs.
        for d in p.demands:
            stays = [v for _, v in self.stay_of.get(d.key, [])]
            if stays and d.running_jobs:
                kept_items = self.placed[d.key] * d.running_items if d.gang else self.krj[d.key]
                m.add(sum(stays) <= kept_items)

    def _gangs(self) -> None:
        m = self.m
        for d in self.p.demands:
            if not d.gang:
                continue
            gk = self.group_of[d.key]
            cells = list(self.x_of_group[gk]) + [(c, v) for c, v in self.stay_of.get(d.key, [])]
            if d.gang_mode == "placement-group":
                keyf = lambda c: c.offer_key  # noqa: E731
            else:
                keyf = lambda c: c.site  # noqa: E731
            sites = sorted({keyf(c) for c, _ in cells}, key=str)
            if not sites:
                continue
            if len(sites) == 1 and d.gang_mode != "placement-group":
                continue
            y = {s: m.new_bool_var(f"site[{d.key},{s}]") for s in sites}
            m.add(sum(y.values()) == self.placed[d.key])
            for c, v in cells:
                if isinstance(v, int) and v == 0:
                    continue
                m.add(v <= d.replicas * y[keyf(c)])
        # An instance launches into one placement group: a placement-group gang's new items take
        # whole instances of their offer, which no other gang's group shares (other work may).
        pg_instances: dict[str, list] = {}
        for d in self.p.demands:
            if not (d.gang and d.gang_mode == "placement-group"):
                continue
            for c, v in self.x_of_group[self.group_of[d.key]]:
                if c.existing:
                    continue
                n = m.new_int_var(0, c.max_new, f"pg_instances[{d.key},{c.key}]")
                m.add(v <= fit(d, c) * n)
                pg_instances.setdefault(c.key, []).append(n)
        for ck, ns in pg_instances.items():
            m.add(sum(ns) <= self.use[ck])

    def _tenants(self) -> None:
        m, p = self.m, self.p
        for t, r in p.tenants.items():
            mine = [d for d in p.demands if d.tenant == t]
            for dim, limit in r.cap.items():
                terms = [(round(d.req(dim) * scale(dim)) * d.replicas, self.placed[d.key]) for d in mine if d.req(dim)]
                if terms:
                    m.add(_wsum(terms) <= math.floor(limit * scale(dim) + 1e-6))
            for dim, limit in r.guarantee.items():
                terms = [(round(d.req(dim) * scale(dim)) * d.replicas, self.g[d.key]) for d in mine if d.req(dim)]
                if terms:
                    m.add(_wsum(terms) <= math.floor(limit * scale(dim) + 1e-6))
            if r.budget is not None:
                terms = self._tenant_cost_terms(mine)
                if terms:
                    m.add(_wsum(terms) <= milli_down(r.budget))
            if r.spot_fraction is not None and r.spot_fraction < 1:
                on_spot, total = [], []
                for d in mine:
                    total.append((work_units(d) * d.replicas, self.placed[d.key]))
                    for c, v in self.stay_of.get(d.key, []):
                        if c.market == "spot":
                            on_spot.append((work_units(d), v))
                for gk in {self.group_of[d.key] for d in mine}:
                    rep = self.demands[p.groups[gk][0]]
                    for c, v in self.x_of_group[gk]:
                        if c.market == "spot":
                            on_spot.append((work_units(rep), v))
                f = fraction_milli(r.spot_fraction)
                m.add(1000 * _wsum(on_spot) <= f * _wsum(total))

    def _tenant_cost_terms(self, mine: list[Demand]) -> list[tuple[int, object]]:
        terms = []
        for d in mine:
            for c, v in self.stay_of.get(d.key, []):
                terms.append((milli_up(charge(d, c)), v))
        for gk in {self.group_of[d.key] for d in mine}:
            rep = self.demands[self.p.groups[gk][0]]
            for c, v in self.x_of_group[gk]:
                terms.append((milli_up(charge(rep, c)), v))
        return terms

    # -- fleet-wide rules

    def _pools_budget_spot(self) -> None:
        m, p = self.m, self.p
        by_pool: dict[str, list] = {}
        for c in self.units:
            by_pool.setdefault(c.pool, []).append(self.use[c.key])
        for pool, (lo, hi) in p.pool_bounds.items():
            vs = by_pool.get(pool, [])
            if any(not isinstance(v, int) for v in vs):
                m.add(sum(vs) >= lo)
                m.add(sum(vs) <= hi)
            elif not lo <= sum(vs) <= hi:
                m.add(m.new_constant(0) >= 1)  # e.g. nothing can be bought for this pool, yet it needs lo instances
        if p.budget is not None:  # prices rounded up, budget down: never over by a fraction of a cent
            m.add(_wsum([(milli_up(c.price), self.use[c.key]) for c in self.units]) <= milli_down(p.budget))

        sp = p.spot
        caps = self.units
        dim, measure = spot_measure(caps, p.gpu_fleet)
        prim = lambda c: round(measure(c))  # noqa: E731 - integer coefficients
        spot = [c for c in caps if c.market == "spot"]
        if spot and sp.max_spot_fraction < 1:
            frac = fraction_milli(sp.max_spot_fraction)
            m.add(1000 * _wsum([(prim(c), self.use[c.key]) for c in spot]) <= frac * _wsum([(prim(c), self.use[c.key]) for c in caps]))
        if spot and sp.on_demand_buffer_percent > 0:
            od = [c for c in caps if c.market != "spot"]
            # idle on-demand capacity (x 70000) >= percent (x 700) of spot capacity. 70000 = 7 x 10000:
            # a MIG item uses its compute slices / 7 of a GPU, so a GPU's seven slices count exactly
            # one GPU (at x 10000 each 1g slice rounded to 1429 and a full GPU was 10003 used).
            need = [(round(sp.on_demand_buffer_percent * 700) * prim(c), self.use[c.key]) for c in spot]
            idle = [(70000 * prim(c), self.use[c.key]) for c in od]

            def used(d: Demand) -> int:  # x 70000 (deadline-critical work may use the buffer's capacity)
                return round(70000 * buffer_use(d, dim))
            for (gk, ck), v in self.x.items():
                if self.caps[ck].market != "spot":
                    idle.append((-used(self.demands[self.p.groups[gk][0]]), v))
            for (dk, hk), v in self.stay.items():
                c = self.caps[hk]
                if c.market != "spot":
                    idle.append((-used(self.demands[dk]), v))
            m.add(_wsum(idle) >= _wsum(need))
        if spot and (sp.min_instance_types > 1 or sp.min_zones > 1):
            any_spot = m.new_bool_var("any_spot")
            for c in spot:
                ub = c.max_new if not c.existing else 1
                m.add(self.use[c.key] <= ub * any_spot)
            for attr, need in (("instance_type", sp.min_instance_types), ("zone", sp.min_zones)):
                if need <= 1:
                    continue
                values = sorted({getattr(c, attr) for c in spot})
                used = {v: m.new_bool_var(f"spot_{attr}[{v}]") for v in values}
                for v in values:
                    m.add(used[v] <= sum(self.use[c.key] for c in spot if getattr(c, attr) == v))
                m.add(sum(used.values()) >= need * any_spot)

    # -- stability

    def _moves(self) -> None:
        """Moved items of running jobs, and (WhenEmpty) the rule that nothing moves unless it must."""
        m, p = self.m, self.p
        self.moved: dict[str, object] = {}
        when_empty = p.placement.consolidation == "WhenEmpty"
        forced = forced_moves(p) if when_empty else {}
        for d in p.demands:
            if not d.running_jobs:
                continue
            stays = [v for _, v in self.stay_of.get(d.key, [])]
            kept_items = self.placed[d.key] * d.running_items if d.gang else self.krj[d.key]
            mv = kept_items - sum(stays)
            self.moved[d.key] = mv
            if when_empty:  # (a job whose resources changed restarts anyway: it may restart elsewhere)
                m.add(mv <= forced.get(d.key, 0) + sum(len(h) // d.bundle for j, h in d.running if j in d.reshaped))

    # -- objectives

    def tiers(self) -> list[_Tier]:
        p, m = self.p, self.m
        classes = sorted({d.klass for d in p.demands}, reverse=True)
        out: list[_Tier] = []
        # 1. Guarantees are never taken by another tenant: each keeps the guaranteed work it runs.
        prot = []
        bound = 0
        # A tenant's protected units of class c are kept by its running jobs of class c kept inside the
        # guarantee, or replaced by its new guaranteed work of a higher class (the README lets a tenant's
        # higher class take its lower jobs' place); never by pending work of the same class (counting any
        # placed guaranteed work let such a job stand in for a running one while another tenant's higher
        # class took its capacity: property tier). The tier is the most units such a matching covers, one
        # count per unit: by Hall's theorem (each kept job serves its own class, new work of class k every
        # class below k: intervals), at most total - units(a..b) + kept(a..b) + new work above a, for
        # every interval a..b of the tenant's protected classes. (Kept is what its demands holding protected jobs
        # keep of those classes, not capped at the protected units: a cap per class made the warm start's
        # completion search, 0.5 deterministic s and 3x the wall time of a 1k-job warm plan; uncapped, only a
        # kept identical job stands in for a protected one. A count per class counted a low unit once
        # per class above it, so CP-SAT kept a tenant's normal job against another's high one; and a count
        # of classes <= c did not let a new normal job stand in for a low one beside a running normal job:
        # both found by the property tier.)
        for t, r in p.tenants.items():
            if r.protected <= 0:  # (a tenant with no quota at all is unlimited: all it runs is guaranteed)
                continue
            mine = [d for d in p.demands if d.tenant == t]
            protected_jobs = set(r.protected_jobs)  # (a tuple of thousands of names at 10k: a set, not a scan per job)
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
            kept = {c: [(d.job_size, self.krg[d.key]) for d in mine if d.klass == c and d.key in self.krg and d.key in holds] for c in levels}
            pt = m.new_int_var(0, total, f"protect[{t}]")
            for i, a in enumerate(levels):
                # (its new work above a, one variable: rows of every demand per interval made a 1k-job warm plan slower)
                # (running jobs that are not protected, e.g. a gang that must move whole, need capacity anew: new work)
                terms = [(d.job_size, self.g[d.key]) for d in mine if d.klass > a]
                terms += [(-d.job_size, self.krg[d.key]) for d in mine if d.klass > a and d.key in self.krg and d.key in holds]
                new_above = m.new_int_var(0, total, f"protect_new[{t},{a}]")
                if terms:
                    m.add(new_above <= _wsum(terms))
                else:
                    m.add(new_above == 0)
                for b in levels[i:]:
                    span = [c for c in levels if a <= c <= b]
                    m.add(pt <= total - sum(units[c] for c in span) + _wsum([x for c in span for x in kept[c]]) + new_above)
            prot.append(pt)
            bound += total
        if prot:
            out.append(_Tier("guarantees kept", sum(prot), "max", bound))

        def run_tier(c, kr, label):
            ds = [d for d in p.demands if d.klass == c and d.running_jobs and not (isinstance(kr[d.key], int) and kr[d.key] == 0)]
            if ds:
                out.append(_Tier(f"{label} running {_cls(c)} jobs kept", _wsum([(d.job_size, kr[d.key]) for d in ds]), "max",
                                 sum(d.job_size * min(d.running_jobs, len(d.jobs)) for d in ds)))

        def work_tier(c, var, label):
            dl = deadline_tier_terms(p.demands, c, var)  # deadline work first, within its class
            if dl is not None:
                out.append(_Tier(f"{label} {_cls(c)} deadline work", _wsum(dl[0]), "max", dl[1]))
            ds = [d for d in p.demands if d.klass == c and not (isinstance(var[d.key], int) and var[d.key] == 0)]
            if ds:
                out.append(_Tier(f"{label} {_cls(c)} work", _wsum([(d.weight, var[d.key]) for d in ds]), "max",
                                 sum(d.weight * len(d.jobs) for d in ds)))

        # 2. Inside guarantees, by class: what runs first (no same-class preemption), then all.
        if p.placement.preemption == "Never":
            for c in classes:
                run_tier(c, self.krg, "guaranteed")
            for c in classes:
                work_tier(c, self.g, "guaranteed")
        else:
            for c in classes:
                run_tier(c, self.krg, "guaranteed")
                work_tier(c, self.g, "guaranteed")
        # 3. Borrowed capacity: weighted dominant-resource fair share first, then by class.
        fair = self._fair_share()
        if fair is not None:
            out.append(fair)
        for c in classes:
            run_tier(c, self.krb, "borrowed")
            work_tier(c, self.b, "borrowed")
        # 4. Victims: among equally good answers, evict the jobs with the least time left.
        ev = []
        for d in p.demands:
            if d.running_jobs:
                rem = [p.job_remaining.get(j, d.hours) for j, _ in d.running]
                per_job = max(1, round(10 * d.job_size * (sum(rem) / len(rem))))
                ev.append((per_job, d.running_jobs - self.krj[d.key] if not d.gang else 1 - self.placed[d.key]))
        if ev:
            out.append(_Tier("victims' remaining time", _wsum([(w, e) for w, e in ev]), "min", 0))
        return out

    def _fair_share(self) -> _Tier | None:
        p, m = self.p, self.m
        borrowers = []
        for t, r in p.tenants.items():
            mine = [d for d in p.demands if d.tenant == t and not isinstance(self.b[d.key], int)]
            if not mine:
                continue
            dim = r.dominant
            cap = p.fleet_capacity.get(dim) or 0
            if cap <= 0:
                continue
            beta = [(round(d.req(dim) * scale(dim)) * d.replicas, self.b[d.key]) for d in mine if d.req(dim)]
            if not beta:
                continue
            most = sum(round(d.req(dim) * scale(dim)) * d.replicas * len(d.jobs) for d in mine)
            room = r.cap.get(dim, math.inf) - r.guarantee.get(dim, 0.0)
            most = min(most, room * scale(dim)) if math.isfinite(room) else most
            borrowers.append((t, r, beta, cap * scale(dim), most))
        if len(borrowers) < 2:
            return None
        top = max(1000.0 / max(r.weight, 1e-3) for _, r, *_ in borrowers)
        step = max(1, math.ceil(top / SEGMENTS))
        terms, bound = [], 0
        for t, r, beta, denom, most in borrowers:
            s = m.new_int_var(0, 1000, f"share[{t}]")
            m.add(round(denom) * s <= 1000 * _wsum(beta))
            w = max(1, round(r.weight * 100))
            segs = [m.new_int_var(0, step, f"fair[{t},{k}]") for k in range(SEGMENTS)]
            m.add(w * sum(segs) <= 100 * s)  # the segments fill up to share / weight
            # Weighted utility, weight x f(share / weight): its slope in share is f' alone, so the
            # optimum equalises share / weight (without the factor the heavier tenant got less).
            terms += [(w * (SEGMENTS - k), v) for k, v in enumerate(segs)]
            x_max = min(1000.0, 1000.0 * most / denom) / max(r.weight, 1e-3)
            left = x_max
            for k in range(SEGMENTS):
                take = max(0.0, min(step, left))
                bound += w * (SEGMENTS - k) * take
                left -= take
        return _Tier("fair share of borrowed capacity", _wsum(terms), "max", math.floor(bound))

    def cost(self):
        """$/h of instances, egress, latency and spot preference, plus amortised moves, in milli-dollars."""
        p = self.p
        terms = [(round(c.price * MILLI), self.use[c.key]) for c in self.units]
        for (gk, ck), v in self.x.items():
            e = p.cost_coef(self.demands[p.groups[gk][0]], self.caps[ck])
            if e:
                terms.append((round(e * MILLI), v))
        for (dk, hk), v in self.stay.items():
            e = p.cost_coef(self.demands[dk], self.caps[hk])
            if e:
                terms.append((round(e * MILLI), v))
        pol = p.placement
        for dk, mv in self.moved.items():
            d = self.demands[dk]
            if len(d.reshaped) == d.running_jobs:
                continue  # its running jobs restart in their new shape wherever they go: moving them costs no more
            per_item = pol.move_cost_per_gpu * (d.gpus or 0) if (d.gpus or d.mig) else pol.move_cost_per_replica
            if d.mig:
                per_item = pol.move_cost_per_gpu * d.size / 7
            w = max(1, round(per_item / pol.payback_hours * MILLI))
            terms.append((w, mv))
        created = [(1, self.use[c.key]) for c in self.offers]
        return _wsum(terms) + _wsum(created)

    def instance_cost(self):
        return _wsum([(round(c.price * MILLI), self.use[c.key]) for c in self.units])

    def work(self):
        return _wsum([(d.weight, self.placed[d.key]) for d in self.p.demands])

    # -- hints

    def hint_from(self, a: Assignment) -> None:
        """Hint the primary variables with an assignment (the rest is completed by a solve)."""
        hints: list[tuple[int, int]] = []
        use = dict(a.use)
        for ik, hs in self.idle_members.items():
            use[ik] = sum(1 for h in hs if a.use.get(h.key, 0))
        for ck, v in self.use.items():
            if not isinstance(v, int):
                hints.append((v.index, use.get(ck, 0)))
        for (dk, hk), v in self.stay.items():
            if not isinstance(v, int):
                hints.append((v.index, a.stay.get((dk, hk), 0)))
        per_group: dict[tuple[str, str], int] = {}
        for (dk, ck), n in a.x.items():
            if dk in self.group_of:
                gk = self.group_of[dk]
                ck = self.idle_of.get(ck, ck)
                if (gk, ck) not in self.x and self.class_of.get(ck):
                    ck = self.class_of[ck]
                k = (gk, ck)
                per_group[k] = per_group.get(k, 0) + n
        for k, v in self.x.items():
            hints.append((v.index, per_group.get(k, 0)))
        for dk, v in self.placed.items():
            if not isinstance(v, int):
                hints.append((v.index, a.placed.get(dk, 0)))
        _set_hints(self.m, hints)

    def primaries(self) -> list:
        out = [v for v in self.use.values() if not isinstance(v, int)]
        out += [v for v in self.stay.values() if not isinstance(v, int)]
        out += list(self.x.values())
        out += [v for v in self.placed.values() if not isinstance(v, int)]
        return out

    def set_primary_hint(self, values: list[int]) -> None:
        _set_hints(self.m, [(v.index, values[v.index]) for v in self.primaries()])

    def set_full_hint(self, values: list[int]) -> None:
        _set_hints(self.m, enumerate(values))


class _HostIndex:
    """Where a group's new items may go, by GPU model: every offer and idle class, and of the
    instances that run work, only those a group could use: free room for one item, a resident
    pending work may evict, or a resident whose tenant must shed work. Found through indexes
    (free room sorted per dimension, hosts by who lives there) instead of asking every host
    for every group: at 10k instances 97% of 1.3M such questions said no."""

    def __init__(self, capacities: list[Capacity], idle: list[Capacity], idle_of: dict[str, str],
                 room: dict[str, dict[str, float]], demands: dict[str, Demand], leaving: set[str]):
        self.order: dict[tuple, list[Capacity]] = {}  # type class -> capacities, in model order
        self.always: dict[tuple, list[int]] = {}  # positions of offers and idle classes
        self.hosts: dict[tuple, list[tuple[int, Capacity]]] = {}  # running instances the model may change
        self.room = room
        self.gpu_resident: set[str] = set()
        self.shedding: dict[tuple, list[int]] = {}
        self.by_pairs: dict[tuple, dict[frozenset, list[int]]] = {}  # who lives there -> positions
        self.pos: dict[str, tuple[tuple, int]] = {}  # host key -> (type class, position)
        self.sorted_free: dict[tuple, tuple[list[float], list[int]]] = {}
        for c in [*capacities, *idle]:
            if c.existing and (c.frozen or c.keep_blocker is not None or c.key in idle_of):
                continue
            t = type_class(c)
            order = self.order.setdefault(t, [])
            i = len(order)
            order.append(c)
            self.pos[c.key] = (t, i)
            if c.instance_id is None:
                self.always.setdefault(t, []).append(i)
                continue
            self.hosts.setdefault(t, []).append((i, c))
            res = [demands[dk] for dk, _, _ in c.residents if dk in demands]
            if any(d.gpus for d in res):
                self.gpu_resident.add(c.key)
            if any(d.tenant in leaving for d in res):
                self.shedding.setdefault(t, []).append(i)
            self.by_pairs.setdefault(t, {}).setdefault(frozenset((d.tenant, d.klass) for d in res), []).append(i)

    def _with_room(self, t: tuple, needs: list[tuple[str, float]]) -> list[int]:
        """Positions of hosts of type t whose free room holds one item of `needs`."""
        if not needs:
            return [i for i, _ in self.hosts.get(t, ())]
        k0, r0 = needs[0]
        key = (t, k0)
        if key not in self.sorted_free:
            ranked = sorted((self.room[c.key].get(k0, 0.0), i) for i, c in self.hosts.get(t, ()))
            self.sorted_free[key] = ([f for f, _ in ranked], [i for _, i in ranked])
        frees, idx = self.sorted_free[key]
        order = self.order[t]
        out = []
        for i in idx[bisect.bisect_left(frees, r0):]:
            free = self.room[order[i].key]
            if all(free.get(k, 0.0) >= r for k, r in needs[1:]):
                out.append(i)
        return out

    def freed(self, pendings: set[tuple[tuple, frozenset]], may_evict) -> dict[tuple, set[int]]:
        """Per type class, positions of hosts where some group's pending work (type class, its (tenant,
        class) pairs) may evict a resident."""
        out: dict[tuple, set[int]] = {}
        for t, pending in pendings:
            for pairs, at in self.by_pairs.get(t, {}).items():
                if may_evict(pending, pairs):
                    out.setdefault(t, set()).update(at)
        return out

    def candidates(self, rep: Demand, pending: frozenset, warm_hosts: list[str], may_evict, freed: dict | None = None) -> list[Capacity]:
        """`warm_hosts`: the hosts the warm start puts this group's new items on; `freed`: hosts where some
        group's pending work may evict a resident (`freed()`), offered to every group with pending work."""
        t = type_class(rep)
        order = self.order.get(t)
        if not order:
            return []
        picked = set(self.always.get(t, ()))
        for k in warm_hosts:  # the hint must be expressible (an idle class's members are not here: the class is)
            tk, i = self.pos.get(k, (None, -1))
            if tk == t:
                picked.add(i)
        if not (rep.gang_mode == "placement-group" and rep.gang):  # a placement group's members are new instances
            found = list(self.shedding.get(t, ()))
            found += self._with_room(t, [(k, rep.req(k) - 1e-9) for k in rep.dims if rep.req(k) > 0])
            if pending:
                for pairs, at in self.by_pairs.get(t, {}).items():
                    if may_evict(pending, pairs):
                        found += at
                found += (freed or {}).get(t, ())
            if rep.nvlink:  # NVLink blocks go only where no GPU is taken (GPU indices are not re-packed)
                found = [i for i in found if order[i].key not in self.gpu_resident]
            picked.update(found)
        return [order[i] for i in sorted(picked)]


def _set_hints(m: cp_model.CpModel, hints) -> None:
    """Replace the model's hint with (variable index, value) pairs, written to the proto at
    once (CpModel.add_hint per variable: 0.35 s per 100k hints)."""
    pairs = list(hints)
    m.clear_hints()
    h = m.proto.solution_hint
    h.vars.extend(i for i, _ in pairs)
    h.values.extend(int(n) for _, n in pairs)


def _free_room(h: Capacity, demands: dict[str, Demand]) -> dict[str, float]:
    """What is free on a host with every resident that may stay still there."""
    dims = list(DIMS) + [f"mig:{p}" for p in set(h.mig or ())]
    free = {k: h.cap(k) for k in dims}
    for dk, _, n in h.residents:
        d = demands.get(dk)
        if d is not None and fit(d, h) > 0:
            for k in d.dims:
                free[k] = free.get(k, 0.0) - d.req(k) * n
    return free


def _complete(model: "_Model", tiers: list[_Tier], s: cp_model.CpSolver, clock: "_Work", work: float) -> list[int] | None:
    """A full solution from the hinted primary variables (instances, stays, placements): every
    helper variable set as high as those placements allow in each tier (max tiers count double
    the borrowed ones so the guaranteed/borrowed split favours the guarantee)."""
    m = model.m
    terms = []
    for t in tiers:
        w = 1 if t.sense == "min" else (2 if t.name.startswith(("guarantee", "protected")) else 1)
        terms.append(t.expr * (w if t.sense == "max" else -w))
    if terms:
        m.maximize(sum(terms))
    st = clock.solve(s, m, work)
    m.clear_hints()
    return list(s.response_proto.solution) if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None


def _proven(lp_value: float, sense: str) -> int:
    """The integer bound an LP optimum proves for an integer objective, loosened by the LP
    solver's tolerances (~1e-7 relative): a bound past the true optimum would cut off plans."""
    slack = 1e-6 + 1e-7 * abs(lp_value)
    return math.floor(lp_value + slack) if sense == "max" else math.ceil(lp_value - slack)


def _wsum(terms):
    """A weighted sum of (coefficient, variable or int) pairs, fast."""
    vs, cs, const = [], [], 0
    for c, v in terms:
        if isinstance(v, int):
            const += c * v
        elif c:
            vs.append(v)
            cs.append(c)
    expr = cp_model.LinearExpr.weighted_sum(vs, cs) if vs else 0
    return expr + const if const else expr


def _cls(c: int) -> str:
    return ("low", "normal", "high", "critical")[c]


# ---------------------------------------------------------------- solving


def _value(values: list[int], expr) -> int:
    """Evaluate a linear expression against a full solution vector."""
    if isinstance(expr, int):
        return expr
    vars_, coeffs, const = _flatten(expr)
    return sum(c * values[i] for i, c in zip(vars_, coeffs)) + const


def _flatten(expr):
    """(variable indices, coefficients, constant) of a linear expression."""
    from ortools.sat.python import cp_model_helper as cmh

    if isinstance(expr, int):
        return [], [], expr
    flat = cmh.FlatIntExpr(expr)
    return [v.index for v in flat.vars], list(flat.coeffs), flat.offset


GAP_LIMIT = 0.03  # stop once the cost is provably within 3% of the LP relaxation's bound (--gap)
EXACT_BELOW = 3000  # variables: models this small are solved to optimality (milliseconds), whatever the gap limit
# One CP-SAT worker: its search is a function of the model, the seed and the work limit; a parallel
# portfolio's answer depends on how its threads are scheduled (the same input gave 0 and 2,237
# jobs placed, or another cloud, from one run to the next). Interleaved search is deterministic
# too, but overran its work limit 2x and took 4x the wall time of one worker on the same model.
WORKERS = 1
# The search is bounded by work: CP-SAT's deterministic seconds, counted the same on a busy machine
# as on an idle one. --time-limit T buys T x WORK_PER_SECOND of them: on these models one took 2-3 s
# of CPU (a 1.25 work-second tier search of an 800-job gang fleet: 21.5 s wall at load 12 on
# 2 cores, ~3.6 s of CPU), so T is about the wall time on an idle core. The wall clock is only a
# safety cap, at WALL_FACTOR x T + WALL_SLACK; when it is hit the plan is greedy's, which is
# as deterministic, and says so.
WORK_PER_SECOND = 0.3
WALL_FACTOR, WALL_SLACK = 10.0, 30.0
WARM_WORK = (1.0, 0.1)  # work to complete the warm start into a solution of the model: max(1, 0.1 x budget)


class _WallCap(Exception):
    """The wall-clock safety cap was hit: the search result would depend on the machine's load."""


class _Work:
    """The search's budget in deterministic seconds, spent stage by stage, with the wall clock as
    a safety cap. Every decision reads `used`, which CP-SAT counts deterministically (one worker)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.used = 0.0

    def solve(self, s: cp_model.CpSolver, m: cp_model.CpModel, work: float) -> int:
        wall = self.deadline - time.monotonic()
        if wall <= 0:
            raise _WallCap
        work = max(0.01, work)
        s.parameters.max_deterministic_time = work
        s.parameters.max_time_in_seconds = wall
        st = s.solve(m)
        used = s.response_proto.deterministic_time
        self.used += used
        if st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and used < work * 0.999 and s.wall_time >= wall * 0.99:
            raise _WallCap  # stopped by the wall clock, not by its work limit
        return st


def solve(problem: Problem, time_limit: float = 20.0, workers: int | None = None, seed: int = 0,
          with_lp_bound: bool = False, gap_limit: float = GAP_LIMIT, decompose: bool = True, processes: int | None = None) -> Solution:
    """Solve with at most time_limit x WORK_PER_SECOND deterministic seconds of CP-SAT work (`_Work`); the cost
    stage stops early once within gap_limit of the LP bound. The same problem always gives the
    same solution: nothing here reads the clock except the wall-clock safety cap (WALL_FACTOR),
    whose fallback is greedy's plan. Every tier is at least the warm start's (greedy's), held as
    its floor, and the finished answer is compared with the warm start tier by tier.
    with_lp_bound: also report the LP relaxation's least instance cost at the same tiers (the
    benchmark's yardstick). Independent parts (`components`) each get a share of the work by size,
    and are solved in worker processes where two or more are large (reconciler/parallel.py;
    `processes`: how many, default by the parts' sizes and the CPUs), else one by one."""
    t0 = time.monotonic()
    if time_limit <= 0:  # --time-limit 0: greedy best-fit only
        return _from_assignment(problem, _warm_start(problem), "GREEDY_FALLBACK", t0, note="greedy best-fit only (--time-limit 0)")
    clock = _Work(t0 + WALL_FACTOR * time_limit + WALL_SLACK)
    work = time_limit * WORK_PER_SECOND
    try:
        if decompose:
            parts = components(problem)
            if len(parts) > 1:
                return _solve_parts(problem, parts, work, workers, seed, with_lp_bound, gap_limit, clock, processes)
        return _solve_one(problem, work, workers, seed, with_lp_bound, gap_limit, clock)
    except _WallCap:
        cap = WALL_FACTOR * time_limit + WALL_SLACK
        return _from_assignment(problem, _warm_start(problem), "GREEDY_FALLBACK", t0,
                                note=f"the solver's wall-clock safety cap ({cap:.0f} s) was hit before its work limit (a busy machine?): "
                                     "greedy best-fit, as every run on this input gets when the cap is hit")


def _warm_start(problem: Problem) -> Assignment:
    """Greedy best-fit; on a fleet with instances, the fleet as it is completed greedily when it
    is as good (so a quiet fleet is not churned for what greedy alone would rebuild differently)."""
    g = greedy(problem)
    if any(c.existing for c in problem.capacities):
        kept = greedy(problem, keep_fleet=True)
        if (kept.work, -kept.cost) >= (g.work, -g.cost - 1e-9 * max(1.0, g.cost)):
            g = kept
    return g


def _better(a: list[int], b: list[int], tiers: list[_Tier]) -> bool:
    """a ranks strictly above b in the lexicographic order of the tiers."""
    for t, x, y in zip(tiers, a, b):
        if x != y:
            return (x > y) if t.sense == "max" else (x < y)
    return False


def _solve_one(problem: Problem, budget: float, workers: int | None, seed: int, with_lp_bound: bool, gap_limit: float,
               clock: _Work) -> Solution:
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    spent0 = clock.used

    def lap(name: str, since: list[float] = [t0]) -> None:  # noqa: B006 - a per-call clock
        now = time.monotonic()
        phases[name] = phases.get(name, 0.0) + now - since[0]
        since[0] = now

    def left() -> float:  # this problem's work left, deterministic seconds
        return budget - (clock.used - spent0)

    g = _warm_start(problem)
    lap("greedy")
    model = _Model(problem, g)
    m = model.m
    tiers = model.tiers()
    cost = model.cost()
    lap("model")
    n_workers = workers or WORKERS
    if len(m.proto.variables) < EXACT_BELOW:
        gap_limit = 0.0

    def solver_for(presolve: bool = False, **params) -> cp_model.CpSolver:
        s = cp_model.CpSolver()
        s.parameters.num_workers = n_workers
        s.parameters.random_seed = seed
        # Presolve costs more than it saves on these models (0.7 s of a 1k-job cost stage) and
        # a complete hint is a solution at once without it.
        s.parameters.cp_model_presolve = presolve
        s.parameters.symmetry_level = 0
        # CP-SAT's own Ctrl-C handler ended the search quietly (the apply then went on with that plan) and set
        # SIGINT back to SIG_DFL afterwards, so a Ctrl-C during apply killed the process holding the lock.
        s.parameters.catch_sigint_signal = False
        for k, v in params.items():
            setattr(s.parameters, k, v)
        return s

    # Warm start: greedy's answer, completed into a full solution of this model. Its tier values
    # are every tier's floor; without them nothing could promise an answer at least greedy's.
    model.hint_from(g)
    best = _complete(model, tiers, solver_for(fix_variables_to_their_hinted_value=True), clock,
                     max(WARM_WORK[0], WARM_WORK[1] * budget))
    if best is None:
        return _from_assignment(problem, g, "GREEDY_FALLBACK", t0,
                                note="CP-SAT could not complete greedy's answer within its work limit: greedy best-fit")
    warm = [_value(best, t.expr) for t in tiers]
    cost_hint = best  # greedy chose cheap capacity; tier solutions need not have
    lap("warm start")

    from reconciler.lp import LpMirror

    lp = LpMirror(m)
    lap("lp")

    def hold(expr, value: int, sense: str) -> None:
        vs, cs, off = _flatten(expr)
        if sense == "max":
            m.add(expr >= value)
            lp.add(vs, cs, off, value, 2**62)
        else:
            m.add(expr <= value)
            lp.add(vs, cs, off, -(2**62), value)

    reports: list[TierReport] = []
    stage1 = budget * 0.5  # work for the tiers; the cost stage has the rest
    for i, tier in enumerate(tiers):
        ts = time.monotonic()
        bound = tier.bound
        hv = _value(best, tier.expr)
        if (hv >= bound) if tier.sense == "max" else (hv <= bound):
            hold(tier.expr, hv, tier.sense)  # the warm start reaches the tier's best value: nothing to solve
            reports.append(TierReport(tier.name, tier.sense, hv, bound, "HELD", time.monotonic() - ts))
            continue
        vs, cs, off = _flatten(tier.expr)
        res = lp.optimum(vs, cs, off, maximize=tier.sense == "max")
        if res is not None:
            bound = min(bound, _proven(res[0], "max")) if tier.sense == "max" else max(bound, _proven(res[0], "min"))
        if (hv >= bound) if tier.sense == "max" else (hv <= bound):
            hold(tier.expr, hv, tier.sense)
            reports.append(TierReport(tier.name, tier.sense, hv, bound, "HELD", time.monotonic() - ts))
            continue
        hold(tier.expr, hv, tier.sense)  # the floor: what the answer so far (at least greedy's) reaches
        model.set_full_hint(best)
        m.maximize(tier.expr) if tier.sense == "max" else m.minimize(tier.expr)
        s = solver_for()
        st = clock.solve(s, m, max(0.05, (stage1 - (clock.used - spent0)) / max(1, len(tiers) - i)))
        m.clear_hints()
        if st == cp_model.INFEASIBLE:
            raise SolverError("internal: a tier is infeasible although the warm start reaches every tier held so far")
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and ((s.objective_value > hv) if tier.sense == "max" else (s.objective_value < hv)):
            val = round(s.objective_value)
            hold(tier.expr, val, tier.sense)
            best = list(s.response_proto.solution)
            # Its other tiers' helper variables are whatever the search left: settle them at their
            # best for these placements, so later tiers are judged on what this answer really reaches.
            model.set_primary_hint(best)
            best = _complete(model, tiers, solver_for(fix_variables_to_their_hinted_value=True), clock, 1.0) or best
        else:
            val = hv  # no better answer than the floor, which is held
        proven_bound = s.best_objective_bound if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else bound
        bound = max(bound, proven_bound) if tier.sense == "min" else min(bound, proven_bound)
        status = "OPTIMAL" if st == cp_model.OPTIMAL else ("FEASIBLE" if st == cp_model.FEASIBLE else "UNKNOWN")
        reports.append(TierReport(tier.name, tier.sense, val, bound, status, time.monotonic() - ts))
    if any((_value(cost_hint, t.expr) < r.value) if t.sense == "max" else (_value(cost_hint, t.expr) > r.value) for t, r in zip(tiers, reports)):
        cost_hint = None
    hint = cost_hint if cost_hint is not None else best
    lap("tiers")

    # Cost, with every tier held: the LP bound, then a search restricted to what the LP uses
    # (RINS: variables at 0 in both the LP and the hint stay 0), then the whole model.
    cvs, ccs, coff = _flatten(cost)
    res = lp.optimum(cvs, ccs, coff, maximize=False)
    lb = res[0] if res is not None else None
    if lb is not None and not isinstance(cost, int):
        m.add(cost >= _proven(lb, "min"))  # a valid cut: CP-SAT's own bound starts there
    lap("lp")
    status, value = "UNKNOWN", None
    hint_value = _value(hint, cost) if not isinstance(cost, int) else None
    if hint_value is not None and lb is not None and hint_value - lb <= gap_limit * max(hint_value, 1):
        value = hint_value  # already within the gap of the bound: no search, so no churn for crumbs
    elif res is not None:
        sub = m.clone()
        lpv = res[1]
        for v in list(model.x.values()) + [u for u in model.use.values() if not isinstance(u, int)]:
            i = v.index
            if lpv[i] < 1e-6 and hint[i] == 0:
                dom = sub.proto.variables[i].domain
                dom[0], dom[1] = 0, 0
        sub.minimize(cost)
        _set_hints(sub, enumerate(hint))
        # One worker, CP-SAT's LP-guided search, which is what finds good answers in this small
        # neighbourhood (2 workers gave 12.8k-14.0k $/h at 1k jobs depending on the seed; 1 gives
        # 12.8k). It stops once within the gap of the LP bound (the cut above is in the clone):
        # about 0.2 s at 1k jobs, 2.3 s at 5k; up to half the work left otherwise.
        s = solver_for(presolve=True, num_workers=1, linearization_level=2,
                       relative_gap_limit=gap_limit, log_search_progress=bool(os.environ.get("FLEETOPS_SOLVER_DEBUG")))
        st = clock.solve(s, sub, max(0.1, left() * 0.5))
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            hint, value, status = list(s.response_proto.solution), s.objective_value, "FEASIBLE"
        lap("cost: lp-guided")
    if value is None and not isinstance(cost, int):
        value = _value(hint, cost)
    if os.environ.get("FLEETOPS_SOLVER_DEBUG"):
        print(f"[solve] lb={lb} after lp-guided: {status} value={value}", flush=True)
    if not isinstance(cost, int) and (lb is None or value is None or (value - lb) > gap_limit * max(value, 1)) and left() > 0.1:
        m.minimize(cost)
        model.set_full_hint(hint)
        s = solver_for(relative_gap_limit=gap_limit)
        st = clock.solve(s, m, left())
        m.clear_hints()
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value <= (value if value is not None else math.inf):
            hint, value = list(s.response_proto.solution), s.objective_value
            lb = max(lb or 0.0, s.best_objective_bound)
            # CP-SAT says OPTIMAL once within relative_gap_limit: optimal means no gap at all.
            status = "OPTIMAL" if value - lb < 0.5 else "FEASIBLE"
        elif st == cp_model.INFEASIBLE:
            raise SolverError("internal: the cost stage is infeasible although every tier was reached")
        lap("cost: full model")
    # Polish: with every placement fixed, buy no instance they do not need (a search stopped
    # at the gap can leave one idle). It only takes away: buying more of an offer to give up
    # instances the fleet has would be churn the search above did not choose.
    bound_model = m.clone() if with_lp_bound else None  # before the polish's constraints, which only this answer needs
    if not isinstance(cost, int):
        for o in model.offers:
            m.add(model.use[o.key] <= hint[model.use[o.key].index])
        placements = [v for v in model.stay.values() if not isinstance(v, int)] + list(model.x.values()) + \
            [v for v in model.placed.values() if not isinstance(v, int)]
        _set_hints(m, [(v.index, hint[v.index]) for v in placements])
        m.minimize(cost)
        s = solver_for(fix_variables_to_their_hinted_value=True)
        st = clock.solve(s, m, min(0.5, max(0.1, left())))
        m.clear_hints()
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) and s.objective_value < (value if value is not None else math.inf):
            hint, value = list(s.response_proto.solution), s.objective_value
        lap("polish")
    # The answer against the warm start, tier by tier: held floors make it at least as good; if
    # it ever were not, greedy's answer is the plan (never a plan worse than the fallback).
    reached = [_value(hint, t.expr) for t in tiers]
    if _better(warm, reached, tiers):
        return _from_assignment(problem, g, "GREEDY_FALLBACK", t0, note="CP-SAT's answer ranked below greedy's: greedy best-fit")
    gap = 0.0 if status == "OPTIMAL" else (max(0.0, (value - lb) / value) if lb is not None and value else 1.0)
    if isinstance(cost, int):
        gap = 0.0
    optimal = gap <= 1e-9 and all(r.proven for r in reports)
    sol = _extract(problem, model, hint, reports, "OPTIMAL" if optimal else "FEASIBLE", optimal, gap, t0)
    if isinstance(cost, int):
        value = lb = cost
    sol = replace(sol, work_spent=round(clock.used - spent0, 3), cost_value=value,
                  cost_bound=None if lb is None else (value if status == "OPTIMAL" else min(lb, value)))
    lap("extract")
    if with_lp_bound:
        ivs, ics, ioff = _flatten(model.instance_cost())
        r = lp.optimum(ivs, ics, ioff, maximize=False)
        sol = replace(sol, lp_bound=None if r is None else r[0] / MILLI)
        sol = replace(sol, int_bound=_integer_bound(bound_model, model.instance_cost(), hint, sol.lp_bound, budget))
        lap("lp bound")
    return replace(sol, phases={k: round(v, 3) for k, v in phases.items()})


def _integer_bound(m: cp_model.CpModel, instance_cost, hint: list[int], lp_bound: float | None, budget: float) -> float | None:
    """The benchmark's integer bound (USD/h): the least instance cost with whole instances per
    offer and capacity summed per offer (the model, every tier held at what the plan reached),
    as far as CP-SAT proves it in a bounded search; never below the LP bound. A bound, not a
    plan: valid for every plan that reaches those tiers, however it packs."""
    if isinstance(instance_cost, int):
        return instance_cost / MILLI
    m.minimize(instance_cost)
    _set_hints(m, enumerate(hint))
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.random_seed = 0
    s.parameters.catch_sigint_signal = False
    s.parameters.max_deterministic_time = max(2.0, budget)
    s.parameters.max_time_in_seconds = 300.0
    st = s.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return lp_bound
    proven = (s.objective_value if st == cp_model.OPTIMAL else s.best_objective_bound) / MILLI
    return max(proven, lp_bound) if lp_bound is not None else proven


def _solve_parts(problem: Problem, parts: list[Problem], budget: float, workers, seed, with_lp_bound, gap_limit,
                 clock: _Work, processes: int | None = None) -> Solution:
    t0 = time.monotonic()
    sizes = [len(q.demands) + len(q.capacities) + 1 for q in parts]
    shares = [max(0.2, budget * n / sum(sizes)) for n in sizes]  # work, by size: no part's depends on how fast another ran
    processes = parallel.processes_for(sizes) if processes is None else processes
    if processes > 1:
        sols = parallel.solve_in_workers(parts, shares, processes, workers, seed, with_lp_bound, gap_limit, clock)
    else:
        sols = [_solve_one(q, shares[i], workers, seed, with_lp_bound, gap_limit, clock) for i, q in enumerate(parts)]
    tiers: dict[str, TierReport] = {}
    for s in sols:
        for t in s.tiers:
            prev = tiers.get(t.name)
            if prev is None or prev.status == t.status:
                status = t.status
            elif prev.proven and t.proven:
                status = "OPTIMAL"  # each part's best: so is their sum
            else:
                status = "UNKNOWN" if "UNKNOWN" in (prev.status, t.status) else "FEASIBLE"
            bound = None if t.bound is None or (prev is not None and prev.bound is None) else t.bound + (prev.bound if prev else 0)
            tiers[t.name] = TierReport(t.name, t.sense, t.value + (prev.value if prev else 0), bound, status, t.seconds + (prev.seconds if prev else 0))
    statuses = {s.status for s in sols}
    status = "GREEDY_FALLBACK" if "GREEDY_FALLBACK" in statuses else ("OPTIMAL" if statuses == {"OPTIMAL"} else "FEASIBLE")
    cost = sum(s.cost_milli for s in sols)
    phases: dict[str, float] = {}
    for s in sols:
        for k, v in s.phases.items():
            phases[k] = round(phases.get(k, 0.0) + v, 3)
    return Solution(
        status=status, optimal=all(s.optimal for s in sols), gap=max(s.gap for s in sols), seconds=time.monotonic() - t0,
        keep=frozenset().union(*(s.keep for s in sols)), new={k: v for s in sols for k, v in s.new.items()},
        stay={k: v for s in sols for k, v in s.stay.items()}, x={k: v for s in sols for k, v in s.x.items()},
        placed={k: v for s in sols for k, v in s.placed.items()}, guaranteed={k: v for s in sols for k, v in s.guaranteed.items()},
        tiers=tuple(tiers.values()), work=sum(s.work for s in sols), cost_milli=cost,
        capacities={k: v for s in sols for k, v in s.capacities.items()},
        scope=(sum(s.scope[0] for s in sols), sum(s.scope[1] for s in sols)), variables=sum(s.variables for s in sols),
        constraints=sum(s.constraints for s in sols), note=f"solved as {len(parts)} independent parts",
        lp_bound=sum(s.lp_bound for s in sols) if with_lp_bound and all(s.lp_bound is not None for s in sols) else None,
        int_bound=sum(s.int_bound for s in sols) if with_lp_bound and all(s.int_bound is not None for s in sols) else None,
        phases=phases, work_spent=round(sum(s.work_spent for s in sols), 3),
        cost_value=None if any(s.cost_value is None for s in sols) else sum(s.cost_value for s in sols),
        cost_bound=None if any(s.cost_bound is None for s in sols) else sum(s.cost_bound for s in sols),
    )


def _extract(problem: Problem, model: _Model, values: list[int], tiers: list[TierReport], status: str, optimal: bool,
             gap: float, t0: float) -> Solution:
    val = lambda v: v if isinstance(v, int) else values[v.index]  # noqa: E731
    placed = {dk: val(v) for dk, v in model.placed.items()}
    stay = {k: val(v) for k, v in model.stay.items() if val(v) > 0}
    xg = {k: val(v) for k, v in model.x.items() if val(v) > 0}
    keep = frozenset([c.instance_id for c in model.hosts if c.key in model.use and val(model.use[c.key])]
                     + [h.instance_id for ik, hs in model.idle_members.items() for h in hs[:val(model.use[ik])]])
    x = _unfold_idle(model, _split(problem, xg, placed, stay), keep)
    new = {c.key: val(model.use[c.key]) for c in model.offers if val(model.use[c.key]) > 0}
    guaranteed = {dk: val(v) for dk, v in model.g.items()}
    hosts = len(model.hosts)
    frozen = sum(1 for h in model.hosts if h.frozen)
    return Solution(
        status=status, optimal=optimal, gap=gap, seconds=time.monotonic() - t0, keep=keep, new=new, stay=stay, x=x,
        placed=placed, guaranteed=guaranteed, tiers=tuple(tiers),
        work=sum(d.weight * placed[d.key] for d in problem.demands),
        cost_milli=sum(round(c.price * MILLI) * (1 if c.instance_id in keep else 0) for c in model.hosts)
        + sum(round(model.caps[k].price * MILLI) * n for k, n in new.items()),
        capacities=model.caps, scope=(hosts - frozen, frozen), variables=len(model.m.proto.variables),
        constraints=len(model.m.proto.constraints),
    )


def _unfold_idle(model: _Model, x: dict[tuple[str, str], int], keep: frozenset[str]) -> dict[tuple[str, str], int]:
    """Items placed on a class of idle hosts, packed onto its kept hosts as the planner will
    pack them (largest first). The class's capacity rows and cuts make a misfit rare; an
    item that does not fit is left on the first host, where the planner leaves its job
    pending rather than overcommit."""
    out = {k: n for k, n in x.items() if k[1] not in model.idle}
    for ik, hosts in model.idle_members.items():
        items = [(model.demands[dk], f"{dk}#{i}", 0, None) for (dk, ck), n in sorted(x.items()) if ck == ik for i in range(n)]
        if not items:
            continue
        bins = [Bin.empty(h, h.key) for h in hosts if h.instance_id in keep] or [Bin.empty(hosts[0], hosts[0].key)]
        left = pack_items(bins, items)
        for b in bins:
            for dk, _, _ in b.items:
                out[(dk, b.ref)] = out.get((dk, b.ref), 0) + 1
        for d, *_ in left:
            out[(d.key, bins[0].ref)] = out.get((d.key, bins[0].ref), 0) + 1
    return out


def _split(problem: Problem, xg: dict[tuple[str, str], int], placed: dict[str, int], stay: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Share each group's new items per capacity among its demands: each demand gets what it
    placed minus what stays."""
    staying: dict[str, int] = {}
    for (dk, _), n in stay.items():
        staying[dk] = staying.get(dk, 0) + n
    need = {d.key: placed.get(d.key, 0) * d.replicas - staying.get(d.key, 0) for d in problem.demands}
    out: dict[tuple[str, str], int] = {}
    cells_of: dict[str, list[tuple[str, int]]] = {}
    for (gk, ck), n in sorted(xg.items()):
        cells_of.setdefault(gk, []).append((ck, n))
    for gk, members in problem.groups.items():
        for ck, n in cells_of.get(gk, []):
            for dk in members:
                take = min(need[dk], n)
                if take > 0:
                    out[(dk, ck)] = out.get((dk, ck), 0) + take
                    need[dk] -= take
                    n -= take
    return out


def _from_assignment(problem: Problem, a: Assignment, status: str, t0: float, note: str = "") -> Solution:
    caps = {c.key: c for c in problem.capacities}
    keep = frozenset(c.instance_id for c in problem.capacities if c.existing and a.use.get(c.key, 0))
    new = {k: n for k, n in a.use.items() if n and not caps[k].existing}
    return Solution(
        status=status, optimal=False, gap=1.0, seconds=time.monotonic() - t0, keep=keep, new=new,
        stay={k: n for k, n in a.stay.items() if n}, x={k: n for k, n in a.x.items() if n}, placed=dict(a.placed),
        guaranteed={}, work=sum(d.weight * a.placed.get(d.key, 0) for d in problem.demands),
        cost_milli=round(a.cost * MILLI), capacities=caps,
        scope=(sum(1 for c in problem.capacities if c.existing and not c.frozen), sum(1 for c in problem.capacities if c.frozen)),
        note=note,
    )


__all__ = ["Solution", "TierReport", "solve", "scale", "MILLI", "DIMS", "rules_allow"]
