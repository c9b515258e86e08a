"""Plan kept fleet states again, each at the instant recorded with it: two solvers compared on the same state.

    python -m bench.explore_large N [START] --keep DIR      # keeps each fleet as edited, before its plan
    python -m bench.replan DIR/fleet-*                        # run in a worktree of each solver, compare the lines

A plan reads the clock (running jobs' hours left, priority aging), and the objective's coefficients with it, so two
solvers planning one state a minute apart are not planning the same problem: on bench.explore_large's fleet 39 the
same solver's high work tier came out 272,300 (proven) and 264,600 (unproven) at two instants (bench/README.md,
seventeenth session). Each kept state carries the instant to plan it at (`now`, a minute after it was kept). Each
line: the plan's tiers in their order ("*": below its bound, unproven) and its places, moves and evictions.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

os.environ.setdefault("FLEETOPS_SIM_AGENTS", "0")  # (before the sim is imported: no node agents)


def save(cfg: Path, dest: Path) -> None:
    """Keep config directory `cfg` (its state and the sim's world are inside it) at `dest`, with the instant to plan it at."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(cfg, dest / "c")
    (dest / "now").write_text((datetime.now(timezone.utc) + timedelta(minutes=1)).isoformat() + "\n")


def summary(r) -> str:
    """A plan's tiers in their order (value, "*" where below its bound: unproven) and its job changes."""
    tiers = " ".join(f"{t['value']:g}{'' if t['value'] == t['bound'] else '*'}" for t in r.plan.solver.tiers)
    acts = {a: sum(1 for j in r.plan.jobs if j.action == a) for a in ("place", "move", "evict")}
    return f"[{tiers}] " + " ".join(f"{a} {n}" for a, n in acts.items())


def replan(kept: Path, time_limit: float = 20.0) -> str:
    """A plan of a fresh copy of kept state `kept` at its recorded instant: its status and `summary`."""
    from reconciler import api

    now = datetime.fromisoformat((kept / "now").read_text().strip())
    with tempfile.TemporaryDirectory() as d:
        shutil.copytree(kept / "c", Path(d) / "c")
        r = api.plan(Path(d) / "c", time_limit=time_limit, now=now)
        return f"{r.plan.solver.status} {summary(r)}"


def main(argv: list[str]) -> None:
    for kept in argv:
        print(f"{Path(kept).name}: {replan(Path(kept))}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
