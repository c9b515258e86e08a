"""Tier bounds that cost less than the LP (reconciler/solve/bounds.py): exact where they are tight, and never below
what the model can reach (a bound below it would prove a warm start optimal that is not)."""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from reconciler.cpsat import cp_model

from reconciler.greedy import greedy
from reconciler.load import load
from reconciler.problem import build_problem
from reconciler.solve.bounds import guaranteed_work_bound, knapsack, tenant_rows_relaxation
from reconciler.solve.model import Model
from reconciler.solve.variables import add_bound, flatten
from tests.fleetkit import catalog_observed, job, pool, tenant, topology, write_config
from tests.test_properties import SETTINGS, fleets


class D:
    def __init__(self, key: str, weight: int, jobs: int):
        self.key, self.weight, self.jobs = key, weight, range(jobs)  # (only its length is read)


def test_the_knapsack_places_whole_jobs():
    items = [D("a", 3, 2), D("b", 5, 1), D("c", 7, 1), D("free", 4, 2)]  # per unit: a 1.5, b 1.25, c 1.75
    units = {"a": 2, "b": 4, "c": 4}
    assert knapsack(items, units, 0) == 8  # only what takes none of the row
    assert knapsack(items, units, 4) == 8 + 7  # c whole
    assert knapsack(items, units, 9) == 8 + 7 + 6  # c and a twice (8 units): no quarter of b, as fractions gave
    assert knapsack(items, units, 100) == 8 + 7 + 6 + 5
    assert knapsack(items, units, -3) == 8  # a row already over: nothing more fits
    # 19 GPUs of guarantee left, jobs of 4 and 8 GPUs (the bench's 100-job fleet): 16 GPUs' worth, not 19's
    assert knapsack([D("four", 40, 3), D("eight", 80, 2)], {"four": 4, "eight": 8}, 19) == 160
    # units in thousandths of a vCPU: divided by their common divisor first, the same answer
    assert knapsack([D("cpu", 5, 10)], {"cpu": 4000}, 18_999) == 20


def test_past_its_table_size_the_knapsack_is_the_fractional_one(monkeypatch):
    from reconciler.solve import bounds

    items, units = [D("a", 3, 1), D("b", 3, 1)], {"a": 2, "b": 3}
    assert knapsack(items, units, 4) == 3  # a or b
    monkeypatch.setattr(bounds, "KNAPSACK_CELLS", 2)
    assert knapsack(items, units, 4) == 3 + 2  # a, and two thirds of b


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 9), st.integers(0, 3)), max_size=5), st.integers(-2, 20))
def test_the_knapsack_is_the_best_of_every_choice_of_whole_jobs(spec, room):
    """Brute force over how many jobs of each demand: the knapsack equals the best that fits, never below it (a bound
    below the optimum would prove a warm start optimal that is not)."""
    items = [D(f"d{i}", w, n) for i, (_, w, n) in enumerate(spec)]
    units = {f"d{i}": a for i, (a, _, _) in enumerate(spec)}
    best = max(sum(w * k for (_, w, _), k in zip(spec, ks)) for ks in itertools.product(*(range(n + 1) for _, _, n in spec))
               if sum(a * k for (a, _, _), k in zip(spec, ks)) <= max(0, room))
    assert knapsack(items, units, room) == best


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
    """The tier's best value in the model (every rule) with each of `held` at its bound (or, a (tier, value) pair,
    at least that value); None where that is infeasible or not proven within the time."""
    sub = model.m.clone()
    for t in held:
        t, value = t if isinstance(t, tuple) else (t, round(t.bound))
        add_bound(sub, t.expr, flatten(t.expr), value, "max")
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


def relaxed_max(model: Model, c: int, held: dict[int, int]) -> int | None:
    m = tenant_rows_relaxation(model, c, held)
    if m is None:
        return None
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.solve(m) == cp_model.OPTIMAL
    return round(s.objective_value)


def test_the_tenants_rows_see_the_room_a_higher_class_held_below_its_bound_leaves(tmp_path):
    """team (4 GPUs guaranteed and in all): normal jobs of 3, 2 and 2 GPUs, and a low 1-GPU job. The normal tier's
    best is the two 2-GPU jobs (4 GPUs), so the normal class is not all placed and the knapsack per row leaves the
    low job its 1 GPU; held at that best, the guarantee has no room left for it."""
    a100 = {"gpu_type": "A100", "cpu": 4, "mem": 16}
    docs = [topology(), tenant("team", gpus=4), pool("p", "gcp", "us-central1", ["us-central1-a"], ["a2-highgpu-8g"], hi=2),
            job("n3", tenant="team", gpus=3, priority="normal", **a100), job("n2a", tenant="team", gpus=2, priority="normal", **a100),
            job("n2b", tenant="team", gpus=2, priority="normal", **a100), job("low", tenant="team", gpus=1, priority="low", **a100)]
    model = model_of(tmp_path, docs)
    klass = {j: d.klass for d in model.p.demands for j in d.jobs}
    weight = {j: d.weight for d in model.p.demands for j in d.jobs}
    normal, low = klass["n2a"], klass["low"]
    best_normal = 2 * weight["n2a"]
    assert relaxed_max(model, normal, {}) == best_normal
    assert guaranteed_work_bound(model, low, set()) == weight["low"]  # (normal is not all placed: not in `full`)
    assert relaxed_max(model, low, {normal: best_normal}) == 0
    assert relaxed_max(model, low, {normal: 0}) == weight["low"]


@settings(max_examples=40, derandomize=True, database=None, **SETTINGS)
@given(fleet=fleets(max_jobs=10, max_instances=4))
def test_the_tenants_rows_relaxation_is_never_below_what_the_model_reaches(fleet):
    """On random fleets that run work: each guaranteed work tier's best value in the whole model, with the tiers
    above held at the best the model reaches for them in turn (as the strategy holds them), is at most the
    relaxation's optimum with the same holds."""
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), fleet.docs))
    observed = replace(catalog_observed(desired, fleet.instances, fleet.placements), gpu_indices=fleet.gpu_indices)
    problem = build_problem(desired, observed)
    model = Model(problem, greedy(problem))
    holds: list = []
    for tier in [t for t in model.tiers() if t.work is not None and t.work[0] == "guaranteed"]:
        best = tier_max(model, tier, holds)
        if best is None:
            break
        bound = relaxed_max(model, tier.work[1], {t.work[1]: v for t, v in holds})
        assert bound is None or best <= bound, (tier.name, best, bound, [(t.name, v) for t, v in holds])
        holds.append((tier, best))
