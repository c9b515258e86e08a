"""The simulated cloud: the embedded default provider.

It serves aws, gcp and azure from the shipped catalog, needs no credentials,
and keeps its whole world in .reconcile/sim/ (a snapshot and a journal) so a
demo, a test or a CI run can interrupt spot instances, exhaust zones and watch
the reconciler heal. Faults are part of the file, so they survive processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, ClassVar, Collection, Iterator, Sequence

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, AgentTarget, CreateRequest, Instance, Offering, PoolTarget, ProviderContext, Quota
from providers.catalog import load_catalog
from providers.placements import PlacementRecord, is_placement_key, placement_tags
from providers.files import loads_json, read_regular, read_regular_fd
from providers.errors import CapacityError, KeySpentError, OwnershipError, ProviderError, QuotaError, TransientProviderError
from providers.settings import flag
from providers.pids import descendants, marked, parents, running, start_time as _starttime, table  # (pid, start): a reused pid is never signalled

DEFAULT_GRACE_S = 10.0  # the agent's stop grace for a replica without a checkpoint spec (reconciler/runtime/agent.py)
SHUTDOWN_MARGIN_S = 10.0  # beyond the longest grace: the agent's poll and its own kill at the end of a grace

# What a shut-down instance's leftovers get: run detached, it waits until the agent and the replicas it
# started have ended, or until the deadline, then SIGKILLs whatever of them still runs (the sim's end of
# an OS shutdown). The apply that deleted the instance does not wait for this.
REAPER = r"""
import sys, time
from pathlib import Path
from providers.sim import _end_instance, _leftovers
d, deadline = Path(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline and _leftovers(d):
    time.sleep(0.2)
_end_instance(d)
"""

# In the environment of every agent the sim starts (the agent's directory, unique to the instance and the sim's store),
# hence of every process it starts that keeps its environment: with the agent's tree and its replicas' sessions, it
# names what runs on the instance, which ends with it.
VM_MARK = "FLEETOPS_SIM_VM"

_EMPTY = {"next_id": 1, "instances": {}, "keys": {},
          "faults": {"exhausted": [], "throttle": 0, "fail_after": None, "reject_every": None, "latency_ms": 0}, "calls": 0}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _kill_group(pid: int, started: str) -> None:
    if started and _starttime(pid) != started:
        return  # gone, or the pid now belongs to another process
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child (a test's): reap it
    except ChildProcessError:
        pass


PID_RECORD_LIMIT = 1 << 20  # agent.pid and replicas.pids: a line per process group


def _pid_records(d: Path) -> tuple[list[tuple[int, str]], list[str]]:
    """The agent of agent directory `d` and the replica process groups it recorded, as (pid, start time), and what
    of its records could not be read (a missing one is none: the agent never started, or started nothing)."""
    out, problems = [], []
    for f in (d / "agent.pid", d / "replicas.pids"):
        try:
            lines = read_regular(f, PID_RECORD_LIMIT).decode().splitlines()
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(f"cannot read {f}: {e.strerror}")
            continue
        except UnicodeDecodeError:
            lines = ["(not text)"]
        for n, line in enumerate(lines, 1):
            parts = line.split()
            if parts and parts[0].isdigit():
                out.append((int(parts[0]), parts[1] if len(parts) > 1 else ""))
            elif parts:
                problems.append(f"{f}:{n} is not 'PID START'")
    return out, problems


def _pid_lines(d: Path) -> list[tuple[int, str]]:
    return _pid_records(d)[0]


def _leftovers(d: Path) -> list[tuple[int, str]]:
    return [(pid, started) for pid, started in _pid_lines(d) if running(pid, started or _starttime(pid))]


def _instance_processes(d: Path, found: list[tuple[int, str]], frozen: dict[int, str]) -> dict[int, str]:
    """What runs on the instance of agent directory `d` and is not in `frozen` yet, as pid -> start time: its agent
    and the replicas' shims (`found`, their records), whatever is in their sessions or process groups, carries the
    instance's mark (VM_MARK), or descends from any of these (a stray that left its replica's group and cleared its
    environment is still its shim's, the subreaper of its tree). Never this process."""
    procs = table()
    # A recorded leader that runs, or is gone: the kernel reuses no pid while a group or session of that id has a member,
    # so what is left in a gone shim's group is still its replica's. (A line without its start time may name a pid
    # reused since: only its group is killed, in _end_instance, as before.)
    leaders = {pid for pid, started in found if started and (running(pid, started) or _starttime(pid) in ("", started))}
    roots = {pid for pid in leaders if pid in procs} | set(marked(VM_MARK, str(d.resolve()))) | set(frozen)
    roots |= {p for p, (_, pgrp, sid) in procs.items() if pgrp in leaders or sid in leaders}
    children = parents(procs)
    out = {p: _starttime(p) for p in roots}
    for p in roots:
        out.update(descendants(p, children))
    return {p: s for p, s in out.items() if p not in frozen and p != os.getpid() and s}


def _end_instance(d: Path) -> tuple[list[str], dict[int, str]]:
    """End everything the instance of agent directory `d` runs, as a VM's stop does: its agent, the replicas' shims and
    what they started, in their groups or not (the sim ended the recorded process groups only, and a replica's process
    that had left its group ran on after its instance was gone). Each is stopped (SIGSTOP: it can fork no more) until
    none is left unfound, then all are SIGKILLed. Returns what of its records could not be read, and what was killed."""
    if not d.exists():
        return [], {}  # (no agent was ever started for it: nothing of it runs)
    found, problems = _pid_records(d)
    frozen: dict[int, str] = {}
    for _ in range(50):  # (a fixpoint in a few rounds: a stopped process starts nothing)
        new = _instance_processes(d, found, frozen)
        if not new:
            break
        for pid, started in new.items():
            if running(pid, started):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
        frozen.update(new)
    for pid, started in frozen.items():
        _kill_one(pid, started)
    for pid, started in found:  # (a group's members were found and killed above; its leader's record, if its own)
        _kill_group(pid, started)
    return problems, frozen


def _kill_one(pid: int, started: str) -> None:
    if running(pid, started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # our own child (a test's): reap it


def _longest_grace(d: Path) -> float:
    """The longest stop grace of the replicas the agent in `d` started (its local records name their entries)."""
    graces = [DEFAULT_GRACE_S]
    for f in sorted((d / "replicas").glob("*.json")) if (d / "replicas").is_dir() else []:
        try:
            ck = loads_json(f.read_text())["entry"].get("checkpoint")
            graces.append(float(ck["grace_seconds"]) if ck and ck.get("grace_seconds") is not None else DEFAULT_GRACE_S)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return max(graces)


def _alive(pidfile: Path) -> bool:
    try:
        parts = pidfile.read_text().split()
    except OSError:
        return False
    if not parts or not parts[0].isdigit():
        return False
    pid = int(parts[0])
    return running(pid, parts[1] if len(parts) > 1 else _starttime(pid))


class _Tracked(dict):
    """A dict that remembers the keys a caller read or wrote, so a call journals only those."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.touched: set[str] = set()

    def __getitem__(self, k):
        self.touched.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        if k in self:
            self.touched.add(k)
        return super().get(k, default)

    def __setitem__(self, k, v) -> None:
        self.touched.add(k)
        super().__setitem__(k, v)

    def setdefault(self, k, default=None):
        self.touched.add(k)
        return super().setdefault(k, default)

    def values(self):
        self.touched.update(self.keys())
        return super().values()

    def items(self):
        self.touched.update(self.keys())
        return super().items()


_TRACKED = ("instances", "keys")
_CACHE: dict[Path, tuple[tuple, int, dict]] = {}  # snapshot path -> (its stat, journal bytes read, world)
MAX_SNAPSHOT_BYTES = 1 << 30  # a bound on what is read: 10k instances are a few MB
COMPACT_BYTES = 4 << 20  # the journal is folded into the snapshot once it is this big (and bigger than the snapshot)
# Folded so, the journal holds at most about the snapshot's bytes and one call's line (no larger than the world): a
# bound on what is read, as the snapshot's is.
MAX_JOURNAL_BYTES = 2 * MAX_SNAPSHOT_BYTES


class SimCloud:
    """The simulated world: file-backed, safe against concurrent processes.

    A snapshot (cloud.json) and a journal of the instances and keys each call touched
    (cloud.journal, one JSON line per call, folded into the snapshot now and then): a call
    costs what it touches, not the whole world, so a 10k-instance apply is not quadratic.
    Each process keeps the world it last saw and reads only what others appended since."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir) / "sim"
        self.path = self.dir / "cloud.json"
        self.journal = self.dir / "cloud.journal"

    def _stamp(self) -> tuple:
        with self._io(self.path, "read"):
            try:
                st = self.path.stat()
            except FileNotFoundError:
                return ()
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self, write: bool) -> dict:
        """The world as the files say (under the lock), from the cache where they did not change."""
        stamp = self._stamp()
        cached = _CACHE.get(self.path)
        if cached is not None and cached[0] == stamp:
            _, offset, data = cached
        else:
            data = self._read_snapshot() if stamp else json.loads(json.dumps(_EMPTY))
            for k in _TRACKED:
                data[k] = _Tracked(data.get(k, {}))
            offset = 0
        with self._io(self.journal, "read"):
            size = self.journal.stat().st_size if self.journal.exists() else 0
        if size < offset:  # folded by another process after our snapshot stamp was taken: read all again
            _CACHE.pop(self.path, None)
            return self._load(write)
        if offset == 0 and data.get("journal") is not None:
            offset = self._check_header(data["journal"], size)
            size = max(size, offset)
        elif not stamp and size:
            self._check_genesis(size)
        if size > offset:
            tail = self._read_journal(offset)
            end = tail.rfind(b"\n") + 1  # a line cut short by a killed process is not a call that happened
            for n, line in enumerate(tail[:end].splitlines()):
                try:
                    entry = loads_json(line)
                    if not isinstance(entry, dict) or not all(isinstance(entry.get(k, {}), dict) for k in (*_TRACKED, "top")):
                        raise ValueError("not a journal entry")
                    changed = entry.get("instances", {})
                    problem = _records_problem(changed, entry.get("keys", {}), entry.get("top", {}),
                                               lambda i: changed[i] if i in changed else dict.get(data["instances"], i))
                    if problem:
                        raise ValueError(problem)
                    self._replay(data, entry)
                except (ValueError, TypeError, AttributeError) as e:
                    _CACHE.pop(self.path, None)
                    raise self._corrupt(self.journal, f"entry {n + 1} after byte {offset} is garbled ({e})") from None
            offset += end
            if write and end < len(tail):
                with self._io(self.journal, "write"):
                    os.truncate(self.journal, offset)
        _CACHE[self.path] = (stamp, offset, data)
        return data

    def _check_header(self, token: str, size: int) -> int:
        """Where the journal's entries start. The snapshot names the journal begun with it (`journal`), whose first
        line is a header with that name: a journal missing or empty then lost every call since the snapshot
        (instances would silently vanish), and is refused. A journal of another name is the one an earlier fold
        replaced (a crash between the two renames): everything in it is in the snapshot already."""
        head = b""
        if size:
            with self._io(self.journal, "read"), open(self.journal, "rb") as f:
                head = f.readline(4096)
        if not head:
            _CACHE.pop(self.path, None)
            raise ProviderError(
                f"{self.journal}: the simulated cloud's journal is {'empty' if self.journal.exists() else 'missing'}, but "
                f"{self.path} says one was begun with it (journal {token}): the calls made since that snapshot (instances "
                f"created, deleted, interrupted) are lost. Nothing was changed. Restore {self.journal.name} from a backup, or "
                f"delete {self.dir} to start an empty simulated cloud (every simulated instance is then gone, and the next "
                "apply creates the fleet again).")
        try:
            first = loads_json(head) if head.endswith(b"\n") else None
        except ValueError:
            first = None
        if first == {"journal": token}:
            return len(head)
        if not isinstance(first, dict) or not (set(first) == {"journal"} or set(first) <= {*_TRACKED, "top"}):
            _CACHE.pop(self.path, None)
            raise self._corrupt(self.journal, f"its first line is not the header of journal {token}")
        self._begin_journal(token)  # under the lock; what the old one held is in the snapshot
        return len(self._header(token))

    def _check_genesis(self, size: int) -> None:
        """A journal without its snapshot. The first call writes the snapshot right after its journal line, and every
        snapshot begins a journal with a header naming it: a journal of that first line alone (a kill between the
        two writes) rebuilds the world by itself; one with a header, or more calls, continued a snapshot that is
        gone, and reading it over an empty world would silently drop the instances the snapshot held."""
        lines = self._read_journal().split(b"\n")[:-1]  # whole lines only (a cut last line is not a call)
        try:
            first = loads_json(lines[0]) if lines else None
        except ValueError:
            first = None  # garbled: replaying it names the line
        if not isinstance(first, dict):
            return
        top = first.get("top") if isinstance(first.get("top"), dict) else {}
        numbered = top.get("next_id", 1)
        first_call = ("journal" not in first and len(lines) == 1 and isinstance(first.get("instances", {}), dict)
                      and isinstance(numbered, int) and numbered - 1 <= len(first.get("instances", {})))
        if first_call:
            return
        _CACHE.pop(self.path, None)
        begun = f" (journal {first['journal']})" if isinstance(first.get("journal"), str) else ""
        raise ProviderError(
            f"{self.path}: the simulated cloud's snapshot is missing, but {self.journal}{begun} continues one: the "
            f"instances recorded in the snapshot would silently vanish (and the next plan replace them). Nothing was "
            f"changed. Restore {self.path.name} from a backup, or delete {self.dir} to start an empty simulated cloud "
            "(every simulated instance is then gone, and the next apply creates the fleet again).")

    @staticmethod
    def _header(token: str) -> bytes:
        return (json.dumps({"journal": token}) + "\n").encode()

    def _begin_journal(self, token: str) -> None:
        """A new journal holding only its header, in place of the old one at once (never a moment without a header)."""
        tmp = self.journal.with_suffix(".tmp")
        with self._io(self.journal, "write"):
            tmp.write_bytes(self._header(token))
            os.replace(tmp, self.journal)

    @contextlib.contextmanager
    def _io(self, path: Path, verb: str) -> Iterator[None]:
        """An OS error on one of the sim's files as what it is (permissions, a directory where the file belongs), naming the file."""
        try:
            yield
        except OSError as e:
            raise ProviderError(f"{path}: cannot {verb} the simulated cloud's record: {e.strerror or e}. Nothing in it was "
                                f"changed; make {path} a file this user can read and write.") from None

    def _corrupt(self, path: Path, problem: str) -> ProviderError:
        return ProviderError(
            f"{path}: the simulated cloud's record is corrupt: {problem}. Nothing was changed. It is the sim's whole "
            f"world (its instances); restore it, or delete {self.dir} to start an empty simulated cloud (every simulated "
            "instance is then gone, and the next apply creates the fleet again).")

    def _bad_faults(self, problem: str) -> ProviderError:
        """Faults are saved in the journal's last line once there is one, else in the snapshot (a journal of its
        header line alone holds no call)."""
        calls = self.journal.exists() and self._read_journal().count(b"\n") > 1
        where = self.journal if calls else self.path
        return ProviderError(
            f"{where}: the simulated cloud's injected faults are invalid: {problem}. Nothing was changed. Set it again "
            "with `reconcile sim fault`, `reconcile sim exhaust ZONE --restore` or `reconcile sim quota NAME --cloud C "
            f"--remove`, or delete {self.dir} to start an empty simulated cloud.")

    def _read_journal(self, offset: int = 0) -> bytes:
        """The journal from `offset`: a regular file (a fifo would block the read for ever) of at most
        MAX_JOURNAL_BYTES, refused unread above it (read whole, a 3 GiB one was taken into memory)."""
        with self._io(self.journal, "read"):
            fd = os.open(self.journal, os.O_RDONLY | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode):
                    if st.st_size > MAX_JOURNAL_BYTES:
                        raise self._corrupt(self.journal, f"it is larger than {MAX_JOURNAL_BYTES >> 20} MiB, which no sim writes")
                    os.lseek(fd, offset, os.SEEK_SET)
            except BaseException:
                os.close(fd)
                raise
            return read_regular_fd(fd, MAX_JOURNAL_BYTES, self.journal)  # (closes it; a fifo or device refused there)

    def _read_snapshot(self) -> dict:
        with self._io(self.path, "read"):
            raw = read_regular(self.path, MAX_SNAPSHOT_BYTES)  # (a fifo at its name hung every command)
        if len(raw) > MAX_SNAPSHOT_BYTES:
            raise self._corrupt(self.path, f"it is larger than {MAX_SNAPSHOT_BYTES >> 20} MiB, which no sim writes")
        try:
            data = loads_json(raw)
        except ValueError as e:
            raise self._corrupt(self.path, f"not valid JSON ({e})") from None
        shapes = {"instances": dict, "keys": dict, "next_id": int, "faults": dict}
        if not isinstance(data, dict) or any(not isinstance(data.get(k), t) for k, t in shapes.items()) or \
                not all(isinstance(i, dict) and isinstance(i.get("tags"), dict) and "state" in i for i in data["instances"].values()) or \
                not isinstance(data.get("journal", ""), str):
            raise self._corrupt(self.path, "it is not a snapshot of instances, keys, next_id and faults")
        problem = _records_problem(data["instances"], data["keys"], data, data["instances"].get)
        if problem:
            raise self._corrupt(self.path, problem)
        return data

    @staticmethod
    def _replay(data: dict, entry: dict) -> None:
        for k in _TRACKED:
            for key, v in entry.get(k, {}).items():
                if v is None:
                    dict.pop(data[k], key, None)
                else:
                    dict.__setitem__(data[k], key, v)
        data.update(entry.get("top", {}))

    def _save(self, data: dict) -> None:
        entry = {k: {key: dict.get(data[k], key) for key in data[k].touched} for k in _TRACKED}
        entry["top"] = {k: v for k, v in data.items() if k not in _TRACKED and k != "journal"}  # the snapshot's, not a call's
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        with self._io(self.journal, "write"):
            fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one write: a killed process leaves a whole line or a cut one (ignored)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        stamp = self._stamp()
        if not stamp or (size > COMPACT_BYTES and size > stamp[2]):
            # The snapshot, then a new journal under the name the snapshot gives it: a crash between the two
            # renames leaves the old journal, whose calls are all in the snapshot (and is told apart by its name).
            data["journal"] = os.urandom(8).hex()
            tmp = self.path.with_suffix(".tmp")
            with self._io(self.path, "write"):
                tmp.write_text(json.dumps(data, separators=(",", ":")))
                os.replace(tmp, self.path)
            self._begin_journal(data["journal"])
            stamp, size = self._stamp(), len(self._header(data["journal"]))
        _CACHE[self.path] = (stamp, size, data)

    @contextlib.contextmanager
    def world(self, write: bool = True, check: bool = True) -> Iterator[dict]:
        """The world under the lock. `check`: refuse one whose faults are invalid (the commands that set faults
        pass False, so they can also set right a value written by hand)."""
        lock_path = self.dir / "cloud.lock"
        with contextlib.ExitStack() as held:
            with self._io(lock_path, "lock"):
                self.dir.mkdir(parents=True, exist_ok=True)
                lock = held.enter_context(open(lock_path, "a+"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = self._load(write)
            except (OSError, ValueError, ProviderError):
                _CACHE.pop(self.path, None)
                raise
            problem = _fault_problem(data.get("faults")) if check else None
            if problem:
                raise self._bad_faults(problem)
            for k in _TRACKED:
                data[k].touched.clear()
            try:
                yield data
            finally:  # also on error: injected faults count down even when a call fails
                if write:
                    self._save(data)

    # -- faults, for tests and demos ------------------------------------------------
    def interrupt(self, instance_id: str, reason: str = "spot-interruption", notice_seconds: float | None = None) -> dict:
        """Reclaim an instance. If a node agent runs on it, it gets a notice first (as a spot
        instance gets its two-minute warning) and up to `notice_seconds` to checkpoint."""
        notice_seconds = sim_notice_seconds(notice_seconds)  # (a bad setting is refused before any notice is written)
        with self.world(write=False) as w:
            inst = w["instances"].get(instance_id)
            if inst is None or inst["state"] == "terminated":
                raise ProviderError(f"sim: no live instance {instance_id!r}")
        outcome = self.deliver_notice(instance_id, reason, notice_seconds) if self.agent_alive(instance_id) else None
        with self.world() as w:
            inst = w["instances"].get(instance_id)
            if inst is None:
                raise ProviderError(f"sim: no live instance {instance_id!r}")
            # Terminated during its notice (a controller replaced it on the notice, as it should): there is nothing left
            # to reclaim, as for a cloud reclaiming an instance already gone. It raised "no live instance", and the
            # controller test failed so under load whenever the replacement's apply beat the notice's end.
            gone = inst["state"] == "terminated"
            if not gone:
                inst["state"], inst["terminated_reason"] = "terminated", reason
        not_ended = self.stop_agent(instance_id)
        # not_ended: what of the instance's records could not be read, or still runs (stop_agent);
        # checkpointed: True once its agent reported its replicas checkpointed and stopped, False when it did not (the
        # notice ran out first, or its agent died during it: notice says which; they were killed mid-checkpoint), None
        # without an agent alive; terminated_during_notice: the instance was gone before the reclaim (its
        # terminated_reason says by what)
        return {**inst, "checkpointed": None if outcome is None else outcome == "checkpointed", "notice": outcome,
                "terminated_during_notice": gone, "not_ended": not_ended}

    def agent_target(self, instance_id: str) -> tuple[Path, str | None] | None:
        """The config dir and state URL the instance's agent was started with (start_agent), or None."""
        try:
            doc = loads_json((self.agent_dir(instance_id) / "target.json").read_text())
            return Path(doc["config_dir"]), doc.get("state_url")
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # -- node agents: one `reconcile agent` process per instance that has work to run ------
    def agent_dir(self, instance_id: str) -> Path:
        return self.dir / "agents" / instance_id

    def disk_dir(self, instance_id: str) -> Path:
        """The instance's own disk: its checkpoints live under `checkpoints/` there, as on a cloud instance's disk, so a
        replica moved to another instance finds them only through the state backend (reconciler/runtime/checkpoints)."""
        return self.dir / "disks" / instance_id

    def agent_alive(self, instance_id: str) -> bool:
        return _alive(self.agent_dir(instance_id) / "agent.pid")

    def start_agent(self, instance_id: str, config_dir: Path, state_url: str | None) -> bool:
        """Start the instance's agent, detached (the apply returns at once). Once only: an agent that
        died is a lost node, which the reconciler replaces; it is not quietly restarted here."""
        d = self.agent_dir(instance_id).resolve()  # the agent's records name its logs: absolute paths
        if (d / "agent.pid").exists():
            return False
        d.mkdir(parents=True, exist_ok=True)
        (d / "target.json").write_text(json.dumps({"config_dir": str(Path(config_dir).resolve()), "state_url": state_url}))
        cmd = [sys.executable, "-m", "reconciler.cli", "agent", instance_id, "--dir", str(config_dir), "--runtime", "process",
               "--notice", "sim", "--address", "127.0.0.1", "--workdir", str(d), "--cwd", str(config_dir),
               "--checkpoint-root", str(self.disk_dir(instance_id).resolve() / "checkpoints")]
        if state_url:
            cmd += ["--state", state_url]
        with open(d / "agent.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, VM_MARK: str(d)})
        (d / "agent.pid").write_text(f"{proc.pid} {_starttime(proc.pid)}\n")
        return True

    def deliver_notice(self, instance_id: str, reason: str, notice_seconds: float | None = None) -> str:
        """Write the notice the agent polls for and wait until it reports its replicas checkpointed
        and stopped (notice.done), or `notice_seconds` (default 120, a spot warning's length), or it dies. Returns
        "checkpointed", "ran out" or "agent died" (an agent that died in the notice had not checkpointed: this said
        "checkpointed" of it, and `sim interrupt` gave no warning)."""
        limit = time.monotonic() + sim_notice_seconds(notice_seconds)
        d = self.agent_dir(instance_id)
        (d / "notice.json").write_text(json.dumps({"reason": reason, "time": _now()}))
        while time.monotonic() < limit:
            if (d / "notice.done").exists():
                return "checkpointed"
            if not self.agent_alive(instance_id):
                return "checkpointed" if (d / "notice.done").exists() else "agent died"
            time.sleep(0.1)
        return "ran out"

    def stop_agent(self, instance_id: str) -> list[str]:
        """The instance is gone: its agent and every replica process it started go with it. Returns what could not
        be done: a record that could not be read (what it names may still run), a process still running."""
        d = self.agent_dir(instance_id)
        problems, ended = _end_instance(d)
        limit = time.monotonic() + 2  # (a SIGKILL is delivered, not awaited)
        while (still := [pid for pid, started in ended.items() if running(pid, started)]) and time.monotonic() < limit:
            time.sleep(0.05)
        return problems + ([f"{instance_id}'s process(es) {', '.join(map(str, still))} still run"] if still else [])

    def shut_down_agent(self, instance_id: str) -> None:
        """The instance shuts down, as a cloud's termination does: its agent (a system service) gets SIGTERM
        and stops its replicas with their checkpoint signal and grace; whatever still runs after the longest
        grace plus a margin is killed by a detached reaper. Returns at once (the instance is shutting down).
        With no agent alive, or no replica running, nothing needs the grace: everything ends now."""
        d = self.agent_dir(instance_id)
        parts = (d / "agent.pid").read_text().split() if self.agent_alive(instance_id) else []
        if not parts or not [p for p in _leftovers(d) if p[0] != int(parts[0])]:
            self.stop_agent(instance_id)
            return
        subprocess.Popen([sys.executable, "-c", REAPER, str(d.resolve()), str(_longest_grace(d) + SHUTDOWN_MARGIN_S)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            os.kill(int(parts[0]), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all_agents(self) -> None:
        """ProviderError naming what could not be done, once every agent that could be stopped is."""
        problems = []
        for d in sorted((self.dir / "agents").glob("*")) if (self.dir / "agents").is_dir() else []:
            problems += self.stop_agent(d.name)
        if problems:
            raise ProviderError("sim: not every agent could be stopped: " + "; ".join(problems))

    def exhaust(self, zone: str, instance_type: str | None = None, market: str | None = None, restore: bool = False,
                zones: Collection[str] | None = None) -> None:
        """Mark a zone (one type, one market: None is any) out of capacity, or restore it. `zones`: the zones a
        launch can go to (None: the catalog's); another zone, type or market is refused, as it would never match."""
        if not restore:
            catalog = load_catalog()
            known = set(zones) if zones is not None else set()
            known |= {z for regions in catalog.regions.values() for r in regions.values() for z in r.get("zones", ())}
            if zone not in known:
                raise ProviderError(f"sim: no region has zone {zone!r} (zones: {', '.join(sorted(known))})")
            if instance_type is not None and not any(t == instance_type for _, t in catalog.shapes):
                raise ProviderError(f"sim: unknown instance type {instance_type!r} (not in the price catalog)")
            if market not in (None, *MARKETS):
                raise ProviderError(f"sim: market {market!r} is not spot or on-demand")
        entry = {"zone": zone, "instance_type": instance_type, "market": market}
        with self.world(check=False) as w:
            ex = [e for e in w["faults"]["exhausted"] if e != entry]
            w["faults"]["exhausted"] = ex if restore else ex + [entry]

    def set_fault(self, **faults) -> None:
        """throttle, latency_ms: 0 or more; fail_after, reject_every: 0 or more, or None (cleared)."""
        problem = _fault_problem({**faults, "exhausted": [], "quotas": []})
        if problem:
            raise ProviderError(f"sim: {problem.removeprefix('faults.')}")
        with self.world(check=False) as w:
            w["faults"].update(faults)

    def set_quota(self, name: str, cloud: str, region: str, unit: str, limit: float, market: str | None = None,
                  gpu_type: str | None = None, instance_types: Sequence[str] | None = None, remove: bool = False) -> None:
        """An account quota, as a cloud keeps one: every live instance in the world that matches counts against it
        (the fleet's, other fleets', planted ones), and a launch past it fails with a QuotaError. region "" covers
        every region of the cloud; unit is vCPUs, GPUs or instances; market, gpu_type and instance_types narrow
        what counts (None: any)."""
        entry = {"name": name, "cloud": cloud, "region": region, "unit": unit, "limit": float(limit), "market": market,
                 "gpu_type": gpu_type, "instance_types": sorted(instance_types) if instance_types else None}
        problem = None if remove else _quota_problem(entry)
        if problem:
            raise ProviderError(f"sim: quota {name!r}: {problem}")
        with self.world(check=False) as w:
            kept = [q for q in w["faults"].get("quotas", []) if (q["cloud"], q["region"], q["name"]) != (cloud, region, name)]
            w["faults"]["quotas"] = kept if remove else kept + [entry]

    def plant(self, cloud: str, region: str, zone: str, instance_type: str, tags: dict[str, str], market: str = "on-demand") -> str:
        """Add an instance the reconciler did not create (a colleague's, another fleet's)."""
        with self.world() as w:
            iid = self._new_id(w, cloud)
            w["instances"][iid] = dict(id=iid, cloud=cloud, region=region, zone=zone, instance_type=instance_type, market=market, state="running", tags=tags, launched_at=_now())
            return iid

    def instances(self) -> list[dict]:
        """Copies: the world itself stays as the files say."""
        with self.world(write=False, check=False) as w:
            return json.loads(json.dumps(list(w["instances"].values())))

    @staticmethod
    def _new_id(w: dict, cloud: str) -> str:
        n = w["next_id"]
        w["next_id"] = n + 1
        return f"sim-{cloud}-{n:05d}"

    @staticmethod
    def exhausted(w: dict, zone: str, instance_type: str, market: str) -> bool:
        return any(
            e["zone"] == zone and e["instance_type"] in (None, instance_type) and e["market"] in (None, market)
            for e in w["faults"]["exhausted"]
        )


SIM_QUOTA_UNITS = ("vCPUs", "GPUs", "instances")
SIM_CLOUDS = ("aws", "gcp", "azure")
MARKETS = ("spot", "on-demand")


def _count(v, least: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


_INSTANCE_FIELDS = ("id", "cloud", "region", "zone", "instance_type", "market", "state")


def _records_problem(instances: dict, keys: dict, top: dict, known: Callable[[str], object]) -> str | None:
    """What is wrong with records of the world (a snapshot's, or those one journal entry changes; None: nothing), read
    back by every call: a field missing or mistyped was an `unexpected KeyError` far from the file. `known`: the record
    of an instance a key may name (a key is never forgotten, nor its instance: the sim remembers both for ever)."""
    for iid, d in instances.items():
        if d is None:  # (a journal entry's way of saying the record is gone)
            continue
        if not isinstance(d, dict):
            return f"instances.{iid} is not an object"
        for name in _INSTANCE_FIELDS:
            if name not in d:
                return f"instances.{iid}.{name} is missing"
            if not isinstance(d[name], str):
                return f"instances.{iid}.{name} is {json.dumps(d[name])[:40]}, not a string"
        if d["id"] != iid:
            return f"instances.{iid}.id is {d['id']!r}, not its own id"
        tags = d.get("tags")
        if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
            return f"instances.{iid}.tags is not a map of strings"
        for name in ("launched_at", "placement_group", "terminated_reason"):
            if d.get(name) is not None and not isinstance(d[name], str):
                return f"instances.{iid}.{name} is {json.dumps(d[name])[:40]}, not a string"
    for key, iid in keys.items():
        if iid is not None and (not isinstance(iid, str) or not isinstance(known(iid), dict)):
            return f"keys.{key} names {json.dumps(iid)[:40]}, which it has no record of"
    for name in ("next_id", "calls", "creates_seen"):
        if name in top and not _count(top[name]):
            return f"{name} is {json.dumps(top[name])[:40]}, not a count"
    groups = top.get("placement_groups", {})
    if not isinstance(groups, dict) or not all(isinstance(z, str) for z in groups.values()):
        return "placement_groups is not a map of group -> zone"
    return None


def _fault_problem(f) -> str | None:
    """What is wrong with the faults of a world (None: nothing). A value `reconcile sim` refuses is refused here too,
    as one written into the file by hand: a NaN quota limit made every later plan fail with a bare ValueError."""
    if not isinstance(f, dict):
        return "faults is not an object"
    for key in ("throttle", "latency_ms"):
        v = f.get(key, 0)
        if not (_count(v) or isinstance(v, float) and math.isfinite(v) and v >= 0):
            return f"faults.{key} is {v!r}, not a number 0 or more"
    for key in ("fail_after", "reject_every"):
        if f.get(key) is not None and not _count(f[key]):
            return f"faults.{key} is {f[key]!r}, not a whole number 0 or more (or null)"
    ex = f.get("exhausted", [])
    for n, e in enumerate(ex if isinstance(ex, list) else [None]):
        if not (isinstance(e, dict) and isinstance(e.get("zone"), str) and isinstance(e.get("instance_type"), (str, type(None)))
                and e.get("market") in (None, *MARKETS)):
            return f"faults.exhausted[{n}] is {e!r}, not a zone with an optional instance_type and market (spot or on-demand)"
    qs = f.get("quotas", [])
    for n, q in enumerate(qs if isinstance(qs, list) else [None]):
        problem = _quota_problem(q) if isinstance(q, dict) else "is not an object"
        if problem:
            return f"faults.quotas[{n}] {problem}"
    return None


def _quota_problem(q: dict) -> str | None:
    limit = q.get("limit")
    if not isinstance(q.get("name"), str) or not isinstance(q.get("region"), str):
        return "has no name or region"
    if q.get("cloud") not in SIM_CLOUDS:
        return f"cloud {q.get('cloud')!r} is not one of {', '.join(SIM_CLOUDS)}"
    if q.get("unit") not in SIM_QUOTA_UNITS:
        return f"unit {q.get('unit')!r} is not one of {', '.join(SIM_QUOTA_UNITS)}"
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not (math.isfinite(limit) and limit >= 0):
        return f"limit {limit!r} is not a number 0 or more"
    if q.get("market") not in (None, *MARKETS):
        return f"market {q.get('market')!r} is not spot or on-demand"
    types = q.get("instance_types")
    if not isinstance(q.get("gpu_type"), (str, type(None))) or not (types is None or isinstance(types, list) and all(isinstance(t, str) for t in types)):
        return "gpu_type or instance_types is not a name (or a list of names)"
    return None


def sim_notice_seconds(given: float | None) -> float:
    """How long a reclaimed instance's agent gets to checkpoint: `given`, else FLEETOPS_SIM_NOTICE_SECONDS, else 120 (a
    spot warning's length). A setting that is no number of seconds 0 or more is an error (float() crashed on it)."""
    if given is not None:
        return given
    raw = os.environ.get("FLEETOPS_SIM_NOTICE_SECONDS")
    if raw is None:
        return 120.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ProviderError(f"sim: FLEETOPS_SIM_NOTICE_SECONDS={raw!r} must be a number of seconds, 0 or more")
    return value


def _sim_quota_units(q: dict, catalog, cloud: str, region: str, instance_type: str, market: str) -> float:
    """Units one instance counts against a sim quota (0: it does not count)."""
    shape = catalog.shape(cloud, instance_type)
    if q["cloud"] != cloud or (q["region"] and q["region"] != region) or (q["market"] and q["market"] != market) or shape is None:
        return 0.0
    if q["instance_types"] and instance_type not in q["instance_types"] or q["gpu_type"] and shape.gpu_type != q["gpu_type"]:
        return 0.0
    return {"vCPUs": float(shape.cpu), "GPUs": float(shape.gpus), "instances": 1.0}[q["unit"]]


def _sim_quota_used(w: dict, q: dict, catalog) -> float:
    return sum(_sim_quota_units(q, catalog, d["cloud"], d["region"], d["instance_type"], d["market"])
               for d in w["instances"].values() if d["state"] in ("pending", "running"))


class SimProvider:
    """Provider protocol over SimCloud."""

    name = "sim"
    placement_groups: ClassVar[bool] = True  # launches into a gang's group and reports it (base.keeps_placement_groups)
    OPTIONS: ClassVar[dict] = {}  # it takes no `-o` options (faults and quotas are set with `reconcile sim ...`)

    def __init__(self, ctx: ProviderContext):
        self.ctx = ctx
        self.cloud = SimCloud(ctx.state_dir)
        self.catalog = load_catalog()

    def _call(self, w: dict) -> None:
        """Account one API call and apply the injected faults that every call can hit."""
        f = w["faults"]
        w["calls"] += 1
        if f.get("latency_ms"):
            time.sleep(f["latency_ms"] / 1000)
        if f.get("throttle", 0) > 0:
            f["throttle"] -= 1
            raise TransientProviderError("sim: RequestLimitExceeded (throttled)")
        if f.get("fail_after") is not None:
            if f["fail_after"] <= 0:
                raise TransientProviderError("sim: injected failure (timeout)")
            f["fail_after"] -= 1

    def _to_instance(self, d: dict) -> Instance:
        return Instance(
            id=d["id"], provider=self.name, cloud=d["cloud"], region=d["region"], zone=d["zone"],
            instance_type=d["instance_type"], market=d["market"], state=d["state"],
            pool=d["tags"].get(TAG_POOL, ""), tags=dict(d["tags"]), launched_at=d.get("launched_at", ""),
            placement_group=d.get("placement_group") or "",  # (as AWS reports Placement.GroupName)
        )

    def observe(self, pools: Sequence[PoolTarget]) -> list[Instance]:
        with self.cloud.world(write=False) as w:
            return [
                self._to_instance(d) for d in w["instances"].values()
                if d["tags"].get(TAG_FLEET) == self.ctx.fleet and d["state"] != "terminated"  # (the observer judges any other state)
            ]

    def offerings(self, pools: Sequence[PoolTarget]) -> list[Offering]:
        """Catalog offerings. Like a real cloud, the sim does not advertise exhausted
        capacity: an exhausted zone is discovered when a create fails."""
        out: dict[tuple, Offering] = {}
        for p in pools:
            for z in p.zones:
                for t in p.instance_types:
                    o = self.catalog.offering(p.cloud, p.region, z, t)
                    if o is not None:
                        out[(p.cloud, z, t)] = o
        return list(out.values())

    def _raise_quota_command(self, q: dict) -> str:
        """The `reconcile sim quota` that raises this quota, run as printed: its DIR and every narrowing it was set with
        (`sim quota` replaces the whole entry, so one without --market or --type counted every type and market)."""
        narrowing = [f"--market {q['market']}"] if q.get("market") else []
        narrowing += [f"--gpu-type {shlex.quote(q['gpu_type'])}"] if q.get("gpu_type") else []
        narrowing += [f"--type {shlex.quote(t)}" for t in q.get("instance_types") or ()]
        return " ".join([f"reconcile sim quota {shlex.quote(q['name'])} {shlex.quote(str(self.ctx.state_dir.parent))}",
                         f"--cloud {q['cloud']} --region {shlex.quote(q['region'])} --unit {q['unit']}", *narrowing, "--limit <more>"])

    def quotas(self, pools: Sequence[PoolTarget]) -> list[Quota]:
        """The quotas `reconcile sim quota` set, with what the world's live instances use of them now."""
        with self.cloud.world(write=False) as w:
            out = []
            for q in w["faults"].get("quotas", []):
                counts = sorted({(t, m, u) for p in pools for t in p.instance_types for m in ("on-demand", "spot")
                                 if (u := _sim_quota_units(q, self.catalog, p.cloud, p.region, t, m))})
                if counts:
                    out.append(Quota(cloud=q["cloud"], region=q["region"], name=q["name"], unit=q["unit"], limit=q["limit"],
                                     used=_sim_quota_used(w, q, self.catalog), counts=tuple(counts),
                                     how_to_raise=self._raise_quota_command(q)))
            return out

    def _check_quotas(self, w: dict, request: CreateRequest) -> None:
        p = request.pool
        for q in w["faults"].get("quotas", []):
            units = _sim_quota_units(q, self.catalog, p.cloud, p.region, request.instance_type, request.market)
            used = _sim_quota_used(w, q, self.catalog) if units else 0.0
            if units and used + units > q["limit"] + 1e-9:
                raise QuotaError(f"sim: QuotaExceeded: {request.market} {request.instance_type} in {request.zone} needs "
                                 f"{units:g} {q['unit']}; {used:g} of {q['limit']:g} are used",
                                 cloud=p.cloud, quota=q["name"], region=q["region"] or "all regions",
                                 how_to_raise=self._raise_quota_command(q))

    def create(self, request: CreateRequest) -> Instance:
        with self.cloud.world() as w:
            existing = w["keys"].get(request.key)
            if existing is not None:  # idempotent retry: the same key never makes a second instance
                d = w["instances"][existing]
                asked = (request.pool.cloud, request.zone, request.instance_type, request.market)
                if (d["cloud"], d["zone"], d["instance_type"], d["market"]) != asked:
                    # As EC2 answers a ClientToken reused with other parameters: an error, never the other launch's
                    # instance (apply tries the next attempt's key, as on AWS).
                    raise KeySpentError(f"sim: IdempotentParameterMismatch: key {request.key} was used for another launch "
                                        f"({d['market']} {d['instance_type']} in {d['zone']})")
                return self._to_instance(d)
            self._call(w)
            every = w["faults"].get("reject_every")
            if every:  # a partial batch failure: every n-th launch is refused, the others succeed
                w["creates_seen"] = w.get("creates_seen", 0) + 1
                if w["creates_seen"] % every == 0:
                    raise ProviderError(f"sim: InvalidParameterValue: launch {w['creates_seen']} rejected (injected reject_every={every})")
            p = request.pool
            if self.catalog.offering(p.cloud, p.region, request.zone, request.instance_type) is None:
                raise ProviderError(f"sim: {request.instance_type} is not offered in {p.cloud}/{request.zone}")
            self._check_quotas(w, request)
            if self.cloud.exhausted(w, request.zone, request.instance_type, request.market):
                raise CapacityError(
                    f"sim: InsufficientCapacity for {request.market} {request.instance_type} in {request.zone}",
                    cloud=p.cloud, zone=request.zone, instance_type=request.instance_type, market=request.market,
                )
            if request.placement_group:  # a cluster placement group lives in one zone, as on AWS
                groups = w.setdefault("placement_groups", {})
                zone = groups.setdefault(request.placement_group, request.zone)
                if zone != request.zone:
                    raise ProviderError(f"sim: placement group {request.placement_group} is in {zone}, not {request.zone}")
            iid = self.cloud._new_id(w, p.cloud)
            placed = placement_tags(request.placements) if request.placements is not None else {}
            tags = {**request.tags, **placed, TAG_CREATE_KEY: request.key}
            w["instances"][iid] = dict(
                id=iid, cloud=p.cloud, region=p.region, zone=request.zone, instance_type=request.instance_type,
                market=request.market, state="running", tags=tags, launched_at=_now(), max_price=request.max_price,
                placement_group=request.placement_group,
            )
            w["keys"][request.key] = iid
            return self._to_instance(w["instances"][iid])

    def _owned(self, w: dict, instance: Instance, verb: str) -> dict | None:
        """The live instance, checked to be this fleet's before we `verb` it (one API call);
        None if it is already gone. Raises OwnershipError for anyone else's instance."""
        d = w["instances"].get(instance.id)
        if d is None or d["state"] == "terminated":
            return None
        if d["tags"].get(TAG_FLEET) != self.ctx.fleet:
            raise OwnershipError(f"sim: refusing to {verb} {instance.id}: it is not owned by fleet {self.ctx.fleet!r}")
        self._call(w)
        return d

    def delete(self, instance: Instance) -> None:
        with self.cloud.world() as w:
            d = self._owned(w, instance, "delete")
            if d is not None:
                d["state"], d["terminated_reason"] = "terminated", "deleted-by-reconciler"
        self.cloud.shut_down_agent(instance.id)  # its replicas get their checkpoint signal and grace

    def ensure_agent(self, instance: Instance, target: AgentTarget) -> None:
        """One agent process per instance with work, unless FLEETOPS_SIM_AGENTS=0 (most tests)."""
        if flag("FLEETOPS_SIM_AGENTS"):
            self.cloud.start_agent(instance.id, target.config_dir, target.state_url)

    def record_placements(self, instance: Instance, record: PlacementRecord) -> None:
        """Replace the instance's placement tags in the world file, as AWS does with CreateTags."""
        with self.cloud.world() as w:
            d = self._owned(w, instance, "tag")
            if d is not None:
                d["tags"] = {**{k: v for k, v in d["tags"].items() if not is_placement_key(k)}, **placement_tags(record)}
