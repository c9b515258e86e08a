"""An exploration, not a benchmark: random fixed clusters of mixed node sizes (bench/trace.py mode mixed, 150-700
trace jobs, 8/4/2/1-GPU pools of random sizes), each planned, checked against every rule (tests/invariants.py) and
apply's re-check, applied and planned again (a no-op expected); then one edit (priorities changed, 10% of the jobs
removed, pools shrunk to 80%, tenant quotas set) and the same again. One line per fleet; a failure prints its
assertion and traceback and the run goes on. Fleet i is seeded by i: `python -m bench.explore_mixed 1 80` replays
fleet 80 alone (bench/README.md, "Fixed clusters of mixed node sizes", lists what it found). With --keep DIR, each
edited fleet is kept for bench.replan (two solvers compared on the same state at the same instant).

    python -m bench.explore_mixed N [START] [--keep DIR]
"""
from __future__ import annotations

import os
import random
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import yaml

os.environ.setdefault("FLEETOPS_SIM_AGENTS", "0")  # (before the sim is imported: no node agents)

from bench.replan import save  # noqa: E402
from bench.trace import generate  # noqa: E402
from reconciler import api  # noqa: E402
from reconciler.plancheck import recheck  # noqa: E402
from reconciler.problem import build_problem  # noqa: E402
from tests.invariants import check_plan, check_stability  # noqa: E402

def docs_of(cfg: Path) -> list[tuple[Path, list[dict]]]:
    out = []
    for f in sorted(cfg.glob("**/*.yaml")):
        if ".reconcile" in f.parts or "status" in f.parts:
            continue
        out.append((f, list(yaml.safe_load_all(f.read_text()))))
    return out

def edit(cfg: Path, rng: random.Random) -> str:
    """One random edit of the config, in place; returns its kind."""
    kind = rng.choice(["raise", "remove", "shrink", "quota"])
    for f, ds in docs_of(cfg):
        changed = False
        for d in ds:
            if kind == "raise" and d["kind"] == "Job" and rng.random() < 0.1:
                d["spec"]["priority"] = rng.choice(["high", "normal", "low"]); changed = True
            if kind == "shrink" and d["kind"] == "Pool" and rng.random() < 0.5 and d["spec"]["max_instances"] > 2:
                n = max(1, int(d["spec"]["max_instances"] * 0.8)); d["spec"]["min_instances"] = d["spec"]["max_instances"] = n; changed = True
            if kind == "quota" and d["kind"] == "Tenant" and rng.random() < 0.5:
                d["spec"]["quota"] = {"gpus": rng.randrange(20, 200)}; changed = True
        if kind == "remove":
            keep = [d for d in ds if not (d["kind"] == "Job" and rng.random() < 0.1)]
            changed = len(keep) != len(ds); ds = keep
        if changed:
            f.write_text(yaml.safe_dump_all(ds, sort_keys=False))
    return kind

def check(cfg: Path, label: str):
    """Plan, every rule, apply's re-check, apply, and the next plan a no-op; returns the first plan."""
    now = datetime.now(timezone.utc)
    r = api.plan(cfg, time_limit=20, now=now)
    check_plan(r.desired, r.observed, r.plan, now=now)
    check_stability(r.desired, r.observed, r.plan)
    bad = recheck(r.plan, r.desired, r.observed, build_problem(r.desired, r.observed))[1]
    assert not bad, (label, bad[:3])
    api.apply(cfg, saved_plan=r.plan, allow_destroy=10**6)
    again = api.plan(cfg, time_limit=20)
    ch = [(j.job, j.action) for j in again.plan.jobs if j.action in ("move", "evict", "place")]
    assert not again.plan.has_changes, (label, "not a no-op", len(again.plan.creates), len(again.plan.deletes), ch[:5])
    return r

def fleet(i: int) -> tuple[int, dict[int, int], random.Random]:
    """Fleet i's job count, node counts per GPU size, and the generator its edit draws from."""
    rng = random.Random(i)
    jobs = rng.randrange(150, 700)
    gpus = jobs * 1.1 * rng.uniform(0.5, 1.0)
    nodes = {8: max(1, round(gpus * rng.uniform(0.3, 0.8) / 8)), 4: rng.randrange(0, 20), 2: rng.randrange(0, 60), 1: rng.randrange(0, 40)}
    return jobs, {k: v for k, v in nodes.items() if v}, rng


def explore(i: int, what: str, make: Callable[[], Path], rng: random.Random, keep: Path | None = None) -> None:
    """Fleet i (`what` it is, `make` generates its config): `check` cold, one `edit` drawn from `rng`, `check` again;
    one line, "ok" or "FAILED" with the assertion and its traceback, and the run goes on. `keep`: the edited fleet,
    before its plan, is copied to keep/fleet-i (bench.replan plans it again, with another solver too)."""
    try:
        cfg = make()
        r = check(cfg, "cold")
        used = sum(len(x) for j in r.plan.jobs if j.instances for x in j.gpus)
        k = edit(cfg, rng)
        if keep is not None:
            save(cfg, keep / f"fleet-{i}")
        check(cfg, f"after {k}")
        print(f"fleet {i}: {what} ok, {used} GPUs, {r.plan.solver.status}; edit {k} ok", flush=True)
    except Exception as e:
        print(f"fleet {i}: {what} FAILED: {e!r}"[:600], flush=True)
        traceback.print_exc()


def options(argv: list[str]) -> tuple[int, int, Path | None]:
    """N, START and --keep DIR of the explorations' command lines."""
    keep = None
    if "--keep" in argv:
        at = argv.index("--keep")
        keep, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    return int(argv[0]), int(argv[1]) if len(argv) > 1 else 0, keep


def main(argv: list[str]) -> None:
    n, start, keep = options(argv)
    for i in range(start, start + n):
        jobs, nodes, rng = fleet(i)
        with tempfile.TemporaryDirectory() as d:
            explore(i, f"{jobs} jobs {nodes}", lambda: generate(Path(d) / "c", jobs, i, "mixed", nodes=nodes), rng, keep)


if __name__ == "__main__":
    main(sys.argv[1:])
