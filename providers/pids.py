"""A process named by its pid and its start time, so a pid the kernel has reused since is never taken for it (and
never signalled). The sim's agent.pid and the agent's replicas.pids record both ("PID START"); the sim and the
node agent read them with these two functions."""

from __future__ import annotations


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


__all__ = ["running", "start_time"]
