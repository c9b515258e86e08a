"""Create keys are unique per launch attempt (issue 15, item 1).

A plan's id is a function of (desired, observed), so the same plan recurs whenever the
fleet returns to a state it was in: a reclaimed replacement, a whole fleet lost, a scale to
zero reverted. Every cloud remembers an idempotency key after its instance is gone (the
sim's key table, EC2's ClientToken for >= 24 h, GCE's requestId), so reusing the plan's key
"creates" the dead instance again: nothing launches, status says Running on it, and every
later run drifts. Each scenario here must really launch, heal and then plan no changes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from providers.sim import SimCloud
from reconciler import api
from reconciler.state import state_dir
from tests.fleetkit import copy_example, copy_quickstart

QUICK = 5  # seconds: the quickstart solves to optimality far sooner


def _live(cfg: Path) -> dict[str, dict]:
    return {i["id"]: i for i in SimCloud(state_dir(cfg)).instances() if i["state"] != "terminated"}


def _assert_healed(cfg: Path, res: api.ApplyResult) -> None:
    """Every job the apply placed runs on live instances, status says so, and the next plan is a no-op."""
    live = _live(cfg)
    assert res.report.ok, res.report.failures
    for ref, iid in res.report.created.items():
        assert iid in live, f"{ref} 'created' {iid}, which is not running: the launch was a no-op"
    for job, ids in res.report.placements.items():
        assert set(ids) <= set(live), f"{job} is recorded on dead instances {sorted(set(ids) - set(live))}"
    for job, doc in api.read_status(cfg)["jobs"].items():
        st = doc["status"]
        if st["phase"] in ("Running", "Reserved"):
            assert set(st["instances"]) <= set(live), f"status says {job} runs on dead {st['instances']}"
    again = api.plan(cfg, time_limit=QUICK)
    assert not again.plan.has_changes, "drift right after a successful apply"
    keys = [i["tags"]["fleetops.io/create-key"] for i in live.values()]
    assert len(keys) == len(set(keys))


def test_reclaimed_replacement_is_replaced_again(tmp_path):
    """The issue's scenario: reclaim the instance running finetune-a, apply, reclaim its replacement, apply."""
    cfg = copy_quickstart(tmp_path)
    res = api.apply(cfg, time_limit=QUICK)
    sim = SimCloud(state_dir(cfg))
    for _ in range(3):
        victim = res.report.placements["finetune-a"][0]
        sim.interrupt(victim)
        res = api.apply(cfg, time_limit=QUICK)
        assert res.report.placements["finetune-a"][0] != victim
        _assert_healed(cfg, res)


def test_whole_fleet_lost_once(tmp_path):
    cfg = copy_quickstart(tmp_path)
    first = api.apply(cfg, time_limit=QUICK)
    sim = SimCloud(state_dir(cfg))
    for iid in _live(cfg):
        sim.interrupt(iid)
    res = api.apply(cfg, time_limit=QUICK)
    assert len(res.report.created) == len(first.report.created)
    _assert_healed(cfg, res)


def test_scale_to_zero_and_revert(tmp_path):
    cfg = copy_quickstart(tmp_path)
    first = api.apply(cfg, time_limit=QUICK)
    saved = {p: p.read_text() for p in cfg.rglob("*.yaml") if "status" not in p.parts}
    for p in (cfg / "jobs").glob("*.yaml"):
        p.unlink()
    pools = cfg / "pools.yaml"
    pools.write_text(pools.read_text().replace("min_instances: 1", "min_instances: 0"))
    api.apply(cfg, time_limit=QUICK, allow_destroy=20)
    assert not _live(cfg)
    for p, text in saved.items():  # git revert
        p.write_text(text)
    res = api.apply(cfg, time_limit=QUICK)
    assert len(res.report.created) == len(first.report.created)
    _assert_healed(cfg, res)


def test_heals_with_the_state_file_lost_too(tmp_path):
    """Attempt keys are tried in order and a spent one is proved by the cloud, not remembered:
    losing .reconcile/state.json between the reclaims changes nothing."""
    cfg = copy_quickstart(tmp_path)
    res = api.apply(cfg, time_limit=QUICK)
    sim = SimCloud(state_dir(cfg))
    for _ in range(2):
        sim.interrupt(res.report.placements["finetune-a"][0])
        (state_dir(cfg) / "state.json").unlink()
        res = api.apply(cfg, time_limit=QUICK)
        _assert_healed(cfg, res)


# ---------------------------------------------------------------- the clouds' own key rules, over HTTP


def test_ec2_token_layer_behaves_as_ec2_documents(aws_env, ec2_tokens):
    """The rules tests/ec2_tokens.py puts in front of moto, checked with a plain boto3 client."""
    import boto3
    from botocore.exceptions import ClientError

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)
    token = f"tok-{uuid.uuid4().hex}"
    args = dict(ImageId="ami-03cf127a", InstanceType="g5.xlarge", MinCount=1, MaxCount=1, ClientToken=token,
                TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "token", "Value": token}]}])
    first = ec2.run_instances(**args)["Instances"][0]
    again = ec2.run_instances(**args)["Instances"][0]
    assert again["InstanceId"] == first["InstanceId"]
    ec2.terminate_instances(InstanceIds=[first["InstanceId"]])
    after = ec2.run_instances(**args)["Instances"][0]  # the original launch, as it is now: terminated
    assert after["InstanceId"] == first["InstanceId"] and after["State"]["Name"] in ("shutting-down", "terminated")
    other = {**args, "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "token", "Value": token},
                                                                                 {"Key": "k", "Value": "w"}]}]}
    with pytest.raises(ClientError, match="IdempotentParameterMismatch"):
        ec2.run_instances(**other)
    mine = [i for r in ec2.describe_instances(Filters=[{"Name": "tag:token", "Values": [token]}])["Reservations"]
            for i in r["Instances"]]
    assert [i["InstanceId"] for i in mine] == [first["InstanceId"]], "a token launched twice"
    # DescribeInstances' client-token filter (moto has none): the token's instances, terminated ones too.
    by_token = [i for r in ec2.describe_instances(Filters=[{"Name": "client-token", "Values": [token]}])["Reservations"]
                for i in r["Instances"]]
    assert [i["InstanceId"] for i in by_token] == [first["InstanceId"]]
    assert ec2.describe_instances(Filters=[{"Name": "client-token", "Values": [f"never-{token}"]}])["Reservations"] == []
    # A lagging tag-filtered listing (eventual consistency) misses the instance once, then shows it.
    ec2_tokens.lag_tag("token", token)
    tagged = [{"Name": "tag:token", "Values": [token]}]
    assert ec2.describe_instances(Filters=tagged)["Reservations"] == []
    assert [i["InstanceId"] for r in ec2.describe_instances(Filters=tagged)["Reservations"] for i in r["Instances"]] == [
        first["InstanceId"]]


def _reclaim_and_heal(cfg: Path, provider: str, opts: dict, kill, rounds: int = 3) -> None:
    """Apply; then `rounds` times: kill the instance of the first placed job, apply, check it healed."""
    res = api.apply(cfg, provider=provider, options=opts)
    job = min(res.report.placements)
    for _ in range(rounds):
        victim = res.report.placements[job][0]
        kill(victim)
        res = api.apply(cfg, provider=provider, options=opts)
        assert res.report.ok, res.report.failures
        again = api.plan(cfg, provider=provider, options=opts)
        live = {i.id for i in again.observed.instances}
        assert res.report.placements[job][0] in live  # (Azure: a new VM may take the same name, so the same id)
        assert set(res.report.created.values()) <= live, "a 'created' instance is not running"
        assert not again.plan.has_changes, "drift right after a successful apply"


def test_aws_reclaimed_replacement_is_replaced_again(aws_env, tmp_path, ec2_tokens):
    import boto3

    fleet = f"keys-{uuid.uuid4().hex[:8]}"
    cfg = copy_example(tmp_path, "aws-only")
    (cfg / "fleet.yaml").write_text((cfg / "fleet.yaml").read_text().replace("name: aws-fleet", f"name: {fleet}"))
    clients = {r: boto3.client("ec2", region_name=r, endpoint_url=aws_env) for r in ("us-east-1", "us-west-2")}

    def kill(iid: str) -> None:
        for ec2 in clients.values():
            try:
                ec2.terminate_instances(InstanceIds=[iid])
                return
            except ec2.exceptions.ClientError:
                continue

    answered = ec2_tokens.replays + ec2_tokens.mismatches
    _reclaim_and_heal(cfg, "aws", {"endpoint_url": aws_env}, kill)
    # The plan did recur: EC2 answered its tokens with the dead instance or IdempotentParameterMismatch (the
    # placement tags' serial differs), and the next attempt's token launched.
    assert ec2_tokens.replays + ec2_tokens.mismatches > answered


def test_gcp_reclaimed_replacement_is_replaced_again(gce, tmp_path):
    from tests.test_gcp_provider import PROJECT

    cfg = copy_example(tmp_path, "gcp-only")

    def kill(iid: str) -> None:  # a Spot VM preempted with instanceTerminationAction DELETE, a minute into its life
        _, project, _, zone, _, name = iid.split("/")
        # (A GCE insert takes seconds to be DONE, so the same key's next insert is never within seconds of its last:
        # here the whole round takes less than one, and the provider tells a remembered operation by its age.)
        gce.preempt(project, zone, name)  # STOPPING for GCE's 30 s, then deleted: the minute below ends it
        gce.age(60)
        assert not any(i["name"] == name for i in gce.instances(project))

    _reclaim_and_heal(cfg, "gcp", {"endpoint": gce.url, "project": PROJECT}, kill)


def test_azure_reclaimed_replacement_is_replaced_again(arm, tmp_path):
    from tests.conftest import arm_options

    cfg = copy_example(tmp_path, "azure-only")
    _reclaim_and_heal(cfg, "azure", arm_options(arm), lambda iid: arm.evict(iid.rsplit("/", 1)[1]))
