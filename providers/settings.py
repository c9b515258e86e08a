"""FLEETOPS_* yes/no and whole-number environment settings: one parser per kind (here, at the bottom layer: the sim
reads one too), and reconciler.settings.check_all, which the CLI runs before any command acts.

A value no parser accepts is an error naming the variable and what it accepts: FLEETOPS_SIM_AGENTS=off started
agents (anything but "0" did) and FLEETOPS_SOLVE_PROCESSES=four ran one process, both silently."""

from __future__ import annotations

import os

from providers.errors import ReconcileError

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

# Each yes/no setting and its value when unset (or set to "").
FLAGS = {
    "FLEETOPS_DEBUG": False,  # an unexpected error's traceback (cli.last_resort_message)
    "FLEETOPS_SOLVER_DEBUG": False,  # CP-SAT's search log on stderr
    "FLEETOPS_CHECKPOINT_SYNC": True,  # checkpoints copied through the state backend (runtime.checkpoints)
    "FLEETOPS_SIM_AGENTS": True,  # the sim starts a node agent per instance with work
}

# Each whole-number setting and the range it accepts (unset or "": the reader's default).
COUNTS = {
    "FLEETOPS_SOLVE_PROCESSES": (0, 1024),  # solver worker processes at most; 0 or 1: all parts in this process
}


class SettingError(ReconcileError):
    """A FLEETOPS_* environment variable holds a value its setting does not accept."""


def _raw(name: str) -> str | None:
    raw = os.environ.get(name)
    return raw.strip() if raw is not None and raw.strip() else None


def flag(name: str) -> bool:
    """A yes/no setting: 1/true/yes/on or 0/false/no/off, any case; unset or empty, its default (FLAGS)."""
    raw = _raw(name)
    if raw is None:
        return FLAGS[name]
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a yes/no value: give one of {'/'.join(TRUE)} or {'/'.join(FALSE)} "
                       f"(any case), or leave it unset ({'on' if FLAGS[name] else 'off'})")


def count(name: str) -> int | None:
    """A whole-number setting within its range (COUNTS); None when unset or empty (the reader's default)."""
    raw = _raw(name)
    if raw is None:
        return None
    lo, hi = COUNTS[name]
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise SettingError(f"{name}={raw!r} is not a whole number from {lo} to {hi}, or unset")
    return value
