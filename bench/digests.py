"""Plan digests: did a change change any plan? (every solver or planner change is checked with this)

    python -m bench.digests [--work DIR] [--only NAME,NAME] [--time-limit 20]

Plans a fixed set of inputs with `api.plan` and prints, per input, the SHA-256 of the plan's JSON (its
plan id included: the same input gives the same plan byte for byte, README "How it decides") with the
status, jobs placed and $/h beside it. Run it on main and on a change: equal digests mean equal plans.
The inputs are seeded, so the digests are comparable between machines and runs; the search is bounded by
deterministic work, so a loaded machine gives the same digests (only slower).

  qs        examples/quickstart
  mlp       examples/ml-platform
  g1k       bench.generate 1,000 jobs, seed 1
  g2kr      bench.generate 2,000 jobs, seed 1, with licenses, reservations and deadlines (--rules)
  g1k-app   g1k applied on the sim, then planned again (the plan right after an apply)
  g1k-b6k   g1k under max_hourly_budget 6000 (a budget greedy fills to within cents)
  g1k-q50   g1k with tenant quotas at half of what the jobs ask (much pending on quota)

The wall and CPU seconds are printed for orientation only; the bench's tiers measure time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Priority aging and deadlines read the clock: the digests plan every input at this instant.
NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)


def _generated(out: Path, jobs: int, budget: float | None = None, **options) -> Path:
    import yaml

    from bench.generate import generate

    cfg = generate(out, jobs, 1, **options)
    if budget is not None:
        pol = cfg / "policies.yaml"
        docs = list(yaml.safe_load_all(pol.read_text()))
        for d in docs:
            if d["kind"] == "GuardrailPolicy":
                d["spec"]["max_hourly_budget"] = budget
        pol.write_text(yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=None))
    return cfg


def _example(name: str):
    def make(out: Path) -> Path:
        shutil.copytree(ROOT / "examples" / name, out, ignore=shutil.ignore_patterns(".reconcile"))
        return out
    return make


INPUTS = {
    "qs": (_example("quickstart"), False),
    "mlp": (_example("ml-platform"), False),
    "g1k": (lambda out: _generated(out, 1000), False),
    "g2kr": (lambda out: _generated(out, 2000, rules=True), False),
    "g1k-app": (lambda out: _generated(out, 1000), True),
    "g1k-b6k": (lambda out: _generated(out, 1000, budget=6000.0), False),
    "g1k-q50": (lambda out: _generated(out, 1000, quota_fraction=0.5), False),
}


def digest(name: str, work: Path, time_limit: float) -> dict:
    """Plan input `name` in a fresh copy under `work`: its digest and a summary."""
    from reconciler import api

    make, applied = INPUTS[name]
    cfg = make(work / name)
    t0, c0 = time.perf_counter(), time.process_time()
    res = api.plan(cfg, time_limit=time_limit, now=NOW)
    if applied:
        api.apply(cfg, saved_plan=res.plan, allow_destroy=10**6)
        t0, c0 = time.perf_counter(), time.process_time()
        res = api.plan(cfg, time_limit=time_limit, now=NOW)
    text = res.plan.to_json()
    counts = res.plan.counts()
    return {"name": name, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16], "status": res.plan.solver.status,
            "placed": sum(1 for j in res.plan.jobs if j.instances), "hourly": res.plan.cost_after,
            "changes": {k: v for k, v in counts.items() if v and k in ("create", "delete", "move", "evict")},
            "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, help="where to write the configs (default: a temporary directory, removed)")
    ap.add_argument("--only", help=f"comma-separated, of {', '.join(INPUTS)}")
    ap.add_argument("--time-limit", type=float, default=20.0)
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(INPUTS)
    unknown = [n for n in names if n not in INPUTS]
    if unknown:
        ap.error(f"unknown input(s) {', '.join(unknown)}; known: {', '.join(INPUTS)}")
    os.environ.setdefault("FLEETOPS_SIM_AGENTS", "0")  # no node agents: the applied input's sim must stay quiet
    work = args.work or Path(tempfile.mkdtemp(prefix="digests-"))
    try:
        for name in names:
            if (work / name).exists():
                shutil.rmtree(work / name)
            r = digest(name, work, args.time_limit)
            changes = " ".join(f"{k} {v}" for k, v in sorted(r["changes"].items())) or "no changes"
            print(f"{r['name']:8} {r['sha256']}  {r['status']:16} placed {r['placed']:5}  ${r['hourly']:,.2f}/h  "
                  f"{changes}  ({r['cpu_s']} s CPU, {r['wall_s']} s wall)", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
