"""Aggregation: what the model counts as one. Identical idle hosts become one class (a count of
instances kept), an offer's zones one class (for work that does not care which zone), and the
host index says which running instances a group's new work could use at all.

Pure: functions of the Problem's capacities and demands."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import ClassVar

from reconciler.problem import DIMS, Capacity, Demand, Host, fit, type_class


@dataclass(frozen=True, kw_only=True)
class IdleClass(Capacity):
    """Identical idle hosts as one count of instances kept (`most` of them): their site, shape and price."""

    hosts: tuple[str, ...]  # their keys, in keep order
    ballast: ClassVar[int] = 0  # (none stands idle by design: what slots.add_slot_rows asks of an offer)

    @property
    def most(self) -> int:
        return len(self.hosts)


def idle_classes(hosts: list[Host]) -> tuple[dict[str, IdleClass], dict[str, list[Host]], dict[str, str]]:
    """Idle hosts: identical instances with nothing on them (pool minimums kept warm) are
    interchangeable, so a class of them is one count of instances kept, and its new work
    is placed on the class, like an offer's: at 10k idle instances, per-host variables
    made a million. `extract.unfold_idle` keeps the first ones and packs the class's items onto them.
    Returns (class key -> the class; class key -> its hosts in keep order; host key -> class key)."""
    idle: dict[str, IdleClass] = {}
    idle_members: dict[str, list[Host]] = {}
    idle_of: dict[str, str] = {}
    alike: dict[tuple, list[Host]] = {}
    for h in hosts:
        if not h.frozen and h.keep_blocker is None and not h.residents:
            alike.setdefault((h.offer_key, h.price, h.on_demand_price, h.mig, h.nvlink_domain), []).append(h)
    for n, hs in enumerate(v for v in alike.values() if len(v) > 1):
        hs.sort(key=lambda h: h.key)
        ik = f"idle#{n}:{hs[0].offer_key}"
        idle[ik] = IdleClass(**{**hs[0].common(), "key": ik}, hosts=tuple(h.key for h in hs))
        idle_members[ik] = hs
        for h in hs:
            idle_of[h.key] = ik
    return idle, idle_members, idle_of


def zone_classes(offers: list[Capacity]) -> tuple[dict[str, Capacity], dict[str, str]]:
    """Zone classes: the offers of one (pool, type, market) across its zones. Work that does
    not care which zone (no gang, no zone-dependent cost or latency rule) is placed on
    the class, so it costs one variable per pool and type instead of one per zone.
    Returns (class key -> its shape: the cheapest zone's, at the dearest zone's price; offer key -> class key)."""
    classes: dict[str, Capacity] = {}
    class_of: dict[str, str] = {}
    members: dict[str, list[Capacity]] = {}
    for o in offers:
        members.setdefault(o.class_key, []).append(o)
    for ck, os_ in members.items():
        if len(os_) < 2:
            continue
        rep = min(os_, key=lambda o: (o.price, o.key))
        classes[ck] = replace(rep, key=ck, price=max(o.price for o in os_), max_new=sum(o.max_new for o in os_),
                              ballast=sum(o.ballast for o in os_), members=tuple(o.key for o in os_))
        for o in os_:
            class_of[o.key] = ck
    return classes, class_of


def free_room(h: Capacity, demands: dict[str, Demand], unsettled: frozenset[str] = frozenset()) -> dict[str, float]:
    """What is free on a host with every resident that may stay still there: not one a rule moves, nor one that does
    not run as it may run on (a new shape, a gang grown or short: rules.settled_jobs), whose room may free as it
    restarts. (Counted, a critical gang grown past its instance under WhenEmpty, which stopped, left its room to the
    jobs the warm start put there; a guaranteed low job of the shape, offered no variable there, waited beside another
    tenant's borrowed job for the next plan: fleet65.) `unsettled`: the demand keys with such jobs."""
    dims = list(DIMS) + [f"mig:{p}" for p in set(h.mig or ())]
    free = {k: h.cap(k) for k in dims}
    for dk, _, n in h.residents:
        d = demands.get(dk)
        if d is not None and fit(d, h) > 0 and dk not in unsettled:
            for k in d.dims:
                free[k] = free.get(k, 0.0) - d.req(k) * n
    return free


class HostIndex:
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
        self._evictable: dict[tuple, list[int]] = {}  # (type class, pairs, nvlink, rule) -> hosts where they may evict, ranked
        self.narrowed = 0  # (group, host) candidates left out by a bound (bound_freed, evictable, candidates' room_most)
        for c in [*capacities, *idle]:
            if isinstance(c, Host) and (c.frozen or c.keep_blocker is not None or c.key in idle_of):
                continue
            t = type_class(c)
            order = self.order.setdefault(t, [])
            i = len(order)
            order.append(c)
            self.pos[c.key] = (t, i)
            if not isinstance(c, Host):
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

    def _roomiest_first(self, t: tuple, at) -> list[int]:
        """Positions `at` of type class t, those with the most free room first (summed over its dimensions), then in
        model order: the order every bound on evictable room keeps."""
        order = self.order.get(t, ())
        return sorted(at, key=lambda i: (-sum(self.room[order[i].key].values()), i))

    def freed(self, pendings: set[tuple[tuple, frozenset]], may_evict) -> dict[tuple, set[int]]:
        """Per type class, positions of hosts where some group's pending work (type class, its (tenant,
        class) pairs) may evict a resident."""
        out: dict[tuple, set[int]] = {}
        for t, pending in pendings:
            for pairs, at in self.by_pairs.get(t, {}).items():
                if may_evict(pending, pairs):
                    out.setdefault(t, set()).update(at)
        return out

    def holding(self, resident) -> dict[tuple, set[int]]:
        """Per type class, positions of hosts with a resident whose (tenant, class) pair `resident` accepts."""
        out: dict[tuple, set[int]] = {}
        for t, by in self.by_pairs.items():
            for pairs, at in by.items():
                if any(resident(p) for p in pairs):
                    out.setdefault(t, set()).update(at)
        return out

    def on_freed(self, freed: dict[tuple, set[int]]) -> set[str]:
        """The host keys of `freed` (positions per type class)."""
        return {self.order[t][i].key for t, at in freed.items() for i in at}

    def bound_freed(self, freed: dict[tuple, set[int]], groups: dict[tuple, int], pairs: int) -> dict[tuple, set[int]]:
        """`freed` with at most pairs // groups[t] hosts of each type class t offered this way, those with the most
        free room first (then in model order), where every pending group taking all of them would pass `pairs`
        (group, host) candidates. At 5,436 running instances of a 10k-job fleet after a 5% reclaim, some pending
        work may evict a resident nearly everywhere, and offering every such host to every pending group grew
        the model from 119,601 to 662,883 variables (28 s -> 224 s of CPU; the wall cap then made it greedy's)."""
        out = {}
        for t, at in freed.items():
            n = groups.get(t, 0)
            if n * len(at) <= pairs:
                out[t] = at
                continue
            most = self._roomiest_first(t, at)
            out[t] = set(most[:max(1, pairs // max(n, 1))])
            self.narrowed += n * (len(at) - len(out[t]))
        return out

    def evictable(self, rep: Demand, pairs: frozenset, may_evict, most: int) -> list[int]:
        """Positions of at most `most` hosts of rep's type class where work of `pairs` (tenant, class) may evict a
        resident, those with the most free room first (then in model order); not beside taken GPUs for NVLink work
        on several domains (as `candidates`)."""
        t = type_class(rep)
        key = (t, pairs, rep.nvlink, may_evict)
        ranked = self._evictable.get(key)
        if ranked is None:  # (asked per group: at 5k jobs after a reclaim, 1,162 groups of a few dozen (tenant, class) pairs)
            order = self.order.get(t, [])
            at = {i for rp, idx in self.by_pairs.get(t, {}).items() if may_evict(pairs, rp) for i in idx}
            if rep.nvlink:
                at = {i for i in at if order[i].one_nvlink_domain or order[i].key not in self.gpu_resident}
            ranked = self._evictable[key] = self._roomiest_first(t, at)
        self.narrowed += max(0, len(ranked) - most)
        return ranked[:most]

    def merged(self, rep: Demand, found: list[Capacity], more: list[int]) -> list[Capacity]:
        """`found` (rep's candidates, in model order) with the hosts at positions `more` of its type class added."""
        if not more:
            return found
        order = self.order[type_class(rep)]
        picked = {self.pos[c.key][1] for c in found} | set(more)
        return [order[i] for i in sorted(picked)]

    def candidates(self, rep: Demand, pending: frozenset, warm_hosts: list[str], may_evict, freed: dict | None = None,
                   own: tuple[str, ...] = (), room_most: int | None = None, turn: int = 0) -> list[Capacity]:
        """`warm_hosts`: the hosts the warm start puts this group's new items on; `freed`: hosts where some
        group's pending work may evict a resident (`freed()`), offered to every group with pending work; `own`: for a
        placement-group gang alone in its group, the hosts it runs on (in its placement group); `room_most`: at most
        this many of the hosts with room for one item (`spread`, the group's `turn` among those so bounded)."""
        t = type_class(rep)
        order = self.order.get(t)
        if not order:
            return []
        picked = set(self.always.get(t, ()))
        for k in (*warm_hosts, *own):  # the hint must be expressible (an idle class's members are not here: the class is)
            tk, i = self.pos.get(k, (None, -1))
            if tk == t:
                picked.add(i)
        if not (rep.gang_mode == "placement-group" and rep.gang):  # a placement group's members are new instances
            found = list(self.shedding.get(t, ()))
            room = self._with_room(t, [(k, rep.req(k) - 1e-9) for k in rep.dims if rep.req(k) > 0])
            evict = [i for pairs, at in self.by_pairs.get(t, {}).items() if may_evict(pending, pairs) for i in at] if pending else []
            unbounded = room + evict
            if room_most is not None and len(room) > room_most:
                room = spread(room, room_most, turn)
            if room_most is not None and len(evict) > room_most:  # (the roomiest first, as `evictable`)
                evict = spread(self._roomiest_first(t, evict), room_most, turn)
            found += room + evict
            if pending:
                found += (freed or {}).get(t, ())
            if rep.nvlink:  # beside taken GPUs only in one NVLink domain (Capacity.one_nvlink_domain)
                found = [i for i in found if order[i].one_nvlink_domain or order[i].key not in self.gpu_resident]
                unbounded = [i for i in unbounded if order[i].one_nvlink_domain or order[i].key not in self.gpu_resident]
            picked.update(found)
            if room_most is not None:  # (those left out and offered no other way)
                self.narrowed += len(set(unbounded) - picked)
        return [order[i] for i in sorted(picked)]


def spread(ranked: list[int], most: int, turn: int) -> list[int]:
    """`most` of `ranked` (hosts, the tightest fit first): the first half of them, where an item packs best and
    every group of the shape looks, then a run of the rest that starts further on at each `turn`, so the groups
    bounded together see every host between them (all of them the tightest alone: a few hosts' room for thousands of
    groups)."""
    if len(ranked) <= most:
        return ranked
    head = most // 2
    rest = ranked[head:]
    k = most - head
    start = (turn * k) % len(rest)
    run = rest[start:start + k]
    return ranked[:head] + run + rest[:k - len(run)]


__all__ = ["HostIndex", "free_room", "idle_classes", "spread", "zone_classes"]
