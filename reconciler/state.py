"""The reconciler's own state (.reconcile/state.json) and the apply lock.

The cloud is the truth for which instances exist; this file records which job
replica runs on which instance (with its GPU indices), and which zones recently
ran out of capacity (so the next run does not retry them at once). Providers that
can (sim, AWS) also tag each instance with its replicas; `serial` tells which of
the two records is newer when they disagree (reconciler/placements.py)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import socket
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from providers.files import loads_json, others_may_write, read_regular
from providers.placements import SERIAL_MAX
from reconciler.atomicfile import write_atomic
from reconciler.errors import LockError, ReconcileError, shown

CAPACITY_COOL_OFF = timedelta(minutes=30)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


@dataclass
class State:
    placements: dict[str, list[str]] = field(default_factory=dict)  # job -> instance id per replica
    gpus: dict[str, list[list[int]]] = field(default_factory=dict)  # job -> GPU indices per replica on its instance
    short: list[dict] = field(default_factory=list)  # {cloud, zone, instance_type, market, until}
    serial: int = 0  # one more each apply, and above every placement tag's serial seen
    # The highest serial an apply of this fleet began with, recorded before it touched the cloud: tags up to it may be
    # newer than `serial` (an apply that died before it saved, or a state restored from an older copy), tags past it no
    # apply wrote (reconciler/placements.py). Kept by the backend beside the state document, not in it, so that an older
    # copy put back still knows how far the applies went (reconciler/backend.py STARTED_KEY). None: not recorded.
    started: int | None = field(default=None, compare=False)
    shapes: dict[str, dict] = field(default_factory=dict)  # job -> the resources it was placed with (problem.shape_of)
    since: dict[str, int] = field(default_factory=dict)  # job -> the serial of the apply that started it, running since
    # job -> the priority aging had raised it to when it was placed (only where above its own): a running job holds it
    # (problem.demands.effective_priority), so the work it displaced does not outrank it again once it runs
    aged: dict[str, int] = field(default_factory=dict)
    fleet_name: str = ""  # the fleet this state belongs to, and its uid (reconciler/identity.py)
    fleet_uid: str = ""
    regions: list[dict] = field(default_factory=list)  # {provider, cloud, region, settings}: launched into, maybe not empty yet
    # job -> the gone instances of a gang that apply stopped because it could not replace them all, until it runs
    # again: the next plan says it replaces them (not a resize of its survivors: reconciler/apply.py _placements)
    lost: dict[str, list[str]] = field(default_factory=dict)
    source: str = field(default="state", compare=False)  # where it was read from (errors about it name that): not saved
    # The newest serial an apply published assignments with (its own: it had saved the state at it), read from the bus
    # when asked (the backend's load sets it): a record of how far the applies went that a state and a started.json put
    # back from an older copy do not take back. Asked only when tags are newer than the state (a request per agent).
    published: Callable[[], int] | None = field(default=None, compare=False, repr=False)
    # instance -> the "job/replica"s its live agent reports running, read from the bus when asked (the backend's load
    # sets it): what runs, which settles a state and tags that disagree at one serial. Asked only then.
    running: Callable[[], dict[str, frozenset[str]]] | None = field(default=None, compare=False, repr=False)
    # instance -> the "job/replica"s its published assignment (bus assignments/) lists, read when asked: with the
    # instance's tags, a second record against a state edited since its last apply. Asked only then.
    assigned: Callable[[], dict[str, frozenset[str]]] | None = field(default=None, compare=False, repr=False)

    def short_now(self, now: datetime | None = None) -> frozenset[tuple[str, str, str, str]]:
        now = now or utcnow()
        return frozenset(
            (s["cloud"], s["zone"], s["instance_type"], s["market"]) for s in self.short
            if datetime.fromisoformat(s["until"]) > now
        )

    def mark_short(self, cloud: str, zone: str, instance_type: str, market: str, now: datetime | None = None) -> None:
        until = ((now or utcnow()) + CAPACITY_COOL_OFF).isoformat()
        self.short = [s for s in self.short if (s["cloud"], s["zone"], s["instance_type"], s["market"]) != (cloud, zone, instance_type, market)]
        self.short.append(dict(cloud=cloud, zone=zone, instance_type=instance_type, market=market, until=until))


def state_dir(config_dir: Path) -> Path:
    return Path(config_dir) / ".reconcile"


# The state document's format: written in every state, refused when above this (a newer fleetops wrote fields this one
# would drop on its next save, or read otherwise). Raise it with a change a reader of this format would misread.
STATE_FORMAT = 1
# A bound on what is read, not a format rule: a 50k-job state is 9.5 MiB (bench.generate --jobs 50000, applied: 39,099
# jobs placed), so 256 MiB is far above any fleet's, and parsing it takes a few GiB at most (1 GiB allowed ~10).
MAX_STATE_BYTES = 256 << 20
LOCK_BYTES = 1 << 16  # what is read of a lock file (an apply writes ~150 bytes): the same bytes name a garbled one's id
_STATE_FIELDS = frozenset({"format", "serial", "placements", "gpus", "shapes", "since", "aged", "short", "fleet", "regions", "lost"})


def state_to_json(state: State) -> str:
    return json.dumps({"format": STATE_FORMAT, "serial": state.serial, "placements": dict(sorted(state.placements.items())),
                       "gpus": dict(sorted(state.gpus.items())), "shapes": dict(sorted(state.shapes.items())),
                       "since": dict(sorted(state.since.items())), **({"aged": dict(sorted(state.aged.items()))} if state.aged else {}),
                       "short": state.short, "fleet": {"name": state.fleet_name, "uid": state.fleet_uid},
                       "regions": state.regions, **({"lost": dict(sorted(state.lost.items()))} if state.lost else {})}, indent=1)


class StateFileError(ReconcileError):
    """The reconciler's state (a file or an object) cannot be read: nothing is planned from it."""

    def __init__(self, where: str, problem: str, newer: bool = False):
        advice = ("Upgrade fleetops to the version that wrote it (do not move it aside: it records which job replica "
                  "runs on which instance, and an older fleetops would drop what it does not know on its next save)."
                  if newer else
                  "This file records which job replica runs on which instance; restore it from a backup, or move it aside "
                  "to start from an empty state (each instance's placement tags, where its provider keeps them, then say "
                  "again what runs where).")
        super().__init__(f"{where}: cannot read the reconciler's state: {problem}. Nothing was changed. {advice}")


class StatePermissionError(ReconcileError):
    """The state, or the directory it is in, could be rewritten by someone beside its owner: no apply acts on it."""


class StateLinkError(ReconcileError):
    """A symlink under .reconcile/: nothing is read or written through it."""


def refuse_links(config_dir: Path) -> None:
    """Refuse a symlink anywhere under the config's .reconcile/ before anything reads or writes there. Apply writes and
    prunes files in its directories (assignments, agents' reports, the sim's world, caches), and a pull request can add
    a link to the checkout: `.reconcile/assignments -> /somewhere` had every apply delete the *.json files there and
    write its own (audit). status/ was already never written through a link; this is the same rule for the state.
    One exception: `.reconcile/sim` may link to a directory. It is the simulated cloud account, which two config
    checkouts may share as two repos share a real one (tests/test_fleet_identity.py); its files are the sim's."""
    top = state_dir(config_dir)
    if top.is_symlink():
        links = [top]
    elif not top.is_dir():
        return
    else:
        links = []
        sim = os.path.join(top, "sim")
        disks = {os.path.join(sim, "volumes"), os.path.join(sim, "disks"), *(os.path.join(sim, "agents", n, "replicas") for n in _names(os.path.join(sim, "agents")))}
        todo = [str(top)]
        while todo:  # (scandir's entries know whether they are links without a stat each: 15k entries in ~0.03 s)
            d = todo.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue  # (what cannot be listed is reported by whatever reads it)
            for e in entries:
                if e.is_symlink():
                    if not (e.path == sim and os.path.isdir(e.path)):
                        links.append(Path(e.path))
                elif d not in disks and e.is_dir(follow_symlinks=False):
                    todo.append(e.path)  # the simulated instances' disks are the jobs' own (a venv's links): not entered
    if links:
        first = min(links)
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise StateLinkError(f"{first} is a symlink (to {os.readlink(first)}){more}: the reconciler never reads or writes "
                             "its state through a link, which could lead out of the config directory. Nothing was "
                             f"changed. Remove the link (`rm {first}`); its files are rewritten by the next run, or restore "
                             "them from a backup.")


def refuse_loose_state(top: Path) -> None:
    """Refuse to act (apply, the controller: whoever takes the apply lock) on a state that someone beside its owner
    could have rewritten: state.json records which job runs on which instance, and the sim's world and the bus's
    objects are beside it. A world-writable .reconcile/ or state.json let any user of the host choose what an apply
    deleted and placed (ssh refuses such an authorized_keys for the same reason). Plan and status only read it."""
    for path in (top, top / "state.json"):
        try:
            loose = others_may_write(path)
        except FileNotFoundError:
            continue
        except OSError as e:  # (whatever reads it next reports a file it cannot read)
            raise StatePermissionError(f"{path}: cannot check who may write it: {e.strerror}. Nothing was changed.") from None
        if loose:
            raise StatePermissionError(
                f"{loose}: anyone who can write there chooses what this apply launches and deletes, so no apply acts on "
                "it. Nothing was changed. Make it writable by its owner only and run again (check, if others had write "
                "access, that the state is the one your applies wrote).")


def _names(d: str) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []


def _is_int(v) -> bool:
    return type(v) is int  # (not a bool, which JSON's true would be)


def _is_num(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


# A recorded shape's fields (problem/demands.py shape_of), each as apply writes it; a field may be left out (a state from
# before it existed: the job's own value is taken), others are ignored.
_SHAPE_KINDS = {
    "gpus": ("a non-negative integer", lambda v: _is_int(v) and v >= 0),
    "gpu_type": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "mig": ("null or \"<count>x <profile>\"", lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"[0-9]{1,6}x \S+", v) is not None)),
    "nvlink": ("true or false", lambda v: type(v) is bool),
    "cpu": ("a non-negative number", lambda v: _is_num(v) and v >= 0),
    "memory_gib": ("a non-negative number", lambda v: _is_num(v) and v >= 0),
}
_REGION_FIELDS = ("provider", "cloud", "region")


def _gpus_problem(gpus) -> str | None:
    if not isinstance(gpus, dict):
        return "gpus is not a map of job -> [[GPU index]]"
    for job, reps in gpus.items():
        if not isinstance(reps, list) or not all(isinstance(g, list) and all(map(_is_int, g)) for g in reps):
            return f"gpus.{job} is not a list of [GPU index] per replica"
        for r, g in enumerate(reps):
            if any(n < 0 for n in g):
                return f"gpus.{job}: replica {r} holds GPU index {min(g)}, which is negative"
            if len(set(g)) != len(g):
                return f"gpus.{job}: replica {r} holds GPU {next(n for n in g if g.count(n) > 1)} twice ({g})"
    return None


def _identity_problem(raw) -> str | None:
    fleet = raw.get("fleet")
    if fleet is None:
        return None
    if not isinstance(fleet, dict) or not all(isinstance(fleet.get(k, ""), str) for k in ("name", "uid")):
        return "fleet is not {name, uid} (two strings)"
    return None


def _regions_problem(regions) -> str | None:
    if not isinstance(regions, list):
        return "regions is not a list of {provider, cloud, region, settings}"
    for n, r in enumerate(regions):
        if not isinstance(r, dict):
            return f"regions[{n}] is not an object {{provider, cloud, region, settings}}"
        for k in _REGION_FIELDS:
            if not isinstance(r.get(k), str) or not r[k]:
                return f"regions[{n}].{k} is " + ("missing" if k not in r else "not a name")
        settings = r.get("settings", {})
        if not isinstance(settings, dict) or not all(isinstance(v, str) for v in settings.values()):
            return f"regions[{n}].settings is not a map of name -> string"
    return None


def _shapes_problem(shapes) -> str | None:
    if not isinstance(shapes, dict):
        return "shapes is not a map of job -> {gpus, gpu_type, mig, nvlink, cpu, memory_gib}"
    for job, shape in shapes.items():
        if not isinstance(shape, dict):
            return f"shapes.{job} is not an object {{gpus, gpu_type, mig, nvlink, cpu, memory_gib}}"
        for k, (what, ok) in _SHAPE_KINDS.items():
            if k in shape and not ok(shape[k]):
                return f"shapes.{job}.{k} is {json.dumps(shape[k])[:40]}, not {what}"
    return None


def _newer_problem(raw) -> str | None:
    """A state document this fleetops cannot read whole: a newer format, or a field it does not know (written by a newer
    fleetops, or by hand): read anyway, its next save would drop what it did not know (a state `{"version": 99}` was
    planned from as an empty one)."""
    if not isinstance(raw, dict):
        return None
    fmt = raw.get("format", 1)  # (states saved before the field was written are format 1)
    if _is_int(fmt) and fmt > STATE_FORMAT:
        return f"it was written by a newer fleetops (state format {fmt}; this one reads format {STATE_FORMAT})"
    unknown = sorted(k for k in raw if k not in _STATE_FIELDS)
    if unknown:
        return (f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(repr(k)[:40] for k in unknown[:3])} "
                f"(state format {STATE_FORMAT} has none such: written by a newer fleetops, or by hand?)")
    return None


def _state_problem(raw) -> str | None:
    """What is wrong with a parsed state document, if anything (its shape, not its meaning): every field as apply
    writes it. (A GPU index beyond its instance's GPUs is judged where the instance is known: observe.py.)"""
    if not isinstance(raw, dict):
        return f"expected a JSON object, got {type(raw).__name__}"

    def str_lists(v, inner) -> bool:
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, list) and all(map(inner, x)) for k, x in v.items())

    if not str_lists(raw.get("placements", {}), lambda i: isinstance(i, str)):
        return "placements is not a map of job -> [instance id]"
    if not str_lists(raw.get("lost", {}), lambda i: isinstance(i, str)):
        return "lost is not a map of job -> [instance id]"
    problem = _gpus_problem(raw.get("gpus", {}))
    if problem:
        return problem
    if not _is_int(raw.get("format", 1)) or raw.get("format", 1) < 1:
        return f"format is {json.dumps(raw.get('format'))[:40]}, not a format number"
    if not _is_int(raw.get("serial", 0)):
        return "serial is not an integer"
    if raw.get("serial", 0) < 0:  # applies count up from 0, so no apply wrote this
        return f"serial is negative ({raw['serial']})"
    if raw.get("serial", 0) > SERIAL_MAX:  # it goes into every instance's placement tags (EC2 values: 256 characters)
        return f"serial is out of range ({len(str(raw['serial']))} digits; an apply's serial is below 2**63)"
    since = raw.get("since", {})
    if not isinstance(since, dict) or not all(isinstance(k, str) and _is_int(v) for k, v in since.items()):
        return "since is not a map of job -> serial"
    aged = raw.get("aged", {})
    if not isinstance(aged, dict) or not all(isinstance(k, str) and _is_int(v) and v > 0 for k, v in aged.items()):
        return "aged is not a map of job -> priority (a positive integer)"
    short = raw.get("short", [])
    keys = ("cloud", "zone", "instance_type", "market", "until")
    if not isinstance(short, list) or not all(isinstance(s, dict) and all(isinstance(s.get(k), str) for k in keys) for s in short):
        return "short is not a list of {cloud, zone, instance_type, market, until}"
    for s in short:
        try:
            until = datetime.fromisoformat(s["until"])
        except ValueError:
            return f"short: until {s['until']!r} is not a time"
        if until.tzinfo is None:  # (apply writes UTC's offset; compared with the clock, a naive time was a TypeError)
            return f"short: until {s['until']!r} is not a time with a zone (apply writes {utcnow().isoformat()!r})"
    return _shapes_problem(raw.get("shapes", {})) or _identity_problem(raw) or _regions_problem(raw.get("regions", []))


def state_from_json(text: str | bytes, where: str = "state") -> State:
    """Parse a state document; StateFileError (naming `where`) if it is not one."""
    try:
        raw = loads_json(text)
    except ValueError as e:  # also UnicodeDecodeError, a nest too deep, half a surrogate pair
        raise StateFileError(where, f"not valid JSON ({'empty' if not text.strip() else e})") from None
    newer = _newer_problem(raw)
    if newer:
        raise StateFileError(where, newer, newer=True)
    problem = _state_problem(raw)
    if problem:
        raise StateFileError(where, problem)
    now = utcnow()
    short = [s for s in raw.get("short", []) if datetime.fromisoformat(s["until"]) > now]
    fleet = raw.get("fleet") or {}
    return State(placements=raw.get("placements", {}), gpus=raw.get("gpus", {}), short=short, serial=raw.get("serial", 0),
                 shapes=raw.get("shapes", {}), since=raw.get("since", {}), aged=raw.get("aged", {}), fleet_name=fleet.get("name", ""), fleet_uid=fleet.get("uid", ""),
                 regions=list(raw.get("regions", [])), lost=raw.get("lost", {}), source=where)


def load_state(config_dir: Path) -> State:
    path = state_dir(config_dir) / "state.json"
    try:
        text = read_regular(path, MAX_STATE_BYTES)  # (a fifo at its name hung plan and apply)
    except FileNotFoundError:
        return State(source=str(path))
    except OSError as e:
        raise StateFileError(str(path), e.strerror or str(e)) from None
    if len(text) > MAX_STATE_BYTES:
        raise state_too_large(str(path))
    return state_from_json(text, str(path))


def state_too_large(where: str) -> StateFileError:
    """A state file or object above MAX_STATE_BYTES: refused unread (parsing it could take all the memory there is)."""
    return StateFileError(where, f"it is larger than {MAX_STATE_BYTES >> 20} MiB, which no apply writes")


def save_state(config_dir: Path, state: State) -> None:
    write_atomic(state_dir(config_dir) / "state.json", state_to_json(state).encode())


GARBLED = "garbled-"  # the id of a lock that names no holder: "garbled-" and a digest of its bytes


# An id as a lock's writer makes it (12 hex digits; GARBLED's own): printed in the advice to run `reconcile unlock ID`,
# an id from a lock file someone else wrote (`x;curl ...|sh`) was a command to paste, its escapes the terminal's.
LOCK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def lock_holder(body: bytes) -> dict:
    """The holder a lock's bytes name. An empty or garbled lock (a write cut short, a hand edit) names
    none: it gets an id made of its digest, so `reconcile unlock <that id>` breaks exactly that lock."""
    try:
        h = loads_json(body)
    except ValueError:
        h = None
    named = isinstance(h, dict) and isinstance(h.get("id"), str) and LOCK_ID.fullmatch(h["id"]) is not None
    if named and ("pid" not in h or _is_pid(h["pid"])):
        return h
    what = "empty" if not body.strip() else "garbled (not a lock this tool wrote)"
    if named:
        what = f"garbled (its pid {json.dumps(h['pid'])[:40]} is not a process id)"
    return {"id": GARBLED + hashlib.sha256(body).hexdigest()[:8], "garbled": what}


def describe_holder(h: dict) -> str:
    if "garbled" in h:
        return f"nobody: the lock is {h['garbled']}"
    return f"{h['id']} (pid {h.get('pid')} on {shown(h.get('host'))} since {shown(h.get('since'))}" + (
        f", expires {shown(h['expires'])})" if h.get("expires") else ")")


class ApplyLock:
    """An exclusive lock file naming its holder, that the holder also keeps flock()ed.

    The kernel drops a flock when its process dies, so a lock whose flock can be taken is stale (its
    holder is gone) on this host, and it is taken over by renaming a new lock file over it while
    holding the old one's flock: of two applies racing for a dead holder's lock exactly one wins (the
    old check-then-unlink let both in: 18 instances for 10). A lock named by another host, or one
    that names nobody, is refused with the id `reconcile unlock ID` takes."""

    def __init__(self, config_dir: Path):
        self.path = state_dir(config_dir) / "apply.lock"
        self.id = uuid.uuid4().hex[:12]
        self._fd: int | None = None

    def holder(self) -> dict | None:
        try:
            mode = os.lstat(self.path).st_mode
            if not stat.S_ISREG(mode):  # (a fifo's read would block for ever)
                raise self._not_a_lock(mode)
            return lock_holder(read_regular(self.path, LOCK_BYTES)[:LOCK_BYTES])
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._cannot_read(e) from None

    def _not_a_lock(self, mode: int) -> LockError:
        """Something no apply wrote at the lock's name (a directory, a fifo): it names no holder, yet no apply can take
        the lock while it is there. Left for a person to remove: a directory may hold someone's files."""
        what, rm = (("a directory", "rm -r") if stat.S_ISDIR(mode) else ("a symlink", "rm") if stat.S_ISLNK(mode)
                    else ("a special file", "rm"))
        return LockError(f"{self.path} is not a lock file ({what}): no apply wrote it, and none can take the lock while "
                         f"it is there. Nothing was changed. If no apply is running, remove it (`{rm} {self.path}`) and "
                         "run again.")

    def _cannot_read(self, e: OSError) -> LockError:
        try:
            mode = os.lstat(self.path).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):  # (a symlink: O_NOFOLLOW's ELOOP)
            return self._not_a_lock(mode)
        return LockError(f"cannot read the apply lock {self.path}: {e.strerror or e}. Nothing was changed.")

    def _refuse(self, h: dict, running: bool = False) -> LockError:
        """`running`: a live process holds the lock's flock, an apply that is running, which `reconcile unlock` refuses
        to break (`break_lock`): the advice is to wait for it or stop it, not an unlock that would be refused."""
        if running:
            return LockError(f"another apply holds the lock {self.path}: {describe_holder(h)}, and it is running (it "
                             "holds the lock file's flock). Nothing was changed. Wait for it to finish, or stop it "
                             "(Ctrl-C, or `kill` its pid); a lock whose holder died is taken over by the next apply")
        return LockError(f"another apply holds the lock {self.path}: {describe_holder(h)}; "
                         f"if no apply is running, run `reconcile unlock {h['id']}`" + (" (or remove the file)" if "garbled" in h else ""))

    def __enter__(self) -> "ApplyLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # (an "unexpected FileExistsError")
            raise LockError(f"{self.path.parent} is not a directory: the reconciler keeps its state and lock there. "
                            "Nothing was changed. Move it away, or restore the directory from a backup") from None
        refuse_loose_state(self.path.parent)
        body = json.dumps({"id": self.id, "pid": os.getpid(), "host": socket.gethostname(), "since": utcnow().isoformat()}).encode()
        mine = self.path.with_name(f".apply.lock.{self.id}")
        fd = os.open(mine, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, body)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours, before the file is the lock
            for _ in range(20):
                try:
                    os.link(mine, self.path)  # atomic: only if no lock exists
                    break
                except FileExistsError:
                    pass
                if self._take_over_stale(mine):
                    break
            else:
                raise LockError(f"could not take the lock at {self.path}")
        except BaseException:
            os.close(fd)
            mine.unlink(missing_ok=True)
            raise
        mine.unlink(missing_ok=True)
        self._fd = fd
        return self

    def _take_over_stale(self, mine: Path) -> bool:
        """True if the lock at self.path was stale and is ours now; False to try again; LockError if held."""
        try:
            old = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # (a fifo's open would block)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self._cannot_read(e) from None
        try:
            mode = os.fstat(old).st_mode
            if not stat.S_ISREG(mode):  # (a directory's read was an "unexpected IsADirectoryError")
                raise self._not_a_lock(mode)
            try:
                body = os.read(old, LOCK_BYTES)
            except OSError as e:
                raise self._cannot_read(e) from None
            h = lock_holder(body)
            try:
                fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise self._refuse(h, running=True) from None  # a live process here holds it
            try:
                if os.stat(self.path, follow_symlinks=False).st_ino != os.fstat(old).st_ino:
                    return False  # replaced while we looked: look again
            except FileNotFoundError:
                return False
            if "garbled" in h or h.get("host") != socket.gethostname() or _pid_alive(h.get("pid", -1)):
                raise self._refuse(h)  # names nobody, another host, or a live process (an older version's lock)
            os.rename(mine, self.path)  # we hold the dead lock's flock: nobody else can be doing this
            return True
        finally:
            os.close(old)

    def still_held(self) -> bool:
        """Still the lock file at self.path (not broken by `reconcile unlock` while we worked)."""
        try:
            return self._fd is not None and os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *exc) -> None:
        if self._fd is None:
            return
        try:
            if os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(self._fd).st_ino:
                self.path.unlink()  # still ours (not broken by `reconcile unlock`)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None


def break_lock(config_dir: Path, lock_id: str) -> None:
    """`reconcile unlock`: remove a stale lock. One whose flock a process holds is a running apply's (the kernel drops
    the flock when its holder dies): broken, it went on beside the next apply (it stops only before its next provider
    call, its actions in flight do not), so it is refused, as the refusal that sent the user here says."""
    lock = ApplyLock(config_dir)
    h = lock.holder()
    if h is None:
        raise LockError("no lock is held")
    if h.get("id") != lock_id:
        raise LockError(f"the lock is held by {h.get('id')}, not {lock_id}; refusing to break it")
    if _flock_held(lock.path):
        raise LockError(f"the lock {lock.path} is held by an apply that is running: {describe_holder(h)}; refusing to "
                        "break it. Stop that apply (Ctrl-C, or `kill` its pid) and it releases the lock; a lock whose "
                        "holder died is taken over by the next apply without `reconcile unlock`")
    lock.path.unlink(missing_ok=True)


def _flock_held(path: Path) -> bool:
    """Whether a live process holds the lock file's flock (an apply running, on this host or one sharing the file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (closing drops the flock taken just now)
    return False


PID_MAX = 1 << 22  # Linux's highest pid_max


def _is_pid(pid) -> bool:
    return type(pid) is int and 0 < pid <= PID_MAX


def _pid_alive(pid: int) -> bool:
    if not _is_pid(pid):  # (lock_holder refuses such a lock's pid: this is for a lock without one, -1)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed but not yet reaped) still answers kill(0); it holds nothing.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


__all__ = ["State", "StateFileError", "load_state", "save_state", "state_to_json", "state_from_json", "state_too_large", "ApplyLock", "break_lock",
           "lock_holder", "describe_holder", "state_dir", "utcnow"]
