"""The reconciler's side of the bus: read the agents' reports into a RuntimeView (observe), and
publish the assignments after an apply (and start the sim's agents)."""

from __future__ import annotations

import time

from dataclasses import replace
from pathlib import Path
from typing import Iterable, Mapping

from providers.base import AgentHost, AgentTarget, Instance
from providers.bootstrap import agent_package
from reconciler.backend import StateBackend
from reconciler.errors import CorruptBusObjectError, ReconcileError
from reconciler.model import DesiredState
from reconciler.placements import launch_times
from reconciler.runtime.assign import build_assignments, previous_placements, published_hashes
from reconciler.runtime.bus import AGENTS, RUNS, Bus, instance_of, boot_seconds, now_unix, reports_alive, stale_seconds
from reconciler.runtime.lifecycle import RuntimeView, runtime_view
from reconciler.site import Host


GONE = "the cloud no longer lists it (spot interruption or lost capacity)"


def has_workload(desired: DesiredState) -> bool:
    return any(j.spec.run is not None for j in desired.jobs.values())


def mig_hosts(desired: DesiredState, instances: Iterable[Instance]) -> dict[str, tuple[tuple[str, ...], int]]:
    """instance -> (its MIG layout, its GPU count from the catalog), for MIG-partitioned instances. The layout is the
    one the instance was launched with (observe.instance_layout), not its pool's now: the devices `G:M` name are
    those its GPUs have (a drifted instance is replaced, and until then hosts no replica of the pool's new layout)."""
    from providers.catalog import load_catalog
    from reconciler.observe import instance_layout

    catalog, out = load_catalog(), {}
    for inst in instances:
        pool = desired.pools.get(inst.pool)
        shape = catalog.shape(inst.cloud, inst.instance_type)
        layout = instance_layout(inst, pool)
        if pool is not None and layout and shape is not None and shape.gpus:
            out[inst.id] = (layout, shape.gpus)
    return out


def agent_bus(desired: DesiredState, state_url: str | None) -> str | None:
    """The bus URL cloud instances' agents are booted with: a remote state backend, when some job
    runs something. A local `.reconcile/` cannot be reached from a cloud instance: no agent then."""
    if state_url and "://" in state_url and has_workload(desired):
        agent_package()  # refused now, before any launch, when it carries a credential (it goes into user data)
        return state_url
    return None


def read_view(backend: StateBackend, desired: DesiredState, placements: Mapping[str, Iterable[str]],
              instances: Iterable[Instance] | None) -> RuntimeView | None:
    """None when nothing runs through the bus (no job has `run`, nothing was ever assigned): a
    config that declares no workload costs one listing and behaves exactly as before. An agent's
    report that cannot be read (garbled, wrong types) is skipped and named in view.unreadable: one
    agent's bad report must not stop plan, apply and the controller for the whole fleet."""
    bus = Bus(backend)
    if not has_workload(desired) and not bus.assigned_instances() and not bus.store.list_keys("runs"):
        return None
    gone: dict[str, str] = {}
    published = bus.assignments()  # (their spec hashes: the jobs whose run changed since, which the plan lists)
    if instances is None:  # `reconcile status` asks no provider: the instances are the assigned ones, as published
        # (the instance's launch as apply published it; before, the publication itself: an assignment published again
        # to an instance whose agent never reported gave it a new boot allowance in status, where metrics and apply,
        # which read the launch from the cloud, said Unknown)
        ids = sorted(published)
        launched = {i: float(d.get("launched_at", d.get("published_at", 0))) for i, d in published.items()}
    else:
        instances = list(instances)
        ids, launched = [i.id for i in instances], launch_times(instances)
        listed = set(ids)  # a placed instance the cloud no longer lists is gone, however fresh its agent's last report
        gone = {i: GONE for v in placements.values() for i in v if i not in listed}
    skipped: dict[str, str] = {}
    runs, agents = bus.runs(skipped=skipped), bus.agents(skipped=skipped)
    bad_agents = {i: msg for k, msg in skipped.items() if (i := instance_of(k, AGENTS)) is not None}
    hashes = published_hashes(published)
    view = runtime_view(desired, {j: list(v) for j, v in placements.items()}, runs, agents, ids,
                        now_unix(), stale_seconds(), launched, boot_seconds(), bad_agents, hashes, gone,
                        {j: epoch for j, (epoch, _) in previous_placements(published).items()})
    return replace(view, unreadable=dict(sorted(skipped.items())), published=hashes)


def publish(backend: StateBackend, desired: DesiredState, placements: Mapping[str, list[str]], gpus: Mapping[str, list[list[int]]],
            serial: int, instances: Iterable[Instance], providers: Mapping[str, object], config_dir: Path, state_url: str | None,
            previous: Mapping[str, dict] | None = None, vanished: Iterable[str] = ()) -> int:
    """Write `assignments/<instance>.json` for every instance that hosts work with `run`, delete the
    ones no longer assigned, and ask providers that host agents (the sim) to start one where none
    runs. Returns how many assignments were written or deleted. `previous`: the published assignments,
    when the caller read them already (apply does, before any provider call). `vanished`: the instances the cloud no longer
    listed before this apply changed anything (a spot reclaim, lost capacity; not the ones the apply deleted): their
    heartbeat keys go whatever they last said, since nothing runs on a terminated instance and a replica moved from one
    must not wait for its report to go stale (publish.shutting_down is for instances shut down by an apply)."""
    bus = Bus(backend)
    vanished = set(vanished)
    previous = bus.assignments() if previous is None else previous
    if not has_workload(desired) and not previous:
        return 0
    live = {i.id: i for i in instances}
    placed = {j: ids for j, ids in placements.items() if all(i in live for i in ids)}
    want = build_assignments(desired, placed, gpus, {i: inst.provider for i, inst in live.items()}, serial, previous, mig_hosts(desired, live.values()))
    changed = 0
    launched = launch_times(live.values())
    for iid, doc in sorted(want.items()):
        if iid in launched:  # (status reads the boot allowance from it, as apply and metrics do from the instance)
            doc = {**doc, "launched_at": launched[iid]}
        old = previous.get(iid)
        if old is None or {**old, "serial": 0, "published_at": 0} != {**doc, "serial": 0, "published_at": 0}:
            bus.put_assignment(iid, {**doc, "published_at": now_unix()})
            changed += 1
    for iid in sorted(set(previous) - set(want)):
        bus.delete_assignment(iid)
        changed += 1
    for iid in bus.agent_instances():
        if iid not in live and (iid in vanished or not shutting_down(bus, iid)):  # gone: its heartbeat would only pile up (its runs/ stay: history)
            try:
                bus.delete_agent(iid)
            except CorruptBusObjectError:
                pass  # not a report (a directory at its name): each plan names it among the reports it skipped
    target = AgentTarget(config_dir=Path(config_dir).resolve(), state_url=state_url)
    for iid in sorted(want):
        provider = providers.get(live[iid].provider)
        if isinstance(provider, AgentHost):
            provider.ensure_agent(live[iid], target)
    return changed


def shutting_down(bus: Bus, instance: str) -> bool:
    """May the agent of an instance the cloud no longer lists still run replicas: its report lists some with a fresh
    heartbeat, or cannot be read? A deleted instance shuts down as a cloud instance does: its agent stops its replicas
    through their checkpoint grace. A replica the plan moved waits for its old copy by that report
    (agent.Agent._predecessor), so the key stays until it says Stopped or goes stale: deleted at once, the moved copy
    started while the old one still wrote its checkpoint (test_runtime_sim, the moved replica). One that cannot be read
    stays too (never deleted unread): deleted, the moved copy read the missing key as "holds nothing" and started before
    the agent wrote it again. A garbled one its agent no longer rewrites stays, named by each plan among those skipped."""
    try:
        doc = bus.agent(instance)
    except ReconcileError:
        return True  # unreadable: it may still list replicas running
    return reports_alive(doc, now_unix(), stale_seconds()) and bool(doc.get("running"))


def removed_checkpoints(backend: StateBackend, desired: DesiredState, previous: Mapping[str, dict],
                        now: float | None = None) -> list[str]:
    """The checkpoints of each job no longer in the config whose replicas are all gone: marked removed (`checkpoints/
    <job>/removed.json`), so that a new job given its name later (another model) starts afresh while the same job put
    back (its spec hash that of the uploads) resumes them; deleted once marked longer than the retention
    (FLEETOPS_CHECKPOINT_RETENTION_DAYS, 7 days). Deleted at once, a job file deleted by mistake in a PR lost days of
    training for good when it was put back. A note for each job marked, deleted, or kept for a replica not yet gone.
    Gone means: no assignment published before this apply (`previous`: what the agents may still act on) names it, and
    no agent's report, fresh or stale, lists one of its replicas running: an agent lists a replica there until its
    process ended and its checkpoint upload is done (agent._supervise uploads before the heartbeat that drops it), so
    once both hold no upload of the job is under way or to come (marked before, that upload would count as the new
    job's). A report that cannot be read may be the one that lists it: nothing is marked then. The apply that removes
    a job only withdraws its assignments; a later one marks (the controller's next resync). A job that finished and
    stays in the config keeps its checkpoints. A listing that fails is a note, not an error: the apply that calls this
    has changed the fleet already and writes its status next."""
    from reconciler.runtime import checkpoints

    now = time.time() if now is None else now
    skipped: dict[str, str] = {}
    try:
        gone = sorted(j for j in checkpoints.jobs(backend) if j not in desired.jobs)
        if not gone:
            return []
        reports = Bus(backend).agents(skipped=skipped)
        keep_s = checkpoints.retention_seconds()
    except ReconcileError as e:
        return [f"checkpoints of removed jobs not collected: {e}; tried again by the next apply"]
    assigned = {e.get("job") for doc in previous.values() for e in doc.get("replicas", []) if isinstance(e, dict)}
    if skipped:
        return [f"checkpoints of removed job(s) {', '.join(gone)} kept: an agent's report cannot be read (it may run "
                "one of their replicas); marked removed by an apply after it is readable again"]
    running: dict[str, list[str]] = {}
    for iid, doc in sorted(reports.items()):
        for name in doc.get("running", []):
            running.setdefault(name.rpartition("/")[0], []).append(iid)
    notes = []
    for job in gone:
        if job in assigned or job in running:
            where = "still assigned" if job in assigned else f"still running on {', '.join(running[job])}"
            notes.append(f"checkpoints of removed job {job} kept until its replicas' stop is reported ({where}): "
                         "an upload may still come")
            continue
        try:
            marked = checkpoints.removed_at(backend, job)
            docs = checkpoints.manifests(backend, job, log=lambda m: None)
            if marked is None or any(d["created_unix"] > marked for d in docs):  # (put back and removed again: anew)
                checkpoints.mark_removed(backend, job, now)
                until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now + keep_s))
                notes.append(f"checkpoints of removed job {job} marked removed, deleted after {until} "
                             "(FLEETOPS_CHECKPOINT_RETENTION_DAYS): put back as it was, it resumes them; a new job of its "
                             "name starts afresh")
            elif now - marked >= keep_s:
                n = checkpoints.remove(backend, job)
                notes.append(f"checkpoints of removed job {job} deleted: {n} files")
        except ReconcileError as e:
            notes.append(f"checkpoints of removed job {job}: {e}; tried again by the next apply")
    return notes


def mark_lost(backend: StateBackend, instance: str, why: str) -> bool:
    """The instance is gone (its cloud reclaimed or lost it) and its agent with it: rewrite its agent's report as
    `Stopped`, running nothing, with `lost` saying why, so that neither status nor a replica moved from it (agent._predecessor)
    trusts its last heartbeat, fresh for up to 60 s, which still listed replicas running. `Stopped` is what every agent
    version already reads as holding nothing. False when the instance has neither a report nor an assignment."""
    bus = Bus(backend)
    try:
        doc = bus.agent(instance)
    except ReconcileError:
        doc = {}  # unreadable: replaced by what is known now
    if doc is None and instance not in bus.assigned_instances():
        return False  # no agent report, nothing assigned: nothing to correct
    beat = (doc or {}).get("heartbeat_at", now_unix())
    bus.put_agent(instance, {**(doc or {}), "instance": instance, "heartbeat_at": beat, "state": "Stopped", "running": [],
                             "lost": why, "lost_at": now_unix()})
    return True


# ---------------------------------------------------------------- the pipeline's boundaries


def with_runtime(backend: StateBackend, desired: DesiredState, observed):
    """Observed plus what the agents reported (observed.runtime), with a note for each finished
    job and each instance to replace, so the plan says why it changes what it changes."""
    view = read_view(backend, desired, observed.placements, observed.instances)
    if view is None:
        return observed
    notes = [f"job {j} {phase} (spec unchanged): it demands no capacity until its spec changes"
             for j, phase in sorted(view.finished.items()) if observed.placements.get(j)]
    notes += [f"instance {i} is replaced: {why}" for i, why in sorted(view.unhealthy.items())]
    notes += [f"skipped: {msg}" for msg in view.unreadable.values()]
    notes += [f"job {j} is not placed while its run record cannot be read (it may have finished): restore the record, or "
              "delete it to run the job again" for j in sorted(unread_runs(view, observed))]
    notes += [workload_note(run) for _, run in sorted(view.jobs.items()) if workload_note(run)]
    return replace(observed, runtime=view, notes=tuple(observed.notes) + tuple(notes))


def workload_note(run) -> str:
    """A job's run worth a line in the plan (and so in the PR comment): failed, restarted, past its
    time limit, or without a heartbeat from its agent. A job that just runs is not news."""
    conds = {c[0]: c for c in run.conditions}
    if run.phase == "Failed":
        return f"job {run.job}: Failed ({run.reason}): {run.message}"[:400]
    bits = [f"{run.restarts} restart(s)"] if run.restarts else []
    if conds.get("DeadlineExceeded", (0, False))[1]:
        bits.append("DeadlineExceeded")
    if conds.get("AgentUnreachable", (0, False))[1]:
        bits.append(f"AgentUnreachable: {conds['AgentUnreachable'][3]}")
    return f"job {run.job}: {run.phase}, " + ", ".join(bits) if bits else ""


def planning_reads(view: RuntimeView | None) -> dict | None:
    """What planning reads of the agents' reports: the jobs that finished (`demanding`) and the instances to
    replace, with their words (`block_unhealthy`); of the published assignments, each job's spec hash (the plan's
    `restarted`); the plan's notes (`with_runtime`) are in observed.notes.
    Heartbeats, log tails, run phases and times are for status only: a plan memo that keyed them (all of
    observed.runtime) missed on every plan of a fleet whose agents are alive (issue 20)."""
    if view is None:
        return None
    return {"finished": dict(sorted(view.finished.items())), "unhealthy": dict(sorted(view.unhealthy.items())),
            "published": dict(sorted(view.published.items()))}


def demanding(desired: DesiredState, observed) -> DesiredState:
    """The desired state the solver sees: without the jobs that finished (a Succeeded batch job, a
    Failed one past its restarts) at their current spec; they are placed again when it changes."""
    view = getattr(observed, "runtime", None)
    if view is None:
        return desired
    drop = set(view.finished) | unread_runs(view, observed)
    if not drop:
        return desired
    return desired.model_copy(update={"jobs": {n: j for n, j in desired.jobs.items() if n not in drop}})


def unread_runs(view: RuntimeView, observed) -> set[str]:
    """Jobs not running whose run record cannot be read: they are not placed. The record may say the job finished
    (a Succeeded batch job), and placing it again would run it twice; nothing is decided on what cannot be read. A job
    that runs goes on as it runs."""
    jobs = {key.split("/")[1] for key in view.unreadable if key.startswith(RUNS + "/") and key.count("/") == 2}
    return {j for j in jobs if not observed.placements.get(j)}


def block_unhealthy(problem, observed):
    """Instances whose agent reported an interruption notice or went silent are not kept: their
    work is placed again (make before break) and they are deleted, with the reason on the plan."""
    view = getattr(observed, "runtime", None)
    if view is None or not view.unhealthy:
        return problem
    caps = tuple(replace(c, keep_blocker=view.unhealthy[c.instance_id], frozen=False)
                 if isinstance(c, Host) and c.instance_id in view.unhealthy else c for c in problem.capacities)
    return replace(problem, capacities=caps)


def published(backend: StateBackend) -> dict[str, dict]:
    """The assignments apply published last: read before an apply changes anything, so a corrupt one
    (the reconciler's own record) is refused with nothing changed, not found after the launches."""
    return Bus(backend).assignments()


def publish_assignments(backend: StateBackend, desired: DesiredState, state, instances: list[Instance], fleet, config_dir: Path,
                        state_url: str | None, previous: Mapping[str, dict] | None = None,
                        vanished: Iterable[str] = ()) -> RuntimeView | None:
    """After an apply: publish what each instance runs, then read the view back for status."""
    providers = {}
    for inst in instances:
        if inst.provider not in providers:
            providers[inst.provider] = fleet.provider(inst.provider)
    publish(backend, desired, state.placements, state.gpus, state.serial, instances, providers, config_dir, state_url, previous,
            vanished)
    return read_view(backend, desired, state.placements, instances)
