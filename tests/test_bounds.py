"""Tier bounds that cost less than the LP (reconciler/solve/bounds.py): exact where they are tight, and never below
what the model can reach (a bound below it would prove a warm start optimal that is not)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from ortools.sat.python import cp_model

from reconciler.greedy import greedy
from reconciler.load import load
from reconciler.problem import build_problem
from reconciler.solve.bounds import guaranteed_work_bound, knapsack
from reconciler.solve.model import Model
from reconciler.solve.variables import add_bound, flatten
from tests.fleetkit import catalog_observed, job, pool, tenant, topology, write_config
from tests.test_properties import SETTINGS, fleets


class D:
    def __init__(self, key: str, weight: int, jobs: int):
        self.key, self.weight, self.jobs = key, weight, range(jobs)  # (only its length is read)


def test_the_knapsack_takes_the_most_weight_per_unit_first_and_rounds_the_part_down():
    items = [D("a", 3, 2), D("b", 5, 1), D("c", 7, 1), D("free", 4, 2)]  # per unit: a 1.5, b 1.25, c 1.75
    units = {"a": 2, "b": 4, "c": 4}
    assert knapsack(items, units, 0) == 8  # only what takes none of the row
    assert knapsack(items, units, 4) == 8 + 7  # c whole
    assert knapsack(items, units, 9) == 8 + 7 + 6 + 1  # c, a twice, a quarter of b: 1.25 rounded down
    assert knapsack(items, units, 100) == 8 + 7 + 6 + 5
    assert knapsack(items, units, -3) == 8  # a row already over: nothing more fits


def test_the_knapsack_orders_by_exact_ratio():
    """Weights per unit that a float could not tell apart: the better one first, or the bound falls below the
    optimum. 10**17 + 1 over 10**17 units against 1 over 1: the first is better by 1e-17."""
    items = [D("even", 1, 10**17), D("more", 10**17 + 1, 1)]
    assert knapsack(items, {"even": 1, "more": 10**17}, 10**17) == 10**17 + 1


def model_of(tmp_path, docs) -> Model:
    desired = load(write_config(tmp_path, docs))
    problem = build_problem(desired, catalog_observed(desired))
    model = Model(problem, greedy(problem))
    model.tiers()
    return model


def test_a_tenants_guarantee_less_what_its_higher_classes_take_bounds_its_lower_guaranteed_work(tmp_path):
    """team-a (4 GPUs guaranteed, 6 in all): a critical 2-GPU job and three low 1-GPU jobs; team-b (2 guaranteed):
    two low 2-GPU jobs. With the critical work held at its bound, team-a has 2 GPUs of guarantee for low work and
    team-b 2: two of team-a's low jobs and one of team-b's."""
    a100 = {"gpu_type": "A100", "cpu": 4, "mem": 16}
    docs = [topology(), tenant("team-a", gpus=4, burst={"gpus": 6}), tenant("team-b", gpus=2),
            pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=4),
            job("crit", tenant="team-a", gpus=2, priority="critical", **a100)]
    docs += [job(f"a{i}", tenant="team-a", gpus=1, priority="low", **a100) for i in range(3)]
    docs += [job(f"b{i}", tenant="team-b", gpus=2, priority="low", **a100) for i in range(2)]
    model = model_of(tmp_path, docs)
    low = next(d for d in model.p.demands if "a0" in d.jobs).klass
    crit = next(d for d in model.p.demands if "crit" in d.jobs).klass
    w = {d.jobs[0][0]: d.weight for d in model.p.demands if d.klass == low}
    assert guaranteed_work_bound(model, low, {crit}) == 2 * w["a"] + w["b"]
    assert guaranteed_work_bound(model, low, set()) == 3 * w["a"] + w["b"]  # the critical job may not be there


def tier_max(model: Model, tier, held: list) -> int | None:
    """The tier's best value in the model (every rule) with each of `held` at its bound; None where that is
    infeasible or not proven within the time."""
    sub = model.m.clone()
    for t in held:
        add_bound(sub, t.expr, flatten(t.expr), round(t.bound), "max")
    sub.clear_hints()
    sub.maximize(tier.expr)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.max_time_in_seconds = 10.0
    return round(s.objective_value) if s.solve(sub) == cp_model.OPTIMAL else None


@settings(max_examples=60, derandomize=True, database=None, **SETTINGS)
@given(fleet=fleets(max_jobs=10, max_instances=4))
def test_the_guaranteed_work_bound_is_never_below_what_the_model_reaches(fleet):
    """On random fleets that run work (guarantees, bursts, CPU quotas, budgets, spot shares): each guaranteed work
    tier's best value in the whole model, with the classes above at their bound where the model allows it, is at
    most the bound."""
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), fleet.docs))
    observed = replace(catalog_observed(desired, fleet.instances, fleet.placements), gpu_indices=fleet.gpu_indices)
    problem = build_problem(desired, observed)
    model = Model(problem, greedy(problem))
    work = [t for t in model.tiers() if t.work is not None and t.work[0] == "guaranteed"]
    for i, tier in enumerate(work):
        c = tier.work[1]
        best = tier_max(model, tier, [])
        if best is not None:
            assert best <= guaranteed_work_bound(model, c, set())
        above = work[:i]  # (the tiers come by class, highest first)
        best = tier_max(model, tier, above)
        if best is not None:
            assert best <= guaranteed_work_bound(model, c, {t.work[1] for t in above})
