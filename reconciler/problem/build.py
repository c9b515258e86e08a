"""Turn desired + observed state into the solver's problem: demands, capacity, tenants, the fleet's
capacity for fair shares, costs per zone, deadlines, and what nothing can ever host."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime

from providers.catalog import load_catalog
from reconciler.problem.diagnosis import pool_instances, why_nothing_fits
from reconciler.ledger import LicenseRules, QuotaBook, quota_scope, quota_units
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.problem.capacity import hosts_of, offers_of, active_reservations, reserved_hosts, reserved_offers, size_offers
from reconciler.problem.demands import demands_of, group_key, as_utc
from reconciler.problem.freeze import FREEZE_ABOVE, frozen_hosts
from reconciler.problem.rules import OfferFits
from reconciler.problem.tenants import tenant_rules
from reconciler.problem.types import DIMS, Capacity, Demand, Host, Problem, hopeless, type_class
from reconciler.topology import TopologyIndex

def build_problem(desired: DesiredState, observed: Observed, default_provider: str = "sim", now: datetime | None = None,
                  freeze: bool | None = None) -> Problem:
    """`now` drives priority aging and remaining times (None: no aging). `freeze`: True or
    False forces freezing of unchangeable hosts on or off; None freezes above FREEZE_ABOVE hosts."""
    catalog = load_catalog()
    topo = TopologyIndex(desired.topology.spec)
    demands = demands_of(desired, observed, now, topo)
    pool_bounds = {n: (p.spec.min_instances, p.spec.max_instances) for n, p in desired.pools.items()}
    reservations = active_reservations(desired, now)
    hosts = reserved_hosts(hosts_of(desired, observed, demands, catalog), observed, reservations)
    # The spot share counts GPUs when the fleet's pools offer any GPU type (or a GPU instance runs), whatever
    # the plan can buy or use now (ledger.spot_units).
    gpu_fleet = any(po.offering.gpus for po in observed.offerings) or any(h.gpus for h in hosts)
    offers = size_offers(offers_of(desired, observed, default_provider) + reserved_offers(desired, observed, default_provider, reservations),
                         demands, pool_bounds, desired.spot_policy, hosts, gpu_fleet)
    quotas = _cloud_quotas(observed, offers)
    pool_bounds, quota_floors, quota_floor_gaps = _quota_floors(pool_bounds, hosts, offers, quotas)

    fleet_capacity = {dim: 0.0 for dim in DIMS}
    best: dict[tuple[str, str], float] = {}
    for c in offers + hosts:
        for dim in DIMS:
            best[(c.pool, dim)] = max(best.get((c.pool, dim), 0.0), c.cap(dim))
    for (pool, dim), v in best.items():
        fleet_capacity[dim] += v * pool_bounds.get(pool, (0, 1))[1]
    tenants = tenant_rules(desired, demands, hosts, fleet_capacity, getattr(observed, "since", {}))

    static_pending = _static_pending(demands, hosts + offers, desired, observed, offers)
    if freeze or (freeze is None and len(hosts) > FREEZE_ABOVE):
        never = frozenset(d.key for d in demands if hopeless(d, static_pending))
        frozen = frozen_hosts(hosts, offers, demands, desired, tenants, pool_bounds, gpu_fleet, never)
        hosts = [replace(h, frozen=True) if h.instance_id in frozen else h for h in hosts]

    split = {t for t, r in tenants.items() if r.budget is not None or r.spot_fraction is not None}
    groups: dict[tuple, list[str]] = {}
    for d in demands:
        groups.setdefault(group_key(d, split), []).append(d.key)
    group_map = {f"g{i}": tuple(keys) for i, keys in enumerate(groups.values())}

    coef = _zone_costs(demands, {(c.cloud, c.region, c.zone) for c in offers + hosts}, topo, desired.placement.latency_cost_per_ms)

    # Expected hours left for running jobs (deadlines), and when each is expected to end: the victim order of
    # preemption, which does not move with the clock (every running job ages alike).
    launched = {i.id: parse_time(i.launched_at) for i in observed.instances}
    job_remaining, job_end = {}, {}
    for d in demands:
        for job, iids in d.running:
            start = started(iids, launched)
            job_remaining[job] = hours_left(start, d.hours, now)
            job_end[job] = expected_end(start, d.hours, now)
    deadlines = {j: (desired.jobs[j].spec.deadline, job_remaining.get(j, d.hours)) for d in demands for j in d.jobs
                 if desired.jobs[j].spec.deadline is not None}

    caps = hosts + offers

    return Problem(
        demands=tuple(demands), capacities=tuple(caps), groups=group_map, pool_bounds=pool_bounds, tenants=tenants,
        desired_spot=desired.spot_policy, placement=desired.placement, budget=desired.guardrails.max_hourly_budget,
        fleet_capacity=fleet_capacity, static_pending=static_pending, job_remaining=job_remaining, job_end=job_end, coef=coef, now=now,
        licenses=_licenses(desired), reservations=reservations, deadlines=deadlines, quotas=quotas, quota_floors=quota_floors,
        quota_floor_gaps=quota_floor_gaps,
        gpu_fleet=gpu_fleet,
    )



def _zone_costs(demands: list[Demand], sites: set[tuple[str, str, str]], topo: TopologyIndex, lat_cost: float) -> dict[tuple[str, str], float]:
    """Data egress and latency, USD per item-hour, for every zone (cloud, region, zone) a demand could use."""
    coef: dict[tuple[str, str], float] = {}
    dists: dict[tuple, object] = {}  # (data location, site) -> Distance: 46k asks at 10k jobs, a few hundred pairs
    for d in demands:
        if not d.data_location:
            continue
        for cloud, region, zone in sites:
            dist = dists.get(k := (d.data_location, cloud, region, zone))
            if dist is None:
                dist = dists[k] = topo.distance(d.data_location, cloud, region, zone)
            v = 0.0
            if d.data_gib > 0 and math.isfinite(dist.egress_per_gb):  # (inf: an instance outside the Topology, which must go)
                v += dist.egress_per_gb * d.data_gib / d.hours / d.replicas  # the data set is read once per job
            if lat_cost > 0 and math.isfinite(dist.latency_ms):
                v += lat_cost * dist.latency_ms * d.bundle
            if v:
                coef[(d.key, f"{cloud}/{zone}")] = v
    return coef


def _static_pending(demands: list[Demand], caps: list[Capacity], desired: DesiredState, observed: Observed,
                    offers: list[Capacity]) -> dict[str, str]:
    """Job -> why no capacity the fleet could have ever hosts it (diagnosis.why_nothing_fits), for the demands
    no keepable host and no offer fits."""
    out: dict[str, str] = {}
    shapes_by_type: dict[tuple, dict[str, Capacity]] = {}  # one capacity per offer key: fit() reads nothing else
    for c in caps:
        if not (isinstance(c, Host) and c.keep_blocker is not None):
            shapes_by_type.setdefault(type_class(c), {}).setdefault(c.offer_key, c)
    every = None  # what the pools could ever run, built for the first demand nothing fits
    fits = OfferFits()  # (once per demand shape and offer: 5,000 demands asked 35k times, 0.05 s at 5k jobs)
    for d in demands:
        if not any(fits.at(d, k, c) > 0 for k, c in shapes_by_type.get(type_class(d), {}).items()):
            every = pool_instances(desired, observed) if every is None else every
            reason = why_nothing_fits(d, desired, observed, offers, every)
            for j in d.jobs:
                out[j] = reason
    return out


def _quota_floors(pool_bounds: dict[str, tuple[int, int]], hosts: list[Capacity], offers: list[Capacity],
                  quotas: tuple) -> tuple[dict[str, tuple[int, int]], dict[str, str], dict[str, tuple[tuple[str, int, str], ...]]]:
    """A pool minimum the account's quotas leave no room to launch is lowered to what they allow (a quota limits
    launches; a minimum it blocks would leave no plan at all): pools in name order, each filling its minimum from its
    cheapest offers while the quotas (shared between pools) have room. Returns the bounds, per lowered pool why, and
    per lowered pool what it lacks of each quota that holds it back (Problem.quota_floor_gaps): the instances a raise
    would launch first, cheapest first as here."""
    if not quotas:
        return pool_bounds, {}, {}
    book = QuotaBook(quotas)
    have: dict[str, int] = {}
    for h in hosts:
        if h.keep_blocker is None:
            have[h.pool] = have.get(h.pool, 0) + 1
    bounds, why, gaps = dict(pool_bounds), {}, {}
    for pool in sorted(pool_bounds):
        lo, hi = pool_bounds[pool]
        need, got, blocked = lo - have.get(pool, 0), 0, None
        cheapest = sorted((o for o in offers if o.pool == pool), key=lambda o: (o.price, o.key))
        took: dict[str, int] = {}
        for o in cheapest:
            for _ in range(min(o.max_new, max(0, need - got))):
                over = book.short(o)
                if over is not None:
                    blocked = blocked or quota_scope(book.quotas[over[0]])
                    break
                book.take(o)
                got += 1
                took[o.key] = took.get(o.key, 0) + 1
        if need > 0 and got < need and blocked:
            bounds[pool] = (lo - (need - got), hi)
            why[pool] = f"pool {pool}: min_instances {lo} lowered to {lo - (need - got)}: cloud quota {blocked} has no room for more"
            gaps[pool] = tuple(_floor_gap(book, cheapest, took, need - got))
    return bounds, why, gaps


def _floor_gap(book: QuotaBook, cheapest: list[Capacity], took: dict[str, int], lack: int) -> list[tuple[str, int, str]]:
    """(quota_scope, units, "1 m6i.4xlarge") of each quota that refuses the `lack` instances a lowered minimum misses,
    on its cheapest offers with launches left (`took`: what it launched of each)."""
    out = []
    for o in cheapest:
        k = min(o.max_new - took.get(o.key, 0), lack)
        if k <= 0:
            continue
        for i, _ in book.shorts(o, k):
            out.append((quota_scope(book.quotas[i]), k * quota_units(book.quotas[i], o), f"{k} {o.instance_type}"))
        lack -= k
        if not lack:
            break
    return out


def _cloud_quotas(observed: Observed, offers: list[Capacity]) -> tuple:
    """The quotas providers read that some offer's new instances count against (the others cannot bind)."""
    return tuple(q for q in sorted(getattr(observed, "quotas", ()), key=lambda q: (q.cloud, q.region, q.name))
                 if any(quota_units(q, c) for c in offers))


def _licenses(desired: DesiredState) -> dict[str, LicenseRules]:
    return {n: LicenseRules(n, lic.spec.count, dict(lic.spec.tenant_quotas), lic.spec.cost_per_hour) for n, lic in desired.licenses.items()}


def parse_time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return None


def started(iids, launched: dict) -> datetime | None:
    """When a running job started: the earliest launch of its instances (None: none of them says)."""
    return min((launched[i] for i in iids if launched.get(i)), default=None)


def hours_left(start, hours: float, now) -> float:
    """A running job's expected hours left at `now` (all of them when its start is not known; none once past)."""
    ran = (now - start).total_seconds() / 3600 if (now and start) else 0.0
    return max(0.0, hours - ran)


def expected_end(start, hours: float, now) -> float:
    """When a running job is expected to end, in seconds since the epoch: its start plus its expected_hours. A job
    whose start is not known counts as started now (its end then moves with the clock; the plan memo keys that)."""
    begun = start if start is not None else now
    return (begun.timestamp() if begun is not None else 0.0) + hours * 3600
