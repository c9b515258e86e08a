"""Check a plan's answer against the rules, independently of the solver.

Uses only the desired state, the observed fleet, the catalog, the topology graph
(`reconciler.topology`, plain networkx) and the plan: nothing from the solver model
(problem, solve, greedy, pack), so a bug there is not shared here. Each rule is
re-derived from the YAML kinds' documented meaning. Definitions this checker takes:

- The fleet after the plan: existing instances not deleted, plus the plan's creates.
  An instance's price is its market's price in the observed offerings (else the catalog).
- Work units of one replica: 7 per whole GPU, one per MIG compute slice, 1 for CPU work;
  a job's priority-weighted work is priority x units x replicas. An integer priority is in
  the class (low, normal, high, critical = 1, 10, 100, 1000) of the highest weight not above it.
- A tenant's spot share (`tenant_max_spot_fraction`, "of the tenant's placed work" in the
  README): work units of its placed replicas on spot instances / work units of all its
  placed replicas.
- The fleet's spot share (`max_spot_fraction`): GPUs of spot instances / GPUs of all
  instances after the plan; vCPUs instead for a CPU-only fleet, one whose pools have no
  GPU instance type (in a fleet with GPU pools, CPU instances count 0 either way).
- The on-demand buffer: idle GPUs of on-demand instances (GPUs no replica uses; a MIG
  replica uses its compute slices / 7) >= percent of the GPUs of spot instances (vCPUs
  for a CPU-only fleet).
- A tenant's cost: per replica, its instance's price x (replica GPUs / instance GPUs; for
  MIG compute slices / (7 x instance GPUs); for CPU work on a CPU instance vCPUs / instance
  vCPUs), at most 1.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timezone

from providers.catalog import InstanceShape, load_catalog
from reconciler.model import PRIORITY_CLASSES, DesiredState, Job, quota_guarantee, region_matches
from reconciler.observe import Observed
from reconciler.plan import JobChange, Plan, placement_group_name
from reconciler.topology import TopologyIndex

EPS = 1e-6


def _micro(usd: float) -> int:
    """README "Budgets": a budget counts each instance's price and each replica's charge in whole micro-dollars (to
    the nearest), summed, against the budget in micro-dollars."""
    return round(usd * 1_000_000)
DIMS = ("gpus", "cpu", "memory_gib")
_NO_GPU = InstanceShape("", "", 0, None, 0, 0, {})  # a type the catalog does not know
_NO_CHANGES = Plan("", "", "", "", (), (), (), 0.0, 0.0, None)  # type: ignore[arg-type]  # the fleet as it runs


@dataclass(frozen=True)
class Host:
    """One instance of the fleet after the plan."""

    ref: str  # instance id, or the plan's create ref
    new: bool
    cloud: str
    region: str
    zone: str
    itype: str
    market: str
    pool: str
    shape: InstanceShape
    price: float
    on_demand: float
    # placement group: of a new instance, the one it launches into; of a running one, the one its provider reports ('' none)
    # where the provider keeps groups (Observed.grouped), else None
    group: str | None = None
    reservation: str | None = None  # launched into this Reservation (new instances): price 0, checked in fleet_after
    mig: tuple[str, ...] = ()  # the MIG layout of its GPUs (_layout), () for whole GPUs


@dataclass(frozen=True)
class Replica:
    job: str
    index: int
    host: Host
    gpus: tuple[int, ...]


def _offering(observed: Observed, cloud: str, region: str, zone: str, itype: str):
    for po in observed.offerings:
        o = po.offering
        if (o.cloud, o.zone, o.instance_type) == (cloud, zone, itype):
            return o
    return load_catalog().offering(cloud, region, zone, itype)


def _layout(i, desired: DesiredState | None) -> tuple[str, ...]:
    """An instance's MIG layout: the one it recorded at launch (`fleetops.io/mig`: profiles joined by '-', or 'none');
    an instance that records none (launched before the tag) counts as having its pool's (README, MIG)."""
    tag = i.tags.get("fleetops.io/mig")
    if tag is not None:
        return () if tag == "none" else tuple(tag.split("-"))
    pool = desired.pools.get(i.pool) if desired is not None else None
    return tuple(pool.spec.mig or ()) if pool is not None else ()


def _pool_layout(desired: DesiredState | None, pool: str) -> tuple[str, ...]:
    p = desired.pools.get(pool) if desired is not None else None
    return tuple(p.spec.mig or ()) if p is not None else ()


def _reserved(desired: DesiredState | None, observed: Observed) -> set[str]:
    """Existing instances a Reservation covers: on-demand, tagged with its name at launch, in its zone
    and of its type, at most its count of them (by instance id). Their price is 0: it is committed."""
    out: set[str] = set()
    if desired is None:
        return out
    for name, r in desired.reservations.items():
        s = r.spec
        pools = [p.name for p in desired.pools.values() if (p.spec.cloud, p.spec.region) == (s.cloud, s.region) and s.zone in p.spec.zones
                 and s.instance_type in p.spec.instance_types and p.spec.market != "spot"]
        pool = s.pool or (pools[0] if len(pools) == 1 else None)
        mine = sorted(i.id for i in observed.instances if i.tags.get("fleetops.io/reservation") == name and i.market == "on-demand"
                      and (i.zone, i.instance_type, i.pool) == (s.zone, s.instance_type, pool))
        out.update(mine[: s.count])
    return out


def fleet_after(observed: Observed, plan: Plan, desired: DesiredState | None = None) -> dict[str, Host]:
    """`desired`: to price reserved capacity (Reservations) at 0; without it every instance has its market's price."""
    cat = load_catalog()
    deleted = {d.instance_id for d in plan.deletes}
    reserved = _reserved(desired, observed)
    hosts = {}
    for i in observed.instances:
        if i.id in deleted:
            continue
        o = _offering(observed, i.cloud, i.region, i.zone, i.instance_type)
        assert o is not None, f"kept instance {i.id} has a type {i.instance_type} nothing prices in {i.zone}"
        price = o.spot_price if i.market == "spot" and o.spot_price is not None else o.on_demand_price
        if i.id in reserved:
            price = 0.0
        hosts[i.id] = Host(i.id, False, i.cloud, i.region, i.zone, i.instance_type, i.market, i.pool,
                           cat.shape(i.cloud, i.instance_type), price, o.on_demand_price,
                           group=(i.placement_group or "") if i.provider in observed.grouped else None, mig=_layout(i, desired))
    for c in plan.creates:
        o = _offering(observed, c.cloud, c.region, c.zone, c.instance_type)
        assert o is not None, f"create {c.ref}: no offering of {c.instance_type} in {c.zone}"
        price = c.price
        if c.reservation is not None:  # launched into a Reservation: checked in _check_reservations, committed cost
            r = desired.reservations.get(c.reservation) if desired is not None else None
            assert r is not None, f"create {c.ref} launches into reservation {c.reservation}, which the config does not define"
            assert (c.zone, c.instance_type, c.market) == (r.spec.zone, r.spec.instance_type, "on-demand"), (
                f"create {c.ref} ({c.market} {c.instance_type} in {c.zone}) is not what reservation {c.reservation} holds")
            assert c.price == 0.0, f"create {c.ref} in reservation {c.reservation} priced {c.price}, not 0 (its cost is committed)"
        hosts[c.ref] = Host(c.ref, True, c.cloud, c.region, c.zone, c.instance_type, c.market, c.pool,
                            cat.shape(c.cloud, c.instance_type), price, o.on_demand_price, c.placement_group, c.reservation,
                            _pool_layout(desired, c.pool))
    return hosts


def replicas_of(plan: Plan, hosts: dict[str, Host]) -> dict[str, list[Replica]]:
    """Placed jobs -> their replicas after the plan."""
    out = {}
    for jc in plan.jobs:
        if jc.action in ("pending", "evict"):
            continue
        gpus = jc.gpus if jc.gpus else ((),) * len(jc.instances)
        assert len(gpus) == len(jc.instances), f"{jc.job}: {len(gpus)} GPU index sets for {len(jc.instances)} replicas"
        for h in jc.instances:
            assert h in hosts, f"{jc.job} placed on {h}, which will not exist"
        out[jc.job] = [Replica(jc.job, r, hosts[h], tuple(g)) for r, (h, g) in enumerate(zip(jc.instances, gpus))]
    return out


def mig_slices(job: Job) -> int:
    """Compute slices (of 7 per GPU) one replica of a MIG job uses."""
    m = job.spec.resources.mig
    prof = load_catalog().gpu_models[job.spec.resources.gpu_type].mig_profiles[m.profile]
    return prof.compute * m.count


def gpu_equiv(job: Job) -> float:
    """GPUs one replica uses: whole GPUs, or MIG compute slices / 7."""
    r = job.spec.resources
    return mig_slices(job) / 7 if r.mig else float(r.gpus)


def work_units(job: Job) -> int:
    r = job.spec.resources
    return mig_slices(job) if r.mig else (7 * r.gpus if r.gpus else 1)


def placed_work(desired: DesiredState, plan: Plan) -> int:
    """Priority-weighted work the plan runs (priority x work units x replicas)."""
    total = 0
    for jc in plan.jobs:
        if jc.action not in ("pending", "evict"):
            j = desired.jobs[jc.job]
            total += j.spec.priority_weight() * work_units(j) * j.spec.replicas
    return total


def priority_class(priority: int) -> int:
    """0 low .. 3 critical: the band of the highest named class whose weight is not above it."""
    return max([i for i, w in enumerate(sorted(PRIORITY_CLASSES.values())) if w <= priority], default=0)


def can_borrow(desired: DesiredState) -> bool:
    """Does some tenant have a ceiling above its guarantee (work that is only borrowed)?"""
    for t in desired.tenants.values():
        q = t.spec.quota
        for dim in DIMS:
            g, cap = quota_guarantee(q, dim), q.cap(dim)
            if cap is not None and (g is None or cap > g + EPS):
                return True
    return False


def job_size(job: Job) -> int:
    return work_units(job) * job.spec.replicas


def changed(job: Job, observed: Observed) -> bool:
    """Does a running job ask for something other than what runs: another replica count (a gang
    grown or shrunk), or resources other than those apply recorded it with (state `shapes`)?"""
    placed = observed.placements.get(job.name, ())
    return len(placed) != job.spec.replicas or reshaped(job, observed)


def reshaped(job: Job, observed: Observed) -> bool:
    """Does a running job ask for resources other than those apply recorded it with (state `shapes`)? It restarts in
    its new shape: it cannot stay as it runs."""
    old = getattr(observed, "shapes", {}).get(job.name)
    if not old:
        return False
    r = job.spec.resources
    now = {"gpus": r.gpus, "gpu_type": r.gpu_type, "mig": f"{r.mig.count}x {r.mig.profile}" if r.mig else None,
           "nvlink": r.nvlink, "cpu": r.cpu, "memory_gib": r.memory_gib}
    return any(k in old and old[k] != v for k, v in now.items())


def protected_jobs(desired: DesiredState, observed: Observed, tenant: str) -> list[str]:
    """The tenant's running jobs inside its guarantee, the longest-running first (`observed.since`), then the highest
    priority, then the largest (the README: 'no tenant loses guaranteed work it runs now to another tenant'). Only jobs running whole in
    the shape they ask for: a grown gang or a changed job needs capacity it does not hold."""
    return _guaranteed_running(desired, observed, tenant)[0]


def moving_jobs(desired: DesiredState, observed: Observed, tenant: str) -> list[str]:
    """The tenant's running jobs that cannot stay where they run (not protected), in what its
    guarantee leaves after the protected ones, highest priority first: the README's second
    guarantee tier keeps them running (moved) before other tenants' new work."""
    return _guaranteed_running(desired, observed, tenant)[1]


def _guaranteed_running(desired: DesiredState, observed: Observed, tenant: str) -> tuple[list[str], list[str]]:
    q = desired.tenants[tenant].spec.quota
    # (a tenant without a quota is unlimited: everything it runs is inside its guarantee)
    guar = {dim: quota_guarantee(q, dim) for dim in DIMS if quota_guarantee(q, dim) is not None}
    used = dict.fromkeys(DIMS, 0.0)
    since = getattr(observed, "since", {})
    whole = [j for j in desired.jobs.values() if j.spec.tenant == tenant and observed.placements.get(j.name) and not changed(j, observed)]
    stays = [j for j in whole if _legal_now(j, observed, desired, _NO_CHANGES)]  # (a job that cannot stay where it runs is not kept there)
    out: tuple[list[str], list[str]] = ([], [])
    for part, jobs in zip(out, (stays, [j for j in whole if j not in stays])):
        for j in sorted(jobs, key=lambda j: (since.get(j.name, 0), -j.spec.priority_weight(), -job_size(j), j.name)):
            r = j.spec.resources
            need = {"gpus": r.gpus * j.spec.replicas, "cpu": r.cpu * j.spec.replicas, "memory_gib": r.memory_gib * j.spec.replicas}
            if all(used[k] + need[k] <= guar[k] + EPS for k in guar):
                for k in DIMS:
                    used[k] += need[k]
                part.append(j.name)
    return out


def _protected(desired: DesiredState, observed: Observed, tenant: str) -> int:
    """Work units of the tenant's protected jobs (`protected_jobs`)."""
    return sum(job_size(desired.jobs[j]) for j in protected_jobs(desired, observed, tenant))


def _guarantee_kept(desired: DesiredState, observed: Observed, tenant: str, plan: Plan, moving: bool = False) -> int:
    """Work units of the tenant's protected jobs that the plan keeps (in place or moved), or whose room its own
    new work of a higher class takes (`_room_taken`; the README, Tenants: guaranteed work gives way only to a higher class
    of its own tenant that takes its room, not where that work lands on other capacity while another tenant's work
    takes the room). A pending job of a lost one's class does not stand in for it. moving: the second guarantee tier,
    where its running jobs that must move (`moving_jobs`) count as its own units, not as new work. (A stand-in counted
    anywhere ranked greedy's plan above CP-SAT's OPTIMAL one: t3's critical job on a new A10G instance stood in for its
    guaranteed low job on the only A100 slot, whose room t1's job took, fleet140.)"""
    placed = {jc.job for jc in plan.jobs if jc.action not in ("pending", "evict")}
    left: dict[str, int] = {}  # a lost protected job -> its units not stood in for yet
    kept = 0
    protected = protected_jobs(desired, observed, tenant) + (moving_jobs(desired, observed, tenant) if moving else [])
    for name in protected:
        if name in placed:
            kept += job_size(desired.jobs[name])
        else:
            left[name] = job_size(desired.jobs[name])
    if desired.placement.preemption == "Never" or not left:
        return kept  # (no class takes another's place: nothing stands in)
    # (its other placed jobs are new work: pending ones, and running ones it does not protect, e.g. a gang that
    # must move whole or a changed job, which need capacity anew)
    new = sorted((priority_class(j.spec.priority_weight()), job_size(j), j.name) for j in desired.jobs.values()
                 if j.spec.tenant == tenant and j.name in placed and j.name not in protected)
    lost_jobs = [desired.jobs[n] for n in left]

    def gpu_work(j: Job) -> bool:
        return bool(j.spec.resources.gpus or j.spec.resources.mig)

    # Smallest class first: each covers lost units of any class below its own whose room it takes, with its own units
    # any work's, and with the room it takes beyond them (_stands_in_for) lost CPU work's only (counted for any, a
    # 12-vCPU critical job stood in for 3 units of a lost 1-GPU job, measured on a 4-vCPU job: greedy's plan outranked
    # CP-SAT's, fleet87).
    order = sorted(left, key=lambda n: (priority_class(desired.jobs[n].spec.priority_weight()), not gpu_work(desired.jobs[n]), n))
    for klass, own, name in new:
        size = _stands_in_for(desired.jobs[name], lost_jobs)
        for q in order:
            c = priority_class(desired.jobs[q].spec.priority_weight())
            if c >= klass or size <= 0:
                break
            above = [k for _, _, k in new if _class(desired, k) > c]  # (the guarantee holds q beside all of it, or not)
            if not left[q] or not _room_taken(desired, observed, plan, q, [name], above):
                continue
            if gpu_work(desired.jobs[q]):
                take = min(own, size, left[q])
                own, size = own - take, size - take
            else:
                take = min(size, left[q])
                own, size = min(own, size - take), size - take
            left[q] -= take
            kept += take
    return kept


def _class(desired: DesiredState, job: str) -> int:
    return priority_class(desired.jobs[job].spec.priority_weight())


def _stands_in_for(job: Job, lost: list[Job]) -> int:
    """The units of its tenant's lost lower protected jobs a new job may stand in for (README, Tenants: a CPU job of a
    higher class counts for as many of its tenant's smaller CPU jobs as its vCPU or memory takes the room of; GPU work
    by its own units, which count GPUs): its own units, or, CPU work for CPU work, that many of a lost job's."""
    units = job_size(job)
    r = job.spec.resources
    if r.gpus or r.mig:
        return units
    for q in lost:
        qr = q.spec.resources
        if priority_class(q.spec.priority_weight()) >= priority_class(job.spec.priority_weight()) or qr.gpus or qr.mig:
            continue
        takes = max((math.ceil(a * job.spec.replicas / (b * q.spec.replicas) - 1e-9)
                     for a, b in ((r.cpu, qr.cpu), (r.memory_gib, qr.memory_gib)) if b > 0), default=0)
        units = max(units, takes * job_size(q))
    return units


def ranking(desired: DesiredState, observed: Observed, plan: Plan) -> tuple[int, ...]:
    """The README's lexicographic order ("How it decides") for a fleet where no tenant can
    borrow, larger is better: guaranteed running work kept (`_guarantee_kept`), then the same with the jobs that
    must move counted as its own (the second guarantee tier); per class from critical down, the
    running work kept (in place or moved), then the deadline work placed (work units x the job's deadline rank, as
    reconciler.deadlines ranks the latest starts: the README's "deadline work first, within its class"), then the
    priority-weighted work placed (preemption: Never puts the running work of every class first); then minus the
    evicted jobs' time left (10 x work units x hours; with no clock, a job's expected_hours)."""
    assert not can_borrow(desired), "with borrowing, fair share and guaranteed/borrowed tiers come in between"
    placed = {jc.job for jc in plan.jobs if jc.action not in ("pending", "evict")}
    kept = sum(_guarantee_kept(desired, observed, t, plan) for t in desired.tenants)
    kept_moving = sum(_guarantee_kept(desired, observed, t, plan, moving=True) for t in desired.tenants)
    rank = _deadline_ranks(desired, observed)
    run, deadline, work = [0] * 4, [0] * 4, [0] * 4
    victims = 0
    for j in desired.jobs.values():
        c = 3 - priority_class(j.spec.priority_weight())
        running = bool(observed.placements.get(j.name))
        if j.name in placed:
            work[c] += j.spec.priority_weight() * job_size(j)
            deadline[c] += rank.get(j.name, 0) * job_size(j)
            run[c] += job_size(j) if running else 0
        elif running:
            victims += max(1, round(10 * job_size(j) * j.spec.expected_hours))
    if desired.placement.preemption == "Never":
        tiers = run + [v for pair in zip(deadline, work) for v in pair]
    else:
        tiers = [v for triple in zip(run, deadline, work) for v in triple]
    return (kept, kept_moving, *tiers, -victims)


def _deadline_ranks(desired: DesiredState, observed: Observed) -> dict[str, int]:
    """Job -> its deadline rank (reconciler.deadlines: 1..n by latest start, the closest n; none once it cannot start in
    time), from the jobs' deadlines and expected hours as the config states them."""
    from reconciler.deadlines import ranks, start_by

    now = getattr(observed, "now", None)
    latest = {n: start_by(j.spec.deadline, j.spec.expected_hours) for n, j in desired.jobs.items() if j.spec.deadline is not None}
    return {n: r for n, (r, _) in ranks(latest, {n: desired.jobs[n].spec.expected_hours for n in latest}, now).items()}


def cost_per_hour(desired: DesiredState, observed: Observed, plan: Plan) -> float:
    """What the plan costs per hour as the README counts it: instances, data egress (amortised
    over expected_hours), latency (latency_cost_per_ms x ms per replica) and moves (amortised
    over payback_hours). Not the premium a spot-preferred job pays on on-demand (no price is
    documented for it)."""
    hosts = fleet_after(observed, plan, desired)
    topo = TopologyIndex(desired.topology.spec)
    lat_cost = desired.placement.latency_cost_per_ms
    total = plan.cost_after + move_cost_per_hour(desired, observed, plan)
    for jc in plan.jobs:
        spec = desired.jobs[jc.job].spec
        if spec.data is None:
            continue
        for ref in jc.instances:
            h = hosts[ref]
            dist = topo.distance(spec.data.location, h.cloud, h.region, h.zone)
            total += dist.egress_per_gb * spec.data.size_gib / spec.expected_hours / spec.replicas
            if lat_cost and math.isfinite(dist.latency_ms):
                total += lat_cost * dist.latency_ms
    return total


def replica_share(job: Job, host: Host) -> float:
    """The fraction of its instance one replica pays for."""
    r, s = job.spec.resources, host.shape
    if s.gpus:
        if r.mig:
            return min(1.0, mig_slices(job) / (7 * s.gpus))
        return min(1.0, r.gpus / s.gpus) if r.gpus else min(1.0, r.cpu / s.cpu)
    return min(1.0, r.cpu / s.cpu) if s.cpu else 1.0


def restarted(observed: Observed, jc) -> int:
    """Replicas of a running job the plan restarts: each one not on its instance with its
    recorded GPUs any more (a replica given other GPUs restarts too)."""
    if not jc.previous or not jc.instances:
        return 0  # new, or evicted (not moved)
    recorded = observed.gpu_indices.get(jc.job)
    n = 0
    for r, prev in enumerate(jc.previous):
        now = jc.instances[r] if r < len(jc.instances) else None
        gpus = jc.gpus[r] if r < len(jc.gpus) else ()
        if now != prev or (recorded and r < len(recorded) and tuple(gpus) != tuple(recorded[r])):
            n += 1
    return n + max(0, len(jc.instances) - len(jc.previous))


def move_cost_per_hour(desired: DesiredState, observed: Observed, plan: Plan) -> float:
    """The PlacementPolicy's one-time cost of the plan's restarted replicas, amortised over payback_hours."""
    pol = desired.placement
    total = 0.0
    for jc in plan.jobs:
        job = desired.jobs[jc.job]
        r = job.spec.resources
        per = pol.move_cost_per_gpu * gpu_equiv(job) if (r.gpus or r.mig) else pol.move_cost_per_replica
        total += per * restarted(observed, jc)
    return total / pol.payback_hours


# ---------------------------------------------------------------- the rules


def check_plan(desired: DesiredState, observed: Observed, plan: Plan, now=None) -> None:
    """`now`: the plan's time, for the deadline rules (None: no job is deadline-critical)."""
    hosts = fleet_after(observed, plan, desired)
    reps = replicas_of(plan, hosts)
    _check_job_states(desired, observed, plan)
    _check_jobs(desired, reps)
    _check_gangs(desired, reps)
    _check_gpu_indices(desired, reps)
    _check_capacity(desired, hosts, reps)
    _check_tenants(desired, reps)
    _check_pools(desired, observed, plan, hosts, now)
    _check_spot(desired, hosts, reps, now)
    _check_guardrails(desired, plan, hosts)
    _check_licenses(desired, reps)
    _check_reservations(desired, observed, plan)
    _check_cloud_quotas(observed, plan)


def _check_cloud_quotas(observed: Observed, plan: Plan) -> None:
    """The plan's creates stay within every account quota the providers read: the units of the creates that count
    against it (as the provider said each type and market counts), at most its limit less what the account used
    when it was read (that use includes the fleet's instances, and apply deletes only after it creates)."""
    for q in getattr(observed, "quotas", ()):
        per = {(t, m): u for t, m, u in q.counts}
        took = sum(per.get((c.instance_type, c.market), 0) for c in plan.creates
                   if c.cloud == q.cloud and (not q.region or c.region == q.region))
        assert took <= max(0.0, q.limit - q.used) + 1e-6, (f"cloud quota {q.cloud} {q.name} ({q.region or 'all regions'}): the plan's creates "
                                                 f"take {took:g} {q.unit}, {q.used:g} of {q.limit:g} were used")


def _quota_blocks(observed: Observed, plan: Plan, spec) -> bool:
    """Would one more instance of every type and market the pool may launch take some cloud quota past its room (a
    pool minimum yields to the account's quotas: they limit launches)? Only for the fleet as it runs (_broken_as): a
    plan's pool minimums are judged by apply's rule (plancheck.pool_min_errors), which weighs the budget the plan
    leaves; the fleet as it runs is under a minimum the budget can meet by stopping work (fleet25)."""
    quotas = getattr(observed, "quotas", ())

    def full(itype: str, market: str) -> bool:
        for q in quotas:
            per = {(t, m): u for t, m, u in q.counts}
            if q.cloud != spec.cloud or (q.region and q.region != spec.region) or (itype, market) not in per:
                continue
            took = sum(per.get((c.instance_type, c.market), 0) for c in plan.creates
                       if c.cloud == q.cloud and (not q.region or c.region == q.region))
            if took + per[(itype, market)] > max(0.0, q.limit - q.used) + 1e-6:
                return True
        return False
    return bool(quotas) and all(full(t, m) for t in spec.instance_types for m in spec.markets())


def _check_reservations(desired: DesiredState, observed: Observed, plan: Plan) -> None:
    """No more instances in a Reservation after the plan than its count."""
    deleted = {d.instance_id for d in plan.deletes}
    held = Counter(i.tags.get("fleetops.io/reservation") for i in observed.instances if i.id in _reserved(desired, observed) and i.id not in deleted)
    held.update(c.reservation for c in plan.creates if c.reservation is not None)
    for name, r in desired.reservations.items():
        assert held[name] <= r.spec.count, f"reservation {name}: {held[name]} instances after the plan, over its count {r.spec.count}"


def _check_licenses(desired: DesiredState, reps: dict[str, list[Replica]]) -> None:
    """A License's count is never exceeded by the replicas the plan runs (each holds `licenses` of
    its job's spec), nor a tenant's quota of it."""
    held: Counter = Counter()
    by_tenant: Counter = Counter()
    for job, rs in reps.items():
        spec = desired.jobs[job].spec
        for name, n in spec.licenses.items():
            held[name] += n * len(rs)
            by_tenant[(name, spec.tenant)] += n * len(rs)
    for name, lic in desired.licenses.items():
        assert held[name] <= lic.spec.count, f"license {name}: {held[name]} held by the plan's replicas, over its count {lic.spec.count}"
        for t, q in lic.spec.tenant_quotas.items():
            assert by_tenant[(name, t)] <= q, f"license {name}: tenant {t} holds {by_tenant[(name, t)]}, over its quota {q}"
    for name in held:
        assert name in desired.licenses, f"a placed job holds license {name}, which no License defines"


def _check_job_states(desired: DesiredState, observed: Observed, plan: Plan) -> None:
    assert sorted(j.job for j in plan.jobs) == sorted(desired.jobs), "the plan must say what happens to every job"
    for jc in plan.jobs:
        spec = desired.jobs[jc.job].spec
        if jc.action in ("pending", "evict"):
            assert jc.instances == (), f"{jc.job} is pending but has instances"
            assert jc.reason, f"{jc.job} is pending without a reason"
            assert (jc.action == "evict") == bool(jc.previous), f"{jc.job}: {jc.action} but previously on {jc.previous}"
            continue
        assert len(jc.instances) == spec.replicas, f"gang {jc.job} not whole: {len(jc.instances)}/{spec.replicas}"
        if jc.action == "keep":
            assert sorted(jc.instances) == sorted(jc.previous), f"{jc.job} kept but moved {jc.previous} -> {jc.instances}"
            recorded = observed.gpu_indices.get(jc.job)
            assert not recorded or sorted(map(tuple, jc.gpus)) == sorted(map(tuple, recorded)), (
                f"{jc.job} kept, but its GPUs change from {recorded} to {jc.gpus} (running replicas keep theirs)")
        elif jc.action == "place":
            assert not jc.previous, f"{jc.job} placed although it ran on {jc.previous}"


def _check_jobs(desired: DesiredState, reps: dict[str, list[Replica]]) -> None:
    """Per replica: the instance serves the job's resources and every allowlist holds."""
    topo = TopologyIndex(desired.topology.spec)
    for job, rs in reps.items():
        spec = desired.jobs[job].spec
        r = spec.resources
        for rep in rs:
            h = rep.host
            s = h.shape
            pool_mig = h.mig  # (its GPUs' layout: a kept instance keeps the one it was launched with)
            if r.mig:
                assert s.gpu_type == r.gpu_type, f"MIG job {job} wants {r.gpu_type}, {h.ref} has {s.gpu_type}"
                assert pool_mig and r.mig.profile in pool_mig, f"MIG job {job} ({r.mig.profile}) on {h.ref} of pool {h.pool} (layout {pool_mig})"
                assert rep.gpus == (), f"MIG job {job} was given whole GPUs {rep.gpus}"
            elif r.gpus:
                assert s.gpu_type == r.gpu_type, f"{job} wants {r.gpu_type}, {h.ref} has {s.gpu_type}"
                assert not pool_mig, f"whole-GPU job {job} on MIG pool {h.pool}"
            else:
                assert s.gpus == 0, f"CPU job {job} on GPU instance {h.ref}"
                assert rep.gpus == (), f"CPU job {job} was given GPUs {rep.gpus}"
            if spec.spot == "never":
                assert h.market != "spot", f"spot-never job {job} on spot {h.ref}"
            if spec.spot == "required":
                assert h.market == "spot", f"spot-required job {job} on {h.market} {h.ref}"
            assert region_matches(spec.regions, h.cloud, h.region), f"{job} on {h.cloud}/{h.region}, outside its regions {spec.regions}"
            assert spec.clouds is None or h.cloud in spec.clouds, f"{job} on {h.cloud}, outside its clouds {spec.clouds}"
            assert spec.pools is None or h.pool in spec.pools, f"{job} on pool {h.pool}, outside its pools {spec.pools}"
            if spec.data is not None and spec.data.max_latency_ms is not None:
                lat = topo.distance(spec.data.location, h.cloud, h.region, h.zone).latency_ms
                assert lat <= spec.data.max_latency_ms + EPS, (
                    f"{job} in {h.cloud}/{h.zone}, {lat} ms from its data at {spec.data.location} (max {spec.data.max_latency_ms})")


def _check_gangs(desired: DesiredState, reps: dict[str, list[Replica]]) -> None:
    for job, rs in reps.items():
        spec = desired.jobs[job].spec
        zones = {(rep.host.cloud, rep.host.zone) for rep in rs}
        assert len(zones) == 1, f"gang {job} spans zones {zones}"
        if spec.replicas < 2:
            continue
        if spec.gang == "instance":
            assert len({rep.host.ref for rep in rs}) == 1, f"instance-gang {job} spans {sorted({rep.host.ref for rep in rs})}"
        if spec.gang == "placement-group":
            types = {rep.host.itype for rep in rs}
            assert len(types) == 1, f"placement-group gang {job} spans instance types {types}"
            groups = {rep.host.group for rep in rs if rep.host.new}
            assert None not in groups, f"placement-group gang {job} on a new instance without a placement group"
            # (and where it runs on, kept, the instances of a provider with groups: all in its own, the one the plan names
            # for it in its zone; a zone gang before was in none: README, it moves whole into one)
            groups |= {rep.host.group for rep in rs if not rep.host.new and rep.host.group is not None}
            assert len(groups) <= 1, f"placement-group gang {job} spans placement groups {groups}"
            own = placement_group_name(desired.fleet, job, rs[0].host.zone)
            assert groups <= {own}, f"placement-group gang {job} runs outside its placement group {own}: in {sorted(groups)}"


def _check_gpu_indices(desired: DesiredState, reps: dict[str, list[Replica]]) -> None:
    taken: dict[str, dict[int, tuple[str, int]]] = defaultdict(dict)
    for job, rs in reps.items():
        r = desired.jobs[job].spec.resources
        if not r.gpus:
            continue
        for rep in rs:
            n, dom = rep.host.shape.gpus, max(1, rep.host.shape.nvlink_domain)
            assert len(rep.gpus) == r.gpus and len(set(rep.gpus)) == r.gpus, f"{job}[{rep.index}] has GPUs {rep.gpus}, wants {r.gpus}"
            assert all(0 <= i < n for i in rep.gpus), f"{job}[{rep.index}] has GPUs {rep.gpus}; {rep.host.ref} has {n}"
            for i in rep.gpus:
                other = taken[rep.host.ref].get(i)
                assert other is None, f"GPU {i} of {rep.host.ref} given to {other[0]}[{other[1]}] and {job}[{rep.index}]"
                taken[rep.host.ref][i] = (job, rep.index)
            if r.nvlink:
                assert len({i // dom for i in rep.gpus}) == 1, (
                    f"nvlink job {job}[{rep.index}] has GPUs {rep.gpus} across NVLink domains of {dom} on {rep.host.ref}")


def _check_capacity(desired: DesiredState, hosts: dict[str, Host], reps: dict[str, list[Replica]]) -> None:
    used: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    mig_used: dict[str, Counter] = defaultdict(Counter)
    for job, rs in reps.items():
        r = desired.jobs[job].spec.resources
        for rep in rs:
            u = used[rep.host.ref]
            u[0] += r.gpus
            u[1] += r.cpu
            u[2] += r.memory_gib
            if r.mig:
                mig_used[rep.host.ref][r.mig.profile] += r.mig.count
    for ref, (g, c, m) in used.items():
        s = hosts[ref].shape
        assert g <= s.gpus, f"GPU overcommit on {ref}: {g}>{s.gpus}"
        assert c <= s.cpu + EPS, f"CPU overcommit on {ref}: {c}>{s.cpu}"
        assert m <= s.memory_gib + EPS, f"memory overcommit on {ref}: {m}>{s.memory_gib}"
    for ref, per in mig_used.items():
        h = hosts[ref]
        layout = list(h.mig)
        for prof, n in per.items():
            assert n <= h.shape.gpus * layout.count(prof), (
                f"MIG overcommit on {ref}: {n} x {prof}, the layout {layout} on {h.shape.gpus} GPUs has {h.shape.gpus * layout.count(prof)}")


def tenant_costs(desired: DesiredState, observed: Observed, plan: Plan) -> dict[str, float]:
    """USD/h each tenant is charged after the plan: its replicas' shares of their instances."""
    cost: dict[str, float] = defaultdict(float)
    for job, rs in replicas_of(plan, fleet_after(observed, plan, desired)).items():
        j = desired.jobs[job]
        for rep in rs:
            cost[j.spec.tenant] += rep.host.price * replica_share(j, rep.host)
    return dict(cost)


def _check_tenants(desired: DesiredState, reps: dict[str, list[Replica]]) -> None:
    use: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    cost: dict[str, float] = defaultdict(float)
    spend: dict[str, int] = defaultdict(int)  # micro-dollars/h, each replica's charge rounded (_micro)
    n_reps: dict[str, int] = defaultdict(int)
    spot_work: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # on spot, all
    for job, rs in reps.items():
        j = desired.jobs[job]
        t, r = j.spec.tenant, j.spec.resources
        u = use[t]
        u[0] += r.gpus * len(rs)
        u[1] += r.cpu * len(rs)
        u[2] += r.memory_gib * len(rs)
        for rep in rs:
            cost[t] += rep.host.price * replica_share(j, rep.host)
            spend[t] += _micro(rep.host.price * replica_share(j, rep.host))
            n_reps[t] += 1
            spot_work[t][1] += work_units(j)
            if rep.host.market == "spot":
                spot_work[t][0] += work_units(j)
    for tname, (g, c, m) in use.items():
        q = desired.tenants[tname].spec.quota
        for dim, v in (("gpus", g), ("cpu", c), ("memory_gib", m)):
            cap = q.cap(dim)
            assert cap is None or v <= cap + EPS, f"tenant {tname} over quota on {dim}: {v}>{cap}"
    for tname, budget in desired.guardrails.tenant_hourly_budgets.items():
        # (the planner charges a same-instance gang's replicas as one item, rounded once: a micro-dollar a replica at most)
        assert spend[tname] <= _micro(budget) + n_reps[tname], f"tenant {tname} costs ${cost[tname]:.6f}/h, over its budget ${budget}/h"
    for tname, frac in desired.spot_policy.tenant_max_spot_fraction.items():
        spot, total = spot_work[tname]
        assert spot <= frac * total + EPS, f"tenant {tname} has {spot:g}/{total:g} on spot, over its max {frac}"


def _check_pools(desired: DesiredState, observed: Observed, plan: Plan, hosts: dict[str, Host], now=None,
                 as_it_runs: bool = False) -> None:
    per_pool: Counter = Counter(h.pool for h in hosts.values())
    for name, p in desired.pools.items():
        assert per_pool[name] <= p.spec.max_instances, f"pool {name} has {per_pool[name]} instances"
        if as_it_runs:
            assert p.spec.min_instances <= per_pool[name] or _quota_blocks(observed, plan, p.spec), f"pool {name} has {per_pool[name]} instances"
    if not as_it_runs and any(per_pool[name] < p.spec.min_instances for name, p in desired.pools.items()):
        # A pool under min_instances: apply's rule says whether the plan could have done better (a cloud quota, a
        # capacity cool-off or the budget may keep it under), one definition (plancheck.pool_min_errors).
        from reconciler.plancheck import pool_min_errors
        from reconciler.problem import build_problem

        errors = pool_min_errors(plan, desired, observed, build_problem(desired, observed, now=now))
        assert not errors, errors
    short = observed.short
    for h in hosts.values():
        pool = desired.pools.get(h.pool)
        assert pool is not None, f"{h.ref} stays in pool {h.pool}, which is no longer desired"
        s = pool.spec
        assert (h.cloud, h.region) == (s.cloud, s.region) and h.zone in s.zones and h.itype in s.instance_types, (
            f"{h.ref} ({h.cloud}/{h.zone} {h.itype}) does not match Pool/{h.pool}")
        assert h.market in s.markets(), f"{h.ref} is {h.market}, Pool/{h.pool} allows {s.market}"
        assert sorted(h.mig) == sorted(s.mig or ()), (
            f"{h.ref} stays with MIG layout {list(h.mig)}, Pool/{h.pool}'s is {s.mig} (a layout is applied only at launch)")
        if h.new:
            assert (h.cloud, h.zone, h.itype, h.market) not in short, f"{h.ref} bought in {h.zone} {h.itype} {h.market}, in capacity cool-off"
            o = _offering(observed, h.cloud, h.region, h.zone, h.itype)
            assert o.available, f"{h.ref} bought where the provider has no capacity"
            want = 0.0 if h.reservation else o.spot_price if h.market == "spot" else o.on_demand_price
            assert want is not None and abs(h.price - want) <= EPS, f"{h.ref} priced {h.price}, the offering says {want}"


def _primary(h: Host, gpu_fleet: bool) -> float:
    return h.shape.gpus if gpu_fleet else h.shape.cpu


def deadline_critical(job: Job, now) -> bool:
    """A job with a deadline that can still start in time and must start within its expected_hours from
    now (README: it may use the capacity the on-demand buffer keeps idle)."""
    s = job.spec
    if s.deadline is None or now is None:
        return False
    dl = s.deadline if s.deadline.tzinfo else s.deadline.replace(tzinfo=timezone.utc)
    slack = (dl - now).total_seconds() / 3600 - s.expected_hours
    return 0 <= slack <= s.expected_hours + 1e-9


def _check_spot(desired: DesiredState, hosts: dict[str, Host], reps: dict[str, list[Replica]], now=None) -> None:
    sp = desired.spot_policy
    spot = [h for h in hosts.values() if h.market == "spot"]
    cat = load_catalog()
    gpu_fleet = any((cat.shape(p.spec.cloud, t) or _NO_GPU).gpus for p in desired.pools.values() for t in p.spec.instance_types)
    total = sum(_primary(h, gpu_fleet) for h in hosts.values())
    on_spot = sum(_primary(h, gpu_fleet) for h in spot)
    unit = "GPUs" if gpu_fleet else "vCPUs"
    assert on_spot <= sp.max_spot_fraction * total + EPS, f"{on_spot:g} of {total:g} {unit} on spot, over max_spot_fraction {sp.max_spot_fraction}"
    if spot:
        types = {(h.cloud, h.itype) for h in spot}
        zones = {(h.cloud, h.zone) for h in spot}
        assert len(types) >= sp.min_instance_types, f"spot uses {len(types)} instance types, min_instance_types is {sp.min_instance_types}"
        assert len(zones) >= sp.min_zones, f"spot uses {len(zones)} zones, min_zones is {sp.min_zones}"
    for h in spot:
        if h.new:
            assert h.price <= sp.max_price_fraction * h.on_demand + EPS, (
                f"{h.ref} bought on spot at {h.price}, over {sp.max_price_fraction} x on-demand {h.on_demand}")
    if sp.on_demand_buffer_percent > 0 and on_spot > 0:
        busy: dict[str, float] = defaultdict(float)
        for job, rs in reps.items():
            j = desired.jobs[job]
            if deadline_critical(j, now):
                continue
            for rep in rs:
                busy[rep.host.ref] += gpu_equiv(j) if gpu_fleet else j.spec.resources.cpu
        idle = sum(_primary(h, gpu_fleet) - busy[h.ref] for h in hosts.values() if h.market != "spot")
        need = sp.on_demand_buffer_percent / 100 * on_spot
        assert idle >= need - EPS, f"{idle:g} idle on-demand {unit}, the buffer needs {need:g} ({sp.on_demand_buffer_percent}% of {on_spot:g} on spot)"


def _check_guardrails(desired: DesiredState, plan: Plan, hosts: dict[str, Host]) -> None:
    g = desired.guardrails
    for h in hosts.values():
        assert region_matches(g.allowed_regions, h.cloud, h.region), f"{h.ref} in {h.cloud}/{h.region}, outside allowed_regions"
        assert g.allowed_clouds is None or h.cloud in g.allowed_clouds, f"{h.ref} in {h.cloud}, outside allowed_clouds"
    cost = sum(h.price for h in hosts.values())
    assert abs(plan.cost_after - cost) <= 1e-3, f"the plan says ${plan.cost_after}/h after; its instances cost ${cost:.4f}/h"
    if g.max_hourly_budget is not None:
        assert sum(_micro(h.price) for h in hosts.values()) <= _micro(g.max_hourly_budget), \
            f"the fleet costs ${cost:.6f}/h, over max_hourly_budget {g.max_hourly_budget}"


# ---------------------------------------------------------------- stability (issue 18)


def _legal_now(job: Job, observed: Observed, desired: DesiredState, plan: Plan) -> bool:
    """Could the job stay where it runs by the config's rules: every instance exists, matches its
    pool, the guardrails and the job's allowlists and spot rule, and is not deleted for a rule."""
    insts = {i.id: i for i in observed.instances}
    deleted = {d.instance_id: d.reason for d in plan.deletes}
    s, g = job.spec, desired.guardrails
    for iid in observed.placements.get(job.name, ()):
        i = insts.get(iid)
        if i is None:
            return False
        pool = desired.pools.get(i.pool)
        if pool is None or i.zone not in pool.spec.zones or i.instance_type not in pool.spec.instance_types or i.market not in pool.spec.markets():
            return False
        if sorted(_layout(i, desired)) != sorted(pool.spec.mig or ()):
            return False  # (its GPUs keep the layout they were launched with)
        if not region_matches(g.allowed_regions, i.cloud, i.region) or (g.allowed_clouds is not None and i.cloud not in g.allowed_clouds):
            return False
        if s.pools is not None and i.pool not in s.pools or s.clouds is not None and i.cloud not in s.clouds:
            return False
        if s.regions is not None and not region_matches(list(s.regions), i.cloud, i.region):
            return False
        if s.spot == "never" and i.market == "spot" or s.spot == "required" and i.market != "spot":
            return False
        if s.data is not None and s.data.max_latency_ms is not None and \
                TopologyIndex(desired.topology.spec).distance(s.data.location, i.cloud, i.region, i.zone).latency_ms > s.data.max_latency_ms + EPS:
            return False
        # (its pool past max_instances is a fleet-wide rule, not one of the instance's own: the job could stay but for it)
        if iid in deleted and not deleted[iid].startswith(("consolidated", "no longer needed", "emptied")) \
                and not deleted[iid].endswith(f"over its max_instances {pool.spec.max_instances}"):
            return False
    ids = observed.placements.get(job.name, ())
    if len({(insts[i].cloud, insts[i].zone) for i in ids}) > 1:
        return False  # a gang split over zones as it runs must move (or go)
    if job.spec.replicas > 1 and job.spec.gang == "instance" and len(set(ids)) > 1:
        return False  # a same-instance gang split over instances as it runs, likewise
    if job.spec.replicas > 1 and job.spec.gang == "placement-group" and any(
            insts[i].provider in observed.grouped and insts[i].placement_group != placement_group_name(desired.fleet, job.name, insts[i].zone)
            for i in ids):
        return False  # a placement-group gang outside its own group (where the provider keeps groups), likewise
    return True


def _use_now(desired: DesiredState, observed: Observed, tenant: str) -> dict[str, float]:
    use = dict.fromkeys(DIMS, 0.0)
    for j in desired.jobs.values():
        n = len(observed.placements.get(j.name, ()))
        if j.spec.tenant == tenant and n:
            r = j.spec.resources
            for k, v in (("gpus", r.gpus), ("cpu", r.cpu), ("memory_gib", r.memory_gib)):
                use[k] += v * n
    return use


def _fleet_rules_broken_now(desired: DesiredState, observed: Observed) -> bool:
    """Does the fleet as it runs break a rule the checks above know (budgets, pools, quotas,
    tenant budgets and spot shares, the spot share, buffer and diversity)? Then something must
    give. The fleet as it runs is checked as a plan that keeps everything where it is; and then
    without the jobs whose resources changed (they restart, so they cannot stay as they run: a tenant's
    spot share that holds only with such a job, which then has no room, may take its spot work, fleet37), nor the jobs
    whose placement a rule breaks (they must leave where they run: t2's spot share held only with its spot-required
    j5 on an on-demand host; without it t2 ran all its work on spot, and its j0 had to go too, fleet59)."""
    return _broken_as(desired, observed, lambda name: True) or _broken_as(
        desired, observed, lambda name: not reshaped(desired.jobs[name], observed)
        and len(observed.placements[name]) >= desired.jobs[name].spec.replicas  # (a gang grown or short restarts too: fleet68)
        and _legal_now(desired.jobs[name], observed, desired, _NO_CHANGES))


def _broken_as(desired: DesiredState, observed: Observed, stays) -> bool:
    """Does the fleet with its running jobs `stays(name)` where they run break a rule the checks know?"""
    hosts = fleet_after(observed, _NO_CHANGES, desired)
    jobs = []
    for name, ids in sorted(observed.placements.items()):
        if name in desired.jobs and ids and all(i in hosts for i in ids) and stays(name):
            rec = observed.gpu_indices.get(name, ())
            gpus = tuple(tuple(g) for g in rec) if len(rec) == len(ids) else ((),) * len(ids)
            jobs.append(JobChange(name, desired.jobs[name].spec.tenant, "keep", tuple(ids), tuple(ids), "", gpus))
    as_it_runs = Plan("", "", "", "", (), (), tuple(jobs), 0.0, sum(h.price for h in hosts.values()), None)  # type: ignore[arg-type]
    try:
        reps = replicas_of(as_it_runs, hosts)
        _check_tenants(desired, reps)
        _check_pools(desired, observed, as_it_runs, hosts, as_it_runs=True)
        _check_spot(desired, hosts, reps)
        _check_guardrails(desired, as_it_runs, hosts)
        _check_licenses(desired, reps)  # (a license count lowered below what is held: audit21 saw it flag the planner's eviction)
    except AssertionError:
        return True
    return False


def _could_stay_without(desired: DesiredState, observed: Observed, plan: Plan, evicted, own: list[str]) -> bool:
    """Would the plan keep every rule with the evicted job kept where it runs (on the GPUs it ran on) and its tenant's
    new work `own` left pending? Only then is its stop for that work (a swap); where it could not stay even so (its
    room went to another tenant's reclaim, or a higher class's; a rule the kept instance would break), the stop is
    not for its tenant's work, which need not wait a plan behind it (fleet47, fleet52)."""
    from dataclasses import replace

    rec = observed.gpu_indices.get(evicted.job, ())
    gpus = tuple(tuple(g) for g in rec) if len(rec) == len(evicted.previous) else ()
    jobs = []
    for jc in plan.jobs:
        if jc.job == evicted.job:
            jc = replace(jc, action="keep", instances=tuple(evicted.previous), gpus=gpus)
        elif jc.job in own:
            jc = replace(jc, action="pending", instances=(), gpus=())
        jobs.append(jc)
    deletes = tuple(d for d in plan.deletes if d.instance_id not in evicted.previous)
    variant = replace(plan, jobs=tuple(jobs), deletes=deletes)
    hosts = fleet_after(observed, variant, desired)
    try:
        reps = replicas_of(variant, hosts)
        _check_gpu_indices(desired, reps)
        _check_capacity(desired, hosts, reps)
        _check_tenants(desired, reps)
        _check_pools(desired, observed, variant, hosts)
        _check_spot(desired, hosts, reps)
        _check_guardrails(desired, variant, hosts)
        _check_licenses(desired, reps)
    except AssertionError:
        return False
    return True


def _stood_in(desired: DesiredState, observed: Observed, plan: Plan, name: str) -> bool:
    """Whether the plan keeps (in place or moved) as many running jobs identical to `name` (the same spec: tenant,
    priority, resources, everything but the name) as there are protected ones among them: then the tenant keeps its
    guaranteed work, an identical job standing in for the evicted one (jobs alike are interchangeable; which of them
    a plan keeps follows the instances it keeps)."""
    spec = desired.jobs[name].spec
    alike = [j.name for j in desired.jobs.values() if j.spec == spec and observed.placements.get(j.name)]
    protected = set(protected_jobs(desired, observed, spec.tenant))
    kept = {jc.job for jc in plan.jobs if jc.action in ("keep", "move")}
    return sum(j in kept for j in alike) >= sum(j in protected for j in alike)


def _room_taken(desired: DesiredState, observed: Observed, plan: Plan, name: str, higher: list[str],
                held_beside: list[str] | None = None) -> bool:
    """Whether its tenant's higher-class work `higher` takes the room of evicted job `name` (README, Tenants: guaranteed
    work gives way only to a higher class of its own tenant): some of it lands where the job ran, or where a job of the
    tenant that moved into that room ran, or on a new instance of the pool of one of those the plan deletes, where the
    pool ends at its max_instances (the slot bought again); or the tenant's guarantee cannot hold the job beside what
    the plan keeps of the tenant's work and that higher work (the job would borrow; `held_beside`: the higher work held
    there, where it is more than `higher`)."""
    if not higher:
        return False
    t = desired.jobs[name].spec.tenant
    room = set(observed.placements[name])
    on = {jc.job: set(jc.instances) for jc in plan.jobs}
    moved = [jc.job for jc in plan.jobs if jc.action == "move" and desired.jobs[jc.job].spec.tenant == t]
    pool_of = {i.id: i.pool for i in observed.instances} | {c.ref: c.site.pool for c in plan.creates}
    deleted = {d.instance_id for d in plan.deletes}
    after = Counter(pool_of[i] for i in pool_of if i not in deleted)
    while True:
        more = {i for k in moved if on[k] & room for i in observed.placements.get(k, ())}
        full = {pool_of[i] for i in room & deleted if pool_of.get(i) in desired.pools
                and after[pool_of[i]] >= desired.pools[pool_of[i]].spec.max_instances}
        more |= {c.ref for c in plan.creates if c.site.pool in full}
        more -= room
        if not more:
            break
        room |= more
    if any(on.get(k, set()) & room for k in higher):
        return True
    q = desired.tenants[t].spec.quota if t in desired.tenants else None
    if q is None:
        return False
    held = set(higher if held_beside is None else held_beside) | {jc.job for jc in plan.jobs if jc.action in ("keep", "move")}
    use = dict.fromkeys(DIMS, 0.0)
    for k in held | {name}:
        if desired.jobs[k].spec.tenant == t:
            r, n = desired.jobs[k].spec.resources, desired.jobs[k].spec.replicas
            for dim, v in (("gpus", r.gpus), ("cpu", r.cpu), ("memory_gib", r.memory_gib)):
                use[dim] += v * n
    asks = desired.jobs[name].spec.resources
    return any(quota_guarantee(q, k) is not None and use[k] > quota_guarantee(q, k) + EPS and getattr(asks, k) for k in DIMS)


def check_stability(desired: DesiredState, observed: Observed, plan: Plan) -> None:
    """Issue 18: running work that may stay where it is stays, unless a rule the README names
    requires otherwise. An evicted job must have one: it changed (grown gang, new resources),
    its placement broke a rule, higher-class work of its own tenant came, its tenant borrows
    (over its guarantee) or is over its ceiling, or the fleet as it runs breaks a fleet-wide
    rule. A tenant's protected jobs (`protected_jobs`) are never evicted for its borrowing or
    other tenants' work. And no replica moves to a new instance identical in pool, zone, type,
    market and price to the one it leaves, which is deleted."""
    placed_before = {j for j, ids in observed.placements.items() if ids}
    placed_now = {jc.job for jc in plan.jobs if jc.action in ("keep", "place", "move")}
    must_leave = {j for j in placed_before if j in desired.jobs and not _legal_now(desired.jobs[j], observed, desired, _NO_CHANGES)}
    broken = None
    for jc in plan.jobs:
        if jc.action != "evict":
            continue
        job = desired.jobs[jc.job]
        t = job.spec.tenant
        if changed(job, observed) or not _legal_now(job, observed, desired, plan):
            continue
        klass = priority_class(job.spec.priority_weight())
        higher = [k for k in desired.jobs
                  if k in placed_now and (k not in placed_before or changed(desired.jobs[k], observed) or k in must_leave)
                  and desired.jobs[k].spec.tenant == t and priority_class(desired.jobs[k].spec.priority_weight()) > klass]
        if desired.placement.preemption == "LowerPriority" and _room_taken(desired, observed, plan, jc.job, higher):
            continue  # a higher class of its tenant (new, changed, or running where a rule moves it: README, it counts as new work)
        q = desired.tenants[t].spec.quota if t in desired.tenants else None
        use = _use_now(desired, observed, t)
        if q is not None and any(q.cap(k) is not None and use[k] > q.cap(k) + EPS for k in DIMS):
            continue  # its tenant is over its ceiling: some of its work must go
        if broken is None:
            broken = _fleet_rules_broken_now(desired, observed)
        if broken:
            continue
        protected = jc.job in protected_jobs(desired, observed, t) and not _stood_in(desired, observed, plan, jc.job)
        borrowing = q is not None and any(quota_guarantee(q, k) is not None and use[k] > quota_guarantee(q, k) + EPS for k in DIMS)
        assert borrowing and not protected, (
            f"{jc.job} ({t}, {job.spec.priority}) evicted from {jc.previous} with no rule requiring it"
            + (" (inside its tenant's guarantee)" if protected else "") + f": {jc.reason}")
        # (borrowed work is reclaimed for others: never stopped for new work of its own tenant of its class or below, of
        # any class under preemption: Never, README "Priorities"; fleet30 and tests/test_stability.py's new job beside a
        # running one of its class)
        own = sorted(k for k in placed_now if (k not in placed_before or changed(desired.jobs[k], observed))
                     and desired.jobs[k].spec.tenant == t and (desired.placement.preemption == "Never"
                                                               or priority_class(desired.jobs[k].spec.priority_weight()) <= klass))
        assert not own or not _could_stay_without(desired, observed, plan, jc, own), (
            f"{jc.job} ({t}, {job.spec.priority}) evicted from {jc.previous} while its tenant places new work of its class "
            f"or below, {own[:5]}, without which it could stay: {jc.reason}")
    insts = {i.id: i for i in observed.instances}
    creates = {c.ref: c for c in plan.creates}
    deleted = {d.instance_id for d in plan.deletes}
    for jc in plan.jobs:
        if jc.action != "move":
            continue
        for old, new in zip(jc.previous, jc.instances):
            if old in deleted and new in creates and old in insts:
                i, c = insts[old], creates[new]
                o = _offering(observed, i.cloud, i.region, i.zone, i.instance_type)
                price = (o.spot_price if i.market == "spot" else o.on_demand_price) if o else None
                # (an instance launched into a gang's placement group is not one outside it: a
                # placement-group gang can only join new instances of its group)
                # (nor is one whose GPUs are partitioned otherwise: a new instance gets its pool's MIG layout)
                assert (i.pool, i.zone, i.instance_type, i.market, i.placement_group or None, sorted(_layout(i, desired))) != \
                    (c.pool, c.zone, c.instance_type, c.market, c.placement_group, sorted(_pool_layout(desired, c.pool))) \
                    or price is None or abs(price - c.price) > EPS, (
                    f"{jc.job} moves from {old} to {new}, an identical instance ({c.pool} {c.zone} {c.instance_type} {c.market} ${c.price}/h): {jc.reason}")
    # No instance is bought to stand idle (the next plan would delete it), unless its pool's
    # minimum needs it or spot capacity is in the fleet (the spot share and buffer count on-demand capacity).
    hosts = fleet_after(observed, plan, desired)
    hosting = {i for jc in plan.jobs for i in jc.instances}
    per_pool = Counter(h.pool for h in hosts.values())
    any_spot = any(h.market == "spot" for h in hosts.values())
    gpu_fleet = any(h.shape.gpus for h in hosts.values())
    for c in plan.creates:
        if c.ref not in hosting:
            lo = desired.pools[c.pool].spec.min_instances
            assert per_pool[c.pool] <= lo or any_spot and (c.market == "spot" or hosts[c.ref].shape.gpus or not gpu_fleet), (
                f"{c.ref} ({c.pool} {c.instance_type} {c.market}) is bought to stand idle")
