"""gang: placement-group, through the provider boundary: the sim keeps a group in one zone as
AWS does; on a real moto server the AWS provider creates a cluster placement group (tagged
with the fleet) and launches every replica into it."""

from __future__ import annotations

import uuid

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

from providers.aws import AwsProvider
from providers.base import TAG_FLEET, CreateRequest, PoolTarget, ProviderContext, ownership_tags
from reconciler.errors import OwnershipError, ProviderError
from reconciler.plan import placement_group_name

from providers.sim import SimCloud
from reconciler import api
from reconciler.state import state_dir
from tests.fleetkit import job, pool, tenant, topology, write_config
from tests.invariants import check_plan, check_stability

AMI = "ami-03cf127a"  # one of moto's built-in images


def _docs(fleet: str, aws: bool) -> list[dict]:
    p = pool("a100", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], hi=4)
    if aws:
        p["spec"]["provider"] = "aws"
        p["spec"]["aws"] = {"ami": AMI}
    g = job("pretrain", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=3, gang="placement-group")
    return [topology(fleet, clouds={"aws": {"us-east-1": ["us-east-1a", "us-east-1b"]}}), tenant("t"), p, g]


def test_sim_launches_a_gang_into_one_group_in_one_zone(tmp_path):
    cfg = write_config(tmp_path / "cfg", _docs("pg-sim", aws=False))
    res = api.apply(cfg, time_limit=5)
    assert res.report.ok
    group = {c.placement_group for c in res.plan.creates}
    zones = {c.zone for c in res.plan.creates}
    assert len(zones) == 1 and group == {placement_group_name("pg-sim", "pretrain", zones.pop())}  # one group per gang and zone
    world = [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] == "running"]
    assert len(world) == 3 and {i["placement_group"] for i in world} == group and len({i["zone"] for i in world}) == 1


def test_aws_creates_a_cluster_group_once_and_launches_into_it(aws_env, tmp_path):
    """moto implements neither CreatePlacementGroup nor Placement.GroupName, so EC2's answers to
    CreatePlacementGroup (created, then InvalidPlacementGroup.Duplicate) come from a botocore
    hook, and the RunInstances request is read as sent; the launches themselves hit moto."""
    fleet = f"pg-{uuid.uuid4().hex[:6]}"
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env}))
    client = prov.ec2("us-east-1")
    groups: dict[str, dict] = {}
    launched: list[dict] = []

    asked: list[dict] = []

    def create_group(**_):
        params = asked[-1]  # the API parameters, as provide-client-params saw them
        if params["GroupName"] in groups:
            raise ClientError({"Error": {"Code": "InvalidPlacementGroup.Duplicate",
                                         "Message": f"The placement group '{params['GroupName']}' already exists."}}, "CreatePlacementGroup")
        groups[params["GroupName"]] = params
        return AWSResponse("https://ec2.us-east-1.amazonaws.com/", 200, {}, None), {"ResponseMetadata": {"HTTPStatusCode": 200}}

    def describe_group(**_):  # the Duplicate is checked to be ours before the group is used
        g = groups[asked[-1]["GroupNames"][0]]
        return AWSResponse("https://ec2.us-east-1.amazonaws.com/", 200, {}, None), {"PlacementGroups": [
            {"GroupName": g["GroupName"], "Strategy": "cluster", "Tags": g["TagSpecifications"][0]["Tags"]}]}

    client.meta.events.register("provide-client-params.ec2.CreatePlacementGroup", lambda params, **kw: asked.append(dict(params)))
    client.meta.events.register("before-call.ec2.CreatePlacementGroup", create_group)
    client.meta.events.register("provide-client-params.ec2.DescribePlacementGroups", lambda params, **kw: asked.append(dict(params)))
    client.meta.events.register("before-call.ec2.DescribePlacementGroups", describe_group)
    client.meta.events.register("provide-client-params.ec2.RunInstances", lambda params, **kw: launched.append(params))
    target = PoolTarget(name="a100", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("p4d.24xlarge",),
                        settings={"ami": AMI})
    for k in ("k1", "k2"):
        prov.create(CreateRequest(key=k, pool=target, zone="us-east-1a", instance_type="p4d.24xlarge", market="on-demand",
                                  tags=ownership_tags(fleet, "a100", k), placement_group=f"{fleet}-pretrain"))
    assert list(groups) == [f"{fleet}-pretrain"] and groups[f"{fleet}-pretrain"]["Strategy"] == "cluster"
    assert groups[f"{fleet}-pretrain"]["TagSpecifications"][0]["Tags"] == [{"Key": TAG_FLEET, "Value": fleet}]
    assert [p["Placement"] for p in launched] == [{"AvailabilityZone": "us-east-1a", "GroupName": f"{fleet}-pretrain"}] * 2
    assert len(prov.observe([target])) == 2


def test_aws_reports_a_refused_group_as_a_provider_error(aws_env, tmp_path):
    prov = AwsProvider(ProviderContext(fleet="pg-x", state_dir=tmp_path, options={"endpoint_url": aws_env}))

    def refuse(**_):
        raise ClientError({"Error": {"Code": "PlacementGroupLimitExceeded", "Message": "You've reached the limit of placement groups."}},
                          "CreatePlacementGroup")

    prov.ec2("us-east-1").meta.events.register("before-call.ec2.CreatePlacementGroup", refuse)
    target = PoolTarget(name="a100", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("p4d.24xlarge",),
                        settings={"ami": AMI})
    with pytest.raises(ProviderError, match="PlacementGroupLimitExceeded"):
        prov.create(CreateRequest(key="k", pool=target, zone="us-east-1a", instance_type="p4d.24xlarge", market="on-demand",
                                  tags=ownership_tags("pg-x", "a100", "k"), placement_group="pg-x-job"))
    assert prov.observe([target]) == []  # nothing was launched


# -- placement groups are cleaned up (issue 22, item 5) ----------------------------------------------
@pytest.fixture
def ec2_proxy(aws_env):
    from tests.ec2_proxy import Ec2Proxy

    p = Ec2Proxy(aws_env).start()
    yield p
    p.stop()


def _gang_docs(fleet: str, jobs: list[str]) -> list[dict]:
    docs = _docs(fleet, aws=True)[:3]
    return docs + [job(j, gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2, gang="placement-group") for j in jobs]


def test_a_gangs_placement_group_is_deleted_once_the_gang_is_gone(ec2_proxy, tmp_path):
    """EC2 keeps a cluster placement group after its instances are terminated, and its per-Region limit then fails
    every later gang (PlacementGroupLimitExceeded). The layer in front of moto enforces the limit (moto has no
    placement groups) and refuses to delete a group that still has a live member, as EC2 does."""
    fleet = f"pg-{uuid.uuid4().hex[:6]}"
    ec2_proxy.placement_group_limit = 1
    opts = {"endpoint_url": ec2_proxy.url, "placement_group_wait": "30"}
    cfg = write_config(tmp_path / "cfg", _gang_docs(fleet, ["pretrain"]))
    first = api.apply(cfg, provider="aws", options=opts, time_limit=5)
    assert first.report.ok and len(first.plan.creates) == 2
    groups = {c.placement_group for c in first.plan.creates}
    assert {n for _, n in ec2_proxy.groups} == groups and len(groups) == 1
    assert not first.report.cleaned_up  # in use: kept

    write_config(cfg, _gang_docs(fleet, []))  # the gang is gone
    second = api.apply(cfg, provider="aws", options=opts, time_limit=5, allow_destroy=2)
    assert second.report.ok and len(second.report.deleted) == 2
    assert [r.split("/", 1)[1] for r in second.report.cleaned_up] == sorted(groups) and not ec2_proxy.groups

    # Limit 1: another gang gets its group only because the first one's was deleted.
    write_config(cfg, _gang_docs(fleet, ["finetune"]))
    third = api.apply(cfg, provider="aws", options=opts, time_limit=5)
    assert third.report.ok and len(third.report.created) == 2
    assert {n for _, n in ec2_proxy.groups} == {c.placement_group for c in third.plan.creates} != groups


def test_the_placement_group_limit_is_a_quota_error(ec2_proxy, tmp_path):
    from reconciler.errors import QuotaError

    ec2_proxy.placement_group_limit = 0
    prov = AwsProvider(ProviderContext(fleet="pg-q", state_dir=tmp_path, options={"endpoint_url": ec2_proxy.url}))
    target = PoolTarget(name="a100", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("p4d.24xlarge",),
                        settings={"ami": AMI})
    with pytest.raises(QuotaError, match="PlacementGroupLimitExceeded") as e:
        prov.create(CreateRequest(key="k", pool=target, zone="us-east-1a", instance_type="p4d.24xlarge", market="on-demand",
                                  tags=ownership_tags("pg-q", "a100", "k"), placement_group="pg-q-job"))
    assert "placement groups per Region" in str(e.value) and prov.observe([target]) == []


def test_placement_group_names_of_two_fleets_never_collide():
    """Fleet `team` with job `a-train` and fleet `team-a` with job `train` shared `team-a-train` (issue 15, item 3)."""
    assert placement_group_name("team", "a-train", "us-east-1a") != placement_group_name("team-a", "train", "us-east-1a")
    assert placement_group_name("team", "a-train", "us-east-1a").startswith("team-a-train-")


def test_aws_refuses_a_duplicate_group_another_fleet_owns(aws_env, tmp_path):
    """InvalidPlacementGroup.Duplicate means the name exists, not that it is ours: its fleet tag is read first."""
    prov = AwsProvider(ProviderContext(fleet="pg-mine", state_dir=tmp_path, options={"endpoint_url": aws_env}))
    client = prov.ec2("us-east-1")

    def duplicate(**_):
        raise ClientError({"Error": {"Code": "InvalidPlacementGroup.Duplicate", "Message": "exists"}}, "CreatePlacementGroup")

    def theirs(**_):
        return AWSResponse("https://ec2.us-east-1.amazonaws.com/", 200, {}, None), {"PlacementGroups": [
            {"GroupName": "shared-name", "Strategy": "cluster", "Tags": [{"Key": TAG_FLEET, "Value": "pg-theirs"}]}]}

    client.meta.events.register("before-call.ec2.CreatePlacementGroup", duplicate)
    client.meta.events.register("before-call.ec2.DescribePlacementGroups", theirs)
    target = PoolTarget(name="a100", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("p4d.24xlarge",),
                        settings={"ami": AMI})
    with pytest.raises(OwnershipError, match="placement group shared-name already exists and is not fleet 'pg-mine'"):
        prov.create(CreateRequest(key="k", pool=target, zone="us-east-1a", instance_type="p4d.24xlarge", market="on-demand",
                                  tags=ownership_tags("pg-mine", "a100", "k"), placement_group="shared-name"))
    assert prov.observe([target]) == []  # nothing was launched


def _g4_docs(gang: str | None) -> list[dict]:
    spec = {} if gang is None else {"gang": gang}
    return [topology("pg", clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t", gpus=8),
            pool("g4", "aws", "us-east-1", ["us-east-1a"], ["g4dn.xlarge"], hi=4),
            job("train", gpus=1, gpu_type="T4", cpu=4, mem=16, replicas=2, **spec)]


@pytest.mark.parametrize("time_limit", [5, 0])  # CP-SAT's plan, greedy's
def test_a_running_gang_made_placement_group_moves_whole_into_its_group(tmp_path, time_limit):
    """A running zone gang whose job now asks `gang: placement-group` runs on instances in no placement group: its own
    rule changed, so it moves whole onto new instances launched into its group (README: every replica launches into
    one). Before, the plan only checked zone and type, said "No changes" and the gang never entered a group. Back to
    `gang: zone`, a gang in its group breaks nothing: it stays."""
    cfg = write_config(tmp_path / "c", _g4_docs(None))
    assert api.apply(cfg, time_limit=time_limit).report.ok
    before = {i["id"] for i in SimCloud(state_dir(cfg)).instances() if i["state"] == "running"}
    assert len(before) == 2
    kept = api.plan(cfg, time_limit=time_limit).plan  # the plan the fleet as a zone gang needs: none
    assert not kept.has_changes
    write_config(tmp_path / "c", _g4_docs("placement-group"))
    made = api.plan(cfg, time_limit=time_limit)
    p = made.plan
    check_plan(made.desired, made.observed, p)
    check_stability(made.desired, made.observed, p)
    with pytest.raises(AssertionError, match="outside its placement group"):  # the oracle refuses what the plan was
        check_plan(made.desired, made.observed, kept)
    group = placement_group_name("pg", "train", "us-east-1a")
    (train,) = [j for j in p.jobs if j.job == "train"]
    assert train.action == "move" and "placement group" in train.reason, (train.action, train.reason)
    assert len(p.creates) == 2 and {c.placement_group for c in p.creates} == {group}
    assert set(train.instances) == {c.ref for c in p.creates}
    done = api.apply(cfg, time_limit=time_limit)
    assert done.report.ok, done.report.failures
    world = [i for i in SimCloud(state_dir(cfg)).instances() if i["state"] == "running"]
    assert len(world) == 2 and not before & {i["id"] for i in world} and {i["placement_group"] for i in world} == {group}
    assert not api.plan(cfg, time_limit=time_limit).plan.has_changes
    write_config(tmp_path / "c", _g4_docs("zone"))
    assert not api.plan(cfg, time_limit=time_limit).plan.has_changes
