"""Greedy's pool minimums: a pool whose minimum greedy cannot buy (no offer it may open, the budget refusing and no kept
host giving way) leaves the minimums of the pools after it to be bought. Greedy had returned there, and its plan left an
affordable pool empty: apply's re-check refuses such a plan (plancheck._pool_min_errors), so a greedy-fallback plan
could not be applied."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.load import load
from reconciler.plan import make_plan
from reconciler.plancheck import recheck
from reconciler.problem import build_problem
from reconciler.solve import solve
from tests.fleetkit import catalog_observed, doc, pool, tenant, topology, write_config
from tests.invariants import check_plan


POOLS = [pool("a-gpu", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], lo=1, hi=1),
         pool("b-cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.xlarge"], lo=1, hi=1)]


def _greedy_plan(desired, observed):
    """Greedy best-fit's plan, and what apply's re-check says of it."""
    problem = build_problem(desired, observed)
    assert list(problem.pool_bounds) == ["a-gpu", "b-cpu"]  # (the order pool_minimums walks them in)
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=0))
    return plan, recheck(plan, desired, observed, problem)[1]


def test_a_minimum_greedy_cannot_buy_leaves_a_later_pools_minimum_to_be_bought(tmp_path):
    """Pool a-gpu's one offer (p4d in us-east-1a) is in a capacity cool-off: its minimum cannot be met. Pool b-cpu's
    m6i.xlarge can: greedy's plan buys it, and apply's re-check takes the plan."""
    desired = load(write_config(tmp_path, [topology(), tenant("t"), *POOLS]))
    plan, errors = _greedy_plan(desired, catalog_observed(desired, short={("aws", "us-east-1a", "p4d.24xlarge", "on-demand")}))
    assert [c.site.pool for c in plan.creates] == ["b-cpu"]
    assert errors == []


def test_a_minimum_the_budget_refuses_keeps_no_budget_from_a_later_pools_minimum(tmp_path):
    """The p4d's price now is $30/h (the catalog's $21.96 passed load's bound under the $25/h budget): pool a-gpu's
    minimum does not fit the budget. Its $30 is not kept back from b-cpu's m6i.xlarge ($0.192/h), which is bought."""
    desired = load(write_config(tmp_path, [topology(), tenant("t"), doc("GuardrailPolicy", "g", {"max_hourly_budget": 25.0}),
                                           *POOLS]))
    observed = catalog_observed(desired)
    dear = tuple(replace(po, offering=replace(po.offering, on_demand_price=30.0)) if po.pool == "a-gpu" else po
                 for po in observed.offerings)
    plan, errors = _greedy_plan(desired, replace(observed, offerings=dear))
    assert [c.site.pool for c in plan.creates] == ["b-cpu"]
    assert errors == []


def test_the_oracle_excuses_a_minimum_a_cool_off_keeps_unmet_as_apply_does(tmp_path):
    """tests/invariants.py judged pool minimums by its own rule (only a cloud quota excused a pool under its minimum):
    it failed this plan, which apply's re-check takes (pool a-gpu's only offer is in a capacity cool-off). It now asks
    apply's rule (plancheck.pool_min_errors), and still fails a plan that leaves b-cpu's affordable minimum unbought."""
    desired = load(write_config(tmp_path, [topology(), tenant("t"), *POOLS]))
    observed = catalog_observed(desired, short={("aws", "us-east-1a", "p4d.24xlarge", "on-demand")})
    plan, errors = _greedy_plan(desired, observed)
    assert errors == []
    check_plan(desired, observed, plan)
    bare = replace(plan, creates=())
    assert any("b-cpu" in e for e in recheck(bare, desired, observed, build_problem(desired, observed))[1])
    with pytest.raises(AssertionError, match="pool b-cpu: the plan leaves 0 instances"):
        check_plan(desired, observed, bare)
