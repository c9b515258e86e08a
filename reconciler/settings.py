"""`check_all`: every FLEETOPS_* setting that is set, parsed before a command acts (the CLI runs it first), so a bad
one stops a command before it calls a cloud, not half-way. Yes/no and whole-number settings are parsed by
providers.settings; periods and limits in seconds, MB or days by their readers where they are used
(runtime.bus.setting, runtime.checkpoints, providers.sim)."""

from __future__ import annotations

import os
from typing import Callable

from providers.settings import COUNTS, FLAGS, SettingError, count, flag

__all__ = ["COUNTS", "FLAGS", "SettingError", "check_all", "count", "flag"]


def _number_readers() -> dict[str, Callable[[], object]]:
    """The settings in seconds, MB or days, each by the reader that parses it where it is used."""
    from providers.sim import sim_notice_seconds
    from reconciler.runtime import bus, checkpoints

    return {
        "FLEETOPS_AGENT_POLL_SECONDS": bus.poll_seconds, "FLEETOPS_AGENT_HEARTBEAT_SECONDS": bus.heartbeat_seconds,
        "FLEETOPS_CLOCK_SKEW_SECONDS": bus.clock_skew_seconds, "FLEETOPS_HEARTBEAT_STALE_SECONDS": bus.stale_seconds,
        "FLEETOPS_AGENT_BOOT_SECONDS": bus.boot_seconds, "FLEETOPS_RESTART_BACKOFF_SECONDS": bus.backoff_seconds,
        "FLEETOPS_RESTART_BACKOFF_RESET_SECONDS": bus.backoff_reset_seconds,
        "FLEETOPS_CHECKPOINT_SYNC_MAX_MB": checkpoints.max_bytes,
        "FLEETOPS_CHECKPOINT_RETENTION_DAYS": checkpoints.retention_seconds,
        "FLEETOPS_SIM_NOTICE_SECONDS": lambda: sim_notice_seconds(None),
    }


def check_all() -> None:
    """Parse every FLEETOPS_* setting that is set; a SettingError (or the number reader's ReconcileError) for the first
    bad one. The number readers' modules are imported only when one of their settings is set."""
    for name in FLAGS:
        flag(name)
    for name in COUNTS:
        count(name)
    if any(k.startswith("FLEETOPS_") and k.endswith(("_SECONDS", "_MB", "_DAYS")) for k in os.environ):
        for name, read in _number_readers().items():
            if name in os.environ:
                read()
