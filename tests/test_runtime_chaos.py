"""The runtime under faults an outside tester would inject: the state store failing the agent's writes in the middle of
a spot notice, and the like. Real agent and replica processes on the local bus, faults injected at the backend; every
wait polls for a condition."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from reconciler.backend import LocalBackend
from reconciler.errors import ReconcileError
from reconciler.runtime.agent import Agent
from reconciler.runtime.bus import Bus
from reconciler.runtime.notices import FileNotice
from reconciler.runtime.runtimes import ProcessRuntime
from tests.test_runtime_agent import CHECKPOINTER, entry, run_until

PY = sys.executable

CK = {"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 30}


class FailingRunWrites(LocalBackend):
    """The real local backend whose writes of run records fail while `failing` (the store full, read-only, or cut off
    for the agent's `runs/` writes)."""

    failing = False

    def write_key(self, key: str, body: bytes) -> None:
        if self.failing and key.startswith("runs/"):
            raise ReconcileError(f"local bus: cannot write .reconcile/{key}: No space left on device")
        super().write_key(key, body)


def test_a_replica_stopped_by_a_notice_while_its_record_cannot_be_written_is_reported_once_the_store_takes_it(tmp_path):
    """A spot notice while the store refuses the agent's run records (measured on a full, then a read-only, tmpfs
    `.reconcile/`): the replica checkpointed and stopped, its Stopped record's one write failed, and the agent dropped it.
    Once the store took writes again the agent said "interruption handled: every replica stopped and reported" while
    `runs/ft/0.json` said Running for good (status showed a job running on a reclaimed node). Now the record is written
    again each poll until the store takes it, and the notice is handled only then."""
    store = FailingRunWrites(tmp_path)
    bus = Bus(store)
    notice = tmp_path / "notice.json"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ft", CHECKPOINTER, checkpoint=CK, mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=True, notice=FileNotice(notice))
    try:
        run_until([a], lambda: (r := bus.run("ft", 0)) and r["log_tail"][-1:] == ["ready"])
        store.failing = True
        notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
        run_until([a], lambda: not a.uploads and bus.agent("i-0")["running"] == [])  # stopped and uploaded
        for _ in range(5):  # (polls with the store still refusing the record)
            a.tick()
            time.sleep(0.05)
        assert not a.notice_done  # before: handled, its record Running
        assert "cannot write the run record of ft/0" in bus.agent("i-0").get("write_failed", "")
        store.failing = False
        run_until([a], lambda: a.notice_done)
        rec = bus.run("ft", 0)
        assert (rec["phase"], rec["reason"]) == ("Stopped", "Interrupted"), rec
        a.tick()
        assert "write_failed" not in bus.agent("i-0")
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


def test_a_replica_killed_at_the_end_of_its_grace_has_no_upload_and_its_replacement_resumes_from_the_last_complete_one(tmp_path):
    """A spot notice; the replica begins writing its checkpoint on the signal but is still writing when its grace ends,
    and the agent kills it. Its directory then held a file cut mid-write, and the agent uploaded it as a complete
    generation (every file with its sha256): the moved copy restored the torn file, newer than the last good upload.
    Now a replica killed at its grace's end uploads nothing (logged): the replacement resumes from the last upload made
    after a stop that ended by itself."""
    from reconciler.runtime import checkpoints

    store = LocalBackend(tmp_path)
    bus = Bus(store)
    good = tmp_path / "good"
    good.mkdir()
    (good / "model.bin").write_text("step 5 " * 1000)
    before = checkpoints.upload(store, "ft", good, instance="i-9", spec_hash="h1", epoch=1, log=lambda m: None)
    assert before.complete
    slow = [PY, "-c", "import os, signal, time\n"
                      "def stop(s, f):\n"
                      "    with open(os.path.join(os.environ['FLEETOPS_CHECKPOINT_DIR'], 'model.bin'), 'w') as out:\n"
                      "        out.write('step 9 ' * 10); out.flush()\n"
                      "        print('writing', flush=True); time.sleep(600)  # (the rest never comes)\n"
                      "signal.signal(signal.SIGTERM, stop)\n"
                      "print('ready', flush=True)\n"
                      "time.sleep(600)"]
    notice = tmp_path / "notice.json"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ft", slow, checkpoint={**CK, "grace_seconds": 0.5}, mode="service")]})
    said: list[str] = []
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=said.append, checkpoint_sync=True, notice=FileNotice(notice))
    try:
        run_until([a], lambda: (r := bus.run("ft", 0)) and r["log_tail"][-1:] == ["ready"])
        notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
        run_until([a], lambda: a.notice_done)
        assert (tmp_path / "i-0" / "disk" / "ft" / "ckpt" / "model.bin").read_text() == "step 9 " * 10  # (cut mid-write)
        assert [d["generation"] for d in checkpoints.manifests(store, "ft", log=lambda m: None)] == [before.generation]
        assert any("killed at the end of its grace" in m and "not uploaded" in m for m in said), said
        moved = tmp_path / "moved"
        got = checkpoints.restore(store, "ft", moved, log=lambda m: None)
        assert got.generations == [before.generation] and (moved / "model.bin").read_text() == "step 5 " * 1000
    finally:
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)


def test_an_upload_from_a_host_whose_clock_is_behind_is_still_the_newest_one_restored(tmp_path):
    """The job ran on i-0 (its clock right) and uploaded step 5 at a move; then on i-1, whose clock is an hour behind,
    and uploaded step 9 at a spot notice. The uploads were ordered by the writers' clocks (the manifest's created_unix),
    so step 5 was the newest: the replacement resumed from it, the hour on i-1 lost, and the prune of later uploads
    (the newest 3 kept) could delete step 9. The store's own time of each manifest orders them now, as it judges
    heartbeats: step 9 is restored."""
    from reconciler.runtime import checkpoints

    store = LocalBackend(tmp_path)
    for instance, step, skew in (("i-0", "step 5", 0.0), ("i-1", "step 9", -3600.0)):
        d = tmp_path / instance
        d.mkdir()
        (d / "model.bin").write_text(step)
        up = checkpoints.upload(store, "ft", d, instance=instance, spec_hash="h1", epoch=1, log=lambda m: None,
                                now=lambda skew=skew: time.time() + skew)
        assert up.complete
    assert [d["instance"] for d in checkpoints.manifests(store, "ft", log=lambda m: None)] == ["i-1", "i-0"]
    got = checkpoints.restore(store, "ft", tmp_path / "i-2", log=lambda m: None)
    assert (tmp_path / "i-2" / "model.bin").read_text() == "step 9", got


def s3_store_at(monkeypatch, tmp_path, sock: socket.socket):
    """The real s3 backend, its endpoint the server `sock` listens as."""
    from reconciler.backend import backend_for
    from tests.conftest import AWS_ENV

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
    return backend_for(tmp_path, "s3://bucket/fleet")


def test_an_s3_store_that_stops_answering_is_a_bus_error_the_agent_retries_not_a_crash(monkeypatch, tmp_path, hung_endpoint):
    """The S3 endpoint accepts connections and never answers (a hung or overloaded server, a proxy blackholing the
    store). Measured against such a socket: one read of the agent's assignment blocked its loop 362 s (botocore's 60 s
    read timeout, 5 attempts: no notice seen, no kill at a grace's end meanwhile), then raised AttributeError from the
    error's message (a timeout's `response` is None), which no caller catches: the agent died, and systemd's restarts
    crash-looped while the store hung. Now the client gives up within seconds a try and the error is the bus's: the
    agent logs it and polls on."""
    from botocore.config import Config

    from providers.aws import aws_session

    store = s3_store_at(monkeypatch, tmp_path, hung_endpoint)
    cfg = store.s3.meta.config
    assert cfg.connect_timeout <= 5 and cfg.read_timeout <= 10, (cfg.connect_timeout, cfg.read_timeout)  # before: 60, 60
    # (the same client on a test's timescale: what the agent sees once the tries are over)
    store.s3 = aws_session().client("s3", config=Config(connect_timeout=0.3, read_timeout=0.3, retries={"mode": "standard", "max_attempts": 1}))
    bus = Bus(store)
    said: list[str] = []
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, log=said.append)
    a.tick()  # before: AttributeError: 'NoneType' object has no attribute 'get'
    assert a.bus_error and "Read timeout" in a.bus_error, a.bus_error
    assert any(m.startswith("cannot reach the bus") for m in said), said


def test_a_notice_while_the_store_hangs_signals_the_replicas_at_once(monkeypatch, tmp_path, hung_endpoint):
    """A GCE or Azure preemption notice gives 30 s. The agent asked for it once a poll, between its store calls: one
    that hung (an S3 endpoint that stopped answering) held the loop up to ~60 s (10 s a read, botocore's retries), and
    the replicas got their checkpoint signal that late into the notice, or never. Now a watcher thread asks for the
    notice while a store call is in flight and signals them itself: measured here against a store that never answers,
    the signal within 2 s of the notice while the assignment's read still hangs (before: not until the read gave up)."""
    from botocore.config import Config

    from providers.aws import aws_session

    bus = Bus(LocalBackend(tmp_path))
    notice = tmp_path / "notice.json"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("ft", CHECKPOINTER, checkpoint=CK, mode="service")]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.1,
              checkpoint_root=tmp_path / "i-0" / "disk", log=lambda m: None, checkpoint_sync=False, notice=FileNotice(notice))
    stop = threading.Event()
    loop = threading.Thread(target=a.run, kwargs={"should_stop": stop.is_set}, daemon=True)
    checkpoint = tmp_path / "i-0" / "disk" / "ft" / "ckpt" / "model.bin"
    held = None
    try:
        run_until([a], lambda: (r := bus.run("ft", 0)) and r["log_tail"][-1:] == ["ready"])
        hung = s3_store_at(monkeypatch, tmp_path, hung_endpoint)
        # (one try, each read given up after 20 s: the store's hang outlasts the test)
        hung.s3 = aws_session().client("s3", config=Config(connect_timeout=20, read_timeout=20, retries={"mode": "standard", "max_attempts": 1}))
        a.bus = Bus(hung)
        loop.start()
        hung_endpoint.settimeout(10)
        held, _ = hung_endpoint.accept()  # the agent's first store call of its loop is in flight, and stays so
        noticed = time.monotonic()
        notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
        while not checkpoint.exists() and time.monotonic() - noticed < 5:
            time.sleep(0.02)
        signalled = time.monotonic() - noticed
        assert checkpoint.exists() and signalled < 2, f"no checkpoint signal {signalled:.1f}s into the notice"  # before: none in 5 s
        assert a.notice_seen and loop.is_alive()
    finally:
        stop.set()
        for sock in (held, hung_endpoint):
            if sock is not None:
                sock.close()  # (the agent's calls fail at once from here on: its loop ends)
        loop.join(20)
        for rep in a.replicas.values():
            if rep.handle is not None:
                a.runtime.kill(rep.handle)
