"""The placement rules: which work may go on which capacity, and how much of it fits there; and the
rules of who may take whose capacity (preemption, borrowing, moves). One definition each, read by the
problem's build, the freezer, the solver, greedy, the plan's checks and the diagnosis of pending work."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reconciler.ledger import pool_ok, quota_ok
from reconciler.model import region_matches
from reconciler.problem.types import DIMS, Capacity, Demand, Problem, TenantRules
from reconciler.words import amount


def has_room(free: dict[str, float], smallest: dict[str, float]) -> bool:
    """Could the smallest item still fit in what is free? `smallest` is, per dimension, the least
    any item asks. GPUs, vCPU and memory are needed together; a MIG item needs devices of its own
    profile only, so room in one profile is enough."""
    mig = [k for k, v in smallest.items() if k.startswith("mig:") and v > 0]
    if mig and not any(free.get(k, 0.0) >= smallest[k] - 1e-9 for k in mig):
        return False
    return all(free.get(k, 0.0) >= v - 1e-9 for k, v in smallest.items() if v > 0 and not k.startswith("mig:"))


# ---------------------------------------------------------------- placement rules
# One function a rule, each the refusal in words or None. placement_refusal asks them all in this order;
# the diagnosis of work nothing can host (diagnosis.why_nothing_fits) asks them one by one, to say which
# one leaves no capacity, instead of re-deriving them from pools and offerings.


def _kind(d: Demand, c: Capacity) -> str | None:
    """GPU model and MIG profile, whatever the count; CPU work stays off GPU instances."""
    if d.mig is not None:
        if c.gpu_type != d.gpu_type or not c.mig or d.mig[0] not in c.mig:
            return f"its instance does not offer MIG {d.mig[0]} of {d.gpu_type}"
    elif d.gpus > 0:
        if c.gpu_type != d.gpu_type or c.mig:
            return f"its instance does not offer {amount(d.gpus, f'whole {d.gpu_type} GPUs')}"
    elif c.gpus > 0:
        return "CPU work does not run on GPU instances"  # tainted for GPU work, as GPU node pools usually are
    return None


def _gpu_count(d: Demand, c: Capacity) -> str | None:
    if d.mig is None and d.gpus > 0 and c.gpus < d.gpus:
        return f"its instance does not offer {amount(d.gpus, f'whole {d.gpu_type} GPUs')}"
    return None


def _nvlink(d: Demand, c: Capacity) -> str | None:
    if d.mig is None and d.gpus > 0 and d.nvlink and c.nvlink_domain < d.gpus // d.bundle:
        return "its instance has no NVLink domain large enough"
    return None


def _spot(d: Demand, c: Capacity) -> str | None:
    if d.spot == "never" and c.market == "spot" or d.spot == "required" and c.market != "spot":
        return f"the job's spot: {d.spot} excludes {c.market} instances"
    return None


def _pools(d: Demand, c: Capacity) -> str | None:
    if d.pools is not None and c.pool not in d.pools:
        return f"the job's pools allowlist ({', '.join(sorted(d.pools))}) excludes pool {c.pool}"
    return None


def _clouds(d: Demand, c: Capacity) -> str | None:
    if d.clouds is not None and c.cloud not in d.clouds:
        return f"the job's clouds allowlist ({', '.join(sorted(d.clouds))}) excludes {c.cloud}"
    return None


def _regions(d: Demand, c: Capacity) -> str | None:
    if d.regions is not None and not region_matches(list(d.regions), c.cloud, c.region):
        return f"the job's regions allowlist ({', '.join(d.regions)}) excludes {c.cloud}/{c.region}"
    return None


def _zones(d: Demand, c: Capacity) -> str | None:
    if d.zones is not None and (c.cloud, c.zone) not in d.zones:
        return f"{c.cloud}/{c.zone} is beyond the data's max_latency_ms"
    return None


PLACEMENT_RULES = {"kind": _kind, "gpus": _gpu_count, "nvlink": _nvlink, "spot": _spot, "pools": _pools, "clouds": _clouds,
                   "regions": _regions, "zones": _zones}
_ALL_RULES = tuple(PLACEMENT_RULES.values())


def placement_refusal(d: Demand, c: Capacity, rules: tuple[str, ...] | None = None) -> str | None:
    """The placement rule that keeps d off c, in words; None if none does. Every rule but size (GPU model,
    MIG, GPU count, NVLink, spot, pools, clouds, regions, latency), or only the named ones (PLACEMENT_RULES)."""
    for rule in _ALL_RULES if rules is None else (PLACEMENT_RULES[r] for r in rules):
        why = rule(d, c)
        if why is not None:
            return why
    return None


def rules_allow(d: Demand, c: Capacity) -> bool:
    """Every placement rule but size: placement_refusal finds none."""
    return placement_refusal(d, c) is None


def guardrail_refusal(guard, cloud: str, region: str) -> str | None:
    """The GuardrailPolicy's allowed regions and clouds: what keeps a site out of the fleet; None if allowed."""
    if not region_matches(guard.allowed_regions, cloud, region):
        return f"region {cloud}/{region} not allowed by the GuardrailPolicy"
    if guard.allowed_clouds is not None and cloud not in guard.allowed_clouds:
        return f"cloud {cloud} not allowed by the GuardrailPolicy"
    return None


def size_fit(d: Demand, c: Capacity) -> int:
    """How many items of d one empty instance of c holds by size alone (GPUs or MIG devices, vCPU, memory)."""
    return max(0, min(math.floor(c.cap(dim) / d.req(dim) + 1e-9) for dim in d.dims if d.req(dim) > 0))


def fit(d: Demand, c: Capacity) -> int:
    """How many items of d fit on one empty instance of c, honouring every placement rule (0: none)."""
    if not rules_allow(d, c):
        return 0
    return size_fit(d, c)


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
        self.shape_of: dict[str, int] = {}  # demand key -> its shape's number
        self.shapes: dict[tuple, int] = {}
        self.rows: list[dict[str, int]] = []  # per shape number: offer key -> fit
        self.row_of: dict[str, dict[str, int]] = {}  # demand key -> its shape's row
        # Two lookups by string, no tuple key built and hashed per ask: `at` is asked 680k times in a
        # 10k-job cold plan; by (shape, offer key) it was ~20% slower (a third of it building the tuple).

    def __call__(self, d: Demand, c: Capacity) -> int:
        return self.at(d, c.offer_key, c)

    def shape(self, d: Demand) -> int:
        """The number of d's fit_shape (demands of one shape share it)."""
        s = self.shape_of.get(d.key)
        if s is None:
            s = self.shapes.get(key := fit_shape(d))
            if s is None:
                s = self.shapes[key] = len(self.rows)
                self.rows.append({})
            self.shape_of[d.key] = s
        return s

    def at(self, d: Demand, offer_key: str, c: Capacity) -> int:
        """fit(d, c) where the caller knows c's offer key (building it is a third of a lookup's cost)."""
        row = self.row_of.get(d.key)
        if row is None:
            row = self.row_of[d.key] = self.rows[self.shape(d)]
        f = row.get(offer_key)
        if f is None:
            f = row[offer_key] = fit(d, c)
        return f


def running_use(demands) -> dict[str, dict[str, float]]:
    """Per tenant, what its running jobs that may run on as they do request. A job whose resources changed is not
    counted: it restarts in its new shape, new work that needs capacity it does not hold (as tenant_rules protects
    it not). Counted at its new size, one PR raising a running job from 1 to 2 T4s read its tenant over its quota
    now (2,092 of 2,091 GPUs on the applied 5k fleet): every host the tenant runs on was opened to the model and
    none frozen (21 s of CPU), and apply's re-check exempted every eviction of that tenant from its rules."""
    use: dict[str, dict[str, float]] = {}
    for d in demands:
        u = use.setdefault(d.tenant, {k: 0.0 for k in DIMS})
        items = d.running_items
        if d.reshaped:
            items -= sum(len(h) // d.bundle for j, h in d.running if j in d.reshaped)
        for k in DIMS:
            u[k] += d.req(k) * items
    return use


def wants_room(d: Demand) -> bool:
    """Has d jobs that need capacity they do not hold: jobs not running, running jobs whose resources changed
    (they restart in the new shape: new work, which may take a lower class's place in its tenant as any may), or a
    gang running fewer replicas than it asks (grown, or short of a reclaimed spot replica). Without the last, a
    normal gang grown past its instance's free room was offered no room where its tenant's low jobs ran: the plan
    evicted it, and the plan after the apply placed it anew in those jobs' room (the stable-run exploration)."""
    return d.running_jobs < len(d.jobs) or settled_jobs(d) < d.running_jobs


def settled_jobs(d: Demand) -> int:
    """d's running jobs that may run on as they run: not restarted in a new shape (Demand.reshaped), and running whole
    (a gang grown by a replica, or short of a reclaimed one, restarts or heals: it needs capacity it does not hold).
    The rest rank as new work: the tiers keeping running work do not count them, so they never take the place of
    their tenant's running jobs of their class (README, Stability). (Counted there, t3's low gang grown from 2 to 3
    replicas kept its third replica by stopping t3's running low j8 for the quota, a swap.)"""
    return sum(1 for job, ids in d.running if runs_settled(d, job, ids))


def runs_settled(d: Demand, job: str, ids) -> bool:
    """Whether running job `job` of d, on instances `ids`, may run on as it runs (settled_jobs). One that may not
    restarts or heals, so its running items may move where it restarts (moves.must_move): no move for other work."""
    return job not in d.reshaped and len(ids) >= d.replicas * d.bundle


def exceeds(use: dict[str, float], limits: dict[str, float]) -> bool:
    """Whether a tenant using `use` (per dimension) is above one of `limits` (its guarantee, or its ceiling)."""
    return not all(quota_ok(use.get(k, 0.0), 0.0, v) for k, v in limits.items())


def borrows(use: dict[str, float], rules: TenantRules) -> bool:
    """Whether a tenant using `use` (per dimension) is above its guarantee in one: the excess is borrowed."""
    return exceeds(use, rules.guarantee)


def borrowing_tenants(demands: list[Demand] | tuple[Demand, ...], tenants: dict[str, TenantRules]) -> set[str]:
    """Tenants whose running work exceeds their guarantee now: the excess may be reclaimed."""
    use = running_use(demands)
    return {t for t, r in tenants.items() if borrows(use.get(t, {}), r)}


def over_cap_tenants(demands: list[Demand] | tuple[Demand, ...], tenants: dict[str, TenantRules]) -> set[str]:
    """Tenants whose running work exceeds their ceiling now (a quota was lowered): some of it must go."""
    use = running_use(demands)
    return {t for t, r in tenants.items() if exceeds(use.get(t, {}), r.cap)}


def quota_shedding(demands, tenants: dict[str, TenantRules], preemption: str) -> dict[str, int]:
    """Tenant -> the class below which its running work may stop for its own pending work at its quota's ceiling: the
    highest class c whose pending work (of c and above) the ceiling cannot hold beside everything the tenant runs.
    Under preemption LowerPriority a higher class takes its tenant's lower job's place, here for the quota, whatever
    capacity either runs on; the room the stop frees is room for anyone's pending work of the shape. (Offered no
    variable there, t1's pending high j1 waited while t2's low j3 stopped on the one A10G host for t2's normal A100
    gang at t2's GPU quota, where greedy placed j1 in j3's room: the solver property tier, 2026-11-29.)"""
    if preemption != "LowerPriority":
        return {}
    use = running_use(demands)
    need: dict[str, dict[int, dict[str, float]]] = {}
    for d in demands:
        if d.tenant in tenants and tenants[d.tenant].cap and wants_room(d):
            per = need.setdefault(d.tenant, {}).setdefault(d.klass, {k: 0.0 for k in DIMS})
            for k in DIMS:
                per[k] += d.req(k) * d.replicas * (len(d.jobs) - settled_jobs(d))
    out: dict[str, int] = {}
    for t, by_class in need.items():
        cap, total = tenants[t].cap, {k: 0.0 for k in DIMS}
        for c in sorted(by_class, reverse=True):
            for k in DIMS:
                total[k] += by_class[c][k]
            if not all(quota_ok(use.get(t, {}).get(k, 0.0), total[k], v) for k, v in cap.items()):
                out[t] = c
                break
    return out


def forced_moves(problem: "Problem") -> dict[str, int]:
    """Items of each demand that must leave their instance whatever is decided (it goes, or they
    no longer fit there): under WhenEmpty, the only running work that may move."""
    return forced_items(problem.demands, problem.hosts())


def forced_items(demands, host_list) -> dict[str, int]:
    """forced_moves of these demands on these hosts (the freezer asks before the Problem exists): the items on a host
    that refuses them, and every item of a gang that runs split (`cannot_stay`'s reasons, counted per item)."""
    by_key = {d.key: d for d in demands}
    hosts = {c.instance_id: c for c in host_list}
    # A running gang that breaks its gang mode as it runs (replicas in two zones, say) moves whole.
    split = {(d.key, job) for d in demands for job, iids in d.running if gang_split(d, [hosts.get(i) for i in iids])}
    out: dict[str, int] = {}
    for h in host_list:
        for dk, job, n in h.residents:
            if dk in by_key and ((dk, job) in split or refuses(by_key[dk], h)):
                out[dk] = out.get(dk, 0) + n
    return out


def refuses(d: Demand, h, fits=None) -> bool:
    """Whether a host cannot keep d's work running on it: it must go (keep_blocker: its pool removed or drifted from,
    a region or cloud the guardrails no longer allow) or no longer fits d (a spot-required job on on-demand, an
    allowlist or latency cap it breaks). `fits`: fit, or a caller's cached OfferFits."""
    return h.keep_blocker is not None or (fits or fit)(d, h) == 0


def cannot_stay(d: Demand, hosts: list, fits=None) -> bool:
    """The one definition of a running job that cannot stay where it runs by its own rules, whatever a plan does: a
    host of it refuses it (`refuses`), or it is a gang that breaks its gang mode as it runs (split over zones; a
    same-instance gang over instances). `hosts`: the hosts of its replicas, None for one lost (no reason: the job is
    healed around its survivors). The model moves its items (forced_items), apply's re-check and the fleet that can
    stay count it as arriving work (ledger.jobs_that_must_leave), its tenant's guarantee does not protect it."""
    return any(h is not None and refuses(d, h, fits) for h in hosts) or gang_split(d, hosts)


def stuck_gangs(p: "Problem") -> set[str]:
    """Under WhenEmpty, running gangs none of whose items must leave their instance: the model
    lets them stay or stop, never move (`_Model._moves`); greedy and pending reasons alike."""
    if p.placement.consolidation != "WhenEmpty":
        return set()
    forced = forced_moves(p)
    return {d.key for d in p.demands if d.gang and d.running_jobs and d.key not in forced}


def gang_split(d: Demand, hosts: list) -> bool:
    """Do a running gang's hosts break its gang mode: one zone; one instance (instance); one type and all in its own
    cluster placement group (placement-group: a gang that ran as a zone gang before is in none, so it moves whole into
    one; where the provider has no groups, Host.group_of None, one type is all)? A same-instance gang is one item of
    `bundle` replicas, so `d.gang` is false for it (fleet15)."""
    if d.replicas * d.bundle < 2 or any(h is None for h in hosts):
        return False  # (a lost host: the gang is healed around its survivors)
    if len({(h.cloud, h.zone) for h in hosts}) > 1:
        return True
    if d.gang_mode == "instance":
        return len({h.instance_id for h in hosts}) > 1
    return d.gang_mode == "placement-group" and (len({h.instance_type for h in hosts}) > 1 or not in_own_group(d, hosts))


def in_own_group(d: Demand, hosts: list) -> bool:
    """Are a placement-group gang's hosts all in its own cluster placement group, where their providers keep groups?"""
    return not any(outside_group(d, h) for h in hosts)


def outside_group(d: Demand, h) -> bool:
    """Is host h, whose provider keeps placement groups, outside placement-group gang d's own group (in none, or in
    another's)? Its items there cannot stay (gang_split moves the gang whole) and no new item of d goes there."""
    return d.gang and d.gang_mode == "placement-group" and getattr(h, "group_of", None) is not None and h.group_of not in d.jobs


def pools_over_max(hosts, pool_bounds: dict[str, tuple[int, int]]) -> set[str]:
    """Pools running more instances than their max_instances now: some of their instances must go, and which is the
    search's choice (the freezer solves their hosts; the model offers their work room as new work's)."""
    per_pool: dict[str, int] = {}
    for h in hosts:
        per_pool[h.pool] = per_pool.get(h.pool, 0) + 1
    return {p for p, n in per_pool.items() if p in pool_bounds and not pool_ok(n, 0, pool_bounds[p][1])}


def may_preempt(p: Demand, r: Demand, borrowing: set[str], preemption: str) -> bool:
    """Could pending work p ever evict running work r? Inside one tenant, a higher class may
    (PlacementPolicy preemption: LowerPriority); across tenants only borrowed work is taken,
    to give a guarantee back or to a higher class. Guaranteed work is never taken by others."""
    if p.tenant == r.tenant:
        return preemption == "LowerPriority" and p.klass > r.klass
    return r.tenant in borrowing and (p.tenant not in borrowing or p.klass > r.klass)


@dataclass(frozen=True)
class Rival:
    """The part of a demand `may_preempt` reads: its tenant and class."""

    tenant: str
    klass: int
