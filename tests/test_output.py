"""Plan output cosmetics a reviewer reads every day (issue 21, item 3): numbers as people write them, summaries
that agree with the tables under them, and JSON whose types do not change with the values."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from typer.testing import CliRunner

from reconciler import api
from reconciler.cli import app
from reconciler.render import render_human, render_markdown
from tests.fleetkit import copy_example, copy_quickstart


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_a_bound_just_below_zero_is_not_minus_zero(tmp_path):
    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    tiers = ({"name": "cost", "value": 0, "bound": -0.3, "status": "OPTIMAL"},)
    md = render_markdown(replace(plan, solver=replace(plan.solver, tiers=tiers)))
    row = next(line for line in md.splitlines() if line.startswith("| cost |"))
    assert row == "| cost | 0 | 0 | optimal | yes |"  # (the last column: proven)


def test_the_tiers_table_says_when_its_values_are_the_solvers_not_the_plans(tmp_path):
    """The tiers are the solver's counts; a plan whose packing left some of them pending, or whose backfill placed
    more, does not have those values, and the PR comment must not present them as its own, proven best."""
    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    assert plan.solver.tiers and not plan.solver.unpacked and not plan.solver.backfilled
    assert "not this plan's" not in render_markdown(plan)
    for changed, words in (({"backfilled": 3}, "backfill placed 3 more pending job(s)"),
                           ({"unpacked": 2}, "packing left 2 job(s) it placed pending"),
                           ({"unpacked": 1, "backfilled": 4}, "packing left 1 job(s) it placed pending and backfill placed 4")):
        md = render_markdown(replace(plan, solver=replace(plan.solver, status="FEASIBLE", optimal=False, **changed)))
        tiers = md[md.index("Objective tiers"):md.index("</details>", md.index("Objective tiers"))]
        assert "These are the solver's counts, not this plan's" in tiers and words in tiers, tiers


def test_a_tier_below_greedys_is_not_said_to_be_at_least_greedys(tmp_path):
    """A tier the repair stage's answer gave up for a tier ranked above (BELOW_GREEDY, strategy.searched_again) is
    below greedy's answer there: the plan must not say "at least greedy's" of it, nor that a work limit stopped it."""
    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    tiers = ({"name": "guaranteed normal work", "value": 90, "bound": None, "status": "FEASIBLE", "proven": False},
             {"name": "guaranteed low work", "value": 0, "bound": None, "status": "BELOW_GREEDY", "proven": False})
    traded = replace(plan, solver=replace(plan.solver, status="FEASIBLE", optimal=False, tiers=tiers))
    md = render_markdown(traded)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| guaranteed")}
    assert rows["guaranteed normal work"].endswith("| no: at least greedy's |"), rows
    assert rows["guaranteed low work"].endswith("| no: below greedy's, for a tier above |"), rows
    line = next(x for x in render_human(traded).splitlines() if x.startswith("CP-SAT"))
    assert ("was searched again where its counts did not pack with 2 tier(s) not proven best (guaranteed normal work; each at "
            "least greedy's; guaranteed low work: below greedy's, for a tier ranked above)") in line, line
    assert "work limit" not in line


def test_parts_merged_keep_a_tier_below_greedys_so():
    """Independent parts' tiers summed: one part's tier below its warm start's value leaves the sum unclaimed."""
    from reconciler.solve.parts import merge_parts
    from reconciler.solve.solution import Solution, TierReport

    def part(status: str) -> Solution:
        return Solution(status="FEASIBLE", optimal=False, gap=1.0, seconds=0.0, keep=frozenset(), new={}, stay={}, x={},
                        placed={}, tiers=(TierReport("guaranteed low work", "max", 5, None, status, 0.0),))

    for a, b in (("BELOW_GREEDY", "FEASIBLE"), ("OPTIMAL", "BELOW_GREEDY"), ("BELOW_GREEDY", "BELOW_GREEDY")):
        assert merge_parts([part(a), part(b)], 0.0, False).tiers[0].status == "BELOW_GREEDY", (a, b)
    assert merge_parts([part("OPTIMAL"), part("FEASIBLE")], 0.0, False).tiers[0].status == "FEASIBLE"


def test_deleting_everything_is_not_within_100_percent_of_a_bound(tmp_path):
    cfg = copy_quickstart(tmp_path)
    assert cli("apply", cfg, "--auto-approve").exit_code == 0
    for f in (cfg / "jobs").glob("*.yaml"):
        f.unlink()
    pools = cfg / "pools.yaml"
    pools.write_text(re.sub(r"min_instances: \d+", "min_instances: 0", pools.read_text()))
    plan = api.plan(cfg, time_limit=5).plan
    assert len(plan.deletes) == 10 and plan.cost_after == 0
    for text in (render_human(plan), render_markdown(plan)):
        assert "100.00%" not in text
        assert "-$" not in text and "$-" not in text


def test_summary_and_table_agree_on_evicted_jobs(tmp_path):
    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    jobs = list(plan.jobs)
    jobs[0] = replace(jobs[0], action="evict", instances=(), reason="preempted (capacity goes to higher-priority work first: x)")
    plan = replace(plan, jobs=tuple(jobs))
    text = render_human(plan)
    assert "1 evicted, 0 pending" in text
    assert "Pending and evicted jobs" in text and "Pending jobs\n" not in text
    assert re.search(rf"{jobs[0].job}\s+.*evicted", text)
    md = render_markdown(plan)
    assert "**Pending jobs (0) and evicted jobs (1)**" in md


def test_plan_json_keeps_float_fields_floats_and_mig_replicas_without_gpu_lists(tmp_path):
    cfg = copy_example(tmp_path, "ml-platform")
    out = cli("plan", cfg, "--format", "json")
    raw = json.loads(out.output)
    assert isinstance(raw["cost_before"], float) and raw["cost_before"] == 0.0  # nothing runs yet: 0.0, not 0
    assert all(isinstance(c["price"], float) for c in raw["creates"])
    mig = next(j for j in raw["jobs"] if j["job"] == "embed-mig")
    assert mig["instances"] and mig["gpus"] == []  # MIG slices: no whole-GPU indices, not [[]]
    gang = next(j for j in raw["jobs"] if j["job"] == "llm-pretrain")
    assert all(len(g) == 8 for g in gang["gpus"])
    assert '"cost_before": 0.0' in out.output


def test_a_plan_of_thousands_of_jobs_prints_every_row_aligned_one_a_line(tmp_path):
    """Above PLAIN_TABLE_ROWS a table is plain aligned columns (rich laid out a 10k-job plan's 15.8k rows in 5.1 s of
    CPU; plain, 0.3 s): every row still printed, one a line, its columns under their headers, long reasons whole."""
    from reconciler.render import PLAIN_TABLE_ROWS

    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    j = plan.jobs[0]
    n = PLAIN_TABLE_ROWS + 5
    reason = "quota exhausted: tenant t uses 4/4 GPUs in this plan, the job needs 1 more " + "x" * 150
    many = [replace(j, job=f"job-{k:04d}", action="pending", instances=(), gpus=(), reason=reason) for k in range(n)]
    many += [replace(j, job=f"mover-{k:04d}", action="place", previous=()) for k in range(n)]
    text = render_human(replace(plan, jobs=tuple(many)))
    lines = text.splitlines()
    assert f"Pending jobs ({n})" in lines and f"Job placements ({n})" in lines
    rows = [ln for ln in lines if ln.startswith("job-")]
    assert len(rows) == n and all(ln.endswith(reason) for ln in rows)  # (a long reason is not wrapped or cut)
    header = lines[lines.index(f"Pending jobs ({n})") + 1]
    assert header.split() == ["job", "tenant", "state", "reason"]
    assert {ln.index("pending") for ln in rows} == {header.index("state")}  # aligned under its header
    assert len([ln for ln in lines if ln.startswith("mover-")]) == n
    assert f"{n} pending" in text  # the summary line as before


def test_a_plan_mapping_with_a_key_that_is_not_a_string_is_refused_not_written_differently(tmp_path):
    """encode writes the body as reading it back gives it (no json round trip: 0.25 s at 10k jobs); JSON would turn an
    int key into a string and sort it elsewhere, so the body digest would not match the file: such a key is refused."""
    import pytest

    from reconciler.plan import Plan

    plan = api.plan(copy_quickstart(tmp_path), time_limit=5).plan
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()  # read back, written again: the same bytes
    with pytest.raises(TypeError, match="not a string"):
        replace(plan, rules={1: "x"}).to_json()


def test_a_running_job_removed_from_the_config_is_a_change_the_plan_shows(tmp_path):
    """Audit: a running job's document deleted read "No changes. The fleet matches the desired state." (exit 0 with
    --detailed-exitcode: a scheduled run saw no drift) where its instance stayed, and "0 evicted" beside the deletes of
    its instances; apply stopped it either way. The plan lists it, counts it, and exits 2."""
    cfg = copy_quickstart(tmp_path)
    assert cli("apply", cfg, "--auto-approve", "--time-limit", 5).exit_code == 0
    jobs = cfg / "jobs" / "platform.yaml"
    docs = jobs.read_text().split("---\n")
    jobs.write_text("---\n".join(d for d in docs if "name: label-sync" not in d))
    res = cli("plan", cfg, "--detailed-exitcode", "--time-limit", 5)
    assert res.exit_code == 2, res.output
    assert "No changes" not in res.output and "9 unchanged, 1 removed;" in res.output, res.output
    assert re.search(r"label-sync\s*│\s*sim-\w+-\d+", res.output), res.output
    md = cli("plan", cfg, "--format", "markdown", "--time-limit", 5).output
    assert "Jobs removed from the config: they stop (1)" in md and "| label-sync |" in md
    saved = tmp_path / "p.json"
    assert cli("plan", cfg, "--out", saved, "--time-limit", 5, "--format", "json").exit_code == 0
    assert [r["job"] for r in json.loads(saved.read_text())["removed"]] == ["label-sync"]
    assert cli("apply", cfg, "--plan", saved).exit_code == 0
    after = cli("plan", cfg, "--detailed-exitcode", "--time-limit", 5)
    assert after.exit_code == 0 and "removed" not in after.output, after.output


def test_a_plan_that_changes_nothing_but_leaves_jobs_pending_does_not_say_the_fleet_matches(tmp_path):
    """Audit: a new job no pool can hold printed "No changes. The fleet matches the desired state." above its pending
    reason: the desired job does not run. Nothing to apply (exit 0 with --detailed-exitcode), and the line says why."""
    cfg = copy_quickstart(tmp_path)
    assert cli("apply", cfg, "--auto-approve", "--time-limit", 5).exit_code == 0
    (cfg / "jobs" / "big.yaml").write_text("apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: too-big}\n"
                                           "spec: {tenant: platform, resources: {cpu: 1000, memory_gib: 4}}\n")
    for fmt in ("human", "markdown"):
        res = cli("plan", cfg, "--detailed-exitcode", "--format", fmt, "--time-limit", 5)
        assert res.exit_code == 0, res.output
        assert "No changes. 1 job(s) stay pending (reasons below)" in res.output and "matches the desired state" not in res.output


def test_a_job_restarted_in_place_is_not_also_counted_unchanged(tmp_path):
    """Audit: a running job whose `run` was edited read "10 unchanged, 1 restarted" on a 10-job fleet: counted twice,
    once as unchanged. Each job is counted once, as the summary's words say; the human, markdown and JSON plans agree."""
    from reconciler.plan import Plan
    from reconciler.render import summary_line

    cfg = copy_quickstart(tmp_path)
    assert cli("apply", cfg, "--auto-approve", "--time-limit", 5).exit_code == 0
    jobs = cfg / "jobs" / "platform.yaml"
    text = jobs.read_text()
    run_line = '  run: {command: [python3, bin/train.py, "150"]}\n'
    assert run_line in text
    jobs.write_text(text.replace(run_line, run_line.replace('"150"', '"151"'), 1))
    human = cli("plan", cfg, "--time-limit", 5).output
    assert "9 unchanged, 1 restarted;" in human, human
    md = cli("plan", cfg, "--format", "markdown", "--time-limit", 5).output
    plan = Plan.from_json(cli("plan", cfg, "--format", "json", "--time-limit", 5).stdout)
    line = summary_line(plan)
    assert f"Plan: {line}" in " ".join(human.split()) and f"**{line}**" in md  # (the terminal's width wraps it)
    c = plan.counts()
    each = ("unchanged", "place", "move", "evict", "pending", "restarts", "starts", "stops")
    assert sum(c[k] for k in each) == len(plan.jobs) and c["restarts"] == 1, c
