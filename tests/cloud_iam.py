"""What each request the GCE and ARM fakes received asks of the caller, by the clouds' own permission names, so a
test can hold the README's documented roles to what the providers really send: neither fake checks the README's roles (their
RBAC and IAM, ArmFake.assign and GceFake.deny, enforce what a test sets), and a role missing a permission the provider needs is found only by a user, as a 403 on a real project or subscription
(on AWS a missing ec2:DescribeSubnets failed every plan: tests/aws_calls.py does the same for moto).

GCE: the permission each method's REST reference names under "IAM Permissions" (`instances.insert` is
`compute.instances.create`, `zoneOperations.wait` is `compute.zoneOperations.get`), plus what an insert body's fields
ask for ("Create a VM": a new boot disk `compute.disks.create`, its image `compute.images.useReadOnly`, the NIC's
subnet `compute.subnetworks.use`, labels `compute.instances.setLabels`, metadata `compute.instances.setMetadata`, a
service account `compute.instances.setServiceAccount` and `iam.serviceAccounts.actAs`).

ARM: the RBAC action of each request (`Microsoft.Compute/virtualMachines/write` for a VM's PUT) with the scope it is
checked at (a subscription-level list is checked on the subscription, not the resource group), plus the linked
actions a VM's PUT and DELETE ask for on what Compute makes and removes for it: the NIC from
`networkInterfaceConfigurations` (`networkInterfaces/write`, `join/action`, and the subnet's `subnets/join/action`),
the OS disk, a named capacity reservation group (`capacityReservationGroups/deploy/action`)."""

from __future__ import annotations

import re

_GCE = "/compute/v1/projects/[^/]+/"
# (method, path pattern after /compute/v1/projects/P/) -> permission
_GCE_METHODS: list[tuple[str, re.Pattern, str]] = [(m, re.compile(f"^{_GCE}{p}/?$"), perm) for m, p, perm in [
    ("POST", "zones/[^/]+/instances", "compute.instances.create"),
    ("GET", "zones/[^/]+/instances/[^/]+", "compute.instances.get"),
    ("DELETE", "zones/[^/]+/instances/[^/]+", "compute.instances.delete"),
    ("GET", "aggregated/instances", "compute.instances.list"),
    ("GET", "zones/[^/]+/operations/[^/]+", "compute.zoneOperations.get"),
    ("POST", "zones/[^/]+/operations/[^/]+/wait", "compute.zoneOperations.get"),
    ("GET", "zones/[^/]+/operations", "compute.zoneOperations.list"),
    ("GET", "global/images/family/[^/]+", "compute.images.getFromFamily"),
    ("GET", "global/images/[^/]+", "compute.images.get"),
    ("GET", "global/networks/[^/]+", "compute.networks.get"),
    ("GET", "regions/[^/]+/subnetworks/[^/]+", "compute.subnetworks.get"),
    ("GET", "aggregated/machineTypes", "compute.machineTypes.list"),
    ("GET", "aggregated/acceleratorTypes", "compute.acceleratorTypes.list"),
    ("GET", "regions/[^/]+", "compute.regions.get"),
]] + [("GET", re.compile(r"^/compute/v1/projects/[^/]+/?$"), "compute.projects.get")]


def gce_permissions(method: str, path: str) -> str:
    """The permission one GCE request needs; an unknown request is an error (a new call needs its permission named)."""
    for m, pattern, perm in _GCE_METHODS:
        if m == method and pattern.match(path):
            return perm
    raise LookupError(f"no GCE permission known for {method} {path}: name it in tests/cloud_iam.py")


def gce_insert_permissions(body: dict) -> set[str]:
    """What an instances.insert body asks for beyond compute.instances.create."""
    out = set()
    for disk in body.get("disks") or []:
        params = disk.get("initializeParams") or {}
        if params:
            out.add("compute.disks.create")
        if params.get("sourceImage"):
            out.add("compute.images.useReadOnly")
    if body.get("networkInterfaces"):
        out.add("compute.subnetworks.use")  # an auto-mode network's subnet too: GCE picks it, the caller uses it
    if body.get("labels"):
        out.add("compute.instances.setLabels")
    if (body.get("metadata") or {}).get("items"):
        out.add("compute.instances.setMetadata")
    if body.get("serviceAccounts"):
        out |= {"compute.instances.setServiceAccount", "iam.serviceAccounts.actAs"}
    return out


def gce_calls(fake) -> set[str]:
    """Every permission the requests a GceFake received since its start (or since `fake.log` was cleared) need."""
    with fake.lock:
        log, bodies = list(fake.log), [b for _, _, b in fake.insert_bodies]
    log = [(m, p, q) for m, p, q in log if not p.rstrip("/").endswith("/testIamPermissions")]  # (needs none)
    return {gce_permissions(m, p) for m, p, _ in log} | {p for b in bodies for p in gce_insert_permissions(b)}


# ---------------------------------------------------------------------------------------------------------- Azure
SUBSCRIPTION, RESOURCE_GROUP, VNET, SUBNET = "subscription", "resource group", "virtual network", "subnet"
_SUB = "^/subscriptions/[^/]+"
_RG = _SUB + "/resourcegroups/[^/]+"
_VM = _RG + "/providers/microsoft.compute/virtualmachines"
# (method, path pattern, lower case) -> (action, the scope ARM checks it at)
_ARM_METHODS: list[tuple[str, re.Pattern, str, str]] = [(m, re.compile(p + "/?$", re.I), a, s) for m, p, a, s in [
    ("GET", _VM + "/[^/]+", "Microsoft.Compute/virtualMachines/read", RESOURCE_GROUP),
    ("PUT", _VM + "/[^/]+", "Microsoft.Compute/virtualMachines/write", RESOURCE_GROUP),
    ("DELETE", _VM + "/[^/]+", "Microsoft.Compute/virtualMachines/delete", RESOURCE_GROUP),
    ("GET", _VM, "Microsoft.Compute/virtualMachines/read", RESOURCE_GROUP),
    ("GET", _SUB + "/providers/microsoft.compute/virtualmachines", "Microsoft.Compute/virtualMachines/read", SUBSCRIPTION),
    ("GET", _SUB + "/providers/microsoft.compute/skus", "Microsoft.Compute/skus/read", SUBSCRIPTION),
    ("GET", _SUB + "/providers/microsoft.compute/locations/[^/]+/usages", "Microsoft.Compute/locations/usages/read",
     SUBSCRIPTION),
    ("GET", _SUB + "/providers/microsoft.compute/locations/[^/]+/operations/[^/]+",
     "Microsoft.Compute/locations/operations/read", SUBSCRIPTION),
    ("GET", _SUB + "/providers/microsoft.compute/locations/[^/]+/publishers/[^/]+/artifacttypes/vmimage/offers/[^/]+/skus/"
     "[^/]+/versions(?:/[^/]+)?", "Microsoft.Compute/locations/publishers/artifacttypes/offers/skus/versions/read",
     SUBSCRIPTION),
    ("GET", _RG + "/providers/microsoft.network/virtualnetworks/[^/]+", "Microsoft.Network/virtualNetworks/read", VNET),
    ("GET", _RG + "/providers/microsoft.network/virtualnetworks/[^/]+/subnets/[^/]+",
     "Microsoft.Network/virtualNetworks/subnets/read", SUBNET),
]]


# Permissions - List (apply's check) asks what the caller may do; it needs no action of its own.
_PERMISSIONS_LIST = re.compile(r"^/subscriptions/.+/providers/microsoft\.authorization/permissions/?$", re.I)


def arm_action(method: str, path: str) -> tuple[str, str]:
    """(RBAC action, scope kind) of one ARM request; an unknown request is an error."""
    path = path.split("?", 1)[0]
    for m, pattern, action, scope in _ARM_METHODS:
        if m == method and pattern.match(path):
            return action, scope
    raise LookupError(f"no ARM action known for {method} {path}: name it in tests/cloud_iam.py")


def arm_put_actions(body: dict) -> set[tuple[str, str]]:
    """The linked actions a VM's PUT asks for on what Compute makes for it."""
    props = body.get("properties") or {}
    out = {("Microsoft.Compute/disks/write", RESOURCE_GROUP)}  # the OS disk (createOption FromImage)
    if (props.get("networkProfile") or {}).get("networkInterfaceConfigurations"):
        out |= {("Microsoft.Network/networkInterfaces/write", RESOURCE_GROUP),
                ("Microsoft.Network/networkInterfaces/join/action", RESOURCE_GROUP),
                ("Microsoft.Network/virtualNetworks/subnets/join/action", SUBNET)}
    image = ((props.get("storageProfile") or {}).get("imageReference") or {}).get("id")
    if image:
        out.add(("Microsoft.Compute/galleries/images/versions/read" if "/galleries/" in image.lower()
                 else "Microsoft.Compute/images/read", RESOURCE_GROUP))
    if (props.get("capacityReservation") or {}).get("capacityReservationGroup"):
        out.add(("Microsoft.Compute/capacityReservationGroups/deploy/action", RESOURCE_GROUP))
    return out


def arm_delete_actions(vm: dict) -> set[tuple[str, str]]:
    """A VM's DELETE removes what was made with deleteOption Delete: its NIC and OS disk."""
    props = vm.get("properties") or {}
    out = set()
    if ((props.get("storageProfile") or {}).get("osDisk") or {}).get("deleteOption") == "Delete":
        out.add(("Microsoft.Compute/disks/delete", RESOURCE_GROUP))
    if any((n.get("properties") or {}).get("deleteOption") == "Delete"
           for n in (props.get("networkProfile") or {}).get("networkInterfaceConfigurations") or []):
        out.add(("Microsoft.Network/networkInterfaces/delete", RESOURCE_GROUP))
    return out


def arm_calls(fake) -> set[tuple[str, str]]:
    """Every (action, scope kind) the requests an ArmFake received need, its writes' linked actions included."""
    with fake.lock:
        log, puts, deleted = list(fake.log), list(fake.put_bodies), list(fake.deleted_vms)
    log = [(m, p) for m, p in log if not _PERMISSIONS_LIST.match(p.split("?", 1)[0])]
    return ({arm_action(m, p) for m, p in log} | {a for b in puts for a in arm_put_actions(b)}
            | {a for vm in deleted for a in arm_delete_actions(vm)})


# A role assigned at a scope holds at every scope under it.
ENCLOSING = {SUBSCRIPTION: (SUBSCRIPTION,), RESOURCE_GROUP: (RESOURCE_GROUP, SUBSCRIPTION),
             VNET: (VNET, SUBSCRIPTION), SUBNET: (SUBNET, VNET, SUBSCRIPTION)}


def scope_kind(assignable_scope: str) -> str:
    """The kind of scope a role definition's AssignableScopes entry names."""
    parts = assignable_scope.strip("/").lower().split("/")
    if len(parts) == 2:
        return SUBSCRIPTION
    if len(parts) == 4:
        return RESOURCE_GROUP
    if parts[-2:-1] == ["subnets"]:
        return SUBNET
    if parts[-2:-1] == ["virtualnetworks"]:
        return VNET
    raise ValueError(f"unknown scope {assignable_scope}")
