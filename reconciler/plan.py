"""Turn the solver's counts into a concrete, reviewable plan.

Pure. Decides which replica goes on which instance (keeping running replicas
where they are), names the instances to create with idempotency keys derived
from the plan id, and says for each job whether it is kept, placed, moved,
evicted or pending (with a reason)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Literal

from reconciler.errors import SolverError
from reconciler.explain import pending_reason
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.problem import Capacity, Demand, Problem
from reconciler.problem import Unit
from reconciler.solve import Solution

PLAN_FORMAT = 1
JobAction = Literal["keep", "place", "move", "evict", "pending"]


@dataclass(frozen=True)
class CreateAction:
    ref: str  # how the plan names the instance before it exists: "+1", "+2", ...
    key: str  # idempotency key: the same plan never creates it twice
    pool: str
    provider: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    price: float
    max_price: float | None


@dataclass(frozen=True)
class DeleteAction:
    instance_id: str
    pool: str
    provider: str
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    price: float
    reason: str


@dataclass(frozen=True)
class JobChange:
    job: str
    tenant: str
    action: JobAction
    instances: tuple[str, ...]  # one per replica: instance id or a create ref
    previous: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class SolverReport:
    status: str
    optimal: bool
    gap: float
    seconds: float


@dataclass(frozen=True)
class Plan:
    id: str
    fleet: str
    desired_digest: str
    observed_digest: str
    creates: tuple[CreateAction, ...]
    deletes: tuple[DeleteAction, ...]
    jobs: tuple[JobChange, ...]
    cost_before: float  # USD per hour, instances
    cost_after: float
    solver: SolverReport
    violations: tuple[str, ...] = ()
    format: int = PLAN_FORMAT
    kept: dict[str, float] = field(default_factory=dict)  # existing instance id -> USD/h, for those that stay

    @property
    def changed_jobs(self) -> list[JobChange]:
        return [j for j in self.jobs if j.action in ("place", "move", "evict")]

    @property
    def pending(self) -> list[JobChange]:
        return [j for j in self.jobs if j.action in ("pending", "evict")]

    @property
    def has_changes(self) -> bool:
        return bool(self.creates or self.deletes or self.changed_jobs)

    def counts(self) -> dict[str, int]:
        c = {a: 0 for a in ("keep", "place", "move", "evict", "pending")}
        for j in self.jobs:
            c[j.action] += 1
        return {"create": len(self.creates), "delete": len(self.deletes), **c}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        raw = json.loads(text)
        if raw.get("format") != PLAN_FORMAT:
            raise ValueError(f"plan format {raw.get('format')} is not {PLAN_FORMAT}")
        return cls(
            id=raw["id"], fleet=raw["fleet"], desired_digest=raw["desired_digest"], observed_digest=raw["observed_digest"],
            creates=tuple(CreateAction(**c) for c in raw["creates"]),
            deletes=tuple(DeleteAction(**d) for d in raw["deletes"]),
            jobs=tuple(JobChange(**{**j, "instances": tuple(j["instances"]), "previous": tuple(j["previous"])}) for j in raw["jobs"]),
            cost_before=raw["cost_before"], cost_after=raw["cost_after"], solver=SolverReport(**raw["solver"]),
            violations=tuple(raw.get("violations", ())), kept=dict(raw.get("kept", {})),
        )


def plan_id(desired: DesiredState, observed: Observed, actions: str = "") -> str:
    return hashlib.sha256(f"{desired.fleet}|{desired.digest}|{observed.digest}|{actions}".encode()).hexdigest()[:12]


def _pack(replicas: list[tuple[str, Demand]], cap: Capacity, refs: list[str]) -> list[str]:
    """First-fit decreasing of replicas onto identical new instances (exact for aggregate units)."""
    free = [[cap.gpus, cap.cpu, cap.memory_gib] for _ in refs]
    out = [""] * len(replicas)
    order = sorted(range(len(replicas)), key=lambda i: (-replicas[i][1].gpus, -replicas[i][1].cpu, -replicas[i][1].memory_gib))
    for i in order:
        d = replicas[i][1]
        for b, f in enumerate(free):
            if f[0] >= d.gpus and f[1] >= d.cpu - 1e-9 and f[2] >= d.memory_gib - 1e-9:
                f[0] -= d.gpus
                f[1] -= d.cpu
                f[2] -= d.memory_gib
                out[i] = refs[b]
                break
        else:
            raise SolverError(f"internal: {cap.key} replicas do not pack into {len(refs)} instances")
    return out


def make_plan(desired: DesiredState, observed: Observed, problem: Problem, solution: Solution) -> Plan:
    # The id covers what the plan does, so two different plans never share idempotency keys.
    pid = plan_id(desired, observed, json.dumps(sorted(solution.new_units.items())) + json.dumps(sorted(solution.keep)))
    units = solution.units
    caps = {c.key: c for c in problem.capacities}

    # New instances: one ref per instance, in a stable order.
    creates: list[CreateAction] = []
    unit_refs: dict[str, list[str]] = {}
    for uk in sorted(solution.new_units):
        u = units[uk]
        refs = []
        for _ in range(solution.new_units[uk]):
            n = len(creates) + 1
            c = u.cap
            creates.append(CreateAction(
                ref=f"+{n}", key=f"{pid}-{n:04d}", pool=c.pool, provider=c.provider, cloud=c.cloud, region=c.region,
                zone=c.zone, instance_type=c.instance_type, market=c.market, price=c.price,
                max_price=c.on_demand_price if c.market == "spot" else None,
            ))
            refs.append(f"+{n}")
        unit_refs[uk] = refs

    # Replica-level assignment.
    assigned: dict[str, list[str]] = {}  # job -> refs/ids per replica
    pending_in_agg: dict[str, list[tuple[str, Demand, str]]] = {}  # unit -> (job, demand, slot marker)
    for d in problem.demands:
        room = {uk: n for (dk, uk), n in solution.x.items() if dk == d.key}
        placed_jobs = _choose_jobs(d, solution.placed.get(d.key, 0), room, observed)
        for job in placed_jobs:
            current = [i for i in observed.placements.get(job, ()) if room.get(i, 0) > 0]
            slots: list[str] = []
            for iid in current[: d.replicas]:
                room[iid] -= 1
                slots.append(iid)
            while len(slots) < d.replicas:
                uk = next(k for k in sorted(room, key=lambda k: (not units[k].cap.existing, k)) if room[k] > 0)
                room[uk] -= 1
                slots.append(uk)
            assigned[job] = slots
    # Replicas assigned to new units become concrete instance refs.
    job_demand = {j: d for d in problem.demands for j in d.jobs}
    for job, slots in assigned.items():
        for i, uk in enumerate(slots):
            if uk in unit_refs:
                pending_in_agg.setdefault(uk, []).append((job, job_demand[job], str(i)))
    for uk, items in pending_in_agg.items():
        refs = _pack([(j, d) for j, d, _ in items], units[uk].cap, unit_refs[uk])
        for (job, _, i), ref in zip(items, refs):
            assigned[job][int(i)] = ref

    jobs: list[JobChange] = []
    for d in problem.demands:
        for job in d.jobs:
            prev = tuple(observed.placements.get(job, ()))
            now = tuple(assigned.get(job, ()))
            if now:
                action: JobAction = "keep" if sorted(now) == sorted(prev) and len(prev) == d.replicas else ("move" if prev else "place")
                gone = observed.lost.get(job)
                note = f"replaces {', '.join(gone)}: gone (spot interruption or lost capacity)" if gone and action != "keep" else ""
                jobs.append(JobChange(job, d.tenant, action, now, prev, note))
            else:
                reason = problem.static_pending.get(job) or pending_reason(d, problem, solution)
                jobs.append(JobChange(job, d.tenant, "evict" if prev else "pending", (), prev, reason))
    jobs.sort(key=lambda j: j.job)

    deletes = []
    for c in problem.capacities:
        if c.existing and c.instance_id not in solution.keep:
            why = c.keep_blocker or "no longer needed"
            deletes.append(DeleteAction(c.instance_id, c.pool, c.provider, c.cloud, c.region, c.zone, c.instance_type, c.market, c.price, why))
    existing = [c for c in problem.capacities if c.existing]
    cost_before = round(sum(c.price for c in existing), 4)
    cost_after = round(sum(c.price for c in existing if c.instance_id in solution.keep) + sum(a.price for a in creates), 4)
    return Plan(
        id=pid, fleet=desired.fleet, desired_digest=desired.digest, observed_digest=observed.digest,
        creates=tuple(creates), deletes=tuple(deletes), jobs=tuple(jobs), cost_before=cost_before, cost_after=cost_after,
        solver=SolverReport(solution.status, solution.optimal, round(solution.gap, 6), round(solution.seconds, 3)),
        kept={c.instance_id: c.price for c in existing if c.instance_id in solution.keep},
    )


def _choose_jobs(d: Demand, n: int, room: dict[str, int], observed: Observed) -> list[str]:
    """Which of a class's identical jobs run: those already running first, then by name."""
    if n <= 0:
        return []
    if d.gang:
        return list(d.jobs)
    running_here = [j for j in d.jobs if any(room.get(i, 0) > 0 for i in observed.placements.get(j, ()))]
    running_elsewhere = [j for j in d.jobs if j not in running_here and observed.placements.get(j)]
    rest = [j for j in d.jobs if j not in running_here and j not in running_elsewhere]
    return (running_here + running_elsewhere + rest)[:n]


__all__ = ["Plan", "CreateAction", "DeleteAction", "JobChange", "make_plan", "plan_id", "Unit"]
