"""Turn desired + observed state into the solver's problem: demands, capacity, rules.

Pure. Equivalence classes keep the model small: identical single-replica jobs are
one Demand with a count; new instances of one (pool, zone, type, market) are one
offer with a count; demands that no rule tells apart share placement variables
(a `group`). Existing instances are individual hosts with their residents. On a
large fleet, hosts that no decision can change are frozen (see `_frozen`): the
solver treats them as constants, so a drift plan over 10k instances solves only
the part of the fleet that moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable

from providers.base import TAG_RESERVATION
from providers.catalog import load_catalog
from reconciler.deadlines import ranks, start_by
from reconciler.ledger import (GPU_SLICES, LicenseRules, QuotaBook, ReservationRules, budget_ok, item_share, mig_compute, pool_ok, quota_ok,
                               quota_scope, quota_units, spot_share_ok, spot_units)
from reconciler.model import PRIORITY_CLASSES, DesiredState, Job, PlacementPolicySpec, SpotPolicySpec, quota_guarantee, region_matches
from reconciler.observe import Observed
from reconciler.topology import TopologyIndex

DIMS = ("gpus", "cpu", "memory_gib")
FREEZE_ABOVE = 400  # hosts; smaller fleets are always solved whole (exact)


def priority_class(priority: int) -> int:
    """0 low, 1 normal, 2 high, 3 critical: the bands of the named classes (1, 10, 100, 1000)."""
    return 0 if priority < 10 else 1 if priority < 100 else 2 if priority < 1000 else 3


@dataclass(frozen=True)
class Demand:
    """One class of identical work: a gang (one job, all replicas) or identical 1-replica jobs.

    An item is what lands on one instance: a replica, or for a same-instance gang the
    whole job (`bundle` replicas)."""

    key: str
    jobs: tuple[str, ...]
    replicas: int  # items per job
    bundle: int  # job replicas per item (>1 only for gang: instance)
    tenant: str
    gpus: int  # per item
    gpu_type: str | None
    mig: tuple[str, int] | None  # (profile, devices) per item
    nvlink: bool
    cpu: float
    memory_gib: float
    priority: int  # effective: aged while pending
    spot: str
    gang_mode: str  # zone | placement-group | instance
    pools: frozenset[str] | None
    regions: tuple[str, ...] | None
    clouds: frozenset[str] | None
    zones: frozenset[tuple[str, str]] | None  # (cloud, zone) within the data's max_latency_ms
    data_location: str | None
    data_gib: float
    hours: float
    running: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (job, host per item) of jobs running now
    base_priority: int = 0
    reshaped: frozenset[str] = frozenset()  # running jobs whose resources changed since they were placed: they restart
    licenses: tuple[tuple[str, int], ...] = ()  # (License, held per item) while it runs
    deadline_rank: int = 0  # within its class: above work without a deadline, the closer the higher (deadlines.py)
    deadline_critical: bool = False  # must start within its expected_hours: may use the on-demand buffer's capacity

    @property
    def gang(self) -> bool:
        return self.replicas > 1

    @property
    def klass(self) -> int:
        return priority_class(self.priority)

    @property
    def size(self) -> int:
        """Work units of one item: 7 per GPU (a MIG compute slice is 1), 1 for CPU work."""
        if self.mig is not None:
            return mig_compute(self.mig[0]) * self.mig[1]
        return 7 * self.gpus if self.gpus else 1

    @property
    def job_size(self) -> int:
        return self.size * self.replicas

    @property
    def weight(self) -> int:
        """Objective weight of one job inside its priority class."""
        return self.priority * self.job_size

    @property
    def running_jobs(self) -> int:
        return len(self.running)

    @property
    def running_items(self) -> int:
        """Items running now (a same-instance gang's replicas are one item)."""
        return sum(len(h) // self.bundle for _, h in self.running)

    def req(self, dim: str) -> float:
        if dim == "gpus":
            return self.gpus
        if dim == "cpu":
            return self.cpu
        if dim == "memory_gib":
            return self.memory_gib
        if self.mig is not None and dim == f"mig:{self.mig[0]}":
            return self.mig[1]
        return 0.0

    @property
    def dims(self) -> tuple[str, ...]:
        mig = (f"mig:{self.mig[0]}",) if self.mig else ()
        return (("gpus",) if self.gpus else ()) + mig + ("cpu", "memory_gib")


@dataclass(frozen=True)
class Capacity:
    """An existing instance (a host: instance_id set) or an offer of up to max_new new instances."""

    key: str
    pool: str
    provider: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    gpus: int  # physical GPUs
    gpu_type: str | None
    cpu: float
    memory_gib: float
    price: float  # USD per hour
    on_demand_price: float
    nvlink_domain: int = 1
    mig: tuple[str, ...] | None = None  # the per-GPU MIG layout of the pool
    instance_id: str | None = None
    max_new: int = 0
    keep_blocker: str | None = None  # existing: why it must go (pool removed, drifted from spec)
    residents: tuple[tuple[str, str, int], ...] = ()  # (demand key, job, items here)
    frozen: bool = False  # nothing can change here: kept, residents stay, nothing new lands
    members: tuple[str, ...] = ()  # a zone class: the offers (one per zone) it stands for
    reservation: str | None = None  # reserved capacity (a Reservation's name): price 0, its cost is committed
    price_source: str = ""  # where the price comes from, and its date (shown with the plan)

    @property
    def existing(self) -> bool:
        return self.instance_id is not None

    @property
    def offer_key(self) -> str:
        """The (pool, zone, type, market) class this capacity belongs to (a reservation's is its own)."""
        return f"{self.pool}/{self.zone}/{self.instance_type}/{self.market}" + (f"@{self.reservation}" if self.reservation else "")

    @property
    def class_key(self) -> str:
        """The same across the zones of a pool: (pool, type, market)."""
        return f"{self.pool}/*/{self.instance_type}/{self.market}" + (f"@{self.reservation}" if self.reservation else "")

    @property
    def site(self) -> tuple[str, str]:
        return (self.cloud, self.zone)

    def cap(self, dim: str) -> float:
        if dim == "gpus":
            return 0 if self.mig else self.gpus
        if dim == "cpu":
            return self.cpu
        if dim == "memory_gib":
            return self.memory_gib
        if dim.startswith("mig:") and self.mig:
            return self.gpus * self.mig.count(dim[4:])
        return 0.0


@dataclass(frozen=True)
class TenantRules:
    name: str
    weight: float
    cap: dict[str, float]  # hard ceilings (burst, else quota); a missing dimension is unlimited
    guarantee: dict[str, float]  # guaranteed amounts; a missing dimension is fully guaranteed
    budget: float | None = None  # USD/h of its replicas
    spot_fraction: float | None = None
    protected: int = 0  # work units of its running jobs inside its guarantee now
    protected_jobs: tuple[str, ...] = ()  # those jobs: no other tenant's work and no fleet limit may take them
    dominant: str = "gpus"  # the dimension its fair share is measured in


@dataclass(frozen=True)
class Problem:
    demands: tuple[Demand, ...]
    capacities: tuple[Capacity, ...]
    groups: dict[str, tuple[str, ...]]  # group key -> demand keys sharing placement variables
    pool_bounds: dict[str, tuple[int, int]]
    tenants: dict[str, TenantRules]
    desired_spot: SpotPolicySpec  # the SpotPolicy spec, a frozen model
    placement: PlacementPolicySpec
    budget: float | None
    fleet_capacity: dict[str, float]  # per dimension, for fair shares
    static_pending: dict[str, str] = field(default_factory=dict)  # job -> why nothing can ever host it
    job_remaining: dict[str, float] = field(default_factory=dict)  # running job -> expected hours left
    coef: dict[tuple[str, str], float] = field(default_factory=dict)  # (demand, zone site) -> USD/h per item
    now: datetime | None = None
    licenses: dict[str, LicenseRules] = field(default_factory=dict)
    reservations: dict[str, ReservationRules] = field(default_factory=dict)  # the active ones
    deadlines: dict[str, tuple[datetime, float]] = field(default_factory=dict)  # job -> (deadline, hours it still needs)
    quotas: tuple = ()  # providers.base.Quota: the cloud account quotas some offer's new instances count against
    quota_floors: dict[str, str] = field(default_factory=dict)  # pool -> why its min_instances was lowered to fit a quota
    gpu_fleet: bool | None = None  # do the fleet's pools offer GPUs (the spot share counts GPUs)? None: read the capacities

    @property
    def spot(self) -> SpotPolicySpec:
        return self.desired_spot

    def demand(self, key: str) -> Demand:
        return self._demand_index[key]

    @property
    def _demand_index(self) -> dict[str, Demand]:
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = {d.key: d for d in self.demands}
            object.__setattr__(self, "_idx", idx)
        return idx

    def hosts(self) -> list[Capacity]:
        return [c for c in self.capacities if c.existing]

    def offers(self) -> list[Capacity]:
        return [c for c in self.capacities if not c.existing]

    def cost_coef(self, d: Demand, c: Capacity) -> float:
        """USD/h per item of d on c beyond the instance price: data egress, latency, and the
        premium a spot-preferred job pays for falling back to on-demand."""
        v = self.coef.get((d.key, f"{c.cloud}/{c.zone}"), 0.0)
        if d.spot == "preferred" and c.market != "spot":
            v += 0.5 * c.on_demand_price * share(d, c)
        return v


def share(d: Demand, c: Capacity) -> float:
    """The fraction of an instance one item of d uses, in the instance's primary resource:
    what its cost is attributed by (status, tenant budgets): the ledger's definition."""
    return item_share(d, c)


def spot_measure(capacities, gpu_fleet: bool | None = None) -> tuple[str, Callable[[Capacity], float]]:
    """What the spot share and the on-demand buffer count, one definition for the solver, the
    warm start, the packer and the freezer: GPUs in a GPU fleet (CPU instances count 0), vCPUs in
    a CPU-only fleet (ledger.spot_units). Returns the dimension and the measure of an instance."""
    return spot_units(capacities, gpu_fleet)


def has_room(free: dict[str, float], smallest: dict[str, float]) -> bool:
    """Could the smallest item still fit in what is free? `smallest` is, per dimension, the least
    any item asks. GPUs, vCPU and memory are needed together; a MIG item needs devices of its own
    profile only, so room in one profile is enough."""
    mig = [k for k, v in smallest.items() if k.startswith("mig:") and v > 0]
    if mig and not any(free.get(k, 0.0) >= smallest[k] - 1e-9 for k in mig):
        return False
    return all(free.get(k, 0.0) >= v - 1e-9 for k, v in smallest.items() if v > 0 and not k.startswith("mig:"))


def rules_allow(d: Demand, c: Capacity) -> bool:
    """Every placement rule but size: GPU model, MIG, NVLink, spot, pools, regions, clouds, latency."""
    return placement_refusal(d, c) is None


def placement_refusal(d: Demand, c: Capacity) -> str | None:
    """The placement rule (rules_allow's) that keeps d off c, in words; None if none does."""
    if d.mig is not None:
        if c.gpu_type != d.gpu_type or not c.mig or d.mig[0] not in c.mig:
            return f"its instance does not offer MIG {d.mig[0]} of {d.gpu_type}"
    elif d.gpus > 0:
        if c.gpu_type != d.gpu_type or c.mig or c.gpus < d.gpus:
            return f"its instance does not offer {d.gpus} whole {d.gpu_type} GPUs"
        if d.nvlink and c.nvlink_domain < d.gpus // d.bundle:
            return "its instance has no NVLink domain large enough"
    elif c.gpus > 0:
        return "CPU work does not run on GPU instances"  # tainted for GPU work, as GPU node pools usually are
    if d.spot == "never" and c.market == "spot" or d.spot == "required" and c.market != "spot":
        return f"the job's spot: {d.spot} excludes {c.market} instances"
    if d.pools is not None and c.pool not in d.pools:
        return f"the job's pools allowlist ({', '.join(sorted(d.pools))}) excludes pool {c.pool}"
    if d.clouds is not None and c.cloud not in d.clouds:
        return f"the job's clouds allowlist ({', '.join(sorted(d.clouds))}) excludes {c.cloud}"
    if d.regions is not None and not region_matches(list(d.regions), c.cloud, c.region):
        return f"the job's regions allowlist ({', '.join(d.regions)}) excludes {c.cloud}/{c.region}"
    if d.zones is not None and (c.cloud, c.zone) not in d.zones:
        return f"{c.cloud}/{c.zone} is beyond the data's max_latency_ms"
    return None


def fit(d: Demand, c: Capacity) -> int:
    """How many items of d fit on one empty instance of c, honouring every placement rule (0: none)."""
    if not rules_allow(d, c):
        return 0
    n = min(math.floor(c.cap(dim) / d.req(dim) + 1e-9) for dim in d.dims if d.req(dim) > 0)
    return max(0, n)


def fit_shape(d: Demand) -> tuple:
    """Everything of a demand that fit() reads: demands alike in these fit every offer alike (a 10k-job
    fleet has ~7,500 demands but a few hundred shapes)."""
    return (d.mig, d.gpu_type, d.gpus, d.nvlink, d.bundle, d.spot, d.pools, d.clouds, d.regions, d.zones, d.cpu, d.memory_gib)


class OfferFits:
    """fit(d, c) asked once per (demand shape, offer key): it reads only what the offer key fixes (pool,
    zone, type, market) and the demand's fit_shape, so every instance of an offer answers alike, and
    so does every demand of one shape; a 10k-instance fleet asks it ~1M times otherwise (and greedy,
    which asks each demand against every offer, 1.6M times at 10k jobs)."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, str], int] = {}
        self.shape_of: dict[str, int] = {}  # demand key -> its shape's number
        self.shapes: dict[tuple, int] = {}

    def __call__(self, d: Demand, c: Capacity) -> int:
        return self.at(d, c.offer_key, c)

    def shape(self, d: Demand) -> int:
        """The number of d's fit_shape (demands of one shape share it)."""
        s = self.shape_of.get(d.key)
        if s is None:
            s = self.shape_of[d.key] = self.shapes.setdefault(fit_shape(d), len(self.shapes))
        return s

    def at(self, d: Demand, offer_key: str, c: Capacity) -> int:
        """fit(d, c) where the caller knows c's offer key (building it is a third of a lookup's cost)."""
        k = (self.shape(d), offer_key)
        f = self.known.get(k)
        if f is None:
            f = self.known[k] = fit(d, c)
        return f


# ---------------------------------------------------------------- demands


SHAPE_FIELDS = ("gpus", "gpu_type", "mig", "nvlink", "cpu", "memory_gib")


def shape_of(job: Job) -> dict:
    """What one replica of a job runs with, as apply records it (state `shapes`): a change in
    any of these restarts the job (in place when the new shape fits there)."""
    r = job.spec.resources
    return {"gpus": r.gpus, "gpu_type": r.gpu_type, "mig": f"{r.mig.count}x {r.mig.profile}" if r.mig else None,
            "nvlink": r.nvlink, "cpu": r.cpu, "memory_gib": r.memory_gib}


def shape_changes(job: Job, observed: Observed) -> tuple[str, ...]:
    """The resource fields of a running job that differ from the shape it was placed with, as
    "field old -> new" (empty: unchanged, or no shape recorded, e.g. a state from before shapes)."""
    old = getattr(observed, "shapes", {}).get(job.name)
    if not old or not observed.placements.get(job.name):
        return ()
    new = shape_of(job)
    return tuple(f"{k} {old.get(k)} -> {new[k]}" for k in SHAPE_FIELDS if k in old and old.get(k) != new[k])


def _utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def effective_priority(job: Job, running: bool, now: datetime | None, aging) -> int:
    """Pending jobs climb one class (x10) per aging.step_hours since `submitted`, up to
    aging.max_priority, so nothing starves; running jobs keep their own priority."""
    base = job.spec.priority_weight()
    sub = _utc(job.spec.submitted)
    if running or sub is None or now is None:
        return base
    steps = int(max(0.0, (now - sub).total_seconds() / 3600) // aging.step_hours)
    if steps <= 0:
        return base
    ceiling = PRIORITY_CLASSES[aging.max_priority]
    return max(base, min(base * 10 ** min(steps, 6), ceiling))


def _demands(desired: DesiredState, observed: Observed, now: datetime | None, topo: TopologyIndex) -> list[Demand]:
    groups: dict[tuple, list[Job]] = {}
    eff: dict[str, int] = {}
    aging = desired.placement.aging
    for job in desired.jobs.values():
        s = job.spec
        running = bool(observed.placements.get(job.name))
        eff[job.name] = effective_priority(job, running, now, aging)
        r = s.resources
        sig = (
            s.tenant, r.gpus, r.gpu_type, (r.mig.profile, r.mig.count) if r.mig else None, r.nvlink, r.cpu, r.memory_gib,
            s.replicas, eff[job.name], s.spot, tuple(sorted(s.pools)) if s.pools is not None else None,
            tuple(sorted(s.regions)) if s.regions is not None else None, tuple(sorted(s.clouds)) if s.clouds is not None else None,
            (s.data.location, s.data.size_gib, s.data.max_latency_ms) if s.data else None, s.expected_hours,
            tuple(sorted(s.licenses.items())), s.deadline,
        )
        key = ("gang", job.name) if s.replicas > 1 else sig  # gangs stay individual: zone choice is per gang
        groups.setdefault(key, []).append(job)
    out = []
    zones_all = [tuple(z.split("/")) for z in topo.zones]  # cloud/region/zone
    for i, (_, jobs) in enumerate(sorted(groups.items(), key=lambda kv: kv[1][0].name)):
        s = jobs[0].spec
        r = s.resources
        bundle = s.replicas if (s.gang == "instance" and s.replicas > 1) else 1
        items = s.replicas // bundle
        zones = None
        if s.data is not None and s.data.max_latency_ms is not None:
            zones = frozenset((c, z) for c, rg, z in zones_all
                              if topo.distance(s.data.location, c, rg, z).latency_ms <= s.data.max_latency_ms + 1e-9)
        running = tuple(
            (j.name, tuple(observed.placements[j.name])) for j in jobs if observed.placements.get(j.name)
        )
        reshaped = frozenset(j.name for j in jobs if shape_changes(j, observed))
        out.append(Demand(
            key=f"d{i}:{jobs[0].name}", jobs=tuple(j.name for j in jobs), replicas=items, bundle=bundle, tenant=s.tenant,
            gpus=r.gpus * bundle, gpu_type=r.gpu_type, mig=(r.mig.profile, r.mig.count * bundle) if r.mig else None,
            nvlink=r.nvlink, cpu=r.cpu * bundle, memory_gib=r.memory_gib * bundle, priority=eff[jobs[0].name],
            base_priority=s.priority_weight(), spot=s.spot, gang_mode=s.gang if s.replicas > 1 else "zone",
            pools=frozenset(s.pools) if s.pools is not None else None,
            regions=tuple(s.regions) if s.regions is not None else None,
            clouds=frozenset(s.clouds) if s.clouds is not None else None, zones=zones,
            data_location=s.data.location if s.data else None, data_gib=s.data.size_gib if s.data else 0.0,
            hours=s.expected_hours, running=running, reshaped=reshaped,
            licenses=tuple((n, k * bundle) for n, k in sorted(s.licenses.items())),
        ))
    latest = {d.key: start_by(desired.jobs[d.jobs[0]].spec.deadline, d.hours) for d in out if desired.jobs[d.jobs[0]].spec.deadline is not None}
    if latest:
        ranked = ranks(latest, {d.key: d.hours for d in out}, now)
        out = [replace(d, deadline_rank=ranked[d.key][0], deadline_critical=ranked[d.key][1]) if d.key in ranked else d for d in out]
    return out


def _group_key(d: Demand, tenant_split: set[str]) -> tuple:
    """Demands with equal keys are interchangeable for every constraint that reads placement
    variables, so they share them (exact). Gangs stay alone: each picks its own zone."""
    if d.gang:
        return ("gang", d.key)
    return (d.gpus, d.gpu_type, d.mig, d.nvlink, d.cpu, d.memory_gib, d.spot, d.pools, d.regions, d.clouds, d.zones,
            d.data_location, d.data_gib, d.hours, d.tenant if d.tenant in tenant_split else None, d.deadline_critical)


# ---------------------------------------------------------------- capacity


def _offering_lookup(observed: Observed, catalog):
    by_key = {(po.offering.cloud, po.offering.zone, po.offering.instance_type): po.offering for po in observed.offerings}

    def lookup(cloud: str, region: str, zone: str, itype: str):
        return by_key.get((cloud, zone, itype)) or catalog.offering(cloud, region, zone, itype)
    return lookup


def _hosts(desired: DesiredState, observed: Observed, demands: list[Demand], catalog) -> list[Capacity]:
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
        elif not region_matches(guard.allowed_regions, inst.cloud, inst.region):
            blocker = f"region {inst.cloud}/{inst.region} not allowed by the GuardrailPolicy"
        elif guard.allowed_clouds is not None and inst.cloud not in guard.allowed_clouds:
            blocker = f"cloud {inst.cloud} not allowed by the GuardrailPolicy"
        od = off.on_demand_price if off else 0.0
        price = off.spot_price if inst.market == "spot" and off and off.spot_price is not None else od
        res = tuple(sorted((dk, job, n) for (dk, job), n in residents.get(inst.id, {}).items()))
        # A same-instance gang is one item (of `bundle` replicas).
        res = tuple((dk, job, n // job_demand[job].bundle) for dk, job, n in res)
        hosts.append(Capacity(
            key=inst.id, pool=inst.pool, provider=inst.provider, cloud=inst.cloud, region=inst.region, zone=inst.zone,
            instance_type=inst.instance_type, market=inst.market, gpus=off.gpus if off else 0,
            gpu_type=off.gpu_type if off else None, cpu=off.cpu if off else 0, memory_gib=off.memory_gib if off else 0,
            price=price, on_demand_price=od, nvlink_domain=getattr(off, "nvlink_domain", 1) if off else 1,
            mig=tuple(pool.spec.mig) if pool is not None and pool.spec.mig else None,
            instance_id=inst.id, keep_blocker=blocker, residents=res,
        ))
    return hosts


def _offers(desired: DesiredState, observed: Observed, default_provider: str) -> list[Capacity]:
    guard, spot = desired.guardrails, desired.spot_policy
    offers = []
    for po in observed.offerings:
        pool = desired.pools[po.pool]
        o = po.offering
        if not o.available or not region_matches(guard.allowed_regions, o.cloud, o.region):
            continue
        if guard.allowed_clouds is not None and o.cloud not in guard.allowed_clouds:
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
                nvlink_domain=getattr(o, "nvlink_domain", 1), mig=tuple(pool.spec.mig) if pool.spec.mig else None,
                price_source=price_label(o),
            ))
    return offers


def _reservations(desired: DesiredState, now: datetime | None) -> dict[str, ReservationRules]:
    """The Reservations in force at `now` (all of them without a time), with the pool each fills."""
    out = {}
    for name, r in desired.reservations.items():
        s = r.spec
        until = s.until if isinstance(s.until, datetime) or s.until is None else datetime(s.until.year, s.until.month, s.until.day)
        if until is not None and now is not None and _utc(until) <= now:
            continue
        pool = s.pool or next((p.name for p in desired.pools.values() if p.spec.cloud == s.cloud and p.spec.region == s.region
                                and s.zone in p.spec.zones and s.instance_type in p.spec.instance_types and "on-demand" in p.spec.markets()), None)
        if pool is None:
            continue
        out[name] = ReservationRules(name, pool, s.cloud, s.region, s.zone, s.instance_type, s.count, s.hourly_cost,
                                     s.target.reservation_id if s.target else None, until.isoformat() if until else None)
    return out


def _reserved_hosts(hosts: list[Capacity], observed: Observed, reservations: dict[str, ReservationRules]) -> list[Capacity]:
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
            h = Capacity(**{**h.__dict__, "price": 0.0, "reservation": r.name})
        out.append(h)
    order = {h.key: i for i, h in enumerate(hosts)}
    return sorted(out, key=lambda h: order[h.key])


def _reserved_offers(desired: DesiredState, observed: Observed, default_provider: str, reservations: dict[str, ReservationRules],
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
        if o is None or left <= 0 or not region_matches(guard.allowed_regions, o.cloud, o.region) \
                or (guard.allowed_clouds is not None and o.cloud not in guard.allowed_clouds) \
                or (o.cloud, o.zone, o.instance_type, "on-demand") in observed.short:
            continue  # (a reservation's capacity is held for it: only a provider that says so makes it short)
        pool = desired.pools[r.pool]
        out.append(Capacity(
            key=f"{r.pool}/{o.zone}/{o.instance_type}/on-demand@{name}", pool=r.pool,
            provider=observed.providers.get(r.pool, default_provider), cloud=o.cloud, region=o.region, zone=o.zone,
            instance_type=o.instance_type, market="on-demand", gpus=o.gpus, gpu_type=o.gpu_type, cpu=o.cpu,
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


def _size_offers(offers: list[Capacity], demands: list[Demand], pool_bounds: dict[str, tuple[int, int]],
                 spot=None, hosts: list[Capacity] = (), gpu_fleet: bool | None = None) -> list[Capacity]:
    """Bound each offer's count: no optimum buys more instances of it than its compatible items
    need one by one (or the pool minimum), nor more than the pool allows; unless those bounds
    leave no room for the idle on-demand capacity the SpotPolicy's spot share and on-demand
    buffer ask for (`_ballast_bound`)."""
    by_type: dict[tuple, list[Demand]] = {}
    for d in demands:
        by_type.setdefault(type_class(d), []).append(d)
    fits = OfferFits()
    bounds: dict[str, int] = {}
    on_demand_items: dict[str, Demand] = {}  # demands some on-demand offer fits
    for c in offers:
        bound = 0
        okey = c.offer_key
        for d in by_type.get(type_class(c), []):
            f = fits.at(d, okey, c)
            if f:
                bound += math.ceil(len(d.jobs) * d.replicas / f)
                if c.market != "spot":
                    on_demand_items[d.key] = d
        bounds[c.key] = bound
    extra = _ballast_bound(offers, hosts, bounds, pool_bounds, spot, list(on_demand_items.values()), gpu_fleet)
    sized = []
    for c in offers:
        lo, hi = pool_bounds[c.pool]
        n = min(max(bounds[c.key] + extra(c), lo), hi)
        if c.reservation:
            n = min(n, c.max_new)  # what is left of the reservation
        if n > 0:
            sized.append(Capacity(**{**c.__dict__, "max_new": n}))
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


# ---------------------------------------------------------------- tenants


def _split(d: Demand, iids, host_of: dict[str, Capacity]) -> bool:
    """Does a gang run split as the config no longer allows (over zones; a same-instance gang over instances)?"""
    if not d.gang:
        return False
    return len({(host_of[i].cloud, host_of[i].zone) for i in iids}) > 1 or (d.bundle > 1 and len(set(iids)) > 1)


def _tenants(desired: DesiredState, demands: list[Demand], hosts: list[Capacity], fleet_capacity: dict[str, float]) -> dict[str, TenantRules]:
    by_tenant: dict[str, list[Demand]] = {}
    for d in demands:
        by_tenant.setdefault(d.tenant, []).append(d)
    host_of = {h.instance_id: h for h in hosts}
    out = {}
    for name, t in desired.tenants.items():
        q = t.spec.quota
        cap = {dim: q.cap(dim) for dim in DIMS if q.cap(dim) is not None}
        guarantee = {dim: quota_guarantee(q, dim) for dim in DIMS if quota_guarantee(q, dim) is not None}
        # Protected: its running jobs, highest priority first, while they stay inside the guarantee.
        used = {dim: 0.0 for dim in DIMS}
        protected = 0
        # Only jobs running whole in the shape they ask for now: a gang grown by a replica (or a
        # job whose resources changed) needs capacity it does not hold, which is new work. Counted
        # at its new size, it outweighed other tenants' guaranteed work in this sum (a vision gang
        # grown from 2 to 3 x 8 GPUs evicted nlp's critical MIG job and infra's CPU job to fit the
        # fleet budget and max_instances: issue 18).
        # Nor a job that cannot stay where it runs (its instance must go or no longer allows it): counted, it
        # made a job that can stay look borrowed (found by the property tier).
        # Nor a gang running split (over zones, or a same-instance gang over instances): it must move whole.
        running = sorted(((d, job) for d in by_tenant.get(name, []) for job, iids in d.running
                          if len(iids) == d.replicas * d.bundle and job not in d.reshaped
                          and all(i in host_of and host_of[i].keep_blocker is None and placement_refusal(d, host_of[i]) is None
                                  for i in iids) and not _split(d, iids, host_of)),
                         key=lambda dj: (-dj[0].priority, dj[1]))
        kept: list[str] = []
        for d, job in running:
            need = {dim: d.req(dim) * d.replicas for dim in DIMS}
            if all(quota_ok(used[k], need[k], guarantee[k]) for k in guarantee):
                for k in DIMS:
                    used[k] += need[k]
                protected += d.job_size
                kept.append(job)
        # Fair share is measured in the dimension its own demand weighs most on.
        demand_dim = {dim: sum(d.req(dim) * d.replicas * len(d.jobs) for d in by_tenant.get(name, [])) / fleet_capacity[dim]
                      if fleet_capacity.get(dim) else 0.0 for dim in DIMS}
        dominant = max(DIMS, key=lambda k: (demand_dim[k], k == "gpus"))
        out[name] = TenantRules(
            name=name, weight=t.spec.weight, cap=cap, guarantee=guarantee,
            budget=desired.guardrails.tenant_hourly_budgets.get(name),
            spot_fraction=desired.spot_policy.tenant_max_spot_fraction.get(name),
            protected=protected, protected_jobs=tuple(kept), dominant=dominant,
        )
    return out


# ---------------------------------------------------------------- freezing


def _running_use(demands) -> dict[str, dict[str, float]]:
    use: dict[str, dict[str, float]] = {}
    for d in demands:
        u = use.setdefault(d.tenant, {k: 0.0 for k in DIMS})
        for k in DIMS:
            u[k] += d.req(k) * d.running_items
    return use


def borrowing_tenants(demands: list[Demand] | tuple[Demand, ...], tenants: dict[str, TenantRules]) -> set[str]:
    """Tenants whose running work exceeds their guarantee now: the excess may be reclaimed."""
    use = _running_use(demands)
    return {t for t, r in tenants.items() if not all(quota_ok(use.get(t, {}).get(k, 0.0), 0.0, v) for k, v in r.guarantee.items())}


def over_cap_tenants(demands: list[Demand] | tuple[Demand, ...], tenants: dict[str, TenantRules]) -> set[str]:
    """Tenants whose running work exceeds their ceiling now (a quota was lowered): some of it must go."""
    use = _running_use(demands)
    return {t for t, r in tenants.items() if not all(quota_ok(use.get(t, {}).get(k, 0.0), 0.0, v) for k, v in r.cap.items())}


def forced_moves(problem: "Problem") -> dict[str, int]:
    """Items of each demand that must leave their instance whatever is decided (it goes, or they
    no longer fit there): under WhenEmpty, the only running work that may move."""
    by_key = {d.key: d for d in problem.demands}
    hosts = {c.instance_id: c for c in problem.capacities if c.existing}
    # A running gang that breaks its gang mode as it runs (replicas in two zones, say) moves whole.
    split = {(d.key, job) for d in problem.demands if d.gang for job, iids in d.running if gang_split(d, [hosts.get(i) for i in iids])}
    out: dict[str, int] = {}
    for h in problem.capacities:
        if h.existing:
            for dk, job, n in h.residents:
                if dk in by_key and (h.keep_blocker is not None or fit(by_key[dk], h) == 0 or (dk, job) in split):
                    out[dk] = out.get(dk, 0) + n
    return out


def stuck_gangs(p: "Problem") -> set[str]:
    """Under WhenEmpty, running gangs none of whose items must leave their instance: the model
    lets them stay or stop, never move (`_Model._moves`); greedy and pending reasons alike."""
    if p.placement.consolidation != "WhenEmpty":
        return set()
    forced = forced_moves(p)
    return {d.key for d in p.demands if d.gang and d.running_jobs and d.key not in forced}


def gang_split(d: Demand, hosts: list) -> bool:
    """Do a running gang's hosts break its gang mode: one zone; one instance (instance); one type (placement-group)?"""
    if any(h is None for h in hosts):
        return False  # (a lost host: the gang is healed around its survivors)
    if len({(h.cloud, h.zone) for h in hosts}) > 1:
        return True
    if d.gang_mode == "instance":
        return len({h.instance_id for h in hosts}) > 1
    return d.gang_mode == "placement-group" and len({h.instance_type for h in hosts}) > 1


def may_preempt(p: Demand, r: Demand, borrowing: set[str], preemption: str) -> bool:
    """Could pending work p ever evict running work r? Inside one tenant, a higher class may
    (PlacementPolicy preemption: LowerPriority); across tenants only borrowed work is taken,
    to give a guarantee back or to a higher class. Guaranteed work is never taken by others."""
    if p.tenant == r.tenant:
        return preemption == "LowerPriority" and p.klass > r.klass
    return r.tenant in borrowing and (p.tenant not in borrowing or p.klass > r.klass)


def type_class(x) -> tuple:
    """(GPU model or None for CPU-only, MIG or not): capacity and work of different classes never meet."""
    if isinstance(x, Capacity):
        return (x.gpu_type if x.gpus else None, bool(x.mig))
    return (x.gpu_type if (x.gpus or x.mig) else None, x.mig is not None)


def _frozen(hosts: list[Capacity], offers: list[Capacity], demands: list[Demand], desired: DesiredState,
            tenants: dict[str, TenantRules], pool_bounds: dict[str, tuple[int, int]], gpu_fleet: bool | None = None) -> set[str]:
    """Hosts no decision can change, solved as constants. A host is frozen only when it is
    keepable and full (no compatible item fits in what is free), its residents all fit and
    may stay, no pending work may evict them (`may_preempt`), moving them to their cheapest
    capacity would not save (consolidation), and no fleet-wide rule is broken now (pool max,
    budgets, quotas, spot rules). Everything else is solved. Checks are by GPU model, not by
    pool or region, so they err towards solving more."""
    by_key = {d.key: d for d in demands}
    pending = [d for d in demands if d.running_jobs < len(d.jobs) or d.running_items < d.running_jobs * d.replicas]
    # Fleet-wide states that force a look at everything.
    if not budget_ok(sum(h.price for h in hosts), desired.guardrails.max_hourly_budget):
        return set()
    sp = desired.spot_policy
    _, prim = spot_measure(hosts + offers, gpu_fleet)
    spot_p = sum(prim(h) for h in hosts if h.market == "spot")
    total_p = sum(prim(h) for h in hosts)
    spot_rules = sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 or sp.min_zones > 1
    unfrozen_markets = {"spot", "on-demand"} if (spot_rules or not spot_share_ok(spot_p, total_p, sp.max_spot_fraction)) else set()
    per_pool: dict[str, int] = {}
    for h in hosts:
        per_pool[h.pool] = per_pool.get(h.pool, 0) + 1
    over_pools = {p for p, n in per_pool.items() if p in pool_bounds and not pool_ok(n, 0, pool_bounds[p][1])}
    # Tenants over a cap now, or with budgets or spot shares (which tie all their work together).
    hot = over_cap_tenants(demands, tenants) | {t for t, r in tenants.items() if r.budget is not None or r.spot_fraction is not None}
    borrowing = borrowing_tenants(demands, tenants)
    preemption = desired.placement.preemption
    # Per GPU model: the smallest item any demand asks (what "room" means), and who is pending.
    smallest: dict[tuple, dict[str, float]] = {}
    for d in demands:
        cur = smallest.setdefault(type_class(d), {})
        for k in d.dims:
            cur[k] = min(cur.get(k, math.inf), d.req(k))
    pending_by_type: dict[tuple, set[tuple[str, int]]] = {}
    for d in pending:
        pending_by_type.setdefault(type_class(d), set()).add((d.tenant, d.klass))
    # The cheapest $/h per item of each demand on any offer: what consolidation would pay.
    slice_price: dict[str, float] = {}
    consolidate = desired.placement.consolidation == "WhenUnderutilized"
    if consolidate:
        by_type: dict[tuple, list[Capacity]] = {}
        for o in offers:
            by_type.setdefault(type_class(o), []).append(o)
        for d in demands:
            if d.running:
                best = math.inf
                for o in by_type.get(type_class(d), []):
                    f = fit(d, o)
                    if f:
                        best = min(best, o.price / f)
                slice_price[d.key] = best

    wanted_licenses = {n for d in pending for n, _ in d.licenses}
    fits_on = OfferFits()
    frozen = set()
    for h in hosts:
        if h.keep_blocker is not None or h.pool in over_pools or h.market in unfrozen_markets or not h.residents:
            continue
        res = [(by_key[dk], n) for dk, _, n in h.residents if dk in by_key]
        if len(res) != len(h.residents) or any(fits_on(d, h) == 0 for d, _ in res):
            continue
        if any(d.tenant in hot for d, _ in res):
            continue
        if any(d.gang and d.running_items < d.running_jobs * d.replicas for d, _ in res):
            continue  # a gang that lost a replica is healed around its survivors
        if any(job in by_key[dk].reshaped for dk, job, _ in h.residents):
            continue  # a job whose resources changed restarts
        if any(n in wanted_licenses for d, _ in res for n, _ in d.licenses):
            continue  # pending work waits for a license it holds: preemption may take it
        tc = type_class(h)
        dims = ("gpus", "cpu", "memory_gib", *{f"mig:{p}" for p in h.mig or ()})
        free = {k: h.cap(k) - sum(d.req(k) * n for d, n in res) for k in dims}
        need = smallest.get(tc)
        if need and has_room(free, need):
            continue  # room for more
        rivals = pending_by_type.get(tc, ())
        if any(may_preempt(Rival(t, c), d, borrowing, preemption) for t, c in rivals for d, _ in res):
            continue
        if consolidate and sum(slice_price.get(d.key, math.inf) * n for d, n in res) < h.price * 0.97:
            continue  # its work fits more cheaply elsewhere
        frozen.add(h.instance_id)
    return frozen


@dataclass(frozen=True)
class Rival:
    """The part of a demand `may_preempt` reads: its tenant and class."""

    tenant: str
    klass: int


# ---------------------------------------------------------------- the problem


def build_problem(desired: DesiredState, observed: Observed, default_provider: str = "sim", now: datetime | None = None,
                  freeze: bool | None = None) -> Problem:
    """`now` drives priority aging and remaining times (None: no aging). `freeze`: True or
    False forces freezing of unchangeable hosts on or off; None freezes above FREEZE_ABOVE hosts."""
    catalog = load_catalog()
    topo = TopologyIndex(desired.topology.spec)
    demands = _demands(desired, observed, now, topo)
    pool_bounds = {n: (p.spec.min_instances, p.spec.max_instances) for n, p in desired.pools.items()}
    reservations = _reservations(desired, now)
    hosts = _reserved_hosts(_hosts(desired, observed, demands, catalog), observed, reservations)
    # The spot share counts GPUs when the fleet's pools offer any GPU type (or a GPU instance runs), whatever
    # the plan can buy or use now (ledger.spot_units).
    gpu_fleet = any(po.offering.gpus for po in observed.offerings) or any(h.gpus for h in hosts)
    offers = _size_offers(_offers(desired, observed, default_provider) + _reserved_offers(desired, observed, default_provider, reservations, hosts),
                          demands, pool_bounds, desired.spot_policy, hosts, gpu_fleet)
    quotas = _cloud_quotas(observed, offers)
    pool_bounds, quota_floors = _quota_floors(pool_bounds, hosts, offers, quotas)

    fleet_capacity = {dim: 0.0 for dim in DIMS}
    best: dict[tuple[str, str], float] = {}
    for c in offers + hosts:
        for dim in DIMS:
            best[(c.pool, dim)] = max(best.get((c.pool, dim), 0.0), c.cap(dim))
    for (pool, dim), v in best.items():
        fleet_capacity[dim] += v * pool_bounds.get(pool, (0, 1))[1]
    tenants = _tenants(desired, demands, hosts, fleet_capacity)

    if freeze or (freeze is None and len(hosts) > FREEZE_ABOVE):
        frozen = _frozen(hosts, offers, demands, desired, tenants, pool_bounds, gpu_fleet)
        hosts = [Capacity(**{**h.__dict__, "frozen": True}) if h.instance_id in frozen else h for h in hosts]

    split = {t for t, r in tenants.items() if r.budget is not None or r.spot_fraction is not None}
    groups: dict[tuple, list[str]] = {}
    for d in demands:
        groups.setdefault(_group_key(d, split), []).append(d.key)
    group_map = {f"g{i}": tuple(keys) for i, keys in enumerate(groups.values())}

    # Data egress and latency, per item-hour, for every zone a demand could use.
    coef: dict[tuple[str, str], float] = {}
    lat_cost = desired.placement.latency_cost_per_ms
    sites = {(c.cloud, c.region, c.zone) for c in offers + hosts}
    for d in demands:
        if not d.data_location:
            continue
        for cloud, region, zone in sites:
            dist = topo.distance(d.data_location, cloud, region, zone)
            v = 0.0
            if d.data_gib > 0:
                v += dist.egress_per_gb * d.data_gib / d.hours / d.replicas  # the data set is read once per job
            if lat_cost > 0 and math.isfinite(dist.latency_ms):
                v += lat_cost * dist.latency_ms * d.bundle
            if v:
                coef[(d.key, f"{cloud}/{zone}")] = v

    # Expected hours left for running jobs: the victim order of preemption.
    launched = {i.id: _parse_time(i.launched_at) for i in observed.instances}
    job_remaining = {}
    for d in demands:
        for job, iids in d.running:
            start = min((launched.get(i) for i in iids if launched.get(i)), default=None)
            ran = (now - start).total_seconds() / 3600 if (now and start) else 0.0
            job_remaining[job] = max(0.0, d.hours - ran)
    deadlines = {j: (desired.jobs[j].spec.deadline, job_remaining.get(j, d.hours)) for d in demands for j in d.jobs
                 if desired.jobs[j].spec.deadline is not None}

    caps = hosts + offers
    static_pending = {}
    shapes_by_type: dict[tuple, dict[str, Capacity]] = {}  # one capacity per offer key: fit() reads nothing else
    for c in caps:
        if c.keep_blocker is None:
            shapes_by_type.setdefault(type_class(c), {}).setdefault(c.offer_key, c)
    for d in demands:
        if not any(fit(d, c) > 0 for c in shapes_by_type.get(type_class(d), {}).values()):
            reason = _why_nothing_fits(d, desired, observed, offers)
            for j in d.jobs:
                static_pending[j] = reason

    return Problem(
        demands=tuple(demands), capacities=tuple(caps), groups=group_map, pool_bounds=pool_bounds, tenants=tenants,
        desired_spot=desired.spot_policy, placement=desired.placement, budget=desired.guardrails.max_hourly_budget,
        fleet_capacity=fleet_capacity, static_pending=static_pending, job_remaining=job_remaining, coef=coef, now=now,
        licenses=_licenses(desired), reservations=reservations, deadlines=deadlines, quotas=quotas, quota_floors=quota_floors,
        gpu_fleet=gpu_fleet,
    )


def _quota_floors(pool_bounds: dict[str, tuple[int, int]], hosts: list[Capacity], offers: list[Capacity],
                  quotas: tuple) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """A pool minimum the account's quotas leave no room to launch is lowered to what they allow (a quota limits
    launches; a minimum it blocks would leave no plan at all): pools in name order, each filling its minimum from its
    cheapest offers while the quotas (shared between pools) have room. Returns the bounds and, per lowered pool, why."""
    if not quotas:
        return pool_bounds, {}
    book = QuotaBook(quotas)
    have: dict[str, int] = {}
    for h in hosts:
        if h.keep_blocker is None:
            have[h.pool] = have.get(h.pool, 0) + 1
    bounds, why = dict(pool_bounds), {}
    for pool in sorted(pool_bounds):
        lo, hi = pool_bounds[pool]
        need, got, blocked = lo - have.get(pool, 0), 0, None
        for o in sorted((o for o in offers if o.pool == pool), key=lambda o: (o.price, o.key)):
            for _ in range(min(o.max_new, max(0, need - got))):
                over = book.short(o)
                if over is not None:
                    blocked = blocked or quota_scope(book.quotas[over[0]])
                    break
                book.take(o)
                got += 1
        if need > 0 and got < need and blocked:
            bounds[pool] = (lo - (need - got), hi)
            why[pool] = f"pool {pool}: min_instances {lo} lowered to {lo - (need - got)}: cloud quota {blocked} has no room for more"
    return bounds, why


def _cloud_quotas(observed: Observed, offers: list[Capacity]) -> tuple:
    """The quotas providers read that some offer's new instances count against (the others cannot bind)."""
    return tuple(q for q in sorted(getattr(observed, "quotas", ()), key=lambda q: (q.cloud, q.region, q.name))
                 if any(quota_units(q, c) for c in offers))


def _licenses(desired: DesiredState) -> dict[str, LicenseRules]:
    return {n: LicenseRules(n, lic.spec.count, dict(lic.spec.tenant_quotas), lic.spec.cost_per_hour) for n, lic in desired.licenses.items()}


def _parse_time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        return _utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return None


def _why_nothing_fits(d: Demand, desired: DesiredState, observed: Observed, offers: list[Capacity]) -> str:
    """The first rule, in the order a user would check them, that leaves no capacity."""
    if d.mig:
        what = f"{d.mig[1]}x MIG {d.mig[0]} of {d.gpu_type}"
    else:
        what = f"{d.gpus}x {d.gpu_type}" if d.gpus else f"{d.cpu:g} vCPU / {d.memory_gib:g} GiB (CPU-only)"
    shapes: dict[str, list] = {}  # pool -> the offerings its provider reports
    for po in observed.offerings:
        shapes.setdefault(po.pool, []).append(po.offering)
    pools = [p for p in desired.pools.values() if d.pools is None or p.name in d.pools]

    def serves(p, o) -> bool:
        if d.mig:
            return o.gpu_type == d.gpu_type and bool(p.spec.mig) and d.mig[0] in p.spec.mig
        if d.gpus:
            return o.gpu_type == d.gpu_type and not p.spec.mig
        return o.gpus == 0

    typed = [p for p in pools if any(serves(p, o) for o in shapes.get(p.name, []))]
    if not typed:
        return f"no pool offers {what}" + (" (CPU jobs do not run on GPU instances)" if not d.gpus and not d.mig else "")
    guard = desired.guardrails
    in_region = [p for p in typed if region_matches(list(d.regions) if d.regions else None, p.spec.cloud, p.spec.region)
                 and region_matches(guard.allowed_regions, p.spec.cloud, p.spec.region)
                 and (d.clouds is None or p.spec.cloud in d.clouds)
                 and (guard.allowed_clouds is None or p.spec.cloud in guard.allowed_clouds)]
    if not in_region:
        where = ", ".join((d.regions or ()) + tuple(sorted(d.clouds or ()))) or "any"
        return f"no pool offers {what} in an allowed region or cloud (job allows: {where})"
    if d.zones is not None and not any((p.spec.cloud, z) in d.zones for p in in_region for z in p.spec.zones):
        return f"no pool offering {what} has a zone within the data's max_latency_ms"
    per_gpu = d.gpus // d.bundle if d.gpus else 0

    def large(p, o) -> bool:
        return (serves(p, o) and o.cpu >= d.cpu and o.memory_gib >= d.memory_gib and (not d.gpus or o.gpus >= d.gpus)
                and (not d.nvlink or getattr(o, "nvlink_domain", 1) >= per_gpu)
                # (MIG: as many devices of the profile as the pool's layout makes on its GPUs; a same-instance gang
                # of 4x 2g.20gb on a 1-GPU type with two per GPU was said to find every zone out of capacity)
                and (not d.mig or o.gpus * list(p.spec.mig).count(d.mig[0]) >= d.mig[1]))

    big = [p for p in in_region if any(large(p, o) for o in shapes.get(p.name, []))]
    if not big:
        nv = f", {per_gpu} GPUs in one NVLink domain" if d.nvlink else ""
        return f"no instance type in an allowed pool is large enough for one {'instance-gang' if d.bundle > 1 else 'replica'} ({what}, {d.cpu:g} vCPU, {d.memory_gib:g} GiB{nv})"
    markets = {m for p in big for m in p.spec.markets()}
    if d.spot == "never" and markets == {"spot"}:
        return "spot: never, but every matching pool is spot-only"
    if d.spot == "required" and "spot" not in markets:
        return "spot: required, but no matching pool allows spot"
    names = {p.name for p in big}
    if not any(o.pool in names for o in offers):
        # Spot offers over the price cap are left out too: say so when that, not capacity, is why (a spot-only
        # A10G pool at 0.3 was said to find 'every matching zone out of capacity': property tier).
        usable = {"never": {"on-demand"}, "required": {"spot"}}.get(d.spot, {"spot", "on-demand"})
        frac = desired.spot_policy.max_price_fraction
        short, priced_out = 0, 0
        for p in big:
            for o in (o for o in shapes.get(p.name, []) if large(p, o)):
                for market in set(p.spec.markets()) & usable:
                    if not o.available or (o.cloud, o.zone, o.instance_type, market) in observed.short:
                        short += 1
                    elif market == "spot" and (o.spot_price is None or o.spot_price > frac * o.on_demand_price + 1e-9):
                        priced_out += 1
        if priced_out and not short:
            return f"spot: every matching spot price is over max_price_fraction {frac:g} of on-demand, and the job cannot run on on-demand there"
        return "every matching zone is out of capacity or in cool-off after a capacity error; retry later or add zones"
    return f"no capacity matches {what} under the pool, market and spot price rules"


# ---------------------------------------------------------------- decomposition


def components(problem: Problem) -> list[Problem]:
    """Split a problem into parts no constraint links: a demand is tied to every pool that
    could host it and to the other demands of its tenant (quotas, guarantees, budgets); a host
    to its pool and its residents. Fleet-wide rules (budget, spot share, buffer, diversity,
    fair share between borrowing tenants) tie everything: then there is one part. Each part
    is solved alone (exact: the parts share no variable or constraint)."""
    sp = problem.spot
    borrowers = [t for t, r in problem.tenants.items() if any(r.cap.get(k, math.inf) > v + 1e-9 for k, v in r.guarantee.items())]
    if problem.budget is not None or sp.max_spot_fraction < 1 or sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 \
            or sp.min_zones > 1 or len(borrowers) > 1:
        return [problem]
    parent: dict[str, str] = {}

    def find(a: str) -> str:
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    by_type: dict[tuple, list[Capacity]] = {}
    for c in problem.capacities:
        by_type.setdefault(type_class(c), []).append(c)
        union("p:" + c.pool, "c:" + c.key)
        for dk, _, _ in c.residents:
            union("c:" + c.key, "d:" + dk)
    for d in problem.demands:
        union("d:" + d.key, "t:" + d.tenant)
        for name, _ in d.licenses:  # a license's count ties every job that holds it
            union("d:" + d.key, "l:" + name)
        for c in by_type.get(type_class(d), []):
            if fit(d, c) > 0:
                union("d:" + d.key, "p:" + c.pool)
    for ks in problem.groups.values():  # a group's demands share placement variables (one fitting no pool, too)
        for k in ks[1:]:
            union("d:" + ks[0], "d:" + k)
    for i, q in enumerate(problem.quotas):  # a cloud quota ties every offer that counts against it
        for c in problem.capacities:
            if not c.existing and quota_units(q, c):
                union("c:" + c.key, f"q:{i}")
    for pool in problem.pool_bounds:
        find("p:" + pool)
    parts: dict[str, dict[str, list]] = {}
    for d in problem.demands:
        parts.setdefault(find("d:" + d.key), {"d": [], "c": [], "p": []})["d"].append(d)
    for c in problem.capacities:
        parts.setdefault(find("c:" + c.key), {"d": [], "c": [], "p": []})["c"].append(c)
    for pool in problem.pool_bounds:
        parts.setdefault(find("p:" + pool), {"d": [], "c": [], "p": []})["p"].append(pool)
    if len(parts) <= 1:
        return [problem]
    out = []
    for part in parts.values():
        keys = {d.key for d in part["d"]}
        tenants = {d.tenant for d in part["d"]}
        jobs = {j for d in part["d"] for j in d.jobs}
        out.append(Problem(
            demands=tuple(part["d"]), capacities=tuple(part["c"]),
            groups={g: ks for g, ks in problem.groups.items() if ks[0] in keys},
            pool_bounds={p: problem.pool_bounds[p] for p in part["p"]},
            tenants={t: r for t, r in problem.tenants.items() if t in tenants},
            desired_spot=problem.desired_spot, placement=problem.placement, budget=problem.budget,
            fleet_capacity=problem.fleet_capacity,
            static_pending={j: r for j, r in problem.static_pending.items() if j in jobs},
            job_remaining={j: r for j, r in problem.job_remaining.items() if j in jobs},
            coef={k: v for k, v in problem.coef.items() if k[0] in keys}, now=problem.now, licenses=problem.licenses,
            reservations=problem.reservations, deadlines={j: v for j, v in problem.deadlines.items() if j in jobs},
            quotas=tuple(q for q in problem.quotas if any(not c.existing and quota_units(q, c) for c in part["c"])),
            quota_floors={p: w for p, w in problem.quota_floors.items() if p in part["p"]},
            gpu_fleet=problem.gpu_fleet,
        ))
    return sorted(out, key=lambda q: -(len(q.demands) + len(q.capacities)))
