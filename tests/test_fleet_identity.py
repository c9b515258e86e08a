"""Fleet identity (issue 15, item 3): a renamed Topology, a second config repo with the same name on one
account, a lost state, and the last pool of a region removed. Before, the rename started a second fleet
(10 new instances, the old 10 leaked), the second repo deleted the first one's instances, and the instances
of a removed region ran on unseen."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from providers.base import TAG_FLEET_UID
from providers.sim import SimCloud
from reconciler import api
from reconciler.cli import app
from reconciler.identity import FleetIdentityError
from reconciler.state import load_state, state_dir
from tests.fleetkit import copy_example, copy_quickstart

runner = CliRunner()
QUICK = 5


def _live(cfg: Path) -> dict[str, dict]:
    return {i["id"]: i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"}


def test_first_apply_records_a_uid_on_the_state_status_and_every_instance(tmp_path):
    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    st = load_state(cfg)
    assert st.fleet_name == "quickstart" and len(st.fleet_uid) == 16
    assert api.read_status(cfg)["fleet"]["metadata"]["uid"] == st.fleet_uid
    assert {i["tags"].get(TAG_FLEET_UID) for i in _live(cfg).values()} == {st.fleet_uid}


def test_a_renamed_topology_is_refused_with_instructions(tmp_path):
    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    before = set(_live(cfg))
    topo = cfg / "topology.yaml"
    topo.write_text(topo.read_text().replace("name: quickstart", "name: quickstart-v2"))
    for args in (["plan", str(cfg)], ["apply", str(cfg), "--auto-approve"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, res.output
        assert "its state records fleet 'quickstart'" in res.output and "Rename it back to 'quickstart'" in res.output
    assert set(_live(cfg)) == before  # nothing launched, nothing deleted


def test_a_second_repo_with_the_same_name_is_refused_and_deletes_nothing(tmp_path):
    first = copy_quickstart(tmp_path / "a")
    api.apply(first, time_limit=QUICK)
    ours = set(_live(first))
    second = copy_quickstart(tmp_path / "b")  # the same Topology name, its own state, the same cloud account
    state_dir(second).mkdir(parents=True)
    (state_dir(second) / "sim").symlink_to(state_dir(first) / "sim")
    for p in (second / "jobs").glob("*.yaml"):  # the second repo runs other work: the first's would be "unneeded"
        p.unlink()
    for args in (["plan", str(second)], ["apply", str(second), "--auto-approve", "--allow-destroy", "20"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, res.output
        assert "belong to another fleet of that name" in res.output and "Rename one of the Topologies" in res.output
    assert set(_live(first)) == ours
    assert not api.plan(first, time_limit=QUICK).plan.has_changes  # the first repo is untouched and sees no one else


def test_a_lost_state_is_recovered_from_status_and_adopted_only_explicitly(tmp_path):
    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    uid = load_state(cfg).fleet_uid
    (state_dir(cfg) / "state.json").unlink()
    assert not api.plan(cfg, time_limit=QUICK).plan.has_changes  # status/fleet.yaml still says who we are
    shutil.rmtree(cfg / "status")
    (state_dir(cfg) / "state.json").unlink(missing_ok=True)
    with pytest.raises(FleetIdentityError, match="--adopt-fleet"):
        api.plan(cfg, time_limit=QUICK)
    res = api.apply(cfg, time_limit=QUICK, adopt_fleet=True)
    assert not res.plan.has_changes and load_state(cfg).fleet_uid == uid


def test_the_last_pool_of_a_region_removed_still_has_its_instances_deleted(aws_env, tmp_path):
    """aws-only runs inference-canary on a T4 in us-west-2, its only pool there. Remove that pool (and the job):
    the region's instance must be seen and deleted, and the region forgotten once nothing of ours is left."""
    import boto3

    fleet = f"regions-{uuid.uuid4().hex[:8]}"
    cfg = copy_example(tmp_path, "aws-only")
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("name: aws-fleet", f"name: {fleet}"))
    opts = {"endpoint_url": aws_env}
    api.apply(cfg, provider="aws", options=opts)
    west = boto3.client("ec2", region_name="us-west-2", endpoint_url=aws_env)

    def live_west() -> list[str]:
        pages = west.get_paginator("describe_instances").paginate(Filters=[
            {"Name": "tag:fleetops.io/fleet", "Values": [fleet]}, {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return [i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"]]

    assert len(live_west()) == 1
    docs = f.read_text().split("\n---\n")
    f.write_text("\n---\n".join(d for d in docs if "name: t4-west" not in d))
    jobs = cfg / "jobs" / "jobs.yaml"
    jobs.write_text("\n---\n".join(d for d in jobs.read_text().split("\n---\n") if "inference-canary" not in d))
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok and len(res.plan.deletes) == 1 and res.plan.deletes[0].region == "us-west-2"
    assert live_west() == []
    assert [r["region"] for r in load_state(cfg).regions] == ["us-east-1"]
    assert not api.plan(cfg, provider="aws", options=opts).plan.has_changes


def test_adopting_another_uid_never_abandons_the_fleets_own_instances(tmp_path):
    """The fleet's state records its uid and its instances carry it; one instance of the same name carries another uid
    (another repo's of that name, or a uid tag edited by hand). The refusal said to run again with --adopt-fleet, and
    that adopted the other uid: the fleet's own 10 instances became "another fleet's", running unseen, and the plan
    bought all their work again ("replaces ...: gone"), its $/h and the budget blind to them; the next plan was refused
    the same way, and adopting again flipped back. Adoption is refused while the fleet runs instances of its own uid,
    and the refusal does not offer it then."""
    from providers.base import TAG_FLEET, TAG_POOL

    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    uid = load_state(cfg).fleet_uid
    SimCloud(state_dir(cfg)).plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge",
                                   tags={TAG_FLEET: "quickstart", TAG_POOL: "aws-cpu", TAG_FLEET_UID: "0123456789abcdef"})
    before = _live(cfg)
    res = runner.invoke(app, ["plan", str(cfg)])
    assert res.exit_code == 1 and "belong to another fleet of that name" in res.output, res.output
    assert "run again with --adopt-fleet" not in " ".join(res.output.split()), res.output  # not offered
    for args in (["plan", str(cfg), "--adopt-fleet"], ["apply", str(cfg), "--auto-approve", "--adopt-fleet"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, res.output
        assert f"runs 10 instance(s) of its own (uid {uid})" in " ".join(res.output.split()), res.output
    assert _live(cfg) == before and load_state(cfg).fleet_uid == uid  # nothing launched, deleted or re-identified


def test_an_instance_tagged_with_the_fleets_name_alone_is_left_alone_not_deleted(tmp_path):
    """Damage audit: an instance launched by hand (or by another tool) with only `fleetops.io/fleet=<name>`, no pool,
    create-key or uid tag, was taken as the fleet's and deleted by the next apply ("pool '' is no longer in the desired
    state"), with no word of where it came from. Every apply of every provider tags its instances with their pool and
    create key: one with neither was never launched by a fleet. It is left alone, said in a note; a legacy instance
    without a uid but with our pool and create-key tags is still the fleet's."""
    from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL

    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    sim = SimCloud(state_dir(cfg))
    hand = sim.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", tags={TAG_FLEET: "quickstart"})
    res = api.plan(cfg, time_limit=QUICK)
    assert hand not in {d.instance_id for d in res.plan.deletes}, res.plan.deletes
    assert any(hand in n and "left alone" in n for n in res.plan.notes), res.plan.notes
    legacy = sim.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge",
                       tags={TAG_FLEET: "quickstart", TAG_POOL: "aws-cpu", TAG_CREATE_KEY: "k-legacy"})
    with sim.world() as w:  # launched before uids, so before the fleet's first uid-tagged instance (one after is not
        w["instances"][legacy]["launched_at"] = "2025-01-01T00:00:00+00:00"  # the fleet's: tests/test_redteam.py)
    res = api.apply(cfg, time_limit=QUICK)
    assert legacy in res.report.deleted and hand not in res.report.deleted, res.report.deleted
    assert hand in _live_ids(cfg)


def _live_ids(cfg) -> set[str]:
    return {i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"}
