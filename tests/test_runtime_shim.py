"""A replica's shim (runtimes.SHIM) and the signals an agent sends a replica's process group: a stop's SIGTERM in the
replica's first moments, before its shim had exec'd the command, was swallowed (the shim's no-op handler, in the shim
or inherited by its child before exec) and the replica ran on to its grace's end. Real shims and commands."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reconciler.runtime.runtimes import FORWARDED, Launch, ProcessRuntime, exit_record, shimmed
from tests.fleetkit import poll_until
from tests.test_runtime_adopt import leftovers  # noqa: F401 (the fixture below)

pytestmark = pytest.mark.usefixtures("leftovers")


def caught(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (/proc/PID/status SigCgt)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def test_a_sigterm_in_a_replicas_first_moments_reaches_its_command(tmp_path):
    """50 replicas, each sent SIGTERM to its group as the agent stops one (killpg) just after its start: half at
    once or a few ms later (0-48 ms: the shim's Python start, its fork, the command's exec), half as soon as the shim
    has set its handlers (the window where it was lost). Every command sees it: killed by it (it came before the
    command's own handler, or before its exec) or its handler's exit 42; and the shim records that in its exit file.
    Before: 5-8 of 50 ran on (none ended in 3 s), and one signalled in the shim's own start killed the shim before it
    forked (no exit file: an adopting agent read the replica as SIGKILLed)."""
    rt = ProcessRuntime()
    command = ("sh", "-c", 'trap "exit 42" TERM; while :; do sleep 0.05; done', str(tmp_path))
    handles = []
    for i in range(50):
        h = rt.start(Launch(name=f"r{i}", command=command, env={}, log_path=tmp_path / f"r{i}.log", exit_path=tmp_path / f"r{i}.exit"))
        if i % 2:
            poll_until(lambda: caught(h.pid, signal.SIGTERM) or h.poll() is not None, "the shim's handlers set", 5, 0.0005)
        else:
            time.sleep(i / 1000)  # (a spread over the shim's first moments, not a wait for anything)
        rt.signal(h, signal.SIGTERM)
        handles.append(h)
    limit = time.monotonic() + 5
    while time.monotonic() < limit and any(rt.poll(h) is None for h in handles):
        time.sleep(0.02)
    lost = [i for i, h in enumerate(handles) if rt.poll(h) is None]
    for i in lost:
        rt.kill(handles[i])
    assert not lost, f"{len(lost)} of 50 replicas ran on after their SIGTERM: {lost}"
    codes = [rt.poll(h) for h in handles]
    records = [exit_record(tmp_path / f"r{i}.exit") for i in range(50)]
    assert set(codes) <= {-signal.SIGTERM, 42}, codes
    assert [r and r["code"] for r in records] == codes, records


def signal_set(status: str, field: str) -> set[int]:
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":")), 16)
    return {s for s in range(1, 65) if mask >> (s - 1) & 1}


def test_the_command_starts_with_no_signal_blocked_or_ignored_by_its_shim(tmp_path):
    """The shim blocks the stop signals until its child's exec and runs in Python (which ignores SIGPIPE and SIGXFSZ):
    the command gets none of that (exec keeps a mask and what is ignored). Before, it ran with SIGPIPE ignored: a
    `producer | head` in its script got EPIPE errors instead of ending quietly."""
    rt = ProcessRuntime()
    h = rt.start(Launch(name="sig", command=("cat", "/proc/self/status"), env={}, log_path=tmp_path / "sig.log",
                        exit_path=tmp_path / "sig.exit"))
    poll_until(lambda: rt.poll(h) is not None, "the command ended", 10, 0.02)
    status = (tmp_path / "sig.log").read_text()
    assert rt.poll(h) == 0
    assert not signal_set(status, "SigBlk") & set(FORWARDED)
    assert not signal_set(status, "SigIgn") & {signal.SIGPIPE, signal.SIGXFSZ, *FORWARDED}


def test_a_shim_that_cannot_fork_records_an_ordinary_failure_not_a_start_error(tmp_path):
    """fork() failing (EAGAIN at the process limit, ENOMEM) is passing: the replica is an ordinary failure, restarted
    after its backoff, with the reason in its log; not a StartError (a command that cannot be run: Failed for good).
    Before: a traceback, and no exit file (an adopting agent read the replica as SIGKILLed). The shim runs under
    RLIMIT_NPROC=1; where this is root (whom it does not bind), as another user (its exec still with root's file
    access, setfsuid: this Python may be under /root), its files in a directory that user can write."""
    root = os.geteuid() == 0
    work = Path(tempfile.mkdtemp(prefix=f"shim-{tmp_path.name}-")) if root else tmp_path
    os.chmod(work, 0o777)
    launch = Launch(name="nofork", command=("true", str(tmp_path)), env={}, log_path=work / "nofork.log",
                    exit_path=work / "nofork.exit")

    # (saved uid 0: setfsuid may go back to 0, for the exec; exec then drops every right of root's)
    as_user = "os.setresuid(65534, 65534, 0); ctypes.CDLL(None).setfsuid(0); " if root else ""
    limited = [sys.executable, "-c", f"import ctypes, os, resource, sys; {as_user}resource.setrlimit(resource.RLIMIT_NPROC, (1, 1)); "
               "os.execv(sys.argv[1], sys.argv[1:])"]
    try:
        with open(launch.log_path, "wb") as log:
            proc = subprocess.Popen(limited + shimmed(launch, list(launch.command)), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        assert proc.wait(timeout=10) == 1, launch.log_path.read_text()
        assert exit_record(launch.exit_path) == {"code": 1}, launch.log_path.read_text()
        assert launch.log_path.read_text() == "fleetops shim: cannot fork to start 'true': Resource temporarily unavailable\n"
    finally:
        if root:
            shutil.rmtree(work)
