"""The packed plan's tenant spot share (reconciler/plan/tenant_spot.py): on plain data, then through the planner.

settle_tenant_spot takes spot work out where the packer left out on-demand work the solver counted
in a tenant's share: new spot work first, then running spot work as a last resort. The last resort
never takes a job inside its tenant's guarantee (TenantRules.protected_jobs) for a share the fleet
as it runs keeps (README, Tenants: running work inside the guarantee gives way only to a higher
class of its own tenant, a rule its own placement breaks, or a fleet-wide rule the fleet as it runs
breaks; apply's re-check refuses such an evict). The planner reaches the last resort where the
packer drops on-demand work the solver counted and only running spot work is left to take
(tests/test_rules.py's reduced fleet12 with t2's CPU job running on spot, below); a protected job there
moves onto on-demand room instead, a repair instance if need be.
"""

from __future__ import annotations

from reconciler.model import SpotPolicySpec
from reconciler.observe import Observed
from reconciler.pack import Bin
from reconciler.plan.packing import Packing
from reconciler.plan.tenant_spot import settle_tenant_spot
from reconciler.problem import Capacity, Demand, Host, Problem, TenantRules
from reconciler.site import Site


def host(key: str, market: str) -> Capacity:
    return Host(key=key, site=Site("p", "sim", "gcp", "r", "z", "t", market), gpus=0,
                    gpu_type=None, cpu=8.0, memory_gib=64.0, price=1.0, on_demand_price=1.0, mig=None, instance_id=key)


def cpu_job(name: str, running_on: str | None = None) -> Demand:
    return Demand(key=name, jobs=(name,), replicas=1, bundle=1, tenant="t", gpus=0, gpu_type=None, mig=None, nvlink=False, cpu=1.0,
                  memory_gib=1.0, priority=100, spot="allowed", gang_mode="zone", pools=None, regions=None, clouds=None, zones=None,
                  data_location=None, data_gib=0.0, hours=1.0, running=((name, (running_on,)),) if running_on else ())


def settle(protected: tuple[str, ...], placements: dict[str, tuple[str, ...]], keep_h2: bool = False):
    """Tenant t, max spot share 0.5, on a spot host h1 and an on-demand host h2: `running` (1 CPU job) runs on h1
    and `od` on h2 in `placements`. The solver kept `running` on h1, put `new` there too and moved `od` (its host
    must go) to a new on-demand instance; the packer could not pack `od`. With `keep_h2` the plan keeps h2 too (empty).
    Returns (drops, new items left on h1), and the packing."""
    h1, h2 = host("h1", "spot"), host("h2", "on-demand")
    demands = {"running": cpu_job("running", placements.get("running", (None,))[0]), "new": cpu_job("new"),
               "od": cpu_job("od", placements.get("od", (None,))[0])}
    tenants = {"t": TenantRules(name="t", weight=1.0, cap={}, guarantee={}, spot_fraction=0.5, protected_jobs=protected)}
    problem = Problem(demands=tuple(demands.values()), capacities=(h1, h2), groups={}, pool_bounds={"p": (0, 10)}, tenants=tenants,
                      desired_spot=SpotPolicySpec(), placement=None, budget=None, fleet_capacity={})
    observed = Observed(instances=(), offerings=(), placements=placements)
    b = Bin.empty(h1, "h1")
    b.reserve(demands["running"], [()])  # (staying where it runs, as the packer keeps a resident)
    assert b.place(demands["new"], "new", 0) is not None
    slots = {"running": ["h1"], "new": [None], "od": [None]}
    bins_of = {"h1": [b]} | ({"h2": [Bin.empty(h2, "h2")]} if keep_h2 else {})
    packing = Packing(bins_of, {}, {}, {"od"}, {"p": len(bins_of)}, {"all": 0.0, "spot": 0.0}, lambda c: 0.0)  # (no repair: more_of None)
    drops = settle_tenant_spot(problem, observed, slots, packing, {"h1": h1, "h2": h2}, demands)
    return drops, [job for _, job, _ in b.items], packing


def test_the_last_resort_never_takes_a_protected_job_for_a_share_the_fleet_keeps():
    """As it runs, t has 1 of 2 work units on spot (its share holds). With `od` left unpacked, `running` + `new`
    are 2 of 2: dropping `new` leaves 1 of 1, still over, and the last resort evicted `running`, inside t's
    guarantee (apply's re-check then refused the plan). Now `running` stays and only the new work waits."""
    drops, left, _ = settle(("running",), {"running": ("h1",), "od": ("h2",)})
    assert list(drops) == ["new"] and left == []
    assert drops["new"].startswith("tenant spot share: t's placed work would be 2 of 2 work units on spot, over its "
                                   "max_spot_fraction 0.5")  # (true of the plan with `new` in it)
    assert "inside its guarantee" in drops["new"] and "running" in drops["new"]


def test_a_protected_job_moves_onto_on_demand_room_the_plan_keeps_instead():
    """The same fleet with h2 (on-demand, empty) kept: `running` moves there, which leaves t at 1 of 2 work units
    on spot, within its share, so `new` stays too and nothing waits."""
    drops, left, packing = settle(("running",), {"running": ("h1",), "od": ("h2",)}, keep_h2=True)
    assert drops == {} and left == ["new"]
    assert [job for _, job, _ in packing.bins_of["h2"][0].items] == ["running"]
    assert packing.moved["running"].startswith("tenant spot share: moves onto on-demand room")


def test_the_last_resort_still_takes_running_work_outside_the_guarantee():
    """The same fleet with `running` borrowed (not protected): the last resort takes it, as before."""
    drops, left, _ = settle((), {"running": ("h1",), "od": ("h2",)})
    assert set(drops) == {"new", "running"}


def test_a_protected_job_gives_way_to_a_share_the_fleet_as_it_runs_breaks():
    """As it runs, t has 1 of 1 work units on spot (`od` not placed yet): the fleet breaks t's share now, a rule
    that requires something to give (README, Tenants), so the last resort takes `running` as before."""
    drops, left, _ = settle(("running",), {"running": ("h1",)})
    assert set(drops) == {"new", "running"}


# ---------------------------------------------------------------- through the planner: fleet12 (issue 18), reduced


def _fleet12(tmp_path, big_runs_in_zone: str | None):
    """tests/test_rules.py's reduced fleet12 with t2's CPU job `small` running on the spot instance i1 (inside t2's
    guarantee: protected) and, if given, t2's 4-GPU NVLink job `big` running on an on-demand p4d in that zone. The
    solver counts `big` (on a new p4d) in t2's share; the packer cannot pack it (2 + 2 GPUs left, pool at max) where
    the offers' instances are summed, as a large offer's are (the tests below that need it: `aggregate_only`; with
    per-instance rows the plan places `big` and `small` keeps running: the last test here)."""
    from dataclasses import replace

    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.plancheck import recheck
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.fleetkit import catalog_observed, instance, reduced_fleet12, write_config

    docs, running = reduced_fleet12()
    placements = {"gang0": ("i0",) * 3, "small": ("i1",)}
    gpus = {"gang0": ((0, 1), (2, 3), (4, 5))}
    if big_runs_in_zone:
        running.append(instance("i2", "gpu", "aws", "us-east-1", big_runs_in_zone, "p4d.24xlarge"))
        placements["big"], gpus["big"] = ("i2",), ((0, 1, 2, 3),)
    desired = load(write_config(tmp_path, docs))
    observed = replace(catalog_observed(desired, running, placements), gpu_indices=gpus)
    problem = build_problem(desired, observed)
    assert problem.tenants["t2"].protected_jobs == ("small",)
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=5, workers=1))
    return desired, observed, plan, recheck(plan, desired, observed, problem)[1]


def test_a_protected_spot_job_stops_for_the_share_the_running_fleet_breaks(tmp_path, aggregate_only):
    """As it runs, t2 has 1 of 1 work units on spot (`small` alone): over its 0.5 share, so something must give,
    and `small` stops (the oracle and apply's re-check agree)."""
    from tests.invariants import check_plan

    desired, observed, plan, refused = _fleet12(tmp_path, None)
    small = next(j for j in plan.jobs if j.job == "small")
    assert small.action == "evict" and small.reason.startswith("tenant spot share: t2's placed work would be 1 of 1")
    check_plan(desired, observed, plan)
    assert refused == []


def test_a_protected_spot_job_keeps_running_when_the_running_fleet_keeps_the_share(tmp_path, aggregate_only):
    """As it runs, t2 has 1 of 29 work units on spot (`big` on i2, on-demand): its share holds. i2 is in a zone the
    pool no longer has, so `big` must move, and the packer cannot pack it. The plan evicted `small`, inside t2's
    guarantee, and apply's re-check refused it for that; then it kept `small` on spot (1 of 1, over the share).
    Then `small` moved onto a repair on-demand n2-standard-16 where the packer dropped `big`; since the moves tier
    (solve/objective.moves_tier) the search moves `big` onto a p4d it packs, and `small` stays where it runs, its
    tenant at 1 of 29 work units on spot."""
    from tests.invariants import check_plan

    desired, observed, plan, refused = _fleet12(tmp_path, "us-east-1c")
    jobs = {j.job: j for j in plan.jobs}
    small = jobs["small"]
    assert small.action in ("keep", "move"), small
    if jobs["big"].action == "evict":  # (the packer dropped it: small alone on spot would break the share)
        assert "could not be packed" in jobs["big"].reason
        assert small.action == "move" and small.reason.startswith("tenant spot share: moves onto on-demand room"), small
    else:
        assert (jobs["big"].action, small.action) == ("move", "keep"), jobs
    check_plan(desired, observed, plan)
    assert not any("small" in e for e in refused)


def test_the_plan_keeping_a_protected_spot_job_also_keeps_the_share(tmp_path):
    """Was a strict xfail: the plan kept `small` on spot, 1 of 1, which apply's re-check refused and the oracle
    flagged (t2 over its share, a rule the fleet as it runs keeps)."""
    from tests.invariants import check_plan, check_stability

    desired, observed, plan, refused = _fleet12(tmp_path, "us-east-1c")
    assert refused == []
    check_plan(desired, observed, plan)
    check_stability(desired, observed, plan)
    jobs = {j.job: j for j in plan.jobs}  # (the two p4d modelled one by one: `big` packs, so t2's share holds with `small`)
    assert jobs["big"].action == "move" and jobs["small"].action == "keep" and plan.solver.repairs == plan.solver.unpacked == 0
