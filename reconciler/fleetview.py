"""The fleet as numbers for dashboards: what `reconcile metrics` exports and `reconcile report` draws.

Pure: built from a plan's inputs (the problem's capacities, the placements) with the ledger's charge
(reconciler/ledger.py), so a tenant's $/h here is the one its budget, status/ and explain quote. Two
moments have a view: the fleet now (`current_view`: observed instances and placements; the plan only
supplies why work is pending) and the fleet an apply left (`applied_view`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime

from reconciler.ledger import GPU_SLICES, OVER_QUOTA_ALONE, RESERVATION_FULL, Ledger, mig_compute, quota_ok
from reconciler.plan.quality import UNPACKED, claimed_gap
from reconciler.problem import DIMS, as_utc
from reconciler.problem.diagnosis import OUTRANKED, OUTRANKED_IN_TENANT, RECLAIMED, STUCK_GANG

# A pending reason's category (a bounded label), by the rule the reason starts with ("evicted: " and the packer's
# UNPACKED aside), or by what it says holds the capacity, whatever rule binds: room its tenant borrowed above its
# guarantee, reclaimed (diagnosis._reclaimed), is "guarantee"; higher-priority work placed first (diagnosis._outranked)
# is "priority". The clauses are diagnosis's own words, so the two cannot drift apart.
AWAITING_APPLY = "placed by the next apply"
REASON_KINDS: tuple[tuple[str, str], ...] = (
    (rf".*\(tenant .* above its guaranteed .*: {re.escape(RECLAIMED)} ", "guarantee"),
    (rf"{re.escape(OVER_QUOTA_ALONE)} ", "quota"),  # (beyond its quota alone: no higher work holds it back)
    (rf".*\((?:{re.escape(OUTRANKED)}|{re.escape(OUTRANKED_IN_TENANT)}): ", "priority"),
    (re.escape(AWAITING_APPLY), "awaiting-apply"),
    (rf"reservation .+? {re.escape(RESERVATION_FULL)} ", "reservation"),  # before pool-max: the rule that leads, as diagnosis orders them
    (r"cloud quota", "cloud-quota"),
    (r"quota", "quota"),
    (r"tenant budget", "tenant-budget"),
    (r"budget", "budget"),
    (r".*pools? at max_instances", "pool-max-instances"),
    (re.escape(STUCK_GANG), "gang"),
    (r"(tenant spot share|on-demand buffer|spot)", "spot"),  # the SpotPolicy's rules
    (r"license", "license"),
)


def reason_kind(reason: str) -> str:
    """The category of a pending or evicted job's reason (REASON_KINDS). (An evicted job's reason starts "evicted: ",
    and every eviction but one for a pool at max_instances was counted "other": a quota, budget, spot or gang eviction too.)"""
    text = reason.removeprefix("evicted: ").removeprefix(UNPACKED + "; ")
    for pattern, kind in REASON_KINDS:
        if re.match(pattern, text):
            return kind
    return "other"


@dataclass(frozen=True)
class Slot:
    job: str
    replica: int
    gpus: tuple[int, ...]  # GPU indices on the host ((): a CPU job, or a MIG slice)
    mig_slices: int = 0  # MIG compute slices (of 7 per GPU) the replica holds


@dataclass(frozen=True)
class Host:
    id: str
    pool: str
    cloud: str
    zone: str
    instance_type: str
    market: str
    price: float
    gpus: int
    gpu_type: str | None
    mig: bool
    slots: tuple[Slot, ...]

    @property
    def gpus_allocated(self) -> int:
        """GPUs holding a replica; on a MIG host, the GPUs its replicas' compute slices fill (7 per GPU, rounded up)."""
        if self.mig:
            return min(self.gpus, math.ceil(sum(s.mig_slices for s in self.slots) / GPU_SLICES))
        return len({g for s in self.slots for g in s.gpus})


@dataclass(frozen=True)
class JobState:
    job: str
    tenant: str
    phase: str  # running | reserved (placed, no `run`) | pending | evicted | succeeded | failed (finished: its agents reported it done)
    reason: str
    wait_seconds: float | None  # pending since `submitted` (None: no submitted time, or not waiting)

    @property
    def waiting(self) -> bool:
        """Pending or evicted: wants capacity it does not have (a finished job wants none)."""
        return self.phase in ("pending", "evicted")


@dataclass(frozen=True)
class FleetView:
    fleet: str
    hosts: tuple[Host, ...]
    jobs: tuple[JobState, ...]
    tenant_cost: dict[str, float]  # USD/h charged (the ledger's charge)
    pool_cost: dict[str, float]  # USD/h of the pool's instances
    over_quota: dict[str, bool]  # tenant -> uses more than its quota's cap on some dimension
    evictions: int  # jobs the plan evicts
    instances_lost: int  # instances found gone (spot interruptions, lost hosts) by the observe
    plan_seconds: float
    solver_gap: float | None  # None where the plan claims no gap (plan.quality.claimed_gap: unproven tiers, greedy's)
    solver_optimal: bool
    changes_outstanding: int  # creates + deletes not applied yet
    tenant_license_cost: dict[str, float] = field(default_factory=dict)  # USD/h of the licenses its running jobs hold

    @property
    def cost(self) -> float:
        return sum(h.price for h in self.hosts)

    def wait_stats(self) -> tuple[float, float]:
        """Average and p95 (nearest rank) of pending jobs' wait since `submitted`, in seconds (0, 0 if none)."""
        waits = sorted(j.wait_seconds for j in self.jobs if j.waiting and j.wait_seconds is not None)
        if not waits:
            return 0.0, 0.0
        return sum(waits) / len(waits), waits[max(0, math.ceil(0.95 * len(waits)) - 1)]


# What `count_phase` counts a job as, in the order fleet.yaml, the metrics and `reconcile status` show them.
COUNTED = ("running", "starting", "unknown", "reserved", "pending", "succeeded", "failed")


def count_phase(placed: bool, finished: str | None, reserved: bool = False, live: str | None = None) -> str:
    """How a job counts (fleet.yaml, live status, metrics, the report): succeeded or failed once its agents report it
    finished (whether or not it is placed), else pending when not placed, reserved when placed without `run` (nothing
    started), else as its agents report its phase (`live`, lifecycle.JobRun.phase): starting while any replica is not
    running yet (assigned, waiting for GPUs or its predecessor, in a restart's backoff), unknown while an agent is
    unreachable, running when all run or where no agent reports (a provider without the runtime). Before, a placed
    job counted running whatever its agents said: a job crash-looping in its backoff was "running"."""
    if finished in ("Succeeded", "Failed"):
        return finished.lower()
    if not placed:
        return "pending"
    if reserved:
        return "reserved"
    return {"Starting": "starting", "Pending": "starting", "Unknown": "unknown"}.get(live or "Running", "running")


def _view(problem, desired, observed, plan, hosts: dict, placements: dict[str, tuple[str, ...]], gpus: dict,
          reasons: dict[str, tuple[str, str]], now: datetime, changes_outstanding: int,
          run_changes: dict[str, str] | None = None, runtime=None) -> FleetView:
    """`run_changes`: job -> "starts" / "stops" for a job whose `run` was added or taken out since the last apply (the
    plan's `restarted`): it runs, or not, as that apply left it until the next one publishes the change. `runtime`: what
    the agents report (lifecycle.RuntimeView), the observed one unless given."""
    run_changes = run_changes or {}
    demand_of = {j: d for d in problem.demands for j in d.jobs}
    led = Ledger(problem)
    for key, cap in hosts.items():
        led.add_instance(key, cap)
    slots: dict[str, list[Slot]] = {k: [] for k in hosts}
    for job, ids in sorted(placements.items()):
        d = demand_of.get(job)
        if d is None or not all(i in hosts for i in ids):
            continue
        idx = gpus.get(job, ())
        slices = mig_compute(d.mig[0]) * d.mig[1] // d.bundle if d.mig is not None else 0
        for r, iid in enumerate(ids):
            slots[iid].append(Slot(job, r, tuple(idx[r]) if r < len(idx) else (), slices if hosts[iid].mig else 0))
        for iid in ids[:: d.bundle]:
            led.add_item(d, job, iid)
    placed = led.placed_jobs()
    # A finished job (Succeeded, Failed past its restarts) demands nothing, so the plan leaves it out: it is done, not
    # pending (before: counted pending "not in the plan", and its `submitted` fed the queue wait forever).
    runtime = runtime if runtime is not None else getattr(observed, "runtime", None)
    finished = dict(getattr(runtime, "finished", None) or {})
    runs = dict(getattr(runtime, "jobs", None) or {})
    jobs = []
    for name, job in sorted(desired.jobs.items()):
        reserved = run_changes.get(name) == "starts" or (job.spec.run is None and run_changes.get(name) != "stops")
        live = runs[name].phase if name in runs else None
        counted = count_phase(name in placed, finished.get(name), reserved, live)
        if counted != "pending":
            why = f"{finished[name]}: demands no capacity until its spec changes" if counted in ("succeeded", "failed") else ""
            jobs.append(JobState(name, job.spec.tenant, counted, why, None))
            continue
        phase, reason = reasons.get(name, ("pending", "not in the plan"))
        sub = job.spec.submitted
        wait = max(0.0, (now - as_utc(sub)).total_seconds()) if sub is not None else None  # no zone: UTC, as aging reads it
        jobs.append(JobState(name, job.spec.tenant, phase, reason, wait))
    over = {}
    for t, tenant in desired.tenants.items():
        use = led.tenant_use(t)
        over[t] = any((cap := tenant.spec.quota.cap(k)) is not None and not quota_ok(use[k], 0.0, cap) for k in DIMS)
    pool_cost: dict[str, float] = {p: 0.0 for p in desired.pools}
    for cap in hosts.values():
        pool_cost[cap.pool] = pool_cost.get(cap.pool, 0.0) + cap.price
    charges = led.tenant_charges()
    return FleetView(
        fleet=desired.fleet,
        hosts=tuple(Host(k, c.pool, c.cloud, c.zone, c.instance_type, c.market, c.price, c.gpus, c.gpu_type, bool(c.mig),
                         tuple(slots[k])) for k, c in sorted(hosts.items())),
        jobs=tuple(jobs), tenant_cost={t: charges.get(t, 0.0) for t in sorted(set(desired.tenants) | set(charges))},
        pool_cost=pool_cost, over_quota=over, evictions=sum(j.action == "evict" for j in plan.jobs),
        instances_lost=len({i for ids in observed.lost.values() for i in ids}),
        plan_seconds=plan.solver.seconds, solver_gap=claimed_gap(plan.solver, plan.cost_after), solver_optimal=plan.solver.optimal,
        changes_outstanding=changes_outstanding,
        tenant_license_cost={t: round(led.tenant_license_charges().get(t, 0.0), 6) for t in sorted(desired.tenants)},
    )


def current_view(problem, desired, observed, plan, now: datetime) -> FleetView:
    """The fleet as observed, with the plan's reasons for what is not running (a job the plan would place is
    "placed by the next apply")."""
    hosts = {c.key: c for c in problem.hosts()}
    reasons = {}
    for j in plan.jobs:
        if j.action in ("pending", "evict"):
            reasons[j.job] = ("pending", j.reason)
        else:
            reasons[j.job] = ("pending", AWAITING_APPLY)
    placements = {j: tuple(ids) for j, ids in observed.placements.items()}
    outstanding = len(plan.creates) + len(plan.deletes)
    return _view(problem, desired, observed, plan, hosts, placements, dict(observed.gpu_indices), reasons, now, outstanding,
                 {r.job: r.change for r in plan.restarted})


def applied_view(problem, desired, observed, plan, report, now: datetime, runtime=None) -> FleetView:
    """The fleet an apply of `plan` left: existing instances kept (not deleted), those it created, and the
    placements it recorded; `runtime`, what the agents reported after it (the jobs it placed are starting)."""
    deleted = set(report.deleted)
    hosts = {c.key: c for c in problem.hosts() if c.key in plan.kept and c.key not in deleted}
    offers = {c.offer_key: c for c in problem.offers() if not c.members}
    for cr in plan.creates:
        iid = report.created.get(cr.ref)
        cap = offers.get(cr.site.offer_key)
        if iid is not None and cap is not None:
            hosts[iid] = cap
    ref_to_id = dict(report.created)
    gpus = {}
    reasons = {}
    for j in plan.jobs:
        ids = tuple(ref_to_id.get(i, i) for i in j.instances)
        if j.gpus and tuple(report.placements.get(j.job, ())) == ids:
            gpus[j.job] = j.gpus
        if j.action in ("pending", "evict"):
            reasons[j.job] = ("evicted" if j.action == "evict" else "pending", j.reason)
        else:
            reasons[j.job] = ("pending", "its new instances could not be created")
    placements = {j: tuple(ids) for j, ids in report.placements.items()}
    outstanding = len(report.failed_refs) + len(report.not_started) + len(report.skipped_deletes)
    return _view(problem, desired, observed, plan, hosts, placements, gpus, reasons, now, outstanding, runtime=runtime)


__all__ = ["COUNTED", "FleetView", "Host", "JobState", "Slot", "applied_view", "count_phase", "current_view", "reason_kind"]
