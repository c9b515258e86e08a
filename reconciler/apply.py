"""Carry a plan out through the providers: create, re-place, then delete.

Make before break: new capacity is created first; an instance is deleted only
after every replica it hosted has somewhere to go. The one exception is a full
Reservation: a create into it waits until the plan has deleted one of its
instances (the cloud takes no more), so a replica moving between two of its
instances restarts on the new one after the old one is gone. Each create carries the
plan's idempotency key, so a retry (or a rerun of the same plan after a crash)
never yields a second instance. Failures are collected, not raised midway:
the report says exactly what happened.

A plan's keys recur whenever (desired, observed) does: a reclaimed replacement, a whole fleet
lost, a scale to zero reverted. Every cloud remembers a key after its instance is gone (EC2 a
ClientToken for >= 24 h after termination, GCE a requestId, the sim for ever) and answers it
with the dead instance, so each create is tried as a sequence of attempts: the plan's key, then
`<key>-1`, `<key>-2`, ... An attempt whose key the cloud proves spent (it answers with an
instance that is gone, or KeySpentError) moves on to the next; the first attempt that
launches, or finds a live instance (a rerun after a crash), is the create. One answered with an
instance that exists but is stopped fails the create instead: the key is not spent, and moving on
would launch a second instance for it. Attempts are tried in
order and a spent key is never counted as a launch, so the rule needs no state of its own and
survives a lost state file.

Placements are recorded on the instances too (providers that can: PlacementRecorder),
in this order: a new instance is launched with the replicas the plan puts on it;
once the creates are done, every surviving instance whose tags differ from the
final placements is retagged, before any delete (make before break for the record
as well); the caller saves the state last. Tags and state carry the same new
serial, so a crash between any two steps leaves whichever is newer recognisable
(reconciler/placements.py), and observe recovers from it."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from providers.base import (TAG_CREATE_KEY, TAG_FLEET, TAG_FLEET_UID, TAG_MIG, TAG_RESERVATION, CreateRequest, Instance, Janitor,
                            PlacementRecorder, Preflight, mig_tag, ownership_tags)
from providers.placements import Placement, PlacementRecord, PlacementTagError, placement_tags, read_placements
from providers.errors import retrying_until
from reconciler.errors import AccessDeniedError, CapacityError, KeySpentError, ProviderError, TransientProviderError
from reconciler.model import DesiredState
from reconciler.observe import Fleet, Observed, pool_target, provider_for
from reconciler.placements import next_serial
from reconciler.plan import CreateAction, DeleteAction, JobChange, Plan
from reconciler.problem import effective_priority, shape_of
from reconciler.state import State, utcnow

RETRIES = 4
BACKOFF_S = 0.2
MAX_BACKOFF_S = 30.0
MAX_WORKERS = 256  # threads for all lanes together; each lane is bounded by its provider's parallelism
MAX_ATTEMPTS = 16  # keys tried for one create in one apply; each spent one cost the cloud one answer


def attempt_key(key: str, attempt: int) -> str:
    """The create key of the n-th launch attempt for a plan's key (the 0th is the key itself)."""
    return key if attempt == 0 else f"{key}-{attempt}"


@dataclass(frozen=True)
class ApplyEvent:
    """One step of an apply, for progress displays (reconciler/progress.py) and metrics.

    phase: "started" | "finished" | "failed" | "skipped" (not started: the apply was stopped);
    action: "create" | "tag" | "delete"; target: a create's plan ref ("+3"), else the instance id;
    what: for people ("spot g5.xlarge in us-east-1b"); elapsed_s: since this action started.
    Callbacks run on the thread that called apply_plan, one event at a time."""

    phase: str
    action: str
    target: str
    what: str = ""
    elapsed_s: float = 0.0
    instance_id: str | None = None
    error: str | None = None


OnEvent = Callable[[ApplyEvent], None]


class _Steps:
    """Times each action and reports it; says whether to start the next one (stopped: Ctrl-C)."""

    def __init__(self, on_event: OnEvent | None, should_stop: Callable[[], bool] | None, report: "ApplyReport"):
        self.on_event, self.should_stop, self.report = on_event, should_stop, report

    def begin(self, action: str, target: str, what: str) -> float | None:
        """The start time, or None when the apply was asked to stop (the action is recorded as not started)."""
        if self.report.stopped or (self.should_stop is not None and self.should_stop()):
            self.report.stopped = True
            self.report.not_started.append(f"{action} {target}")
            self._emit(ApplyEvent("skipped", action, target, what))
            return None
        self._emit(ApplyEvent("started", action, target, what))
        return time.monotonic()

    def end(self, started: float, action: str, target: str, what: str, instance_id: str | None = None,
            error: Exception | None = None) -> None:
        self._emit(ApplyEvent("failed" if error else "finished", action, target, what, time.monotonic() - started,
                              instance_id, None if error is None else str(error)))

    def _emit(self, event: ApplyEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)


@dataclass
class ApplyReport:
    plan_id: str
    created: dict[str, str] = field(default_factory=dict)  # plan ref -> instance id
    deleted: list[str] = field(default_factory=list)
    skipped_deletes: dict[str, str] = field(default_factory=dict)  # instance id -> why it was kept
    failures: list[str] = field(default_factory=list)
    failed_refs: dict[str, str] = field(default_factory=dict)  # plan ref -> error
    placements: dict[str, list[str]] = field(default_factory=dict)  # job -> instance ids, as now recorded
    stopped: bool = False  # asked to stop (Ctrl-C): actions after that point were not started
    not_started: list[str] = field(default_factory=list)  # "create +3", "delete i-0ab..."
    cleaned_up: list[str] = field(default_factory=list)  # unused cloud objects deleted (AWS placement groups)
    gangs_stopped: dict[str, list[str]] = field(default_factory=dict)  # job -> instances its survivors were stopped on
    # plan ref -> instance id: launched for work that was not placed after all (a gang missing a replica's instance),
    # then deleted; not in `created` (it is not there) nor `deleted` (the plan did not delete it)
    rolled_back: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the apply did besides its actions (checkpoints of removed jobs deleted)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def counts(self) -> str:
        """What the apply did, for summaries: "2 created, 1 rolled back, 0 deleted" (rolled back only when any was)."""
        back = f", {len(self.rolled_back)} rolled back" if self.rolled_back else ""
        return f"{len(self.created)} created{back}, {len(self.deleted)} deleted"


def _retry(call, what: str, window_s: float = 0.0):
    """Retry throttling and timeouts with exponential backoff; other errors go straight up. At least RETRIES tries;
    with a window (a provider's retry_window_s: the clouds' write rate limits are per minute), keep trying until the
    next pause would end past it, pauses growing to MAX_BACKOFF_S. A pause is never shorter than the Retry-After the
    cloud answered (TransientProviderError.retry_after); one longer than MAX_BACKOFF_S is waited only within the
    window. An error the provider's SDK already retried (TransientProviderError.retried) is not retried again: the
    tries would multiply. The window's end is the call's providers.errors.retry_deadline(): a provider's own retries
    of the reads inside a try (GCE's) stop there."""
    started = time.monotonic()
    for attempt in itertools.count():
        try:
            with retrying_until(started + window_s if window_s > 0 else None):
                return call()
        except TransientProviderError as e:
            pause = max(min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S), e.retry_after or 0.0)
            past_window = time.monotonic() - started + pause > window_s
            if e.retried or (attempt >= RETRIES - 1 or pause > MAX_BACKOFF_S) and past_window:
                raise
            time.sleep(pause)
    raise AssertionError(what)


def _retried(e: ProviderError) -> str:
    """What a transient error that outlasted _retry means, for the report: a cloud's bare throttling or outage answer
    reads like a refusal for good."""
    if not isinstance(e, TransientProviderError):
        return ""
    return (" (a transient error, still there after every retry: throttling, an outage or a timeout; the next run "
            "tries again; if the cloud keeps throttling, fewer calls at once: -o parallelism=N)")


def _window(provider) -> float:
    return float(getattr(provider, "retry_window_s", 0.0) or 0.0)


def parallelism(provider) -> int:
    """How many creates (or deletes) run at once per provider and region: the provider's `parallelism` (an option
    of its own, or its default); 1 for providers that declare none."""
    return max(1, int(getattr(provider, "parallelism", 1) or 1))


def _lane(fleet: Fleet, provider: str, region: str) -> tuple[str, str]:
    """Actions of one lane share its parallelism: a provider and region; a provider that declares no parallelism
    (the sim, plugins) is one lane, so its calls never overlap and run in the plan's order."""
    return (provider, region) if hasattr(fleet.provider(provider), "parallelism") else (provider, "")


def _run_all(items: list, lane: Callable[[Any], tuple[str, str]], limit: Callable[[Any], int],
             begin: Callable[[Any], float | None], work: Callable[[Any], Any],
             finish: Callable[[Any, float, Any, BaseException | None], None]) -> None:
    """Run work(item) for every item on worker threads, at most limit(item) at once per lane (provider, region),
    in the items' order as slots free up. begin (may decline: stopped) and finish run on this thread, so progress
    callbacks, the report and the state are only ever touched here."""
    order = {id(item): n for n, item in enumerate(items)}
    queues: dict[tuple[str, str], deque] = {}  # per lane, in the items' order: a pass visits lanes, not every waiting item
    for item in items:
        queues.setdefault(lane(item), deque()).append(item)
    busy: dict[tuple[str, str], int] = {}
    running: dict[Future, tuple[Any, float, tuple[str, str]]] = {}
    with ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="apply") as pool:
        while queues or running:
            # Lanes by their next item, so items start in the plan's order as slots free up.
            for key in sorted(queues, key=lambda k: order[id(queues[k][0])]):
                q = queues[key]
                while q and busy.get(key, 0) < limit(q[0]):
                    item = q.popleft()
                    started = begin(item)
                    if started is None:
                        continue
                    busy[key] = busy.get(key, 0) + 1
                    running[pool.submit(work, item)] = (item, started, key)
                if not q:
                    del queues[key]
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: order[id(running[f][0])]):  # a deterministic report order
                item, started, key = running.pop(fut)
                busy[key] -= 1
                error = fut.exception()
                finish(item, started, None if error is not None else fut.result(), error)


def create_request(fleet: Fleet, desired: DesiredState, plan: Plan, c: CreateAction, serial: int, key: str, uid: str,
                   hosted: list[Placement]) -> CreateRequest:
    """What a provider is asked to launch for a create (its attempt `key`), tags and placements included."""
    target = pool_target(desired.pools[c.site.pool])
    tags = {**ownership_tags(desired.fleet, c.site.pool, key), "fleetops.io/plan": plan.id, **({TAG_FLEET_UID: uid} if uid else {})}
    # The layout the bootstrap partitions its GPUs with (target.mig), once: how the next plans know it when the pool's
    # changes (a drifted instance is replaced: reconciler/problem/capacity.py).
    tags[TAG_MIG] = mig_tag(target.mig)
    reservation = desired.reservations.get(c.reservation) if c.reservation else None
    if c.reservation:
        tags[TAG_RESERVATION] = c.reservation  # how the next plan knows it is reserved capacity (price 0)
    return CreateRequest(
        key=key, pool=target, zone=c.site.zone, instance_type=c.site.instance_type,
        market=c.site.market, max_price=c.max_price, tags=tags, placement_group=c.placement_group,  # type: ignore[arg-type]
        placements=PlacementRecord.of(serial, hosted), agent_state_url=getattr(fleet, "agent_state_url", None),
        capacity_reservation=reservation.spec.target.reservation_id if reservation is not None and reservation.spec.target else None,
    )


def _create(fleet: Fleet, desired: DesiredState, plan: Plan, c: CreateAction, serial: int, key: str, uid: str,
            hosted: list[Placement]) -> Instance:
    provider = fleet.provider(c.site.provider)
    req = create_request(fleet, desired, plan, c, serial, key, uid, hosted)
    return _retry(lambda: provider.create(req), f"create {c.ref}", _window(provider))


def _launch(fleet: Fleet, desired: DesiredState, plan: Plan, c: CreateAction, serial: int,
            alive: dict[str, Instance], uid: str, hosted: list[Placement], known: frozenset[str]) -> Instance:
    """The create's first attempt that launches or finds a live instance (module docstring). `hosted`: the
    replicas the plan puts on it (recorded in its tags). `known`: the ids of the instances the fleet ran before."""
    for n in range(MAX_ATTEMPTS):
        key = attempt_key(c.key, n)
        if key in alive:  # created by an earlier, interrupted run of this same plan
            return alive[key]
        try:
            inst = _create(fleet, desired, plan, c, serial, key, uid, hosted)
        except KeySpentError:
            continue
        if inst.state not in ("pending", "running", "terminated"):  # the key's instance exists, stopped (or in a state
            # we do not know): launching under the next key would make two
            raise ProviderError(f"the cloud answered create key {key} with {inst.id}, which exists but does not run "
                                f"(stopped, suspended or failed{'' if inst.state == 'stopping' else f'; its state is {inst.state!r}'}): "
                                "it is this create's instance, so no second one is launched; start it, or delete it yourself, "
                                "then apply again")
        if inst.alive:
            _check_launched(c, key, inst, known, desired.fleet, uid)
            return inst
    raise ProviderError(f"the cloud answered all {MAX_ATTEMPTS} create keys {c.key}..{attempt_key(c.key, MAX_ATTEMPTS - 1)} "
                        "with instances that are gone; nothing was launched")


def _check_launched(c: CreateAction, key: str, inst: Instance, known: frozenset[str], fleet: str, uid: str = "") -> None:
    """The instance the cloud answered a create with is a new one of the site asked for. A cloud answers a key it has
    seen with that key's instance, whatever was asked: one the fleet already ran (a key it was launched with) or one of
    another site would get the plan's replicas beside its own work, on GPUs it does not have (audit: a plan given an
    earlier plan's id). Nothing is placed on it; the create fails and says why."""
    site = c.site
    if inst.id in known:
        raise ProviderError(f"the cloud answered create key {key} with {inst.id}, an instance the fleet already runs, not a "
                            "new one; nothing was placed on it")
    owner, theirs = inst.tags.get(TAG_FLEET), inst.tags.get(TAG_FLEET_UID)
    if owner and owner != fleet or uid and theirs and theirs != uid:  # (a name is no identity: reconciler/identity.py)
        raise ProviderError(f"the cloud answered create key {key} with {inst.id}, an instance of fleet {owner!r} "
                            f"(uid {theirs or 'unknown'}), not a new one of this fleet; nothing was placed on it")
    got = (inst.cloud, inst.zone, inst.instance_type, inst.market, inst.pool or site.pool)  # (a launch may answer before
    want = (site.cloud, site.zone, site.instance_type, site.market, site.pool)             # its tags are readable)
    if got != want:
        raise ProviderError(f"the cloud answered create key {key} with {inst.id}, a {inst.market} {inst.instance_type} in "
                            f"{inst.cloud}/{inst.zone} (pool {inst.pool!r}), not the {site.market} {site.instance_type} in "
                            f"{site.cloud}/{site.zone} (pool {site.pool!r}) asked for; nothing was placed on it")


def _hosted(placements: dict[str, list[str]], gpus: dict[str, list[list[int]]]) -> dict[str, list[Placement]]:
    """Instance id -> the replicas it hosts, with their GPU indices (as the state records them)."""
    out: dict[str, list[Placement]] = {}
    for job, ids in placements.items():
        g = gpus.get(job)
        for r, iid in enumerate(ids):
            out.setdefault(iid, []).append(Placement(job, r, tuple(g[r]) if g and len(g) == len(ids) else ()))
    return out


def _retagged(inst: Instance, want: PlacementRecord) -> bool:
    """Whether recording `want` on the instance rewrites its placement tags: they would read back differently."""
    try:
        have = read_placements(inst.tags)
    except PlacementTagError:
        have = None
    shown = read_placements(placement_tags(want))  # what a reader gets back (too many reads as incomplete)
    return have is None or shown is None or (have.placements, have.complete) != (shown.placements, shown.complete)


def _record_placements(fleet: Fleet, instances: list[Instance], hosted: dict[str, list[Placement]], serial: int,
                       report: ApplyReport, steps: _Steps) -> None:
    """Retag each instance whose placement tags would read back differently from what it now hosts
    (an unchanged instance is left alone: its older serial still tells the truth)."""
    for inst in instances:
        provider = fleet.provider(inst.provider)
        if not isinstance(provider, PlacementRecorder):
            continue
        want = PlacementRecord.of(serial, hosted.get(inst.id, ()))
        if not _retagged(inst, want):
            continue
        # Recording is not an action a stop skips: the tags must agree with the state saved after this.
        started = time.monotonic()
        steps._emit(ApplyEvent("started", "tag", inst.id, "record placements"))
        try:
            _retry(lambda: provider.record_placements(inst, want), f"tag {inst.id}")  # type: ignore[union-attr]
            steps.end(started, "tag", inst.id, "record placements", inst.id)
        except ProviderError as e:
            report.failures.append(f"record placements on {inst.id}: {e} (the state still has them)")
            steps.end(started, "tag", inst.id, "record placements", inst.id, e)


def _clean_up(fleet: Fleet, plan: Plan, existing: dict[str, Instance], report: ApplyReport) -> None:
    """Janitor providers delete this fleet's placement groups nothing is in, when one may have just been freed: an
    instance in a group was deleted, a create into a group failed, or an observed instance is in one (its group is
    kept, others are looked at). Providers whose instances report no groups are not asked."""
    deleted = set(report.deleted) | set(report.rolled_back.values())
    for name, pools in sorted(fleet.pools_by_provider().items()):
        ours = [i for i in existing.values() if i.provider == name]
        in_use = frozenset(i.placement_group for i in ours if i.placement_group and i.id not in deleted)
        freed = any(i.placement_group and i.id in deleted for i in ours) or any(
            c.placement_group and c.ref in report.failed_refs for c in plan.creates if c.site.provider == name)
        if not (freed or in_use):
            continue
        provider = fleet.provider(name)
        if not isinstance(provider, Janitor):
            continue
        try:
            report.cleaned_up.extend(_retry(lambda: provider.clean_up([pool_target(p) for p in pools], in_use),
                                            f"clean up {name}"))
        except ProviderError as e:
            report.failures.append(f"clean up {name}: {e} (the next run tries again)")


def _hold_back_arrivals(plan: Plan, observed: Observed, placed: "_Placed", failures: list[str]) -> None:
    """A job the plan puts on an instance whose resident could not leave (its new instance was
    not created) would share its GPUs and room with it: 16 of 8 GPUs, both on GPUs 0-7. It is
    not put there: it stays where it runs (which strands that instance in turn) or, new, waits
    for the next plan, which sees the fleet as it is (and so does a gang that lost replicas: _stop_gang)."""
    placements, gpus, stranded = placed.ids, placed.gpus, placed.stranded
    changed = True
    while changed:
        changed = False
        for j in plan.jobs:
            ids = placements.get(j.job)
            if ids is None or ids == list(j.previous):
                continue
            blocked = sorted({iid for iid in ids if iid in stranded and iid not in j.previous})
            if not blocked:
                continue
            changed = True
            partly = _runs_partly(j, observed)
            failures.append(f"{j.job} not put on {', '.join(blocked)}: what runs there could not move (its new instance "
                                   "was not created); " + ("it stays where it runs" if j.previous and not partly else "the next run places it"))
            if partly:
                del placements[j.job]
                gpus.pop(j.job, None)
                _stop_gang(j, observed, placed, failures)
            elif j.previous:
                placements[j.job] = list(j.previous)
                gpus.pop(j.job, None)
                if j.job in observed.gpu_indices:
                    gpus[j.job] = [list(g) for g in observed.gpu_indices[j.job]]
                stranded.update(j.previous)
            else:
                del placements[j.job]
                gpus.pop(j.job, None)


SCOPE_SETTINGS = ("project", "subscription_id", "resource_group")  # where a provider looks, beyond the region


def _regions(desired: DesiredState, fleet: Fleet, state: State, alive: list[Instance]) -> list[dict]:
    """Every (provider, cloud, region) the fleet has launched into and still has instances in, or has a pool in:
    observe keeps looking there after its last pool is gone, until nothing of ours is left."""
    pooled = {(provider_for(p, fleet.default), p.spec.cloud, p.spec.region): p for p in desired.pools.values()}
    out = {(r["provider"], r["cloud"], r["region"]): r for r in state.regions}
    for i in alive:
        k = (i.provider, i.cloud, i.region)
        if k not in out:
            pool = desired.pools.get(i.pool) or pooled.get(k)
            settings = pool_target(pool).settings if pool is not None else {}
            out[k] = {"provider": k[0], "cloud": k[1], "region": k[2],
                      "settings": {s: settings[s] for s in SCOPE_SETTINGS if settings.get(s)}}
    live = {(i.provider, i.cloud, i.region) for i in alive}
    return [r for k, r in sorted(out.items()) if k in live or k in pooled]


def check_permissions(desired: DesiredState, observed: Observed, plan: Plan, fleet: Fleet, state: State, serial: int) -> None:
    """Before an apply changes anything: each provider that can (base.Preflight) is asked whether the credentials may make
    the plan's launches (as they will be sent), its deletes, and the placement tags' writes; a refusal stops the apply
    with nothing changed, naming the actions (an apply that could launch but not tag or delete left a replacement
    running beside what it replaced, and a failed gang's instances up)."""
    arriving = _arrivals(plan)
    existing = {i.id: i for i in observed.instances}
    checks = any(isinstance(fleet.provider(n), Preflight) for n in {i.provider for i in observed.instances})
    retag = _retagging(plan, observed, fleet, serial) if checks else []  # (no provider would be asked: not worked out)
    for name in sorted({c.site.provider for c in plan.creates} | {existing[d.instance_id].provider for d in plan.deletes
                                                                     if d.instance_id in existing}
                       | {i.provider for i in retag}):
        provider = fleet.provider(name)
        if not isinstance(provider, Preflight):
            continue
        creates = [create_request(fleet, desired, plan, c, serial, c.key, state.fleet_uid, arriving.get(c.ref, []))
                   for c in plan.creates if c.site.provider == name]
        deletes = [existing[d.instance_id] for d in plan.deletes if existing.get(d.instance_id) and existing[d.instance_id].provider == name]
        mine = [i for i in retag if i.provider == name]
        try:
            _retry(lambda: provider.preflight(creates, deletes, [i for i in observed.instances if i.provider == name],
                                              retag=mine),
                   f"check {name}'s permissions", _window(provider))
        except AccessDeniedError as e:
            raise AccessDeniedError(f"refusing to apply; nothing was changed:\n  - {e}", actions=e.actions) from None


def _retagging(plan: Plan, observed: Observed, fleet: Fleet, serial: int) -> list[Instance]:
    """The instances whose placement tags the apply rewrites when its creates succeed (as _record_placements decides):
    the instances it keeps whose replicas change. A plan that only moves or stops jobs still writes tags."""
    placed = _placements(plan, observed, ApplyReport(plan.id), coming={c.ref for c in plan.creates}, failures=[])
    hosted = _hosted(placed.ids, placed.gpus)
    leaving = {d.instance_id for d in plan.deletes}
    return [i for i in observed.instances if i.id not in leaving and isinstance(fleet.provider(i.provider), PlacementRecorder)
            and _retagged(i, PlacementRecord.of(serial, hosted.get(i.id, ())))]


def apply_plan(desired: DesiredState, observed: Observed, plan: Plan, fleet: Fleet, state: State,
               on_event: OnEvent | None = None, should_stop: Callable[[], bool] | None = None, serial: int | None = None) -> ApplyReport:
    """on_event: told of every action as it starts and ends (ApplyEvent). should_stop: asked before each
    create and delete; once true, no further action starts (report.stopped, report.not_started), the jobs
    whose new instances exist are placed, and placements are recorded as usual, so the state saved after
    this agrees with the cloud and the next run carries on. serial: what the tags and the state are written with,
    as the caller recorded it before any provider call (backend.record_start); None: the next one (next_serial)."""
    report = ApplyReport(plan.id)
    steps = _Steps(on_event, should_stop, report)
    if serial is None:
        serial = next_serial(state, getattr(observed, "serial", 0), observed.instances)  # newer than anything recorded so far
    existing = {i.id: i for i in observed.instances}
    already = {i.tags.get(TAG_CREATE_KEY): i for i in observed.instances}

    todo = _resume_creates(plan, already, report)
    now, later = _reservation_order(desired, plan, todo, existing)
    _launch_all(now, desired, plan, fleet, state, serial, already, existing, report, steps)
    placed = _placements(plan, observed, report, coming={c.ref for c in later})
    leaving = {d.instance_id for d in plan.deletes} - placed.stranded  # retagging those would be wasted

    def survivors() -> list[Instance]:
        return [i for iid, i in sorted(existing.items()) if iid not in leaving]
    _record_placements(fleet, survivors(), _hosted(placed.ids, placed.gpus), serial, report, steps)
    deletes = plan.deletes
    if later:
        # A full Reservation takes a new instance only once one of its own is gone: its holders the plan deletes go
        # first, then the creates that waited for them, then the other deletes (make before break as usual).
        waited = {c.reservation for c in later}
        freeing = [d for d in deletes if existing.get(d.instance_id) and _reservation_of(existing[d.instance_id]) in waited]
        _delete_all(freeing, fleet, existing, placed.stranded, report, steps)
        _launch_all(_room_left(desired, plan, later, existing, report), desired, plan, fleet, state, serial, already,
                    existing, report, steps)
        notes: list[str] = []
        placed = _placements(plan, observed, report, failures=notes)  # as the creates ended
        report.failures.extend(n for n in notes if n not in report.failures)
        if any(c.ref in report.failed_refs for c in later):  # what the survivors host changed: record it again
            leaving = {d.instance_id for d in deletes} - placed.stranded
            _record_placements(fleet, survivors(), _hosted(placed.ids, placed.gpus), serial, report, steps)
        deletes = [d for d in deletes if d not in freeing]
    _roll_back(plan, placed, fleet, existing, report, steps)
    _delete_all(deletes, fleet, existing, placed.stranded, report, steps)
    if not report.stopped:
        _clean_up(fleet, plan, existing, report)
    _update_state(desired, observed, fleet, state, existing, placed, serial, report)
    return report


def _unplaced_launches(plan: Plan, report: ApplyReport, placed: _Placed) -> list[CreateAction]:
    """The creates launched for replicas of which none is placed after all: a job is placed only once every one of
    its replicas' new instances exists (a gang runs with all its replicas or none), so when one create failed, the
    instances launched for its other replicas host nothing. A create the plan launched to stand idle (no replicas
    arriving: an on-demand buffer, spot ballast) is not one of them."""
    hosting = {iid for ids in placed.ids.values() for iid in ids}
    arriving = _arrivals(plan)
    return [c for c in plan.creates if c.ref in report.created and arriving.get(c.ref) and report.created[c.ref] not in hosting]


def _roll_back(plan: Plan, placed: _Placed, fleet: Fleet, existing: dict[str, Instance], report: ApplyReport,
               steps: _Steps) -> None:
    """Delete the instances launched for work that was not placed (_unplaced_launches). Kept, they ran idle and billed
    until a later run (audit: a 3-replica gang whose third create failed left two p4d up, and apply said "2 created").
    Not after a stop: a rerun of the same plan finds them by key and carries on. One whose delete fails is still
    reported created (it is there), with why."""
    launches = [] if report.stopped else _unplaced_launches(plan, report, placed)
    if not launches:
        return
    why = "launched for replicas that were not placed"
    by_id = {report.created[c.ref]: c for c in launches}
    done = ApplyReport(plan.id)  # its deletes and failures, told apart from the plan's (steps still reports a stop)
    _delete_all([DeleteAction(iid, c.site, c.price, why) for iid, c in by_id.items()], fleet, existing, set(), done, steps)
    for iid in done.deleted:
        ref = by_id[iid].ref
        report.rolled_back[ref] = report.created.pop(ref)
    for f in done.failures:
        report.failures.append(f"roll back ({why}): {f}; it hosts nothing, and the next plan uses or deletes it")
    refs = {by_id[iid].ref: iid for iid in done.deleted}
    for j in plan.jobs:
        back = [f"{r} {refs[r]}" for r in j.instances if r in refs]
        failed = [r for r in j.instances if r in report.failed_refs]
        if back and j.job not in placed.ids:
            report.failures.append(
                f"{j.job}: not placed: the new instance for its replica(s) on {', '.join(failed) or 'others'} could not be "
                f"created, and a job is placed with all its replicas or none (a gang runs so); the instance(s) launched "
                f"for its other replicas were deleted, not left idle: {', '.join(back)}")


def _what(action: CreateAction | DeleteAction) -> str:
    """An action's instance, for people: "spot g5.xlarge in us-east-1b"."""
    return f"{action.site.market} {action.site.instance_type} in {action.site.zone}"


def _reservation_of(inst: Instance) -> str | None:
    """The Reservation an instance of ours was launched into (its tag), if on-demand (a spot one cannot be in one)."""
    return inst.tags.get(TAG_RESERVATION) if inst.market == "on-demand" else None


def _reservation_members(plan: Plan, existing: dict[str, Instance], created: dict[str, str], deleted) -> dict[str, set[str]]:
    """Reservation -> the ids of our instances in it: those observed (or launched: `existing`) with its tag, and the
    plan's creates into it launched so far (`created`: by id, so one an interrupted run launched and observe found
    counts once), less those `deleted`."""
    ids: dict[str, set[str]] = {}
    for iid, inst in existing.items():
        name = _reservation_of(inst)
        if name:
            ids.setdefault(name, set()).add(iid)
    for c in plan.creates:
        if c.reservation and c.ref in created:
            ids.setdefault(c.reservation, set()).add(created[c.ref])
    gone = set(deleted)
    return {name: s - gone for name, s in ids.items()}


def _reservation_order(desired: DesiredState, plan: Plan, todo: list[CreateAction],
                       existing: dict[str, Instance]) -> tuple[list[CreateAction], list[CreateAction]]:
    """(creates to launch now, creates that wait for the plan's deletes): a create into a Reservation whose instances
    alive now already fill its count waits until the plan has deleted one of them. The cloud refuses a launch into a
    full targeted reservation (EC2: ReservationCapacityExceeded, a capacity error that would mark the zone short),
    and into an open one it launches at the on-demand price. The plan may do this: its count holds the instances it
    keeps and launches (problem.capacity.reserved_offers; fleet66)."""
    held = {name: len(ids) for name, ids in _reservation_members(plan, existing, {}, ()).items()}
    now, later = [], []
    for c in todo:
        r = desired.reservations.get(c.reservation) if c.reservation else None
        if r is not None and held.get(c.reservation, 0) >= r.spec.count:  # type: ignore[arg-type]
            later.append(c)
        else:
            now.append(c)
            if c.reservation:
                held[c.reservation] = held.get(c.reservation, 0) + 1
    return now, later


def _room_left(desired: DesiredState, plan: Plan, later: list[CreateAction], existing: dict[str, Instance],
               report: ApplyReport) -> list[CreateAction]:
    """Of the creates that waited for their Reservation, those it has room for now that the plan's deletes ran; the
    others are reported failed, not started (nothing is launched past a reservation's count)."""
    held = {name: len(ids) for name, ids in _reservation_members(plan, existing, report.created, report.deleted).items()}
    out = []
    for c in later:
        name = c.reservation or ""
        if held.get(name, 0) < desired.reservations[name].spec.count:
            held[name] = held.get(name, 0) + 1
            out.append(c)
            continue
        why = f"reservation {name} is still full: its instance(s) the plan deletes were not deleted"
        report.failed_refs[c.ref] = why
        report.failures.append(f"create {c.ref} {c.site.market} {c.site.instance_type} in {c.site.zone}: not started: {why}")
    return out


def _resume_creates(plan: Plan, already: dict[str | None, Instance], report: ApplyReport) -> list[CreateAction]:
    """The creates still to launch. One an earlier, interrupted run of this same plan launched (under any
    attempt's key) is recorded as created and not launched again."""
    todo = []
    for c in plan.creates:
        found = next((already[k] for k in (attempt_key(c.key, n) for n in range(MAX_ATTEMPTS)) if k in already), None)
        if found is not None:  # created by an earlier, interrupted run of this same plan
            report.created[c.ref] = found.id
        else:
            todo.append(c)
    return todo


def _launch_all(todo: list[CreateAction], desired: DesiredState, plan: Plan, fleet: Fleet, state: State, serial: int,
                already: dict[str | None, Instance], existing: dict[str, Instance], report: ApplyReport, steps: _Steps) -> None:
    """Launch the creates, lanes in parallel. A launched instance joins `existing` and report.created; a failed
    create is reported (a capacity error also marks its zone short in the state, so the next plan goes elsewhere)."""

    def created(c: CreateAction, started: float, inst: Instance | None, e: BaseException | None) -> None:
        if e is None:
            report.created[c.ref] = inst.id  # type: ignore[union-attr]
            existing[inst.id] = inst  # type: ignore[union-attr,index]
            steps.end(started, "create", c.ref, _what(c), inst.id)  # type: ignore[union-attr]
            return
        if not isinstance(e, ProviderError):
            raise e
        report.failed_refs[c.ref] = str(e)
        if isinstance(e, CapacityError):
            state.mark_short(e.cloud, e.zone, e.instance_type, e.market)
            report.failures.append(f"create {c.ref} {c.site.market} {c.site.instance_type} in {c.site.zone}: {e} (zone marked short; the next run places the work elsewhere)")
        else:
            report.failures.append(f"create {c.ref} {c.site.market} {c.site.instance_type} in {c.site.zone}: {e}{_retried(e)}")
        steps.end(started, "create", c.ref, _what(c), error=e)

    arriving = _arrivals(plan)
    known = frozenset(i.id for i in already.values())
    _run_all(todo, lane=lambda c: _lane(fleet, c.site.provider, desired.pools[c.site.pool].spec.region),
             limit=lambda c: parallelism(fleet.provider(c.site.provider)),
             begin=lambda c: steps.begin("create", c.ref, _what(c)),
             work=lambda c: _launch(fleet, desired, plan, c, serial, already, state.fleet_uid, arriving.get(c.ref, []), known),
             finish=created)


def _arrivals(plan: Plan) -> dict[str, list[Placement]]:
    """Create ref -> the replicas the plan puts on it (worked out once: per create, 3k creates x 5k jobs took 10 s)."""
    arriving: dict[str, list[Placement]] = {}
    for j in plan.jobs:
        if j.action in ("keep", "place", "move"):
            for r, ref in enumerate(j.instances):
                arriving.setdefault(ref, []).append(Placement(j.job, r, tuple(j.gpus[r]) if r < len(j.gpus) else ()))
    return arriving


@dataclass
class _Placed:
    """Where each job runs once the creates are done."""

    ids: dict[str, list[str]] = field(default_factory=dict)  # job -> instance ids
    gpus: dict[str, list[list[int]]] = field(default_factory=dict)  # job -> GPU indices per replica
    stranded: set[str] = field(default_factory=set)  # instances still hosting a replica that could not move
    stayed_old: set[str] = field(default_factory=set)  # jobs whose move failed: they still run as they were
    stopped: dict[str, list[str]] = field(default_factory=dict)  # gangs not run: job -> where their survivors were


def _runs_partly(j: JobChange, observed: Observed) -> bool:
    """A gang that lost replicas (their instances are gone) and runs with the rest: it may not stay so."""
    return bool(j.previous) and bool(observed.lost.get(j.job))


def _stop_gang(j: JobChange, observed: Observed, placed: _Placed, failures: list[str]) -> None:
    """A gang runs with all its replicas or none (README, Gangs): one that lost replicas and whose replacements
    were not all created is not left running with the rest, restarted at a smaller world size (before: WORLD_SIZE=1,
    recorded as running, and the next plan read the heal as "replicas changed (1 -> 2)"). Its survivors stop and it
    is pending; the state remembers what it lost, so the next plan places it whole as the heal it is."""
    placed.stopped[j.job] = list(j.previous)
    failures.append(f"{j.job}: stopped its surviving replica(s) on {', '.join(j.previous)}: its replica(s) lost on "
                    f"{', '.join(observed.lost[j.job])} could not all be replaced, and a gang runs with all its replicas "
                    "or none; it is pending until the next run places it whole")


def _placements(plan: Plan, observed: Observed, report: ApplyReport, coming: set[str] = frozenset(),  # type: ignore[assignment]
                failures: list[str] | None = None) -> _Placed:
    """A job moves only if every replica's new instance exists; otherwise it stays where it ran (stranding
    those instances) or, new, is not placed. Evicted and pending jobs are no longer placed. `coming`: creates still
    to launch (after the deletes their Reservation waits for), counted as if they existed (by their ref).
    `failures`: where to say which jobs were held back (report.failures)."""
    placed = _Placed()
    failures = report.failures if failures is None else failures
    for j in plan.jobs:
        if j.action in ("keep", "place", "move"):
            ids = [(r if r in coming else report.created.get(r)) if r.startswith("+") else r for r in j.instances]
            if all(ids):
                placed.ids[j.job] = ids  # type: ignore[assignment]
                if any(j.gpus):
                    placed.gpus[j.job] = [list(g) for g in j.gpus]
                continue
            if _runs_partly(j, observed):
                _stop_gang(j, observed, placed, failures)
            elif j.previous:
                placed.ids[j.job] = list(j.previous)
                placed.stayed_old.add(j.job)
                if j.job in observed.gpu_indices:  # aligned with previous (the survivors), as observed
                    placed.gpus[j.job] = [list(g) for g in observed.gpu_indices[j.job]]
                placed.stranded.update(j.previous)
    _hold_back_arrivals(plan, observed, placed, failures)
    return placed


def _delete_all(deletes: list[DeleteAction], fleet: Fleet, existing: dict[str, Instance], stranded: set[str], report: ApplyReport,
                steps: _Steps) -> None:
    """Delete what the plan deletes, lanes in parallel, except an instance still hosting a replica that could not
    move (kept, said why) and one observe did not find (refused)."""
    todo = []
    for d in deletes:
        if d.instance_id in stranded:
            report.skipped_deletes[d.instance_id] = "still hosts a replica whose new instance could not be created"
        elif d.instance_id not in existing:  # a plan only deletes what observe found (ours, alive): refused, not "deleted"
            report.failures.append(f"delete {d.instance_id}: refused: not an instance of this fleet that observe found")
        else:
            todo.append(d)

    def removed(d: DeleteAction, started: float, _result, e: BaseException | None) -> None:
        if e is None:
            report.deleted.append(d.instance_id)
            steps.end(started, "delete", d.instance_id, _what(d), d.instance_id)
            return
        if not isinstance(e, ProviderError):
            raise e
        report.failures.append(f"delete {d.instance_id}: {e}{_retried(e)}")
        steps.end(started, "delete", d.instance_id, _what(d), d.instance_id, e)

    def delete(d: DeleteAction) -> None:
        provider = fleet.provider(d.site.provider)
        _retry(lambda: provider.delete(existing[d.instance_id]), f"delete {d.instance_id}", _window(provider))

    _run_all(todo, lane=lambda d: _lane(fleet, d.site.provider, existing[d.instance_id].region),
             limit=lambda d: parallelism(fleet.provider(d.site.provider)),
             begin=lambda d: steps.begin("delete", d.instance_id, _what(d)), work=delete, finish=removed)


def _update_state(desired: DesiredState, observed: Observed, fleet: Fleet, state: State, existing: dict[str, Instance],
                  placed: _Placed, serial: int, report: ApplyReport) -> None:
    """The state (and report.placements) as the cloud now is: regions still in use, where each job runs, on which
    GPUs, with which shape, under the new serial. The caller saves it."""
    gone = set(report.deleted) | set(report.rolled_back.values())
    state.regions = _regions(desired, fleet, state, [i for iid, i in existing.items() if iid not in gone])
    state.placements = {j: ids for j, ids in placed.ids.items() if not gone.intersection(ids)}
    state.gpus = {j: g for j, g in placed.gpus.items() if j in state.placements}
    # The shape each placed job runs with: the desired one, except where a move failed and the
    # job still runs as it was (the next plan sees the change again and restarts it).
    state.shapes = {j: (observed.shapes[j] if j in placed.stayed_old and j in observed.shapes else shape_of(desired.jobs[j]))
                    for j in state.placements if j in desired.jobs}
    # Since when each placed job has run: a job that ran before (moved or not) keeps its serial, a new one gets this
    # apply's (a tenant's guarantee holds the longest-running first, as the plan that placed them did: problem.tenants)
    state.since = {j: observed.since.get(j, 0) if observed.placements.get(j) else serial for j in state.placements}
    # The aged priority each job was placed with, held while it runs (problem.demands.effective_priority): a job that ran
    # before keeps what it held, a new one what aging gives it now (where above its own priority)
    now, aging = utcnow(), desired.placement.aging
    aged = {j: observed.aged.get(j, 0) if observed.placements.get(j)
            else effective_priority(desired.jobs[j], False, now, aging) for j in state.placements if j in desired.jobs}
    state.aged = {j: p for j, p in aged.items() if p > desired.jobs[j].spec.priority_weight()}
    # What a stopped gang lost, until it runs again (observe read the earlier ones into observed.lost)
    state.lost = {j: list(ids) for j, ids in sorted(observed.lost.items())
                  if j in desired.jobs and j not in state.placements and (j in placed.stopped or j in state.lost)}
    state.serial = serial
    report.placements = state.placements
    report.gangs_stopped = dict(placed.stopped)
