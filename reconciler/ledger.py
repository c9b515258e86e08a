"""The ledger: one definition of what a replica costs its tenant (its charge) and of the
fleet-wide rules a finished plan is measured by.

Pure. `charge` is what tenant budgets, status/, explain and pending reasons all quote: a
replica pays its share of its instance's price, in the instance's primary resource (GPUs;
compute slices of 7 per GPU for MIG; vCPU on CPU instances). `Ledger` holds the fleet a
plan leaves (instances kept and created, the items on them), or that greedy is building,
and answers, for one more instance, item or job, which rule refuses it, with the plan's own
numbers: greedy, diagnosis and explain read the rules here instead of re-deriving them. The test oracle (tests/invariants.py) keeps
its own, independent copy of the rules.
"""

from __future__ import annotations

import heapq
import math
import weakref
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from providers.catalog import load_catalog
from reconciler.site import Host
from reconciler.words import amount

GPU_SLICES = 7  # MIG compute slices of one GPU


@lru_cache(maxsize=1)
def _mig_compute() -> dict[str, int]:
    out: dict[str, int] = {}
    for m in load_catalog().gpu_models.values():
        for p in m.mig_profiles.values():
            out.setdefault(p.name, p.compute)
    return out


def mig_compute(profile: str) -> int:
    """Compute slices (of 7) of one MIG device of this profile."""
    return _mig_compute().get(profile, 1)


def instance_share(gpus: float, mig_slices: float, cpu: float, inst_gpus: float, inst_cpu: float) -> float:
    """The fraction of an instance a replica (or an item of several) uses, in the instance's
    primary resource: GPUs, MIG compute slices, or vCPU on a CPU instance (or by a CPU job)."""
    if inst_gpus:
        if mig_slices:
            return min(1.0, mig_slices / (GPU_SLICES * inst_gpus))
        return min(1.0, gpus / inst_gpus) if gpus else min(1.0, cpu / inst_cpu)
    return min(1.0, cpu / inst_cpu) if inst_cpu else 1.0


def item_share(d, c) -> float:
    """instance_share of one item of demand d on capacity c."""
    slices = mig_compute(d.mig[0]) * d.mig[1] if d.mig is not None and c.mig else 0
    return instance_share(d.gpus, slices, d.cpu, c.gpus, c.cpu)


def charge(d, c) -> float:
    """USD/h one item of demand d on capacity c costs its tenant."""
    return c.price * item_share(d, c)


def replica_charge(resources, inst_gpus: float, inst_cpu: float, price: float) -> float:
    """USD/h one replica (a Job's `resources`) costs its tenant on an instance of this shape and price."""
    slices = mig_compute(resources.mig.profile) * resources.mig.count if resources.mig is not None else 0
    return price * instance_share(resources.gpus, slices, resources.cpu, inst_gpus, inst_cpu)


def money(x: float) -> str:
    """$1,234.50; a negative amount as -$8.22 (not $-8.22); -0 as $0.00."""
    x = round(float(x), 2) + 0.0
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def round_up(x: float, unit: float) -> float:
    """x rounded up to a whole number of `unit`s, float noise (1e-6 of a unit) aside: a shortfall raised by this
    much is met. One rule for the pending reasons' shortfalls and explain's raises."""
    return math.ceil(round(float(x) / unit, 6)) * unit


def money_short(x: float) -> str:
    """A shortfall in $/h, rounded up to the cent (money() rounds to the nearest: "$17.06/h more budget" where
    explain's raise, rounded up, said $17.07)."""
    return money(round_up(x, 0.01))


def spot_units(capacities, gpu_fleet: bool | None = None) -> tuple[str, object]:
    """What the spot share and the on-demand buffer count: GPUs in a GPU fleet (CPU instances
    count 0), vCPUs in a CPU-only fleet. A fleet is a GPU fleet when its pools offer any GPU type
    (`Problem.gpu_fleet`), whether or not the plan can buy or use one now: else a spot price over
    the cap in a GPU pool, or no GPU job today, turned the share into vCPUs and evicted running CPU
    spot work (property tier). Without the flag: GPUs if any of these capacities has them.
    (problem.spot_measure is this.)"""
    if gpu_fleet if gpu_fleet is not None else any(c.gpus for c in capacities):
        return "gpus", lambda c: c.gpus
    return "cpu", lambda c: c.cpu


# How a reason starts when the job alone asks more than its tenant's quota allows: fleetview counts it "quota",
# whatever else the reason names (no other work placed otherwise would let it run).
OVER_QUOTA_ALONE = "quota: the job needs"
# What a reason says of a Reservation at its count ("reservation <name> ..."): fleetview counts it "reservation".
RESERVATION_FULL = "is fully used in this plan"
# The dimensions a job asks and a tenant's quota counts, and the words their amounts are said in (reasons, explain).
DIMS = ("gpus", "cpu", "memory_gib")
DIM_UNITS = {"gpus": "GPUs", "cpu": "vCPU", "memory_gib": "GiB memory"}


# ---------------------------------------------------------------- the rules, as arithmetic on plain numbers
# Each fleet-wide rule's unit, comparison and tolerance, once: greedy (incrementally), the packer's repairs, the
# freezer, the Ledger's refusals and broken rules, the guardrail re-check and the CP-SAT model's coefficients all
# call these. Callers add what they count; these compare.

EPS = 1e-9  # sums of float vCPUs and shares: a rule holds within this (one tolerance for every rule but budgets)
MILLI = 1000  # the cost objective's money unit: USD/h as integer milli-dollars
MICRO = 1_000_000  # the budgets' money unit: USD/h as integer micro-dollars (`micro`)


def within(amount: float, limit: float) -> bool:
    """amount <= limit, within the float tolerance."""
    return amount <= limit + EPS


def micro(usd: float) -> int:
    """USD/h as every budget counts it: integer micro-dollars, to the nearest. A budget adds `micro` of each
    instance's price (the fleet's) or of each item's charge (a tenant's) and compares the sum with `micro` of the
    budget (budget_ok), so greedy, the ledger, the packer, the freezer, apply's re-check and the CP-SAT rows add the
    same integers and no answer one accepts another refuses. (The model had rounded each price up to the
    milli-dollar and the budget down while greedy summed floats: greedy's answer at $5,999.995/h of a $6,000 budget
    read $6,000.145 to the model, which could not complete it, so every plan near its budget was greedy's.)
    Catalog prices have at most 6 decimals: their sums are exact."""
    return round(usd * MICRO)


def budget_ok(spend: int, budget: float | None) -> bool:
    """A fleet's (max_hourly_budget) or a tenant's (tenant_hourly_budgets) budget: `spend`, in micro-dollars/h
    (`micro` of each price or charge, summed: what is spent plus what is added), keeps it; no budget keeps anything."""
    return budget is None or spend <= micro(budget)


def pool_ok(count: int, add: int, max_instances: int) -> bool:
    """A pool's max_instances: `count` instances and `add` more."""
    return count + add <= max_instances


def reservation_over(count: int, add: int, reserved: int) -> int:
    """A Reservation of `reserved` instances: how many `count` instances in it (kept and launched into it) and `add`
    more would be over it; 0 within it."""
    return max(0, count + add - reserved)


def pool_min_ok(count: int, min_instances: int) -> bool:
    """A pool's min_instances: `count` instances meet it."""
    return count >= min_instances


def capacity_kind(d) -> tuple:
    """The kind of capacity a demand takes, as pending reasons compare jobs by it: GPU model, whether GPUs, whether MIG."""
    return (d.gpu_type, d.gpus > 0, bool(d.mig))


def quota_ok(used: float, need: float, limit: float) -> bool:
    """A tenant's quota (or burst ceiling) in one dimension: `used` and `need` more keep it."""
    return within(used + need, limit)


def may_borrow(rules) -> bool:
    """Whether a tenant (its TenantRules) may run work beyond its guarantee (a ceiling above it in a guaranteed
    dimension): only then is any of its work borrowed, the part the model's tiers rank after every tenant's guaranteed
    work (solve/model.py splits it, solve/objective.py ranks it); all of any other tenant's work is guaranteed."""
    return bool(borrow_dims(rules.cap, rules.guarantee))


def borrow_dims(cap: dict[str, float], guarantee: dict[str, float]) -> list[str]:
    """The dimensions a tenant may borrow in: guaranteed, with a ceiling above the guarantee (a dimension left out is
    unlimited and fully guaranteed: nothing of it is borrowed)."""
    return [dim for dim, v in guarantee.items() if cap.get(dim, math.inf) > v + 1e-9]


def borrow_room(rules, dim: str) -> float:
    """What a tenant may borrow in `dim`: its ceiling above its guarantee (unlimited where it has no ceiling there)."""
    return rules.cap.get(dim, math.inf) - rules.guarantee.get(dim, 0.0)


def share_weight(weight: float) -> float:
    """A tenant's weight (TenantRules.weight) as its borrowed share is divided by it (README, Tenants: weighted DRF):
    never below 1e-3, so a share over it stays finite. The one definition: `borrowed_share`, `fair_share_level` (the
    model's step) and bench/philly's water-fill read it (it was defined twice,
    `share_weight(rules)` beside `share_weight_of(weight)`)."""
    return max(weight, 1e-3)


def share_capacity(rules, fleet_capacity: dict[str, float]) -> float:
    """The fleet's capacity in the tenant's dominant dimension (rules.dominant), its borrowed share's denominator; 0
    where the fleet has none: no share is counted there."""
    return max(0.0, fleet_capacity.get(rules.dominant) or 0.0)


def fair_share_level(reach: list[tuple[float, float]], free: float) -> float:
    """The share over weight borrowers reach when `free` is water-filled over them, each (its reach, its weight) taking
    weight x level up to its reach (all in one unit, e.g. per mille of the fleet): where the fair share's equalising is
    decided, so the model's utility steps are sized by it rather than by the whole fleet (objective.fair_share_tier)."""
    left, level, weights = max(0.0, free), 0.0, sum(share_weight(w) for _, w in reach)
    for r, w in sorted(reach, key=lambda rw: rw[0] / share_weight(rw[1])):
        top = r / share_weight(w)
        need = (top - level) * weights
        if need >= left:
            return level + left / weights
        left, level, weights = left - need, top, weights - share_weight(w)
    return level


def borrowed_share(rules, use: dict[str, float], fleet_capacity: dict[str, float]) -> float:
    """README, Tenants: a tenant's borrowed share, the one measure borrowed capacity is split by: what it uses above its
    guarantee in its dominant dimension (none where that dimension is fully guaranteed), at most its room above the
    guarantee (`borrow_room`), over the fleet's capacity there (`share_capacity`), over its weight (`share_weight`).
    Greedy lends the next borrowed job to the tenant of the least half way through it (`lending_share`); the model's
    fair-share tier equalises the same measure of its borrowed part (solve/objective.fair_share_tier)."""
    dim, cap = rules.dominant, share_capacity(rules, fleet_capacity)
    if cap <= 0:
        return 0.0
    over = min(use.get(dim, 0.0) - rules.guarantee.get(dim, math.inf), borrow_room(rules, dim))
    return max(0.0, over) / cap / share_weight(rules.weight)


def lending_share(rules, use: dict[str, float], d, fleet_capacity: dict[str, float]) -> float:
    """README, Tenants: where greedy lends the next borrowed job: to the tenant whose borrowed share (`borrowed_share`)
    half way through one more job of d is least. The model's fair-share utility is concave, its slope falling step by
    step with share over weight, so a job is worth about its slope half way through the share it adds: ranked by the
    share before it, c at weight 0.1 took a 1-GPU job worth 10 of a's and b's GPUs to its share while their third
    waited (greedy 3/2/1 of 6 borrowed GPUs, CP-SAT 3/3/0)."""
    after = {k: v + d.req(k) * d.replicas for k, v in use.items()}
    return (borrowed_share(rules, use, fleet_capacity) + borrowed_share(rules, after, fleet_capacity)) / 2


def spot_share_ok(spot: float, total: float, fraction: float) -> bool:
    """max_spot_fraction (fleet, in spot_units) or a tenant's (in work units): spot <= fraction x total."""
    return within(spot, fraction * total)


def buffer_ok(idle: float, spot: float, percent: float) -> bool:
    """on_demand_buffer_percent: the idle on-demand capacity is at least `percent` % of the spot capacity
    (both in spot_units). No spot, or no buffer asked: it holds."""
    return percent <= 0 or not spot or idle * 100 >= percent * spot - EPS


def diversity_ok(types: int, zones: int, min_instance_types: int, min_zones: int) -> bool:
    """SpotPolicy diversity: the spot capacity spans enough instance types and zones."""
    return types >= min_instance_types and zones >= min_zones


def item_units(d, dim: str) -> float:
    """What one item of d uses of the spot share's unit `dim`: a MIG item its compute slices / 7 of a GPU."""
    return d.size / GPU_SLICES if dim == "gpus" and d.mig else d.req(dim)


def buffer_use(d, dim: str) -> float:
    """What one item of d takes of the on-demand buffer's idle capacity: item_units, none for deadline-critical
    work (it may use the buffer's capacity)."""
    return 0.0 if d.deadline_critical else item_units(d, dim)


def work_units(d) -> int:
    """What one item of d counts in its tenant's spot share: its size (7 per GPU, a MIG slice 1, CPU work 1)."""
    return d.size


def tenant_spot_drops(jobs: list[tuple[str, int, int]], fraction: float) -> list[str]:
    """Which of a tenant's jobs to take out so its spot share holds again, fewest first in the
    given order. `jobs` is (job, work units on spot, work units in all) per placed job, the ones
    the plan may take out first (new spot work before running spot work). A packed plan needs
    this where the packer could not hold on-demand work the solver counted in the tenant's
    share (the model counts new instances per offer): the spot work stayed, its total shrank."""
    on = sum(s for _, s, _ in jobs)
    tot = sum(t for _, _, t in jobs)
    drops = []
    for job, s, t in jobs:
        if spot_share_ok(on, tot, fraction):
            break
        if s:
            drops.append(job)
            on, tot = on - s, tot - t
    return drops


def milli_down(usd: float) -> int:
    """A price as the benchmark's bounds count it: rounded down, so a bound is never above a plan's exact $/h."""
    return math.floor(usd * MILLI)


# The spot share and the on-demand buffer as integer rows (CP-SAT: the solver's fleet rules, a tenant's spot share,
# load's bound on what pool minimums cost). Exact for the decimal the config wrote, so a row accepts what
# spot_share_ok and buffer_ok accept: each scale is the smallest multiple of its base that makes the coefficient whole.
# (The share had been rounded to the per mille, the buffer to 1/700 % in the solver and 1/1000 % in load: at
# max_spot_fraction 0.0625 the rows refused 1 spot GPU of 16, at on_demand_buffer_percent 3.125 the solver refused 1
# idle GPU beside 32 spot, both of which greedy, load and apply's re-check accepted.) The config's decimals are
# bounded (model.SpotPolicySpec) so the float checks' tolerance (EPS) cannot accept what a row refuses.
SHARE_SCALE = 1000  # the share row's base: x 1000 (a per-mille fraction's coefficient is whole)
BUFFER_SCALE = 70000  # the buffer row's base: 7 x 10000, so a MIG item's compute slices / 7 of a GPU count exactly


def _decimal(x: float) -> Fraction:
    """The decimal a config wrote (the shortest that reads back as this float), exactly."""
    return Fraction(repr(float(x)))


def share_row(fraction: float) -> tuple[int, int]:
    """max_spot_fraction (the fleet's or a tenant's) as integers (scale, coef): the share holds iff
    scale x spot <= coef x total, exactly as spot_share_ok."""
    c = _decimal(fraction) * SHARE_SCALE
    return SHARE_SCALE * c.denominator, c.numerator


def buffer_row(percent: float) -> tuple[int, int]:
    """on_demand_buffer_percent as integers (scale, coef): the buffer holds iff scale x idle >= coef x spot, exactly
    as buffer_ok."""
    c = _decimal(percent) * BUFFER_SCALE / 100
    return BUFFER_SCALE * c.denominator, c.numerator



# ---------------------------------------------------------------- floating licenses


@dataclass(frozen=True)
class LicenseRules:
    """A License document as the planner reads it."""

    name: str
    count: int
    tenant_quotas: dict[str, int]
    cost_per_hour: float = 0.0


def license_need(d) -> dict[str, int]:
    """Licenses one job of demand d holds while it runs (every replica holds its own)."""
    return {name: n * d.replicas for name, n in d.licenses}


def license_charge(per_replica: dict[str, int], licenses: dict, replicas: int = 1) -> float:
    """USD/h the licenses of `replicas` running replicas cost their tenant (`licenses`: name ->
    LicenseRules or anything with cost_per_hour)."""
    return sum(n * replicas * licenses[name].cost_per_hour for name, n in per_replica.items() if name in licenses)


# ---------------------------------------------------------------- cloud account quotas


def quota_units(q, c) -> int:
    """Units (vCPUs, GPUs, instances) one new instance of capacity c counts against cloud quota q (a
    providers.base.Quota): 0 unless q covers c's cloud and region (a quota without a region covers them all) and
    c's type and market. Whole units: clouds count whole vCPUs and GPUs."""
    if q.cloud != c.cloud or (q.region and q.region != c.region):
        return 0
    for itype, market, units in q.counts:
        if itype == c.instance_type and market == c.market:
            return math.ceil(units - EPS)
    return 0


def quota_headroom(q) -> int:
    """What new instances may still take of quota q: its limit less what the account uses now. Usage includes the
    fleet's own instances, and apply creates before it deletes (make before break), so an instance the plan deletes
    frees its units for the next run, not for this plan's creates."""
    return max(0, quota_room(q))


def quota_room(q) -> int:
    """Whole units of quota q left, negative where the account is over it already (quota_headroom clamps it at 0)."""
    return math.floor(q.limit - q.used + EPS)


def quota_scope(q) -> str:
    return f"{q.cloud} {q.name} in {q.region or 'all regions'}"


class QuotaBook:
    """Units of each cloud quota the new instances of a plan take, against its headroom: what the solver's quota
    rows count, kept by greedy, the packer's repairs, the plan's ledger and pending reasons alike."""

    def __init__(self, quotas, floor_gaps: dict[str, tuple[tuple[str, int, str], ...]] | None = None) -> None:
        """`floor_gaps`: Problem.quota_floor_gaps, the pool minimums each quota holds back (only words read them)."""
        self.quotas = tuple(quotas)
        self.taken = [0] * len(self.quotas)
        self._units: dict[tuple, tuple[tuple[int, int], ...]] = {}
        self.held_back: dict[str, list[tuple[str, int, str]]] = {}  # quota_scope -> (pool, units, "1 m6i.4xlarge")
        for pool, gaps in sorted((floor_gaps or {}).items()):
            for scope, units, what in gaps:
                self.held_back.setdefault(scope, []).append((pool, units, what))

    def units(self, c) -> tuple[tuple[int, int], ...]:
        """(quota index, units) of every quota one new instance of c counts against."""
        k = (c.cloud, c.region, c.instance_type, c.market)
        u = self._units.get(k)
        if u is None:
            u = self._units[k] = tuple((i, n) for i, q in enumerate(self.quotas) if (n := quota_units(q, c)))
        return u

    def short(self, c, n: int = 1, extra=None) -> tuple[int, int] | None:
        """(quota index, units over its headroom) of the first quota n more new instances of c would exceed;
        `extra`: (capacity, count) pairs planned but not taken yet."""
        return next(iter(self.shorts(c, n, extra)), None)

    def shorts(self, c, n: int = 1, extra=None) -> list[tuple[int, int]]:
        """(quota index, units over its headroom) of every quota n more new instances of c would exceed (`short`).
        The units over count from the limit, not from a headroom clamped at 0: an account already 48 over its quota
        needs a raise of the job's units and those 48 (explain's first raise fell short by them)."""
        out = []
        for i, u in self.units(c):
            more = sum(k * v for x, k in (extra or ()) for j, v in self.units(x) if j == i)
            over = self.taken[i] + more + n * u - quota_room(self.quotas[i])
            if over > 0:
                out.append((i, over))
        return out

    def take(self, c, n: int = 1) -> None:
        for i, u in self.units(c):
            self.taken[i] += n * u

    def message(self, i: int, c, n: int) -> str:
        """"cloud quota: aws Running On-Demand P instances (L-417A185B) in us-east-1: 96 of 96 vCPUs used; the job
        needs 1 more p4d.24xlarge (96 vCPUs); raise it: ..." with the plan's own use of it."""
        q, u = self.quotas[i], quota_units(self.quotas[i], c)
        plan = f", and this plan's new instances take {self.taken[i]:g} more" if self.taken[i] else ""
        raise_it = f"; raise it: {q.how_to_raise}" if q.how_to_raise else ""
        return (f"cloud quota: {quota_scope(q)}: {q.used:g} of {amount(q.limit, q.unit)} used{plan}{self._held_back_text(i)}; the job "
                f"needs {n} more {c.instance_type} {c.market} ({amount(n * u, q.unit)}){raise_it}")

    def held_back_units(self, i: int) -> int:
        """Units of quota i the pool minimums it holds back would take first, were it raised."""
        return sum(units for _, units, _ in self.held_back.get(quota_scope(self.quotas[i]), ()))

    def _held_back_text(self, i: int) -> str:
        """", and pool minimums it holds back take 16 more first (aws-cpu: 1 m6i.4xlarge)", or "": a raise of the quota
        by the job's units alone went to the minimum, and the job stayed pending."""
        gaps = self.held_back.get(quota_scope(self.quotas[i]))
        if not gaps:
            return ""
        pools = ", ".join(f"{pool}: {what}" for pool, _, what in gaps)
        return f", and pool minimums it holds back take {self.held_back_units(i):g} more first ({pools})"

    def summary(self) -> dict[str, dict]:
        """Per quota: its limit, the account's use when read, what the plan's new instances take, what is left."""
        return {quota_scope(q): {"limit": q.limit, "used": q.used, "unit": q.unit, "plan_takes": self.taken[i],
                                 "left": quota_headroom(q) - self.taken[i]} for i, q in enumerate(self.quotas)}


@dataclass(frozen=True)
class ReservationRules:
    """A Reservation in force, as the planner reads it."""

    name: str
    pool: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    count: int
    hourly_cost: float  # USD per reserved instance-hour, paid used or not
    target: str | None = None  # the cloud's reservation id
    until: str | None = None


def reservation_cost(count: int, used: int, hourly_cost: float) -> tuple[float, float, float]:
    """(utilisation, USD/h committed, USD/h wasted) of a reservation of `count` instances with
    `used` of them running: all of it is paid; the unused part is the waste."""
    used = min(used, count)
    return round(used / count, 4), round(count * hourly_cost, 4), round((count - used) * hourly_cost, 4)


@dataclass(frozen=True)
class LicenseShort:
    """Why a job cannot hold its licenses: `scope` is "count" (the License's) or "tenant" (its tenant quota)."""

    license: str
    scope: str
    held: int
    limit: int
    need: int


class LicenseBook:
    """Licenses held, per license in all and per tenant, and by which jobs: what the solver's
    license constraints count, kept by greedy, the plan's ledger and pending reasons alike."""

    def __init__(self, rules: dict[str, LicenseRules]):
        self.rules = rules
        self.held: dict[str, int] = {n: 0 for n in rules}
        self.by_tenant: dict[tuple[str, str], int] = {}
        self.holders: dict[str, dict[str, tuple[str, int]]] = {n: {} for n in rules}  # license -> job -> (tenant, held)

    def short(self, d) -> LicenseShort | None:
        """The first license (by name) one more job of d would hold beyond its tenant's quota or its count."""
        return next(iter(self.shorts(d)), None)

    def shorts(self, d, may_take=None) -> list[LicenseShort]:
        """Every limit one more job of d would hold a license beyond, by license name, its tenant's quota of it before
        its count: each binds alone (a job needing 4 under a tenant quota of 2 and a count of 1 was said to wait for the
        tenant quota only, which raised left it pending). Beside its tenant's quota, a count only where the job alone
        needs more, or, given `may_take` (holding job -> whether d may ever take its seats), where the seats held by work
        it may never take leave too few: preempting the others could free the rest (a count of 2 held by its tenant's
        job and another tenant's critical one went unnamed, and the tenant's quota raised alone left the job pending)."""
        out = []
        for name, need in sorted(license_need(d).items()):
            r = self.rules.get(name)
            if r is None:
                continue
            q = r.tenant_quotas.get(d.tenant)
            tenant_short = q is not None and self.by_tenant.get((name, d.tenant), 0) + need > q
            if tenant_short:
                out.append(LicenseShort(name, "tenant", self.by_tenant.get((name, d.tenant), 0), q, need))
            if self.held[name] + need > r.count and (not tenant_short or need > r.count
                                                       or self._kept_from(name, may_take) + need > r.count):
                out.append(LicenseShort(name, "count", self.held[name], r.count, need))
        return out

    def _kept_from(self, name: str, may_take) -> int:
        """Seats of license `name` held by work a job may never take (`may_take`: holding job -> whether it may); with
        no `may_take`, none are known to be (any holder may be preempted)."""
        if may_take is None:
            return 0
        return self.held[name] - sum(n for job, (_, n) in self.holders[name].items() if may_take(job))

    def take(self, d, job: str = "", sign: int = 1) -> None:
        """Job `job` of d holds its licenses (sign -1: gives them back)."""
        for name, need in license_need(d).items():
            if name in self.rules:
                self.held[name] += sign * need
                k = (name, d.tenant)
                self.by_tenant[k] = self.by_tenant.get(k, 0) + sign * need
                if job:
                    h = self.holders[name]
                    n = h.get(job, (d.tenant, 0))[1] + sign * need
                    if n > 0:
                        h[job] = (d.tenant, n)
                    else:
                        h.pop(job, None)

    def message(self, s: LicenseShort, d, priority: dict[str, int] | None = None) -> str:
        """"license matlab: 50/50 held, by a, b, c and 47 more; the job needs 1": holders lowest
        priority first (those preemption would take first), then by name."""
        holders = {j: t for j, (t, _) in self.holders.get(s.license, {}).items() if s.scope == "count" or t == d.tenant}
        pri = priority or {}
        names = sorted(holders, key=lambda j: (pri.get(j, 0), j))
        by = (f", by {', '.join(names[:3])}" + (f" and {len(names) - 3} more" if len(names) > 3 else "")) if names else ""
        if s.need > s.limit:
            where = f"tenant {d.tenant}'s quota of it is {s.limit}" if s.scope == "tenant" else f"its count is {s.limit}"
            # (what is held beside it: a raise to what the job needs leaves it short)
            held = "" if not s.held else f" (tenant {d.tenant} holds {s.held} in this plan{by})" if s.scope == "tenant" else \
                f" ({s.held} held in this plan{by})"
            return f"license {s.license}: the job needs {s.need} but {where}{held}"
        if s.scope == "tenant":
            return f"license {s.license}: tenant {d.tenant} holds {s.held}/{s.limit} of its quota{by}; the job needs {s.need}"
        return f"license {s.license}: {s.held}/{s.limit} held{by}; the job needs {s.need}"


@dataclass(frozen=True)
class Refusal:
    """A rule that refuses one way of placing a job. `rule` is stable (tests and explain read
    it): quota, cloud-quota, tenant-budget, pool-max, fleet-budget, spot-share, spot-buffer, spot-diversity,
    tenant-spot-share; `limit` names what to lift (a pool, a tenant)."""

    rule: str
    message: str
    limit: str = ""
    shortfall: float = 0.0  # how much more of the limit the job needs (USD/h, instances, units)
    instances: int = 0  # new instances the refused way of placing it needs


@dataclass(frozen=True)
class Option:
    """One way of placing a job: on new instances of an offer, or in room left on instances the plan has."""

    label: str
    price: float  # USD/h the plan would pay more for it
    refusals: tuple[Refusal, ...]
    offer: str = ""  # on new instances: the key of their offer (problem.capacities), and how many
    new: int = 0
    # in room left on the plan's instances: (the instances of a room kind, by name; items of the job one holds) per kind
    rooms: tuple = field(default=(), compare=False)


class ExactSum:
    """A float total that adding and taking away keep exact: add x, take x away, and the total is
    what it was, bit for bit (a running `+=` drifts: 0.1 + 0.2 - 0.2 is 0.10000000000000003, and a
    ledger greedy adds to and takes from 20k times must not). Shewchuk's non-overlapping partials,
    as math.fsum keeps them; `value` is their correctly rounded sum."""

    __slots__ = ("_parts", "_value")

    def __init__(self) -> None:
        self._parts: list[float] = []
        self._value: float | None = 0.0

    @property
    def value(self) -> float:
        if self._value is None:
            self._value = math.fsum(self._parts)
        return self._value

    def add(self, x: float) -> None:
        parts, i = self._parts, 0
        for y in parts:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                parts[i] = lo
                i += 1
            x = hi
        parts[i:] = [x]
        self._value = None  # summed when read: greedy adds more often than it reads some totals


@dataclass(slots=True)
class Pending:
    """What a placement being planned would add before it is committed (greedy plans a job whole,
    then commits it): instances to open and items to place, for one demand's tenant."""

    spend: int = 0  # micro-dollars/h of the instances to open (what the fleet budget counts: `micro`)
    pools: dict = field(default_factory=dict)  # pool -> instances to open
    capacity: float = 0.0  # of the instances to open, in the spot share's unit
    spot: float = 0.0  # ... of those that are spot
    buys: dict = field(default_factory=dict)  # offer's capacity key -> [Capacity, new instances] (what cloud quotas count)
    tenant_spend: int = 0  # micro-dollars/h the items charge their tenant (what its budget counts)
    tenant_spot: float = 0.0  # work units of the items on spot
    tenant_work: float = 0.0  # work units of the items

    def open(self, c, prim: float) -> None:
        self.spend += micro(c.price)
        self.pools[c.pool] = self.pools.get(c.pool, 0) + 1
        self.capacity += prim
        if c.market == "spot":
            self.spot += prim
        if not isinstance(c, Host):
            b = self.buys.get(c.key)
            if b is None:
                self.buys[c.key] = [c, 1]
            else:
                b[1] += 1

    def buying(self, c) -> int:
        """New instances of offer c planned."""
        b = self.buys.get(c.key)
        return b[1] if b else 0


_NONE = Pending()  # nothing pending (never added to)


class Ledger:
    """The fleet a plan leaves (or greedy is building) and the totals the fleet-wide rules read.

    Instances (existing ones kept, new ones created, each as its Capacity), the items placed on
    them and the jobs placed are added and removed; every total a rule reads (spend, pool counts,
    spot and on-demand capacity, the idle on-demand buffer, tenant charges, use and spot shares,
    licenses, cloud quotas, reservations) is kept incrementally, exact under add then remove
    (ExactSum), so a check costs the same at 20k jobs as at 10. `refuses_*` name the rule that
    refuses one more instance, item or job ("pool-max", "tenant-budget", ...: Refusal.rule);
    greedy asks them, and the messages of explain and pending reasons are built on the same checks."""

    def __init__(self, problem) -> None:
        self.problem = problem
        self.instances: dict[str, object] = {}  # ref or instance id -> Capacity
        self.items: dict[str, list] = {}  # instance -> [(demand, job)]
        self.jobs: dict[str, str] = {}  # placed job -> tenant
        self.job_demand: dict[str, object] = {}
        self._job_items: dict[str, int] = {}  # placed job -> its items in `items`
        self.dim, self._prim = spot_units(problem.capacities, getattr(problem, "gpu_fleet", None))
        self._memo: dict = {}  # what explain asks of one state (room, options): computed once per state
        self._fits: dict[tuple[str, str], int] = {}  # (demand, offer key) -> items per empty instance
        self._cost = ExactSum()  # USD/h, as reported
        self._spend = 0  # micro-dollars/h, as the fleet budget counts it
        self._pools: dict[str, int] = {}
        self._all, self._spot, self._idle = ExactSum(), ExactSum(), ExactSum()
        self._spot_types: dict[str, int] = {}
        self._spot_zones: dict[str, int] = {}
        self._reserved: dict[str, int] = {}
        self._charges: dict[str, ExactSum] = {}  # tenant -> USD/h its items are charged
        self._charged: dict[str, int] = {}  # tenant -> micro-dollars/h of those charges, as its budget counts them
        self._tenant_spot: dict[str, list[float]] = {}  # tenant -> [work units on spot, in all] (whole numbers)
        self._use: dict[str, dict[str, ExactSum]] = {}  # tenant -> dimension -> what its placed jobs request
        self.licenses = LicenseBook(problem.licenses)
        self.quotas = QuotaBook(getattr(problem, "quotas", ()), getattr(problem, "quota_floor_gaps", None))  # what the new instances take of cloud quotas

    def once(self, key, compute):
        """compute(), made once while the ledger stays as it is (every add or remove forgets it): what explain and the
        pending reasons ask of one state many times (room, options, who holds what)."""
        v = self._memo.get(key)
        if v is None:
            v = self._memo[key] = compute()
        return v

    # -- building (and taking apart: greedy gives up what it kept)

    def add_instance(self, ref: str, cap) -> None:
        """An instance kept or bought; the on-demand buffer counts the idle capacity of every on-demand one, as the
        plan after the apply counts it (greedy's too, during its pass: what it buys for work among them)."""
        if ref in self.instances:
            raise ValueError(f"instance {ref} is in the ledger already")
        self.instances[ref] = cap
        self.items[ref] = []
        self._instance(ref, cap, 1)

    def remove_instance(self, ref: str) -> None:
        """Take an instance out; it must hold no items."""
        if self.items[ref]:
            raise ValueError(f"instance {ref} still holds {len(self.items[ref])} items")
        cap = self.instances.pop(ref)
        del self.items[ref]
        self._instance(ref, cap, -1)

    def _instance(self, ref: str, c, sign: int) -> None:
        self._memo.clear()
        self._cost.add(sign * c.price)
        self._spend += sign * micro(c.price)
        self._pools[c.pool] = self._pools.get(c.pool, 0) + sign
        prim = sign * self._prim(c)
        self._all.add(prim)
        if c.market == "spot":
            self._spot.add(prim)
            self._spot_types[c.instance_type] = self._spot_types.get(c.instance_type, 0) + sign
            self._spot_zones[c.zone] = self._spot_zones.get(c.zone, 0) + sign
        else:
            self._idle.add(prim)
        if not isinstance(c, Host):
            self.quotas.take(c, sign)
        if c.reservation:
            self._reserved[c.reservation] = self._reserved.get(c.reservation, 0) + sign

    def add_item(self, d, job: str | None, ref: str) -> None:
        """One item of d on instance ref, of placed job `job` (its first item places the job: add_job). job None:
        the item only (greedy places items before it knows which of identical jobs they are; it books jobs apart)."""
        self.items[ref].append((d, job))
        self._item(d, ref, 1)
        if job is not None:
            n = self._job_items.get(job, 0)
            if not n:
                self.add_job(d, job)
            self._job_items[job] = n + 1

    def remove_item(self, d, job: str | None, ref: str) -> None:
        """Take one item of d (of `job`) off instance ref; its job's last item takes the job out."""
        its = self.items[ref]
        for i, (o, j) in enumerate(its):
            if o is d and j == job:  # by identity: comparing Demands field by field is slow
                del its[i]
                break
        else:
            raise ValueError(f"no item of {d.key} ({job}) on {ref}")
        self._item(d, ref, -1)
        if job is not None:
            self._job_items[job] -= 1
            if not self._job_items[job]:
                del self._job_items[job]
                self.remove_job(job)

    def _item(self, d, ref: str, sign: int) -> None:
        self._memo.clear()
        c = self.instances[ref]
        s = self._charges.get(d.tenant)
        if s is None:
            s = self._charges[d.tenant] = ExactSum()
        x = charge(d, c)
        s.add(sign * x)
        self._charged[d.tenant] = self._charged.get(d.tenant, 0) + sign * micro(x)
        ts = self._tenant_spot.setdefault(d.tenant, [0, 0])
        if c.market == "spot":
            ts[0] += sign * work_units(d)
        ts[1] += sign * work_units(d)
        if c.market != "spot":
            use = buffer_use(d, self.dim)
            if use:
                self._idle.add(-sign * use)

    def add_job(self, d, job: str) -> None:
        """Job `job` of d is placed: it counts against its tenant's quota and holds its licenses."""
        self._memo.clear()
        self.jobs[job] = d.tenant
        self.job_demand[job] = d
        self._job(d, job, 1)

    def remove_job(self, job: str) -> None:
        self._memo.clear()
        d = self.job_demand.pop(job)
        del self.jobs[job]
        self._job(d, job, -1)

    def _job(self, d, job: str, sign: int) -> None:
        use = self._use.get(d.tenant)
        if use is None:
            use = self._use[d.tenant] = {k: ExactSum() for k in DIMS}
        for k in DIMS:
            r = d.req(k)
            if r:
                use[k].add(sign * d.replicas * r)
        if d.licenses:
            self.licenses.take(d, job, sign)

    # -- totals

    def cost(self) -> float:
        return self._cost.value

    def spend(self) -> int:
        """The fleet's cost as its budget counts it (micro-dollars/h: budget_ok)."""
        return self._spend

    def pool_count(self, pool: str) -> int:
        return self._pools.get(pool, 0)

    def tenant_charge(self, tenant: str) -> float:
        s = self._charges.get(tenant)
        return s.value if s is not None else 0.0

    def tenant_spend(self, tenant: str) -> int:
        """The tenant's charges as its budget counts them (micro-dollars/h: budget_ok)."""
        return self._charged.get(tenant, 0)

    def tenant_charges(self) -> dict[str, float]:
        return {t: s.value for t, s in self._charges.items()}

    def tenant_use(self, tenant: str) -> dict[str, float]:
        """Requested resources of the tenant's placed jobs (what quotas count)."""
        use = self._use.get(tenant)
        return {k: use[k].value if use else 0.0 for k in DIMS}

    def spot(self) -> tuple[float, float]:
        """Spot capacity and all capacity, in the spot share's unit."""
        return self._spot.value, self._all.value

    def spot_sites(self) -> tuple[set[str], set[str]]:
        """The instance types and zones the spot capacity spans (what SpotPolicy diversity counts)."""
        return {t for t, n in self._spot_types.items() if n}, {z for z, n in self._spot_zones.items() if n}

    def spot_site_counts(self, instance_type: str, zone: str) -> tuple[int, int]:
        """Spot instances of this type, and in this zone, in the plan (whether one going leaves the type or zone)."""
        return self._spot_types.get(instance_type, 0), self._spot_zones.get(zone, 0)

    def used(self, ref: str, buffer: bool = False) -> float:
        """What the items on an instance use of the spot share's unit (a MIG item: its slices of a GPU).
        buffer: as the on-demand buffer counts it (deadline-critical work may use the buffer's capacity)."""
        return sum(item_units(d, self.dim) for d, _ in self.items[ref] if not (buffer and d.deadline_critical))

    def idle_on_demand(self) -> float:
        """Idle on-demand capacity the on-demand buffer counts, in the spot share's unit."""
        return self._idle.value

    def in_buffer(self, ref: str) -> bool:
        """Does the on-demand buffer count this instance's idle capacity (so work placed there takes from it)?"""
        return self.instances[ref].market != "spot"

    @property
    def spot_unit(self) -> str:
        """What the spot share and the on-demand buffer count, in words (spot_units' dimension)."""
        return "GPUs" if self.dim == "gpus" else "vCPU"

    def tenant_spot(self, tenant: str) -> tuple[float, float]:
        """Work units of the tenant's items on spot, and in all."""
        on, tot = self._tenant_spot.get(tenant, (0, 0))
        return float(on), float(tot)

    # -- the rules, for one more instance, item or job: the refusing rule's name (Refusal.rule) or None

    def open_rules(self, c, n: int = 1, pending: Pending = _NONE, reserve: int = 0, spot_share: bool = True,
                   first: bool = True) -> list[str]:
        """The rules n more instances of c (besides `pending`) would break, in this order: "reservation" (its count,
        the instances kept in it counted), "pool-max", "cloud-quota", "fleet-budget" (with `reserve` micro-dollars/h
        kept back: greedy's unmet pool minimums), "spot-share" (spot_share=False: not asked). first: only the first
        (greedy asks for every instance it would open)."""
        p, out = self.problem, []
        if c.reservation and not isinstance(c, Host) and self.reservation_over(c, n + pending.buying(c)) > 0:
            out.append("reservation")
            if first:
                return out
        if not pool_ok(self._pools.get(c.pool, 0) + pending.pools.get(c.pool, 0), n, p.pool_bounds.get(c.pool, (0, 0))[1]):
            out.append("pool-max")
            if first:
                return out
        if not isinstance(c, Host) and self.quotas.quotas and self.quotas.short(c, n, pending.buys.values()) is not None:
            out.append("cloud-quota")
            if first:
                return out
        if p.budget is not None and not budget_ok(self._spend + pending.spend + n * micro(c.price) + reserve, p.budget):
            out.append("fleet-budget")
            if first:
                return out
        f = p.spot.max_spot_fraction
        if spot_share and c.market == "spot" and f < 1:
            add = n * self._prim(c)
            if not spot_share_ok(self._spot.value + pending.spot + add, self._all.value + pending.capacity + add, f):
                out.append("spot-share")
        return out

    def reserved(self, name: str) -> int:
        """Instances of the plan in Reservation `name`: those kept in it and launched into it, as its count counts them."""
        return self._reserved.get(name, 0)

    def reservation_over(self, c, n: int) -> int:
        """How many instances n more of c would put its Reservation over its count (the instances kept in it and
        launched into it, as the model's row counts them: solve/fleet_rules.add_reservations); 0 within it."""
        r = self.problem.reservations.get(c.reservation) if c.reservation else None
        return reservation_over(self.reserved(c.reservation), n, r.count) if r is not None else 0

    def refuses_open(self, c, n: int = 1, pending: Pending = _NONE, reserve: int = 0, spot_share: bool = True) -> str | None:
        """The first rule n more instances of c (besides `pending`) would break, or None (open_rules)."""
        rules = self.open_rules(c, n, pending, reserve, spot_share)
        return rules[0] if rules else None

    def plan_item(self, d, c, pending: Pending, spot_share: bool = True) -> str | None:
        """The rule one more item of d on c (besides `pending`, placed for d's tenant) would break: "tenant-budget",
        "tenant-spot-share" (spot_share=False: not asked); None, and the item joins `pending`, if none does."""
        r = self.problem.tenants.get(d.tenant)
        if r is None:
            return None
        more, wu, spot = 0, d.size, c.market == "spot"  # (d.size: work_units, inline: greedy asks per item)
        if r.budget is not None:
            more = micro(charge(d, c))
            if not budget_ok(self._charged.get(d.tenant, 0) + pending.tenant_spend + more, r.budget):
                return "tenant-budget"
        if spot and spot_share and r.spot_fraction is not None:
            on, tot = self._tenant_spot.get(d.tenant, (0, 0))
            if not spot_share_ok(on + pending.tenant_spot + wu, tot + pending.tenant_work + wu, r.spot_fraction):
                return "tenant-spot-share"
        pending.tenant_spend += more
        if spot:
            pending.tenant_spot += wu
        pending.tenant_work += wu
        return None

    def refuses_item(self, d, c, spot_share: bool = True) -> str | None:
        """plan_item for one item alone."""
        return self.plan_item(d, c, Pending(), spot_share)

    def refuses_items(self, d, cells, spot_share: bool = True) -> str | None:
        """plan_item for a job's items on `cells`, one after another."""
        pending = Pending()
        for c in cells:
            rule = self.plan_item(d, c, pending, spot_share)
            if rule:
                return rule
        return None

    def refuses_job(self, d) -> str | None:
        """The rule one more job of d breaks wherever it goes: a license it would hold ("license", "license-quota")
        or its tenant's quota ("quota"; a tenant already over its ceiling in a dimension takes no more jobs)."""
        if d.licenses:
            s = self.licenses.short(d)
            if s is not None:
                return "license" if s.scope == "count" else "license-quota"
        return "quota" if self.quota_short(d) is not None else None

    def quota_short(self, d) -> tuple[str, float, float, float] | None:
        """The first dimension of its tenant's quota that one more job of d would break, as (dimension, used, need,
        limit), or None. A dimension the job needs none of is not asked, as the model's quota rows leave it out
        (solve/tenants.py): a tenant over its ceiling in CPU may still take a job that needs no CPU."""
        r = self.problem.tenants.get(d.tenant)
        return None if r is None else self._short(d, r.cap)

    def borrows_job(self, d) -> bool:
        """Whether one more job of d would be borrowed work: its tenant may borrow (`may_borrow`) and the job takes it
        past its guarantee in a dimension the job needs (the guarantee's rows are the quota's, solve/tenants.py)."""
        r = self.problem.tenants.get(d.tenant)
        return r is not None and may_borrow(r) and self._short(d, r.guarantee) is not None

    def _short(self, d, limits: dict[str, float]) -> tuple[str, float, float, float] | None:
        return next(iter(self._shorts(d, limits)), None)

    def _shorts(self, d, limits: dict[str, float]) -> list[tuple[str, float, float, float]]:
        """Every dimension of `limits` one more job of d would break, as (dimension, used, need, limit) (`_short`)."""
        use = self._use.get(d.tenant)
        out = []
        for dim, limit in limits.items():
            need = d.replicas * d.req(dim)
            used = use[dim].value if use else 0.0
            if need and not quota_ok(used, need, limit):
                out.append((dim, used, need, limit))
        return out

    def refuses_buffer(self, d, taken: float) -> str | None:
        """"spot-buffer" if d's items would take `taken` (buffer_use) of the idle on-demand capacity the buffer keeps."""
        pct = self.problem.spot.on_demand_buffer_percent
        if pct <= 0 or d.deadline_critical or not taken:
            return None
        return None if buffer_ok(self.idle_on_demand() - taken, self._spot.value, pct) else "spot-buffer"

    def free(self, ref: str) -> dict[str, float]:
        def room() -> dict[str, float]:
            c = self.instances[ref]
            dims = list(DIMS) + [f"mig:{p}" for p in set(c.mig or ())]
            return {k: c.cap(k) - sum(d.req(k) for d, _ in self.items[ref]) for k in dims}
        return self.once(("free", ref), room)

    def roomy(self) -> dict[tuple, list[str]]:
        """Instances with some GPU (or, without GPUs, vCPU) left, by (GPU model or None, MIG or
        not) as problem.type_class tells work and capacity apart: the only ones room may be on."""
        def find() -> dict[tuple, list[str]]:
            out: dict[tuple, list[str]] = {}
            for ref, c in self.instances.items():
                f = self.free(ref)
                if c.mig and any(v > 1e-9 for k, v in f.items() if k.startswith("mig:")) or f["gpus"] > 1e-9 or not c.gpus and f["cpu"] > 1e-9:
                    out.setdefault((c.gpu_type if c.gpus else None, bool(c.mig)), []).append(ref)
            return out
        return self.once("roomy", find)

    def higher(self, d, tenant: str | None = None) -> tuple[str, ...]:
        """Placed jobs of a higher class than d's on the same kind of capacity (of `tenant` only, if given), by name.
        (Asked for every pending job: the placed jobs are grouped by kind and by kind and tenant once.)"""
        kind = capacity_kind(d)

        def by_kind() -> dict[tuple, list[tuple[int, str]]]:
            out: dict[tuple, list[tuple[int, str]]] = {}
            for j, o in self.job_demand.items():
                k = capacity_kind(o)
                out.setdefault(k, []).append((o.klass, j))
                out.setdefault((k, o.tenant), []).append((o.klass, j))
            return out
        key = kind if tenant is None else (kind, tenant)
        # (one sorted list per kind, tenant and class: asked for each of the 50k-job plan's 10,900 pending jobs, the sort
        # of the placed jobs above each took 2.6 s)
        return self.once(("higher", key, d.klass),
                          lambda: tuple(sorted(j for k, j in self.once("kinds", by_kind).get(key, ()) if k > d.klass)))

    def placed_jobs(self) -> set[str]:
        return set(self.jobs)

    def license_book(self) -> "LicenseBook":
        """The licenses the plan's placed jobs hold."""
        return self.licenses

    def quota_book(self) -> "QuotaBook":
        """The cloud quotas the plan's new instances take (instances it keeps are in the usage already)."""
        return self.quotas

    def broken_rules(self) -> dict[str, str]:
        """The fleet-wide rules this fleet breaks as it stands (a budget lowered below what runs, a
        pool shrunk or under its minimum, a spot share or buffer no longer met, a tenant past its ceiling, budget or
        spot share, a license count lowered): something must give, so work the rules would
        otherwise keep may be stopped. {rule: what breaks it}; {} when every rule holds."""
        p, out = self.problem, {}
        if not budget_ok(self._spend, p.budget):
            out["budget"] = f"the fleet costs {money(self.cost())}/h, over max_hourly_budget {money(p.budget)}/h"
        # (from the running counts, not the instances: plancheck.KeptInstead asks it per stop it weighs, at 11.7k instances)
        for pool in sorted(q for q, n in self._pools.items() if n > 0):
            if not pool_ok(self.pool_count(pool), 0, p.pool_bounds.get(pool, (0, math.inf))[1]):
                out[f"pool:{pool}"] = f"pool {pool} has {amount(self.pool_count(pool), 'instances')}, over its max_instances"
        # (a minimum the fleet does not meet is bought by the plan, and what that costs may be a running job's room under
        # the budget: an honest plan evicting a guaranteed job for it was refused by apply's re-check, fleet25)
        for pool, (lo, _) in sorted(p.pool_bounds.items()):
            if not pool_min_ok(self.pool_count(pool), lo):
                out[f"pool-min:{pool}"] = f"pool {pool} has {amount(self.pool_count(pool), 'instances')}, under its min_instances {lo}"
        sp = p.spot
        spot, total = self.spot()
        if spot and sp.max_spot_fraction < 1 and not spot_share_ok(spot, total, sp.max_spot_fraction):
            out["spot-share"] = f"the fleet is {spot / total:.1%} spot, over max_spot_fraction {sp.max_spot_fraction:g}"
        if not buffer_ok(self.idle_on_demand(), spot, sp.on_demand_buffer_percent):
            out["spot-buffer"] = (f"the on-demand buffer ({sp.on_demand_buffer_percent:g}% of {amount(spot, 'spot ' + self.spot_unit)}) "
                                  f"is not idle")
        types, zones = self.spot_sites()  # (any spot instance, CPU ones too)
        if types:
            if not diversity_ok(len(types), len(zones), sp.min_instance_types, sp.min_zones):
                out["spot-diversity"] = (f"spot spans {len(types)} instance type(s) and {len(zones)} zone(s); the SpotPolicy "
                                         f"asks for {sp.min_instance_types} and {sp.min_zones}")
        for name, r in sorted(p.tenants.items()):
            use = self.tenant_use(name)
            if not all(quota_ok(use.get(k, 0.0), 0.0, v) for k, v in r.cap.items()):
                out[f"tenant-cap:{name}"] = f"tenant {name} is over its ceiling"
            if not budget_ok(self.tenant_spend(name), r.budget):
                out[f"tenant-budget:{name}"] = (f"tenant {name} is charged {money(self.tenant_charge(name))}/h, "
                                                f"over its budget {money(r.budget)}/h")
            on, tot = self.tenant_spot(name)
            if r.spot_fraction is not None and not spot_share_ok(on, tot, r.spot_fraction):
                out[f"tenant-spot:{name}"] = (f"tenant {name} runs {on:g} of {amount(tot, 'work units')} on spot, "
                                              f"over its max_spot_fraction {r.spot_fraction:g}")
        book = self.license_book()
        for name, r in sorted(p.licenses.items()):
            if book.held[name] > r.count or any(book.by_tenant.get((name, t), 0) > q for t, q in r.tenant_quotas.items()):
                out[f"license:{name}"] = f"license {name} is held past its count or a tenant's quota of it"
        return out

    def license_refusal(self, d) -> Refusal | None:
        """A license the job would hold beyond its count or its tenant's quota of it, in this plan (the first)."""
        return next(iter(self.license_refusals(d)), None)

    def license_refusals(self, d) -> list[Refusal]:
        """Every license limit the job would hold beyond in this plan: a License's count, a tenant's quota of it."""
        if not d.licenses:
            return []
        from reconciler.problem.rules import borrowing_tenants, may_preempt

        book = self.license_book()
        priority = {j: o.priority for j, o in self.job_demand.items()}
        p = self.problem
        borrowing = self.once("borrowing tenants", lambda: borrowing_tenants(p.demands, p.tenants))
        jobs = self.job_demand

        def may_take(job: str) -> bool:
            """Running work as preemption allows; new work of a lower class (the tiers place a higher class first)."""
            o = jobs.get(job)
            if o is None:
                return False
            if any(j == job for j, _ in o.running):
                return may_preempt(d, o, borrowing, p.placement.preemption)
            return d.klass > o.klass
        return [Refusal("license" if s.scope == "count" else "license-quota", book.message(s, d, priority), s.license,
                        s.held + s.need - s.limit) for s in book.shorts(d, may_take)]

    def reservation_summary(self) -> dict[str, dict]:
        """Per Reservation in force: instances of the plan in it, what it commits per hour, and the
        money its unused reserved instances waste per hour (paid, used or not)."""
        used: dict[str, int] = {}
        for c in self.instances.values():
            if c.reservation:
                used[c.reservation] = used.get(c.reservation, 0) + 1
        out = {}
        for name, r in sorted(self.problem.reservations.items()):
            n = used.get(name, 0)
            util, committed, wasted = reservation_cost(r.count, n, r.hourly_cost)
            out[name] = {"pool": r.pool, "zone": r.zone, "instance_type": r.instance_type, "count": r.count, "used": n,
                         "utilisation": util, "committed_per_hour": committed, "wasted_per_hour": wasted, "until": r.until}
        return out

    def tenant_license_charges(self) -> dict[str, float]:
        """USD/h of the licenses each tenant's placed jobs hold (license-hours at the License's cost_per_hour)."""
        out: dict[str, float] = {}
        for name, holders in self.license_book().holders.items():
            for tenant, n in holders.values():
                out[tenant] = out.get(tenant, 0.0) + license_charge({name: n}, self.problem.licenses)
        return out

    def license_summary(self) -> dict[str, dict]:
        """Per License: its count, how many the plan's jobs hold (in all and per tenant) and what they cost per hour."""
        book, out = self.license_book(), {}
        for name, r in sorted(self.problem.licenses.items()):
            tenants = {t: n for (lic, t), n in sorted(book.by_tenant.items()) if lic == name and n}
            out[name] = {"count": r.count, "held": book.held[name], "tenants": tenants,
                         "cost_per_hour": round(book.held[name] * r.cost_per_hour, 4)}
        return out

    # -- rules for one more job

    def tenant_refusals(self, d, cells: list) -> list[Refusal]:
        """Tenant budget and tenant spot share for d's items on these capacities (the checks refuses_item makes)."""
        out = []
        r = self.problem.tenants.get(d.tenant)
        if r is None:
            return out
        if r.budget is not None:
            charges = [charge(d, c) for c in cells]
            more, spent = sum(charges), self.tenant_charge(d.tenant)
            if not budget_ok(self.tenant_spend(d.tenant) + sum(map(micro, charges)), r.budget):  # (as plan_item: charges only add)
                short = spent + more - r.budget
                out.append(Refusal("tenant-budget", f"tenant budget: {d.tenant} spends {money(spent)}/h of its {money(r.budget)}/h "
                                   f"in this plan; the job would add {money(more)}/h, {money_short(short)}/h more than it allows", d.tenant, short))
        if r.spot_fraction is not None and any(c.market == "spot" for c in cells):
            add_on = sum(work_units(d) for c in cells if c.market == "spot")
            on, tot = self.tenant_spot(d.tenant)
            if not spot_share_ok(on + add_on, tot + work_units(d) * len(cells), r.spot_fraction):  # the share the job leaves
                now = on / tot if tot else 0.0
                out.append(Refusal("tenant-spot-share", f"tenant spot share: {d.tenant}'s placed work is {now:.1%} on spot; "
                                   f"the job on spot would take it over its max {r.spot_fraction:g}", d.tenant))
        return out

    def _buffer_refusals(self, d, cells: list) -> list[Refusal]:
        """The on-demand buffer, for d's items in room left on on-demand instances: idle capacity they would
        take (deadline-critical work may use it)."""
        taken = buffer_use(d, self.dim) * sum(1 for c in cells if c.market != "spot")
        if not self.refuses_buffer(d, taken):
            return []
        pct, spot, idle = self.problem.spot.on_demand_buffer_percent, self._spot.value, self.idle_on_demand()
        unit = self.spot_unit
        return [Refusal("spot-buffer", f"on-demand buffer: the job would take {taken:g} of the {amount(idle, 'idle on-demand ' + unit)} "
                                       f"the plan keeps; {pct:g}% of {amount(spot, 'spot ' + unit)} must stay idle")]

    def new_refusals(self, c, n: int) -> list[Refusal]:
        """Pool size, fleet budget and spot rules for n more instances of offer c (all of them, where
        refuses_open names the first)."""
        p, out = self.problem, []
        rules = self.open_rules(c, n, first=False)
        if "reservation" in rules:
            r, have = p.reservations[c.reservation], self.reserved(c.reservation)
            over = self.reservation_over(c, n)
            # (how many: raised by one, a reservation the job's 2 new instances both launch into left it pending)
            out.append(Refusal("reservation", f"reservation {r.name} {RESERVATION_FULL} ({have}/{r.count} {r.instance_type} "
                                              f"in {r.zone})" + (f"; the job needs {over} more of it" if over > 1 else ""),
                               r.name, over, n))
        for i, over in self.quotas.shorts(c, n) if "cloud-quota" in rules else ():  # (each binds alone: a vCPU and a GPU quota)
            out.append(Refusal("cloud-quota", self.quotas.message(i, c, n), quota_scope(self.quotas.quotas[i]),
                               over + self.quotas.held_back_units(i), n))
        if "pool-max" in rules:
            hi, have = p.pool_bounds.get(c.pool, (0, 0))[1], self.pool_count(c.pool)
            out.append(Refusal("pool-max", f"pool {c.pool} is at {have}/{hi} instances (max_instances)"
                               + (f"; the job needs {n} more" if n > 1 else ""), c.pool, have + n - hi, n))
        if "fleet-budget" in rules:
            cost = self.cost()
            short = cost + n * c.price - p.budget
            out.append(Refusal("fleet-budget", f"budget: the fleet costs {money(cost)}/h and max_hourly_budget is {money(p.budget)}/h; "
                               f"{n} more {c.instance_type} ({money(n * c.price)}/h) would need {money_short(short)}/h more budget", "", short))
        if c.market == "spot":
            sp = p.spot
            spot, total = self.spot()
            add = n * self._prim(c)
            unit = self.spot_unit
            if "spot-share" in rules:
                now = spot / total if total else 0.0
                after = (spot + add) / (total + add) if total + add else 1.0
                out.append(Refusal("spot-share", f"spot share: the plan's fleet is {now:.1%} spot ({spot:g} of {amount(total, unit)}); "
                                   f"{n} more spot {c.instance_type} would make it {after:.1%}, over max_spot_fraction {sp.max_spot_fraction:g}"))
            if sp.on_demand_buffer_percent > 0:
                idle = self.idle_on_demand()
                if not buffer_ok(idle, spot + add, sp.on_demand_buffer_percent):
                    out.append(Refusal("spot-buffer", f"on-demand buffer: {amount(idle, 'idle on-demand ' + unit)} in the plan, "
                                       f"{sp.on_demand_buffer_percent:g}% of {amount(spot + add, 'spot ' + unit)} is needed"
                                       + self._buffer_unaffordable(c, n, sp.on_demand_buffer_percent / 100 * (spot + add) - idle)))
            have_types, have_zones = self.spot_sites()
            types, zones = len(have_types | {c.instance_type}), len(have_zones | {c.zone})
            if not diversity_ok(types, zones, sp.min_instance_types, sp.min_zones):
                out.append(Refusal("spot-diversity", f"spot diversity: spot in the plan would span {types} instance type(s) and "
                                   f"{zones} zone(s); the SpotPolicy asks for {sp.min_instance_types} and {sp.min_zones}"
                                   + self._diversity_unaffordable(c, n, have_types | {c.instance_type}, have_zones | {c.zone})))
        return out

    def _diversity_unaffordable(self, c, n: int, types: set[str], zones: set[str]) -> str:
        """Where the fleet budget cannot pay for n more instances of spot offer c and the spot instances that would
        add the instance types and zones spot diversity still asks for, the words saying so; else "". Each instance
        adds at most one type and one zone, so a cover takes at least m more, each of another offer that adds one
        still asked for: the m cheapest such offers are a bound no cover costs less than, which is all the words
        claim (the rule named alone read as if any second zone would do, as the buffer's did: QA 4b)."""
        budget, sp = self.problem.budget, self.problem.spot
        m = max(sp.min_instance_types - len(types), sp.min_zones - len(zones), 0)
        if budget is None or m == 0:
            return ""
        want_type, want_zone = len(types) < sp.min_instance_types, len(zones) < sp.min_zones
        adding = sorted((o for o in self.problem.offers() if o.market == "spot"
                         and (want_type and o.instance_type not in types or want_zone and o.zone not in zones)),
                        key=lambda o: (micro(o.price), o.key))
        cheapest: dict[tuple[str, str], object] = {}  # (a second instance of a type and zone adds nothing)
        for o in adding:
            cheapest.setdefault((o.instance_type, o.zone), o)
        if len(cheapest) < m:
            return ""  # (no cover at all: the rule alone is the reason)
        cover = list(cheapest.values())[:m]
        after = self.spend() + n * micro(c.price) + sum(micro(o.price) for o in cover)
        if budget_ok(after, budget):
            return ""
        what = ", ".join(f"{o.instance_type} in {o.zone}" for o in cover)
        return (f"; the budget cannot pay for it: that takes at least {m} more spot instance(s) of another type or zone, "
                f"{money(sum(o.price for o in cover))}/h at the cheapest ({what}), which would take the fleet to at least "
                f"{money(after / MICRO)}/h, over max_hourly_budget {money(budget)}/h")

    def _buffer_unaffordable(self, c, n: int, need: float) -> str:
        """Where the fleet budget cannot pay for n more instances of spot offer c and on-demand capacity for `need`
        more idle units of the buffer (the cheapest offer's instances that cover it; any other cover costs no less),
        the words saying so; else "". A spot job pending on the buffer under a budget that could not buy the buffer
        read as if one idle on-demand instance would do (QA 4b)."""
        budget = self.problem.budget
        offers = [o for o in self.problem.offers() if o.market != "spot" and self._prim(o) > 0]
        if budget is None or need <= 1e-9 or not offers:
            return ""
        k = {o.key: math.ceil(need / self._prim(o) - 1e-9) for o in offers}
        o = min(offers, key=lambda o: (k[o.key] * micro(o.price), o.key))
        after = self.spend() + n * micro(c.price) + k[o.key] * micro(o.price)
        if budget_ok(after, budget):
            return ""
        return (f"; the budget cannot pay for it: the cheapest cover, {k[o.key]} on-demand {o.instance_type} standing idle "
                f"({money(k[o.key] * o.price)}/h) beside it, would take the fleet to {money(after / MICRO)}/h, over "
                f"max_hourly_budget {money(budget)}/h")

    def _room_items(self, d, ref: str, fits) -> int:
        """Items of d the room left on a plan instance holds (its rules allowing)."""
        c = self.instances[ref]
        if (isinstance(c, Host) and c.keep_blocker is not None) or self._fit(d, c, fits) <= 0:
            return 0
        if d.nvlink and not c.one_nvlink_domain and any(o.gpus for o, _ in self.items[ref]):
            return 0  # as the solver: beside taken GPUs only in one NVLink domain (Capacity.one_nvlink_domain)
        free = self.free(ref)
        return max(0, min(math.floor(free.get(k, 0.0) / d.req(k) + 1e-9) for k in d.dims if d.req(k) > 0))

    def _room_kinds(self) -> dict[tuple, list["_RoomKind"]]:
        """`roomy()` by room kind: instances alike in everything `_room_items` reads (offer, whether it must go, its
        NVLink domain, GPUs taken, free room) hold alike. Per type class, its kinds in the order their first instance
        comes in `roomy()`. The applied 5k fleet's 10,000 idle instances kept warm are a few kinds, and asking each
        of them for each of its 525 pending demands (then listing them one by one) was 0.4 s of the plan."""
        def find() -> dict[tuple, list[_RoomKind]]:
            kinds: dict[tuple, _RoomKind] = {}
            out: dict[tuple, list[_RoomKind]] = {}
            pos = 0
            for tc, refs in self.roomy().items():
                lst = out[tc] = []
                for ref in refs:
                    c = self.instances[ref]
                    sig = (c.offer_key, isinstance(c, Host) and c.keep_blocker is not None, c.one_nvlink_domain,
                           any(o.gpus for o, _ in self.items[ref]), tuple(sorted(self.free(ref).items())))
                    kind = kinds.get(sig)
                    if kind is None:
                        kind = kinds[sig] = _RoomKind(ref, (c.cloud, c.zone))
                        lst.append(kind)
                    kind.at.append((pos, ref))
                    pos += 1
            for kind in kinds.values():
                kind.by_name = sorted(ref for _, ref in kind.at)
            return out
        return self.once("room kinds", find)

    def _fit(self, d, c, fits) -> int:
        k = (d.key, c.offer_key)  # fit reads only what the offer key fixes (problem.OfferFits)
        f = self._fits.get(k)
        if f is None:
            f = self._fits[k] = fits(d, c)
        return f

    def options(self, d, fits) -> list[Option]:
        return self.once(("options", d.key), lambda: self._options(d, fits))  # identical jobs are one demand

    def _options(self, d, fits) -> list[Option]:
        """Every way of placing one more job of d considered here, each with the rules that
        refuse it: in the room left on the plan's instances of one zone, topped up with new
        instances of one offer in that zone (all on new instances for a placement-group gang).
        `fits(d, c)`: items per empty instance."""
        # (cloud, zone) -> the room kinds there that hold items of d, each with how many one instance holds
        room: dict[tuple[str, str], list[tuple[_RoomKind, int]]] = {}
        if d.gang_mode != "placement-group":
            for kind in self._room_kinds().get((d.gpu_type if (d.gpus or d.mig) else None, d.mig is not None), ()):
                k = self._room_items(d, kind.ref, fits)
                if k:
                    room.setdefault(kind.zone, []).append((kind, k))
        out = []
        for (cloud, zone), held in room.items():
            if sum(k * len(kind.at) for kind, k in held) >= d.replicas:
                used, left = [], d.replicas
                for ref, k in heapq.merge(*[[(ref, k) for ref in kind.by_name[:d.replicas]] for kind, k in held]):
                    take = min(k, left)
                    used += [self.instances[ref]] * take
                    left -= take
                    if not left:
                        break
                where = self.once(("where", tuple(sorted(id(kind) for kind, _ in held))),
                                   lambda held=held: ", ".join(heapq.merge(*[kind.by_name for kind, _ in held])))
                out.append(Option(f"room on {where} ({cloud}/{zone})", 0.0, tuple(self.tenant_refusals(d, used) + self._buffer_refusals(d, used)),
                                  rooms=tuple((kind.by_name, k) for kind, k in held)))
        def offers_by_class() -> dict[tuple, list]:
            out: dict[tuple, list] = {}
            for o in self.problem.offers():
                if not o.members:
                    out.setdefault((o.gpu_type if o.gpus else None, bool(o.mig)), []).append(o)
            return out
        for c in self.once("offers", offers_by_class).get((d.gpu_type if (d.gpus or d.mig) else None, d.mig is not None), ()):
            f = self._fit(d, c, fits)
            if f <= 0:
                continue
            held = room.get((c.cloud, c.zone), [])
            have = min(sum(k * len(kind.at) for kind, k in held), d.replicas - 1) if d.replicas > 1 else 0
            n = math.ceil((d.replicas - have) / f)
            cells = [c] * (d.replicas - have)
            if len(cells) < d.replicas:  # (topped up from the room there, instance by instance in the plan's order)
                for _, ref, k in heapq.merge(*[[(p, ref, k) for p, ref in kind.at[:d.replicas]] for kind, k in held]):
                    cells += [self.instances[ref]] * min(k, d.replicas - len(cells))
                    if len(cells) >= d.replicas:
                        break
            reserved = f" (reserved: {c.reservation})" if c.reservation else ""
            # (the room it is topped up from may be the idle on-demand capacity the buffer keeps, as a way in room alone:
            # a 2 x 8-GPU gang was "held under every rule" by one new p4d beside the idle one the buffer stands on)
            out.append(Option(f"{n} new {c.instance_type} {c.market}{reserved} in {c.pool} ({c.cloud}/{c.zone})", n * c.price,
                              tuple(self.new_refusals(c, n) + self.tenant_refusals(d, cells)
                                    + self._buffer_refusals(d, cells[d.replicas - have:])), c.key, n))
        return sorted(out, key=lambda o: (o.price, o.label))

    def quota_refusal(self, d) -> Refusal | None:
        """Its tenant's quota, where one more job of d breaks it: every dimension short, each with what the tenant uses
        in this plan where that is not 0 (a job needing 6 GPUs beside its tenant's 1 under a limit of 2 read "needs 6
        GPUs but ... limit is 2", then raised by 4 still waited; one needing 4 GPUs and 40 vCPU named the GPUs alone)."""
        r = self.problem.tenants.get(d.tenant)
        shorts = [] if r is None else self._shorts(d, r.cap)
        if not shorts:
            return None
        dim, used, need, limit = shorts[0]
        if not quota_ok(0.0, need, limit):
            text = f"{OVER_QUOTA_ALONE} {amount(need, DIM_UNITS[dim])} but tenant {d.tenant}'s limit is {limit:g}" + (
                f" (it uses {used:g} in this plan)" if used else "")
        else:
            text = f"quota exhausted: tenant {d.tenant} uses {used:g}/{limit:g} {DIM_UNITS[dim]} in this plan, the job needs {need:g} more"
        text += "".join(f"; and it uses {u:g}/{lim:g} {DIM_UNITS[k]} in this plan, the job needs {n:g} more" for k, u, n, lim in shorts[1:])
        return Refusal("quota", text, d.tenant, used + need - limit)


class _RoomKind:
    """Instances of a plan that hold alike (Ledger._room_kinds): one to ask (`ref`), its zone, and every one of them,
    in the plan's order with their positions there (`at`) and by name (`by_name`)."""

    __slots__ = ("ref", "zone", "at", "by_name")

    def __init__(self, ref: str, zone: tuple[str, str]):
        self.ref, self.zone = ref, zone
        self.at: list[tuple[int, str]] = []
        self.by_name: list[str] = []


@dataclass(frozen=True)
class SpotBallast:
    """Idle on-demand capacity a plan pays for that its spot capacity needs to keep the
    SpotPolicy's spot share or on-demand buffer (beyond empty instances pool minimums ask)."""

    instances: tuple[str, ...]  # instance ids and create refs with idle on-demand capacity
    idle: float  # in the spot share's unit
    unit: str  # GPUs or vCPU
    cost_per_hour: float  # the idle part of their prices
    rule: str  # e.g. "max_spot_fraction 0.5"
    spot_share: float  # of the plan's fleet, with them
    spot_share_without: float  # were the idle capacity not bought


def spot_ballast(led: Ledger) -> SpotBallast | None:
    """The plan's idle on-demand capacity without which its spot capacity would break
    max_spot_fraction or the on-demand buffer; None if the rules hold without it."""
    sp = led.problem.spot
    spot, total = led.spot()
    if not spot or (sp.max_spot_fraction >= 1 and sp.on_demand_buffer_percent <= 0):
        return None
    count: dict[str, int] = {}
    for c in led.instances.values():
        count[c.pool] = count.get(c.pool, 0) + 1
    idle: dict[str, float] = {}
    for ref in sorted(led.instances):
        c = led.instances[ref]
        if c.market == "spot" or not led._prim(c):
            continue
        if not led.items[ref] and count[c.pool] <= led.problem.pool_bounds.get(c.pool, (0, 0))[0]:
            continue  # a pool minimum keeps it anyway
        used = led.used(ref)
        if led._prim(c) - used > 1e-9:
            idle[ref] = led._prim(c) - used
            count[c.pool] -= 0 if led.items[ref] else 1
    gone = sum(idle.values())
    rules = []
    if sp.max_spot_fraction < 1 and not spot_share_ok(spot, total - gone, sp.max_spot_fraction):
        rules.append(f"max_spot_fraction {sp.max_spot_fraction:g}")
    if sp.on_demand_buffer_percent > 0 and sp.on_demand_buffer_percent * spot > 1e-9:
        rules.append(f"on_demand_buffer_percent {sp.on_demand_buffer_percent:g}")  # the buffer is idle capacity by definition
    if not idle or not rules:
        return None
    cost = sum(led.instances[r].price * v / led._prim(led.instances[r]) for r, v in idle.items())
    return SpotBallast(tuple(idle), round(gone, 3), led.spot_unit, round(cost, 4), " and ".join(rules),
                       round(spot / total, 4), round(spot / (total - gone), 4) if total > gone else 1.0)


def plan_ledger(problem, creates, kept, placements, as_running: bool = False) -> Ledger:
    """The ledger of a finished plan. `creates`: CreateActions; `kept`: ids of the existing
    instances that stay; `placements`: (job, instances per replica) of every placed job, each in its
    demand's shape, or with `as_running` in the shape it runs in now (`_as_running`)."""
    led = Ledger(problem)
    hosts = {c.key: c for c in problem.hosts()}
    offers = {c.offer_key: c for c in problem.offers() if not c.members}
    for h in kept:
        led.add_instance(h, hosts[h])
    for cr in creates:
        cap = offers.get(cr.offer_key)
        if cap is not None:
            led.add_instance(cr.ref, cap)
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    for job, instances in placements:
        d = demand_of[job].as_it_runs(job) if as_running else demand_of[job]
        for ref in instances[:: d.bundle]:
            if ref in led.instances:
                led.add_item(d, job, ref)
    return led


def running_ledger(problem) -> Ledger:
    """The ledger of the fleet as it runs: every existing instance, each running job where it runs now, in the shape
    it runs in (what plancheck compares a plan with, and what a stuck gang's reason names as broken)."""
    hosts = sorted(c.key for c in problem.hosts())
    return _as_running(problem, hosts, sorted((job, ids) for d in problem.demands for job, ids in d.running))


def _as_running(problem, kept: list[str], placements: list[tuple[str, tuple[str, ...]]]) -> Ledger:
    """plan_ledger of running jobs where they run, each in the shape it runs in (Demand.as_it_runs): a job whose
    resources a PR raised is not running at its new size yet (counted so, a running job raised from 1 to 2 T4s read
    its tenant over its quota now, and apply's re-check then let any eviction through: 'something must give')."""
    return plan_ledger(problem, (), kept, placements, as_running=True)


def staying_ledger(problem, leaving: set[str] | None = None) -> Ledger:
    """The fleet that can stay: the existing instances but those that must go (a keep_blocker: a pool removed or
    drifted from, a region or cloud the guardrails no longer allow), each running job whose every replica is on
    them where it runs, but a job whose resources changed (Demand.reshaped: it restarts in its new shape, so it
    cannot stay as it runs), or a gang grown or short of a replica (it restarts too: rules.runs_settled; kept, t3's spot
    share held only with its grown gang, and the re-check refused the plan that stopped t3's spot job: fleet68). A fleet-wide rule it breaks, the fleet breaks whatever a plan does (fleet16: spot diversity
    kept only by a spot instance in a cloud no longer allowed), so something must give, as where the fleet as it
    runs breaks one (plancheck). (fleet37: a tenant's spot share held only with its on-demand job that changed and
    then had no room; its running spot job was counted as taken for a share the fleet keeps, and every plan refused.)"""
    from reconciler.problem.rules import runs_settled

    hosts = sorted(c.key for c in problem.hosts() if c.keep_blocker is None)
    stay = set(hosts)
    leaving = jobs_that_must_leave(problem) if leaving is None else leaving  # (rules_broken_now has it)
    return _as_running(problem, hosts, sorted((job, ids) for d in problem.demands for job, ids in d.running
                                              if set(ids) <= stay and runs_settled(d, job, ids) and job not in leaving))


def jobs_that_must_leave(problem) -> set[str]:
    """Running jobs that cannot stay where they run by their own rules (rules.cannot_stay: a host that must go or no
    longer allows them, a gang split over zones): they move or stop whatever a plan does, so the fleet that can stay
    does not hold them, and placed elsewhere they arrive as new work does. (fleet59: t2's spot share held only with
    its spot-required j5 on an on-demand host; without it t2 ran all its work on spot, so its j0 had to go too, and
    apply's re-check refused the plan that stopped it: every plan of that fleet was refused. A job leaving a removed
    pool for its tenant's low job's room was not counted here, and the re-check refused that plan too.) And a job that
    alone holds more of a License than its count or its tenant's quota of it: it runs nowhere. (The h7 hunt: with
    License sim lowered to 0, t3's j1 holding 2 of it was put back in its room, as guaranteed work a higher class of its
    tenant took it from, where the re-check weighed the stop of t1's j3 holding 1; the license broken with j1 there,
    j3 kept broke "no rule the plan keeps" and greedy's plan was refused.)"""
    from reconciler.problem.rules import cannot_stay

    hosts = {c.instance_id: c for c in problem.hosts()}
    alone = LicenseBook(problem.licenses)
    return {job for d in problem.demands for job, ids in d.running
            if cannot_stay(d, [hosts.get(i) for i in ids]) or (d.licenses and alone.short(d) is not None)}


_BROKEN_NOW: list = []  # [(a weak reference to the problem, its rules broken now)]: asked by the model, the objective,
# the packer and the re-check of one problem; weak, so a controller's long-lived process does not keep the last one


def rules_broken_now(problem) -> dict[str, str]:
    """The rules the fleet breaks now, as it runs or as it can stay (staying_ledger): {rule: what breaks it}.
    Something must give for them whatever a plan does, so work the rules would otherwise keep may be stopped: for
    a fleet-wide rule any work, for a tenant's own rule (`tenant-...:<tenant>`) that tenant's work (`licensed_by`).
    The one reading of it for the model's moves, its guarantees tier, the packer's tenant spot shares and apply's
    re-check."""
    if _BROKEN_NOW and _BROKEN_NOW[0][0]() is problem:
        return _BROKEN_NOW[0][1]
    out = running_ledger(problem).broken_rules()
    # (the staying fleet is the running one unless an instance must go or a job changed: 0.18 s at 11.7k hosts)
    from reconciler.problem.rules import settled_jobs

    leaving = jobs_that_must_leave(problem)
    if leaving or any(h.keep_blocker is not None for h in problem.hosts()) or any(settled_jobs(d) < d.running_jobs for d in problem.demands):
        out = staying_ledger(problem, leaving).broken_rules() | out
    _BROKEN_NOW[:] = [(weakref.ref(problem), out)]
    return out


def licensed_by(broken: dict[str, str] | set[str]) -> set[str] | None:
    """Whose running work the broken rules let a plan stop: None for anyone's (a fleet-wide rule is broken), else the
    tenants whose own rules are broken (their ceiling, budget or spot share: another tenant's work does not mend them)."""
    if any(not rule.startswith("tenant-") for rule in broken):
        return None
    return {rule.split(":", 1)[1] for rule in broken}


def stand_in_units(d, lower: list) -> int:
    """The units of its tenant's protected lower jobs (`lower`: the demands holding them) one job of d may stand in
    for (objective.protected_tier, and greedy's `_place_displacing`): its own units, or, CPU work in CPU work's place,
    as many of a lower job's as its vCPU or memory would take the room of (a CPU replica is one unit whatever its size: counted so, a 12-vCPU critical job
    stood in for one of the two 6-vCPU normal jobs of its tenant holding the one instance it fits on, and waited for
    good beside them). GPU work is counted by its GPUs alike already (7 a GPU)."""
    units = d.job_size
    if d.gpus or d.mig:
        return units
    for q in lower:
        if q.klass >= d.klass or q.gpus or q.mig:
            continue
        takes = max((math.ceil(d.req(dim) * d.replicas / (q.req(dim) * q.replicas) - 1e-9)
                     for dim in ("cpu", "memory_gib") if q.req(dim) > 0), default=0)
        units = max(units, takes * q.job_size)
    return units


def stand_in_item_units(d, lower: list) -> int:
    """The units one item of d stands in for where it lands (`stand_in_units` over its items, rounded up): the model's
    stand-in room (objective.stand_in_room) and the re-check's (plancheck.own_higher_class_room) count so, one unit of
    higher work placed in a room for at most one unit of its tenant's protected work lost there."""
    return -(-stand_in_units(d, lower) // d.replicas)


__all__ = ["EPS", "MILLI", "stand_in_units", "stand_in_item_units", "within", "capacity_kind", "budget_ok", "pool_ok", "pool_min_ok", "quota_ok", "may_borrow", "borrow_dims", "borrow_room", "share_weight", "share_capacity", "fair_share_level", "borrowed_share", "lending_share", "spot_share_ok", "buffer_ok", "diversity_ok", "item_units",
           "buffer_use", "work_units", "MICRO", "micro", "milli_down", "reservation_over", "share_row", "buffer_row", "SHARE_SCALE", "BUFFER_SCALE", "quota_units", "quota_headroom", "quota_scope", "QuotaBook", "ReservationRules", "reservation_cost", "LicenseBook", "LicenseRules", "LicenseShort", "license_charge", "license_need", "SpotBallast", "spot_ballast", "charge", "item_share", "instance_share", "replica_charge", "mig_compute", "money", "Ledger", "ExactSum", "Pending", "Refusal", "Option", "plan_ledger", "running_ledger", "staying_ledger", "rules_broken_now", "licensed_by", "GPU_SLICES", "DIMS", "DIM_UNITS", "OVER_QUOTA_ALONE", "RESERVATION_FULL",
           "round_up", "spot_units", "tenant_spot_drops", "jobs_that_must_leave"]
