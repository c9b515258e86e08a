"""The CP-SAT model of one Problem: its variables, and the constraint families applied in order.

Variables, in the order they are created (the order is part of the model: CP-SAT's search
depends on it, and the plan digests prove it unchanged): instances (`use`: new per offer, keep
per host, kept per idle class), residents that stay (`stay`), new items per group and capacity
(`x`, only where the host index says they could land), the new instances of offers modelled one
by one and their items (`on`, `z`: slots.py, only where counts are small), then jobs placed per demand with their
guaranteed/borrowed split and the running jobs kept (`placed`, `g`, `b`, `krj`, of them as they run `krs`, `krg`, `krb`).
Each container is a `Values`: a variable for what the model decides, a frozen int for what it
does not. The constraint families (one module each) read these and add rows; a test may build
the model with only some of them (`families`) to check one family alone."""

from __future__ import annotations

from reconciler.cpsat import cp_model

from reconciler.greedy import Assignment
from reconciler.ledger import may_borrow
from reconciler.problem import (Capacity, Demand, OfferFits, Problem, Rival, borrowing_tenants, fit, forced_moves, may_preempt, outside_group, over_cap_tenants, pools_over_max,
                                quota_shedding, settled_jobs, type_class, wants_room)
from reconciler.solve import capacity, fleet_rules, gangs, items, moves, objective, patterns, slots, tenants
from reconciler.solve.index import HostIndex, free_room, idle_classes, zone_classes
from reconciler.solve.licenses import add_license_constraints
from reconciler.solve.quotas import add_cloud_quota_constraints
from reconciler.solve.variables import Values, set_full_hints, set_hints

# The constraint families, in the order they add their rows (capacity's come before the demand
# variables exist: they read only instances, stays and new items).
# (group, host) candidates the room evictions free may add (HostIndex.bound_freed): the 10k-job drift model
# had 119,601 variables before such room was offered at all.
FREED_PAIRS = 20_000
# (group, host) candidates per type class for running work its tenant's pending work may stop (Model._displaced), at
# most (at least one per group), those with the most free room first. The applied 5k fleet after a 5% reclaim: 1,162
# such groups; unbounded they were offered 6,422 more hosts and its plan took 17.1 s of CPU, at 500 1,162 and 15.7 s,
# against 14.5 s without them (the same plan each time; unbounded and offered for any tenant's pending work, 24.8 s).
DISPLACED_PAIRS = 500
SHED_PAIRS = 500  # (group, host) candidates on hosts a quota's stop may free (Model._placement_vars), at most
# (group, host) candidates per type class on hosts with room for one item, for groups whose work runs and none waits
# (it only may move there: a consolidation, a move for a higher class), at most, and at least MOVE_LEAST a group
# (index.spread says which: the tightest fits, and in turn the rest). A 20k-job fleet after a 5% reclaim (10,366
# instances, 8,179 groups) offered 6,210 such groups ~132 hosts each: 818k of its 1.11M placement variables; its plan
# took 324 s, 286 of them in the LP, and 3.9 GiB. Bounded: 613k variables, 133 s (LP 107 s), the same plan.
MOVE_PAIRS = 20_000
MOVE_LEAST = 8
# The same for groups with work waiting, for the hosts with room and, apart, those where it may evict a resident (the
# roomiest first), and never fewer than the group's waiting items. On that fleet: 370k variables, 41 s (LP 19 s), the
# same plan again (its LP bound too); on the 10k-job drift nothing more is left out.
ROOM_PAIRS = 40_000
FAMILIES = ("capacity", "patterns", "slots", "items", "gangs", "tenants", "licenses", "quotas", "fleet", "moves")


class Model:
    """The CP-SAT model of one Problem; variables for solved parts, constants for frozen ones."""

    def __init__(self, problem: Problem, warm: Assignment | None = None, families: tuple[str, ...] = FAMILIES,
                 exempt: dict[str, int] | None = None):
        """`warm`: the warm start; every host it puts new work on gets that work's variable,
        even where the model alone would not look (a host freed by a gang greedy moves away).
        `families`: the constraint families to add (all of them but in tests of one family).
        `exempt`: demand key -> running jobs whose stop is no swap (objective.swap_exemptions)."""
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"internal: unknown constraint families {sorted(unknown)}")
        self.p = problem
        self.exempt = dict(exempt or {})
        m = self.m = cp_model.CpModel()
        self.demands = {d.key: d for d in problem.demands}
        self.group_of = {dk: gk for gk, members in problem.groups.items() for dk in members}
        self.caps = {c.key: c for c in problem.capacities}
        self.hosts = problem.hosts()
        self.offers = problem.offers()
        self.idle, self.idle_members, self.idle_of = idle_classes(self.hosts)
        self.caps.update(self.idle)
        # What the fleet-wide rules and the cost count: offers, hosts, and idle classes.
        self.units = [c for c in problem.capacities if c.key not in self.idle_of] + list(self.idle.values())
        self._instance_vars()
        self._stay_vars()
        self.classes, self.class_of = zone_classes(self.offers)
        self.caps.update(self.classes)
        self.forced = forced_moves(problem)  # running items that must leave their instance (read by the variables and moves)
        self._placement_vars(warm)
        slots.slot_vars(self)
        self.pattern_vars: dict[str, tuple[list, list]] = {}  # capacity key -> (its patterns, their counts): patterns.py
        # (objective.stand_in_room, per tenant, made once; and the items per (group, host) it counts as a tenant's
        # higher work taking its lower work's room, with the demands they are, which extract.split_groups honours)
        self.stand_in_rooms: dict[str, object] = {}
        self.stand_in_shares: list[tuple[str, str, tuple[str, ...], object]] = []
        self.protected_kept: dict[tuple[str, frozenset[str]], object] = {}  # (objective.protected_kept, made once)
        if "capacity" in families:
            capacity.add_capacity(self)
        if "patterns" in families:
            patterns.add_patterns(self)
        if "slots" in families:
            slots.add_slot_rows(self)
        self._demand_vars()
        if "items" in families:
            items.add_item_balance(self)
        if "gangs" in families:
            gangs.add_gangs(self)
        if "tenants" in families:
            tenants.add_tenant_rules(self)
        if "licenses" in families and problem.licenses:
            add_license_constraints(m, problem, self.placed)
        if "quotas" in families and problem.quotas:
            add_cloud_quota_constraints(m, problem, self.offers, self.use)
        if "fleet" in families:
            fleet_rules.add_fleet_rules(self)
        self.moved = moves.moved_items(self)
        self.licensed = moves.licensed(self)  # (asked by WhenEmpty's rows and by the moves and swaps tiers)
        if "moves" in families:
            moves.add_when_empty(self)

    # -- variables

    def _instance_vars(self) -> None:
        """Instances: new per offer, keep per host, kept per idle class."""
        m = self.m
        self.use = Values()
        for o in self.offers:
            self.use[o.key] = m.new_int_var(0, o.max_new, f"new[{o.key}]")
        for h in self.hosts:
            if h.key in self.idle_of:
                continue
            if h.frozen:
                self.use[h.key] = 1
            elif h.keep_blocker is not None:
                self.use[h.key] = 0
            else:
                self.use[h.key] = m.new_bool_var(f"keep[{h.key}]")
        for ik, c in self.idle.items():
            self.use[ik] = m.new_int_var(0, c.most, f"kept[{ik}]")

    def _stay_vars(self) -> None:
        """Residents that stay where they run (items per demand class and host)."""
        m = self.m
        self.stay = Values()
        self.stay_of: dict[str, list[tuple[Capacity, object]]] = {}
        for h in self.hosts:
            here: dict[str, int] = {}
            for dk, _, n in h.residents:
                if dk in self.demands:
                    here[dk] = here.get(dk, 0) + n
            for dk, n in here.items():
                d = self.demands[dk]
                if h.frozen:
                    v = n
                elif h.keep_blocker is None and fit(d, h) > 0 and not outside_group(d, h):
                    v = m.new_int_var(0, n, f"stay[{dk},{h.key}]")
                else:
                    v = 0  # it must move: its instance goes, it no longer fits there, or its gang's group is not there
                self.stay[(dk, h.key)] = v
                self.stay_of.setdefault(dk, []).append((h, v))

    def _placement_vars(self, warm: Assignment | None) -> None:
        """New items per (group, capacity). On a host, only where they could land: in its free
        room, where pending work may evict a resident (preemption, reclaim), or where a
        resident's tenant is over its quota now (some of its work must go)."""
        problem = self.p
        self.x = Values()
        self.x_of_group: dict[str, list[tuple[Capacity, object]]] = {gk: [] for gk in problem.groups}
        self.x_at: dict[str, list[tuple[Demand, object]]] = {}
        unsettled = frozenset(d.key for d in problem.demands if d.running_jobs and settled_jobs(d) < d.running_jobs)
        host_at = {h.key: h for h in self.hosts}
        room = {h.key: free_room(h, self.demands, unsettled) for h in self.hosts if not h.frozen and h.keep_blocker is None}
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

        def own_lower(pairs: frozenset, resident_pairs: frozenset) -> bool:  # (a displaced job: its own tenant's lower work)
            return may_evict(pairs, frozenset(r for r in resident_pairs if any(r[0] == tenant for tenant, _ in pairs)))

        hosts_at = HostIndex(problem.capacities, list(self.idle.values()), self.idle_of, room, self.demands, leaving)
        # (work that needs room it does not hold: new, resized, or running where it must leave, e.g. a spot-required job on
        # an on-demand host: as new work it may take its tenant's lower job's room, which a variable there must offer; a
        # normal job that had to leave was evicted beside the low job whose move would have made room for it: fleet49)
        # (and running work in a pool over its max_instances: some of its instances must go, the search chooses which, and
        # the work on them needs room as new work does. Not offered it, a fleet whose pools were shrunk to 80% kept its
        # tenants' running low jobs and evicted 13 running normal ones; the plan after the apply evicted the low jobs
        # for them, their tenants' own normal work arriving in turn: bench.explore_mixed's fleet 147)
        over = pools_over_max(self.hosts, problem.pool_bounds)
        movable = {dk for h in self.hosts if h.pool in over and not h.frozen for dk, _, _ in h.residents}
        pending_of = {gk: frozenset((d.tenant, d.klass) for k in members_
                                    if (wants_room(d := self.demands[k]) or k in self.forced or k in movable) and not problem.never_hosted(d))
                      for gk, members_ in problem.groups.items()}
        # Room an eviction frees is room for any pending work of the shape, not only the evicting job's: a host
        # where some pending work may evict a resident is offered to every group with pending jobs. (Without it
        # a 4-vCPU job stayed pending beside the 8 vCPU a normal job's eviction of a 12-vCPU one freed, or the
        # plan bought a new instance at 2.6x the spot host's price to hold it: the pending-reason property tier.)
        self.pending_of = pending_of  # (strategy.own_lower_room reads it)
        freed = hosts_at.freed({(type_class(self.demands[problem.groups[gk][0]]), pend) for gk, pend in pending_of.items() if pend}, may_evict)
        groups_of: dict[tuple, int] = {}
        for gk, pend in pending_of.items():
            if pend:
                t = type_class(self.demands[problem.groups[gk][0]])
                groups_of[t] = groups_of.get(t, 0) + 1
        displaced = self._displaced(hosts_at.on_freed(freed), pending_of)
        displaced_of: dict[tuple, int] = {}
        for gk in displaced:
            t = type_class(self.demands[problem.groups[gk][0]])
            displaced_of[t] = displaced_of.get(t, 0) + 1
        freed = hosts_at.bound_freed(freed, groups_of, FREED_PAIRS)
        # And a host whose resident may stop for its own tenant's higher class at the tenant's quota (rules.quota_shedding),
        # bounded apart: at the applied 5k fleet's quotas nearly every tenant may, and offered within FREED_PAIRS such
        # hosts took a PR plan from 4.6 to 5.6 s of CPU (the same plan).
        shed = quota_shedding(problem.demands, problem.tenants, preemption)
        if shed:
            for t, at in hosts_at.bound_freed(hosts_at.holding(lambda pair: pair[1] < shed.get(pair[0], -1)), groups_of, SHED_PAIRS).items():
                freed.setdefault(t, set()).update(at)
        moving = {gk for gk, members_ in problem.groups.items()  # groups with running work and none pending: it only may move
                  if not pending_of[gk] and any(self.demands[k].running_jobs for k in members_)}
        moving_of: dict[tuple, int] = {}  # type class -> such groups
        for gk in moving:
            t = type_class(self.demands[problem.groups[gk][0]])
            moving_of[t] = moving_of.get(t, 0) + 1
        turns: dict[tuple, int] = {}
        fit_of = OfferFits()  # asked for each group's first demand: the group's shape
        for gk, members_ in problem.groups.items():
            rep = self.demands[members_[0]]
            total = sum(len(self.demands[k].jobs) * self.demands[k].replicas for k in members_)
            # (a placement-group gang's new items go on new instances launched into its group, or, grown, on the
            # instances it runs on, which are in its group; offered none, a gang grown by a replica with room for it
            # beside its own moved whole onto an identical new instance)
            # (none where they are outside its group: rules.outside_group, the gang moves whole into one)
            own = tuple(sorted({h for _, hs in rep.running for h in hs})) if rep.gang_mode == "placement-group" and rep.gang \
                and len(members_) == 1 and len(rep.jobs) == 1 and pending_of[gk] \
                and not any(outside_group(rep, host_at[h]) for _, hs in rep.running for h in hs if h in host_at) else ()
            room_most, turn = None, 0
            t = type_class(rep)
            if gk in moving:
                room_most, turn = max(MOVE_LEAST, MOVE_PAIRS // moving_of[t]), turns.get((t, False), 0)
                turns[(t, False)] = turn + 1
            elif pending_of[gk]:  # (and never fewer than its waiting items: the hosts offered could hold them all)
                waiting = sum((len(d.jobs) - settled_jobs(d)) * d.replicas + self.forced.get(d.key, 0)
                              for d in (self.demands[k] for k in members_))
                room_most, turn = max(MOVE_LEAST, ROOM_PAIRS // groups_of[t], waiting), turns.get((t, True), 0)
                turns[(t, True)] = turn + 1
            found = hosts_at.candidates(rep, pending_of[gk], warm_hosts.get(gk, []), may_evict, freed, own, room_most, turn)
            if gk in displaced and not (rep.gang_mode == "placement-group" and rep.gang):  # (a group's members are new instances)
                most = max(1, DISPLACED_PAIRS // displaced_of[type_class(rep)])
                found = hosts_at.merged(rep, found, hosts_at.evictable(rep, displaced[gk], own_lower, most))
            for c in self._group_capacities(rep, found, fit_of):
                f = fit_of(rep, c)
                if f <= 0:
                    continue
                v = self.m.new_int_var(0, min(total, f * c.work_most), f"x[{gk},{c.key}]")
                self.x[(gk, c.key)] = v
                self.x_of_group[gk].append((c, v))
                self.x_at.setdefault(c.key, []).append((rep, v))
        # (group, host) candidates a bound left out: the model is narrower than the fleet's choices, so its bounds are of
        # the choices offered, and no plan of it is called optimal (strategy.finish, render._solver_line)
        self.narrowed = hosts_at.narrowed

    def _displaced(self, hosts: set[str], pending_of: dict[str, frozenset]) -> dict[str, frozenset]:
        """Group -> its tenant's (tenant, class) pairs, for a group with no pending work of its own that runs on `hosts`
        (where pending work may evict a resident) beside pending work of its tenant's higher class that could use the
        host: that work may take its room (a higher class of its tenant may), and it may instead move where it in turn
        takes a lower job of its tenant's room (moves_tier: a move is kinder than the eviction). Offered nowhere to do
        so, t2's running high j25 was stopped for t2's new critical job and placed, by the plan after the apply, where
        it stopped t2's low j1 (fleet69)."""
        out: dict[str, frozenset] = {}
        if not hosts:
            return out
        top: dict[tuple, int] = {}  # (tenant, type class) -> the highest class of its pending work
        for gk, pend in pending_of.items():
            t = type_class(self.demands[self.p.groups[gk][0]])
            for tenant, klass in pend:
                top[(tenant, t)] = max(top.get((tenant, t), -1), klass)
        for h in self.hosts:
            if h.key not in hosts:
                continue
            t = type_class(h)
            for dk, _, _ in h.residents:
                d = self.demands.get(dk)
                gk = self.group_of.get(dk)
                if d is not None and gk is not None and not pending_of.get(gk) and top.get((d.tenant, t), -1) > d.klass:
                    out[gk] = out.get(gk, frozenset()) | {(d.tenant, d.klass)}
        return out

    def _group_capacities(self, rep: Demand, candidates: list[Capacity], fit_of: OfferFits):
        """The capacities a group's items get a variable on: its candidates, with a zone offer
        replaced by its zone class where the zone does not matter to the group."""
        done_classes: set[str] = set()
        zoned: set[str] = set()  # classes whose zones this group must tell apart (asked once: 2-3 zones each)
        for c in candidates:
            if c.key in self.idle and rep.gang_mode == "placement-group" and rep.gang:
                continue  # (as on any host)
            elif c.key in self.class_of and not rep.gang and fit_of(rep, c) > 1:
                # Items over half an instance stay per zone: a class's aggregate row cannot
                # tell that one needs most of a single instance beside work pinned to a zone.
                ck = self.class_of[c.key]
                if ck in done_classes:
                    continue
                if ck not in zoned:
                    if self._one_class(rep, ck, fit_of):
                        done_classes.add(ck)
                        c = self.classes[ck]  # one variable for every zone of the class
                    else:
                        zoned.add(ck)
            yield c

    def _one_class(self, rep: Demand, ck: str, fit_of: OfferFits) -> bool:
        """Whether a group's items may go on zone class ck as one: every zone fits them at one cost."""
        zones = [self.caps[k] for k in self.classes[ck].members]
        # A tenant budget charges a class's items at its dearest zone's price: only where
        # the zones cost alike (else work that fits the budget in the cheap zone was left out).
        rules = self.p.tenants.get(rep.tenant)
        priced_alike = rules is None or rules.budget is None or len({z.price for z in zones}) == 1
        return all(fit_of(rep, z) > 0 for z in zones) and len({round(self.p.cost_coef(rep, z), 9) for z in zones}) == 1 and priced_alike

    def _demand_vars(self) -> None:
        """Jobs placed per demand; for tenants that can borrow (a ceiling above the guarantee), its
        guaranteed and borrowed parts; of running jobs, those kept (in each part). The rows here
        define the split (g + b = placed, kept within placed); the rules on them are the families'."""
        m, p = self.m, self.p
        self.placed, self.g, self.b = Values(), Values(), Values()
        self.krj, self.krs, self.krg, self.krb = Values(), Values(), Values(), Values()
        finite = {t for t, r in p.tenants.items() if may_borrow(r)}
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
                if p.held.get(d.key):
                    m.add(k >= min(p.held[d.key], n, r))  # (Problem.held)
                # Of them, the jobs kept as they run: a job restarted in a new shape, or a gang grown or short of a
                # replica, is kept only as new work is placed (rules.settled_jobs), never counted as running work kept.
                s = min(n, settled_jobs(d))
                if s == r:
                    ks = self.krs[d.key] = k
                elif s == 0:
                    ks = self.krs[d.key] = 0
                else:
                    ks = self.krs[d.key] = m.new_int_var(0, s, f"krs[{d.key}]")
                    m.add(ks <= k)
                if d.tenant in finite and s:
                    kg = self.krg[d.key] = m.new_int_var(0, s, f"krg[{d.key}]")
                    kb = self.krb[d.key] = m.new_int_var(0, s, f"krb[{d.key}]")
                    m.add(kg <= self.g[d.key])
                    m.add(kb <= self.b[d.key])
                    m.add(kg + kb <= ks)
                else:
                    self.krg[d.key], self.krb[d.key] = ks, 0

    def kept_items(self, d: Demand):
        """Items of a running demand's kept jobs: a gang's every running item while it is placed, but no more than it
        asks now (a gang shrunk from 3 replicas to 2 keeps 2: counted 3, one more than could stay was a move, which
        WhenEmpty forbids, so the gang was evicted from the instance it fits on, audit21 finding 2)."""
        return self.placed[d.key] * min(d.running_items, d.replicas) if d.gang else self.krj[d.key]

    # -- objectives (objective.py)

    def tiers(self) -> list[objective.Tier]:
        return objective.tiers(self)

    def cost(self):
        return objective.cost(self)

    def instance_cost(self):
        return objective.instance_cost(self)

    # -- hints

    def hint_from(self, a: Assignment) -> None:
        """Hint the primary variables with an assignment (the rest is completed by a solve)."""
        hints: list[tuple[int, int]] = []
        use = dict(a.use)
        for ik, hs in self.idle_members.items():
            use[ik] = sum(1 for h in hs if a.use.get(h.key, 0))
        for ck, v in self.use.variable_items():
            hints.append((v.index, use.get(ck, 0)))
        for (dk, hk), v in self.stay.variable_items():
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
        for dk, v in self.placed.variable_items():
            hints.append((v.index, a.placed.get(dk, 0)))
        hints += slots.slot_hints(self, a)
        set_hints(self.m, hints)

    def primaries(self) -> list:
        """The variables a placement is: instances, stays, new items, jobs placed, and which new instance
        of an offer modelled instance by instance holds them (the rest follows from them)."""
        return self.use.variables() + self.stay.variables() + list(self.x.values()) + self.placed.variables() + slots.slot_variables(self)

    def set_primary_hint(self, values: list[int]) -> None:
        set_hints(self.m, [(v.index, values[v.index]) for v in self.primaries()])

    def set_full_hint(self, values: list[int]) -> None:
        set_full_hints(self.m, values)


__all__ = ["FAMILIES", "Model"]
