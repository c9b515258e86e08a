"""Issue 7: instances this fleet does not own survive every apply, on every provider.

For each provider (sim; AWS on a moto server; GCP and Azure on their local REST fakes, driven by the
real SDK clients), plant unmanaged instances and another fleet's, in the zones, types and pools the
config uses, then apply the config, delete every Job and apply, remove a Pool and apply. After each
step a client independent of the provider reads the planted instances back and they must be exactly
as planted; handed to the provider's delete, each is refused with OwnershipError. The same applies
delete this fleet's own instances next to them, so the test fails if ownership were not checked.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import boto3
import pytest
import yaml

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, Instance, ProviderContext
from providers.registry import load_provider
from providers.sim import SimCloud
from reconciler import api
from reconciler.errors import OwnershipError
from reconciler.load import load
from reconciler.observe import pool_target
from reconciler.state import state_dir
from tests.conftest import ARM_RESOURCE_GROUP, arm_options
from tests.fleetkit import copy_example, launched_later

OTHER = "other-fleet"
GCP_PROJECT = "fleet-test-project"
AMI = "ami-03cf127a"  # one of moto's built-in images


@dataclass
class Rig:
    """One provider with a config to apply and instances planted where that config works."""

    provider: str
    cfg: Path
    options: dict[str, str]
    removed_pool: str  # the Pool the last step deletes from the config
    planted: list[str]  # handles of the planted instances
    read: Callable[[str], dict]  # a planted instance as an independent client sees it (None: gone)
    impostor: Callable[[str], Instance]  # a planted instance, handed to delete as if it were ours
    ours: Callable[[], list[dict]]  # this fleet's live instances, read independently (each with a "pool")


def _use_fleet(cfg: Path) -> str:
    """Give the copied config a fleet name of its own (the moto server is shared by the session)."""
    fleet = f"own-{uuid.uuid4().hex[:8]}"
    _edit(cfg, lambda d: {**d, "metadata": {**d["metadata"], "name": fleet}} if d["kind"] == "Topology" else d)
    return fleet


def _edit(cfg: Path, change: Callable[[dict], dict | None]) -> None:
    """Rewrite every config document through `change` (None drops the document)."""
    for f in sorted(cfg.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        out = [n for n in (change(d) for d in docs) if n is not None]
        if out != docs:
            f.write_text(yaml.safe_dump_all(out, sort_keys=False))


def _pool_min(name: str, n: int) -> Callable[[dict], dict]:
    return lambda d: {**d, "spec": {**d["spec"], "min_instances": n}} if d["kind"] == "Pool" and d["metadata"]["name"] == name else d


def _drop_pool(name: str) -> Callable[[dict], dict | None]:
    return lambda d: None if d["kind"] == "Pool" and d["metadata"]["name"] == name else d


# ---------------------------------------------------------------- one rig per provider


def _sim(tmp_path: Path) -> Rig:
    cfg = copy_example(tmp_path, "quickstart")
    fleet = _use_fleet(cfg)
    cloud = SimCloud(state_dir(cfg))
    planted = [
        cloud.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge", tags={"owner": "someone"}),
        cloud.plant("aws", "us-east-1", "us-east-1a", "m6i.4xlarge",
                    tags={TAG_FLEET: OTHER, TAG_POOL: "aws-cpu", TAG_CREATE_KEY: "k-other-1"}),
        cloud.plant("gcp", "us-central1", "us-central1-a", "g2-standard-4",
                    tags={TAG_FLEET: OTHER, TAG_POOL: "gcp-l4-spot"}, market="spot"),
        cloud.plant("azure", "eastus", "eastus-1", "Standard_NC4as_T4_v3", tags={TAG_FLEET: fleet.upper()}),
    ]

    def read(iid: str) -> dict:
        return next((d for d in SimCloud(state_dir(cfg)).instances() if d["id"] == iid), None)

    def impostor(iid: str) -> Instance:
        d = read(iid)
        return Instance(id=iid, provider="sim", cloud=d["cloud"], region=d["region"], zone=d["zone"],
                        instance_type=d["instance_type"], market=d["market"], state="running", pool="aws-cpu",
                        tags={TAG_FLEET: fleet})

    def ours() -> list[dict]:
        return [{**d, "pool": d["tags"][TAG_POOL]} for d in SimCloud(state_dir(cfg)).instances()
                if d["tags"].get(TAG_FLEET) == fleet and d["state"] != "terminated"]

    return Rig("sim", cfg, {}, "aws-cpu", planted, read, impostor, ours)


def _aws(tmp_path: Path, endpoint: str) -> Rig:
    cfg = copy_example(tmp_path, "aws-only")
    fleet = _use_fleet(cfg)
    ec2 = {r: boto3.client("ec2", region_name=r, endpoint_url=endpoint) for r in ("us-east-1", "us-west-2")}

    def run(region: str, zone: str, itype: str, tags: dict[str, str]) -> str:
        spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []
        inst = ec2[region].run_instances(ImageId=AMI, InstanceType=itype, MinCount=1, MaxCount=1, TagSpecifications=spec,
                                         Placement={"AvailabilityZone": zone})["Instances"][0]
        return f"{region}/{inst['InstanceId']}"

    planted = [
        run("us-east-1", "us-east-1a", "g5.xlarge", {}),
        run("us-east-1", "us-east-1b", "g5.xlarge", {TAG_FLEET: OTHER, TAG_POOL: "a10g", TAG_CREATE_KEY: "k-other-1"}),
        run("us-west-2", "us-west-2a", "g4dn.xlarge", {TAG_FLEET: OTHER, TAG_POOL: "t4-west"}),
        run("us-east-1", "us-east-1a", "g5.xlarge", {"fleetops.io/Fleet": fleet, "owner": "alice"}),  # tag keys are exact
    ]

    def read(handle: str) -> dict:
        region, iid = handle.split("/")
        d = ec2[region].describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
        return {"id": d["InstanceId"], "state": d["State"]["Name"], "type": d["InstanceType"],
                "zone": d["Placement"]["AvailabilityZone"], "launched": d["LaunchTime"].isoformat(),
                "tags": {t["Key"]: t["Value"] for t in d.get("Tags", [])}}

    def impostor(handle: str) -> Instance:
        region, iid = handle.split("/")
        d = read(handle)
        return Instance(id=iid, provider="aws", cloud="aws", region=region, zone=d["zone"], instance_type=d["type"],
                        market="on-demand", state="running", pool="a10g", tags={TAG_FLEET: fleet})

    def ours() -> list[dict]:
        out = []
        for client in ec2.values():
            for r in client.describe_instances(Filters=[{"Name": f"tag:{TAG_FLEET}", "Values": [fleet]},
                                                        {"Name": "instance-state-name", "Values": ["pending", "running"]}]
                                               )["Reservations"]:
                out += [{"id": d["InstanceId"], "pool": {t["Key"]: t["Value"] for t in d["Tags"]}[TAG_POOL]}
                        for d in r["Instances"]]
        return out

    # `regions`: keep watching us-west-2 once its only Pool is gone, so that Pool's instances are cleaned up.
    return Rig("aws", cfg, {"endpoint_url": endpoint, "regions": "us-east-1,us-west-2"}, "t4-west", planted, read,
               impostor, ours)


def _gcp(tmp_path: Path, gce) -> Rig:
    cfg = copy_example(tmp_path, "gcp-only")
    fleet = _use_fleet(cfg)
    planted = [
        ("us-central1-a", "bare-vm", "a2-highgpu-1g", {}),
        ("us-central1-a", "their-l4", "g2-standard-4", {"fleetops-fleet": OTHER, "fleetops-pool": "l4",
                                                        "fleetops-create-key": "k-other-1"}),
        ("us-central1-c", "their-n1", "n1-standard-8", {"fleetops-fleet": OTHER, "fleetops-pool": "t4"}),
        ("us-central1-c", "lookalike", "g2-standard-4", {"fleetops-fleet": fleet.replace("-", "_"), "fleetops-pool": "l4"}),
    ]
    for zone, name, itype, labels in planted:
        gce.plant(GCP_PROJECT, zone, name, machine_type=itype, labels=labels)

    def read(handle: str) -> dict:
        """A plain HTTP GET of the instance resource, as any Compute Engine client would do it."""
        url = f"{gce.url}/compute/v1/projects/{GCP_PROJECT}/zones/{handle}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def impostor(handle: str) -> Instance:
        zone, _, name = handle.split("/")
        return Instance(id=f"projects/{GCP_PROJECT}/zones/{zone}/instances/{name}", provider="gcp", cloud="gcp",
                        region="us-central1", zone=zone, instance_type="g2-standard-4", market="on-demand",
                        state="running", pool="l4", tags={TAG_FLEET: fleet})

    def ours() -> list[dict]:
        return [{**i, "pool": i["labels"]["fleetops-pool"]} for i in gce.instances(GCP_PROJECT)
                if i["labels"].get("fleetops-fleet") == fleet]

    return Rig("gcp", cfg, {"endpoint": gce.url, "project": GCP_PROJECT}, "l4",
               [f"{zone}/instances/{name}" for zone, name, _, _ in planted], read, impostor, ours)


def _azure(tmp_path: Path, arm) -> Rig:
    cfg = copy_example(tmp_path, "azure-only")
    fleet = _use_fleet(cfg)
    arm.plant("bare-vm")
    arm.plant("their-t4", tags={"fleetops.io_fleet": OTHER, "fleetops.io_pool": "t4", "fleetops.io_create-key": "k-1"})
    arm.plant("their-a100", zone="2", vm_size="Standard_NC24ads_A100_v4", tags={"fleetops.io_fleet": OTHER,
                                                                              "fleetops.io_pool": "a100"})
    arm.plant("slash-tag", tags={"fleetops.io-fleet": fleet})  # not our tag name
    arm.plant("other-group", resource_group="other-team", tags={"fleetops.io_fleet": OTHER, "fleetops.io_pool": "t4"})
    planted = ["bare-vm", "their-t4", "their-a100", "slash-tag", "other-group"]

    def read(name: str) -> dict:
        return arm.snapshot().get(name)

    def impostor(name: str) -> Instance:
        rg = "other-team" if name == "other-group" else ARM_RESOURCE_GROUP
        return Instance(id=f"/subscriptions/{arm.subscription}/resourceGroups/{rg}/providers/Microsoft.Compute/"
                           f"virtualMachines/{name}", provider="azure", cloud="azure", region="eastus", zone="eastus-1",
                        instance_type="Standard_NC4as_T4_v3", market="on-demand", state="running", pool="t4",
                        tags={TAG_FLEET: fleet})

    def ours() -> list[dict]:
        return [{**v, "pool": v["tags"]["fleetops.io_pool"]} for v in arm.snapshot().values()
                if v["tags"].get("fleetops.io_fleet") == fleet]

    return Rig("azure", cfg, arm_options(arm, resource_groups="other-team"), "t4", planted, read, impostor, ours)


@pytest.fixture(params=["sim", "aws", "gcp", "azure"])
def rig(request, tmp_path) -> Rig:
    name = request.param
    if name == "sim":
        return _sim(tmp_path)
    if name == "aws":
        return _aws(tmp_path, request.getfixturevalue("aws_env"))
    if name == "gcp":
        return _gcp(tmp_path, request.getfixturevalue("gce"))
    return _azure(tmp_path, request.getfixturevalue("arm"))


# ---------------------------------------------------------------- the suite


def test_instances_the_fleet_does_not_own_survive_every_apply(rig: Rig):
    planted = {h: rig.read(h) for h in rig.planted}
    assert all(planted.values())

    def apply():
        res = api.apply(rig.cfg, provider=rig.provider, options=rig.options, allow_destroy=100)
        assert res.report.ok, res.report.failures
        assert {h: rig.read(h) for h in rig.planted} == planted  # same id, tags or labels, state: untouched
        return res

    first = apply()
    assert first.report.created and len(rig.ours()) == len(first.report.created)

    # Every Job deleted; the Pool about to go keeps one instance (min 1), so the last step has one of ours to delete.
    for f in (rig.cfg / "jobs").glob("*.yaml"):
        f.unlink()
    _edit(rig.cfg, _pool_min(rig.removed_pool, 1))
    emptied = apply()
    assert emptied.report.deleted and [i["pool"] for i in rig.ours()] == [rig.removed_pool]

    _edit(rig.cfg, _drop_pool(rig.removed_pool))
    assert apply().report.deleted and rig.ours() == []

    # The provider never sees them and refuses to delete them, even handed them as if they were its own.
    desired = load(rig.cfg)
    prov = load_provider(rig.provider, ProviderContext(fleet=desired.fleet, state_dir=state_dir(rig.cfg),
                                                       options=rig.options))
    assert prov.observe([pool_target(p) for p in desired.pools.values()]) == []
    for h in rig.planted:
        with pytest.raises(OwnershipError, match="refusing"):
            prov.delete(rig.impostor(h))
    assert {h: rig.read(h) for h in rig.planted} == planted


def test_a_copy_of_an_instance_with_all_its_tags_is_left_alone(tmp_path):
    """Damage audit: an instance cloned in a console (or launched from an image of one) with every tag of the fleet's
    original, its create key too, was taken as the fleet's: idle beside the original running the work, the plan deleted
    it ("no longer needed") with whatever someone ran on it. An apply launches one instance per create key, so of two
    carrying one the later launched is a copy: left alone (not counted as capacity, never deleted), said in a note."""
    from tests.fleetkit import job, pool, tenant, topology, write_config

    cfg = tmp_path / "cfg"
    docs = [topology("copied", clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t"),
            pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], hi=3), job("a", gpus=2, gpu_type="A10G")]
    write_config(cfg, docs)
    api.apply(cfg, time_limit=5)
    sim = SimCloud(state_dir(cfg))
    (host,) = [d for d in sim.instances() if d["state"] == "running"]
    copy = sim.plant("aws", "us-east-1", "us-east-1a", "g5.12xlarge", dict(host["tags"]))
    launched_later(sim, copy, host)
    res = api.plan(cfg, time_limit=5)
    assert copy not in {i.id for i in res.observed.instances} and not res.plan.deletes
    assert any(n.startswith(f"{copy} carries the create key {host['tags'][TAG_CREATE_KEY]} of {host['id']}")
               for n in res.plan.notes), res.plan.notes
    write_config(cfg, docs[:-1])  # no jobs: the fleet's own instance goes, the copy stays
    assert api.apply(cfg, time_limit=5).report.deleted == [host["id"]]
    assert {d["id"]: d["state"] for d in sim.instances()} == {host["id"]: "terminated", copy: "running"}



def test_a_state_placing_work_on_an_instance_not_the_fleets_says_so(tmp_path):
    """A state edited (or restored from another fleet's) to place a job on an instance that is not the fleet's: the
    instance is left alone and the job placed again, and the plan said it "replaces X: gone (spot interruption)", of
    an instance that runs. A note says what X is."""
    from tests.fleetkit import job, pool, tenant, topology, write_config

    cfg = tmp_path / "cfg"
    write_config(cfg, [topology("edited", clouds={"aws": {"us-east-1": ["us-east-1a"]}}), tenant("t"),
                       pool("p", "aws", "us-east-1", ["us-east-1a"], ["g5.12xlarge"], hi=3), job("a", gpus=2, gpu_type="A10G")])
    api.apply(cfg, time_limit=5)
    sim = SimCloud(state_dir(cfg))
    (host,) = [d for d in sim.instances() if d["state"] == "running"]
    by_hand = sim.plant("aws", "us-east-1", "us-east-1a", "g5.12xlarge", {TAG_FLEET: "edited"})
    copy = sim.plant("aws", "us-east-1", "us-east-1a", "g5.12xlarge", dict(host["tags"]))
    launched_later(sim, copy, host)
    path = state_dir(cfg) / "state.json"
    for other in (by_hand, copy):
        path.write_text(json.dumps({**json.loads(path.read_text()), "placements": {"a": [other]}}))
        res = api.plan(cfg, time_limit=5)
        assert any(n.startswith(f"the state places a on {other}, which is not this fleet's") for n in res.plan.notes), res.plan.notes
        assert other not in {d.instance_id for d in res.plan.deletes}
