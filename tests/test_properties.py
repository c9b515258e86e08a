"""Property tests: on random small fleets the solver's answer always keeps the rules.

The checks (tests/invariants.py) re-derive every rule from the desired state and
the catalog; they share no code with the solver model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.greedy import greedy
from reconciler.load import load
from reconciler.plan import make_plan
from reconciler.problem import build_problem
from reconciler.solve import solve
from tests.fleetkit import catalog_observed, doc, instance, job, pool, tenant, topology, write_config
from tests.invariants import check_plan

POOLS = [
    pool("a100", "gcp", "us-central1", ["us-central1-a", "us-central1-b"], ["a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"], market="either", hi=4),
    pool("p4d", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], market="either", hi=2),
    pool("a10g", "aws", "us-east-1", ["us-east-1a"], ["g5.xlarge", "g5.12xlarge"], market="spot", hi=3),
    pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=3),
]
SHAPES = [(1, "A100", 8, 60), (2, "A100", 16, 120), (4, "A100", 40, 300), (8, "A100", 90, 1000),
          (1, "A10G", 4, 16), (4, "A10G", 40, 160), (0, None, 4, 16), (0, None, 12, 48)]

jobs_st = st.lists(
    st.tuples(st.sampled_from(SHAPES), st.integers(1, 3), st.sampled_from(["eligible", "never", "required"]),
              st.sampled_from(["t1", "t2"]), st.sampled_from(["low", "normal", "high"])),
    min_size=1, max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=jobs_st, q1=st.integers(0, 24), q2=st.integers(0, 24), spot_frac=st.sampled_from([0.3, 0.6, 1.0]),
       budget=st.sampled_from([None, 20.0, 80.0]), existing=st.integers(0, 3))
def test_solver_answer_keeps_every_rule(jobs, q1, q2, spot_frac, budget, existing):
    docs = [topology(), tenant("t1", gpus=q1), tenant("t2", gpus=q2, cpu=32), *POOLS,
            doc("SpotPolicy", "sp", {"max_spot_fraction": spot_frac})]
    if budget is not None:
        docs.append(doc("GuardrailPolicy", "g", {"max_hourly_budget": budget}))
    for i, ((g, gt, cpu, mem), reps, spot, ten, prio) in enumerate(jobs):
        reps = reps if g >= 4 else 1
        docs.append(job(f"j{i}", tenant=ten, gpus=g, gpu_type=gt, cpu=cpu, mem=mem, replicas=reps, spot=spot, priority=prio))
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs))
    insts = [instance(f"i{k}", "a100", "gcp", "us-central1", "us-central1-a", "a2-highgpu-8g") for k in range(existing)]
    insts.append(instance("icpu", "cpu", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge"))
    observed = catalog_observed(desired, insts)
    problem = build_problem(desired, observed)
    solution = solve(problem, time_limit=5, workers=1)
    plan = make_plan(desired, observed, problem, solution)
    check_plan(desired, observed, plan)
    # Greedy best-fit is a valid answer too, and CP-SAT (warm-started from it) never places less work.
    g = greedy(problem)
    gplan = make_plan(desired, observed, problem, solve(problem, time_limit=0))
    check_plan(desired, observed, gplan)
    assert solution.work >= g.work
    if solution.optimal:
        assert solution.cost_milli / 1000 <= g.cost + 0.01 or solution.work > g.work  # costs are rounded to 0.1 cent
    # Whenever nothing binds (no quota, spot or budget limits), all placeable work is placed.
    if solution.optimal:
        for j in plan.jobs:
            if j.action == "pending":
                assert j.reason, j


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
