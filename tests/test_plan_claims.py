"""What a plan says of itself holds for the plan the user gets: greedy best-fit's plans (--time-limit 0, the wall-clock
cap's fallback, a model proven infeasible), a tier the emitted plan keeps short of the solver's count, and a plan of
independent parts some of which greedy answered."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from reconciler import api
from reconciler.load import load
from reconciler.plan import Plan, make_plan
from reconciler.problem import build_problem
from reconciler.explain import explain_job
from reconciler.render import _solver_line, render_human, render_markdown
from reconciler.solve import solve
from tests.fleetkit import catalog_observed, copy_quickstart, job, pool, tenant, topology, write_config


def _built(docs: list[dict]):
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), docs))
    observed = catalog_observed(desired)
    return desired, observed, build_problem(desired, observed)


def test_a_model_proven_infeasible_is_not_said_to_have_hit_its_work_limit():
    """A pool minimum (one m6i.4xlarge, $0.77/h) under a fleet budget of $0.10/h: no plan keeps both (load refuses
    such a config; the problem is made so here, as a contradiction load does not see would reach the solver). CP-SAT
    proved its model infeasible in 0.02 s, and the plan said "CP-SAT could not complete greedy's answer within its work
    limit ... raise --time-limit for a better one": no work limit was hit, and no --time-limit changes the plan."""
    desired, observed, problem = _built([topology(), tenant("t"), job("j", cpu=2, mem=4),
                                         pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.4xlarge"], lo=1, hi=2)])
    problem = replace(problem, budget=0.1)
    solution = solve(problem, time_limit=2)
    assert solution.status == "GREEDY_FALLBACK"
    assert "proved its model infeasible" in solution.note and "work limit" not in solution.note, solution.note
    line = _solver_line(make_plan(desired, observed, problem, solution))
    assert "raise --time-limit" not in line and "may find a better one" not in line, line
    assert "no longer --time-limit changes that" in line, line


def test_greedys_plan_asked_for_with_time_limit_0_promises_no_better_plan(tmp_path):
    """`--time-limit 0` on the quickstart: greedy's plan is $53.40/h, as CP-SAT's optimal one is; its line said "raise
    --time-limit for a better one". A longer search is what it offers, not a better plan."""
    plan = api.plan(copy_quickstart(tmp_path), time_limit=0).plan
    assert plan.solver.status == "GREEDY_FALLBACK" and round(plan.cost_after, 2) == 53.40
    for text in (render_human(plan), render_markdown(plan)):
        assert "for a better one" not in text.replace("search for a better one", ""), text
        assert "greedy best-fit only (--time-limit 0): this plan is greedy best-fit; a --time-limit above 0 has CP-SAT search " \
               "for a better one and prove how good it is" in text, text


def test_the_wall_clock_caps_fallback_points_at_the_load_not_at_more_work(tmp_path, monkeypatch):
    """The wall-clock safety cap (10 x --time-limit + 30 s) hit: the cap grows with --time-limit as the work does, so
    "raise --time-limit for a better one" was no promise; a less loaded machine is what gets CP-SAT's plan."""
    from reconciler.solve import strategy

    monkeypatch.setattr(strategy, "WALL_FACTOR", 0.0)
    monkeypatch.setattr(strategy, "WALL_SLACK", 0.0)  # (a machine so busy that no work fits the cap)
    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    line = _solver_line(plan)
    assert plan.solver.status == "GREEDY_FALLBACK" and "wall-clock safety cap" in line, line
    assert "raise --time-limit" not in line and "a run on a less loaded machine gets CP-SAT's" in line, line


def test_a_pending_reason_in_greedys_plan_promises_no_search_it_did_not_make(tmp_path):
    """A job that fits a new instance under every rule, left pending by greedy best-fit's answer, read "the solver did
    not find that placement: the next run retries (a longer --time-limit searches more)": greedy's plan is the same
    every run on this input, and no solver searched it. (Greedy's answer here is made to place nothing: no finding's
    greedy plan leaves such a job, so the reason is asked of an answer that does.)"""
    cfg = copy_quickstart(tmp_path)
    res = api.plan(cfg, time_limit=0)
    nothing = replace(res.solution, keep=frozenset(), new={}, stay={}, x={}, placed={})
    plan = make_plan(res.desired, res.observed, res.problem, nothing)
    reasons = [j.reason for j in plan.jobs if j.action == "pending" and "would hold it" in j.reason]
    assert reasons, [j.reason for j in plan.jobs]
    for reason in reasons:
        assert "--time-limit" not in reason and "next run retries" not in reason, reason
        assert "greedy best-fit, which made this plan, did not find that placement" in reason, reason


def test_a_guarantees_tier_the_plan_keeps_short_of_is_not_said_held(monkeypatch):
    """api.emitted's net (plan.quality.guarantees_kept_short: the model once counted a kept job of a class of identical
    jobs as its protected one, fleet117) set the emitted plan's guarantees tier to what it keeps, unproven, and left its
    status HELD: the PR comment's table said "how: held" of a tier below its bound (FEASIBLE would make the plan's line
    say "stopped at its work limit", where the search was optimal). The solver's count is made one above what
    fleet119's plan keeps here, as that model's was."""
    from reconciler import solve as solve_module
    from reconciler.solve import TierReport
    from tests.test_open_findings import fleet

    def over_counted(problem, time_limit=20.0, **kw):
        s = solve(problem, time_limit=time_limit, processes=1, **kw)  # (its two parts in this process: 2 s less)
        if not time_limit:
            return s
        return replace(s, tiers=tuple(TierReport(t.name, t.sense, t.value + 1, t.bound + 1, t.status, t.seconds)
                                      if t.name == "guarantees kept" else t for t in s.tiers))

    monkeypatch.setattr(solve_module, "solve", over_counted)
    f = fleet("fleet119")
    with tempfile.TemporaryDirectory() as d:
        desired = load(write_config(Path(d), f.docs))
    observed = replace(catalog_observed(desired, f.instances, f.placements), gpu_indices=f.gpu_indices)
    plan, _ = api.emitted(desired, observed, build_problem(desired, observed), time_limit=1)
    tier = next(t for t in plan.solver.tiers if t["name"] == "guarantees kept")
    assert (tier["value"], tier["bound"], tier["proven"], tier["status"]) == (21, 22, False, "KEPT_SHORT"), tier
    assert plan.solver.status == "FEASIBLE" and not plan.solver.optimal
    row = next(line for line in render_markdown(plan).splitlines() if line.startswith("| guarantees kept |"))
    assert row == "| guarantees kept | 21 | 22 | as the plan keeps it | no: at least greedy's |", row
    assert Plan.from_json(plan.to_json()).solver.tiers == plan.solver.tiers
    # (and no work limit stopped it: the search was optimal in 0.3 s)
    line = _solver_line(plan)
    assert "work limit" not in line and "CP-SAT counted more than the plan keeps with 1 tier(s) not proven best (guarantees kept: " \
        "the plan's value, at least greedy's), so no optimality gap is claimed" in line, line


def test_explain_does_not_say_greedys_plan_has_no_cheaper_option(tmp_path):
    """ml-platform with --time-limit 0: greedy's plan costs $206.83/h, CP-SAT's $199.00/h; explain said of every placed
    job of greedy's "cheaper options are either taken by the rules above or cost more in the whole plan". Only an
    optimal plan proves that."""
    from tests.fleetkit import copy_example

    cfg = copy_example(tmp_path, "ml-platform")
    greedy = api.plan(cfg, time_limit=0)
    assert greedy.plan.cost_after > api.plan(cfg, time_limit=3).plan.cost_after + 7
    job = next(j.job for j in greedy.plan.jobs if j.instances)
    said = next(d for d in explain_job(job, greedy.desired, greedy.observed, greedy.problem, greedy.plan, lambda d: greedy.plan).details
                if d.startswith("the plan is"))
    assert "cheaper options are either taken" not in said, said
    assert "or was not found by greedy best-fit: this plan is not proven the cheapest" in said, said


def _two_parts(path: Path, tenants=("a", "b")):
    """Two independent parts (problem.components): tenant a's two 4-GPU jobs, each on its own p4d, where one p4d holds
    both (a consolidation: one moves, one instance goes); tenant b's two 2-GPU jobs on two g5.12xlarge at the pool's
    max, and a new 4-GPU one."""
    from tests.fleetkit import instance

    docs = [topology(), *(tenant(t) for t in tenants)]
    insts, placements = [], {}
    if "a" in tenants:
        docs += [pool("p", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=3),
                 *(job(j, tenant="a", gpus=4, gpu_type="A100", cpu=40, mem=400) for j in ("a1", "a2"))]
        insts += [instance(i, "p", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge") for i in ("i0", "i1")]
        placements |= {"a1": ("i0",), "a2": ("i1",)}
    if "b" in tenants:
        docs += [pool("q", "aws", "us-east-1", ["us-east-1b"], ["g5.12xlarge"], hi=2),
                 *(job(j, tenant="b", gpus=g, gpu_type="A10G", cpu=2, mem=8) for j, g in (("b1", 2), ("b2", 2), ("b3", 4)))]
        insts += [instance(i, "q", "aws", "us-east-1", "us-east-1b", "g5.12xlarge") for i in ("k0", "k1")]
        placements |= {"b1": ("k0",), "b2": ("k1",)}
    desired = load(write_config(path, docs))
    observed = catalog_observed(desired, insts, placements)
    return desired, observed, build_problem(desired, observed)


def test_a_consolidation_in_a_plan_with_a_part_of_greedys_says_what_it_saves(tmp_path, monkeypatch):
    """Tenant b's part answered by greedy best-fit (as where CP-SAT cannot complete greedy's answer in a part's share
    of the work), tenant a's by CP-SAT, which moves a1 to free a p4d. The plan said "(the saving was not measured)":
    greedy's part measured no cost, so the parts' sum was none, though a's part measured what its move saves and b's
    moves nothing for cost. The saving is a's, as a's fleet alone plans it; b's jobs are no consolidation's."""
    from reconciler.problem import components
    from reconciler.solve import strategy

    alone, _ = api.emitted(*_two_parts(tmp_path / "a", ("a",)), time_limit=2)
    saved = alone.consolidation.saving_per_hour
    assert saved > 20, alone.consolidation

    complete = strategy.Search.complete
    monkeypatch.setattr(strategy.Search, "complete", lambda search, work, fixed=True: None if any(
        d.tenant == "b" for d in search.problem.demands) else complete(search, work, fixed))
    desired, observed, problem = _two_parts(tmp_path / "ab")
    assert len(components(problem)) == 2
    plan, solution = api.emitted(desired, observed, problem, time_limit=2)
    assert solution.greedy_parts == 1
    assert {j.job: j.reason for j in plan.jobs if j.action == "move"} == {"a1": "consolidation: its instance is removed"}
    c = plan.consolidation
    assert c.saving_per_hour is not None and abs(c.saving_per_hour - saved) < 0.01, (c, saved)
    assert "not measured" not in render_human(plan)


def test_the_tiers_table_of_a_held_search_says_of_which_plans_its_bounds_are(tmp_path):
    """A plan searched again holding running jobs (api._lawful: Problem.held) proves its tiers and cost of the plans that
    keep them, as its line says; the PR comment's tiers table said "best possible ..., proven: yes" with no such word
    (the line is below it, the table what a reviewer reads). Likewise a model that left choices out (narrowed)."""
    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    for changed, words in (({"held": 2}, "of the plans that keep the 2 running job(s) its search held"),
                           ({"narrowed": 40}, "of the choices offered")):
        md = render_markdown(replace(plan, solver=replace(plan.solver, status="FEASIBLE", optimal=False, **changed)))
        tiers = md[md.index("Objective tiers"):md.index("</details>", md.index("Objective tiers"))]
        assert f"_Best possible and proven {words}._" in tiers, tiers
    assert "Best possible and proven" not in render_markdown(plan)


def test_the_json_claims_no_gap_where_the_plan_claims_none(tmp_path):
    """Greedy's plan says "no optimality gap is claimed" (and metrics export none), but its JSON said `"gap": 1.0` (a
    100% gap read as a number). `solver.gap` is the gap the plan claims: null where it claims none; such a file is
    read back, and applied, as a saved plan; a file with a number there (written before) still reads."""
    import json

    from typer.testing import CliRunner

    from reconciler.cli import app

    cfg, out = copy_quickstart(tmp_path), tmp_path / "plan.json"
    runner = CliRunner()
    assert runner.invoke(app, ["plan", str(cfg), "--time-limit", "0", "--out", str(out)]).exit_code == 0
    raw = json.loads(out.read_text())
    assert raw["solver"]["status"] == "GREEDY_FALLBACK" and raw["solver"]["gap"] is None, raw["solver"]
    old = {k: v for k, v in raw.items() if k != "body_digest"}
    old["solver"]["gap"] = 1.0  # (as written before)
    from reconciler.plan import body_digest
    assert Plan.from_json(json.dumps({**old, "body_digest": body_digest(old)})).solver.gap == 1.0
    res = runner.invoke(app, ["apply", str(cfg), "--plan", str(out)])
    assert res.exit_code == 0 and "unexpected" not in res.output, res.output
    optimal = json.loads(runner.invoke(app, ["plan", str(cfg), "--format", "json"]).output)
    assert optimal["solver"]["optimal"] and optimal["solver"]["gap"] == 0.0, optimal["solver"]
