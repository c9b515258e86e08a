"""What a replica leaves running when it ends: a process orphaned by its parent's exit that left the replica's process
group (setsid) and cleared its environment (no FLEETOPS_REPLICA_ID) was found by nothing and held its GPUs for ever;
and strays that ignore SIGTERM made the agent wait ~3 s per replica, one after another, through a spot notice's
checkpoint window. Real agent, replica and stray processes on a local bus; every wait polls for a condition."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from reconciler.backend import backend_for
from reconciler.runtime.bus import Bus
from reconciler.runtime.notices import FileNotice
from reconciler.runtime.runtimes import REPLICA_ID, ProcessRuntime, subreaper_problem
from tests.fleetkit import poll_until
from tests.test_runtime_adopt import leftovers, processes_with  # noqa: F401 (leftovers: the fixture below)
from tests.test_runtime_agent import entry
from tests.test_runtime_workdir import agent, escaper

PY = sys.executable
pytestmark = [pytest.mark.usefixtures("leftovers"),
              pytest.mark.skipif(subreaper_problem() is not None, reason=f"no child subreaper here: {subreaper_problem()}")]


@pytest.fixture
def bus(tmp_path):
    return Bus(backend_for(tmp_path, None))


def orphaner(marker: Path, then: str, ignores_term: bool = False) -> list[str]:
    """A replica whose child starts a grandchild and exits at once: the grandchild, orphaned, leaves the process group
    (setsid) and execs with an empty environment (FLEETOPS_REPLICA_ID gone), writes its facts to `marker`.ready and runs
    on, optionally ignoring SIGTERM (a daemonising data server, `env -i` in a launcher script). The replica then runs
    `then` (Python)."""
    ready = f"{marker}.ready"
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignores_term else ""
    facts = "json.dumps({'pid': os.getpid(), 'own_session': os.getsid(0) == os.getpid(), 'env': sorted(os.environ)})"
    grandchild = (f"import json, os, pathlib, signal, time; {ignore}"
                  f"pathlib.Path({ready + '.tmp'!r}).write_text({facts}); os.replace({ready + '.tmp'!r}, {ready!r}); "
                  "time.sleep(120)")
    child = ("import os, sys, time\nparent = os.getpid()\n"
             "if os.fork() == 0:\n"
             "    while os.getppid() == parent: time.sleep(0.01)\n"  # orphaned: its parent has exited
             "    os.setsid()\n"
             f"    os.execve(sys.executable, [sys.executable, '-c', {grandchild!r}, {str(marker)!r}], {{}})\n"
             "os._exit(0)\n")
    return [PY, "-c", f"import os, subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {child!r}])\n"
            f"while not os.path.exists({ready!r}): time.sleep(0.02)\n" + then, str(marker)]


def orphan(marker: Path) -> int:
    """The orphaned grandchild's pid, once it runs; checked to be what the test means (by its own word: it may be
    ended already): in a session of its own, with no replica mark in its environment."""
    facts = poll_until(lambda: Path(f"{marker}.ready").exists() and json.loads(Path(f"{marker}.ready").read_text()),
                       "the orphan running", 20, 0.05)
    assert facts["own_session"] and REPLICA_ID not in facts["env"], facts
    return facts["pid"]


def gone(pid: int) -> bool:
    """Neither running nor a zombie: ended and reaped (a zombie keeps its /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def test_an_orphan_that_left_the_group_and_cleared_its_env_is_ended_with_its_stopped_replica(bus, tmp_path):
    """Before: the orphan was init's child, in a session of its own, with no mark: nothing found it at the replica's
    stop, and it ran on (on the GPUs the plan gave the next job). The replica's shim is its child subreaper: the orphan
    is the shim's child, ended and reaped with the replica."""
    marker = tmp_path / "svc-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("svc", orphaner(marker, "time.sleep(120)"), mode="service")]})
    a = agent(bus, tmp_path / "i-0")
    poll_until(lambda: a.tick() or Path(f"{marker}.ready").exists(), "the replica and its orphan running", 20, 0.05)
    pid = orphan(marker)
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    poll_until(lambda: a.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Stopped", "the replica stopped", 20, 0.05)
    poll_until(lambda: gone(pid), "the orphan ended and reaped", 3, 0.05)  # before: running on, two minutes


def test_an_orphan_that_ignores_sigterm_is_killed_and_reaped_when_its_replica_crashes(bus, tmp_path):
    marker = tmp_path / "crash-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crash", orphaner(marker, "sys.exit(3)", ignores_term=True),
                                                                restart={"policy": "Never", "backoff_limit": 0})]})
    a = agent(bus, tmp_path / "i-0")
    pid = poll_until(lambda: a.tick() or Path(f"{marker}.ready").exists() and orphan(marker), "the orphan running", 20, 0.05)
    rec = poll_until(lambda: a.tick() or (r := bus.run("crash", 0)) and r["terminal"] and r, "the replica failed", 20, 0.05)
    assert (rec["phase"], rec["exit_code"]) == ("Failed", 3), rec
    assert gone(pid)  # ended (SIGTERM, then SIGKILL) and reaped before the replica's end was reported


def test_an_orphan_of_a_replica_killed_after_its_grace_is_ended(bus, tmp_path):
    marker = tmp_path / "stuck-marker"
    stuck = f"import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nopen({str(marker) + '.stuck'!r}, 'w').close()\ntime.sleep(120)"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("stuck", orphaner(marker, stuck), mode="service",
                                                                checkpoint={"dir": str(tmp_path / "ck"), "signal": "SIGTERM", "grace_seconds": 0.3})]})
    a = agent(bus, tmp_path / "i-0")
    poll_until(lambda: a.tick() or Path(f"{marker}.stuck").exists(), "the replica, ignoring SIGTERM, and its orphan running", 20, 0.05)
    pid = orphan(marker)
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    rec = poll_until(lambda: a.tick() or (r := bus.run("stuck", 0)) and r["phase"] == "Stopped" and r, "the replica stopped", 20, 0.05)
    assert rec["exit_code"] == -signal.SIGKILL, rec
    poll_until(lambda: gone(pid), "the orphan ended and reaped", 3, 0.05)


def test_a_restarted_agent_ends_the_orphan_of_the_replica_it_adopted(bus, tmp_path):
    """The orphan's attribution lives in the replica's shim (its subreaper), not in the agent: an agent restarted (a
    crash, systemd) adopts the replica and its stop ends the orphan too."""
    marker = tmp_path / "svc-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("svc", orphaner(marker, "time.sleep(120)"), mode="service")]})
    first = agent(bus, tmp_path / "i-0")
    poll_until(lambda: first.tick() or Path(f"{marker}.ready").exists(), "the replica and its orphan running", 20, 0.05)
    pid = orphan(marker)
    again = agent(bus, tmp_path / "i-0")  # (the first gone without a stop, as in a crash)
    again.tick()
    assert again.replicas[("svc", 0)].reason == "Adopted"
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    poll_until(lambda: again.tick() or (r := bus.run("svc", 0)) and r["phase"] == "Stopped", "the replica stopped", 20, 0.05)
    poll_until(lambda: gone(pid), "the orphan ended and reaped", 3, 0.05)


def test_a_replica_that_ended_while_no_agent_watched_left_no_orphan(bus, tmp_path):
    marker = tmp_path / "crash-marker"
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("crash", orphaner(marker, "sys.exit(3)"),
                                                                restart={"policy": "Never", "backoff_limit": 0})]})
    agent(bus, tmp_path / "i-0").tick()  # (then gone, as in a crash)
    pid = orphan(marker)
    poll_until(lambda: (tmp_path / "i-0" / "replicas" / "crash-0.exit").exists(), "the replica ended, unwatched", 20, 0.05)
    assert gone(pid)  # its shim ended and reaped it before it wrote the replica's end (before: running on)


def test_a_replica_killed_as_it_starts_is_killed_at_once(tmp_path):
    """A kill that comes while the shim has not forked its command yet (a notice just after the start) found no tree
    to kill; the shim then started the command, and the kill waited its whole margin (5 s) before it killed the shim."""
    from reconciler.runtime.runtimes import Launch

    rt = ProcessRuntime()
    marker = tmp_path / "quick-marker"
    for _ in range(3):
        handle = rt.start(Launch(name="quick", command=(PY, "-c", "import time; time.sleep(60)", str(marker)), env={},
                                 log_path=tmp_path / "quick.log", exit_path=tmp_path / "quick.exit"))
        began = time.monotonic()
        rt.kill(handle)
        assert time.monotonic() - began < 1.5 and handle.returncode == -signal.SIGKILL and not processes_with(str(marker))


@pytest.mark.parametrize("on_signal", ["exits", "ignores it"])
def test_a_spot_notice_ends_every_replicas_strays_at_once_not_one_replica_after_another(bus, tmp_path, on_signal):
    """Three replicas, each with a stray out of its process group that ignores SIGTERM, and a spot notice (30 s on GCP
    and Azure). Each replica exits on its checkpoint signal, or ignores it and is killed after its grace. Before: the
    agent's tick waited the strays' 2 s grace plus the kill, ~3 s, per replica, one after another: 9 s here, every
    other replica's kill and the heartbeat held up meanwhile. Now each replica's strays end beside the others', and no
    tick waits on them."""
    notice = tmp_path / "notice.json"
    then = "time.sleep(120)" if on_signal == "exits" else "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"
    markers = [tmp_path / f"r{i}-marker" for i in range(3)]
    ck = {"dir": str(tmp_path / "ck"), "signal": "SIGTERM", "grace_seconds": 0.3}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry(f"j{i}", escaper(m, then, ignores_term=True), mode="service", checkpoint=ck)
                                                         for i, m in enumerate(markers)]})
    a = agent(bus, tmp_path / "i-0", notice=FileNotice(notice))
    poll_until(lambda: a.tick() or all(Path(f"{m}.ready").exists() for m in markers), "the replicas and their strays running", 20, 0.05)
    shims = {rep.handle.pid for rep in a.replicas.values()}
    strays = {p for m in markers for p in processes_with(str(m)) if os.getsid(p) == p and p not in shims}
    assert len(strays) == 3
    notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
    began, longest = time.monotonic(), 0.0
    while not a.notice_done and time.monotonic() - began < 15:
        t = time.monotonic()
        a.tick()
        longest = max(longest, time.monotonic() - t)
        time.sleep(0.05)
    took = time.monotonic() - began
    assert a.notice_done
    assert longest < 1.0 and took < 4.5, (longest, took)  # before: a tick of ~3 s, 9 s in all
    assert all(gone(p) for p in strays)  # and reaped by their shims (before: zombies of an init that reaps nothing)
    assert {bus.run(f"j{i}", 0)["reason"] for i in range(3)} == {"Interrupted"}


def test_the_agents_heartbeat_names_no_untracked_strays_where_the_shim_can_be_their_subreaper(bus, tmp_path):
    a = agent(bus, tmp_path / "i-0")
    a.tick()
    a._publish(force=True)
    assert "strays_untracked" not in bus.agent("i-0") and a.strays_untracked is None


@pytest.mark.slow
def test_a_command_that_left_its_shims_group_and_ignores_sigterm_is_killed_with_its_shim_after_the_margin(bus, tmp_path):
    """The replica's command itself calls setsid() and ignores SIGTERM: neither its checkpoint signal (its shim's
    group) nor the kill (SIGTERM out of the group) ends it, so its shim never ends. KILL_MARGIN_S past the strays'
    grace the agent kills the shim's group and the tree with SIGKILL: a tick never waits the margin out. (~6 s)"""
    from reconciler.runtime.runtimes import KILL_MARGIN_S, STRAY_GRACE_S

    marker = tmp_path / "hermit-marker"
    hermit = [PY, "-c", "import os, signal, time\nos.setsid()\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              f"open({str(marker) + '.ready'!r}, 'w').close()\ntime.sleep(120)", str(marker)]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry("hermit", hermit, mode="service",
                                                                checkpoint={"dir": str(tmp_path / "ck"), "signal": "SIGTERM", "grace_seconds": 0.3})]})
    a = agent(bus, tmp_path / "i-0")
    poll_until(lambda: a.tick() or Path(f"{marker}.ready").exists(), "the replica running", 20, 0.05)
    [pid] = [p for p in processes_with(str(marker)) if os.getsid(p) == p and p != a.replicas[("hermit", 0)].handle.pid]
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    began, longest = time.monotonic(), 0.0
    while not ((r := bus.run("hermit", 0)) and r["phase"] == "Stopped") and time.monotonic() - began < 20:
        t = time.monotonic()
        a.tick()
        longest = max(longest, time.monotonic() - t)
        time.sleep(0.05)
    assert bus.run("hermit", 0)["phase"] == "Stopped" and not processes_with(str(marker))
    assert time.monotonic() - began < 0.3 + STRAY_GRACE_S + KILL_MARGIN_S + 2 and longest < 1.5, longest



class StuckFs:
    """A FUSE file system that answers its INIT and reads every later request without answering it: a process that
    opens a file in it waits in the kernel, uninterruptibly (state D) once its request was read and it was signalled,
    and SIGKILL does not end it (as on a hung NFS mount, or a GPU driver's hang) until the file system goes (`close`:
    the kernel aborts its requests). Root only (mount), with /dev/fuse."""

    def __init__(self, mnt: Path):
        import ctypes
        import struct
        import threading

        self.mnt, self.libc, self.lookups = mnt, ctypes.CDLL(None, use_errno=True), 0
        mnt.mkdir()
        self.fd = os.open("/dev/fuse", os.O_RDWR)
        opts = f"fd={self.fd},rootmode=40000,user_id=0,group_id=0".encode()
        if self.libc.mount(b"fleetops-stuck", str(mnt).encode(), b"fuse", 0, opts) != 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            pytest.skip(f"cannot mount a FUSE file system here: {os.strerror(err)}")
        unique = struct.unpack_from("<IIQ", os.read(self.fd, 1 << 17))[2]  # FUSE_INIT
        # (protocol 7.22: the short reply the kernel still takes; FUSE_PARALLEL_DIROPS: a lookup does not wait for another)
        init = struct.pack("<IIIIHHI", 7, 22, 0, 1 << 18, 0, 0, 4096)
        os.write(self.fd, struct.pack("<IiQ", 16 + len(init), 0, unique) + init)
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        import select
        import struct

        while not self.stop.is_set():
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    got = os.read(self.fd, 1 << 17)
                except OSError:
                    return
                self.lookups += struct.unpack_from("<I", got, 4)[0] == 1  # FUSE_LOOKUP

    def close(self) -> None:
        self.stop.set()
        self.reader.join()
        os.close(self.fd)
        self.libc.umount2(str(self.mnt).encode(), 2)  # MNT_DETACH


@pytest.fixture
def stuck_fs(tmp_path):
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("a FUSE mount needs root and /dev/fuse")
    fs = StuckFs(tmp_path / "stuck")
    yield fs
    fs.close()


def test_replicas_stuck_in_the_kernel_past_their_kill_hold_up_no_tick(bus, tmp_path, stuck_fs):
    """Two replicas whose commands are stuck in the kernel (a read from a hung file system: SIGKILL does not end them)
    are stopped. KILL_MARGIN_S past their strays' grace the agent kills their shims. Before, it did so in its loop
    (runtime.kill) and waited there for each one's tree, 1 s after its SIGKILL before it gave up, one replica after
    another (a shim SIGKILL could not end either: 10 s more, and again every tick): the heartbeat, the notice's other
    replicas' stops and uploads held up meanwhile (a tick of ~2 s here). Now it begins that kill (force_kill) and polls
    on; each replica ends as before, once its tree is dead or given up (1 s)."""
    from reconciler.runtime.runtimes import KILL_MARGIN_S, STRAY_GRACE_S

    markers = [tmp_path / f"s{i}-marker" for i in range(2)]
    stuck = [PY, "-c", f"import os, sys\nopen({str(stuck_fs.mnt)!r} + '/' + os.path.basename(sys.argv[1]))"]  # (a name each: one lookup each)
    ck = {"dir": str(tmp_path / "ck"), "signal": "SIGTERM", "grace_seconds": 0.3}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry(f"s{i}", [*stuck, str(m)], mode="service", checkpoint=ck)
                                                         for i, m in enumerate(markers)]})
    a = agent(bus, tmp_path / "i-0")
    poll_until(lambda: a.tick() or stuck_fs.lookups >= 2, "both commands waiting on the file system", 20, 0.05)
    bus.put_assignment("i-0", {"serial": 2, "replicas": []})
    began, longest = time.monotonic(), 0.0
    while not all((r := bus.run(f"s{i}", 0)) and r["phase"] == "Stopped" for i in range(2)) and time.monotonic() - began < 20:
        t = time.monotonic()
        a.tick()
        longest = max(longest, time.monotonic() - t)
        time.sleep(0.05)
    assert [bus.run(f"s{i}", 0)["phase"] for i in range(2)] == ["Stopped", "Stopped"]
    assert time.monotonic() - began < 0.3 + STRAY_GRACE_S + KILL_MARGIN_S + 3 and longest < 0.8, longest
    states = {Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] for m in markers for p in processes_with(str(m))}
    assert states == {"D"}  # (what the test means: the commands outlived their SIGKILL; they end with the file system)

# The shim as agents before the subreaper ran it (961505c^): it waits for its command alone and exits with it, leaving
# whatever the command started outside its process group to the agent. Such shims still run after an agent upgrade.
OLD_SHIM = r"""
import json, os, signal, sys
out, cmd = sys.argv[1], sys.argv[2:]
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
    signal.signal(s, lambda n, f: None)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        os.write(w, f"cannot start {cmd[0]!r}: {e.strerror}".encode())
        os._exit(127)
os.close(w)
err = b""
while chunk := os.read(r, 4096):
    err += chunk
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
doc = {"code": code, **({"error": err.decode(errors="replace")} if err else {})}
if err:
    print(doc["error"], file=sys.stderr, flush=True)
with open(out + ".tmp", "w") as f:
    json.dump(doc, f)
os.replace(out + ".tmp", out)
if code < 0:
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code if code >= 0 else 128 - code)
"""


def old_shimmed(launch, command):
    """What the agent before the subreaper ran a replica under (its argv: no strays' grace)."""
    launch.exit_path.parent.mkdir(parents=True, exist_ok=True)
    launch.exit_path.unlink(missing_ok=True)
    return [PY, "-S", "-c", OLD_SHIM, str(launch.exit_path), *command]


def test_an_upgraded_agent_adopts_replicas_under_the_old_shim_says_their_strays_are_untracked_and_ends_them_side_by_side(
        bus, tmp_path, monkeypatch):
    """An agent upgraded while replicas run under the earlier version's shim (not their subreaper, gone with its command)
    adopts them: none is started a second time. Its heartbeat says their orphans are not tracked (StraysUntracked, as
    where prctl is refused: it said nothing, the subreaper being available to new shims). At a spot notice each one's
    stray, out of its group and ignoring SIGTERM, is ended beside the others': the agent's tick waited each one's
    2 s grace and kill, one replica after another (~3 s a replica, the old agent's wait)."""
    from reconciler.runtime import runtimes
    from reconciler.runtime.lifecycle import agent_fault
    from tests.test_runtime_workdir import copies

    notice = tmp_path / "notice.json"
    markers = [tmp_path / f"r{i}-marker" for i in range(3)]
    ck = {"dir": str(tmp_path / "ck"), "signal": "SIGTERM", "grace_seconds": 0.3}
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry(f"j{i}", escaper(m, "time.sleep(120)", ignores_term=True), mode="service",
                                                               checkpoint=ck) for i, m in enumerate(markers)]})
    with monkeypatch.context() as old:
        old.setattr(runtimes, "shimmed", old_shimmed)
        before = agent(bus, tmp_path / "i-0")
        poll_until(lambda: before.tick() or all(Path(f"{m}.ready").exists() for m in markers), "the old replicas and strays running", 20, 0.05)
    shims = {key: rep.handle.pid for key, rep in before.replicas.items()}
    a = agent(bus, tmp_path / "i-0", notice=FileNotice(notice))  # the upgraded agent (the old one gone, as at a restart)
    a.tick()
    assert {key: rep.reason for key, rep in a.replicas.items()} == {(f"j{i}", 0): "Adopted" for i in range(3)}
    assert {key: rep.handle.pid for key, rep in a.replicas.items()} == shims
    assert all(len(copies(m)) == 2 for m in markers)  # the one copy's group and its stray's session: none started again
    a._publish(force=True)
    report = bus.agent("i-0")
    assert "j0/0" in report.get("strays_untracked", ""), report
    assert agent_fault(report)[0] == "StraysUntracked"
    strays = {p for m in markers for p in processes_with(str(m)) if os.getsid(p) == p and p not in shims.values()}
    assert len(strays) == 3
    notice.write_text(json.dumps({"reason": "spot-interruption", "time": "now"}))
    began, longest = time.monotonic(), 0.0
    while not a.notice_done and time.monotonic() - began < 15:
        t = time.monotonic()
        a.tick()
        longest = max(longest, time.monotonic() - t)
        time.sleep(0.05)
    took = time.monotonic() - began
    assert a.notice_done and not [p for m in markers for p in processes_with(str(m))]  # (init's zombies, maybe: no shim reaps them)
    assert longest < 1.0 and took < 4.5, (longest, took)  # before: a tick of ~3 s a replica
    assert {bus.run(f"j{i}", 0)["reason"] for i in range(3)} == {"Interrupted"}
    a._publish(force=True)
    assert "strays_untracked" not in bus.agent("i-0")  # none of the old shims runs any more


def test_an_upgraded_agent_ends_the_strays_of_old_shim_replicas_that_ended_unwatched_side_by_side(bus, tmp_path, monkeypatch):
    """Three replicas under the earlier version's shim crashed while no agent ran, each leaving a stray out of its
    group that ignores SIGTERM (the old shim ends none). The upgraded agent ends them before it starts the replicas
    again: one after another, 2-3 s each, in its first tick (~7-9 s here, no heartbeat meanwhile). Now side by side."""
    from reconciler.runtime import runtimes

    markers = [tmp_path / f"c{i}-marker" for i in range(3)]
    bus.put_assignment("i-0", {"serial": 1, "replicas": [entry(f"c{i}", escaper(m, "sys.exit(3)", ignores_term=True), mode="service")
                                                         for i, m in enumerate(markers)]})
    with monkeypatch.context() as old:
        old.setattr(runtimes, "shimmed", old_shimmed)
        before = agent(bus, tmp_path / "i-0")
        before.tick()  # (then gone: the replicas crash with no agent watching)
    exits = [tmp_path / "i-0" / "replicas" / f"c{i}-0.exit" for i in range(3)]
    poll_until(lambda: all(p.exists() for p in exits), "the old replicas ended, unwatched", 20, 0.05)
    strays = [p for m in markers for p in processes_with(str(m))]
    assert len(strays) == 3  # each replica's stray runs on
    a = agent(bus, tmp_path / "i-0")
    began = time.monotonic()
    a.tick()
    took = time.monotonic() - began
    assert not [p for m in markers for p in processes_with(str(m)) if p in strays]
    assert took < 4.5, took  # before: ~3 s a replica
