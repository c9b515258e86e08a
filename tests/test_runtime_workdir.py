"""The node agent when its own disk fails under it: records it cannot read or write (a failed or full disk), a
checkpoint restore the disk fills in the middle of, hostile job input. Real agent and replica processes on a local bus;
disk failures are made real (a directory or a symlink loop where a file goes, which stop root too; a file-size limit
in a child process), never by replacing the agent's own functions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from reconciler.backend import backend_for
from reconciler.runtime.agent import Agent
from reconciler.runtime.bus import Bus
from reconciler.runtime.runtimes import ProcessRuntime
from tests.fleetkit import poll_until
from tests.test_runtime_adopt import leftovers, processes_with  # noqa: F401 (leftovers: the fixture below)
from tests.test_runtime_agent import entry

PY = sys.executable
pytestmark = pytest.mark.usefixtures("leftovers")  # (whatever a test leaves running under its tmp path is killed)


@pytest.fixture
def bus(tmp_path):
    return Bus(backend_for(tmp_path, None))


def agent(bus: Bus, workdir: Path, **kw) -> Agent:
    return Agent("i-0", bus, ProcessRuntime(), workdir, address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.05,
                 log=lambda m: None, **kw)


def copies(marker: Path) -> set[int]:
    """The copies of a replica that run: the process groups (one a start: its shim and command) named by `marker`."""
    out = set()
    for pid in processes_with(str(marker)):
        try:
            out.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    return out


def sleeper(marker: Path) -> list[str]:
    """A replica that runs a minute; `marker` (a path under the test's tmp dir) names its processes."""
    return [PY, "-c", "import sys, time; time.sleep(60)", str(marker)]


def _restarted_with_an_unreadable_record(bus, tmp_path):
    """A replica running under a first agent, then that agent gone (crashed: systemd restarts it) and its record of the
    replica made unreadable (a symlink loop where the file is: ELOOP, as an I/O error would fail it, and it stops root
    too), and a second agent made on the same workdir: (marker, the running copy's pid, record, its saved bytes, agent)."""
    marker = tmp_path / "train-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("train", sleeper(marker))]})
    first = agent(bus, tmp_path / "i-0")
    first.tick()
    pid = first.replicas[("train", 0)].handle.pid
    poll_until(lambda: copies(marker) == {pid}, "the replica running", 30)
    record = tmp_path / "i-0" / "replicas" / "train-0.json"
    saved = record.read_bytes()
    record.unlink()
    record.symlink_to(record.name)
    return marker, pid, record, saved, agent(bus, tmp_path / "i-0")


def test_a_restarted_agent_that_cannot_read_a_replicas_record_does_not_start_a_second_copy(bus, tmp_path):
    """An agent restarted on an instance whose record of a running replica cannot be read (a failing disk: here a
    symlink loop where the file is, which stops root too) ignored the record and started the replica again: two copies
    on the same GPUs. It starts nothing of that replica, says why in its heartbeat and the run record, and adopts the
    running copy once the record can be read again."""
    marker, pid, record, saved, again = _restarted_with_an_unreadable_record(bus, tmp_path)
    for _ in range(3):
        again.tick()
    assert copies(marker) == {pid}  # before: a second copy beside it
    rec = bus.run("train", 0)
    assert (rec["phase"], rec["reason"]) == ("Starting", "RecordUnreadable"), rec
    assert str(record) in rec["message"] and "not started a second time" in rec["message"], rec["message"]
    assert str(record) in bus.agent("i-0")["workdir_failed"]
    record.unlink()
    record.write_bytes(saved)
    again.tick()
    again._publish(force=True)
    assert again.replicas[("train", 0)].reason == "Adopted" and again.replicas[("train", 0)].handle.pid == pid
    assert "workdir_failed" not in bus.agent("i-0")
    assert copies(marker) == {pid}
    again.runtime.kill(again.replicas[("train", 0)].handle)


def test_a_replica_given_gpus_waits_while_a_record_that_may_hold_them_cannot_be_read(bus, tmp_path):
    """The running copy of `train` holds GPU 2; its record is unreadable to the restarted agent, and the new assignment
    moved `train` away and gave GPU 2 to `infer`. `infer` started at once on GPU 2 beside `train`'s copy, which no
    agent could stop (its pid is in the record): two processes on one GPU. A replica given GPUs waits while any record
    of a copy that may run cannot be read (WaitingForGPUs, naming it); one without GPUs does not."""
    marker = tmp_path / "train-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("train", sleeper(marker), gpus=["2"])]})
    first = agent(bus, tmp_path / "i-0")
    first.tick()
    pid = first.replicas[("train", 0)].handle.pid
    poll_until(lambda: copies(marker) == {pid}, "the replica running", 30)
    record = tmp_path / "i-0" / "replicas" / "train-0.json"
    saved = record.read_bytes()
    record.unlink()
    record.symlink_to(record.name)
    infer, etl = tmp_path / "infer-marker", tmp_path / "etl-marker"
    bus.put_assignment("i-0", {"serial": 2, "replicas": [entry("infer", sleeper(infer), gpus=["2"]), entry("etl", sleeper(etl))]})
    again = agent(bus, tmp_path / "i-0")
    for _ in range(3):
        again.tick()
    poll_until(lambda: len(copies(etl)) == 1, "etl (no GPUs) running", 30)
    assert copies(infer) == set()  # before: started on GPU 2 beside train's copy
    rec = bus.run("infer", 0)
    assert (rec["phase"], rec["reason"]) == ("Starting", "WaitingForGPUs") and str(record) in rec["message"], rec
    record.unlink()
    record.write_bytes(saved)  # readable again: train's copy adopted, and stopped (no longer assigned); then infer starts
    poll_until(lambda: again.tick() or len(copies(infer)) == 1, "infer running once train's copy is gone", 60, 0.05)
    assert copies(marker) == set()
    for rep in again.replicas.values():
        if rep.handle is not None:
            again.runtime.kill(rep.handle)


def test_a_replica_whose_record_cannot_be_written_is_not_started_and_the_heartbeat_says_why(bus, tmp_path):
    """The agent started a replica whose local record (its pid, how to find and stop it) it could not write (a full or
    read-only disk: here a file where the records' folder goes, which stops root too): an agent restarted on the
    instance could neither adopt nor stop that copy, and started a second. It is not started until it can be recorded."""
    marker = tmp_path / "etl-marker"
    (tmp_path / "i-0").mkdir()
    (tmp_path / "i-0" / "replicas").write_text("")
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("etl", sleeper(marker))]})
    a = agent(bus, tmp_path / "i-0")
    for _ in range(3):
        a.tick()
    assert copies(marker) == set()  # before: started, with no record to adopt or stop it by
    rec = bus.run("etl", 0)
    assert (rec["phase"], rec["reason"]) == ("Starting", "CannotRecord"), rec
    assert "etl-0.json" in rec["message"] and "EEXIST" in rec["message"] and "could neither adopt nor stop" in rec["message"], rec
    assert "etl-0.json" in bus.agent("i-0")["workdir_failed"]
    (tmp_path / "i-0" / "replicas").unlink()
    a.replicas[("etl", 0)].next_start = 0.0  # (its retry delay, doubling, over)
    a.tick()
    a._publish(force=True)
    pid = a.replicas[("etl", 0)].handle.pid
    poll_until(lambda: copies(marker) == {pid}, "the replica running", 30)
    assert json.loads((tmp_path / "i-0" / "replicas" / "etl-0.json").read_text())["pid"] == pid
    assert "workdir_failed" not in bus.agent("i-0")
    a.runtime.kill(a.replicas[("etl", 0)].handle)


# `reconcile ARGS` on a disk that fills at 100 kB a file: a write past it fails (EFBIG, SIGXFSZ ignored) as on a full disk
SMALL_DISK = ("import os, resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
              "os.execv(sys.executable, [sys.executable, '-m', 'reconciler.cli', *sys.argv[1:]])")


def test_an_agent_whose_disk_fills_while_it_restores_a_checkpoint_does_not_start_the_replica(bus, tmp_path):
    """The agent (`reconcile agent`, its own process) restores the job's newest checkpoint, and the disk fills in the
    middle of it (for real: a file-size limit on the agent's process, RLIMIT_FSIZE, so the 300 kB weights cannot be
    written). The download failed as a broken upload would, and the replica started from an empty checkpoint
    directory: its training lost. It waits, NoRoomForCheckpoint, naming the file; nothing is left half restored."""
    import signal
    import subprocess
    import time

    from reconciler.runtime import checkpoints

    src = tmp_path / "elsewhere" / "ckpt"
    src.mkdir(parents=True)
    (src / "step.json").write_text('{"step": 41}')
    (src / "weights.bin").write_bytes(os.urandom(300_000))
    checkpoints.upload(bus.store, "ft", src, instance="i-9", spec_hash="h1", epoch=1, log=lambda m: None)
    marker = tmp_path / "ft-marker"
    bus.put_assignment("i-0", {"serial": 2, "replicas": [entry("ft", sleeper(marker), epoch=2, mode="service",
                                                               checkpoint={"dir": "/ckpt", "signal": "SIGTERM", "grace_seconds": 5})]})

    disk = tmp_path / "i-0" / "disk"
    with open(tmp_path / "agent.log", "ab") as out:
        agent_proc = subprocess.Popen([PY, "-c", SMALL_DISK, "agent", "i-0", "--dir", str(tmp_path), "--runtime", "process",
                                       "--address", "127.0.0.1", "--workdir", str(tmp_path / "i-0"), "--checkpoint-root", str(disk),
                                       "--poll", "0.1", "--heartbeat", "0.2"], stdout=out, stderr=subprocess.STDOUT,
                                      env={**os.environ, "FLEETOPS_CHECKPOINT_SYNC": "1"})
    try:
        rec = poll_until(lambda: (r := bus.run("ft", 0)) and r["reason"] != "Assigned" and r, "the replica's record", 60)
        assert (rec["phase"], rec["reason"]) == ("Starting", "NoRoomForCheckpoint"), rec  # before: Running, from nothing
        assert "weights.bin" in rec["message"] and "the disk filled" in rec["message"], rec["message"]
        time.sleep(1)
        assert copies(marker) == set() and bus.run("ft", 0)["reason"] == "NoRoomForCheckpoint"
        assert not (disk / "ft").exists(), list((disk / "ft").iterdir())  # nothing half placed, nothing staged left
    finally:
        agent_proc.send_signal(signal.SIGKILL)
        agent_proc.wait(timeout=60)


def forker(marker: Path, then: str) -> list[str]:
    """A replica that starts a child in its process group (a data loader, a launcher's worker) that ignores SIGTERM and
    runs on, then `then` (Python)."""
    ready = f"{marker}.ready"
    child = f"import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); pathlib.Path({ready!r}).touch(); time.sleep(120)"
    return [PY, "-c", f"import os, subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}, {str(marker)!r}])\n"
            f"while not os.path.exists({ready!r}): time.sleep(0.02)\n" + then, str(marker)]


def test_a_replica_that_exits_leaving_children_has_them_killed_with_it(bus, tmp_path):
    """A replica's main process exits (crashes) and leaves a child of its process group running, holding the GPUs: the
    agent reported the replica ended and started its restart beside that child, two processes on one GPU, and nothing
    ever ended the child. As a container's end ends every process in it, the replica's end kills its process group."""
    marker = tmp_path / "crash-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crash", forker(marker, "sys.exit(3)"),
                                                                restart={"policy": "Never", "backoff_limit": 0})]})
    a = agent(bus, tmp_path / "i-0")
    rec = poll_until(lambda: a.tick() or (r := bus.run("crash", 0)) and r["terminal"] and r, "the replica failed", 30)
    assert (rec["phase"], rec["exit_code"]) == ("Failed", 3), rec
    poll_until(lambda: not copies(marker), "its child killed", 10)  # before: running on, two minutes


def test_a_stopped_replica_whose_child_ignores_the_signal_has_it_killed(bus, tmp_path):
    """The replica's main process exits on its stop signal, its child (in its process group) ignores it: the agent
    took the exit for the end and the child ran on, on the GPUs the plan had moved to another job."""
    marker = tmp_path / "stop-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("svc", forker(marker, "time.sleep(120)"), mode="service")]})
    a = agent(bus, tmp_path / "i-0")
    poll_until(lambda: a.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Running" and Path(f"{marker}.ready").exists(),
               "the replica and its child running", 30)
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    poll_until(lambda: a.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Stopped" and r, "the replica stopped", 30)
    poll_until(lambda: not copies(marker), "its child killed", 10)  # before: running on


def escaper(marker: Path, then: str, ignores_term: bool = False) -> list[str]:
    """A replica that starts a child which leaves its process group (os.setsid(): a daemonising launcher, a data
    server) and runs on, optionally ignoring SIGTERM, then `then` (Python)."""
    ready = f"{marker}.ready"
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignores_term else ""
    child = f"import os, pathlib, signal, time; os.setsid(); {ignore}pathlib.Path({ready!r}).touch(); time.sleep(120)"
    return [PY, "-c", f"import os, subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}, {str(marker)!r}])\n"
            f"while not os.path.exists({ready!r}): time.sleep(0.02)\n" + then, str(marker)]


def test_a_stopped_replica_whose_child_left_its_process_group_has_it_killed(bus, tmp_path):
    """A replica's child that calls setsid() is out of the process group the agent signals and kills: it survived the
    replica's stop, holding the GPUs and ports the plan had given to the next job. The agent marks each replica's
    environment (FLEETOPS_REPLICA_ID) and, at its end, ends every process of this user that carries the mark."""
    marker = tmp_path / "svc-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("svc", escaper(marker, "time.sleep(120)"), mode="service")]})
    a = agent(bus, tmp_path / "i-0")
    poll_until(lambda: a.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Running" and Path(f"{marker}.ready").exists(),
               "the replica and its child running", 30)
    assert len(copies(marker)) == 2  # the replica's group and the child's own session
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    poll_until(lambda: a.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Stopped" and r, "the replica stopped", 30)
    poll_until(lambda: not copies(marker), "its escaped child killed", 3)  # before: running on, two minutes


def test_an_adopted_replica_whose_child_left_its_process_group_has_it_killed_at_its_stop(bus, tmp_path):
    """An agent restarted (a crash) adopts a replica by its local record, which keeps the replica's mark: its stop ends
    the child that left its process group too."""
    marker = tmp_path / "svc-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("svc", escaper(marker, "time.sleep(120)"), mode="service")]})
    first = agent(bus, tmp_path / "i-0")
    poll_until(lambda: first.tick() or Path(f"{marker}.ready").exists(), "the replica and its child running", 30)
    again = agent(bus, tmp_path / "i-0")  # (the first gone without a stop, as in a crash)
    again.tick()
    assert again.replicas[("svc", 0)].reason == "Adopted"
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    poll_until(lambda: again.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Stopped" and r, "the replica stopped", 30)
    poll_until(lambda: not copies(marker), "its escaped child killed", 3)


def test_a_replica_that_ended_while_no_agent_watched_has_its_escaped_child_killed(bus, tmp_path):
    """The replica crashed while its agent was down, leaving a child that left its process group: before, it ran on
    until an agent restarted there learnt of the end from the replica's exit file and ended it. The replica's shim, the
    subreaper of its tree, ends it before it writes that file, agent or none; the agent restarted there reports the
    end (and would end, by its mark, what a shim that is no subreaper left)."""
    marker = tmp_path / "crash-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crash", escaper(marker, "sys.exit(3)"),
                                                                restart={"policy": "Never", "backoff_limit": 0})]})
    agent(bus, tmp_path / "i-0").tick()  # (then gone, as in a crash)
    poll_until(lambda: (tmp_path / "i-0" / "replicas" / "crash-0.exit").exists(), "the replica ended, unwatched", 30)
    assert not copies(marker)  # its child, in a session of its own, ended with it
    again = agent(bus, tmp_path / "i-0")
    again.tick()
    assert not copies(marker) and bus.run("crash", 0)["exit_code"] == 3


def test_a_replica_that_exits_leaving_an_escaped_child_that_ignores_sigterm_has_it_killed(bus, tmp_path):
    """The replica crashes and its child, in a session of its own, ignores SIGTERM: it is killed after a short grace."""
    marker = tmp_path / "crash-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crash", escaper(marker, "sys.exit(3)", ignores_term=True),
                                                                restart={"policy": "Never", "backoff_limit": 0})]})
    a = agent(bus, tmp_path / "i-0")
    rec = poll_until(lambda: a.tick() or (r := bus.run("crash", 0)) and r["terminal"] and r, "the replica failed", 30)
    assert (rec["phase"], rec["exit_code"]) == ("Failed", 3), rec
    poll_until(lambda: not copies(marker), "its escaped child killed", 3)  # before: running on, two minutes


@pytest.mark.parametrize("content", [b"[" * 4000, b'{"code": -99999}', b'{"code": "3"}', b'{"code": true}',
                                     b'{"code": 1, "error": 7}', b"\xff\xfe", "huge"])
def test_a_malformed_exit_file_of_a_replica_that_ended_unwatched_is_reported_not_a_traceback(bus, tmp_path, content):
    """The shim's exit file says how a replica that ended while no agent watched it ended; a job (or a failing disk) can
    leave anything there. A deep nest of brackets (RecursionError) or a code no signal has (Signals(99999)) killed the
    restarted agent with a traceback, and a huge file was read whole. The end is reported Failed, its exit code unknown,
    naming the file."""
    import tracemalloc

    from providers.pids import running, start_time

    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crash", [PY, "-c", "import sys; sys.exit(3)"],
                                                                restart={"policy": "Never", "backoff_limit": 0})]})
    first = agent(bus, tmp_path / "i-0")
    first.tick()  # (then gone, as in a crash)
    pid = first.replicas[("crash", 0)].handle.pid
    started = start_time(pid)
    exit_file = tmp_path / "i-0" / "replicas" / "crash-0.exit"
    poll_until(lambda: exit_file.exists() and not running(pid, started), "the replica ended, unwatched", 30)
    if content == "huge":
        with open(exit_file, "wb") as f:
            f.truncate(300 * 2**20)  # (sparse: no disk used)
    else:
        exit_file.write_bytes(content)
    tracemalloc.start()
    try:
        agent(bus, tmp_path / "i-0").tick()  # before: RecursionError, ValueError (no signal 99999)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rec = bus.run("crash", 0)
    assert (rec["phase"], rec["reason"], rec["exit_code"]) == ("Failed", "Error", None), rec
    assert "exit code unknown" in rec["message"] and str(exit_file) in rec["message"], rec["message"]
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB allocated"  # before: 300 MiB read for the huge one


def test_a_huge_log_is_never_read_whole_when_docker_refuses_a_restart(bus, tmp_path):
    """A replica's log holds every attempt on the instance (weeks of a chatty training run: GBs). When docker refused
    to start an attempt (exit 126/127), the agent read the whole log into memory to find docker's line: one such log
    killed the agent (out of memory). It reads the log's end only, as the log tail does. (Here a 300 MB sparse log,
    and the agent's Python allocations measured.)"""
    import tracemalloc

    from reconciler.runtime.agent import replica_log
    from reconciler.runtime.runtimes import DockerRuntime
    from tests.test_runtime_agent import run_until, terminal

    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'docker: Error response from daemon: exec: \"pyhton3\": executable file not found' >&2\n"
                    "exit 127\n")
    fake.chmod(0o755)
    log = replica_log(tmp_path / "i-0", "typo", 0)
    log.parent.mkdir(parents=True)
    with open(log, "wb") as f:
        f.truncate(300 * 2**20)  # (sparse: no disk used)
    a = Agent("i-0", bus, DockerRuntime(docker=str(fake)), tmp_path / "i-0", address="127.0.0.1", poll=0.05, heartbeat=0.2,
              backoff=0.05, log=lambda m: None)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("typo", ["pyhton3"], run={"image": "img", "command": ["pyhton3"], "env": {}})]})
    tracemalloc.start()
    try:
        rec = run_until([a], terminal(bus, "typo"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (rec["reason"], rec["restarts"]) == ("StartError", 0) and "executable file not found" in rec["message"], rec
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB allocated"  # before: over 300 MiB


def test_an_unreadable_record_of_a_replica_no_longer_assigned_is_kept_and_its_copy_stopped_once_read(bus, tmp_path):
    """The replica whose record cannot be read is unassigned meanwhile: deleting the record as for any replica that
    leaves would orphan the copy that may run (nothing could find it again). It is kept, read again, and the copy it
    names adopted and stopped."""
    marker, pid, record, saved, again = _restarted_with_an_unreadable_record(bus, tmp_path)
    again.tick()
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    again.tick()
    assert record.is_symlink() and ("train", 0) not in again.replicas and copies(marker) == {pid}
    record.unlink()
    record.write_bytes(saved)
    poll_until(lambda: again.tick() or not copies(marker) and bus.run("train", 0)["reason"] == "Unassigned", "the adopted copy stopped", 30)


def test_an_agent_that_cannot_list_its_replicas_records_starts_nothing_until_it_can(bus, tmp_path):
    """The folder of the replicas' records cannot be listed (a failing disk: here a symlink loop at its name): any
    replica may run, started by an earlier agent, and the agent could not know which (Path.glob took it for empty:
    every assigned replica was started again; here, its exit file going there too, it failed for good, StartError).
    Nothing starts, saying why, until it can be listed."""
    marker = tmp_path / "etl-marker"
    folder = tmp_path / "i-0" / "replicas"
    folder.parent.mkdir()
    folder.symlink_to(folder.name)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("etl", sleeper(marker))]})
    a = agent(bus, tmp_path / "i-0")
    for _ in range(3):
        a.tick()
    assert copies(marker) == set()
    rec = bus.run("etl", 0)
    assert rec["reason"] == "RecordUnreadable" and str(folder) in rec["message"] and "ELOOP" in rec["message"], rec
    assert str(folder) in bus.agent("i-0")["workdir_failed"]
    folder.unlink()
    a.tick()
    pid = a.replicas[("etl", 0)].handle.pid
    poll_until(lambda: copies(marker) == {pid}, "the replica running", 30)
    a.runtime.kill(a.replicas[("etl", 0)].handle)
