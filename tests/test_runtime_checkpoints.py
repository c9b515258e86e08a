"""Checkpoints copied through the state backend (reconciler/runtime/checkpoints.py): upload with its manifest last,
restore into an empty or older directory, a partial or corrupt upload skipped whole, the newest upload wins, a gang's
round merged; the local backend and s3:// on the moto server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from reconciler.backend import backend_for, check_key
from reconciler.errors import ReconcileError
from reconciler.runtime import checkpoints as ck


def logs():
    out: list[str] = []
    return out, out.append


def write(d: Path, files: dict[str, bytes | str]) -> Path:
    for rel, body in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body.encode() if isinstance(body, str) else body)
    return d


def clock(start: float = 1_800_000_000.0):
    t = [start]

    def now() -> float:
        t[0] += 1.0
        return t[0]
    return now


@pytest.fixture
def store(tmp_path):
    return backend_for(tmp_path / "cfg", None)


def test_an_upload_writes_every_file_then_its_manifest_and_an_empty_dir_is_restored(store, tmp_path):
    src = write(tmp_path / "a" / "ckpt", {"rank-0.json": '{"step": 23}', "shards/w.bin": os.urandom(4096), "odd name\\x": "y"})
    out, log = logs()
    up = ck.upload(store, "ft", src, instance="sim-aws-00001", spec_hash="h1", epoch=2, log=log)
    assert up.complete and up.files == 3 and up.bytes == 4096 + 12 + 1
    [key] = store.list_keys(ck.manifest_prefix("ft"))
    doc = json.loads(store.read_key(key))
    assert (doc["job"], doc["instance"], doc["spec_hash"], doc["epoch"], doc["bytes"]) == ("ft", "sim-aws-00001", "h1", 2, up.bytes)
    assert sorted(f["path"] for f in doc["files"]) == ["odd name\\x", "rank-0.json", "shards/w.bin"]
    for f in doc["files"]:
        check_key(f["key"])  # plain names: no `..`, no backslash
        assert store.read_key(f["key"]) == (src / f["path"]).read_bytes()
    dest = tmp_path / "b" / "ckpt"
    got = ck.restore(store, "ft", dest, log=log)
    assert got.generations == [up.generation] and got.files == 3 and got.bytes == up.bytes
    assert {r: p.read_bytes() for r, p, _ in ck.local_files(dest)} == {r: p.read_bytes() for r, p, _ in ck.local_files(src)}
    assert not list(dest.parent.glob(".*restore*"))  # no staging left
    # Restored, it is as new as the upload: not fetched again.
    assert ck.restore(store, "ft", dest, log=log).generations == []


def test_a_partial_or_corrupt_upload_is_skipped_whole_and_the_previous_one_restored(store, tmp_path):
    now = clock()
    out, log = logs()
    src = tmp_path / "a"
    good = ck.upload(store, "ft", write(src, {"rank-0.json": "10", "rank-1.json": "10"}), instance="i-1", spec_hash="h", epoch=1, now=now, log=log)
    bad = ck.upload(store, "ft", write(src, {"rank-0.json": "20", "rank-1.json": "20"}), instance="i-1", spec_hash="h", epoch=2, now=now, log=log)
    doc = json.loads(store.read_key(ck.manifest_key("ft", bad.generation)))
    store.write_key(doc["files"][1]["key"], b"2X")  # corrupt: same size, other bytes
    # ... and a third upload cut before its manifest: files without one are never read.
    cut = ck.upload(store, "ft", write(src, {"rank-0.json": "30", "rank-1.json": "30"}), instance="i-1", spec_hash="h", epoch=3, now=now,
                    deadline=time.monotonic() - 1, log=log)
    assert not cut.complete and "no manifest written" in cut.why
    assert [d["generation"] for d in ck.manifests(store, "ft")] == [bad.generation, good.generation]
    dest = tmp_path / "b"
    got = ck.restore(store, "ft", dest, log=log)
    assert got.generations == [good.generation]
    assert (dest / "rank-0.json").read_text() == "10" and (dest / "rank-1.json").read_text() == "10"  # not half of the bad one
    assert any(f"checkpoint {bad.generation}: rank-1.json is corrupt" in m for m in out), out
    # A missing file too, and a manifest that is not JSON.
    store.delete_key(json.loads(store.read_key(ck.manifest_key("ft", good.generation)))["files"][0]["key"])
    store.write_key(ck.manifest_key("ft", "9999999999999-x"), b"{nope")
    out.clear()
    got = ck.restore(store, "ft", tmp_path / "c", log=log)
    assert got.generations == [] and got.why == "no complete upload" and not (tmp_path / "c").exists()
    assert any("rank-0.json is missing" in m for m in out) and any("9999999999999-x.json unreadable" in m for m in out), out


def test_the_newest_upload_wins_and_an_older_local_dir_is_refreshed_a_newer_one_kept(store, tmp_path):
    now = clock(time.time() - 100)
    src = tmp_path / "a"
    ck.upload(store, "ft", write(src, {"rank-0.json": "1"}), instance="i-1", spec_hash="h", epoch=1, now=now)
    new = ck.upload(store, "ft", write(src, {"rank-0.json": "2"}), instance="i-2", spec_hash="h", epoch=2, now=now)
    dest = write(tmp_path / "b", {"rank-0.json": "0"})
    os.utime(dest / "rank-0.json", (time.time() - 1000, time.time() - 1000))  # older than the uploads
    assert ck.restore(store, "ft", dest).generations == [new.generation] and (dest / "rank-0.json").read_text() == "2"
    write(dest, {"rank-0.json": "3"})  # the job went on here: newer than any upload, kept
    assert ck.restore(store, "ft", dest).generations == [] and (dest / "rank-0.json").read_text() == "3"
    # What this instance uploaded itself is not fetched back, however old its files (a restart in place).
    mine = ck.upload(store, "ft", dest, instance="i-3", spec_hash="h", epoch=3, now=lambda: time.time() + 50)
    assert ck.restore(store, "ft", dest, marker={"generations": [mine.generation]}).generations == []


def test_a_gangs_round_brings_back_every_instances_ranks(store, tmp_path):
    now = clock()
    ck.upload(store, "g", write(tmp_path / "old", {"rank-1.json": "old"}), instance="i-2", spec_hash="h", epoch=1, now=now)
    a = ck.upload(store, "g", write(tmp_path / "a", {"rank-0.json": "5"}), instance="i-1", spec_hash="h", epoch=2, now=now)
    b = ck.upload(store, "g", write(tmp_path / "b", {"rank-1.json": "5", "rank-2.json": "5"}), instance="i-2", spec_hash="h", epoch=2, now=now)
    dest = tmp_path / "c"
    got = ck.restore(store, "g", dest)
    assert got.generations == [b.generation, a.generation]
    assert {r: p.read_text() for r, p, _ in ck.local_files(dest)} == {"rank-0.json": "5", "rank-1.json": "5", "rank-2.json": "5"}


def _gang_up(store, d: Path, files: dict, instance: str, epoch: int, ranks: list[int], now, world: int = 2, mtimes: dict | None = None):
    write(d, files)
    for rel, t in (mtimes or {}).items():
        os.utime(d / rel, (t, t))
    return ck.upload(store, "g", d, instance=instance, spec_hash="h", epoch=epoch, now=now, replicas=ranks, world_size=world)


def steps(d: Path) -> dict[str, str]:
    return {r: p.read_text() for r, p, _ in ck.local_files(d)}


def test_a_gang_resumes_every_rank_from_its_newest_complete_round_never_a_newer_local_dir(store, tmp_path):
    """A lost node uploads nothing: its round lacks a rank, and every rank, the one that stayed with its newer local
    files too, resumes from the round before, whole. Before, the instance that stayed kept its own newer directory
    (step 25) while the moved rank restored the other's round (step 18): a gang at two steps."""
    now = clock()
    a = _gang_up(store, tmp_path / "a", {"rank-0.json": "18"}, "i-a", 1, [0], now)
    b = _gang_up(store, tmp_path / "b", {"rank-1.json": "18"}, "i-b", 1, [1], now)
    # Epoch 2: i-b is lost (no upload); i-a ran on to step 25 and uploaded when the gang moved.
    _gang_up(store, tmp_path / "a", {"rank-0.json": "25"}, "i-a", 2, [0], now)
    out, log = logs()
    stay = write(tmp_path / "a2", {"rank-0.json": "25", "step-25/extra.bin": "x"})  # the instance that stayed
    got = ck.restore(store, "g", stay, log=log, spec_hash="h", epoch=3, world_size=2, marker={"generations": ["whatever"]})
    assert got.generations == [b.generation, a.generation] and got.marker["at"] == ["h", 3] and got.aside == 2
    assert steps(stay) == {"rank-0.json": "18", "rank-1.json": "18"}  # the round, whole: not its own step 25
    aside = tmp_path / ".a2.fleetops-aside"
    assert steps(aside) == {"rank-0.json": "25", "step-25/extra.bin": "x"}  # kept, beside, where the job does not look
    assert any("round 2 (spec h) lacks rank(s) 1" in m for m in out), out
    moved = tmp_path / "new"
    assert ck.restore(store, "g", moved, spec_hash="h", epoch=3, world_size=2).generations == [b.generation, a.generation]
    assert steps(moved) == steps(stay)
    # A gang resized by an edit (replicas 2 -> 3, a new spec) resumes from that round too: complete for its own size.
    assert ck.restore(store, "g", tmp_path / "third", spec_hash="h3", epoch=3, world_size=3).generations == [b.generation, a.generation]
    # A restart in place within the same assignment (a failure, a gang restart) keeps what the job wrote since.
    write(stay, {"rank-0.json": "30"})
    assert ck.restore(store, "g", stay, spec_hash="h", epoch=3, world_size=2, marker=got.marker).generations == []
    assert steps(stay)["rank-0.json"] == "30"
    # prune keeps that complete round whole, however many newer uploads there are.
    for e in range(4, 8):
        _gang_up(store, tmp_path / "a", {"rank-0.json": str(e)}, "i-a", e, [0], now)
    ck.prune(store, "g", keep=2)
    assert {a.generation, b.generation} <= {d["generation"] for d in ck.manifests(store, "g")}


def test_a_gangs_round_takes_each_file_from_where_it_was_written_last_not_a_carried_copy(store, tmp_path):
    """Each instance gets the whole job's files, so an upload carries other ranks' files from the round it restored.
    Within a round the copy written last wins (its recorded mtime, kept by the restore), not the upload made last:
    i-b's carried rank-0.json of step 7 lost to i-a's step 14. Before, the newest upload won every name it held, and
    after a second move a rank resumed at the first move's step."""
    now = clock()
    t = time.time()
    # i-a holds rank 0 (written at step 14) and carries rank 1's file of the round before (step 7); i-b the reverse,
    # and i-b uploaded last.
    a = _gang_up(store, tmp_path / "a", {"rank-0.json": "14", "rank-1.json": "7"}, "i-a", 2, [0], now,
                 mtimes={"rank-0.json": t - 10, "rank-1.json": t - 100})
    b = _gang_up(store, tmp_path / "b", {"rank-0.json": "7", "rank-1.json": "14"}, "i-b", 2, [1], now,
                 mtimes={"rank-0.json": t - 100, "rank-1.json": t - 9})
    dest = tmp_path / "c"
    got = ck.restore(store, "g", dest, spec_hash="h", epoch=3, world_size=2)
    assert got.generations == [b.generation, a.generation]
    assert steps(dest) == {"rank-0.json": "14", "rank-1.json": "14"}
    assert (dest / "rank-0.json").stat().st_mtime_ns == (tmp_path / "a" / "rank-0.json").stat().st_mtime_ns  # the writer's time
    # On i-a itself nothing is fetched again but i-b's rank-1.json: its own files are as it uploaded them.
    out, log = logs()
    ck.restore(store, "g", tmp_path / "a", spec_hash="h", epoch=3, world_size=2, log=log)
    assert steps(tmp_path / "a") == {"rank-0.json": "14", "rank-1.json": "14"}
    assert any("2 file(s), 1 fetched" in m for m in out), out


def test_a_gang_instance_with_nothing_to_upload_still_takes_part_in_its_round(store, tmp_path):
    """Plain DDP saves on rank 0 only: the other instances' directories are empty. Their upload is a manifest with no
    files that says which ranks they hold, so the round is complete; without one, no round ever was. And with uploads
    but no complete round at all, every rank starts afresh, its local files moved aside."""
    now = clock()
    a = _gang_up(store, tmp_path / "a", {"model.pt": "w1"}, "i-a", 1, [0], now)
    b = ck.upload(store, "g", tmp_path / "empty", instance="i-b", spec_hash="h", epoch=1, now=now, replicas=[1], world_size=2)
    assert b.complete and b.files == 0
    got = ck.restore(store, "g", tmp_path / "c", spec_hash="h", epoch=2, world_size=2)
    assert got.generations == [b.generation, a.generation] and steps(tmp_path / "c") == {"model.pt": "w1"}
    fresh = tmp_path / "fresh"
    for key in store.list_keys("checkpoints/g/manifests"):
        if b.generation in key:
            store.delete_key(key)
    stay = write(tmp_path / "stay", {"model.pt": "w9"})
    got = ck.restore(store, "g", stay, spec_hash="h", epoch=2, world_size=2)
    assert got.why == "no complete round" and got.aside == 1 and steps(stay) == {} and got.marker["at"] == ["h", 2]
    assert ck.restore(store, "g", fresh, spec_hash="h", epoch=2, world_size=2).why == "no complete round"


def test_a_gangs_first_start_with_no_upload_records_its_assignment_so_a_restart_in_place_keeps_its_files(store, tmp_path):
    """No upload at all: the directory is left as it is, and the assignment is recorded (the marker) as for a round
    restored. Before, nothing was recorded: a gang restarted in place after a rank's upload of that assignment (a lost
    peer's agent back, GangPeerLost) went back to an older round, or afresh, on the ranks that had uploaded, while the
    others kept their newer files."""
    mine = write(tmp_path / "mine", {"rank-0": "7"})
    got = ck.restore(store, "g", mine, spec_hash="h", epoch=1, world_size=2)
    assert got.why == "no upload" and got.marker["at"] == ["h", 1] and steps(mine) == {"rank-0": "7"}
    _gang_up(store, mine, {"rank-0": "8"}, "i-a", 1, [0], clock())  # its GangPeerLost upload: a round without rank 1
    again = ck.restore(store, "g", mine, marker=got.marker, spec_hash="h", epoch=1, world_size=2)
    assert again.generations == [] and steps(mine) == {"rank-0": "8"}  # restarted in place: what it wrote, kept


def test_limits_an_upload_over_its_size_is_not_made_and_old_generations_are_pruned(store, tmp_path):
    out, log = logs()
    src = write(tmp_path / "a", {"big.bin": b"x" * 2048})
    up = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, limit=1024, log=log)
    assert not up.complete and up.generation is None and store.list_keys("checkpoints") == []
    assert "over the 1024 byte limit" in out[0]
    assert ck.upload(store, "ft", tmp_path / "empty", instance="i-1", spec_hash="h", epoch=1).why == "no files"
    now = clock()
    gens = [ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=e, now=now).generation for e in range(5)]
    assert ck.prune(store, "ft", keep=2) == 3
    assert [d["generation"] for d in ck.manifests(store, "ft")] == gens[:-3:-1]
    assert len(store.list_keys("checkpoints/ft/data")) == 2  # the pruned ones' files went too


def test_measured_a_64_mib_checkpoint_through_the_local_backend(store, tmp_path):
    """Not a speed test: the figures the README quotes, printed (-s); bounds far above them for a shared machine."""
    src = write(tmp_path / "a", {f"rank-{r}.pt": os.urandom(16 << 20) for r in range(4)})
    up = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None)
    got = ck.restore(store, "ft", tmp_path / "b", log=lambda m: None)
    assert up.bytes == got.bytes == 64 << 20
    print(f"64 MiB in 4 files, local backend: upload {up.seconds:.2f}s, restore {got.seconds:.2f}s (sha256 checked)")
    assert up.seconds < 60 and got.seconds < 60


def test_a_round_trip_through_s3_on_the_moto_server(aws_env, monkeypatch, request, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    bucket = f"ck-{abs(hash(request.node.name)) % 10**8}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    s3 = backend_for(tmp_path, f"s3://{bucket}/fleets/demo")
    src = write(tmp_path / "a", {"rank-0.json": '{"step": 7}', "sub/opt.bin": os.urandom(1000)})
    up = ck.upload(s3, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None)
    got = ck.restore(s3, "ft", tmp_path / "b", log=lambda m: None)
    assert got.generations == [up.generation] and got.bytes == up.bytes == 1011
    assert (tmp_path / "b" / "sub" / "opt.bin").read_bytes() == (src / "sub" / "opt.bin").read_bytes()


def test_a_long_upload_or_restore_lets_the_agent_beat_between_files(store, tmp_path):
    """Upload and restore run in the agent's loop; one longer than the heartbeat's stale limit (60 s) made the instance
    look lost and its work placed again. Each calls `progress` (the agent's keepalive) before every file it moves."""
    beats: list[int] = []
    src = write(tmp_path / "a", {f"shard-{i}.bin": os.urandom(64) for i in range(5)})
    up = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=logs()[1], progress=lambda: beats.append(1))
    assert up.complete and len(beats) == 5
    got = ck.restore(store, "ft", tmp_path / "b", log=logs()[1], progress=lambda: beats.append(2))
    assert got.files == 5 and beats.count(2) == 5


def test_prune_collects_a_cut_upload_older_than_a_complete_one_and_never_one_that_may_still_be_uploading(store, tmp_path):
    t0 = time.time() - 600
    src = write(tmp_path / "a", {"rank-0.json": "1", "w.bin": b"w" * 64})
    at = lambda s: (lambda: t0 + s)  # noqa: E731
    cut = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, now=at(0), deadline=0.0)  # cut: no manifest
    assert not cut.complete and cut.files == 0
    # (a cut upload that wrote some files before its deadline: made by hand, the deadline check precedes every file)
    store.write_key(ck.file_key("ft", cut.generation, "rank-0.json"), b"1")
    peer = ck.generation(t0 + 5, "i-2")  # a gang peer's upload of the same round, still going (another instance, fresh)
    store.write_key(ck.file_key("ft", peer, "rank-1.json"), b"1")
    lost = ck.generation(t0 - 3 * 3600, "i-9")  # another instance's, cut three hours ago: over (its instance is gone)
    store.write_key(ck.file_key("ft", lost, "rank-2.json"), b"1")
    done = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, now=at(10))
    going = ck.generation(t0 + 20, "i-1")  # newer than the newest complete one: may be uploading now
    store.write_key(ck.file_key("ft", going, "rank-0.json"), b"2")
    out, log = logs()
    assert ck.prune(store, "ft", log=log) == 2
    gens = {k.split("/")[3] for k in store.list_keys("checkpoints/ft/data")}
    assert gens == {done.generation, peer, going}, gens
    assert any(f"{cut.generation} was cut before its manifest" in m for m in out), out
    # An unreadable manifest is not a missing one: its upload's files stay.
    store.write_key(ck.manifest_key("ft", peer), b"{nope")
    assert ck.prune(store, "ft", now=lambda: t0 + 4 * 3600) == 0
    assert peer in {k.split("/")[3] for k in store.list_keys("checkpoints/ft/data")}
    assert ck.restore(store, "ft", tmp_path / "r").generations == [done.generation]


# ---------------------------------------------------------------- a job removed from the config

def _config(path: Path, *names: str) -> Path:
    from tests.fleetkit import job, pool, tenant, topology, write_config

    return write_config(path, [topology(), tenant("t"), pool("od", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=2),
                               *(job(n, cpu=1, mem=1) for n in names)])


def _planted(cfg: Path, job: str, tmp_path: Path) -> int:
    src = write(tmp_path / f"src-{job}", {"rank-0.json": '{"step": 900}', "model.bin": b"old model"})
    ck.upload(backend_for(cfg, None), job, src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None)
    return len(backend_for(cfg, None).list_keys(f"checkpoints/{job}"))


def test_a_job_removed_from_the_config_keeps_its_checkpoints_for_itself_put_back_and_a_new_one_of_its_name_starts_afresh(tmp_path):
    """Nothing marked a removed job's checkpoints: a new job given its name (another model) resumed the old one's
    training state. Deleted at once instead, a job file deleted by mistake and put back would lose its training for
    good: they are marked removed, kept for the retention, restored only into the same job put back (its spec hash),
    and deleted by an apply after it."""
    from reconciler import api
    from reconciler.runtime.publish import removed_checkpoints

    cfg = _config(tmp_path / "c", "other")
    n = _planted(cfg, "ft", tmp_path)  # ft was in the config; its replicas stopped and uploaded; it was removed since
    _planted(cfg, "other", tmp_path)  # a job still in the config (finished, say) keeps its checkpoints
    store = backend_for(cfg, None)
    res = api.apply(cfg)
    assert any(m.startswith("checkpoints of removed job ft marked removed, deleted after ") for m in res.report.notes), res.report.notes
    assert ck.removed_at(store, "ft") is not None and len(store.list_keys("checkpoints/ft")) == n + 1
    # A new job named ft (another model: another spec hash) finds no upload: it starts from an empty checkpoint dir.
    got = ck.restore(store, "ft", tmp_path / "new-ft" / "ckpt", spec_hash="another")
    assert got.why == "no upload since a job of this name was removed" and not (tmp_path / "new-ft").exists()
    # The same job put back (its spec hash the uploads') resumes them.
    assert ck.restore(store, "ft", tmp_path / "back" / "ckpt", spec_hash="h").files == 2
    assert api.apply(cfg).report.notes == []  # marked once: nothing more to say within the retention
    # Past the retention, deleted.
    later = time.time() + ck.retention_seconds() + 1
    assert removed_checkpoints(store, api.load(cfg), {}, now=later) == [f"checkpoints of removed job ft deleted: {n + 1} files"]
    assert store.list_keys("checkpoints/ft") == [] and store.list_keys("checkpoints/other") != []
    assert api.remove_checkpoints(cfg) == []  # nothing left to collect (the controller's call, when its plan changes nothing)


def test_a_removed_jobs_checkpoints_stay_while_a_replica_is_assigned_or_reported_running(tmp_path):
    from reconciler import api
    from reconciler.runtime.bus import Bus
    from reconciler.runtime.publish import removed_checkpoints

    cfg = _config(tmp_path / "c", "other")
    _planted(cfg, "ft", tmp_path)
    store = backend_for(cfg, None)
    bus, desired = Bus(store), api.load(cfg)
    entry = {"job": "ft", "replica": 0, "spec_hash": "h", "epoch": 1, "run": {"command": ["x"]}}
    previous = {"i-1": {"serial": 3, "replicas": [entry]}}  # the apply that removes ft withdraws this assignment
    notes = removed_checkpoints(store, desired, previous)
    assert notes and "kept until its replicas' stop is reported (still assigned)" in notes[0]
    # Withdrawn, but the agent still reports ft/0 running (stopping: its checkpoint grace, then its upload) ...
    bus.put_agent("i-1", {"heartbeat_at": time.time(), "state": "Ready", "running": ["ft/0", "other/0"]})
    assert "still running on i-1" in removed_checkpoints(store, desired, {})[0]
    # ... even when its heartbeat is stale (a long upload's single file): its instance still listed, it may upload.
    bus.put_agent("i-1", {"heartbeat_at": time.time() - 3600, "state": "Ready", "running": ["ft/0"]})
    assert "still running" in api.remove_checkpoints(cfg)[0]
    # An agent's report that cannot be read may be the one: nothing deleted.
    store.write_key("agents/i-2.json", b"{nope")
    assert "cannot be read" in removed_checkpoints(store, desired, {})[0]
    store.delete_key("agents/i-2.json")
    assert len(store.list_keys("checkpoints/ft")) == 3
    # The stop is reported (after the upload): deleted.
    bus.put_agent("i-1", {"heartbeat_at": time.time(), "state": "Ready", "running": ["other/0"]})
    [note] = removed_checkpoints(store, desired, {})
    assert note.startswith("checkpoints of removed job ft marked removed") and ck.removed_at(store, "ft") is not None


# ---------------------------------------------------------------- large files: streamed, never whole in memory

def _big(path: Path, mib: int) -> Path:
    """A file of `mib` MiB of random bytes, written a MiB at a time (the test holds none of it whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.writelines(os.urandom(1 << 20) for _ in range(mib))
    return path


def _same(a: Path, b: Path) -> bool:
    def sha(p: Path) -> str:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    return sha(a) == sha(b)


def test_a_file_over_the_multipart_threshold_goes_to_s3_in_parts_and_comes_back(aws_env, monkeypatch, request, tmp_path):
    """S3's PutObject refuses a body over 5 GB (multipart upload is required above it): each file was one write_key of
    its bytes. Above the backend's threshold a file now goes up in parts (S3 gives a multipart object the ETag
    "<md5 of the parts' md5s>-<parts>") and comes back by ranged GETs; the agent's heartbeat goes on meanwhile."""
    from reconciler import backend

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    monkeypatch.setattr(backend, "PROGRESS_EVERY_S", 0.01, raising=False)
    bucket = f"ck-{abs(hash(request.node.name)) % 10**8}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    s3 = backend_for(tmp_path, f"s3://{bucket}/fleets/demo")
    s3.multipart_threshold = s3.part_size = 5 << 20  # (S3's smallest part)
    src = tmp_path / "a"
    _big(src / "model.pt", 12)
    write(src, {"rank-0.json": '{"step": 9}', "empty.bin": ""})
    beats: list[int] = []
    up = ck.upload(s3, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None, progress=lambda: beats.append(1))
    assert up.complete and up.bytes == (12 << 20) + 11
    doc = json.loads(s3.read_key(ck.manifest_key("ft", up.generation)))
    etags = {f["path"]: client.head_object(Bucket=bucket, Key=f"fleets/demo/{f['key']}")["ETag"].strip('"') for f in doc["files"]}
    assert etags["model.pt"].endswith("-3") and "-" not in etags["rank-0.json"] + etags["empty.bin"], etags  # 5 + 5 + 2 MiB; the small one whole
    assert len(beats) > 3, beats  # called within the large file too, not only before each of the three
    beats.clear()
    got = ck.restore(s3, "ft", tmp_path / "b", log=lambda m: None, progress=lambda: beats.append(2))
    assert got.generations == [up.generation] and got.bytes == up.bytes and len(beats) > 3, beats
    assert _same(tmp_path / "b" / "model.pt", src / "model.pt") and (tmp_path / "b" / "rank-0.json").read_text() == '{"step": 9}'
    assert (tmp_path / "b" / "empty.bin").read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no staging, no partial download left
    # A missing object is False (its destination untouched); a missing bucket is an error, not a missing object.
    assert s3.read_file("checkpoints/ft/nope", tmp_path / "x") is False and not (tmp_path / "x").exists()
    with pytest.raises(ReconcileError, match=r"s3 bus: cannot read s3://no-such-bucket-ck/checkpoints/ft/nope"):
        backend_for(tmp_path, "s3://no-such-bucket-ck").read_file("checkpoints/ft/nope", tmp_path / "x")
    with pytest.raises(ReconcileError, match=r"s3 bus: cannot write s3://no-such-bucket-ck/checkpoints/ft/w"):
        backend_for(tmp_path, "s3://no-such-bucket-ck").write_file("checkpoints/ft/w", src / "rank-0.json")


def test_an_upload_and_restore_of_a_64_mib_file_never_hold_it_in_memory(store, tmp_path):
    """A checkpoint was read whole (upload: path.read_bytes()) and restored from bytes held for every file of a
    generation: 2 GB of them could take the agent out of memory. Peak Python allocation now stays a few MiB."""
    import tracemalloc

    src = tmp_path / "a"
    _big(src / "model.pt", 64)
    tracemalloc.start()
    try:
        up = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None)
        got = ck.restore(store, "ft", tmp_path / "b", log=lambda m: None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert up.bytes == got.bytes == 64 << 20 and _same(tmp_path / "b" / "model.pt", src / "model.pt")
    assert peak < 8 << 20, f"peak {peak / (1 << 20):.1f} MiB"


def test_the_heartbeat_goes_on_within_one_long_file_throttled(store, tmp_path, monkeypatch):
    """The agent beat only before each file: one file copied for longer than the stale limit (60 s) made its instance
    look lost. `progress` is now called within a file too (hashing it, copying it), at most every PROGRESS_EVERY_S:
    here on a clock where every chunk takes a second."""
    from types import SimpleNamespace

    from reconciler import atomicfile, backend

    src = tmp_path / "a"
    _big(src / "model.pt", 4)
    monkeypatch.setattr(atomicfile, "COPY_CHUNK", 256 << 10, raising=False)  # 16 chunks to copy, 16 to hash
    monkeypatch.setattr(ck, "HASH_CHUNK", 256 << 10, raising=False)
    t = [0.0]

    def monotonic() -> float:  # (backend.Every's clock: one second more at every look, a look per chunk)
        t[0] += 1.0
        return t[0]
    monkeypatch.setattr(backend, "time", SimpleNamespace(monotonic=monotonic, time=time.time), raising=False)  # (time: a stamped read)
    monkeypatch.setattr(backend, "PROGRESS_EVERY_S", 5.0, raising=False)
    beats: list[str] = []
    up = ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None, progress=lambda: beats.append("up"))
    assert up.complete
    # once before the file, then every 5 of its 32 chunks' seconds: neither only once nor at every chunk
    assert 1 + 4 <= beats.count("up") <= 1 + 8, beats
    got = ck.restore(store, "ft", tmp_path / "b", log=lambda m: None, progress=lambda: beats.append("restore"))
    assert got.files == 1 and 1 + 4 <= beats.count("restore") <= 1 + 8, beats
    assert _same(tmp_path / "b" / "model.pt", src / "model.pt")


def small_disk(monkeypatch, free: int) -> None:
    """The local file system, as the restore sees it, has `free` bytes free (checkpoints.disk_usage, its one seam)."""
    monkeypatch.setattr(ck, "disk_usage", lambda path: SimpleNamespace(total=10**12, used=10**12 - free, free=free))


def beside(d: Path) -> list[str]:
    return sorted(p.name for p in d.parent.iterdir() if p.name != d.name)


@pytest.mark.parametrize("gang", [False, True], ids=["one", "gang"])
def test_a_restore_the_disk_has_no_room_for_fails_naming_the_job_bytes_and_free_and_leaves_the_directory(store, tmp_path, monkeypatch, gang):
    """A restore stages every file it takes before any replaces a local one. With too little free disk each download
    failed ("cannot read: skipped", as a broken upload), every older upload was tried and fetched too, and then the
    replica started from the older local files (one replica) or, a gang, had its local files moved aside and started
    afresh ("no complete round"). Now it fails first, naming the job, the bytes needed and free, with nothing fetched
    and the local directory as it was; with room it restores."""
    now = clock()
    if gang:
        _gang_up(store, tmp_path / "u0", {"rank-0": "7" * 3000}, "i-0", 1, [0], now)
        _gang_up(store, tmp_path / "u1", {"rank-1": "7" * 2000}, "i-1", 1, [1], now)
    else:
        ck.upload(store, "g", write(tmp_path / "u0", {"rank-0": "7" * 3000, "rank-1": "7" * 2000}), instance="i-0", spec_hash="h", epoch=1, now=now)
    dest = write(tmp_path / "b" / "ckpt", {"rank-0": "3", "scratch": "mine"})
    os.utime(dest / "rank-0", (1_000_000_000, 1_000_000_000))  # older than the uploads: restored over
    small_disk(monkeypatch, 4000)
    out, log = logs()
    with pytest.raises(ck.NoRoomError) as err:
        ck.restore(store, "g", dest, log=log, spec_hash="h", epoch=2, world_size=2 if gang else 1)
    said = str(err.value)
    assert "g: " in said and "needs 5000 bytes" in said and "4000 free" in said and str(dest) in said, said
    assert steps(dest) == {"rank-0": "3", "scratch": "mine"} and beside(dest) == [], beside(dest)  # as it was: nothing staged or aside
    small_disk(monkeypatch, 10**9)
    got = ck.restore(store, "g", dest, log=log, spec_hash="h", epoch=2, world_size=2 if gang else 1)
    assert got.files == 2 and steps(dest)["rank-0"] == "7" * 3000, got


@pytest.mark.parametrize("gang", [False, True], ids=["one", "gang"])
def test_a_restore_never_writes_through_a_link_the_job_left_in_its_directory(store, tmp_path, gang):
    """A job (root in its container, its checkpoint dir a host directory) leaves `sub -> /etc` in that directory; an
    upload (of another rank, another instance) holds `sub/passwd`. The restore, run by the agent as root on the host,
    wrote the upload's file through the link: /etc/passwd replaced. Now a link in the way of a restored file is
    removed (never followed) and the file restored into a directory of its own."""
    now = clock()
    etc = write(tmp_path / "etc", {"passwd": "root:x:0:0"})
    if gang:
        _gang_up(store, tmp_path / "u0", {"sub/passwd": "pwned"}, "i-0", 1, [0], now)
        _gang_up(store, tmp_path / "u1", {"rank-1": "1"}, "i-1", 1, [1], now)
    else:
        ck.upload(store, "g", write(tmp_path / "u0", {"sub/passwd": "pwned"}), instance="i-0", spec_hash="h", epoch=1, now=now)
    dest = tmp_path / "b" / "ckpt"
    dest.mkdir(parents=True)
    (dest / "sub").symlink_to(etc)
    out, log = logs()
    got = ck.restore(store, "g", dest, log=log, spec_hash="h", epoch=2, world_size=2 if gang else 1)
    assert got.generations, (got, out)
    assert (etc / "passwd").read_text() == "root:x:0:0"  # before: pwned
    assert not (dest / "sub").is_symlink() and (dest / "sub" / "passwd").read_text() == "pwned"
    assert any("a link" in m and "sub" in m for m in out), out


def test_a_file_begun_before_the_upload_deadline_is_sent_whole_and_a_last_one_completes_the_upload(store, tmp_path):
    """The deadline is checked before each file, never within one: a last file begun in time and ending after it
    completes the upload (an instance that outlives the deadline, a move or an edit, keeps that checkpoint); a next
    file past it is not begun, and the upload, without a manifest, leaves the previous complete generation newest."""
    now = clock()
    first = ck.upload(store, "ft", write(tmp_path / "a", {"a.bin": "1"}), instance="i-1", spec_hash="h", epoch=1, now=now)
    slow = lambda: time.sleep(0.3)  # noqa: E731 (the agent's heartbeat, here slow: each file ends past the deadline)
    late = ck.upload(store, "ft", write(tmp_path / "b", {"a.bin": "2"}), instance="i-1", spec_hash="h", epoch=2, now=now,
                     deadline=time.monotonic() + 0.1, progress=slow)
    assert late.complete and late.files == 1, late
    cut = ck.upload(store, "ft", write(tmp_path / "c", {"a.bin": "3", "b.bin": "3"}), instance="i-1", spec_hash="h", epoch=3, now=now,
                    deadline=time.monotonic() + 0.1, progress=slow)
    assert not cut.complete and cut.files == 1 and "out of time after 1/2 file(s)" in cut.why, cut
    assert [d["generation"] for d in ck.manifests(store, "ft")] == [late.generation, first.generation]


def test_a_manifest_whose_file_keys_lie_outside_its_own_jobs_generation_is_skipped_whole(store, tmp_path):
    """A manifest under job a's prefix (any agent can write one: the bus is shared) naming another job's file by its key,
    with that file's size and sha256 (the writer reads both): a's restore took job b's checkpoint, and a's prune deleted
    it. Each file's key must be the one upload gives it (file_key: its job, its generation, its path)."""
    now = clock()
    out, log = logs()
    other = ck.upload(store, "b", write(tmp_path / "b", {"rank-0.json": "b's weights"}), instance="i-2", spec_hash="hb", epoch=1, now=now, log=log)
    mine = ck.upload(store, "a", write(tmp_path / "a", {"rank-0.json": "a's own"}), instance="i-1", spec_hash="ha", epoch=1, now=now, log=log)
    b_file = json.loads(store.read_key(ck.manifest_key("b", other.generation)))["files"][0]
    for gen, key in (("9999999999990-x", b_file["key"]),  # another job's key outright
                     ("9999999999991-x", f"{ck.data_prefix('a')}/9999999999991-x/../../../b/data/{other.generation}/rank-0.json"),
                     ("9999999999992-x", ck.file_key("a", mine.generation, "rank-0.json"))):  # a's, but another generation's
        forged = json.loads(store.read_key(ck.manifest_key("a", mine.generation)))
        forged.update(generation=gen, created_unix=float(gen[:13]) / 1000)
        forged["files"] = [{**b_file, "key": key}]
        store.write_key(ck.manifest_key("a", gen), json.dumps(forged).encode())
    assert [d["generation"] for d in ck.manifests(store, "a", log=log)] == [mine.generation]
    assert sum("names the key" in m and "outside" in m for m in out) == 3, out
    dest = tmp_path / "restored"
    assert ck.restore(store, "a", dest, log=log).generations == [mine.generation]
    assert (dest / "rank-0.json").read_text() == "a's own"
    ck.prune(store, "a", keep=0, log=log)
    assert store.read_key(b_file["key"]) == b"b's weights"


RESTORE_UNDER_A_FILE_SIZE_LIMIT = r'''
import json, resource, signal, sys
from pathlib import Path
from reconciler.backend import backend_for
from reconciler.runtime import checkpoints as ck
cfg, dest, limit, world, url = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] or None
store = backend_for(Path(cfg), url)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as one on a full disk does
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
said = []
try:
    got = ck.restore(store, "g", dest, log=said.append, spec_hash="h", epoch=2, world_size=world)
    out = {"restored": got.generations, "why": got.why}
except ck.NoRoomError as e:
    out = {"no_room": str(e)}
print(json.dumps({**out, "log": said}))
'''


@pytest.mark.parametrize("gang", [False, True], ids=["one", "gang"])
def test_a_disk_that_fills_in_the_middle_of_a_restore_leaves_the_directory_and_restores_no_older_upload(store, tmp_path, gang):
    """The disk fills while the newest upload is fetched (its room was there when checked: another writer took it, or
    a quota): each download failed as a broken upload would ("cannot read: skipped"), the next older upload was restored
    instead (or, none left, the gang's files moved aside) and the replica resumed from older training. It fails as a
    restore without room does (NoRoomError: the agent does not start the replica), the directory as it was, nothing
    staged left. The disk is filled for real: a file-size limit (RLIMIT_FSIZE) in the process that restores."""
    now = clock()
    if gang:
        _gang_up(store, tmp_path / "o0", {"rank-0": "1" * 100}, "i-0", 1, [0], now)
        _gang_up(store, tmp_path / "o1", {"rank-1": "1" * 100}, "i-1", 1, [1], now)
        _gang_up(store, tmp_path / "u0", {"rank-0": "7" * 100, "weights": os.urandom(300_000)}, "i-0", 2, [0], now)
        _gang_up(store, tmp_path / "u1", {"rank-1": "7" * 100}, "i-1", 2, [1], now)
    else:
        ck.upload(store, "g", write(tmp_path / "o", {"rank-0": "1" * 100}), instance="i-0", spec_hash="h", epoch=1, now=now)
        ck.upload(store, "g", write(tmp_path / "u", {"rank-0": "7" * 100, "weights": os.urandom(300_000)}), instance="i-0",
                  spec_hash="h", epoch=2, now=now)
    _restore_under_a_file_size_limit(tmp_path, 2 if gang else 1, "")


def _restore_under_a_file_size_limit(tmp_path, world: int, url: str) -> None:
    dest = write(tmp_path / "b" / "ckpt", {"rank-0": "3", "scratch": "mine"})
    os.utime(dest / "rank-0", (1_000_000_000, 1_000_000_000))  # older than the uploads: restored over
    run = subprocess.run([sys.executable, "-c", RESTORE_UNDER_A_FILE_SIZE_LIMIT, str(tmp_path / "cfg"), str(dest), "100000",
                          str(world), url], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert "no_room" in got, got  # before: restored from the older upload (or the gang's files moved aside)
    assert "g: " in got["no_room"] and "weights" in got["no_room"] and str(dest) in got["no_room"], got["no_room"]
    assert steps(dest) == {"rank-0": "3", "scratch": "mine"} and beside(dest) == [], beside(dest)


def test_a_disk_that_fills_in_the_middle_of_a_restore_from_s3_fails_as_one_without_room(aws_env, monkeypatch, request, tmp_path):
    """As above, through s3:// on the moto server: the SDK's download fails on the full disk, not the object."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    bucket = f"ck-{abs(hash(request.node.name)) % 10**8}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/fleets/demo"
    s3, now = backend_for(tmp_path / "cfg", url), clock()
    ck.upload(s3, "g", write(tmp_path / "o", {"rank-0": "1" * 100}), instance="i-0", spec_hash="h", epoch=1, now=now)
    ck.upload(s3, "g", write(tmp_path / "u", {"rank-0": "7" * 100, "weights": os.urandom(300_000)}), instance="i-0",
              spec_hash="h", epoch=2, now=now)
    _restore_under_a_file_size_limit(tmp_path, 1, url)


@pytest.mark.parametrize("gang", [False, True], ids=["one", "gang"])
def test_a_restore_that_fails_while_its_files_are_moved_into_place_leaves_the_directory_as_it_was(store, tmp_path, monkeypatch, gang):
    """Staged whole, the files are then moved into the local directory one by one; a move that failed (a full disk:
    a directory entry, a new subdirectory) left it half restored, some files of the upload beside older ones of the
    job's (the gang's other local files moved aside), and the agent started the replica from it. Every move is undone
    (nothing else changed) and the restore fails, NoRoomError for a full disk: the replica is not started. The failure
    is injected at the I/O boundary (os.replace, the third move into place)."""
    import errno

    now = clock()
    files = {"a": "7", "b": "7", "sub/c": "7", "sub/d": "7"}
    if gang:
        _gang_up(store, tmp_path / "u0", files, "i-0", 1, [0], now)
        _gang_up(store, tmp_path / "u1", {"rank-1": "7"}, "i-1", 1, [1], now)
    else:
        ck.upload(store, "g", write(tmp_path / "u", files), instance="i-0", spec_hash="h", epoch=1, now=now)
    dest = write(tmp_path / "b" / "ckpt", {"a": "3", "sub/c": "3", "scratch": "mine"})
    for rel in ("a", "sub/c", "scratch"):
        os.utime(dest / rel, (1_000_000_000, 1_000_000_000))  # older than the uploads: restored over
    before = steps(dest)
    real, moved = os.replace, []

    def replace(src, dst):
        if ".fleetops-restore" in str(src) and str(dst).startswith(str(dest) + os.sep):
            moved.append(dst)
            if len(moved) == 3:
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(ck.os, "replace", replace)
    with pytest.raises(ck.NoRoomError) as err:
        ck.restore(store, "g", dest, log=lambda m: None, spec_hash="h", epoch=2, world_size=2 if gang else 1)
    assert "No space left on device" in str(err.value) and str(dest) in str(err.value), err.value
    assert steps(dest) == before and beside(dest) == [], (steps(dest), beside(dest))  # before: half restored
    monkeypatch.setattr(ck.os, "replace", real)
    got = ck.restore(store, "g", dest, log=lambda m: None, spec_hash="h", epoch=2, world_size=2 if gang else 1)
    assert {k: v for k, v in steps(dest).items() if k in files} == files and got.generations, (steps(dest), got)


@pytest.mark.parametrize("gang", [False, True], ids=["one", "gang"])
@pytest.mark.parametrize("what", ["file", "link"])
def test_a_checkpoint_directory_the_job_replaced_by_a_file_or_link_is_restored_in_its_place(store, tmp_path, gang, what):
    """The job replaced its own checkpoint directory by a file: the restore failed (File exists) and the replica's
    start on it failed for good (StartError), its checkpoint never resumed from. By a link: the restore wrote through it
    into the directory it names (a gang's moved that directory's files aside), the agent root on the host. The file or
    link is replaced by the restored directory; a link is never followed."""
    now = clock()
    if gang:
        _gang_up(store, tmp_path / "u0", {"rank-0": "7"}, "i-0", 1, [0], now)
        _gang_up(store, tmp_path / "u1", {"rank-1": "7"}, "i-1", 1, [1], now)
    else:
        ck.upload(store, "g", write(tmp_path / "u", {"rank-0": "7", "rank-1": "7"}), instance="i-0", spec_hash="h", epoch=1, now=now)
    dest = tmp_path / "b" / "ckpt"
    dest.parent.mkdir()
    elsewhere = write(tmp_path / "elsewhere", {"keep": "mine"})
    if what == "file":
        dest.write_text("not a directory")
    else:
        dest.symlink_to(elsewhere)
    out, log = logs()
    got = ck.restore(store, "g", dest, log=log, spec_hash="h", epoch=2, world_size=2 if gang else 1)
    assert got.generations and dest.is_dir() and not dest.is_symlink(), got
    assert steps(dest) == {"rank-0": "7", "rank-1": "7"} and beside(dest) == [], (steps(dest), beside(dest))
    assert steps(elsewhere) == {"keep": "mine"}  # (a link's target untouched)
    assert any(f"a {what} at {dest}" in m for m in out), out


@pytest.mark.parametrize("days", ["nan", "-1", "inf", "1e300", "seven"])
def test_a_retention_that_is_no_number_of_days_deletes_nothing_and_says_why(tmp_path, monkeypatch, days):
    """s35: FLEETOPS_CHECKPOINT_RETENTION_DAYS=nan or -1 was a retention of 0 (max(0, nan) is 0): the apply after the
    one that marked a removed job's checkpoints deleted them, the loss the retention is there to prevent; inf or 1e300
    was an "unexpected OverflowError" (the deletion date) after the apply had changed the fleet; "seven" was 7 days,
    silently. Each is a note saying what to fix, and nothing is marked or deleted."""
    from reconciler import api
    from reconciler.runtime.publish import removed_checkpoints

    cfg = _config(tmp_path / "c", "other")
    n = _planted(cfg, "ft", tmp_path)
    store = backend_for(cfg, None)
    api.apply(cfg)  # marks ft's checkpoints removed
    monkeypatch.setenv("FLEETOPS_CHECKPOINT_RETENTION_DAYS", days)
    notes = removed_checkpoints(store, api.load(cfg), {}, now=time.time() + 3600)
    assert notes == [f"checkpoints of removed jobs not collected: FLEETOPS_CHECKPOINT_RETENTION_DAYS={days!r} is not a "
                     "number of days from 0 to 36500; tried again by the next apply"], notes
    assert len(store.list_keys("checkpoints/ft")) == n + 1


@pytest.mark.parametrize("mb", ["nan", "-1", "inf", "1e400", "lots"])
def test_a_sync_limit_that_is_no_number_of_mb_is_an_error_naming_it(tmp_path, monkeypatch, mb):
    """s35: FLEETOPS_CHECKPOINT_SYNC_MAX_MB=nan or -1 was a limit of 0 bytes (max(0, nan) is 0): no checkpoint was ever
    uploaded, said only in the agent's log as "over the 0 byte limit"; inf an OverflowError the agent did not catch.
    Each is the error the agent logs for a checkpoint not uploaded, naming the variable; nothing is uploaded."""
    from reconciler.errors import ReconcileError

    store = backend_for(tmp_path / "cfg", None)
    src = write(tmp_path / "src", {"rank-0.json": '{"step": 1}'})
    monkeypatch.setenv("FLEETOPS_CHECKPOINT_SYNC_MAX_MB", mb)
    with pytest.raises(ReconcileError, match=f"FLEETOPS_CHECKPOINT_SYNC_MAX_MB='{mb}' is not a number of MB from 0 to "):
        ck.upload(store, "ft", src, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None)
    assert store.list_keys("checkpoints/ft") == []
