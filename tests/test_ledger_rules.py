"""The ledger's rule arithmetic on plain numbers, and the copies of the rules it replaced agreeing with it.

Each fleet-wide rule (pool limits, budgets, quotas, spot shares, the on-demand buffer, diversity) is one small
function in reconciler/ledger.py that greedy, the packer's repairs, the freezer, the Ledger's refusals and broken
rules, the guardrail re-check and the model's coefficients call. tests/invariants.py keeps its own copy.
"""

from __future__ import annotations

from reconciler.ledger import (Ledger, borrow_room, borrowed_share, budget_ok, buffer_ok, buffer_use, charge, diversity_ok, fair_share_level, item_units,
                               milli_down, micro, pool_min_ok, pool_ok, quota_ok, share_row, share_weight, spot_share_ok, within, work_units)
from reconciler.model import SpotPolicySpec
from reconciler.problem import Capacity, Demand, Host, Problem, TenantRules
from reconciler.site import Site


def cap(key: str, market: str = "on-demand", gpus: int = 0, cpu: float = 8.0, price: float = 1.0, mig=None) -> Capacity:
    return Host(key=key, site=Site("p", "sim", "gcp", "r", "z", "t", market), gpus=gpus,
                    gpu_type="A100" if gpus else None, cpu=cpu, memory_gib=64.0, price=price, on_demand_price=price, mig=mig,
                    instance_id=key)


def demand(key: str = "d", gpus: int = 0, cpu: float = 1.0, mig=None, tenant: str = "t", deadline_critical: bool = False) -> Demand:
    return Demand(key=key, jobs=(key,), replicas=1, bundle=1, tenant=tenant, gpus=gpus, gpu_type="A100" if gpus or mig else None, mig=mig,
                  nvlink=False, cpu=cpu, memory_gib=1.0, priority=100, spot="allowed", gang_mode="zone", pools=None, regions=None,
                  clouds=None, zones=None, data_location=None, data_gib=0.0, hours=1.0, deadline_critical=deadline_critical)


def problem(caps, spot: SpotPolicySpec | None = None, tenants=None, budget=None) -> Problem:
    return Problem(demands=(), capacities=tuple(caps), groups={}, pool_bounds={"p": (0, 10)}, tenants=tenants or {},
                   desired_spot=spot or SpotPolicySpec(), placement=None, budget=budget, fleet_capacity={})


# ---------------------------------------------------------------- the functions, at and past their limits


def test_a_borrowed_share_is_use_above_the_guarantee_at_most_the_room_over_the_fleet_and_weight():
    """README, Tenants: the one measure greedy lends borrowed jobs by and the model's fair-share tier equalises."""
    r = TenantRules(name="t", weight=2.0, cap={"gpus": 12.0}, guarantee={"gpus": 4.0}, dominant="gpus")
    fleet = {"gpus": 40.0}
    assert borrow_room(r, "gpus") == 8.0 and borrow_room(r, "cpu") == float("inf")
    assert borrowed_share(r, {"gpus": 3.0}, fleet) == 0.0  # within its guarantee: nothing borrowed
    assert borrowed_share(r, {"gpus": 10.0}, fleet) == 6 / 40 / 2
    assert borrowed_share(r, {"gpus": 20.0}, fleet) == 8 / 40 / 2  # (no more than its room above the guarantee)
    assert borrowed_share(r, {"gpus": 10.0}, {"gpus": 0.0}) == 0.0  # no such capacity: no share counted
    light = TenantRules(name="l", weight=1e-9, cap={"gpus": 12.0}, guarantee={"gpus": 4.0}, dominant="gpus")
    assert borrowed_share(light, {"gpus": 5.0}, fleet) == 1 / 40 / 1e-3
    assert share_weight(1e-9) == 1e-3 and share_weight(2.0) == 2.0  # (the one floor, which the model's step reads too)
    assert fair_share_level([(10.0, 1e-9), (10.0, 1.0)], 1.0) == 1.0 / (1e-3 + 1.0)


def test_every_ledger_name_another_module_imports_is_exported():
    """`__all__` says what the ledger offers: `borrowed_share`, the fair-share measure greedy and the model's tier are
    defined by, and ten more imported names were missing from it, so `from reconciler.ledger import *` and the
    readers of `__all__` did not see them."""
    import ast

    from reconciler import ledger
    from tests.fleetkit import ROOT

    imported = set()
    for path in [*ROOT.glob("reconciler/**/*.py"), *ROOT.glob("bench/*.py"), *ROOT.glob("policies/*.py"), *ROOT.glob("providers/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "reconciler.ledger":
                imported |= {a.name for a in node.names}
    assert imported and not imported - set(ledger.__all__), sorted(imported - set(ledger.__all__))
    assert all(hasattr(ledger, n) for n in ledger.__all__)


def test_budgets_count_whole_micro_dollars_up_to_the_budget():
    assert micro(21.957642) == 21_957_642 and micro(15.3) == 15_300_000 and micro(0.1 + 0.2) == 300_000
    assert budget_ok(100_000_000, 100.0) and not budget_ok(100_000_001, 100.0)  # a micro-dollar over is over
    assert budget_ok(sum(map(micro, [0.1, 0.2])), 0.3)  # no float drift: the sum of the integers is exact
    assert budget_ok(10**15, None)  # no budget
    assert within(0.1 + 0.2, 0.3)  # the other rules' float sums: 0.30000000000000004 is within 0.3


def test_the_model_row_greedy_and_the_recheck_agree_at_the_edge_of_a_budget():
    """The budget was two rules: the model rounded each price up to the milli-dollar and the budget down, the ledger
    summed floats. Four p4d at $21.957642 fill a $87.830568 budget exactly: the ledger took them and the model
    (4 x 21.958 = 87.832 > 87.830) refused them, so CP-SAT could not complete greedy's answer. Now both count
    micro-dollars and agree."""
    p4d = cap("p4d", gpus=8, price=21.957642)
    led = Ledger(problem([p4d], budget=4 * 21.957642))
    for i in range(3):
        led.add_instance(f"i{i}", p4d)
    assert led.refuses_open(p4d) is None  # the fourth fits exactly
    led.add_instance("i3", p4d)
    assert led.refuses_open(p4d) == "fleet-budget" and not led.broken_rules()
    assert 4 * micro(p4d.price) <= micro(4 * 21.957642)  # the CP-SAT row's coefficients (solve/fleet_rules) hold it too


def test_pool_limits_count_whole_instances():
    assert pool_ok(9, 1, 10) and not pool_ok(10, 1, 10) and not pool_ok(8, 3, 10)
    assert pool_ok(12, 0, 12) and not pool_ok(13, 0, 12)  # a pool over its max now: broken
    assert pool_min_ok(2, 2) and not pool_min_ok(1, 2) and pool_min_ok(0, 0)


def test_quotas_add_what_is_needed_to_what_is_used():
    assert quota_ok(6.0, 2.0, 8.0) and not quota_ok(6.0, 2.5, 8.0)
    assert quota_ok(0.0, 8.0, 8.0) and not quota_ok(0.0, 9.0, 8.0)


def test_spot_share_compares_spot_with_the_fraction_of_all():
    assert spot_share_ok(5.0, 10.0, 0.5) and not spot_share_ok(6.0, 10.0, 0.5)
    assert spot_share_ok(0.0, 0.0, 0.0) and not spot_share_ok(1.0, 1.0, 0.0)
    assert spot_share_ok(10.0, 10.0, 1.0)


def test_the_buffer_is_a_percentage_of_spot_kept_idle_on_demand():
    assert buffer_ok(10.0, 100.0, 10) and not buffer_ok(9.0, 100.0, 10)
    assert buffer_ok(0.0, 0.0, 50)  # no spot: nothing to land
    assert buffer_ok(0.0, 100.0, 0)  # no buffer asked
    assert buffer_ok(10.0 - 1e-12, 100.0, 10) and not buffer_ok(10.0 - 1e-10, 100.0, 10)  # tolerance on idle x 100


def test_diversity_asks_for_both_types_and_zones():
    assert diversity_ok(2, 2, 2, 2) and not diversity_ok(1, 3, 2, 1) and not diversity_ok(3, 1, 1, 2)


def test_units_a_mig_item_is_its_slices_of_a_gpu_and_deadline_critical_work_takes_no_buffer():
    mig = demand(mig=("3g.40gb", 1))
    assert work_units(mig) == 3 and item_units(mig, "gpus") == 3 / 7 and buffer_use(mig, "gpus") == 3 / 7
    gpu = demand(gpus=2, cpu=16)
    assert work_units(gpu) == 14 and item_units(gpu, "gpus") == 2 and item_units(gpu, "cpu") == 16
    assert buffer_use(demand(gpus=2, deadline_critical=True), "gpus") == 0
    assert work_units(demand(cpu=4)) == 1


def test_charges_are_the_share_of_the_instance_price():
    assert charge(demand(gpus=2), cap("c", gpus=8, price=40.0)) == 10.0
    assert charge(demand(mig=("1g.10gb", 4)), cap("m", gpus=8, price=40.22, mig=("1g.10gb",) * 7)) == 40.22 * (4 / 56)
    assert charge(demand(cpu=2), cap("cpu", cpu=8, price=0.4)) == 0.1


def test_model_coefficients_round_bound_prices_down_and_hold_fractions_exactly():
    assert milli_down(99.9999) == 99999
    assert share_row(0.5) == (1000, 500) and share_row(0.3333) == (10000, 3333)


# ---------------------------------------------------------------- copies that disagreed before


def test_a_job_the_ledger_lets_into_the_buffer_leaves_no_broken_buffer():
    """The room refusal compared idle - taken >= percent/100 x spot - 1e-9, the new-instance refusal, broken_rules
    and greedy idle x 100 >= percent x spot - 1e-9: a job taking the buffer's last 5e-10 vCPU was allowed, and the
    fleet it left broke the buffer by the ledger's own broken_rules. Now both read buffer_ok (README: idle on-demand
    capacity >= the percentage of spot, the x 100 form four of the five copies had)."""
    od, spot = cap("od", cpu=10.0), cap("spot", market="spot", cpu=100.0)
    led = Ledger(problem([od, spot], SpotPolicySpec(on_demand_buffer_percent=10)))
    led.add_instance("od", od)
    led.add_instance("spot", spot)
    tiny = demand("tiny", cpu=5e-10)
    allowed = not led._buffer_refusals(tiny, [od])
    led.add_item(tiny, "tiny", "od")
    assert allowed == ("spot-buffer" not in led.broken_rules())


def test_a_tenant_over_its_budget_by_a_fraction_is_over_it_everywhere():
    """broken_rules (and the guardrail re-check, plancheck) allowed 1e-6 over a budget, the refusals, greedy and
    the packer 1e-9: a tenant charged 5e-7 over its budget could take no more work, yet its budget was 'kept'."""
    c = cap("c", gpus=1, price=1.0 + 5e-7)
    led = Ledger(problem([c], tenants={"t": TenantRules("t", 1.0, {}, {}, budget=1.0)}))
    led.add_instance("c", c)
    led.add_item(demand("j", gpus=1), "j", "c")
    refused = any(r.rule == "tenant-budget" for r in led.tenant_refusals(demand("k", gpus=1), []))
    assert refused == ("tenant-budget:t" in led.broken_rules())


def test_the_rules_broken_now_hold_the_running_fleets_own():
    """plancheck.unlawful_evictions reads rules_broken_now alone, where it read it `|` the running ledger's
    broken_rules (a ledger of the whole fleet built twice a plan: ~0.1 s of CPU of a 5k-job PR plan). The same only
    while rules_broken_now keeps every rule the fleet as it runs breaks, with the running ledger's words; here the
    staying fleet (a host that must go left out) breaks other rules than the running one."""
    from dataclasses import replace

    from reconciler.ledger import running_ledger, rules_broken_now

    h1 = replace(cap("h1", price=3.0), residents=(("d", "d", 1),))
    h2 = replace(cap("h2", market="spot", price=1.0), residents=(("e", "e", 1),), keep_blocker="its pool was removed")
    d = replace(demand("d"), running=(("d", ("h1",)),))
    e = replace(demand("e"), running=(("e", ("h2",)),))
    p = replace(problem([h1, h2], spot=SpotPolicySpec(max_spot_fraction=0.2), budget=2.0), demands=(d, e))
    running = running_ledger(p).broken_rules()
    assert {"budget", "spot-share"} <= running.keys()
    now = rules_broken_now(p)
    assert now == now | running and list(now) == list(now | running)
