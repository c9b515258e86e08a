"""End-to-end `reconcile plan` time for a pull request's change to an applied fleet (issue 20.3).

    python -m bench.pr_plan [--dir DIR] [--jobs 5000 --reserve 10000] [--repeat 2] [--age-hours H]

Each row is one `reconcile plan DIR` process, timed from its start to its exit (wall) and by the
CPU it used (user + system, from the OS: what the process would take on an idle core), against a
fleet that was applied on the simulated cloud:

  no change      the applied config as it is (first with an empty parse cache and plan memo, then with
                 them: a plan read back from the memo says so, and the row is marked "memo")
  no change, --no-memo   solved again all the same
  add a job      one new 1-GPU job in a new file (what a PR adding a job does)
  remove a job   the last job of the last jobs file taken out
  change a job   one job's priority changed
  raise a job    a running normal job's GPUs raised from 1 to 2 T4s (its tenant at its GPU quota: the new shape
                 needs a lower job of its tenant to stop; README "Stability": it restarts in its new shape)

Every change is undone after its row. Without --dir the fleet is generated (bench.generate, the
run.py `10k` tier: 5,000 jobs on ~11,700 instances) and applied with api.apply of its cold plan,
which takes minutes; with --dir an applied config is reused (its .reconcile/ holds the sim). Targets
(issue 20.3): one changed job < 1 s, no change < 0.7 s, end to end.

--age-hours H moves the sim's instance launch times H hours back first (in DIR's .reconcile/sim/, for
good): a fleet that has run that long. Running jobs are ranked by when they are expected to end, which the
clock does not move (reconciler/memo.py), so the plan memo serves a no-change plan at any age; the option
remains to check that (the generated jobs expect 4, 24 or 72 h: --age-hours 96 puts every one past it).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ADDED = """apiVersion: fleetops.io/v1alpha1
kind: Job
metadata: {name: pr-added-job}
spec:
  tenant: team-0
  priority: normal
  resources: {gpus: 1, gpu_type: A10G, cpu: 2, memory_gib: 16}
  spot: eligible
"""


def _reconcile() -> str:
    exe = Path(sys.executable).with_name("reconcile")
    return str(exe) if exe.exists() else "reconcile"


def timed_plan(cfg: Path, time_limit: float, *extra: str) -> dict:
    """One `reconcile plan` process: wall seconds, CPU seconds (user + system) and its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run([_reconcile(), "plan", str(cfg), "--detailed-exitcode", "--time-limit", str(time_limit), *extra],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = next((line for line in p.stdout.splitlines() if line.startswith("Plan:")), p.stderr.strip()[-200:])
    memo = " (memo)" if "plan-memo.json" in p.stderr else ""
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": p.returncode, "summary": summary + memo}


def raised(text: str, cfg: Path) -> str | None:
    """`text` (a jobs file) with its first running normal 1-T4 job raised to 2 T4s (None: it has none)."""
    import json

    running = json.loads((cfg / ".reconcile" / "state.json").read_text()).get("placements", {})
    docs = text.split("\n---\n")
    for i, doc in enumerate(docs):
        name = re.search(r"name: ([\w-]+)", doc)
        if name and name.group(1) in running and "priority: normal" in doc and "resources: {gpus: 1, gpu_type: T4," in doc:
            docs[i] = doc.replace("resources: {gpus: 1, gpu_type: T4,", "resources: {gpus: 2, gpu_type: T4,")
            return "\n---\n".join(docs)
    return None


def age_sim(cfg: Path, hours: float) -> int:
    """Move every sim instance's launch time `hours` back (snapshot and journal); how many were moved."""
    from datetime import datetime, timedelta

    moved = 0

    def back(m: re.Match) -> str:
        nonlocal moved
        moved += 1
        return f'"launched_at":"{(datetime.fromisoformat(m.group(1)) - timedelta(hours=hours)).isoformat()}"'

    for name in ("cloud.json", "cloud.journal"):
        f = cfg / ".reconcile" / "sim" / name
        if f.exists():
            f.write_text(re.sub(r'"launched_at":"([^"]+)"', back, f.read_text()))
    return moved


def applied_fleet(work: Path, jobs: int, reserve: int, seed: int) -> Path:
    from bench.generate import generate
    from reconciler import api

    cfg = work / "fleet"
    generate(cfg, jobs, seed, reserve=reserve)
    cold = api.plan(cfg)
    api.apply(cfg, saved_plan=cold.plan, allow_destroy=10**6)
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="an applied config dir to reuse (its sim fleet is in .reconcile/)")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--reserve", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2, help="plans per row (the table shows each)")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--age-hours", type=float, default=0.0, help="move the sim's launch times back this much first")
    a = ap.parse_args(argv)
    if a.dir is None:
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="bench-pr-"))
        print(f"generating and applying {a.jobs} jobs (+{a.reserve} kept warm) in {work} ...", flush=True)
        cfg = applied_fleet(work, a.jobs, a.reserve, a.seed)
    else:
        cfg = a.dir
    if a.age_hours:
        print(f"moved {age_sim(cfg, a.age_hours)} launch times {a.age_hours:g} h back", flush=True)
    jobs_dir = cfg / "jobs"
    last = max(jobs_dir.glob("*.yaml"))
    original = last.read_text()
    rows: list[tuple[str, dict]] = []

    def measure(step: str, *extra: str) -> None:
        for _ in range(a.repeat):
            r = timed_plan(cfg, a.time_limit, *extra)
            rows.append((step, r))
            print(f"{step}: wall {r['wall_s']} s, cpu {r['cpu_s']} s, exit {r['exit']}: {r['summary']}", flush=True)

    try:
        shutil.rmtree(cfg / ".reconcile" / "cache", ignore_errors=True)
        r = timed_plan(cfg, a.time_limit)
        rows.append(("no change, empty parse cache", r))
        print(f"no change, empty parse cache: wall {r['wall_s']} s, cpu {r['cpu_s']} s, exit {r['exit']}: {r['summary']}", flush=True)
        measure("no change")
        measure("no change, --no-memo", "--no-memo")
        (jobs_dir / "pr-added.yaml").write_text(ADDED)
        measure("add a job")
        os.unlink(jobs_dir / "pr-added.yaml")
        docs = original.split("\n---\n")
        last.write_text("\n---\n".join(docs[:-1]) + "\n")
        measure("remove a job")
        last.write_text(original)
        changed = original.replace("priority: low", "priority: critical", 1)
        assert changed != original, f"no low-priority job in {last} to change"
        last.write_text(changed)
        measure("change a job")
        bigger = raised(original, cfg)
        if bigger is None:
            print(f"raise a job: no running normal 1-T4 job in {last}, not measured", flush=True)
        else:
            last.write_text(bigger)
            measure("raise a job")
    finally:
        last.write_text(original)
        if (jobs_dir / "pr-added.yaml").exists():
            os.unlink(jobs_dir / "pr-added.yaml")
    print("\n| change | wall s | CPU s | exit | plan |\n|---|---|---|---|---|")
    for step, r in rows:
        print(f"| {step} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['exit']} | {r['summary']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
