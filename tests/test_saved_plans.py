"""A saved plan is input, not an order (issue 15, item 4).

`apply --plan` checks every action of the file against the desired state, the offerings and the
fleet, recomputes its cost from prices, and refuses an edited body. Each attack here is an edit
that keeps the desired and observed digests (and, but for the last, recomputes the body digest
as anyone can): on the code before, each was carried out or crashed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from providers.sim import SimCloud
from reconciler import api
from reconciler.cli import app
from reconciler.plan import body_digest
from reconciler.state import state_dir
from tests.fleetkit import copy_quickstart

runner = CliRunner()
QUICK = "5"


def _live(cfg: Path) -> dict[str, dict]:
    return {i["id"]: i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"}


@pytest.fixture
def applied(tmp_path):
    """The quickstart applied, and a no-change plan of it saved: the raw material an attacker edits."""
    cfg = copy_quickstart(tmp_path)
    assert runner.invoke(app, ["apply", str(cfg), "--auto-approve", "--time-limit", QUICK]).exit_code == 0
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    return cfg, out


def _edit(path: Path, change, *, redigest: bool = True) -> None:
    raw = json.loads(path.read_text())
    old = raw.pop("body_digest")
    change(raw)
    raw["body_digest"] = body_digest(raw) if redigest else old
    path.write_text(json.dumps(raw))


def _create(raw: dict, n: int, pool: str, zone: str, itype: str, cloud: str = "aws", region: str = "us-east-1",
            market: str = "on-demand", **extra) -> dict:
    return {"ref": f"+{n}", "key": f"{raw['id']}-{n:04d}", "pool": pool, "provider": "sim", "cloud": cloud, "region": region,
            "zone": zone, "instance_type": itype, "market": market, "price": 0.01, "max_price": None,
            "placement_group": None, **extra}


def _apply(cfg: Path, plan: Path):
    return runner.invoke(app, ["apply", str(cfg), "--plan", str(plan)])


def _refused(res, *needles: str) -> None:
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    for n in needles:
        assert n in res.output, res.output


def test_an_honest_saved_plan_applies(tmp_path):
    cfg = copy_quickstart(tmp_path)
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    res = _apply(cfg, out)
    assert res.exit_code == 0, res.output
    assert len(_live(cfg)) == len(json.loads(out.read_text())["creates"])


def test_delete_of_an_instance_running_a_job_is_refused(applied):
    cfg, out = applied
    host = api.read_status(cfg)["jobs"]["finetune-a"]["status"]["instances"][0]
    inst = _live(cfg)[host]

    def add_delete(raw):
        raw["deletes"].append({"instance_id": host, "pool": inst["tags"]["fleetops.io/pool"], "provider": "sim",
                               "cloud": inst["cloud"], "region": inst["region"], "zone": inst["zone"],
                               "instance_type": inst["instance_type"], "market": inst["market"], "price": 0.0,
                               "reason": "no longer needed"})

    _edit(out, add_delete)
    _refused(_apply(cfg, out), f"delete {host}: job finetune-a runs on it and the plan keeps it there")
    assert host in _live(cfg)


def test_extra_creates_past_max_instances_and_the_budget_are_refused(applied):
    """20 p4d.24xlarge ($655/h against a $150/h budget, max_instances 3), priced at a cent in the plan."""
    cfg, out = applied
    before = set(_live(cfg))
    _edit(out, lambda raw: raw["creates"].extend(_create(raw, n, "aws-a100", "us-east-1a", "p4d.24xlarge")
                                                 for n in range(1, 21)))
    _refused(_apply(cfg, out), "pool aws-a100: the plan would run", "over its max_instances 3")
    assert set(_live(cfg)) == before


def test_budget_is_recomputed_from_prices_not_read_from_the_plan(applied):
    cfg, out = applied
    pools = cfg / "pools.yaml"
    pools.write_text(pools.read_text().replace("max_instances: 3", "max_instances: 30"))
    assert runner.invoke(app, ["plan", str(cfg), "--out", str(out), "--time-limit", QUICK]).exit_code == 0
    before = set(_live(cfg))
    _edit(out, lambda raw: raw["creates"].extend(_create(raw, n, "aws-a100", "us-east-1a", "p4d.24xlarge")
                                                 for n in range(1, 6)))
    _refused(_apply(cfg, out), "max_hourly_budget")
    assert set(_live(cfg)) == before


def test_a_type_and_zone_the_pool_does_not_allow_are_refused(applied):
    cfg, out = applied
    _edit(out, lambda raw: raw["creates"].append(_create(raw, 1, "aws-cpu", "us-east-1b", "p5.48xlarge")))
    _refused(_apply(cfg, out), "create +1 (on-demand p5.48xlarge in us-east-1b, pool 'aws-cpu'): the pool does not allow it")
    _edit(out, lambda raw: raw["creates"].__setitem__(0, _create(raw, 1, "aws-cpu", "us-east-1a", "p5.48xlarge")))
    _refused(_apply(cfg, out), "the pool does not allow it")
    _edit(out, lambda raw: raw["creates"].__setitem__(0, _create(raw, 1, "gcp-l4-spot", "us-central1-a", "g2-standard-4",
                                                                  cloud="gcp", region="us-central1")))  # on-demand in a spot pool
    _refused(_apply(cfg, out), "the pool does not allow it")
    assert not runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode"]).exit_code


def test_an_unknown_pool_is_a_clear_error(applied):
    cfg, out = applied
    _edit(out, lambda raw: raw["creates"].append(_create(raw, 1, "ghost", "us-east-1a", "m6i.4xlarge")))
    _refused(_apply(cfg, out), "create +1 (on-demand m6i.4xlarge in us-east-1a, pool 'ghost'): there is no pool 'ghost'")


def test_delete_of_a_foreign_instance_is_refused_and_never_reported_deleted(applied):
    cfg, out = applied
    theirs = SimCloud(state_dir(cfg)).plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", tags={"owner": "them"})

    def add_delete(raw):
        raw["deletes"].append({"instance_id": theirs, "pool": "aws-cpu", "provider": "sim", "cloud": "aws",
                               "region": "us-east-1", "zone": "us-east-1a", "instance_type": "m6i.4xlarge",
                               "market": "on-demand", "price": 0.768, "reason": "no longer needed"})

    _edit(out, add_delete)
    res = _apply(cfg, out)
    _refused(res, f"delete {theirs}: not an instance of fleet 'quickstart'")
    assert "1 deleted" not in res.output and theirs in _live(cfg)


def test_apply_plan_reports_a_refused_delete_as_a_failure(applied):
    """Below the check, too: apply_plan never counts a delete of an instance observe did not find as done."""
    from dataclasses import replace

    from reconciler.apply import apply_plan
    from reconciler.observe import Fleet
    from reconciler.plan import DeleteAction
    from reconciler.state import State

    cfg, _ = applied
    theirs = SimCloud(state_dir(cfg)).plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", tags={"owner": "them"})
    res = api.plan(cfg, time_limit=float(QUICK))
    plan = replace(res.plan, deletes=(DeleteAction(theirs, "aws-cpu", "sim", "aws", "us-east-1", "us-east-1a", "m6i.4xlarge",
                                                   "on-demand", 0.768, "forged"),))
    report = apply_plan(res.desired, res.observed, plan, Fleet(res.desired, state_dir(cfg)), State())
    assert not report.ok and theirs not in report.deleted and theirs in _live(cfg)


def test_an_edited_body_with_the_old_digests_is_refused(applied):
    cfg, out = applied
    _edit(out, lambda raw: raw["creates"].append(_create(raw, 1, "aws-cpu", "us-east-1a", "m6i.4xlarge")), redigest=False)
    _refused(_apply(cfg, out), "it was edited after `reconcile plan` wrote it")
