"""Capacity: the fleet's instances as hosts (with their residents, and why one must go), new instances
of each (pool, zone, type, market) as offers bounded by what an optimum could buy, and reservations."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime
from typing import Callable

from providers.base import TAG_RESERVATION
from reconciler.ledger import ReservationRules
from reconciler.model import DesiredState
from reconciler.observe import Observed, instance_layout
from reconciler.problem.demands import as_utc
from reconciler.problem.rules import OfferFits, guardrail_refusal
from reconciler.problem.types import Capacity, Demand, Host, Offer, spot_measure, type_class
from reconciler.site import Site

FILL_DIMS = ("gpus", "cpu", "memory_gib")  # what size_offers sums to tell whether an offer's work fills its pool


def _offering_lookup(observed: Observed, catalog):
    by_key = {(po.offering.cloud, po.offering.zone, po.offering.instance_type): po.offering for po in observed.offerings}

    def lookup(cloud: str, region: str, zone: str, itype: str):
        return by_key.get((cloud, zone, itype)) or catalog.offering(cloud, region, zone, itype)
    return lookup


def show_layout(layout) -> str:
    return "[" + ", ".join(layout) + "]" if layout else "none (whole GPUs)"


def hosts_of(desired: DesiredState, observed: Observed, demands: list[Demand], catalog) -> list[Capacity]:
    guard = desired.guardrails
    lookup = _offering_lookup(observed, catalog)
    job_demand = {j: d for d in demands for j in d.jobs}
    group_of = _group_owner(desired, observed)
    residents: dict[str, dict[tuple[str, str], int]] = {}
    for job, iids in observed.placements.items():
        d = job_demand.get(job)
        if d is None:
            continue
        if d.bundle > 1 and (len(iids) != d.bundle or len(set(iids)) != 1):
            continue  # an instance-gang not whole on one instance stays nowhere: it is placed again, whole
        for iid in iids:
            cell = residents.setdefault(iid, {})
            cell[(d.key, job)] = cell.get((d.key, job), 0) + 1
    hosts = []
    for inst in observed.instances:
        pool = desired.pools.get(inst.pool)
        off = lookup(inst.cloud, inst.region, inst.zone, inst.instance_type)
        blocker = None
        if pool is None:
            blocker = f"pool {inst.pool!r} is no longer in the desired state"
        elif inst.cloud != pool.spec.cloud:  # (a cloud the catalog and Topology may not know: it cannot be priced)
            blocker = f"drifted from Pool/{pool.name} (in cloud {inst.cloud}, not {pool.spec.cloud})"
        elif off is None:
            blocker = f"instance type {inst.instance_type} is unknown in {inst.zone}"
        elif inst.instance_type not in pool.spec.instance_types or inst.zone not in pool.spec.zones or inst.region != pool.spec.region:
            blocker = f"drifted from Pool/{pool.name} (type or zone no longer allowed)"
        elif inst.market not in pool.spec.markets():
            blocker = f"market {inst.market} no longer allowed by Pool/{pool.name}"
        elif sorted(layout := instance_layout(inst, pool)) != sorted(pool.spec.mig or ()):
            blocker = (f"drifted from Pool/{pool.name}: its MIG layout {show_layout(layout)} is not the pool's "
                       f"{show_layout(pool.spec.mig or ())} (a layout is applied only at launch)")
        else:
            blocker = guardrail_refusal(guard, inst.cloud, inst.region)
        od = off.on_demand_price if off else 0.0
        price = off.spot_price if inst.market == "spot" and off and off.spot_price is not None else od
        res = tuple(sorted((dk, job, n) for (dk, job), n in residents.get(inst.id, {}).items()))
        # A same-instance gang is one item (of `bundle` replicas).
        res = tuple((dk, job, n // job_demand[job].bundle) for dk, job, n in res)
        hosts.append(Host(
            key=inst.id, site=Site.of(inst), gpus=off.gpus if off else 0,
            gpu_type=off.gpu_type if off else None, cpu=off.cpu if off else 0, memory_gib=off.memory_gib if off else 0,
            price=price, on_demand_price=od, nvlink_domain=getattr(off, "nvlink_domain", 1) if off else 1,
            mig=instance_layout(inst, pool) or None,
            instance_id=inst.id, keep_blocker=blocker, residents=res, group_of=group_of(inst),
        ))
    return hosts


def _group_owner(desired: DesiredState, observed: Observed) -> Callable:
    """Host.group_of of an observed instance: the placement-group gang whose cluster placement group (the name the plan
    launches its instances into, in that zone) it runs in, '' for none; None where its provider keeps no groups."""
    from reconciler.plan.file import placement_group_name  # (reconciler.plan imports the problem)

    gangs = [j.name for j in desired.jobs.values() if j.spec.gang == "placement-group" and j.spec.replicas > 1]
    owners: dict[str, dict[str, str]] = {}  # zone -> group name -> its gang

    def group_of(inst) -> str | None:
        if inst.provider not in observed.grouped:
            return None
        if not inst.placement_group or not gangs:
            return ""
        if inst.zone not in owners:
            owners[inst.zone] = {placement_group_name(desired.fleet, j, inst.zone): j for j in gangs}
        return owners[inst.zone].get(inst.placement_group, "")

    return group_of


def offers_of(desired: DesiredState, observed: Observed, default_provider: str) -> list[Capacity]:
    guard, spot = desired.guardrails, desired.spot_policy
    offers = []
    for po in observed.offerings:
        pool = desired.pools[po.pool]
        o = po.offering
        if not o.available or guardrail_refusal(guard, o.cloud, o.region) is not None:
            continue
        for market in pool.spec.markets():
            if (o.cloud, o.zone, o.instance_type, market) in observed.short:
                continue
            if market == "spot":
                if o.spot_price is None or o.spot_price > spot.max_price_fraction * o.on_demand_price + 1e-9:
                    continue
            site = Site(po.pool, observed.providers.get(po.pool, default_provider), o.cloud, o.region, o.zone, o.instance_type, market)
            offers.append(Offer(
                key=site.offer_key, site=site, gpus=o.gpus, gpu_type=o.gpu_type, cpu=o.cpu,
                memory_gib=o.memory_gib, price=o.price(market), on_demand_price=o.on_demand_price,
                nvlink_domain=getattr(o, "nvlink_domain", 1), mig=tuple(pool.spec.mig) if pool.spec.mig else None,
                price_source=price_label(o),
            ))
    return offers


def active_reservations(desired: DesiredState, now: datetime | None) -> dict[str, ReservationRules]:
    """The Reservations in force at `now` (all of them without a time), with the pool each fills."""
    out = {}
    for name, r in desired.reservations.items():
        s = r.spec
        until = s.until if isinstance(s.until, datetime) or s.until is None else datetime(s.until.year, s.until.month, s.until.day)
        if until is not None and now is not None and as_utc(until) <= now:
            continue
        pool = s.pool or next((p.name for p in desired.pools.values() if p.spec.cloud == s.cloud and p.spec.region == s.region
                                and s.zone in p.spec.zones and s.instance_type in p.spec.instance_types and "on-demand" in p.spec.markets()), None)
        if pool is None:
            continue
        out[name] = ReservationRules(name, pool, s.cloud, s.region, s.zone, s.instance_type, s.count, s.hourly_cost,
                                     s.target.reservation_id if s.target else None, until.isoformat() if until else None)
    return out


def reserved_hosts(hosts: list[Capacity], observed: Observed, reservations: dict[str, ReservationRules]) -> list[Capacity]:
    """Instances launched into a reservation (its tag) that it still covers: price 0 (committed),
    up to its count, by instance id. The others keep their on-demand price."""
    tagged = {i.id: i.tags.get(TAG_RESERVATION) for i in observed.instances if i.tags.get(TAG_RESERVATION)}
    taken: dict[str, int] = {}
    out = []
    for h in sorted(hosts, key=lambda h: h.key):
        r = reservations.get(tagged.get(h.key) or "")
        if r is not None and h.keep_blocker is None and h.market == "on-demand" and (h.pool, h.zone, h.instance_type) == (r.pool, r.zone, r.instance_type) \
                and taken.get(r.name, 0) < r.count:
            taken[r.name] = taken.get(r.name, 0) + 1
            h = replace(h, price=0.0, reservation=r.name)
        out.append(h)
    order = {h.key: i for i, h in enumerate(hosts)}
    return sorted(out, key=lambda h: order[h.key])


def reserved_offers(desired: DesiredState, observed: Observed, default_provider: str,
                    reservations: dict[str, ReservationRules]) -> list[Capacity]:
    """Each reservation's own offer: new on-demand instances at price 0, up to its count. Its instances the fleet
    runs count against the count too (`fleet_rules.add_reservations`, `Ledger.open_rules`, the packer): a plan may
    delete one and launch another into it (a placement-group gang's new instance, fleet66), so a reservation its
    holders fill is still offered while any of them could go."""
    guard = desired.guardrails
    by_key = {(po.pool, po.offering.zone, po.offering.instance_type): po.offering for po in observed.offerings}
    out = []
    for name, r in sorted(reservations.items()):
        o = by_key.get((r.pool, r.zone, r.instance_type))
        if o is None or r.count <= 0 or guardrail_refusal(guard, o.cloud, o.region) is not None \
                or (o.cloud, o.zone, o.instance_type, "on-demand") in observed.short:
            continue  # (a reservation's capacity is held for it: only a provider that says so makes it short)
        pool = desired.pools[r.pool]
        site = Site(r.pool, observed.providers.get(r.pool, default_provider), o.cloud, o.region, o.zone, o.instance_type, "on-demand")
        out.append(Offer(
            key=f"{site.offer_key}@{name}", site=site, gpus=o.gpus, gpu_type=o.gpu_type, cpu=o.cpu,
            memory_gib=o.memory_gib, price=0.0, on_demand_price=o.on_demand_price,
            nvlink_domain=getattr(o, "nvlink_domain", 1), mig=tuple(pool.spec.mig) if pool.spec.mig else None,
            max_new=r.count, reservation=name, price_source=f"Reservation/{name} (committed: ${r.hourly_cost:g}/h)",
        ))
    return out


def price_label(o) -> str:
    """`catalog: skypilot-v8 (2026-11-23)`, or the live source a provider names; "" when unknown."""
    src = getattr(o, "price_source", "")
    date = getattr(o, "prices_as_of", "")
    return f"{src} ({date})" if src and date else src


def size_offers(offers: list[Capacity], demands: list[Demand], pool_bounds: dict[str, tuple[int, int]],
                 spot=None, hosts: list[Capacity] = (), gpu_fleet: bool | None = None) -> list[Capacity]:
    """Bound each offer's count by what an optimum of the config could buy, so that the sized problem is a
    relaxation of the config at every optimum (README, How it decides: its OPTIMAL is the config's):

    - for work, the instances its compatible items need one by one (`bound`: each demand's items on
      instances of their own), or the pool minimum, or, under spot diversity, one (a spot offer), within the
      pool's max_instances and a reservation's count (`max_new - ballast`);
    - and, on an on-demand offer, `ballast` more that stand idle for the spot share and the on-demand buffer
      (`_ballast`): `max_new` is min(max(bound + ballast, min_instances, diversity), max_instances).

    Why no optimum buys more: take any plan the config allows and put each demand's items on an offer onto
    instances of their own (its per-offer counts are unchanged, and nothing the model or its tiers read tells
    which instance of an offer an item is on): at most `bound` instances hold work, and the others are empty.
    An empty instance serves only a pool minimum, spot diversity (one spot instance of a type or zone), or,
    on-demand, the spot share (on-demand >= spot x (1 - f) / f) and the buffer (idle >= pct% of spot). With n
    instances of an offer over max(bound + ballast, min_instances, diversity), one empty instance goes and
    every rule still holds: the pool keeps its minimum, the offer an instance, and the offer's own empty
    instances, at least `ballast` of them, hold alone the idle capacity either spot rule asks beside the most
    spot capacity the problem can buy and keep; the budget, quotas and max_instances only gain. It saves its
    price, so no optimum has it (a reservation's instance is free: an optimum without it is one too).

    `fills_pool`: the items that fit the offer, summed per dimension (FILL_DIMS), fill at least its pool's
    max_instances of it, so the pool caps its count (solve/slots.pool_capped models it as a fixed pool's).

    Model size: the ballast gets no per-instance slots (solve/slots.py sizes those by `work_most`), so an
    offer modelled instance by instance stays so however much idle capacity the buffer could ask for."""
    # Each demand with its shape's number: an offer's fit is asked once per shape, then read by number
    # (274k OfferFits asks on the applied 10k-job fleet were ~30% of building its problem).
    fits = OfferFits()
    by_type: dict[tuple, list[tuple[Demand, int, int]]] = {}
    for d in demands:
        by_type.setdefault(type_class(d), []).append((d, fits.shape(d), len(d.jobs) * d.replicas))
    bounds: dict[str, int] = {}
    filled: dict[str, int] = {}  # the instances the work that fits would fill, in sum per dimension
    for c in offers:
        bound = 0
        okey = c.offer_key
        of_shape: dict[int, int] = {}
        asked = dict.fromkeys(FILL_DIMS, 0.0)
        for d, shape, items in by_type.get(type_class(c), []):
            f = of_shape.get(shape)
            if f is None:
                f = of_shape[shape] = fits.at(d, okey, c)
            if f:
                bound += math.ceil(items / f)
                for dim in FILL_DIMS:
                    asked[dim] += items * d.req(dim)
        bounds[c.key] = bound
        filled[c.key] = max((math.ceil(v / c.cap(dim) - 1e-9) for dim, v in asked.items() if c.cap(dim) > 0), default=0)
    # Spot diversity (min_instance_types, min_zones) may make an optimum buy one idle spot instance of a type or zone
    # no work needs: each spot offer may stand for one. (Sized to its items alone, a spot offer no job fits was
    # offered 0 times, so a fleet whose spot needed a second zone could use no spot at all, and its plan, "OPTIMAL",
    # left a job pending that a spot instance plus one idle in another zone would hold: found by the
    # pending-reason property tier.)
    diverse = spot is not None and (spot.min_instance_types > 1 or spot.min_zones > 1)

    def size(c: Capacity, idle: int) -> int:
        lo, hi = pool_bounds[c.pool]
        n = min(max(bounds[c.key] + idle, lo, 1 if diverse and c.market == "spot" else 0), hi)
        return min(n, c.max_new) if c.reservation else n  # (a reservation: what is left of it)

    work = {c.key: size(c, 0) for c in offers}
    ballast = _ballast(offers, hosts, work, spot, gpu_fleet)
    sized = []
    for c in offers:
        n = size(c, ballast(c))
        if n > 0:
            sized.append(replace(c, max_new=n, ballast=n - work[c.key], fills_pool=filled[c.key] >= pool_bounds[c.pool][1]))
    return sized


def _ballast(offers: list[Capacity], hosts: list[Capacity], work: dict[str, int], spot,
             gpu_fleet: bool | None = None) -> Callable[[Capacity], int]:
    """Instances of an on-demand offer an optimum may buy beyond its work, to stand idle beside spot capacity:
    as many as hold alone the idle capacity the spot share (on-demand >= spot x (1 - f) / f) and the buffer
    (idle >= pct% of spot) ask for beside the most spot capacity the problem can have (the spot hosts it may
    keep, every spot offer at its size; spot offers get no ballast, so this is not circular). Every on-demand
    offer may hold it all: the optimum buys it where it is cheapest, which may be the offer whose instances a job
    needs. (Before, an offer got any only where the other on-demand offers' room could not hold it: on fleet24 the
    optimum bought the idle GPU on the one instance j3's offer had, and j3, pending, stayed so with max_instances
    lifted: an "OPTIMAL" plan that was not the config's, found by the pending-reason property tier.)"""
    f = spot.max_spot_fraction if spot is not None else 1.0
    pct = spot.on_demand_buffer_percent if spot is not None else 0.0
    ratio = max((1 - f) / f if 0 < f < 1 else 0.0, pct / 100)
    if ratio <= 0:
        return lambda c: 0
    _, prim = spot_measure(list(offers) + list(hosts), gpu_fleet)
    most = sum(prim(h) for h in hosts if h.market == "spot" and h.keep_blocker is None)
    most += sum(prim(c) * work[c.key] for c in offers if c.market == "spot")
    idle = most * ratio
    if idle <= 0:
        return lambda c: 0
    return lambda c: math.ceil(idle / prim(c) - 1e-9) if c.market != "spot" and prim(c) > 0 else 0
