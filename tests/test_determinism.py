"""Issue 18, items 2 and 6: a plan is at least greedy's, tier by tier, whatever the time limit,
and the same (desired, observed) gives the same plan, byte for byte, on a busy machine too.

The fleets are generated (bench.generate) with scarce capacity (a few instances per pool,
tenant quotas above what the jobs ask), so the tiers need a search the work limit cuts short
and the aggregate counts do not always pack: the cases where a wall-clock search answered
differently from run to run, and below greedy best-fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bench.generate as gen
from reconciler import api
from reconciler.plan import Plan, outcome_rank
from reconciler.render import render
from tests.invariants import check_plan

ROOT = Path(__file__).resolve().parent.parent


def scarce_fleet(path: Path, jobs: int, seed: int, max_instances: int) -> Path:
    """A gang-heavy generated fleet with a few instances per pool: work competes for capacity."""
    mix = gen.SINGLE_GPU, gen.MULTI_GPU, gen.GANG
    gen.SINGLE_GPU, gen.MULTI_GPU, gen.GANG = 0.25, 0.15, 0.45
    try:
        return gen.generate(path, jobs, seed, max_instances=max_instances, quota_fraction=2.0)
    finally:
        gen.SINGLE_GPU, gen.MULTI_GPU, gen.GANG = mix


def reconcile(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("reconcile")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


# (the 400-job fleet in the slow tier: 14.5 s of CPU, the CI tier's heaviest test on 2026-12-03 when the tier took
# 597 s of its 10 minutes; the 150-job fleet asks the same of a plan whose tiers are unproven)
@pytest.mark.parametrize("jobs, seed, max_instances, time_limit", [pytest.param(400, 1, 6, 2.0, marks=pytest.mark.slow),
                                                                   (150, 3, 3, 0.3)])
def test_every_plan_ranks_at_least_as_greedys_and_says_which_tiers_were_proven(tmp_path, jobs, seed, max_instances, time_limit):
    """Fleets whose tiers the search cannot prove in the work limit. Each tier holds greedy's
    value as its floor, and the packed plan ranks no lower than greedy's plan (the first fleet:
    CP-SAT's counts did not all pack, and its plan placed less priority-weighted work than greedy's,
    2,794,203 against 2,794,213). The plan says which tiers were proven, and its gap does not read
    as a promise when a work tier was not."""
    cfg = scarce_fleet(tmp_path / "f", jobs, seed, max_instances)
    greedy = api.plan(cfg, time_limit=0)
    res = api.plan(cfg, time_limit=time_limit)
    check_plan(res.desired, res.observed, res.plan)
    assert outcome_rank(res.problem, res.plan, res.observed) >= outcome_rank(greedy.problem, greedy.plan, greedy.observed)
    raw = json.loads(res.plan.to_json())
    assert "seconds" not in raw["solver"]  # the wall clock is not part of the plan
    assert Plan.from_json(res.plan.to_json()).to_json() == res.plan.to_json()
    assert res.plan.read_back() == Plan.from_json(res.plan.to_json())  # (what `reconcile plan` renders for the memo)
    s = res.plan.solver
    if s.status == "GREEDY_FALLBACK":
        return
    assert s.tiers and all(isinstance(t["proven"], bool) for t in raw["solver"]["tiers"])
    assert s.unproven, "these fleets were chosen for tiers the work limit cannot prove"
    assert {t["name"] for t in raw["solver"]["tiers"] if not t["proven"]} == set(s.unproven)
    assert not s.optimal
    for fmt in ("human", "markdown"):
        text = render(res.plan, fmt)
        assert "within" not in text and "not proven best" in text, text[-800:]


def _burn() -> subprocess.Popen:
    """A busy second process: a CPU-bound loop, until killed."""
    code = "while True: pass\n"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_the_same_input_gives_the_same_plan_byte_for_byte_even_on_a_busy_machine(tmp_path):
    """Planned three times from three processes (other hash seeds), the third with a CPU burner
    competing: the same JSON, plan id included. Before, the search was cut by the wall clock
    (and the JSON carried it), so a busy machine got another plan."""
    # Seed 2: on the 2026-11-26 AWS prices seed 1's fleet has CP-SAT's counts pack worse than greedy, so its plan is
    # greedy's fallback and would prove nothing about the search (it was FEASIBLE on the older prices).
    cfg = scarce_fleet(tmp_path / "f", 120, 2, 2)
    out = [reconcile("plan", cfg, "--format", "json", "--time-limit", "1", env={"PYTHONHASHSEED": str(k)}) for k in (1, 2)]
    burner = _burn()
    try:
        time.sleep(0.5)
        out.append(reconcile("plan", cfg, "--format", "json", "--time-limit", "1", env={"PYTHONHASHSEED": "3"}))
    finally:
        os.killpg(burner.pid, 9)
        burner.wait()
    for o in out:
        assert o.returncode == 0, o.stderr
    assert out[0].stdout == out[1].stdout == out[2].stdout
    plan = Plan.from_json(out[0].stdout)
    assert plan.solver.status != "GREEDY_FALLBACK"  # the search ran (else this would prove little)


def test_the_model_an_hour_later_is_the_same_model(tmp_path):
    """Nothing in the model reads the clock but the rules about time (deadlines, priority aging; this fleet has
    neither). The victims tier weighed each running job by its hours left, so a re-plan an hour later searched a
    different model, and where the work limit cut the search short it emitted another plan for the same config
    and fleet (an applied 1k-job fleet: $7,957.79/h with 69 moves, then $7,961.13/h with 63, an hour apart)."""
    from datetime import timedelta

    from reconciler.problem import build_problem
    from reconciler.solve.model import Model
    from reconciler.solve.objective import cost, tiers
    from reconciler.solve.variables import flatten
    from reconciler.state import utcnow
    from tests.fleetkit import copy_quickstart

    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=5)
    res = api.plan(cfg, time_limit=5)
    assert any(d.running_jobs for d in res.problem.demands)
    t = utcnow()

    def model_at(hours: float):
        m = Model(build_problem(res.desired, res.observed, now=t + timedelta(hours=hours)))
        return [(x.name, x.sense, x.bound, flatten(x.expr)) for x in tiers(m)], flatten(cost(m)), str(m.m.proto)

    now = model_at(0)
    assert any(name == "victims' remaining time" for name, *_ in now[0])
    assert model_at(1) == now
    assert model_at(10) == now
