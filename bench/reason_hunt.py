"""Random hunt for pending reasons a raise does not make true: on fleets_with_rules (licenses, reservations,
deadlines, gangs, spot-only jobs, budgets) under random cloud quotas, each pending job's limit is raised by what its
reason says is short (every limit named, where several bind; lifted where it states no amount), the other pending
jobs removed, and the job must then be placed. One JSON line per check; LIFT-FAILS are findings.

    python -m bench.reason_hunt OUT.jsonl [N fleets]
"""

from __future__ import annotations

import copy
import json
import re
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler import api
from reconciler.load import load
from reconciler.problem import build_problem
from tests.fleetkit import catalog_observed, write_config
from tests.test_cloud_quotas import _random_quotas
from tests.test_properties import fleets_with_rules

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "reason_hunt.jsonl")
N = int(sys.argv[2] if len(sys.argv) > 2 else 40)
TL = 3.0


def plan(docs, fleet, quotas):
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs))
    observed = replace(catalog_observed(desired, fleet.instances, fleet.placements), gpu_indices=fleet.gpu_indices, quotas=tuple(quotas))
    problem = build_problem(desired, observed)
    p, _ = api.emitted(desired, observed, problem, TL)
    return desired, p


def num(s: str) -> float:
    return float(s.replace(",", "").replace("$", ""))


def lift(docs, quotas, reason: str, tenant: str):
    """(docs, quotas) with the limit the reason names raised by what it says is short; None: no single limit."""
    docs = copy.deepcopy(docs)
    quotas = list(quotas)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    kinds = {d["kind"]: d for d in docs}

    def policy(kind: str) -> dict:
        if kind not in kinds:
            docs.append({"apiVersion": "fleetops.io/v1alpha1", "kind": kind, "metadata": {"name": "lifted"}, "spec": {}})
            kinds[kind] = docs[-1]
        return kinds[kind]["spec"]

    r = reason.removeprefix("evicted: ")
    if "several limits bind" in r:
        # every clause named, lifted together
        # (the way "for 1 new p4d.24xlarge on-demand (reserved: p4d) in ...": a colon inside its parentheses)
        parts = re.split(r"; several limits bind at once with it(?: for (?:[^:(]|\([^)]*\))*)?: |; (?=(?:quota exhausted:|quota: the job|license |cloud quota: "
                         r"|pools at max_instances|budget: |tenant budget: |spot share: |tenant spot share: |on-demand buffer: "
                         r"|spot diversity: |reservation \S+ is fully))", r)
        whats = []
        for part in parts:
            got = lift(docs, quotas, part, tenant)
            if got is None:
                return None
            docs, quotas, what = got
            whats.append(what)
        return docs, quotas, "ALL: " + " + ".join(whats)
    dims = {"GPU": "gpus", "GPUs": "gpus", "vCPU": "cpu", "vCPUs": "cpu", "GiB": "memory_gib"}
    if m := re.match(r"quota(?: exhausted)?: (?:tenant (\S+) uses|the job needs)", r):
        t = m.group(1) or re.search(r"tenant (\S+)'s limit", r).group(1)
        q = by[("Tenant", t)]["spec"]["quota"]
        lifts = []
        for used, limit, unit, need in re.findall(r"uses ([\d.]+)/([\d.]+) (\w+) in this plan, the job needs ([\d.]+) more", r):
            lifts.append((dims[unit], float(used) + float(need) - float(limit)))
        if a := re.match(r"quota: the job needs ([\d.]+) (\w+) but tenant \S+'s limit is ([\d.]+)(?: \(it uses ([\d.]+) in this plan\))?", r):
            need, unit, limit, used = a.groups()
            lifts.append((dims[unit], float(used or 0) + float(need) - float(limit)))
        for dim, short in lifts:
            short = int(short) if dim == "gpus" else short
            if dim in q:
                q[dim] += short
            if dim in q.get("burst", {}):
                q["burst"][dim] += short
        return docs, quotas, f"tenant {t} {lifts}"
    if m := re.match(r"license (\S+): tenant (\S+) holds (\d+)/(\d+) of its quota.*?; the job needs (\d+)", r):
        name, t, held, q, need = m.groups()
        by[("License", name)]["spec"]["tenant_quotas"][t] += int(held) + int(need) - int(q)
        return docs, quotas, f"license {name} tenant quota {t}"
    if m := re.match(r"license (\S+): (\d+)/(\d+) held.*?; the job needs (\d+)", r):
        name, held, count, need = m.groups()
        by[("License", name)]["spec"]["count"] += int(held) + int(need) - int(count)
        return docs, quotas, f"license {name} count"
    if m := re.match(r"license (\S+): the job needs (\d+) but (tenant (\S+)'s quota of it|its count) is (\d+)(?: \((?:tenant \S+ holds )?(\d+) held| \(tenant \S+ holds (\d+))?", r):
        name, need, _, t, limit, held, theld = m.groups()
        spec = by[("License", name)]["spec"]
        if t:
            spec["tenant_quotas"][t] = int(need) + int(theld or held or 0)
        else:
            spec["count"] = int(need) + int(held or 0)
        return docs, quotas, f"license {name} to need"
    if m := re.match(r"cloud quota: (\S+) (.+?) in (\S+(?: regions)?): ([\d.]+) of ([\d.]+) \w+ used(?:, and this plan's new instances "
                     r"take ([\d.]+) more)?(?:, and pool minimums it holds back take ([\d.]+) more first \([^)]*\))?; "
                     r"the job needs \d+ more \S+ \S+ \(([\d.]+) \w+\)", r):
        cloud, name, region, used, limit, taken, held_back, need = m.groups()
        region = "" if region == "all regions" else region
        short = float(used) + float(taken or 0) + float(held_back or 0) + float(need) - float(limit)
        quotas = [replace(q, limit=q.limit + short) if (q.cloud, q.name, q.region) == (cloud, name, region) else q for q in quotas]
        return docs, quotas, f"cloud quota {name} +{short:g}"
    if r.startswith("pools at max_instances"):
        n = re.search(r"a raise of (\d+) instances", r) or re.search(r"the job needs (\d+) new instances", r)
        for name in re.findall(r"([\w-]+) \d+/\d+", r.split(")")[0]):
            by[("Pool", name)]["spec"]["max_instances"] += int(n.group(1)) if n else 1
        return docs, quotas, "pools +n"
    if m := re.match(r"budget: the fleet costs .*? would need \$([\d,.]+)/h more budget", r):
        policy("GuardrailPolicy")["max_hourly_budget"] += num(m.group(1))
        return docs, quotas, f"budget +{m.group(1)}"
    if m := re.match(r"tenant budget: (\S+) spends .*?, \$([\d,.]+)/h more than it allows", r):
        policy("GuardrailPolicy")["tenant_hourly_budgets"][m.group(1)] += num(m.group(2))
        return docs, quotas, f"tenant budget +{m.group(2)}"
    if r.startswith("spot share:"):
        policy("SpotPolicy")["max_spot_fraction"] = 1.0
        return docs, quotas, "spot share"
    if r.startswith("tenant spot share:"):
        policy("SpotPolicy").get("tenant_max_spot_fraction", {}).pop(tenant, None)
        return docs, quotas, "tenant spot share"
    if r.startswith("on-demand buffer:"):
        policy("SpotPolicy")["on_demand_buffer_percent"] = 0
        return docs, quotas, "buffer"
    if r.startswith("spot diversity:"):
        policy("SpotPolicy").update(min_instance_types=1, min_zones=1)
        return docs, quotas, "diversity"
    if m := re.match(r"reservation (\S+) is fully used in this plan[^;]*(?:; the job needs (\d+) more of it)?", r):
        by[("Reservation", m.group(1))]["spec"]["count"] += int(m.group(2) or 1)
        return docs, quotas, "reservation +1"
    return None


def check(fleet, quotas, log):
    desired, p = plan(fleet.docs, fleet, quotas)
    placed = {j.job for j in p.jobs if j.instances}
    pending = [j for j in p.jobs if j.action in ("pending", "evict")]
    for jc in pending:
        # a named holder ("capacity goes to higher-priority work first: a, b") is work the plan places
        for m in re.finditer(r"\((?:capacity goes to higher-priority work first|its tenant's quota goes to its higher-priority work first): ([^)]*)\)", jc.reason):
            names = [n.strip() for n in re.split(r",| and ", m.group(1).split(" and ")[0] if "more" in m.group(1) else m.group(1)) if n.strip()]
            for n in names:
                if n not in placed and not n.endswith("more"):
                    log({"kind": "holder-not-placed", "job": jc.job, "holder": n, "reason": jc.reason})
        if jc.reason.startswith("not placed by this plan"):
            log({"kind": "solver-missed", "job": jc.job, "reason": jc.reason})
    for jc in pending[:3]:
        lifted = lift(fleet.docs, quotas, jc.reason, jc.tenant)
        if lifted is None:
            log({"kind": "no-single-limit", "job": jc.job, "reason": jc.reason})
            continue
        docs, q2, what = lifted
        others = {j.job for j in pending if j.job != jc.job}
        docs = [d for d in docs if not (d["kind"] == "Job" and d["metadata"]["name"] in others)]
        try:
            _, again = plan(docs, fleet, q2)
        except Exception as e:  # noqa: BLE001
            log({"kind": "lift-error", "job": jc.job, "reason": jc.reason, "lift": what, "error": repr(e)[:300]})
            continue
        now = next(j for j in again.jobs if j.job == jc.job)
        log({"kind": "ok" if now.instances else "LIFT-FAILS", "job": jc.job, "reason": jc.reason, "lift": what,
             **({} if now.instances else {"after": now.reason, "docs": docs, "quotas": [repr(q) for q in q2],
                                          "instances": [repr(i) for i in fleet.instances], "placements": fleet.placements})})


count = [0]


@settings(max_examples=N, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(fleet=fleets_with_rules(max_jobs=10), data=st.data())
def hunt(fleet, data):
    quotas = _random_quotas(data.draw, fleet) if data.draw(st.booleans()) else ()
    count[0] += 1
    with OUT.open("a") as f:
        def log(rec):
            f.write(json.dumps({"n": count[0], **rec}, default=str) + "\n")
            f.flush()
        try:
            check(fleet, quotas, log)
        except Exception:  # noqa: BLE001
            log({"kind": "crash", "tb": traceback.format_exc()[-2000:]})


if __name__ == "__main__":
    t = time.time()
    hunt()
    print(f"{count[0]} fleets in {time.time() - t:.0f}s")
