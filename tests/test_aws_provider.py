"""The AWS provider with boto3 against a real moto server over HTTP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from providers.aws import AwsProvider
from providers.catalog import load_catalog
from providers.base import TAG_CREATE_KEY, TAG_FLEET, CreateRequest, PoolTarget, ProviderContext, ownership_tags
from reconciler import api
from reconciler.cli import app
from reconciler.errors import ApplyError, CapacityError, KeySpentError, OwnershipError, ProviderError
from reconciler.state import load_state
from tests.conftest import AWS_ENV
from tests.ec2_iam import readme_policy_actions
from tests.fleetkit import copy_example

AMI = "ami-03cf127a"  # one of moto's built-in images


@pytest.fixture
def fleet():
    return f"fleet-{uuid.uuid4().hex[:8]}"  # moto's state is shared by the session: one fleet per test


@pytest.fixture
def prov(aws_env, tmp_path, fleet):
    return AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env}))


@pytest.fixture
def ec2(aws_env):
    """An independent client, for planting and checking."""
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_env)


def target(name="a10g", zones=("us-east-1a", "us-east-1b"), types=("g5.xlarge", "g5.12xlarge")):
    return PoolTarget(name=name, cloud="aws", region="us-east-1", zones=zones, instance_types=types,
                      settings={"ami": AMI, "security_groups": [], "subnets": {}})


def req(fleet, key, market="on-demand", zone="us-east-1a", itype="g5.xlarge"):
    return CreateRequest(key=key, pool=target(), zone=zone, instance_type=itype, market=market,
                         max_price=1.006 if market == "spot" else None, tags=ownership_tags(fleet, "a10g", key))


def test_create_observe_delete_spot_and_on_demand(prov, fleet, ec2):
    od = prov.create(req(fleet, "k-od"))
    spot = prov.create(req(fleet, "k-spot", market="spot", zone="us-east-1b"))
    assert (od.market, od.zone, od.instance_type, od.pool) == ("on-demand", "us-east-1a", "g5.xlarge", "a10g")
    assert (spot.market, spot.zone) == ("spot", "us-east-1b")
    seen = {i.id: i for i in prov.observe([target()])}
    assert set(seen) == {od.id, spot.id}
    assert seen[spot.id].tags[TAG_CREATE_KEY] == "k-spot"
    raw = ec2.describe_instances(InstanceIds=[spot.id])["Reservations"][0]["Instances"][0]
    assert raw["InstanceLifecycle"] == "spot" and raw["ImageId"] == AMI
    prov.delete(spot)
    prov.delete(spot)  # already gone: not an error
    assert {i.id for i in prov.observe([target()])} == {od.id}


def test_retry_with_the_same_key_returns_the_same_instance(prov, fleet):
    first = prov.create(req(fleet, "k-same"))
    again = prov.create(req(fleet, "k-same"))
    assert again.id == first.id
    assert [i.id for i in prov.observe([target()])] == [first.id]


def _with_tag(request: CreateRequest, key: str, value: str) -> CreateRequest:
    return replace(request, tags={**request.tags, key: value})


def test_a_token_reused_with_other_parameters_answers_its_live_instance(prov, fleet, ec2, ec2_tokens):
    """EC2's IdempotentParameterMismatch says an earlier launch with the token succeeded with other parameters (on a
    rerun a tag changed, or the AMI's SSM alias resolved to a newer image), not that its instance is gone. With the
    key's tag lookup missing the instance (eventual consistency), that answer was KeySpentError, and apply launched
    `<key>-1`: a second GPU instance beside the running one. The create is the token's live instance."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    first = prov.create(req(fleet, key))
    mismatches = ec2_tokens.mismatches
    ec2_tokens.lag_tag(TAG_CREATE_KEY, key)
    again = prov.create(_with_tag(req(fleet, key), "team", "vision"))
    assert ec2_tokens.mismatches == mismatches + 1, "EC2 did not answer IdempotentParameterMismatch"
    assert (again.id, again.alive) == (first.id, True)
    mine = [i["InstanceId"] for r in ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_FLEET}", "Values": [fleet]}])[
        "Reservations"] for i in r["Instances"]]
    assert mine == [first.id]


def test_a_token_reused_with_other_parameters_is_spent_once_its_instance_is_terminated(prov, fleet, ec2, ec2_tokens):
    """A reclaimed replacement's plan recurs with new placement tags: its token's instance is terminated, so the key
    is spent and apply tries the next one."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    first = prov.create(req(fleet, key))
    ec2.terminate_instances(InstanceIds=[first.id])
    with pytest.raises(KeySpentError, match=rf"IdempotentParameterMismatch.*{first.id} is terminated"):
        prov.create(_with_tag(req(fleet, key), "team", "vision"))


def test_a_token_whose_terminated_instance_ec2_no_longer_lists_is_spent(aws_env, tmp_path, fleet, ec2, ec2_tokens):
    """EC2 lists a terminated instance for less than an hour but keeps its ClientToken for at least 24 h; moto lists it
    forever, so a plan key recurring a day after its instance was reclaimed never met a token whose instance nothing
    shows. Replayed as it was, the token answers its launch, terminated; with other parameters it is
    IdempotentParameterMismatch, and with nothing to show for it the key is spent (apply tries the next one)."""
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env,
                                                                                 "consistency_timeout": "1"}))
    key = f"k-{uuid.uuid4().hex[:8]}"
    first = prov.create(req(fleet, key))
    ec2.terminate_instances(InstanceIds=[first.id])
    ec2_tokens.expire("us-east-1", [first.id])  # an hour on
    with pytest.raises(ClientError, match="InvalidInstanceID.NotFound"):
        ec2.describe_instances(InstanceIds=[first.id])
    assert prov.find([first.id], [target()]) == []
    again = prov.create(req(fleet, key))
    assert (again.id, again.state) == (first.id, "terminated")
    with pytest.raises(KeySpentError, match="no instance launched with it shows"):
        prov.create(_with_tag(req(fleet, key), "team", "vision"))


def test_a_recurring_key_this_state_sent_long_ago_is_spent_without_waiting_for_eventual_consistency(aws_env, tmp_path, fleet,
                                                                                                      ec2, ec2_tokens):
    """A plan key recurring a day after its instance was reclaimed, with new placement tags: EC2 answers
    IdempotentParameterMismatch and shows no instance for the token (it lists a terminated one for about an hour).
    The provider asked again for consistency_timeout (120 s by default) in case the instance was launched a moment
    ago, once per spent attempt key of every such create. This state sent the token a day ago, so its instance is a
    day old and would show if alive: the key is spent at once. Without that record (another checkout's state, or a
    lost one) the wait stands. And once EC2 forgets the token (some time after 24 h), the key launches anew."""
    import os
    import time

    from providers.aws import client_token

    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env,
                                                                                 "consistency_timeout": "5"}))
    key = f"k-{uuid.uuid4().hex[:8]}"
    first = prov.create(req(fleet, key))
    ec2.terminate_instances(InstanceIds=[first.id])
    ec2_tokens.expire("us-east-1", [first.id])
    records = list((tmp_path / "cache" / "aws-client-tokens").iterdir())
    assert len(records) == 1
    a_day_ago = time.time() - 25 * 3600
    os.utime(records[0], (a_day_ago, a_day_ago))  # a day on
    started = time.monotonic()
    with pytest.raises(KeySpentError, match="no instance launched with it shows, and this state last sent it at"):
        prov.create(_with_tag(req(fleet, key), "team", "vision"))
    assert time.monotonic() - started < 2

    elsewhere = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path / "elsewhere", options={
        "endpoint_url": aws_env, "consistency_timeout": "1"}))
    started = time.monotonic()
    with pytest.raises(KeySpentError, match="no instance launched with it shows in 1 s"):
        elsewhere.create(_with_tag(req(fleet, key), "team", "audio"))
    assert time.monotonic() - started >= 0.5  # (asked again until the next pause would pass the 1 s)

    ec2_tokens.forget("us-east-1", client_token(key))
    again = prov.create(_with_tag(req(fleet, key), "team", "vision"))
    assert again.id != first.id and again.alive
    mine = [i["InstanceId"] for r in ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_FLEET}", "Values": [fleet]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
    assert mine == [again.id]


def test_unmanaged_and_foreign_instances_are_invisible_and_untouchable(prov, fleet, ec2):
    mine = prov.create(req(fleet, "k-mine"))
    bare = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    other = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": TAG_FLEET, "Value": "someone-else"}]}])["Instances"][0]["InstanceId"]
    assert [i.id for i in prov.observe([target()])] == [mine.id]
    for iid in (bare, other):
        with pytest.raises(OwnershipError, match="refusing to terminate"):
            prov.delete(mine.__class__(**{**mine.__dict__, "id": iid}))
        state = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
        assert state == "running"


def test_observe_paginates(prov, fleet, ec2):
    """moto pages DescribeInstances by reservation: 130 instances launched by one call were one page, and observe read
    them all with or without following NextToken. One launch per instance, as the provider launches them."""
    for _ in range(101):
        ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": TAG_FLEET, "Value": fleet}, {"Key": "fleetops.io/pool", "Value": "a10g"}]}])
    assert len(prov.observe([target()])) == 101  # pages of 100


def test_find_asks_for_many_ids_within_ec2_s_filter_value_limit(prov, fleet, ec2):
    """EC2 refuses a call with more than 200 filter values (FilterLimitExceeded: "The maximum number of filter values
    specified on a single call is 200"); moto took any number, so find()'s chunking was never put to the test."""
    run = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=3, MaxCount=3, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": TAG_FLEET, "Value": fleet}]}])
    mine = sorted(i["InstanceId"] for i in run["Instances"])
    absent = [f"i-{n:017x}" for n in range(250)]  # sorted ahead of moto's ids: the real ones are in a later chunk
    assert sorted(i.id for i in prov.find(absent + mine, [target()])) == mine
    with pytest.raises(ClientError, match="FilterLimitExceeded"):
        ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": absent[:201]}])


def _moto_types(n: int, *, quota: str | None = None, exclude: set[str] = frozenset()) -> list[str]:
    """n instance types moto describes (small ones) that the catalog does not know, of one vCPU quota if given."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    from providers.aws import vcpu_quota

    cat = load_catalog()
    out = sorted(t for t, info in INSTANCE_TYPES.items() if cat.shape("aws", t) is None and t not in exclude
                 and info["VCpuInfo"]["DefaultVCpus"] <= 4 and (quota is None or vcpu_quota(t, "on-demand")[0] == quota))
    assert len(out) >= n
    return out[:n]


def _vcpus_of(instance_type: str) -> int:
    from moto.ec2.models.instance_types import INSTANCE_TYPES

    return INSTANCE_TYPES[instance_type]["VCpuInfo"]["DefaultVCpus"]


def test_ec2_s_limit_on_the_instance_types_of_one_describe_instance_types_is_held(ec2):
    """EC2's API model caps DescribeInstanceTypes' InstanceTypes at 100 (botocore sends more: it checks a list's
    minimum only); moto described any number. A type EC2 does not know fails the whole call, as moto answers too."""
    types = _moto_types(101)
    assert len(ec2.describe_instance_types(InstanceTypes=types[:100])["InstanceTypes"]) == 100
    with pytest.raises(ClientError, match=r"InvalidParameterValue.*at most 100"):
        ec2.describe_instance_types(InstanceTypes=types)
    with pytest.raises(ClientError, match=r"InvalidInstanceType.*do not exist: \[zz9.large\]"):
        ec2.describe_instance_types(InstanceTypes=[*types[:3], "zz9.large"])


QUOTA_REGION = "eu-west-3"  # no other test launches here: the account's usage is this test's alone


@pytest.fixture
def quota_region(aws_env):
    """A client of QUOTA_REGION; every instance launched there is terminated after."""
    client = boto3.client("ec2", region_name=QUOTA_REGION, endpoint_url=aws_env)
    yield client
    ids = [i["InstanceId"] for page in client.get_paginator("describe_instances").paginate()
           for r in page["Reservations"] for i in r["Instances"]]
    for n in range(0, len(ids), 100):
        client.terminate_instances(InstanceIds=ids[n:n + 100])


def _cpu_pool(region=QUOTA_REGION):
    return PoolTarget(name="cpu", cloud="aws", region=region, zones=(f"{region}a",), instance_types=("m6i.xlarge",),
                      settings={"ami": AMI})


def test_quota_usage_counts_more_instance_types_than_one_describe_instance_types_takes(prov, quota_region):
    """The Standard vCPU quota counts every running instance of its families, whoever launched it, so the provider
    asks DescribeInstanceTypes for the vCPUs of the types the catalog does not know. An account running 101 such types
    in a Region was one call past EC2's 100, refused, and the plan failed with "the vCPUs of a1.large (running in this
    account) are unknown"; asked 100 at a time, every one is counted."""
    types = _moto_types(101, quota="L-1216C47A")
    for t in types:
        quota_region.run_instances(ImageId=AMI, InstanceType=t, MinCount=1, MaxCount=1)
    calls = []
    prov.ec2(QUOTA_REGION).meta.events.register("before-call.ec2.DescribeInstanceTypes", lambda **kw: calls.append(1))
    (std,) = [q for q in prov.quotas([_cpu_pool()]) if q.name.endswith("(L-1216C47A)")]
    assert std.used == sum(_vcpus_of(t) for t in types)
    assert len(calls) == 2


def test_a_running_type_ec2_does_not_describe_loses_only_its_own_vcpus(prov, quota_region):
    """DescribeInstanceTypes fails as a whole for a type it does not describe (InvalidInstanceType). One such type
    among those the account runs cost every shape of the call: the plan failed naming a type EC2 knows ("the vCPUs of
    a1.large ... are unknown"). The refused type is isolated: the error names it, and a type of a quota no pool
    counts against is not asked about at all."""
    known = _moto_types(3, quota="L-1216C47A")
    for t in [*known, "zz9.large"]:  # (moto launches a type it does not describe; "zz" is of the Standard quota)
        quota_region.run_instances(ImageId=AMI, InstanceType=t, MinCount=1, MaxCount=1)
    with pytest.raises(ProviderError, match=r"the vCPUs of zz9\.large \(running in this account\) are unknown"):
        prov.quotas([_cpu_pool()])
    gone = [i["InstanceId"] for r in quota_region.describe_instances(Filters=[{"Name": "instance-type", "Values": ["zz9.large"]}])[
        "Reservations"] for i in r["Instances"]]
    quota_region.terminate_instances(InstanceIds=gone)
    quota_region.run_instances(ImageId=AMI, InstanceType="p9.large", MinCount=1, MaxCount=1)  # P: not the pool's quota
    (std,) = [q for q in prov.quotas([_cpu_pool()]) if q.name.endswith("(L-1216C47A)")]
    assert std.used == sum(_vcpus_of(t) for t in known)


def test_offerings_of_more_instance_types_than_one_filter_takes(prov):
    """What each zone offers is read with an instance-type filter of the Region's types: past EC2's 200 filter values
    a call is refused (FilterLimitExceeded) and the plan failed. A pinned catalog may add types (reconcile catalog
    update prices what it lists), so a Region's pools can list more than 200; they are asked 200 at a time."""
    calls = []
    prov.ec2("us-east-1").meta.events.register("before-call.ec2.DescribeInstanceTypeOfferings", lambda **kw: calls.append(1))
    types = (*_moto_types(200), "g5.xlarge")  # the catalog's type in the second call
    offs = {(o.zone, o.instance_type) for o in prov.offerings([replace(target(), instance_types=types)])}
    assert offs == {("us-east-1a", "g5.xlarge"), ("us-east-1b", "g5.xlarge")}
    assert len(calls) == 2


def test_capacity_errors_become_capacity_errors(prov, fleet):
    def no_capacity(**kwargs):
        raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity",
                                     "Message": "We currently do not have sufficient g5.xlarge capacity in us-east-1a."}}, "RunInstances")

    prov.ec2("us-east-1").meta.events.register("before-call.ec2.RunInstances", no_capacity)
    with pytest.raises(CapacityError) as e:
        prov.create(req(fleet, "k-cap", market="spot"))
    assert (e.value.zone, e.value.instance_type, e.value.market) == ("us-east-1a", "g5.xlarge", "spot")
    assert "testing-secret" not in str(e.value)


def test_offerings_are_the_catalogs_and_keep_its_spot_price_where_ec2_has_none_within_90_days(prov):
    """Shapes and on-demand prices are the catalog's (no DescribeInstanceTypes at plan time since ae08e05); the spot
    price is EC2's when its history has one, else the catalog's, labelled as such."""
    offs = {(o.zone, o.instance_type): o for o in prov.offerings([target()])}
    g5 = offs[("us-east-1a", "g5.xlarge")]
    assert (g5.gpus, g5.gpu_type, g5.cpu, g5.memory_gib) == (1, "A10G", 4, 16)
    assert g5.on_demand_price == pytest.approx(1.006)
    # moto's spot history is a 2006 placeholder, beyond the 90 days EC2 keeps: the catalog's spot price is used.
    assert g5.spot_price == load_catalog().offering("aws", "us-east-1", "us-east-1a", "g5.xlarge").spot_price
    assert g5.price_source == "catalog: skypilot-v8"


def test_a_pools_subnets_and_security_groups_are_checked_at_plan_time(prov, ec2):
    """Issue 22 item 6: a pool's network settings are validated where the API allows, before anything launches. Each
    aws.subnets entry must exist and lie in the zone it is given for, and each security group must exist in the
    subnets' VPC; otherwise every RunInstances of the apply would fail. Before, nothing checked them."""
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    sub_a = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    sub_b = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.2.0/24", AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName=f"fleet-{uuid.uuid4().hex[:6]}", Description="gpu", VpcId=vpc)["GroupId"]
    other_vpc = ec2.create_vpc(CidrBlock="10.43.0.0/16")["Vpc"]["VpcId"]
    foreign_sg = ec2.create_security_group(GroupName=f"other-{uuid.uuid4().hex[:6]}", Description="x", VpcId=other_vpc)["GroupId"]

    def pool(subnets, groups):
        return replace(target(), settings={"ami": AMI, "subnets": subnets, "security_groups": groups})

    assert prov.offerings([pool({"us-east-1a": sub_a, "us-east-1b": sub_b}, [sg])])
    for subnets, groups, message in (
            ({"us-east-1a": "subnet-0000000000deadbee"}, [], "pool a10g: subnets subnet-0000000000deadbee: .*InvalidSubnetID.NotFound"),
            ({"us-east-1a": sub_b}, [], f"pool a10g: subnet {sub_b} is in us-east-1b, not us-east-1a"),
            ({"us-east-1a": sub_a}, ["sg-0000000000deadbee"], "pool a10g: security groups sg-0000000000deadbee: .*InvalidGroup.NotFound"),
            ({"us-east-1a": sub_a}, [foreign_sg], f"pool a10g: security group {foreign_sg} is in {other_vpc}, not the subnets' VPC")):
        with pytest.raises(ProviderError, match=message):
            prov.offerings([pool(subnets, groups)])


def _config(tmp_path: Path) -> Path:
    return copy_example(tmp_path, "aws-only")


def test_full_plan_apply_converge_against_moto(aws_env, tmp_path, ec2):
    cfg = _config(tmp_path)
    opts = {"endpoint_url": aws_env}
    planted = ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok and len(res.report.created) == len(res.plan.creates) == 4
    assert not api.plan(cfg, provider="aws", options=opts).plan.has_changes
    # An independent client, the AWS CLI, sees exactly the instances the reconciler created.
    env = {**os.environ, **AWS_ENV}
    out = subprocess.run([str(Path(sys.executable).parent / "aws"), "ec2", "describe-instances", "--endpoint-url", aws_env,
                          "--region", "us-east-1", "--filters", "Name=tag:fleetops.io/fleet,Values=aws-fleet",
                          "Name=instance-state-name,Values=running", "--output", "json"],
                         capture_output=True, text=True, env=env, check=True)
    ids = {i["InstanceId"] for r in json.loads(out.stdout)["Reservations"] for i in r["Instances"]}
    west = {i.id for i in api.plan(cfg, provider="aws", options=opts).observed.instances if i.region == "us-west-2"}
    assert ids | west == set(res.report.created.values())
    # Remove every job: our instances go, the planted one stays.
    for f in (cfg / "jobs").glob("*.yaml"):
        f.unlink()
    api.apply(cfg, provider="aws", options=opts)
    assert not api.plan(cfg, provider="aws", options=opts).observed.instances
    state = ec2.describe_instances(InstanceIds=[planted])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "running"


def test_the_readme_s_minimal_iam_policy_allows_every_call_a_plan_apply_and_teardown_makes(aws_env, tmp_path, fleet, ec2,
                                                                                          aws_calls):
    """moto enforces no IAM, so a policy missing an action the provider calls is found only on a real account, as
    UnauthorizedOperation. A pool with subnets and a security group (checked at plan time), an apply, and the teardown:
    every action sent is one the README's policy allows."""
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets(
        Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]}
    vpc = ec2.describe_subnets(SubnetIds=[subnets["us-east-1a"]])["Subnets"][0]["VpcId"]
    group = ec2.create_security_group(GroupName=f"{fleet}-nodes", Description="fleet nodes", VpcId=vpc)["GroupId"]
    cfg = _config(tmp_path)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}").replace(
        "security_groups: []", f"security_groups: [{group}]\n    subnets: {{us-east-1a: {subnets['us-east-1a']}, "
        f"us-east-1b: {subnets['us-east-1b']}}}"))
    opts = {"endpoint_url": aws_env}
    aws_calls.take()  # (the test's own calls above)
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    for job in (cfg / "jobs").glob("*.yaml"):
        job.unlink()
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    sent = aws_calls.take()
    assert {"ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:RunInstances", "ec2:TerminateInstances"} <= sent
    assert sorted(sent - readme_policy_actions()) == [], sorted(sent)


def test_a_stopped_instance_is_observed_as_stopping_not_gone(prov, fleet, ec2):
    """A stopped EC2 instance still exists (its EBS volumes are billed): observe reports it, not alive, never drops it."""
    inst = prov.create(req(fleet, "k-stopped"))
    ec2.stop_instances(InstanceIds=[inst.id])
    assert [(i.id, i.state) for i in prov.observe([target()])] == [(inst.id, "stopping")]
    assert prov.create(req(fleet, "k-stopped")).state == "stopping"  # its key finds it as it is


def test_a_stopped_instance_is_noted_left_alone_and_its_work_placed_elsewhere(aws_env, tmp_path, fleet):
    """Audit: observe listed only pending/running instances, so a stopped one vanished: its replicas were relaunched
    elsewhere and the instance itself was never reported (nor cleaned up)."""
    cfg = _config(tmp_path)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}"))
    opts = {"endpoint_url": aws_env}
    first = api.apply(cfg, provider="aws", options=opts)
    assert first.report.ok
    victim = min(first.report.created.values())
    region = next(i.region for i in api.plan(cfg, provider="aws", options=opts).observed.instances if i.id == victim)
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=aws_env)
    ec2.stop_instances(InstanceIds=[victim])
    res = api.plan(cfg, provider="aws", options=opts)
    assert victim not in {i.id for i in res.observed.instances}  # not capacity
    assert victim not in {d.instance_id for d in res.plan.deletes} and res.plan.creates  # left alone; its work goes elsewhere
    assert any(n.startswith(f"{victim} exists but does not run") and "may still be billed" in n for n in res.plan.notes)
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    assert ec2.describe_instances(InstanceIds=[victim])["Reservations"][0]["Instances"][0]["State"]["Name"] == "stopped"


def test_an_instance_terminated_outside_is_replaced_and_nothing_the_fleet_does_not_own_is_touched(aws_env, tmp_path, fleet):
    """An on-demand instance of the fleet terminated outside it (the console, another tool): observe no longer counts it
    (EC2 lists it terminated for a while), the plan launches one replacement for it and deletes nothing, and
    instances the fleet does not own (one launched by hand, one tagged for another fleet) are left running."""
    cfg = _config(tmp_path)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}"))
    opts = {"endpoint_url": aws_env}
    first = api.apply(cfg, provider="aws", options=opts)
    assert first.report.ok
    observed = api.plan(cfg, provider="aws", options=opts).observed.instances
    victim = next(i for i in observed if i.market == "on-demand")
    ec2 = boto3.client("ec2", region_name=victim.region, endpoint_url=aws_env)
    foreign = [ec2.run_instances(ImageId=AMI, InstanceType="g5.xlarge", MinCount=1, MaxCount=1, **tags)["Instances"][0]["InstanceId"]
               for tags in ({}, {"TagSpecifications": [{"ResourceType": "instance", "Tags": [
                   {"Key": TAG_FLEET, "Value": f"{fleet}-other"}]}]})]
    ec2.terminate_instances(InstanceIds=[victim.id])
    res = api.plan(cfg, provider="aws", options=opts)
    assert victim.id not in {i.id for i in res.observed.instances}
    assert len(res.plan.creates) == 1 and not res.plan.deletes
    again = api.apply(cfg, provider="aws", options=opts)
    assert again.report.ok and len(again.report.created) == 1 and victim.id not in again.report.created.values()
    after = api.plan(cfg, provider="aws", options=opts)
    assert not after.plan.has_changes and len(after.observed.instances) == len(observed)
    states = {d["InstanceId"]: d["State"]["Name"] for r in ec2.describe_instances(InstanceIds=foreign + [victim.id])["Reservations"]
              for d in r["Instances"]}
    assert states == {foreign[0]: "running", foreign[1]: "running", victim.id: "terminated"}


def test_a_create_whose_key_holds_a_stopped_instance_launches_no_second_one(aws_env, tmp_path, fleet):
    """Every instance stopped: the plan (and its create keys) is the first apply's again, and EC2 answers each key
    with its stopped instance. Launching under the next key would make a second instance for the key; the create
    fails instead, naming the instance and what to do."""
    cfg = _config(tmp_path)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}"))
    opts = {"endpoint_url": aws_env}
    first = api.apply(cfg, provider="aws", options=opts)
    by_region: dict[str, list[str]] = {}
    for i in api.plan(cfg, provider="aws", options=opts).observed.instances:
        by_region.setdefault(i.region, []).append(i.id)
    for region, ids in by_region.items():
        boto3.client("ec2", region_name=region, endpoint_url=aws_env).stop_instances(InstanceIds=ids)
    with pytest.raises(ApplyError, match="exists but does not run .*no second one is launched; start it, or delete it"):
        api.apply(cfg, provider="aws", options=opts)
    after = [d for region in by_region for r in boto3.client("ec2", region_name=region, endpoint_url=aws_env).describe_instances(
        Filters=[{"Name": "tag:fleetops.io/fleet", "Values": [fleet]}])["Reservations"] for d in r["Instances"]]
    assert sorted(d["InstanceId"] for d in after) == sorted(first.report.created.values())  # nothing launched
    assert {d["State"]["Name"] for d in after} == {"stopped"}


def test_cli_against_moto(aws_env, tmp_path):
    cfg = _config(tmp_path)
    runner = CliRunner()
    args = ["--provider", "aws", "-o", f"endpoint_url={aws_env}"]
    plan = runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode", *args])
    assert plan.exit_code == 2, plan.output
    applied = runner.invoke(app, ["apply", str(cfg), "--auto-approve", *args])
    assert applied.exit_code == 0, applied.output
    again = runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode", *args])
    assert again.exit_code == 0, again.output
    for out in (plan.output, applied.output, again.output):
        assert AWS_ENV["AWS_SECRET_ACCESS_KEY"] not in out


# -- EC2's eventual consistency (issue 22, item 4) -------------------------------------------------
@pytest.fixture
def proxy(aws_env):
    from tests.ec2_proxy import Ec2Proxy

    p = Ec2Proxy(aws_env).start()
    yield p
    p.stop()


def test_a_just_launched_instance_that_ec2_does_not_show_yet_is_still_terminated(proxy, tmp_path, fleet, ec2):
    """Right after RunInstances, DescribeInstances may answer InvalidInstanceID.NotFound (eventual consistency).
    Reading that as "already gone" skipped the terminate and left the instance running, unseen by the report."""
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))
    proxy.lag(3)
    inst = prov.create(req(fleet, "k-young"))
    prov.delete(inst)
    state = ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    assert proxy.calls.count("DescribeInstances") >= 4  # three "not found" answers, retried


def _own_fleet(tmp_path: Path, fleet: str) -> Path:
    """examples/aws-only as a fleet of its own (moto's state is shared by the session's tests)."""
    cfg = _config(tmp_path)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}"))
    return cfg


@pytest.mark.slow  # an apply and a plan of examples/aws-only through the proxy (about 6 s)
def test_instances_still_booting_are_the_fleet_s_not_launched_again(proxy, tmp_path, fleet):
    """EC2 reports a new instance pending for its first tens of seconds ("pending", then "running": Amazon EC2 instance
    state changes, EC2 User Guide); moto reports it running at once, so no AWS test met a fleet still booting. A plan
    right after an apply sees every instance pending, and has nothing to launch or replace."""
    cfg = _own_fleet(tmp_path, fleet)
    opts = {"endpoint_url": proxy.url}
    proxy.boot(600)
    first = api.apply(cfg, provider="aws", options=opts)
    assert first.report.ok and len(first.report.created) == 4
    res = api.plan(cfg, provider="aws", options=opts)
    assert sorted((i.id, i.state) for i in res.observed.instances) == sorted((i, "pending") for i in first.report.created.values())
    assert not res.plan.has_changes and not res.plan.deletes


def test_a_throttled_create_is_tried_max_attempts_times_in_all(proxy, tmp_path, fleet):
    """Audit (apply under cloud failures, item 3): botocore's adaptive retries (9 tries) ran inside apply's own 4, so
    under RequestLimitExceeded each create made 36 RunInstances (144 and 262 s for 4 creates). Now botocore's standard
    mode owns a call's retries (max_attempts tries, explicit) and apply's retry (the one each create runs in) does not
    retry what it gave up on. Counted at the EC2 proxy, throttling every RunInstances."""
    from reconciler.apply import _retry
    from reconciler.errors import TransientProviderError

    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url,
                                                                                 "max_attempts": "2"}))
    proxy.fail("RunInstances", "RequestLimitExceeded", "Request limit exceeded.", count=10**6)
    with pytest.raises(TransientProviderError) as e:
        _retry(lambda: prov.create(req(fleet, "k-throttled")), "create", 0.0)
    assert proxy.calls.count("RunInstances") == 2 and e.value.retried
    assert re.search(r"RequestLimitExceeded: Request limit exceeded\. \(after 2 tries\)$", str(e.value)), str(e.value)
    proxy.failures.clear()
    proxy.fail("RunInstances", "RequestLimitExceeded", "Request limit exceeded.", count=1)  # a burst botocore rides out
    assert _retry(lambda: prov.create(req(fleet, "k-throttled")), "create", 0.0).state in ("pending", "running")
    assert proxy.calls.count("RunInstances") == 2 + 2


@pytest.mark.slow  # two applies of examples/aws-only (about 10 s)
def test_throttled_creates_are_retried_by_botocore_alone_a_bounded_number_of_times(proxy, tmp_path, fleet):
    """The audit's apply: every create throttled; the calls counted at the EC2 proxy are max_attempts per create."""
    cfg = _own_fleet(tmp_path, fleet)
    opts = {"endpoint_url": proxy.url, "max_attempts": "2"}  # (2: one botocore pause of up to 1 s; the default is 5)
    proxy.fail("RunInstances", "RequestLimitExceeded", "Request limit exceeded.", count=10**6)
    with pytest.raises(ApplyError, match=r"RequestLimitExceeded: Request limit exceeded\. \(after 2 tries\)") as e:
        api.apply(cfg, provider="aws", options=opts)
    creates = len(e.value.result.plan.creates)
    assert creates == 4 and e.value.result.report.created == {}
    assert proxy.calls.count("RunInstances") == 2 * creates  # one retry policy: max_attempts per create, no more

    # A short burst is ridden out by that one layer: one refusal, one more call, every create lands once.
    proxy.failures.clear()
    proxy.calls.clear()
    proxy.fail("RunInstances", "RequestLimitExceeded", "Request limit exceeded.", count=1)
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok and len(res.report.created) == creates and proxy.calls.count("RunInstances") == creates + 1


def test_a_delete_whose_ownership_read_is_throttled_says_so_and_is_not_retried_again(proxy, tmp_path, fleet):
    """delete (and record_placements) read the instance first (its fleet tag) with a DescribeInstances of their own:
    a throttled one, after botocore's tries, was a plain ProviderError naming only the code ("aws: describe i-...:
    RequestLimitExceeded"), unlike every other EC2 call's, which says it is transient and how often it was tried."""
    from reconciler.errors import TransientProviderError

    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url,
                                                                                 "max_attempts": "2"}))
    inst = prov.create(req(fleet, "k-read-throttled"))
    proxy.fail("DescribeInstances", "RequestLimitExceeded", "Request limit exceeded.", count=10**6)
    with pytest.raises(TransientProviderError) as e:
        prov.delete(inst)
    assert e.value.retried and str(e.value).endswith("RequestLimitExceeded: Request limit exceeded. (after 2 tries)"), str(e.value)
    assert proxy.calls.count("TerminateInstances") == 0


def test_the_ec2_client_retries_in_standard_mode_with_an_explicit_bound(tmp_path, aws_env, fleet):
    """botocore's retry settings are explicit, not its defaults or adaptive mode's client-side rate limiter: standard
    mode, max_attempts tries in all (the first included), 5 unless -o max_attempts=N."""
    def retries(**options: str) -> dict:
        prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": aws_env, **options}))
        return prov.ec2("us-east-1").meta.config.retries

    assert retries() == {"mode": "standard", "total_max_attempts": 5}
    assert retries(max_attempts="3") == {"mode": "standard", "total_max_attempts": 3}
    with pytest.raises(ProviderError, match="max_attempts"):
        retries(max_attempts="0")


def test_an_instance_ec2_never_shows_is_a_transient_error_not_a_delete(proxy, tmp_path, fleet, ec2):
    from reconciler.errors import TransientProviderError

    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url,
                                                                                 "consistency_timeout": "1"}))
    proxy.lag(1000)
    inst = prov.create(req(fleet, "k-unseen"))
    with pytest.raises(TransientProviderError, match="does not show it yet"):
        prov.delete(inst)
    assert ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"


def test_a_plan_before_ec2_lists_the_last_applys_instances_buys_nothing_twice(aws_env, tmp_path, fleet, ec2_tokens):
    """Right after an apply (`apply && plan --detailed-exitcode`, a controller's next poll), EC2's tag-filtered
    DescribeInstances may not list the instances it just launched yet. observe read them as gone: the plan placed their
    running jobs again on 3 new instances (no note said why), and its apply bought them, the originals left idle to be
    deleted later with their work. The instances the state places work on are asked for by id first."""
    cfg = _config(tmp_path)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}"))
    opts = {"endpoint_url": aws_env}
    first = api.apply(cfg, provider="aws", options=opts)
    assert first.report.ok and len(first.report.created) == 4
    ec2_tokens.lag_tag(TAG_FLEET, fleet, reads=2)  # both regions' next listings miss them
    res = api.plan(cfg, provider="aws", options=opts)
    assert not res.plan.has_changes and {i.id for i in res.observed.instances} == set(first.report.created.values())
    assert any("listing yet but exists (found by its id" in n for n in res.plan.notes), res.plan.notes
    ec2_tokens.lag_tag(TAG_FLEET, fleet, reads=2)
    again = api.apply(cfg, provider="aws", options=opts)
    assert again.report.ok and not again.report.created and not again.report.deleted
    mine = [d for region in ("us-east-1", "us-west-2") for r in boto3.client("ec2", region_name=region, endpoint_url=aws_env)
            .describe_instances(Filters=[{"Name": f"tag:{TAG_FLEET}", "Values": [fleet]}])["Reservations"] for d in r["Instances"]]
    assert sorted(d["InstanceId"] for d in mine) == sorted(first.report.created.values())


def test_a_stockout_is_a_capacity_error_at_once_not_retried_as_a_server_error(proxy, tmp_path, fleet):
    """EC2 answers InsufficientInstanceCapacity with HTTP 500 (a server error code, "Error codes for the Amazon EC2
    API"), and botocore's standard mode retries every 500: each stocked-out create was sent max_attempts times, with up
    to 15 s of backoff, before apply could mark the zone short and go elsewhere (a burst of them spending RunInstances'
    request budget). The proxy answered 400, so no test saw it; now it answers EC2's status, and one refusal is final."""
    from botocore.config import Config

    raw = boto3.client("ec2", region_name="us-east-1", endpoint_url=proxy.url,
                       config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    proxy.fail("DescribeRegions", "InsufficientInstanceCapacity", "x")
    with pytest.raises(ClientError) as e:
        raw.describe_regions()
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500  # as EC2 answers it

    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))
    proxy.fail("RunInstances", "InsufficientInstanceCapacity", "We currently do not have sufficient g5.xlarge capacity in "
                                                               "the Availability Zone you requested (us-east-1a).")
    with pytest.raises(CapacityError) as e:
        prov.create(req(fleet, "k-stockout"))
    assert (e.value.zone, e.value.instance_type) == ("us-east-1a", "g5.xlarge")
    assert proxy.calls.count("RunInstances") == 1  # (a retry would have launched: the refusal was for one call)


# -- quotas (issue 22, item 2) ----------------------------------------------------------------------
@pytest.mark.parametrize("code, market, itype, quota", [
    ("VcpuLimitExceeded", "on-demand", "g5.xlarge", "L-DB2E81BA"),
    ("VcpuLimitExceeded", "on-demand", "p5.48xlarge", "L-417A185B"),
    ("MaxSpotInstanceCountExceeded", "spot", "g5.xlarge", "L-3819A6DF"),
    ("InstanceLimitExceeded", "on-demand", "m5.large", "L-1216C47A"),
])
def test_an_account_limit_is_a_quota_error_naming_the_service_quota(proxy, tmp_path, fleet, code, market, itype, quota):
    from reconciler.errors import QuotaError

    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))
    proxy.fail("RunInstances", code, "You have requested more vCPU capacity than your current vCPU limit of 0 allows "
                                     "for the instance bucket that the specified instance type belongs to.")
    with pytest.raises(QuotaError) as e:
        prov.create(req(fleet, "k-quota", market=market, itype=itype))
    assert quota in e.value.quota and e.value.region == "us-east-1" and not isinstance(e.value, CapacityError)
    assert f"servicequotas/home/services/ec2/quotas/{quota}" in str(e.value) and "--quota-code" in str(e.value)


# -- live spot prices (issue 22, item 1) --------------------------------------------------------------
def test_the_current_spot_price_is_the_last_change_even_weeks_old(proxy, tmp_path, fleet):
    """EC2 answers a StartTime with the last price change before it: a price set 30 days ago and unchanged since is
    today's price, not stale history (it was dropped for being older than 7 days, and the catalog's used)."""
    from datetime import datetime, timedelta, timezone

    def ago(days: float) -> str:
        return (datetime.now(timezone.utc) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    proxy.spot_history = [
        ("g5.xlarge", "us-east-1a", "Linux/UNIX", 0.5123, ago(60)),
        ("g5.xlarge", "us-east-1a", "Linux/UNIX", 0.4321, ago(30)),   # the effective price now
        ("g5.xlarge", "us-east-1b", "Linux/UNIX", 0.3999, ago(0.5)),
        ("g5.xlarge", "us-east-1b", "Windows", 0.9, ago(0.1)),         # another product: never ours
    ]
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))
    offs = {(o.zone, o.instance_type): o for o in prov.offerings([target()])}
    assert offs[("us-east-1a", "g5.xlarge")].spot_price == pytest.approx(0.4321)
    assert offs[("us-east-1b", "g5.xlarge")].spot_price == pytest.approx(0.3999)
    # The plan says which price is live and when it was read; on-demand stays the dated catalog's.
    assert re.fullmatch(r"catalog: skypilot-v8 \(2026-11-23\); spot: live EC2 DescribeSpotPriceHistory, read \d{4}-\d\d-\d\dT\d\d:\d\dZ",
                        offs[("us-east-1a", "g5.xlarge")].price_source)
    # Cached with a TTL (spot_price_ttl, an hour by default): a price change inside it is seen by the next read after.
    proxy.spot_history.append(("g5.xlarge", "us-east-1a", "Linux/UNIX", 0.3333, ago(0.01)))
    again = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))
    assert {(o.zone, o.instance_type): o for o in again.offerings([target()])}[("us-east-1a", "g5.xlarge")].spot_price == pytest.approx(0.4321)
    fresh = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url, "spot_price_ttl": "0"}))
    assert {(o.zone, o.instance_type): o for o in fresh.offerings([target()])}[("us-east-1a", "g5.xlarge")].spot_price == pytest.approx(0.3333)


def test_the_spot_prices_of_more_types_than_one_call_takes_are_all_read_page_by_page(proxy):
    """DescribeSpotPriceHistory's instance types and products are filter values, at most 200 a call with its filters
    (FilterLimitExceeded past them), and it answers at most MaxResults (1000 by default) rows a page, the rest behind
    a NextToken. Every type of a Region went into one call: a Region's pools listing more than 198 types failed
    every plan's spot read (and `reconcile catalog update`'s). 400 types in 6 zones: 2400 prices, several calls of
    several pages each."""
    from datetime import datetime, timedelta, timezone

    from providers.aws import latest_spot_prices

    now = datetime.now(timezone.utc)
    at = (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    types = [f"zz{n}.large" for n in range(400)]
    zones = [f"us-east-1{z}" for z in "abcdef"]
    proxy.spot_history = [(t, z, "Linux/UNIX", n / 1000 + k / 10, at) for n, t in enumerate(types) for k, z in enumerate(zones)]
    raw = boto3.client("ec2", region_name="us-east-1", endpoint_url=proxy.url)
    with pytest.raises(ClientError, match="FilterLimitExceeded"):
        raw.describe_spot_price_history(InstanceTypes=types[:199], ProductDescriptions=["Linux/UNIX", "Windows"])
    prices = latest_spot_prices(raw, types, now)
    assert prices == {(t, z): pytest.approx(n / 1000 + k / 10) for n, t in enumerate(types) for k, z in enumerate(zones)}
    assert proxy.calls.count("DescribeSpotPriceHistory") > 2 + 3  # the refused call; then pages, more than one a chunk


# -- images (issue 22, item 6) -------------------------------------------------------------------------
def test_gpu_types_boot_the_deep_learning_ami_and_a_missing_image_is_a_plan_time_error(proxy, tmp_path, fleet, ec2):
    """A GPU pool without aws.ami or aws.launch_template boots the Deep Learning Base AMI, read from its public SSM
    parameter (the proxy publishes it: moto has none), so it has the NVIDIA driver. An AMI that does not exist
    (mistyped, deregistered, another region's) is refused while offerings are read, naming the pool; and EC2 (the
    proxy, where moto launches anything) refuses to launch it."""
    from providers.aws import DEFAULT_GPU_AMI, SSM_PREFIX

    proxy.public_parameters[DEFAULT_GPU_AMI[len(SSM_PREFIX):]] = AMI
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))

    def pool(name, types=("g5.xlarge",), **settings):
        return PoolTarget(name=name, cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=types,
                          settings={"security_groups": [], "subnets": {}, **settings})

    def launch(key, p, itype="g5.xlarge"):
        return prov.create(CreateRequest(key=key, pool=p, zone="us-east-1a", instance_type=itype, market="on-demand",
                                         max_price=None, tags=ownership_tags(fleet, p.name, key)))

    default = pool("gpu-default")
    assert prov.offerings([default])  # the default's parameter resolves to an AMI that exists
    inst = launch("k-dlami", default)
    assert ec2.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]["ImageId"] == AMI
    with pytest.raises(ProviderError, match="needs aws.ami or aws.launch_template"):  # CPU types have no default
        launch("k-cpu", pool("cpu", types=("m6i.4xlarge",)), itype="m6i.4xlarge")
    missing = pool("gpu-custom", ami="ami-0123456789abcdef0")
    with pytest.raises(ProviderError, match="aws: pool gpu-custom: image ami-0123456789abcdef0 does not exist in us-east-1"):
        prov.offerings([missing])
    with pytest.raises(ProviderError, match="InvalidAMIID.NotFound"):
        launch("k-missing", missing)
    with pytest.raises(ProviderError, match="aws: pool gpu-ssm: .*ParameterNotFound"):
        prov.offerings([pool("gpu-ssm", ami="resolve:ssm:/fleetops/no-such-ami")])
    boto3.client("ssm", region_name="us-east-1", endpoint_url=proxy.url).put_parameter(
        Name="/fleetops/gpu-ami", Value=AMI, Type="String")
    mine = pool("gpu-ssm", ami="resolve:ssm:/fleetops/gpu-ami")
    assert prov.offerings([mine]) and launch("k-ssm", mine).state in ("pending", "running")


# -- capacity reservations (issue 17) ------------------------------------------------------------------
CR = "cr-0123456789abcdef0"


def test_a_launch_into_a_capacity_reservation_names_its_id(proxy, tmp_path, fleet):
    """RunInstances carries CapacityReservationSpecification.CapacityReservationTarget with the reservation's id
    (moto accepts and drops it: the proxy checks the body and holds EC2's rules: matching type and zone, on-demand,
    room left). A full reservation is a capacity error, so the zone is marked short like any other."""
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": proxy.url}))
    proxy.reserve(CR, "g5.xlarge", "us-east-1a", 1)
    inst = prov.create(replace(req(fleet, "k-cr"), capacity_reservation=CR))
    sent = proxy.run_requests[-1]
    assert sent["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == CR
    assert "CapacityReservationSpecification.CapacityReservationPreference" not in sent  # only with capacity-reservations-only
    assert inst.id in proxy.reservations[CR]["members"]
    plain = prov.create(req(fleet, "k-plain"))
    assert not any(k.startswith("CapacityReservation") for k in proxy.run_requests[-1]) and plain.id not in proxy.reservations[CR]["members"]
    with pytest.raises(CapacityError):
        prov.create(replace(req(fleet, "k-full"), capacity_reservation=CR))
    with pytest.raises(Exception, match="InvalidParameterCombination"):
        prov.create(replace(req(fleet, "k-zone", zone="us-east-1b"), capacity_reservation=CR))


def test_apply_launches_reserved_capacity_into_its_reservation_against_moto(proxy, tmp_path, fleet):
    """examples/aws-only with a reservation of two g4dn.xlarge in us-west-2a: the on-demand T4 job goes there at no
    marginal cost, launched with the reservation's id and tagged with its name; the next plan changes nothing and
    reports one of two reserved instances used."""
    cfg, _, opts = _reserved_config(proxy, tmp_path, fleet, 2)
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok
    reserved = [c for c in res.plan.creates if c.reservation == "t4-2026"]
    assert len(reserved) == 1 and reserved[0].price == 0.0
    targeted = [r for r in proxy.run_requests if r.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")]
    assert len(targeted) == 1 and (targeted[0]["InstanceType"], targeted[0]["Placement.AvailabilityZone"]) == ("g4dn.xlarge", "us-west-2a")
    iid = res.report.created[reserved[0].ref]
    assert proxy.reservations[CR]["members"] == {iid}
    w2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=proxy.url)
    tags = {t["Key"]: t["Value"] for t in w2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["Tags"]}
    assert tags["fleetops.io/reservation"] == "t4-2026"
    again = api.plan(cfg, provider="aws", options=opts).plan
    assert not again.has_changes and again.rules["reservations"]["t4-2026"]["used"] == 1


def _reserved_config(proxy, tmp_path: Path, fleet: str, count: int) -> tuple[Path, str, dict]:
    """examples/aws-only as a fleet of its own (moto's state is shared by the session's tests), with a targeted
    reservation of `count` g4dn.xlarge in us-west-2a, held by the proxy as EC2 holds it. Returns (config, fleet.yaml's
    text, options)."""
    cfg = _config(tmp_path)
    text = (cfg / "fleet.yaml").read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {fleet}}}")
    assert fleet in text
    (cfg / "fleet.yaml").write_text(text)
    res_doc = {"apiVersion": "fleetops.io/v1alpha1", "kind": "Reservation", "metadata": {"name": "t4-2026"},
               "spec": {"cloud": "aws", "region": "us-west-2", "zone": "us-west-2a", "instance_type": "g4dn.xlarge", "count": count,
                        "hourly_cost": 0.33, "target": {"reservation_id": CR}}}
    (cfg / "reservation.yaml").write_text(json.dumps(res_doc))
    proxy.reserve(CR, "g4dn.xlarge", "us-west-2a", count)
    return cfg, text, {"endpoint_url": proxy.url}


def _reserved_canary(proxy, tmp_path: Path, fleet: str) -> tuple[Path, str, dict, str]:
    """_reserved_config with a reservation of one, applied: inference-canary runs on the instance that holds it.
    Returns (config, fleet.yaml's text, options, that instance's id)."""
    cfg, text, opts = _reserved_config(proxy, tmp_path, fleet, 1)
    first = api.apply(cfg, provider="aws", options=opts)
    assert first.report.ok
    old = first.report.placements["inference-canary"][0]
    assert proxy.reservations[CR]["members"] == {old}
    return cfg, text, opts, old


def test_a_reserved_instance_the_plan_replaces_gives_its_reservation_to_the_replacement_against_moto(proxy, tmp_path, fleet):
    """A reservation of one g4dn.xlarge, held by the instance inference-canary runs on. Its pool is renamed, so the
    plan deletes that instance and launches the canary's new one into the reservation (price 0). EC2 takes no launch
    into a full targeted reservation (ReservationCapacityExceeded): apply created first, the create failed, the zone
    was marked short and the canary stayed on an instance of no pool. A create into a full reservation now waits for
    the plan's delete of one of its instances (fleet66)."""
    cfg, text, opts, old = _reserved_canary(proxy, tmp_path, fleet)
    (cfg / "fleet.yaml").write_text(text.replace("metadata: {name: t4-west}", "metadata: {name: t4-pool}"))
    plan = api.plan(cfg, provider="aws", options=opts).plan
    assert [d.instance_id for d in plan.deletes] == [old]
    (new,) = [c for c in plan.creates if c.reservation == "t4-2026"]
    assert new.price == 0.0 and new.site.pool == "t4-pool"
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok, res.report.failures
    iid = res.report.created[new.ref]
    assert res.report.deleted == [old] and res.report.placements["inference-canary"] == [iid]
    assert iid in proxy.reservations[CR]["members"]
    w2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=proxy.url)
    state = w2.describe_instances(InstanceIds=[old])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    again = api.plan(cfg, provider="aws", options=opts).plan
    assert not again.has_changes and again.rules["reservations"]["t4-2026"]["used"] == 1


def test_a_create_waiting_for_its_reservation_is_not_launched_when_the_delete_fails_against_moto(proxy, tmp_path, fleet):
    """The same replacement, but EC2 refuses to terminate the reservation's instance (OperationNotPermitted:
    termination protection). Nothing is launched past the reservation's count: the waiting create is reported not
    started, the canary keeps running where it ran, and once the delete goes through the next apply converges."""
    cfg, text, opts, old = _reserved_canary(proxy, tmp_path, fleet)
    (cfg / "fleet.yaml").write_text(text.replace("metadata: {name: t4-west}", "metadata: {name: t4-pool}"))
    launches = len(proxy.run_requests)
    proxy.fail("TerminateInstances", "OperationNotPermitted",
               f"The instance '{old}' may not be terminated. Modify its 'disableApiTermination' instance attribute and try again.")
    with pytest.raises(ApplyError) as err:
        api.apply(cfg, provider="aws", options=opts)
    assert "reservation t4-2026 is still full" in str(err.value) and "ReservationCapacityExceeded" not in str(err.value)
    assert len(proxy.run_requests) == launches and proxy.reservations[CR]["members"] == {old}
    assert load_state(cfg).placements["inference-canary"] == [old]
    assert not load_state(cfg).short_now()  # (no capacity error: the zone is not marked short)
    res = api.apply(cfg, provider="aws", options=opts)
    assert res.report.ok and res.report.deleted == [old]
    assert proxy.reservations[CR]["members"] - {old} == set(res.report.placements["inference-canary"])


def test_a_mig_layout_is_tagged_at_launch_read_back_and_a_changed_one_replaces_the_instance(aws_env, tmp_path, ec2, fleet):
    from tests.test_mig_drift import check_mig_drift_on, cloud_mig_config

    cfg = _config(tmp_path)

    def raw(i) -> str:
        found = ec2.describe_instances(InstanceIds=[i.id])["Reservations"][0]["Instances"][0]
        return {t["Key"]: t["Value"] for t in found["Tags"]}["fleetops.io/mig"]

    check_mig_drift_on(cfg, "aws", {"endpoint_url": aws_env},  # p4d.24xlarge: eight A100 (40 GB)
                       lambda layout, profile: cloud_mig_config(cfg, "a100", "p4d.24xlarge", "A100", layout, profile, like="a10g",
                                                                        fleet=fleet),
                       ["3g.20gb", "3g.20gb"], ["2g.10gb", "2g.10gb", "2g.10gb"], ("3g.20gb", "2g.10gb"), raw, lambda v: v)


def test_an_nvlink_job_is_placed_on_an_aws_type_whose_gpus_share_one_nvlink_domain(aws_env, tmp_path):
    """A p4d.24xlarge's eight A100s share one NVSwitch domain (the catalog's nvlink_domain 8), and GCP's and Azure's
    offerings say so. The AWS provider built its offerings anew from the catalog's fields and left nvlink_domain at
    its default of 1: an 8-GPU tensor-parallel job (resources.nvlink) found no AWS type for it and stayed pending."""
    from tests.fleetkit import job, pool, tenant, topology, write_config

    p = pool("p4d", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=2)
    p["spec"]["aws"] = {"ami": AMI}
    tp = job("tp-train", gpus=8, gpu_type="A100", cpu=90, mem=1000)
    tp["spec"]["resources"]["nvlink"] = True
    cfg = write_config(tmp_path / "cfg", [topology(name=f"nvl-{uuid.uuid4().hex[:6]}", clouds={"aws": {"us-east-1": ["us-east-1a"]}}),
                                          tenant("t"), p, tp])
    res = api.plan(cfg, provider="aws", options={"endpoint_url": aws_env})
    assert [(c.instance_type, c.zone) for c in res.plan.creates] == [("p4d.24xlarge", "us-east-1a")], \
        [j.reason for j in res.plan.jobs if j.action == "pending"]
