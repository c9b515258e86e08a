"""`reconcile agent`: the node agent. One per instance; it runs what the bus assigns to it.

Every poll it reads `assignments/<instance>.json`, starts the replicas assigned to it through a
runtime, stops the ones no longer assigned (checkpoint signal, grace period, kill), restarts
failed ones with exponential backoff up to the job's backoff_limit (a gang restarts together),
stops a replica past its time limit, and on an interruption notice checkpoints everything and
reports the instance as Interrupting. A replica starts only once no other process holds any of its
GPUs (a replica that is stopping keeps them through its checkpoint grace), and a replica the plan moved
here only once the agent of the instance it left no longer runs it. It writes each replica's
record to `runs/<job>/<replica>.json` and its heartbeat to `agents/<instance>.json`. After a stop a replica survives
(a notice, a move, an edit, its own shutdown) it uploads the job's checkpoint dir to `checkpoints/<job>/`, and before
a replica starts it restores the newest upload into an empty or older dir (reconciler/runtime/checkpoints.py); it
writes nothing else. A gang stops and resumes whole: a peer's stop it survives (a notice, a move) stops every rank of
the round with its checkpoint signal (GangStopped), and so does a peer whose agent is lost (peer_lost: not alive by
bus.reports_alive, the one rule status uses; GangPeerLost); every rank, moved or not, starts from the gang's newest
complete round, once the round before is uploaded and no peer of its round is lost (WaitingForGang; checkpoints.py says
what is guaranteed).

The agent keeps running what it runs when the bus cannot be reached (a network blip must not
kill a training run); the reconciler then sees no heartbeat and shows AgentUnreachable."""

from __future__ import annotations

import errno
import json
import os
import signal as signals
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from providers.pids import age as process_age, start_time
from providers.redact import credential_name
from reconciler.atomicfile import write_atomic
from reconciler.errors import CorruptBusObjectError, ReconcileError
from reconciler.runtime import checkpoints
from reconciler.runtime.bus import _ENTRY, BeatWatch, Bus, beat_time, Check, _count, _number, _opt, _shape, _str, backoff_reset_seconds, backoff_seconds, heartbeat_seconds, now_unix, poll_seconds, reports_alive, stale_seconds
from reconciler.runtime.notices import NoNotice, NoticeSource
from reconciler.runtime.runtimes import KILL_MARGIN_S, REPLICA_ID, STRAY_GRACE_S, Detached, Launch, Runtime, StartError, StrayEnd, adopt, exec_problem, exit_record, mig_uuids, nvidia_smi_list, subreaper_problem, unrecorded_shim

STOP_GRACE_S = 10.0  # without a checkpoint spec: SIGTERM, then this long before SIGKILL
MAX_BACKOFF_S = 300.0
HANDOFF_MARGIN_S = 30.0  # beyond a moved replica's grace: time for the old agent to see the move, stop and report it
LOG_TAIL_LINES = 20
UPLOAD_MIN_S = 10.0  # a checkpoint's upload may go on this long past its replica's exit even when the grace is over


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts if ts is not None else now_unix(), timezone.utc).isoformat(timespec="seconds")


def signal_name(number: int) -> str:
    """SIGTERM for 15; a real-time signal, which has no name in the enum, as `signal 40`."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def replica_log(workdir: Path, job: str, replica: int) -> Path:
    """Where an agent keeps a replica's output (every attempt on its instance appended): `reconcile logs` reads the
    sim's agents' files by this name too."""
    return Path(workdir) / "logs" / f"{job}-{replica}.log"


def log_end(path: Path, size: int = 16384) -> str | None:
    """The last `size` bytes of a replica's log as text (None: unreadable): never the whole log, which holds every
    attempt on the instance (GBs of a chatty run; read whole, it took the agent's memory)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    text = log_end(path)
    return [ln for ln in (text or "").splitlines() if not ln.startswith("--- fleetops:")][-lines:]


def own_secrets(entry: dict) -> tuple[str, ...]:
    """The values of the credentials a replica's run.env gives it (by the variable's name: providers/redact), longest
    first: masked wherever its output leaves the instance (log tail, failure message, hence status/). Values shorter
    than 6 characters are left alone: masking "1" or "yes" would garble every line, and they are no secret."""
    env = (entry.get("run") or {}).get("env") or {}
    return tuple(sorted({v for k, v in env.items() if credential_name(k) and isinstance(v, str) and len(v) >= 6}, key=len, reverse=True))


def masked(lines: list[str], secrets: tuple[str, ...]) -> list[str]:
    for s in secrets:
        lines = [ln.replace(s, "***") for ln in lines]
    return lines


def own_address() -> str:
    """The address peers reach this instance on: the source address of the default route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: UDP connect only picks a route
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def hold_workdir(workdir: Path):
    """This process's exclusive lock on WORKDIR/agent.lock, held while the returned file is open (flock: released when
    the process ends, however it ends). A second agent on one instance (a manual run beside the service) adopted or
    started every replica assigned there again, two copies on the same GPUs: it is refused, naming the first's pid."""
    import fcntl

    workdir = Path(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        f = open(workdir / "agent.lock", "a+")  # noqa: SIM115 (held open for the agent's life: the lock)
    except OSError as e:
        raise ReconcileError(f"cannot lock the agent's --workdir {workdir}: {e.strerror}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        other = f.read().strip() or "?"
        f.close()
        raise ReconcileError(f"another agent (pid {other}) runs with --workdir {workdir}: one agent an instance (stop it "
                             "first, e.g. systemctl stop fleetops-agent, or give this one another --workdir)") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def same_device(a: str, b: str) -> bool:
    """Whether two of the plan's device ids share hardware: GPU `G`, or MIG device `G:M` (on GPU G)."""
    return a == b or a.split(":")[0] == b.split(":")[0] and (":" not in a or ":" not in b)


def device_names(devices: list[str]) -> str:
    mig = any(":" in d for d in devices)
    return f"{'MIG device' if mig else 'GPU'}{'s' if len(devices) > 1 else ''} {','.join(devices)}"


@dataclass
class _Stop:
    deadline: float
    phase: str
    reason: str
    message: str
    terminal: bool
    restart_attempt: int | None = None  # restart at this attempt once stopped (a gang restart)
    killed: float | None = None  # when its grace ended and its kill began (runtime.begin_kill)
    forced: float | None = None  # when its kill's last step began, its shim killed too (runtime.force_kill)


# A gang peer's stop that stops the whole gang at its round (its record says it stopped, or, while it checkpoints, that
# it is stopping): its instance is going (a notice, the agent stopping) or the plan took it away (moved, edited).
STOPS_THE_GANG = ("Interrupted", "AgentStopped", "Unassigned", "Replaced")


def _grace(entry: dict) -> float:
    """The checkpoint grace of an assignment's replica (STOP_GRACE_S without a checkpoint): how long a copy it hands
    over to may wait for it (plus HANDOFF_MARGIN_S) before starting anyway."""
    ck = entry.get("checkpoint")
    return float(ck["grace_seconds"]) if ck and ck.get("grace_seconds") is not None else STOP_GRACE_S


_STOPPING: dict[str, Check] = {"phase": (_str, "a phase"), "reason": (_str, "a reason"), "message": (_str, "a message"),
                               "terminal": (lambda v: isinstance(v, bool), "true or false"), "deadline_at": (_number, "a unix time"),
                               "restart_attempt": (_opt(_count), "an attempt")}
LOCAL_FIELDS: dict[str, Check] = {
    "entry": (lambda v: _shape(v, _ENTRY, ("job", "replica", "spec_hash", "epoch", "run")) is None, "a replica assignment"),
    "attempt": (_count, "a count"), "backoff_from": (_count, "a count"), "pid": (_count, "a pid"), "started": (_str, "a start time"),
    "name": (_str, "a name"), "exit_path": (_opt(_str), "a path"), "started_at": (_opt(_str), "a time"),
    "started_unix": (_number, "a unix time"), "env": (lambda v: isinstance(v, dict), "an environment"),
    "stopping": (lambda v: _shape(v, _STOPPING, ("phase", "reason", "message", "terminal")) is None, "a stop under way"),
}


def _survives(st: _Stop) -> bool:
    """A stop the replica survives: a notice, a move, an edit, the agent stopping, or its gang stopping with a peer (one
    that stops, or one whose agent is lost)."""
    return st.phase == "Stopped" or st.reason in ("GangStopped", "GangPeerLost")


def _uploads_after(st: _Stop) -> bool:
    """A stop whose checkpoint is uploaded: one the replica survives (a notice, a move, an edit, the agent stopping, a
    gang's stop with one of them), and its time limit. The job then ends Failed (DeadlineExceeded), but its checkpoint
    signal was sent and the edit that raises the limit runs it again, placed anew: without the upload it started from
    step 0 (sim, runtime audit). A gang's ranks stopped because a peer ran past the limit ("replica N failed:
    DeadlineExceeded", GangFailed) too: without theirs its round lacked their ranks and was never restored."""
    return _survives(st) or st.reason == "DeadlineExceeded" or st.reason == "GangFailed" and st.message.endswith(": DeadlineExceeded")


def peer_stop(replica: int, peers: list[dict]) -> str | None:
    """Why a gang's replica `replica` stops with its peers' records `peers` (the other replicas, of its round: spec hash
    and epoch), or None: one of them stopped, or is stopping, for a reason in STOPS_THE_GANG. A gang is one training
    run: a rank that goes away leaves the others hung in their next collective, and checkpointed then, later, they
    resumed at steps the moved rank's checkpoint never reached (test_runtime_sim, the gang tests)."""
    for r in sorted(peers, key=lambda r: r.get("replica", 0)):
        if r.get("replica") == replica or r.get("terminal"):
            continue
        how = r.get("stopping") if r.get("stopping") in STOPS_THE_GANG else \
            r.get("reason") if r.get("phase") == "Stopped" and r.get("reason") in STOPS_THE_GANG else None
        if how:
            return f"replica {r.get('replica')} stopped ({how}) on {r.get('instance')}: the gang stops with it"
    return None


def unstarted_peers(entry: dict, peers: list[dict]) -> list[dict]:
    """The ranks of `entry`'s round with no record of it in `peers` (its round's records), each as a record on the
    instance the assignment places it on (`peers` of the entry: rank -> instance; an older apply wrote none: [])."""
    have = {r.get("replica") for r in peers}
    return [{"replica": i, "instance": inst, "unstarted": True} for i, inst in enumerate(entry.get("peers") or [])
            if i != entry["replica"] and i not in have]


def peer_lost(replica: int, here: str, peers: list[dict], report: Callable[[str], dict | None], now: float, stale: float) -> str | None:
    """Which peer of a gang's replica `replica` (its round's records `peers`, and `unstarted_peers`) is lost, or None:
    one not finished, on another instance than `here`, whose agent's report (`report(instance)`) is no longer alive by
    the bus's one rule (bus.reports_alive: written at most `stale` seconds ago by the store's clock, whatever the peer's
    host clock says, and not Stopped; publish.mark_lost marks
    a reclaimed instance's report Stopped). A peer with no report at all is not lost: an agent writes its first run
    record just before its first heartbeat, and the reconciler deletes the report of an instance the cloud no longer
    lists in the apply that places its work anew. A peer not started yet (no record of the round) is judged by the
    agent of the instance it is assigned to: lost only if that agent is (it died before it took up the round; the
    others waited for it, then ran alone, hung in their first collective with nothing in status saying why). A network
    blip shorter than the stale limit keeps the heartbeat fresh. A killed agent or a vanished instance leaves its rank's
    record saying Running for ever: the other ranks hung in their next collective (or, with a collective that times
    out, trained on at a smaller world), until an apply moved the gang."""
    for r in sorted(peers, key=lambda r: r.get("replica", 0)):
        inst = r.get("instance")
        if r.get("replica") == replica or r.get("terminal") or inst in (None, here):
            continue
        doc = report(inst)
        if doc is None or reports_alive(doc, now, stale):
            continue
        how = f"gone: {doc['lost']}" if doc.get("lost") else "its agent stopped" if doc.get("state") == "Stopped" else \
            f"no heartbeat since {iso(beat_time(doc))}"
        return f"replica {r.get('replica')}'s agent on {inst} is lost ({how}){' before it took up this round' if r.get('unstarted') else ''}"
    return None


@dataclass
class Replica:
    """One assigned replica on this agent, across its attempts."""

    entry: dict  # its part of the assignment
    attempt: int = 0
    phase: str = "Starting"
    reason: str = "Assigned"
    message: str = ""
    terminal: bool = False
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    handle: object | None = None
    started_mono: float = 0.0
    next_start: float = 0.0
    next_start_at: float | None = None  # the same as a unix time, in its run record while it backs off (agent restarts keep it)
    backoff_from: int = 0  # the attempt its restart delays double from: the last that ran backoff_reset long before failing
    stop: _Stop | None = None
    env: dict = field(default_factory=dict)
    devices: tuple[str, ...] = ()  # the GPUs / MIG devices (the plan's ids) its process was started on
    predecessor: str | None = None  # the instance whose agent ran it before the plan moved it here
    waiting_since: float | None = None  # when it began waiting for that copy to stop
    gang_since: float | None = None  # when it began waiting for its gang's last round to be uploaded
    held_back: int = 0  # starts in a row held back by its disk (no room for its checkpoint, no local record written): each waits twice as long

    @property
    def key(self) -> tuple[str, int]:
        return self.entry["job"], self.entry["replica"]

    @property
    def running(self) -> bool:
        return self.handle is not None


class Turn:
    """Whose turn it is to act on the agent's replicas: its loop's, or the notice watcher's. The loop holds it through a
    tick and gives it up only while a store call is in flight (StoreOffTurn) or it sleeps between polls: the watcher then
    signals the replicas at a notice, and the loop finds them stopping when the store answers. (A re-entrant lock whose
    holder can give up every level at once around one call, as threading.Condition does with an RLock.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> Turn:
        me = threading.get_ident()
        if self._owner != me:
            self._lock.acquire()
            self._owner = me
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    @contextmanager
    def given_up(self) -> Iterator[None]:
        """Given up while the body runs, if this thread holds it; taken back after, at the depth it was held."""
        if self._owner != threading.get_ident():
            yield
            return
        depth, self._depth, self._owner = self._depth, 0, None
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._owner, self._depth = threading.get_ident(), depth


class StoreOffTurn:
    """The state backend, each call of which gives up the agent's Turn while it is in flight (a hung store held the loop
    ~60 s, two notices' worth: botocore's retries). A `progress` callback (the agent's heartbeat during a checkpoint's
    transfer) takes the turn back while it runs. Attributes are the store's own, read at each call (tests replace them)."""

    def __init__(self, store: Any, turn: Turn):
        self._store, self._turn = store, turn

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        turn = self._turn

        def call(*args: Any, **kwargs: Any) -> Any:
            progress = kwargs.get("progress")
            if progress is not None:
                def in_turn() -> None:
                    with turn:
                        progress()
                kwargs["progress"] = in_turn
            with turn.given_up():
                return attr(*args, **kwargs)
        return call


class Agent:
    def __init__(self, instance: str, bus: Bus, runtime: Runtime, workdir: Path, *, notice: NoticeSource | None = None,
                 address: str | None = None, checkpoint_root: Path | None = None, poll: float | None = None,
                 heartbeat: float | None = None, backoff: float | None = None, backoff_reset: float | None = None, command_cwd: Path | None = None,
                 log: Callable[[str], None] | None = None, checkpoint_sync: bool | None = None):
        self.instance = instance
        self.turn = Turn()  # the loop's or the notice watcher's (_watch_notice)
        self.bus = bus
        self.runtime = runtime
        self.workdir = Path(workdir)
        self.notice = notice or NoNotice()
        self.address = address or own_address()
        self.checkpoint_root = checkpoint_root
        self.command_cwd = command_cwd
        self.poll = poll or poll_seconds()
        self.heartbeat = heartbeat or heartbeat_seconds()
        self.backoff = backoff or backoff_seconds()
        self.backoff_reset = backoff_reset or backoff_reset_seconds()
        self._log = log or (lambda m: print(f"{iso()} agent {instance}: {m}", flush=True))
        self.replicas: dict[tuple[str, int], Replica] = {}
        self.assignment: dict | None = None
        self.notice_seen: str | None = None
        self.notice_asked = 0.0  # (monotonic) when the notice source was last asked
        self.notice_done = False
        self.bus_error: str | None = None
        self.bus_said: str | None = None  # the bus failure last logged: each is logged once, and its end
        self.write_failed: str | None = None  # a run record not written since: in the heartbeat, so status does not trust runs/
        self.written: dict[tuple[str, int], str] = {}
        # This agent's own files it could not write or read (a full, read-only or failing disk): path -> why, in its
        # heartbeat. The replicas keep running; their local records (unsaved) and replicas.pids (pids_due) are written
        # again each tick, the records it could not read (unread) read again.
        self.workdir_failed: dict[str, str] = {}
        # replica -> why its local record could not be read (None: the records' folder could not be listed): it may run,
        # started by an earlier agent, so it is not started again until the record is read and its process adopted
        self.unread: dict[tuple[str, int] | None, str] = {}
        self.unsaved: dict[tuple[str, int], dict] = {}
        self.pids_due = False
        self.last_beat = 0.0
        self.last_running: list[str] | None = None
        self.stopping = False
        self.adopted = False
        # Checkpoints copied through the state backend (reconciler/runtime/checkpoints): FLEETOPS_CHECKPOINT_SYNC=0 off.
        self.checkpoint_sync = checkpoints.enabled() if checkpoint_sync is None else checkpoint_sync
        self.uploads: dict[str, dict] = {}  # job -> the upload due once none of its replicas here runs any more
        # gang peers' agents' reports, each read again only once it could be stale (_lost_peer); their rounds' run
        # records read this tick (_round_records)
        self.reports: dict[str, dict | None] = {}
        self.beats = BeatWatch()  # predecessors' reports, judged by this agent's clock (a moved replica's wait)
        self.round_records: dict[tuple, list[dict]] = {}
        # Why a process replica's shim cannot be the subreaper of its tree here (runtimes.SHIM), in the heartbeat: an
        # orphan that left the replica's group and cleared its environment then outlives the replica. (A container's
        # processes end with it: docker's.)
        self.strays_untracked = subreaper_problem() if runtime.name == "process" else None

    @property
    def bus(self) -> Bus:
        return self._bus

    @bus.setter
    def bus(self, bus: Bus) -> None:
        """The bus, its store giving up the turn during each call: the notice watcher acts while a store call hangs."""
        self._bus = Bus(StoreOffTurn(bus.store, self.turn))

    # -------------------------------------------------------------- the loop
    def run(self, should_stop: Callable[[], bool] = lambda: False,
            instance_gone: Callable[[], bool] = lambda: False) -> None:
        self._log(f"started (runtime {self.runtime.name}, address {self.address}, poll {self.poll}s, heartbeat {self.heartbeat}s)")
        if self.strays_untracked:
            self._log(f"a replica's orphans cannot be tracked ({self.strays_untracked}): one that leaves its process group "
                      "and clears its environment outlives its replica")
        done = threading.Event()
        watcher = threading.Thread(target=self._watch_notice, args=(done,), name="fleetops-notice", daemon=True)
        watcher.start()
        try:
            while not should_stop() and not self.stopping:
                if instance_gone():
                    with self.turn:
                        self.vanish()
                    return
                self.tick()
                time.sleep(self.poll)
            self.shutdown()
        finally:
            done.set()
            watcher.join()

    def _watch_notice(self, done: threading.Event) -> None:
        """Asks for the notice once a poll beside the loop, till one is seen: at a notice it takes the turn, which the
        loop gives up while a store call is in flight, and signals every running replica (_notice). What needs the store,
        the uploads and the reports, stays the loop's, done when the store answers. Before, a store call that hung held
        the notice, and the checkpoint signal, up to ~60 s of a 30 s GCE or Azure notice."""
        while not done.wait(self.poll) and not self.notice_seen:
            notice = self.notice.check()  # (outside the turn: a metadata endpoint that is slow holds nothing)
            if notice:
                with self.turn:
                    self._notice(notice)

    def vanish(self) -> None:
        """The instance itself is gone (on the sim: its directory was deleted): its processes die with it,
        with no checkpoint and no report, as on a cloud instance that was terminated under them."""
        live = [rep.handle for rep in self.replicas.values() if rep.handle is not None]
        for handle in live:  # (all begun first: their strays' grace runs side by side, not one replica after another)
            self.runtime.begin_kill(handle)
        for handle in live:
            self.runtime.kill(handle)

    def shutdown(self) -> None:
        """Checkpoint and stop every replica (SIGTERM to the agent: the instance is going away)."""
        with self.turn:
            for rep in self.replicas.values():
                if rep.running and rep.stop is None:
                    self._begin_stop(rep, "Stopped", "AgentStopped", "the agent was stopped", terminal=False)
            self._publish(force=True)  # at once: the reconciler may have removed our key with the instance
        while True:
            with self.turn:
                if not (any(r.running for r in self.replicas.values()) or self.uploads):  # (an upload tried again: up to its deadline)
                    break
                self._supervise(starts=False)  # a replica that started now would never be stopped
                self._publish()  # what still runs: the agent a replica moved to waits for it to stop
            time.sleep(min(self.poll, 0.2))
        with self.turn:
            self._publish(force=True, state="Stopped")
        self._log("stopped")

    def tick(self) -> None:
        with self.turn:
            self._tick()

    def _tick(self) -> None:
        self.round_records = {}
        if not self.adopted or self.unread:
            self._adopt()
        self._write_own_again()
        self._check_notice()
        self._read_assignment()
        self._reconcile()
        self._gang_sync()
        self._supervise()
        self._publish(force=bool(self.notice_seen) and not self.notice_done)
        if self.bus_error is None and self.bus_said is not None:  # a whole tick's reads and writes went through
            self._log("the bus is reachable again")
            cleared, self.bus_said, self.write_failed = self.write_failed, None, None
            if cleared:
                self._publish(force=True)  # (status trusts runs/ again now, not a heartbeat later)
        if self.notice_seen and not self.notice_done and not self.replicas and not self.uploads and self.bus_error is None:
            # (a notice leaves none assigned: a replica still here runs, or its end is not written yet)
            # Everything checkpointed and reported: the instance may go (the sim waits for this).
            if self._write_own(self.workdir / "notice.done", (iso() + "\n").encode()):  # (else again next tick)
                self.notice_done = True
                self._log("interruption handled: every replica stopped and reported")

    def _check_notice(self) -> None:
        """An interruption notice, first seen: every running replica gets its checkpoint signal now (_reconcile stops
        what is left). Also asked while a checkpoint's restore or upload holds the loop (_keepalive, once a poll): a
        notice that came meanwhile was seen once that was over (a restore of GBs takes minutes), and the running
        replicas got their signal that much later into the notice (GCE and Azure give 30 s)."""
        self.notice_asked = time.monotonic()
        notice = None if self.notice_seen else self.notice.check()
        if notice:
            self._notice(notice)

    def _notice(self, notice: str) -> None:
        """The notice `notice`, first seen (by the loop or its watcher): every running replica gets its checkpoint
        signal; nothing starts from now on."""
        if self.notice_seen:
            return
        self.notice_seen = notice
        self._log(f"interruption notice: {notice}; checkpointing and stopping every replica")
        for rep in self.replicas.values():
            if rep.running and rep.stop is None:
                self._begin_stop(rep, "Stopped", "Interrupted", notice, terminal=False)

    # -------------------------------------------------------------- an agent that restarted
    def _local(self, key: tuple[str, int]) -> Path:
        return self.workdir / "replicas" / f"{key[0]}-{key[1]}.json"

    def _exit_path(self, key: tuple[str, int]) -> Path:
        return self.workdir / "replicas" / f"{key[0]}-{key[1]}.exit"

    def _adopt(self) -> None:
        """Take over what an earlier agent on this instance started (it crashed, or systemd restarted
        it): each replica's local record names its process (pid and start time) and its attempt. A
        process still running is watched again, not started a second time; one that ended while no
        agent watched is reported from its exit file, once. Before this, a restarted agent started a
        second copy of every running replica beside the first. A record that cannot be read (a failing disk) holds its
        replica back (unread) and is read again each tick: that replica may run, and a second copy was started beside it."""
        first, retry = not self.adopted, set(self.unread)
        self.adopted = True
        folder = self.workdir / "replicas"
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except (FileNotFoundError, NotADirectoryError):
            names = []  # (no record was ever written there)
        except OSError as e:
            self._unreadable(None, folder, e)
            return
        self._readable(None, folder)
        left: list[StrayEnd] = []  # what replicas that ended unwatched left running: ended side by side, below
        try:
            self._adopt_records(folder, names, first, retry, left)
        finally:
            while [end for end in left if not end.done()]:  # (each polled: its SIGKILL is due at its own time)
                time.sleep(0.02)

    def _adopt_records(self, folder: Path, names: list[str], first: bool, retry: set, left: list[StrayEnd]) -> None:
        for name in names:
            path = folder / name
            job, _, num = name[: -len(".json")].rpartition("-")
            named = (job, int(num)) if num.isdigit() else None
            if not first and None not in retry and named not in retry:
                continue  # adopted, or ignored, by an earlier pass
            try:
                rec = json.loads(path.read_bytes())
            except OSError as e:
                if named is None or named in self.replicas and self.replicas[named].handle is not None:
                    self._log(f"ignoring the unreadable replica record {path}: {e.strerror}")
                else:
                    self._unreadable(named, path, e)
                continue
            except ValueError:
                self._readable(named, path)
                self._log(f"ignoring the unreadable replica record {path}")
                continue
            self._readable(named, path)
            problem = _shape(rec, LOCAL_FIELDS, ("entry",))  # (a field of another type killed the agent: ValueError, TypeError)
            if problem is not None:
                self._log(f"ignoring the replica record {path}: it {problem}")
                continue
            entry, key = rec["entry"], (rec["entry"]["job"], rec["entry"]["replica"])
            if key in self.replicas and self.replicas[key].handle is not None:
                continue  # (read again after a failure: never in place of a copy this agent runs)
            rep = Replica(entry, attempt=rec.get("attempt", 0), started_at=rec.get("started_at"), env=rec.get("env", {}),
                          backoff_from=rec.get("backoff_from", 0))
            rep.started_mono = time.monotonic() - max(0.0, now_unix() - rec.get("started_unix", now_unix()))
            exit_path = Path(rec.get("exit_path") or self._exit_path(key))
            if not rec.get("pid") and (shim := unrecorded_shim(rep.env.get(REPLICA_ID))) is not None:
                # (its agent died between the start and this record's pid: read as killed, it was started a second time)
                rec = {**rec, "pid": shim[0], "started": shim[1]}
                self.unsaved[key] = rec
                self._flush_local(key)
                self._log(f"{key[0]}/{key[1]}: attempt {rep.attempt} runs (pid {shim[0]}), unrecorded by the agent that "
                          "started it: found by its mark")
            rep.handle = adopt(rec.get("pid", 0), rec.get("started", ""), exit_path, rec.get("name", ""), rep.env.get(REPLICA_ID))
            if rep.handle is not None and (ran := process_age(rep.handle.started)) is not None:
                # (its shim's age, since boot: a wall clock set since, ahead or back, moved started_unix's count, and
                # a jump ahead stopped it at its time limit, Failed, days early)
                rep.started_mono = time.monotonic() - ran
            stopping = rec.get("stopping")
            stop = None  # (none under way, or a record an older agent wrote)
            if stopping is not None:
                # (the rest of its grace, never more than the grace: the wall clock set back since made it an hour)
                rest = min(_grace(entry), max(0.0, float(stopping.get("deadline_at", 0)) - now_unix()))
                stop = _Stop(time.monotonic() + rest, stopping["phase"],
                             stopping["reason"], stopping["message"], stopping["terminal"], stopping.get("restart_attempt"))
            if rep.handle is not None:
                rep.devices = tuple(str(g) for g in entry.get("gpus", ()))  # the entry it was started with
                rep.phase, rep.reason, rep.message = "Running", "Adopted", f"attempt {rep.attempt}, started by an earlier agent"
                rep.stop = stop  # (its signal was sent, if any: the rest of its grace, then the kill)
                self.replicas[key] = rep
                self._log(f"{key[0]}/{key[1]}: adopted attempt {rep.attempt} (pid {rep.handle.pid}), still running"
                          + ("" if getattr(rep.handle, "subreaps", True) else " under an earlier agent version's shim: its orphans are not tracked"))
                continue
            # (ended while no agent watched: what it left running, a child that left its process group, holds its GPUs)
            if (end := self.runtime.end_left(rec.get("pid", 0), rec.get("started", ""), rep.env.get(REPLICA_ID))) is not None:
                left.append(end)
            try:
                prev = self.bus.run(*key)
            except ReconcileError:
                prev = None
            ended = exit_record(exit_path)
            unreported = prev is not None and prev.get("instance") == self.instance and prev.get("phase") in ("Starting", "Running") and \
                (prev.get("spec_hash"), prev.get("epoch"), prev.get("attempt")) == (entry["spec_hash"], entry["epoch"], rep.attempt)
            if not (unreported or prev is None and ended is not None):
                continue  # its end was reported already (or it never ran): the bus record is what counts
            self.replicas[key] = rep
            if stop:
                # It ended on the stop its agent had begun (a time limit, a peer's restart, an unassignment): that stop's
                # outcome, not its exit code's. A script exits 0 on its checkpoint signal, and was read as Succeeded.
                self._ended_as(rep, stop, (ended or {}).get("code", -signals.SIGKILL))
                if _uploads_after(stop) and time.monotonic() < stop.deadline + HANDOFF_MARGIN_S:
                    # a stop it survives: its checkpoint still travels (the killed agent never sent it); not later than a
                    # moved copy waits for it, after which that copy runs and an upload of this would be older than its own
                    self._upload_due(rep, max(stop.deadline, time.monotonic() + UPLOAD_MIN_S))
                self._log(f"{key[0]}/{key[1]}: attempt {rep.attempt} ended while no agent watched it, as its stop ({rep.reason}) asked")
                continue
            self._ended(rep, ended)
            self._log(f"{key[0]}/{key[1]}: attempt {rep.attempt - (0 if rep.terminal else 1)} ended while no agent watched it")

    def _unreadable(self, key: tuple[str, int] | None, path: Path, err: OSError) -> None:
        """A replica's local record (`key`; None: the folder of them) cannot be read: held back, in the heartbeat."""
        why = f"cannot read {path}: {err.strerror} ({errno.errorcode.get(err.errno or 0, err.errno)}, errno {err.errno})"
        if self.unread.get(key) != why:
            self._log(f"{why}; {'its replica is' if key else 'no replica is'} not started until it can be (read again every poll)")
        self.unread[key] = self.workdir_failed[str(path)] = why

    def _readable(self, key: tuple[str, int] | None, path: Path) -> None:
        if self.unread.pop(key, None) is not None:
            self.workdir_failed.pop(str(path), None)
            self._log(f"read {path} again")

    def _local_doc(self, rep: Replica, launch: Launch) -> dict:
        """A replica's local record: with its process (pid, start time) once it runs."""
        ran = {"pid": rep.handle.pid, "started": start_time(rep.handle.pid)} if rep.handle is not None else {}
        return {"entry": rep.entry, "attempt": rep.attempt, "backoff_from": rep.backoff_from, **ran, "name": launch.name,
                "exit_path": str(launch.exit_path), "started_at": rep.started_at, "started_unix": now_unix(), "env": rep.env}

    def _save_local(self, rep: Replica, launch: Launch) -> None:
        self.unsaved[rep.key] = self._local_doc(rep, launch)
        self._flush_local(rep.key)

    def _flush_local(self, key: tuple[str, int]) -> None:
        # (0600: it holds the replica's environment, run.env too)
        if self._write_own(self._local(key), json.dumps(self.unsaved[key]).encode(), mode=0o600):
            del self.unsaved[key]

    def _write_own(self, path: Path, data: bytes, mode: int = 0o644, again: bool = True) -> bool:
        """Write one of this agent's own files; False when it cannot (a full or read-only disk), logged. One written again
        each tick until it is (`again`) is kept in workdir_failed (the heartbeat's) till then. The agent died with the
        OSError just after it started a replica: the replica ran on with no agent, and no local record to adopt it by."""
        try:
            write_atomic(path, data, mode=mode)
        except OSError as e:
            why = f"cannot write {path}: {e.strerror} ({errno.errorcode.get(e.errno or 0, e.errno)}, errno {e.errno})"
            if not again:
                self._log(why)
            elif self.workdir_failed.get(str(path)) != why:
                self._log(f"{why}; what runs keeps running, written again every poll")
                self.workdir_failed[str(path)] = why
            return False
        if self.workdir_failed.pop(str(path), None) is not None:
            self._log(f"wrote {path} again")
        return True

    def _write_own_again(self) -> None:
        """The local records and replicas.pids not written yet (_write_own): until they are, an agent restarted here
        would not adopt the replica (it started a second copy) and the sim could not end it with the instance."""
        for key in list(self.unsaved):
            self._flush_local(key)
        if self.pids_due:
            self._write_pids()

    def _ended(self, rep: Replica, ended: dict | None, seen: int | None = None) -> None:
        """A replica's process ended: how (its shim's exit file, `ended`) decides what follows. `seen`: the exit status of
        a shim this agent started (it exits as its command did), for a file missing or not the shim's; without it, no file
        says the replica was killed with its shim, and a malformed one leaves its exit code unknown (None)."""
        malformed = ended.get("malformed") if ended else None
        if malformed:
            self._log(f"{rep.key[0]}/{rep.key[1]}: {malformed}")
        if ended and not malformed:
            code = ended["code"]
        elif seen is not None or malformed:
            code = seen
        else:
            code = -signals.SIGKILL  # (no file: it died with its shim, killed)
        if ended and ended.get("error"):
            rep.handle, rep.exit_code, rep.finished_at = None, code, iso()
            rep.phase, rep.reason, rep.message, rep.terminal = "Failed", "StartError", ended["error"], True
            self._write_pids()
            return
        refused = self._docker_refused(rep, code)
        if refused is not None:  # the command never ran: restarting cannot help (as a missing command under `process`)
            rep.handle, rep.exit_code, rep.finished_at = None, code, iso()
            rep.phase, rep.reason, rep.message, rep.terminal = "Failed", "StartError", refused, True
            self._write_pids()
            self._log(f"{rep.key[0]}/{rep.key[1]}: cannot start: {refused}")
            return
        self._exited(rep, code, malformed)

    def _docker_refused(self, rep: Replica, code: int | None) -> str | None:
        """Docker's own refusal to start the container's command (exit 126: cannot be run, 127: not found in the
        image), from the line the docker client printed last; None for any other end, an exit 127 of the command
        itself included. It was an ordinary failure, restarted backoff_limit times before the job failed."""
        if self.runtime.name != "docker" or code not in (126, 127):
            return None
        text = log_end(self._log_path(rep))  # this attempt's output only: docker's error comes last, maybe before a hint
        if text is None:
            return None
        attempt = text.rsplit("\n--- fleetops: attempt ", 1)[-1].splitlines()[1:]
        said = [ln for ln in attempt[-5:] if ln.startswith("docker: Error response from daemon")]
        return masked(said, own_secrets(rep.entry))[-1][:400] if said else None

    # -------------------------------------------------------------- reading the bus
    def _read_assignment(self) -> None:
        try:
            doc = self.bus.assignment(self.instance)
        except ReconcileError as e:
            self._bus_failed("cannot reach the bus", e, "; keeping what runs")
            return
        self.bus_error = None
        if doc is None or self.assignment is None or doc.get("serial", 0) >= self.assignment.get("serial", 0):
            self.assignment = doc if doc is not None else {"serial": 0, "replicas": []}

    def _desired(self) -> dict[tuple[str, int], dict]:
        if self.notice_seen or self.assignment is None:
            return {}
        return {(e["job"], e["replica"]): e for e in self.assignment.get("replicas", [])}

    def _reconcile(self) -> None:
        if self.assignment is None and not self.notice_seen:
            return  # the bus was never read: what an earlier agent started (adopted) keeps running
        want = self._desired()
        for key, rep in list(self.replicas.items()):
            entry = want.get(key)
            same = entry is not None and (entry["spec_hash"], entry["epoch"]) == (rep.entry["spec_hash"], rep.entry["epoch"])
            if same:
                rep.entry = entry  # addresses and ports may be filled in later
                continue
            if rep.running:
                if rep.stop is None:
                    if self.notice_seen:
                        self._begin_stop(rep, "Stopped", "Interrupted", self.notice_seen, terminal=False)
                    else:
                        why = "Unassigned" if entry is None else "Replaced"
                        self._begin_stop(rep, "Stopped", why, "no longer assigned here" if entry is None else "spec or placement changed", terminal=False)
                continue
            if self.notice_seen and not rep.terminal and rep.phase != "Stopped":
                rep.phase, rep.reason, rep.message = "Stopped", "Interrupted", self.notice_seen
                self._write_run(rep, force=True)
            elif not self.notice_seen and not rep.terminal and rep.phase != "Stopped":  # (backing off, or never started here)
                rep.phase, rep.reason = "Stopped", "Unassigned" if entry is None else "Replaced"
                rep.message = "no longer assigned here" if entry is None else "spec or placement changed"
            # (also one adopted as stopped, by an agent restarted in the notice: never written)
            if not self._last_report(rep):
                continue  # kept, its end written again each poll: dropped, its record said Running for good
            del self.replicas[key]
            self.unsaved.pop(key, None)
            if key in self.unread:
                continue  # (its record stays: read again, it is adopted and stopped as no longer assigned)
            self.workdir_failed.pop(str(self._local(key)), None)
            for path in (self._local(key), self._exit_path(key)):
                try:
                    path.unlink(missing_ok=True)
                except OSError as e:  # (left: an agent restarted here finds it ended and reported, and skips it)
                    self._log(f"cannot remove {path}: {e.strerror}")
        if self.bus_error is not None and self.assignment is None:
            return
        for key, entry in want.items():
            if key in self.replicas:
                continue
            rep = Replica(entry)
            try:
                prev = self.bus.run(*key)
            except ReconcileError:
                prev = None
            if prev and prev.get("instance") not in (None, self.instance) and not prev.get("terminal"):
                rep.predecessor = prev["instance"]  # remembered: our own record overwrites its record
            if prev and prev.get("instance") == self.instance and (prev.get("spec_hash"), prev.get("epoch")) == (entry["spec_hash"], entry["epoch"]):
                rep.attempt, rep.backoff_from = prev.get("attempt", 0), prev.get("backoff_from", 0)
                if prev.get("reason") == "BackOff" and prev.get("next_start_at") is not None and not prev.get("terminal"):
                    # backing off when this agent (re)started: the rest of the wait, not a restart at once (a crashing
                    # service, with its agent restarted by systemd, was started again without its backoff)
                    wait = min(MAX_BACKOFF_S, max(0.0, float(prev["next_start_at"]) - now_unix()))
                    rep.next_start, rep.next_start_at = time.monotonic() + wait, float(prev["next_start_at"])
                    rep.phase, rep.reason, rep.message = "Starting", "BackOff", prev.get("message", "")
                if prev.get("terminal"):  # finished before this agent (re)started: not run again
                    for k in ("phase", "reason", "message", "terminal", "exit_code", "started_at", "finished_at"):
                        setattr(rep, k, prev.get(k))
            self.replicas[key] = rep
            self._log(f"assigned {key[0]}/{key[1]} (epoch {entry['epoch']}, spec {entry['spec_hash']})")

    def _gang_sync(self) -> None:
        """A gang restarts together: a peer on a later attempt restarts this replica at that attempt;
        a peer that failed for good stops it; a peer's stop it survives (GangStopped) or a peer's lost agent
        (GangPeerLost) stops it with its checkpoint signal."""
        for rep in self.replicas.values():
            e = rep.entry
            if e.get("world_size", 1) <= 1 or rep.terminal or self.bus_error:
                continue
            try:
                peers = [r for r in self._round_records(e) if r.get("replica") != e["replica"]]
            except ReconcileError:
                continue
            failed = [r for r in peers if r.get("terminal") and r.get("phase") == "Failed"]
            why = peer_stop(e["replica"], peers)
            if why and not failed:
                if rep.running and rep.stop is None:
                    self._begin_stop(rep, "Starting", "GangStopped", why, terminal=False)
                continue
            if failed:
                msg = f"replica {failed[0].get('replica')} failed: {failed[0].get('reason')}"
                if rep.running:
                    if rep.stop is None:
                        self._begin_stop(rep, "Failed", "GangFailed", msg, terminal=True)
                else:
                    rep.phase, rep.reason, rep.message, rep.terminal = "Failed", "GangFailed", msg, True
                continue
            newest = max((r.get("attempt", 0) for r in peers), default=0)
            lost = self._lost_peer(rep, peers)
            if lost:
                # Checkpointed and uploaded, as for a peer's stop; then it waits (_gang_wait) for the round to be formed
                # again. Restarted at the next attempt: a lost agent that comes back (systemd) finds its rank's copy
                # still running alone and restarts it at that attempt with the others (the gang restart's rule), one
                # restart of the gang's backoff_limit, as torchrun counts a worker group restarted for a lost node.
                if rep.running and rep.stop is None:
                    self._begin_stop(rep, "Starting", "GangPeerLost", f"{lost}: the gang stops with it", terminal=False,
                                     restart_attempt=max(newest, rep.attempt) + 1)
                continue
            if newest > rep.attempt:
                if rep.running:
                    if rep.stop is None:
                        self._begin_stop(rep, "Starting", "GangRestart", f"a peer restarted (attempt {newest})", terminal=False,
                                         restart_attempt=newest)
                elif rep.phase != "Succeeded":
                    rep.attempt, rep.next_start = newest, 0.0
                    rep.phase, rep.reason, rep.terminal = "Starting", "GangRestart", False

    # -------------------------------------------------------------- processes
    def _supervise(self, starts: bool = True) -> None:
        now = time.monotonic()
        ready = []
        for rep in self.replicas.values():
            if rep.stop is not None:
                code = self.runtime.poll(rep.handle) if rep.handle is not None else -1
                if code is None and now < rep.stop.deadline:
                    continue
                if code is None and rep.stop.killed is None:
                    # (begun, not waited for: its shim ends its strays, those of every replica killed now side by side)
                    self._log(f"{rep.key[0]}/{rep.key[1]}: grace period over: killing")
                    rep.stop.killed = now
                    self.runtime.begin_kill(rep.handle)
                    code = self.runtime.poll(rep.handle)
                elif code is None and rep.stop.forced is None and now >= rep.stop.killed + STRAY_GRACE_S + KILL_MARGIN_S:
                    # (begun too, not waited for: a process SIGKILL cannot end, stuck in the kernel, held the loop 1 s
                    # per replica, and 10 s more every tick for such a shim; `poll` says when it has ended or is given up)
                    self._log(f"{rep.key[0]}/{rep.key[1]}: still running {now - rep.stop.killed:.0f}s after its kill: killing its shim")
                    rep.stop.forced = now
                    self.runtime.force_kill(rep.handle)
                    code = self.runtime.poll(rep.handle)
                if code is None:
                    continue  # (its devices stay held until nothing of it runs)
                st, rep.stop, rep.handle = rep.stop, None, None
                self._ended_as(rep, st, code)
                self._write_pids()
                if _uploads_after(st):  # its checkpoint travels
                    self._upload_due(rep, max(st.deadline, now + UPLOAD_MIN_S), killed=st.killed is not None)
                continue
            if rep.running:
                code = self.runtime.poll(rep.handle)
                if code is None:
                    if rep.phase == "Starting":
                        rep.phase, rep.reason, rep.message = "Running", "Started", f"attempt {rep.attempt}"
                    limit = rep.entry.get("time_limit_hours")
                    if limit and now - rep.started_mono >= limit * 3600:
                        self._begin_stop(rep, "Failed", "DeadlineExceeded", f"ran past time_limit_hours={limit}", terminal=True)
                    continue
                seen = None if isinstance(rep.handle, Detached) else code  # (its own child's status: the command's)
                self._ended(rep, exit_record(self._exit_path(rep.key)), seen)
                continue
            if not rep.terminal and rep.phase != "Stopped" and now >= rep.next_start and not self.notice_seen:
                ready.append(rep)
        self._upload_checkpoints()  # before the heartbeat says they stopped: a moved copy waits for that, then restores
        for rep in ready if starts else ():  # after every exit of this tick: the GPUs it released are free
            if self.notice_seen:  # (seen during an earlier one's restore)
                break
            self._start(rep)

    def _holders(self, rep: Replica) -> list[str]:
        """Why `rep` cannot start yet: each device it is given that another replica's process still
        holds (one stopping through its checkpoint grace, or an older spec of this replica), or may hold (the copy a
        local record this agent cannot read names). Starting beside it would put two processes on one GPU until that
        one exits."""
        mine = [str(g) for g in rep.entry.get("gpus", ())]
        out = []
        for other in self.replicas.values():
            if other is rep or other.handle is None:
                continue
            shared = [d for d in mine if any(same_device(d, h) for h in other.devices)]
            if shared:
                state = f"stopping ({other.stop.reason})" if other.stop else other.phase
                out.append(f"{device_names(shared)} held by {other.key[0]}/{other.key[1]}, {state}")
        if mine:  # (a copy an earlier agent started, its record unread: which devices it holds is unknown, maybe these)
            out += [f"{device_names(mine)} may be held by the copy of {key[0]}/{key[1]} its unreadable record names ({why})"
                    for key, why in sorted(self.unread.items(), key=lambda kv: str(kv[0])) if key is not None and key != rep.key]
        return out

    def _predecessor(self, rep: Replica) -> str | None:
        """The other instance whose agent still runs (or is stopping) this replica, which the plan moved
        here: starting now would run one rank twice, and the old copy's checkpoint, written through its
        grace, would overwrite the new copy's. Its agent's heartbeat says so (`running`; apply keeps a deleted
        instance's key while it does, or cannot be read: publish.shutting_down), and so does one that cannot be read, or
        one seen listing it and then deleted; fresh means seen changing within the stale limit by this agent's clock
        (bus.BeatWatch: another host's clock may be minutes off). A stale or Stopped agent, or one whose key is gone since
        before it was first read, holds nothing, and the wait ends anyway after the replica's grace plus a margin."""
        job, r = rep.key
        olds = {rep.predecessor} - {None}
        try:
            rec = self.bus.run(job, r)
        except ReconcileError:
            rec = None
        if rec and rec.get("instance") not in (None, self.instance) and not rec.get("terminal"):
            olds.add(rec["instance"])
        holder, unread = None, ""
        for old in sorted(olds):
            try:
                read = self.bus.agent(old)
            except ReconcileError as e:
                # (no evidence that it stopped: the copy there may checkpoint on; it started at once beside it, one rank
                # twice. Waited for as a report that says it runs: read again each poll, up to the same bound.)
                holder, unread = old, f"; its agent's report cannot be read: {e}"
                break
            doc, alive = self.beats.judge(old, read, stale_seconds())
            if alive and f"{job}/{r}" in doc.get("running", []):
                holder = old
                if read is None:
                    unread = "; its agent's report was deleted while it listed it (held as it last said until stale)"
                break
        if holder is None:
            rep.waiting_since = None
            return None
        if rep.waiting_since is None:
            rep.waiting_since = time.monotonic()
        grace, waited = _grace(rep.entry), time.monotonic() - rep.waiting_since
        if waited > grace + HANDOFF_MARGIN_S:
            self._log(f"{job}/{r}: the agent on {holder} still reports it running {waited:.0f}s after the move: starting anyway")
            rep.predecessor = None
            return None
        msg = f"waiting for its previous copy on {holder} to stop (checkpoint grace {grace:g}s){unread}"
        if (rep.reason, rep.message) != ("WaitingForPredecessor", msg):
            self._log(f"{job}/{r}: {msg}")
        rep.reason, rep.message = "WaitingForPredecessor", msg
        return holder

    def _round_records(self, e: dict, fresh: bool = False) -> list[dict]:
        """The run records of `e`'s round (its spec hash and epoch), of the ranks that have one: read once a tick (the
        gang's ranks here share them; `fresh`: read again), each by its key, runs/<job>/<rank>.json for the ranks of its
        world size (every rank of a round has that size: no listing, which S3 bills as 12 reads and throttles per
        prefix), and those of the ranks this agent runs from memory (what it writes this tick). ReconcileError when one
        cannot be read."""
        job, mine = e["job"], (e["spec_hash"], e["epoch"])
        key = (job, *mine, e.get("world_size", 1))
        if fresh or key not in self.round_records:
            out = []
            for r in range(e.get("world_size", 1)):
                here = self.replicas.get((job, r))
                doc = self._record(here) if here is not None and (here.entry["spec_hash"], here.entry["epoch"]) == mine \
                    else self.bus.run(job, r)
                if doc is not None and (doc.get("spec_hash"), doc.get("epoch")) == mine:
                    out.append(doc)
            self.round_records[key] = out
        return self.round_records[key]

    def _lost_peer(self, rep: Replica, peers: list[dict]) -> str | None:
        """peer_lost for this replica, its peers' agents' reports read from the bus (one that cannot be read is no
        evidence of a loss). A report alive by the one rule (bus.reports_alive) is not read again until it could no
        longer be (its heartbeat as old as the stale limit): a lost agent is seen when it was, a peer's report is read
        about once a stale limit instead of every poll. (A report marked Stopped or lost before then, the sim's reclaim,
        is seen at that limit: its replicas' stop, when the agent stopped them, is in their run records at once.)"""
        now, stale = now_unix(), stale_seconds()

        def report(instance: str) -> dict | None:
            doc = self.reports.get(instance)
            if doc is None or not reports_alive(doc, now, stale):
                try:
                    doc = self.bus.agent(instance)
                except ReconcileError:
                    doc = None
                self.reports[instance] = doc
            return doc

        return peer_lost(rep.entry["replica"], self.instance, peers + unstarted_peers(rep.entry, peers), report, now, stale)

    def _gang_stopping(self, rep: Replica) -> tuple[str, str] | None:
        """Why this replica's gang stops, from its run records of its round: (GangStopped, peer_stop) or (GangPeerLost,
        peer_lost); None for a job of one replica."""
        e = rep.entry
        if e.get("world_size", 1) <= 1:
            return None
        try:
            same = self._round_records(e, fresh=True)
        except ReconcileError:
            return None
        why = peer_stop(e["replica"], same)
        if why:
            return "GangStopped", why
        lost = self._lost_peer(rep, same)
        return ("GangPeerLost", f"{lost}: the gang stops with it") if lost else None

    def _gang_wait(self, rep: Replica) -> str | None:
        """Why a gang's replica must not restore and start yet, or None. Until a peer of its round that stopped with a
        survivable stop (peer_stop) runs again or the plan places the gang anew (a new epoch): a gang never runs with a
        rank missing. And, at most its grace plus HANDOFF_MARGIN_S, while a peer's copy of the round before still runs
        or uploads (its agent, fresh, lists it), here or on another instance, or a peer's new copy still waits for its
        old one: restored before that upload is there, its round looked incomplete (a rank missing) and this rank
        resumed from an older round than the others."""
        e = rep.entry
        job, me = rep.key
        if e.get("world_size", 1) <= 1:
            return None
        waits = []
        try:
            runs = self.bus.runs(job)
        except ReconcileError as err:  # (whether a peer still uploads is unknown: waited for, up to the same bound)
            runs = {}
            waits.append(f"the gang's run records, which cannot be read ({err})")
        mine = (e["spec_hash"], e["epoch"])
        same = [r for r in runs.values() if (r.get("spec_hash"), r.get("epoch")) == mine]
        why = peer_stop(me, same) or self._lost_peer(rep, same)
        if why:
            return f"{why}; it starts again with the gang"
        if job in self.uploads or any(x.handle is not None and (x.entry["spec_hash"], x.entry["epoch"]) != mine
                                      for (j, _), x in self.replicas.items() if j == job):
            waits.append(f"this instance's upload of {job}'s last round")
        for (_, i), r in sorted(runs.items()):
            if i == me or r.get("terminal"):
                continue
            if (r.get("spec_hash"), r.get("epoch")) == mine:
                if r.get("reason") == "WaitingForPredecessor":
                    waits.append(f"replica {i}'s previous copy ({r.get('message')})")
            elif r.get("instance") not in (None, self.instance):
                try:
                    doc = self.bus.agent(r["instance"])
                except ReconcileError as err:  # (no evidence that it is done: waited for as a report that lists it)
                    waits.append(f"replica {i} on {r['instance']}, whose agent's report cannot be read ({err})")
                    continue
                doc, alive = self.beats.judge(r["instance"], doc, stale_seconds())
                if alive and f"{job}/{i}" in doc.get("running", []):
                    waits.append(f"replica {i} on {r['instance']}, still running or uploading its checkpoint")
        if not waits:
            return None
        if rep.gang_since is None:
            rep.gang_since = time.monotonic()
        waited = time.monotonic() - rep.gang_since
        if waited > _grace(e) + HANDOFF_MARGIN_S:
            self._log(f"{job}/{me}: still waiting for {'; '.join(waits)} {waited:.0f}s on: starting anyway")
            return None
        return "waiting for the gang's last round to be uploaded: " + "; ".join(waits)

    def _cannot_start(self, rep: Replica, why: str) -> None:
        """The replica cannot be started at all: Failed (StartError) for good, restarting cannot help."""
        rep.phase, rep.reason, rep.message, rep.terminal, rep.finished_at = "Failed", "StartError", why, True, iso()
        self._log(f"{rep.key[0]}/{rep.key[1]}: cannot start: {why}")

    def _hold_back(self, rep: Replica, reason: str, why: str) -> None:
        """The replica is not started now for want of its disk (no room for its checkpoint, no local record written) or of
        its uploaded checkpoint (the state backend failing its reads): tried again after the restart delays, doubling."""
        rep.held_back += 1
        delay = min(MAX_BACKOFF_S, self.backoff * 2 ** (rep.held_back - 1))
        rep.next_start = time.monotonic() + delay
        msg = f"{why}; tried again in {delay:.1f}s"
        if rep.reason != reason:
            self._log(f"{rep.key[0]}/{rep.key[1]}: {msg}")
        rep.reason, rep.message = reason, msg

    def _start(self, rep: Replica) -> None:
        e = rep.entry
        job, r = rep.key
        unread = self.unread.get(rep.key, self.unread.get(None))
        if unread is not None:  # (read again each tick: adopted, or started, once it can be)
            msg = (f"its local record may say a copy still runs, started by an earlier agent, and {unread}: not started a "
                   "second time (once it can be read, the agent adopts that copy; if none runs, remove the file)")
            if (rep.reason, rep.message) != ("RecordUnreadable", msg):
                self._log(f"{job}/{r}: {msg}")
            rep.reason, rep.message = "RecordUnreadable", msg
            return
        problem = exec_problem(e["run"]["command"], e["run"].get("env", {}))  # (an older bus's: before any restore)
        if problem is not None:
            self._cannot_start(rep, problem)
            return
        held = self._holders(rep)
        if held:  # started on the first tick after the last of them exits (or is killed after its grace)
            msg = "waiting for its devices to be released: " + "; ".join(held)
            if (rep.reason, rep.message) != ("WaitingForGPUs", msg):
                self._log(f"{job}/{r}: {msg}")
            rep.reason, rep.message = "WaitingForGPUs", msg
            return
        if self._predecessor(rep) is not None:  # started on the first tick after the old copy is reported stopped
            return
        wait = self._gang_wait(rep)
        if wait is not None:  # the gang's ranks restore one round: each waits until every one of them is uploaded
            if (rep.reason, rep.message) != ("WaitingForGang", wait):
                self._log(f"{job}/{r}: {wait}")
            rep.reason, rep.message = "WaitingForGang", wait
            return
        rep.gang_since = None
        master = self.address if e.get("master_instance") in (None, self.instance) else None
        if master is None:
            try:
                peer = self.bus.agent(e["master_instance"])
            except ReconcileError:
                peer = None
            if not peer or not peer.get("address"):
                rep.reason, rep.message = "WaitingForMaster", f"waiting for replica 0's agent on {e['master_instance']}"
                return
            master = peer["address"]
        run = e["run"]
        gpus = tuple(str(g) for g in e.get("gpus", ()))
        ck = e.get("checkpoint")
        ck_host = self._checkpoint_dir(e)
        if ck_host is not None:
            not_restored = self._restore_checkpoint(job, ck_host, e.get("spec_hash"), e.get("epoch"), e.get("world_size", 1))
            if self.notice_seen:
                return  # (a notice seen while it was restored: nothing starts in a notice)
            if not_restored is not None:
                # (not started: from the older files it holds, or afresh, it would lose the training its checkpoint
                # holds; the retries fetch nothing while there is no room)
                self._hold_back(rep, *not_restored)
                return
        env = {**run.get("env", {}),
               "RANK": str(r), "WORLD_SIZE": str(e.get("world_size", 1)), "LOCAL_RANK": str(e.get("local_rank", 0)),
               "MASTER_ADDR": master, "MASTER_PORT": str(e.get("master_port", 29500)),
               "FLEETOPS_JOB": job, "FLEETOPS_REPLICA": str(r), "FLEETOPS_ATTEMPT": str(rep.attempt),
               "FLEETOPS_INSTANCE": self.instance, REPLICA_ID: f"{self.instance}/{job}/{r}/{rep.attempt}/{uuid.uuid4().hex}"}
        if ck:
            env["FLEETOPS_CHECKPOINT_DIR"] = str(ck_host) if self.runtime.name == "process" else ck["dir"]
        if gpus and e.get("mig_profile"):
            env["FLEETOPS_MIG_DEVICES"] = ",".join(gpus)  # G:M, as the plan gave them
            try:
                gpus = mig_uuids(gpus, e.get("mig_layout", []), nvidia_smi_list()) or gpus
            except StartError as err:
                self._cannot_start(rep, str(err))
                return
        if gpus:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(gpus)
            if self.runtime.name == "process":  # a container sees only its devices, renumbered from 0
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        log_path = replica_log(self.workdir, job, r)
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a") as f:
                f.write(f"--- fleetops: attempt {rep.attempt} of {job}/{r} on {self.instance} at {iso()} ---\n")
        except OSError as err:
            self._cannot_start(rep, f"cannot write its log {log_path}: {err.strerror}")
            return
        launch = Launch(name=f"fleetops-{job}-{r}-{rep.attempt}", command=tuple(run["command"]), env=env, log_path=log_path,
                        image=run.get("image"), gpus=gpus, checkpoint_dir=ck["dir"] if ck else None,
                        checkpoint_host_dir=ck_host, workdir=self.command_cwd, exit_path=self._exit_path(rep.key))
        if self.notice_seen:
            return  # (the watcher saw a notice while a store call above was in flight: nothing starts in a notice)
        rep.env = env
        if not self._write_own(self._local(rep.key), json.dumps(self._local_doc(rep, launch)).encode(), mode=0o600):
            # A replica this agent cannot record is one an agent restarted here could not adopt (it started a second
            # copy) nor stop: not started. (The record is written again once it runs, with its pid: _save_local.)
            self._hold_back(rep, "CannotRecord", f"not started: {self.workdir_failed[str(self._local(rep.key))]}, where "
                                                 "the agent records what it runs (without it, an agent restarted here "
                                                 "could neither adopt nor stop the replica)")
            return
        self.unsaved.pop(rep.key, None)  # (an earlier attempt's, superseded)
        rep.held_back = 0
        rep.started_at, rep.finished_at, rep.exit_code = iso(), None, None
        try:
            rep.handle = self.runtime.start(launch)
        except StartError as err:
            self._cannot_start(rep, str(err))
            return
        rep.started_mono = time.monotonic()
        rep.devices = tuple(str(g) for g in e.get("gpus", ()))
        rep.phase, rep.reason, rep.message = "Starting", "Started", f"attempt {rep.attempt}"
        self._save_local(rep, launch)
        self._log(f"{job}/{r}: started attempt {rep.attempt} (pid {rep.handle.pid}, RANK {r}, WORLD_SIZE {env['WORLD_SIZE']}, MASTER_ADDR {master})")
        self._write_pids()

    # -------------------------------------------------------------- checkpoints through the state backend
    def _checkpoint_dir(self, entry: dict) -> Path | None:
        """Where the job's checkpoints live on this host (`--checkpoint-root`/JOB/DIR), None without `checkpoint`."""
        ck = entry.get("checkpoint")
        if not ck:
            return None
        return (self.checkpoint_root / entry["job"] / ck["dir"].lstrip("/")) if self.checkpoint_root else Path(ck["dir"])

    def _marker(self, job: str) -> Path:
        """Which uploads the job's local checkpoint dir holds (its own, or restored): not fetched back."""
        return self.workdir / "checkpoints" / f"{checkpoints.segment(job)}.json"

    def _read_marker(self, job: str) -> dict | None:
        try:
            doc = json.loads(self._marker(job).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and isinstance(doc.get("generations"), list) else None

    def _write_marker(self, job: str, generations: list[str], at: list | None = None) -> None:
        """`at`: the assignment (spec hash, epoch) whose round the directory was restored for (restore_round)."""
        doc = {"generations": generations, "at_time": iso(), **({"at": at} if at else {})}
        self._write_own(self._marker(job), json.dumps(doc).encode(), again=False)  # (unwritten: fetched again by the next restore)

    def _upload_due(self, rep: Replica, deadline: float, killed: bool = False) -> None:
        """`killed`: the replica was killed at its grace's end, maybe in the middle of writing its checkpoint: the job's
        directory (a gang's ranks here share it) is not uploaded this round (_upload_checkpoints)."""
        path = self._checkpoint_dir(rep.entry)
        if self.checkpoint_sync and path is not None:
            e = rep.entry
            # the job's replicas of this round here: the ranks the upload holds (a gang's round is complete when its
            # uploads hold every rank: checkpoints.restore_round)
            ranks = {r for (j, r), x in self.replicas.items()
                     if j == e["job"] and (x.entry["spec_hash"], x.entry["epoch"]) == (e["spec_hash"], e["epoch"])}
            before = self.uploads.get(e["job"])
            cut = [e["replica"]] if killed else []
            if before and (before["spec_hash"], before["epoch"]) == (e["spec_hash"], e["epoch"]):
                ranks |= set(before["replicas"])
                cut += before.get("killed", [])
            self.uploads[e["job"]] = {"dir": path, "spec_hash": e["spec_hash"], "epoch": e["epoch"], "deadline": deadline,
                                      "replicas": sorted(ranks | {e["replica"]}), "world_size": e.get("world_size", 1),
                                      **({"killed": sorted(cut)} if cut else {})}

    def _upload_checkpoints(self) -> None:
        """Upload each job's checkpoint dir once none of its replicas here still runs (a gang's ranks write into one
        directory: an upload while one of them still checkpoints would take half its files)."""
        for job, due in list(self.uploads.items()):
            if any(r.handle is not None for (j, _), r in self.replicas.items() if j == job):
                continue
            del self.uploads[job]
            if due.get("killed"):
                # (what it held was certified by the manifest's sha256s, and its replacement resumed from a file cut
                # mid-write, newer than the last good upload)
                self._log(f"{job}: checkpoint not uploaded: {', '.join(f'{job}/{r}' for r in due['killed'])} killed at the end "
                          f"of its grace, maybe in the middle of writing it; its replacement resumes from the last complete upload")
                continue
            try:
                up = checkpoints.upload(self.bus.store, job, due["dir"], instance=self.instance, spec_hash=due["spec_hash"],
                                        epoch=due["epoch"], deadline=due["deadline"], log=self._log, progress=self._keepalive,
                                        replicas=due["replicas"], world_size=due["world_size"])
                if up.complete:
                    # (the assignment its round was restored for stays: a gang restarted in place after this upload,
                    # its lost peer's agent back, keeps what each rank wrote, as that peer's agent, which uploaded
                    # nothing, does; dropped, this rank went back to the round before and the peer kept its newer step)
                    was = (self._read_marker(job) or {}).get("at")
                    self._write_marker(job, [up.generation], was if was == [due["spec_hash"], due["epoch"]] else None)
                    checkpoints.prune(self.bus.store, job, log=self._log)
            except (ReconcileError, OSError) as err:
                if time.monotonic() < due["deadline"]:
                    # (a blip of the bus: dropped, the replacement resumed from an older upload with most of a notice
                    # left. Tried again each poll; the replica stays listed running till then, so a moved copy waits)
                    if not due.get("failed"):
                        self._log(f"{job}: checkpoint upload failed: {err}; tried again each poll until its deadline")
                    self.uploads[job] = {**due, "failed": str(err)}
                else:
                    self._log(f"{job}: checkpoint not uploaded: {err}")

    def _restore_checkpoint(self, job: str, path: Path, spec_hash: str | None, epoch: int | None = None,
                            world_size: int = 1) -> tuple[str, str] | None:
        """Before a replica starts: an empty or older local checkpoint dir is filled from the newest complete upload
        (of a job removed once, only one made since, or by the same job put back: `spec_hash`); a gang's, once per
        assignment, is made the gang's newest complete round (checkpoints.restore_round). Returns why the replica must
        not start, as (reason, message): the disk has no room for the restore, or it filled, or a file could not be put in
        place (checkpoints.NotRestoredError: the directory as it was, older than the upload)."""
        if not self.checkpoint_sync:
            return None
        try:
            got = checkpoints.restore(self.bus.store, job, path, marker=self._read_marker(job), log=self._log,
                                      progress=self._keepalive, spec_hash=spec_hash, epoch=epoch, world_size=world_size)
        except checkpoints.NotRestoredError as err:
            return "NoRoomForCheckpoint" if isinstance(err, checkpoints.NoRoomError) else "CheckpointNotRestored", str(err)
        except ReconcileError as err:
            # (the state backend failing its reads: started from what the directory holds, older or nothing, the replica
            # lost the training its upload holds, and its own next upload, newer, buried that one)
            return "CheckpointNotRestored", f"{job}: its uploaded checkpoints cannot be read ({err}): not started from what {path} holds"
        except OSError as err:
            self._log(f"{job}: checkpoint not restored: {err}; starting from what {path} holds")
            return None
        if got.marker is not None:
            # (unwritten: the next restore fetches this upload again)
            self._write_own(self._marker(job), json.dumps({**got.marker, "at_time": iso()}).encode(), again=False)
        elif got.generations:
            self._write_marker(job, got.generations)
        return None

    def _exited(self, rep: Replica, code: int | None, malformed: str | None = None) -> None:
        """The replica's command ended with `code` (None: unknown, its exit file `malformed`, which the message says)."""
        e = rep.entry
        rep.handle, rep.exit_code, rep.finished_at = None, code, iso()
        self._write_pids()
        job, r = rep.key
        how = "exit code unknown" if code is None else f"exit code {code}" if code >= 0 else f"killed by {signal_name(-code)}"
        how += f" ({malformed})" if malformed else ""
        policy = e.get("restart", {}).get("policy", "OnFailure")
        limit = e.get("restart", {}).get("backoff_limit", 3)
        why = self._gang_stopping(rep) if code == 0 else None
        if why:
            # (a gang whose ranks agree on a stop at a step, the stop flag reduced over the ranks, exits 0 on the peer's
            # signal, maybe before its own: that is the gang's stop, checkpointed, not a batch job that Succeeded)
            st = _Stop(time.monotonic(), "Starting", why[0], why[1], False, rep.attempt + 1 if why[0] == "GangPeerLost" else None)
            self._ended_as(rep, st, code)
            self._upload_due(rep, time.monotonic() + UPLOAD_MIN_S)
        elif e.get("mode", "batch") == "batch" and code == 0:
            rep.phase, rep.reason, rep.message, rep.terminal = "Succeeded", "Completed", how, True
        elif e.get("mode") == "service" and (code == 0 or policy == "OnFailure"):
            self._backoff(rep, how, None)
        elif policy == "OnFailure" and rep.attempt < limit:
            self._backoff(rep, how, limit)
        else:
            tail = masked(log_tail(self._log_path(rep), 5), own_secrets(e))
            reason = "BackoffLimitExceeded" if policy == "OnFailure" and limit > 0 else "Error"
            rep.phase, rep.reason, rep.terminal = "Failed", reason, True
            rep.message = f"{how} after {rep.attempt} restart(s); last lines: " + " | ".join(tail)
        self._log(f"{job}/{r}: attempt {rep.attempt - (0 if rep.terminal else 1)} ended: {how} -> {rep.phase} ({rep.reason})")

    def _backoff(self, rep: Replica, how: str, limit: int | None) -> None:
        if rep.started_mono and time.monotonic() - rep.started_mono >= self.backoff_reset:
            # (a service that crashed six times in a month waited the 5-minute cap after each crash; a run this long
            # says the last crash was not part of a loop. backoff_limit still counts every attempt, as a k8s Job's does)
            rep.backoff_from = rep.attempt
        rep.attempt += 1
        delay = min(MAX_BACKOFF_S, self.backoff * 2 ** (rep.attempt - 1 - rep.backoff_from))
        rep.next_start = time.monotonic() + delay
        rep.next_start_at = now_unix() + delay
        rep.phase, rep.reason = "Starting", "BackOff"
        rep.message = f"{how}; restart {rep.attempt}{f'/{limit}' if limit is not None else ''} in {delay:.1f}s"

    def _begin_stop(self, rep: Replica, phase: str, reason: str, message: str, terminal: bool, restart_attempt: int | None = None) -> None:
        ck = rep.entry.get("checkpoint")
        sig = getattr(signals, ck["signal"]) if ck else signals.SIGTERM
        grace = float(ck["grace_seconds"]) if ck else STOP_GRACE_S
        self._log(f"{rep.key[0]}/{rep.key[1]}: stopping ({reason}): {signals.Signals(sig).name}, {grace:g}s grace")
        rep.stop = _Stop(time.monotonic() + grace, phase, reason, message, terminal, restart_attempt)
        if rep.handle is not None:
            self._note_stop(rep, now_unix() + grace)
            self.runtime.signal(rep.handle, sig)

    @staticmethod
    def _ended_as(rep: Replica, st: _Stop, code: int | None) -> None:
        """The replica ended on stop `st` (its exit `code`): as that stop asked (and restarts at its attempt, a gang's)."""
        rep.exit_code, rep.finished_at = code, iso()
        rep.phase, rep.reason, rep.message, rep.terminal = st.phase, st.reason, st.message, st.terminal
        if st.restart_attempt is not None:
            rep.attempt, rep.next_start = st.restart_attempt, 0.0

    def _note_stop(self, rep: Replica, deadline_at: float) -> None:
        """The stop under way, in the replica's local record (before its signal): an agent that restarts in its grace
        ends the replica as this stop asks, not as its exit code alone would say (_adopt)."""
        doc = self.unsaved.get(rep.key)
        if doc is None:
            try:
                doc = json.loads(self._local(rep.key).read_text())
            except (OSError, ValueError):
                return
        st = rep.stop
        doc["stopping"] = {"phase": st.phase, "reason": st.reason, "message": st.message, "terminal": st.terminal,
                           "restart_attempt": st.restart_attempt, "deadline_at": deadline_at}
        self.unsaved[rep.key] = doc
        self._flush_local(rep.key)

    def _log_path(self, rep: Replica) -> Path:
        return replica_log(self.workdir, *rep.key)

    def _write_pids(self) -> None:
        """The replicas' process groups with their start times, so the sim can end them with the
        instance even after this agent is gone (and never hit a reused pid)."""
        lines = [f"{rep.handle.pid} {start_time(rep.handle.pid)}" for rep in self.replicas.values() if rep.handle is not None]
        self.pids_due = not self._write_own(self.workdir / "replicas.pids", "".join(f"{ln}\n" for ln in lines).encode())

    # -------------------------------------------------------------- writing the bus
    def _record(self, rep: Replica) -> dict:
        e = rep.entry
        return {
            "job": e["job"], "replica": e["replica"], "instance": self.instance, "spec_hash": e["spec_hash"], "epoch": e["epoch"],
            "attempt": rep.attempt, "restarts": rep.attempt, "backoff_from": rep.backoff_from, "phase": rep.phase, "reason": rep.reason, "message": rep.message,
            "terminal": rep.terminal, "exit_code": rep.exit_code, "started_at": rep.started_at, "finished_at": rep.finished_at,
            "world_size": e.get("world_size", 1), "master_addr": rep.env.get("MASTER_ADDR"),
            "log_path": str(self._log_path(rep)), "log_tail": masked(log_tail(self._log_path(rep)), own_secrets(e)),
            **({"next_start_at": rep.next_start_at} if rep.reason == "BackOff" and rep.next_start_at is not None else {}),
            # (a stop it survives, under way: its gang's peers stop with it at once, not once its checkpoint is written)
            **({"stopping": rep.stop.reason} if rep.stop is not None and rep.handle is not None and _survives(rep.stop) else {}),
        }

    def _last_report(self, rep: Replica) -> bool:
        """A replica's record as it leaves this agent, where not written yet (its end in the tick it is dropped, or it was
        backing off): its record said Starting (BackOff), or Running, for good. Only while the record on the bus is still
        this instance's: the agent the plan moved it to may have written its own. False while the store fails the read
        or the write (the replica is kept and this is tried again next poll: a store full or cut off at a spot notice
        left its record Running, and the notice was said handled once the store was back)."""
        if self.written.get(rep.key) == json.dumps(self._record(rep), sort_keys=True):
            return True
        try:
            now = self.bus.run(*rep.key)
        except CorruptBusObjectError:
            now = None  # (garbled: ours to write again, as a missing one)
        except ReconcileError as e:
            self._bus_failed(f"cannot read the run record of {rep.key[0]}/{rep.key[1]}", e)
            return False
        return self._write_run(rep) if now is None or now.get("instance") == self.instance else True

    def _write_run(self, rep: Replica, force: bool = False) -> bool:
        """The replica's run record on the bus (unless as last written); False when the write failed."""
        doc = self._record(rep)
        body = json.dumps(doc, sort_keys=True)
        if not force and self.written.get(rep.key) == body:
            return True
        try:
            self.bus.put_run(rep.key[0], rep.key[1], {**doc, "updated_at": iso()})
            self.written[rep.key] = body
            return True
        except ReconcileError as e:
            self._bus_failed(f"cannot write the run record of {rep.key[0]}/{rep.key[1]}", e)
            self.write_failed = self.bus_said
            return False

    def _publish(self, force: bool = False, state: str | None = None) -> None:
        for rep in self.replicas.values():
            self._write_run(rep)
        now = now_unix()
        running = self._running()
        if not force and now - self.last_beat < self.heartbeat and running == self.last_running:
            return  # a change in what runs is reported at once: an agent a replica moved to waits on it
        self._beat(now, running, state)

    def _running(self) -> list[str]:
        """What the heartbeat lists running: each replica whose process runs, and those whose checkpoint upload is still
        due (a moved copy waits for that, then restores the upload)."""
        due = {f"{job}/{r}" for job, up in self.uploads.items() for r in up["replicas"]}
        return sorted(due | {f"{j}/{r}" for (j, r), rep in self.replicas.items() if rep.running})

    def _keepalive(self) -> None:
        """The heartbeat, due, while a checkpoint's upload or restore runs (the loop waits for it: one longer than the
        stale limit, 60 s, made the instance look lost and its work placed again): what runs said as it was last said,
        so an agent a replica moved to still waits for the upload before it restores."""
        now = now_unix()
        if now - self.last_beat >= self.heartbeat:
            self._beat(now, list(self.last_running or []), None)
        if time.monotonic() - self.notice_asked >= self.poll:
            self._check_notice()

    def _strays_untracked(self) -> str | None:
        """Why some replica's orphans are not tracked here (the heartbeat's, StraysUntracked in status): no subreaper at
        all (strays_untracked), or replicas adopted under the shim of an agent version from before the subreaper, which
        stays theirs until they next start."""
        old = sorted(f"{j}/{r}" for (j, r), rep in self.replicas.items() if rep.handle is not None and not getattr(rep.handle, "subreaps", True))
        said = [self.strays_untracked] if self.strays_untracked else []
        if old and self.runtime.name == "process":
            said.append(f"{', '.join(old)} run under the shim of an earlier agent version, not their subreaper, until they next start")
        return "; ".join(said) or None

    def _beat(self, now: float, running: list[str], state: str | None) -> None:
        doc = {
            "instance": self.instance, "address": self.address, "pid": os.getpid(), "runtime": self.runtime.name,
            "state": state or ("Interrupting" if self.notice_seen else "Ready"), "notice": self.notice_seen,
            "heartbeat_at": now, "heartbeat": iso(now), "serial": (self.assignment or {}).get("serial", 0),
            "running": running, **({"write_failed": self.write_failed} if self.write_failed else {}),
            **({"workdir_failed": "; ".join(sorted(self.workdir_failed.values()))} if self.workdir_failed else {}),
            **({"strays_untracked": untracked} if (untracked := self._strays_untracked()) else {}),
        }
        try:
            self.bus.put_agent(self.instance, doc)
            self.last_beat, self.last_running = now, running
        except ReconcileError as e:
            self._bus_failed("cannot write the heartbeat", e)

    def _bus_failed(self, what: str, err: ReconcileError, then: str = "") -> None:
        """A read or write of the bus failed: logged when it differs from the last failure logged. (A failed write was
        never logged, and the next poll's successful read logged "the bus is reachable again", every poll.)"""
        said = f"{what}: {err}"
        if said != self.bus_said:
            self._log(said + then)
            self.bus_said = said
        self.bus_error = str(err)
