"""The bus: JSON objects on the state backend that apply and the node agents exchange.

    assignments/<instance>.json    written by apply: what the instance runs, with the state serial
    runs/<job>/<replica>.json      written by the agent the replica is assigned to
    agents/<instance>.json         written by that instance's agent: heartbeat, address, notice
    checkpoints/<job>/...          written by the agents: a job's checkpoint dir, copied between instances
                                   (reconciler/runtime/checkpoints.py)

Agents never write assignments/ and apply never writes runs/ or agents/, so the least-privilege
policy for an agent is: read assignments/ (and runs/, agents/ for its gang peers), write its own
runs/ and agents/ keys, and checkpoints/ (read, write, delete)."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from functools import partial
from typing import Any, Callable
from urllib.parse import quote, unquote

from providers.files import loads_json
from reconciler.backend import Listed, StateBackend
from reconciler.errors import CorruptBusObjectError, ReconcileError

ASSIGNMENTS, RUNS, AGENTS = "assignments", "runs", "agents"


MAX_SECONDS = 7 * 86400.0  # a week: no period or threshold here is longer (and time.sleep overflows near 1e10 s)


def seconds_problem(value: float, zero: bool = False) -> str | None:
    """Why `value` is not a period or threshold in seconds (None: it is): a finite number above 0 (0 or more
    with `zero`) and at most a week. The rule of the FLEETOPS_* settings below and of the CLI's --poll,
    --heartbeat, --resync and --notice-seconds: 0, a negative or NaN poll busy-looped a core or crashed a sleep."""
    if not (0 <= value if zero else 0 < value) or not value <= MAX_SECONDS:
        return f"must be {'0 or more' if zero else 'above 0'} and at most {MAX_SECONDS:g} seconds (a week)"
    return None


def setting(name: str, default: float) -> float:
    """A runtime period or threshold in seconds: FLEETOPS_<NAME> from the environment (tests and
    the sim shorten them), else the default."""
    raw = os.environ.get(f"FLEETOPS_{name}")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ReconcileError(f"FLEETOPS_{name}={raw!r} is not a number of seconds") from None
    problem = seconds_problem(value)
    if problem:
        raise ReconcileError(f"FLEETOPS_{name}={raw!r} {problem}")
    return value


def poll_seconds() -> float:
    return setting("AGENT_POLL_SECONDS", 2.0)


def heartbeat_seconds() -> float:
    return setting("AGENT_HEARTBEAT_SECONDS", 5.0)


# What Bus.agent and Bus.agents add to a report as read (never written back: put_agent drops them), from the store's own
# clock (StateBackend.read_key_stamped): when the store recorded the report's last write, on this reader's clock
# (this reader's now_unix() at the read minus the store's age of the object), and how far the writer's clock (its
# heartbeat_at) was from the store's at that write.
SEEN_AT, CLOCK_AHEAD = "stored_seen_at", "clock_ahead_seconds"
READ_ONLY_FIELDS = (SEEN_AT, CLOCK_AHEAD)


def beat_time(doc: dict) -> float:
    """When an agent's report was last written, on this reader's clock: by the store's record of the write (SEEN_AT),
    never by heartbeat_at, the writer's host clock (a host 2 minutes behind looked lost while it beat every 5 s, its
    live instance replaced; one ahead looked alive for ever once dead). heartbeat_at only for a report read from a store
    that cannot say when it was written (none of ours: a test's fake)."""
    return float(doc.get(SEEN_AT, doc.get("heartbeat_at", 0)))


def reports_alive(doc: dict | None, now: float, stale: float) -> bool:
    """An agent's report that says it is up: written at most `stale` seconds before `now` (beat_time: by the store's
    clock, as of this reader's), and not Stopped. The one rule of a lost agent: status and the controller's
    replacements (lifecycle), a deleted instance's key kept while it stops its replicas (publish.shutting_down), and a
    gang's ranks, which stop when a peer's agent is lost (agent.peer_lost). (A moved replica's wait judges its
    predecessor by when it saw the report change: BeatWatch.)"""
    return bool(doc) and doc.get("state") != "Stopped" and now - beat_time(doc) <= stale


def clock_skew_seconds() -> float:
    """An agent host's clock further than this from the store's is said in status (ClockSkew): fix its NTP."""
    return setting("CLOCK_SKEW_SECONDS", 10.0)


class BeatWatch:
    """Other agents' reports judged alive by this process's own clock: by when it last saw a report's heartbeat change
    (time.monotonic), never by the heartbeat's time, which the writer's host clock wrote (a host 60 s behind looked
    lost while it beat every 5 s). A report read for the first time counts as changed then. A report seen alive that
    is then deleted (an apply that judged it stale by its own clock; its agent writes it again at its next heartbeat)
    is judged as it last read until it is stale by this clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seen: dict[str, tuple[dict, float]] = {}  # instance -> (its report last read, when its heartbeat changed)

    def judge(self, instance: str, doc: dict | None, stale: float) -> tuple[dict | None, bool]:
        """(the report to go by: `doc`, or the last one read when the key is gone; whether it is alive: not Stopped,
        its heartbeat changed at most `stale` seconds ago by this clock)."""
        now, last = self.clock(), self.seen.get(instance)
        if doc is None:
            if last is None:
                return None, False
            doc, changed = last
        else:
            changed = last[1] if last is not None and last[0].get("heartbeat_at") == doc.get("heartbeat_at") else now
            self.seen[instance] = (doc, changed)
        return doc, bool(doc) and doc.get("state") != "Stopped" and now - changed <= stale


def stale_seconds() -> float:
    """A heartbeat older than this is a lost node: a few missed beats, not one slow write."""
    return setting("HEARTBEAT_STALE_SECONDS", 60.0)


def boot_seconds() -> float:
    """How long a new instance's agent may take to report first (boot, install, start)."""
    return setting("AGENT_BOOT_SECONDS", 600.0)


def backoff_seconds() -> float:
    return setting("RESTART_BACKOFF_SECONDS", 10.0)


def backoff_reset_seconds() -> float:
    """A replica that ran this long before it failed starts its restart delays over from the first (the kubelet's
    rule for a crash loop: 10 minutes)."""
    return setting("RESTART_BACKOFF_RESET_SECONDS", 600.0)


def now_unix() -> float:
    return time.time()


def instance_key(instance: str) -> str:
    """An instance id as one key segment: GCE (projects/p/zones/z/instances/n) and Azure
    (/subscriptions/...) ids hold slashes, so they are percent-encoded; EC2 and sim ids are unchanged."""
    return quote(instance, safe="-_.~")


def instance_of(key: str, prefix: str) -> str | None:
    name = key[len(prefix) + 1:]
    return unquote(name[:-5]) if key.startswith(prefix + "/") and name.endswith(".json") and "/" not in name else None


# ---------------------------------------------------------------- what each kind of object must hold
# One check per kind, of every field a reader uses (the reconciler's lifecycle and status, the agents,
# `reconcile logs`): a wrong type is refused here, by key, not met as a TypeError deep in a reader.

Check = tuple[Callable[[Any], bool], str]


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(v: Any) -> bool:
    return _int(v) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _unix_time(v: Any) -> bool:
    return _number(v) and 0 <= v < 1e11  # shown as a date: beyond year 5000 is no time a writer wrote


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _signal(v: Any) -> bool:
    return isinstance(v, str) and isinstance(getattr(signal, v, None), signal.Signals)


def _shape(doc: Any, fields: dict[str, Check], required: tuple[str, ...] = ()) -> str | None:
    """What is wrong with `doc` (a JSON object whose listed fields, where present, pass their checks), or None."""
    if not isinstance(doc, dict):
        return "is not a JSON object"
    for name in required:
        if name not in doc:
            return f"has no {name}"
    for name, (ok, what) in fields.items():
        if name in doc and not ok(doc[name]):
            return f"has {name} {json.dumps(doc[name])[:40]}, not {what}"
    return None


AGENT_FIELDS: dict[str, Check] = {
    "heartbeat_at": (_unix_time, "a unix time"), "state": (lambda v: v in ("Ready", "Interrupting", "Stopped"), "Ready, Interrupting or Stopped"),
    "running": (_strings, "a list of job/replica"), "notice": (_opt(_str), "a string"), "address": (_opt(_str), "an address"),
    "lost": (_opt(_str), "why the instance is gone"), "write_failed": (_opt(_str), "why a run record was not written"),
    "workdir_failed": (_opt(_str), "why the agent's own files were not written"),
    "strays_untracked": (_opt(_str), "why a replica's orphans are not tracked"),
}
RUN_FIELDS: dict[str, Check] = {
    "job": (_str, "a job name"), "replica": (_count, "a replica number"), "instance": (_opt(_str), "an instance id"),
    "spec_hash": (_str, "a spec hash"), "epoch": (_int, "an epoch"), "attempt": (_count, "a count"), "restarts": (_count, "a count"),
    "phase": (_str, "a phase"), "reason": (_str, "a reason"), "message": (_str, "a message"), "terminal": (lambda v: isinstance(v, bool), "true or false"),
    "exit_code": (_opt(_int), "an exit code"), "started_at": (_opt(_str), "a time"), "finished_at": (_opt(_str), "a time"),
    "log_tail": (_strings, "a list of lines"), "log_path": (_opt(_str), "a path"),
    "next_start_at": (_opt(_unix_time), "a unix time"),
}
_RUN_SPEC: dict[str, Check] = {"command": (lambda v: _strings(v) and bool(v), "a command"), "image": (_opt(_str), "an image"),
                               "env": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), "a map of strings")}
_CHECKPOINT: dict[str, Check] = {"dir": (_str, "a directory"), "signal": (_signal, "a signal name"), "grace_seconds": (_number, "seconds")}
_RESTART: dict[str, Check] = {"policy": (_str, "a policy"), "backoff_limit": (_count, "a count")}
_ENTRY: dict[str, Check] = {
    "job": (_str, "a job name"), "replica": (_count, "a replica number"), "spec_hash": (_str, "a spec hash"), "epoch": (_int, "an epoch"),
    "run": (lambda v: _shape(v, _RUN_SPEC, ("command",)) is None, "a run spec with a command"),
    "world_size": (lambda v: _int(v) and v >= 1, "a count"), "local_rank": (_count, "a count"), "master_port": (_count, "a port"),
    "master_instance": (_opt(_str), "an instance id"), "peers": (_strings, "a list of instance ids"),
    "gpus": (_strings, "a list of devices"), "mode": (_str, "a mode"),
    "restart": (lambda v: _shape(v, _RESTART) is None, "a restart policy"), "time_limit_hours": (_opt(_number), "hours"),
    "checkpoint": (lambda v: v is None or _shape(v, _CHECKPOINT, ("dir",)) is None, "a checkpoint spec"),
    "mig_profile": (_str, "a MIG profile"), "mig_layout": (_strings, "a list of MIG profiles"),
}
ASSIGNMENT_FIELDS: dict[str, Check] = {
    "serial": (_int, "a serial"), "published_at": (_unix_time, "a unix time"), "launched_at": (_unix_time, "a unix time"),
    "replicas": (lambda v: isinstance(v, list) and all(_shape(e, _ENTRY, ("job", "replica", "spec_hash", "epoch", "run")) is None for e in v),
                 "a list of replica assignments (job, replica, spec_hash, epoch, run)"),
}


def _agent_problem(doc: Any) -> str | None:
    """heartbeat_at is required: a report without one would read as a lost node, replaced on no evidence."""
    return _shape(doc, AGENT_FIELDS, ("heartbeat_at",))


def _run_problem(doc: Any) -> str | None:
    return _shape(doc, RUN_FIELDS)


def _assignment_problem(doc: Any) -> str | None:
    return _shape(doc, ASSIGNMENT_FIELDS)


class Bus:
    """Typed access to the bus keys of one state backend."""

    def __init__(self, store: StateBackend):
        self.store = store

    def _read(self, key: str, problem: Callable[[Any], str | None]) -> dict | None:
        """The object at `key`, None when there is none; CorruptBusObjectError when it is not what its writer writes."""
        raw = self.store.read_key(key)
        return None if raw is None else self._parse(key, raw, problem)

    def _parse(self, key: str, raw: bytes, problem: Callable[[Any], str | None]) -> dict:
        try:
            doc = loads_json(raw)
        except ValueError as e:  # (also a UnicodeDecodeError, a nest too deep, a key twice: providers.files)
            raise CorruptBusObjectError(key, f"is not valid JSON ({e})") from None
        why = problem(doc)
        if why is not None:
            raise CorruptBusObjectError(key, why)
        return doc

    def _read_or_skip(self, key: str, read: Callable[[str], dict | None], skipped: dict[str, str] | None) -> dict | None:
        """read(key); with `skipped`, a corrupt object is left out and noted there (key -> the error), not raised."""
        try:
            return read(key)
        except CorruptBusObjectError as e:
            if skipped is None:
                raise
            skipped[key] = str(e)
            return None

    def _write(self, key: str, doc: dict[str, Any]) -> None:
        self.store.write_key(key, json.dumps(doc, indent=1, sort_keys=True).encode())

    # assignments/ (apply)
    def assignment(self, instance: str) -> dict | None:
        return self._read(f"{ASSIGNMENTS}/{instance_key(instance)}.json", _assignment_problem)

    def put_assignment(self, instance: str, doc: dict) -> None:
        self._write(f"{ASSIGNMENTS}/{instance_key(instance)}.json", doc)

    def delete_assignment(self, instance: str) -> None:
        self.store.delete_key(f"{ASSIGNMENTS}/{instance_key(instance)}.json")

    def assigned_instances(self) -> list[str]:
        return [i for k in self.store.list_keys(ASSIGNMENTS) if (i := instance_of(k, ASSIGNMENTS)) is not None]

    def assignments(self) -> dict[str, dict]:
        out = {}
        for iid in self.assigned_instances():
            doc = self.assignment(iid)
            if doc is not None:
                out[iid] = doc
        return out

    # runs/ (agents)
    def run(self, job: str, replica: int) -> dict | None:
        return self._read(f"{RUNS}/{job}/{replica}.json", _run_problem)

    def put_run(self, job: str, replica: int, doc: dict) -> None:
        self._write(f"{RUNS}/{job}/{replica}.json", doc)

    def runs(self, job: str | None = None, skipped: dict[str, str] | None = None) -> dict[tuple[str, int], dict]:
        out = {}
        for key in self.store.list_keys(f"{RUNS}/{job}" if job else RUNS):
            parts = key.split("/")
            if len(parts) != 3 or not parts[2].endswith(".json") or not parts[2][:-5].isdigit():
                continue
            doc = self._read_or_skip(key, lambda k: self._read(k, _run_problem), skipped)
            if doc is not None:
                out[(parts[1], int(parts[2][:-5]))] = doc
        return out

    # agents/ (agents)
    def agent(self, instance: str) -> dict | None:
        """The report with when the store recorded it (SEEN_AT) and the writer's clock offset (CLOCK_AHEAD)."""
        return self._read_report(f"{AGENTS}/{instance_key(instance)}.json")

    def _read_report(self, key: str, listed: Listed | None = None) -> dict | None:
        """`listed`: what the listing of agents/ said of it (StateBackend.list_keys_stamped), for a read in one request."""
        stamped = getattr(self.store, "read_key_stamped", None)
        if stamped is None:  # (a store that cannot say when an object was written: judged by heartbeat_at)
            return self._read(key, _agent_problem)
        got = stamped(key) if listed is None else stamped(key, listed)
        if got is None:
            return None
        doc = self._parse(key, got.body, _agent_problem)
        return {**doc, SEEN_AT: now_unix() - got.age, CLOCK_AHEAD: float(doc["heartbeat_at"]) - got.modified}

    def put_agent(self, instance: str, doc: dict) -> None:
        """(A report as read carries what the reader learned of it: not the writer's to say, never written back.)"""
        self._write(f"{AGENTS}/{instance_key(instance)}.json", {k: v for k, v in doc.items() if k not in READ_ONLY_FIELDS})

    def agent_instances(self) -> list[str]:
        return [i for k in self.store.list_keys(AGENTS) if (i := instance_of(k, AGENTS)) is not None]

    def delete_agent(self, instance: str) -> None:
        """The reconciler's cleanup once the instance is gone (an agent never deletes)."""
        self.store.delete_key(f"{AGENTS}/{instance_key(instance)}.json")

    def agents(self, skipped: dict[str, str] | None = None) -> dict[str, dict]:
        """Every agent's report, as Bus.agent reads one: one listing, then one read of each (the listing's stamps)."""
        listing = getattr(self.store, "list_keys_stamped", None)
        listed = listing(AGENTS) if listing is not None else dict.fromkeys(self.store.list_keys(AGENTS))
        out = {}
        for key, stamp in listed.items():
            iid = instance_of(key, AGENTS)
            if iid is not None and (doc := self._read_or_skip(key, partial(self._read_report, listed=stamp), skipped)) is not None:
                out[iid] = doc
        return out
