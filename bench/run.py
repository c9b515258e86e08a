"""Plan-time benchmark on the simulated cloud. `python -m bench.run [--tiers quickstart,1k] [--time-limit S]`.

For each tier: a cold plan (empty fleet), the apply, a warm plan against the converged fleet
(must show no changes), and a drift plan after ~5% of instances are interrupted. Prints a
table and writes bench/results.json. Everything runs in one process, one tier after another.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import tempfile
import time
from pathlib import Path

from bench.generate import generate
from providers.sim import SimCloud
from reconciler import api
from reconciler.state import state_dir

ROOT = Path(__file__).resolve().parent.parent
TIERS = {"quickstart": None, "1k": 1000, "5k": 5000}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _plan(cfg: Path, label: str, time_limit: float) -> dict:
    t = time.perf_counter()
    r = api.plan(cfg, time_limit=time_limit)
    wall = time.perf_counter() - t
    c = r.plan.counts()
    return {
        "step": label, "wall_s": round(wall, 2), "solve_s": round(r.solution.seconds, 2), "status": r.solution.status,
        "gap": round(r.solution.gap, 4), "demands": len(r.problem.demands), "capacities": len(r.problem.capacities),
        "instances_before": len(r.observed.instances), "creates": c["create"], "deletes": c["delete"],
        "placed": c["keep"] + c["place"] + c["move"], "pending": c["pending"] + c["evict"],
        "cost_before": r.plan.cost_before, "cost_after": r.plan.cost_after, "changes": r.plan.has_changes,
        "peak_rss_mib": round(_rss_mib()),
    }


def run_tier(name: str, jobs: int | None, time_limit: float, work: Path) -> list[dict]:
    cfg = work / name
    if jobs is None:
        shutil.copytree(ROOT / "examples" / "quickstart", cfg, ignore=shutil.ignore_patterns(".reconcile", "status"))
    else:
        generate(cfg, jobs, seed=1)
    rows = [_plan(cfg, "cold plan", time_limit)]
    t = time.perf_counter()
    try:
        api.apply(cfg, time_limit=time_limit, allow_destroy=10**6)
        applied = "ok"
    except Exception as e:  # noqa: BLE001 - the benchmark reports, it does not stop
        applied = f"{type(e).__name__}: {e}"[:200]
    rows.append({"step": "apply", "wall_s": round(time.perf_counter() - t, 2), "status": applied,
                 "instances_after": len([i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"]),
                 "peak_rss_mib": round(_rss_mib())})
    rows.append(_plan(cfg, "warm plan", time_limit))
    sim = SimCloud(state_dir(cfg))
    live = [i["id"] for i in sim.instances() if i["state"] != "terminated"]
    for iid in live[:: 20]:  # ~5%
        sim.interrupt(iid)
    rows.append(_plan(cfg, f"drift plan ({len(live[::20])} lost)", time_limit))
    for r in rows:
        r["tier"] = name
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tiers", default="quickstart,1k")
    ap.add_argument("--time-limit", type=float, default=api.DEFAULT_TIME_LIMIT)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    a = ap.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for tier in a.tiers.split(","):
            rows += run_tier(tier, TIERS[tier], a.time_limit, Path(tmp))
            _print(rows[-4:])
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(), "time_limit": a.time_limit}
    a.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{meta}; results in {a.out}")


def _print(rows: list[dict]) -> None:
    cols = ["tier", "step", "wall_s", "solve_s", "status", "gap", "instances_before", "creates", "deletes", "placed", "pending", "cost_after", "peak_rss_mib"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
