"""What the reconciler reads back from the bus: job phases and conditions, the jobs that no longer
demand capacity, and the instances that must be replaced. Pure functions of plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping

from reconciler.errors import shown
from reconciler.model import DesiredState
from reconciler.runtime.assign import current_hashes
from reconciler.runtime.bus import CLOCK_AHEAD, beat_time, clock_skew_seconds, reports_alive


@dataclass(frozen=True)
class JobRun:
    job: str
    phase: str  # Pending | Starting | Running | Succeeded | Failed | Unknown
    reason: str
    message: str
    restarts: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    replicas: tuple[dict, ...] = ()  # per replica: instance, phase, reason, exit_code, attempt
    conditions: tuple[tuple[str, bool, str, str], ...] = ()  # (type, status, reason, message)
    log_tail: tuple[str, ...] = ()
    since: tuple[tuple[str, str], ...] = ()  # (condition type, when the reports say its status began): live status dates it so


@dataclass(frozen=True)
class RuntimeView:
    jobs: dict[str, JobRun] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)  # job -> Succeeded | Failed: demands no capacity
    unhealthy: dict[str, str] = field(default_factory=dict)  # instance -> why it must be replaced
    heartbeats: dict[str, float] = field(default_factory=dict)  # instance -> last heartbeat (unix)
    unreadable: dict[str, str] = field(default_factory=dict)  # bus key -> why it was skipped (garbled, wrong types)
    published: dict[str, str] = field(default_factory=dict)  # job -> the spec hash apply last published for it
    agent_faults: dict[str, tuple[str, str]] = field(default_factory=dict)  # instance -> (reason, message): agent_fault

    def agents_status(self) -> dict[str, dict[str, str]]:
        """The agents' faults as status shows them (`agents`: live in `reconcile status`, and in status/fleet.yaml as of
        the last apply): instance -> {reason, message}."""
        return {i: {"reason": reason, "message": message} for i, (reason, message) in self.agent_faults.items()}


def agent_fault(report: Mapping) -> tuple[str, str] | None:
    """What is wrong with an agent that beats, from its report, as status shows it (reason, message), or None: it cannot
    write or read its own files (a full, read-only or failing disk: agent._write_own). What it runs keeps running, but
    status said only Running while an agent restarted there could neither adopt nor stop a replica it had not recorded.
    Else: its replicas' shims cannot be the subreaper of their processes (runtimes.subreaper_problem), which the
    operator had no way to know: a replica's orphan that hides (setsid, an emptied environment) outlives it."""
    why = report.get("workdir_failed")
    if why:
        return ("WorkdirFailed", f"its agent cannot write or read its own files ({shown(str(why), 600)}): what runs there keeps "
                                 "running, but an agent restarted on it could neither adopt nor stop a replica it has not recorded, "
                                 "and it starts none it cannot record; free or repair the agent's --workdir disk")
    untracked = report.get("strays_untracked")
    if untracked:
        return ("StraysUntracked", f"its agent cannot make a replica's shim the subreaper of its processes ({shown(str(untracked), 300)}): "
                                   "a process a replica starts that leaves its process group and clears its environment after its "
                                   "parent exits outlives the replica, on its GPUs (needs Linux 3.4+ prctl, not refused by seccomp)")
    return None


def clock_fault(report: Mapping, limit: float | None = None) -> tuple[str, str] | None:
    """An agent whose host's clock is more than `limit` (FLEETOPS_CLOCK_SKEW_SECONDS, 10 s) from the state store's, by
    its heartbeat_at against the store's time of that write (bus.CLOCK_AHEAD), as status shows it, or None. Its liveness
    is judged by the store's clock whatever its own says, but the times it writes (run records, logs, a restart's
    backoff) are off by as much, and an older reconciler judging by heartbeat_at replaced it or never did."""
    ahead = report.get(CLOCK_AHEAD)
    limit = clock_skew_seconds() if limit is None else limit
    if ahead is None or abs(ahead) <= limit:
        return None
    return ("ClockSkew", f"its host's clock is about {round(abs(ahead), -1):.0f}s {'ahead of' if ahead > 0 else 'behind'} the state store's "
                         f"(more than {limit:g}s): liveness is judged by the store's clock, but the times it writes are off; "
                         "fix the host's time sync (chrony, systemd-timesyncd, the cloud's NTP service)")


def _ago(now: float, ts: float) -> str:
    return f"{max(0, int(now - ts))}s ago ({datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec='seconds')})"


def unhealthy_instances(instances: list[str], agents: Mapping[str, dict], now: float, stale: float) -> dict[str, str]:
    """Instances whose agent reported an interruption notice, stopped, or went silent after it had
    reported (a lost node). An instance whose agent never reported is booting, not lost."""
    out = {}
    for iid in instances:
        a = agents.get(iid)
        if a is None:
            continue
        beat = beat_time(a)
        if a.get("lost"):
            out[iid] = f"gone: {a['lost']}"
        elif a.get("state") == "Interrupting":
            if a.get("running"):
                continue  # still checkpointing: replaced once its replicas have stopped (or it goes silent)
            out[iid] = f"interruption notice ({a.get('notice') or 'spot'}), reported by its agent {_ago(now, beat)}"
        elif a.get("state") == "Stopped":
            out[iid] = f"its agent stopped {_ago(now, beat)}"
        elif now - beat > stale:
            out[iid] = f"lost node: its agent's last heartbeat was {_ago(now, beat)} (threshold {stale:g}s)"
    return out


def _finished(n: int, recs: list[dict | None], mode: str) -> str | None:
    if any(r and r.get("terminal") and r.get("phase") == "Failed" for r in recs):
        return "Failed"
    if mode == "batch" and len(recs) == n and all(r and r.get("phase") == "Succeeded" for r in recs):
        return "Succeeded"
    return None


def runtime_view(desired: DesiredState, placements: Mapping[str, list[str] | tuple[str, ...]], runs: Mapping[tuple[str, int], dict],
                 agents: Mapping[str, dict], instances: list[str], now: float, stale: float,
                 launched: Mapping[str, float] | None = None, boot: float = 0.0,
                 unreadable_agents: Mapping[str, str] | None = None, published: Mapping[str, str] | None = None,
                 gone: Mapping[str, str] | None = None, epochs: Mapping[str, int] | None = None) -> RuntimeView:
    """`runs` and `agents` as read from the bus; `placements` as observed; `now` in unix seconds.
    An instance launched less than `boot` seconds ago whose agent has not reported yet is starting,
    not unreachable (a cloud instance boots and installs the agent first). `unreadable_agents`:
    instance -> why its agent's report was skipped; such an instance is neither healthy nor replaced
    (nothing is decided on a report that cannot be read), its replicas are Unknown. `published`: job -> the spec hash
    the last apply published; a job whose `run` was taken out since runs that spec until the next apply withdraws it,
    so its phase is read by that hash (never its finish: a reservation demands its capacity whatever the old process did).
    `gone`: instance -> why, the instances the cloud no longer lists (observe); an agent's report marked `lost` (publish.mark_lost)
    counts too. A replica there is Unknown (AgentUnreachable), whatever its agent's last heartbeat said: nothing runs on a
    terminated instance, and its agent's last report (fresh for up to `stale` seconds) must not show it Running.
    `epochs`: job -> the epoch its published assignments give it; a replica whose record is of an earlier one runs (or
    checkpoints) the placement before a move and is restarted: Starting (Replaced), not Running."""
    launched = launched or {}
    published = published or {}
    epochs = epochs or {}
    unreadable_agents = unreadable_agents or {}
    gone = {**{i: a["lost"] for i, a in agents.items() if a.get("lost")}, **(gone or {})}
    fresh = {i for i, a in agents.items() if reports_alive(a, now, stale) and i not in gone}
    # An agent that beats but cannot write its run records (a policy without runs/*, a full disk): what runs/ holds of
    # its replicas is stale. It showed Starting (Assigned) while they ran, and Running after they ended.
    unwritten = {i: str(a["write_failed"]) for i, a in agents.items() if i in fresh and a.get("write_failed")}
    faults = {i: f for i, a in agents.items() if i in fresh and (f := agent_fault(a) or clock_fault(a)) is not None}
    jobs: dict[str, JobRun] = {}
    finished: dict[str, str] = {}
    for name, job in desired.jobs.items():
        s = job.spec
        if s.run is None and name not in published:
            continue
        h = current_hashes(job) if s.run is not None else (published[name],)
        n = s.replicas
        recs = [r if (r := runs.get((name, i))) is not None and r.get("spec_hash") in h else None for i in range(n)]
        done = _finished(n, recs, s.run_mode) if s.run is not None else None
        ids = list(placements.get(name, ()))
        if done:
            finished[name] = done
        was = published.get(name) if s.run is not None and ids else None
        if was is not None and was not in h:
            # Its `run` was edited since the last apply, which published `was`: until the next apply restarts it, its
            # agents run that spec, and what they report of it is what runs now (never its finish: the edit runs again).
            recs = [r if r is not None or (o := runs.get((name, i))) is None or o.get("spec_hash") != was or o.get("terminal")
                    else o for i, r in enumerate(recs)]
        restarts = max((r.get("restarts", 0) for r in recs if r), default=0)
        started = min((r["started_at"] for r in recs if r and r.get("started_at")), default=None)
        ended = max((r["finished_at"] for r in recs if r and r.get("finished_at")), default=None)
        reps = []
        unreachable = []
        current = []  # the records the phases shown come from
        for i in range(n):
            r = recs[i]
            iid = ids[i] if i < len(ids) else (r or {}).get("instance")
            here = r if r is not None and (not ids or r.get("instance") == iid) else None
            if done:
                phase, reason = (here or r or {}).get("phase", "Pending"), (here or r or {}).get("reason", "")
            elif not ids:
                phase, reason = "Pending", "NotPlaced"
            elif iid in gone:
                phase, reason = "Unknown", "AgentUnreachable"
                unreachable.append(f"{iid} (its instance is gone: {gone[iid]})")
            elif iid in unreadable_agents:
                phase, reason = "Unknown", "AgentUnreachable"
                unreachable.append(f"{iid} (its report is unreadable: {unreadable_agents[iid]})")
            elif iid not in agents and now - launched.get(iid, 0.0) <= boot:
                phase, reason = "Starting", "AgentStarting"
            elif iid not in fresh:
                phase, reason = "Unknown", "AgentUnreachable"
                beat = beat_time(agents[iid]) if iid in agents else None
                unreachable.append(f"{iid} ({'no heartbeat yet' if beat is None else 'last heartbeat ' + _ago(now, beat)})")
            elif iid in unwritten:
                phase, reason = "Unknown", "AgentUnreachable"
                unreachable.append(f"{iid} (its agent beats but cannot write its run records: {unwritten[iid]})")
            elif here is None:
                phase, reason = "Starting", "Assigned"
            elif isinstance(here.get("epoch"), int) and here["epoch"] < epochs.get(name, here["epoch"]) and not here.get("terminal"):
                # A gang's replica that stayed put while another moved: its copy of the old epoch runs (the new one's
                # peer waits for it) until its agent restarts it. Measured on the sim: with a 6 s checkpoint the job
                # showed Running, "2 replica(s) running", for those 6 s.
                phase, reason = "Starting", "Replaced"
            else:
                phase, reason = here.get("phase", "Starting"), here.get("reason", "")
                current.append(here)
            reps.append({"replica": i, "instance": iid, "phase": phase, "reason": reason,
                         "exit_code": (here or {}).get("exit_code"), "attempt": (here or {}).get("attempt", 0),
                         **({"agent_fault": faults[iid][1]} if iid in faults and not done else {})})
        phases = [r["phase"] for r in reps]
        failures = [r for r in recs if r and r.get("terminal") and r.get("phase") == "Failed"]
        # The replica that failed, not a peer it stopped (GangFailed): its reason, exit code and last lines are the job's.
        failed = next((r for r in failures if r.get("reason") != "GangFailed"), failures[0] if failures else None)
        if done == "Failed" and failed is not None:
            phase, reason, message = "Failed", failed.get("reason", "Error"), f"replica {failed.get('replica')}: {failed.get('message', '')}"
        elif done == "Succeeded":
            phase, reason, message = "Succeeded", "Completed", f"{n} replica(s) completed"
        elif not ids:
            phase, reason, message = "Pending", "NotPlaced", "waiting for a placement"
        elif "Unknown" in phases:
            phase, reason, message = "Unknown", "AgentUnreachable", "no fresh report from " + ", ".join(unreachable)
        elif all(p == "Running" for p in phases):
            phase, reason, message = "Running", "Running", f"{n} replica(s) running"
        elif "Running" in phases and all(p in ("Running", "Succeeded") for p in phases):
            # Some replicas finished their share and the rest run (a Kubernetes Job with completions is Running so):
            # nothing is being started, so not Starting, as it was shown and counted.
            k = phases.count("Running")
            phase, reason, message = "Running", "Running", f"{k} replica(s) running, {n - k} completed"
        else:
            phase, reason = "Starting", next((r["reason"] for r in reps if r["phase"] != "Running"), "Starting")
            message = "; ".join(f"replica {r['replica']}: {r['phase']} ({r['reason']})" for r in reps if r["phase"] != "Running")
        deadline = next((r for r in recs if r and r.get("reason") == "DeadlineExceeded"), None)
        conds = [
            ("Running", phase == "Running", reason if phase == "Running" else phase, message if phase == "Running" else f"phase {phase}"),
            ("Succeeded", phase == "Succeeded", "Completed" if phase == "Succeeded" else phase, message if phase == "Succeeded" else ""),
            ("Failed", phase == "Failed", reason if phase == "Failed" else "NotFailed", message if phase == "Failed" else ""),
            ("Restarts", restarts > 0, "Restarted" if restarts else "NoRestarts", f"{restarts} restart(s)"),
            ("DeadlineExceeded", deadline is not None, "DeadlineExceeded" if deadline else "WithinLimit",
             deadline.get("message", "") if deadline else ""),
            ("AgentUnreachable", bool(unreachable), "NoHeartbeat" if unreachable else "HeartbeatFresh", ", ".join(unreachable)),
        ]
        tail = tuple((failed or next((r for r in recs if r), None) or {}).get("log_tail", ())[-10:])
        since: dict[str, str] = {}
        if phase == "Running" and len(current) == n and all(isinstance(r.get("started_at"), str) for r in current):
            since["Running"] = max(r["started_at"] for r in current)  # when the last of its replicas started
        elif phase in ("Succeeded", "Failed") and ended:
            since[phase] = since["Running"] = ended
        jobs[name] = JobRun(name, phase, reason, message, restarts, started, ended if phase in ("Succeeded", "Failed") else None,
                            tuple(reps), tuple(conds), tail, tuple(sorted(since.items())))
    unhealthy = unhealthy_instances(instances, agents, now, stale)
    beats = {i: beat_time(a) for i, a in agents.items()}
    return RuntimeView(jobs, finished, unhealthy, beats, agent_faults=dict(sorted(faults.items())))
