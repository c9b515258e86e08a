"""The GCP provider with the real google-cloud-compute client against a local Compute Engine fake over HTTP."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, CreateRequest, Instance, PoolTarget, ProviderContext, ownership_tags
from providers.catalog import load_catalog
from providers.gcp import (
    DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, LABEL_FLEET, STATES, GcpProvider, instance_name, join_type, label_key, label_value, request_id,
    split_type, tag_value,
)
from reconciler import api
from reconciler.cli import app
from reconciler.errors import (
    ApplyError, CapacityError, IncompleteObservationError, OwnershipError, ProviderError, QuotaError, TransientProviderError,
)
from tests.cloud_iam import gce_calls
from tests.fleetkit import copy_example
from tests.gce_fake import LABEL_KEY_RE, LABEL_VALUE_RE, NAME_RE, GceFake, parse_filter

PROJECT = "fleet-test-project"
FLEET = "gcp-test.fleet"  # a '.' in the name: the label spells it '_'
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


@pytest.fixture
def prov(gce, tmp_path):
    return GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={"endpoint": gce.url, "project": PROJECT}))


def target(name="l4", zones=(ZONE_A, ZONE_B), types=("g2-standard-4", "n2-standard-16"), **settings):
    return PoolTarget(name=name, cloud="gcp", region="us-central1", zones=zones, instance_types=types, settings=settings)


def req(key, market="on-demand", zone=ZONE_A, itype="g2-standard-4", pool=None, fleet=FLEET):
    pool = pool or target()
    return CreateRequest(key=key, pool=pool, zone=zone, instance_type=itype, market=market,
                         max_price=0.7068 if market == "spot" else None, tags=ownership_tags(fleet, pool.name, key))


def stored(gce: GceFake, name: str) -> dict:
    return next(i for i in gce.instances(PROJECT) if i["name"] == name)


# ---------------------------------------------------------------- naming


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=120))
def test_names_and_labels_are_valid_and_deterministic_for_any_key(key):
    name = instance_name(key)
    assert NAME_RE.fullmatch(name) and name == instance_name(key)
    assert LABEL_VALUE_RE.fullmatch(label_value(key)) and LABEL_KEY_RE.fullmatch(label_key(key))
    assert re.fullmatch(r"[0-9a-f-]{36}", request_id(FLEET, key)) and request_id(FLEET, key) != request_id("other", key)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", fullmatch=True),
       st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", fullmatch=True))
def test_config_names_map_to_labels_exactly_and_never_collide(a, b):
    """Every name the config allows (fleet, pool) survives the round trip, and two names never share a label."""
    assert tag_value(label_value(a)) == a
    assert (label_value(a) == label_value(b)) == (a == b)


def test_plan_keys_keep_their_spelling_and_odd_keys_are_hashed():
    assert instance_name("d42109a49d5f-0001") == "fo-d42109a49d5f-0001"
    long = "K" * 80
    assert instance_name(long) != instance_name(long + "x") and len(instance_name(long)) <= 63
    assert label_value("Team_A") != label_value("team-a")
    assert label_key("fleetops.io/create-key") == "fleetops-create-key"


# ---------------------------------------------------------------- create / observe / delete


def test_create_observe_delete_spot_and_on_demand(prov, gce):
    od = prov.create(req("k-od"))
    spot = prov.create(req("k-spot", market="spot", zone=ZONE_B))
    assert (od.market, od.zone, od.region, od.instance_type, od.pool, od.state) == (
        "on-demand", ZONE_A, "us-central1", "g2-standard-4", "l4", "running")
    assert (spot.market, spot.zone) == ("spot", ZONE_B)
    assert spot.id == f"projects/{PROJECT}/zones/{ZONE_B}/instances/fo-k-spot"
    seen = {i.id: i for i in prov.observe([target()])}
    assert set(seen) == {od.id, spot.id}
    assert seen[spot.id].tags[TAG_CREATE_KEY] == "k-spot" and seen[spot.id].tags[TAG_FLEET] == FLEET
    assert seen[spot.id].tags[TAG_POOL] == "l4" and seen[spot.id].market == "spot"

    raw = stored(gce, "fo-k-spot")  # what GCE itself holds
    assert raw["status"] == "RUNNING" and raw["labels"][LABEL_FLEET] == "gcp-test_fleet"
    assert raw["scheduling"]["provisioningModel"] == "SPOT" and raw["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert stored(gce, "fo-k-od")["scheduling"]["provisioningModel"] == "STANDARD"
    # Every insert was waited on: zoneOperations.wait blocks until the operation is DONE, so once each.
    assert len(gce.requests("POST", "/wait")) == 2

    prov.delete(spot)
    prov.delete(spot)  # already gone: not an error
    assert [i["name"] for i in gce.instances(PROJECT)] == ["fo-k-od"]
    assert {i.id for i in prov.observe([target()])} == {od.id}


def test_insert_bodies_carry_pool_settings_and_gce_scheduling_rules(prov, gce):
    sa = "fleetops-node@fleet-test-project.iam.gserviceaccount.com"
    gce.add_image("my-images", "gpu-node-v7", family="gpu-node")
    gce.add_network(PROJECT, "ml-vpc")
    gce.add_subnetwork(PROJECT, "us-central1", "gpu", "ml-vpc")
    pool = target(image="projects/my-images/global/images/family/gpu-node", network="ml-vpc", subnetwork="gpu",
                  service_account=sa)
    prov.create(req("k-gpu", pool=pool))
    prov.create(req("k-cpu", pool=pool, itype="n2-standard-16"))
    prov.create(req("k-spot-cpu", pool=target(), itype="n2-standard-16", market="spot"))
    bodies = {b["name"]: b for _, _, b in gce.insert_bodies}
    gpu, cpu, spot = bodies["fo-k-gpu"], bodies["fo-k-cpu"], bodies["fo-k-spot-cpu"]
    assert gpu["machineType"] == f"zones/{ZONE_A}/machineTypes/g2-standard-4"
    assert gpu["disks"][0]["initializeParams"]["sourceImage"] == "projects/my-images/global/images/family/gpu-node"
    assert gpu["disks"][0]["autoDelete"] is True and gpu["disks"][0]["boot"] is True
    assert gpu["networkInterfaces"] == [{"network": "global/networks/ml-vpc",
                                         "subnetwork": "regions/us-central1/subnetworks/gpu"}]
    assert gpu["serviceAccounts"] == [{"email": sa, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    # GPUs cannot live-migrate; CPU-only on-demand VMs can; Spot never restarts.
    assert gpu["scheduling"] == {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE", "automaticRestart": True}
    assert cpu["scheduling"]["onHostMaintenance"] == "MIGRATE"
    assert spot["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                  "onHostMaintenance": "TERMINATE", "automaticRestart": False}
    assert spot["disks"][0]["initializeParams"]["sourceImage"] == DEFAULT_IMAGE
    assert spot["networkInterfaces"] == [{"network": "global/networks/default"}]
    assert gpu["labels"] == {"fleetops-fleet": "gcp-test_fleet", "fleetops-pool": "l4", "fleetops-create-key": "k-gpu"}


T4, V100 = "n1-standard-8+1xnvidia-tesla-t4", "n1-standard-8+1xnvidia-tesla-v100"


def test_n1_types_are_launched_with_their_gpu_attached_and_observed_by_their_catalog_name(prov, gce):
    pool = target("n1", types=(T4, V100))
    t4 = prov.create(req("k-t4", pool=pool, itype=T4))
    v100 = prov.create(req("k-v100", pool=pool, itype=V100, market="spot", zone=ZONE_B))
    a100 = prov.create(req("k-a100", pool=pool, itype="a2-highgpu-1g"))
    bodies = {b["name"]: b for _, _, b in gce.insert_bodies}
    assert bodies["fo-k-t4"]["machineType"] == f"zones/{ZONE_A}/machineTypes/n1-standard-8"
    assert bodies["fo-k-t4"]["guestAccelerators"] == [
        {"acceleratorType": f"projects/{PROJECT}/zones/{ZONE_A}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}]
    assert bodies["fo-k-t4"]["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GPUs cannot live-migrate
    assert bodies["fo-k-v100"]["guestAccelerators"][0]["acceleratorType"].endswith(f"/{ZONE_B}/acceleratorTypes/nvidia-tesla-v100")
    assert "guestAccelerators" not in bodies["fo-k-a100"]  # an a2's GPUs come with the machine type
    # GCE reports every instance's GPUs, the a2's built-in one too; the type names still read back exactly.
    assert stored(gce, "fo-k-a100")["guestAccelerators"][0]["acceleratorType"].endswith("/nvidia-tesla-a100")
    assert (t4.instance_type, v100.instance_type, v100.market, a100.instance_type) == (T4, V100, "spot", "a2-highgpu-1g")
    assert {i.id: i.instance_type for i in prov.observe([pool])} == {t4.id: T4, v100.id: V100, a100.id: "a2-highgpu-1g"}


def test_n1_gpu_offerings_come_from_the_catalog_with_its_date(prov):
    offs = {(o.zone, o.instance_type): o for o in prov.offerings([target("n1", types=(T4, V100))])}
    t4, v100 = offs[(ZONE_A, T4)], offs[(ZONE_B, V100)]
    assert (t4.gpus, t4.gpu_type, t4.cpu, t4.memory_gib, t4.on_demand_price) == (1, "T4", 8, 30, 0.73)
    assert (v100.gpus, v100.gpu_type, v100.on_demand_price) == (1, "V100", 2.86)
    assert 0 < t4.spot_price < t4.on_demand_price and 0 < v100.spot_price < v100.on_demand_price
    cat = load_catalog()
    dates = {cat.sources[cat.shape("gcp", t).prices["us-central1"].source].date for t in (T4, V100)}
    assert {o.prices_as_of for o in offs.values()} == dates  # list prices, and how old they are (their source's date)


def test_spot_prices_are_read_live_when_an_api_key_is_set_cached_and_labelled(gce, tmp_path, monkeypatch):
    """Issue 22: with an API key the Cloud Billing Catalog's Preemptible SKUs price spot at plan time (cached with a
    TTL, labelled with the API and the read time); without one, or where the API has no spot SKU, the catalog's
    dated price. Before, GCP spot came from the catalog only."""
    from tests.price_fake import PriceFake

    fake = PriceFake().start()
    try:
        def offers(**extra):
            p = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={
                "endpoint": gce.url, "project": PROJECT, "prices_endpoint": fake.url, **extra}))
            return {(o.zone, o.instance_type): o for o in p.offerings([target(types=("a2-highgpu-1g", "n2-standard-16"))])}

        cat = load_catalog()
        monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
        monkeypatch.delenv("FLEETOPS_GCP_API_KEY", raising=False)
        keyless = offers()
        assert keyless[(ZONE_A, "a2-highgpu-1g")] == cat.offering("gcp", "us-central1", ZONE_A, "a2-highgpu-1g") and not fake.requests
        monkeypatch.setenv("FLEETOPS_GCP_API_KEY", "fake-api-key-for-tests")
        live = offers()
        a2 = live[(ZONE_A, "a2-highgpu-1g")]
        # The A2 family's Preemptible per-vCPU and per-GiB prices times the shape, plus the A100's: 12, 85 GiB, 1 GPU.
        assert a2.spot_price == pytest.approx(12 * 0.009483 + 85 * 0.001271 + 0.88, abs=1e-6)
        assert a2.on_demand_price == cat.offering("gcp", "us-central1", ZONE_A, "a2-highgpu-1g").on_demand_price
        assert re.fullmatch(r"catalog: skypilot-v8-gcp \(2026-11-23\); spot: live Cloud Billing Catalog API, read \S+Z", a2.price_source)
        assert live[(ZONE_B, "n2-standard-16")] == cat.offering("gcp", "us-central1", ZONE_B, "n2-standard-16")  # no Preemptible N2 SKU
        pages = len(fake.requests)
        offers()
        assert len(fake.requests) == pages  # within the TTL: the cached read
        fake.broken = "gcp"
        down = offers(spot_price_ttl="0.001")[(ZONE_A, "a2-highgpu-1g")]
        assert down.spot_price == cat.offering("gcp", "us-central1", ZONE_A, "a2-highgpu-1g").spot_price
        assert "spot: catalog, the live Cloud Billing Catalog API could not be read (gcp Cloud Billing Catalog: SKU X" in down.price_source
    finally:
        fake.stop()


def test_a_real_api_key_is_only_sent_to_the_cloud_billing_api(gce, tmp_path, monkeypatch):
    """GOOGLE_API_KEY (the variable Google's Gemini SDK reads too: an ML team's shell often has one) went, as `?key=`,
    to whatever `-o prices_endpoint=` named, over plain http too (secrets audit). A real key goes only to
    https://cloudbilling.googleapis.com; elsewhere (a local fake) only the tests' key is sent, and FLEETOPS_GCP_API_KEY
    is read before GOOGLE_API_KEY. Refused, the plan keeps the catalog's spot prices and says why."""
    from tests.price_fake import PriceFake

    fake = PriceFake().start()
    try:
        def a2(**env):
            for k in ("GOOGLE_API_KEY", "FLEETOPS_GCP_API_KEY"):
                monkeypatch.delenv(k, raising=False)
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            p = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path / str(len(fake.requests)), options={
                "endpoint": gce.url, "project": PROJECT, "prices_endpoint": fake.url, "spot_price_ttl": "0"}))
            return {(o.zone, o.instance_type): o for o in p.offerings([target(types=("a2-highgpu-1g",))])}[(ZONE_A, "a2-highgpu-1g")]

        cat = load_catalog().offering("gcp", "us-central1", ZONE_A, "a2-highgpu-1g")
        refused = a2(GOOGLE_API_KEY="AIzaPLANTED-real-key")
        assert refused.spot_price == cat.spot_price and "the API key is only sent to https://cloudbilling.googleapis.com" in \
            refused.price_source and "PLANTED" not in refused.price_source
        assert fake.keys == []
        live = a2(GOOGLE_API_KEY="AIzaPLANTED-real-key", FLEETOPS_GCP_API_KEY="fake-api-key-for-tests")
        assert "live Cloud Billing Catalog API" in live.price_source and set(fake.keys) == {"fake-api-key-for-tests"}
    finally:
        fake.stop()


def test_a_bad_spot_price_ttl_is_an_error_naming_it(gce, tmp_path, monkeypatch):
    """Before, `-o spot_price_ttl=soon` was a bare ValueError out of float() (an "unexpected error" at plan time). Every
    option's value is checked when the provider is made, before any call."""
    monkeypatch.setenv("FLEETOPS_GCP_API_KEY", "fake-api-key-for-tests")
    with pytest.raises(ProviderError, match=r"^gcp: option spot_price_ttl='soon' must be a number of seconds, 0 or more$"):
        GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={
            "endpoint": gce.url, "project": PROJECT, "prices_endpoint": "http://127.0.0.1:9", "spot_price_ttl": "soon"}))


def test_instance_type_names_split_into_machine_type_and_attached_gpus():
    assert split_type(T4) == ("n1-standard-8", "nvidia-tesla-t4", 1)
    assert split_type("n1-highmem-16+4xnvidia-tesla-v100") == ("n1-highmem-16", "nvidia-tesla-v100", 4)
    for name in ("a2-highgpu-1g", "g2-standard-48", "n2-standard-16", "n1-standard-8", "n1-standard-8+t4", "x+0xnvidia-tesla-t4"):
        assert split_type(name) == (name, None, 0)
    for name in sorted(t for c, t in load_catalog().shapes if c == "gcp"):
        assert join_type(*split_type(name)) == name


@pytest.mark.parametrize("conflicts", ["http", "operation"])
def test_retry_with_the_same_key_yields_one_instance(prov, gce, conflicts):
    gce.conflicts = conflicts
    first = prov.create(req("k-same"))
    again = prov.create(req("k-same"))  # GCE answers the repeated requestId with the original operation
    assert again.id == first.id
    inserts = gce.requests("POST", f"/zones/{ZONE_A}/instances")
    assert len(inserts) == 2 and inserts[0][2]["requestId"] == inserts[1][2]["requestId"]
    assert len(gce.insert_bodies) == 1
    gce.forget_request_ids()  # much later: the requestId is forgotten, the name still taken (409 or failed op) and ours
    assert prov.create(req("k-same")).id == first.id
    assert [i["name"] for i in gce.instances(PROJECT)] == ["fo-k-same"]
    assert [i.id for i in prov.observe([target()])] == [first.id]


@pytest.mark.parametrize("market", ["on-demand", "spot"])
def test_a_key_whose_instance_was_deleted_since_creates_a_new_one(prov, gce, market):
    """The same plan can come back (a config reverted, the fleet as it was): GCE still remembers the key's requestId
    and answers with the old, finished operation, whose instance is gone. The create must launch a new one."""
    first = prov.create(req("k-again", market=market))
    prov.delete(first)
    again = prov.create(req("k-again", market=market))
    assert again.id == first.id and again.state == "running" and again.market == market
    assert [i["status"] for i in gce.instances(PROJECT)] == ["RUNNING"]
    assert len(gce.insert_bodies) == 2
    rids = [q["requestId"][0] for _, _, q in gce.requests("POST", f"/zones/{ZONE_A}/instances")]
    assert rids[0] == rids[1] != rids[2]  # the re-insert has its own requestId ...
    assert prov.create(req("k-again", market=market)).id == first.id  # ... and a retry of it is still one instance
    assert len(gce.insert_bodies) == 2 and len(gce.instances(PROJECT)) == 1


@pytest.mark.parametrize("latency", [0.05, 0], ids=["answered-running", "answered-done"])
def test_a_spot_vm_reclaimed_as_it_starts_is_tried_once_more_then_a_capacity_error(prov, gce, latency):
    """GCE preempts a Spot VM whenever it needs the capacity back, as it starts too; with instanceTerminationAction
    DELETE the insert's operation still ends DONE with no error and the instance is gone. Answered with that operation
    already DONE, the insert was read as a remembered one of an earlier create and inserted again under derived
    requestIds, a Spot VM launched (and billed) each time, until the key was "spent" (KeySpentError): never a capacity
    error, so the zone was never cooled off for spot and the next plan put the key back there. (Gone before the create
    looks: preempt_grace 0; test_a_spot_vm_preempted_as_it_starts_and_still_stopping_... has GCE's 30 s.)"""
    gce.op_latency = latency
    gce.preempt_grace = 0
    gce.reclaim_spot(ZONE_B)
    with pytest.raises(CapacityError, match="preempted") as e:
        prov.create(req("k-reclaimed", market="spot", zone=ZONE_B))
    assert (e.value.zone, e.value.market) == (ZONE_B, "spot")
    assert len(gce.insert_bodies) == 2 and gce.instances(PROJECT) == []


@pytest.mark.parametrize("latency", [0.05, 0], ids=["answered-running", "answered-done"])
def test_a_spot_vm_preempted_as_it_starts_and_still_stopping_is_a_capacity_error_not_a_stopped_vm(prov, gce, latency):
    """A preempted Spot VM is not gone at once: GCE gives it up to 30 s to shut down, STOPPING, before it deletes it
    (instanceTerminationAction DELETE). The fake deleted it at once; against GCE the create read it back STOPPING and
    answered a stopped VM, which apply reported as "exists but does not run ... start it, or delete it yourself", and
    no capacity error cooled the zone off for spot. GCE's compute.instances.preempted operation says what it is."""
    gce.op_latency = latency
    gce.reclaim_spot(ZONE_B)
    with pytest.raises(CapacityError, match="preempted") as e:
        prov.create(req("k-stopping", market="spot", zone=ZONE_B))
    assert (e.value.zone, e.value.market) == (ZONE_B, "spot")
    assert len(gce.insert_bodies) == 1 and [i["status"] for i in gce.instances(PROJECT)] == ["STOPPING"]
    gce.clock.advance(gce.preempt_grace)
    assert gce.instances(PROJECT) == []


def test_a_spot_vm_someone_stops_as_it_starts_is_answered_stopped(prov, gce):
    """Stopped by someone (not preempted): the create answers the VM as it is, stopped, for apply to report."""
    gce.op_latency = 0
    made = prov.create(req("k-stopped", market="spot", zone=ZONE_B))
    gce.stop_instance(PROJECT, ZONE_B, "fo-k-stopped")
    again = prov.create(req("k-stopped", market="spot", zone=ZONE_B))
    assert (again.id, again.state) == (made.id, "stopping")


@pytest.mark.parametrize("latency", [0.05, 0], ids=["answered-running", "answered-done"])
@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_a_vm_someone_deletes_as_it_starts_is_not_read_as_preempted_nor_launched_again(prov, gce, latency, market):
    """An insert that succeeded and whose VM is gone: a Spot VM preempted, or one someone else deleted (a person, a
    clean-up job). Both were read as a preemption: a capacity error that cooled the zone off for spot, and for an
    on-demand VM a guess ("deleted by someone else?"). GCE records which it was, a compute.instances.preempted
    operation or that principal's delete, and the create reads it: a plain error naming who deleted it."""
    gce.op_latency = latency
    gce.delete_at_start(ZONE_B, user="janitor@example.iam.gserviceaccount.com")
    with pytest.raises(ProviderError, match="deleted by janitor@example.iam.gserviceaccount.com") as e:
        prov.create(req("k-snatched", market=market, zone=ZONE_B))
    assert not isinstance(e.value, CapacityError)
    assert len(gce.insert_bodies) == 2 and gce.instances(PROJECT) == []  # (the first may be an earlier insert's)
    listed = gce.requests("GET", f"/zones/{ZONE_B}/operations")
    assert [q["filter"] for _, path, q in listed if path.endswith("/operations")] == [
        [f'(targetLink = "https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE_B}/instances/fo-k-snatched")']]


@pytest.mark.parametrize("server", ["strict", "one-a-page", "filter-ignored"])
def test_a_preemption_is_told_by_the_operation_gce_records_for_it(prov, gce, server):
    """What tells a preemption is GCE's compute.instances.preempted operation on that VM (its targetId, as names are
    used again): one of an earlier VM of the same name says nothing of this one. Read page by page, and checked again
    on this side should the server ignore the filter."""
    gce.page_limit = 1 if server == "one-a-page" else 500
    gce.honour_filters = server != "filter-ignored"
    gce.op_latency, gce.preempt_grace = 0, 0
    gce.reclaim_spot(ZONE_B)
    with pytest.raises(CapacityError, match="preempted"):
        prov.create(req("k-twice", market="spot", zone=ZONE_B))
    gce.reclaiming.clear()
    gce.delete_at_start(ZONE_B)
    gce.forget_request_ids()
    with pytest.raises(ProviderError, match="deleted by someone@example.com") as e:
        prov.create(req("k-twice", market="spot", zone=ZONE_B))
    assert not isinstance(e.value, CapacityError)
    preempted = [o for o in gce.operations.values() if o.op_type == "compute.instances.preempted"]
    assert len(preempted) == 2 and all(o.user == "system" and o.target == "fo-k-twice" for o in preempted)


def test_an_instance_deleted_outside_is_replaced_and_nothing_the_fleet_does_not_own_is_touched(gce, tmp_path):
    """An on-demand instance of the fleet deleted outside it (the console, another tool): observe no longer sees it, the
    plan launches a replacement for its place and deletes nothing, and the instances the fleet does not own (one
    planted by hand, one labelled for another fleet) are left as they were."""
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    first = api.apply(cfg, provider="gcp", options=opts)
    foreign = [gce.plant(PROJECT, ZONE_A, "hand-made", machine_type="a2-highgpu-1g"),
               gce.plant(PROJECT, ZONE_B, "other-fleet", labels={LABEL_FLEET: "other-fleet"})]
    gone = next(i for i in _ours(gce) if i["scheduling"]["provisioningModel"] == "STANDARD")
    gce.delete_instance(PROJECT, _zone(gone), gone["name"])
    res = api.plan(cfg, provider="gcp", options=opts)
    gone_id = f"projects/{PROJECT}/zones/{_zone(gone)}/instances/{gone['name']}"
    assert gone_id not in {i.id for i in res.observed.instances}
    assert len(res.plan.creates) == 1 and not res.plan.deletes
    again = api.apply(cfg, provider="gcp", options=opts)
    assert again.report.ok and len(again.report.created) == 1
    assert len(_ours(gce)) == len(first.plan.creates) and all(i["status"] == "RUNNING" for i in _ours(gce))
    assert not api.plan(cfg, provider="gcp", options=opts).plan.has_changes
    assert [(i["name"], i["id"], i["status"]) for i in gce.instances(PROJECT) if i["name"] in ("hand-made", "other-fleet")] == [
        (f["name"], f["id"], "RUNNING") for f in foreign]


@pytest.mark.parametrize("skew", [-90.0, 90.0], ids=["host-clock-behind", "host-clock-ahead"])
def test_which_insert_an_operation_answered_done_belongs_to_does_not_depend_on_this_host_s_clock(prov, gce, skew):
    """An insert answered with an operation already DONE and failed: the insert's own failure (the error now), or an
    earlier insert's that GCE remembered for the requestId (tried again). That was told by the operation's insertTime
    (GCE's clock) against this host's clock, 30 s allowed between them: with this host 90 s ahead, every fresh stockout
    read as remembered and was inserted again until the key was spent (KeySpentError); 90 s behind, a stockout of a
    minute before read as now's, and the zone, replenished since, was refused."""
    gce.clock_skew = -skew  # GCE's clock against this host's
    gce.op_latency = 0  # answered DONE at insert
    gce.exhaust(ZONE_B)
    with pytest.raises(CapacityError):
        prov.create(req("k-skewed", zone=ZONE_B))
    assert len(gce.requests("POST", f"/zones/{ZONE_B}/instances")) == 1
    gce.replenish(ZONE_B)
    gce.age(60)  # a minute on, capacity back: the remembered stockout says nothing of now
    made = prov.create(req("k-skewed", zone=ZONE_B))
    assert made.state == "running" and len(gce.instances(PROJECT)) == 1
    assert len(gce.requests("POST", f"/zones/{ZONE_B}/instances")) == 3


def test_unmanaged_and_foreign_instances_are_invisible_and_untouchable(prov, gce):
    mine = prov.create(req("k-mine"))
    gce.plant(PROJECT, ZONE_A, "bare")
    gce.plant(PROJECT, ZONE_A, "theirs", labels={LABEL_FLEET: "someone-else", "fleetops-pool": "l4"})
    gce.plant(PROJECT, ZONE_B, "fo-k-taken", labels={"team": "vision"})  # squats on the name key k-taken maps to
    assert [i.id for i in prov.observe([target()])] == [mine.id]
    for name, zone in (("bare", ZONE_A), ("theirs", ZONE_A), ("fo-k-taken", ZONE_B)):
        impostor = Instance(id=f"projects/{PROJECT}/zones/{zone}/instances/{name}", provider="gcp", cloud="gcp",
                            region="us-central1", zone=zone, instance_type="g2-standard-4", market="on-demand",
                            state="running", pool="l4", tags={TAG_FLEET: FLEET})
        with pytest.raises(OwnershipError, match="refusing to delete"):
            prov.delete(impostor)
    with pytest.raises(OwnershipError, match="refusing to adopt"):
        prov.create(req("k-taken", zone=ZONE_B))
    after = {i["name"]: i for i in gce.instances(PROJECT)}
    assert {n: after[n]["status"] for n in ("bare", "theirs", "fo-k-taken")} == dict.fromkeys(("bare", "theirs", "fo-k-taken"), "RUNNING")
    assert after["fo-k-taken"]["labels"] == {"team": "vision"}
    assert not gce.requests("DELETE")


def test_observe_paginates_and_filters_server_side(prov, gce):
    gce.page_limit = 4
    zones = (ZONE_A, ZONE_B, "us-central1-c", "europe-west4-a")
    for n in range(11):
        gce.plant(PROJECT, zones[n % 4], f"mine-{n:02d}", labels={LABEL_FLEET: "gcp-test_fleet", "fleetops-pool": "l4"},
                  spot=n % 2 == 1)
    gce.plant(PROJECT, ZONE_A, "mine-stopping", labels={LABEL_FLEET: "gcp-test_fleet"}, status="STOPPING")
    gce.plant(PROJECT, ZONE_A, "mine-stopped", labels={LABEL_FLEET: "gcp-test_fleet"}, status="TERMINATED")
    for n in range(6):
        gce.plant(PROJECT, ZONE_B, f"other-{n}", labels={LABEL_FLEET: "gcp-test-fleet"})  # '-' is not '.': not ours
    found = prov.observe([target()])
    assert sorted(i.id.rsplit("/", 1)[1] for i in found) == [f"mine-{n:02d}" for n in range(11)] + ["mine-stopped", "mine-stopping"]
    assert {i.id.rsplit("/", 1)[1]: i.state for i in found if i.state != "running"} == {"mine-stopped": "stopping",
                                                                                         "mine-stopping": "stopping"}
    assert {i.market for i in found if i.id.endswith(("01", "03"))} == {"spot"}
    assert {i.region for i in found} == {"us-central1", "europe-west4"}  # a removed pool's region is still watched
    lists = gce.requests("GET", "/aggregated/instances")
    assert len(lists) == 4  # 13 matches, 4 a page: the filter ran on the server
    assert "pageToken" not in lists[0][2] and all("pageToken" in q for _, _, q in lists[1:])


def test_an_instance_under_repair_is_still_observed_as_running(prov, gce):
    """A host failure puts an instance in REPAIRING; hiding it would make the planner replace a VM that comes back."""
    gce.plant(PROJECT, ZONE_A, "mine-repairing", labels={LABEL_FLEET: "gcp-test_fleet", "fleetops-pool": "l4"},
              status="REPAIRING")
    assert [(i.id.rsplit("/", 1)[1], i.state) for i in prov.observe([target()])] == [("mine-repairing", "running")]


def test_the_observe_filter_selects_exactly_this_fleets_instances_live_or_stopped(prov, gce):
    prov.observe([target()])
    flt = gce.requests("GET", "/aggregated/instances")[0][2]["filter"][0]
    match = parse_filter(flt)
    ours = {"labels": {LABEL_FLEET: "gcp-test_fleet"}}
    assert all(match({**ours, "status": s}) for s in STATES)  # a stopped one is billed: it must not vanish
    assert not match({"labels": {LABEL_FLEET: "other"}, "status": "RUNNING"}) and not match({"status": "RUNNING"})


def test_observe_checks_ownership_itself_even_if_the_server_ignores_the_filter(prov, gce):
    gce.honour_filters = False
    mine = prov.create(req("k-mine"))
    gce.plant(PROJECT, ZONE_A, "bare")
    gce.plant(PROJECT, ZONE_A, "theirs", labels={LABEL_FLEET: "someone-else"})
    gce.plant(PROJECT, ZONE_B, "mine-stopping", labels={LABEL_FLEET: "gcp-test_fleet"}, status="STOPPING")
    gce.plant(PROJECT, ZONE_B, "theirs-stopped", labels={LABEL_FLEET: "someone-else"}, status="TERMINATED")
    assert {i.id: i.state for i in prov.observe([target()])} == {
        mine.id: "running", f"projects/{PROJECT}/zones/{ZONE_B}/instances/mine-stopping": "stopping"}


def test_stopped_and_suspended_instances_are_observed_as_stopping_not_gone(prov, gce):
    """Audit: TERMINATED (GCE's stopped: its disks and static IPs still billed) and SUSPENDED instances were dropped by
    observe, so their replicas were declared lost and relaunched, and the instances never reported."""
    stopped = prov.create(req("k-stopped"))
    gce.stop_instance(PROJECT, ZONE_A, "fo-k-stopped")
    gce.plant(PROJECT, ZONE_B, "mine-suspended", labels={LABEL_FLEET: "gcp-test_fleet"}, status="SUSPENDED")
    gce.plant(PROJECT, ZONE_B, "mine-suspending", labels={LABEL_FLEET: "gcp-test_fleet"}, status="SUSPENDING")
    seen = {i.id.rsplit("/", 1)[1]: i.state for i in prov.observe([target()])}
    assert seen == {"fo-k-stopped": "stopping", "mine-suspended": "stopping", "mine-suspending": "stopping"}
    assert stopped.id.endswith("/fo-k-stopped")


@pytest.mark.parametrize("conflicts", ["http", "operation"])
def test_a_create_whose_key_holds_a_stopped_instance_returns_it_stopped(prov, gce, conflicts):
    """GCE keeps a stopped (TERMINATED) instance and its name: a create with its key finds it, `stopping`, so apply
    launches no second instance for the key (before, it was "terminated" and apply moved on to the next key)."""
    gce.conflicts = conflicts
    first = prov.create(req("k-held"))
    gce.stop_instance(PROJECT, ZONE_A, "fo-k-held")
    again = prov.create(req("k-held"))  # the requestId answered with the original operation
    assert (again.id, again.state) == (first.id, "stopping")
    gce.forget_request_ids()  # later: the name is taken by it
    again = prov.create(req("k-held"))
    assert (again.id, again.state) == (first.id, "stopping")
    assert [(i["name"], i["status"]) for i in gce.instances(PROJECT)] == [("fo-k-held", "TERMINATED")]


def test_a_preempted_spot_vm_is_deleted_or_kept_as_its_termination_action_says(prov, gce):
    """GCE's default instanceTerminationAction is STOP: a preempted Spot VM stays, TERMINATED, its disk billed. The
    provider asks for DELETE, so its Spot VMs go when preempted; the fake honours either."""
    ours = prov.create(req("k-spot", market="spot"))
    body = next(b for _, _, b in gce.insert_bodies if b["name"] == "fo-k-spot")
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    gce.plant(PROJECT, ZONE_A, "mine-spot-stop", labels={LABEL_FLEET: "gcp-test_fleet"}, spot=True)  # GCE's default
    gce.preempt(PROJECT, ZONE_A, "fo-k-spot")
    gce.preempt(PROJECT, ZONE_A, "mine-spot-stop")
    assert [i["status"] for i in gce.instances(PROJECT)] == ["STOPPING", "STOPPING"]  # GCE's soft off, up to 30 s
    gce.clock.advance(gce.preempt_grace)
    assert [(i["name"], i["status"]) for i in gce.instances(PROJECT)] == [("mine-spot-stop", "TERMINATED")]
    assert [(i.id.rsplit("/", 1)[1], i.state) for i in prov.observe([target()])] == [("mine-spot-stop", "stopping")]
    assert ours.id not in {i.id for i in prov.observe([target()])}


# ---------------------------------------------------------------- errors


def test_reads_ride_out_a_blip_and_give_up_on_an_outage(prov, gce, tmp_path):
    mine = prov.create(req("k-blip"))
    gce.fail_next(503, "backendError", method="GET", path_contains="/aggregated", count=2)
    assert [i.id for i in prov.observe([target()])] == [mine.id]  # retried by the client
    gce.fail_next(503, "backendError", method="GET", count=10_000)
    impatient = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={
        "endpoint": gce.url, "project": PROJECT, "retry_timeout": "1"}))
    for call in (lambda: impatient.observe([target()]), lambda: impatient.delete(mine)):
        with pytest.raises(TransientProviderError, match="503"):
            _within(10.0, call)


def _within(seconds: float, call):
    """Run call() but fail (not hang) if it takes longer than `seconds`."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed back to the test thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still retrying after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"])
def test_operation_capacity_errors_become_capacity_errors(prov, gce, code):
    gce.exhaust(ZONE_B, code)
    with pytest.raises(CapacityError, match=code) as e:
        prov.create(req("k-cap", market="spot", zone=ZONE_B))
    assert (e.value.cloud, e.value.zone, e.value.instance_type, e.value.market) == ("gcp", ZONE_B, "g2-standard-4", "spot")
    assert len(gce.requests("POST", "/wait")) == 1  # the error arrived in the finished operation
    assert gce.instances(PROJECT) == []
    assert prov.create(req("k-elsewhere", zone=ZONE_A)).zone == ZONE_A  # other zones are unaffected


@pytest.mark.parametrize("code, error", [("ZONE_RESOURCE_POOL_EXHAUSTED", CapacityError), ("QUOTA_EXCEEDED", QuotaError)])
def test_an_insert_answered_already_failed_is_that_stockout_or_quota_now(prov, gce, code, error):
    """GCE may answer an insert with its operation already DONE (clients check the answer's status before waiting), a
    stockout or an exhausted quota in its error. That failure is this insert's: it was read as a remembered one of an
    earlier try and inserted again, four requestIds a key and four keys a create, then "spent", so the zone was
    never cooled off and the planner never tried elsewhere."""
    gce.op_latency = 0  # answered DONE at insert
    gce.exhaust(ZONE_B, code)
    with pytest.raises(error, match=code) as e:
        prov.create(req("k-at-once", market="spot", zone=ZONE_B))
    if error is CapacityError:
        assert (e.value.cloud, e.value.zone, e.value.instance_type, e.value.market) == ("gcp", ZONE_B, "g2-standard-4", "spot")
    assert len(gce.requests("POST", f"/zones/{ZONE_B}/instances")) == 1 and gce.instances(PROJECT) == []


def test_a_remembered_failure_answered_done_is_tried_again_and_a_fresh_one_is_the_error(prov, gce):
    """The same key back after the zone's 30-minute cool-off, GCE still remembering its failed insert: that old
    failure says nothing of now, so the create inserts again; the new insert's own failure is the error."""
    gce.op_latency = 0  # answered DONE at insert
    gce.exhaust(ZONE_B)
    with pytest.raises(CapacityError):
        prov.create(req("k-back", zone=ZONE_B))
    gce.age(30 * 60)
    with pytest.raises(CapacityError):  # still short: the new insert's failure
        prov.create(req("k-back", zone=ZONE_B))
    gce.age(30 * 60)
    gce.replenish(ZONE_B)
    made = prov.create(req("k-back", zone=ZONE_B))
    assert made.state == "running" and len(gce.instances(PROJECT)) == 1
    rids = [q["requestId"][0] for _, _, q in gce.requests("POST", f"/zones/{ZONE_B}/instances")]
    assert len(rids) == 6 and rids[0] == rids[1] == rids[3] and rids[2] == rids[4] and len(set(rids)) == 3


@pytest.mark.parametrize("code", ["ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED"])
def test_a_failed_insert_gce_remembers_is_tried_again_not_answered_from_memory(prov, gce, code):
    """GCE answers a repeated requestId with the original operation for at least 60 minutes ("the server can check if
    original operation with the same request ID was received, and if so, will ignore the second request"), a failed
    one too. The same key comes back within that time (the next run after a quota was raised; the plan back in a zone
    after its 30-minute cool-off): answered from memory, it failed again with the old stockout or quota error, and
    nothing was tried. A remembered failure is tried again under a requestId of its own, and a retry of that is one
    instance."""
    gce.exhaust(ZONE_B, code)
    with pytest.raises((CapacityError, QuotaError)):
        prov.create(req("k-later", zone=ZONE_B))
    gce.replenish(ZONE_B)  # capacity is back, or the quota was raised
    gce.age(30 * 60)
    made = prov.create(req("k-later", zone=ZONE_B))
    assert made.state == "running" and made.zone == ZONE_B
    rids = [q["requestId"][0] for _, _, q in gce.requests("POST", f"/zones/{ZONE_B}/instances")]
    assert rids[0] == rids[1] != rids[2] and len(gce.insert_bodies) == 2
    assert prov.create(req("k-later", zone=ZONE_B)).id == made.id and len(gce.instances(PROJECT)) == 1


def test_a_raised_quota_lets_the_next_apply_launch_what_it_refused(gce, tmp_path):
    """The user's flow: an apply fails with QUOTA_EXCEEDED and says to raise the quota; once it is raised, the next
    apply (the same plan, its keys and requestIds too: nothing changed in the fleet) launches the fleet."""
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    for z in gce.zones:
        gce.exhaust(z, "QUOTA_EXCEEDED")
    with pytest.raises(ApplyError, match="raise it"):
        api.apply(cfg, provider="gcp", options=opts)
    for z in gce.zones:
        gce.replenish(z)
    gce.age(10 * 60)  # a quota increase takes minutes to be granted
    again = api.apply(cfg, provider="gcp", options=opts)
    assert again.report.ok and len(_ours(gce)) == len(again.plan.creates) == 5
    assert not api.plan(cfg, provider="gcp", options=opts).plan.has_changes


def test_an_operation_that_never_finishes_is_waited_for_once_and_the_next_run_uses_its_instance(gce, tmp_path):
    """An insert's operation not DONE after operation_timeout (default 900 s) was a transient error: apply inserted
    again under the same requestId, GCE answered with the same unfinished operation, and it was waited for again,
    four times over (an hour at the default, the apply holding its lock and deaf to a stop the while). It is waited
    for once; the create fails saying so, and the next run finds the instance and places work on it, launching
    nothing twice."""
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT, "operation_timeout": "1", "retry_window": "0"}
    gce.op_latency = 10**6  # no operation reaches DONE while the apply waits
    with pytest.raises(ApplyError, match="is not done after 1 s") as e:
        api.apply(cfg, provider="gcp", options=opts)
    assert "the next run sees how it ended and uses the instance it made" in str(e.value)
    inserts = gce.requests("POST", "/instances")
    assert len(inserts) == len(gce.insert_bodies) == 5, "an unfinished insert was sent again"
    # A plan made while they are still being made (PROVISIONING) sees them pending and launches nothing; so does an
    # observe once they are STAGING (from half-way).
    assert {i["status"] for i in gce.instances(PROJECT)} == {"PROVISIONING"}
    seen = api.plan(cfg, provider="gcp", options=opts)
    assert [i.state for i in seen.observed.instances] == ["pending"] * 5 and not seen.plan.creates
    gce.clock.advance(10**6 / 2)
    assert {i["status"] for i in gce.instances(PROJECT)} == {"STAGING"}
    fleet = seen.observed.instances[0].tags[TAG_FLEET]
    prov = GcpProvider(ProviderContext(fleet=fleet, state_dir=tmp_path / "p", options=opts))
    assert [i.state for i in prov.observe([])] == ["pending"] * 5
    gce.clock.advance(10**6)  # GCE gets there in the end
    res = api.apply(cfg, provider="gcp", options=opts)
    assert res.report.ok and not res.report.created and len(gce.insert_bodies) == 5
    assert {j.action for j in res.plan.jobs} == {"place"} and all(not i.startswith("+") for j in res.plan.jobs
                                                                    for i in j.instances)


def test_a_machine_type_missing_from_the_zone_is_a_capacity_error(prov, gce):
    gce.withhold(ZONE_A, "g2-standard-4")
    with pytest.raises(CapacityError, match="does not exist in zone") as e:
        prov.create(req("k-sku"))
    assert (e.value.zone, e.value.instance_type) == (ZONE_A, "g2-standard-4")


@pytest.mark.parametrize("status, reason, message, error", [
    (503, "backendError", "Backend Error", TransientProviderError),
    (429, "rateLimitExceeded", "Rate Limit Exceeded", TransientProviderError),
    (403, "rateLimitExceeded", "Rate Limit Exceeded", TransientProviderError),
    (503, "resourceExhausted", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: The zone 'projects/p/zones/us-central1-a' does "
     "not have enough resources available to fulfill the request.", CapacityError),
    (403, "quotaExceeded", "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1.", QuotaError),
    (403, "forbidden", "Required 'compute.instances.create' permission for 'projects/p/zones/us-central1-a/instances/x'",
     ProviderError),
])
def test_http_errors_are_mapped(prov, gce, status, reason, message, error):
    gce.fail_next(status, reason, message, method="POST", path_contains="/instances")
    with pytest.raises(ProviderError) as e:
        prov.create(req("k-http"))
    assert type(e.value) is error and message in str(e.value)
    assert prov.create(req("k-http")).state == "running"  # a retry with the same key goes through


def _inserts(gce: GceFake) -> int:
    return len([r for r in gce.requests("POST", "/instances") if r[1].endswith("/instances")])


@pytest.mark.parametrize("status, reason", [(429, "rateLimitExceeded"), (503, "backendError")])
def test_a_throttled_insert_is_retried_by_apply_alone(prov, gce, status, reason):
    """One layer owns an insert's retries: the compute client sends instances.insert once (its default has no retry;
    the provider passes none), and apply retries it with the same requestId. Under a refusal every time: apply's
    RETRIES inserts with no window, no more; the Retry-After GCE answered rides on the error."""
    from reconciler.apply import RETRIES, _retry

    gce.fail_next(status, reason, method="POST", path_contains="/instances", count=10**6, headers={"Retry-After": "0"})
    with pytest.raises(TransientProviderError, match=f"HTTP {status}") as e:
        _retry(lambda: prov.create(req("k-throttled")), "create", 0.0)
    assert _inserts(gce) == RETRIES and e.value.retry_after == 0.0 and not e.value.retried
    assert len({r[2]["requestId"][0] for r in gce.requests("POST", "/instances")}) == 1  # the same requestId every time


def test_apply_waits_at_least_the_retry_after_gce_answers(prov, gce):
    """A 429 or 503 with a Retry-After: apply's next try waits that long, not its own shorter backoff (0.2 s first)."""
    import time

    from reconciler.apply import _retry

    gce.fail_next(429, "rateLimitExceeded", method="POST", path_contains="/instances", count=1, headers={"Retry-After": "1"})
    started = time.monotonic()
    inst = _retry(lambda: prov.create(req("k-after")), "create", 0.0)
    assert time.monotonic() - started >= 1.0 and inst.state == "running" and _inserts(gce) == 2


def test_a_throttled_operation_wait_retries_its_reads_no_later_than_apply_s_window(gce, tmp_path):
    """Audit: an insert's zone operation wait retried its throttled reads for retry_timeout (30 s) inside every one of
    apply's tries, a try started near the end of apply's retry_window running up to 30 s past it. Here (retry_window 1 s,
    retry_timeout 4 s, every wait answered 429) apply's first try alone took 4 s, its 4 tries 16 s; the wait's reads
    are now retried only until apply's window ends (after it, a try's wait is sent once): 1 s, then apply's last tries,
    each one insert and one wait."""
    import time

    from reconciler.apply import RETRIES, _retry

    prov = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={
        "endpoint": gce.url, "project": PROJECT, "retry_window": "1", "retry_timeout": "4"}))
    gce.fail_next(429, "rateLimitExceeded", method="POST", path_contains="/wait", count=10**6)
    gce.op_latency = 10**6  # (and the operation still runs when apply's retries insert again: answered with it)
    started = time.monotonic()
    with pytest.raises(TransientProviderError, match="429|rateLimitExceeded"):
        _within(6.0, lambda: _retry(lambda: prov.create(req("k-wait")), "create", prov.retry_window_s))
    # the window, apply's pauses (0.2 + 0.4 + 0.8 s) and three short tries: ~2.6 s; 16 s before (slack for a loaded CI)
    assert time.monotonic() - started < 5.0
    assert _inserts(gce) == RETRIES and len(gce.requests("POST", "/wait")) >= RETRIES


@pytest.mark.parametrize("fault", ["throttled", "slow"])
def test_an_operation_wait_gives_up_at_operation_timeout_not_a_read_retry_or_a_wait_call_later(gce, tmp_path, fault):
    """operation_timeout bounds an insert's wait, start to DONE, but was checked only between wait calls: a wait call's
    read retries (retry_timeout) or the call itself (zoneOperations.wait blocks until the operation is DONE, up to
    ~2 minutes; the call's own timeout was 150 s) ran past it. With operation_timeout 1 s: 4 s of retried 429s, or 3 s
    blocked on a slow operation. Each wait call now gets what is left of operation_timeout."""
    import time

    prov = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={
        "endpoint": gce.url, "project": PROJECT, "operation_timeout": "1", "retry_timeout": "4"}))
    if fault == "throttled":
        gce.fail_next(429, "rateLimitExceeded", method="POST", path_contains="/wait", count=10**6)
    else:
        gce.op_latency = 3.0
    started = time.monotonic()
    with pytest.raises(ProviderError, match="not done after 1 s") as e:
        _within(6.0, lambda: prov.create(req("k-slow-op")))
    assert not isinstance(e.value, TransientProviderError)  # a retry would only wait for the same operation again
    assert time.monotonic() - started < 2.6  # ~1.1 s; 3-4 s before (slack for a loaded CI: a 1.8 s bound was tight)
    assert _inserts(gce) == 1


@pytest.mark.slow  # about 8 s: apply's pauses
def test_throttling_that_outlasts_apply_s_first_tries_but_clears_within_the_window_still_creates_every_instance(gce, tmp_path):
    """Throttling that clears within retry_window (300 s) still ends in every instance created, once each (requestId
    and name from the key): more refusals than apply's first RETRIES tries of every create."""
    from reconciler.apply import RETRIES

    cfg = _config(tmp_path)
    plan = api.plan(cfg, provider="gcp", options={"endpoint": gce.url, "project": PROJECT})
    creates = len(plan.plan.creates)
    refusals = creates * (RETRIES + 1)
    gce.fail_next(429, "rateLimitExceeded", method="POST", path_contains="/instances", count=refusals)
    res = api.apply(cfg, provider="gcp", options={"endpoint": gce.url, "project": PROJECT})
    assert res.report.ok and len(res.report.created) == creates, res.report.failures
    assert len(_ours(gce)) == creates and _inserts(gce) == creates + refusals


def test_a_request_gce_rejects_is_a_provider_error_not_capacity(prov, gce):
    with pytest.raises(ProviderError) as e:
        prov.create(req("k-bad", itype="G2-Standard-4"))  # machine type names are lower case
    assert type(e.value) is ProviderError and "HTTP 400" in str(e.value) and "machineType" in str(e.value)
    assert gce.instances(PROJECT) == []


def test_a_reservation_target_is_named_so_the_launch_takes_a_slot_of_it(prov, gce):
    """A Reservation's target (apply passes it as capacity_reservation) is a reservation that only instances naming it
    consume (specificReservationRequired): GCE's default affinity, ANY_RESERVATION, never takes one of its slots. Left
    unnamed, the instance ran outside it, billed on-demand, while the plan priced it at $0 as reserved."""
    gce.add_reservation(PROJECT, ZONE_A, "l4-block", "g2-standard-4", 2)
    plain = prov.create(req("k-plain"))  # no target: GCE's default affinity leaves a targeted-only reservation alone
    assert gce.reservation_in_use(PROJECT, ZONE_A, "l4-block") == 0 and plain.state == "running"
    reserved = prov.create(replace(req("k-res"), capacity_reservation="l4-block"))
    assert reserved.state == "running" and gce.reservation_in_use(PROJECT, ZONE_A, "l4-block") == 1
    assert stored(gce, instance_name("k-res"))["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name", "values": ["l4-block"]}
    # What GCE refuses, the fake refuses: a reservation that does not exist, or one any VM may take (not targetable).
    gce.add_reservation(PROJECT, ZONE_A, "open", "g2-standard-4", 2, specific=False)
    for key, target, why in (("k-none", "no-such", "Could not find the given reservation"),
                             ("k-open", "open", "specificReservationRequired is not set")):
        with pytest.raises(ProviderError, match=why):
            prov.create(replace(req(key), capacity_reservation=target))


def test_deleting_an_instance_busy_with_another_operation_is_retried_later(prov, gce):
    mine = prov.create(req("k-busy"))
    gce.fail_next(400, "resourceNotReady", f"The resource '{mine.id}' is not ready", method="DELETE")
    with pytest.raises(TransientProviderError, match="not ready"):
        prov.delete(mine)
    prov.delete(mine)
    assert gce.instances(PROJECT) == []


def test_gcp_prefixed_options_win_so_runs_mixing_providers_keep_theirs_apart(gce, tmp_path):
    """One `-o` set reaches every provider of a run: `gcp_endpoint` is this provider's even if `endpoint` is Azure's."""
    prov = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={
        "endpoint": "https://127.0.0.1:9/arm", "gcp_endpoint": gce.url, "project": "other", "gcp_project": PROJECT,
        "timeout": "soon", "gcp_timeout": "30"}))
    assert prov.create(req("k-mixed")).id.startswith(f"projects/{PROJECT}/") and prov.timeout == 30
    assert [i["name"] for i in gce.instances(PROJECT)] == ["fo-k-mixed"]


def test_bad_timeouts_are_rejected(gce, tmp_path):
    with pytest.raises(ProviderError, match="timeout='soon'"):
        GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={"endpoint": gce.url, "timeout": "soon"}))


def test_missing_credentials_are_an_actionable_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ProviderError, match="Application Default Credentials|GOOGLE_APPLICATION_CREDENTIALS"):
        GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={}))


def test_adc_supplies_the_default_project_and_its_secret_stays_out_of_errors(monkeypatch, tmp_path):
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
                               "client_secret": "adc-secret-never-printed", "refresh_token": "refresh-never-printed"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "adc-project")
    p = GcpProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={"timeout": "5"}))
    assert p.default_project == "adc-project" and p._project(target()) == "adc-project"
    assert p._project(target(project="pool-project")) == "pool-project"


# ---------------------------------------------------------------- the whole pipeline


def _config(tmp_path: Path) -> Path:
    return copy_example(tmp_path, "gcp-only")


def _ours(gce: GceFake) -> list[dict]:
    return [i for i in gce.instances(PROJECT) if i["labels"].get(LABEL_FLEET) == "gcp-fleet"]


def test_full_plan_apply_converge_against_the_fake(gce, tmp_path):
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    planted = gce.plant(PROJECT, ZONE_A, "hand-made", machine_type="a2-highgpu-1g")
    res = api.apply(cfg, provider="gcp", options=opts)
    assert res.report.ok and len(res.report.created) == len(res.plan.creates) == 5
    again = api.plan(cfg, provider="gcp", options=opts)
    assert not again.plan.has_changes
    # The fake's own state, read directly: exactly the instances the reconciler reported creating.
    ours = _ours(gce)
    assert {f"projects/{PROJECT}/zones/{_zone(i)}/instances/{i['name']}" for i in ours} == set(res.report.created.values())
    assert all(i["status"] == "RUNNING" for i in ours)
    assert sorted(i["scheduling"]["provisioningModel"] for i in ours) == ["SPOT", "SPOT", "STANDARD", "STANDARD", "STANDARD"]
    assert {i["labels"]["fleetops-pool"] for i in ours} == {"a100", "l4", "t4"}
    n1 = next(i for i in ours if i["labels"]["fleetops-pool"] == "t4")  # the N1 with its T4 attached
    assert n1["machineType"].endswith("/n1-standard-8") and n1["guestAccelerators"][0]["acceleratorType"].endswith(
        "/nvidia-tesla-t4")
    assert all(i["labels"]["fleetops-plan"] == res.plan.id for i in ours)
    status = api.read_status(cfg)
    assert sum(len(p["status"]["instances"]) for p in status["pools"].values()) == 5
    # Remove every job: our instances go, the hand-made one stays.
    for f in (cfg / "jobs").glob("*.yaml"):
        f.unlink()
    api.apply(cfg, provider="gcp", options=opts, allow_destroy=5)  # the example allows 4 at a time
    assert _ours(gce) == [] and not api.plan(cfg, provider="gcp", options=opts).observed.instances
    assert [(i["name"], i["status"], i["id"]) for i in gce.instances(PROJECT)] == [("hand-made", "RUNNING", planted["id"])]
    # Every permission its requests needed (observe, offerings, quotas, the image and network checks, inserts and their
    # operations, deletes) is in the README's custom role: the fake enforces IAM only for what a test deny()s (tests/cloud_iam.py).
    assert sorted(gce_calls(gce) - _readme_gcp_role()) == []


def test_a_reverted_config_applies_again(gce, tmp_path):
    """Remove every job, apply, restore them, apply: the fleet is as it was, so the plan (and every create key) is the
    one of the first apply, and GCE answers its requestIds with operations whose instances were deleted since."""
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    first = api.apply(cfg, provider="gcp", options=opts)
    jobs = {f: f.read_text() for f in (cfg / "jobs").glob("*.yaml")}
    for f in jobs:
        f.unlink()
    api.apply(cfg, provider="gcp", options=opts, allow_destroy=5)
    assert _ours(gce) == []
    for f, text in jobs.items():
        f.write_text(text)
    again = api.apply(cfg, provider="gcp", options=opts)
    assert again.plan.id == first.plan.id and again.report.ok
    assert len(_ours(gce)) == len(first.plan.creates) and all(i["status"] == "RUNNING" for i in _ours(gce))
    assert not api.plan(cfg, provider="gcp", options=opts).plan.has_changes


def test_stopped_instances_are_noted_left_alone_and_no_second_instance_is_launched_for_their_keys(gce, tmp_path):
    """Every instance stopped (TERMINATED): observe notes each (it may still be billed) and the plan is the first
    apply's again, its create keys too. GCE answers each with its stopped instance: apply fails those creates, naming
    the instance and what to do, instead of launching a second instance under the next key."""
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    first = api.apply(cfg, provider="gcp", options=opts)
    for i in _ours(gce):
        gce.stop_instance(PROJECT, _zone(i), i["name"])
    res = api.plan(cfg, provider="gcp", options=opts)
    assert not res.observed.instances and not res.plan.deletes
    for iid in first.report.created.values():
        assert any(n.startswith(f"{iid} exists but does not run") and "may still be billed" in n for n in res.plan.notes)
    with pytest.raises(ApplyError, match="exists but does not run .*no second one is launched; start it, or delete it"):
        api.apply(cfg, provider="gcp", options=opts)
    assert len(_ours(gce)) == len(first.report.created) and {i["status"] for i in _ours(gce)} == {"TERMINATED"}


def _zone(inst: dict) -> str:
    return inst["zone"].rsplit("/", 1)[1]


def test_a_stocked_out_zone_is_marked_short_and_the_next_run_goes_elsewhere(gce, tmp_path):
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    gce.exhaust(ZONE_A)
    with pytest.raises(ApplyError, match="zone marked short"):
        api.apply(cfg, provider="gcp", options=opts)
    res = api.apply(cfg, provider="gcp", options=opts)
    assert res.report.ok
    assert all(_zone(i) != ZONE_A for i in _ours(gce)) and len(_ours(gce)) == 5
    assert not api.plan(cfg, provider="gcp", options=opts).plan.has_changes


def test_cli_against_the_fake(gce, tmp_path):
    cfg = _config(tmp_path)
    runner = CliRunner()
    args = ["--provider", "gcp", "-o", f"endpoint={gce.url}", "-o", f"project={PROJECT}"]
    plan = runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode", *args])
    assert plan.exit_code == 2, plan.output
    applied = runner.invoke(app, ["apply", str(cfg), "--auto-approve", *args])
    assert applied.exit_code == 0, applied.output
    again = runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode", *args])
    assert again.exit_code == 0, again.output
    assert len(_ours(gce)) == 5


# ---------------------------------------------------------------- observe completeness (issue 22, item 4)


def test_the_fake_takes_only_the_documented_flat_filter_grammar():
    """GCE documents `filter` as one comparison, or a chain of parenthesised comparisons joined by AND/OR."""
    r = {"labels": {LABEL_FLEET: "x"}, "status": "RUNNING"}
    assert parse_filter(f'(labels.{LABEL_FLEET} = "x") AND (status != TERMINATED)')(r)
    assert parse_filter(f'(labels.{LABEL_FLEET} = "x") (status = STAGING) OR (status = RUNNING)')(r)
    assert not parse_filter("status != RUNNING")(r)
    with pytest.raises(ValueError, match="nested"):
        parse_filter(f'(labels.{LABEL_FLEET} = "x") AND ((status = RUNNING) OR (status = STAGING))')


def test_observe_stops_when_a_zone_is_unreachable_instead_of_missing_its_instances(prov, gce):
    """aggregatedList answers 200 with an UNREACHABLE warning for a zone it cannot reach; the instances there are
    unknown, not gone, and a plan made without them would replace them."""
    a, b = prov.create(req("k-a", zone=ZONE_A)), prov.create(req("k-b", zone=ZONE_B))
    assert {i.id for i in prov.observe([target()])} == {a.id, b.id}
    gce.cut_off(ZONE_B)
    with pytest.raises(IncompleteObservationError, match=f"zones/{ZONE_B}"):
        prov.observe([target()])
    gce.cut_off(ZONE_B, reachable=True)
    assert {i.id for i in prov.observe([target()])} == {a.id, b.id}


def test_an_unreachable_zone_stops_the_plan_and_changes_nothing(gce, tmp_path):
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    first = api.apply(cfg, provider="gcp", options=opts)
    assert first.report.ok and first.report.created
    zones = {i["zone"].rsplit("/", 1)[1] for i in gce.instances(PROJECT)}
    gce.cut_off(min(zones))
    before = gce.instances(PROJECT)
    with pytest.raises(IncompleteObservationError, match="unreachable|could not reach"):
        api.plan(cfg, provider="gcp", options=opts)
    with pytest.raises(IncompleteObservationError):
        api.apply(cfg, provider="gcp", options=opts)
    assert gce.instances(PROJECT) == before and not gce.requests("DELETE")


# ---------------------------------------------------------------- quotas and zone offerings (issue 22, item 2)


def test_an_exhausted_quota_is_a_quota_error_naming_it_not_a_capacity_error(prov, gce):
    gce.exhaust(ZONE_B, "QUOTA_EXCEEDED")  # "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
    with pytest.raises(QuotaError) as e:
        prov.create(req("k-quota", zone=ZONE_B))
    assert (e.value.cloud, e.value.quota, e.value.region) == ("gcp", "GPUS_ALL_REGIONS", "global")
    assert "console.cloud.google.com/iam-admin/quotas" in str(e.value) and PROJECT in str(e.value)
    assert not isinstance(e.value, CapacityError)


def test_a_quota_error_in_apply_cools_off_no_zone_and_says_raise_the_quota(gce, tmp_path):
    cfg = _config(tmp_path)
    opts = {"endpoint": gce.url, "project": PROJECT}
    for z in gce.zones:
        gce.exhaust(z, "QUOTA_EXCEEDED")
    with pytest.raises(ApplyError, match="GPUS_ALL_REGIONS") as e:
        api.apply(cfg, provider="gcp", options=opts)
    assert "raise it" in str(e.value)
    assert not api.plan(cfg, provider="gcp", options=opts).observed.short  # no zone marked short: it would not help


def test_offerings_are_what_each_zone_offers(prov, gce):
    """A plan may only buy a type in a zone that has it: machineTypes/acceleratorTypes aggregatedList say which."""
    t4 = "n1-standard-8+1xnvidia-tesla-t4"
    pool = target(types=("g2-standard-4", "a2-highgpu-1g", t4))
    gce.withhold(ZONE_A, "a2-highgpu-1g")
    gce.withhold(ZONE_B, "nvidia-tesla-t4")
    got = {(o.zone, o.instance_type) for o in prov.offerings([pool])}
    assert got == {(ZONE_A, "g2-standard-4"), (ZONE_B, "g2-standard-4"), (ZONE_B, "a2-highgpu-1g"), (ZONE_A, t4)}
    assert all("((" not in q["filter"][0] for _, _, q in gce.requests("GET", "/aggregated/machineTypes"))
    prov.offerings([pool])  # read once, then from the cache
    assert len(gce.requests("GET", "/aggregated/machineTypes")) == 1


def test_an_accelerator_the_zone_lacks_is_mapped_not_a_plain_error(prov, gce):
    gce.withhold(ZONE_A, "nvidia-tesla-t4")
    with pytest.raises(CapacityError, match="does not exist in zone") as e:
        prov.create(req("k-acc", itype="n1-standard-8+1xnvidia-tesla-t4"))
    assert (e.value.zone, e.value.instance_type) == (ZONE_A, "n1-standard-8+1xnvidia-tesla-t4")


def test_gpu_types_boot_a_driver_image_and_a_missing_image_is_a_plan_time_error(prov, gce):
    """Debian 12 has no NVIDIA driver: a GPU machine type without gcp.image boots a Deep Learning VM image (CPU types
    keep Debian). An image that does not exist is refused while offerings are read (plan time), naming the pool, and
    the fake answers an insert with it as GCE does (404), so no test can pass on an image the cloud would refuse."""
    prov.create(req("k-gpu"))
    prov.create(req("k-cpu", itype="n2-standard-16"))
    bodies = {b["name"]: b["disks"][0]["initializeParams"]["sourceImage"] for _, _, b in gce.insert_bodies}
    assert bodies == {"fo-k-gpu": DEFAULT_GPU_IMAGE, "fo-k-cpu": DEFAULT_IMAGE}
    assert prov.offerings([target()])  # both default images exist: nothing refused
    missing = target(name="l4-custom", image="projects/my-images/global/images/family/gpu-node")
    with pytest.raises(ProviderError, match=r"pool l4-custom: image projects/my-images/global/images/family/gpu-node does "
                                            r"not exist or project fleet-test-project cannot read it"):
        prov.offerings([missing])
    with pytest.raises(ProviderError, match="HTTP 404.*was not found"):
        prov.create(req("k-missing", pool=missing))
    gce.add_image("my-images", "gpu-node-v7", family="gpu-node")
    assert prov.offerings([missing]) and prov.create(req("k-custom", pool=missing)).state in ("pending", "running")


def test_a_pools_network_and_subnetwork_are_checked_at_plan_time(prov, gce):
    """Issue 22 item 6: a pool's network settings are validated where the API allows, before anything is inserted
    (networks.get, subnetworks.get; the fake, like GCE, refuses an insert whose NIC names a network or subnetwork
    that does not exist). Before, a mistyped name failed every insert of the apply."""
    gce.add_network(PROJECT, "ml-vpc")
    gce.add_subnetwork(PROJECT, "us-central1", "gpu", "ml-vpc")
    gce.add_network("host-project", "shared")
    gce.add_subnetwork("host-project", "us-central1", "gpu-shared", "shared")
    ok = [target(network="ml-vpc", subnetwork="gpu"), target(network="global/networks/default"),
          target(subnetwork="projects/host-project/regions/us-central1/subnetworks/gpu-shared")]
    assert all(prov.offerings([p]) for p in ok)
    assert prov.create(req("k-net", pool=ok[0])).state in ("pending", "running")
    for pool_settings, message in (
            ({"network": "ml-vcp"}, f"pool l4: network ml-vcp does not exist in project {PROJECT}"),
            ({"subnetwork": "gpus"}, "pool l4: subnetwork gpus does not exist in us-central1"),
            ({"subnetwork": "regions/europe-west4/subnetworks/gpu"}, "is not a subnetwork of the pool's region us-central1"),
            ({"network": "default", "subnetwork": "gpu"}, "pool l4: subnetwork gpu belongs to ml-vpc, not network default")):
        with pytest.raises(ProviderError, match=message):
            prov.offerings([target(**pool_settings)])
    with pytest.raises(ProviderError, match="The referenced network resource cannot be found"):
        prov.create(req("k-bad-net", pool=target(network="ml-vcp")))  # what an unchecked pool met at insert time


def test_a_mig_layout_is_labelled_at_launch_read_back_and_a_changed_one_replaces_the_instance(gce, tmp_path):
    """GCE label values allow no '.': the layout `3g.20gb-3g.20gb` is the label `3g_20gb-3g_20gb`, read back exact."""
    from tests.test_mig_drift import check_mig_drift_on, cloud_mig_config

    cfg = _config(tmp_path)

    def raw(i: Instance) -> str:
        return next(d for d in gce.instances(PROJECT) if i.id.endswith("/" + d["name"]))["labels"]["fleetops-mig"]

    check_mig_drift_on(cfg, "gcp", {"endpoint": gce.url, "project": PROJECT},
                       lambda layout, profile: cloud_mig_config(cfg, "a100", "a2-highgpu-1g", "A100", layout, profile),
                       ["3g.20gb", "3g.20gb"], ["2g.10gb", "2g.10gb", "2g.10gb"], ("3g.20gb", "2g.10gb"), raw,
                       lambda v: v.replace(".", "_"))


def test_every_catalog_mig_layout_fits_a_gce_label_exactly():
    """Every layout the config allows (catalog.mig_layout_error) of every GPU model the catalog partitions is at most
    63 characters of [a-z0-9_-] as a label and reads back as written (a hashed label would read as another layout:
    the instance would be replaced on every plan). The longest: seven 1g devices, 55 characters."""
    from itertools import combinations_with_replacement

    from providers.base import NO_MIG, mig_of, mig_tag
    from providers.catalog import mig_layout_error

    longest = 0
    for model in load_catalog().gpu_models.values():
        for n in range(1, 8):
            for layout in combinations_with_replacement(sorted(model.mig_profiles), n):
                if mig_layout_error(model, list(layout)) is None:
                    label = label_value(mig_tag(layout))
                    assert LABEL_VALUE_RE.fullmatch(label) and mig_of({"fleetops.io/mig": tag_value(label)}) == layout, label
                    longest = max(longest, len(label))
    assert 0 < longest <= 63
    assert mig_tag(()) == NO_MIG and mig_of({"fleetops.io/mig": tag_value(label_value(NO_MIG))}) == ()


# ---------------------------------------------------------------- operations that take time, as GCE's do


def test_a_wait_that_returns_before_the_operation_is_done_is_waited_again(prov, gce):
    """zoneOperations.wait is best effort: "the request might return before the default deadline is reached, or might
    return after zero seconds" (its reference). A create that took the wait's answer as the end would answer an
    instance still PROVISIONING as created, and miss an error the operation ends with; it waits again until DONE."""
    gce.op_latency = 0.3
    gce.early_waits(3)
    got = prov.create(req("k-early"))
    assert got.state == "running" and stored(gce, "fo-k-early")["status"] == "RUNNING"
    assert len(gce.requests("POST", "/wait")) >= 4  # the three early answers, then one that saw it DONE

    gce.exhaust(ZONE_B)
    gce.early_waits(3)
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):  # the error is in the DONE operation only
        prov.create(req("k-early-short", zone=ZONE_B))


def test_a_delete_of_an_instance_still_being_made_is_retried_until_gce_takes_it(prov, gce):
    """An instance is visible (PROVISIONING) while its insert runs, and GCE refuses to delete it then: 400
    resourceNotReady, "The resource ... is not ready" (tests/gce_fake.py). Such a delete (a second run's plan dropping
    an instance whose insert the first run gave up waiting on) is transient: apply retries it, and it lands once the
    instance is made. Taken as a plain 400 it failed the apply and left the instance to run on, unwanted."""
    import time

    from reconciler.apply import _retry

    opts = {"endpoint": gce.url, "project": PROJECT, "operation_timeout": "0.2"}
    slow = GcpProvider(ProviderContext(fleet=FLEET, state_dir=prov.ctx.state_dir, options=opts))
    gce.op_latency = 1.5
    with pytest.raises(ProviderError, match="is not done after 0.2 s"):
        slow.create(req("k-unwanted"))
    (pending,) = prov.observe([target()])
    assert pending.state == "pending" and stored(gce, "fo-k-unwanted")["status"] in ("PROVISIONING", "STAGING")
    started = time.monotonic()
    _within(6.0, lambda: _retry(lambda: prov.delete(pending), "delete", 5.0))
    assert gce.instances(PROJECT) == [] and time.monotonic() - started < 4.0
    refused = [r for r in gce.requests("DELETE", "/instances/fo-k-unwanted")]
    assert len(refused) >= 2  # refused while it was being made, then taken


# ---------------------------------------------------------------- permissions


def _readme_gcp_role() -> set[str]:
    """The permissions of the README's GCP custom role (its YAML block, `gcloud iam roles create --file`)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("### GCP", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    return set(yaml.safe_load(block)["includedPermissions"])


def test_the_readme_s_custom_role_grants_what_a_create_with_every_pool_setting_needs(prov, gce):
    """The fake withholds only what a test deny()s, so a README role missing a permission the provider needs is found only by a user, as a 403
    on a real project. A create with a service account, a subnetwork and the agent's startup script (setMetadata,
    setServiceAccount, actAs), and a VM gone as it starts (zoneOperations.list): every permission their requests need
    is in the README's role (the plan, apply and teardown of examples/gcp-only: test_full_plan_apply_converge...)."""
    pool = target(subnetwork="default", service_account="node@fleet-test-project.iam.gserviceaccount.com")
    prov.create(replace(req("k-agent", pool=pool), agent_state_url="s3://bus/fleet"))
    gce.delete_at_start(ZONE_B)
    with pytest.raises(ProviderError, match="deleted"):
        prov.create(req("k-gone", zone=ZONE_B))
    sent = gce_calls(gce)
    assert {"compute.instances.create", "compute.instances.setLabels", "compute.instances.setMetadata",
            "compute.instances.setServiceAccount", "iam.serviceAccounts.actAs", "compute.zoneOperations.list",
            "compute.subnetworks.use", "compute.disks.create", "compute.images.useReadOnly"} <= sent
    assert sorted(sent - _readme_gcp_role()) == [], sorted(sent)


def test_gce_refuses_metadata_past_its_limits_and_the_agent_s_startup_script_is_within_them(prov, gce):
    """GCE refuses an insert whose metadata breaks the API reference's `Items` rules: a value over 262144 bytes, a key
    not of [a-zA-Z0-9-_] or repeated. The fake took any metadata, so a node-agent startup script grown past the limit
    passed here and would have failed every create on GCE."""
    from google.api_core.exceptions import BadRequest

    request = replace(req("k-boot"), agent_state_url="s3://bus/" + "x" * 200)
    inst = prov.create(request)
    assert [i["key"] for i in stored(gce, inst.id.rsplit("/", 1)[-1])["metadata"]["items"]] == ["startup-script"]
    for key, value, why in [("startup-script", "#" * 262145, "over the limit of 262144 bytes"),
                            ("startup script", "#", "Must be a match of regex"),
                            ("startup-script", "#", "duplicate key")]:
        body = prov._resource(replace(request, key="k-big"), PROJECT, "fo-k-big")
        items = body.metadata.items if why == "duplicate key" else []
        body.metadata = type(body.metadata)(items=[*items, type(body.metadata.items[0])(key=key, value=value)])
        with pytest.raises(BadRequest, match=why):
            prov.instances.insert_unary(project=PROJECT, zone=ZONE_A, instance_resource=body)
    assert [i["name"] for i in gce.instances(PROJECT)] == [inst.id.rsplit("/", 1)[-1]]


# -- apply's permission check (instances.testIamPermissions; the fake refuses what deny() withholds) -------------------
def test_an_apply_that_may_not_delete_what_it_replaces_is_refused_before_any_insert(gce, tmp_path):
    """Make before break: the replacements are inserted, then the old instances deleted. Without
    compute.instances.delete every delete failed after the inserts (GCE's 403 forbidden): old and new both ran,
    billed. Refused before the first insert, naming the permission and the instances; nothing changed."""
    from reconciler.errors import ReconcileError

    cfg, opts = _config(tmp_path), {"endpoint": gce.url, "project": PROJECT}
    assert api.apply(cfg, provider="gcp", options=opts).report.ok
    before, inserts = {i["name"]: i["status"] for i in _ours(gce)}, len(gce.insert_bodies)
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("instance_types: [g2-standard-4, g2-standard-48]", "instance_types: [g2-standard-48]"))
    replacing = api.plan(cfg, provider="gcp", options=opts).plan
    assert replacing.creates and replacing.deletes
    gce.deny("compute.instances.delete")
    with pytest.raises(ReconcileError, match="(?s)refusing to apply; nothing was changed:.*may not compute.instances.delete"
                                             f".*projects/{PROJECT}/zones/") as e:
        api.apply(cfg, provider="gcp", options=opts)
    assert e.value.actions == ("compute.instances.delete",)
    assert {i["name"]: i["status"] for i in _ours(gce)} == before and len(gce.insert_bodies) == inserts
    assert not gce.requests("DELETE")
    gce.withheld.clear()  # allowed again, it applies
    assert api.apply(cfg, provider="gcp", options=opts).report.ok


def test_a_teardown_of_many_asks_one_instance_per_zone_and_a_few_each(gce, tmp_path):
    """Past PERMISSION_ASKS instances to delete the check asks one per zone (a read each would spend minutes of GCE's
    per-project read rate before a teardown); up to it, each one, so an instance's own policy is seen too."""
    from providers.gcp import PERMISSION_ASKS
    from reconciler.errors import AccessDeniedError

    prov = GcpProvider(ProviderContext(fleet="gcp-fleet", state_dir=tmp_path, options={"endpoint": gce.url, "project": PROJECT}))

    def planted(n: int, zone: str) -> Instance:
        gce.plant(PROJECT, zone, f"vm-{zone[-1]}-{n}")
        return Instance(id=f"projects/{PROJECT}/zones/{zone}/instances/vm-{zone[-1]}-{n}", provider="gcp", cloud="gcp",
                        region="us-central1", zone=zone, instance_type="g2-standard-4", market="on-demand", state="running",
                        pool="l4")

    few = [planted(n, ZONE_A) for n in range(3)]
    many = few + [planted(n, z) for z in (ZONE_A, ZONE_B) for n in range(3, 3 + PERMISSION_ASKS // 2)]
    prov.preflight([], few, [])
    assert len(gce.requests("POST", "/testIamPermissions")) == 3
    prov.preflight([], many, [])
    assert len(gce.requests("POST", "/testIamPermissions")) == 3 + 2
    gce.deny("compute.instances.delete")
    with pytest.raises(AccessDeniedError, match="may not compute.instances.delete.*and 2 more"):
        prov.preflight([], few + many[-2:], [])
    assert not gce.requests("DELETE")
