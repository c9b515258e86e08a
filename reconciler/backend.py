"""Where the reconciler keeps its state and its apply lock: `local`, `s3`, `gs` or `azblob`.

Teams whose runs come from many CI runners share one object-store backend (S3, GCS or
Azure Blob): the state is one object, and the lock is a second object created with a
conditional write (S3 and Azure: If-None-Match: *; GCS: ifGenerationMatch=0), so two
runners can never both believe they hold it. The
lock names its holder and expires; its holder renews it while it works (LeasedLock,
every write conditional on the version it last wrote) and stops if it cannot. An
expired lock is taken over; a live, empty or garbled one is broken with
`reconcile unlock ID`.

Files of any size (a job's checkpoints, reconciler/runtime/checkpoints.py) go through `write_file`/`read_file`, streamed
from and to disk, never whole in memory: S3 with a multipart upload above S3_MULTIPART_THRESHOLD (PutObject refuses a
body over 5 GB), GCS with a resumable upload in GCS_CHUNK chunks, Azure in blocks of AZBLOB_BLOCK. A file read is
written to a temporary name beside its destination and renamed into place only once whole."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterator, Protocol
from urllib.parse import urlparse

from reconciler.atomicfile import copy_atomic, write_atomic
from reconciler.errors import CorruptBusObjectError, DiskFullError, LockError, ReconcileError, disk_full
from providers.redact import redact
from providers.placements import SERIAL_MAX
from providers.files import loads_json, read_regular
from reconciler.state import (LOCK_BYTES, MAX_STATE_BYTES, ApplyLock, State, break_lock, describe_holder, load_state, lock_holder,
                              save_state, state_from_json, state_to_json, state_too_large, utcnow)

LOCK_TTL = timedelta(minutes=30)
# While one file is copied, `progress` (the agent's heartbeat) is called at least this often (and at most: Every).
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Stamped:
    """An object read with when the store recorded its last write, by the store's own clock: `modified` (unix) and `age`
    (the store's time of the read minus `modified`). The one clock every writer and reader shares: an agent's host clock
    minutes off made its heartbeat_at look stale (its live instance replaced) or fresh for ever (a dead one never)."""

    body: bytes
    modified: float
    age: float


@dataclass(frozen=True)
class Listed:
    """An object as a listing saw it, for a stamped read of that version of it (StateBackend.list_keys_stamped): its
    version token (GCS: generation), when the store recorded its last write (`modified`, unix), the store's age of it
    at the listing (its response's Date minus `modified`) and this host's time.monotonic() then (`at`)."""

    version: str
    modified: float
    age: float
    at: float

    def age_now(self) -> float:
        """Its age on the store's clock now: the listing's, plus the time this host has counted since."""
        return self.age + time.monotonic() - self.at


def _http_date(text: str | None) -> float | None:
    """An HTTP Date or Last-Modified header (RFC 7231) as unix seconds, None if absent or unreadable."""
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(text).timestamp() if text else None
    except (TypeError, ValueError, IndexError):
        return None


class StateBackend(Protocol):
    def load(self) -> State: ...

    def save(self, state: State) -> None: ...

    @property
    def location(self) -> str:
        """Where this state is kept, as status/fleet.yaml records it (reconciler/identity.py check_confirmed): the
        same string for the same place from any run, another for a fork's or another checkout's state."""
        ...

    def lock(self) -> contextlib.AbstractContextManager[str]:
        """Hold the apply lock for a block; yields the lock id; raises LockError naming the holder."""
        ...

    def unlock(self, lock_id: str) -> None: ...

    def check_lock(self) -> None:
        """Raise LockError if the lock this backend holds was lost (broken, taken over, not renewed):
        called before every provider call of an apply, so a lost lock stops it there."""
        ...

    # The bus (reconciler/runtime/bus.py): small objects under the state's prefix, written by
    # apply (assignments/) and by node agents (runs/, agents/).
    def read_key(self, key: str) -> bytes | None: ...

    def read_key_stamped(self, key: str, listed: Listed | None = None) -> Stamped | None:
        """read_key's object with the store's times of its last write and of the read (Stamped), from one response
        where the store gives both. How a reader judges how old an agent's report is: never by the writer's clock.
        `listed`: what list_keys_stamped said of it; where the store cannot stamp a read in one request (GCS), the
        body of exactly that version is read and judged by the listing's stamp (rewritten since: read afresh)."""
        ...

    def list_keys_stamped(self, prefix: str) -> dict[str, Listed | None]:
        """list_keys, each key with what the listing says of its object for read_key_stamped (None: nothing it needs:
        a local file and an S3 or Azure GET carry their own stamp, as cheaply and fresher). Readers of every agent's
        report (Bus.agents, each plan) pay one listing and one read a report, not two (GCS: metadata, then body)."""
        ...

    def write_key(self, key: str, body: bytes) -> None: ...

    def delete_key(self, key: str) -> None: ...

    def list_keys(self, prefix: str) -> list[str]: ...

    # Files of any size (checkpoints), streamed: never whole in memory. `progress` is called now and then while one is
    # copied (every PROGRESS_EVERY_S or so), on the calling thread: the agent's heartbeat, kept through a long file.
    def write_file(self, key: str, path: Path, progress: Callable[[], None] | None = None) -> None: ...

    def read_file(self, key: str, dest: Path, progress: Callable[[], None] | None = None) -> bool:
        """Copy `key` into the file `dest` (replaced only once whole); False, `dest` untouched, if there is no such key."""
        ...


class Every:
    """`progress`, called at most every `seconds` (PROGRESS_EVERY_S): the first call that long after this was made.
    Thread-safe; None does nothing."""

    def __init__(self, progress: Callable[[], None] | None, seconds: float | None = None):
        self.progress, self.seconds = progress, PROGRESS_EVERY_S if seconds is None else seconds
        self._last, self._lock = time.monotonic(), threading.Lock()

    def __call__(self) -> None:
        if self.progress is None:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.seconds:
                return
            self._last = now
            self.progress()


def _beating(call: Callable[[], object], progress: Callable[[], None] | None) -> object:
    """call() on a thread of its own while this one calls `progress` every PROGRESS_EVERY_S until it returns: an SDK's
    transfer of one large file blocks for minutes, and its own progress callbacks come (if at all) from its worker
    threads, where the agent's heartbeat must not run. Returns call()'s result or raises its exception."""
    if progress is None:
        return call()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            box["error"] = e

    worker = threading.Thread(target=run, name="fleetops-transfer", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(PROGRESS_EVERY_S)
            if worker.is_alive():
                progress()
    finally:
        worker.join()  # (progress raised: the transfer is still ours to wait for, its temporary file ours to remove)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def check_key(key: str) -> str:
    """A bus key is a relative path of plain names: never absolute, never `..`."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in key:
        raise ReconcileError(f"invalid bus key {key!r}")
    return key


def bus_object_too_large(key: str, where: str = "") -> CorruptBusObjectError:
    """A bus object above MAX_STATE_BYTES (no object is larger than the state): refused unread. `where`: its URL."""
    return CorruptBusObjectError(key, f"{f'({where}) ' if where else ''}is larger than {MAX_STATE_BYTES >> 20} MiB, more than any "
                                      "writer of the bus writes")


class TooLarge(Exception):
    """An object above the size its reader allows (`size`: the size the store reported, None if it was found reading)."""

    def __init__(self, size: int | None = None):
        super().__init__(size)
        self.size = size


class CappedSink:
    """A stream an SDK downloads into, holding at most about `limit` bytes: TooLarge once it is given more, so that the
    download stops there (the bytes it holds then are the object's first, for a reader that wants only those)."""

    def __init__(self, limit: int):
        self.limit, self.parts, self.got = limit, [], 0

    def write(self, chunk: bytes) -> int:
        self.parts.append(bytes(chunk))
        self.got += len(chunk)
        if self.got > self.limit:
            raise TooLarge()
        return len(chunk)

    def value(self) -> bytes:
        return b"".join(self.parts)


STARTED_KEY = "started.json"  # beside the state: {"serial": the highest serial an apply began with} (State.started)


def read_started(backend: "StateBackend", state: State, where: str) -> State:
    """`state` with what the backend records of the applies begun (State.started). A record that is there but cannot be
    read is refused: taken as none, tags of applies that died before they saved would not be believed."""
    state.published = lambda: published_serial(backend)
    state.running = lambda: running_replicas(backend)
    state.assigned = lambda: assigned_replicas(backend)
    body = backend.read_key(STARTED_KEY)
    if body is None:
        return state
    try:
        serial = loads_json(body).get("serial")
    except (ValueError, AttributeError):
        serial = None
    if type(serial) is not int or not 0 <= serial <= SERIAL_MAX:
        raise ReconcileError(f"{where}: cannot read the highest serial an apply began with (expected {{\"serial\": N}}, N "
                             f"from 0 to 2**63-1). Nothing was changed. Delete it if no apply died since the last one that "
                             "finished (the next apply writes it again); else set it to that apply's serial.")
    state.started = serial
    return state


def published_serial(backend: "StateBackend") -> int:
    """The newest serial an apply published assignments with (State.published): the published assignments' and those the
    agents report running (an agent rewrites its report, so it outlives a bus put back from an older copy). 0: none."""
    from reconciler.runtime.bus import Bus

    bus = Bus(backend)
    docs = [*bus.agents(skipped={}).values(), *bus.assignments().values()]
    return max((d["serial"] for d in docs if type(d.get("serial")) is int and 0 <= d["serial"] <= SERIAL_MAX), default=0)


def running_replicas(backend: "StateBackend") -> dict[str, frozenset[str]]:
    """instance -> the "job/replica"s its agent reports running (State.running), of the reports alive by the bus's one
    rule (bus.reports_alive) and not marked lost; a report that cannot be read says nothing."""
    from reconciler.runtime.bus import Bus, now_unix, reports_alive, stale_seconds

    now, stale = now_unix(), stale_seconds()
    return {iid: frozenset(doc.get("running", ())) for iid, doc in Bus(backend).agents(skipped={}).items()
            if reports_alive(doc, now, stale) and not doc.get("lost")}


def assigned_replicas(backend: "StateBackend") -> dict[str, frozenset[str]]:
    """instance -> the "job/replica"s its published assignment lists (State.assigned); one that cannot be read says
    nothing (apply refuses it before any change; a plan names it)."""
    from reconciler.errors import CorruptBusObjectError
    from reconciler.runtime.bus import Bus

    bus, out = Bus(backend), {}
    for iid in bus.assigned_instances():
        try:
            doc = bus.assignment(iid)
        except CorruptBusObjectError:
            continue
        if doc is not None:
            out[iid] = frozenset(f"{e['job']}/{e['replica']}" for e in doc.get("replicas", []))
    return out


def record_start(backend: "StateBackend", state: State, serial: int) -> None:
    """Before an apply touches the cloud: record that one began with `serial`, so that the tags it writes are believed
    should it die before it saves the state (reconciler/placements.py). Under the apply lock."""
    state.started = max(serial, state.started or 0)
    backend.write_key(STARTED_KEY, json.dumps({"serial": state.started}).encode())


class LocalBackend:
    """.reconcile/state.json and .reconcile/apply.lock beside the config."""

    def __init__(self, config_dir: Path):
        self.config_dir = Path(config_dir)

    @property
    def location(self) -> str:
        """`local:` and a digest of this host's name and the state directory's real path: a clone of the config repo
        elsewhere (another directory, another machine) keeps its state elsewhere. A digest, not the path, since
        status/fleet.yaml is committed (a home directory and a host name in a public repo); describe_location says it."""
        import hashlib

        where = f"{socket.gethostname()}:{(self.config_dir / '.reconcile').resolve()}"
        return "local:" + hashlib.sha256(where.encode()).hexdigest()[:16]

    def describe_location(self) -> str:
        return f"{self.location}, i.e. {(self.config_dir / '.reconcile').resolve()} on {socket.gethostname()}"

    def load(self) -> State:
        return read_started(self, load_state(self.config_dir), str(self._path(STARTED_KEY)))

    def save(self, state: State) -> None:
        save_state(self.config_dir, state)

    @contextlib.contextmanager
    def lock(self) -> Iterator[str]:
        with ApplyLock(self.config_dir) as held:
            self._held = held
            try:
                yield held.id
            finally:
                self._held = None

    def unlock(self, lock_id: str) -> None:
        break_lock(self.config_dir, lock_id)

    def check_lock(self) -> None:
        held = getattr(self, "_held", None)
        if held is not None and not held.still_held():
            raise LockError(f"the lock {held.path} was broken while this apply ran (`reconcile unlock`?): "
                            "stopped before the next provider call; run plan again")

    def _path(self, key: str) -> Path:
        return self.config_dir / ".reconcile" / check_key(key)

    def read_key(self, key: str) -> bytes | None:
        """The object's bytes, None if there is none. Read as the state is: a regular file (a fifo would block the read
        for ever) of at most MAX_STATE_BYTES, no object being larger than the state (a 3 GiB started.json was read whole:
        "unexpected MemoryError")."""
        path = self._path(key)
        try:
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):
                raise CorruptBusObjectError(key, f"is not a file ({'a directory' if stat.S_ISDIR(mode) else 'a special file'})")
            body = read_regular(path, MAX_STATE_BYTES)
            if len(body) > MAX_STATE_BYTES:
                raise bus_object_too_large(key)
            return body
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ReconcileError(f"local bus: cannot read {path}: {e.strerror}") from None

    def list_keys_stamped(self, prefix: str) -> dict[str, Listed | None]:
        return dict.fromkeys(self.list_keys(prefix))

    def read_key_stamped(self, key: str, listed: Listed | None = None) -> Stamped | None:
        """The file's mtime, which this host's kernel set as it renamed the object into place (write_atomic), against
        this host's clock now: the same clock, whatever clock the writer's host keeps. (Stat after the read: an object
        replaced between the two was written later still, its writer no less alive.)"""
        body = self.read_key(key)
        if body is None:
            return None
        try:
            modified = self._path(key).stat().st_mtime
        except FileNotFoundError:
            return None  # (deleted since: read as gone, as a read a moment later would be)
        except OSError as e:
            raise ReconcileError(f"local bus: cannot read {self._path(key)}: {e.strerror}") from None
        return Stamped(body, modified, time.time() - modified)

    def write_key(self, key: str, body: bytes) -> None:
        path = self._path(key)
        try:
            write_atomic(path, body)  # readers see the old object or the new one, never half of one
        except OSError as e:
            raise ReconcileError(f"local bus: cannot write {path}: {e.strerror}") from None

    def write_file(self, key: str, path: Path, progress: Callable[[], None] | None = None) -> None:
        dest = self._path(key)
        try:
            with open(path, "rb") as src:
                copy_atomic(src, dest, Every(progress))
        except OSError as e:
            raise ReconcileError(f"local bus: cannot write {dest} from {path}: {e.strerror}") from None

    def read_file(self, key: str, dest: Path, progress: Callable[[], None] | None = None) -> bool:
        path = self._path(key)
        try:
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):  # (a fifo would block the read for ever)
                raise CorruptBusObjectError(key, f"is not a file ({'a directory' if stat.S_ISDIR(mode) else 'a special file'})")
            with open(path, "rb") as src:
                copy_atomic(src, Path(dest), Every(progress))
            return True
        except FileNotFoundError as e:
            if e.filename != str(path):  # (the destination's directory is missing: an error, not a missing key)
                raise ReconcileError(f"local bus: cannot copy {path} to {dest}: {e.strerror}") from None
            return False
        except OSError as e:
            raise (DiskFullError if disk_full(e) else ReconcileError)(f"local bus: cannot copy {path} to {dest}: {e.strerror}") from None

    def delete_key(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as e:  # (a directory at the object's name, listed for its readers to refuse: not ours to remove)
            raise CorruptBusObjectError(key, f"cannot be deleted ({e.strerror})") from None

    def list_keys(self, prefix: str) -> list[str]:
        root = self.config_dir / ".reconcile"
        base = root / check_key(prefix.rstrip("/"))
        if not base.is_dir():
            if os.path.lexists(base):  # (listed as no objects, apply created instances, then failed to write an assignment)
                raise ReconcileError(f"local bus: {base} is not a directory. Nothing was changed. Move it away (its objects' "
                                     "writers write them again), or restore the directory from a backup")
            return []
        # An object's name with something else there is listed too, for its reader to refuse: left out, a directory at
        # assignments/<instance>.json was no assignment, and apply created instances before it failed to write one.
        # A directory that cannot be listed is an error, as a remote store's failed listing is: Path.rglob skipped it,
        # and a finished job whose run record was in it was placed and run again (audit).
        out, todo = [], [base]
        while todo:
            d = todo.pop()
            try:
                with os.scandir(d) as entries:
                    for e in entries:
                        if e.is_dir():
                            todo.append(Path(e.path))
                        if not e.name.startswith(".") and (e.is_file() or e.name.endswith(".json")):
                            out.append(str(Path(e.path).relative_to(root)))
            except OSError as err:
                raise ReconcileError(f"local bus: cannot list {d}: {err.strerror}") from None
        return sorted(out)


class LeaseStore(Protocol):
    """What a remote backend provides for its lock: one object, written only conditionally. The lock's
    logic (expiry, takeover, renewal, unlock) is LeasedLock's, the same for every store."""

    lock_url: str  # for messages: s3://bucket/prefix/lock.json

    def lock_read(self) -> tuple[bytes, str] | None:
        """The lock object's bytes and version token (S3: ETag), or None if there is none."""
        ...

    def lock_create(self, body: bytes) -> str | None:
        """Create the lock object only if none exists (S3: If-None-Match: *): its token, or None."""
        ...

    def lock_replace(self, body: bytes, token: str) -> str | None:
        """Overwrite it only if it is still at `token` (S3: If-Match): the new token, or None."""
        ...

    def lock_delete(self, token: str) -> bool:
        """Delete it only if it is still at `token` (S3: If-Match); False if it is not."""
        ...


class LeasedLock:
    """An expiring lock in a LeaseStore, renewed by a heartbeat while held.

    The heartbeat rewrites the lock every `ttl / 3` with a later expiry, conditional on the token it
    last wrote. If the lock was broken or taken over (the condition fails), or could not be renewed
    before it expired, the lease is lost and check() raises: the apply stops before its next provider
    call. (Before, the 30-minute lock was never renewed: a second runner started while a long apply
    still ran and 13 instances were bought for 10.)"""

    def __init__(self, store: LeaseStore, ttl: timedelta, renew_every: float | None = None):
        self.store, self.ttl = store, ttl
        self.renew_every = renew_every if renew_every is not None else max(ttl.total_seconds() / 3, 1.0)
        self.lost: str | None = None
        self._stop = threading.Event()
        self._token_lock = threading.Lock()

    def _body(self, lock_id: str, since: str) -> bytes:
        now = utcnow()
        return json.dumps({"id": lock_id, "host": socket.gethostname(), "pid": os.getpid(), "since": since,
                           "expires": (now + self.ttl).isoformat(), "run": os.environ.get("GITHUB_RUN_ID", "")}).encode()

    def _refuse(self, h: dict) -> LockError:
        return LockError(f"another apply holds the lock {self.store.lock_url}: {describe_holder(h)}; "
                         f"if no apply is running, run `reconcile unlock {h['id']}`")

    @contextlib.contextmanager
    def hold(self) -> Iterator[str]:
        lock_id, since = uuid.uuid4().hex[:12], utcnow().isoformat()
        for _ in range(3):
            token = self.store.lock_create(self._body(lock_id, since))
            if token is not None:
                break
            current = self.store.lock_read()
            if current is None:
                continue  # released between our write and our read: try again
            h = lock_holder(current[0])
            if h.get("id") == lock_id:  # our create landed but the SDK's retry of it was refused: it is ours
                token = current[1]
                break
            expires = _when(h.get("expires"))
            if "garbled" in h or expires is None or expires >= utcnow():
                raise self._refuse(h)
            # Expired: its holder is gone (or stopped: it renews while alive). Replaced only if it is
            # still the lock we read, so of two runners taking it over exactly one wins.
            token = self.store.lock_replace(self._body(lock_id, since), current[1])
            if token is not None:
                break
        else:
            raise LockError(f"could not take the lock {self.store.lock_url} after 3 tries")
        self.lost = None
        self._stop.clear()
        self._token = token
        beat = threading.Thread(target=self._heartbeat, args=(lock_id, since), name="lock-heartbeat", daemon=True)
        beat.start()
        try:
            yield lock_id
        finally:
            self._stop.set()
            beat.join()
            if self.lost is None:
                with contextlib.suppress(ReconcileError):
                    self.store.lock_delete(self._token)  # only if still ours: a broken lock's new holder keeps it

    def _heartbeat(self, lock_id: str, since: str) -> None:
        deadline = utcnow() + self.ttl
        while not self._stop.wait(self.renew_every):
            body = self._body(lock_id, since)
            try:
                token = self.store.lock_replace(body, self._token)
            except ReconcileError as e:  # the store is unreachable: try again, until the lease runs out
                if utcnow() >= deadline - timedelta(seconds=self.renew_every):
                    self.lost = f"it could not be renewed before it expired ({e})"
                    return
                continue
            if token is None:
                self.lost = "it was broken or taken over by another runner"
                return
            self._token = token
            deadline = _when(json.loads(body)["expires"]) or deadline

    def check(self) -> None:
        if self.lost is not None:
            raise LockError(f"lost the lock {self.store.lock_url}: {self.lost}; this apply stopped before its next "
                            "provider call (what it did so far is in the cloud); run plan again")

    def unlock(self, lock_id: str) -> None:
        # A live holder renews its lease every ttl/3, so the object can change between our read and our
        # conditional delete while the holder stays the same: read again and retry. Only a change of
        # holder (or a store that keeps changing) is a refusal.
        for _ in range(5):
            current = self.store.lock_read()
            if current is None:
                raise LockError("no lock is held")
            h = lock_holder(current[0])
            if h["id"] != lock_id:
                raise LockError(f"the lock is held by {h['id']}, not {lock_id}; refusing to break it")
            if self.store.lock_delete(current[1]):
                return
        raise LockError(f"the lock {self.store.lock_url} changed while it was being broken; look again")


def _when(text) -> datetime | None:
    """A lock's time; one without a zone is UTC's, as a config's is (compared with the clock, it was a TypeError)."""
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


class ObjectStoreBackend:
    """The state, the lock and the bus as objects under one prefix of a bucket: `prefix/state.json`,
    `prefix/lock.json` (a LeasedLock over the store's conditional writes) and the bus keys.

    S3, GCS and Azure Blob differ only in the object calls below and in their conditional-write
    tokens (ETag, generation, ETag); the semantics (exactly one of two racers gets the lock, expiry,
    takeover, renewal, unlock) are LeasedLock's, shared."""

    kind = ""  # the URL scheme: names the backend in messages

    def _paths(self, url: str, root: str, prefix: str, ttl: timedelta | None) -> None:
        self.url, self.root = url, root  # root: scheme://bucket (or account/container)
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.location = f"{root}/{prefix}" if prefix else root  # (s3://b/p/ and s3://b/p name one place)
        self.state_key = f"{self.prefix}state.json"
        self.lock_key = f"{self.prefix}lock.json"
        self.ttl = ttl if ttl is not None else LOCK_TTL
        self.lease = LeasedLock(self, self.ttl)

    # -- the object calls each store implements (they raise the SDK's own errors) --------------------
    def _get(self, key: str, limit: int) -> bytes | None:
        """The whole object, None if there is none; TooLarge, having read little more than `limit` bytes of it (or
        nothing, where the store reports its size first), if it is larger than `limit`."""
        raise NotImplementedError

    def _get_stamped(self, key: str, limit: int) -> Stamped | None:
        """_get's object with the store's times of its last write and of the response (Stamped); TooLarge as _get."""
        raise NotImplementedError

    def _get_listed(self, key: str, limit: int, listed: Listed) -> Stamped | None:
        """The body of exactly the version `listed`, judged by the listing's stamp; rewritten since the listing: read
        afresh (_get_stamped); gone: None. Only a store whose _list_stamped gives a Listed implements it."""
        raise NotImplementedError

    def _list_stamped(self, prefix: str) -> list[tuple[str, Listed | None]]:
        """_list's keys with what the listing says of each: None here, where a GET stamps its object in the same
        response (S3, Azure). A store whose stamped read costs more (GCS) returns the listing's stamps."""
        return [(k, None) for k in self._list(prefix)]

    def _put(self, key: str, body: bytes) -> None:
        raise NotImplementedError

    def _remove(self, key: str) -> None:
        raise NotImplementedError

    def _list(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def _put_file(self, key: str, path: Path) -> None:
        """Upload the file `path`, streamed (the SDK's managed, chunked transfer)."""
        raise NotImplementedError

    def _get_file(self, key: str, dest: Path) -> bool:
        """Download into the file `dest` (a temporary name, ours), streamed; False if there is no such object."""
        raise NotImplementedError

    def _code(self, e: Exception) -> str:
        """The store's error code for a message (never a credential: connection errors are redacted)."""
        return redact(str(e)) or type(e).__name__

    # -- shared -----------------------------------------------------------------------------------
    @property
    def lock_url(self) -> str:
        return f"{self.root}/{self.lock_key}"

    def _error(self, e: Exception, what: str, key: str | None = None) -> ReconcileError:
        return ReconcileError(f"{self.kind} state backend: {what} {self.root}/{key or self.state_key}: {self._code(e)}. Nothing was "
                              "changed by this step; check the endpoint, the bucket and the credentials, then run again.")

    def load(self) -> State:
        try:
            body = self._get(self.state_key, MAX_STATE_BYTES)
        except TooLarge:  # (read whole, a 3 GiB object was an unbounded download, then a MemoryError)
            raise state_too_large(f"{self.root}/{self.state_key}") from None
        except Exception as e:  # the SDK's errors and connection errors
            raise self._error(e, "cannot read") from None
        state = State() if body is None else state_from_json(body, f"{self.root}/{self.state_key}")
        return read_started(self, state, f"{self.root}/{self.prefix}{STARTED_KEY}")

    def save(self, state: State) -> None:
        try:
            self._put(self.state_key, state_to_json(state).encode())
        except Exception as e:
            raise self._error(e, "cannot write") from None

    def holder(self) -> tuple[dict, str] | None:
        current = self.lock_read()
        return (lock_holder(current[0]), current[1]) if current is not None else None

    @contextlib.contextmanager
    def lock(self) -> Iterator[str]:
        with self.lease.hold() as lock_id:
            yield lock_id

    def unlock(self, lock_id: str) -> None:
        self.lease.unlock(lock_id)

    def check_lock(self) -> None:
        self.lease.check()

    def _bus_error(self, e: Exception, what: str, key: str) -> ReconcileError:
        return ReconcileError(f"{self.kind} bus: {what} {self.root}/{self.prefix}{key}: {self._code(e)}")

    def read_key(self, key: str) -> bytes | None:
        check_key(key)
        try:
            return self._get(self.prefix + key, MAX_STATE_BYTES)
        except TooLarge:
            raise bus_object_too_large(key, f"{self.root}/{self.prefix}{key}") from None
        except Exception as e:
            raise self._bus_error(e, "cannot read", key) from None

    def read_key_stamped(self, key: str, listed: Listed | None = None) -> Stamped | None:
        check_key(key)
        try:
            if listed is not None:
                return self._get_listed(self.prefix + key, MAX_STATE_BYTES, listed)
            return self._get_stamped(self.prefix + key, MAX_STATE_BYTES)
        except TooLarge:
            raise bus_object_too_large(key, f"{self.root}/{self.prefix}{key}") from None
        except Exception as e:
            raise self._bus_error(e, "cannot read", key) from None

    def write_key(self, key: str, body: bytes) -> None:
        check_key(key)
        try:
            self._put(self.prefix + key, body)
        except Exception as e:
            raise self._bus_error(e, "cannot write", key) from None

    def delete_key(self, key: str) -> None:
        check_key(key)
        try:
            self._remove(self.prefix + key)
        except Exception as e:
            raise self._bus_error(e, "cannot delete", key) from None

    def write_file(self, key: str, path: Path, progress: Callable[[], None] | None = None) -> None:
        check_key(key)
        try:
            _beating(lambda: self._put_file(self.prefix + key, Path(path)), progress)
        except Exception as e:
            raise self._bus_error(e, "cannot write", key) from None

    def read_file(self, key: str, dest: Path, progress: Callable[[], None] | None = None) -> bool:
        check_key(key)
        dest = Path(dest)
        part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:12]}.part")  # renamed into place only once whole
        try:
            if not _beating(lambda: self._get_file(self.prefix + key, part), progress):
                return False
            os.replace(part, dest)
            return True
        except Exception as e:
            if disk_full(e):
                raise DiskFullError(f"{self.kind} bus: cannot copy {self.root}/{self.prefix}{key} to {dest}: no room on the local "
                                    "disk (full, a quota or a file-size limit)") from None
            raise self._bus_error(e, "cannot read", key) from None
        finally:
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        return list(self.list_keys_stamped(prefix))

    def list_keys_stamped(self, prefix: str) -> dict[str, Listed | None]:
        base = self.prefix + check_key(prefix.rstrip("/")) + "/"
        try:
            return {k[len(self.prefix):]: listed for k, listed in sorted(self._list_stamped(base), key=lambda kv: kv[0])}
        except Exception as e:
            raise self._bus_error(e, "cannot list", prefix) from None


# An object store request's connect and read timeouts (S3, GCS, Azure Blob): the libraries' own (botocore 60 s each, 5
# tries; GCS 60 s each; Azure 20 s and 60 s, then a backoff of 15 s and more a retry) held one call of a store that
# stopped answering minutes, the agent's loop with it. A read timeout is per socket read, not per object: a large
# checkpoint's transfer is not cut by it.
STORE_CONNECT_TIMEOUT_S = 5.0
STORE_READ_TIMEOUT_S = 10.0
# A file above the threshold is uploaded in parts (S3's PutObject refuses a body over 5 GB; AWS recommends multipart
# above ~100 MB), S3_CONCURRENCY at a time: about S3_PART_SIZE * S3_CONCURRENCY bytes in memory. (Parts are 5 MiB to
# 5 GiB, at most 10,000 of them: boto3 makes the parts of a file over 160 GB larger.)
S3_MULTIPART_THRESHOLD = 64 << 20
S3_PART_SIZE = 16 << 20
# The IAM action of each S3 call the backend makes whose name is not its own (Amazon S3's "Actions, resources, and
# condition keys"): a listing is s3:ListBucket, a HEAD a GetObject, a multipart upload's parts PutObject.
S3_ACTIONS = {"ListObjectsV2": "ListBucket", "HeadObject": "GetObject", "CreateMultipartUpload": "PutObject",
              "UploadPart": "PutObject", "CompleteMultipartUpload": "PutObject", "CopyObject": "PutObject"}
S3_CONCURRENCY = 4


def _s3_response(e: Exception) -> dict:
    """The S3 response an error carries ({} for none): a ClientError's; a timeout or a dropped connection has
    `response` None (read as a dict, that was an AttributeError out of the bus's error message: the agent died)."""
    return getattr(e, "response", None) or {}


class S3Backend(ObjectStoreBackend):
    """s3://bucket/prefix.

    The endpoint comes from the standard AWS configuration (AWS_ENDPOINT_URL_S3 or
    AWS_ENDPOINT_URL for S3-compatible stores and tests); credentials from the AWS chain."""

    kind = "s3"

    def __init__(self, url: str, ttl: timedelta | None = None):
        u = urlparse(url)
        if u.scheme != "s3" or not u.netloc:
            raise ReconcileError(f"state backend {url!r} is not s3://bucket/prefix")
        self.bucket = u.netloc
        self._paths(url, f"s3://{self.bucket}", u.path, ttl)
        try:
            from botocore.config import Config  # lazy: only teams using the s3 backend need it

            from providers.aws import aws_session
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ReconcileError("the s3 state backend needs boto3: pip install 'fleetops-reconciler[aws]'") from e
        # (botocore's 60 s connect and read timeouts, 5 tries: a store that stopped answering held one read 362 s, the
        # agent's loop with it: no notice seen, no kill at a grace's end. A read timeout is per socket read, not per
        # object: a large checkpoint's transfer is not cut by it)
        self.s3 = aws_session().client("s3", config=Config(connect_timeout=STORE_CONNECT_TIMEOUT_S, read_timeout=STORE_READ_TIMEOUT_S,
                                                           retries={"mode": "standard", "max_attempts": 5}))
        self.multipart_threshold, self.part_size = S3_MULTIPART_THRESHOLD, S3_PART_SIZE

    def _code(self, e: Exception) -> str:
        """S3's error code; a refusal (AccessDenied) names the IAM action the call needs, which S3's message does not."""
        code = _s3_response(e).get("Error", {}).get("Code") or redact(str(e)) or type(e).__name__
        operation = getattr(e, "operation_name", "")
        if code == "AccessDenied" and operation:
            return f"{code} (the credentials may not s3:{S3_ACTIONS.get(operation, operation)})"
        return code

    def _get(self, key: str, limit: int) -> bytes | None:
        got = self._get_object(key, limit)
        return None if got is None else got[0]

    def _get_object(self, key: str, limit: int) -> tuple[bytes, dict] | None:
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.NoSuchKey:
            return None
        with contextlib.closing(obj["Body"]) as body:  # (closed unread: the rest of a large body is never downloaded)
            if obj.get("ContentLength", 0) > limit:
                raise TooLarge(obj["ContentLength"])
            sink = CappedSink(limit)
            for chunk in body.iter_chunks(1 << 20):
                sink.write(chunk)
            return sink.value(), obj

    def _get_stamped(self, key: str, limit: int) -> Stamped | None:
        """LastModified against the same response's Date header: both S3's clock (whole seconds)."""
        got = self._get_object(key, limit)
        if got is None:
            return None
        body, obj = got
        modified = obj["LastModified"].timestamp()
        now = _http_date(obj.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date"))
        if now is None:
            raise ReconcileError(f"the response for {key} has no Date header: the store's clock is unknown")
        return Stamped(body, modified, now - modified)

    def _put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")

    def _remove(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=key)

    def _list(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def _transfer(self):
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.multipart_threshold, multipart_chunksize=self.part_size,
                              max_concurrency=S3_CONCURRENCY)

    def _put_file(self, key: str, path: Path) -> None:
        # boto3's managed transfer: one PutObject up to the threshold, a multipart upload above it (aborted if it fails)
        self.s3.upload_file(str(path), self.bucket, key, Config=self._transfer())

    def _get_file(self, key: str, dest: Path) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.download_file(self.bucket, key, str(dest), Config=self._transfer())  # ranged GETs above the threshold
        except ClientError as e:
            if _s3_response(e).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                self.s3.head_bucket(Bucket=self.bucket)  # (a HEAD's 404 has no reason: a missing bucket is no missing key)
                return False
            raise
        return True

    # -- the lock: LeasedLock over these four conditional operations ------------------------------
    @staticmethod
    def _precondition_failed(e: Exception) -> bool:
        r = _s3_response(e)
        return r.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey") or \
            r.get("ResponseMetadata", {}).get("HTTPStatusCode") in (404, 409, 412)

    def _conditional(self, what: str, call: Callable[[], dict]) -> dict | None:
        """The response of a conditional lock call; None if its condition failed."""
        from botocore.exceptions import ClientError

        try:
            return call()
        except ClientError as e:
            if self._precondition_failed(e):
                return None
            raise self._error(e, what, self.lock_key) from None
        except Exception as e:  # connection errors
            raise self._error(e, what, self.lock_key) from None

    def lock_read(self) -> tuple[bytes, str] | None:
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=self.lock_key)
            with contextlib.closing(obj["Body"]) as body:  # its first LOCK_BYTES, as of a lock file (a lock is ~150 bytes)
                return body.read(LOCK_BYTES), obj["ETag"]
        except self.s3.exceptions.NoSuchKey:
            return None
        except Exception as e:
            raise self._error(e, "cannot read the lock", self.lock_key) from None

    def lock_create(self, body: bytes) -> str | None:
        r = self._conditional("cannot lock", lambda: self.s3.put_object(Bucket=self.bucket, Key=self.lock_key, Body=body, IfNoneMatch="*"))
        return r["ETag"] if r is not None else None

    def lock_replace(self, body: bytes, token: str) -> str | None:
        r = self._conditional("cannot renew the lock", lambda: self.s3.put_object(Bucket=self.bucket, Key=self.lock_key, Body=body, IfMatch=token))
        return r["ETag"] if r is not None else None

    def lock_delete(self, token: str) -> bool:
        return self._conditional("cannot unlock", lambda: self.s3.delete_object(Bucket=self.bucket, Key=self.lock_key, IfMatch=token)) is not None


GCS_RETRY_SECONDS = 60.0  # how long one GCS call retries transient errors (the client's default is 120 s)
AZBLOB_RETRIES = 5  # retries of one Azure Blob call (the SDK's default is 10, exponential backoff)
AZBLOB_BACKOFF_S = 1.0  # Azure's first retry after this, then 2 s more, 4 s, ... (the SDK's: 15 s, then 3 s, 9 s, ...)
# A file is uploaded resumably in chunks of this (a multiple of 256 KiB; the library's default is 100 MiB, held in memory)
GCS_CHUNK = 16 << 20
# A blob above AZBLOB_BLOCK is uploaded in blocks (Put Block, then Put Block List), AZBLOB_CONCURRENCY at a time, and
# downloaded in ranged GETs of that size; below it, in one Put Blob (the SDK reads such a body whole: its default
# threshold is 64 MiB, its first GET 32 MiB)
AZBLOB_BLOCK = 8 << 20
AZBLOB_CONCURRENCY = 4


class GcsBackend(ObjectStoreBackend):
    """gs://bucket/prefix (google-cloud-storage).

    The lock is created with ifGenerationMatch=0 (only if no live object exists) and renewed or
    deleted with ifGenerationMatch=<the generation this runner last wrote>: GCS answers 412 to a
    failed condition, so of two racers exactly one succeeds. Credentials: Application Default
    Credentials; STORAGE_EMULATOR_HOST (the client library's own setting) points it at an emulator."""

    kind = "gs"

    def __init__(self, url: str, ttl: timedelta | None = None):
        u = urlparse(url)
        if u.scheme != "gs" or not u.netloc:
            raise ReconcileError(f"state backend {url!r} is not gs://bucket/prefix")
        self._paths(url, f"gs://{u.netloc}", u.path, ttl)
        try:  # lazy: only teams using the gs backend need it
            from google.api_core import exceptions
            from google.api_core.retry import Retry
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage
            from google.cloud.storage.retry import DEFAULT_RETRY
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ReconcileError("the gs state backend needs google-cloud-storage: pip install 'fleetops-reconciler[gcp]'") from e
        self._exc = exceptions
        retry: Retry = DEFAULT_RETRY.with_timeout(GCS_RETRY_SECONDS)
        self._call = {"retry": retry, "timeout": (STORE_CONNECT_TIMEOUT_S, STORE_READ_TIMEOUT_S)}  # each request's
        try:
            self.client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None)
        except DefaultCredentialsError as e:
            from providers.gcp import adc_problem

            raise ReconcileError(f"gs state backend: {adc_problem(e)}") from None
        self.bucket = self.client.bucket(u.netloc)
        self._dates = threading.local()  # the Date header of this thread's last response: GCS's clock (_get_stamped)
        self.client._http.hooks["response"].append(self._saw_response)

    def _saw_response(self, response, *args, **kwargs):
        self._dates.last = response.headers.get("Date")
        return response

    def _code(self, e: Exception) -> str:
        if isinstance(e, self._exc.GoogleAPICallError):
            return redact(f"HTTP {e.code} {e.message}".strip())
        return redact(str(e)) or type(e).__name__

    def _get(self, key: str, limit: int) -> bytes | None:
        sink = CappedSink(limit)  # (the download stops once it is past `limit`)
        try:
            self.bucket.blob(key).download_to_file(sink, **self._call)
        except self._exc.NotFound:
            return None
        return sink.value()

    def _get_stamped(self, key: str, limit: int) -> Stamped | None:
        """The object's metadata (`updated`, and the Date header of that response: both GCS's clock), then the body of
        exactly that generation (changed between the two calls: read again). The media download carries no time the
        client exposes, and on the emulator none at all."""
        for _ in range(5):
            self._dates.last = None
            blob = self.bucket.get_blob(key, **self._call)
            if blob is None:
                return None
            now = _http_date(self._dates.last)
            sink = CappedSink(limit)
            try:
                self.bucket.blob(key).download_to_file(sink, if_generation_match=blob.generation, **self._call)
            except (self._exc.PreconditionFailed, self._exc.NotFound):
                continue
            if now is None or blob.updated is None:
                raise ReconcileError(f"the metadata of {key} has no time of its last write, or its response no Date header")
            modified = blob.updated.timestamp()
            return Stamped(sink.value(), modified, now - modified)
        raise ReconcileError(f"{key} changed on every read")

    def _get_listed(self, key: str, limit: int, listed: Listed) -> Stamped | None:
        sink = CappedSink(limit)
        try:
            self.bucket.blob(key).download_to_file(sink, if_generation_match=int(listed.version), **self._call)
        except self._exc.NotFound:
            return None  # (deleted since the listing: gone, as a read a moment later would find it)
        except self._exc.PreconditionFailed:
            return self._get_stamped(key, limit)  # rewritten since: never judged by the older write's stamp
        return Stamped(sink.value(), listed.modified, listed.age_now())

    def _list_stamped(self, prefix: str) -> list[tuple[str, Listed | None]]:
        """Each object's generation and `updated`, against the Date header of its page's response (GCS's clock)."""
        out: list[tuple[str, Listed | None]] = []
        pages = iter(self.client.list_blobs(self.bucket, prefix=prefix, **self._call).pages)
        while True:
            self._dates.last = None
            page = next(pages, None)
            if page is None:
                return out
            now, at = _http_date(self._dates.last), time.monotonic()
            for b in page:
                stamp = None if now is None or b.updated is None or b.generation is None else b.updated.timestamp()
                out.append((b.name, None if stamp is None else Listed(str(b.generation), stamp, now - stamp, at)))

    def _put(self, key: str, body: bytes) -> None:
        self.bucket.blob(key).upload_from_string(body, content_type="application/json", **self._call)

    def _remove(self, key: str) -> None:
        with contextlib.suppress(self._exc.NotFound):
            self.bucket.blob(key).delete(**self._call)

    def _put_file(self, key: str, path: Path) -> None:
        # (a file over 8 MiB, or any with chunk_size set: a resumable upload, chunk by chunk, each chunk retried)
        self.bucket.blob(key, chunk_size=GCS_CHUNK).upload_from_filename(str(path), content_type="application/octet-stream",
                                                                         **self._call)

    def _get_file(self, key: str, dest: Path) -> bool:
        try:
            self.bucket.blob(key).download_to_filename(str(dest), **self._call)  # streamed, its checksum checked
        except self._exc.NotFound:
            return False
        return True

    def _conditional(self, what: str, call: Callable[[], object]) -> tuple[bool, object]:
        """(True, result) or (False, None) if the call's generation condition failed (412, or 404: gone)."""
        try:
            return True, call()
        except (self._exc.PreconditionFailed, self._exc.NotFound):
            return False, None
        except Exception as e:
            raise self._error(e, what, self.lock_key) from None

    def lock_read(self) -> tuple[bytes, str] | None:
        for _ in range(5):
            ok, blob = self._conditional("cannot read the lock", lambda: self.bucket.get_blob(self.lock_key, **self._call))
            if not ok or blob is None:
                return None
            # The body of exactly that generation: if it changed between the two calls, look again.
            generation = blob.generation
            ok, body = self._conditional("cannot read the lock", lambda: self._lock_bytes(generation))
            if ok:
                return body, str(generation)
        raise self._error(ReconcileError("it changed on every read"), "cannot read the lock", self.lock_key)

    def _lock_bytes(self, generation: int) -> bytes:
        """The first LOCK_BYTES of the lock at `generation`, as of a lock file (a lock is ~150 bytes)."""
        sink = CappedSink(LOCK_BYTES)
        with contextlib.suppress(TooLarge):  # (the download stopped there: those bytes name a garbled lock's id)
            self.bucket.blob(self.lock_key).download_to_file(sink, if_generation_match=generation, **self._call)
        return sink.value()[:LOCK_BYTES]

    def _upload_lock(self, what: str, body: bytes, generation: int) -> str | None:
        blob = self.bucket.blob(self.lock_key)
        ok, _ = self._conditional(what, lambda: blob.upload_from_string(body, content_type="application/json",
                                                                          if_generation_match=generation, **self._call))
        return str(blob.generation) if ok else None

    def lock_create(self, body: bytes) -> str | None:
        return self._upload_lock("cannot lock", body, 0)

    def lock_replace(self, body: bytes, token: str) -> str | None:
        return self._upload_lock("cannot renew the lock", body, int(token))

    def lock_delete(self, token: str) -> bool:
        return self._conditional("cannot unlock", lambda: self.bucket.blob(self.lock_key).delete(
            if_generation_match=int(token), **self._call))[0]


class AzureBlobBackend(ObjectStoreBackend):
    """azblob://account/container/prefix (azure-storage-blob).

    The lock is created with If-None-Match: * and renewed or deleted with If-Match: <the ETag this
    runner last wrote> (409/412 when the condition fails). Credentials: AZURE_STORAGE_CONNECTION_STRING
    (also how an emulator such as Azurite is named; it must name the URL's account), else
    AZURE_STORAGE_KEY, else azure-identity's DefaultAzureCredential (managed identity, `az login`)."""

    kind = "azblob"

    def __init__(self, url: str, ttl: timedelta | None = None):
        u = urlparse(url)
        container, _, prefix = u.path.lstrip("/").partition("/")
        if u.scheme != "azblob" or not u.netloc or not container:
            raise ReconcileError(f"state backend {url!r} is not azblob://account/container/prefix")
        self.account, self.container_name = u.netloc, container
        self._paths(url, f"azblob://{self.account}/{container}", prefix, ttl)
        try:  # lazy: only teams using the azblob backend need it
            from azure.core import MatchConditions
            from azure.core import exceptions
            from azure.storage.blob import BlobServiceClient, ContentSettings
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ReconcileError("the azblob state backend needs azure-storage-blob: pip install 'fleetops-reconciler[azure]'") from e
        self._exc, self._unmodified = exceptions, MatchConditions.IfNotModified
        self._json = ContentSettings(content_type="application/json")
        self._octets = ContentSettings(content_type="application/octet-stream")
        options = {"retry_total": AZBLOB_RETRIES, "initial_backoff": AZBLOB_BACKOFF_S, "increment_base": 2,
                   "connection_timeout": STORE_CONNECT_TIMEOUT_S, "read_timeout": STORE_READ_TIMEOUT_S, "max_single_put_size": AZBLOB_BLOCK, "max_block_size": AZBLOB_BLOCK,
                   "max_single_get_size": AZBLOB_BLOCK, "max_chunk_get_size": AZBLOB_BLOCK}  # (a get's chunk is held whole)
        conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        if conn:
            fields = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
            named = "devstoreaccount1" if fields.get("UseDevelopmentStorage", "").lower() == "true" else fields.get("AccountName")
            if named and named != self.account:
                raise ReconcileError(f"azblob state backend: AZURE_STORAGE_CONNECTION_STRING is for account {named!r}, "
                                     f"not {self.account!r} of {url}")
            try:
                service = BlobServiceClient.from_connection_string(conn, **options)
            except ValueError:  # ("Connection string is either blank or malformed": "unexpected ValueError ... a bug")
                raise ReconcileError("azblob state backend: AZURE_STORAGE_CONNECTION_STRING is not a connection string "
                                     "(DefaultEndpointsProtocol=https;AccountName=...;AccountKey=...; its value is not shown): "
                                     "fix it, or unset it to use AZURE_STORAGE_KEY or Azure AD") from None
        else:
            endpoint = f"https://{self.account}.blob.core.windows.net"
            key = os.environ.get("AZURE_STORAGE_KEY")
            if key:
                credential: object = {"account_name": self.account, "account_key": key}
            else:
                try:
                    from azure.identity import DefaultAzureCredential
                except ImportError as e:  # pragma: no cover - depends on the install
                    raise ReconcileError("the azblob state backend needs azure-identity: pip install 'fleetops-reconciler[azure]'") from e
                credential = DefaultAzureCredential()
            service = BlobServiceClient(endpoint, credential=credential, **options)
        self.container = service.get_container_client(container)

    def _code(self, e: Exception) -> str:
        if isinstance(e, self._exc.HttpResponseError) and getattr(e, "status_code", None):
            return redact(f"HTTP {e.status_code} {e.error_code or e.reason or ''}".strip())
        return redact(str(e).splitlines()[0] if str(e) else "") or type(e).__name__

    def _get(self, key: str, limit: int) -> bytes | None:
        try:
            download = self.container.get_blob_client(key).download_blob()  # (its first GET: AZBLOB_BLOCK at most)
        except self._exc.ResourceNotFoundError:
            return None
        if download.size > limit:  # (the blob's size, from the first GET's Content-Range)
            raise TooLarge(download.size)
        return download.readall()

    def _get_stamped(self, key: str, limit: int) -> Stamped | None:
        """The blob's Last-Modified against the Date header of the same GET: both Azure's clock."""
        date: list[str | None] = []
        try:
            download = self.container.get_blob_client(key).download_blob(
                raw_response_hook=lambda r: date.append(r.http_response.headers.get("Date")))
        except self._exc.ResourceNotFoundError:
            return None
        if download.size > limit:
            raise TooLarge(download.size)
        body = download.readall()
        now, modified = _http_date(date[0] if date else None), download.properties.last_modified
        if now is None or modified is None:
            raise ReconcileError(f"the response for {key} has no Date or Last-Modified header: the store's clock is unknown")
        return Stamped(body, modified.timestamp(), now - modified.timestamp())

    def _put(self, key: str, body: bytes) -> None:
        self.container.get_blob_client(key).upload_blob(body, overwrite=True, content_settings=self._json)

    def _remove(self, key: str) -> None:
        with contextlib.suppress(self._exc.ResourceNotFoundError):
            self.container.get_blob_client(key).delete_blob()

    def _list(self, prefix: str) -> list[str]:
        return [b.name for b in self.container.list_blobs(name_starts_with=prefix)]

    def _put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as f:
            self.container.get_blob_client(key).upload_blob(f, length=os.fstat(f.fileno()).st_size, overwrite=True,
                                                            max_concurrency=AZBLOB_CONCURRENCY, content_settings=self._octets)

    def _get_file(self, key: str, dest: Path) -> bool:
        try:
            download = self.container.get_blob_client(key).download_blob(max_concurrency=AZBLOB_CONCURRENCY)
        except self._exc.ResourceNotFoundError:
            return False
        with open(dest, "wb") as f:
            download.readinto(f)  # chunk by chunk (max_chunk_get_size), each ranged GET retried
        return True

    def _conditional(self, what: str, call: Callable[[], object]) -> tuple[bool, object]:
        """(True, result) or (False, None) if the call's condition failed (409 exists, 412 changed, 404 gone)."""
        try:
            return True, call()
        except (self._exc.ResourceExistsError, self._exc.ResourceModifiedError, self._exc.ResourceNotFoundError):
            return False, None
        except Exception as e:
            raise self._error(e, what, self.lock_key) from None

    def lock_read(self) -> tuple[bytes, str] | None:
        def read():
            download = self.container.get_blob_client(self.lock_key).download_blob()
            # One GET: the body and its ETag agree. Its first LOCK_BYTES, as of a lock file (a lock is ~150 bytes).
            return download.read(LOCK_BYTES), download.properties.etag

        ok, current = self._conditional("cannot read the lock", read)
        return current if ok else None  # type: ignore[return-value]

    def lock_create(self, body: bytes) -> str | None:
        blob = self.container.get_blob_client(self.lock_key)
        ok, r = self._conditional("cannot lock", lambda: blob.upload_blob(body, overwrite=False, content_settings=self._json))
        return r["etag"] if ok else None  # type: ignore[index]

    def lock_replace(self, body: bytes, token: str) -> str | None:
        blob = self.container.get_blob_client(self.lock_key)
        ok, r = self._conditional("cannot renew the lock", lambda: blob.upload_blob(
            body, overwrite=True, etag=token, match_condition=self._unmodified, content_settings=self._json))
        return r["etag"] if ok else None  # type: ignore[index]

    def lock_delete(self, token: str) -> bool:
        blob = self.container.get_blob_client(self.lock_key)
        return self._conditional("cannot unlock", lambda: blob.delete_blob(etag=token, match_condition=self._unmodified))[0]


BACKENDS = {"s3": S3Backend, "gs": GcsBackend, "azblob": AzureBlobBackend}


def backend_for(config_dir: Path, url: str | None = None) -> StateBackend:
    """`url` None or 'local' -> LocalBackend; s3://bucket/prefix, gs://bucket/prefix or
    azblob://account/container/prefix -> the object-store backend for it."""
    if not url or url == "local":
        return LocalBackend(config_dir)
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in BACKENDS:
        u = urlparse(url)
        if "@" in u.netloc:  # a bucket name never holds '@': a key pasted in would reach the SDK's errors
            raise ReconcileError(f"state backend {url!r}: credentials do not go in the URL (user:secret@); the "
                                 f"{scheme} backend takes them from its cloud's usual chain (environment, profile, identity)")
        if "?" in url or "#" in url:  # no store reads one, and the URL as given goes into every instance's user data
            raise ReconcileError(f"state backend {scheme}://{u.netloc}{u.path}: credentials do not go in the URL (a "
                                 f"query string or fragment, such as a SAS or a presigned signature, is refused unread: "
                                 f"the agents' --state would carry it into every instance's user data); the {scheme} "
                                 "backend takes them from its cloud's usual chain (environment, profile, identity)")
        return BACKENDS[scheme](url)
    raise ReconcileError(f"unknown state backend {url!r}: use 'local', s3://bucket/prefix, gs://bucket/prefix "
                         "or azblob://account/container/prefix")
