"""A fleet config converted from Alibaba's cluster-trace-gpu-v2025 (GPU-disaggregated DLRM serving): one day's GPU
inference instances as jobs of 91 tenants (the trace's services) with guarantees and burst caps sized from the trace's
own history, on pools the plan buys from the shipped catalog.

Source: github.com/alibaba/clusterdata, cluster-trace-gpu-v2025/disaggregated_DLRM_trace.csv (commit 358ef992,
2025-04-11; Yang et al., "GPU-Disaggregated Serving for Deep Learning Recommendation Models at Scale", USENIX NSDI '25).
The repository gives no licence for this trace; its README lets anyone use the traces "for research or study
purpose". Excerpt in bench/data/dlrm/ (read 2026-12-03):

  dlrm_hn_every3rd_days0-14.csv  of the trace's 23,871 instances, the 7,386 HN (GPU node) ones, every 3rd by instance
                                 number (instance_N, N divisible by 3), alive at some time in days 0-14: 1,452 rows;
                                 columns as the trace's (its CN, rdma and disk columns, and scheduled_time, dropped)

Why this trace: of the candidates with tenants and gangs, none has its data in a stored snapshot (cluster-trace-gpu-v2020
and msr-fiddle/philly-traces are Git LFS pointers, over quota; S-Lab HeliosData holds only the Venus VCs' GPU counts).
This one is whole in the alibaba/clusterdata snapshot and differs from openb (bench/openb.py) in every axis that
matters here: many tenants instead of one, history to size their quotas from, and no cluster: the fleet buys.

Conversion:
- a job is an HN instance alive on day 14 (created at or before 14 x 86,400 s, or before the trace, and not deleted by
  then): 1 GPU, its cpu_request vCPU and memory_request GiB; the trace names no GPU model: A10G (aws g5, the catalog's
  inference GPU nearest the A10 Alibaba serves on); priority normal for all (the trace's instances are all LS: one
  class); spot never;
- a tenant is a service (app_name) with a job; its guarantee is its day-0 GPUs scaled to the fleet's GPU ceiling (its
  share of day 0, floored), its burst cap the most GPUs it ran at any day boundary of days 0-13 (at least its guarantee,
  and at least 1): services that grew by day 14 borrow, and those that grew past their two-week peak wait at the cap;
- pools: aws us-east-1a, on-demand, min 0: 1-GPU g5 (2x/4x/8x/16xlarge), 4-GPU (12x, 24xlarge), 8-GPU (48xlarge),
  max_instances holding 50% / 20% / 15% of the GPUs asked for (CAPACITY_SHARE 85% in all), priced by the shipped
  catalog: the plan chooses what to buy and who waits;
- left out: max_instance_per_node (the trace's spread limit per service: the YAML has no per-instance spread rule, so
  a plan may put more of a service on one instance than the trace allows); gangs: the trace's instances are
  independent replicas of a service, none needs another.

    python -m bench.dlrm OUT [--csv EXCERPT] [--day 14]
    python -m bench.dlrm OUT --day 15 --pools-day 14 --replace   # the next day's instances on the fleet day 14 bought
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import Counter
from pathlib import Path

import yaml

from bench.generate import _doc

DATA = Path(__file__).parent / "data" / "dlrm"
EXCERPT = DATA / "dlrm_hn_every3rd_days0-14.csv"
DAY = 86_400
SNAPSHOT_DAY = 14
CLOUD, REGION, ZONE = "aws", "us-east-1", "us-east-1a"
GPU_TYPE = "A10G"
FLEET = "dlrm"
CAPACITY_SHARE = 0.85
# pool -> (instance types, GPUs per instance, share of the GPUs asked for)
POOLS = {"g5-1gpu": (["g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.16xlarge"], 1, 0.50),
         "g5-4gpu": (["g5.12xlarge", "g5.24xlarge"], 4, 0.20),
         "g5-8gpu": (["g5.48xlarge"], 8, 0.15)}


def _alive(r: dict, t: float) -> bool:
    """An instance runs at t: created at or before it (or before the trace: no creation_time) and not yet deleted."""
    made, gone = r["creation_time"], r["deletion_time"]
    return (not made or float(made) <= t) and (not gone or float(gone) > t)


def _name(s: str) -> str:
    return s.replace("_", "-")


def read(path: Path = EXCERPT) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def pool_ceilings(gpus_asked: int) -> dict[str, int]:
    """max_instances of each pool: its share of CAPACITY_SHARE of the GPUs asked for, in whole instances."""
    return {p: max(1, math.ceil(share * gpus_asked / per)) for p, (_, per, share) in POOLS.items()}


def tenants(rows: list[dict], jobs_of: Counter, ceiling_gpus: int, day: int = SNAPSHOT_DAY) -> dict[str, dict]:
    """app -> quota: the day-0 share of the fleet's GPU ceiling guaranteed, the peak of days 0..day-1 as burst cap."""
    day0 = Counter(r["app_name"] for r in rows if _alive(r, 0))
    total0 = sum(day0.values())
    peak: Counter = Counter()
    for d in range(day):
        for app, n in Counter(r["app_name"] for r in rows if _alive(r, d * DAY)).items():
            peak[app] = max(peak[app], n)
    out = {}
    for app in sorted(jobs_of):
        g = math.floor(day0[app] * ceiling_gpus / total0) if total0 else 0
        out[app] = {"gpus": g, "burst": {"gpus": max(g, peak[app], 1)}}
    return out


def generate(out: Path, path: Path = EXCERPT, day: int = SNAPSHOT_DAY, pools_day: int | None = None,
             replace: bool = False) -> tuple[Path, Counter]:
    """`pools_day`: size the pools by that day's GPUs instead (a later day's jobs on the fleet an earlier day bought);
    `replace`: write over a config made before (its .reconcile/ and status/ kept: the same fleet, a new day)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not replace:
        raise FileExistsError(f"{out} is not empty; generate into an empty directory")
    rows = read(path)
    live = [r for r in rows if _alive(r, day * DAY)]
    seen = Counter({"HN instances alive on the day": len(live)})
    jobs_of = Counter(r["app_name"] for r in live)
    asked = sum(int(r["gpu_request"]) for r in live)
    ceilings = pool_ceilings(asked if pools_day is None else sum(int(r["gpu_request"]) for r in rows if _alive(r, pools_day * DAY)))
    ceiling_gpus = sum(POOLS[p][1] * n for p, n in ceilings.items())
    quotas = tenants(rows, jobs_of, ceiling_gpus, day)
    jobs = [_doc("Job", f"dlrm-{_name(r['instance_sn'])}", {
        "tenant": _name(r["app_name"]), "priority": "normal", "spot": "never",
        "resources": {"gpus": int(r["gpu_request"]), "gpu_type": GPU_TYPE, "cpu": float(r["cpu_request"]),
                      "memory_gib": float(r["memory_request"])}}) for r in live]
    pools = [_doc("Pool", p, {"cloud": CLOUD, "region": REGION, "zones": [ZONE], "instance_types": types,
                              "market": "on-demand", "min_instances": 0, "max_instances": ceilings[p]})
             for p, (types, _, _) in POOLS.items()]
    if replace:
        for old in (out / "jobs").glob("*.yaml"):
            old.unlink()
    (out / "jobs").mkdir(parents=True, exist_ok=True)

    def dump(p: Path, items: list[dict]) -> None:
        p.write_text(yaml.safe_dump_all(items, sort_keys=False, default_flow_style=None))

    dump(out / "topology.yaml", [_doc("Topology", FLEET, {"clouds": {CLOUD: {"regions": {REGION: {"zones": [ZONE]}}}}})])
    dump(out / "policies.yaml", [_doc("GuardrailPolicy", "default", {"allowed_regions": [f"{CLOUD}/{REGION}"]})])
    dump(out / "tenants.yaml", [_doc("Tenant", _name(a), {"weight": 1.0, "quota": q}) for a, q in quotas.items()])
    dump(out / "pools.yaml", pools)
    for k in range(0, len(jobs), 500):
        dump(out / "jobs" / f"jobs-{k // 500:03d}.yaml", jobs[k:k + 500])
    seen.update({"tenants": len(quotas), "GPUs asked": asked, "GPU ceiling": ceiling_gpus,
                 "GPUs guaranteed": sum(q["gpus"] for q in quotas.values()),
                 "tenants above their burst cap": sum(jobs_of[a] > q["burst"]["gpus"] for a, q in quotas.items()),
                 "tenants above their guarantee": sum(jobs_of[a] > q["gpus"] for a, q in quotas.items())})
    return out, seen


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.dlrm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--csv", type=Path, default=EXCERPT, help="HN rows in the excerpt's CSV form (default: the excerpt)")
    ap.add_argument("--day", type=int, default=SNAPSHOT_DAY, help="the day whose instances are the jobs (default 14)")
    ap.add_argument("--pools-day", type=int, help="size the pools by this day's GPUs (default: --day's)")
    ap.add_argument("--replace", action="store_true", help="write over a config made before, keeping its fleet state")
    a = ap.parse_args(argv)
    out, seen = generate(a.out, a.csv, a.day, a.pools_day, a.replace)
    print(f"{out}: {dict(seen)}")


if __name__ == "__main__":
    main()
