"""A fleet config converted from Microsoft's Philly trace (msr-fiddle/philly-traces): its two machine shapes as fixed
pools in two zones, its virtual clusters (VCs) as tenants with guarantees sized from the VC sizes, its jobs running at
one moment as jobs, the multi-machine ones as gangs.

Source (the trace's own cluster_job_log is a 1 GB Git LFS object, absent from every stored snapshot; these are the
public re-publications of its parts that are stored), in bench/data/philly/ (read 2026-12-03):

  philly_machine_shapes.csv  cluster_machine_list of the trace (2017; CC BY 4.0, Jeon et al., "Analysis of Large-Scale
                             Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC '19), as re-published
                             in github.com/Qinghao-Hu/Philly-Trace-Scripts data/cluster_machine_list (commit 2d1478f),
                             counted by shape: 321 machines of 2 x 12 GB GPUs, 231 of 8 x 24 GB (2,490 GPUs)
  philly_vc_nodes.csv        the VC sizes (nodes) the Helios authors derived from the trace for their simulator:
                             github.com/S-Lab-System-Group/HeliosArtifact framework/QSSF Service/data/philly_vc.csv
                             (commit bdaae10, MIT), 11 VCs, 352 nodes
  philly_jobs_day45.csv      the Philly jobs per VC as github.com/abdullahfsm/PCS simulation/traces/trace_<vc>.csv
                             (commit 62a6ca3, MIT) re-publishes them (109,532 jobs of 12 VCs: submit_time in seconds
                             from the VC's first job, num_jobs = the job's GPUs, service = GPU-seconds), keeping the
                             494 jobs running 45 days after their VC's first job (submit <= 45 d < submit +
                             service / GPUs): 1,344 GPUs of 11 VCs; philly_jobs_day46.csv likewise a day on
                             (720 jobs, 1,523 GPUs: 416 of day 45's still running, 304 new), for a replan

Conversion:
- each machine shape is a test type (catalog.json beside the config: the shipped catalog plus these types, nominal
  prices $1/GPU-hour, not a cloud's) in gcp us-central1; the trace names no GPU model (12 GB and 24 GB: P100 and P40
  by Hu et al. 2024), neither is in the catalog and no job names one, so both are V100; nor does it give vCPU or memory:
  6 vCPU and 32 GiB a GPU, nominal;
- the machines of each shape, divided by `node_scale` (default 2: 1,248 GPUs for the 1,344 asked, so VCs contend),
  split evenly over two zones standing in for Philly's racks (a multi-machine job stays in one): one fixed pool (min =
  max) per shape and zone;
- a VC is a tenant; its guarantee is its share of the VC nodes (philly_vc_nodes.csv) of the pools' GPUs, rounded
  down; it may borrow up to every GPU (burst); vCPU and memory are not limited;
- a job of up to 8 GPUs is one replica; a larger one (16 GPUs here) a gang of 8-GPU replicas (`gang: zone`); each
  asks 5 vCPU and 28 GiB a GPU (a replica of 8 fits an 8-GPU machine, of 2 a 2-GPU one); the trace gives no
  priorities: all normal; spot never.

    python -m bench.philly OUT [--node-scale 2] [--check [--then bench/data/philly/philly_jobs_day46.csv]]

--check plans it, checks the plan from outside (check_plan: placements within each machine's GPUs, vCPU and memory,
GPU indices distinct; gangs whole and in one zone; no tenant past its burst; no pending job that fits the room left;
no tenant within its guarantee left pending where a borrower's job holds its room; each pending or evicted job's
reason: its pool counts, its tenant and quota figures, the jobs it names placed for other tenants; the guaranteed tier's claim
against whole jobs within each guarantee; the fair-share tier's value, bound and status against an exact best split of the
borrowed GPUs: fair_share_check), plans again (the same bytes?), applies it to the sim and plans again (nothing to do?); --then
replans a day on against the fleet that apply left and checks that plan the same way.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import Counter
from pathlib import Path

import yaml

from bench.generate import _doc
from providers.catalog import shipped_catalog_text

DATA = Path(__file__).parent / "data" / "philly"
MACHINES = DATA / "philly_machine_shapes.csv"
VCS = DATA / "philly_vc_nodes.csv"
JOBS = DATA / "philly_jobs_day45.csv"
CLOUD, REGION, ZONES = "gcp", "us-central1", ("us-central1-a", "us-central1-b")
PRICE_SOURCE = "philly-test"
GPU_TYPE = "V100"                          # the trace names none (12 GB and 24 GB GPUs); no job asks for one
CPU_PER_GPU, GIB_PER_GPU = 6, 32           # a machine's, per GPU (nominal: the trace gives neither)
JOB_CPU_PER_GPU, JOB_GIB_PER_GPU = 5, 28   # a job's, per GPU


def type_name(gpus: int) -> str:
    return f"philly-{gpus}g"


def machine_shapes(path: Path = MACHINES, node_scale: int = 2) -> dict[int, int]:
    """GPUs per machine -> machines (divided by node_scale, rounded, at least one per zone)."""
    with open(path, newline="") as f:
        return {int(r["gpus"]): max(len(ZONES), round(int(r["machines"]) / node_scale)) for r in csv.DictReader(f)}


def guarantees(shapes: dict[int, int], path: Path = VCS) -> dict[str, int]:
    """VC -> guaranteed GPUs: its share of the VC nodes, of the pools' GPUs, rounded down."""
    with open(path, newline="") as f:
        nodes = {r["vc"]: int(r["node num"]) for r in csv.DictReader(f)}
    gpus = sum(g * n for g, n in shapes.items())
    return {vc: gpus * n // sum(nodes.values()) for vc, n in sorted(nodes.items())}


def replicas_of(gpus: int, per_machine: int = 8) -> tuple[int, int]:
    """(replicas, GPUs each): one replica up to a machine's GPUs, else the fewest equal replicas that fit one."""
    r = 1
    while gpus % r or gpus // r > per_machine:
        r += 1
    return r, gpus // r


def jobs(path: Path, tenants: set[str]) -> tuple[list[dict], Counter]:
    seen, out = Counter(), []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["vc"] not in tenants:
                seen["VC without a size, left out"] += 1
                continue
            r, g = replicas_of(int(row["num_gpus"]))
            spec: dict = {"tenant": row["vc"], "priority": "normal",
                          "resources": {"gpus": g, "gpu_type": GPU_TYPE, "cpu": JOB_CPU_PER_GPU * g, "memory_gib": JOB_GIB_PER_GPU * g},
                          "spot": "never"}
            if r > 1:
                spec.update(replicas=r, gang="zone")
            seen[f"{r} x {g} GPUs"] += 1
            out.append(_doc("Job", f"philly-{row['vc']}-{int(row['app_id']):05d}", spec))
    return out, seen


def catalog(shapes: dict[int, int]) -> dict:
    cat = json.loads(shipped_catalog_text())
    cat["sources"][PRICE_SOURCE] = {"date": "2017-10-03", "what": "test types of the machine shapes of the Philly trace "
                                    "(cluster_machine_list); nominal prices, not a cloud's"}
    types = cat["clouds"][CLOUD]["instance_types"]
    for g in shapes:
        types[type_name(g)] = {"gpus": g, "cpu": CPU_PER_GPU * g, "memory_gib": GIB_PER_GPU * g, "gpu_type": GPU_TYPE,
                               "nvlink_domain": 1, "prices": {REGION: {"on_demand": float(g), "source": PRICE_SOURCE}}}
    return cat


def generate(out: Path, job_rows: Path = JOBS, node_scale: int = 2) -> tuple[Path, Counter]:
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; generate into an empty directory")
    shapes = machine_shapes(MACHINES, node_scale)
    quota = guarantees(shapes)
    total = sum(g * n for g, n in shapes.items())
    body, seen = jobs(job_rows, set(quota))
    pools = []
    for g, n in shapes.items():
        for k, zone in enumerate(ZONES):
            here = n // len(ZONES) + (1 if k < n % len(ZONES) else 0)
            pools.append(_doc("Pool", f"{type_name(g)}-{zone[-1]}", {
                "cloud": CLOUD, "region": REGION, "zones": [zone], "instance_types": [type_name(g)],
                "market": "on-demand", "min_instances": here, "max_instances": here}))
    (out / "jobs").mkdir(parents=True, exist_ok=True)

    def dump(path: Path, items: list[dict]) -> None:
        path.write_text(yaml.safe_dump_all(items, sort_keys=False, default_flow_style=None))

    dump(out / "topology.yaml", [_doc("Topology", "philly", {"clouds": {CLOUD: {"regions": {REGION: {"zones": list(ZONES)}}}}})])
    dump(out / "policies.yaml", [_doc("GuardrailPolicy", "default", {"allowed_regions": [f"{CLOUD}/{REGION}"]})])
    dump(out / "tenants.yaml", [_doc("Tenant", vc, {"weight": 1.0, "quota": {"gpus": q, "burst": {"gpus": total}}})
                                for vc, q in quota.items()])
    dump(out / "pools.yaml", pools)
    dump(out / "jobs" / "jobs.yaml", body)
    (out / "catalog.json").write_text(json.dumps(catalog(shapes), indent=1))
    return out, seen


def check(cfg: Path, time_limit: float) -> dict:
    """Plan twice (the same bytes?), check the plan from outside, apply it to the sim, plan again (nothing to do?)."""
    import time

    from reconciler import api

    from bench.run import gpu_packing

    t, cpu = time.perf_counter(), time.process_time()
    result = api.plan(cfg, time_limit=time_limit)
    first, wall, cpu = result.plan, time.perf_counter() - t, time.process_time() - cpu
    packing = gpu_packing(result)  # greedy best-fit on the same problem, and the project's own bound, beside ours
    again = api.plan(cfg, time_limit=time_limit).plan
    doc = json.loads(first.to_json())
    wrong, figures = check_plan(cfg, doc)
    fair_wrong, fair = fair_share_check(cfg, doc)
    api.apply(cfg, saved_plan=first, time_limit=time_limit, allow_destroy=10**6)
    after = api.plan(cfg, time_limit=time_limit).plan
    return {"wrong": wrong + fair_wrong, **figures, "fair_share": fair, "gpu_bound": gpu_bound(cfg), "status": doc["solver"]["status"],
            "gap": doc["solver"]["gap"], "unproven": first.solver.unproven, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "greedy_gpus_placed": packing["greedy_gpus_placed"], "project_gpu_bound": packing["gpus_bound"],
            "identical": first.to_json() == again.to_json(), "after_apply": after.counts(),
            "after_apply_changes": after.has_changes}


def replan(cfg: Path, job_rows: Path, time_limit: float) -> dict:
    """The trace a day on: the jobs of job_rows replace the config's (a job in both keeps its name, so where it runs it
    stays running), planned against the fleet the last apply left, checked from outside as check() does."""
    from providers.base import TAG_POOL
    from providers.sim import SimCloud
    from reconciler import api
    from reconciler.state import state_dir

    _, tenants, _, _ = read_config(cfg)
    body, _ = jobs(job_rows, set(tenants))
    (cfg / "jobs" / "jobs.yaml").write_text(yaml.safe_dump_all(body, sort_keys=False, default_flow_style=None))
    running = {i["id"]: {**i, "pool": i["tags"].get(TAG_POOL)} for i in SimCloud(state_dir(cfg)).instances()
               if i["state"] == "running"}
    plan = api.plan(cfg, time_limit=time_limit).plan
    again = api.plan(cfg, time_limit=time_limit).plan
    doc = json.loads(plan.to_json())
    (cfg.parent / f"{cfg.name}-replan.json").write_text(plan.to_json())  # beside the config, to read further
    wrong, figures = check_plan(cfg, doc, running)
    fair_wrong, fair = fair_share_check(cfg, doc)
    greedy = json.loads(api.plan(cfg, time_limit=0).plan.to_json())  # greedy's plan of the same replan, its split beside
    return {"wrong": wrong + fair_wrong, **figures, "fair_share": fair, "greedy_fair_share": fair_share_check(cfg, greedy)[1],
            "counts": plan.counts(), "status": doc["solver"]["status"],
            "gap": doc["solver"]["gap"], "unproven": plan.solver.unproven, "identical": plan.to_json() == again.to_json()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.philly", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--check", action="store_true", help="then plan, check the plan from outside, apply, plan again")
    ap.add_argument("--time-limit", type=float, default=20)
    ap.add_argument("--then", type=Path, help="with --check: then replan with these job rows (e.g. philly_jobs_day46.csv)")
    ap.add_argument("--jobs", type=Path, default=JOBS, help="job rows in philly_jobs_day45.csv's form (default: the excerpt)")
    ap.add_argument("--node-scale", type=int, default=2, help="pools hold 1/N of each machine shape (default 2)")
    a = ap.parse_args(argv)
    out, seen = generate(a.out, a.jobs, a.node_scale)
    print(f"{out}: {dict(seen)}")
    if a.check:
        print(json.dumps(check(out, a.time_limit), indent=1))
        if a.then:
            print(json.dumps(replan(out, a.then, a.time_limit), indent=1))



# ---- checked from outside: these read only the config's YAML, its catalog.json and the plan's JSON, never the ledger.

def read_config(cfg: Path) -> tuple[dict, dict, dict, dict]:
    """(jobs, tenants, pools, instance types) of a config as its files say them."""
    docs = [d for f in sorted(Path(cfg).rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    by = {k: {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == k} for k in ("Job", "Tenant", "Pool")}
    types = json.loads((Path(cfg) / "catalog.json").read_text())["clouds"][CLOUD]["instance_types"]
    return by["Job"], by["Tenant"], by["Pool"], types


def fits(room: dict, need: dict) -> bool:
    return all(room[k] >= need[k] for k in ("gpus", "cpu", "memory_gib"))


def check_plan(cfg: Path, plan: dict, running: dict[str, dict] | None = None) -> tuple[list[str], dict]:
    """Every claim of a plan that can be checked from outside, and its figures: wrong claims as sentences (none
    expected), placed GPUs per tenant. running: the instances there are (id -> instance_type, zone, pool), for a plan
    that keeps some."""
    jobs, tenants, pools, types = read_config(cfg)
    wrong: list[str] = []
    inst: dict[str, dict] = {}
    sites = [(c["ref"], c) for c in plan["creates"]] + [(i, (running or {})[i]) for i in plan.get("kept", {})]
    for ref, c in sites:
        t = types[c["instance_type"]]
        inst[ref] = {"type": c["instance_type"], "zone": c["zone"], "pool": c["pool"],
                     "room": {"gpus": t["gpus"], "cpu": t["cpu"], "memory_gib": t["memory_gib"]}, "indices": set()}
    per_pool = Counter(i["pool"] for i in inst.values())
    for name, p in pools.items():
        if not p["min_instances"] <= per_pool[name] <= p["max_instances"]:
            wrong.append(f"pool {name}: {per_pool[name]} instances, outside {p['min_instances']}..{p['max_instances']}")
    placed, pending = Counter(), []
    for j in plan["jobs"]:
        spec = jobs[j["job"]]
        need = {k: spec["resources"][k] for k in ("gpus", "cpu", "memory_gib")}
        r = spec.get("replicas", 1)
        if j["action"] in ("pending", "evict"):
            if j["instances"]:
                wrong.append(f"{j['job']}: {j['action']} yet on {j['instances']}")
            pending.append((j, spec, need, r))
            continue
        if len(j["instances"]) != r:
            wrong.append(f"{j['job']}: {len(j['instances'])} of its {r} replicas placed (a gang is all or nothing)")
        if len({inst[i]["zone"] for i in j["instances"]}) > 1:
            wrong.append(f"{j['job']}: gang over zones {sorted({inst[i]['zone'] for i in j['instances']})}")
        for i, idx in zip(j["instances"], j["gpus"] or [()] * r, strict=True):
            h = inst[i]
            if types[h["type"]].get("gpu_type") != spec["resources"].get("gpu_type"):
                wrong.append(f"{j['job']}: on {i}, a {types[h['type']].get('gpu_type')} instance")
            h["room"] = {k: h["room"][k] - need[k] for k in need}
            if len(idx) != need["gpus"] or h["indices"] & set(idx) or any(not 0 <= g < types[h["type"]]["gpus"] for g in idx):
                wrong.append(f"{j['job']}: GPU indices {idx} on {i} (taken: {sorted(h['indices'])})")
            h["indices"] |= set(idx)
        placed[spec["tenant"]] += need["gpus"] * r
    for i, h in inst.items():
        if any(v < 0 for v in h["room"].values()):
            wrong.append(f"instance {i} ({h['type']}) overcommitted: room left {h['room']}")
    for t, spec in tenants.items():
        burst = spec.get("quota", {}).get("burst", {}).get("gpus")
        if burst is not None and placed[t] > burst:
            wrong.append(f"tenant {t}: {placed[t]} GPUs placed, over its burst {burst}")
    guaranteed = {t: s.get("quota", {}).get("gpus", 0) for t, s in tenants.items()}
    ran_before = Counter()  # GPUs each tenant ran before the plan
    for j in plan["jobs"]:
        if j.get("previous"):
            spec = jobs[j["job"]]
            ran_before[spec["tenant"]] += spec["resources"]["gpus"] * spec.get("replicas", 1)
    placed_names = {j["job"] for j in plan["jobs"] if j["action"] not in ("pending", "evict")}
    placed_jobs: dict[str, list[str]] = {}
    for j in plan["jobs"]:
        if j["action"] not in ("pending", "evict"):
            for i in j["instances"]:
                placed_jobs.setdefault(i, []).append(j["job"])
    borrowers = {t for t in tenants if placed[t] > guaranteed[t]}
    limit = {t: s.get("quota", {}).get("burst", {}).get("gpus", s.get("quota", {}).get("gpus")) for t, s in tenants.items()}
    for j, spec, need, r in pending:
        t = spec["tenant"]
        quota = _quota_figures(j.get("reason", ""))
        for who, used, cap, more in quota:
            if who != t or int(used) != placed[t] or int(cap) != limit[t] or int(more) != need["gpus"] * r or \
                    placed[t] + need["gpus"] * r <= limit[t]:
                wrong.append(f"{j['job']}: reason says tenant {who} uses {used}/{cap} GPUs and needs {more} more; it places "
                             f"{placed[t]} of {limit[t]}, the job asks {need['gpus'] * r}")
        for zone in {h["zone"] for h in inst.values()} if not quota else ():
            free = sum(fits(h["room"], need) for h in inst.values() if h["zone"] == zone) if r > 1 else 0
            if r > 1 and free >= r or r == 1 and any(fits(h["room"], need) for h in inst.values() if h["zone"] == zone):
                wrong.append(f"{j['job']} pending, yet it fits the room left in {zone}")
        if placed[t] + need["gpus"] * r <= guaranteed[t]:
            # within its guarantee: no borrower's job (one whose going leaves its tenant at or above its guarantee) may
            # hold room it could run in (a gang: room for each replica on as many instances of one zone; each instance
            # counted alone, so two that need the same borrower's excess twice would be named too: look closer then)
            reclaimable = Counter()
            for i, h in inst.items():
                room = dict(h["room"])
                for k in placed_jobs.get(i, ()):
                    o = jobs[k]
                    if o["tenant"] in borrowers and placed[o["tenant"]] - o["resources"]["gpus"] * o.get("replicas", 1) >= \
                            guaranteed[o["tenant"]]:
                        room = {x: room[x] + o["resources"][x] for x in room}
                if fits(room, need):
                    reclaimable[h["zone"]] += 1
            if any(n >= r for n in reclaimable.values()):
                wrong.append(f"{j['job']} of {t} ({placed[t]} of its guaranteed {guaranteed[t]} GPUs) pending while "
                             f"borrowed work holds room for it in {sorted(z for z, n in reclaimable.items() if n >= r)}")
        reason = j.get("reason", "")
        for who, ran, owed in _eviction_figures(reason):
            if ran_before[who] != int(ran) or guaranteed.get(who) != int(owed) or int(ran) <= int(owed):
                wrong.append(f"{j['job']}: reason says tenant {who} ran {ran} GPUs, above its guaranteed {owed}; it ran "
                             f"{ran_before[who]}, its guarantee is {guaranteed.get(who)}")
        for name in _named_jobs(reason):
            if name not in placed_names or jobs[name]["tenant"] == t:
                wrong.append(f"{j['job']}: reason names {name}, which the plan does not place for another tenant")
        for who, runs, owed in _tenant_figures(reason):
            if placed[who] != int(runs) or guaranteed.get(who) != int(owed):
                wrong.append(f"{j['job']}: reason says tenant {who} runs {runs} GPUs of its guaranteed {owed}; the plan "
                             f"places {placed[who]}, its guarantee is {guaranteed.get(who)}")
        for name, got, mx in _pools_at_max(reason):
            if name not in pools or per_pool[name] != int(got) or int(mx) != pools[name]["max_instances"]:
                wrong.append(f"{j['job']}: reason says {name} {got}/{mx}; the plan has {per_pool.get(name)} of max "
                             f"{pools.get(name, {}).get('max_instances')}")
    asked: dict[str, list[int]] = {}
    for spec in jobs.values():
        asked.setdefault(spec["tenant"], []).append(spec["resources"]["gpus"] * spec.get("replicas", 1))
    bound = sum(most_within(asked.get(t, []), g) for t, g in guaranteed.items())
    # the guaranteed tier's work is 7 units a GPU x priority 10 (every job here is normal): no more than whole jobs fit
    claimed = sum(t["value"] for t in plan.get("solver", {}).get("tiers", []) if t["name"] == "guaranteed normal work") / 70
    if claimed > bound:
        wrong.append(f"the guaranteed tier claims {claimed:g} GPUs; whole jobs within the guarantees hold {bound}")
    return wrong, {"placed": dict(placed), "pending": len(pending), "guaranteed": guaranteed,
                   "gpus_placed": sum(placed.values()), "guaranteed_claimed": claimed, "guaranteed_bound": bound,
                   "burst_bound": sum(most_within(asked.get(t, []), c) for t, c in limit.items() if c is not None)}


FAIR_TIER = "fair share of borrowed capacity"
SEGMENTS = 20  # README, Tenants: the fair share's concave utility has 20 steps, of per-mille shares over weights


def fair_utility(share: int, weight: float, step: int) -> int:
    """The README's weighted DRF utility of one tenant's borrowed share (whole per mille): its share over its weight
    (hundredths) in SEGMENTS steps of `step`, the last taking the rest, the k-th worth weight x (SEGMENTS - k) a per
    mille."""
    w = max(1, round(weight * 100))
    left, value = 100 * share // w, 0
    for k in range(SEGMENTS):
        take = max(0, left if k == SEGMENTS - 1 else min(step, left))
        value += w * (SEGMENTS - k) * take
        left -= take
    return value


def fair_step(cap: int, guarantee: dict[str, float], asked: dict[str, list[int]], reach: dict[str, float],
              weight: dict[str, float]) -> int:
    """README, Tenants: the utility's step, per mille of share / weight: twice the level the borrowers reach when the
    GPUs the guarantees do not hold of what each tenant asks (cap - each tenant's GPUs asked up to its guarantee) are
    water-filled over them (each up to `reach`, per mille: its GPUs asked up to its room), in SEGMENTS steps."""
    from reconciler.ledger import fair_share_level

    free = 1000 * max(0, cap - sum(min(sum(asked[t]), g) for t, g in guarantee.items())) / cap
    level = fair_share_level([(min(r, free), weight[t]) for t, r in reach.items()], free)
    return max(1, math.ceil(2 * level / SEGMENTS))


def fair_share_check(cfg: Path, plan: dict) -> tuple[list[str], dict]:
    """The fair-share tier of borrowed capacity checked from outside (README, Tenants: each borrowing tenant's GPUs
    above its guarantee, as whole per mille of the pools' GPUs, at most its room and its jobs, through the concave
    utility): the value the plan's placements give, the guaranteed split being the one its guaranteed tier holds (the
    most whole placed jobs within each guarantee: `most_within`); an exact best value with that tier held (a knapsack
    over tenants of the borrowed GPUs the held guarantees leave: cap - guaranteed GPUs claimed, each tenant at most the
    GPUs it asks, packing ignored, so never below the true best); and a max-min water-filling of the same borrowed GPUs
    over the tenants' own job sizes (the fairest split whole jobs allow, as a reference). Wrong: a claimed value other
    than the placements give; a bound below the value; a value above the exact best. Proven below the exact best is no
    contradiction (the best ignores packing, job sizes and the held tiers: at steps of a few per mille it is loose) but
    a `look_closer` note."""
    jobs, tenants, pools, types = read_config(cfg)
    cap = sum(types[p["instance_types"][0]]["gpus"] * p["max_instances"] for p in pools.values())
    tier = next((t for t in plan.get("solver", {}).get("tiers", []) if t["name"] == FAIR_TIER), None)
    guarantee = {t: s.get("quota", {}).get("gpus", 0) for t, s in tenants.items()}
    burst = {t: s.get("quota", {}).get("burst", {}).get("gpus", guarantee[t]) for t, s in tenants.items()}
    asked: dict[str, list[int]] = {t: [] for t in tenants}
    placed: dict[str, list[int]] = {t: [] for t in tenants}
    for j in plan["jobs"]:
        spec = jobs[j["job"]]
        n = spec["resources"]["gpus"] * spec.get("replicas", 1)
        asked[spec["tenant"]].append(n)
        if j["action"] not in ("pending", "evict"):
            placed[spec["tenant"]].append(n)
    borrowers = [t for t in tenants if burst[t] > guarantee[t] and asked[t]]
    weight = {t: tenants[t].get("weight", 1.0) for t in tenants}
    quota_gpus = {t: s.get("quota", {}).get("gpus", math.inf) for t, s in tenants.items()}  # (none: all guaranteed)
    step = fair_step(cap, quota_gpus, asked, {t: 1000 * min(sum(asked[t]), burst[t] - guarantee[t]) / cap for t in borrowers},
                     weight)
    top = {t: min(1000, 1000 * min(sum(asked[t]), burst[t] - guarantee[t]) // cap) for t in borrowers}

    def value(t: str, gpus: int) -> int:
        return fair_utility(min(top[t], 1000 * gpus // cap), weight[t], step)

    kept = {t: most_within(placed[t], guarantee[t]) for t in tenants}
    borrowed = {t: sum(placed[t]) - kept[t] for t in borrowers}
    emitted = sum(value(t, b) for t, b in borrowed.items()) if len(borrowers) > 1 else 0
    claimed_guaranteed = sum(t["value"] for t in plan.get("solver", {}).get("tiers", []) if t["name"] == "guaranteed normal work") / 70
    # the GPUs borrowed work may hold beside the guaranteed tier held (a plan without tiers, greedy's: its own split)
    held = round(claimed_guaranteed) if tier is not None else sum(kept.values())
    room = cap - held
    best = [0] + [-1] * room  # best[x]: the most utility of x borrowed GPUs over the tenants so far
    for t in borrowers:
        most = min(room, sum(asked[t]))
        best = [max((best[x - b] + value(t, b) for b in range(min(x, most) + 1) if best[x - b] >= 0), default=-1)
                for x in range(room + 1)]
    exact = max(best) if len(borrowers) > 1 else 0
    fill = water_fill(room, {t: beyond(asked[t], placed[t], kept[t]) for t in borrowers}, kept, burst, weight)
    figures = {"borrowed": {t: b for t, b in borrowed.items() if b}, "room": room, "emitted": emitted, "exact_best": exact,
               "water_fill": {t: b for t, b in fill.items() if b},
               "water_fill_value": sum(value(t, b) for t, b in fill.items()) if len(borrowers) > 1 else 0,
               "split_held": sum(kept.values()) == held}
    wrong: list[str] = []
    if tier is None:  # (greedy's plan, or one borrower: no claim)
        return wrong, figures
    figures.update(claimed=tier["value"], bound=tier["bound"], proven=tier["proven"], bound_valid=tier["bound"] >= exact)
    if figures["split_held"] and tier["value"] != emitted:
        wrong.append(f"the fair-share tier claims {tier['value']}; the plan's borrowed GPUs {figures['borrowed']} give {emitted}")
    if tier["bound"] < tier["value"]:
        wrong.append(f"the fair-share tier's bound {tier['bound']} is below its value {tier['value']}")
    if tier["value"] > exact:
        wrong.append(f"the fair-share tier claims {tier['value']}; no split of the {room} borrowed GPUs reaches more than {exact}")
    if tier["proven"] and tier["value"] < exact:
        figures["look_closer"] = f"the fair-share tier claims {tier['value']} proven; {exact} with packing ignored"
    return wrong, figures


def water_fill(room: int, sizes: dict[str, list[int]], kept: dict[str, int], burst: dict[str, int],
               weight: dict[str, float]) -> dict[str, int]:
    """Max-min fair borrowed GPUs over whole jobs, packing ignored: while `room` lasts, the tenant borrowing least over
    its weight takes its next smallest job (of `sizes`, those outside its guaranteed part `kept`) that fits the room and
    its burst; a tenant none of whose jobs fits drops out."""
    from reconciler.ledger import share_weight

    left = {t: sorted(s) for t, s in sizes.items()}
    borrowed = {t: 0 for t in sizes}
    live = set(sizes)
    while live:
        t = min(live, key=lambda t: (borrowed[t] / share_weight(weight[t]), t))
        fit = next((n for n in left[t] if n <= room and kept[t] + borrowed[t] + n <= burst[t]), None)
        if fit is None:
            live.discard(t)
            continue
        left[t].remove(fit)
        room -= fit
        borrowed[t] += fit
    return borrowed


def beyond(asked: list[int], placed: list[int], kept: int) -> list[int]:
    """The job sizes of `asked` left once placed jobs summing to `kept` (its guaranteed part) are set aside."""
    reach = {0: []}
    for i, n in enumerate(placed):
        for s, used in list(reach.items()):
            if s + n <= kept and s + n not in reach:
                reach[s + n] = used + [i]
    rest = list(asked)
    for i in reach.get(kept, []):
        rest.remove(placed[i])
    return rest


def most_within(sizes: list[int], cap: int) -> int:
    """The largest sum of whole jobs no more than cap (a tenant's guaranteed GPUs no plan can fill further)."""
    sums = 1
    for s in sizes:
        sums |= sums << s
    sums &= (1 << (cap + 1)) - 1
    return sums.bit_length() - 1


def _pools_at_max(reason: str) -> list[tuple[str, str, str]]:
    """("pool", "n", "max") of "pools at max_instances (a 1/1, b 2/2)"."""
    import re

    m = re.search(r"pools at max_instances \(([^)]*)\)", reason)
    return re.findall(r"([\w.-]+) (\d+)/(\d+)", m.group(1)) if m else []


def _tenant_figures(reason: str) -> list[tuple[str, str, str]]:
    """("tenant", "runs", "guaranteed") of "(tenant b runs 8 GPUs, its guaranteed 8, ..." in a pending reason."""
    import re

    return re.findall(r"tenant ([\w-]+) runs (\d+) GPUs, its guaranteed (\d+)", reason)


def _quota_figures(reason: str) -> list[tuple[str, str, str, str]]:
    """("tenant", "used", "limit", "more") of "quota exhausted: tenant b uses 14/16 GPUs in this plan, the job needs 4
    more" (the GPUs only: this fleet limits nothing else)."""
    import re

    return re.findall(r"quota exhausted: tenant ([\w-]+) uses (\d+)/(\d+) GPUs in this plan, the job needs (\d+) more", reason)


def _eviction_figures(reason: str) -> list[tuple[str, str, str]]:
    """("tenant", "ran", "guaranteed") of "(tenant b ran 16 GPUs, above its guaranteed 8: ..." in an eviction's reason."""
    import re

    return re.findall(r"tenant ([\w-]+) ran (\d+) GPUs, above its guaranteed (\d+)", reason)


def _named_jobs(reason: str) -> list[str]:
    """The jobs "...within their guarantees: a-00, a-01 and 5 more)" names (the first few; "and N more" is not a name)."""
    import re

    m = re.search(r"within their guarantees(?:, [^:)]*)?: ([^)]*)\)", reason)
    if not m:
        return []
    names = re.split(r", | and ", m.group(1))
    return [n for n in names if n and not re.fullmatch(r"\d+ more", n)]


def gpu_bound(cfg: Path) -> int:
    """GPUs no packing of the config's fixed pools places more of: the GPUs asked, the pools' GPUs, and replicas larger
    than the small machines only on the large ones (each count of GPUs alone)."""
    jobs, _, pools, types = read_config(cfg)
    cap = Counter()
    for p in pools.values():
        cap[types[p["instance_types"][0]]["gpus"]] += types[p["instance_types"][0]]["gpus"] * p["max_instances"]
    small = min(cap)
    asked_big = sum(j["resources"]["gpus"] * j.get("replicas", 1) for j in jobs.values() if j["resources"]["gpus"] > small)
    asked = sum(j["resources"]["gpus"] * j.get("replicas", 1) for j in jobs.values())
    return min(asked, sum(cap.values()), min(asked_big, sum(v for g, v in cap.items() if g > small)) + (asked - asked_big))


if __name__ == "__main__":
    main()
