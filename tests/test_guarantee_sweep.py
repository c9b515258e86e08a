"""A seeded sweep of fleets where a tenant runs identical jobs on mixed hosts, some inside its guarantee and some not
(fleet116, fleet117): the solver counts a class of identical jobs, so it could keep an unguaranteed one and stop the
guaranteed twin while claiming its "guarantees kept" tier. Two checks per fleet:

- the plan of CP-SAT's own answer (no after-check, no greedy in its place), searched with a stand-in counted only in
  its room, and the emitted plan keep what their "guarantees kept" tier claims (plan.quality.guarantee_kept), so the
  tier's proven bound is true of the plan it is about (the first search counts stand-ins anywhere: its claim may only
  be looser, fleet143);
- no plan stops a tenant's guaranteed job while running on an identical job of that tenant its guarantee does not
  hold (the guaranteed one could take its place);
- and both plans keep every rule (test_properties.check_fleet).

The CI tier runs a few seeds; `-m slow` runs the sweep (fleet122, fleet123 came from it)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from providers.base import Instance
from reconciler.plan import make_plan
from reconciler.plan.quality import guarantee_kept
from reconciler.problem import build_problem
from reconciler.problem.types import GUARANTEES_TIER
from reconciler.solve import solve
from tests.test_properties import Fleet, check_fleet, solve_both

SHAPE = {"cpu": 4, "gpu_type": "A10G", "gpus": 1, "memory_gib": 16}
TYPES = {"g5.xlarge": 1, "g5.12xlarge": 4}


def identical_jobs_fleet(seed: int) -> Fleet:
    """t1 runs 2-5 identical 1-GPU A10G jobs (its guarantee holds 1-3), t2 runs or asks for a few of that shape, on
    1-3 instances of mixed types and markets; a budget, a spot fraction and the placement policy drawn too."""
    rnd = random.Random(seed)
    guarantee = rnd.randint(1, 3)
    quota: dict = {"gpus": guarantee}
    if rnd.random() < 0.3:
        quota["burst"] = {"gpus": guarantee + rnd.randint(1, 2)}
    docs: list[dict] = [
        {"apiVersion": "fleetops.io/v1alpha1", "kind": "Topology", "metadata": {"name": "test"},
         "spec": {"clouds": {"aws": {"regions": {"us-east-1": {"zones": ["us-east-1a", "us-east-1b"]}}}}}},
        {"apiVersion": "fleetops.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t1"}, "spec": {"quota": quota}},
        {"apiVersion": "fleetops.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t2"},
         "spec": {"quota": {"gpus": rnd.randint(1, 3)}} if rnd.random() < 0.4 else {}},
        {"apiVersion": "fleetops.io/v1alpha1", "kind": "Pool", "metadata": {"name": "a10g"},
         "spec": {"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a", "us-east-1b"], "instance_types": list(TYPES),
                  "market": rnd.choice(["either", "either", "on-demand"]), "min_instances": 0, "max_instances": rnd.randint(2, 4)}},
        {"apiVersion": "fleetops.io/v1alpha1", "kind": "SpotPolicy", "metadata": {"name": "sp"},
         "spec": {"max_spot_fraction": rnd.choice([1.0, 1.0, 0.5])}},
        {"apiVersion": "fleetops.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "pp"},
         "spec": {"consolidation": rnd.choice(["WhenEmpty", "WhenUnderutilized"]), "preemption": rnd.choice(["Never", "LowerPriority"])}},
    ]
    budget = rnd.choice([None, 4.0, 6.0, 7.0, 9.0])
    if budget is not None:
        docs.append({"apiVersion": "fleetops.io/v1alpha1", "kind": "GuardrailPolicy", "metadata": {"name": "g"},
                     "spec": {"max_hourly_budget": budget}})
    instances, free = [], {}
    for i in range(rnd.randint(1, 3)):
        itype = rnd.choice(list(TYPES))
        instances.append(Instance(id=f"i{i}", provider="sim", cloud="aws", region="us-east-1", zone=rnd.choice(["us-east-1a", "us-east-1b"]),
                                  instance_type=itype, market=rnd.choice(["spot", "on-demand"]), state="running", pool="a10g",
                                  tags={"fleetops.io/fleet": "test", "fleetops.io/pool": "a10g"}, launched_at="", placement_group=""))
        free[f"i{i}"] = list(range(TYPES[itype]))
    placements, indices = {}, {}
    jobs = [("t1", "normal")] * rnd.randint(2, 5) + [("t2", rnd.choice(["low", "normal", "high", "critical"])) for _ in range(rnd.randint(1, 3))]
    for n, (tenant, priority) in enumerate(jobs):
        name = f"j{n}"
        docs.append({"apiVersion": "fleetops.io/v1alpha1", "kind": "Job", "metadata": {"name": name},
                     "spec": {"tenant": tenant, "priority": priority, "replicas": 1, "resources": dict(SHAPE), "spot": "eligible"}})
        room = [i for i, gpus in free.items() if gpus]
        if room and (tenant == "t1" or rnd.random() < 0.6):
            at = rnd.choice(room)
            placements[name] = (at,)
            indices[name] = ((free[at].pop(0),),)
    return Fleet(docs=docs, instances=instances, placements=placements, gpu_indices=indices)


def claimed(plan) -> int | None:
    return next((t.get("value") for t in plan.solver.tiers if t.get("name") == GUARANTEES_TIER), None)


def twin_stopped(problem, plan) -> list[str]:
    """The guaranteed jobs a plan stops while it keeps an identical running job of theirs (one demand) that the
    guarantee does not hold."""
    placed = {j.job for j in plan.jobs if j.action in ("keep", "move")}
    protected = {j for r in problem.tenants.values() for j in r.protected_jobs}
    out = []
    for d in problem.demands:
        running = [j for j, _ in d.running]
        if any(j not in protected and j in placed for j in running):
            out += [j for j in running if j in protected and j not in placed]
    return out


def check_guarantees(seed: int, time_limit: float = 3) -> None:
    """The emitted plan's "guarantees kept" tier and that of CP-SAT's own answer counting a stand-in only in its room
    (the search api.emitted makes again where the first one's count was short) are what the plan keeps. The first
    search counts a stand-in wherever it lands (Problem.stand_in_rooms, fleet136), so its claim may only be looser: seed
    691 (fleet143), t2's new high job on a new host for its guaranteed low job, claimed 28 where its plan keeps 21."""
    fleet = identical_jobs_fleet(seed)
    solved = solve_both(fleet, time_limit=time_limit)
    desired, observed, (solution, plan), (gsol, gplan) = solved
    problem = build_problem(desired, observed)
    first = make_plan(desired, observed, problem, solve(problem, time_limit=time_limit))
    own = make_plan(desired, observed, problem, solve(replace(problem, stand_in_rooms=True), time_limit=time_limit))
    for name, p, exact in (("CP-SAT's first", first, False), ("CP-SAT's own", own, True), ("emitted", plan, True)):
        if p.solver.status != "GREEDY_FALLBACK" and (tier := claimed(p)) is not None:
            kept = guarantee_kept(problem, p, observed)
            assert kept == tier if exact else kept <= tier, f"seed {seed}: the {name} plan keeps {kept} guaranteed units, its tier claims {tier}"
    for name, p in (("emitted", plan), ("CP-SAT's first", first), ("CP-SAT's own", own), ("greedy", gplan)):
        assert not (lost := twin_stopped(problem, p)), f"seed {seed}: the {name} plan stops guaranteed {lost} and keeps an identical unguaranteed job"
    check_fleet(fleet, time_limit=time_limit, solved=solved)  # (and every rule, stability and apply's re-check)


@pytest.mark.parametrize("seed", [24, 81, 86, 691])  # (each failed on main, 2026-12-03: the model, greedy, the moved job chosen; 691: the check)
def test_identical_jobs_keep_the_guaranteed_one(seed):
    check_guarantees(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(200))
def test_identical_jobs_keep_the_guaranteed_one_sweep(seed):
    check_guarantees(seed)
