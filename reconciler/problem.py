"""Turn desired + observed state into the solver's problem: demands and capacities.

Pure. Equivalence classes keep the model small: identical single-replica jobs
become one Demand with a count, and new instances of one (pool, zone, type,
market) become one Capacity with a maximum count. Where packing replicas into
identical instances is exact in aggregate (one replica per instance, or GPU
sizes that divide each other with CPU and memory in proportion), the solver
uses a single integer for the count instead of one variable per instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from providers.catalog import load_catalog
from reconciler.model import DesiredState, Job, SpotPolicySpec, region_matches
from reconciler.observe import Observed
from reconciler.topology import TopologyIndex

DIMS = ("gpus", "cpu", "memory_gib")


@dataclass(frozen=True)
class Demand:
    """One class of identical work: a gang (one job, all replicas) or identical 1-replica jobs."""

    key: str
    jobs: tuple[str, ...]
    replicas: int  # per job
    tenant: str
    gpus: int
    gpu_type: str | None
    cpu: float
    memory_gib: float
    priority: int
    spot: str
    pools: frozenset[str] | None
    regions: tuple[str, ...] | None
    data_location: str | None
    data_gib: float
    hours: float

    @property
    def gang(self) -> bool:
        return self.replicas > 1

    @property
    def weight(self) -> int:
        """Objective weight of one replica: priority times the GPUs (or 1 for CPU work)."""
        return self.priority * max(1, self.gpus)

    def req(self, dim: str) -> float:
        return getattr(self, dim)


@dataclass(frozen=True)
class Capacity:
    """An existing instance (instance_id set) or an offer of up to max_new new instances."""

    key: str
    pool: str
    provider: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    gpus: int
    gpu_type: str | None
    cpu: float
    memory_gib: float
    price: float  # USD per hour
    on_demand_price: float
    instance_id: str | None = None
    max_new: int = 0
    aggregate: bool = False
    keep_blocker: str | None = None  # existing: why it must go (pool removed, drifted from spec)

    @property
    def existing(self) -> bool:
        return self.instance_id is not None

    def cap(self, dim: str) -> float:
        return getattr(self, dim)


@dataclass(frozen=True)
class Unit:
    """One decision unit: an existing instance, one slot of an offer, or a whole aggregated offer."""

    key: str
    cap: Capacity
    count: int  # how many instances this unit may stand for (1 unless aggregate)
    slot: int = 0  # position among the slots of one offer (they are used in order)


@dataclass(frozen=True)
class Problem:
    demands: tuple[Demand, ...]
    capacities: tuple[Capacity, ...]
    running: dict[tuple[str, str], int]  # (demand key, capacity key) -> replicas running there now
    pool_bounds: dict[str, tuple[int, int]]
    tenant_caps: dict[str, dict[str, float]]
    spot: SpotPolicySpec
    budget: float | None
    egress: dict[tuple[str, str], float] = field(default_factory=dict)  # (demand, capacity) -> USD/h per replica
    static_pending: dict[str, str] = field(default_factory=dict)  # job -> why nothing can ever host it


def fit(d: Demand, c: Capacity) -> int:
    """How many replicas of d fit on one instance of c, honouring every placement rule (0: none)."""
    if d.gpus > 0:
        if c.gpu_type != d.gpu_type or c.gpus < d.gpus:
            return 0
    elif c.gpus > 0:
        return 0  # GPU instances are tainted for GPU work, as GPU node pools usually are
    if d.spot == "never" and c.market == "spot" or d.spot == "required" and c.market != "spot":
        return 0
    if d.pools is not None and c.pool not in d.pools:
        return 0
    if not region_matches(list(d.regions) if d.regions is not None else None, c.cloud, c.region):
        return 0
    n = min(math.floor(c.cap(dim) / d.req(dim) + 1e-9) for dim in DIMS if d.req(dim) > 0)
    return max(0, n)


def _ffd_bins(demands: list[Demand], c: Capacity) -> int:
    """Instances of c that first-fit decreasing needs for all these replicas."""
    items = sorted(((d.gpus, d.cpu, d.memory_gib) for d in demands for _ in range(len(d.jobs) * d.replicas)), reverse=True)
    bins: list[list[float]] = []
    for g, cpu, mem in items:
        for b in bins:
            if b[0] >= g and b[1] >= cpu - 1e-9 and b[2] >= mem - 1e-9:
                b[0] -= g
                b[1] -= cpu
                b[2] -= mem
                break
        else:
            bins.append([c.gpus - g, c.cpu - cpu, c.memory_gib - mem])
    return len(bins)


def _exact_in_aggregate(c: Capacity, demands: list[Demand]) -> bool:
    """True when any multiset of these replicas whose totals fit n instances also packs into n."""
    fits = [fit(d, c) for d in demands]
    if all(f <= 1 for f in fits):
        return True
    if c.gpus == 0:
        return False
    sizes = sorted({d.gpus for d in demands})
    chain = all(b % a == 0 for a, b in zip(sizes, sizes[1:])) and all(c.gpus % s == 0 for s in sizes)
    proportional = all(d.cpu / d.gpus <= c.cpu / c.gpus + 1e-9 and d.memory_gib / d.gpus <= c.memory_gib / c.gpus + 1e-9 for d in demands)
    return chain and proportional


def _demands(desired: DesiredState) -> list[Demand]:
    groups: dict[tuple, list[Job]] = {}
    for job in desired.jobs.values():
        s = job.spec
        sig = (
            s.tenant, s.resources.gpus, s.resources.gpu_type, s.resources.cpu, s.resources.memory_gib, s.replicas,
            job.spec.priority_weight(), s.spot, tuple(sorted(s.pools)) if s.pools is not None else None,
            tuple(sorted(s.regions)) if s.regions is not None else None,
            s.data.location if s.data else None, s.data.size_gib if s.data else 0.0, s.expected_hours,
        )
        key = ("gang", job.name) if s.replicas > 1 else sig  # gangs stay individual: zone choice is per gang
        groups.setdefault(key, []).append(job)
    out = []
    for i, (_, jobs) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0].name)):
        s = jobs[0].spec
        out.append(Demand(
            key=f"d{i}:{jobs[0].name}", jobs=tuple(j.name for j in jobs), replicas=s.replicas, tenant=s.tenant,
            gpus=s.resources.gpus, gpu_type=s.resources.gpu_type, cpu=s.resources.cpu, memory_gib=s.resources.memory_gib,
            priority=s.priority_weight(), spot=s.spot, pools=frozenset(s.pools) if s.pools is not None else None,
            regions=tuple(s.regions) if s.regions is not None else None,
            data_location=s.data.location if s.data else None, data_gib=s.data.size_gib if s.data else 0.0,
            hours=s.expected_hours,
        ))
    return out


def build_problem(desired: DesiredState, observed: Observed, default_provider: str = "sim") -> Problem:
    catalog = load_catalog()
    guard = desired.guardrails
    spot = desired.spot_policy
    demands = _demands(desired)
    caps: list[Capacity] = []

    # Existing instances: one capacity each, keepable only while they match their pool's spec.
    price_of = {(po.offering.cloud, po.offering.zone, po.offering.instance_type): po.offering for po in observed.offerings}
    for inst in observed.instances:
        pool = desired.pools.get(inst.pool)
        # The provider's offering is the authority on shape and price; the catalog fills gaps.
        off = price_of.get((inst.cloud, inst.zone, inst.instance_type)) or catalog.offering(inst.cloud, inst.region, inst.zone, inst.instance_type)
        blocker = None
        if pool is None:
            blocker = f"pool {inst.pool!r} is no longer in the desired state"
        elif off is None:
            blocker = f"instance type {inst.instance_type} is unknown in {inst.zone}"
        elif inst.instance_type not in pool.spec.instance_types or inst.zone not in pool.spec.zones or inst.region != pool.spec.region:
            blocker = f"drifted from Pool/{pool.name} (type or zone no longer allowed)"
        elif inst.market not in pool.spec.markets():
            blocker = f"market {inst.market} no longer allowed by Pool/{pool.name}"
        elif not region_matches(guard.allowed_regions, inst.cloud, inst.region):
            blocker = f"region {inst.cloud}/{inst.region} not allowed by the GuardrailPolicy"
        od = off.on_demand_price if off else 0.0
        price = (off.spot_price if inst.market == "spot" and off and off.spot_price is not None else od)
        caps.append(Capacity(
            key=inst.id, pool=inst.pool, provider=inst.provider, cloud=inst.cloud, region=inst.region, zone=inst.zone,
            instance_type=inst.instance_type, market=inst.market, gpus=off.gpus if off else 0,
            gpu_type=off.gpu_type if off else None, cpu=off.cpu if off else 0, memory_gib=off.memory_gib if off else 0,
            price=price, on_demand_price=od, instance_id=inst.id, keep_blocker=blocker,
        ))

    # Offers of new instances.
    offers: list[Capacity] = []
    for po in observed.offerings:
        pool = desired.pools[po.pool]
        o = po.offering
        if not o.available or not region_matches(guard.allowed_regions, o.cloud, o.region):
            continue
        for market in pool.spec.markets():
            if (o.cloud, o.zone, o.instance_type, market) in observed.short:
                continue
            if market == "spot":
                if o.spot_price is None or o.spot_price > spot.max_price_fraction * o.on_demand_price + 1e-9:
                    continue
            offers.append(Capacity(
                key=f"{po.pool}/{o.zone}/{o.instance_type}/{market}", pool=po.pool,
                provider=observed.providers.get(po.pool, default_provider), cloud=o.cloud, region=o.region, zone=o.zone,
                instance_type=o.instance_type, market=market, gpus=o.gpus, gpu_type=o.gpu_type, cpu=o.cpu,
                memory_gib=o.memory_gib, price=o.price(market), on_demand_price=o.on_demand_price,
            ))
    pool_bounds = {n: (p.spec.min_instances, p.spec.max_instances) for n, p in desired.pools.items()}
    sized: list[Capacity] = []
    for c in offers:
        compatible = [d for d in demands if fit(d, c) > 0]
        aggregate = _exact_in_aggregate(c, compatible)
        # Any valid packing of every compatible replica bounds how many of this offer an optimum
        # needs (it never buys an instance its replicas could do without). Slots cost a variable
        # each, so their bound is worth the tighter first-fit-decreasing count.
        bound = sum(math.ceil(len(d.jobs) * d.replicas / fit(d, c)) for d in compatible)
        if not aggregate and bound > 1:
            bound = min(bound, _ffd_bins(compatible, c))
        lo, hi = pool_bounds[c.pool]
        n = min(max(bound, lo), hi)
        if n > 0:
            sized.append(Capacity(**{**c.__dict__, "max_new": n, "aggregate": aggregate}))
    caps.extend(sized)

    by_id = {c.instance_id: c for c in caps if c.existing}
    running: dict[tuple[str, str], int] = {}
    job_demand = {j: d for d in demands for j in d.jobs}
    for job, iids in observed.placements.items():
        d = job_demand.get(job)
        if d is None:
            continue
        for iid in iids:
            if iid in by_id:
                running[(d.key, iid)] = running.get((d.key, iid), 0) + 1

    topo = TopologyIndex(desired.topology.spec)
    egress: dict[tuple[str, str], float] = {}
    for d in demands:
        if d.data_location and d.data_gib > 0:
            for c in caps:
                dist = topo.distance(d.data_location, c.cloud, c.region, c.zone)
                egress[(d.key, c.key)] = dist.egress_per_gb * d.data_gib / d.hours / d.replicas

    tenant_caps = {}
    for name, t in desired.tenants.items():
        tenant_caps[name] = {dim: t.spec.quota.cap(dim) for dim in DIMS if t.spec.quota.cap(dim) is not None}

    static_pending = {}
    for d in demands:
        if not any(fit(d, c) > 0 and c.keep_blocker is None for c in caps):
            reason = _why_nothing_fits(d, desired, observed, offers)
            for j in d.jobs:
                static_pending[j] = reason

    return Problem(
        demands=tuple(demands), capacities=tuple(caps), running=running, pool_bounds=pool_bounds,
        tenant_caps=tenant_caps, spot=spot, budget=guard.max_hourly_budget, egress=egress, static_pending=static_pending,
    )


def _why_nothing_fits(d: Demand, desired: DesiredState, observed: Observed, offers: list[Capacity]) -> str:
    """The first rule, in the order a user would check them, that leaves no capacity."""
    what = f"{d.gpus}x {d.gpu_type}" if d.gpus else f"{d.cpu:g} vCPU / {d.memory_gib:g} GiB (CPU-only)"
    shapes: dict[str, list] = {}  # pool -> the offerings its provider reports
    for po in observed.offerings:
        shapes.setdefault(po.pool, []).append(po.offering)
    pools = [p for p in desired.pools.values() if d.pools is None or p.name in d.pools]
    typed = [p for p in pools if any((o.gpu_type == d.gpu_type if d.gpus else o.gpus == 0) for o in shapes.get(p.name, []))]
    if not typed:
        return f"no pool offers {what}" + (" (CPU jobs do not run on GPU instances)" if not d.gpus else "")
    in_region = [p for p in typed if region_matches(list(d.regions) if d.regions else None, p.spec.cloud, p.spec.region)
                 and region_matches(desired.guardrails.allowed_regions, p.spec.cloud, p.spec.region)]
    if not in_region:
        return f"no pool offers {what} in an allowed region (job regions: {', '.join(d.regions or ['any'])})"
    big = [p for p in in_region if any(
        o.gpus >= d.gpus and o.cpu >= d.cpu and o.memory_gib >= d.memory_gib and (o.gpu_type == d.gpu_type if d.gpus else o.gpus == 0)
        for o in shapes.get(p.name, []))]
    if not big:
        return f"no instance type in an allowed pool is large enough for one replica ({what}, {d.cpu:g} vCPU, {d.memory_gib:g} GiB)"
    markets = {m for p in big for m in p.spec.markets()}
    if d.spot == "never" and markets == {"spot"}:
        return "spot: never, but every matching pool is spot-only"
    if d.spot == "required" and "spot" not in markets:
        return "spot: required, but no matching pool allows spot"
    names = {p.name for p in big}
    if not any(o.pool in names for o in offers):
        return "every matching zone is out of capacity or in cool-off after a capacity error; retry later or add zones"
    return f"no capacity matches {what} under the pool, market and spot price rules"


def units_of(problem: Problem) -> list[Unit]:
    units = []
    for c in problem.capacities:
        if c.existing:
            units.append(Unit(c.key, c, 1))
        elif c.aggregate:
            units.append(Unit(c.key, c, c.max_new))
        else:
            units.extend(Unit(f"{c.key}#{k}", c, 1, k) for k in range(c.max_new))
    return units
