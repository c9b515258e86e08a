"""The gs:// and azblob:// state backends (state, lock, bus) against real emulators: gcp-storage-emulator
behind GCS's documented generation preconditions (tests/gcs_emulator.py) and Azurite (tests/azurite.py).
The same cases the s3 backend passes on moto (tests/test_state_backend.py, tests/test_safety.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import pytest

from providers.sim import SimCloud
from reconciler import api
from reconciler.backend import AzureBlobBackend, GcsBackend, backend_for
from reconciler.errors import CorruptBusObjectError, LockError, ReconcileError
from reconciler.runtime.bus import Bus
from reconciler.state import State, StateFileError, state_dir, state_to_json
from tests.fleetkit import copy_quickstart
from tests.test_runtime_bus import _round_trip, reading_five_reports_costs
from tests.test_safety import assert_clean_error, assert_renewed_while_held_and_lost_lease_noticed, cli, cli_here


@dataclass
class Store:
    url: str  # the backend URL, prefix "fleet"
    env: dict  # what a `reconcile` process needs to reach the emulator
    put: Callable[[str, bytes], None]  # raw object access, around the backend under test
    get: Callable[[str], bytes | None]
    keys: Callable[[], list[str]]


def _gcs_store(emu, monkeypatch, name: str) -> Store:
    from google.api_core.exceptions import NotFound
    from google.cloud import storage

    env = {"STORAGE_EMULATOR_HOST": emu.url, "GOOGLE_CLOUD_PROJECT": "fleetops-test"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = storage.Client().create_bucket(name)

    def get(key):
        try:
            return bucket.blob(key).download_as_bytes()
        except NotFound:
            return None

    return Store(f"gs://{name}/fleet", env, lambda k, b: bucket.blob(k).upload_from_string(b), get,
                 lambda: sorted(b.name for b in bucket.list_blobs()))


def _azure_store(emu, monkeypatch, name: str) -> Store:
    from azure.core.exceptions import ResourceNotFoundError
    from azure.storage.blob import BlobServiceClient

    from tests.azurite import ACCOUNT

    env = {"AZURE_STORAGE_CONNECTION_STRING": emu.connection_string}
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", emu.connection_string)
    container = BlobServiceClient.from_connection_string(emu.connection_string).create_container(name)

    def get(key):
        try:
            return container.get_blob_client(key).download_blob().readall()
        except ResourceNotFoundError:
            return None

    return Store(f"azblob://{ACCOUNT}/{name}/fleet", env, lambda k, b: container.get_blob_client(k).upload_blob(b, overwrite=True), get,
                 lambda: sorted(b.name for b in container.list_blobs()))


@pytest.fixture(params=["gs", "azblob"])
def store(request, monkeypatch) -> Store:
    name = f"fleet-{abs(hash(request.node.name)) % 10**8}"
    if request.param == "gs":
        return _gcs_store(request.getfixturevalue("gcs_emulator"), monkeypatch, name)
    return _azure_store(request.getfixturevalue("azurite"), monkeypatch, name)


def _backend(store: Store, **kw):
    cls = GcsBackend if store.url.startswith("gs://") else AzureBlobBackend
    return cls(store.url, **kw)


def test_state_round_trips_and_apply_converges_keeping_nothing_local(store, tmp_path):
    backend = backend_for(tmp_path, store.url)
    assert isinstance(backend, GcsBackend | AzureBlobBackend)
    assert backend.load().placements == {}
    st = State(placements={"job": ["i-1", "i-2"]}, serial=3)
    st.mark_short("gcp", "us-central1-a", "a2-highgpu-8g", "spot")
    backend.save(st)
    assert json.loads(store.get("fleet/state.json"))["placements"] == {"job": ["i-1", "i-2"]}
    again = backend.load()
    assert again.placements == st.placements and again.short_now() == st.short_now() and again.serial == 3

    qs = copy_quickstart(tmp_path)
    api.apply(qs, state=store.url)
    assert not (state_dir(qs) / "state.json").exists()
    assert "placements" in json.loads(store.get("fleet/state.json"))
    assert not api.plan(qs, state=store.url).plan.has_changes
    assert store.get("fleet/lock.json") is None  # released once the apply is over


def test_of_many_concurrent_lockers_exactly_one_gets_the_lock(store):
    """The conditional create is the whole guarantee: eight runners try at the same instant."""
    backends = [_backend(store) for _ in range(8)]
    start, results = threading.Barrier(len(backends)), []

    def race(b):
        start.wait()
        try:
            ctx = b.lock()
            results.append(("won", ctx.__enter__(), ctx))
        except LockError as e:
            results.append(("lost", str(e), None))

    threads = [threading.Thread(target=race, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    won = [r for r in results if r[0] == "won"]
    assert len(results) == 8 and len(won) == 1, results
    assert all(f"another apply holds the lock {store.url}/lock.json: {won[0][1]}" in r[1] for r in results if r[0] == "lost"), results
    won[0][2].__exit__(None, None, None)
    assert store.get("fleet/lock.json") is None


def test_lock_is_exclusive_expired_ones_are_taken_over_and_unlock_breaks_a_live_one(store, tmp_path):
    a, b = backend_for(tmp_path, store.url), backend_for(tmp_path, store.url)
    with a.lock() as held:
        with pytest.raises(LockError, match=f"another apply holds the lock {store.url}/lock.json: {held} \\(pid {os.getpid()}"):
            with b.lock():
                pass
        with pytest.raises(LockError, match="refusing to break it"):
            b.unlock("not-the-holder")
    with b.lock():  # released: the next one gets it
        pass

    stuck = _backend(store, ttl=timedelta(seconds=-1)).lock()  # every lock it writes is already expired
    stuck.__enter__()  # a runner that died holding the lock
    with backend_for(tmp_path, store.url).lock():
        pass
    live = backend_for(tmp_path, store.url).lock()
    lock_id = live.__enter__()
    res = cli("unlock", lock_id, "--state", store.url, env=store.env)
    assert res.returncode == 0, res.stderr
    assert store.get("fleet/lock.json") is None
    # The broken holders finish later: they no longer hold the lock, so they delete nothing.
    with backend_for(tmp_path, store.url).lock():
        live.__exit__(None, None, None)
        stuck.__exit__(None, None, None)
        assert store.get("fleet/lock.json") is not None


def test_lock_is_renewed_while_held_and_a_lost_lease_is_noticed(store):
    assert_renewed_while_held_and_lost_lease_noticed(_backend(store, ttl=timedelta(seconds=6)),
                                                     _backend(store, ttl=timedelta(seconds=6)), store.url,
                                                     lambda: store.get("fleet/lock.json"))


def test_two_concurrent_applies_exactly_one_proceeds(store, tmp_path):
    qs = copy_quickstart(tmp_path)
    sim = SimCloud(state_dir(qs))
    sim.set_fault(latency_ms=2000)  # a slow cloud keeps the first apply inside its lock until the second is done
    penv = {**os.environ, **store.env, "FLEETOPS_STATE": store.url}
    cmd = [sys.executable, "-m", "reconciler.cli", "apply", str(qs), "--auto-approve"]
    first = subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while store.get("fleet/lock.json") is None and time.time() < deadline:  # the first one holds it
        time.sleep(0.05)
    second = subprocess.run(cmd, env=penv, capture_output=True, text=True, timeout=300)
    sim.set_fault(latency_ms=0)  # now let the first one finish
    out, err = first.communicate(timeout=300)
    assert (first.returncode, second.returncode) == (0, 1), (out, err, second.stdout, second.stderr)
    assert f"another apply holds the lock {store.url}/lock.json" in second.stderr and "reconcile unlock" in second.stderr
    assert "Applied plan" in out
    assert not api.plan(qs, state=store.url).plan.has_changes


@pytest.fixture(scope="module")
def applied_once(tmp_path_factory):
    cfg = copy_quickstart(tmp_path_factory.mktemp("applied"))
    assert cli_here("apply", cfg, "--auto-approve").returncode == 0
    return cfg


def test_garbled_state_and_lock_objects_are_clear_errors(store, applied_once, tmp_path):
    cfg = tmp_path / "cfg"
    shutil.copytree(applied_once, cfg)
    store.put("fleet/state.json", b'{"placements": [1, 2')
    assert_clean_error(cli_here("apply", cfg, "--auto-approve", "--state", store.url, env=store.env),
                       f"{store.url}/state.json: cannot read the reconciler's state: not valid JSON", "move it aside")
    store.put("fleet/state.json", b'{"placements": {"train": "i-1"}}')
    with pytest.raises(ReconcileError, match=f"{store.url}/state.json: cannot read the reconciler's state: placements is not a map"):
        api.plan(cfg, state=store.url)
    store.put("fleet/state.json", state_to_json(State()).encode())

    store.put("fleet/lock.json", b"\x00not json")
    res = cli_here("apply", cfg, "--auto-approve", "--state", store.url, env=store.env)
    assert_clean_error(res, f"another apply holds the lock {store.url}/lock.json: nobody: the lock is garbled", "reconcile unlock garbled-")
    lock_id = res.stderr.split("reconcile unlock ")[1].split()[0].rstrip("`")
    with pytest.raises(LockError, match=f"held by {lock_id}, not garbled-00000000"):
        backend_for(cfg, store.url).unlock("garbled-00000000")
    backend_for(cfg, store.url).unlock(lock_id)
    assert store.get("fleet/lock.json") is None


def test_bus_round_trips(store, tmp_path):
    bus = Bus(backend_for(tmp_path, store.url))
    _round_trip(bus)
    assert store.keys() == ["fleet/agents/i-1.json", "fleet/assignments/i-1.json", "fleet/runs/eval/0.json",
                            "fleet/runs/train/0.json", "fleet/runs/train/1.json"]


def test_every_agents_report_is_read_in_one_request_plus_the_listing(store, tmp_path, monkeypatch):
    """GCS: each report cost its metadata, then that generation's body (11 requests for 5); now the listing's stamps
    (`updated`, the list response's Date) judge them and each body is read pinned to the generation listed (6)."""
    assert reading_five_reports_costs(Bus(backend_for(tmp_path, store.url)), monkeypatch) == {"GET": 6}


@pytest.mark.parametrize("scheme", ["gs", "azblob"])
def test_an_unreachable_store_is_a_clear_error_without_credentials(scheme, monkeypatch, tmp_path):
    from reconciler import backend

    if scheme == "gs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens on the discard port
        monkeypatch.setattr(backend, "GCS_RETRY_SECONDS", 0.5)
        url = "gs://nowhere/fleet"
    else:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "DefaultEndpointsProtocol=http;AccountName=acct;"
                           "AccountKey=UzNDUkVUS0VZ;BlobEndpoint=http://127.0.0.1:9/acct;")
        monkeypatch.setattr(backend, "AZBLOB_RETRIES", 0)
        url = "azblob://acct/nowhere/fleet"
    store = backend_for(tmp_path, url)
    with pytest.raises(ReconcileError, match=f"{scheme} bus: cannot read {url}/assignments/i-1.json") as e:
        Bus(store).assignment("i-1")
    with pytest.raises(ReconcileError, match=f"{scheme} state backend: cannot lock {url}/lock.json: .*Nothing was changed") as e:
        with store.lock():
            pass
    assert "UzNDUkVUS0VZ" not in str(e.value)


@pytest.mark.parametrize("scheme", ["gs", "azblob"])
def test_a_store_that_stops_answering_is_a_clear_error_within_seconds(scheme, monkeypatch, tmp_path, hung_endpoint):
    """The store accepts connections and never answers (a hung server, a proxy blackholing it). GCS's client waited 60 s
    a try, then retried for GCS_RETRY_SECONDS; Azure's 60 s a try, 6 tries, 15 s and more between them: minutes for one
    read, the agent's loop held with it (tests/test_runtime_chaos.py). Each request now gives up after the timeouts S3's
    does (5 s to connect, 10 s a read); on this test's timescale (0.3 s, no retry) the read is the bus's error."""
    from reconciler import backend

    assert (backend.STORE_CONNECT_TIMEOUT_S, backend.STORE_READ_TIMEOUT_S) == (5.0, 10.0)
    at = f"127.0.0.1:{hung_endpoint.getsockname()[1]}"
    for name in ("STORE_CONNECT_TIMEOUT_S", "STORE_READ_TIMEOUT_S"):
        monkeypatch.setattr(backend, name, 0.3, raising=False)
    if scheme == "gs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{at}")
        monkeypatch.setattr(backend, "GCS_RETRY_SECONDS", 0.5)
        url = "gs://hung/fleet"
    else:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "DefaultEndpointsProtocol=http;AccountName=acct;"
                           f"AccountKey=UzNDUkVUS0VZ;BlobEndpoint=http://{at}/acct;")
        monkeypatch.setattr(backend, "AZBLOB_RETRIES", 0)
        url = "azblob://acct/hung/fleet"
    bus = Bus(backend_for(tmp_path, url))
    said: list[BaseException] = []

    def read() -> None:
        try:
            bus.assignment("i-1")
        except BaseException as e:  # noqa: BLE001 - handed to the test
            said.append(e)

    reader = threading.Thread(target=read, daemon=True)
    began = time.monotonic()
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "the read still hangs after 5 s"  # before: 60 s or more
    assert said and isinstance(said[0], ReconcileError) and f"{scheme} bus: cannot read {url}/assignments/i-1.json" in str(said[0]), said
    assert time.monotonic() - began < 3


def test_a_connection_string_for_another_account_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "DefaultEndpointsProtocol=https;AccountName=other;AccountKey=eA==")
    with pytest.raises(ReconcileError, match="AZURE_STORAGE_CONNECTION_STRING is for account 'other', not 'mine'"):
        backend_for(tmp_path, "azblob://mine/state/fleet")
    with pytest.raises(ReconcileError, match="is not azblob://account/container/prefix"):
        backend_for(tmp_path, "azblob://mine")


def test_a_large_file_is_streamed_up_in_chunks_or_blocks_and_back_and_a_checkpoint_round_trips(store, request, monkeypatch, tmp_path):
    """A checkpoint's file went through write_key/read_key as bytes, whole in memory. write_file/read_file stream it:
    on GCS a resumable upload in GCS_CHUNK chunks, on Azure Put Block per AZBLOB_BLOCK and Put Block List; read back
    into a temporary name renamed only once whole; the caller's progress called meanwhile."""
    from reconciler import backend
    from reconciler.runtime import checkpoints as ck

    monkeypatch.setattr(backend, "GCS_CHUNK", 4 << 20, raising=False)
    monkeypatch.setattr(backend, "AZBLOB_BLOCK", 4 << 20, raising=False)
    monkeypatch.setattr(backend, "PROGRESS_EVERY_S", 0.01, raising=False)
    chunks: list[int] = []
    if store.url.startswith("gs://"):
        storage = request.getfixturevalue("gcs_emulator").storage
        add = storage.add_to_resumable_upload

        def counted(upload_id, data, *a, **kw):
            chunks.append(len(data))
            return add(upload_id, data, *a, **kw)
        monkeypatch.setattr(storage, "add_to_resumable_upload", counted)
    b = _backend(store)
    src = tmp_path / "a" / "model.pt"
    src.parent.mkdir()
    body = os.urandom((12 << 20) + 1000)
    src.write_bytes(body)
    beats: list[int] = []
    b.write_file("checkpoints/ft/model.pt", src, lambda: beats.append(1))
    assert store.get("fleet/checkpoints/ft/model.pt") == body
    if store.url.startswith("gs://"):
        assert [n for n in chunks if n] == [4 << 20, 4 << 20, 4 << 20, 1000], chunks
    else:
        from azure.storage.blob import BlobServiceClient

        from tests.azurite import ACCOUNT

        container = BlobServiceClient.from_connection_string(store.env["AZURE_STORAGE_CONNECTION_STRING"]).get_container_client(
            store.url.removeprefix(f"azblob://{ACCOUNT}/").split("/")[0])
        committed, _ = container.get_blob_client("fleet/checkpoints/ft/model.pt").get_block_list("committed")
        assert [blk.size for blk in committed] == [4 << 20, 4 << 20, 4 << 20, 1000]
    dest = tmp_path / "b" / "model.pt"
    dest.parent.mkdir()
    assert b.read_file("checkpoints/ft/model.pt", dest, lambda: beats.append(2)) is True and dest.read_bytes() == body
    assert b.read_file("checkpoints/ft/nope", tmp_path / "b" / "nope") is False
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.pt"]  # no temporary file left
    assert beats, "progress was never called while 12 MiB went up and back"
    # The whole checkpoint path on this store.
    (src.parent / "rank-0.json").write_text('{"step": 4}')
    (src.parent / "empty.bin").write_bytes(b"")
    up = ck.upload(b, "ft", src.parent, instance="i-1", spec_hash="h", epoch=1, log=lambda m: None)
    got = ck.restore(b, "ft", tmp_path / "c", log=lambda m: None)
    assert got.generations == [up.generation] and got.bytes == len(body) + 11
    assert (tmp_path / "c" / "model.pt").read_bytes() == body and (tmp_path / "c" / "rank-0.json").read_text() == '{"step": 4}'
    assert (tmp_path / "c" / "empty.bin").read_bytes() == b""


def check_oversized_objects_are_refused(url: str, put: Callable[[str, bytes], None], get: Callable[[str], bytes | None],
                                        monkeypatch, tmp_path) -> None:
    """Shared by every remote store (`put`/`get` take keys under the URL's prefix). The state, a bus object and the lock
    were downloaded whole, however large: a huge object was an unbounded download, then a MemoryError. Each is read as
    its local file is: the state and a bus object up to MAX_STATE_BYTES (here 1 MiB: a 3 MiB object, valid but for
    its size), refused naming the object; the lock's first LOCK_BYTES, a garbled lock `reconcile unlock` breaks."""
    from reconciler import backend, state

    monkeypatch.setattr(state, "MAX_STATE_BYTES", 1 << 20)
    monkeypatch.setattr(backend, "MAX_STATE_BYTES", 1 << 20)
    padded = state_to_json(State()).encode() + b" " * (3 << 20)  # (before: read whole, it loaded)
    put("state.json", padded)
    qs = copy_quickstart(tmp_path)
    with pytest.raises(StateFileError, match=re.escape(f"{url}/state.json: cannot read the reconciler's state: it is larger "
                                                       "than 1 MiB, which no apply writes. Nothing was changed.")):
        api.apply(qs, state=url)
    assert get("state.json") == padded and get("lock.json") is None and SimCloud(state_dir(qs)).instances() == []

    put("assignments/i-1.json", json.dumps({"serial": 1, "replicas": []}).encode() + b" " * (3 << 20))
    with pytest.raises(CorruptBusObjectError, match=re.escape(f"bus object assignments/i-1.json ({url}/assignments/i-1.json) is "
                                                              "larger than 1 MiB, more than any writer of the bus writes; delete it")):
        Bus(backend_for(tmp_path, url)).assignment("i-1")

    put("lock.json", b"x" * (3 << 20))
    with pytest.raises(LockError, match=f"another apply holds the lock {re.escape(url)}/lock.json: nobody: the lock is garbled") as e:
        with backend_for(tmp_path, url).lock():
            pass
    backend_for(tmp_path, url).unlock(str(e.value).split("reconcile unlock ")[1].split()[0].rstrip("`"))
    assert get("lock.json") is None


def test_oversized_state_bus_and_lock_objects_are_refused_unread(store, monkeypatch, tmp_path):
    check_oversized_objects_are_refused(store.url, lambda k, b: store.put(f"fleet/{k}", b), lambda k: store.get(f"fleet/{k}"),
                                        monkeypatch, tmp_path)


def test_a_huge_state_object_is_not_downloaded_past_the_cap(gcs_emulator, monkeypatch, tmp_path):
    """The download stops a chunk past the cap (here 1 MiB, the object 48 MiB): before, the whole object was taken into
    memory, then parsed. (GCS: its emulator runs in this process and serves without copying, so the peak measured is
    the client's; S3's ContentLength and Azure's first ranged GET stop theirs before the body.)"""
    import tracemalloc

    from reconciler import backend, state

    store = _gcs_store(gcs_emulator, monkeypatch, "fleet-huge")
    store.put("fleet/state.json", b" " * (48 << 20))
    monkeypatch.setattr(state, "MAX_STATE_BYTES", 1 << 20)
    monkeypatch.setattr(backend, "MAX_STATE_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(StateFileError, match="it is larger than 1 MiB"):
            backend_for(tmp_path, store.url).load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB allocated"  # before: 96 MiB


def test_a_report_read_by_its_listed_generation_is_judged_by_the_write_it_holds(gcs_emulator, monkeypatch, tmp_path):
    """GCS's listing stamps each report (Bus.agents: one request a report). A report rewritten after the listing is
    read afresh with the stamp of the write it holds, never the older listed one; one deleted since is gone; one
    unchanged is as old as the listing said plus the time since (its age counted on, not frozen at the listing)."""
    store = _gcs_store(gcs_emulator, monkeypatch, "fleet-listed")
    backend = backend_for(tmp_path, store.url)
    for name in ("a", "b", "c"):
        backend.write_key(f"agents/{name}.json", name.encode())
    listing = backend.list_keys_stamped("agents")
    assert list(listing) == ["agents/a.json", "agents/b.json", "agents/c.json"] and None not in listing.values(), listing
    time.sleep(1.2)
    backend.write_key("agents/b.json", b"b2")
    backend.delete_key("agents/c.json")
    a = backend.read_key_stamped("agents/a.json", listing["agents/a.json"])
    assert (a.body, a.modified) == (b"a", listing["agents/a.json"].modified) and a.age >= listing["agents/a.json"].age + 1.2, a
    b = backend.read_key_stamped("agents/b.json", listing["agents/b.json"])
    assert b.body == b"b2" and b.modified >= listing["agents/b.json"].modified + 1.2 and b.age < 1.2, b
    assert backend.read_key_stamped("agents/c.json", listing["agents/c.json"]) is None
