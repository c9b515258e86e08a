"""Text the plan did not make itself reaches the terminal and the PR comment: a job's name read back from the state or a
saved plan (apply wrote what the config named, but the file is only a file), a provider's note, an instance id, a
replica's last log lines. Printed as it came, a name rewrote the terminal (an escape sequence, a `\\r`), was read by
rich as its own markup (`[/y]`: "unexpected MarkupError ... a bug in reconcile") or, in the PR comment, ended its
table row, opened HTML, made a link or notified a team. Each is shown as the literal text it is."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from reconciler import api
from reconciler.cli import app
from reconciler.plan.types import RemovedJob
from reconciler.render import render_human, render_markdown, render_status
from tests.fleetkit import copy_quickstart

HOSTILE = ("x[/y]\x1b]0;pwned\x07\x1b[2K\r| cell | <details open>@org/team [c](javascript:alert(1))\n# heading `tick\u202e"
           " ##[set-output name=safe;]yes")
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def hostile_plan(tmp_path_factory):
    """The quickstart's plan with HOSTILE where free text goes: a removed job (as the state names it), a pending
    job's reason, a note and a guardrail violation."""
    plan = api.plan(copy_quickstart(tmp_path_factory.mktemp("qs")), time_limit=0).plan
    jobs = list(plan.jobs)
    jobs[0] = replace(jobs[0], action="pending", instances=(), gpus=(), reason=f"waits: {HOSTILE}")
    return replace(plan, jobs=tuple(jobs), removed=(RemovedJob(HOSTILE, ("i-1" + HOSTILE,)),), notes=(HOSTILE,),
                   violations=(HOSTILE,))


def test_a_hostile_name_in_the_human_plan_is_printed_as_text(hostile_plan):
    for color in (False, True):
        out = render_human(hostile_plan, color=color)
        assert "[/y]" in out  # (as written, not read as rich markup: it raised MarkupError)
        assert "\\x1b]0;pwned\\x07" in out and "\\r" in out and "\\u202e" in out, out
        without_colour = re.sub(r"\x1b\[[0-9;]*m", "", out)  # (the plan's own colours, on a terminal)
        assert not CONTROLS.search(without_colour), repr(CONTROLS.search(without_colour))
        assert "##[" not in out


def test_a_hostile_name_in_the_pr_comment_stays_in_its_cell(hostile_plan):
    md = render_markdown(hostile_plan)
    assert not CONTROLS.search(md), repr(CONTROLS.search(md))
    assert "##[" not in md
    assert not re.search(r"(?<!\\)<details open>@", md) and "\\<details open>" in md  # no HTML of the input's
    assert not re.search(r"(?<![\w`])@org/team", md)  # no team notified
    assert "[c](javascript" not in md  # no link
    assert "\n# heading" not in md
    start = md.index("Jobs removed from the config")
    rows = [line for line in md[start:md.index("</details>", start)].splitlines() if line.startswith("| ")]
    assert len(rows) == 2 and len(re.findall(r"(?<!\\)\|", rows[1])) == 3, rows  # the header, and one row of two cells


def test_a_hostile_name_in_the_json_plan_is_the_same_json_without_a_workflow_command(hostile_plan):
    """GitHub's runner acts on `##[command]` anywhere in a line of a step's output: a JSON plan printed to the CI log
    carried one in a name from the state. The JSON writes that `#` as \\u0023, the same string to any reader."""
    from reconciler.render import render

    text = render(hostile_plan, "json")
    assert "##[" not in text
    assert json.loads(text)["removed"][0]["job"] == HOSTILE


@pytest.mark.slow
def test_a_job_named_like_markup_in_the_state_does_not_stop_the_plan(tmp_path):
    """End to end: the name comes from .reconcile/state.json, for a job the config no longer has."""
    cfg = copy_quickstart(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve"]).exit_code == 0
    path = cfg / ".reconcile" / "state.json"
    state = json.loads(path.read_text())
    bad = "x[/y]\x1b]0;pwned"
    for field in ("placements", "gpus", "shapes", "since"):
        if "sweep-lr" in state.get(field, {}):
            state[field][bad] = state[field].pop("sweep-lr")
    path.write_text(json.dumps(state))
    research = cfg / "jobs" / "research.yaml"
    research.write_text("---".join(d for d in research.read_text().split("---") if "name: sweep-lr" not in d))
    res = runner.invoke(app, ["plan", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "x[/y]\\x1b]0;pwned" in res.output and "\x1b" not in res.output


def test_a_replicas_log_lines_in_status_do_not_reach_the_terminal_raw():
    """A failed replica's message carries its last log lines: colours, a title rewrite, a `\\r`."""
    st = {"fleet": {"metadata": {"name": "f"}, "status": {"instances": 1, "hourlyCost": 1.0, "lastChangedBy": "abc",
                                                          "tenants": {}, "jobs": {"running": 0, "pending": 0}}},
          "jobs": {"j": {"status": {"phase": "Failed", "conditions": [{"reason": "Error", "message": "m"}],
                                    "run": {"reason": "Error", "message": "exit 1; last lines: \x1b[31mboom\x1b]0;t\x07\r"}}}}}
    out = render_status(st)
    assert not CONTROLS.search(out.replace("\n", "")) and "\\x1b[31mboom" in out, repr(out)


def test_a_config_with_thousands_of_errors_gives_a_pr_comment_github_takes(tmp_path):
    """The error section of `plan --format markdown` had no bound: 1,500 bad jobs (a PR can add as many) made a
    comment of 182,626 characters, which GitHub refuses (65,536), so the PR showed nothing. Cut as the plan's is, with
    a line saying how many errors are left out and where to see them all."""
    from tests.fleetkit import job, tenant, topology, write_config

    write_config(tmp_path, [topology(), tenant("t")] + [job(f"j{i}", tenant="t", colour="blue") for i in range(700)])
    res = CliRunner().invoke(app, ["plan", str(tmp_path), "--format", "markdown"])
    assert res.exit_code == 1
    assert len(res.stdout) < 65_536, len(res.stdout)
    assert res.stdout.rstrip().endswith("more error(s) left out; `reconcile validate` lists every one_"), res.stdout[-300:]
    assert res.stdout.count("unknown field") > 100


def test_an_error_quoting_what_a_pr_wrote_is_printed_as_text(tmp_path):
    """Errors other than the config's diagnostics quote input too: `.reconcile` committed as a link is refused with its
    target, which the PR chose (an escape sequence, a CI workflow command)."""
    cfg = copy_quickstart(tmp_path)
    (cfg / ".reconcile").symlink_to("##[set-output name=safe;]yes\x1b]0;pwned\x07")
    for fmt in ("human", "markdown", "json"):
        res = CliRunner().invoke(app, ["plan", str(cfg), "--format", fmt])
        assert res.exit_code == 1 and "is a symlink" in res.output, res.output
        assert "##[" not in res.output and "\x1b" not in res.output and "\x07" not in res.output, res.output
