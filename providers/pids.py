"""A process named by its pid and its start time, so a pid the kernel has reused since is never taken for it (and
never signalled). The sim's agent.pid and the agent's replicas.pids record both ("PID START"); the sim and the
node agent read them with these functions, and find what a process started through /proc (its descendants, or the
processes that carry a mark in their environment)."""

from __future__ import annotations

import os


def start_time(pid: int) -> str:
    """The process's start time in clock ticks (/proc/PID/stat field 22): with the pid, it names one
    process, so a pid reused since is never taken for it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def running(pid: int, started: str) -> bool:
    """The process `pid` that started at `started` still runs (is neither gone, reused, nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return len(fields) > 19 and fields[19] == started and fields[0] != "Z"


def age(started: str) -> float | None:
    """Seconds since a process with start time `started` (start_time: clock ticks since boot) began, by the clock since
    boot, which no setting of the wall clock moves; None where it cannot be told (no /proc)."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(started) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def proc_pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:  # no /proc (not Linux): nothing to find
        return []


def table() -> dict[int, tuple[int, int, int]]:
    """Every process now, as pid -> (parent pid, process group, session)."""
    out = {}
    for p in proc_pids():
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[p] = (int(fields[1]), int(fields[2]), int(fields[3]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def parents(procs: dict[int, tuple[int, int, int]] | None = None) -> dict[int, list[int]]:
    """Every process's children, by their parent pids now (or in `procs`, as `table` gave them)."""
    children: dict[int, list[int]] = {}
    for p, (ppid, _, _) in (table() if procs is None else procs).items():
        children.setdefault(ppid, []).append(p)
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> dict[int, str]:
    """The live descendants of `pid` (by their parent pids, now, or `children` as `parents` gave them), as pid -> start
    time: what a process started, also what left its process group, while its own processes still run (an orphan's
    parent is its nearest subreaper, else init)."""
    children = parents() if children is None else children
    out, todo = {}, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        if p not in out:
            out[p] = start_time(p)
            todo += children.get(p, [])
    return out


def marked(name: str, value: str) -> dict[int, str]:
    """The processes whose environment carries `name=value` exactly, as pid -> start time. One whose environment cannot
    be read (another user's, gone meanwhile) is skipped."""
    want = f"{name}={value}".encode()
    out = {}
    for pid in proc_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if want in env.split(b"\0"):
            out[pid] = start_time(pid)
    return out


__all__ = ["age", "descendants", "marked", "parents", "proc_pids", "running", "start_time", "table"]
