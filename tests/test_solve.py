"""The pure core: problem -> CP-SAT -> plan, on plain data (no files, no providers)."""

from __future__ import annotations

import pytest

from reconciler.load import load
from reconciler.plan import make_plan
from reconciler.problem import build_problem
from reconciler.solve import solve
from reconciler.topology import TopologyIndex
from tests.fleetkit import catalog_observed, doc, instance, job, plan_for, pool, tenant, topology, write_config
from tests.invariants import check_plan


def by_job(plan):
    return {j.job: j for j in plan.jobs}


def test_packs_small_jobs_onto_the_cheapest_capacity(tmp_path):
    # Eight 1-GPU A100 jobs: one p4d.24xlarge ($21.96/h at the catalog's public price, after AWS's 2025 cut)
    # beats one a2-highgpu-8g or eight a2-highgpu-1g ($29.39 either way): all eight pack onto the one p4d.
    docs = [topology(), tenant("t"),
            pool("aws", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"]),
            pool("gcp", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g", "a2-highgpu-1g"])]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=8, mem=60) for i in range(8)]
    plan = plan_for(tmp_path, docs)
    assert all(j.action == "place" for j in plan.jobs)
    assert plan.cost_after == pytest.approx(21.9576, abs=0.01)
    assert [c.instance_type for c in plan.creates] == ["p4d.24xlarge"]
    assert plan.solver.optimal


def test_gang_is_all_or_nothing_and_in_one_zone(tmp_path):
    docs = [topology(), tenant("t"),
            pool("p", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=3)]
    docs.append(job("gang", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=3))
    docs.append(job("big", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=4, priority="critical"))
    plan = plan_for(tmp_path, docs)
    jobs = by_job(plan)
    # Only 3 instances allowed: the 4-replica gang can never run, the 3-replica one can.
    assert jobs["big"].action == "pending" and "max_instances" in jobs["big"].reason
    assert jobs["gang"].action == "place" and len(set(jobs["gang"].instances)) == 3
    assert len({c.zone for c in plan.creates}) == 1


def test_gang_never_spans_zones_even_when_zone_capacity_is_split(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=4)]
    docs.append(job("g", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2))
    a = instance("i-a", "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
    b = instance("i-b", "p", "aws", "us-east-1", "us-east-1b", "p4d.24xlarge")
    plan = plan_for(tmp_path, docs, [a, b])
    g = by_job(plan)["g"]
    # Keeping one existing instance and buying one more in its zone beats spanning a and b.
    assert g.action == "place"
    assert len(plan.creates) == 1 and len(plan.deletes) == 1


def test_quota_is_exact(tmp_path):
    docs = [topology(), tenant("t", gpus=3), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"])]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=4, mem=16) for i in range(5)]
    plan = plan_for(tmp_path, docs)
    placed = [j for j in plan.jobs if j.action == "place"]
    pending = [j for j in plan.jobs if j.action == "pending"]
    assert len(placed) == 3 and len(pending) == 2
    assert all("quota exhausted: tenant t uses 3/3 GPUs" in j.reason for j in pending)


def test_burst_is_the_hard_cap(tmp_path):
    docs = [topology(), doc("Tenant", "t", {"quota": {"gpus": 2, "burst": {"gpus": 4}}}),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"])]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=4, mem=16) for i in range(6)]
    plan = plan_for(tmp_path, docs)
    assert sum(j.action == "place" for j in plan.jobs) == 4


def test_priority_wins_scarce_capacity(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=2)]
    docs += [job(f"low{i}", gpus=1, gpu_type="A100", cpu=4, mem=16, priority="low") for i in range(3)]
    docs.append(job("vip", gpus=1, gpu_type="A100", cpu=4, mem=16, priority="critical"))
    plan = plan_for(tmp_path, docs)
    jobs = by_job(plan)
    assert jobs["vip"].action == "place"
    assert sum(j.action == "place" for j in plan.jobs) == 2
    pending = [j for j in plan.jobs if j.action == "pending"]
    assert all("max_instances" in j.reason for j in pending)


def test_spot_rules(tmp_path):
    docs = [topology(), tenant("t"),
            pool("spot", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="spot"),
            pool("od", "gcp", "us-central1", ["us-central1-b"], ["a2-highgpu-1g"], market="on-demand"),
            job("never", gpus=1, gpu_type="A100", cpu=4, mem=16, spot="never"),
            job("required", gpus=1, gpu_type="A100", cpu=4, mem=16, spot="required"),
            job("eligible", gpus=1, gpu_type="A100", cpu=4, mem=16)]
    plan = plan_for(tmp_path, docs)
    market = {c.ref: c.market for c in plan.creates}
    jobs = by_job(plan)
    assert market[jobs["never"].instances[0]] == "on-demand"
    assert market[jobs["required"].instances[0]] == "spot"
    assert market[jobs["eligible"].instances[0]] == "spot"  # cheaper


def test_max_spot_fraction_and_price_cap(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], market="either"),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5})]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=4, mem=16) for i in range(4)]
    plan = plan_for(tmp_path, docs)
    assert sorted(c.market for c in plan.creates) == ["on-demand", "on-demand", "spot", "spot"]
    docs[-5] = doc("SpotPolicy", "sp", {"max_price_fraction": 0.1})  # spot is ~30% of on-demand: too dear
    plan = plan_for(tmp_path / "b", docs)
    assert {c.market for c in plan.creates} == {"on-demand"}


def test_min_instance_types_for_spot(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], market="spot"),
            doc("SpotPolicy", "sp", {"min_instance_types": 2})]
    docs += [job(f"j{i}", gpus=1, gpu_type="A10G", cpu=2, mem=8) for i in range(2)]
    plan = plan_for(tmp_path, docs)
    assert {c.instance_type for c in plan.creates} == {"g5.xlarge", "g5.12xlarge"}


def test_budget_and_region_guardrails(tmp_path):
    docs = [topology(), tenant("t"),
            pool("east", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"]),
            pool("west", "aws", "us-west-2", ["us-west-2a"], ["p3.2xlarge"]),
            doc("GuardrailPolicy", "g", {"max_hourly_budget": 8.0, "allowed_regions": ["us-central1", "aws/us-east-1"]})]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=4, mem=16) for i in range(4)]
    docs.append(job("v100", gpus=1, gpu_type="V100", cpu=4, mem=16))
    # The west pool is outside allowed_regions: the loader refuses it outright.
    from reconciler.errors import ConfigError
    with pytest.raises(ConfigError, match="not in GuardrailPolicy/g allowed_regions"):
        load(write_config(tmp_path / "a", docs))
    docs = [d for d in docs if d["metadata"]["name"] not in ("west", "v100")]
    plan = plan_for(tmp_path / "b", docs)
    assert sum(j.action == "place" for j in plan.jobs) == 2  # 2 x $3.67 fits $8, a third does not
    pend = [j for j in plan.jobs if j.action == "pending"]
    assert all("budget" in j.reason for j in pend)


@pytest.mark.parametrize("which", ["fleet", "tenant"])
def test_a_budget_filled_to_the_micro_dollar_is_the_same_rule_for_cp_sat_and_greedy(tmp_path, which):
    """Issue 18: the budget was two rules. Four p4d.24xlarge at $21.957642 cost $87.830568/h; under that budget
    greedy (exact sums) bought all four, and the model (each price rounded up to $21.958, the budget down to
    $87.830) refused the fourth: CP-SAT could not complete greedy's answer and the plan was greedy's
    (GREEDY_FALLBACK), as on every generated fleet whose greedy answer lands within cents of its budget. The same
    for a tenant's budget, charged per replica. Now every budget counts whole micro-dollars (ledger.micro)."""
    budget = round(4 * 21.957642, 6)
    guard = {"max_hourly_budget": budget} if which == "fleet" else {"tenant_hourly_budgets": {"t": budget}}
    docs = [topology(), tenant("t"), pool("p4d", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=10),
            doc("GuardrailPolicy", "g", guard)]
    docs += [job(f"j{i}", gpus=8, gpu_type="A100", cpu=90, mem=1000, spot="never") for i in range(5)]
    plan = plan_for(tmp_path, docs)
    assert plan.solver.status == "OPTIMAL", plan.solver.note
    assert len(plan.creates) == 4 and sum(j.action == "place" for j in plan.jobs) == 4
    assert "budget" in next(j.reason for j in plan.jobs if j.action == "pending")


def test_no_pool_offers_reason(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"]),
            job("a", gpus=1, gpu_type="A100", cpu=4, mem=16, regions=["us-east-1"]),
            job("fat", gpus=1, gpu_type="A100", cpu=64, mem=16),
            job("cpu", cpu=2, mem=4)]
    plan = plan_for(tmp_path, docs)
    jobs = by_job(plan)
    assert jobs["a"].reason.startswith("no pool offers 1x A100 in an allowed region")
    assert "large enough" in jobs["fat"].reason
    assert "CPU jobs do not run on GPU instances" in jobs["cpu"].reason


def test_an_empty_allowlist_is_a_config_error_not_a_job_that_waits_for_ever(tmp_path):
    """`regions: []` allowed no region and the job waited, with a reason (it read the empty list as no allowlist once,
    and blamed 'the pool, market and spot price rules'); `clouds: []` waited saying "job allows: any", and `pools: []`
    was refused for the GPU type its pools () did not offer. An empty allowlist is a template's mistake far more often
    than a wish: it is refused where it is written (tests/test_load.py has the message)."""
    from reconciler.errors import ConfigError
    from reconciler.load import load

    for field in ("regions", "clouds", "pools"):
        docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"]),
                job("nowhere", gpus=1, gpu_type="A100", cpu=4, mem=16, **{field: []})]
        with pytest.raises(ConfigError) as e:
            load(write_config(tmp_path / field, docs))
        assert f"Job/nowhere: spec.{field}: Value error, an empty list allows nothing" in str(e.value), str(e.value)


def test_placement_refusal_names_the_first_rule_or_only_the_rules_asked():
    """One function a placement rule: placement_refusal asks them all in one order (the reason a plan gives for an
    instance a job may not stay on), or only those named (the diagnosis of pending work asks step by step);
    rules_allow and fit read the same answer."""
    from dataclasses import replace

    from reconciler.problem import Demand, Offer, fit, placement_refusal, rules_allow
    from reconciler.site import Site

    c = Offer(key="c", site=Site("p", "sim", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", "spot"), gpus=1, gpu_type="A100", cpu=12, memory_gib=85, price=1.0, on_demand_price=3.0)
    d = Demand(key="d", jobs=("j",), replicas=1, bundle=1, tenant="t", gpus=1, gpu_type="A100", mig=None, nvlink=False, cpu=4, memory_gib=16,
               priority=10, spot="never", gang_mode="zone", pools=frozenset({"q"}), regions=None, clouds=None, zones=None,
               data_location=None, data_gib=0, hours=1)
    assert placement_refusal(d, c) == "the job's spot: never excludes spot instances"
    assert placement_refusal(d, c, ("pools",)) == "the job's pools allowlist (q) excludes pool p"
    assert placement_refusal(d, c, ("kind", "gpus", "nvlink", "zones")) is None
    assert not rules_allow(d, c) and fit(d, c) == 0
    free = replace(d, spot="eligible", pools=None)
    assert rules_allow(free, c) and fit(free, c) == 1
    two = replace(free, gpus=2)
    assert placement_refusal(two, c) == "its instance does not offer 2 whole A100 GPUs" and placement_refusal(two, c, ("kind",)) is None


def test_running_jobs_stay_put_and_idle_instances_go(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g"])]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=4, mem=16) for i in range(2)]
    insts = [instance(f"i{k}", "p", "gcp", "us-central1", z, "a2-highgpu-1g")
             for k, z in enumerate(["us-central1-a", "us-central1-b", "us-central1-b"])]
    plan = plan_for(tmp_path, docs, insts, placements={"j0": ("i0",), "j1": ("i2",)})
    assert not plan.creates
    assert [d.instance_id for d in plan.deletes] == ["i1"]
    assert {j.job: j.action for j in plan.jobs} == {"j0": "keep", "j1": "keep"}


def test_drifted_and_orphaned_instances_are_replaced(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"]),
            job("j", gpus=1, gpu_type="A100", cpu=4, mem=16)]
    drifted = instance("i-drift", "p", "gcp", "us-central1", "us-central1-b", "a2-highgpu-1g")  # zone b left the pool
    orphan = instance("i-orphan", "gone", "gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")
    plan = plan_for(tmp_path, docs, [drifted, orphan], placements={"j": ("i-drift",)})
    reasons = {d.instance_id: d.reason for d in plan.deletes}
    assert "drifted" in reasons["i-drift"] and "no longer in the desired state" in reasons["i-orphan"]
    assert by_job(plan)["j"].action == "move"


def test_zone_in_capacity_cool_off_is_avoided(tmp_path):
    docs = [topology(), tenant("t"), pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g"]),
            job("j", gpus=1, gpu_type="A100", cpu=4, mem=16, spot="never")]
    plan = plan_for(tmp_path, docs, short={("gcp", "us-central1-a", "a2-highgpu-1g", "on-demand"), ("gcp", "us-central1-b", "a2-highgpu-1g", "on-demand")})
    assert by_job(plan)["j"].action == "pending" and "cool-off" in by_job(plan)["j"].reason
    plan = plan_for(tmp_path / "b", docs, short={("gcp", "us-central1-a", "a2-highgpu-1g", "on-demand")})
    assert [c.zone for c in plan.creates] == ["us-central1-b"]


def test_egress_pulls_work_to_the_data(tmp_path):
    docs = [topology(), tenant("t"),
            pool("aws", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge"]),
            pool("aws-west", "aws", "us-west-2", ["us-west-2a"], ["g5.xlarge"]),
            job("j", gpus=1, gpu_type="A10G", cpu=2, mem=8, spot="never", data={"location": "aws/us-west-2", "size_gib": 5000}, expected_hours=1)]
    plan = plan_for(tmp_path, docs)
    assert plan.creates[0].region == "us-west-2"


def test_topology_shortest_paths():
    from reconciler.load import load as _load  # noqa: F401
    from reconciler.model import TopologySpec
    spec = TopologySpec.model_validate(topology(links=[{"from": "aws/us-east-1", "to": "gcp/us-central1", "latency_ms": 20, "egress_per_gb": 0.01}])["spec"])
    idx = TopologyIndex(spec)
    assert idx.distance("aws/us-east-1", "aws", "us-east-1", "us-east-1a").egress_per_gb == 0
    assert idx.distance("aws/us-east-1", "aws", "us-west-2", "us-west-2a").egress_per_gb == pytest.approx(0.02)
    assert idx.distance("aws/us-east-1", "gcp", "us-central1", "us-central1-a").egress_per_gb == pytest.approx(0.01)
    # Azure is reached over the internet: out of aws (0.01 to the cloud node) + 0.09 + into the region (0.01).
    assert idx.distance("aws/us-east-1", "azure", "eastus", "eastus-1").egress_per_gb == pytest.approx(0.11)


def test_greedy_fallback_is_valid_and_said_so(tmp_path):
    """When CP-SAT has no answer in time, the plan is greedy best-fit and says so."""
    from reconciler.greedy import greedy
    docs = [topology(), tenant("t", gpus=6), pool("p", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-8g"], hi=3),
            pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=2)]
    docs += [job(f"j{i}", gpus=1, gpu_type="A100", cpu=4, mem=16) for i in range(5)]
    docs.append(job("gang", gpus=8, gpu_type="A100", cpu=90, mem=600, replicas=2, priority="low"))
    desired = load(write_config(tmp_path, docs))
    observed = catalog_observed(desired)
    problem = build_problem(desired, observed)
    g = greedy(problem)
    solution = solve(problem, time_limit=0)  # no time for CP-SAT at all
    assert solution.status == "GREEDY_FALLBACK" and not solution.optimal
    plan = make_plan(desired, observed, problem, solution)
    check_plan(desired, observed, plan)
    # Greedy buys the cheapest instance per job (a2-highgpu-1g) until the pool's max of 3 stops it; then it swaps its own
    # small instance for an a2-highgpu-8g that holds the waiting jobs too (greedy._place_upgrading): all five placed.
    assert solution.work == g.work and plan.counts()["place"] == 5
    from reconciler.render import render_human
    text = render_human(plan)
    assert "greedy best-fit only (--time-limit 0)" in text and "a --time-limit above 0 has CP-SAT search for a better one" in text
    # With time, CP-SAT proves that is the most work there is (one 8-GPU instance holds all five jobs), at no more cost.
    full = solve(problem, time_limit=10)
    assert full.optimal and full.work == g.work
    assert sum(full.placed.values()) == 5
    assert make_plan(desired, observed, problem, full).cost_after <= plan.cost_after + 1e-9


def test_room_evictions_free_is_offered_within_a_bound(tmp_path, monkeypatch):
    """Hosts where some pending work may evict a resident are offered to every pending group (the room an eviction
    frees fits other work too), but at most FREED_PAIRS (group, host) pairs of them: at 5,436 running instances of
    a 10k-job fleet after a 5% reclaim, such hosts were nearly all of them, and the drift model grew from 119,601 to
    662,883 variables (28 s -> 224 s of CPU; the wall cap made it greedy's). Here a normal job may evict any of 12
    low residents, and 6 pending low groups (which may evict nobody) are offered those 12 hosts; bounded to 24
    pairs over the 7 pending groups, 3 hosts a group. The plan still evicts low work for the normal job and is sound."""
    import reconciler.solve.model as model_mod
    from reconciler.solve.model import Model
    from reconciler.solve.strategy import warm_start

    hosts = [instance(f"i{n}", "p", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge") for n in range(12)]
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=12, hi=12)]
    docs += [job(f"low{n}", cpu=12, mem=8, priority="low") for n in range(12)]
    docs += [job("urgent", cpu=14, mem=8, priority="normal")]
    docs += [job(f"more{n}", cpu=5 + n / 10, mem=8, priority="low") for n in range(6)]  # six shapes: six groups
    desired = load(write_config(tmp_path / "cfg", docs))
    observed = catalog_observed(desired, hosts, {f"low{n}": (f"i{n}",) for n in range(12)})
    problem = build_problem(desired, observed)

    def low_groups_on_hosts(m) -> dict[str, int]:
        out: dict[str, int] = {}
        for gk, ck in m.x:
            d = m.demands[problem.groups[gk][0]]
            if ck.startswith("i") and d.jobs[0].startswith("more"):
                out[gk] = out.get(gk, 0) + 1
        return out

    assert sorted(low_groups_on_hosts(Model(problem, warm_start(problem))).values()) == [12] * 6  # every group, every host
    monkeypatch.setattr(model_mod, "FREED_PAIRS", 24)
    assert sorted(low_groups_on_hosts(Model(problem, warm_start(problem))).values()) == [3] * 6
    sol = solve(problem, time_limit=5)
    plan = make_plan(desired, observed, problem, sol)
    check_plan(desired, observed, plan)
    assert {j.job: j.action for j in plan.jobs}["urgent"] == "place"


def test_a_placement_group_gang_running_on_a_spot_and_an_on_demand_instance_of_one_type_stays():
    """A placement-group gang's rule is one zone and one instance type (problem.gang_split, as plancheck and the README
    say); its market is not part of it. Greedy kept such a gang only on one offer (pool, zone, type, market) and the
    model keyed its site by offer, so a gang running on a spot and an on-demand instance was re-placed, or evicted
    with the pool at max_instances (fleet19). Plain data: the pool is at max 2, both hosts run g; it stays in both."""
    from reconciler.greedy import greedy
    from reconciler.model import PlacementPolicySpec, SpotPolicySpec
    from reconciler.problem import Demand, Host, Offer, Problem, TenantRules, gang_split
    from reconciler.site import Site

    def site(market):
        return Site("p", "sim", "azure", "eastus", "eastus-1", "nc24", market)

    shape = dict(gpus=1, gpu_type="A100-80GB", cpu=24.0, memory_gib=220.0, price=3.7, on_demand_price=3.7)
    spot, od = (Host(key=k, site=site(m), **shape, instance_id=k, residents=(("g", "g", 1),)) for k, m in (("i1", "spot"), ("i2", "on-demand")))
    offers = tuple(Offer(key=f"p/eastus-1/nc24/{m}", site=site(m), **shape, max_new=1) for m in ("spot", "on-demand"))
    g = Demand(key="g", jobs=("g",), replicas=2, bundle=1, tenant="t", gpus=1, gpu_type="A100-80GB", mig=None, nvlink=False, cpu=8.0,
               memory_gib=60.0, priority=1, spot="eligible", gang_mode="placement-group", pools=None, regions=None, clouds=None, zones=None,
               data_location=None, data_gib=0.0, hours=24.0, running=(("g", ("i1", "i2")),))
    problem = Problem(demands=(g,), capacities=(spot, od, *offers), groups={"gg": ("g",)}, pool_bounds={"p": (0, 2)},
                      tenants={"t": TenantRules("t", 1.0, {}, {})}, desired_spot=SpotPolicySpec(max_spot_fraction=1.0),
                      placement=PlacementPolicySpec(), budget=None, fleet_capacity={"gpus": 2.0, "cpu": 48.0, "memory_gib": 440.0})
    assert spot.offer_key != od.offer_key and not gang_split(g, [spot, od])
    a = greedy(problem)
    assert a.placed["g"] == 1 and a.stay == {("g", "i1"): 1, ("g", "i2"): 1}, (a.placed, a.stay)
    sol = solve(problem, time_limit=2)
    assert sol.status == "OPTIMAL" and sol.placed["g"] == 1 and sol.keep == {"i1", "i2"}, (sol.status, sol.placed, sol.keep)


def test_running_work_is_offered_hosts_with_room_within_a_bound_and_the_plan_says_it_was(tmp_path, monkeypatch):
    """Work that runs and has nothing waiting may only move (a consolidation, a move for a higher class); every host
    with room for one of its items was a variable, and at 20k jobs after a 5% reclaim (6,210 such groups, ~132 hosts
    with room each) that was 818k of the model's 1.11M placements and a 324 s plan. Within MOVE_PAIRS, each such group
    is offered the hosts that fit it tightest and, in turn, a run of the others (index.spread), so the groups see
    every host between them. Here 12 jobs of 6 shapes (6 groups) run one per 16-vCPU instance, two fit one: bounded
    to 8 hosts a group, the plan still halves the fleet, and it claims no optimum of a model that left choices out."""
    import reconciler.solve.model as model_mod
    from reconciler.render import render_human
    from reconciler.solve.model import Model
    from reconciler.solve.strategy import warm_start

    hosts = [instance(f"i{n:02d}", "p", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge") for n in range(12)]
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=12)]
    docs += [job(f"r{n}", cpu=6 + (n % 6) / 10, mem=8) for n in range(12)]
    desired = load(write_config(tmp_path / "cfg", docs))
    observed = catalog_observed(desired, hosts, {f"r{n}": (f"i{n:02d}",) for n in range(12)})
    problem = build_problem(desired, observed)

    def hosts_offered(m) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for gk, ck in m.x:
            if ck.startswith("i"):
                out.setdefault(gk, set()).add(ck)
        return out

    whole = Model(problem, warm_start(problem))
    assert len(hosts_offered(whole)) == 6 and all(len(at) == 12 for at in hosts_offered(whole).values())
    assert whole.narrowed == 0
    monkeypatch.setattr(model_mod, "MOVE_PAIRS", 6)
    narrow = Model(problem, warm_start(problem))
    offered = hosts_offered(narrow)
    assert all(len(at) == model_mod.MOVE_LEAST == 8 for at in offered.values())
    assert set().union(*offered.values()) == {h.id for h in hosts}  # every host, between the groups
    assert narrow.narrowed == 6 * (12 - 8)
    sol = solve(problem, time_limit=5)
    plan = make_plan(desired, observed, problem, sol)
    check_plan(desired, observed, plan)
    assert len(plan.deletes) == 6 and plan.counts()["evict"] == 0 and plan.counts()["pending"] == 0
    assert not plan.solver.optimal and plan.solver.narrowed == 24
    line = next(x for x in render_human(plan).splitlines() if x.startswith("CP-SAT"))
    assert "of the choices offered" in line and "24 (job group, instance) choices not offered" in line


def test_waiting_work_is_offered_hosts_with_room_within_a_bound_but_never_fewer_than_it_needs(tmp_path, monkeypatch):
    """Work that waits is offered, within ROOM_PAIRS a type class, hosts with room (and, apart, hosts where it may evict
    a resident), never fewer than MOVE_LEAST nor than its waiting items, so the hosts a group is offered could hold all
    of it. 12 instances each run a 6-vCPU job and have room for one more; three 5-vCPU jobs of three shapes wait
    alone, and ten 4-vCPU ones of one shape. Bounded to 8 hosts a lone job and 10 for the ten, the plan still places
    all 13 in that room and buys nothing."""
    import reconciler.solve.model as model_mod
    from reconciler.solve.model import Model

    hosts = [instance(f"i{n:02d}", "p", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge") for n in range(12)]
    docs = [topology(), tenant("t"), pool("p", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], hi=12)]
    docs += [job(f"r{n}", cpu=6, mem=8) for n in range(12)]
    docs += [job(f"one{n}", cpu=5 + n / 10, mem=8) for n in range(3)] + [job(f"ten{n}", cpu=4, mem=8) for n in range(10)]
    desired = load(write_config(tmp_path / "cfg", docs))
    observed = catalog_observed(desired, hosts, {f"r{n}": (f"i{n:02d}",) for n in range(12)})
    problem = build_problem(desired, observed)

    def hosts_offered(m) -> dict[str, int]:
        out: dict[str, int] = {}
        for gk, ck in m.x:
            name = m.demands[problem.groups[gk][0]].jobs[0]
            if ck.startswith("i") and not name.startswith("r"):
                out[name[:3]] = out.get(name[:3], 0) + 1
        return out

    assert hosts_offered(Model(problem)) == {"one": 36, "ten": 12}  # (no warm start: its hosts are always offered)
    monkeypatch.setattr(model_mod, "ROOM_PAIRS", 4)
    assert hosts_offered(Model(problem)) == {"one": 3 * 8, "ten": 10}
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=5))
    check_plan(desired, observed, plan)
    assert plan.counts()["place"] == 13 and not plan.creates and plan.solver.narrowed
