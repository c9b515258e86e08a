"""Checks a plan of a bench.dlrm fleet from outside the planner: reads only the config's YAML, the shipped catalog's
instance types and the plan JSON, and uses none of the reconciler's rules (so a wrong rule there cannot hide here).

What it checks (each a list of violations, empty when the plan holds):
  capacity    every instance bought: its jobs' GPUs, vCPU and memory within its type's, GPU model its type's, GPU
              indices distinct and on the instance; each pool's instances within max_instances and of its types
  quotas      no tenant runs more GPUs than its burst cap
  guarantees  no tenant under its guarantee waits while a borrower (a tenant above its guarantee) runs a job whose
              room, with what is left beside it, would hold the waiting job
  pending     no pending job, its tenant below its cap, fits the room left on any instance, or a pool below its max
  reasons     each pending reason's numbers: the pools it names at max_instances are exactly those whose types hold
              the job, each at its max; the tenant's GPUs and guarantee as the plan has them; the jobs it names as
              guaranteed work are placed, of other tenants, within their guarantees
and bounds: an LP (GLOP) of the most GPUs any plan places (jobs fractionally onto instance types, pool ceilings and
burst caps kept) and, at that many GPUs, the least cost; and a best-fit-decreasing baseline with the same rules.

    python -m bench.dlrm_check CONFIG PLAN.json
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import yaml

DIMS = ("gpus", "cpu", "memory_gib")


def load_config(cfg: Path) -> dict:
    files = [f for f in sorted(Path(cfg).rglob("*.yaml")) if f.relative_to(cfg).parts[0] != "status"
             and not any(p.startswith(".") for p in f.relative_to(cfg).parts)]  # apply's output, not config
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    by = defaultdict(dict)
    for d in docs:
        by[d["kind"]][d["metadata"]["name"]] = d["spec"]
    from providers.catalog import shipped_catalog_text  # the catalog's data only

    types = json.loads(shipped_catalog_text())["clouds"]["aws"]["instance_types"]
    return {"jobs": by["Job"], "pools": by["Pool"], "tenants": by["Tenant"], "types": types}


def _req(job: dict) -> dict:
    r = job["resources"]
    return {"gpus": r.get("gpus", 0), "cpu": r["cpu"], "memory_gib": r["memory_gib"]}


def _holds(room: dict, need: dict) -> bool:
    return all(room[k] + 1e-9 >= need[k] for k in DIMS)


def _type_holds(t: dict, job: dict) -> bool:
    return t.get("gpu_type") == job["resources"].get("gpu_type") and _holds({k: t[k] for k in DIMS}, _req(job))


def _guarantee(ten: dict) -> int:
    return (ten.get("quota") or {}).get("gpus") or 0


def _cap(ten: dict) -> float:
    q = ten.get("quota") or {}
    b = (q.get("burst") or {}).get("gpus")
    return b if b is not None else q.get("gpus", float("inf"))


def sim_instances(cfg: Path) -> dict[str, dict]:
    """The sim cloud's running instances of the fleet (id -> instance_type, pool): what a warm plan keeps. (The
    sim stands for the cloud here; none of the planner's code is read.)"""
    from providers.sim import SimCloud

    if not (Path(cfg) / ".reconcile" / "sim").exists():
        return {}
    return {v["id"]: {"instance_type": v["instance_type"], "pool": v["tags"]["fleetops.io/pool"]}
            for v in SimCloud(Path(cfg) / ".reconcile").instances() if v["state"] == "running"}


def check(c: dict, plan: dict, running: dict[str, dict] | None = None) -> dict[str, list[str]]:
    """`running`: the instances the plan may keep (sim_instances); those it keeps count as the pool's and hold its jobs."""
    jobs, pools, tenants, types = c["jobs"], c["pools"], c["tenants"], c["types"]
    inst = {**{i: running[i] for i in plan.get("kept", {}) if running and i in running}, **{i["ref"]: i for i in plan["creates"]}}
    if missing := [i for i in plan.get("kept", {}) if i not in inst]:
        raise SystemExit(f"the plan keeps {len(missing)} instances this check cannot see (pass the config the sim ran): {missing[:3]}")
    out: dict[str, list[str]] = {k: [] for k in ("capacity", "quotas", "guarantees", "pending", "reasons")}
    used = {ref: dict.fromkeys(DIMS, 0.0) for ref in inst}
    gpu_idx: dict[str, list[int]] = defaultdict(list)
    on: dict[str, list[str]] = defaultdict(list)
    placed_gpus: Counter = Counter()
    pending = []
    for j in plan["jobs"]:
        spec = jobs[j["job"]]
        if j["action"] == "pending":
            pending.append(j)
            continue
        for ref, idx in zip(j["instances"], j["gpus"]):
            for k, v in _req(spec).items():
                used[ref][k] += v
            gpu_idx[ref] += idx
            on[ref].append(j["job"])
            if types[inst[ref]["instance_type"]].get("gpu_type") != spec["resources"].get("gpu_type"):
                out["capacity"].append(f"{j['job']} on {ref}: GPU model {types[inst[ref]['instance_type']].get('gpu_type')}")
        placed_gpus[spec["tenant"]] += _req(spec)["gpus"] * len(j["instances"])
    left = {}
    for ref, i in inst.items():
        t = types[i["instance_type"]]
        left[ref] = {k: t[k] - used[ref][k] for k in DIMS}
        if any(v < -1e-9 for v in left[ref].values()):
            out["capacity"].append(f"{ref} {i['instance_type']} overcommitted: {used[ref]}")
        if len(set(gpu_idx[ref])) != len(gpu_idx[ref]) or any(not 0 <= g < t["gpus"] for g in gpu_idx[ref]):
            out["capacity"].append(f"{ref}: GPU indices {sorted(gpu_idx[ref])}")
        if i["instance_type"] not in pools[i["pool"]]["instance_types"]:
            out["capacity"].append(f"{ref}: {i['instance_type']} not a type of pool {i['pool']}")
    count = Counter(i["pool"] for i in inst.values())
    for p, n in count.items():
        if n > pools[p].get("max_instances", 100):
            out["capacity"].append(f"pool {p}: {n} instances, max {pools[p]['max_instances']}")
    for t, n in placed_gpus.items():
        if n > _cap(tenants[t]):
            out["quotas"].append(f"tenant {t} runs {n} GPUs, cap {_cap(tenants[t])}")
    borrowers = {t for t, n in placed_gpus.items() if n > _guarantee(tenants[t])}
    for j in pending:
        spec, t = jobs[j["job"]], jobs[j["job"]]["tenant"]
        need = _req(spec)
        if placed_gpus[t] + need["gpus"] <= _cap(tenants[t]):
            if fits := [ref for ref in inst if _type_holds(types[inst[ref]["instance_type"]], spec) and _holds(left[ref], need)]:
                out["pending"].append(f"{j['job']} fits the room left on {fits[:3]}")
            if room := [p for p, ps in pools.items() if count[p] < ps.get("max_instances", 100)
                        and any(_type_holds(types[x], spec) for x in ps["instance_types"])]:
                out["pending"].append(f"{j['job']} fits pool(s) below their max: {room}")
        if placed_gpus[t] + need["gpus"] <= _guarantee(tenants[t]):
            for ref in inst:
                for b in on[ref]:
                    bt = jobs[b]["tenant"]
                    if bt != t and bt in borrowers and _type_holds(types[inst[ref]["instance_type"]], spec) and \
                            _holds({k: left[ref][k] + _req(jobs[b])[k] for k in DIMS}, need):
                        out["guarantees"].append(f"{j['job']} of {t} ({placed_gpus[t]} of its guaranteed "
                                                 f"{_guarantee(tenants[t])}) waits; borrower {bt}'s {b} holds its room on {ref}")
                        break
        out["reasons"] += _reason_errors(j, spec, pools, tenants, types, count, placed_gpus, jobs, plan)
    return out


def _reason_errors(j, spec, pools, tenants, types, count, placed_gpus, jobs, plan) -> list[str]:
    why, t, errs = j["reason"], spec["tenant"], []
    if m := re.search(r"pools at max_instances \(([^)]*)\)", why):
        # a reason led by another limit names the pools of the one option it was tried on ("for 1 new X in P"); a
        # reason led by the pools names every pool that holds the job
        named = {}
        for part in m.group(1).split(", "):
            p, a, b = re.fullmatch(r"(\S+) (\d+)/(\d+)", part).groups()
            named[p] = (int(a), int(b))
        holding = {p for p, ps in pools.items() if any(_type_holds(types[x], spec) for x in ps["instance_types"])}
        if set(named) != holding and not (why.startswith("quota exhausted") and set(named) <= holding):
            errs.append(f"{j['job']}: names pools {sorted(named)}, the pools that hold it are {sorted(holding)}")
        for p, (a, b) in named.items():
            if (a, b) != (count[p], pools[p].get("max_instances", 100)) or a < b:
                errs.append(f"{j['job']}: {p} {a}/{b}, the plan has {count[p]}/{pools[p].get('max_instances', 100)}")
    if m := re.search(r"tenant (\S+) runs (\d+) GPUs?, its guaranteed (\d+)", why):
        if (m.group(1), int(m.group(2)), int(m.group(3))) != (t, placed_gpus[t], _guarantee(tenants[t])):
            errs.append(f"{j['job']}: '{m.group(0)}', the plan has {t} at {placed_gpus[t]} of {_guarantee(tenants[t])}")
    if m := re.search(r"tenant (\S+) uses (\d+)/(\d+) GPUs in this plan, the job needs (\d+) more", why):
        a, b, n = int(m.group(2)), int(m.group(3)), int(m.group(4))
        if (m.group(1), a, b) != (t, placed_gpus[t], _cap(tenants[t])) or a + n <= b:
            errs.append(f"{j['job']}: '{m.group(0)}', the plan has {t} at {placed_gpus[t]}, cap {_cap(tenants[t])}")
    if m := re.search(r"which holds \S+ GPUs: (.*?)(?: and (\d+) more)?\)", why):
        status = {x["job"]: x["action"] for x in plan["jobs"]}
        for other in m.group(1).split(", "):
            ot = jobs[other]["tenant"]
            if status[other] == "pending" or ot == t or placed_gpus[ot] == 0 or _guarantee(tenants[ot]) == 0:
                errs.append(f"{j['job']}: names {other} of {ot} as guaranteed work ({status[other]}, "
                            f"{placed_gpus[ot]} of {_guarantee(tenants[ot])})")
    if not re.search(r"pools at max_instances|quota exhausted", why):
        errs.append(f"{j['job']}: a reason not checked here: {why[:120]}")
    return errs


def _shapes(c: dict) -> dict[tuple, int]:
    """(tenant, GPUs, vCPU, GiB) -> jobs."""
    return Counter((s["tenant"], *(_req(s)[k] for k in DIMS)) for s in c["jobs"].values())


def lp_bounds(c: dict) -> dict:
    """The most GPUs any plan places, and the least $/h at that, as an LP: jobs (by shape) fractionally onto instance
    types, each type's instances summed per dimension, pool ceilings and burst caps kept. Every plan is a point of it."""
    from ortools.linear_solver import pywraplp

    shapes, pools, types = _shapes(c), c["pools"], c["types"]
    lp = pywraplp.Solver.CreateSolver("GLOP")
    n = {(p, t): lp.NumVar(0, ps.get("max_instances", 100), "") for p, ps in pools.items() for t in ps["instance_types"]}
    x = {(s, pt): lp.NumVar(0, k, "") for s, k in shapes.items() for pt in n
         if types[pt[1]].get("gpu_type") == "A10G" and _holds({d: types[pt[1]][d] for d in DIMS}, dict(zip(DIMS, s[1:])))}
    for p, ps in pools.items():
        lp.Add(sum(n[p, t] for t in ps["instance_types"]) <= ps.get("max_instances", 100))
    for pt, count in n.items():
        for i, d in enumerate(DIMS):
            lp.Add(sum(s[1 + i] * v for (s, q), v in x.items() if q == pt) <= types[pt[1]][d] * count)
    for s, k in shapes.items():
        lp.Add(sum(v for (s2, _), v in x.items() if s2 == s) <= k)
    for t, ten in c["tenants"].items():
        if (cap := _cap(ten)) != float("inf"):
            lp.Add(sum(s[1] * v for (s, _), v in x.items() if s[0] == t) <= cap)
    gpus = sum(s[1] * v for (s, _), v in x.items())
    lp.Maximize(gpus)
    lp.Solve()
    most = lp.Objective().Value()
    lp.Add(gpus >= most - 1e-6)
    price = {pt: types[pt[1]]["prices"]["us-east-1"]["on_demand"] for pt in n}
    lp.Minimize(sum(price[pt] * v for pt, v in n.items()))
    lp.Solve()
    return {"gpus_bound": round(most, 2), "cost_bound_at_that": round(lp.Objective().Value(), 3),
            "guaranteed_units": sum(min(_guarantee(ten), sum(k * s[1] for s, k in shapes.items() if s[0] == t))
                                    for t, ten in c["tenants"].items())}


def integer_bound(c: dict, gpus: int, seconds: float = 30.0) -> dict:
    """The least $/h of any plan placing `gpus` GPUs with every tenant at min(its guarantee, its jobs) or more, as an
    integer program (CP-SAT): instances of each type and jobs of each shape on each type in whole numbers, a type's
    instances summed per dimension (exact for the 1-GPU types, a relaxation for the others), pool ceilings and burst
    caps kept. A lower bound on what any plan with that many GPUs and its guarantees held costs; (bound, proven)."""
    from reconciler.cpsat import cp_model

    shapes, pools, types = _shapes(c), c["pools"], c["types"]
    m = cp_model.CpModel()
    n = {(p, t): m.NewIntVar(0, ps.get("max_instances", 100), "") for p, ps in pools.items() for t in ps["instance_types"]}
    x = {(s, pt): m.NewIntVar(0, k, "") for s, k in shapes.items() for pt in n
         if types[pt[1]].get("gpu_type") == "A10G" and _holds({d: types[pt[1]][d] for d in DIMS}, dict(zip(DIMS, s[1:])))}
    for p, ps in pools.items():
        m.Add(sum(n[p, t] for t in ps["instance_types"]) <= ps.get("max_instances", 100))
    for pt, count in n.items():
        for i, d in enumerate(DIMS):
            m.Add(sum(round(s[1 + i] * 10) * v for (s, q), v in x.items() if q == pt) <= round(types[pt[1]][d] * 10) * count)
    for s, k in shapes.items():
        m.Add(sum(v for (s2, _), v in x.items() if s2 == s) <= k)
    for t, ten in c["tenants"].items():
        mine = sum(s[1] * v for (s, _), v in x.items() if s[0] == t)
        asked = sum(k * s[1] for s, k in shapes.items() if s[0] == t)
        m.Add(mine >= min(_guarantee(ten), asked))
        if (cap := _cap(ten)) != float("inf"):
            m.Add(mine <= int(cap))
    m.Add(sum(s[1] * v for (s, _), v in x.items()) >= gpus)
    price = {pt: round(types[pt[1]]["prices"]["us-east-1"]["on_demand"] * 1000) for pt in n}
    m.Minimize(sum(price[pt] * v for pt, v in n.items()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    st = solver.Solve(m)
    return {"cost_bound": round(solver.BestObjectiveBound() / 1000, 3), "best_found": round(solver.ObjectiveValue() / 1000, 3)
            if st in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None, "proven": st == cp_model.OPTIMAL}


def best_fit(c: dict) -> dict:
    """Best-fit decreasing, guarantees first: each tenant's jobs up to its guarantee, then the rest up to its cap; a
    job goes on the open instance it leaves least room on, else opens the cheapest type of a pool below its max that
    holds it (by $ per GPU)."""
    jobs, pools, types, tenants = c["jobs"], c["pools"], c["types"], c["tenants"]
    price = {t: types[t]["prices"]["us-east-1"]["on_demand"] for ps in pools.values() for t in ps["instance_types"]}
    opened: list[dict] = []
    count: Counter = Counter()
    placed: Counter = Counter()
    order = sorted(jobs, key=lambda n: (-_req(jobs[n])["memory_gib"], -_req(jobs[n])["cpu"], n))
    waiting = []
    for phase in ("guarantee", "burst"):
        for name in order:
            s = jobs[name]
            t, need = s["tenant"], _req(s)
            limit = _guarantee(tenants[t]) if phase == "guarantee" else _cap(tenants[t])
            if name in {w for w, _ in waiting} or placed.get(("job", name)) or placed[t] + need["gpus"] > limit:
                continue
            best = min((o for o in opened if _holds(o["left"], need)), default=None,
                       key=lambda o: sum(o["left"][k] - need[k] for k in ("cpu",)) + o["left"]["gpus"] * 100)
            if best is None:
                cands = [(price[x] / types[x]["gpus"], x, p) for p, ps in sorted(pools.items()) for x in ps["instance_types"]
                         if count[p] < ps.get("max_instances", 100) and _type_holds(types[x], s)]
                if not cands:
                    continue
                _, x, p = min(cands)
                count[p] += 1
                best = {"type": x, "left": {k: types[x][k] for k in DIMS}}
                opened.append(best)
            for k in DIMS:
                best["left"][k] -= need[k]
            placed[t] += need["gpus"]
            placed[("job", name)] = 1
    gpus = sum(v for k, v in placed.items() if isinstance(k, str))
    return {"gpus_placed": gpus, "jobs_placed": sum(1 for k in placed if isinstance(k, tuple)),
            "cost": round(sum(price[o["type"]] for o in opened), 3)}


def summary(c: dict, plan: dict, running: dict[str, dict] | None = None) -> dict:
    types = c["types"]
    held = [running[i]["instance_type"] for i in plan.get("kept", {})] if running else []
    placed = [j for j in plan["jobs"] if j["action"] != "pending"]
    return {"status": plan["solver"]["status"], "optimal": plan["solver"]["optimal"], "gap": plan["solver"]["gap"],
            "jobs_placed": len(placed), "pending": len(plan["jobs"]) - len(placed),
            "gpus_placed": sum(len(j["instances"]) * c["jobs"][j["job"]]["resources"]["gpus"] for j in placed),
            "cost": round(sum(types[t]["prices"]["us-east-1"]["on_demand"] for t in [i["instance_type"] for i in plan["creates"]] + held), 3),
            "kept": len(held), "created": len(plan["creates"]), "deleted": len(plan["deletes"]),
            "moved_or_evicted": sum(1 for j in plan["jobs"] if j["action"] not in ("place", "keep", "pending"))}


def main(argv: list[str] | None = None) -> None:
    cfg, plan_path = (argv or sys.argv[1:])[:2]
    c, plan = load_config(Path(cfg)), json.loads(Path(plan_path).read_text())
    running = sim_instances(Path(cfg))
    v = check(c, plan, running)
    print(json.dumps({"plan": summary(c, plan, running), "violations": {k: (len(x), x[:5]) for k, x in v.items()},
                      "lp": lp_bounds(c), "integer": integer_bound(c, summary(c, plan, running)["gpus_placed"]),
                      "best_fit": best_fit(c)}, indent=1))


if __name__ == "__main__":
    main()
