"""Plan-time check of an Azure pool's `subnet_id` (issue 22 item 6), without azure-mgmt-network.

Compute creates each VM's NIC in the pool's subnet, and a NIC can only join a virtual network of its own
subscription and location. A mistyped subnet, or one of another region's VNet, therefore fails every VM create of an
apply (ARM: 400 InvalidResourceReference "Resource .../subnets/x referenced by resource .../networkInterfaces/y was
not found. Please make sure that the referenced resource exists, and that both resources are in the same region").
Reading the subnet (Subnets - Get) and its VNet (Virtual Networks - Get: a subnet carries no location) before any
create turns that into one error naming the pool.

The reads go through the Compute client's own ARM pipeline (`send_request`: the same credential, endpoint, TLS
settings and retry policy), so no Network SDK is needed. Parsing and the verdict are pure functions; `check_subnet`
does the two GETs through a `read` callable the provider supplies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

# Subnets - Get / Virtual Networks - Get (Microsoft.Network stable 2023-09-01; both GETs exist in every version).
NETWORK_READ_API_VERSION = "2023-09-01"
# ARM's naming rules: a subscription is a GUID; a resource group word characters, '.', '-', '(' and ')'; a VNet and a
# subnet word characters, '.' and '-'. Anything else could not be a resource (nor be put in a request path as is).
_SUBNET_ID = re.compile(r"^/subscriptions/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})/resourceGroups/"
                        r"([\w.()-]{1,90})/providers/Microsoft\.Network/virtualNetworks/([\w.-]{1,64})/subnets/([\w.-]{1,80})$",
                        re.I)
SUBNET_ID_FORM = "/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Network/virtualNetworks/<vnet>/subnets/<subnet>"


class NotReadable(Exception):
    """The account may not read this network resource (403): it may still join the subnet (join/action)."""

    def __init__(self, what: str, detail: str):
        super().__init__(f"{what}: {detail}")
        self.what, self.detail = what, detail


@dataclass(frozen=True)
class SubnetRef:
    subscription: str
    resource_group: str
    vnet: str
    subnet: str

    @property
    def vnet_path(self) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/Microsoft.Network/"
                f"virtualNetworks/{self.vnet}")

    @property
    def subnet_path(self) -> str:
        return f"{self.vnet_path}/subnets/{self.subnet}"


def parse_subnet_id(subnet_id: str) -> SubnetRef | None:
    """The parts of a subnet resource id, or None if it is not one."""
    m = _SUBNET_ID.fullmatch(subnet_id)
    return SubnetRef(*m.groups()) if m else None


def subnet_problem(subnet_id: str, subscription: str, region: str, vnet_location: str | None) -> str | None:
    """Why VMs of `subscription` in `region` cannot use this subnet, or None. The subnet is known to exist;
    `vnet_location` is None when its VNet could not be read (the region is then not judged)."""
    ref = parse_subnet_id(subnet_id)
    if ref is None:
        return f"is not a subnet resource id ({SUBNET_ID_FORM})"
    if ref.subscription.lower() != subscription.lower():
        return (f"is in subscription {ref.subscription}, not the pool's {subscription} (a NIC can only join a virtual "
                "network of its own subscription)")
    if vnet_location is not None and _region(vnet_location) != _region(region):
        return (f"belongs to virtual network {ref.vnet} in {vnet_location}, not the pool's region {region} (a NIC can only "
                "join a virtual network of its own location)")
    return None


def _region(location: str) -> str:
    """ARM answers a location as `eastus`; templates and the portal also write `East US`."""
    return location.replace(" ", "").lower()


def check_subnet(subnet_id: str, subscription: str, region: str,
                 read: Callable[[str, str], dict | None], warn: Callable[[str], None]) -> str | None:
    """Why the pool cannot use `subnet_id` (a reason to print after the field's name), or None when it can.

    `read(path, api_version)` GETs an ARM resource: its JSON, None for 404; NotReadable for 403; anything else
    (5xx, timeouts) propagates as the provider's own error, so an outage is transient and never a refusal. A subnet the
    account may not read (it may hold only subnets/join/action) or whose VNet it may not read is not judged: `warn`
    says so and the check passes, since the create may well succeed."""
    if (problem := subnet_problem(subnet_id, subscription, region, None)) is not None:
        return problem  # not a subnet id, or another subscription's: nothing to read
    ref = parse_subnet_id(subnet_id)
    assert ref is not None
    try:
        if read(ref.subnet_path, NETWORK_READ_API_VERSION) is None:
            return (f"does not exist (no subnet {ref.subnet} in virtual network {ref.vnet} of resource group "
                    f"{ref.resource_group})")
    except NotReadable as e:
        warn(f"cannot read it ({e.detail}), so it is not checked; Network Contributor (or "
             "Microsoft.Network/virtualNetworks/subnets/read) on it lets the plan check it")
        return None
    try:
        vnet = read(ref.vnet_path, NETWORK_READ_API_VERSION)
    except NotReadable as e:
        warn(f"its virtual network {ref.vnet} cannot be read ({e.detail}), so its region is not checked; "
             "Reader on the virtual network lets the plan check it")
        return None
    if vnet is None:  # deleted between the two reads
        return f"does not exist (no virtual network {ref.vnet} in resource group {ref.resource_group})"
    return subnet_problem(subnet_id, subscription, region, str(vnet.get("location") or "") or None)
