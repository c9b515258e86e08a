"""Turn the solver's counts into a concrete, reviewable plan.

Pure. Decides which replica goes on which instance and GPUs (keeping running
replicas where they are), names the instances to create with idempotency keys
derived from the plan id, and says for each job whether it is kept, placed, moved,
evicted or pending (with a reason). It also says what the moves are for: healing
lost capacity, leaving an instance that must go, or consolidation (with the saving).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Literal

from reconciler.deadlines import conditions as deadline_conditions
from reconciler.errors import SolverError
from reconciler.explain import pending_reason
from reconciler.ledger import (QuotaBook, SpotBallast, budget_ok, charge, plan_ledger, pool_min_ok, pool_ok, spot_ballast, spot_share_ok,
                               tenant_spot_drops, within, work_units)
from reconciler.model import DesiredState
from reconciler.observe import Observed
from reconciler.pack import Bin, pack_items
from reconciler.problem import Capacity, Demand, Problem, fit, placement_refusal, shape_changes, spot_measure

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools, pandas and numpy (~0.5 s of CPU)
    from reconciler.solve import Solution

PLAN_FORMAT = 2
UNPACKED = "its replicas could not be packed onto the instances the plan buys"  # then the rule the ledger finds binding
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
    placement_group: str | None = None  # launch into this cluster placement group (a gang's)
    reservation: str | None = None  # launch into this Reservation's capacity (price 0: its cost is committed)
    price_source: str = ""  # where `price` comes from and its date: "catalog: <source> (<date>)" or a live API


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
    gpus: tuple[tuple[int, ...], ...] = ()  # GPU indices per replica on its instance


@dataclass(frozen=True)
class SolverReport:
    status: str
    optimal: bool
    gap: float
    seconds: float  # wall clock: shown to people, left out of the JSON (the same input gives the same JSON)
    tiers: tuple[dict, ...] = ()  # what each objective tier reached (name, value, bound, status, proven)
    scope: tuple[int, int] = (0, 0)  # existing instances solved, frozen as they are
    repairs: int = 0  # instances added by the packer where aggregate counts did not pack
    note: str = ""
    work: float = 0.0  # CP-SAT deterministic seconds spent (--time-limit bounds them)
    unpacked: int = 0  # jobs the solver placed that the packer could not: the plan does not reach its tiers

    @property
    def unproven(self) -> list[str]:
        """Tiers whose value is not proven best: the plan holds at least greedy's there."""
        return [t["name"] for t in self.tiers if not t.get("proven", t.get("status") in ("HELD", "OPTIMAL"))]


@dataclass(frozen=True)
class Consolidation:
    """Moves made only because a cheaper packing exists."""

    moved_replicas: int
    instances_removed: tuple[str, ...]
    saving_per_hour: float  # $/h of the instances removed minus those bought for the moved replicas
    move_cost: float  # one-time USD, as the PlacementPolicy prices a move


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
    consolidation: Consolidation | None = None
    notes: tuple[str, ...] = ()  # what observe found worth saying (state vs placement tags)
    ballast: SpotBallast | None = None  # idle on-demand capacity paid for only to allow the spot in the plan
    # The scheduling rules' figures (licenses held, reservations used, deadline conditions), only
    # where the config has such rules: left out of the JSON when empty, so other plans are as before.
    rules: dict = field(default_factory=dict)

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
        raw = _json_ready(self)
        del raw["solver"]["seconds"]  # the wall clock: the same (desired, observed) gives the same JSON, byte for byte
        if not raw["rules"]:
            del raw["rules"]
        for c in raw["creates"]:  # (only where set: a plan without reservations is as before)
            if c["reservation"] is None:
                del c["reservation"]
        body = json.loads(json.dumps(raw))
        return json.dumps({**body, "body_digest": body_digest(body)}, indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        raw = json.loads(text)
        if raw.get("format") != PLAN_FORMAT:
            raise ValueError(f"plan format {raw.get('format')} is not {PLAN_FORMAT}; make the plan again with this version")
        if raw.pop("body_digest", None) != body_digest(raw):
            raise ValueError("the plan's body does not match its body_digest: it was edited after `reconcile plan` wrote "
                             "it (or made by an older version); make the plan again")
        solver = raw["solver"]
        cons = raw.get("consolidation")
        return cls(
            id=raw["id"], fleet=raw["fleet"], desired_digest=raw["desired_digest"], observed_digest=raw["observed_digest"],
            creates=tuple(CreateAction(**c) for c in raw["creates"]),
            deletes=tuple(DeleteAction(**d) for d in raw["deletes"]),
            jobs=tuple(JobChange(**{**j, "instances": tuple(j["instances"]), "previous": tuple(j["previous"]),
                                    "gpus": tuple(tuple(g) for g in j.get("gpus", ()))}) for j in raw["jobs"]),
            cost_before=raw["cost_before"], cost_after=raw["cost_after"],
            solver=SolverReport(**{"seconds": 0.0, **solver, "tiers": tuple(solver.get("tiers", ())), "scope": tuple(solver.get("scope", (0, 0)))}),
            violations=tuple(raw.get("violations", ())), kept=dict(raw.get("kept", {})),
            consolidation=Consolidation(**{**cons, "instances_removed": tuple(cons["instances_removed"])}) if cons else None,
            notes=tuple(raw.get("notes", ())),
            ballast=SpotBallast(**{**raw["ballast"], "instances": tuple(raw["ballast"]["instances"])}) if raw.get("ballast") else None,
            rules=dict(raw.get("rules", {})),
        )


def _json_ready(obj):
    """asdict, with a float field always a float (`cost_before: 0.0`, not `0` beside `72.21`) and a job whose
    replicas hold no whole GPU (CPU, MIG slices) showing `gpus: []` rather than `[[]]`."""
    if is_dataclass(obj):
        out = {}
        for f in fields(obj):
            v = _json_ready(getattr(obj, f.name))
            if f.type in ("float", "float | None") and type(v) is int:
                v = float(v)
            elif f.type == "dict[str, float]":
                v = {k: float(x) for k, x in v.items()}
            out[f.name] = v
        if isinstance(obj, JobChange) and not any(obj.gpus):
            out["gpus"] = []
        return out
    if isinstance(obj, (list, tuple)):
        return [_json_ready(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    return obj


def body_digest(body: dict) -> str:
    """What a saved plan's every field hashes to, so an edited body is refused even with its old digests. A
    checksum, not a signature: apply also checks every action of a saved plan on its own (plancheck.py)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def placement_group_name(fleet: str, job: str, zone: str) -> str:
    """The cluster placement group of a placement-group gang in one zone: `<fleet>-<job>-<hash of the pair>-<zone>`.
    A group lives in one zone (with one name per gang, a gang whose allowlist moved it failed every create in the
    new zone). Names are dash-joined, so `<fleet>-<job>` alone was ambiguous (fleet `team` job `a-train` and fleet
    `team-a` job `train` shared `team-a-train`); the pair's hash (a `/` cannot occur in either name) tells them apart."""
    return f"{fleet}-{job}-{hashlib.sha256(f'{fleet}/{job}'.encode()).hexdigest()[:8]}-{zone}"


def plan_id(desired: DesiredState, observed: Observed, actions: str = "") -> str:
    return hashlib.sha256(f"{desired.fleet}|{desired.digest}|{observed.digest}|{actions}".encode()).hexdigest()[:12]


# ---------------------------------------------------------------- which jobs, which replicas


def _choose_jobs(d: Demand, n: int, stay_left: dict[str, int], problem: Problem, observed: Observed) -> list[str]:
    """Which of a class's identical jobs run: those staying where they are first, then the other
    running ones (most time left first: the victims are those nearly done), then the rest in
    submission order."""
    if n <= 0:
        return []
    if d.gang:
        return list(d.jobs)
    running = dict(d.running)
    staying, moving = [], []
    for j in d.jobs:
        if j in running:
            (staying if any(stay_left.get(h, 0) > 0 for h in running[j]) else moving).append(j)
    moving.sort(key=lambda j: (-problem.job_remaining.get(j, 0.0), j))
    rest = [j for j in d.jobs if j not in running]
    return (staying + moving + rest)[:n]


def _resident_gpus(host: Capacity, problem: Problem, observed: Observed) -> dict[tuple[str, int], tuple[int, ...]]:
    """GPU indices of the replicas running on a host: as recorded, else as the packer would have
    given them (deterministic, so two runs agree)."""
    recorded = getattr(observed, "gpu_indices", {}) or {}
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    missing = []
    for dk, job, _ in sorted(set(host.residents)):
        hosts = observed.placements.get(job, ())
        for r, iid in enumerate(hosts):
            if iid != host.key:
                continue
            rec = recorded.get(job)
            if rec and r < len(rec):
                out[(job, r)] = tuple(rec[r])
            else:
                missing.append((problem.demand(dk), job, r))
    if missing:
        b = Bin.empty(host, host.key)
        for (job, r), idx in out.items():
            b.reserve(problem.demand(next(dk for dk, j, _ in host.residents if j == job)), [idx])
        for d, job, r in sorted(missing, key=lambda m: (-m[0].gpus, m[1], m[2])):
            single = Demand(**{**d.__dict__, "bundle": 1, "gpus": d.gpus // d.bundle}) if d.bundle > 1 else d
            idx = b.gpus_for(single) or [()]
            out[(job, r)] = idx[0]
    return out


# ---------------------------------------------------------------- the plan


def make_plan(desired: DesiredState, observed: Observed, problem: Problem, solution: Solution) -> Plan:
    # The id covers what the plan does, so two different plans never share idempotency keys.
    pid = plan_id(desired, observed, json.dumps(sorted(solution.new.items())) + json.dumps(sorted(solution.keep)))
    caps = {**{c.key: c for c in problem.capacities}, **solution.capacities}  # with the solver's zone classes
    hosts = {c.key: c for c in problem.capacities if c.existing}
    demand_of = {job: d for d in problem.demands for job in d.jobs}

    # 1. Which jobs run, and which of their items stay where they are.
    stay_left = {}
    for (dk, hk), n in solution.stay.items():
        stay_left.setdefault(dk, {})[hk] = n
    new_left = {}
    for (dk, ck), n in solution.x.items():
        new_left.setdefault(dk, {})[ck] = n
    slots: dict[str, list[str | None]] = {}  # job -> instance id per item (None: to be packed)
    to_host: dict[str, list[tuple[Demand, str, int]]] = {}  # host id -> new items
    to_offer: dict[str, list[tuple[Demand, str, int]]] = {}  # offer key -> new items
    for d in problem.demands:
        sl = stay_left.get(d.key, {})
        jobs = _choose_jobs(d, solution.placed.get(d.key, 0), sl, problem, observed)
        running = dict(d.running)
        for job in jobs:
            items: list[str | None] = [None] * d.replicas
            for r, hk in enumerate(running.get(job, ())[: d.replicas] if d.bundle == 1 else running.get(job, ())[:1]):
                if sl.get(hk, 0) > 0:
                    sl[hk] -= 1
                    items[r] = hk
            for r in range(d.replicas):
                if items[r] is not None:
                    continue
                nl = new_left.get(d.key, {})
                ck = next((k for k in sorted(nl, key=lambda k: (not caps[k].existing, k)) if nl[k] > 0), None)
                if ck is None:
                    raise SolverError(f"internal: demand {d.key} placed {len(jobs)} jobs but has no room left for {job}")
                nl[ck] -= 1
                (to_host if caps[ck].existing else to_offer).setdefault(ck, []).append((d, job, r))
            slots[job] = items

    # 2. Pack: hosts keep their residents' GPUs; new instances are filled first-fit decreasing.
    gpu_of: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {}
    where: dict[tuple[str, int], str] = {}
    unpacked: set[str] = set()
    in_group = {d.key for d in problem.demands if d.gang and d.gang_mode == "placement-group"}

    def group(d: Demand, zone: str) -> str | None:
        """A gang's cluster placement group, one per zone: a group lives in the zone of its first
        instance, so a gang whose allowlist moved it elsewhere needs another (with one name per
        gang, every create in the new zone failed, every run)."""
        return placement_group_name(desired.fleet, d.jobs[0], zone) if d.key in in_group else None
    bins_of: dict[str, list[Bin]] = {}
    staying_at: dict[str, list[tuple[str, int]]] = {}
    for job, items in slots.items():
        for r, at in enumerate(items):
            if at is not None:
                staying_at.setdefault(at, []).append((job, r))
    for hk in sorted(solution.keep):
        h = hosts[hk]
        b = Bin.empty(h, hk)
        known = _resident_gpus(h, problem, observed) if h.gpus else {}
        fresh = []
        for job, r in staying_at.get(hk, []):
            d = demand_of[job]
            if job in d.reshaped:  # restarts here in its new shape: GPUs given afresh, after the others'
                fresh.append((d, job, r, group(d, h.zone)))
                continue
            idx = [known.get((job, k), ()) for k in range(d.bundle)] if d.bundle > 1 else [known.get((job, r), ())]
            b.reserve(d, idx)
            gpu_of[(job, r)] = tuple(idx)
            where[(job, r)] = hk
        # A replica placed anew on the instance it runs on takes its own GPUs again when they
        # are free, so a job that ends where it was is really kept (apply records these GPUs).
        for d, job, r in to_host.get(hk, []):
            idx = known.get((job, r)) if d.bundle == 1 else None
            was_here = tuple(observed.placements.get(job, ()))[r:r + 1] == (hk,)
            if was_here and idx is not None and len(idx) == d.gpus and not any(b.gpus_used[i] for i in idx if i < len(b.gpus_used)):
                b.reserve(d, [idx])
                gpu_of[(job, r)] = (tuple(idx),)
                where[(job, r)] = hk
            else:
                fresh.append((d, job, r, group(d, h.zone)))
        left = pack_items([b], fresh)
        unpacked.update(job for _, job, _, _ in left)
        bins_of[hk] = [b]

    creates: list[CreateAction] = []
    pool_count = {p: 0 for p in problem.pool_bounds}
    for hk in solution.keep:
        pool_count[hosts[hk].pool] = pool_count.get(hosts[hk].pool, 0) + 1
    for ok, n in solution.new.items():
        pool_count[caps[ok].pool] = pool_count.get(caps[ok].pool, 0) + n
    cost = sum(hosts[h].price for h in solution.keep) + sum(caps[k].price * n for k, n in solution.new.items())
    repairs = 0

    _, prim = spot_measure(caps.values(), problem.gpu_fleet)
    fleet = {"all": sum(prim(hosts[h]) for h in solution.keep) + sum(prim(caps[k]) * n for k, n in solution.new.items())}
    fleet["spot"] = sum(prim(hosts[h]) for h in solution.keep if hosts[h].market == "spot") + \
        sum(prim(caps[k]) * n for k, n in solution.new.items() if caps[k].market == "spot")

    cloud_quotas = QuotaBook(problem.quotas)  # what the solver's new instances take of the account's quotas
    for ok, n in solution.new.items():
        cloud_quotas.take(caps[ok], n)

    def more_of(cap: Capacity, ok: str):
        """One more instance of an offer, if its pool, the cloud quotas, the budget and the spot share allow (a
        packing repair). A spot repair is refused when the SpotPolicy asks for a buffer or
        diversity the solver, not the packer, must keep."""
        def more():
            nonlocal repairs, cost
            lo, hi = problem.pool_bounds.get(cap.pool, (0, 0))
            if not pool_ok(pool_count.get(cap.pool, 0), 1, hi) or not budget_ok(cost + cap.price, problem.budget):
                return None
            if cloud_quotas.short(cap) is not None:
                return None
            if cap.reservation and len(bins_of.get(ok, [])) >= cap.max_new:
                return None  # the reservation has no more instances
            sp = problem.spot
            if cap.market == "spot":
                if sp.on_demand_buffer_percent > 0 or sp.min_instance_types > 1 or sp.min_zones > 1:
                    return None
                if not spot_share_ok(fleet["spot"] + prim(cap), fleet["all"] + prim(cap), sp.max_spot_fraction):
                    return None
                fleet["spot"] += prim(cap)
            fleet["all"] += prim(cap)
            cloud_quotas.take(cap)
            pool_count[cap.pool] = pool_count.get(cap.pool, 0) + 1
            cost += cap.price
            repairs += 1
            b = Bin.empty(cap, f"{ok}#r{repairs}")
            bins_of.setdefault(ok, []).append(b)
            return b
        return more

    # Work pinned to a zone first, on its zone's instances; then work placed on a zone class, on
    # any instance of its zones (cheapest zone first); then repairs for what did not fit. Pinned
    # work that shares its zone with a class's work is packed compactly (fullest instance
    # first), so it strands none of the room the class's larger items need.
    for ok in sorted(solution.new):
        bins_of[ok] = [Bin.empty(caps[ok], f"{ok}#{i}") for i in range(solution.new[ok])]
    pinned = {ok: [(d, job, r, group(d, caps[ok].zone)) for d, job, r in items] for ok, items in to_offer.items() if not caps[ok].members}
    shared = {m for ck in to_offer if caps[ck].members for m in caps[ck].members}
    leftover: dict[str, list] = {}
    for ok in sorted(k for k in pinned if k in shared):
        leftover[ok] = pack_items(list(bins_of.setdefault(ok, [])), pinned.pop(ok), compact=True)
    for ck in sorted(k for k in to_offer if caps[k].members):
        zones = sorted(caps[ck].members, key=lambda k: (caps[k].price, k))
        view = [b for k in zones for b in bins_of.get(k, [])]
        leftover[ck] = pack_items(view, [(d, job, r, group(d, caps[ck].zone)) for d, job, r in to_offer[ck]])  # (gangs are never on a zone class)
    for ok in sorted(set(pinned) | {k for k in leftover if not caps[k].members}):
        bins_of.setdefault(ok, [])
        left = pack_items(list(bins_of[ok]), pinned.get(ok, []) + leftover.get(ok, []), more_of(caps[ok], ok))
        unpacked.update(job for _, job, _, _ in left)
    for ck in sorted(k for k in leftover if caps[k].members and leftover[k]):
        zones = sorted(caps[ck].members, key=lambda k: (caps[k].price, k))
        view = [b for k in zones for b in bins_of.get(k, [])]
        left = pack_items(view, leftover[ck], more_of(caps[zones[0]], zones[0]))
        unpacked.update(job for _, job, _, _ in left)

    # A gang is whole or nothing: take every item of a job that did not pack back out.
    for bins in bins_of.values():
        for b in bins:
            for job in {j for _, j, _ in b.items if j in unpacked}:
                b.remove(demand_of[job], job)

    # 2a. A tenant's spot share on what was packed: on-demand work the packer could not hold
    # leaves the tenant's spot work over its share, so spot work goes too (fleet12, issue 18).
    spot_drops = _settle_tenant_spot(problem, observed, slots, unpacked, bins_of, hosts, demand_of)

    # 2b. Never a move to an identical instance: a new instance whose items all fit on an instance
    # the plan deletes, of the same pool, zone, type, market and price, is that instance instead.
    solved = solution  # the solver's answer as it counted it (emitted_quality compares the plan with it)
    solution = _keep_identical(problem, observed, solution, bins_of, hosts, demand_of)
    _return_home(problem, observed, solution, bins_of, hosts, demand_of)

    # 3. Name the new instances.
    refs: dict[str, str] = {}  # bin ref -> "+n"
    for ok in sorted(k for k in bins_of if not caps[k].existing):
        for b in bins_of[ok]:
            if not b.items and (b.ref.split("#")[1].startswith("r") or _spare(b.cap, problem, pool_count, fleet, prim)):
                # A repair instance left empty after a gang was taken out, or one the packer did not
                # need (it packs an offer's items tighter than the solver's count of them): buying it
                # would launch an idle instance that the next plan deletes.
                pool_count[b.cap.pool] -= 1
                continue
            n = len(creates) + 1
            c = b.cap
            creates.append(CreateAction(
                ref=f"+{n}", key=f"{pid}-{n:04d}", pool=c.pool, provider=c.provider, cloud=c.cloud, region=c.region,
                zone=c.zone, instance_type=c.instance_type, market=c.market, price=c.price,
                max_price=c.on_demand_price if c.market == "spot" else None, placement_group=b.group, reservation=c.reservation,
                price_source=c.price_source,
            ))
            refs[b.ref] = f"+{n}"
    for bins in bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                where[(job, r)] = refs.get(b.ref, b.ref)
                gpu_of[(job, r)] = tuple(b.gpu_of.get((job, r), ((),)))

    # 4. Per job: what happens to it.
    jobs: list[JobChange] = []
    for d in problem.demands:
        for job in d.jobs:
            prev = tuple(observed.placements.get(job, ()))
            if job in spot_drops:
                jobs.append(JobChange(job, d.tenant, "evict" if prev else "pending", (), prev, spot_drops[job]))
            elif job in slots and job not in unpacked:
                now, gpus = [], []
                for r in range(d.replicas):
                    for k in range(d.bundle):
                        now.append(where[(job, r)])
                        g = gpu_of.get((job, r), ((),))
                        gpus.append(g[k] if k < len(g) else ())
                now_t = tuple(now)
                action: JobAction = "keep" if sorted(now_t) == sorted(prev) and len(prev) == len(now_t) else ("move" if prev else "place")
                note = _move_note(d, job, prev, now_t, observed, hosts, solution) if action == "move" else ""
                if job in d.reshaped:  # a resource change is a change: the job restarts
                    where_to = "restarts in place" if action == "keep" else "restarts on other instances"
                    action, note = "move", f"resources changed ({'; '.join(shape_changes(desired.jobs[job], observed))}): {where_to}"
                if action == "place" and observed.lost.get(job):
                    note = f"replaces {', '.join(observed.lost[job])}: gone (spot interruption or lost capacity)"
                jobs.append(JobChange(job, d.tenant, action, now_t, prev, note, tuple(gpus)))
            else:
                jobs.append(JobChange(job, d.tenant, "evict" if prev else "pending", (), prev, problem.static_pending.get(job, "")))
    # Pending reasons are read off the finished plan (its instances, charges and spot share).
    ledger = plan_ledger(problem, creates, solution.keep, [(j.job, j.instances) for j in jobs if j.instances])
    jobs = [replace(j, reason=(UNPACKED + "; " if j.job in unpacked else "") + pending_reason(demand_of[j.job], problem, ledger, j.job))
            if not j.instances and not j.reason else j for j in jobs]
    jobs.sort(key=lambda j: j.job)

    deletes = []
    for c in problem.capacities:
        if c.existing and c.instance_id not in solution.keep:
            why = c.keep_blocker or ("consolidated: its replicas fit more cheaply elsewhere" if c.residents else "no longer needed")
            deletes.append(DeleteAction(c.instance_id, c.pool, c.provider, c.cloud, c.region, c.zone, c.instance_type, c.market, c.price, why))
    existing = [c for c in problem.capacities if c.existing]
    cost_before = round(sum(c.price for c in existing), 4)
    cost_after = round(sum(c.price for c in existing if c.instance_id in solution.keep) + sum(a.price for a in creates), 4)
    n_unpacked = len({j.job for j in jobs if j.job in unpacked or j.job in spot_drops})  # placed by the solver, not by the plan
    status, optimal, gap = emitted_quality(solved, hosts, creates, repairs, n_unpacked, kept=solution.keep)
    return Plan(
        id=pid, fleet=desired.fleet, desired_digest=desired.digest, observed_digest=observed.digest,
        creates=tuple(creates), deletes=tuple(deletes), jobs=tuple(jobs), cost_before=cost_before, cost_after=cost_after,
        solver=SolverReport(
            status, optimal, round(gap, 6), round(solution.seconds, 3),
            tiers=tuple({"name": t.name, "value": t.value, "bound": t.bound if t.bound is None else round(t.bound, 3), "status": t.status,
                         "proven": t.proven} for t in solution.tiers),
            scope=solution.scope, repairs=repairs, note=solution.note, work=solution.work_spent, unpacked=n_unpacked,
        ),
        kept={c.instance_id: c.price for c in existing if c.instance_id in solution.keep},
        consolidation=_consolidation(problem, jobs, deletes, creates, hosts), notes=tuple(getattr(observed, "notes", ())),
        ballast=spot_ballast(ledger), rules=rule_summary(problem, ledger),
    )


def rule_summary(problem: Problem, ledger) -> dict:
    """What the plan's scheduling rules come to, from its ledger: licenses held per License,
    reservations' use and waste, deadline conditions."""
    out: dict = {}
    if problem.licenses:
        out["licenses"] = ledger.license_summary()
    if problem.reservations:
        out["reservations"] = ledger.reservation_summary()
    if problem.deadlines:
        out["deadlines"] = deadline_conditions(problem.deadlines, ledger.placed_jobs(), problem.now)
    if problem.quotas:
        out["cloud_quotas"] = ledger.quota_book().summary()
    if problem.quota_floors:
        out["cloud_quota_floors"] = dict(sorted(problem.quota_floors.items()))
    return out


def emitted_quality(solution: Solution, hosts: dict[str, Capacity], creates: list[CreateAction], repairs: int,
                    n_unpacked: int, kept: frozenset[str]) -> tuple[str, bool, float]:
    """(status, optimal, gap) of the plan as emitted, not of the solver's counts. The solver's
    cost bound holds for any plan reaching its tiers (its model relaxes packing: capacity summed
    per offer, valid cuts), so the gap is the emitted cost's to that bound: instances the packer
    added (repairs) or left out are counted at their price, like the solver's own objective.
    Optimal only when nothing was repaired or left unpacked; a plan whose packing left jobs
    the solver placed has not reached the tiers the bound is for: no gap (1.0)."""
    if solution.status == "GREEDY_FALLBACK":
        return solution.status, False, solution.gap
    if n_unpacked:
        return "FEASIBLE", False, 1.0
    if solution.cost_value is None or solution.cost_bound is None:
        return solution.status, solution.optimal and not repairs, solution.gap if not repairs else max(solution.gap, 1e-6)
    from reconciler.solve import MILLI

    emitted = sum(round(hosts[h].price * MILLI) for h in kept if h in hosts) + sum(round(a.price * MILLI) + 1 for a in creates)
    counted = sum(round(hosts[h].price * MILLI) for h in solution.keep if h in hosts) + \
        sum((round(solution.capacities[k].price * MILLI) + 1) * n for k, n in solution.new.items() if k in solution.capacities)
    value = solution.cost_value + emitted - counted  # the rest of the objective (egress, moves) as the solver counted it
    gap = max(0.0, (value - solution.cost_bound) / value) if value > 0 else 0.0
    optimal = solution.optimal and not repairs and gap <= 1e-9
    return ("OPTIMAL" if optimal else "FEASIBLE"), optimal, (0.0 if optimal else max(gap, 1e-6) if repairs else gap)


def _settle_tenant_spot(problem: Problem, observed: Observed, slots: dict[str, list[str | None]], unpacked: set[str],
                        bins_of: dict[str, list[Bin]], hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> dict[str, str]:
    """Take spot work out of the packed plan where a tenant is over its tenant_max_spot_fraction
    (the solver held it, counting work the packer then left out): new spot work first, lowest
    priority first. Returns job -> its pending reason; their items leave the bins."""
    market: dict[tuple[str, int], str] = {}
    for bins in bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                market[(job, r)] = b.cap.market
    per_tenant: dict[str, list[tuple[tuple, str, int, int]]] = {}
    for job, items in slots.items():
        d = demand_of[job]
        r_ = problem.tenants.get(d.tenant)
        if job in unpacked or r_ is None or r_.spot_fraction is None:
            continue
        on = sum(work_units(d) for r, at in enumerate(items) if (hosts[at].market if at is not None else market.get((job, r))) == "spot")
        running = bool(observed.placements.get(job))
        per_tenant.setdefault(d.tenant, []).append(((running, d.priority, -on, job), job, on, work_units(d) * len(items)))
    drops: dict[str, str] = {}
    for tenant, rows in sorted(per_tenant.items()):
        rows.sort()
        frac = problem.tenants[tenant].spot_fraction
        on, tot = sum(r[2] for r in rows), sum(r[3] for r in rows)
        for job in tenant_spot_drops([(job, s, t) for _, job, s, t in rows], frac):
            drops[job] = (f"tenant spot share: {tenant}'s placed work would be {on:g} of {tot:g} work units on spot, over its "
                          f"max_spot_fraction {frac:g}, as on-demand work the solver placed could not be packed")
    for bins in bins_of.values():
        for b in bins:
            for job in {j for _, j, _ in b.items if j in drops}:
                b.remove(demand_of[job], job)
    return drops


def _keep_identical(problem: Problem, observed: Observed, solution: Solution, bins_of: dict[str, list[Bin]],
                    hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> Solution:
    """The solver stops within its gap of the best cost, and one such answer deleted an instance
    while buying an identical one for the same work ("consolidated", $6.13/h -> $6.13/h), every
    plan again (issue 18). Here each such new instance is replaced by the deleted one when all
    its items fit there: its old residents on their recorded GPUs, the others packed as usual.
    Pool counts, prices, markets and zones are the same, so every fleet and tenant rule holds."""
    keep = set(solution.keep)
    for h in sorted((h for h in hosts.values() if h.key not in keep and h.keep_blocker is None and not h.frozen), key=lambda h: h.key):
        twins = [b for ok, bins in sorted(bins_of.items()) if ok not in hosts for b in bins
                 if b.items and b.group is None and b.cap.offer_key == h.offer_key and abs(b.cap.price - h.price) < 1e-9]
        known = _resident_gpus(h, problem, observed) if h.gpus else {}
        for b in twins:
            nb = Bin.empty(h, h.key)
            # (A same-instance gang's item is `bundle` replicas, each back on its own GPUs: before, such a gang
            # was re-packed onto new GPUs of the instance it runs on, under a running job: property tier.)
            home = [(dk, job, r) for dk, job, r in b.items if job not in demand_of[job].reshaped
                    and tuple(observed.placements.get(job, ()))[r * demand_of[job].bundle:(r + 1) * demand_of[job].bundle]
                    == (h.key,) * demand_of[job].bundle]
            ok = True
            for dk, job, r in home:  # back where it runs, on its own GPUs
                d = demand_of[job]
                idxs = [known.get((job, k), ()) for k in range(r * d.bundle, (r + 1) * d.bundle)]
                used = [i for idx in idxs for i in idx]
                if not nb.fits(d) or any(len(idx) != d.gpus // d.bundle for idx in idxs) or len(set(used)) != len(used) \
                        or any(nb.gpus_used[i] for i in used if i < len(nb.gpus_used)):
                    ok = False
                    break
                nb.reserve(d, idxs)
                nb.items.append((dk, job, r))
                nb.gpu_of[(job, r)] = tuple(tuple(idx) for idx in idxs)
            rest = sorted((it for it in b.items if it not in home), key=lambda it: (-demand_of[it[1]].gpus, it[1], it[2]))
            if not ok or not home or any(nb.place(demand_of[job], job, r) is None for _, job, r in rest):
                continue
            for bins in bins_of.values():
                if b in bins:
                    bins.remove(b)
            bins_of[h.key] = [nb]
            keep.add(h.key)
            break
    return solution if keep == set(solution.keep) else replace(solution, keep=frozenset(keep))


def _return_home(problem: Problem, observed: Observed, solution: Solution, bins_of: dict[str, list[Bin]],
                 hosts: dict[str, Capacity], demand_of: dict[str, Demand]) -> None:
    """A replica moved off an instance the plan keeps goes back when it still fits there on its
    own GPUs, in the same market, at no higher price share or egress/latency cost: a move with
    no rule behind it (the solver's answer, stopped within its gap, moved running work for
    nothing). Fleet and tenant rules hold: same market (spot shares, buffer), no dearer."""
    bin_at: dict[tuple[str, int], Bin] = {}
    for bins in bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                bin_at[(job, r)] = b
    known_at: dict[str, dict] = {}
    for job, prev in sorted(observed.placements.items()):
        d = demand_of.get(job)
        if d is None or d.gang or d.bundle > 1 or job in d.reshaped:
            continue
        for r, hk in enumerate(prev[:d.replicas]):
            b, home = bin_at.get((job, r)), bins_of.get(hk)
            h = hosts.get(hk)
            if b is None or b.ref == hk or not home or h is None or hk not in solution.keep or fit(d, h) == 0:
                continue
            c = b.cap
            budget = d.tenant in problem.tenants and problem.tenants[d.tenant].budget is not None
            if h.market != c.market or problem.cost_coef(d, h) > problem.cost_coef(d, c) + 1e-9 or \
                    budget and not within(charge(d, h), charge(d, c)):
                continue
            hb = home[0]
            if hk not in known_at:
                known_at[hk] = _resident_gpus(h, problem, observed) if h.gpus else {}
            idx = known_at[hk].get((job, r), ())
            if not hb.fits(d) or len(idx) != d.gpus or any(hb.gpus_used[i] for i in idx if i < len(hb.gpus_used)):
                continue
            b.remove(d, job)
            hb.reserve(d, [idx])
            hb.items.append((d.key, job, r))
            hb.gpu_of[(job, r)] = (tuple(idx),)


def _spare(cap: Capacity, problem: Problem, pool_count: dict[str, int], fleet: dict[str, float], prim) -> bool:
    """Can an empty new instance be left out without breaking a rule that may have bought it: its
    pool's minimum, or the spot rules (an on-demand instance counts in the spot share and the
    on-demand buffer; a spot one in the spot diversity)?"""
    if not pool_min_ok(pool_count.get(cap.pool, 0) - 1, problem.pool_bounds.get(cap.pool, (0, 0))[0]):
        return False
    sp = problem.spot
    if cap.market == "spot":
        return sp.min_instance_types <= 1 and sp.min_zones <= 1
    return fleet["spot"] == 0 or prim(cap) == 0  # (a CPU instance counts nothing in a GPU fleet's spot rules)


def outcome_rank(problem: Problem, plan: Plan) -> tuple[int, ...]:
    """The README's order as a finished plan shows it, higher is better: per priority class from
    the highest, the running work kept (in place or moved, by size), then all work placed
    (priority x size); then fewer evicted jobs. The solver's tiers hold for its counts; packing
    can only drop jobs from them (`unpacked`), which this order sees."""
    running = {j for d in problem.demands for j, _ in d.running}
    placed = {j.job for j in plan.jobs if j.action in ("keep", "place", "move")}
    classes = sorted({d.klass for d in problem.demands}, reverse=True)
    out: list[int] = []
    for c in classes:
        ds = [d for d in problem.demands if d.klass == c]
        out.append(sum(d.job_size for d in ds for j in d.jobs if j in placed and j in running))
        out.append(sum(d.weight for d in ds for j in d.jobs if j in placed))
    out.append(-sum(1 for j in running if j not in placed))
    return tuple(out)


def unpacked(plan: Plan) -> int:
    """Jobs the solver placed that the packer could not (see make_plan)."""
    return sum(1 for j in plan.jobs if j.reason.startswith(UNPACKED))


def _move_note(d: Demand, job: str, prev: tuple[str, ...], now: tuple[str, ...], observed: Observed, hosts: dict[str, Capacity],
               solution: Solution) -> str:
    gone = observed.lost.get(job)
    if gone:
        return f"replaces {', '.join(gone)}: gone (spot interruption or lost capacity)"
    left = [h for h in prev if h not in now]
    blocked = [h for h in left if h in hosts and hosts[h].keep_blocker]
    if blocked:
        return f"leaves {blocked[0]}: {hosts[blocked[0]].keep_blocker}"
    refused = [(h, placement_refusal(d, hosts[h])) for h in left if h in hosts]
    refused = [(h, why) for h, why in refused if why]
    if refused:  # the job's own rules changed (an allowlist, spot mode): the rule forces it, not a saving
        return f"leaves {refused[0][0]}: {refused[0][1]}"
    if any(h not in solution.keep for h in left):
        return "consolidation: its instance is removed"
    return "consolidation: a cheaper packing"


def _consolidation(problem: Problem, jobs: list[JobChange], deletes: list[DeleteAction], creates: list[CreateAction],
                   hosts: dict[str, Capacity]) -> Consolidation | None:
    moved = [j for j in jobs if j.action == "move" and j.reason.startswith("consolidation")]
    if not moved:
        return None
    removed = tuple(d.instance_id for d in deletes if d.reason.startswith("consolidated"))
    new_refs = {i for j in moved for i in j.instances if i.startswith("+")}
    saving = sum(hosts[i].price for i in removed) - sum(c.price for c in creates if c.ref in new_refs)
    pol = problem.placement
    demand_of = {job: d for d in problem.demands for job in d.jobs}
    cost = 0.0
    replicas = 0
    for j in moved:
        d = demand_of[j.job]
        n = sum(1 for a, b in zip(j.previous, j.instances) if a != b) or len(j.instances)
        replicas += n
        per = pol.move_cost_per_gpu * (d.gpus // d.bundle) if d.gpus else pol.move_cost_per_replica
        cost += per * n
    return Consolidation(replicas, removed, round(saving, 4), round(cost, 2))


__all__ = ["Plan", "CreateAction", "DeleteAction", "JobChange", "Consolidation", "make_plan", "plan_id", "outcome_rank", "unpacked"]
