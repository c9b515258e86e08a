"""An agent that restarts (a crash, `systemctl restart`) takes over the replicas its predecessor
started on the instance: it does not start them a second time, it learns how one that ended while
no agent watched it ended, and it stops one that is no longer assigned. Real agent and replica
processes on the local bus; every wait polls for a condition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.backend import backend_for
from reconciler.runtime.agent import Agent
from reconciler.runtime.bus import Bus
from reconciler.runtime.runtimes import ProcessRuntime
from tests.fleetkit import poll_until
from tests.test_runtime_agent import entry, run_until, terminal

PY = sys.executable


def waiter(release: Path, ckpt: Path | None = None, linger: float = 0.0) -> list[str]:
    """A replica that runs until `release` exists, then exits 0; on SIGUSR1 it writes `ckpt`, waits `linger` s and exits
    (a test that catches its agent between the signal and the exit needs the exit to come ticks later, not in the tick
    that signalled it)."""
    return [PY, "-c", "import os, pathlib, signal, sys, time\n"
            f"def on(s, f):\n    pathlib.Path({str(ckpt)!r}).write_text('saved'); time.sleep({linger}); sys.exit(0)\n"
            "signal.signal(signal.SIGUSR1, on)\n"
            "print('started', os.getpid(), flush=True)\n"
            f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)\n"
            "print('done', flush=True)"]


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a test's own tmp path: no other test's)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes() \
                    and (p / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(p.name))
        except OSError:
            continue
    return out


@pytest.fixture
def leftovers(tmp_path):
    """Whatever a test leaves running under its tmp path is killed (agents, shims, replicas)."""
    yield
    for pid in processes_with(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def agent_process(cfg: Path, instance: str, workdir: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([PY, "-m", "reconciler.cli", "agent", instance, "--dir", str(cfg), "--runtime", "process",
                                 "--address", "127.0.0.1", "--workdir", str(workdir), "--poll", "0.1", "--heartbeat", "0.2"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_a_restarted_agent_adopts_its_running_replica_and_does_not_start_a_second(tmp_path, leftovers):
    cfg, work, release = tmp_path / "cfg", tmp_path / "w", tmp_path / "release"
    cfg.mkdir()
    bus = Bus(backend_for(cfg, None))
    iid = f"i-adopt-{tmp_path.name}"
    bus.put_assignment(iid, {"serial": 1, "replicas": [entry("train", waiter(release), master=iid)]})
    first = agent_process(cfg, iid, work, tmp_path / "agent.log")
    poll_until(lambda: (r := bus.run("train", 0)) and r["phase"] == "Running" and "started" in " ".join(r["log_tail"]), "replica running", 120)
    first.send_signal(signal.SIGKILL)  # a crash: no shutdown, its replica runs on
    first.wait(timeout=60)
    second = agent_process(cfg, iid, work, tmp_path / "agent.log")
    try:
        poll_until(lambda: (a := bus.agent(iid)) and a["pid"] == second.pid and a["running"] == ["train/0"], "the new agent's heartbeat", 120)
        rec = bus.run("train", 0)
        assert (rec["phase"], rec["reason"], rec["attempt"]) == ("Running", "Adopted", 0), rec
        release.touch()
        rec = poll_until(lambda: (r := bus.run("train", 0)) and r["terminal"] and r, "the adopted replica finished", 120)
        assert (rec["phase"], rec["exit_code"], rec["restarts"]) == ("Succeeded", 0, 0), rec
        log = Path(rec["log_path"]).read_text()
        assert log.count("--- fleetops: attempt") == 1 and log.count("started ") == 1  # one process, never two
        assert "train/0: adopted attempt 0" in (tmp_path / "agent.log").read_text()
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(timeout=60)


def in_process(bus: Bus, instance: str, workdir: Path) -> Agent:
    return Agent(instance, bus, ProcessRuntime(), workdir, address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.05, log=lambda m: None)


def test_a_replica_that_ended_while_no_agent_watched_is_reported_once_not_run_again(tmp_path, leftovers):
    bus = Bus(backend_for(tmp_path, None))
    release = tmp_path / "release"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("etl", waiter(release))]})
    old = in_process(bus, "i-0", tmp_path / "w")
    run_until([old], lambda: (r := bus.run("etl", 0)) and r["phase"] == "Running")
    # The agent is gone (not stopped); the replica then finishes on its own.
    release.touch()
    poll_until(lambda: not processes_with(str(release)), "the replica ended", 60)
    new = in_process(bus, "i-0", tmp_path / "w")
    rec = run_until([new], terminal(bus, "etl"))
    assert (rec["phase"], rec["reason"], rec["exit_code"], rec["restarts"]) == ("Succeeded", "Completed", 0, 0), rec
    assert Path(rec["log_path"]).read_text().count("--- fleetops: attempt") == 1  # not started again


def test_a_restarted_agent_stops_an_adopted_replica_that_is_no_longer_assigned(tmp_path, leftovers):
    bus = Bus(backend_for(tmp_path, None))
    ckpt = tmp_path / "ckpt"
    e = entry("ft", waiter(tmp_path / "never", ckpt), checkpoint={"dir": str(tmp_path / "ck"), "signal": "SIGUSR1", "grace_seconds": 30})
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    old = in_process(bus, "i-0", tmp_path / "w")
    run_until([old], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Running" and "started" in " ".join(r["log_tail"]))
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})  # moved away while no agent ran here
    new = in_process(bus, "i-0", tmp_path / "w")
    rec = run_until([new], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Stopped" and r)
    assert rec["reason"] == "Unassigned" and rec["exit_code"] == 0  # it took its checkpoint signal and exited
    assert ckpt.read_text() == "saved"
    run_until([new], lambda: not new.replicas)  # and then forgotten, its local record with it
    assert not (tmp_path / "w" / "replicas" / "ft-0.json").exists()


def test_a_command_that_cannot_be_executed_is_a_start_error_through_the_shim(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/nonexistent/interpreter\necho hi\n")
    script.chmod(0o755)
    bus = Bus(backend_for(tmp_path, None))
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("bad", [str(script)])]})
    rec = run_until([in_process(bus, "i-0", tmp_path / "w")], terminal(bus, "bad"))
    assert (rec["phase"], rec["reason"], rec["restarts"]) == ("Failed", "StartError", 0), rec
    assert f"cannot start {str(script)!r}: No such file or directory" in rec["message"]


def test_a_replica_that_ended_on_its_stop_signal_while_no_agent_watched_ends_as_that_stop_not_succeeded(tmp_path, leftovers):
    """The agent stopped a replica past its time limit (checkpoint signal, grace) and crashed in the grace; the replica
    checkpointed and exited 0, as a training script does on that signal. The restarted agent read the exit code alone:
    Succeeded, so a job cut off by its time limit counted done (and a gang replica stopped for a peer's restart stayed
    Succeeded, never rejoining it). The stop under way is in the replica's local record; its end is that stop's."""
    bus = Bus(backend_for(tmp_path, None))
    never, ckpt = tmp_path / "never", tmp_path / "ckpt"
    e = entry("ft", waiter(never, ckpt), time_limit_hours=1 / 3600,  # one second
              checkpoint={"dir": str(tmp_path / "ck"), "signal": "SIGUSR1", "grace_seconds": 30})
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    old = in_process(bus, "i-0", tmp_path / "w")
    run_until([old], lambda: (rep := old.replicas.get(("ft", 0))) is not None and rep.stop is not None)  # signalled ...
    poll_until(lambda: not processes_with(str(never)), "the replica checkpointed and exited", 60)  # ... and the agent gone
    assert ckpt.read_text() == "saved"
    rec = run_until([in_process(bus, "i-0", tmp_path / "w")], terminal(bus, "ft"))
    assert (rec["phase"], rec["reason"], rec["exit_code"]) == ("Failed", "DeadlineExceeded", 0), rec  # before: Succeeded


def test_a_checkpoint_written_while_no_agent_watched_is_uploaded_by_the_restarted_agent(tmp_path, leftovers):
    """The agent signalled a replica the plan moved away and was killed in its grace; the replica wrote its checkpoint
    and exited. Before, the restarted agent reported the stop but uploaded nothing (the upload was due only in the agent
    that saw the exit), so the moved copy restored an older upload, or started from step 0. Now it uploads it."""
    bus = Bus(backend_for(tmp_path, None))
    never, ck = tmp_path / "never", tmp_path / "ck"
    e = entry("ft", waiter(never, ck / "ft" / "ckpt" / "step.txt", linger=1.0),
              checkpoint={"dir": "/ckpt", "signal": "SIGUSR1", "grace_seconds": 30})
    (ck / "ft" / "ckpt").mkdir(parents=True)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    make = lambda: Agent("i-0", bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", poll=0.05, heartbeat=0.2,  # noqa: E731
                         backoff=0.05, log=lambda m: None, checkpoint_root=ck, checkpoint_sync=True)
    old = make()
    run_until([old], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Running" and "started" in " ".join(r["log_tail"]))
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})  # moved away ...
    run_until([old], lambda: (rep := old.replicas.get(("ft", 0))) is not None and rep.stop is not None)  # ... signalled ...
    poll_until(lambda: not processes_with(str(never)), "the replica checkpointed and exited", 60)  # ... and the agent gone
    assert not (tmp_path / ".reconcile" / "checkpoints").exists()  # nothing uploaded yet
    new = make()
    run_until([new], lambda: not new.replicas and not new.uploads)
    assert bus.run("ft", 0)["reason"] == "Unassigned"
    [manifest] = (tmp_path / ".reconcile" / "checkpoints" / "ft" / "manifests").iterdir()
    assert [f["path"] for f in json.loads(manifest.read_text())["files"]] == ["step.txt"]


def test_a_replica_stopped_at_its_time_limit_has_its_checkpoint_uploaded(tmp_path, leftovers):
    """time_limit_hours sends the checkpoint signal, then the job is Failed (DeadlineExceeded) and its instance freed.
    Nothing was uploaded, so the edit that raised the limit ran the job again, placed anew, from step 0 (the runtime
    audit, on the sim). Its checkpoint is uploaded now, as after any stop it survives."""
    bus = Bus(backend_for(tmp_path, None))
    never, ck = tmp_path / "never", tmp_path / "ck"
    e = entry("ft", waiter(never, ck / "ft" / "ckpt" / "step.txt"), time_limit_hours=0.0003,  # ~1 s
              checkpoint={"dir": "/ckpt", "signal": "SIGUSR1", "grace_seconds": 30})
    (ck / "ft" / "ckpt").mkdir(parents=True)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.05,
              log=lambda m: None, checkpoint_root=ck, checkpoint_sync=True)
    rec = run_until([a], terminal(bus, "ft"), timeout=60)
    assert (rec["phase"], rec["reason"]) == ("Failed", "DeadlineExceeded"), rec
    run_until([a], lambda: not a.uploads)
    [manifest] = (tmp_path / ".reconcile" / "checkpoints" / "ft" / "manifests").iterdir()  # before: no checkpoints/ at all
    assert [f["path"] for f in json.loads(manifest.read_text())["files"]] == ["step.txt"]


def test_an_agent_restarted_during_a_spot_notice_reports_the_replica_stopped_and_uploads_its_checkpoint(tmp_path, leftovers):
    """A spot notice; the agent signalled the replica and was killed in its grace (systemd restarts it within the
    notice); the replica checkpointed and exited. Before, the restarted agent dropped it without a report (its record
    said Running until the instance was gone) and uploaded nothing. Now it writes Stopped (Interrupted) and uploads."""
    from reconciler.runtime.notices import FileNotice

    bus = Bus(backend_for(tmp_path, None))
    never, ck, notice = tmp_path / "never", tmp_path / "ck", tmp_path / "notice.json"
    e = entry("ft", waiter(never, ck / "ft" / "ckpt" / "step.txt", linger=1.0),
              checkpoint={"dir": "/ckpt", "signal": "SIGUSR1", "grace_seconds": 30})
    (ck / "ft" / "ckpt").mkdir(parents=True)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    make = lambda: Agent("i-0", bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", poll=0.05, heartbeat=0.2,  # noqa: E731
                         backoff=0.05, log=lambda m: None, checkpoint_root=ck, checkpoint_sync=True, notice=FileNotice(notice))
    old = make()
    run_until([old], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Running" and "started" in " ".join(r["log_tail"]))
    notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
    run_until([old], lambda: (rep := old.replicas.get(("ft", 0))) is not None and rep.stop is not None)
    poll_until(lambda: not processes_with(str(never)), "the replica checkpointed and exited", 60)
    new = make()
    run_until([new], lambda: new.notice_done)
    rec = bus.run("ft", 0)
    assert (rec["phase"], rec["reason"]) == ("Stopped", "Interrupted"), rec  # before: Running, from the killed agent
    assert bus.agent("i-0")["running"] == [] and bus.agent("i-0")["state"] == "Interrupting"
    assert len(list((tmp_path / ".reconcile" / "checkpoints" / "ft" / "manifests").iterdir())) == 1


@pytest.mark.parametrize("field, value", [("started_unix", "yesterday"), ("attempt", "2"), ("exit_path", 7),
                                          ("stopping", {"phase": "Stopped", "reason": "Unassigned", "message": "", "terminal": False,
                                                        "deadline_at": "soon"})])
def test_a_local_replica_record_an_agent_cannot_use_is_ignored_naming_it_and_the_replica_started(tmp_path, field, value):
    """A record in the workdir's replicas/ with a field of another type (an older agent's, a hand's) killed the
    restarted agent ('unexpected ValueError'/'TypeError') before it ran anything."""
    bus = Bus(backend_for(tmp_path, None))
    e = entry("etl", [PY, "-c", "print('ran')"])
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    rec = {"entry": e, "attempt": 0, "pid": 1, "started": "1", "exit_path": str(tmp_path / "w" / "x.exit"), "started_unix": 0}
    rec[field] = value
    (tmp_path / "w" / "replicas").mkdir(parents=True)
    (tmp_path / "w" / "replicas" / "etl-0.json").write_text(json.dumps(rec))
    said: list[str] = []
    a = Agent("i-0", bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", poll=0.05, heartbeat=0.2, log=said.append)
    done = run_until([a], terminal(bus, "etl"), timeout=10)
    assert (done["phase"], done["log_tail"]) == ("Succeeded", ["ran"]), done
    assert any("etl-0.json" in m and field in m for m in said), said


def test_a_stop_begun_before_the_wall_clock_went_back_is_killed_after_its_grace_not_the_jump(tmp_path, leftovers):
    """The agent signalled a replica that ignores its signal and was restarted in its grace, the wall clock set back an
    hour meanwhile (NTP stepping a clock that ran fast, a VM resumed). The local record's end of the grace, a wall-clock
    time, then lay an hour ahead: the adopted replica ran on through it, on its GPUs, while its moved copy elsewhere
    started after the grace plus 30 s (one rank twice). The rest of a grace is never more than the grace."""
    bus = Bus(backend_for(tmp_path, None))
    cmd = [PY, "-c", "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\nprint('started', flush=True)\ntime.sleep(600)"]
    e = entry("ft", cmd, mode="service", checkpoint={"dir": str(tmp_path / "ck"), "signal": "SIGUSR1", "grace_seconds": 1})
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    old = in_process(bus, "i-0", tmp_path / "w")
    run_until([old], lambda: (r := bus.run("ft", 0)) and "started" in " ".join(r["log_tail"]))
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    old.tick()  # signalled: its stop, with the grace's end, in its local record; then the agent is gone
    record = tmp_path / "w" / "replicas" / "ft-0.json"
    doc = json.loads(record.read_text())
    doc["stopping"]["deadline_at"] += 3600  # what the record says once the clock went back an hour
    record.write_text(json.dumps(doc))
    new = in_process(bus, "i-0", tmp_path / "w")
    rec = run_until([new], lambda: (r := bus.run("ft", 0)) and r["phase"] == "Stopped" and r, timeout=15)
    assert rec["exit_code"] == -signal.SIGKILL, rec


def test_an_adopted_replicas_time_limit_counts_from_its_process_start_not_a_wall_clock_that_jumped(tmp_path, leftovers):
    """The wall clock jumped two days ahead (a host whose clock was far behind, set right by NTP at boot of the agent)
    between a replica's start and its agent's restart: the restarted agent took the replica to have run two days and
    stopped it at once, Failed (DeadlineExceeded), a day and 23 hours early. Its age is its process's, since boot."""
    bus = Bus(backend_for(tmp_path, None))
    cmd = [PY, "-c", "import time\nprint('started', flush=True)\ntime.sleep(600)"]
    e = entry("ft", cmd, mode="service", time_limit_hours=1)
    bus.put_assignment("i-0", {"serial": 1, "replicas": [e]})
    old = in_process(bus, "i-0", tmp_path / "w")
    run_until([old], lambda: (r := bus.run("ft", 0)) and "started" in " ".join(r["log_tail"]))
    record = tmp_path / "w" / "replicas" / "ft-0.json"
    doc = json.loads(record.read_text())
    doc["started_unix"] -= 2 * 86400  # what the clock said at its start, two days behind the clock now
    record.write_text(json.dumps(doc))
    new = in_process(bus, "i-0", tmp_path / "w")
    for _ in range(5):
        new.tick()
    rec = bus.run("ft", 0)
    assert (rec["phase"], rec["reason"]) == ("Running", "Adopted"), rec
    new.runtime.kill(new.replicas[("ft", 0)].handle)


def test_an_agent_that_died_before_recording_its_replicas_pid_leaves_it_adopted_not_started_twice(tmp_path, leftovers):
    """The agent writes a replica's local record (its attempt and mark, REPLICA_ID) before the start and its pid only
    after: an agent killed between the two (an OOM kill, systemd restarting it; wider on a loaded host, where the
    record's write waits on the disk) left a record without a pid. The agent restarted after it read that as a replica
    killed with its shim and started the next attempt beside the first, still running: one replica twice, on the same
    GPUs. Now the process is found by its mark (the oldest carrying it, leading its own session: its shim) and adopted.
    The record such a crash leaves is made here by taking the pid out of a running replica's record."""
    bus = Bus(backend_for(tmp_path, None))
    release = tmp_path / "release"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("t", waiter(release))]})

    def agent() -> Agent:
        return Agent("i-0", bus, ProcessRuntime(), tmp_path / "w", address="127.0.0.1", poll=0.05, heartbeat=0.2, backoff=0.05,
                     log=lambda m: None)

    run_until([agent()], lambda: (r := bus.run("t", 0)) and "started" in " ".join(r["log_tail"]))
    record = tmp_path / "w" / "replicas" / "t-0.json"
    doc = json.loads(record.read_text())
    pid = doc.pop("pid")
    del doc["started"]
    record.write_text(json.dumps(doc))
    restarted = agent()
    for _ in range(20):  # (its backoff is 0.05 s: a restart it decided on would start within these ticks)
        restarted.tick()
        time.sleep(0.05)
    log = (tmp_path / "w" / "logs" / "t-0.log").read_text()
    assert log.count("\nstarted ") == 1, log  # before: attempt 1 started beside attempt 0
    rep = restarted.replicas["t", 0]
    assert (rep.reason, rep.attempt, rep.handle.pid) == ("Adopted", 0, pid), (rep.reason, rep.message)
    assert json.loads(record.read_text())["pid"] == pid  # (recorded now: an agent restarted again adopts it at once)
    release.touch()
    rec = run_until([restarted], terminal(bus, "t"))
    assert (rec["phase"], rec["exit_code"], rec["restarts"]) == ("Succeeded", 0, 0), rec
