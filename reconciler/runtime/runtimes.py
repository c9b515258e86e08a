"""How an agent starts and stops a replica: `process` (a local subprocess: the sim and bare-metal
hosts) or `docker` (a container with the replica's GPUs, on cloud instances)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal as signals
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from providers.files import read_regular
from providers import pids
from providers.pids import descendants, running, start_time, table
from providers.redact import credential_name


class StartError(Exception):
    """The replica could not be started at all (no such command, no docker): retrying cannot help."""


def exec_problem(command: object, env: object) -> str | None:
    """Why no process can be started with this command and environment, or None: exec takes a list of C strings
    (no NUL) and NAME=value strings. The config refuses these, but an older bus can hold one, and Popen's ValueError or
    TypeError killed the whole agent. Values are not echoed (an environment holds tokens)."""
    if not isinstance(command, (list, tuple)) or not command:
        return f"run.command is {type(command).__name__ if command else 'empty'}, not a non-empty list of arguments"
    for i, arg in enumerate(command):
        if not isinstance(arg, str) or "\0" in arg:
            what = "holds a NUL character (\\0)" if isinstance(arg, str) else f"is {type(arg).__name__}"
            return f"run.command[{i}] {what}: exec takes strings without NUL"
    if not isinstance(env, dict):
        return f"run.env is {type(env).__name__}, not a mapping of names to strings"
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            return f"run.env has a variable name {k!r} no environment can hold"
        if not isinstance(v, str) or "\0" in v:
            what = "holds a NUL character (\\0)" if isinstance(v, str) else f"is {type(v).__name__}, not a string"
            return f"run.env.{k} {what}"
    return None


def _checked(launch: "Launch", cwd: bool = True) -> None:
    """StartError for a launch no process can be started with (its command, environment, or working directory)."""
    problem = exec_problem(launch.command, launch.env)
    if problem is not None:
        raise StartError(problem)
    if cwd and launch.workdir is not None and not Path(launch.workdir).is_dir():
        raise StartError(f"the command's working directory {launch.workdir} is gone (not a directory)")


@dataclass(frozen=True)
class Launch:
    """One attempt of one replica, as the agent asks a runtime to start it."""

    name: str  # fleetops-<job>-<replica>-<attempt>: unique on the host
    command: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    image: str | None = None
    gpus: tuple[str, ...] = ()  # the plan's GPU indices (or MIG device ids) on this instance
    checkpoint_dir: str | None = None  # where the command sees its checkpoints
    checkpoint_host_dir: Path | None = None  # where they live on the host (the same for `process`)
    workdir: Path | None = None
    extra: dict = field(default_factory=dict)
    exit_path: Path | None = None  # the shim writes the exit code here (see SHIM); None: no shim


# The signals an agent sends a replica's process group (its stop's, the checkpoint signal's) that the shim outlives.
FORWARDED = (signals.SIGTERM, signals.SIGINT, signals.SIGHUP, signals.SIGUSR1, signals.SIGUSR2, signals.SIGQUIT)


# The replica's shim: it runs the command as its child and writes the exit code to a file, so an agent
# that restarted (a crash, `systemctl restart`) can adopt a replica it did not start and still learn how
# it ended (only a parent can wait for a process). Signals sent to the replica's process group reach the
# command; the shim outlives them (its handlers do nothing) and, once the command ended, ends as it did
# (the same exit code, or the same signal). `python -S`: no site-packages, about 20 ms.
# None of them is lost in the replica's first moments (before, one that came before the command's exec, ~10-40 ms, a
# stop's SIGTERM just after the start, was swallowed by the shim's handler, in the shim or in its child, and the replica
# ran on to its grace's end): they are blocked (FORWARDED) from before the shim runs (the agent starts it so) until the
# fork; the child waits until the shim has passed on what it got before the fork (only the shim had it; what came since
# reached the child too), then restores their default action and unblocks them just before its exec: one pending then
# ends it as it would the command (killed by that signal). A fork that fails (EAGAIN, ENOMEM) is an ordinary failure
# (exit code 1, restarted after its backoff), its reason in the replica's log.
# It is also the child subreaper of the command's tree (prctl PR_SET_CHILD_SUBREAPER, Linux 3.4; skipped where refused):
# a process of the tree whose parent exits is re-parented to the shim, not to init, so every process the replica
# started stays in the shim's tree however it hides (setsid, an emptied environment: no FLEETOPS_REPLICA_ID), found by
# its ancestry (`descendants`), and reaped by the shim (a container's init may reap nothing: zombies piled up). Once
# the command ended, the shim ends what is left of its tree (its process group's with SIGKILL at once, the rest with
# SIGTERM, then SIGKILL GRACE s later), and only then writes its exit file and exits: the agent sees the replica (and its GPUs) released once nothing of it runs, and the shims of many
# replicas ending at once (a spot notice) wait out their strays' grace side by side, never the agent's loop. The
# subreaper lives in the shim, not in the agent: the agent's restart (a crash, systemd) must not cut the tie between
# an orphan and its replica, nor must the agent reap children it did not start (a Popen's wait, its exit code).
SHIM = r"""
import json, os, signal, sys, time
out, grace, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
FWD = {@FORWARDED@}
signal.pthread_sigmask(signal.SIG_BLOCK, FWD)  # (blocked already: the agent starts the shim so, _forwarded_blocked)
for s in FWD:
    signal.signal(s, lambda n, f: None)
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
r, w = os.pipe()
go, gone = os.pipe()
try:
    pid = os.fork()
except OSError as e:  # (EAGAIN, ENOMEM: no process now; an ordinary failure, restarted after its backoff, no StartError)
    print(f"fleetops shim: cannot fork to start {cmd[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
    pid = -1
if pid == 0:
    os.close(r)
    os.close(gone)
    os.read(go, 1)  # (EOF: the shim has passed on what it got before the fork)
    for s in (*FWD, signal.SIGPIPE, signal.SIGXFSZ):  # (Python ignores SIGPIPE and SIGXFSZ; exec keeps what is ignored)
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FWD)  # a signal pending now ends it as it would the command (SIG_DFL)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        os.write(w, f"cannot start {cmd[0]!r}: {e.strerror}".encode())
        os._exit(127)
os.close(w)
os.close(go)
if pid > 0:  # what came before the fork reached the shim alone: the child's now (it waits, blocked, until `gone` closes)
    for s in signal.sigpending() & FWD:
        os.kill(pid, s)
os.close(gone)
signal.pthread_sigmask(signal.SIG_UNBLOCK, FWD)  # (what is pending here now reached the child too: dropped)
err = b""
while chunk := os.read(r, 4096):
    err += chunk
code = None if pid > 0 else 1
while code is None:  # the command, and the orphans of its tree this shim adopted meanwhile (reaped: no zombies)
    got, status = os.waitpid(-1, 0)
    if got == pid:
        code = os.waitstatus_to_exitcode(status)

def tree():
    kids = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # (no /proc: not Linux, nothing to find)
        names = []
    for n in names:
        try:
            with open("/proc/" + n + "/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(st[1]), []).append((int(n), st[0]))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [os.getpid()]
    while todo:
        for p, state in kids.get(todo.pop(), ()):
            todo.append(p)
            if state != "Z":
                found.append(p)
    return found

def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass

limit, termed = time.monotonic() + grace, set()
while True:
    reap()
    left, now = tree(), time.monotonic()
    if not left or now > limit + 5:  # (one stuck in the kernel: the agent's end_group and end_strays follow)
        reap()  # (one that died since the reap above is a zombie, not in `left`: init may never reap it)
        break
    for p in left:
        try:  # (its process group's at once, as a container's end does; what left the group had no signal yet)
            if now >= limit or os.getpgid(p) == os.getpid():
                os.kill(p, signal.SIGKILL)
            elif p not in termed:
                os.kill(p, signal.SIGTERM)
                termed.add(p)
        except OSError:
            pass
    time.sleep(0.02)
doc = {"code": code, **({"error": err.decode(errors="replace")} if err else {})}
if err:
    print(doc["error"], file=sys.stderr, flush=True)
with open(out + ".tmp", "w") as f:  # (last: once it is there, nothing of the replica runs)
    json.dump(doc, f)
os.replace(out + ".tmp", out)
if code < 0:
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code if code >= 0 else 128 - code)
""".replace("@FORWARDED@", ", ".join(f"signal.{s.name}" for s in FORWARDED))


@contextmanager
def _forwarded_blocked():
    """FORWARDED blocked in this thread while it starts a shim, which inherits the mask (fork and exec keep it): a stop's
    signal in the shim's own first ~20 ms (Python's start, before the shim blocks them itself) waits for the shim, which
    passes it on to its command, instead of killing the shim before it forked (no exit file: an agent that adopts the
    replica then reads it as killed). A signal meant for the agent meanwhile goes to another of its threads or waits."""
    old = signals.pthread_sigmask(signals.SIG_BLOCK, FORWARDED)
    try:
        yield
    finally:
        signals.pthread_sigmask(signals.SIG_SETMASK, old)


def shimmed(launch: Launch, command: list[str]) -> list[str]:
    if launch.exit_path is None:
        return command
    launch.exit_path.parent.mkdir(parents=True, exist_ok=True)
    launch.exit_path.unlink(missing_ok=True)
    return [sys.executable, "-S", "-c", SHIM, str(launch.exit_path), str(STRAY_GRACE_S), *command]


EXIT_RECORD_LIMIT = 4096  # the shim writes {"code": n} and at most a strerror: more is not its file


def exit_code_problem(code: object) -> str | None:
    """Why `code` is not an exit code as the shim reports one (0..255, or minus a signal's number), or None."""
    if not isinstance(code, int) or isinstance(code, bool):
        return f"its code is {type(code).__name__}, not a number"
    if not (0 <= code <= 255 or 0 < -code < signals.NSIG):
        return f"its code {code} is no exit status (0..255) nor a signal (-1..-{signals.NSIG - 1})"
    return None


def exit_record(path: Path | None) -> dict | None:
    """What the shim wrote when the command ended: {"code": n} (negative: killed by that signal),
    with "error" when the command could not be started at all. None: not ended, or killed with its shim. A file that is
    not the shim's (a job, or a failing disk, can leave anything there; read to EXIT_RECORD_LIMIT bytes only):
    {"code": None, "malformed": why}, the how of its end unknown."""
    if path is None:
        return None
    try:
        raw = read_regular(path, EXIT_RECORD_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as e:
        return {"code": None, "malformed": f"its exit file {path} cannot be read: {e.strerror}"}
    doc, problem = None, f"it is larger than the shim writes (over {EXIT_RECORD_LIMIT} bytes)"
    if len(raw) <= EXIT_RECORD_LIMIT:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError; a deep nest of brackets recurses)
            problem = "it is not JSON"
        else:
            problem = "it is not a mapping" if not isinstance(doc, dict) else exit_code_problem(doc.get("code")) \
                or ("its error is not text" if not isinstance(doc.get("error", ""), str) else None)
    if problem is not None:
        return {"code": None, "malformed": f"its exit file {path} is not the shim's: {problem}"}
    return doc


@dataclass
class Detached:
    """A replica an earlier agent on this host started: not this process's child, so it is watched
    through /proc (its pid with the recorded start time) and its shim's exit file."""

    pid: int
    started: str
    exit_path: Path
    name: str = ""  # the container, for the docker runtime
    replica_id: str | None = None  # the mark in its environment (REPLICA_ID): what left its process group is found by it
    kill_begun: float | None = None  # (monotonic) when runtime.begin_kill began its kill
    subreaps: bool = True  # its shim is the subreaper of its tree (shim_subreaps): not one of an earlier agent version
    strays: "StrayEnd | None" = None  # its shim ended: the end of what it left outside its group (ProcessRuntime.poll)
    forced: dict[int, str] | None = None  # its tree when its shim was killed (ProcessRuntime.force_kill): ended with its strays

    def poll(self) -> int | None:
        if running(self.pid, self.started):
            return None
        rec = exit_record(self.exit_path)
        return rec["code"] if rec and rec["code"] is not None else -signals.SIGKILL  # it died with its shim: killed

    def signal(self, sig: int) -> None:
        if running(self.pid, self.started):
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        while running(self.pid, self.started) and time.monotonic() < limit:
            time.sleep(0.05)


def end_group(pid: int, started: str | None = None) -> None:
    """Kill what a replica whose shim (`pid`, the leader of its process group) has ended left running in that group:
    its children (a launcher's workers, a data loader) ran on, on its GPUs, beside the restart the agent started, and
    nothing ever ended them; a container's end ends every process in it. Never another group: the kernel does not reuse
    a pid while a group of that id has a member, so a process at `pid` now is the shim itself (its zombie, `started`)
    or, where it differs, a new one whose group is not the replica's (left alone)."""
    if started is not None and start_time(pid) not in ("", started):
        return
    try:
        os.killpg(pid, signals.SIGKILL)
    except (ProcessLookupError, PermissionError):  # no member left
        pass


# A process replica's mark, unique to its attempt, in its environment: every process it starts inherits it, also one that
# leaves its process group (setsid, setpgid: a daemonising launcher, a data server), which the group's kill misses (the
# way Jenkins' ProcessTreeKiller finds a build's strays). Only a process that clears its environment on exec loses it.
REPLICA_ID = "FLEETOPS_REPLICA_ID"
STRAY_GRACE_S = 2.0  # a stray of an ended replica: SIGTERM, then this long before SIGKILL (its shim waits, not the agent)
KILL_MARGIN_S = 3.0  # beyond STRAY_GRACE_S: how long a killed replica's shim may take to end its tree before it is killed too


PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # linux/prctl.h (Linux 3.4)


def subreaper_problem() -> str | None:
    """Why a replica's shim cannot be the child subreaper of its command's tree here (not Linux, no libc prctl, a
    seccomp filter refusing it), or None. Asked with PR_GET_CHILD_SUBREAPER, which changes nothing."""
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return f"prctl(PR_GET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError, ImportError) as e:
        return f"no prctl: {e}"
    return None


def marked(replica_id: str) -> dict[int, str]:
    """The processes whose environment carries `REPLICA_ID=replica_id` exactly, as pid -> start time."""
    return pids.marked(REPLICA_ID, replica_id)


class StrayEnd:
    """The end of what an ended replica left running outside its process group: the processes carrying its mark
    (`replica_id`) and `known` (its descendants, taken before its kill), each named by pid and start time (a pid reused
    since is left alone): SIGTERM now, SIGKILL `grace` s later, given up 1 s after that (a process stuck in the kernel).
    `done` says whether it is over and never waits, so the strays of replicas ending together end side by side. Never
    this agent itself."""

    def __init__(self, replica_id: str | None, known: dict[int, str] | None = None, grace: float = STRAY_GRACE_S):
        found = {**(known or {}), **(marked(replica_id) if replica_id else {})}
        self.live = {p: s for p, s in found.items() if p != os.getpid() and s and running(p, s)}
        self.kill_at, self.killed_at = time.monotonic() + grace, None
        self._send(signals.SIGTERM)

    def _send(self, sig: int) -> None:
        for p, s in self.live.items():
            if running(p, s):
                try:
                    os.kill(p, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def done(self) -> bool:
        self.live = {p: s for p, s in self.live.items() if running(p, s)}
        now = time.monotonic()
        if self.live and self.killed_at is None and now >= self.kill_at:
            self._send(signals.SIGKILL)
            self.killed_at = now
        return not self.live or self.killed_at is not None and now >= self.killed_at + 1.0


def end_strays(replica_id: str | None, known: dict[int, str] | None = None, grace: float = STRAY_GRACE_S) -> None:
    """StrayEnd, waited for."""
    end = StrayEnd(replica_id, known, grace)
    while not end.done():
        time.sleep(0.02)


def shim_subreaps(pid: int) -> bool:
    """Whether the shim at `pid` is one that makes itself the subreaper of its command's tree (SHIM): one an earlier
    agent version started (before 961505c) is not, and leaves what its command started outside its group to the agent."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return True  # (gone: nothing of it left to track)
    script = args[args.index(b"-c") + 1] if b"-c" in args[:-1] else b""
    return b"PR_SET_CHILD_SUBREAPER" in script


def end_tree(shim: int, started: str | None = None) -> None:
    """Begin the kill of a replica whose shim (`shim`, `started`) still runs; returns at once. SIGKILL to every process
    of its tree in its process group but the shim (they had the stop signal and its grace), SIGTERM to the rest of
    the tree (out of the group, e.g. after setsid: it had no signal yet). The command dead, the shim, the subreaper of
    the tree, ends what is left of it (see SHIM), reaps it and exits: the strays of replicas
    killed together end side by side, while the agent's loop goes on."""
    if started is not None and not running(shim, started):
        return
    tree = descendants(shim)
    if not tree:  # (its command not forked yet: the shim alone, which would start it after this kill)
        try:
            os.killpg(shim, signals.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    for p in tree:
        try:
            os.kill(p, signals.SIGKILL if os.getpgid(p) == shim else signals.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


def adopt(pid: int, started: str, exit_path: Path, name: str = "", replica_id: str | None = None) -> Detached | None:
    """The replica an earlier agent recorded, if that very process still runs (a pid reused since has
    another start time); None when it has ended (its exit file then says how)."""
    if not (started and running(pid, started)):
        return None
    return Detached(pid, started, exit_path, name, replica_id, subreaps=shim_subreaps(pid))


def unrecorded_shim(replica_id: str | None) -> tuple[int, str] | None:
    """The shim of an attempt whose agent died between its start and the record of its pid (the local record, written
    before the start, holds the attempt's mark, REPLICA_ID, which the shim and all it starts carry), as (pid, start
    time); None when none runs. The shim is the oldest process carrying the mark and leads its own session (started
    with start_new_session); an oldest one that does not (its shim is gone, the command or a stray runs on) is none."""
    found = marked(replica_id) if replica_id else {}
    if not found:
        return None
    pid, started = min(found.items(), key=lambda kv: (int(kv[1]) if kv[1].isdigit() else 1 << 62, kv[0]))
    _, group, session = table().get(pid, (0, 0, 0))
    return (pid, started) if started and pid == group == session else None


class Handle(Protocol):
    pid: int


class Runtime(Protocol):
    name: str

    def start(self, launch: Launch) -> Handle: ...

    def poll(self, handle: Handle) -> int | None:
        """The exit code once the replica has ended, else None."""
        ...

    def signal(self, handle: Handle, sig: int) -> None: ...

    def kill(self, handle: Handle) -> None:
        """End the replica and what it started; returns once it has ended."""
        ...

    def begin_kill(self, handle: Handle) -> None:
        """Begin `kill` and return at once: `poll` says when the replica has ended."""
        ...

    def force_kill(self, handle: Handle) -> None:
        """Begin the last step of `kill`, for a replica `begin_kill` did not end within its margin (STRAY_GRACE_S +
        KILL_MARGIN_S): its shim killed too; returns at once, `poll` says when it has ended."""
        ...

    def end_left(self, pid: int, started: str, replica_id: str | None) -> "StrayEnd | None":
        """Begin to kill what a replica that ended while no agent watched it (shim `pid`, `started`) left running;
        what is returned (StrayEnd) says when that is over."""
        ...


def _prepare(launch: Launch) -> None:
    """The directories a replica writes before it starts: its checkpoints' (on the host) and its log's."""
    if launch.checkpoint_host_dir is not None:
        launch.checkpoint_host_dir.mkdir(parents=True, exist_ok=True)
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)


def _log(path: Path):
    return open(path, "ab", buffering=0)


def replica_env(env: dict[str, str]) -> dict[str, str]:
    """A process replica's environment: the agent's without its credentials, and the replica's own (run.env and the
    agent's RANK, WORLD_SIZE...). The sim starts its agents from `reconcile apply`'s environment, and a job that
    printed its own handed the operator's keys to its log tail, hence to status/; a container gets only run.env."""
    return {**{k: v for k, v in os.environ.items() if not credential_name(k)}, **env}


def _strays(handle: "ReplicaProcess | Detached") -> StrayEnd:
    """The end of what a replica whose shim ended left running: its mark's, and, its shim killed (force_kill), its tree
    as it was then (SIGKILL at once: it had its SIGTERM at the kill's beginning)."""
    if handle.forced is None:
        return StrayEnd(handle.replica_id)
    return StrayEnd(handle.replica_id, handle.forced, grace=0.0)


class ReplicaProcess(subprocess.Popen):
    """A replica's shim this agent started, with its mark (REPLICA_ID, from its launch's environment)."""

    replica_id: str | None = None
    kill_begun: float | None = None  # (monotonic) when ProcessRuntime.begin_kill began its kill
    subreaps = True  # (this agent's shim)
    strays: StrayEnd | None = None  # its shim ended: the end of what it left outside its group (ProcessRuntime.poll)
    forced: dict[int, str] | None = None  # its tree when its shim was killed (ProcessRuntime.force_kill): ended with its strays


class ProcessRuntime:
    """The command as a local process in its own session (so signals reach its whole tree), under its shim (SHIM: the
    subreaper of its tree, which ends what is left of it before it exits), and, at its end, what it still left running:
    in its process group (end_group), or outside it, by its mark or as its descendant (end_strays)."""

    name = "process"

    def start(self, launch: Launch) -> ReplicaProcess:
        _checked(launch)
        exe = launch.command[0]
        if os.sep in exe:  # a path: as the child resolves it, from its working directory (the sim's: the config dir)
            found = os.access(Path(launch.workdir or ".") / exe, os.X_OK)
        else:
            found = shutil.which(exe, path=launch.env.get("PATH", os.environ.get("PATH"))) is not None
        if not found and os.sep in exe:
            raise StartError(f"command {exe!r} not found or not executable (in {Path(launch.workdir or '.').resolve()})")
        if not found:
            raise StartError(f"command {exe!r} not found (PATH={launch.env.get('PATH', os.environ.get('PATH', ''))})")
        try:
            _prepare(launch)
            with _log(launch.log_path) as log, _forwarded_blocked():
                proc = ReplicaProcess(shimmed(launch, list(launch.command)), env=replica_env(launch.env), stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, cwd=launch.workdir, start_new_session=True)
        except OSError as e:  # not executable, a bad interpreter line, a directory it cannot write
            raise StartError(f"cannot start {exe!r}: {e.strerror}{f' ({e.filename})' if e.filename else ''}") from None
        proc.replica_id = launch.env.get(REPLICA_ID)
        return proc

    def poll(self, handle: ReplicaProcess | Detached) -> int | None:
        """The exit code once the replica's shim has ended and what it left running is gone: in its process group
        (end_group, at once), and outside it, by its mark (StrayEnd: their grace is waited out over later polls, not
        here; a shim that is their subreaper has ended them already)."""
        if isinstance(handle, Detached):
            code = handle.poll()
            if code is not None and handle.strays is None:
                end_group(handle.pid, handle.started)
                handle.strays = _strays(handle)
            return code if code is None or handle.strays.done() else None
        if handle.returncode is None:
            try:  # (ended, not reaped yet: its pid is not reused while the group is ended)
                ended = os.waitid(os.P_PID, handle.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                ended = False
            if ended and handle.strays is None:
                end_group(handle.pid)
                handle.strays = _strays(handle)
            if ended and not handle.strays.done():
                return None
        return handle.poll()

    def signal(self, handle: ReplicaProcess | Detached, sig: int) -> None:
        if isinstance(handle, Detached):
            handle.signal(sig)
        elif self.poll(handle) is None:  # (an end seen here ends its group too)
            try:
                os.killpg(handle.pid, sig)
            except (ProcessLookupError, PermissionError):  # gone, or a zombie group's pid reused: nothing of ours to signal
                pass

    def begin_kill(self, handle: ReplicaProcess | Detached) -> None:
        """The replica's tree killed (end_tree); its shim ends what is left of it and exits, `poll` then says so."""
        if self.poll(handle) is None:
            if handle.kill_begun is None:
                handle.kill_begun = time.monotonic()
            end_tree(handle.pid, handle.started if isinstance(handle, Detached) else None)

    def force_kill(self, handle: ReplicaProcess | Detached) -> None:
        """The kill's last step, begun, for a shim that has not ended its tree KILL_MARGIN_S past the strays' grace (its
        command left the group and ignores SIGTERM, a process stuck in the kernel): SIGKILL to its process group and to
        its tree as it is now (`forced`: what left the group, whose subreaper dies with the shim); returns at once.
        `poll` ends what is left with its strays (StrayEnd, SIGKILL at once, given up 1 s later: one stuck in the kernel)
        over later polls. The agent's loop waited for it (`kill`): 1 s per replica with a process SIGKILL cannot end,
        one after another, and 10 s more, every tick, for such a shim; the heartbeat and every other stop held up."""
        if self.poll(handle) is None:
            handle.forced = descendants(handle.pid)
            self.signal(handle, signals.SIGKILL)
            for p, started in handle.forced.items():
                if running(p, started):
                    try:
                        os.kill(p, signals.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass

    def kill(self, handle: ReplicaProcess | Detached) -> None:
        """begin_kill, and the wait for the shim to end the tree, up to KILL_MARGIN_S past the strays' grace from the
        kill's beginning (a kill begun ticks ago waits no longer). A shim that has not ended it by then (its command
        left the group and ignores SIGTERM, a process stuck in the kernel) is killed with its process group (force_kill);
        then what the replica left outside it is ended: its descendants as they were before the kill (a stray that
        cleared its environment, still under the replica's tree) and its mark's (end_strays)."""
        tree = descendants(handle.pid) if self.poll(handle) is None else {}
        self.begin_kill(handle)
        limit = (handle.kill_begun or time.monotonic()) + STRAY_GRACE_S + KILL_MARGIN_S
        while self.poll(handle) is None and time.monotonic() < limit:
            time.sleep(0.02)
        stuck = self.poll(handle) is None
        if stuck:
            self.force_kill(handle)
            if isinstance(handle, Detached):
                handle.wait(10)
            else:
                try:
                    handle.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
                    pass
        end_strays(handle.replica_id, tree, grace=0.0 if stuck else STRAY_GRACE_S)  # (stuck: the tree had its SIGTERM)

    def end_left(self, pid: int, started: str, replica_id: str | None) -> StrayEnd | None:
        """What a replica that ended while no agent watched it left in its process group (killed now) and outside it
        (StrayEnd, begun: the agent waits for those of every such replica side by side), as at an end this agent saw
        (poll). Only a recorded shim (a pid and its start time): killpg(0) is this agent's own group."""
        if pid > 0 and started:
            end_group(pid, started)
            return StrayEnd(replica_id)
        return None


MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)\s]+)\)")
GPU_LINE = re.compile(r"^GPU\s+(\d+):")


def parse_mig_list(text: str) -> dict[int, list[tuple[str, str]]]:
    """`nvidia-smi -L` -> GPU index -> its MIG devices as (profile, UUID), in the order listed. Both
    UUID forms: MIG-<uuid> (driver R470+) and MIG-GPU-<uuid>/<gi>/<ci> (R450)."""
    out: dict[int, list[tuple[str, str]]] = {}
    gpu = None
    for line in text.splitlines():
        if m := GPU_LINE.match(line):
            gpu = int(m.group(1))
            out[gpu] = []
        elif (m := MIG_LINE.match(line)) and gpu is not None:
            out[gpu].append((m.group(1), m.group(3)))
    return out


def mig_uuids(devices: tuple[str, ...], layout: list[str], listing: str | None) -> tuple[str, ...] | None:
    """The MIG UUIDs of the plan's devices (`G:M`: GPU G's M-th device of the instance's layout) on this
    host, matched by profile: the k-th `2g.20gb` of the layout on a GPU is the k-th one nvidia-smi lists
    there (same-profile devices are interchangeable; the driver's own numbering is not the layout's).
    None without nvidia-smi (the sim): the indices stand. A GPU not partitioned as the pool says is a
    StartError: the replica must not run on devices the plan did not give it."""
    if listing is None:
        return None
    have = parse_mig_list(listing)
    out = []
    for dev in devices:
        g, m = (int(x) for x in dev.split(":"))
        profile = layout[m]
        ordinal = layout[:m].count(profile)
        mine = [u for p, u in have.get(g, []) if p == profile]
        if ordinal >= len(mine):
            listed = ", ".join(p for p, _ in have.get(g, [])) or "no MIG devices"
            raise StartError(f"GPU {g} has {len(mine)} MIG device(s) of profile {profile}, the instance's layout {'/'.join(layout)} "
                             f"needs {layout.count(profile)} (nvidia-smi -L lists: {listed}); partition the GPUs with that layout")
        out.append(mine[ordinal])
    return tuple(out)


def nvidia_smi_list() -> str | None:
    """`nvidia-smi -L` on this host, or None where there is none (the sim, CPU hosts)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StartError(f"nvidia-smi -L failed: {e}") from None
    if out.returncode != 0:
        raise StartError(f"nvidia-smi -L failed (exit {out.returncode}): {out.stderr.strip()[:200]}")
    return out.stdout


def docker_gpus(gpus: tuple[str, ...]) -> str:
    """`--gpus` value for these devices: docker wants the quotes when there is a comma."""
    return f'"device={",".join(gpus)}"'


def docker_command(launch: Launch) -> list[str]:
    """The `docker run` of one replica: host networking (a gang's replicas meet on the instances'
    addresses), the plan's GPUs only, the checkpoint directory mounted from the host."""
    if not launch.image:
        raise StartError("the docker runtime needs run.image")
    cmd = ["docker", "run", "--rm", "--name", launch.name, "--network", "host", "--ipc", "host"]
    if launch.gpus:
        cmd += ["--gpus", docker_gpus(launch.gpus)]
    if launch.checkpoint_dir and launch.checkpoint_host_dir is not None:
        cmd += ["--volume", f"{launch.checkpoint_host_dir}:{launch.checkpoint_dir}"]
    for k, v in sorted(launch.env.items()):
        cmd += ["--env", k if hidden_in_argv(k) else f"{k}={v}"]
    return cmd + [launch.image, *launch.command]


def hidden_in_argv(name: str) -> bool:
    """Whether a variable goes to the container as `--env NAME`, its value taken from the docker client's own
    environment (`docker_env`), not as NAME=value in the client's command line, which stays in the process table for
    the container's life (`ps`, /proc/PID/cmdline: any local user read a job's HF_TOKEN). A credential by its name;
    not a DOCKER_* one, which the client would read as its own setting (DOCKER_HOST, DOCKER_CONFIG ...)."""
    return credential_name(name) and not name.upper().startswith("DOCKER_")


def docker_env(launch: Launch) -> dict[str, str]:
    """The docker client's environment: the agent's, the values of the variables `docker_command` names alone, and the
    replica's mark (REPLICA_ID: its shim is found by it, unrecorded_shim)."""
    mark = {REPLICA_ID: launch.env[REPLICA_ID]} if REPLICA_ID in launch.env else {}
    return {**os.environ, **{k: v for k, v in launch.env.items() if hidden_in_argv(k)}, **mark}


DOCKER_CALL_S = 30.0  # the longest one `docker kill` may go unanswered before it is given up (a hung daemon)
DOCKER_KILL_WAIT_S = STRAY_GRACE_S + KILL_MARGIN_S  # from a container's kill: how long docker has to end it before its client's group is killed


@dataclass
class DockerHandle:
    pid: int
    name: str
    proc: subprocess.Popen
    kill_begun: float | None = None  # (monotonic) when DockerRuntime.begin_kill began its kill


@dataclass
class DockerCall:
    """One `docker kill` under way for a container (`name`): given up (its client killed) at `until` (monotonic)."""

    name: str
    args: tuple[str, ...]
    proc: subprocess.Popen
    until: float


class DockerRuntime:
    """`docker run` in the foreground, its output into the replica's log; signals via `docker kill`.

    Every `docker kill` runs beside the agent's loop, never waited for: a spot notice signals all of an instance's
    containers at once, and a daemon that does not answer for one container (a hung `docker kill`, up to DOCKER_CALL_S)
    delays no other, nor the agent. A checkpoint signal's call is given up when the replica's kill begins (its grace is
    over: the signal is moot); a container docker has not ended DOCKER_KILL_WAIT_S after its kill began is ended through
    its client's process group (`kill`: the shim and the `docker run` client), which the agent sees as the replica's end."""

    name = "docker"

    def __init__(self, docker: str = "docker"):
        self.docker = docker
        self.calls: list[DockerCall] = []

    def start(self, launch: Launch) -> DockerHandle:
        if shutil.which(self.docker) is None:
            raise StartError("docker is not installed on this instance (use a GPU image with the NVIDIA container toolkit)")
        _checked(launch, cwd=False)  # (a container runs in its image's directory)
        cmd = docker_command(launch)
        cmd[0] = self.docker
        try:
            _prepare(launch)
            with _log(launch.log_path) as log, _forwarded_blocked():
                proc = subprocess.Popen(shimmed(launch, cmd), env=docker_env(launch), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise StartError(f"cannot start {self.docker!r}: {e.strerror}{f' ({e.filename})' if e.filename else ''}") from None
        return DockerHandle(proc.pid, launch.name, proc)

    def poll(self, handle: DockerHandle | Detached) -> int | None:
        self._reap()
        return handle.proc.poll() if isinstance(handle, DockerHandle) else handle.poll()

    def _reap(self) -> None:
        """Drop the `docker kill` calls that ended; kill those past their time (`until`), a daemon that did not answer."""
        now = time.monotonic()
        for call in list(self.calls):
            if call.proc.poll() is None and now < call.until:
                continue
            if call.proc.returncode is None:
                call.proc.kill()
                call.proc.wait()  # (SIGKILL: at once)
            self.calls.remove(call)

    def _call(self, name: str, *args: str) -> None:
        """`docker kill ARGS NAME` begun, not waited for; none begun while the same call for `name` is under way. A
        docker gone since is no reason to stop the agent: a signal then does not reach the replica (it is killed once
        its grace is over), a kill falls back to the client's process group."""
        self._reap()
        if any(c.name == name and c.args == args for c in self.calls):
            return
        try:
            proc = subprocess.Popen([self.docker, "kill", *args, name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        except OSError:
            return
        self.calls.append(DockerCall(name, args, proc, time.monotonic() + DOCKER_CALL_S))

    def signal(self, handle: DockerHandle | Detached, sig: int) -> None:
        if self.poll(handle) is None:
            self._call(handle.name, "--signal", signals.Signals(sig).name)

    def end_left(self, pid: int, started: str, replica_id: str | None) -> None:
        """Nothing: the container (`--rm`) ended with what ran in it."""

    def begin_kill(self, handle: DockerHandle | Detached) -> None:
        """The container's end begun (`docker kill`, with what ran in it); returns at once: `poll` says when it ended.
        Its checkpoint signal's call, still unanswered, is given up (the grace it was for is over)."""
        if self.poll(handle) is None:
            if handle.kill_begun is None:
                handle.kill_begun = time.monotonic()
            for call in self.calls:
                if call.name == handle.name and call.args:
                    call.until = 0.0
            self._call(handle.name)

    def kill(self, handle: DockerHandle | Detached) -> None:
        """begin_kill, and the wait for docker to end the container, up to DOCKER_KILL_WAIT_S from the kill's beginning
        (a kill begun that long ago waits no longer); then, docker not having answered, the client's process group is
        killed (its shim and `docker run`). Its `docker kill` goes on up to DOCKER_CALL_S: a daemon that comes back
        still ends the container."""
        self.begin_kill(handle)
        limit = (handle.kill_begun or time.monotonic()) + DOCKER_KILL_WAIT_S
        while self.poll(handle) is None and time.monotonic() < limit:
            time.sleep(0.02)
        if self.poll(handle) is None:
            self.force_kill(handle)
            if isinstance(handle, Detached):
                handle.wait(10)
                return
            try:
                handle.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
                pass

    def force_kill(self, handle: DockerHandle | Detached) -> None:
        """The kill's last step, begun: docker did not end the container within DOCKER_KILL_WAIT_S (a hung daemon), its
        client's process group is killed (its shim and `docker run`); returns at once, `poll` says when it has ended."""
        if self.poll(handle) is None:
            if isinstance(handle, Detached):
                handle.signal(signals.SIGKILL)
            else:
                end_group(handle.pid)


RUNTIMES = {"process": ProcessRuntime, "docker": DockerRuntime}
