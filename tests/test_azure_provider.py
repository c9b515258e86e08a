"""The Azure provider with the real azure-mgmt-compute client against a local ARM fake over HTTPS."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import json

import pytest
from typer.testing import CliRunner

from providers.azure import AzureProvider, azure_tag_name, logical_tags, parse_image, vm_name, zone_number
from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, CreateRequest, PoolTarget, ProviderContext, ownership_tags
from providers.catalog import load_catalog
from reconciler import api
from reconciler.cli import app
from reconciler.errors import ApplyError, CapacityError, OwnershipError, ProviderError, QuotaError, TransientProviderError
from tests.cloud_iam import ENCLOSING, arm_calls, scope_kind
from tests.conftest import ARM_RESOURCE_GROUP, ARM_SUBNET
from tests.conftest import arm_options as options
from tests.fleetkit import copy_example

FLEET = "az-fleet"
RG = ARM_RESOURCE_GROUP
SUBNET = ARM_SUBNET  # eastus, in the fake's subscription
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOY38JP6o2SAHiqpcdRC9ZRlU//IINSrl2JLx0Ao/SPq test"


@pytest.fixture
def prov(arm, tmp_path):
    return AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm)))


def target(name="t4", zones=("eastus-1", "eastus-2"), types=("Standard_NC4as_T4_v3", "Standard_NC64as_T4_v3"), **settings):
    s = {"subscription_id": None, "resource_group": RG, "image": None, "subnet_id": SUBNET, "admin_username": "fleetops",
         "ssh_public_key": SSH_KEY, **settings}
    return PoolTarget(name=name, cloud="azure", region="eastus", zones=zones, instance_types=types, settings=s)


def req(key, market="on-demand", zone="eastus-1", itype="Standard_NC4as_T4_v3", fleet=FLEET, pool=None):
    return CreateRequest(key=key, pool=pool or target(), zone=zone, instance_type=itype, market=market,
                         max_price=0.526 if market == "spot" else None, tags=ownership_tags(fleet, "t4", key))


def ours(pool="t4", fleet=FLEET):
    return {azure_tag_name(TAG_FLEET): fleet, azure_tag_name(TAG_POOL): pool}


# -- create / observe / delete --------------------------------------------------------------------
def test_create_observe_delete_spot_and_regular(prov, arm):
    regular = prov.create(req("k-od"))
    spot = prov.create(req("k-spot", market="spot", zone="eastus-2"))
    assert (regular.market, regular.zone, regular.region, regular.instance_type, regular.pool, regular.state) == (
        "on-demand", "eastus-1", "eastus", "Standard_NC4as_T4_v3", "t4", "running")
    assert (spot.market, spot.zone) == ("spot", "eastus-2")
    assert regular.id.endswith(f"/virtualMachines/{vm_name(FLEET, 'k-od')}") and regular.launched_at

    # What ARM stored, read from the fake directly.
    vms = arm.snapshot()
    raw = vms[vm_name(FLEET, "k-spot")]
    p = raw["properties"]
    assert raw["zones"] == ["2"] and raw["location"] == "eastus" and p["provisioningState"] == "Succeeded"
    assert (p["priority"], p["evictionPolicy"], p["billingProfile"]) == ("Spot", "Delete", {"maxPrice": 0.526})
    assert vms[vm_name(FLEET, "k-od")]["properties"]["priority"] == "Regular"
    assert "billingProfile" not in vms[vm_name(FLEET, "k-od")]["properties"]
    assert raw["tags"] == {"fleetops.io_fleet": FLEET, "fleetops.io_pool": "t4", "fleetops.io_create-key": "k-spot"}
    assert p["storageProfile"]["imageReference"] == {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204",
                                                     "version": "latest"}  # a GPU size: the image with the NVIDIA driver
    assert p["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    linux = p["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert linux["ssh"]["publicKeys"] == [{"path": "/home/fleetops/.ssh/authorized_keys", "keyData": SSH_KEY}]
    nic = p["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["deleteOption"] == "Delete" and nic["ipConfigurations"][0]["properties"]["subnet"] == {"id": SUBNET}
    # Each long-running operation was polled to its end (how many polls that took is the fake's latency's affair).
    assert len(arm.requests("GET", "/operations/")) >= 2 and all(op.done and op.polls for op in arm.ops.values())

    seen = {i.id: i for i in prov.observe([target()])}
    assert set(seen) == {regular.id, spot.id}  # the fake lists ids with an upper-cased group: ids stay stable
    assert seen[spot.id].tags[TAG_CREATE_KEY] == "k-spot" and seen[spot.id].tags[TAG_FLEET] == FLEET
    assert seen[spot.id].market == "spot" and seen[regular.id].zone == "eastus-1"

    prov.delete(spot)
    assert vm_name(FLEET, "k-spot") not in arm.snapshot()
    prov.delete(spot)  # already gone: not an error
    assert [i.id for i in prov.observe([target()])] == [regular.id]


def test_retry_with_the_same_key_yields_one_vm(prov, arm):
    first = prov.create(req("k-same"))
    again = prov.create(req("k-same"))
    assert again.id == first.id
    assert len(arm.snapshot()) == 1 and len(arm.requests("PUT")) == 1
    assert [i.id for i in prov.observe([target()])] == [first.id]


def test_a_reservation_target_associates_the_vm_with_its_capacity_reservation_group(prov, arm):
    """A Reservation's target (apply passes it as capacity_reservation) is a capacity reservation group, whose reserved
    capacity a VM takes only when its create names the group (properties.capacityReservation.capacityReservationGroup).
    Left unnamed, the VM ran outside the reservation, billed, while the plan priced it at $0 as reserved. The target is
    the group's name (in the pool's resource group) or its id as Azure's guide writes it (no leading '/')."""
    arm.add_capacity_reservation_group("t4-crg")
    prov.create(req("k-plain"))
    assert arm.associated_vms("t4-crg") == []  # naming no group associates the VM with none
    by_name = prov.create(replace(req("k-res"), capacity_reservation="t4-crg"))
    group_id = f"subscriptions/{arm.subscription}/resourceGroups/{RG}/providers/Microsoft.Compute/capacityReservationGroups/t4-crg"
    by_id = prov.create(replace(req("k-res-id", zone="eastus-2"), capacity_reservation=group_id))
    assert by_name.state == by_id.state == "running"
    assert arm.associated_vms("t4-crg") == sorted([vm_name(FLEET, "k-res"), vm_name(FLEET, "k-res-id")])
    with pytest.raises(ProviderError, match="was not found"):  # ARM refuses a group that does not exist
        prov.create(replace(req("k-none"), capacity_reservation="no-such-crg"))


def test_a_failed_earlier_attempt_is_cleared_and_retried(arm, tmp_path):
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, max_retries="0")))
    arm.exhaust("eastus", "1")
    arm.fail_next(500, "InternalServerError", "boom", method="DELETE")  # the clean-up after the failure fails too
    with pytest.raises(CapacityError):
        prov.create(req("k-retry"))
    name = vm_name(FLEET, "k-retry")
    assert arm.snapshot()[name]["properties"]["provisioningState"] == "Failed"
    # A VM that never allocated is not a live instance, but it exists: reported (`stopping`), not capacity
    assert [i.state for i in prov.observe([target()])] == ["stopping"]
    arm.replenish("eastus", "1")
    inst = prov.create(req("k-retry"))
    assert inst.state == "running" and arm.snapshot()[name]["properties"]["provisioningState"] == "Succeeded"
    assert len(arm.requests("PUT")) == 2


# -- ownership ------------------------------------------------------------------------------------
def test_unmanaged_and_foreign_vms_are_invisible_and_untouchable(prov, arm):
    mine = prov.create(req("k-mine"))
    arm.plant("bare-vm")
    arm.plant("their-vm", tags=ours(fleet="someone-else"))
    arm.plant("old-style", tags={TAG_FLEET.replace("/", "-"): FLEET})  # not our tag name
    assert [i.id for i in prov.observe([target()])] == [mine.id]
    for name in ("bare-vm", "their-vm", "old-style"):
        with pytest.raises(OwnershipError, match="refusing to delete"):
            prov.delete(replace(mine, id=mine.id.rsplit("/", 1)[0] + "/" + name))
        assert arm.snapshot()[name]["properties"]["provisioningState"] == "Succeeded"
    assert arm.requests("DELETE") == []


def test_create_never_overwrites_a_vm_it_does_not_own(prov, arm):
    name = vm_name(FLEET, "k-taken")
    arm.plant(name, tags=ours(fleet="someone-else"))
    with pytest.raises(OwnershipError, match="not ours"):
        prov.create(req("k-taken"))
    assert arm.snapshot()[name]["tags"] == ours(fleet="someone-else") and arm.requests("PUT") == []


# -- errors ---------------------------------------------------------------------------------------
def test_zonal_allocation_failure_is_a_capacity_error_and_leaves_nothing_behind(prov, arm):
    arm.exhaust("eastus", "1")
    with pytest.raises(CapacityError) as e:
        prov.create(req("k-cap", market="spot"))
    assert (e.value.cloud, e.value.zone, e.value.instance_type, e.value.market) == (
        "azure", "eastus-1", "Standard_NC4as_T4_v3", "spot")
    assert "ZonalAllocationFailed" in str(e.value) and "fake-for-tests" not in str(e.value)
    assert arm.snapshot() == {}  # the Failed VM Azure keeps was deleted
    assert prov.create(req("k-cap-2", zone="eastus-2")).zone == "eastus-2"


@pytest.mark.parametrize("answer", ["operation", "body"])
def test_a_create_answered_already_failed_is_a_capacity_error_and_leaves_nothing_behind(prov, arm, answer):
    """ARM may answer a VM's PUT with the VM already provisioningState Failed (200, not 201 Creating): with its
    operation's URL, whose first poll says why, or with none, the resource's state all there is to go on. Either is
    this create's failed allocation in that zone, and the Failed VM Azure keeps is removed."""
    arm.failed_at_once = answer
    arm.exhaust("eastus", "1")
    with pytest.raises(CapacityError) as e:
        prov.create(req("k-at-once", market="spot"))
    assert (e.value.zone, e.value.instance_type, e.value.market) == ("eastus-1", "Standard_NC4as_T4_v3", "spot")
    assert arm.snapshot() == {} and len(arm.requests("PUT")) == 1


@pytest.mark.parametrize("status,code,message,expected", [
    (409, "SkuNotAvailable", "The requested size for resource is currently not available in location 'eastus' zones '1'.",
     CapacityError),
    (409, "OperationNotAllowed", "Operation could not be completed as it results in exceeding approved LowPriorityCores "
                                 "quota. Current Limit: 4, Current Usage: 4, Additional Required: 4", QuotaError),
    (409, "QuotaExceeded", "Quota exceeded for standardNCASv3_T4Family.", QuotaError),
    (400, "InvalidParameter", "The value of parameter imageReference is invalid.", ProviderError),
    (409, "OperationNotAllowed", "The VM is being updated.", ProviderError),
    (429, "TooManyRequests", "The request is being throttled.", TransientProviderError),
    # Compute's own throttling ("Troubleshooting API throttling errors"): 429 with OperationNotAllowed, not a quota
    (429, "OperationNotAllowed", "The server rejected the request because too many requests have been received for this "
                                 "subscription.", TransientProviderError),
    (503, "ServiceUnavailable", "The service is unavailable.", TransientProviderError),
])
def test_arm_errors_map_to_reconciler_errors(arm, tmp_path, status, code, message, expected):
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, max_retries="0")))
    arm.fail_next(status, code, message, method="PUT", headers={"Retry-After": "1"} if status == 429 else None)
    with pytest.raises(ProviderError) as e:
        prov.create(req("k-err"))
    assert type(e.value) is expected and code in str(e.value)
    assert arm.snapshot() == {}


def test_a_rejected_token_is_an_authentication_error(prov, arm):
    arm.token = "rotated"
    with pytest.raises(ProviderError, match="not authenticated") as e:
        prov.observe([target()])
    assert "fake-for-tests" not in str(e.value) and "rotated" not in str(e.value)


def test_the_test_credential_needs_a_local_https_endpoint(tmp_path):
    with pytest.raises(ProviderError, match="local ARM fake"):
        AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={"credential": "fake-for-tests"})).observe(
            [target(subscription_id="s")])
    with pytest.raises(ProviderError, match="https"):
        AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={"endpoint": "http://127.0.0.1:1"}))


def test_a_credential_option_that_is_not_the_test_ones_is_refused_without_echoing_it(tmp_path, arm):
    """`-o credential=` takes only fake-for-tests; anything else is refused when the provider is made, before any
    call, and the value is not shown: a client secret passed there (the option's name invites it) was echoed whole,
    `azure: unknown credential 'SECRET...'`, in the CLI's error and the controller's log (secrets audit)."""
    for given in ({"credential": "PLANTED-client-secret~Xq8"}, {"azure_credential": "PLANTED-client-secret~Xq8"}):
        with pytest.raises(ProviderError, match="credential takes only fake-for-tests") as e:
            AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=given))
        assert "PLANTED" not in str(e.value) and "AZURE_CLIENT_SECRET" in str(e.value)
    assert arm.snapshot() == {}


def test_pool_settings_are_checked_before_any_call(prov, arm):
    with pytest.raises(ProviderError, match="subnet_id"):
        prov.create(req("k", pool=target(subnet_id=None)))
    with pytest.raises(ProviderError, match="ssh_public_key"):
        prov.create(req("k", pool=target(ssh_public_key=None)))
    with pytest.raises(ProviderError, match="URN"):
        prov.create(req("k", pool=target(image="ubuntu")))
    assert arm.log == []


# -- observe and offerings ------------------------------------------------------------------------
def test_observe_follows_next_link(prov, arm):
    for n in range(45):
        arm.plant(f"bulk-{n:03d}", tags={**ours(), azure_tag_name(TAG_CREATE_KEY): f"k{n}"}, zone=str(n % 3 + 1),
                  priority="Spot" if n % 2 else None)
    for n in range(7):
        arm.plant(f"stranger-{n}")
    seen = prov.observe([target()])
    assert len(seen) == 45 and {i.zone for i in seen} == {"eastus-1", "eastus-2", "eastus-3"}
    assert sum(i.market == "spot" for i in seen) == 22
    assert len(arm.requests("GET", f"/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines?")) == 3  # 52 VMs in pages of 20
    assert len(arm.requests("GET", "statusOnly=true")) == 3  # their power states: the subscription's list, paged alike


def test_a_silent_arm_connection_ends_at_the_request_timeout_not_azure_cores_300_s(arm, tmp_path):
    """azure-core waits 300 s to connect and 300 s for each read, and retries a timed-out read: an ARM connection that
    went silent held a plan or an apply 300 s a try, 20 minutes at max_retries 3. Option `timeout` (60 s) bounds
    one request now; the timeout is transient (apply tries again in its window), and the next request goes through."""
    import time

    p = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options={**options(arm), "timeout": "0.5",
                                                                                "max_retries": "1"}))
    arm.plant("vm-1", tags={**ours(), azure_tag_name(TAG_CREATE_KEY): "k1"})
    arm.stall(3.0, method="GET", count=2)  # the list and the SDK's one retry of it (0.5 s each: the bound below has slack for a loaded CI)
    t0 = time.monotonic()
    with pytest.raises(TransientProviderError, match="Read timed out"):
        p.observe([target()])
    assert time.monotonic() - t0 < 4.5  # before: 6 s (two silent reads of 3 s, answered in the end); now ~1 s
    assert arm._stalls[0][2] == 0  # (both stalled: the first try and the SDK's retry)
    assert len(p.observe([target()])) == 1


def test_observe_covers_every_resource_group_of_the_pools_and_options(arm, tmp_path):
    arm.plant("in-other", resource_group="other-team", tags=ours())
    arm.plant("in-main", tags=ours())
    base = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm)))
    assert [i.id.rsplit("/", 1)[1] for i in base.observe([target()])] == ["in-main"]
    assert {i.id.rsplit("/", 1)[1] for i in base.observe([target(), target("b", resource_group="Other-Team")])} == {
        "in-main", "in-other"}
    extra = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, resource_groups="other-team")))
    assert {i.id.rsplit("/", 1)[1] for i in extra.observe([target()])} == {"in-main", "in-other"}


def test_offerings_come_from_the_catalog(prov, arm):
    offs = {(o.zone, o.instance_type): o for o in prov.offerings([target(), target("dup")])}
    assert len(offs) == 4
    cat = load_catalog().offering("azure", "eastus", "eastus-2", "Standard_NC64as_T4_v3")
    assert offs[("eastus-2", "Standard_NC64as_T4_v3")] == cat
    assert (cat.gpus, cat.gpu_type, cat.on_demand_price) == (4, "T4", 4.352) and cat.spot_price < cat.on_demand_price
    # Prices read nothing; zones: one SKU list; the pools' one image: one look at its versions, their one subnet: one
    # read of it and of its VNet (once for both pools).
    assert [path.split("?")[0].rsplit("/", 1)[1] for _, path in arm.log] == ["versions", "gpu", "fleetops-vnet", "skus"]


# -- names and tags -------------------------------------------------------------------------------
def test_vm_names_are_deterministic_valid_and_distinct():
    assert vm_name("azure-fleet", "dea60f2355d2-0001") == "azure-fleet-dea60f2355d2-0001"
    odd = ["K/1", "k_1", "k-1", "x" * 200, "x" * 201, "", "ünï"]
    names = [vm_name("my.fleet", k) for k in odd]
    assert len(set(names)) == len(odd)
    for n in names:
        assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?", n), n
    assert vm_name("my.fleet", "K/1") == names[0]


def test_tag_names_and_zones_map_both_ways():
    assert azure_tag_name(TAG_FLEET) == "fleetops.io_fleet"
    logical = ownership_tags(FLEET, "t4", "k") | {"fleetops.io/plan": "p1", "team": "ml"}
    azure = {azure_tag_name(k): v for k, v in logical.items()}
    assert not any(set(k) & set('<>%&\\?/') for k in azure)
    assert logical_tags(azure) == logical
    assert zone_number("eastus", "eastus-3") == "3"
    with pytest.raises(ProviderError):
        zone_number("eastus", "westeurope-1")
    assert parse_image("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/x/images/y") == {
        "id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/x/images/y"}


# -- the whole pipeline ---------------------------------------------------------------------------
def _config(tmp_path: Path) -> Path:
    return copy_example(tmp_path, "azure-only")


def test_full_plan_apply_converge_against_the_fake(arm, tmp_path):
    cfg = _config(tmp_path)
    opts = options(arm)
    arm.plant("hand-made", tags={"owner": "alice"})
    res = api.apply(cfg, provider="azure", options=opts)
    assert res.report.ok and len(res.report.created) == len(res.plan.creates) == 4
    again = api.plan(cfg, provider="azure", options=opts)
    assert not again.plan.has_changes
    assert {i.id for i in again.observed.instances} == set(res.report.created.values())

    # Independently: the fake holds exactly our four VMs plus the hand-made one.
    vms = arm.snapshot()
    fleet_vms = {n: v for n, v in vms.items() if v["tags"].get("fleetops.io_fleet") == "azure-fleet"}
    assert set(vms) - set(fleet_vms) == {"hand-made"} and len(fleet_vms) == 4
    assert all(v["properties"]["provisioningState"] == "Succeeded" for v in fleet_vms.values())
    sizes = sorted((v["properties"]["hardwareProfile"]["vmSize"], v["properties"]["priority"]) for v in fleet_vms.values())
    assert sizes == [("Standard_NC24ads_A100_v4", "Regular")] * 2 + [("Standard_NC4as_T4_v3", "Regular"),
                                                                       ("Standard_NC4as_T4_v3", "Spot")]
    assert {v["properties"]["storageProfile"]["imageReference"]["offer"] for v in fleet_vms.values()} == {"ubuntu-hpc"}

    # Remove every job: our VMs go, the hand-made one stays.
    for f in (cfg / "jobs").glob("*.yaml"):
        f.unlink()
    api.apply(cfg, provider="azure", options=opts)
    assert not api.plan(cfg, provider="azure", options=opts).observed.instances
    assert set(arm.snapshot()) == {"hand-made"}
    # Every action its requests needed, at the scope ARM checks it (the SKU list, the power-state list and the image
    # check at the subscription's), is granted by the README's roles: the fake enforces RBAC only once a test assigns a role (tests/cloud_iam.py).
    assert _not_granted(arm_calls(arm)) == []


def _readme_azure_roles() -> dict[str, set[str]]:
    """Scope kind -> the actions the README's Azure custom roles (its JSON block) grant there."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("### Azure", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    out: dict[str, set[str]] = {}
    for role in json.loads(block):
        for scope in role["AssignableScopes"]:
            out.setdefault(scope_kind(scope), set()).update(role["Actions"])
    return out


def _not_granted(sent: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (action, scope kind) pairs no README role grants at that scope or one enclosing it."""
    roles = _readme_azure_roles()
    return sorted((a, k) for a, k in sent if not any(a in roles.get(s, ()) for s in ENCLOSING[k]))


def test_the_readme_s_roles_grant_what_a_create_with_every_setting_needs(prov, arm):
    """The fake enforces only the roles a test assigns, so a README role missing an action the provider needs is found only by a user, as a 403 on
    a real subscription. A create with the agent's customData and a capacity reservation group, and its delete: every
    action their requests need (the NIC and disk Compute makes and removes, the subnet join, the group's deploy) is
    granted at its scope by the README's roles (the plan, apply and teardown of examples/azure-only:
    test_full_plan_apply_converge...)."""
    arm.add_capacity_reservation_group("t4-crg")
    inst = prov.create(replace(req("k-all"), capacity_reservation="t4-crg", agent_state_url="s3://bus/fleet"))
    prov.delete(inst)
    sent = arm_calls(arm)
    assert {("Microsoft.Compute/virtualMachines/write", "resource group"),
            ("Microsoft.Network/virtualNetworks/subnets/join/action", "subnet"),
            ("Microsoft.Compute/capacityReservationGroups/deploy/action", "resource group"),
            ("Microsoft.Network/networkInterfaces/delete", "resource group")} <= sent
    assert _not_granted(sent) == []


def test_a_vm_deleted_outside_is_replaced_and_nothing_the_fleet_does_not_own_is_touched(arm, tmp_path):
    """A regular VM of the fleet deleted outside it (the portal, another tool): observe no longer sees it, the plan
    creates one replacement for it and deletes nothing, and the VMs the fleet does not own (one made by hand, one
    tagged for another fleet) are left as they were."""
    cfg = _config(tmp_path)
    opts = options(arm)
    first = api.apply(cfg, provider="azure", options=opts)
    assert first.report.ok
    arm.plant("hand-made", tags={"owner": "alice"})
    arm.plant("other-fleet", tags={azure_tag_name(TAG_FLEET): "another-fleet"})
    victim = next(n for n, v in arm.snapshot().items()
                  if v["tags"].get(azure_tag_name(TAG_FLEET)) == "azure-fleet" and v["properties"]["priority"] == "Regular")
    arm.evict(victim)  # deleted, as a delete from outside leaves it: gone from ARM
    res = api.plan(cfg, provider="azure", options=opts)
    assert victim not in {i.id.rsplit("/", 1)[1] for i in res.observed.instances}
    assert len(res.plan.creates) == 1 and not res.plan.deletes
    again = api.apply(cfg, provider="azure", options=opts)
    assert again.report.ok and len(again.report.created) == 1
    assert not api.plan(cfg, provider="azure", options=opts).plan.has_changes
    vms = arm.snapshot()
    assert {"hand-made", "other-fleet"} <= set(vms)
    assert sum(v["tags"].get(azure_tag_name(TAG_FLEET)) == "azure-fleet" for v in vms.values()) == len(first.plan.creates)


@pytest.mark.parametrize("code, message", [
    ("AnotherOperationInProgress", "Operation 'PutVirtualMachine' is not allowed since the Virtual Machine is marked for "
                                   "another operation in progress."),
    ("OperationPreempted", "Operation execution has been preempted by a more recent operation."),
])
def test_a_busy_or_preempted_vm_operation_is_retried_until_the_apply_lands(arm, tmp_path, code, message):
    """Issue 22 item 3: ARM answers 409 AnotherOperationInProgress (the VM or its NIC is busy) or OperationPreempted (a
    platform operation took precedence) and the same PUT succeeds later; the SDK does not retry a 409, so apply does,
    with backoff (the provider's retry_window), for creates and deletes alike, and each VM is created once."""
    cfg = _config(tmp_path)
    opts = options(arm)
    arm.fail_next(409, code, message, method="PUT", count=3)
    res = api.apply(cfg, provider="azure", options=opts)
    assert res.report.ok and len(res.report.created) == len(res.plan.creates) == 4, res.report.failures
    assert len(arm.snapshot()) == 4 and len(arm.requests("PUT", "/virtualMachines/")) == 4 + 3
    for f in (cfg / "jobs").glob("*.yaml"):
        f.unlink()
    arm.fail_next(409, code, message, method="DELETE", count=2)
    res = api.apply(cfg, provider="azure", options=opts, allow_destroy=10)
    assert res.report.ok and len(res.report.deleted) == 4 and arm.snapshot() == {}


THROTTLED = (429, "TooManyRequests", "The request is being throttled.")


@pytest.mark.parametrize("status, code, message, retry_after", [
    (*THROTTLED, "0"),  # ARM's throttling answer names its wait (0 s here, to keep the test short)
    (503, "ServiceUnavailable", "The service is temporarily unavailable.", None),
])
def test_a_throttled_create_is_sent_once_per_apply_try_not_retried_by_the_sdk_inside_it(arm, tmp_path, status, code,
                                                                                        message, retry_after):
    """Audit (one retry policy per call, as for AWS): azure-core's RetryPolicy (1 + max_retries tries, 4 by default,
    honouring Retry-After) ran inside apply's retry of each create, so under a 429 or 503 every time a create made 4
    PUTs per apply try: 16 with no retry window at all (64 PUTs and 29 s for examples/azure-only's 4 creates). Now
    the PUT, and the GET that starts each try, are sent once and apply alone retries them; the error carries the
    Retry-After ARM answered, which apply waits."""
    from reconciler.apply import RETRIES, _retry

    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm)))  # max_retries 3
    arm.fail_next(status, code, message, method="PUT", count=10**6,
                  headers={"Retry-After": retry_after} if retry_after is not None else None)
    with pytest.raises(TransientProviderError, match=code) as e:
        _retry(lambda: prov.create(req("k-throttled")), "create", 0.0)
    assert len(arm.requests("PUT", "/virtualMachines/")) == RETRIES, arm.requests("PUT")
    assert len(arm.requests("GET", "/virtualMachines/")) == RETRIES
    assert e.value.retry_after == (float(retry_after) if retry_after is not None else None) and not e.value.retried
    assert arm.snapshot() == {}


def test_a_retry_after_past_the_retry_window_ends_the_create_at_once(arm, prov):
    """ARM asks for a wait longer than what is left of the retry window: the create fails now, transient (the next run
    tries again), after one PUT. Before, azure-core slept the Retry-After itself, up to max_retries times, inside apply's
    window: an apply stalled 3 minutes on a 60 s Retry-After (or 3 hours on 3600 s)."""
    import threading
    import time

    from reconciler.apply import _retry

    arm.fail_next(*THROTTLED, method="PUT", count=10**6, headers={"Retry-After": "60"})
    outcome: list = []

    def create() -> None:
        try:
            _retry(lambda: prov.create(req("k-later")), "create", 5.0)
        except TransientProviderError as e:
            outcome.append(e)

    started = time.monotonic()
    t = threading.Thread(target=create, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "still waiting on ARM's Retry-After"
    assert time.monotonic() - started < 5 and len(outcome) == 1 and outcome[0].retry_after == 60.0
    assert len(arm.requests("PUT", "/virtualMachines/")) == 1


def test_a_throttled_delete_is_sent_once_per_apply_try(arm, tmp_path, prov):
    """The same for a delete's DELETE (ARM counts it against the same write limits)."""
    from reconciler.apply import RETRIES, _retry

    inst = prov.create(req("k-del"))
    arm.fail_next(*THROTTLED, method="DELETE", count=10**6, headers={"Retry-After": "0"})
    with pytest.raises(TransientProviderError, match="TooManyRequests"):
        _retry(lambda: prov.delete(inst), "delete", 0.0)
    assert len(arm.requests("DELETE", "/virtualMachines/")) == RETRIES
    assert vm_name(FLEET, "k-del") in arm.snapshot()


def test_the_polls_of_a_create_are_still_retried_by_the_sdk(arm, prov):
    """Only the writes (and the GET that starts them) are sent once: a long-running operation's status polls keep the
    SDK's retries (max_retries), so a throttled poll neither fails the create nor sends its PUT again."""
    arm.fail_next(*THROTTLED, method="GET", path_contains="/operations/", count=2, headers={"Retry-After": "0"})
    assert prov.create(req("k-poll")).state == "running"
    assert len(arm.requests("PUT", "/virtualMachines/")) == 1
    assert len(arm.requests("GET", "/operations/")) >= 2 + 1  # the two refused, then on to Succeeded


def test_the_reads_inside_a_create_are_sent_once_per_try_under_arm_read_throttling(arm, prov):
    """Audit (one retry layer): the GETs a create makes besides the one that starts it (the power state of the VM an
    earlier try made, the read of a VM whose allocation failed before it is removed) kept azure-core's RetryPolicy: under
    ARM read throttling (429 with Retry-After) each was sent 1 + max_retries = 4 times, the SDK sleeping the Retry-After
    3 times, inside every one of apply's tries (3 s a try with Retry-After: 1; at ARM's usual tens of seconds, minutes
    past apply's retry_window). Each is sent once now: apply retries the whole create, waiting ARM's Retry-After."""
    import time

    # The key's VM exists (an earlier try made it): the create reads its power state.
    prov.create(req("k-again"))
    gets = len(arm.requests("GET"))
    arm.throttle_reads("1", after=1)  # the GET that starts the create goes through; the power state read is throttled
    started = time.monotonic()
    with pytest.raises(TransientProviderError, match="TooManyRequests") as e:
        prov.create(req("k-again"))
    assert (len(arm.requests("GET")) - gets, e.value.retry_after) == (2, 1.0), arm.requests("GET")[gets:]
    assert time.monotonic() - started < 1.0
    arm.clear_faults()

    # The allocation fails; the Failed VM Azure keeps is read before it is removed: throttled, it is left to the next
    # create with this key (which clears it), and the create answers the capacity error at once.
    arm.exhaust("eastus", "2")
    arm.latency = 0.0  # the allocation fails at once: its first status poll says so
    gets = len(arm.requests("GET"))
    arm.throttle_reads("1", after=2)  # the create's GET and the operation's status poll go through
    started = time.monotonic()
    with pytest.raises(CapacityError):
        prov.create(req("k-failed", zone="eastus-2"))
    assert len(arm.requests("GET")) - gets == 2 + 1, arm.requests("GET")[gets:]
    assert time.monotonic() - started < 1.0
    assert arm.snapshot()[vm_name(FLEET, "k-failed")]["properties"]["provisioningState"] == "Failed"


def test_one_create_waits_lro_timeout_in_all_not_lro_timeout_per_operation(arm, tmp_path):
    """lro_timeout is documented as a create's bound, start to end; each operation a create waits on had one of its own:
    the delete of a Failed VM an earlier try left, then the PUT's allocation, then the delete of a VM whose allocation
    failed, up to 3 x lro_timeout. Here a slow delete (its polls throttled, the SDK retrying them) then an allocation
    that never ends took 1.4 + 2 s with lro_timeout=2 s; the create now gives up at 2 s."""
    import time

    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout="2")))
    name = vm_name(FLEET, "k-slow")
    arm.plant(name, tags={**ours(), azure_tag_name(TAG_CREATE_KEY): "k-slow"}, provisioning_state="Failed")
    arm.throttle_reads("0.7", after=1, count=2)  # the create's GET goes through; the delete's first poll is throttled twice
    arm.hold_creates()
    started = time.monotonic()
    with pytest.raises(ProviderError, match="still allocating after 2 s"):
        prov.create(req("k-slow"))
    took = time.monotonic() - started
    assert len(arm.requests("DELETE")) == len(arm.requests("PUT")) == 1
    assert 2.0 <= took < 2.7, took


@pytest.mark.parametrize("outcome", ["Succeeded", "Failed", "still Creating"])
def test_a_create_retried_after_its_polls_were_throttled_never_answers_with_a_vm_still_allocating(arm, tmp_path, outcome):
    """Audit (a way around lro_timeout's fix): the status polls of a create's operation throttled (429) until azure-core's
    retries of them ran out reached apply as a transient error; apply's retry of the create GETs the VM under its name,
    found it in provisioningState Creating and answered it as a pending instance: reported created and given replicas,
    though its allocation could still fail. The retry now waits on the allocation this create started, for what is left
    of its lro_timeout: a VM that allocated is answered running; a failed allocation is a capacity error and the Failed
    VM is removed (as when the first try sees it fail); one still allocating at the deadline fails the create as the
    first try would, nothing placed on it."""
    import threading
    import time

    from reconciler.apply import _retry

    # A VM that allocates is answered when it does, well before lro_timeout: 6 s there, so a loaded machine's slow
    # requests cannot pass for the deadline; 2 s where the deadline is what is asserted.
    lro = 6.0 if outcome == "Succeeded" else 2.0
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout=f"{lro:g}",
                                                                                            max_retries="1")))
    name = vm_name(FLEET, "k-held")
    arm.hold_creates()
    # The operation's first status poll and the SDK's one retry of it are refused: the 429 reaches apply's _retry.
    arm.fail_next(*THROTTLED, method="GET", path_contains="/operations/", count=2, headers={"Retry-After": "0.1"})

    def end_during_the_retry() -> None:  # the allocation ends once apply's retry of the create has read the VM
        while len(arm.requests("GET", f"/virtualMachines/{name}")) < 2 and time.monotonic() < started + 5:
            time.sleep(0.02)
        time.sleep(0.2)
        arm.end_held(error_code="ZonalAllocationFailed" if outcome == "Failed" else None)

    timer = threading.Thread(target=end_during_the_retry, daemon=True) if outcome != "still Creating" else None
    started = time.monotonic()
    if timer is not None:
        timer.start()
    try:
        got = _retry(lambda: prov.create(req("k-held")), "create", 0.0)
    except ProviderError as e:
        got = e
    took = time.monotonic() - started
    if timer is not None:
        timer.join()
    assert len(arm.requests("PUT", "/virtualMachines/")) == 1
    assert len(arm.requests("GET", f"/virtualMachines/{name}")) >= 2  # apply did retry: the retry read the VM (Creating)
    if outcome == "Succeeded":
        assert not isinstance(got, Exception) and got.state == "running", got
        assert arm.snapshot()[name]["properties"]["provisioningState"] == "Succeeded" and took < lro - 1.0, took
    elif outcome == "Failed":
        assert isinstance(got, CapacityError) and "ZonalAllocationFailed" in str(got), got
        assert arm.snapshot() == {}  # the Failed VM Azure keeps was removed, as when the first try sees it fail
    else:
        assert type(got) is ProviderError and "still allocating after 2 s" in str(got), got
        assert "nothing was placed on it" in str(got)
        assert arm.snapshot()[name]["properties"]["provisioningState"] == "Creating"
        assert 2.0 <= took < 2.7, took  # the create's own lro_timeout, not a new one for apply's retry


def test_a_create_that_finds_its_key_s_vm_allocating_from_elsewhere_does_not_answer_it(prov, arm):
    """The key's VM still Creating, from an allocation this provider did not start (another process's create, or a PUT
    whose answer was lost): answered pending it was reported created and given replicas. The create fails now, at once,
    nothing placed on it; the next run observes it and sees how it ended."""
    name = vm_name(FLEET, "k-elsewhere")
    arm.plant(name, tags={**ours(), azure_tag_name(TAG_CREATE_KEY): "k-elsewhere"}, provisioning_state="Creating")
    with pytest.raises(ProviderError, match="is still allocating .*this run did not start it; nothing was placed on it") as e:
        prov.create(req("k-elsewhere"))
    assert type(e.value) is ProviderError and arm.requests("PUT") == []

def test_a_create_whose_polls_are_refused_past_lro_timeout_says_so_not_that_it_is_still_allocating(arm, tmp_path):
    """A create whose operation's status polls were throttled until lro_timeout ended failed with "still allocating after
    lro_timeout": the allocation may well have finished; what is known is that its status could not be read (ARM
    throttles a subscription's reads: the read of the VM at the deadline is refused too). Where the VM can be read
    then, it is answered as it stands: allocated, it is the create's."""
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout="1",
                                                                                            max_retries="1")))
    arm.throttle_reads("1.5", after=1)  # the GET that starts the create goes through
    with pytest.raises(ProviderError) as e:
        prov.create(req("k-unread"))
    message = str(e.value)
    assert type(e.value) is ProviderError and "still allocating" not in message, message
    assert "not known" in message and "429" in message and "nothing was placed on it" in message, message

    arm.clear_faults()
    arm.fail_next(*THROTTLED, method="GET", path_contains="/operations/", count=10**6, headers={"Retry-After": "1.5"})
    assert prov.create(req("k-read")).state == "running"  # its polls refused, the VM itself read: allocated


def test_retry_after_is_read_as_seconds_or_an_http_date():
    import email.utils
    import time

    from providers.errors import retry_after_seconds

    assert retry_after_seconds({"Retry-After": "17"}) == 17.0 and retry_after_seconds({"Retry-After": " 0 "}) == 0.0
    later = retry_after_seconds({"Retry-After": email.utils.formatdate(time.time() + 60, usegmt=True)})
    assert later is not None and 55 <= later <= 61
    assert retry_after_seconds({"Retry-After": email.utils.formatdate(time.time() - 60, usegmt=True)}) == 0.0
    for unreadable in ({}, None, {"Retry-After": ""}, {"Retry-After": "soon"}, {"Retry-After": "nan"}, {"Retry-After": "inf"}):
        assert retry_after_seconds(unreadable) is None, unreadable
    # Azure's milliseconds first, as azure-core reads them (an unreadable one is passed over)
    assert retry_after_seconds({"retry-after-ms": "2500"}) == 2.5
    assert retry_after_seconds({"x-ms-retry-after-ms": "700", "Retry-After": "30"}) == 0.7
    assert retry_after_seconds({"retry-after-ms": "soon", "Retry-After": "30"}) == 30.0


@pytest.mark.slow  # about 10 s: apply's pauses, each at least the Retry-After (1 s)
def test_throttling_that_outlasts_apply_s_first_tries_but_clears_within_the_window_still_creates_every_vm(arm, tmp_path):
    """Throttling that clears within retry_window (300 s) still ends in every VM created, once each (the VM name is
    the create key): 20 refusals among 4 creates, so one create at least is refused 5 times, more than apply's first
    4 tries (RETRIES), and lands within the window."""
    cfg = _config(tmp_path)
    opts = options(arm)
    arm.fail_next(*THROTTLED, method="PUT", count=4 * 5, headers={"Retry-After": "1"})
    res = api.apply(cfg, provider="azure", options=opts)
    assert res.report.ok and len(res.report.created) == len(res.plan.creates) == 4, res.report.failures
    assert len(arm.snapshot()) == 4 and len(arm.requests("PUT", "/virtualMachines/")) == 4 + 4 * 5


def test_apply_routes_around_an_exhausted_zone(arm, tmp_path):
    cfg = _config(tmp_path)
    opts = options(arm)
    arm.exhaust("eastus", "1")
    with pytest.raises(ApplyError, match="zone marked short"):
        api.apply(cfg, provider="azure", options=opts)
    assert all(v["properties"]["provisioningState"] == "Succeeded" for v in arm.snapshot().values())
    res = api.apply(cfg, provider="azure", options=opts)
    assert res.report.ok
    assert not api.plan(cfg, provider="azure", options=opts).plan.has_changes
    vms = arm.snapshot()
    assert len(vms) == 4 and all(v["zones"] != ["1"] for v in vms.values())


def test_cli_plan_apply_plan(arm, tmp_path):
    cfg = _config(tmp_path)
    args = ["--provider", "azure"] + [a for k, v in options(arm).items() for a in ("-o", f"{k}={v}")]
    runner = CliRunner()
    plan = runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode", *args])
    assert plan.exit_code == 2, plan.output
    applied = runner.invoke(app, ["apply", str(cfg), "--auto-approve", *args])
    assert applied.exit_code == 0, applied.output
    again = runner.invoke(app, ["plan", str(cfg), "--detailed-exitcode", *args])
    assert again.exit_code == 0, again.output
    assert len(arm.snapshot()) == 4


# -- observe reads power states (issue 22, item 4) --------------------------------------------------
def test_a_deallocated_or_stopped_vm_is_not_observed_as_running(prov, arm):
    """A stopped or deallocated VM keeps provisioningState Succeeded; only its instance view says it does not run."""
    running, stopped, deallocated = (prov.create(req(k)) for k in ("k-run", "k-stop", "k-dealloc"))
    arm.power_off(vm_name(FLEET, "k-stop"), deallocate=False)
    arm.power_off(vm_name(FLEET, "k-dealloc"))
    seen = {i.id: i.state for i in prov.observe([target()])}
    assert seen == {running.id: "running", stopped.id: "stopping", deallocated.id: "stopping"}
    # One status list for the subscription, not one GET per VM.
    assert len(arm.requests("GET", "statusOnly=true")) == 1 and not arm.requests("GET", "$expand=instanceView")


def test_a_deallocated_vm_is_replaced_noted_and_left_alone(arm, tmp_path):
    cfg = _config(tmp_path)
    opts = options(arm)
    first = api.apply(cfg, provider="azure", options=opts)
    assert first.report.ok and first.report.created
    victim = min(first.report.created.values())
    arm.power_off(victim.rsplit("/", 1)[1])
    res = api.plan(cfg, provider="azure", options=opts)
    assert victim not in {i.id for i in res.observed.instances}
    assert len(res.plan.creates) == 1 and not res.plan.deletes  # its capacity is replaced; the VM itself is not touched
    assert any(n.startswith(f"{victim} exists but does not run") and "deallocated" in n for n in res.plan.notes)
    # "Left alone" is not "free": a VM stopped without deallocation is still billed for compute, a disk always.
    assert any(victim in n and "may still be billed" in n and "compute too unless deallocated" in n for n in res.plan.notes)


def test_a_vm_whose_host_is_unreachable_is_still_observed_as_running(arm, tmp_path):
    """Audit: PowerState/unknown (Azure cannot reach the VM's host) was read as gone: the VM vanished unreported and
    its replicas were relaunched elsewhere. It is not gone: it counts as running, and the node agent's heartbeat says
    whether its work is healthy."""
    cfg = _config(tmp_path)
    opts = options(arm)
    first = api.apply(cfg, provider="azure", options=opts)
    assert first.report.ok
    victim = min(first.report.created.values())
    arm.lose_host(victim.rsplit("/", 1)[1])
    res = api.plan(cfg, provider="azure", options=opts)
    assert victim in {i.id for i in res.observed.instances} and not res.plan.has_changes


def test_a_failed_vm_without_a_power_state_is_reported_and_left_alone(arm, tmp_path):
    """Audit: a VM in provisioningState Failed with no power state was read as gone and dropped. It exists (its disk
    billed): reported, not counted as capacity, not deleted."""
    cfg = _config(tmp_path)
    opts = options(arm)
    assert api.apply(cfg, provider="azure", options=opts).report.ok
    failed = arm.plant("azure-fleet-failed", tags={azure_tag_name(TAG_FLEET): "azure-fleet", azure_tag_name(TAG_POOL): "t4"},
                       provisioning_state="Failed")
    res = api.plan(cfg, provider="azure", options=opts)
    assert failed["id"] not in {i.id for i in res.observed.instances} and not res.plan.has_changes
    assert any(n.startswith(f"{failed['id']} exists but does not run") for n in res.plan.notes)
    api.apply(cfg, provider="azure", options=opts)
    assert arm.snapshot()["azure-fleet-failed"]["properties"]["provisioningState"] == "Failed"


def test_a_create_whose_key_holds_a_stopped_vm_returns_it_stopped(prov, arm):
    """The VM of a key, stopped or deallocated, is still provisioningState Succeeded: a create with that key answered
    it as running, and apply put the plan's replicas on it. It is answered as it is (apply then launches nothing)."""
    first = prov.create(req("k-held"))
    arm.power_off(vm_name(FLEET, "k-held"))
    again = prov.create(req("k-held"))
    assert (again.id, again.state) == (first.id, "stopping")
    assert len(arm.snapshot()) == 1


# -- zone offerings (issue 22, item 2) ----------------------------------------------------------------
@pytest.fixture
def prices():
    from tests.price_fake import PriceFake

    fake = PriceFake().start()
    yield fake
    fake.stop()


def test_spot_prices_are_read_live_at_plan_time_cached_and_labelled(arm, prices, tmp_path):
    """Issue 22: a provider that can read live spot prices uses them at plan time, cached with a TTL, and says so.
    The Retail Prices API (public, no credentials) is asked per region and size in its documented $filter form; its
    Linux "Spot" meter is the spot price (not "Low Priority", not Windows). Before, Azure spot came from the catalog
    only (NC4as_T4_v3 $0.0627/h from the 2026-11-23 file, whatever the price today)."""
    def offers(**extra):
        p = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, prices_endpoint=prices.url, **extra)))
        return {(o.zone, o.instance_type): o for o in p.offerings([target()])}

    catalog = load_catalog().offering("azure", "eastus", "eastus-1", "Standard_NC64as_T4_v3")
    got = offers()
    t4 = got[("eastus-1", "Standard_NC4as_T4_v3")]
    assert t4.spot_price == 0.0526 and t4.on_demand_price == 0.526
    assert re.fullmatch(r"catalog: skypilot-v6-azure \(2026-11-23\); spot: live Azure Retail Prices API, read \d{4}-\d\d-\d\dT\d\d:\d\dZ",
                        t4.price_source), t4.price_source
    assert got[("eastus-1", "Standard_NC64as_T4_v3")] == catalog  # the API has no spot meter for it: the catalog's, as labelled
    asked = [f for api_, f in prices.requests if api_ == "azure"]
    assert sorted(asked) == sorted(f"serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and armSkuName eq '{t}' "
                                   "and priceType eq 'Consumption'" for t in ("Standard_NC4as_T4_v3", "Standard_NC64as_T4_v3"))
    # Within the TTL a new run reuses the read; past it (ttl 0 here) it reads today's price.
    next(i for i in prices.azure_items if i["skuName"] == "NC4as T4 v3 Spot")["retailPrice"] = 0.07
    assert offers()[("eastus-1", "Standard_NC4as_T4_v3")].spot_price == 0.0526 and len(prices.requests) == 2
    assert offers(spot_price_ttl="0")[("eastus-1", "Standard_NC4as_T4_v3")].spot_price == 0.07 and len(prices.requests) == 4
    # An unreadable price API is no reason to stop planning: the catalog's dated price, saying why.
    prices.broken = "azure"
    down = offers(spot_price_ttl="0")[("eastus-1", "Standard_NC4as_T4_v3")]
    assert down.spot_price == load_catalog().offering("azure", "eastus", "eastus-1", "Standard_NC4as_T4_v3").spot_price
    assert "spot: catalog, the live Azure Retail Prices API could not be read (azure Retail Prices API (eastus, " in down.price_source
    assert "HTTP 503" in down.price_source


def test_offerings_leave_out_sizes_a_zone_does_not_offer_the_subscription(prov, arm):
    arm.restrict_sku("eastus", "Standard_NC64as_T4_v3", ("2",))
    got = {(o.zone, o.instance_type) for o in prov.offerings([target()])}
    assert got == {("eastus-1", "Standard_NC4as_T4_v3"), ("eastus-2", "Standard_NC4as_T4_v3"),
                   ("eastus-1", "Standard_NC64as_T4_v3")}
    skus = arm.requests("GET", "/providers/Microsoft.Compute/skus?")  # (not the image's .../skus/2204/versions)
    assert skus and "location+eq" in skus[0].replace("%20", "+")
    with pytest.raises(CapacityError, match="SkuNotAvailable"):
        prov.create(req("k-sku", zone="eastus-2", itype="Standard_NC64as_T4_v3"))


def test_gpu_sizes_get_a_driver_image_and_a_missing_image_is_a_plan_time_error(prov, arm):
    """Plain Ubuntu has no NVIDIA driver: a GPU size without azure.image boots the Ubuntu HPC image (CPU sizes keep
    Ubuntu 24.04). A marketplace image that does not exist is refused while offerings are read (plan time), naming the
    pool; the fake answers a create with it as ARM does (PlatformImageNotFound)."""
    cpu = target(name="cpu", types=("Standard_D16s_v5",))
    prov.create(req("k-gpu"))
    prov.create(req("k-cpu", itype="Standard_D16s_v5", pool=cpu))
    images = {n: v["properties"]["storageProfile"]["imageReference"]["offer"] for n, v in arm.snapshot().items()}
    assert images == {vm_name(FLEET, "k-gpu"): "ubuntu-hpc", vm_name(FLEET, "k-cpu"): "ubuntu-24_04-lts"}
    assert prov.offerings([target(), cpu])  # both default images exist: nothing refused
    for image in ("nvidia:ngc-nope:base:latest", "microsoft-dsvm:ubuntu-hpc:2204:22.04.1999"):
        with pytest.raises(ProviderError, match=f"pool t4-custom: image {image} does not exist in eastus"):
            prov.offerings([target(name="t4-custom", image=image)])
    with pytest.raises(ProviderError, match="PlatformImageNotFound"):
        prov.create(req("k-missing", pool=target(image="nvidia:ngc-nope:base:latest")))
    pinned = target(name="t4-custom", image="microsoft-dsvm:ubuntu-hpc:2204:22.04.2024043001")
    assert prov.offerings([pinned]) and prov.create(req("k-pinned", pool=pinned)).state in ("pending", "running")


def test_a_pools_subnet_is_checked_at_plan_time(prov, arm, tmp_path, caplog):
    """Issue 22 item 6: azure.subnet_id is read at plan time (Subnets - Get, then its VNet for the location: a subnet
    carries none), so a mistyped subnet, a malformed id, another subscription's or another region's subnet is an
    error naming the pool and the field before anything is created. Before, only its presence was checked and every VM
    create of the apply failed (ARM, and the fake: 400 InvalidResourceReference)."""
    west = arm.add_network("ml-west", resource_group="fleetops-net", location="westeurope", subnets=("gpu",))[0]
    assert prov.offerings([target()]) and prov.create(req("k-net")).state == "running"
    vnet = SUBNET.rsplit("/subnets/", 1)[0]
    with pytest.raises(ProviderError, match="pool t4 needs azure.subnet_id"):
        prov.offerings([target(subnet_id=None)])  # required: said at plan time now, not by the first create
    for subnet_id, message in (
            (f"{vnet}/subnets/gpus", r"pool t4: azure.subnet_id \S+/gpus does not exist \(no subnet gpus in virtual network "
                                     r"fleetops-vnet of resource group fleetops-net\)"),
            (SUBNET.replace("fleetops-vnet", "fleetops-vnett"), r"does not exist \(no subnet gpu in virtual network "),
            (SUBNET.replace("fleetops-net", "fleetops-nett"), r"does not exist"),
            ("fleetops-vnet/gpu", r"pool t4: azure.subnet_id fleetops-vnet/gpu is not a subnet resource id \(/subscriptions/"),
            (f"{vnet}/subnet/gpu", r"is not a subnet resource id"),
            (west, r"pool t4: azure.subnet_id \S+ belongs to virtual network ml-west in westeurope, not the pool's region "
                   r"eastus"),
            (SUBNET.replace(arm.subscription, "11111111-2222-3333-4444-555555555555"),
             rf"is in subscription 11111111-2222-3333-4444-555555555555, not the pool's {arm.subscription}")):
        with pytest.raises(ProviderError, match=message):
            prov.offerings([target(subnet_id=subnet_id)])
        with pytest.raises(ProviderError, match="InvalidResourceReference|LinkedInvalidPropertyId"):
            prov.create(req("k-unchecked", pool=target(subnet_id=subnet_id)))  # what an unchecked pool met at create time
    assert list(arm.snapshot()) == [vm_name(FLEET, "k-net")]

    # Through plan/apply: the mistyped subnet stops the run before any create, naming the pool and the field.
    cfg = copy_example(tmp_path, "azure-only")
    fleet = cfg / "fleet.yaml"
    fleet.write_text(fleet.read_text().replace(SUBNET, f"{vnet}/subnets/gpus", 1))
    with pytest.raises(ProviderError, match=r"pool t4: azure.subnet_id \S+/gpus does not exist"):
        api.apply(cfg, provider="azure", options=options(arm))
    assert len(arm.requests("PUT")) == 1 + 7 and list(arm.snapshot()) == [vm_name(FLEET, "k-net")]  # only the tests' own

    # A role on the subnet alone cannot read its VNet: the region goes unchecked, with a warning, not a refusal.
    arm.forbid_read("fleetops-vnet", resource_group="fleetops-net")
    fresh = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path / "fresh", options=options(arm)))
    with caplog.at_level("WARNING", logger="providers.azure"):
        assert fresh.offerings([target()])
    assert "its virtual network fleetops-vnet cannot be read (HTTP 403 AuthorizationFailed), so its region is not " \
           "checked" in caplog.text
    arm.forbid_read("fleetops-vnet", resource_group="fleetops-net", subnets=True)  # a role holding only join/action
    joiner = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path / "joiner", options=options(arm)))
    with caplog.at_level("WARNING", logger="providers.azure"):
        assert joiner.offerings([target()]) and joiner.create(req("k-join")).state == "running"
    assert f"azure.subnet_id {SUBNET}: cannot read it (HTTP 403 AuthorizationFailed), so it is not checked" in caplog.text
    assert "fleetops-test" not in caplog.text  # ARM's message (the caller's identity) is not repeated


def test_an_unreadable_network_api_is_transient_not_a_verdict(arm, tmp_path):
    """A 5xx while reading the subnet is an outage: a TransientProviderError (the plan is retried later), never the
    refusal a missing subnet gets, and not remembered: the next read decides."""
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, max_retries="0")))
    assert prov.offerings([target()])  # the image and SKUs read; the subnet's verdict is kept for this run
    other = arm.add_network("fleetops-vnet2", resource_group="fleetops-net", subnets=("gpu",))[0]
    arm.fail_next(503, "ServiceUnavailable", "The service is temporarily unavailable.", method="GET")
    with pytest.raises(TransientProviderError, match="ServiceUnavailable"):
        prov.offerings([target(subnet_id=other)])
    assert prov.offerings([target(subnet_id=other)])


def test_a_mig_layout_is_tagged_at_launch_read_back_and_a_changed_one_replaces_the_vm(arm, tmp_path):
    """Azure tag names allow no '/': the logical fleetops.io/mig is the tag fleetops.io_mig, its value as is."""
    from tests.test_mig_drift import check_mig_drift_on, cloud_mig_config

    cfg = _config(tmp_path)

    def raw(i) -> str:
        return arm.snapshot()[i.id.rsplit("/", 1)[1]]["tags"][azure_tag_name("fleetops.io/mig")]

    check_mig_drift_on(cfg, "azure", options(arm),  # one A100-80GB
                       lambda layout, profile: cloud_mig_config(cfg, "a100", "Standard_NC24ads_A100_v4", "A100-80GB", layout, profile),
                       ["3g.40gb", "2g.20gb", "2g.20gb"], ["3g.40gb", "3g.40gb"], ("3g.40gb", "3g.40gb"), raw, lambda v: v)


def test_an_allocation_not_done_within_lro_timeout_is_not_reported_created_and_the_next_run_replaces_it(arm, tmp_path):
    """Audit (apply under cloud failures, item 1): a VM create still allocating after `lro_timeout` was returned as a
    pending instance, so apply reported it created (exit 0) and placed replicas on it; when the allocation then failed,
    the next run only noted the Failed VM. Now the create fails and says the allocation is still under way, as GCE's
    operation wait does (nothing placed, the apply exits 1); the next run replaces an allocation that failed under the
    same key (the Failed VM deleted, created again), so no Failed VM of ours is left."""
    cfg = _config(tmp_path)
    opts = options(arm, lro_timeout="0.2")
    arm.hold_creates()
    with pytest.raises(ApplyError, match="still allocating") as caught:
        api.apply(cfg, provider="azure", options=opts)
    report = caught.value.result.report  # type: ignore[attr-defined]
    assert report.created == {} and len(report.failed_refs) == 4 and report.placements == {}, report
    assert "0 created" in str(caught.value) and "lro_timeout" in str(caught.value)
    held = arm.end_held(error_code="ZonalAllocationFailed")  # the allocations fail after the apply gave up on them
    assert len(held) == 4 and {v["properties"]["provisioningState"] for v in arm.snapshot().values()} == {"Failed"}

    res = api.apply(cfg, provider="azure", options=options(arm))
    assert res.report.ok and len(res.report.created) == 4, res.report.failures
    assert {n: v["properties"]["provisioningState"] for n, v in arm.snapshot().items()} == dict.fromkeys(held, "Succeeded")
    again = api.plan(cfg, provider="azure", options=options(arm))
    assert not again.plan.has_changes and not any("does not run" in n for n in again.plan.notes)


def test_an_allocation_still_under_way_at_the_next_run_is_observed_pending_and_used_once_it_runs(arm, tmp_path):
    """The other way the timed-out VM can be found: still Creating when the next run looks. It is observed pending (ours,
    under its key) and the plan places on it, launching nothing; once it runs, the apply lands with every VM launched once."""
    cfg = _config(tmp_path)
    arm.hold_creates()
    with pytest.raises(ApplyError, match="still allocating"):
        api.apply(cfg, provider="azure", options=options(arm, lro_timeout="0.2"))
    seen = api.plan(cfg, provider="azure", options=options(arm))
    assert [i.state for i in seen.observed.instances] == ["pending"] * 4 and not seen.plan.creates
    arm.end_held()
    res = api.apply(cfg, provider="azure", options=options(arm))
    assert res.report.ok and not res.report.created and len(res.report.placements) == 3, res.report
    assert len(arm.snapshot()) == 4 and len(arm.requests("PUT", "/virtualMachines/")) == 4  # each VM launched once
    assert not api.plan(cfg, provider="azure", options=options(arm)).plan.has_changes


def test_a_create_that_gave_up_at_lro_timeout_stops_polling_its_operation(arm, tmp_path):
    """A wait that gave up (lro_timeout) only stopped waiting: azure-core's LROPoller went on polling the operation in
    a thread of its own until the operation ended, for the rest of the process (the controller's runs for hours): a
    held allocation was polled every polling_interval long after the create had failed. Its polls now stop with the
    wait; the allocation goes on in Azure and a later create with its key finds the VM it made."""
    import threading
    import time

    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout="0.3", polling_interval="0.05")))
    before = set(threading.enumerate())
    arm.hold_creates()
    with pytest.raises(ProviderError, match="still allocating"):
        prov.create(req("k-held"))
    time.sleep(0.3)  # (a poll in flight at the give-up is answered)
    polls = len(arm.requests("GET", "/operations/"))
    time.sleep(1.5)
    assert len(arm.requests("GET", "/operations/")) == polls, "the operation is still polled after the wait gave up"
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("LROPoller")]
    assert arm.end_held() == [vm_name(FLEET, "k-held")]  # it kept allocating in Azure
    assert prov.create(req("k-held")).state == "running" and len(arm.requests("PUT", "/virtualMachines/")) == 1


def _tag_while_allocating(arm, name: str, after_polls: int = 1):
    """Someone writes the VM while its create is under way (tags it in the portal): a PUT of the VM as it is, with one
    more tag, once the create's operation has been polled `after_polls` times. Compute preempts the create."""
    import threading
    import time

    def write() -> None:
        deadline = time.monotonic() + 10
        while len(arm.requests("GET", "/operations/")) < after_polls and time.monotonic() < deadline:
            time.sleep(0.01)
        with arm.lock:
            ((sub, rg, _), vm), = [(k, v) for k, v in arm.vms.items() if k[2] == name.lower()]
            arm.put_vm(sub, rg, name, {**vm, "tags": {**vm["tags"], "costcenter": "ml"}}, arm.base_url, "2024-07-01")

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_a_create_preempted_by_another_write_to_its_vm_answers_the_vm_that_write_allocates(arm, tmp_path):
    """Compute takes a write to a VM whose create is under way and preempts the create: its operation ends Canceled,
    OperationPreempted, while the newer operation allocates the VM (tests/arm_fake.py; the fake took such a PUT as a
    tag update and the create went on to succeed). The preempted create was a transient error: apply's retries read
    the VM, found it Creating, and polled the dead operation again, each answered OperationPreempted, until the retry
    window ran out and the create failed with the VM allocating. The create now waits on the VM itself, within its
    lro_timeout, and answers it once allocated: one PUT of ours, one VM."""
    import threading
    import time

    from reconciler.apply import _retry

    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(
        arm, lro_timeout="6", polling_interval="0.05", retry_window="1")))
    name = vm_name(FLEET, "k-tagged")
    arm.hold_creates()
    writer = _tag_while_allocating(arm, name)
    def end_once_read_more_than_apply_retries() -> None:  # (apply's 4 tries read the VM once each, then gave up)
        deadline = time.monotonic() + 10
        while len(arm.requests("GET", f"/virtualMachines/{name}")) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        arm.end_held()

    ender = threading.Thread(target=end_once_read_more_than_apply_retries, daemon=True)
    ender.start()
    started = time.monotonic()
    got = _retry(lambda: prov.create(req("k-tagged")), "create", prov.retry_window_s)
    writer.join()
    ender.join()
    assert got.state == "running" and got.id.endswith(f"/virtualMachines/{name}") and time.monotonic() - started < 6
    assert len(arm.snapshot()) == 1 and arm.snapshot()[name]["tags"]["costcenter"] == "ml"
    assert len([p for p in arm.requests("PUT", "/virtualMachines/")]) == 1  # ours; the tagger's went around the log


def test_a_create_preempted_by_a_delete_of_its_vm_says_so_and_launches_nothing_more(arm, tmp_path):
    """The other write that preempts a create: someone deletes the VM while it allocates. The create fails naming
    what happened, nothing placed on it and no second VM made behind the delete's back; the next plan, not this
    create, decides whether one is needed."""
    import threading
    import time

    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(
        arm, lro_timeout="5", polling_interval="0.05")))
    name = vm_name(FLEET, "k-deleted")
    arm.hold_creates()

    def delete() -> None:
        deadline = time.monotonic() + 10
        while not arm.requests("GET", "/operations/") and time.monotonic() < deadline:
            time.sleep(0.01)
        with arm.lock:
            ((sub, rg, _), _vm), = [(k, v) for k, v in arm.vms.items() if k[2] == name.lower()]
            arm.delete_vm(sub, rg, name, arm.base_url, "2024-07-01")

    thread = threading.Thread(target=delete, daemon=True)
    thread.start()
    with pytest.raises(ProviderError, match="OperationPreempted") as e:
        prov.create(req("k-deleted"))
    thread.join()
    assert not isinstance(e.value, TransientProviderError) and "deleted" in str(e.value), e.value
    assert len(arm.requests("PUT", "/virtualMachines/")) == 1


# -- operations that take time, as ARM's do -------------------------------------------------------
def test_a_vm_being_created_is_observed_pending_with_no_power_state_and_runs_when_its_operation_ends_unpolled(arm, tmp_path):
    """While its create runs, ARM shows the VM provisioningState Creating, with no PowerState in its instance view, and
    the operation ends by itself, polled or not (tests/arm_fake.py). An observe then (a second run, or apply's own
    after a create that gave up at lro_timeout) reports it pending: neither running (work placed on a VM that may never
    be) nor stopped (replaced, a second VM bought); a plan made then launches nothing; once the allocation is done
    (nobody polling it) the VM is observed running."""
    cfg = _config(tmp_path)
    arm.clock.freeze()
    with pytest.raises(ApplyError, match="still allocating"):
        api.apply(cfg, provider="azure", options=options(arm, lro_timeout="0.3"))
    polls = len(arm.requests("GET", "/operations/"))
    assert {v["properties"]["provisioningState"] for v in arm.snapshot().values()} == {"Creating"}
    seen = api.plan(cfg, provider="azure", options=options(arm))
    assert [i.state for i in seen.observed.instances] == ["pending"] * 4 and not seen.plan.creates
    arm.clock.advance(60)  # the allocations end in Azure; no one polls them
    assert {v["properties"]["provisioningState"] for v in arm.snapshot().values()} == {"Succeeded"}
    assert len(arm.requests("GET", "/operations/")) == polls  # (the gave-up create polls no more)
    seen = api.plan(cfg, provider="azure", options=options(arm))
    assert [i.state for i in seen.observed.instances] == ["running"] * 4 and not seen.plan.creates


def test_arm_s_retry_after_paces_the_status_polls_and_lro_timeout_still_bounds_the_wait(arm, tmp_path):
    """ARM says when to poll an operation again (Retry-After, seconds, on the accepted write and each InProgress
    status): polled faster, a fleet's creates spend the subscription's read limit (429s). A Retry-After longer than
    what is left of lro_timeout does not hold the create past it, and the VM is read as it stands then: the create
    failed "still allocating" of a VM that had been running for most of its wait (the last poll said InProgress)."""
    import time

    arm.retry_after = 1
    arm.latency = 0.5
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, polling_interval="0.01")))
    assert prov.create(req("k-paced")).state == "running"
    assert len(arm.requests("GET", "/operations/")) == 2  # at once, then after the second ARM asked for (not every 0.01 s)

    arm.retry_after, arm.latency = 30, 0.2
    slow = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout="0.5")))
    started = time.monotonic()
    assert slow.create(req("k-told-to-wait")).state == "running"  # allocated at 0.2 s, read at 0.5 s
    assert time.monotonic() - started < 1.5
    arm.clock.freeze()  # one still allocating at the deadline is still not answered as created
    with pytest.raises(ProviderError, match="still allocating after 0.5 s"):
        slow.create(req("k-still-allocating"))
    assert time.monotonic() - started < 3.0


def test_a_create_whose_wait_ran_out_and_whose_vm_reads_failed_is_that_allocation_s_error(arm, tmp_path):
    """The wait on a create's operation gives up at lro_timeout (ARM's Retry-After put the next status poll past it) and
    the VM, read once then, is Failed: its allocation failed in the meantime. That was answered "still allocating after
    lro_timeout", a VM that had failed said to be under way, no zone marked short, and the Failed VM left for the next
    run. It is the create's failed allocation, as when the PUT is answered with the VM already Failed: the allocation's
    error from the instance view (a stockout a CapacityError), and the Failed VM removed."""
    arm.retry_after, arm.latency = 30, 0.2  # the allocation fails at 0.2 s; the poll after the first is due at 30 s
    arm.exhaust("eastus", "1")
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout="0.5")))
    with pytest.raises(CapacityError, match="ZonalAllocationFailed") as e:
        prov.create(req("k-failed-unpolled", market="spot"))
    assert (e.value.zone, e.value.instance_type, e.value.market) == ("eastus-1", "Standard_NC4as_T4_v3", "spot")
    assert "still allocating" not in str(e.value) and len(arm.requests("PUT")) == 1
    assert len(arm.requests("DELETE")) == 1  # its delete sent, not waited on past lro_timeout ...
    arm.clock.advance(1)
    assert arm.snapshot() == {}  # ... and done: the Failed VM Azure keeps is removed


def test_a_delete_of_our_vm_while_its_create_still_runs_removes_it_and_nothing_recreates_it(arm, tmp_path):
    """A plan may drop a VM whose create an earlier run gave up waiting on (still Creating). ARM takes the DELETE: it
    preempts the create (its operation ends Canceled) and removes the VM; the delete waits for that, not for the
    allocation, and the VM does not come back when the allocation would have ended."""
    prov = AzureProvider(ProviderContext(fleet=FLEET, state_dir=tmp_path, options=options(arm, lro_timeout="0.3")))
    arm.latency = 30.0  # the allocation outlasts the create's wait
    with pytest.raises(ProviderError, match="still allocating"):
        prov.create(req("k-dropped"))
    (pending,) = prov.observe([target()])
    assert pending.state == "pending"
    arm.latency = 0.05
    prov.delete(pending)
    assert arm.snapshot() == {} and prov.observe([target()]) == []
    (create,) = [op for op in arm.ops.values() if op.kind == "create"]
    assert create.preempted
    arm.clock.advance(60)  # past when the allocation would have ended
    assert arm.snapshot() == {}


def test_arm_refuses_an_update_that_changes_how_a_vm_was_made(prov, arm):
    """A PUT to an existing VM is an update: ARM lets its tags and size change, not its location, zone, image, OS
    profile (customData, computer name, admin user) or priority (409 PropertyChangeNotAllowed). The fake let every such
    PUT through but a zone change, so a create re-sent over its VM with another body (a new agent bootstrap, a changed
    pool image) passed here and failed on Azure. The provider's own retried create, with the same body, is accepted."""
    from azure.core.exceptions import HttpResponseError

    request = replace(req("k-upd"), agent_state_url="s3://bus/fleet")
    prov.create(request)
    name = vm_name(FLEET, "k-upd")
    body = prov._vm_body(request, name, "1")
    vms = prov.compute(arm.subscription).virtual_machines

    def put(b: dict):
        return vms.begin_create_or_update(RG, name, b, polling_interval=0).result()

    assert put({**body, "tags": {**body["tags"], "costcenter": "ml"}}).tags["costcenter"] == "ml"  # the same VM, retagged
    other = replace(request, agent_state_url="s3://bus/other")
    changes = {
        "customData": prov._vm_body(other, name, "1"),
        "imageReference": prov._vm_body(replace(request, pool=target(image="Canonical:ubuntu-24_04-lts:server:latest")),
                                        name, "1"),
        "priority": prov._vm_body(replace(request, market="spot", max_price=0.5), name, "1"),
        "zones": prov._vm_body(request, name, "2"),
    }
    for prop, changed in changes.items():
        with pytest.raises(HttpResponseError, match=f"Changing property '{prop}' is not allowed"):
            put(changed)
    with pytest.raises(HttpResponseError, match="InvalidResourceLocation"):
        put({**body, "location": "westus2"})
    assert prov.create(request).state == "running"  # the key's create again: its VM as it is, nothing re-sent
    assert len(arm.requests("PUT", f"/virtualMachines/{name}")) == 1 + 1 + len(changes) + 1


@pytest.mark.parametrize("path, action", [
    ("/providers/Microsoft.Compute/skus", "Microsoft.Compute/skus/read"),
    ("/providers/Microsoft.Compute/virtualMachines", "Microsoft.Compute/virtualMachines/read"),
])
def test_a_role_missing_a_subscription_read_stops_the_plan_naming_the_action(arm, tmp_path, path, action):
    """The README asked for Virtual Machine Contributor on the resource group and called Reader on the subscription
    optional; the SKU list and the VM power-state list are read at subscription scope, where ARM refuses a caller
    without a role there. The plan stops with ARM's error, which names the action and scope, and creates nothing.
    Audit: the power states were read only once the fleet had a running VM, so such a caller's first apply launched
    the whole fleet, and every plan after it (the teardown too) failed on that read, the VMs left running."""
    cfg = _config(tmp_path)
    scope = f"/subscriptions/{arm.subscription}"
    arm.fail_next(403, "AuthorizationFailed", f"The client 'fleetops' with object id 'x' does not have authorization to "
                  f"perform action '{action}' over scope '{scope}' or the scope is invalid.", method="GET",
                  path_contains=f"{scope}{path}", count=100)
    with pytest.raises(ProviderError, match=re.escape(action)):
        api.apply(cfg, provider="azure", options=options(arm))
    assert arm.requests("PUT") == [] and arm.snapshot() == {}


# -- apply's permission check (ARM's permissions list; the fake enforces RBAC once a role is assigned) -----------------
def _assign(arm, rg_not: tuple[str, ...] = (), subnet: bool = True) -> None:
    """Reader on the subscription, a Virtual Machine Contributor-like role on the VMs' group (less `rg_not`), and the
    subnet's join (unless not `subnet`): the README's roles, one action taken away."""
    sub = f"/subscriptions/{arm.subscription}"
    arm.roles = None
    arm.assign(sub, ["*/read"])
    arm.assign(f"{sub}/resourceGroups/{RG}", ["Microsoft.Compute/*", "Microsoft.Network/networkInterfaces/*"], list(rg_not))
    if subnet:
        arm.assign(SUBNET, ["Microsoft.Network/virtualNetworks/subnets/join/action"])


def test_an_apply_that_may_not_delete_what_it_replaces_is_refused_before_any_create(arm, tmp_path):
    """Make before break: the replacements are created, then the old VMs deleted. Without
    Microsoft.Compute/virtualMachines/delete on the group the deletes failed after the creates (403 from ARM): old and
    new both ran, billed. Refused before the first PUT, naming the action and scope; the next plan is the same plan."""
    from reconciler.errors import ReconcileError

    cfg, opts = _config(tmp_path), options(arm)
    _assign(arm)
    assert api.apply(cfg, provider="azure", options=opts).report.ok  # the whole roles: RBAC on, everything allowed
    before, puts = arm.snapshot(), len(arm.requests("PUT"))
    f = cfg / "fleet.yaml"
    f.write_text(f.read_text().replace("instance_types: [Standard_NC4as_T4_v3, Standard_NC64as_T4_v3]",
                                       "instance_types: [Standard_NC64as_T4_v3]"))
    replacing = api.plan(cfg, provider="azure", options=opts).plan
    assert replacing.creates and replacing.deletes
    _assign(arm, rg_not=("Microsoft.Compute/virtualMachines/delete",))
    with pytest.raises(ReconcileError, match="(?s)refusing to apply; nothing was changed:.*may not "
                                             "Microsoft.Compute/virtualMachines/delete.*over /subscriptions/") as e:
        api.apply(cfg, provider="azure", options=opts)
    assert e.value.actions == ("Microsoft.Compute/virtualMachines/delete",)
    assert arm.snapshot() == before and len(arm.requests("PUT")) == puts and not arm.requests("DELETE")
    again = api.plan(cfg, provider="azure", options=opts).plan
    assert [c.key for c in again.creates] == [c.key for c in replacing.creates]


def test_an_apply_that_may_not_join_the_subnet_is_refused_naming_it_and_creates_nothing(arm, tmp_path):
    """Without the subnet's join action every VM create was refused by ARM (403 LinkedAuthorizationFailed), one by one,
    the apply failing part-way; refused before any PUT, naming the action and the subnet. The check reads the caller's
    permissions only: with the role on the subnet it goes through."""
    from reconciler.errors import ReconcileError

    cfg, opts = _config(tmp_path), options(arm)
    _assign(arm, subnet=False)
    with pytest.raises(ReconcileError, match="(?s)refusing to apply; nothing was changed:.*may not "
                                             "Microsoft.Network/virtualNetworks/subnets/join/action") as e:
        api.apply(cfg, provider="azure", options=opts)
    assert ARM_SUBNET in str(e.value) and not arm.requests("PUT") and arm.snapshot() == {}
    _assign(arm)
    assert api.apply(cfg, provider="azure", options=opts).report.ok and len(arm.snapshot()) == 4
    assert all("microsoft.authorization/permissions" in p.lower() for p in arm.requests("GET", "/permissions"))


def test_permissions_are_each_roles_actions_less_its_not_actions_added_up_across_roles():
    """RBAC: NotActions is no deny; it only narrows its own role, and another role may grant what it left out."""
    from providers.azure import permitted

    contributor = {"actions": ["Microsoft.Compute/*"], "notActions": ["Microsoft.Compute/*/delete"]}
    assert permitted([contributor], "microsoft.compute/virtualMachines/WRITE")
    assert not permitted([contributor], "Microsoft.Compute/virtualMachines/delete")
    assert permitted([contributor, {"actions": ["*/delete"], "notActions": []}], "Microsoft.Compute/virtualMachines/delete")
    assert not permitted([{"actions": ["*/read"], "notActions": []}], "Microsoft.Compute/virtualMachines/write")
    assert not permitted([], "Microsoft.Compute/virtualMachines/write")


def test_a_permissions_list_arm_will_not_give_refuses_nothing(arm, tmp_path):
    """A scope whose list ARM refuses (403) is not checked: the apply goes on and its calls answer for themselves."""
    cfg, opts = _config(tmp_path), options(arm)
    arm.fail_next(403, "AuthorizationFailed", "not allowed to list permissions", method="GET",
                  path_contains="/providers/Microsoft.Authorization/permissions", count=100)
    assert api.apply(cfg, provider="azure", options=opts).report.ok and len(arm.snapshot()) == 4
    assert arm.requests("GET", "/providers/Microsoft.Authorization/permissions")
