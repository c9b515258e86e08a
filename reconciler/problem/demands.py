"""Jobs as demands: identical single-replica jobs are one Demand with a count, a gang is one alone; the
priority a pending job has aged to; the resource shape a running job was placed with."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from reconciler.deadlines import ranks, start_by
from reconciler.model import PRIORITY_CLASSES, DesiredState, Job
from reconciler.observe import Observed
from reconciler.problem.types import Demand
from reconciler.topology import TopologyIndex

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


def _placed_shape(job: Job, old: dict) -> tuple:
    """The shape a reshaped job runs in, per replica, as Demand.ran_as holds it (a field the state does not record
    is as the job asks now)."""
    r = job.spec.resources
    mig = (r.mig.profile, r.mig.count) if r.mig else None
    if "mig" in old:
        mig = None if old["mig"] is None else (old["mig"].split("x ", 1)[1], int(old["mig"].split("x ", 1)[0]))
    return (old.get("gpus", r.gpus), old.get("gpu_type", r.gpu_type), mig, old.get("nvlink", r.nvlink), float(old.get("cpu", r.cpu)),
            float(old.get("memory_gib", r.memory_gib)))


def as_utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def effective_priority(job: Job, running: bool, now: datetime | None, aging, held: int | None = None) -> int:
    """Pending jobs climb one class (x10) per aging.step_hours since `submitted`, up to
    aging.max_priority, so nothing starves. A running job holds what it was placed with: its own
    priority, or `held`, the aged one apply recorded (state `aged`; never above aging.max_priority
    now). Dropped back to its own once it ran, an aged low job and the normal job it displaced
    evicted each other in turn at every apply."""
    base = job.spec.priority_weight()
    ceiling = PRIORITY_CLASSES[aging.max_priority]
    if running:
        return max(base, min(held, ceiling)) if held else base
    sub = as_utc(job.spec.submitted)
    if sub is None or now is None:
        return base
    steps = int(max(0.0, (now - sub).total_seconds() / 3600) // aging.step_hours)
    if steps <= 0:
        return base
    # (from 1 for `priority: 0`: 0 x 10 per step stayed 0, and such a job never climbed: it could starve)
    return max(base, min(max(base, 1) * 10 ** min(steps, 6), ceiling))


def demands_of(desired: DesiredState, observed: Observed, now: datetime | None, topo: TopologyIndex) -> list[Demand]:
    groups: dict[tuple, list[Job]] = {}
    eff: dict[str, int] = {}
    aging = desired.placement.aging
    for job in desired.jobs.values():
        s = job.spec
        running = bool(observed.placements.get(job.name))
        eff[job.name] = effective_priority(job, running, now, aging, getattr(observed, "aged", {}).get(job.name))
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
        ran_as = tuple((name, _placed_shape(desired.jobs[name], observed.shapes[name])) for name in sorted(reshaped))
        out.append(Demand(
            key=f"d{i}:{jobs[0].name}", jobs=tuple(j.name for j in jobs), replicas=items, bundle=bundle, tenant=s.tenant,
            gpus=r.gpus * bundle, gpu_type=r.gpu_type, mig=(r.mig.profile, r.mig.count * bundle) if r.mig else None,
            nvlink=r.nvlink, cpu=r.cpu * bundle, memory_gib=r.memory_gib * bundle, priority=eff[jobs[0].name],
            base_priority=s.priority_weight(), spot=s.spot, gang_mode=s.gang if s.replicas > 1 else "zone",
            pools=frozenset(s.pools) if s.pools is not None else None,
            regions=tuple(s.regions) if s.regions is not None else None,
            clouds=frozenset(s.clouds) if s.clouds is not None else None, zones=zones,
            data_location=s.data.location if s.data else None, data_gib=s.data.size_gib if s.data else 0.0,
            hours=s.expected_hours, running=running, reshaped=reshaped, ran_as=ran_as,
            licenses=tuple((n, k * bundle) for n, k in sorted(s.licenses.items())),
        ))
    latest = {d.key: start_by(desired.jobs[d.jobs[0]].spec.deadline, d.hours) for d in out if desired.jobs[d.jobs[0]].spec.deadline is not None}
    if latest:
        ranked = ranks(latest, {d.key: d.hours for d in out}, now)
        out = [replace(d, deadline_rank=ranked[d.key][0], deadline_critical=ranked[d.key][1]) if d.key in ranked else d for d in out]
    return out


def group_key(d: Demand, tenant_split: set[str]) -> tuple:
    """Demands with equal keys are interchangeable for every constraint that reads placement
    variables, so they share them (exact). Gangs stay alone: each picks its own zone."""
    if d.gang:
        return ("gang", d.key)
    return (d.gpus, d.gpu_type, d.mig, d.nvlink, d.cpu, d.memory_gib, d.spot, d.pools, d.regions, d.clouds, d.zones,
            d.data_location, d.data_gib, d.hours, d.tenant if d.tenant in tenant_split else None, d.deadline_critical)
