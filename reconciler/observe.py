"""Observe the fleet: ask every provider the pools use what exists and what can be bought.

This is the imperative edge of the pipeline: the result, `Observed`, is plain
data that the pure solver and planner consume. Placements come from the state
merged with the placement tags instances carry (reconciler/placements.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Callable

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_FLEET_UID, TAG_POOL, Instance, InstanceFinder, mig_of, Offering, PoolTarget, Provider, ProviderContext, Quota, QuotaReader, keeps_placement_groups
from providers.catalog import load_catalog
from reconciler.errors import ProviderError
from providers.options import check_options
from providers.registry import available, declared_options, load_provider
from reconciler.model import DesiredState, Pool
from reconciler.placements import launch_times, merge_placements, untrusted_gpus
from reconciler.state import State, StateFileError


@dataclass(frozen=True)
class PoolOffering:
    pool: str
    offering: Offering


@dataclass(frozen=True)
class Observed:
    instances: tuple[Instance, ...]
    offerings: tuple[PoolOffering, ...]
    placements: dict[str, tuple[str, ...]]  # job -> instance id per replica, from the last apply
    short: frozenset[tuple[str, str, str, str]] = frozenset()  # (cloud, zone, type, market) in cool-off
    lost: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job -> its instances that vanished
    providers: dict[str, str] = field(default_factory=dict)  # pool -> provider name
    gpu_indices: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)  # job -> GPUs per replica, as applied
    serial: int = 0  # the newest placement serial seen, in the state or on an instance's tags
    notes: tuple[str, ...] = ()  # where the state and the instances' placement tags disagreed, and who won
    shapes: dict[str, dict] = field(default_factory=dict)  # job -> the resources it was placed with (state), where known
    since: dict[str, int] = field(default_factory=dict)  # job -> the serial of the apply that started it (state), where known
    aged: dict[str, int] = field(default_factory=dict)  # job -> the aged priority it was placed with (state), where above its own
    runtime: object | None = None  # reconciler.runtime.lifecycle.RuntimeView: what the node agents reported
    foreign: tuple[tuple[str, str], ...] = ()  # (instance id, fleet uid): our fleet name, another fleet's uid; left out
    quotas: tuple = ()  # providers.base.Quota: the account quotas the providers read (none: not read, or none apply)
    removed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a job the config no longer has -> where it runs
    # Providers whose instances report the cluster placement group they run in (providers.base.keeps_placement_groups):
    # only there does an instance in none, or in another's, break a placement-group gang's rule (rules.gang_split)
    grouped: frozenset[str] = frozenset()

    @property
    def digest(self) -> str:
        """What a saved plan was made against: instances and placements (not prices). Computed once (a plan asks it
        twice, the plan id and the plan's own field: 0.03 s each at 10,895 instances); the fields are frozen."""
        kept = self.__dict__.get("_digest")
        if kept is None:
            kept = self._digest_now()
            object.__setattr__(self, "_digest", kept)
        return kept

    def _digest_now(self) -> str:
        body = {
            "instances": sorted((i.id, i.instance_type, i.zone, i.market, i.state, i.pool) for i in self.instances),
            "placements": {k: list(v) for k, v in sorted(self.placements.items())},
        }
        # What runs as applied, beyond where: the GPUs each replica holds, the shape it was placed with, since when it
        # runs, and the jobs the config dropped. A saved plan made against other values of them is stale (audit: a plan
        # saved before a job was resized in place, then applied after, restarted it on fewer GPUs and put a new job on
        # the GPU it still held). Each only where set: a fleet without them hashes as before.
        for name, value in (("gpus", self.gpu_indices), ("shapes", self.shapes), ("since", self.since), ("aged", self.aged), ("removed", self.removed)):
            if value:
                body[name] = {k: v for k, v in sorted(value.items())}
        rt = self.runtime
        if rt is not None and (rt.finished or rt.unhealthy):  # type: ignore[attr-defined]
            body["runtime"] = {"finished": dict(sorted(rt.finished.items())), "unhealthy": sorted(rt.unhealthy)}  # type: ignore[attr-defined]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def pool_target(pool: Pool) -> PoolTarget:
    s = pool.spec
    section = getattr(s, s.cloud, None) if s.cloud in ("aws", "gcp", "azure") else None
    return PoolTarget(
        name=pool.name, cloud=s.cloud, region=s.region, zones=tuple(s.zones), instance_types=tuple(s.instance_types),
        settings=section.model_dump() if section is not None else {}, mig=tuple(s.mig or ()),
    )


def instance_layout(inst: Instance, pool: Pool | None) -> tuple[str, ...]:
    """The MIG layout of an instance's GPUs, () for whole GPUs: the one it recorded at launch (TAG_MIG), which it keeps
    whatever its pool says now (the bootstrap partitions its GPUs once; an instance whose layout is not its pool's is
    replaced: reconciler/problem/capacity.py). An instance that records none was launched by an older version: it is
    taken to have its pool's layout now, as those versions took it, not as drifted, so that upgrading does not replace
    every MIG instance of the fleet at once (nothing tells which were partitioned otherwise). The price: a later change
    of its pool's layout does not replace it either (README "MIG": tag it with its layout, or delete it)."""
    recorded = mig_of(inst.tags)
    if recorded is not None:
        return recorded
    return tuple(pool.spec.mig or ()) if pool is not None else ()


def provider_for(pool: Pool, default: str) -> str:
    return pool.spec.provider or default


class _Guarded:
    """A provider each of whose calls first runs `guard`, which raises to stop the caller there."""

    def __init__(self, provider: Provider, guard: Callable[[], None]):
        self._provider, self._guard = provider, guard

    def __getattr__(self, name: str):
        attr = getattr(self._provider, name)
        if not callable(attr):
            return attr

        def guarded(*args, **kwargs):
            self._guard()
            return attr(*args, **kwargs)

        return guarded


class Fleet:
    """The providers a desired state needs, loaded once per run."""

    def __init__(self, desired: DesiredState, state_dir: Path, default_provider: str = "sim", options: dict | None = None):
        self.desired = desired
        self.ctx = ProviderContext(fleet=desired.fleet, state_dir=state_dir, options=options or {})
        self.default = default_provider
        self._providers: dict[str, Provider] = {}

    guard: Callable[[], None] | None = None  # run before every provider call (apply: the lock's check)

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            self._providers[name] = load_provider(name, self.ctx)
        p = self._providers[name]
        return _Guarded(p, self.guard) if self.guard is not None else p

    def pools_by_provider(self) -> dict[str, list[Pool]]:
        out: dict[str, list[Pool]] = {}
        for pool in self.desired.pools.values():
            out.setdefault(provider_for(pool, self.default), []).append(pool)
        out.setdefault(self.default, [])  # always look for orphans in the default provider
        return out

    def observe(self, state: State, uid: str | None = None) -> Observed:
        """`uid`: the fleet's uid (default: the state's). An instance with our fleet name but another uid is
        another fleet's (a second config repo of that name): left out, and listed in Observed.foreign. Every
        region in state.regions is looked at too, pool or no pool, so nothing the fleet launched goes unseen."""
        uid = state.fleet_uid if uid is None else uid
        instances: list[Instance] = []
        offerings: list[PoolOffering] = []
        providers: dict[str, str] = {}
        foreign: list[tuple[str, str]] = []
        idle: list[str] = []  # the fleet's instances that exist but do not run (stopped, suspended, deallocated, failed)
        unknown: list[tuple[str, str]] = []  # the fleet's instances in a state we do not know: taken as running
        by_hand: list[str] = []  # the fleet's name tag alone: never launched by an apply (launched_by_hand)
        late: list[tuple[str, str]] = []  # (provider, instance id) the state places work on, found by id, not listed yet
        claimed = {iid for ids in state.placements.values() for iid in ids}  # the instances the state places work on
        quotas: list[Quota] = []
        quota_notes: list[str] = []
        gpus_by_key: dict[tuple[str, str, str], int] = {}  # (cloud, zone, type) -> GPUs, as the providers offer them
        by_provider = self.pools_by_provider()
        for n, r in enumerate(state.regions):
            if r["provider"] not in by_provider:
                _check_recorded_provider(state, n, r)
                by_provider[r["provider"]] = []
        if self.ctx.options:  # before any provider is made: a key none of them takes is a typo, not a no-op
            check_options(self.ctx.options, {name: declared_options(name) for name in by_provider})
        grouped: set[str] = set()
        for name, pools in sorted(by_provider.items()):
            prov = self.provider(name)
            if keeps_placement_groups(prov):
                grouped.add(name)
            targets = [pool_target(p) for p in pools]
            seen = {(t.cloud, t.region) for t in targets}
            remembered = [PoolTarget(name="", cloud=r["cloud"], region=r["region"], zones=(), instance_types=(),
                                     settings=dict(r.get("settings", {})))
                          for r in state.regions if r["provider"] == name and (r["cloud"], r["region"]) not in seen]
            listed = list(prov.observe(targets + remembered))
            missing = claimed - {i.id for i in listed}
            if missing and isinstance(getattr(prov, "_provider", prov), InstanceFinder):
                # A listing may lag a launch (eventual consistency): what the state places work on is asked for by id
                # before it is read as gone (and its work launched again beside it).
                found = [i for i in prov.find(sorted(missing), targets + remembered) if i.id in missing]  # type: ignore[attr-defined]
                late += [(name, i.id) for i in found]
                listed += found
            claimed -= {i.id for i in listed}
            for i in listed:
                their = i.tags.get(TAG_FLEET_UID)
                if their and their != uid:
                    foreign.append((i.id, their))
                elif launched_by_hand(i.tags):
                    by_hand.append(i.id)
                elif i.alive:
                    instances.append(i)
                elif i.state == "stopping":
                    idle.append(i.id)
                elif i.state != "terminated":
                    # A state no provider maps to ours: it may still run. Dropped, it read as gone and its work was
                    # launched again beside it; kept as it was, nothing runs twice, and the note says why.
                    unknown.append((i.id, i.state))
                    instances.append(dataclasses.replace(i, state="running"))
            by_key = {(o.cloud, o.zone, o.instance_type): o for o in prov.offerings(targets)} if targets else {}
            gpus_by_key.update({k: o.gpus for k, o in by_key.items()})
            if targets:
                read, unread = _read_quotas(name, prov, targets)
                quotas += read
                quota_notes += unread
            for p, t in zip(pools, targets):
                providers[p.name] = name
                for z in t.zones:
                    for it in t.instance_types:
                        o = by_key.get((t.cloud, z, it))
                        if o is not None:
                            offerings.append(PoolOffering(p.name, o))
        copied = copies(instances)
        uidless = launched_without_uid(instances, uid)
        instances = [i for i in instances if i.id not in copied and i.id not in uidless]
        not_ours = {**{iid: f"another fleet's of this name (uid {u})" for iid, u in foreign},
                    **{iid: "launched by hand (this fleet's name tag alone)" for iid in by_hand},
                    **{iid: f"launched without the fleet's uid after {first}" for iid, first in uidless.items()},
                    **{iid: f"a copy of {first}" for iid, (_, first) in copied.items()}}
        merged = untrusted_gpus(merge_placements(state, instances, self.desired.jobs), instances, _gpu_count(gpus_by_key))
        # A gang apply stopped because its lost replicas could not all be replaced still replaces them (state.lost)
        lost = {**{j: tuple(ids) for j, ids in state.lost.items() if j in self.desired.jobs and j not in merged.placements},
                **merged.lost}
        return Observed(
            instances=tuple(sorted(instances, key=lambda i: i.id)), offerings=tuple(offerings),
            placements=merged.placements, short=state.short_now(), providers=providers, lost=lost,
            gpu_indices=merged.gpu_indices, serial=merged.serial, foreign=tuple(sorted(foreign)),
            notes=merged.notes + tuple(f"{iid} exists but does not run (stopping, stopped, suspended, deallocated or failed): "
                                       "not counted as capacity and left alone (if it stays so, start it or delete it "
                                       "yourself: it may still be billed, its disks always, an Azure VM's compute too unless "
                                       "deallocated; one on its way out, a delete or a Spot preemption under way, goes by "
                                       "itself); the plan places its work elsewhere" for iid in sorted(idle))
            + tuple(f"{iid} reports state {state!r}, which is none of pending, running, stopping or terminated: taken as "
                    "running (counted as capacity, its work left on it, nothing launched in its place, so nothing runs "
                    "twice); see what it is in the cloud's console" for iid, state in sorted(unknown))
            + tuple(f"{iid} carries this fleet's name tag ({TAG_FLEET}) but no pool, create-key or fleet-uid tag, which "
                    "every instance an apply launches has: launched by hand or another tool, so left alone (not counted as "
                    "capacity, never deleted); take the tag off, or delete it yourself" for iid in sorted(by_hand))
            + tuple(f"{iid} carries the create key {key} of {first}, launched before it: an apply launches one instance per "
                    "key, so it is a copy (cloned in a console, or launched from an image with its tags), launched by "
                    "someone else: left alone (not counted as capacity, never deleted); take its fleetops.io/ tags off, "
                    "or delete it yourself" for iid, (key, first) in sorted(copied.items()))
            + tuple(f"{iid} carries this fleet's name but no fleet-uid tag, and was launched after {first}, which carries "
                    f"the fleet's uid {uid}: every launch since the fleet had a uid writes it, so {iid} was launched by "
                    "someone else (another tool, or tags copied by hand): left alone (not counted as capacity, never "
                    "deleted); take its fleetops.io/ tags off, or delete it yourself" for iid, first in sorted(uidless.items()))
            + tuple(f"the state places {job} on {iid}, which is not this fleet's ({not_ours[iid]}): left alone, and the "
                    f"plan places {job} as if {iid} were gone (the state was edited, or is another fleet's)"
                    for job, ids in sorted(state.placements.items()) if job in self.desired.jobs
                    for iid in dict.fromkeys(ids) if iid in not_ours)
            + tuple(f"{iid} is not in {name}'s listing yet but exists (found by its id: the listing lags its launch, "
                    "eventual consistency): counted as it is, its work left on it" for name, iid in sorted(late))
            + tuple(quota_notes),
            shapes={j: dict(v) for j, v in state.shapes.items() if j in merged.placements},
            since={j: v for j, v in state.since.items() if j in merged.placements},
            aged={j: v for j, v in state.aged.items() if j in merged.placements},
            quotas=tuple(quotas), removed=merged.removed, grouped=frozenset(grouped),
        )


def launched_by_hand(tags: Mapping[str, str]) -> bool:
    """Whether an instance listed as the fleet's (its TAG_FLEET) carries none of the tags every apply's launch writes
    (its pool, its create key; its fleet's uid since uids): a colleague's instance, or another tool's, tagged with the
    fleet's name. It was taken as the fleet's and deleted ("pool '' is no longer in the desired state"). An instance
    whose provider reports no tags at all is left to that provider's word (a plugin may keep none)."""
    return bool(tags.get(TAG_FLEET)) and not any(tags.get(t) for t in (TAG_POOL, TAG_CREATE_KEY, TAG_FLEET_UID))


def launched_without_uid(instances: Sequence[Instance], uid: str) -> dict[str, str]:
    """uid-less instance's id -> the first-launched instance carrying `uid`, for each launched strictly after it. An
    instance without a uid is the fleet's only as one launched before uids (launched_by_hand: its pool and create-key
    tags), and every launch since the fleet had its uid writes it: one launched later is someone else's with the
    fleet's tags copied (s36: it was taken as the fleet's, idle, and deleted). Launch times unknown or equal: no verdict."""
    if not uid:
        return {}
    launched = launch_times(instances)
    carriers = sorted((launched[i.id], i.id) for i in instances if i.tags.get(TAG_FLEET_UID) == uid and i.id in launched)
    if not carriers:
        return {}
    since, first = carriers[0]
    return {i.id: first for i in instances if not i.tags.get(TAG_FLEET_UID) and launched.get(i.id, since) > since}


def copies(instances: Sequence[Instance]) -> dict[str, tuple[str, str]]:
    """copy's id -> (the create key it carries, the id of the instance first launched with it). An apply launches one
    instance per create key (reconciler/apply.py: each attempt has a key of its own), so of two live instances carrying
    one, the later launched is a copy of the other's tags (audit: a console clone was taken as the fleet's, and the plan
    deleted it as idle). Where launch times are unknown or equal, nothing is told apart: all are taken as the fleet's."""
    by_key: dict[str, dict[str, Instance]] = {}
    for i in instances:
        if i.tags.get(TAG_CREATE_KEY):
            by_key.setdefault(i.tags[TAG_CREATE_KEY], {})[i.id] = i
    groups = {k: g for k, g in by_key.items() if len(g) > 1}
    launched = launch_times(i for g in groups.values() for i in g.values())
    out: dict[str, tuple[str, str]] = {}
    for key, group in groups.items():
        if any(iid not in launched for iid in group):
            continue
        first, *later = sorted(group, key=lambda iid: launched[iid])
        if launched[later[0]] == launched[first]:
            continue
        out.update({iid: (key, first) for iid in later})
    return out


def _gpu_count(offered: dict[tuple[str, str, str], int]) -> Callable[[Instance], int | None]:
    """How many GPUs an instance has: as its provider offers the type there, else as the catalog lists it (None: unknown)."""
    def gpus_of(inst: Instance) -> int | None:
        n = offered.get((inst.cloud, inst.zone, inst.instance_type))
        if n is None:
            shape = load_catalog().shape(inst.cloud, inst.instance_type)
            n = shape.gpus if shape is not None else None
        return n
    return gpus_of


def _check_recorded_provider(state: State, n: int, r: dict) -> None:
    """A region the state records instances in whose provider no pool names: one that is installed, or the state's
    error (an uninstalled plugin, or an edited state), never a bare 'unknown provider' that names neither."""
    installed = available()
    if r["provider"] not in installed:
        raise StateFileError(state.source, f"regions[{n}] records instances launched through provider {r['provider']!r} in "
                                           f"{r['cloud']}/{r['region']}, which is not installed (installed: "
                                           f"{', '.join(sorted(installed))}): install it so that they are seen")


def _read_quotas(name: str, prov, targets: list[PoolTarget]) -> tuple[list[Quota], list[str]]:
    """The account quotas a provider reads for its pools, and a note when it reads none: never a guess, and never a
    stop (the launch-time QuotaError still guards a launch past a quota)."""
    if not isinstance(getattr(prov, "_provider", prov), QuotaReader):
        return [], [f"provider {name} does not read account quotas: the plan is not checked against them (a launch past "
                    "one fails with a QuotaError naming it)"]
    try:
        return list(prov.quotas(targets)), []
    except ProviderError as e:
        return [], [f"account quotas were not read ({e}): the plan is not checked against them (a launch past one fails "
                    "with a QuotaError naming it)"]
