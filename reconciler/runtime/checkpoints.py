"""Checkpoints that follow a job across instances, through the state backend (the bus's).

A job's `checkpoint.dir` is a directory on the instance's own disk (`--checkpoint-root`/JOB/DIR). A replica the plan
moves to another instance (a spot reclaim, a lost node, a consolidation) would find nothing there, so the agent copies
the directory through the state backend:

    checkpoints/<job>/data/<generation>/<path>       each file of one upload
    checkpoints/<job>/manifests/<generation>.json    written last: the upload's file list, sizes, sha256s, spec hash,
                                                     epoch, instance and time; a generation without one is unfinished

A generation is `<unix ms, 13 digits>-<instance>`: names sort by time. `upload` runs after a replica ended on its
checkpoint signal (a stop it survives: a spot notice, a move, an edit, the agent stopping), once no other replica of the
job on the instance still runs (a gang's ranks write into one directory); `restore` runs before a replica starts and
fills an empty or older local directory from the newest complete upload whose every file is there with its sha256. A
generation with a missing or corrupt file is skipped whole (logged), never half-restored.

Gangs (a job of several replicas, its ranks on one or several instances). What is guaranteed:

- One stop for the whole gang. When a rank stops for a stop it survives (a spot notice, its agent stopping, a move or
  an edit) every other rank of its round (spec hash and epoch) is stopped with its checkpoint signal too, within an
  agent poll of the first one's signal (agent.peer_stop, reason GangStopped), and each instance uploads its directory
  for that round; an instance whose directory is empty (plain DDP saves on rank 0) uploads a manifest with no files. Each
  manifest names the ranks its instance held (`replicas`, `world_size`). A rank that exits 0 while a peer of its round
  stops (a job that reduces its stop flag over its ranks) is that stop, not Succeeded. A rank whose agent is lost (no
  heartbeat for the stale limit, its instance reported gone: agent.peer_lost) stops the others the same way
  (GangPeerLost), once that limit has passed, or, lost before it took up the round (no record of it: judged by the
  agent of the instance its assignment names), keeps them from starting (WaitingForGang, naming it); the lost rank
  uploads nothing, so that round is never complete.
- One round for every rank. Before a rank starts on a new assignment (a new epoch or spec), moved or not, its agent
  waits (a grace plus 30 s at most) until no peer's copy of the round before still runs or uploads, then makes the
  job's directory hold exactly the newest complete round: the newest round whose uploads hold every rank, each
  upload's every file there with its sha256 (`restore_round`). A round that lacks a rank (a lost node uploads nothing;
  an upload cut by the notice's end has no manifest) or has a file missing or corrupt is skipped and the next older
  complete one taken, by every rank alike; prune keeps the newest complete round whole. Within a round, a name several
  uploads hold (each instance got the whole job's files and uploads them again) comes from the copy written last (its
  recorded mtime, which the restore keeps): a carried copy from an older round never wins over the rank's own.
- A local directory does not win. Files of the job's directory that are not of that round (a rank that ran on after
  the stop, an instance whose own upload was cut) are moved aside, to `.<dir>.fleetops-aside/` beside it (the last
  set kept), not resumed from. Uploads but no complete round at all: every rank starts afresh, its local files moved
  aside. No upload at all (a first start, sync off): the directory is left as it is.
- Within one assignment, a restart in place (a failure, a gang restart, a lost peer's agent back) keeps what the job
  wrote since, on every rank alike (its agent's marker records the assignment the round was restored for, or that there
  was no upload to restore, and keeps it through the uploads of that assignment: dropped at a rank's GangPeerLost
  upload, that rank went back to the round before while the lost rank's agent, back, kept its newer files).

Not guaranteed: which step each rank's files hold. fleetops stops the ranks together and gives them the files of one
stop; the job writes them (a DDP job agrees on the step it stops at over its ranks, or saves collectively, as DCP does).
Clocks: "written last" compares the writing instances' clocks, for names that two ranks both wrote in one round.

Files are streamed, never held whole: each is hashed (sha256) a MiB at a time, then sent by path through the backend's
write_file (S3: a multipart upload above its threshold; GCS: a resumable upload; Azure: blocks); `restore` downloads
each file of the uploads it takes (read_file) into a staging directory beside the local one, checks its size and
sha256 reading it back a MiB at a time, and moves files into place only once every one of them is there and right.
`progress` (the agent's heartbeat) is called before each file and every few seconds within one.

Limits: an upload past `max_bytes` in total is not made (logged, the previous generation stays the newest); an upload
still going at its deadline stops before its next file (a file begun is sent whole) and writes no manifest. A file is
begun before the deadline even where the rate measured so far says it cannot end by it: a rate of small files
underrates a large one's multipart throughput, and where the instance outlives the deadline (a move, an edit) a last
file sent late still completes the upload, while where it does not (a reclaim) the cut upload has no manifest and the
previous complete generation stays the newest, as skipping the file would leave it. A restore
needs free disk, on the local directory's file system, for every file of the uploads it takes: all are staged before
the local files of the same names are replaced. Without that room it fails before it fetches anything (NoRoomError,
naming the job, the bytes needed and free), the local directory as it was; the agent does not start the replica.

Only the newest KEEP generations (and the newest round) are kept; the files of an upload cut before its manifest go
once a complete upload newer than it exists (`prune`). A job removed from the config is marked removed
(`checkpoints/<job>/removed.json`) once none of its replicas is assigned or runs anywhere, and its whole prefix deleted
a retention later (`mark_removed`, `remove`: publish.removed_checkpoints); meanwhile `restore` gives its uploads only to
the same job put back (their spec hash), so a new job given its name starts afresh."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import quote, unquote

from reconciler.backend import Every, StateBackend
from reconciler.errors import DISK_FULL, DiskFullError, ReconcileError
from providers.settings import flag

PREFIX = "checkpoints"
VERSION = 1
KEEP = 3  # generations kept per job (beside the newest round's)
DEFAULT_MAX_MB = 2048.0
MAX_SYNC_MB = float(1 << 30)  # a PiB: past any checkpoint (and int(inf) overflowed)
# A cut upload of another instance is collected this long after it began: it is over by then (its replica's grace is at
# most an hour, model.Checkpoint, and the upload stops before its next file past it; an hour more for that last file).
# Sooner it may be a gang peer's upload of the same round, still going while this instance's finished first.
ABANDONED_S = 2 * 3600.0
# A removed job's checkpoints are kept this long before an apply deletes them (FLEETOPS_CHECKPOINT_RETENTION_DAYS):
# a job file deleted by mistake and put back resumes its training; deleted at once, days of it were lost for good.
DEFAULT_RETENTION_DAYS = 7.0

Log = Callable[[str], None]
# The free space of a file system (the shell's one call of it: tests give a small disk here).
disk_usage = shutil.disk_usage


class NotRestoredError(ReconcileError):
    """A restore that could not be completed on this disk: the local directory as it was (the agent does not start the
    replica from it, older than the upload it should hold)."""


class NoRoomError(NotRestoredError):
    """A restore the local file system has no room for: nothing fetched, the local directory as it was."""


def _room(job: str, local_dir: Path, docs: list[dict], haves: list[dict[str, Path]] | None = None) -> None:
    """NoRoomError unless the file system of `local_dir` has room to stage every file of the uploads `docs` (but those
    of `haves`, on disk already): a restore stages them all before one replaces a local file. Without this check each
    download failed as a broken upload would ("cannot read: skipped"), every older one was fetched in turn, and the
    replica started from its older local files, or a gang's had its files moved aside and started afresh."""
    haves = haves or [{} for _ in docs]
    needed = sum(f["size"] for doc, have in zip(docs, haves) for f in doc["files"] if f["path"] not in have)
    probe = next((p for p in (local_dir, *local_dir.parents) if p.exists()), local_dir.anchor or Path("/"))
    free = disk_usage(probe).free
    if needed > free:
        raise NoRoomError(f"{job}: its checkpoint ({', '.join(d['generation'] for d in docs)}) needs {needed} bytes "
                          f"({needed / 2**20:.1f} MiB) free on the file system of {local_dir} to be restored, {free} free "
                          f"({free / 2**20:.1f} MiB): not restored, the directory left as it is (free the disk: tried again)")


def enabled() -> bool:
    """FLEETOPS_CHECKPOINT_SYNC=0 turns the copying off (each instance keeps its own checkpoints, as before)."""
    return flag("FLEETOPS_CHECKPOINT_SYNC")


def max_bytes() -> int:
    """FLEETOPS_CHECKPOINT_SYNC_MAX_MB in bytes. NaN was a limit of 0 (max(0, nan) is 0: no checkpoint was ever
    uploaded, silently but for the agent's log) and inf an "unexpected OverflowError" in the agent's upload."""
    raw = os.environ.get("FLEETOPS_CHECKPOINT_SYNC_MAX_MB")
    try:
        mb = float(raw) if raw is not None else DEFAULT_MAX_MB
    except ValueError:
        mb = math.nan
    if not 0 <= mb <= MAX_SYNC_MB:
        raise ReconcileError(f"FLEETOPS_CHECKPOINT_SYNC_MAX_MB={raw!r} is not a number of MB from 0 to {MAX_SYNC_MB:g}")
    return int(mb * 1024 * 1024)


def segment(name: str) -> str:
    """One key segment (plain, never `.` or `..`): what a file or job name holds beyond -_.~ is percent-encoded."""
    out = quote(name, safe="-_.~")
    return out.replace(".", "%2E") if out in (".", "..") else out


def generation(now: float, instance: str) -> str:
    return f"{int(now * 1000):013d}-{segment(instance).replace('%', '_')}"


def job_prefix(job: str) -> str:
    return f"{PREFIX}/{segment(job)}"


def removed_key(job: str) -> str:
    """The mark an apply writes when the job left the config and its replicas' stop was reported (`mark_removed`)."""
    return f"{job_prefix(job)}/removed.json"


MAX_RETENTION_DAYS = 36500.0  # a century: past it, the deletion date is no date (time.gmtime overflowed at 1e300)


def retention_seconds() -> float:
    """FLEETOPS_CHECKPOINT_RETENTION_DAYS in seconds; a ReconcileError if it is no number of days from 0 to a century.
    NaN and negatives were a retention of 0 (max(0, nan) is 0), deleting what the retention is there to keep."""
    raw = os.environ.get("FLEETOPS_CHECKPOINT_RETENTION_DAYS", "")
    if not raw.strip():
        return DEFAULT_RETENTION_DAYS * 86400.0
    try:
        days = float(raw)
    except ValueError:
        days = math.nan
    if not 0 <= days <= MAX_RETENTION_DAYS:
        raise ReconcileError(f"FLEETOPS_CHECKPOINT_RETENTION_DAYS={raw!r} is not a number of days from 0 to {MAX_RETENTION_DAYS:g}")
    return days * 86400.0


def removed_at(store: StateBackend, job: str) -> float | None:
    """When the job was marked removed (unix s), None if it never was (or the mark cannot be read: as never)."""
    try:
        raw = store.read_key(removed_key(job))
        doc = json.loads(raw) if raw is not None else None
    except (ReconcileError, ValueError, UnicodeDecodeError):
        return None
    value = doc.get("removed_unix") if isinstance(doc, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def mark_removed(store: StateBackend, job: str, now: float) -> None:
    store.write_key(removed_key(job), json.dumps({"job": job, "removed_unix": now, "removed_at": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}).encode())


def manifest_prefix(job: str) -> str:
    return f"{job_prefix(job)}/manifests"


def data_prefix(job: str) -> str:
    return f"{job_prefix(job)}/data"


def generation_parts(gen: str) -> tuple[float, str] | None:
    """(unix time it began, instance segment) of a generation name `generation` writes; None for another name."""
    head, sep, inst = gen.partition("-")
    if not sep or len(head) != 13 or not head.isdigit():
        return None
    return int(head) / 1000.0, inst


def manifest_key(job: str, gen: str) -> str:
    return f"{manifest_prefix(job)}/{gen}.json"


def file_key(job: str, gen: str, rel: str) -> str:
    return f"{data_prefix(job)}/{gen}/" + "/".join(segment(p) for p in rel.split("/"))


def local_files(root: Path) -> list[tuple[str, Path, int]]:
    """The regular files under `root` as (relative path with `/`, path, size), sorted; links are not followed (a
    `latest` link is the job's, not a file of the checkpoint), nor are files that vanish while listed."""
    out = []
    todo = [Path(root)]
    while todo:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_symlink():
                    continue
                if e.is_dir():
                    todo.append(Path(e.path))
                elif e.is_file():
                    out.append((Path(e.path).relative_to(root).as_posix(), Path(e.path), e.stat().st_size))
            except OSError:
                continue
    return sorted(out)


HASH_CHUNK = 1 << 20  # bytes read at a time for a file's sha256


def digest(path: Path, tick: Callable[[], None] | None = None) -> tuple[int, str]:
    """(size, sha256 hex) of the file, read HASH_CHUNK bytes at a time (never whole), `tick` called after each."""
    h, size = hashlib.sha256(), 0
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
            if tick is not None:
                tick()
    return size, h.hexdigest()


def newest_mtime(root: Path) -> float | None:
    times = []
    for _, p, _ in local_files(root):
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else None


@dataclass
class Upload:
    generation: str | None
    complete: bool
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    why: str = ""


def upload(store: StateBackend, job: str, local_dir: Path, *, instance: str, spec_hash: str, epoch: int,
           deadline: float | None = None, limit: int | None = None, now: Callable[[], float] = time.time, log: Log = print,
           progress: Callable[[], None] | None = None, replicas: list[int] | None = None, world_size: int = 1) -> Upload:
    """Copy the files of `local_dir` to a new generation of `job`, the manifest last. `deadline` (time.monotonic()):
    no file is begun past it, and then no manifest is written. Nothing to copy (no files) is no upload, except for a
    gang (`world_size` > 1): its manifest, with no files, still says that this instance's ranks (`replicas`) took part
    in the round (plain DDP saves on rank 0 only: the other instances' directories are empty, and their round was
    never complete). `progress` is called before each file and every few seconds within one (backend.Every: the
    agent's heartbeat; an upload longer than the stale limit made its instance look lost). Each file is hashed and
    sent streamed, never read whole; its mtime (ns) goes into the manifest (`restore` gives it back: a gang's round is
    merged by it)."""
    began = time.monotonic()
    files = local_files(local_dir)
    if not files and world_size <= 1:
        return Upload(None, False, why="no files")
    total = sum(size for _, _, size in files)
    limit = max_bytes() if limit is None else limit
    if total > limit:
        why = f"{total} bytes in {len(files)} file(s), over the {limit} byte limit (FLEETOPS_CHECKPOINT_SYNC_MAX_MB)"
        log(f"{job}: checkpoint not uploaded: {why}")
        return Upload(None, False, len(files), total, why=why)
    gen = generation(now(), instance)
    tick = Every(progress)
    listed, sent = [], 0
    for rel, path, _ in files:
        if deadline is not None and time.monotonic() > deadline:
            why = f"out of time after {len(listed)}/{len(files)} file(s), {sent} bytes: no manifest written"
            log(f"{job}: checkpoint upload {gen} cut: {why}")
            return Upload(gen, False, len(listed), sent, time.monotonic() - began, why)
        if progress is not None:
            progress()
        try:
            mtime_ns = path.stat().st_mtime_ns
            size, sha256 = digest(path, tick)
        except OSError as e:
            log(f"{job}: checkpoint file {rel} unreadable ({e.strerror}): left out")
            continue
        key = file_key(job, gen, rel)
        # (the file read again as it is sent: were it changed between the two, its sha256 differs and `restore` skips
        # this upload whole; the job that writes it has stopped)
        store.write_file(key, path, tick)
        listed.append({"path": rel, "key": key, "size": size, "sha256": sha256, "mtime_ns": mtime_ns})
        sent += size
    seconds, at = time.monotonic() - began, now()
    doc = {"version": VERSION, "job": job, "generation": gen, "instance": instance, "spec_hash": spec_hash, "epoch": epoch,
           "created_unix": at, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
           "files": listed, "bytes": sent, "upload_seconds": round(seconds, 3),
           **({"replicas": sorted(replicas), "world_size": world_size} if replicas is not None else {})}
    store.write_key(manifest_key(job, gen), json.dumps(doc, indent=1).encode())
    log(f"{job}: checkpoint uploaded as {gen}: {len(listed)} file(s), {sent} bytes in {seconds:.2f}s")
    return Upload(gen, True, len(listed), sent, time.monotonic() - began)


def _valid(doc: object) -> bool:
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("files"), list):
        return False
    if not isinstance(doc.get("generation"), str) or not isinstance(doc.get("job"), str) or not isinstance(doc.get("created_unix"), (int, float)):
        return False
    return all(isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("key"), str)
               and isinstance(f.get("size"), int) and isinstance(f.get("sha256"), str) for f in doc["files"])


def manifests(store: StateBackend, job: str, log: Log = print) -> list[dict]:
    """The job's complete uploads, newest first (an unreadable manifest, or one naming a file outside its own job's
    generation, is skipped whole, logged). Newest by the store's clock (when it recorded each manifest, as heartbeats
    are judged), then the writer's: ordered by the writers' clocks alone, an upload from a host an hour behind was older
    than the one made an hour before it elsewhere, and its replacement resumed from that one."""
    out = []
    for key, listed in store.list_keys_stamped(manifest_prefix(job)).items():
        if not key.endswith(".json"):
            continue
        try:
            got = store.read_key_stamped(key, listed)
            doc = json.loads(got.body) if got is not None else None
        except (ReconcileError, ValueError, UnicodeDecodeError) as e:
            log(f"{job}: checkpoint manifest {key} unreadable ({e}): skipped")
            continue
        if doc is None:
            continue  # (deleted since listed)
        if not _valid(doc) or f"{manifest_prefix(job)}/{doc['generation']}.json" != key:
            log(f"{job}: checkpoint manifest {key} is not one the agent writes: skipped")
            continue
        # Each file's key is the one upload gives its path, in this job's generation: the manifest's writer (any agent:
        # the bus is shared) also gives the sha256, so a key of another job's file was restored, and pruned, as this one's.
        gen = doc["generation"]
        bad = next((f for f in doc["files"] if f["key"] != file_key(job, gen, f["path"])), None)
        if bad is not None:
            log(f"{job}: checkpoint manifest {key} names the key {bad['key']!r} for {bad['path']!r}, outside "
                f"{data_prefix(job)}/{gen}/ (or not the key its upload gives it): skipped")
            continue
        out.append((got.modified, doc))
    return [doc for _, doc in sorted(out, key=lambda m: (m[0], m[1]["created_unix"], m[1]["generation"]), reverse=True)]


def fetch(store: StateBackend, doc: dict, into: Path, log: Log = print,
          progress: Callable[[], None] | None = None, have: dict[str, Path] | None = None,
          local_dir: Path | None = None) -> dict[str, Path] | None:
    """Every file of one upload, downloaded under the directory `into` (made here), each streamed to disk and checked
    against its size and sha256 as it is read back: {path: downloaded file}. None (logged, `into` removed) when one is
    missing or differs: that upload is skipped whole. `progress`: called before each file and every few seconds
    within one (as upload's). `have`: files of the upload already on this disk (a gang's restore: its own upload, or
    one restored before, same size and mtime), given back as they are, not fetched again. NoRoomError when the disk
    fills as a file is fetched (`local_dir`: the directory it is restored for, named): not a broken upload, whose next
    older one would be restored instead, the replica resuming from older training."""
    out: dict[str, Path] = {}
    tick = Every(progress)
    try:
        for f in doc["files"]:
            if progress is not None:
                progress()
            rel = f["path"]
            if rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")) or rel in out:
                log(f"{doc['job']}: checkpoint {doc['generation']} names the path {rel!r}: skipped")
                return None
            if have and rel in have:
                out[rel] = have[rel]
                continue
            dest = into / rel
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):  # a file of this upload is named as another's directory
                log(f"{doc['job']}: checkpoint {doc['generation']} names the path {rel!r} below another file: skipped")
                return None
            try:
                found = store.read_file(f["key"], dest, tick)
            except DiskFullError as e:
                raise NoRoomError(f"{doc['job']}: the disk filled while its checkpoint {doc['generation']} was fetched "
                                  f"({rel}: {e}): not restored, {local_dir or into} left as it is (free the disk: tried "
                                  "again)") from None
            except ReconcileError as e:
                log(f"{doc['job']}: checkpoint {doc['generation']}: cannot read {rel}: {e}: skipped")
                return None
            if not found or digest(dest, tick) != (f["size"], f["sha256"]):
                what = "missing" if not found else "corrupt (size or sha256 differs from its manifest)"
                log(f"{doc['job']}: checkpoint {doc['generation']}: {rel} is {what}: skipped, not restored")
                return None
            out[rel] = dest
        return out
    finally:
        if len(out) != len(doc["files"]):
            shutil.rmtree(into, ignore_errors=True)  # (only what was fetched is there: `have` is elsewhere)


def round_of(doc: dict) -> tuple:
    return doc.get("spec_hash"), doc.get("epoch")


@dataclass
class Restore:
    generations: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    why: str = ""
    marker: dict | None = None  # a gang's: what the agent records for the directory (which round, at which assignment)
    aside: int = 0  # a gang's: local files moved aside (not of the round restored)


def needs_restore(local_dir: Path, newest: dict, marker: dict | None) -> bool:
    """Whether `local_dir` should be filled from the upload `newest`: it is empty, or older than that upload and not
    what this instance last uploaded or restored itself."""
    mtime = newest_mtime(local_dir)
    if mtime is None:
        return True
    if marker and newest["generation"] in marker.get("generations", []):
        return False
    return mtime < float(newest["created_unix"])


def restore(store: StateBackend, job: str, local_dir: Path, *, marker: dict | None = None, log: Log = print,
            progress: Callable[[], None] | None = None, spec_hash: str | None = None, epoch: int | None = None,
            world_size: int = 1) -> Restore:
    """Fill `local_dir` from the newest complete upload (and the newest one of each other instance of its round, a
    gang's other ranks), where `needs_restore` says so. Its files replace the local ones of the same name; others stay.
    A gang (`world_size` > 1) restores its newest complete round instead, whatever the local directory holds
    (`restore_round`)."""
    began = time.monotonic()
    docs = manifests(store, job, log)
    gone = removed_at(store, job)
    if gone is not None:
        # (uploads from before the job was removed belong to that job: restored only into the same job put back,
        # its spec hash theirs; a new job given the name, another model, starts afresh)
        docs = [d for d in docs if d["created_unix"] > gone or (spec_hash is not None and d.get("spec_hash") == spec_hash)]
    if world_size > 1:
        return restore_round(store, job, Path(local_dir), docs, at=[spec_hash, epoch], marker=marker,
                             log=log, progress=progress, began=began)
    if not docs:
        return Restore(why="no upload" if gone is None else "no upload since a job of this name was removed")
    if not needs_restore(local_dir, docs[0], marker):
        return Restore(why="the local checkpoint is as new")
    local_dir = Path(local_dir)
    # Each upload is downloaded into a directory of its own beside `local_dir` (the same file system: moved into place
    # by rename), and only once every file of every upload taken is there and checked is any moved into `local_dir`.
    staging = local_dir.parent / f".{local_dir.name}.fleetops-restore"
    made = [p for p in local_dir.parents if not p.exists()]  # removed again if nothing is restored
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    picked: list[tuple[dict, dict[str, Path]]] = []
    try:
        for doc in docs:
            _room(job, local_dir, [doc])
            got = fetch(store, doc, staging / str(len(picked)), log, progress, local_dir=local_dir)
            if got is not None:
                picked.append((doc, got))
                break
        if not picked:
            return Restore(why="no complete upload", seconds=time.monotonic() - began)
        head = picked[0][0]
        seen = {head.get("instance")}
        for doc in docs:
            if doc is head or round_of(doc) != round_of(head) or doc.get("instance") in seen:
                continue
            seen.add(doc.get("instance"))
            _room(job, local_dir, [doc])
            got = fetch(store, doc, staging / str(len(picked)), log, progress, local_dir=local_dir)
            if got is not None:
                picked.append((doc, got))
        merged: dict[str, tuple[Path, int]] = {}
        for doc, files in reversed(picked):  # the newest last: it wins a name two uploads hold
            sizes = {f["path"]: f["size"] for f in doc["files"]}
            merged.update({rel: (path, sizes[rel]) for rel, path in files.items()})
        with _Moves(job, local_dir) as moves:
            moves.local_dir_made(log)
            for rel, (path, _) in merged.items():
                _place(local_dir, rel, path, log, job, moves)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if not picked:
            for p in made:  # (the deepest first)
                with contextlib.suppress(OSError):
                    p.rmdir()
    size = sum(n for _, n in merged.values())
    gens = [d["generation"] for d, _ in picked]
    seconds = time.monotonic() - began
    log(f"{job}: checkpoint restored from {', '.join(gens)}: {len(merged)} file(s), {size} bytes in {seconds:.2f}s")
    return Restore(gens, len(merged), size, seconds)


def rounds(docs: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """`docs` (newest first) by round (spec hash, epoch), the round of the newest upload first; in each, the newest
    upload of each instance (an instance's older upload of the same round is superseded), newest first."""
    out: dict[tuple, list[dict]] = {}
    for d in docs:
        members = out.setdefault(round_of(d), [])
        if all(m.get("instance") != d.get("instance") for m in members):
            members.append(d)
    return list(out.items())


def missing_ranks(members: list[dict]) -> list[int] | None:
    """The ranks of the gang (of the world size its uploads recorded) that no upload of a round holds ([] for a
    complete round); None when one of them does not say which ranks it holds (an upload from before they were
    recorded: such a round is taken as complete, as it was then)."""
    if not members or any(not isinstance(m.get("replicas"), list) for m in members):
        return None
    sizes = [m["world_size"] for m in members if isinstance(m.get("world_size"), int)]
    n = max(sizes, default=1)
    have = {r for m in members for r in m["replicas"] if isinstance(r, int)}
    return [r for r in range(n) if r not in have]


def _mtime_ns(doc: dict, f: dict) -> int:
    """When the file was written where it was uploaded from (an upload from before mtimes were recorded: its own time)."""
    m = f.get("mtime_ns")
    return m if isinstance(m, int) and not isinstance(m, bool) else int(doc["created_unix"] * 1e9)


def _on_disk(local: dict[str, tuple[Path, int]], doc: dict) -> dict[str, Path]:
    """The files of upload `doc` this disk holds as they were uploaded (same size and mtime: the instance's own upload,
    or what it restored before, which keeps the file's mtime): not fetched again."""
    out = {}
    for f in doc["files"]:
        got = local.get(f["path"])
        if got is not None and got[1] == f["size"] and isinstance(f.get("mtime_ns"), int):
            try:
                if got[0].stat().st_mtime_ns == _mtime_ns(doc, f):
                    out[f["path"]] = got[0]
            except OSError:
                pass
    return out


class _Moves:
    """The renames (and directories made) that put a restore in place, all or none: one that fails (a full disk: a
    directory entry, a new subdirectory) undoes every one made before it, and the restore fails (NoRoomError for a
    full disk, else NotRestoredError) with the local directory as it was. Before, a failure midway left it half
    restored, the upload's files beside the job's older ones, and the agent started the replica from it. What the
    restore replaces is kept in `.<dir>.fleetops-replaced/` beside it until the whole is in place."""

    def __init__(self, job: str, local_dir: Path):
        self.job, self.local_dir = job, local_dir
        self.replaced = local_dir.parent / f".{local_dir.name}.fleetops-replaced"
        self.done: list[tuple[Path, Path]] = []
        self.made: list[Path] = []

    def __enter__(self) -> "_Moves":
        shutil.rmtree(self.replaced, ignore_errors=True)
        return self

    def __exit__(self, kind, err, tb) -> None:
        if err is not None:
            for src, dst in reversed(self.done):
                with contextlib.suppress(OSError):
                    os.replace(dst, src)
            for d in reversed(self.made):
                with contextlib.suppress(OSError):
                    d.rmdir()
        shutil.rmtree(self.replaced, ignore_errors=True)
        if isinstance(err, OSError):
            what = (f"{self.job}: its checkpoint could not be put in place in {self.local_dir} ({err.strerror}"
                    f"{f': {err.filename}' if err.filename else ''}): every file moved back, the directory as it was")
            if err.errno in DISK_FULL:
                raise NoRoomError(f"{what} (free the disk: tried again)") from None
            raise NotRestoredError(f"{what} (tried again)") from None

    def local_dir_made(self, log: Log) -> None:
        """The job's directory, made where missing; a file or link at its name (the job's, which replaced its own
        directory) is replaced (a link never followed): the replica's start failed on it (StartError)."""
        d = self.local_dir
        if d.is_symlink() or d.exists() and not d.is_dir():
            what = "link" if d.is_symlink() else "file"
            self.mkdir(self.replaced)
            self.move(d, self.replaced / d.name)
            log(f"{self.job}: a {what} at {d}, where its checkpoint directory goes, was in the way of the restore: removed, not followed")
        self.mkdir(d)

    def mkdir(self, d: Path) -> None:
        missing = []
        while not d.exists() and not d.is_symlink():
            missing.append(d)
            d = d.parent
        for p in reversed(missing):
            p.mkdir()
            self.made.append(p)

    def move(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)
        self.done.append((src, dst))

    def out_of_the_way(self, path: Path) -> None:
        """A local file, link or directory where the restore puts one of its files or directories: replaced."""
        kept = self.replaced / path.relative_to(self.local_dir)
        self.mkdir(kept.parent)
        self.move(path, kept)


def _place(local_dir: Path, rel: str, path: Path, log: Log, job: str, moves: _Moves) -> Path:
    """Move the staged file `path` to `rel` under `local_dir` (its directories made), never through a link: the job
    (root in its container) may leave `sub -> /etc` there, and the agent, root on the host, wrote a restored
    `sub/passwd` to /etc/passwd. A link in the way is removed (it is the job's, not a file of the round), logged, as is
    a local file where the upload has a directory; a local file, link or directory at the file's own name is replaced."""
    target = local_dir / rel
    d = local_dir
    for part in rel.split("/")[:-1]:
        d = d / part
        if d.is_symlink() or d.exists() and not d.is_dir():
            what = "link" if d.is_symlink() else "file"
            moves.out_of_the_way(d)
            log(f"{job}: a {what} at {d} was in the way of the restored {rel}: removed, not followed")
    moves.mkdir(target.parent)
    if target.is_symlink() or target.exists():
        moves.out_of_the_way(target)
    moves.move(path, target)
    return target


def _aside(local_dir: Path, rels: list[str], log: Log, job: str, why: str, moves: _Moves) -> int:
    """Move these local files out of the job's directory into `.<dir>.fleetops-aside/` beside it (emptied first: one
    set is kept), so the job cannot resume from them; logged with where they went."""
    if not rels:
        return 0
    aside = local_dir.parent / f".{local_dir.name}.fleetops-aside"
    shutil.rmtree(aside, ignore_errors=True)
    for rel in rels:
        target = aside / rel
        moves.mkdir(target.parent)
        moves.move(local_dir / rel, target)
    log(f"{job}: {len(rels)} local checkpoint file(s) moved aside to {aside} ({why}): "
        + ", ".join(rels[:5]) + (" ..." if len(rels) > 5 else ""))
    return len(rels)


def restore_round(store: StateBackend, job: str, local_dir: Path, docs: list[dict], *, at: list,
                  marker: dict | None = None, log: Log = print, progress: Callable[[], None] | None = None,
                  began: float | None = None) -> Restore:
    """A gang's restore: every rank, moved or not, resumes from the same round. Each agent makes its directory hold
    exactly the files of the newest complete round, the newest round whose uploads hold every rank of its gang (its
    world size then: a gang resized by an edit resumes from its last round, `missing_ranks`) and whose every file is
    there with its sha256 (a round with one missing or corrupt is skipped whole, and the next older complete one tried); a name several of its uploads hold comes from the one whose file was written last (its
    recorded mtime: a file an instance only carried, restored there from an earlier round, never wins over the rank's
    own). Local files not of that round (a newer local directory, from a rank that ran on after the stop, or an
    instance whose upload was cut) are moved aside, not resumed from. Uploads but no complete round (a lost node that
    uploaded nothing, and no older complete round): every local file moved aside, the gang starts afresh, the same on
    every rank. No upload at all: the directory is left as it is. Done once per assignment (`at`: spec hash and
    epoch, in the marker the agent keeps): a restart in place within it (a failure, a gang restart) keeps what the
    job wrote since."""
    began = time.monotonic() if began is None else began
    if marker and marker.get("at") == at:
        return Restore(why="this assignment's round was restored already: restarted in place, the directory kept")
    if not docs:
        # (recorded: a restart in place within this assignment keeps what the job wrote since, on every rank alike)
        return Restore(why="no upload", marker={"generations": [], "round": None, "at": at})
    # (a link the job left at its directory's name is replaced, never followed: _Moves.local_dir_made)
    local = {rel: (path, size) for rel, path, size in local_files(local_dir)} if not local_dir.is_symlink() else {}
    staging = local_dir.parent / f".{local_dir.name}.fleetops-restore"
    for key, members in rounds(docs):
        # (against the round's own world size: a gang resized by an edit, `replicas`, resumes from its last round, all
        # of whose files every rank gets; DCP reshards such a checkpoint)
        missing = missing_ranks(members)
        if missing:
            log(f"{job}: checkpoint round {key[1]} (spec {key[0]}) lacks rank(s) {', '.join(map(str, missing))}: "
                f"{', '.join(m['generation'] for m in members)} not restored")
            continue
        haves = [_on_disk(local, doc) for doc in members]
        _room(job, local_dir, members, haves)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            got = []
            for doc, have in zip(members, haves):
                files = fetch(store, doc, staging / str(len(got)), log, progress, have=have, local_dir=local_dir)
                if files is None:
                    break
                got.append((doc, files))
            if len(got) != len(members):
                log(f"{job}: checkpoint round {key[1]} (spec {key[0]}) is not whole: the next older complete round is tried")
                continue
            merged: dict[str, tuple[int, float, Path, int]] = {}  # path -> (mtime_ns, upload time, file, size)
            for doc, files in got:
                for f in doc["files"]:
                    cand = (_mtime_ns(doc, f), float(doc["created_unix"]), files[f["path"]], f["size"])
                    if f["path"] not in merged or cand[:2] > merged[f["path"]][:2]:
                        merged[f["path"]] = cand
            keep = {rel for rel, (_, _, path, _) in merged.items() if rel in local and path == local[rel][0]}
            with _Moves(job, local_dir) as moves:
                aside = _aside(local_dir, sorted(set(local) - keep), log, job, f"not of round {key[1]}, which every rank resumes from", moves)
                moves.local_dir_made(log)
                for rel, (mtime_ns, _, path, _) in merged.items():
                    if rel in keep:
                        continue
                    target = _place(local_dir, rel, path, log, job, moves)
                    with contextlib.suppress(OSError):
                        os.utime(target, ns=(mtime_ns, mtime_ns))  # (the writer's time: a later restore knows it, _on_disk)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        gens = [d["generation"] for d, _ in got]
        size = sum(n for *_, n in merged.values())
        seconds = time.monotonic() - began
        log(f"{job}: checkpoint round {key[1]} restored from {', '.join(gens)}: {len(merged)} file(s), "
            f"{len(merged) - len(keep)} fetched, {size} bytes in {seconds:.2f}s")
        return Restore(gens, len(merged), size, seconds, marker={"generations": gens, "round": list(key), "at": at}, aside=aside)
    with _Moves(job, local_dir) as moves:
        aside = _aside(local_dir, sorted(local), log, job, "no complete round of the gang's uploads: every rank starts afresh", moves)
    return Restore(why="no complete round", seconds=time.monotonic() - began,
                   marker={"generations": [], "round": None, "at": at}, aside=aside)


def prune(store: StateBackend, job: str, keep: int = KEEP, log: Log = print, now: Callable[[], float] = time.time) -> int:
    """Delete the job's uploads beyond the newest `keep` and the newest round (manifest first: a reader never takes
    an upload whose files are going), and the files of uploads cut before their manifest (`cut_generations`).
    Returns how many generations went."""
    docs = manifests(store, job, log=lambda m: None)
    if not docs:
        return 0
    newest = round_of(docs[0])
    # (and a gang's newest complete round, whole: a newer round that lacks a rank, a lost node's, is never restored,
    # and the older complete one is what every rank resumes from)
    whole = next(((key, {d["generation"] for d in members}) for key, members in rounds(docs) if missing_ranks(members) == []), None)
    gone = 0
    for doc in docs[keep:]:
        if round_of(doc) == newest or whole is not None and doc["generation"] in whole[1]:
            continue
        try:
            store.delete_key(manifest_key(job, doc["generation"]))
            for f in doc["files"]:
                store.delete_key(f["key"])
        except ReconcileError as e:
            log(f"{job}: cannot delete the old checkpoint {doc['generation']}: {e}")
            return gone
        gone += 1
    try:
        for gen, keys in sorted(cut_generations(store, job, docs, now()).items()):
            for key in keys:
                store.delete_key(key)
            log(f"{job}: checkpoint upload {gen} was cut before its manifest: its {len(keys)} file(s) deleted")
            gone += 1
    except ReconcileError as e:
        log(f"{job}: cannot delete the files of a cut checkpoint upload: {e}")
    return gone


def cut_generations(store: StateBackend, job: str, docs: list[dict], now: float) -> dict[str, list[str]]:
    """generation -> its data keys, for the uploads cut before their manifest that are surely over: one with no
    manifest key (listed: an unreadable manifest is not a missing one), older than a complete upload (`docs`) of its
    own instance (an agent uploads one at a time) or, of another instance, begun ABANDONED_S ago. A generation that
    may still be uploading is never one: none is newer than the newest complete upload, nor is a gang peer's of the
    same round, begun a moment before this instance's finished."""
    listed = {key.rsplit("/", 1)[-1][:-len(".json")] for key in store.list_keys(manifest_prefix(job)) if key.endswith(".json")}
    complete = [p for d in docs if (p := generation_parts(d["generation"])) is not None]
    base = data_prefix(job) + "/"
    out: dict[str, list[str]] = {}
    for key in store.list_keys(data_prefix(job)):
        if not key.startswith(base) or "/" not in key[len(base):]:
            continue
        gen = key[len(base):].split("/", 1)[0]
        if gen in listed or (parts := generation_parts(gen)) is None:
            continue
        began, inst = parts
        if any(t > began and (i == inst or now - began > ABANDONED_S) for t, i in complete):
            out.setdefault(gen, []).append(key)
    return out


def jobs(store: StateBackend) -> set[str]:
    """The jobs that have anything under checkpoints/."""
    return {unquote(key.split("/")[1]) for key in store.list_keys(PREFIX) if key.count("/") >= 2}


def remove(store: StateBackend, job: str) -> int:
    """Delete every key under `checkpoints/<job>/` (the manifests first: a reader never takes an upload whose files
    are going). Returns how many keys went."""
    keys = store.list_keys(job_prefix(job))
    head = manifest_prefix(job) + "/"
    for key in sorted(keys, key=lambda k: (not k.startswith(head), k)):
        store.delete_key(key)
    return len(keys)
