"""The AWS provider under the README's minimal IAM policy with one action taken away, against a moto server that
enforces IAM (tests/ec2_iam.py): a plan needs only the reads (PR CI plans with read-only credentials), and an apply
that could not tag or terminate what it launches is refused before anything is launched, naming the action."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from reconciler import api
from reconciler.cli import app
from reconciler.errors import ReconcileError
from tests.ec2_iam import allow, readme_policy_actions
from tests.fleetkit import copy_example

ROOT = Path(__file__).resolve().parent.parent
POLICY = readme_policy_actions()
READS = {a for a in POLICY if a.split(":", 1)[1].startswith(("Describe", "Get"))}
REGIONS = ("us-east-1", "us-west-2")


@pytest.fixture(scope="module")
def iam_moto():
    """A moto server of its own that enforces IAM, for this module (tests/ec2_iam.py)."""
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.ec2_iam"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        yield info
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _admin(iam_moto, service: str, region: str = "us-east-1"):
    key, secret = iam_moto["admin"]
    return boto3.client(service, endpoint_url=iam_moto["url"], region_name=region, aws_access_key_id=key,
                        aws_secret_access_key=secret)


@pytest.fixture
def as_user(iam_moto, monkeypatch):
    """as_user(actions): the AWS credentials in the environment become a new IAM user's, allowed `actions`."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    iam = _admin(iam_moto, "iam")

    def use(actions: set[str]) -> tuple[str, str]:
        name = f"u-{uuid.uuid4().hex[:10]}"
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="fleetops", PolicyDocument=allow(actions))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        return key["AccessKeyId"], key["SecretAccessKey"]
    return use


@pytest.fixture
def fleet_cfg(tmp_path):
    """examples/aws-only under a fleet name of its own (the module's server is shared)."""
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    cfg = copy_example(tmp_path, "aws-only")
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("metadata: {name: aws-fleet}", f"metadata: {{name: {name}}}"))
    return cfg, name


def _instances(iam_moto, fleet: str | None = None) -> dict[str, str]:
    """{instance id: state} in the example's regions (the fleet's, or every instance), as the admin sees them."""
    out = {}
    for region in REGIONS:
        kw = {"Filters": [{"Name": "tag:fleetops.io/fleet", "Values": [fleet]}]} if fleet else {}
        for r in _admin(iam_moto, "ec2", region).describe_instances(**kw)["Reservations"]:
            out.update({d["InstanceId"]: d["State"]["Name"] for d in r["Instances"]})
    return out


def test_a_plan_with_read_only_credentials_is_the_plan_the_whole_policy_makes(iam_moto, as_user, fleet_cfg):
    """PR CI plans with read-only credentials: a plan sends no write (nor a dry run of one), and says what the whole
    policy's plan says, before an apply and after it."""
    cfg, name = fleet_cfg
    opts = {"endpoint_url": iam_moto["url"]}
    as_user(READS)
    before = api.plan(cfg, provider="aws", options=opts).plan
    as_user(POLICY)
    whole = api.plan(cfg, provider="aws", options=opts).plan
    assert [(c.site, c.key) for c in before.creates] == [(c.site, c.key) for c in whole.creates] and len(whole.creates) == 4
    assert before.notes == whole.notes
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    key, secret = as_user(READS)
    result = CliRunner().invoke(app, ["plan", str(cfg), "--detailed-exitcode", "--provider", "aws", "-o",
                                      f"endpoint_url={iam_moto['url']}"])
    assert result.exit_code == 0, result.output
    assert key not in result.output and secret not in result.output


@pytest.mark.parametrize("missing", ["ec2:RunInstances", "ec2:CreateTags"])
def test_an_apply_that_may_not_launch_or_tag_is_refused_before_any_launch(iam_moto, as_user, fleet_cfg, missing):
    """RunInstances with TagSpecifications needs ec2:CreateTags too (EC2 refuses the launch without it): either one
    missing, the apply is refused before anything is created, naming the action, and never shows the credentials."""
    cfg, name = fleet_cfg
    opts = {"endpoint_url": iam_moto["url"]}
    everything = set(_instances(iam_moto))
    key, secret = as_user(POLICY - {missing})
    with pytest.raises(ReconcileError) as e:
        api.apply(cfg, provider="aws", options=opts)
    text = str(e.value)
    assert missing in text and "nothing was changed" in text, text
    assert key not in text and secret not in text
    assert set(_instances(iam_moto)) == everything  # nothing launched, ours or untagged
    assert not (cfg / ".reconcile" / "state.json").exists() or not json.loads(
        (cfg / ".reconcile" / "state.json").read_text()).get("instances")


def test_an_apply_that_may_not_terminate_what_it_replaces_launches_nothing(iam_moto, as_user, fleet_cfg):
    """Make before break: a plan that replaces instances launches the new ones, then deletes the old. Without
    ec2:TerminateInstances the deletes failed after the launches: old and new both ran (and billed). Refused before
    the first launch, naming the action; the next plan still sees the old instances and plans the same."""
    cfg, name = fleet_cfg
    opts = {"endpoint_url": iam_moto["url"]}
    as_user(POLICY)
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    ours = _instances(iam_moto, name)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("instance_types: [g4dn.xlarge]", "instance_types: [g4dn.2xlarge]"))
    replacing = api.plan(cfg, provider="aws", options=opts).plan
    assert replacing.creates and replacing.deletes
    as_user(POLICY - {"ec2:TerminateInstances"})
    with pytest.raises(ReconcileError) as e:
        api.apply(cfg, provider="aws", options=opts)
    assert "ec2:TerminateInstances" in str(e.value) and "nothing was changed" in str(e.value), str(e.value)
    assert _instances(iam_moto, name) == ours
    as_user(READS)
    again = api.plan(cfg, provider="aws", options=opts).plan
    assert [c.key for c in again.creates] == [c.key for c in replacing.creates]
    assert [d.instance_id for d in again.deletes] == [d.instance_id for d in replacing.deletes]


@pytest.mark.parametrize("missing", ["ec2:DescribeInstances", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeImages",
                                     "ec2:DescribeSpotPriceHistory", "servicequotas:GetServiceQuota"])
def test_a_plan_missing_a_read_says_which_action_and_shows_no_credentials(iam_moto, as_user, fleet_cfg, missing):
    """A read the plan needs and may not make: the plan stops with an error naming the action (or, for the quotas, plans
    as without them and says so, naming it); nothing is launched, and the credentials are never shown."""
    cfg, name = fleet_cfg
    key, secret = as_user(READS - {missing})
    result = CliRunner().invoke(app, ["plan", str(cfg), "--provider", "aws", "-o", f"endpoint_url={iam_moto['url']}"])
    print(result.output)
    assert missing in result.output, result.output
    assert key not in result.output and secret not in result.output
    assert not _instances(iam_moto, name)


def test_a_scale_up_without_terminate_is_refused_where_the_fleet_has_an_instance_to_dry_run_it_on(iam_moto, as_user,
                                                                                                   fleet_cfg):
    """An apply that only launches still needs ec2:TerminateInstances: a gang whose last create fails is rolled back,
    and the next plans delete what this one launches. Dry-run on one of the fleet's instances in the region."""
    cfg, name = fleet_cfg
    opts = {"endpoint_url": iam_moto["url"]}
    as_user(POLICY)
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    ours = _instances(iam_moto, name)
    (cfg / "jobs" / "more.yaml").write_text(
        "apiVersion: fleetops.io/v1alpha1\nkind: Job\nmetadata: {name: inference-two}\nspec:\n  tenant: product\n"
        "  priority: critical\n  resources: {gpus: 1, gpu_type: T4, cpu: 4, memory_gib: 16}\n  spot: never\n")
    growing = api.plan(cfg, provider="aws", options=opts).plan
    assert growing.creates and not growing.deletes
    as_user(POLICY - {"ec2:TerminateInstances"})
    with pytest.raises(ReconcileError, match="(?s)refusing to apply; nothing was changed:.*ec2:TerminateInstances"):
        api.apply(cfg, provider="aws", options=opts)
    assert _instances(iam_moto, name) == ours


def test_a_launch_with_an_instance_profile_it_may_not_pass_is_refused_naming_iam_pass_role(iam_moto, as_user, fleet_cfg):
    """EC2's refusal of the launch names no action; the dry runs narrow it down to iam:PassRole."""
    cfg, name = fleet_cfg
    _admin(iam_moto, "iam").create_instance_profile(InstanceProfileName=f"{name}-node")
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("# iam_instance_profile: fleetops-node", f"iam_instance_profile: {name}-node"))
    as_user(POLICY - {"iam:PassRole"})
    with pytest.raises(ReconcileError) as e:
        api.apply(cfg, provider="aws", options={"endpoint_url": iam_moto["url"]})
    assert "may not iam:PassRole," in str(e.value) and "ec2:RunInstances" not in str(e.value), str(e.value)
    assert not _instances(iam_moto, name)


def test_a_delete_the_credentials_may_not_make_names_the_action_and_leaves_the_instance(iam_moto, as_user, tmp_path):
    """Past the apply's check (the policy changed under it, or a first apply in a region had no instance to dry-run a
    terminate on), the refused call itself names its action, not only EC2's encoded message."""
    from providers.aws import AwsProvider
    from providers.base import CreateRequest, PoolTarget, ProviderContext, ownership_tags
    from reconciler.errors import AccessDeniedError

    fleet = f"fleet-{uuid.uuid4().hex[:8]}"
    as_user(POLICY)
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": iam_moto["url"]}))
    pool = PoolTarget(name="a10g", cloud="aws", region="us-east-1", zones=("us-east-1a",), instance_types=("g5.xlarge",),
                      settings={"ami": "ami-03cf127a"})
    inst = prov.create(CreateRequest(key="k-1", pool=pool, zone="us-east-1a", instance_type="g5.xlarge", market="on-demand",
                                     max_price=None, tags=ownership_tags(fleet, "a10g", "k-1")))
    key, secret = as_user(POLICY - {"ec2:TerminateInstances"})
    prov = AwsProvider(ProviderContext(fleet=fleet, state_dir=tmp_path, options={"endpoint_url": iam_moto["url"]}))
    with pytest.raises(AccessDeniedError, match="may not ec2:TerminateInstances; allow it") as e:
        prov.delete(inst)
    assert e.value.actions == ("ec2:TerminateInstances",) and key not in str(e.value) and secret not in str(e.value)
    assert _instances(iam_moto, fleet) == {inst.id: "running"}


S3_READ = {"s3:GetObject", "s3:ListBucket"}


def test_the_s3_state_backend_plans_read_only_and_an_apply_that_cannot_write_its_state_launches_nothing(
        iam_moto, as_user, fleet_cfg, monkeypatch):
    """With the state in S3: a plan reads it (s3:GetObject, s3:ListBucket) and writes nothing; an apply whose
    credentials may not write the state (its lock, its serial, the state itself) stops before the first launch."""
    cfg, name = fleet_cfg
    bucket = f"state-{uuid.uuid4().hex[:8]}"
    _admin(iam_moto, "s3").create_bucket(Bucket=bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", iam_moto["url"])
    opts, state = {"endpoint_url": iam_moto["url"]}, f"s3://{bucket}/fleet"
    as_user(READS | S3_READ)
    assert len(api.plan(cfg, provider="aws", options=opts, state=state).plan.creates) == 4
    key, secret = as_user(POLICY | S3_READ)
    with pytest.raises(ReconcileError) as e:
        api.apply(cfg, provider="aws", options=opts, state=state)
    assert "may not s3:PutObject" in str(e.value) and key not in str(e.value) and secret not in str(e.value), str(e.value)
    assert not _instances(iam_moto, name)


def _gang_config(tmp_path: Path, name: str) -> Path:
    from tests.fleetkit import job, pool, tenant, topology, write_config

    p = pool("a100", "aws", "us-east-1", ["us-east-1a"], ["p4d.24xlarge"], hi=4)
    p["spec"]["provider"], p["spec"]["aws"] = "aws", {"ami": "ami-03cf127a"}
    return write_config(tmp_path / "cfg", [topology(name, clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t"), p,
                                           job("pretrain", gpus=8, gpu_type="A100", cpu=90, mem=1000, replicas=2,
                                               gang="placement-group")])


def test_a_gang_whose_placement_group_may_not_be_created_is_refused_before_any_launch(iam_moto, as_user, tmp_path):
    """A gang launches into a cluster placement group created on its first launch: without
    ec2:CreatePlacementGroup, the apply is refused before anything, naming it."""
    name = f"pg-{uuid.uuid4().hex[:6]}"
    cfg = _gang_config(tmp_path, name)
    as_user(POLICY - {"ec2:CreatePlacementGroup"})
    with pytest.raises(ReconcileError, match="(?s)refusing to apply; nothing was changed:.*may not ec2:CreatePlacementGroup"):
        api.apply(cfg, provider="aws", options={"endpoint_url": iam_moto["url"]}, time_limit=5)
    assert not _instances(iam_moto, name)


def test_an_answer_that_is_not_ec2s_xml_is_an_error_not_a_traceback(iam_moto, as_user, tmp_path):
    """moto has no placement groups and answers CreatePlacementGroup with an HTML 500 page (as a proxy in front of an
    endpoint may): botocore's ResponseParserError is no BotoCoreError, and it went up through apply as a traceback.
    It is a transient error naming the call; the gang is not launched without its group."""
    name = f"pg-{uuid.uuid4().hex[:6]}"
    cfg = _gang_config(tmp_path, name)
    as_user(POLICY)
    with pytest.raises(ReconcileError, match="create_placement_group .*the endpoint's answer could not be read"):
        api.apply(cfg, provider="aws", options={"endpoint_url": iam_moto["url"]}, time_limit=5)
    assert not _instances(iam_moto, name)


def _shards_config(path: Path, name: str, shards: int) -> Path:
    """One m6i.12xlarge hosting `shards` CPU jobs with long names: 24 of them span four placement tags, 2 one."""
    from tests.fleetkit import job, pool, tenant, topology, write_config

    p = pool("cpu", "aws", "us-east-1", ["us-east-1a"], ["m6i.12xlarge"], hi=1)
    p["spec"]["provider"], p["spec"]["aws"] = "aws", {"ami": "ami-03cf127a"}
    return write_config(path, [topology(name, clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t"), p,
                               *[job(f"shard-with-a-rather-long-job-name-{n:02d}", cpu=1, mem=1) for n in range(shards)]])


def _placement_tags(iam_moto, iid: str) -> dict[str, str]:
    d = _admin(iam_moto, "ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in d["Tags"] if t["Key"].startswith("fleetops.io/placements")}


@pytest.mark.parametrize("missing", ["ec2:CreateTags", "ec2:DeleteTags"])
def test_an_apply_that_only_retags_is_checked_and_a_shrinking_list_needs_delete_tags(iam_moto, as_user, tmp_path, missing):
    """A plan that only stops jobs launches and deletes nothing, but rewrites the placement tags of the instance they ran
    on, and a list that spanned several tags and now needs fewer deletes the chunks left over (DeleteTags). Neither was
    checked: without CreateTags the apply failed at the tag, without DeleteTags after rewriting the first chunks (the
    tags half-written, exit 1). Refused before any write, naming the action; the tags are as they were."""
    name = f"tags-{uuid.uuid4().hex[:6]}"
    cfg = _shards_config(tmp_path / "cfg", name, 24)
    opts = {"endpoint_url": iam_moto["url"]}
    as_user(POLICY)
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    (iid,) = _instances(iam_moto, name)
    before = _placement_tags(iam_moto, iid)
    assert "fleetops.io/placements-3" in before, before  # the list spans several tags
    _shards_config(tmp_path / "cfg", name, 2)
    shrinking = api.plan(cfg, provider="aws", options=opts).plan
    assert not shrinking.creates and not shrinking.deletes
    as_user(POLICY - {missing})
    with pytest.raises(ReconcileError, match=f"(?s)refusing to apply; nothing was changed:.*may not {missing}"):
        api.apply(cfg, provider="aws", options=opts)
    assert _placement_tags(iam_moto, iid) == before
    as_user(POLICY)  # with the whole policy it applies, and the list shrinks to one tag
    assert api.apply(cfg, provider="aws", options=opts).report.ok
    assert not {k for k in _placement_tags(iam_moto, iid) if k[len("fleetops.io/placements-"):].isdigit()}
