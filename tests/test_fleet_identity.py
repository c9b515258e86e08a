"""Fleet identity (issue 15, item 3): a renamed Topology, a second config repo with the same name on one
account, a lost state, and the last pool of a region removed. Before, the rename started a second fleet
(10 new instances, the old 10 leaked), the second repo deleted the first one's instances, and the instances
of a removed region ran on unseen."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import yaml
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


def _fork(first: Path, second: Path) -> Path:
    """A fork (or another checkout) of `first`'s config repo, status/ included, with a state of its own and the same
    cloud account; it runs none of the first's jobs, so the first's instances would all be "unneeded" to it."""
    shutil.copytree(first, second, ignore=shutil.ignore_patterns(".reconcile"))
    state_dir(second).mkdir(parents=True)
    (state_dir(second) / "sim").symlink_to(state_dir(first) / "sim")
    for p in (second / "jobs").glob("*.yaml"):
        p.unlink()
    return second


def _said(res) -> str:
    return " ".join(res.output.split())


def test_a_fork_of_the_config_repo_does_not_take_the_fleets_instances(tmp_path):
    """status/fleet.yaml names the fleet's uid so that a lost state is survived, but a fork of the config repo (its own
    state, the same account) carries it too: it took that uid, saw the fleet's 10 instances as its own and planned
    deleting them all (apply with --allow-destroy deleted them). Refused now, plan and apply, until --adopt-fleet."""
    first = copy_quickstart(tmp_path / "a")
    api.apply(first, time_limit=QUICK)
    uid, ours = load_state(first).fleet_uid, _live(first)
    second = _fork(first, tmp_path / "b")
    for args in (["plan", str(second)], ["apply", str(second), "--auto-approve", "--allow-destroy", "20"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, res.output
        said = _said(res)
        assert f"says this config is fleet 'quickstart' (uid {uid}), and 10 instance(s) carry that uid" in said, said
        assert "recorded the fleet's state at local:" in said and "--adopt-fleet" in said, said
    assert _live(first) == ours and not load_state(second).fleet_uid
    assert not api.plan(first, time_limit=QUICK).plan.has_changes  # the fleet itself is untouched
    # --adopt-fleet is the user's word that the instances are this config's: the plan is made (9 deletes: a pool minimum)
    deletes = {d.instance_id for d in api.plan(second, time_limit=QUICK, adopt_fleet=True).plan.deletes}
    assert deletes and deletes <= set(ours), deletes


def test_a_lost_state_is_recovered_where_status_says_the_state_was(tmp_path):
    """The reason status/fleet.yaml holds the uid: the state lost where it was kept, the fleet's own instances are
    recognised without a word (status/fleet.yaml records where the state is); one written by an older fleetops, which
    does not say, needs --adopt-fleet while instances carry the uid."""
    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    uid, ours = load_state(cfg).fleet_uid, _live(cfg)
    fleet_yaml = cfg / "status" / "fleet.yaml"
    assert yaml.safe_load(fleet_yaml.read_text())["metadata"]["annotations"]["fleetops.io/state"].startswith("local:")
    (state_dir(cfg) / "state.json").unlink()
    assert not api.apply(cfg, time_limit=QUICK).plan.has_changes and load_state(cfg).fleet_uid == uid
    doc = yaml.safe_load(fleet_yaml.read_text())
    del doc["metadata"]["annotations"]
    fleet_yaml.write_text(yaml.safe_dump(doc))
    (state_dir(cfg) / "state.json").unlink()
    res = runner.invoke(app, ["plan", str(cfg)])
    assert res.exit_code == 1 and "does not say where the fleet keeps its state" in _said(res), res.output
    assert not api.apply(cfg, time_limit=QUICK, adopt_fleet=True).plan.has_changes and load_state(cfg).fleet_uid == uid
    assert _live(cfg) == ours


def test_a_copied_status_of_an_empty_fleet_gives_the_copy_a_uid_of_its_own(tmp_path):
    """A fork whose fleet runs nothing (yet): it kept the other fleet's uid, and the two were one fleet to each other,
    each taking the other's instances as its own from then on. It takes a new uid, said in a note."""
    first = copy_quickstart(tmp_path / "a")
    api.apply(first, time_limit=QUICK)
    uid = load_state(first).fleet_uid
    second = copy_quickstart(tmp_path / "b")  # its own (empty) cloud account
    (second / "status").mkdir()
    shutil.copy(first / "status" / "fleet.yaml", second / "status" / "fleet.yaml")
    res = api.apply(second, time_limit=QUICK)
    assert any(f"names uid {uid}" in n and "a new uid" in n for n in res.plan.notes), res.plan.notes
    mine = load_state(second).fleet_uid
    assert mine and mine != uid and api.read_status(second)["fleet"]["metadata"]["uid"] == mine
    assert {i["tags"].get(TAG_FLEET_UID) for i in _live(second).values()} == {mine}


def test_status_naming_another_uid_than_the_state_is_refused(tmp_path):
    """The state records the uid and status/fleet.yaml (edited in a pull request, or the state another fleet's) names
    another: nothing noticed, and the edit waited for the state's loss to turn the fleet on the other's instances."""
    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    uid, ours = load_state(cfg).fleet_uid, _live(cfg)
    path = cfg / "status" / "fleet.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["uid"] = "0123456789abcdef"
    path.write_text(yaml.safe_dump(doc))
    for args in (["plan", str(cfg)], ["apply", str(cfg), "--auto-approve"], ["apply", str(cfg), "--auto-approve", "--adopt-fleet"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1, res.output
        said = _said(res)
        assert f"metadata.uid is '0123456789abcdef', but the state records fleet 'quickstart' with uid '{uid}'" in said, said
        assert "restore it from git, or delete it" in said, said
    assert _live(cfg) == ours and "0123456789abcdef" in path.read_text()  # not overwritten either
    path.unlink()  # the way out the error gives: apply writes it again from the state
    assert not api.apply(cfg, time_limit=QUICK).plan.has_changes and api.read_status(cfg)["fleet"]["metadata"]["uid"] == uid


@pytest.mark.parametrize("text,problem", [("", "it is empty"), ("  \n\n", "it is empty"),
                                          ("# nothing\n", "it holds no YAML document"),
                                          ("status: {instances: 10}\n", "it has no metadata")])
def test_an_empty_status_fleet_yaml_with_the_state_lost_is_named(tmp_path, text, problem):
    """It was read as "no identity", and the error blamed "another fleet of that name" (rename a Topology)."""
    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    ours = _live(cfg)
    (cfg / "status" / "fleet.yaml").write_text(text)
    (state_dir(cfg) / "state.json").unlink()
    res = runner.invoke(app, ["plan", str(cfg)])
    assert res.exit_code == 1, res.output
    said = _said(res)
    assert f"status/fleet.yaml: cannot read the fleet's identity: {problem}" in said and "Restore it from git" in said, said
    assert "another fleet of that name" not in said and _live(cfg) == ours


def test_with_the_state_in_s3_a_lost_state_is_recovered_and_another_prefix_is_refused(aws_env, monkeypatch, tmp_path):
    """The gitops workflow keeps the state in a bucket (FLEETOPS_STATE). Its object lost, the same URL (however spelt:
    a trailing slash) recovers the fleet's instances from status/fleet.yaml; a fork of the repo with its own prefix is
    refused while they carry the uid."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    bucket = f"ident-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=aws_env)
    s3.create_bucket(Bucket=bucket)
    cfg = copy_quickstart(tmp_path / "a")
    api.apply(cfg, time_limit=QUICK, state=f"s3://{bucket}/fleet")
    uid, ours = api.read_status(cfg)["fleet"]["metadata"]["uid"], _live(cfg)
    assert api.read_status(cfg)["fleet"]["metadata"]["annotations"] == {"fleetops.io/state": f"s3://{bucket}/fleet"}
    s3.delete_object(Bucket=bucket, Key="fleet/state.json")
    assert not api.plan(cfg, time_limit=QUICK, state=f"s3://{bucket}/fleet/").plan.has_changes
    fork = _fork(cfg, tmp_path / "b")
    with pytest.raises(FleetIdentityError, match=f"recorded the fleet's state at s3://{bucket}/fleet;"):
        api.plan(fork, time_limit=QUICK, state=f"s3://{bucket}/fork")
    with pytest.raises(FleetIdentityError, match=f"this run's state \\(s3://{bucket}/fork\\) records no fleet"):
        api.apply(fork, time_limit=QUICK, state=f"s3://{bucket}/fork", allow_destroy=20)
    assert _live(cfg) == ours and api.read_status(cfg)["fleet"]["metadata"]["uid"] == uid


def test_an_identity_taken_by_an_apply_that_stops_early_is_in_status_too(tmp_path):
    """apply saves a new identity (here a rename's, with --adopt-fleet) in the state before anything else, but wrote
    status/fleet.yaml only at its end: stopped in between (here a stale saved plan; a kill), the two disagreed, which
    every later run refuses. status/fleet.yaml takes it with the state."""
    from reconciler.errors import StalePlanError

    cfg = copy_quickstart(tmp_path)
    api.apply(cfg, time_limit=QUICK)
    old = load_state(cfg).fleet_uid
    saved = api.plan(cfg, time_limit=QUICK).plan
    topo = cfg / "topology.yaml"
    topo.write_text(topo.read_text().replace("name: quickstart", "name: quickstart-v2"))
    with pytest.raises(StalePlanError):
        api.apply(cfg, saved_plan=saved, adopt_fleet=True)
    st = load_state(cfg)
    assert st.fleet_name == "quickstart-v2" and st.fleet_uid != old
    meta = api.read_status(cfg)["fleet"]["metadata"]
    assert (meta["name"], meta["uid"]) == ("quickstart-v2", st.fleet_uid)
    api.plan(cfg, time_limit=QUICK)  # not refused
