"""Greedy keeps its state in the ledger (reconciler/ledger.py, issue 16): the rule that stops greedy placing a job is
the rule the finished plan's ledger names for it, and the ledger's totals come back exactly when greedy takes away
what it added (it gives up a spot host, undoes a gang it could not heal)."""

from __future__ import annotations

import pytest

from reconciler.greedy import greedy
from reconciler.ledger import ExactSum, Ledger, LicenseRules, QuotaBook
from reconciler.load import load
from reconciler.model import SpotPolicySpec
from reconciler.plan import make_plan
from reconciler.problem import Capacity, Demand, Host, Offer, Problem, TenantRules, fit
from reconciler.site import Site
from reconciler.solve import solve
from tests.fleetkit import catalog_observed, doc, job, pool, tenant, topology, write_config
from tests.invariants import check_plan

A100 = dict(gpus=1, gpu_type="A100", cpu=8, mem=60)  # one a2-highgpu-1g ($3.67/h) each


def one_gpu_pool(hi: int) -> dict:
    return pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-1g"], hi=hi)


# One rule each that lets one of two identical 1-GPU jobs in and refuses the second.
REFUSING = {
    "tenant-budget": [tenant("t"), one_gpu_pool(5), doc("GuardrailPolicy", "g", {"tenant_hourly_budgets": {"t": 5.0}})],
    "fleet-budget": [tenant("t"), one_gpu_pool(5), doc("GuardrailPolicy", "g", {"max_hourly_budget": 5.0})],
    "pool-max": [tenant("t"), one_gpu_pool(1)],
    "quota": [tenant("t", gpus=1), one_gpu_pool(5)],
    "license": [tenant("t"), one_gpu_pool(5), doc("License", "matlab", {"count": 1})],
}


@pytest.mark.parametrize("rule", sorted(REFUSING))
def test_the_rule_greedy_refuses_a_job_with_is_the_rule_the_plans_ledger_names(tmp_path, rule):
    """Greedy asked its own running totals before, beside the Ledger explain reads; now it asks the Ledger, and
    says which rule refused (Assignment.refused): the same rule the ledger of greedy's plan names for the job."""
    lic = {"licenses": {"matlab": 1}} if rule == "license" else {}
    docs = [topology(), *REFUSING[rule], job("j0", **A100, **lic), job("j1", **A100, **lic)]
    desired = load(write_config(tmp_path, docs))
    observed = catalog_observed(desired)
    from reconciler.problem import build_problem

    problem = build_problem(desired, observed)
    (d,) = problem.demands  # the two identical jobs are one demand
    a = greedy(problem)
    assert a.placed[d.key] == 1
    assert a.refused == {d.key: (rule,)}

    plan = make_plan(desired, observed, problem, solve(problem, time_limit=0))  # greedy's plan
    check_plan(desired, observed, plan)
    from reconciler.ledger import plan_ledger

    led = plan_ledger(problem, plan.creates, plan.kept, [(j.job, j.instances) for j in plan.jobs if j.instances])
    blanket = {r.rule for r in (led.quota_refusal(d), led.license_refusal(d)) if r is not None}
    named = blanket | {r.rule for o in led.options(d, fit) for r in o.refusals}
    assert named == {rule}
    (pending,) = [j for j in plan.jobs if not j.instances]
    assert pending.reason  # the plan says why, from that ledger


# ---------------------------------------------------------------- add, then remove: the exact totals again


def cap(key: str, market: str = "on-demand", gpus: int = 8, price: float = 0.1, zone: str = "z1", existing: bool = True, mig=None) -> Capacity:
    site = Site("p", "sim", "aws", "r", zone, "p4d", market)
    shape = dict(gpus=gpus, gpu_type="A100", cpu=96.0, memory_gib=1152.0, price=price, on_demand_price=price, mig=mig)
    return Host(key=key, site=site, **shape, instance_id=key) if existing else Offer(key=key, site=site, **shape)


def demand(key: str, gpus: int = 1, cpu: float = 0.7, mig=None, tenant: str = "t", licenses=()) -> Demand:
    return Demand(key=key, jobs=(key,), replicas=1, bundle=1, tenant=tenant, gpus=gpus, gpu_type="A100", mig=mig,
                  nvlink=False, cpu=cpu, memory_gib=1.3, priority=100, spot="allowed", gang_mode="zone", pools=None, regions=None,
                  clouds=None, zones=None, data_location=None, data_gib=0.0, hours=1.0, licenses=licenses)


def totals(led: Ledger) -> dict:
    spot_types, spot_zones = led.spot_sites()
    return {"cost": led.cost(), "pools": led.pool_count("p"), "spot": led.spot(), "idle": led.idle_on_demand(),
            "charges": {t: v for t, v in led.tenant_charges().items() if v}, "use": {t: led.tenant_use(t) for t in ("t", "u")},
            "tenant_spot": {t: led.tenant_spot(t) for t in ("t", "u")}, "licenses": dict(led.licenses.held),
            "cloud_quota": list(led.quotas.taken), "spot_sites": (spot_types, spot_zones), "jobs": dict(led.jobs)}


def test_adding_and_removing_instances_items_and_jobs_returns_the_ledger_to_its_exact_totals():
    """Greedy adds and takes away thousands of times (a spot host given up, a heal undone); a running `+=` drifts
    (0.1 + 0.2 - 0.2 is 0.10000000000000003), and a budget compared at its limit would then read differently after
    an undo. The totals are exact sums: after add then remove they are equal bit for bit, not approximately."""
    from providers.base import Quota

    mig = ("1g.10gb",) * 56
    quota = Quota(cloud="aws", region="r", name="P instances", unit="vCPUs", limit=1000.0, used=96.0,
                  counts=(("p4d", "on-demand", 96.0), ("p4d", "spot", 96.0)))
    problem = Problem(demands=(), capacities=(cap("h0"),), groups={}, pool_bounds={"p": (0, 10)},
                      tenants={"t": TenantRules("t", 1.0, {}, {}, budget=50.0), "u": TenantRules("u", 1.0, {}, {}, spot_fraction=0.5)},
                      desired_spot=SpotPolicySpec(on_demand_buffer_percent=10), placement=None, budget=None, fleet_capacity={},
                      licenses={"matlab": LicenseRules("matlab", 3, {})}, quotas=(quota,))
    led = Ledger(problem)
    led.add_instance("h0", cap("h0", price=0.1))
    led.add_instance("h1", cap("h1", price=0.2, mig=mig))
    a, m = demand("a"), demand("m", gpus=0, mig=("1g.10gb", 3), licenses=(("matlab", 1),))
    led.add_item(a, "a", "h0")
    led.add_item(m, "m", "h1")
    before = totals(led)
    assert before["idle"] == 16 - 1 - 3 / 7 and before["licenses"] == {"matlab": 1}

    # More of every kind: a new spot instance (cloud quota, spot share, diversity), a MIG item (sevenths of a GPU),
    # items of another tenant on spot, a job booked apart from its items (as greedy books identical jobs).
    led.add_instance("new#0", cap("o1", market="spot", price=0.7, zone="z2", existing=False))
    b, c = demand("b", tenant="u", cpu=0.3), demand("c", gpus=0, mig=("1g.10gb", 5), tenant="u", licenses=(("matlab", 2),))
    led.add_item(b, "b", "new#0")
    led.add_item(a, "a2", "h0")
    led.add_item(c, None, "h1")
    led.add_job(c, "c#0")
    led.add_item(m, "m", "h1")  # the job m's second item
    during = totals(led)
    assert during != before and during["licenses"] == {"matlab": 3} and during["cloud_quota"] == [96]

    led.remove_item(m, "m", "h1")
    led.remove_job("c#0")
    led.remove_item(c, None, "h1")
    led.remove_item(b, "b", "new#0")
    led.remove_instance("new#0")
    led.remove_item(a, "a2", "h0")
    assert totals(led) == before
    assert led.items == {"h0": [(a, "a")], "h1": [(m, "m")]}


def test_an_exact_sum_is_back_to_its_value_after_taking_away_what_was_added():
    s = ExactSum()
    for x in (0.1, 0.2, 3.67, 1 / 7):
        s.add(x)
    start = s.value
    naive = start
    for x in (0.7, 1e-9, 2 / 7, 1234.5678):
        s.add(x)
        naive += x
    for x in (1234.5678, 2 / 7, 1e-9, 0.7):
        s.add(-x)
        naive -= x
    assert s.value == start
    assert naive != start  # what the running += it replaces gives for the same steps


def test_a_ledger_refuses_an_instance_its_cloud_quota_has_no_room_for_counting_what_is_planned():
    """refuses_open counts the instances a plan being made would buy (greedy plans a gang's instances before it
    opens any): the quota's headroom is 904 vCPUs, 9 instances of 96."""
    from providers.base import Quota
    from reconciler.ledger import Pending

    quota = Quota(cloud="aws", region="r", name="P instances", unit="vCPUs", limit=1000.0, used=96.0,
                  counts=(("p4d", "on-demand", 96.0),))
    offer = cap("o", existing=False)
    led = Ledger(Problem(demands=(), capacities=(offer,), groups={}, pool_bounds={"p": (0, 20)}, tenants={}, desired_spot=SpotPolicySpec(),
                         placement=None, budget=None, fleet_capacity={}, quotas=(quota,)))
    pending = Pending()
    for _ in range(8):
        assert led.refuses_open(offer, 1, pending) is None
        pending.open(offer, 8)
    assert led.refuses_open(offer, 1, pending) is None  # the 9th
    pending.open(offer, 8)
    assert led.refuses_open(offer, 1, pending) == "cloud-quota"
    assert QuotaBook((quota,)).short(offer, 10) is not None


def test_one_quota_rule_a_tenant_over_its_gpu_ceiling_may_still_take_a_job_that_needs_no_gpu():
    """The model's quota rows leave out the dimensions a job needs none of (solve/tenants.py); greedy and backfill
    asked `refuses_job`, which refused any job of a tenant over its ceiling in any dimension, while explain's
    `quota_refusal` skipped them: two readings of one rule. Both read `quota_short` now."""
    offer = cap("o", existing=False)
    problem = Problem(demands=(), capacities=(cap("h0"), offer), groups={}, pool_bounds={"p": (0, 5)},
                      tenants={"t": TenantRules("t", 1.0, {"gpus": 1.0, "cpu": 10.0}, {})}, desired_spot=SpotPolicySpec(),
                      placement=None, budget=None, fleet_capacity={})
    led = Ledger(problem)
    led.add_instance("h0", cap("h0"))
    led.add_item(demand("a", gpus=2, cpu=1.0), "a", "h0")  # t uses 2 GPUs of its 1 (a quota lowered under running work)
    cpu_only, gpu_job, big_cpu = demand("c", gpus=0, cpu=2.0), demand("g", gpus=1, cpu=1.0), demand("b", gpus=0, cpu=9.5)
    assert led.refuses_job(cpu_only) is None and led.quota_refusal(cpu_only) is None
    assert led.refuses_job(gpu_job) == "quota" == led.quota_refusal(gpu_job).rule
    assert "uses 2/1 GPUs" in led.quota_refusal(gpu_job).message
    assert led.quota_short(big_cpu) == ("cpu", 1.0, 9.5, 10.0) and led.refuses_job(big_cpu) == "quota"
