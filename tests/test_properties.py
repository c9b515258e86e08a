"""Property tests: on random small fleets the solver's answer always keeps the rules.

The checks (tests/invariants.py) re-derive every rule from the desired state and
the catalog; they share no code with the solver model. Each example is solved by
CP-SAT and by greedy best-fit alone (`time_limit=0`, the fallback plan): both plans
must keep every rule and run all the work their solver placed; and, where no tenant
can borrow, CP-SAT (warm-started from greedy) must rank no worse by the README's order
(guarantees kept, then per class running and all work, then victims) and, ranked the
same, cost no more within its reported gap.

The fleets mix 1-GPU jobs, multi-GPU NVLink jobs, gangs in the three gang modes,
MIG jobs with a MIG pool, whole-GPU jobs of the MIG pool's GPU model, CPU jobs, the
four spot modes, allowlists and data latency limits; tenants with guarantees, bursts,
weights, budgets and spot shares; a SpotPolicy, a GuardrailPolicy and a PlacementPolicy;
and existing instances with replicas running on them (with their GPU indices). Aging
and scenario-sized behaviours are in tests/test_rules.py.

The CI tier runs a fixed set of examples (derandomized); `-m slow` explores new ones.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from providers.catalog import load_catalog
from reconciler import api
from reconciler.load import load
from reconciler.plan import make_plan
from reconciler.plancheck import recheck
from reconciler.problem import build_problem
from reconciler.solve import solve
from tests.fleetkit import catalog_observed, doc, instance, job, pool, tenant, topology, write_config
from tests.invariants import can_borrow, check_plan, check_stability, cost_per_hour, placed_work, ranking


@dataclass(frozen=True)
class PoolDef:
    name: str
    cloud: str
    region: str
    zones: tuple[str, ...]
    types: tuple[str, ...]
    markets: tuple[str, ...]  # the market settings the generator may give it
    serves: tuple[str, ...]  # job kinds it can run
    hi: int
    mig: bool = False


POOLS = [
    PoolDef("gcp-a100", "gcp", "us-central1", ("us-central1-a", "us-central1-b"), ("a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"),
            ("either", "on-demand", "spot"), ("a100", "a100nv", "gang8", "gang2"), 4),
    PoolDef("aws-a100", "aws", "us-east-1", ("us-east-1a", "us-east-1b"), ("p4d.24xlarge",), ("either", "on-demand"),
            ("a100", "a100nv", "gang8", "gang2"), 2),
    PoolDef("aws-a10g", "aws", "us-east-1", ("us-east-1a",), ("g5.xlarge", "g5.12xlarge"), ("spot", "either"), ("a10g",), 3),
    PoolDef("az-mig", "azure", "eastus", ("eastus-1", "eastus-2"), ("Standard_NC24ads_A100_v4",), ("either", "on-demand", "spot"),
            ("mig",), 3, mig=True),
    PoolDef("az-a100-80", "azure", "eastus", ("eastus-1",), ("Standard_NC24ads_A100_v4",), ("on-demand", "either"), ("a100-80",), 2),
    PoolDef("aws-cpu", "aws", "us-east-1", ("us-east-1a",), ("m6i.4xlarge",), ("on-demand", "either"), ("cpu",), 3),
    PoolDef("gcp-cpu", "gcp", "us-central1", ("us-central1-a",), ("n2-standard-16",), ("spot", "either"), ("cpu",), 2),
]
MIG_LAYOUTS = [["3g.40gb", "2g.20gb", "2g.20gb"], ["1g.10gb"] * 7, ["4g.40gb", "3g.40gb"]]

# kind -> (gpus, gpu_type, cpu, memory_gib, nvlink)
SHAPES = {
    "a100": [(1, "A100", 8, 60, False)],
    "a100nv": [(2, "A100", 16, 120, True), (4, "A100", 40, 300, True)],
    "gang8": [(8, "A100", 90, 600, False)],
    "gang2": [(2, "A100", 16, 120, False), (2, "A100", 16, 120, True)],
    "a10g": [(1, "A10G", 4, 16, False), (4, "A10G", 40, 160, False)],
    "a100-80": [(1, "A100-80GB", 8, 60, False)],
    "cpu": [(0, None, 4, 16, False), (0, None, 12, 48, False)],
}
TENANTS = ("t1", "t2", "t3")
PRIORITIES = ("low", "normal", "high", "critical", 5, 50)
LOCATIONS = ("aws/us-east-1", "gcp/us-central1", "azure/eastus/eastus-1")


@dataclass
class Fleet:
    docs: list[dict]
    instances: list = field(default_factory=list)
    placements: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gpu_indices: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)  # as apply records them


@st.composite
def fleets(draw, max_jobs: int = 8, max_instances: int = 4) -> Fleet:
    pools = draw(st.lists(st.sampled_from(POOLS), min_size=1, max_size=4, unique_by=lambda p: p.name))
    clouds = sorted({p.cloud for p in pools})
    allowed_clouds = draw(st.none() | st.lists(st.sampled_from(clouds), min_size=1, unique=True).map(sorted))
    layout = draw(st.sampled_from(MIG_LAYOUTS))
    docs = [topology()]
    pool_market = {}
    for p in pools:
        market = draw(st.sampled_from(p.markets))
        pool_market[p.name] = market
        lo = 1 if p.name == "aws-cpu" and market != "spot" and (allowed_clouds is None or p.cloud in allowed_clouds) and draw(st.booleans()) else 0
        d = pool(p.name, p.cloud, p.region, list(p.zones), list(p.types), market=market, lo=lo, hi=draw(st.integers(max(lo, 1), p.hi)))
        if p.mig:
            d["spec"]["mig"] = layout
        docs.append(d)

    # Tenants: unlimited, a guarantee, or (in half the fleets) a guarantee with a burst ceiling;
    # weights for fair share. Without burst the whole ranking can be compared with greedy's.
    kinds = ["none", "quota", "burst", "burst"] if draw(st.booleans()) else ["none", "quota"]
    for t in TENANTS:
        kind = draw(st.sampled_from(kinds))
        spec: dict = {"weight": draw(st.sampled_from([1, 1, 3]))}
        if kind != "none":
            g = draw(st.sampled_from([4, 8, 16, 0, 2]))
            quota: dict = {"gpus": g}
            if kind == "burst":
                quota["burst"] = {"gpus": g + draw(st.sampled_from([4, 8, 16, 1]))}
            if draw(st.booleans()):
                quota["cpu"] = draw(st.sampled_from([64, 24, 128]))
            spec["quota"] = quota
        docs.append(doc("Tenant", t, spec))

    kinds = sorted({k for p in pools for k in p.serves})
    jobs = []
    for i in range(draw(st.integers(1, max_jobs))):
        kind = draw(st.sampled_from(kinds))
        spec: dict = {"tenant": draw(st.sampled_from(TENANTS)), "priority": draw(st.sampled_from(PRIORITIES)),
                      "spot": draw(st.sampled_from(["eligible", "eligible", "never", "required", "preferred"]))}
        if kind == "mig":
            res = {"gpu_type": "A100-80GB", "mig": {"profile": draw(st.sampled_from(sorted(set(layout)))), "count": draw(st.integers(1, 2))},
                   "cpu": 2, "memory_gib": 8}
            spec["replicas"] = draw(st.sampled_from([1, 1, 2]))
        else:
            gpus, gt, cpu, mem, nv = draw(st.sampled_from(SHAPES[kind]))
            res = {"gpus": gpus, "cpu": cpu, "memory_gib": mem}
            if gt:
                res["gpu_type"] = gt
            if nv:
                res["nvlink"] = True
            spec["replicas"] = 2 if kind == "gang8" else draw(st.integers(2, 3)) if kind == "gang2" else 1
        spec["resources"] = res
        if spec["replicas"] > 1:
            spec["gang"] = draw(st.sampled_from(["zone", "placement-group", "instance"]))
        allow = draw(st.sampled_from(["none"] * 6 + ["regions", "clouds", "pools"]))
        serving = [p for p in pools if kind in p.serves]
        if allow == "regions":
            spec["regions"] = sorted({draw(st.sampled_from([f"{p.cloud}/{p.region}" for p in serving])), "us-west-2"})
        elif allow == "clouds":
            spec["clouds"] = [draw(st.sampled_from(sorted({p.cloud for p in serving})))]
        elif allow == "pools":
            spec["pools"] = [draw(st.sampled_from([p.name for p in serving]))]
        if draw(st.integers(0, 4)) == 0:
            data = {"location": draw(st.sampled_from(LOCATIONS)), "size_gib": draw(st.sampled_from([0, 500]))}
            lat = draw(st.sampled_from([None, 5, 40, 100]))
            if lat is not None:
                data["max_latency_ms"] = lat
            spec["data"] = data
        jobs.append(doc("Job", f"j{i}", spec))
    docs += jobs

    sp: dict = {"max_spot_fraction": draw(st.sampled_from([0.25, 0.5, 1.0, 1.0])),
                "on_demand_buffer_percent": draw(st.sampled_from([0, 0, 0, 25, 50])),
                "min_instance_types": draw(st.sampled_from([1, 1, 1, 2])), "min_zones": draw(st.sampled_from([1, 1, 1, 2])),
                "max_price_fraction": draw(st.sampled_from([0.3, 1.0, 1.0]))}
    spot_tenants = draw(st.lists(st.sampled_from(TENANTS), unique=True, max_size=2))
    if spot_tenants:
        sp["tenant_max_spot_fraction"] = {t: draw(st.sampled_from([0.0, 0.5])) for t in spot_tenants}
    docs.append(doc("SpotPolicy", "sp", sp))
    gr: dict = {}
    budget = draw(st.sampled_from([None, None, 15.0, 40.0, 100.0]))
    if budget is not None:
        gr["max_hourly_budget"] = budget
    budget_tenants = draw(st.lists(st.sampled_from(TENANTS), unique=True, max_size=2))
    if budget_tenants:
        gr["tenant_hourly_budgets"] = {t: draw(st.sampled_from([20.0, 5.0, 60.0])) for t in budget_tenants}
    if allowed_clouds is not None:
        gr["allowed_clouds"] = allowed_clouds
    docs.append(doc("GuardrailPolicy", "g", gr))
    pp = {"consolidation": draw(st.sampled_from(["WhenUnderutilized", "WhenEmpty"])),
          "preemption": draw(st.sampled_from(["LowerPriority", "Never"])),
          "latency_cost_per_ms": draw(st.sampled_from([0.0, 0.0, 0.01]))}
    docs.append(doc("PlacementPolicy", "pp", pp))

    # Existing instances, and replicas running on them where they fit (as an earlier plan left them).
    insts = []
    for k in range(draw(st.integers(0, max_instances))):
        p = draw(st.sampled_from(pools))
        market = draw(st.sampled_from(["spot", "on-demand"] if pool_market[p.name] == "either" else [pool_market[p.name]]))
        insts.append(instance(f"i{k}", p.name, p.cloud, p.region, draw(st.sampled_from(p.zones)), draw(st.sampled_from(p.types)), market))
    placements, gpu_indices = _running(draw, jobs, insts, {p.name: p for p in pools}, layout)
    return Fleet(docs, insts, placements, gpu_indices)


def _running(draw, jobs: list[dict], insts: list, pools: dict[str, PoolDef], layout: list[str]):
    """Put some jobs on the existing instances where their resources fit (first fit, whole jobs;
    gang modes are not honoured: a drifted fleet the plan must repair), each GPU replica on
    free GPUs of its instance (an NVLink replica inside one domain), as apply records them.
    Returns (placements, GPU indices)."""
    cat = load_catalog()
    free = {}
    for i in insts:
        s = cat.shape(i.cloud, i.instance_type)
        mig = pools[i.pool].mig
        free[i.id] = {"cpu": s.cpu, "mem": s.memory_gib, "gpu_type": s.gpu_type, "gpus": s.gpus, "dom": max(1, s.nvlink_domain or 1),
                      "used": [False] * (0 if mig else s.gpus), "mig": Counter({p: s.gpus * layout.count(p) for p in layout}) if mig else None}
    placements, indices = {}, {}
    for j in jobs:
        if not insts or not draw(st.booleans()):
            continue
        r = j["spec"]["resources"]
        trial = {k: {**v, "used": list(v["used"]), "mig": Counter(v["mig"]) if v["mig"] is not None else None} for k, v in free.items()}
        hosts, gpus = [], []
        for _ in range(j["spec"]["replicas"]):
            for iid, f in trial.items():
                mig, n = r.get("mig"), r.get("gpus", 0)
                if r.get("gpu_type") != f["gpu_type"] or (mig is None) != (f["mig"] is None):
                    continue  # the GPU model (none: a CPU instance), MIG devices or whole GPUs
                if f["cpu"] < r["cpu"] or f["mem"] < r["memory_gib"] or (mig and f["mig"][mig["profile"]] < mig["count"]):
                    continue
                idx = _free_gpus(f["used"], n, f["dom"] if r.get("nvlink") else len(f["used"]) or 1)
                if idx is None:
                    continue
                f["cpu"] -= r["cpu"]
                f["mem"] -= r["memory_gib"]
                if mig:
                    f["mig"][mig["profile"]] -= mig["count"]
                for g in idx:
                    f["used"][g] = True
                hosts.append(iid)
                gpus.append(tuple(idx))
                break
        if len(hosts) == j["spec"]["replicas"]:
            free = trial
            placements[j["metadata"]["name"]] = tuple(hosts)
            if r.get("gpus"):
                indices[j["metadata"]["name"]] = tuple(gpus)
    return placements, indices


def _free_gpus(used: list[bool], n: int, domain: int) -> list[int] | None:
    """The first n free GPUs inside one block of `domain` GPUs ([] for no GPUs; None: none free)."""
    if n == 0:
        return []
    for start in range(0, len(used), domain):
        free = [g for g in range(start, min(len(used), start + domain)) if not used[g]]
        if len(free) >= n:
            return free[:n]
    return None


def solve_both(fleet: Fleet, time_limit: float = 4):
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), fleet.docs))
    observed = replace(catalog_observed(desired, fleet.instances, fleet.placements), gpu_indices=fleet.gpu_indices)
    problem = build_problem(desired, observed)
    # (the plan the planner emits, as a user gets it: the first search's answer is searched again where it stops running
    # work no rule requires stopping, api._lawful; checked alone, a random fleet's first answer evicted a protected
    # low job that the emitted plan keeps)
    plan, solution = api.emitted(desired, observed, problem, time_limit)
    gsol = solve(problem, time_limit=0)
    gplan = make_plan(desired, observed, problem, gsol)
    return desired, observed, (solution, plan), (gsol, gplan)


def check_fleet(fleet: Fleet, time_limit: float = 4, solved: tuple | None = None) -> None:
    """`solved`: solve_both's answer for this fleet, where the caller has it already (not solved twice)."""
    desired, observed, (solution, plan), (gsol, gplan) = solved or solve_both(fleet, time_limit)
    for name, p in (("CP-SAT", plan), ("greedy", gplan)):  # greedy best-fit alone is a valid answer too (the fallback)
        try:
            check_plan(desired, observed, p)
            check_stability(desired, observed, p)  # no running work stopped without the rule that requires it
        except AssertionError as e:
            raise AssertionError(f"{name} plan: {e}") from e
        # The same plan saved and applied with `apply --plan` passes the re-check (it refuses no honest plan).
        assert not (refused := recheck(p, desired, observed, build_problem(desired, observed))[1]), f"{name} plan refused: {refused}"
    # Each plan runs all the work its solver placed (the packer drops none of it). Known
    # exception (test_rules.py, xfail): the model counts new instances in aggregate, so with
    # the pool at max_instances (no repair instance) a count that no packing holds is dropped.
    # Beyond it, only backfill places more: pending work in room the packing left (plan/backfill.py). And backfill may
    # place pending work in the room of its own tenant's new work of a lower class (backfill._displace): less work
    # summed, more of a higher class, which the README's order ranks above (a random fleet of the slow tier, 2026-12-01:
    # greedy's answer left t3's normal spot-required j1 pending on the spot share and put t3's low 4-GPU j2 on the spot
    # instance; the plan runs j1 there instead: 210 of 280 summed, and a normal job more).
    for name, p, s in (("CP-SAT", plan, solution), ("greedy", gplan, gsol)):
        if placed_work(desired, p) > s.work:
            assert p.solver.backfilled, f"the {name} plan runs {placed_work(desired, p)}, its solution placed {s.work}, none backfilled"
        elif placed_work(desired, p) < s.work and p.solver.backfilled and _outranks_by_class(desired, observed, p, s):
            _note(f"{name}: backfill gave a lower class's new room to a higher class of its tenant")
            return
        elif placed_work(desired, p) != s.work:
            assert _unpackable_at_max(desired, observed, p), f"the {name} plan runs {placed_work(desired, p)}, its solution placed {s.work}"
            _note(f"{name}: work dropped by the packer at max_instances (known limitation)")
            return
    # CP-SAT is warm-started from greedy, so by the README's order it never does worse. With
    # borrowing, fair share and the guaranteed/borrowed split rank in between (test_rules.py).
    # WhenEmpty forbids moves greedy may make (re-placing a job it could not keep), so greedy's
    # answer is comparable there only if it moves nothing.
    if can_borrow(desired) or (desired.placement.consolidation == "WhenEmpty" and any(j.action == "move" for j in gplan.jobs)):
        return
    mine, theirs = ranking(desired, observed, plan), ranking(desired, observed, gplan)
    assert mine >= theirs, f"CP-SAT ranks {mine}, greedy {theirs} (guarantees kept, running and all work per class from critical, -victims)"
    # Ranked the same, CP-SAT costs no more, within its reported gap (and a milli-dollar of
    # rounding per term). Unless greedy runs a spot-preferred job on on-demand, whose premium
    # CP-SAT may pay in dollars to avoid.
    preferred_fallback = any(desired.jobs[j.job].spec.spot == "preferred" and _on_demand(j, gplan, observed) for j in gplan.jobs)
    if mine == theirs and not preferred_fallback:
        a, b = cost_per_hour(desired, observed, plan), cost_per_hour(desired, observed, gplan)
        slack = 0.002 * (len(plan.creates) + len(plan.kept) + len(gplan.creates) + len(gplan.kept) + len(plan.jobs) + 1)
        assert a <= b * (1 + plan.solver.gap) + slack, f"CP-SAT ${a:.4f}/h > greedy ${b:.4f}/h at the same rank (gap {plan.solver.gap})"


def _note(text: str) -> None:
    """hypothesis's note where a property test runs; check_fleet also runs on stored fleets (test_open_findings)."""
    try:
        note(text)
    except InvalidArgument:
        pass


def _outranks_by_class(desired, observed, plan, solution) -> bool:
    """Does the plan's work per class, from critical down, rank above what the solution placed (README order)?"""
    problem = build_problem(desired, observed)
    klass = {j: d.klass for d in problem.demands for j in d.jobs}
    weight = {j: d.weight for d in problem.demands for j in d.jobs}
    mine, theirs = Counter(), Counter()
    for jc in plan.jobs:
        if jc.action in ("keep", "place", "move") and jc.job in klass:
            mine[klass[jc.job]] += weight[jc.job]
    for d in problem.demands:
        theirs[d.klass] += d.weight * solution.placed.get(d.key, 0)
    levels = sorted(set(mine) | set(theirs), reverse=True)
    return [mine[k] for k in levels] > [theirs[k] for k in levels]


def _unpackable_at_max(desired, observed, plan) -> bool:
    """The packer dropped jobs ('could not be packed') and a pool they could use is full."""
    dropped = [j for j in plan.jobs if "could not be packed" in j.reason]
    count = Counter(i.pool for i in observed.instances if i.id not in {d.instance_id for d in plan.deletes})
    count.update(c.pool for c in plan.creates)
    return bool(dropped) and any(count[n] >= p.spec.max_instances for n, p in desired.pools.items())


def _on_demand(jc, plan, observed) -> bool:
    """Does any replica of the job run on an on-demand instance?"""
    market = {c.ref: c.market for c in plan.creates} | {i.id: i.market for i in observed.instances}
    return any(market[i] != "spot" for i in jc.instances)


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# The same fleets every run (CI; the slow tier draws 2,000 new, of up to 14 jobs and 8 instances: these and larger).
# 320 -> 240 -> 200 for the CI tier's 10 minutes (621 s on 2026-12-02); 200 -> 120 on 2026-12-03 (15.1 s of CPU, the tier's
# heaviest test); 120 -> 60 later that day (the tier's pytest at 505 s of its 10 minutes).
@settings(max_examples=60, derandomize=True, database=None, **SETTINGS)
@given(fleet=fleets())
def test_solver_answer_keeps_every_rule(fleet):
    """Every rule holds on CP-SAT's plan and greedy's, and CP-SAT ranks no worse than greedy."""
    check_fleet(fleet)


@pytest.mark.slow
@settings(max_examples=2000, **SETTINGS)  # new fleets every run
@given(fleet=fleets(max_jobs=14, max_instances=8))
def test_solver_answer_keeps_every_rule_on_larger_fleets(fleet):
    check_fleet(fleet, time_limit=5)


# Deadlines from two days ahead (midnight UTC): a fixed date would pass, and with it every deadline the tier draws.
DEADLINES_FROM = (datetime.now(timezone.utc) + timedelta(days=2)).replace(hour=0, minute=0, second=0, microsecond=0)


@st.composite
def fleets_with_rules(draw, max_jobs: int = 8, max_instances: int = 4) -> Fleet:
    """A fleet (as `fleets`) with the issue-17 rules added: a License of a few seats (a tenant quota
    of it, sometimes) held by some of its jobs, deadlines on some jobs (ranked above their class), and with a p4d
    pool, sometimes a Reservation of one or two p4d."""
    fleet = draw(fleets(max_jobs=max_jobs, max_instances=max_instances))
    docs = [dict(d, spec=dict(d["spec"])) for d in fleet.docs]
    lic: dict = {"count": draw(st.integers(0, 4)), "cost_per_hour": 1.5}
    if draw(st.booleans()):
        lic["tenant_quotas"] = {draw(st.sampled_from(TENANTS)): draw(st.integers(0, 2))}
    docs.append(doc("License", "sim", lic))
    for d in docs:
        if d["kind"] == "Job" and draw(st.booleans()):
            d["spec"]["licenses"] = {"sim": draw(st.sampled_from([1, 1, 2]))}
        if d["kind"] == "Job" and draw(st.integers(0, 2)) == 0:
            d["spec"]["deadline"] = DEADLINES_FROM + timedelta(hours=draw(st.integers(0, 72)))
    if any(d["kind"] == "Pool" and d["metadata"]["name"] == "aws-a100" for d in docs) and draw(st.booleans()):
        docs.append(doc("Reservation", "p4d", {"cloud": "aws", "region": "us-east-1", "zone": draw(st.sampled_from(["us-east-1a", "us-east-1b"])),
                                               "instance_type": "p4d.24xlarge", "count": draw(st.integers(1, 2)), "hourly_cost": 19.2}))
    return Fleet(docs, fleet.instances, fleet.placements, fleet.gpu_indices)


# (the same 20 fleets every run in CI: 40 -> 20 on 2026-12-03; the slow tier draws 400 new below)
@settings(max_examples=20, derandomize=True, database=None, **SETTINGS)
@given(fleet=fleets_with_rules())
def test_licenses_reservations_and_deadlines_keep_every_rule(fleet):
    """Licenses, reservations and deadlines on random fleets: no plan holds more than a License's count or a tenant's
    quota of it, nor launches more into a Reservation than its count, at $0 (tests/invariants.py); every
    other rule holds, and CP-SAT ranks no worse than greedy."""
    check_fleet(fleet)


@pytest.mark.slow
@settings(max_examples=400, **SETTINGS)  # new fleets every run
@given(fleet=fleets_with_rules())
def test_licenses_reservations_and_deadlines_keep_every_rule_on_new_fleets(fleet):
    check_fleet(fleet)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), gpus=st.sampled_from([1, 2, 4]))
def test_aggregated_offers_always_pack(n, gpus):
    """Identical instances solved as one count must still pack replica by replica."""
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=20)]
    docs += [job(f"j{i}", gpus=gpus, gpu_type="A100", cpu=8 * gpus, mem=60 * gpus) for i in range(n)]
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs))
    observed = catalog_observed(desired)
    problem = build_problem(desired, observed)
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=5, workers=1))
    check_plan(desired, observed, plan)
    assert len(plan.creates) == -(-n * gpus // 8)
    assert plan.solver.repairs == 0  # proportional shapes: the aggregate count always packs


def _violated(model) -> list[str]:
    """The model's linear constraints and domains the hint breaks (each needs only hinted variables)."""
    proto = model.m.proto
    hint = dict(zip(proto.solution_hint.vars, proto.solution_hint.values))
    names = [v.name for v in proto.variables]
    out = []
    for c in proto.constraints:
        vs, cs, dom = list(c.linear.vars), list(c.linear.coeffs), list(c.linear.domain)
        if not vs or not all(v in hint for v in vs):
            continue
        val = sum(co * hint[v] for v, co in zip(vs, cs))
        if not any(dom[i] <= val <= dom[i + 1] for i in range(0, len(dom), 2)):
            out.append(f"{val} not in {dom}: " + ", ".join(f"{co}*{names[v]}={hint[v]}" for v, co in zip(vs, cs) if hint[v]))
    return out


# (the same 50 fleets every run in CI: 150 -> 100 -> 50 on 2026-12-03, 7.2 s of CPU at 100; the slow tier draws 1,000 new below)
@settings(max_examples=50, derandomize=True, database=None, **SETTINGS)
@given(fleet=fleets(max_jobs=10, max_instances=6))
def test_the_greedy_warm_start_is_a_solution_of_the_model(fleet):
    """CP-SAT starts from greedy's answer; where the model cannot express it (a host greedy fills
    after moving a broken gang away had no variable), the warm start is lost, every tier is
    searched from nothing and a 5k-job drift plan fell back to greedy after the whole time limit."""
    _assert_greedy_warm_start_fits_the_model(fleet)


@pytest.mark.slow
@settings(max_examples=1000, **SETTINGS)  # new fleets every run
@given(fleet=fleets(max_jobs=10, max_instances=6))
def test_the_greedy_warm_start_is_a_solution_of_the_model_on_new_fleets(fleet):
    _assert_greedy_warm_start_fits_the_model(fleet)


def _assert_greedy_warm_start_fits_the_model(fleet) -> None:
    from reconciler.greedy import greedy
    from reconciler.solve.model import Model

    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), fleet.docs))
    observed = replace(catalog_observed(desired, fleet.instances, fleet.placements), gpu_indices=fleet.gpu_indices)
    problem = build_problem(desired, observed)
    for g in (greedy(problem), greedy(problem, keep_fleet=True)):  # either may be the warm start
        model = Model(problem, g)
        model.tiers()
        model.cost()
        model.hint_from(g)
        assert not _violated(model)


# ---------------------------------------------------------------- stability (issue 18)

EDITS = ("none", "raise quota", "grow gang", "change resources", "interrupt spot", "lower budget", "new job", "remove pool",
         "move allowlist", "fail a create")


def _edit(docs: list[dict], kind: str, draw) -> list[dict]:
    """One config edit between plans, as a user makes them."""
    docs = [dict(d, spec=dict(d["spec"])) for d in docs]
    jobs = [d for d in docs if d["kind"] == "Job"]
    if kind == "raise quota":
        for d in docs:
            if d["kind"] == "Tenant" and "quota" in d["spec"]:
                q = dict(d["spec"]["quota"])
                q["gpus"] = q.get("gpus", 0) + 8
                if "burst" in q:
                    q["burst"] = {**q["burst"], "gpus": q["burst"]["gpus"] + 8}
                d["spec"]["quota"] = q
    elif kind == "grow gang":
        for d in jobs:
            if d["spec"].get("replicas", 1) > 1:
                d["spec"]["replicas"] += 1
                break
    elif kind == "change resources" and jobs:
        d = draw(st.sampled_from(jobs))
        res = dict(d["spec"]["resources"])
        if res.get("gpus", 0) >= 2:
            res["gpus"] //= 2
            res["nvlink"] = res.get("nvlink", False) and res["gpus"] >= 2
        elif res.get("mig"):
            res["mig"] = {**res["mig"], "count": 3 - res["mig"]["count"]}
        else:
            res["cpu"] = res["cpu"] / 2
        d["spec"]["resources"] = res
    elif kind == "lower budget":
        for d in docs:
            if d["kind"] == "GuardrailPolicy":
                d["spec"]["max_hourly_budget"] = draw(st.sampled_from([20.0, 60.0]))
    elif kind in ("new job", "fail a create") and jobs:  # (fail a create: a new job, whose apply's first create fails)
        new = dict(draw(st.sampled_from(jobs)))
        new["metadata"] = {"name": "added" if kind == "new job" else "added-late"}
        new["spec"] = dict(new["spec"], priority="critical")
        docs.append(new)
    elif kind == "remove pool" and (pools := _removable_pools(docs)):
        gone = draw(st.sampled_from(pools))  # its instances must go; a job pinned to it alone may go anywhere now
        docs = [d for d in docs if not (d["kind"] == "Pool" and d["metadata"]["name"] == gone)]
        for d in docs:
            if d["kind"] == "Job" and gone in d["spec"].get("pools", ()):
                left = [p for p in d["spec"]["pools"] if p != gone]
                d["spec"] = {k: v for k, v in d["spec"].items() if k != "pools"} | ({"pools": left} if left else {})
    elif kind == "move allowlist" and jobs:
        d = draw(st.sampled_from([d for d in docs if d["kind"] == "Job"]))  # pinned to one pool that serves its kind
        res = d["spec"]["resources"]
        kinds = {None: {"cpu"}, "A10G": {"a10g"}, "A100": {"a100", "a100nv", "gang8", "gang2"},
                 "A100-80GB": {"mig"} if res.get("mig") else {"a100-80"}}[res.get("gpu_type")]
        serves = {p.name: set(p.serves) for p in POOLS}
        d["spec"] = {k: v for k, v in d["spec"].items() if k not in ("pools", "clouds", "regions")}
        d["spec"]["pools"] = [draw(st.sampled_from(sorted(x["metadata"]["name"] for x in docs if x["kind"] == "Pool"
                                                          and serves[x["metadata"]["name"]] & kinds)))]
    return docs


def _removable_pools(docs: list[dict]) -> list[str]:
    """The pools whose kinds of work another pool serves too, and no Reservation names (without them, a job's GPU
    type or a Reservation would have no pool: a config error, which the loader's tests check)."""
    names = [d["metadata"]["name"] for d in docs if d["kind"] == "Pool"]
    serves = {p.name: set(p.serves) for p in POOLS}
    reserved = {"aws-a100"} if any(d["kind"] == "Reservation" for d in docs) else set()  # (its p4d: fleets_with_rules)
    return [n for n in names if n not in reserved and serves[n] <= set().union(*(serves[o] for o in names if o != n))]


def check_stable_run(fleet: Fleet, edits: list[str], draw, time_limit: float = 4) -> None:
    """Plan and apply on the simulated cloud, then after each edit plan (every rule, and no
    eviction, guarantee taken or identical move without a rule: `check_stability`) and apply,
    and plan again: a plan right after an apply changes nothing. (`time_limit`: the default 20 s
    for the mid-size fleets, where 4 s leaves a 126-job cold plan's first tier unsolved.)"""
    from providers.sim import SimCloud
    from reconciler import api
    from reconciler.errors import ApplyError
    from reconciler.state import state_dir

    with tempfile.TemporaryDirectory() as d:
        cfg = write_config(Path(d) / "cfg", fleet.docs)
        docs = fleet.docs
        for step, kind in enumerate(["none", *edits]):
            if kind == "interrupt spot":
                sim = SimCloud(state_dir(cfg))
                spot = sorted(i["id"] for i in sim.instances() if i["state"] == "running" and i["market"] == "spot")
                if spot:
                    sim.interrupt(draw(st.sampled_from(spot)))
            else:
                docs = _edit(docs, kind, draw)
                (cfg / "fleet.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
            # (the plan's clock, to the checks too: without it no job is deadline-critical there, and from 2026-11-29
            # the fixtures' deadlines of 2026-12-01 made jobs critical that the planner let use the on-demand buffer)
            now = datetime.now(timezone.utc)
            res = api.plan(cfg, time_limit=time_limit, now=now)
            check_plan(res.desired, res.observed, res.plan, now=now)
            check_stability(res.desired, res.observed, res.plan)
            if kind == "fail a create" and res.plan.creates:
                # An ordinary capacity error on the first create: the apply fails part-way, and the plan of the fleet it
                # leaves keeps every rule; with the capacity back, its apply converges as any does.
                c = res.plan.creates[0]
                sim = SimCloud(state_dir(cfg))
                sim.exhaust(c.zone, c.instance_type, c.market)
                with pytest.raises(ApplyError):
                    api.apply(cfg, saved_plan=res.plan, time_limit=time_limit, allow_destroy=100)
                sim.exhaust(c.zone, c.instance_type, c.market, restore=True)
                now = datetime.now(timezone.utc)
                res = api.plan(cfg, time_limit=time_limit, now=now)
                check_plan(res.desired, res.observed, res.plan, now=now)
                check_stability(res.desired, res.observed, res.plan)
            api.apply(cfg, saved_plan=res.plan, time_limit=time_limit, allow_destroy=100)
            now = datetime.now(timezone.utc)
            again = api.plan(cfg, time_limit=time_limit, now=now)
            check_plan(again.desired, again.observed, again.plan, now=now)
            check_stability(again.desired, again.observed, again.plan)
            changes = [(j.job, j.action, j.previous, j.instances, j.reason) for j in again.plan.jobs if j.action in ("move", "evict", "place")]
            assert not again.plan.has_changes, (
                f"after edit {step} ({kind}) and its apply, the next plan is not a no-op: {len(again.plan.creates)} creates, "
                f"{len(again.plan.deletes)} deletes, jobs {changes}")


@settings(max_examples=int(os.environ.get("FLEETOPS_STABLE_EXAMPLES", "6")), derandomize=True, database=None, **SETTINGS)
@given(fleet=fleets(max_instances=0), edits=st.lists(st.sampled_from(EDITS), min_size=1, max_size=2, unique=True), data=st.data())
def test_a_plan_after_apply_is_a_no_op_and_edits_take_no_guarantee(fleet, edits, data):
    check_stable_run(fleet, edits, data.draw)
