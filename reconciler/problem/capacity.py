"""Capacity: the fleet's instances as hosts (with their residents, and why one must go), new instances
of each (pool, zone, type, market) as offers bounded by what an optimum could buy, and reservations."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime
from typing import Callable

from providers.base import TAG_RESERVATION
from reconciler.ledger import GPU_SLICES, ReservationRules
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.problem.demands import as_utc
from reconciler.problem.rules import OfferFits, guardrail_refusal
from reconciler.problem.types import Capacity, Demand, Host, Offer, spot_measure, type_class
from reconciler.site import Site

def _offering_lookup(observed: Observed, catalog):
    by_key = {(po.offering.cloud, po.offering.zone, po.offering.instance_type): po.offering for po in observed.offerings}

    def lookup(cloud: str, region: str, zone: str, itype: str):
        return by_key.get((cloud, zone, itype)) or catalog.offering(cloud, region, zone, itype)
    return lookup


def hosts_of(desired: DesiredState, observed: Observed, demands: list[Demand], catalog) -> list[Capacity]:
    guard = desired.guardrails
    lookup = _offering_lookup(observed, catalog)
    job_demand = {j: d for d in demands for j in d.jobs}
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
        elif off is None:
            blocker = f"instance type {inst.instance_type} is unknown in {inst.zone}"
        elif inst.instance_type not in pool.spec.instance_types or inst.zone not in pool.spec.zones or inst.region != pool.spec.region:
            blocker = f"drifted from Pool/{pool.name} (type or zone no longer allowed)"
        elif inst.market not in pool.spec.markets():
            blocker = f"market {inst.market} no longer allowed by Pool/{pool.name}"
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
            mig=tuple(pool.spec.mig) if pool is not None and pool.spec.mig else None,
            instance_id=inst.id, keep_blocker=blocker, residents=res,
        ))
    return hosts


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


def reserved_offers(desired: DesiredState, observed: Observed, default_provider: str, reservations: dict[str, ReservationRules],
                     hosts: list[Capacity]) -> list[Capacity]:
    """What is left of each reservation: new on-demand instances at price 0 (its own offer)."""
    guard = desired.guardrails
    used: dict[str, int] = {}
    for h in hosts:
        if h.reservation:
            used[h.reservation] = used.get(h.reservation, 0) + 1
    by_key = {(po.pool, po.offering.zone, po.offering.instance_type): po.offering for po in observed.offerings}
    out = []
    for name, r in sorted(reservations.items()):
        o = by_key.get((r.pool, r.zone, r.instance_type))
        left = r.count - used.get(name, 0)
        if o is None or left <= 0 or guardrail_refusal(guard, o.cloud, o.region) is not None \
                or (o.cloud, o.zone, o.instance_type, "on-demand") in observed.short:
            continue  # (a reservation's capacity is held for it: only a provider that says so makes it short)
        pool = desired.pools[r.pool]
        site = Site(r.pool, observed.providers.get(r.pool, default_provider), o.cloud, o.region, o.zone, o.instance_type, "on-demand")
        out.append(Offer(
            key=f"{site.offer_key}@{name}", site=site, gpus=o.gpus, gpu_type=o.gpu_type, cpu=o.cpu,
            memory_gib=o.memory_gib, price=0.0, on_demand_price=o.on_demand_price,
            nvlink_domain=getattr(o, "nvlink_domain", 1), mig=tuple(pool.spec.mig) if pool.spec.mig else None,
            max_new=left, reservation=name, price_source=f"Reservation/{name} (committed: ${r.hourly_cost:g}/h)",
        ))
    return out


def price_label(o) -> str:
    """`catalog: skypilot-v8 (2026-11-23)`, or the live source a provider names; "" when unknown."""
    src = getattr(o, "price_source", "")
    date = getattr(o, "prices_as_of", "")
    return f"{src} ({date})" if src and date else src


def size_offers(offers: list[Capacity], demands: list[Demand], pool_bounds: dict[str, tuple[int, int]],
                 spot=None, hosts: list[Capacity] = (), gpu_fleet: bool | None = None) -> list[Capacity]:
    """Bound each offer's count: no optimum buys more instances of it than its compatible items
    need one by one (or the pool minimum), nor more than the pool allows; unless those bounds
    leave no room for the idle on-demand capacity the SpotPolicy's spot share and on-demand
    buffer ask for (`_ballast_bound`)."""
    # Each demand with its shape's number: an offer's fit is asked once per shape, then read by number
    # (274k OfferFits asks on the applied 10k-job fleet were ~30% of building its problem).
    fits = OfferFits()
    by_type: dict[tuple, list[tuple[Demand, int, int]]] = {}
    for d in demands:
        by_type.setdefault(type_class(d), []).append((d, fits.shape(d), len(d.jobs) * d.replicas))
    bounds: dict[str, int] = {}
    on_demand_items: dict[str, Demand] = {}  # demands some on-demand offer fits
    for c in offers:
        bound = 0
        okey = c.offer_key
        of_shape: dict[int, int] = {}
        for d, shape, items in by_type.get(type_class(c), []):
            f = of_shape.get(shape)
            if f is None:
                f = of_shape[shape] = fits.at(d, okey, c)
            if f:
                bound += math.ceil(items / f)
                if c.market != "spot":
                    on_demand_items[d.key] = d
        bounds[c.key] = bound
    extra = _ballast_bound(offers, hosts, bounds, pool_bounds, spot, list(on_demand_items.values()), gpu_fleet)
    # Spot diversity (min_instance_types, min_zones) may make an optimum buy one idle spot instance of a type or zone
    # no work needs: each spot offer may stand for one. (Sized to its items alone, a spot offer no job fits was
    # offered 0 times, so a fleet whose spot needed a second zone could use no spot at all, and its plan, "OPTIMAL",
    # left a job pending that a spot instance plus one idle in another zone would hold: found by the
    # pending-reason property tier.)
    diverse = spot is not None and (spot.min_instance_types > 1 or spot.min_zones > 1)
    sized = []
    for c in offers:
        lo, hi = pool_bounds[c.pool]
        n = min(max(bounds[c.key] + extra(c), lo, 1 if diverse and c.market == "spot" else 0), hi)
        if c.reservation:
            n = min(n, c.max_new)  # what is left of the reservation
        if n > 0:
            sized.append(replace(c, max_new=n))
    return sized


def _ballast_bound(offers: list[Capacity], hosts: list[Capacity], bounds: dict[str, int], pool_bounds: dict[str, tuple[int, int]],
                   spot, on_demand_items: list[Demand], gpu_fleet: bool | None = None) -> Callable[[Capacity], int]:
    """Instances of an on-demand offer an optimum may buy beyond its items' bound, to stand idle beside spot
    capacity. Only where the on-demand offers' bounds, less what the items that fit them use, cannot hold
    the idle capacity the spot share (on-demand >= spot x (1 - f) / f) and the buffer (idle >= pct% of spot)
    ask for beside all the spot capacity the fleet could hold: then each may hold it alone. (An on-demand
    offer whose one instance was the buffer's idle GPU could not also host the one job that fits it, which
    stayed pending although a second instance broke no rule: found by the pending-reason property tier.
    Where the bounds leave room, as on the generated bench fleets, the model is as before.)"""
    f = spot.max_spot_fraction if spot is not None else 1.0
    pct = spot.on_demand_buffer_percent if spot is not None else 0.0
    ratio = max((1 - f) / f if 0 < f < 1 else 0.0, pct / 100)
    if ratio <= 0:
        return lambda c: 0
    dim, prim = spot_measure(list(offers) + list(hosts), gpu_fleet)
    most = sum(prim(h) for h in hosts if h.market == "spot")
    most += sum(prim(c) * min(bounds[c.key], pool_bounds[c.pool][1]) for c in offers if c.market == "spot")
    idle = most * ratio
    room = sum(prim(h) for h in hosts if h.market != "spot")
    room += sum(prim(c) * min(bounds[c.key], pool_bounds[c.pool][1]) for c in offers if c.market != "spot")
    used = sum(len(d.jobs) * d.replicas * (d.size / GPU_SLICES if dim == "gpus" and d.mig else d.req(dim)) for d in on_demand_items)
    if idle <= 0 or room - used >= idle - 1e-9:
        return lambda c: 0
    return lambda c: math.ceil(idle / prim(c) - 1e-9) if c.market != "spot" and prim(c) > 0 else 0
