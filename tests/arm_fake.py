"""A small Azure Resource Manager fake: the Microsoft.Compute/virtualMachines subset, over HTTPS.

It speaks the wire protocol the real SDK expects, so tests drive
azure.mgmt.compute.ComputeManagementClient unmodified:

* PUT/GET/DELETE .../resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}
  and GET .../virtualMachines (a page of `value` plus `nextLink`), api-version required;
* PUT answers 201 with provisioningState "Creating" and an Azure-AsyncOperation URL,
  DELETE answers 202 with Azure-AsyncOperation and Location URLs (204 if already gone);
  an operation runs `latency` seconds of the fake's clock (tests/fakeclock.py: a test may freeze or advance it) and
  ends then whether or not anyone polls it, as ARM's do ("Track asynchronous Azure operations", MicrosoftDocs
  azure-docs articles/azure-resource-manager/management/async-operations.md; the RPC's async-api-reference.md: the
  resource's provisioningState stays non-terminal while its operation runs): until then a GET or list of the VM shows
  provisioningState "Creating" (or "Deleting") and its instance view no PowerState, and its status is "InProgress"
  (the Location URL answers 202); with `retry_after` set, the 201/202 and every InProgress answer carry Retry-After
  (seconds), as that article documents;
* a PUT or DELETE of a VM whose create is still under way preempts the create: its operation ends "Canceled" with
  OperationPreempted (PREEMPTED) while the newer operation carries on (a PUT allocates the VM as the create would
  have, a DELETE removes it); before, a PUT mid-create was a silent tag update and the create still succeeded;
* a PUT to an existing VM is an update: its tags and size change; a change of location, zones, image, OS profile
  (customData and adminPassword compared with what the create sent, as GET never shows them) or priority is refused
  409 PropertyChangeNotAllowed "Changing property 'X' is not allowed." (InvalidResourceLocation for a location);
* an allocation failure is an asynchronous operation that ends "Failed" with the
  ARM error (code ZonalAllocationFailed ...) and leaves the VM in provisioningState
  "Failed", as Azure does, its instance view saying why (ProvisioningState/failed/<code>); failed_at_once answers
  such a create 200 with the VM already Failed, with its operation's URL or none; synchronous errors use the ARM error body
  {"error": {"code", "message", "target"?}};
* bearer tokens are checked, resource groups and path segments are case-insensitive,
  and list responses spell the resource group in upper case in `id` (Compute does).

The request body is validated the way ARM would reject it (tag names, spot settings,
a NIC, an image, a Linux SSH key), so a provider bug shows up as a 400 and not as a
silently accepted VM. Test-side fault injection: exhaust(), plant(), power_off(), lose_host(), fail_next(), throttle_reads(), and
hold_creates() / end_held() (an allocation still InProgress however long it runs, then ended by the test).
GET .../providers/Microsoft.Compute/virtualMachines?statusOnly=true lists a subscription's VMs with their instance views.
GET .../providers/Microsoft.Compute/locations/{l}/publishers/{p}/artifacttypes/vmimage/offers/{o}/skus/{s}/versions[/{v}]
lists (or gets) the marketplace image versions it holds (MARKETPLACE_IMAGES, add_image()); an unknown one is 404
NotFound, and a VM create naming one is 404 PlatformImageNotFound, as ARM answers.
GET .../providers/Microsoft.Compute/locations/{l}/usages lists the subscription's compute quotas in a location as ARM
does ({"unit": "Count", "currentValue", "limit", "name": {"value", "localizedValue"}}): `cores` (Total Regional
vCPUs), `lowPriorityCores` (Spot), and each VM family's vCPUs (the resource SKUs' `family`), counted from the VMs
there that hold capacity (a deallocated VM does not); set_quota() sets a limit (else DEFAULT_QUOTA). A create past a
limit is refused at once with 409 OperationNotAllowed "... results in exceeding approved <family> Cores quota ...".
GET .../providers/Microsoft.Network/virtualNetworks/{vnet}[/subnets/{subnet}] (Virtual Networks - Get, Subnets - Get)
serves the networks add_network() made, in the documented shapes (a subnet carries no location; its VNet does); else
404 ResourceGroupNotFound / ResourceNotFound (no VNet) / NotFound (no such subnet in the VNet), and 403
AuthorizationFailed for a VNet forbid_read() names (an account holding a role on the subnet only). A VM create whose
NIC names a subnet that does not exist, or one of another subscription or location, is 400 InvalidResourceReference
(a malformed id 400 LinkedInvalidPropertyId), as ARM answers: a NIC joins only a VNet of its own subscription and
location.
Capacity reservation groups (add_capacity_reservation_group; associated_vms): a VM consumes a targeted group's reserved
capacity only when its create names the group ("To associate a new virtual machine to the capacity reservation group,
the group must be explicitly referenced as a property of the VM", Associate a VM to a capacity reservation group:
properties.capacityReservation.capacityReservationGroup.id); a VM that names none is associated with nothing. A
malformed group id is 400 LinkedInvalidPropertyId, a group that does not exist or is in another location 400
InvalidParameter (the fake's wording). More VMs than reserved may be associated (Azure documents overallocation).
RBAC (assign(); off until a test assigns a role, every caller then an Owner): each request is authorised as ARM does,
against the roles assigned at its scope or one enclosing it (Actions less NotActions, `*` a wildcard): the action
tests/cloud_iam.py names for it, and for a VM's PUT the linked actions on what it references (the subnet's join, a
capacity reservation group's deploy, an image's read, and the NIC and OS disk Compute makes) and for its DELETE what
goes with it. A refusal is ARM's 403 AuthorizationFailed ("... does not have authorization to perform action 'A' over
scope 'S' or the scope is invalid ...") or, for a linked action, 403 LinkedAuthorizationFailed ("... has permission to
perform action 'Microsoft.Compute/virtualMachines/write' on scope 'S'; however, it does not have permission to perform
action(s) 'A' on the linked scope(s) 'L' (respectively) or the linked scope(s) are invalid."). GET
{scope}/providers/Microsoft.Authorization/permissions (Permissions - List For Resource Group / For Resource,
2022-04-01) lists the caller's: {"value": [{"actions", "notActions", "dataActions", "notDataActions"}]}, one entry per
role assigned there or above.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
import json
import re
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.fakeclock import FakeClock

TOKEN = "fake-for-tests"  # the bearer providers.azure's test-only credential hands out; any other is 401
VM_TYPE = "Microsoft.Compute/virtualMachines"
ZONES = ("1", "2", "3")
TAG_NAME_FORBIDDEN = set('<>%&\\?/')

_VM = re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/virtualmachines(?:/([^/]+))?/?$", re.I)
_IMAGE_VERSIONS = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/locations/([^/]+)/publishers/([^/]+)"
                             r"/artifacttypes/vmimage/offers/([^/]+)/skus/([^/]+)/versions(?:/([^/]+))?/?$", re.I)
# (publisher, offer, sku) -> versions, in every location: the images the providers and examples use.
MARKETPLACE_IMAGES = {("canonical", "ubuntu-24_04-lts", "server"): ("24.04.202501140",),
                      ("microsoft-dsvm", "ubuntu-hpc", "2204"): ("22.04.2024043001", "22.04.2025011801")}
_SKUS = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/skus/?$", re.I)
# VM sizes the fake's regions offer, in every zone unless restricted (restrict_sku).
SKU_SIZES = ("Standard_NC4as_T4_v3", "Standard_NC64as_T4_v3", "Standard_NC24ads_A100_v4", "Standard_NC96ads_A100_v4",
             "Standard_NC40ads_H100_v5", "Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5",
             "Standard_NV36ads_A10_v5", "Standard_D16s_v5", "Standard_NC8as_T4_v3", "Standard_NC16as_T4_v3",
             "Standard_NC48ads_A100_v4", "Standard_NV36adms_A10_v5", "Standard_D4s_v5", "Standard_D8s_v5", "Standard_D32s_v5")
SKU_LOCATIONS = ("eastus", "westeurope")
# Each size's quota family and vCPUs, as the resource SKU list reports them (`family`, capability `vCPUs`).
SKU_FAMILIES = {"Standard_NC4as_T4_v3": ("standardNCASv3_T4Family", 4), "Standard_NC64as_T4_v3": ("standardNCASv3_T4Family", 64),
                "Standard_NC24ads_A100_v4": ("StandardNCADSA100v4Family", 24), "Standard_NC96ads_A100_v4": ("StandardNCADSA100v4Family", 96),
                "Standard_NC40ads_H100_v5": ("StandardNCadsH100v5Family", 40), "Standard_ND96asr_v4": ("standardNDASv4Family", 96),
                "Standard_ND96amsr_A100_v4": ("standardNDAMSv4_A100Family", 96), "Standard_ND96isr_H100_v5": ("standardNDSH100v5Family", 96),
                "Standard_NV36ads_A10_v5": ("StandardNVADSA10v5Family", 36), "Standard_D16s_v5": ("standardDSv5Family", 16),
                "Standard_NC8as_T4_v3": ("standardNCASv3_T4Family", 8), "Standard_NC16as_T4_v3": ("standardNCASv3_T4Family", 16),
                "Standard_NC48ads_A100_v4": ("StandardNCADSA100v4Family", 48),
                "Standard_NV36adms_A10_v5": ("StandardNVADSA10v5Family", 36), "Standard_D4s_v5": ("standardDSv5Family", 4),
                "Standard_D8s_v5": ("standardDSv5Family", 8), "Standard_D32s_v5": ("standardDSv5Family", 32)}
DEFAULT_QUOTA = 10000  # a limit no test fleet reaches unless a test sets one
_USAGES = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/locations/([^/]+)/usages/?$", re.I)
_NETWORK = re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/virtualnetworks/([^/]+)"
                      r"(?:/subnets/([^/]+))?/?$", re.I)
_ALL_VMS = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/virtualmachines/?$", re.I)
_CAPACITY_GROUP = re.compile(r"^/?subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/"
                             r"capacityreservationgroups/([^/]+)/?$", re.I)
_PERMISSIONS = re.compile(r"^/subscriptions/.+/providers/microsoft\.authorization/permissions/?$", re.I)
_CLIENT, _OBJECT_ID = "fleetops-test", "00000000-0000-0000-0000-0000000000ab"


def _encloses(scope: str, path: str) -> bool:
    """A role assigned at `scope` holds at `path` (the scope itself or anything under it)."""
    path = path.rstrip("/").lower()
    return path == scope or path.startswith(scope + "/")


def _any_match(patterns, action: str) -> bool:
    return any(re.fullmatch(".*".join(map(re.escape, p.lower().split("*"))), action.lower()) for p in patterns)


_OP = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/locations/([^/]+)/operations/([^/]+)/?$", re.I)


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (CA:TRUE, so it can be its own trust anchor)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "arm-fake.local")])
    now = dt.datetime.now(dt.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "arm-fake.pem", directory / "arm-fake.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str, target: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.target, self.headers = status, code, message, target, headers or {}

    def body(self) -> dict:
        err = {"code": self.code, "message": self.message}
        if self.target:
            err["target"] = self.target
        return {"error": err}


@dataclass
class Operation:
    id: str
    kind: str  # "create" | "delete"
    key: tuple[str, str, str]  # (subscription, resource group, vm name), lower case
    location: str
    ends_at: float  # the fake clock's time at which it ends (unless held)
    polls: int = 0
    error: dict | None = None  # the ARM error the operation ends with
    held: bool = False  # InProgress until the test ends it (ArmFake.end_held)
    preempted: bool = False  # a later PUT or DELETE of its VM took over: it ended Canceled (OperationPreempted)
    done: bool = False  # ended (Succeeded, Failed, or Canceled if preempted): its effect on the VM is made
    start: str = field(default_factory=lambda: _now())


@dataclass
class Injected:
    status: int
    code: str
    message: str
    method: str | None
    remaining: int
    headers: dict
    path_contains: str | None = None
    skip: int = 0  # matching requests let through before the first that fails


# A write to a VM whose create is still under way (provisioningState Creating) is accepted, and the create's operation
# ends Canceled with this error: the VM goes on being made by the newer operation, or deleted by it. As Compute answers
# it ("status": "Canceled", "error": {"code": "OperationPreempted", ...}: Azure/azure-sdk-for-java#1783, a VM deleted
# while it was being created; terraform-provider-azurerm and osbuild-composer#1447 report VM creates ending so, and
# kubernetes-sigs/cloud-provider-azure#5926 retries a PUT preempted so).
PREEMPTED = {"code": "OperationPreempted", "message": "Operation execution has been preempted by a more recent operation."}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


class ArmFake:
    """The in-memory ARM. Start with start(); base_url and ca_path are then set."""

    def __init__(self, cert_dir: Path, *, subscription: str = "00000000-0000-0000-0000-00000000f1ee",
                 resource_groups: tuple[str, ...] = ("fleet-rg",), page_size: int = 20):
        self.subscription = subscription
        self.resource_groups = {rg.lower(): rg for rg in resource_groups}
        self.page_size = page_size
        self.token = TOKEN  # tests may rotate it to see a 401
        self.vms: dict[tuple[str, str, str], dict] = {}  # (sub, rg, name) lower -> VM JSON as stored
        # osProfile.customData as created: ARM never returns it on GET, so tests read it here
        self.custom_data: dict[tuple[str, str, str], str] = {}
        self.admin_passwords: dict[tuple[str, str, str], str] = {}  # what a create sent, never shown by GET
        self.ops: dict[str, Operation] = {}
        self.log: list[tuple[str, str]] = []  # (method, path?query) of every request, for assertions
        self.put_bodies: list[dict] = []  # the body of every VM PUT, and every VM a DELETE removed (tests/cloud_iam.py)
        self.deleted_vms: list[dict] = []
        self.exhausted: dict[tuple[str, str], str] = {}  # (location, zone) -> error code
        self.sku_restrictions: dict[tuple[str, str], tuple[str, ...]] = {}  # (location, size) -> zones not offered
        self.power: dict[tuple[str, str, str], str] = {}  # (sub, rg, name) lower -> power state, when not "running"
        self.images: dict[tuple[str, str, str], tuple[str, ...]] = dict(MARKETPLACE_IMAGES)
        self.quota_limits: dict[tuple[str, str], int] = {}  # (location, usage name lower case) -> limit
        # Virtual networks: (sub, rg, vnet) lower -> {"name", "resource_group", "location", "subnets": {lower: name}}
        self.networks: dict[tuple[str, str, str], dict] = {}
        self.unreadable_networks: set[tuple[str, str, str]] = set()  # GET of these VNets is 403 (subnets stay readable)
        self.unreadable_subnets: set[tuple[str, str, str]] = set()  # ... and of their subnets too (a join-only role)
        self.capacity_groups: dict[tuple[str, str, str], str] = {}  # (sub, rg, name) lower -> the group's location
        self._inject: list[Injected] = []
        self.holding = False  # hold_creates(): create operations stay InProgress until end_held()
        self.clock = FakeClock()  # what operations progress by (freeze/advance it to hold or end them)
        self.latency = 0.05  # seconds (of self.clock) an operation runs: a real VM create takes minutes
        self.retry_after: int | None = None  # Retry-After (seconds) on accepted writes and InProgress polls, if set
        # A create in an exhausted zone answered 200 with the VM already provisioningState Failed, its operation ended
        # at once: with its operation's Azure-AsyncOperation URL ("operation", the operation Failed with the allocation
        # error at its first poll), or with none ("body": the resource's provisioningState is all the SDK's poller has).
        # None: 201 Creating, the allocation failing `latency` later.
        self.failed_at_once: str | None = None
        self.failures: dict[tuple[str, str, str], dict] = {}  # (sub, rg, name) lower -> the error its allocation failed with
        self._stalls: list[list] = []  # stall(): [seconds, method, count left]
        self.roles: list[tuple[str, tuple[str, ...], tuple[str, ...]]] | None = None  # assign(): (scope, actions, notActions)
        self.lock = threading.RLock()
        self.cert_path, self._key_path = make_certificate(cert_dir)
        self.base_url = ""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def ca_path(self) -> str:
        return str(self.cert_path)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> "ArmFake":
        fake = self

        class Handler(_Handler):
            arm = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_path, self._key_path)
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self.base_url = f"https://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="arm-fake",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)  # type: ignore[union-attr]
            self._server = None

    # -- fault injection and inspection (test side) --------------------------------
    def exhaust(self, location: str, zone: str, code: str = "ZonalAllocationFailed") -> None:
        """Every later VM create in this zone fails asynchronously with `code`."""
        with self.lock:
            self.exhausted[(location.lower(), zone)] = code

    def replenish(self, location: str, zone: str) -> None:
        with self.lock:
            self.exhausted.pop((location.lower(), zone), None)

    def fail_next(self, status: int, code: str, message: str, *, method: str | None = None, count: int = 1,
                  headers: dict | None = None, path_contains: str | None = None, after: int = 0) -> None:
        """The next `count` requests (of `method`, and whose path contains `path_contains`, if given) fail
        synchronously with this ARM error; with `after`, only once that many matching requests have gone through."""
        with self.lock:
            self._inject.append(Injected(status, code, message, method, count, headers or {}, path_contains, after))

    def clear_faults(self) -> None:
        """Forget every fault fail_next(), throttle_reads() and stall() set that has not been used up."""
        with self.lock:
            self._inject.clear()
            self._stalls.clear()

    def throttle_reads(self, retry_after: str, *, after: int = 0, count: int = 10**6) -> None:
        """ARM's read throttling (its read limits are apart from its write limits): once `after` more GETs have gone
        through, the next `count` GETs (a VM's, a list's, an operation's status) are answered 429 TooManyRequests with
        this Retry-After, as ARM answers a subscription's reads past its limit."""
        self.fail_next(429, "TooManyRequests", "The request is being throttled as the limit has been reached for "
                       "operation type - Read_ObservationWindow_00:05:00.", method="GET", count=count, after=after,
                       headers={"Retry-After": retry_after, "x-ms-ratelimit-remaining-subscription-reads": "0"})

    def stall(self, seconds: float, *, method: str | None = None, count: int = 1) -> None:
        """The next `count` requests (of `method`, if given) are answered only after `seconds`: an ARM connection that
        went silent (a dropped path, an overloaded front door), which only the client's read timeout ends."""
        with self.lock:
            self._stalls.append([seconds, method, count])

    def hold_creates(self) -> None:
        """Later VM creates stay InProgress (provisioningState Creating) however long they run, as a slow
        allocation does, until end_held()."""
        with self.lock:
            self.holding = True

    def end_held(self, error_code: str | None = None) -> list[str]:
        """Stop holding: every held create ends now, Succeeded, or Failed with `error_code` (the VM left in
        provisioningState Failed with no power state, as after a failed allocation). The names of the VMs ended."""
        with self.lock:
            self._settle()
            self.holding = False
            ended = []
            for op in self.ops.values():
                if op.kind == "create" and op.held and op.preempted:
                    op.held = False  # (it ended when it was preempted)
                elif op.kind == "create" and op.held and op.key in self.vms:
                    if error_code is not None:
                        op.error = {"code": error_code, "message": "Allocation failed. We do not have sufficient capacity "
                                    "for the requested VM size in this zone."}
                    op.held, op.ends_at = False, self.clock.now()
                    ended.append(self.vms[op.key]["name"])
            self._settle()
            return sorted(ended)

    def plant(self, name: str, *, resource_group: str | None = None, tags: dict | None = None, location: str = "eastus",
              zone: str | None = "1", vm_size: str = "Standard_NC4as_T4_v3", priority: str | None = None,
              provisioning_state: str = "Succeeded") -> dict:
        """A VM that someone else created (provisioningState Succeeded; a Failed one has no power state)."""
        rg = resource_group or next(iter(self.resource_groups.values()))
        body = {"location": location, "tags": tags or {}, "properties": {
            "hardwareProfile": {"vmSize": vm_size},
            "storageProfile": {"imageReference": {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server",
                                                  "version": "latest"}},
        }}
        if zone:
            body["zones"] = [zone]
        if priority:
            body["properties"]["priority"] = priority
        with self.lock:
            vm = self._new_vm(self.subscription, rg, name, body)
            vm["properties"]["provisioningState"] = provisioning_state
            self.vms[(self.subscription.lower(), rg.lower(), name.lower())] = vm
            return copy.deepcopy(vm)

    def restrict_sku(self, location: str, size: str, zones: tuple[str, ...]) -> None:
        """`size` is not offered to this subscription in these zones of `location`: the resource SKU list carries a
        Zone restriction (reasonCode NotAvailableForSubscription), and creates there fail with SkuNotAvailable."""
        with self.lock:
            self.sku_restrictions[(location.lower(), size)] = tuple(zones)

    def list_skus(self, sub: str, flt: str | None) -> dict:
        """GET /subscriptions/{sub}/providers/Microsoft.Compute/skus (api-version 2021-07-01): resource SKUs with
        locationInfo zones and restrictions, in the documented shape; `$filter=location eq '<region>'` narrows it."""
        if sub.lower() != self.subscription.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        m = re.fullmatch(r"\s*location\s+eq\s+'([^']+)'\s*", flt or "") if flt else None
        if flt and m is None:
            raise ArmError(400, "InvalidFilter", f"The filter '{flt}' is not supported; only location eq '<location>' is.")
        out = []
        for loc in SKU_LOCATIONS:
            if m and m.group(1).lower() != loc:
                continue
            for size in SKU_SIZES:
                restricted = self.sku_restrictions.get((loc, size), ())
                family, vcpus = SKU_FAMILIES[size]
                sku = {"resourceType": "virtualMachines", "name": size, "tier": "Standard", "size": size[len("Standard_"):],
                       "family": family, "locations": [loc],
                       "locationInfo": [{"location": loc, "zones": list(ZONES), "zoneDetails": []}],
                       "capabilities": [{"name": "vCPUs", "value": str(vcpus)}], "restrictions": []}
                if restricted:
                    sku["restrictions"].append({"type": "Zone", "values": [loc], "restrictionInfo": {
                        "locations": [loc], "zones": list(restricted)}, "reasonCode": "NotAvailableForSubscription"})
                out.append(sku)
        return {"value": out}

    def set_quota(self, location: str, name: str, limit: int) -> None:
        """The limit of a compute quota (usage name: cores, lowPriorityCores, a family) in a location."""
        with self.lock:
            self.quota_limits[(location.lower(), name.lower())] = limit

    def _quota_names(self, location: str) -> dict[str, str]:
        """usage name lower case -> (name as ARM spells it)."""
        return {"cores": "cores", "lowprioritycores": "lowPriorityCores", **{f.lower(): f for f, _ in SKU_FAMILIES.values()}}

    def _charges(self, vm: dict) -> list[tuple[str, int]]:
        """(usage name lower case, vCPUs) a VM takes while it holds capacity."""
        size = vm["properties"]["hardwareProfile"]["vmSize"]
        family, vcpus = SKU_FAMILIES.get(size, ("", 0))
        if vm["properties"].get("priority") in ("Spot", "Low"):
            return [("lowprioritycores", vcpus)]
        return [("cores", vcpus), (family.lower(), vcpus)]

    def _used(self, location: str) -> dict[str, int]:
        used: dict[str, int] = {}
        for (sub, rg, name), vm in self.vms.items():
            if vm["location"] != location.lower() or vm["properties"].get("provisioningState") in ("Failed", "Deleting"):
                continue
            if self.power.get((sub, rg, name), "running") == "deallocated":
                continue
            for k, n in self._charges(vm):
                used[k] = used.get(k, 0) + n
        return used

    def usages(self, sub: str, location: str) -> dict:
        if sub.lower() != self.subscription.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        used = self._used(location)
        local = {"cores": "Total Regional vCPUs", "lowprioritycores": "Total Regional Low-priority vCPUs"}
        return {"value": [{"unit": "Count", "currentValue": used.get(k, 0),
                           "limit": self.quota_limits.get((location.lower(), k), DEFAULT_QUOTA),
                           "name": {"value": v, "localizedValue": local.get(k, f"{v} vCPUs")}}
                          for k, v in sorted(self._quota_names(location).items())]}

    def _over_quota(self, vm: dict) -> ArmError | None:
        used = self._used(vm["location"])
        for k, n in self._charges(vm):
            limit = self.quota_limits.get((vm["location"], k), DEFAULT_QUOTA)
            if used.get(k, 0) + n > limit:
                name = {"cores": "Total Regional Cores", "lowprioritycores": "LowPriorityCores"}.get(k, self._quota_names(vm["location"])[k] + " Cores")
                return ArmError(409, "OperationNotAllowed", (
                    f"Operation could not be completed as it results in exceeding approved {name} quota. Additional details - "
                    f"Deployment Model: Resource Manager, Location: {vm['location']}, Current Limit: {limit}, Current Usage: "
                    f"{used.get(k, 0)}, Additional Required: {n}, (Minimum) New Limit Required: {used.get(k, 0) + n}. Submit a "
                    "request for Quota increase at https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/"
                    "UsageAndQuota.ReactView/Parameters/ by specifying parameters listed in the 'Details' section for "
                    "deployment to succeed."))
        return None

    def add_image(self, publisher: str, offer: str, sku: str, *versions: str) -> None:
        """A marketplace image (publisher:offer:sku, with these versions) that VMs may be created from."""
        with self.lock:
            self.images[(publisher.lower(), offer.lower(), sku.lower())] = versions

    def image_versions(self, sub: str, location: str, publisher: str, offer: str, sku: str, version: str | None):
        versions = self.images.get((publisher.lower(), offer.lower(), sku.lower()), ())
        if version is not None:
            versions = tuple(v for v in versions if v.lower() == version.lower())
        if not versions:
            raise ArmError(404, "NotFound", "Artifact: VMImage was not found.")
        docs = [{"location": location, "name": v, "id": f"/Subscriptions/{sub}/Providers/Microsoft.Compute/Locations/{location}"
                 f"/Publishers/{publisher}/ArtifactTypes/VMImage/Offers/{offer}/Skus/{sku}/Versions/{v}"} for v in versions]
        return docs[0] if version is not None else sorted(docs, key=lambda d: d["name"], reverse=True)

    def add_network(self, vnet: str, *, resource_group: str, location: str = "eastus", subnets: tuple[str, ...] = ("default",),
                    subscription: str | None = None) -> list[str]:
        """A virtual network (in its own resource group, as networks often are) with these subnets; their ids."""
        sub = subscription or self.subscription
        with self.lock:
            self.networks[(sub.lower(), resource_group.lower(), vnet.lower())] = {
                "name": vnet, "resource_group": resource_group, "location": location.lower(),
                "subnets": {n.lower(): n for n in subnets}}
        return [self._network_id(sub, resource_group, vnet) + f"/subnets/{n}" for n in subnets]

    def assign(self, scope: str, actions: list[str], not_actions: list[str] = ()) -> None:  # type: ignore[assignment]
        """A role assignment to the caller at `scope` (a resource id: subscription, group, resource); the first turns RBAC
        on: from then on a request no assigned role grants is refused, as ARM refuses it."""
        with self.lock:
            self.roles = (self.roles or []) + [(scope.rstrip("/").lower(), tuple(actions), tuple(not_actions))]

    def permissions(self, scope: str) -> list[dict]:
        """The caller's roles that hold at `scope`, as Permissions - List answers them."""
        if self.roles is None:
            return [{"actions": ["*"], "notActions": [], "dataActions": [], "notDataActions": []}]
        return [{"actions": list(a), "notActions": list(n), "dataActions": [], "notDataActions": []}
                for at, a, n in self.roles if _encloses(at, scope)]

    def granted(self, action: str, scope: str) -> bool:
        return any(_any_match(e["actions"], action) and not _any_match(e["notActions"], action) for e in self.permissions(scope))

    def authorize(self, method: str, path: str, raw: bytes) -> None:
        """Refuse the request as ARM would when RBAC is on (assign()) and no role grants what it needs."""
        from tests.cloud_iam import RESOURCE_GROUP, SUBNET, arm_action, arm_delete_actions, arm_put_actions

        if self.roles is None:
            return
        try:
            action, _ = arm_action(method, path)
        except LookupError:
            return  # (a request tests/cloud_iam.py names no action for: not checked)
        if not self.granted(action, path):
            raise ArmError(403, "AuthorizationFailed", f"The client '{_CLIENT}' with object id '{_OBJECT_ID}' does not have "
                           f"authorization to perform action '{action}' over scope '{path}' or the scope is invalid. If "
                           "access was recently granted, please refresh your credentials.")
        m = _VM.match(path)
        if m is None or m.group(3) is None or method not in ("PUT", "DELETE"):
            return
        group = path.split("/providers/", 1)[0]
        if method == "PUT":
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return
            props = body.get("properties") or {}
            linked = []
            for a, kind in sorted(arm_put_actions(body)):
                at = group
                if kind == SUBNET:
                    nics = (props.get("networkProfile") or {}).get("networkInterfaceConfigurations") or [{}]
                    at = (((nics[0].get("properties") or {}).get("ipConfigurations") or [{}])[0].get("properties") or {}).get(
                        "subnet", {}).get("id", group)
                elif a.startswith("Microsoft.Compute/capacityReservationGroups/"):
                    at = props["capacityReservation"]["capacityReservationGroup"]["id"]
                elif a.endswith(("images/read", "versions/read")):
                    at = props["storageProfile"]["imageReference"]["id"]
                assert kind in (RESOURCE_GROUP, SUBNET)
                if not self.granted(a, at):
                    linked.append((a, at))
        else:
            vm = self.vms.get(tuple(x.lower() for x in m.groups()))  # type: ignore[arg-type]
            linked = [(a, group) for a, _ in sorted(arm_delete_actions(vm or {})) if not self.granted(a, group)]
        if linked:
            raise ArmError(403, "LinkedAuthorizationFailed", f"The client '{_CLIENT}' with object id '{_OBJECT_ID}' has "
                           f"permission to perform action '{action}' on scope '{path}'; however, it does not have permission "
                           f"to perform action(s) '{','.join(a for a, _ in linked)}' on the linked scope(s) "
                           f"'{','.join(at for _, at in linked)}' (respectively) or the linked scope(s) are invalid.")

    def forbid_read(self, vnet: str, *, resource_group: str, subnets: bool = False, subscription: str | None = None) -> None:
        """The caller may not read this VNet (403 AuthorizationFailed), as with a role assigned on a subnet only; with
        `subnets`, nor its subnets, as with a role holding only Microsoft.Network/virtualNetworks/subnets/join/action."""
        key = ((subscription or self.subscription).lower(), resource_group.lower(), vnet.lower())
        with self.lock:
            self.unreadable_networks.add(key)
            if subnets:
                self.unreadable_subnets.add(key)

    @staticmethod
    def _network_id(sub: str, rg: str, vnet: str) -> str:
        return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{vnet}"

    def get_network(self, sub: str, rg: str, vnet: str, subnet: str | None) -> dict:
        """Virtual Networks - Get / Subnets - Get (Microsoft.Network 2023-09-01 shapes, trimmed to what matters)."""
        if sub.lower() != self.subscription.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        if rg.lower() not in self.resource_groups and not any(k[1] == rg.lower() for k in self.networks):
            raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        key = (sub.lower(), rg.lower(), vnet.lower())
        net = self.networks.get(key)
        if net is None:
            raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.Network/virtualNetworks/{vnet}' under resource "
                                                    f"group '{rg}' was not found. For more details please go to "
                                                    "https://aka.ms/ARMResourceNotFoundFix")
        vnet_id = self._network_id(sub, net["resource_group"], net["name"])
        subnets = [{"name": n, "id": f"{vnet_id}/subnets/{n}", "type": "Microsoft.Network/virtualNetworks/subnets",
                    "properties": {"provisioningState": "Succeeded", "addressPrefix": f"10.0.{i}.0/24"}}
                   for i, n in enumerate(net["subnets"].values())]
        if subnet is not None:
            if key in self.unreadable_subnets:
                raise self._forbidden("virtualNetworks/subnets/read", f"{vnet_id}/subnets/{subnet}")
            for doc in subnets:
                if doc["name"].lower() == subnet.lower():
                    return doc
            raise ArmError(404, "NotFound", f"Resource {vnet_id}/subnets/{subnet} not found.")
        if key in self.unreadable_networks:
            raise self._forbidden("virtualNetworks/read", vnet_id)
        return {"name": net["name"], "id": vnet_id, "type": "Microsoft.Network/virtualNetworks", "location": net["location"],
                "properties": {"provisioningState": "Succeeded", "addressSpace": {"addressPrefixes": ["10.0.0.0/16"]},
                               "subnets": subnets, "virtualNetworkPeerings": []}}

    @staticmethod
    def _forbidden(action: str, scope: str) -> ArmError:
        return ArmError(403, "AuthorizationFailed", "The client 'fleetops-test' with object id '00000000-0000-0000-0000-"
                        f"0000000000ab' does not have authorization to perform action 'Microsoft.Network/{action}' over "
                        f"scope '{scope}' or the scope is invalid. If access was recently granted, please refresh your "
                        "credentials.")

    def _check_nic_subnets(self, sub: str, rg: str, body: dict) -> None:
        """Each NIC's subnet exists, in the VM's subscription and location: else ARM's 400 InvalidResourceReference (the
        NIC Compute would create cannot join it), or 400 LinkedInvalidPropertyId for an id that is not a resource id."""
        location = str(body.get("location", "")).lower()
        net = ((body.get("properties") or {}).get("networkProfile") or {})
        for nic in net.get("networkInterfaceConfigurations") or []:
            for ipc in (nic.get("properties") or {}).get("ipConfigurations") or []:
                subnet_id = str((((ipc.get("properties") or {}).get("subnet")) or {}).get("id") or "")
                m = _NETWORK.match(subnet_id)
                if m is None or m.group(4) is None:
                    raise ArmError(400, "LinkedInvalidPropertyId", f"Property id '{subnet_id}' at path 'properties."
                                   "networkProfile.networkInterfaceConfigurations[0].properties.ipConfigurations[0].properties."
                                   "subnet.id' is invalid. Expect fully qualified resource Id that start with "
                                   "'/subscriptions/{subscriptionId}' or '/providers/{resourceProviderNamespace}/'.")
                n_sub, n_rg, n_vnet, n_subnet = m.groups()
                found = self.networks.get((n_sub.lower(), n_rg.lower(), n_vnet.lower()))
                if (found is None or n_subnet.lower() not in found["subnets"] or n_sub.lower() != sub.lower()
                        or found["location"] != location):
                    nic_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{nic.get('name')}"
                    raise ArmError(400, "InvalidResourceReference", f"Resource {subnet_id} referenced by resource {nic_id} was "
                                   "not found. Please make sure that the referenced resource exists, and that both resources "
                                   "are in the same region.")

    def add_capacity_reservation_group(self, name: str, *, resource_group: str | None = None, location: str = "eastus") -> None:
        """A (targeted) capacity reservation group in the fake's subscription."""
        rg = resource_group or next(iter(self.resource_groups.values()))
        with self.lock:
            self.capacity_groups[(self.subscription.lower(), rg.lower(), name.lower())] = location.lower()

    def associated_vms(self, name: str, resource_group: str | None = None) -> list[str]:
        """The group's virtualMachinesAssociated, by VM name."""
        rg = (resource_group or next(iter(self.resource_groups.values()))).lower()
        with self.lock:
            return sorted(vm["name"] for vm in self.vms.values() if self._capacity_group(vm) == (self.subscription.lower(), rg, name.lower()))

    @staticmethod
    def _capacity_group(body: dict) -> tuple[str, str, str] | None:
        ref = (((body.get("properties") or {}).get("capacityReservation") or {}).get("capacityReservationGroup") or {}).get("id")
        m = _CAPACITY_GROUP.match(str(ref)) if ref else None
        return (m.group(1).lower(), m.group(2).lower(), m.group(3).lower()) if m else None

    def _check_capacity_group(self, body: dict) -> None:
        """The capacity reservation group a create names exists, in the VM's location."""
        ref = (((body.get("properties") or {}).get("capacityReservation") or {}).get("capacityReservationGroup") or {}).get("id")
        if not ref:
            return
        key = self._capacity_group(body)
        if key is None:
            raise ArmError(400, "LinkedInvalidPropertyId", f"Property id '{ref}' at path 'properties.capacityReservation."
                           "capacityReservationGroup.id' is invalid. Expect fully qualified resource Id that start with "
                           "'/subscriptions/{subscriptionId}' or '/providers/{resourceProviderNamespace}/'.")
        if self.capacity_groups.get(key) != str(body.get("location", "")).lower():
            raise ArmError(400, "InvalidParameter", f"Capacity reservation group '{ref}' was not found in location "
                           f"'{body.get('location')}'.", "capacityReservationGroup")

    def power_off(self, name: str, *, deallocate: bool = True, resource_group: str | None = None) -> None:
        """Someone stopped (or stopped and deallocated) the VM: its provisioningState stays Succeeded, as in Azure;
        only the instance view's PowerState code says it is not running."""
        rg = (resource_group or next(iter(self.resource_groups.values()))).lower()
        with self.lock:
            self.power[(self.subscription.lower(), rg, name.lower())] = "deallocated" if deallocate else "stopped"

    def lose_host(self, name: str, resource_group: str | None = None) -> None:
        """Azure cannot reach the VM's host: its instance view says PowerState/unknown (the VM is not gone)."""
        rg = (resource_group or next(iter(self.resource_groups.values()))).lower()
        with self.lock:
            self.power[(self.subscription.lower(), rg, name.lower())] = "unknown"

    def evict(self, name: str, resource_group: str | None = None) -> None:
        """A spot eviction with evictionPolicy Delete: the VM is simply gone."""
        rg = (resource_group or next(iter(self.resource_groups.values()))).lower()
        with self.lock:
            del self.vms[(self.subscription.lower(), rg, name.lower())]

    def snapshot(self) -> dict[str, dict]:
        """Every VM by name, as stored (a deep copy)."""
        with self.lock:
            self._settle()
            return {vm["name"]: copy.deepcopy(vm) for vm in self.vms.values()}

    def requests(self, method: str, fragment: str = "") -> list[str]:
        with self.lock:
            return [p for m, p in self.log if m == method and fragment.lower() in p.lower()]

    # -- the ARM semantics ---------------------------------------------------------
    def _vm_id(self, sub: str, rg: str, name: str) -> str:
        return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/{VM_TYPE}/{name}"

    def _new_vm(self, sub: str, rg: str, name: str, body: dict) -> dict:
        props = copy.deepcopy(body.get("properties", {}))
        props.update({"vmId": str(uuid.uuid4()), "provisioningState": "Creating", "timeCreated": _now()})
        vm = {"id": self._vm_id(sub, rg, name), "name": name, "type": VM_TYPE, "location": body["location"].lower(),
              "tags": dict(body.get("tags") or {}), "properties": props}
        if body.get("zones"):
            vm["zones"] = list(body["zones"])
        return vm

    def _check_scope(self, sub: str, rg: str) -> None:
        if sub.lower() != self.subscription.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        if rg.lower() not in self.resource_groups:
            raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")

    def _not_found(self, rg: str, name: str) -> ArmError:
        return ArmError(404, "ResourceNotFound", f"The Resource '{VM_TYPE}/{name}' under resource group '{rg}' was not found. "
                                                 "For more details please go to https://aka.ms/ARMResourceNotFoundFix")

    def _validate(self, name: str, body: dict) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}[A-Za-z0-9_]|[A-Za-z0-9]", name):
            raise ArmError(400, "InvalidParameter", f"The VM name '{name}' is invalid.", "vmName")
        if not isinstance(body.get("location"), str) or not body["location"]:
            raise ArmError(400, "LocationRequired", "The location property is required for this definition.")
        tags = body.get("tags") or {}
        if len(tags) > 50:
            raise ArmError(400, "InvalidTemplate", "The number of tags exceeds the limit of 50.")
        for k, v in tags.items():
            if TAG_NAME_FORBIDDEN & set(k) or len(k) > 512:
                raise ArmError(400, "InvalidTagNameCharacters",
                               f"The tag names '{k}' have reserved characters '<,>,%,&,\\,?,/' or control characters.")
            if not isinstance(v, str) or len(v) > 256:
                raise ArmError(400, "InvalidTagValueLength", f"The tag value of '{k}' must be a string of at most 256 characters.")
        for z in body.get("zones") or []:
            if z not in ZONES:
                raise ArmError(400, "InvalidParameter", f"The zone '{z}' is not valid; allowed: {', '.join(ZONES)}.", "zones")
        p = body.get("properties") or {}
        if not (p.get("hardwareProfile") or {}).get("vmSize"):
            raise ArmError(400, "InvalidParameter", "Required parameter 'hardwareProfile.vmSize' is missing (null).", "vmSize")
        image = (p.get("storageProfile") or {}).get("imageReference") or {}
        if not image.get("id") and not all(image.get(k) for k in ("publisher", "offer", "sku", "version")):
            raise ArmError(400, "InvalidParameter", "The image reference needs an id or publisher, offer, sku and version.",
                           "imageReference")
        if not image.get("id"):
            versions = self.images.get((image["publisher"].lower(), image["offer"].lower(), image["sku"].lower()), ())
            if image["version"].lower() != "latest" and image["version"] not in versions or not versions:
                urn = ":".join(image[k] for k in ("publisher", "offer", "sku", "version"))
                raise ArmError(404, "PlatformImageNotFound", f"The platform image '{urn}' is not available. Verify that all "
                                                             "fields in the storage profile are correct.")
        os_profile = p.get("osProfile") or {}
        if not os_profile.get("adminUsername") or not os_profile.get("computerName"):
            raise ArmError(400, "InvalidParameter", "Required parameter 'osProfile.adminUsername' is missing (null).", "adminUsername")
        linux = os_profile.get("linuxConfiguration") or {}
        keys = (linux.get("ssh") or {}).get("publicKeys") or []
        if linux.get("disablePasswordAuthentication") and not keys:
            raise ArmError(400, "InvalidParameter", "Authentication using either SSH or by user name and password must be enabled "
                                                    "in Linux profile.", "linuxConfiguration")
        for k in keys:
            if not str(k.get("keyData", "")).startswith(("ssh-", "ecdsa-")) or not k.get("path"):
                raise ArmError(400, "InvalidParameter", "The value of parameter linuxConfiguration.ssh.publicKeys.keyData is invalid.",
                               "linuxConfiguration.ssh.publicKeys.keyData")
        net = p.get("networkProfile") or {}
        if net.get("networkInterfaceConfigurations"):
            if not net.get("networkApiVersion"):
                raise ArmError(400, "InvalidParameter", "networkApiVersion is required with networkInterfaceConfigurations.",
                               "networkApiVersion")
            for nic in net["networkInterfaceConfigurations"]:
                ipcs = (nic.get("properties") or {}).get("ipConfigurations") or []
                if not nic.get("name") or not ipcs or not all(((i.get("properties") or {}).get("subnet") or {}).get("id") for i in ipcs):
                    raise ArmError(400, "InvalidParameter", "Each network interface configuration needs a name and "
                                                            "ip configurations with a subnet id.", "networkInterfaceConfigurations")
        elif not net.get("networkInterfaces"):
            raise ArmError(400, "InvalidParameter", "The network profile needs at least one network interface.", "networkProfile")
        priority = p.get("priority", "Regular")
        if priority not in ("Regular", "Spot", "Low"):
            raise ArmError(400, "InvalidParameter", f"The value '{priority}' of parameter 'priority' is invalid.", "priority")
        if priority == "Spot" and p.get("evictionPolicy") not in ("Delete", "Deallocate"):
            raise ArmError(400, "InvalidParameter", "evictionPolicy must be Delete or Deallocate for Spot VMs.", "evictionPolicy")
        if priority != "Spot" and (p.get("evictionPolicy") or p.get("billingProfile")):
            raise ArmError(400, "InvalidParameter", "evictionPolicy and billingProfile can only be set for Spot VMs.", "priority")
        max_price = (p.get("billingProfile") or {}).get("maxPrice")
        if max_price is not None and not (max_price == -1 or (isinstance(max_price, (int, float)) and max_price > 0)):
            raise ArmError(400, "InvalidParameter", "billingProfile.maxPrice must be -1 or a positive number.", "maxPrice")

    def put_vm(self, sub: str, rg: str, name: str, body: dict, base: str, api_version: str) -> tuple[int, dict, dict]:
        self._settle()
        self._check_scope(sub, rg)
        key = (sub.lower(), rg.lower(), name.lower())
        existing = self.vms.get(key)
        if existing is not None:
            if existing["properties"].get("provisioningState") == "Deleting":
                raise ArmError(409, "OperationNotAllowed", f"The VM '{name}' is being deleted.")
            self._check_update(key, existing, body)
            existing["tags"] = dict(body.get("tags") or {})  # an update: tags are replaced, a resize made, the rest kept
            size = ((body.get("properties") or {}).get("hardwareProfile") or {}).get("vmSize")
            if size:
                existing["properties"]["hardwareProfile"]["vmSize"] = size
            running = self._preempt(key)
            if running is None:
                return 200, copy.deepcopy(existing), {}
            # The update carries the allocation on in an operation of its own, which ends as the preempted one would have.
            op = Operation(str(uuid.uuid4()), "create", key, existing["location"], running.ends_at, error=running.error,
                           held=running.held)
            self.ops[op.id] = op
            return 200, copy.deepcopy(existing), self._accepted(base, sub, op, api_version)
        self._validate(name, body)
        self._check_nic_subnets(sub, rg, body)
        self._check_capacity_group(body)
        size = ((body.get("properties") or {}).get("hardwareProfile") or {}).get("vmSize")
        if set(body.get("zones") or []) & set(self.sku_restrictions.get((body["location"].lower(), size), ())):
            raise ArmError(409, "SkuNotAvailable", f"The requested VM size '{size}' is currently not available in location "
                           f"'{body['location']}' zones '{','.join(body['zones'])}' for subscription '{sub}'. Please try "
                           "another size or deploy to a different location or zones. See https://aka.ms/azureskunotavailable "
                           "for details.")
        custom = ((body.get("properties") or {}).get("osProfile") or {}).get("customData")
        if custom is not None:
            try:
                raw = base64.b64decode(custom, validate=True)
            except (ValueError, TypeError):
                raise ArmError(400, "InvalidParameter", "customData must be base64-encoded.", "customData") from None
            if len(raw) > 65535:
                raise ArmError(400, "InvalidParameter", "The value of parameter customData is too long (at most 65535 bytes).", "customData")
            body = copy.deepcopy(body)
            del body["properties"]["osProfile"]["customData"]  # not part of the VM as GET shows it
            self.custom_data[key] = raw.decode()
        password = ((body.get("properties") or {}).get("osProfile") or {}).get("adminPassword")
        if password is not None:
            body = copy.deepcopy(body)
            del body["properties"]["osProfile"]["adminPassword"]  # never shown by GET either
            self.admin_passwords[key] = password
        vm = self._new_vm(sub, self.resource_groups[rg.lower()], name, body)
        over = self._over_quota(vm)
        if over is not None:
            raise over
        self.vms[key] = vm
        op = Operation(str(uuid.uuid4()), "create", key, vm["location"], self.clock.now() + self.latency, held=self.holding)
        zone = (vm.get("zones") or [None])[0]
        code = self.exhausted.get((vm["location"], zone)) if zone else None
        if code is not None:
            op.error = {"code": code, "message": (
                f"Allocation failed. We do not have sufficient capacity for the requested VM size "
                f"{vm['properties']['hardwareProfile']['vmSize']} in this zone. Read more about improving likelihood of "
                "allocation success at http://aka.ms/allocation-guidance")}
        self.ops[op.id] = op
        if op.error is not None and self.failed_at_once is not None:  # the allocation failed before the PUT was answered
            op.ends_at, op.held, op.done = self.clock.now(), False, True
            self._finish(op)  # the VM Failed, its instance view saying why
            headers = self._accepted(base, sub, op, api_version) if self.failed_at_once == "operation" else {}
            return 200, copy.deepcopy(vm), headers
        return 201, copy.deepcopy(vm), self._accepted(base, sub, op, api_version)

    def _check_update(self, key: tuple[str, str, str], existing: dict, body: dict) -> None:
        """A PUT to an existing VM is an update: its tags and size may change, not how it was made. ARM refuses a
        change of location (InvalidResourceLocation), zones, image, OS profile (computer name, admin user, customData,
        adminPassword: compared with what the create sent, which GET never shows) or priority with 409
        PropertyChangeNotAllowed, "Changing property 'X' is not allowed."; a property the update leaves out is kept."""
        location = body.get("location")
        if isinstance(location, str) and location.replace(" ", "").lower() != existing["location"]:
            raise ArmError(409, "InvalidResourceLocation", f"The resource '{existing['name']}' already exists in location "
                           f"'{existing['location']}' in resource group '{key[1]}'. A resource with the same name cannot be "
                           f"created in location '{location}'. Please select a new resource name.")
        p, was = body.get("properties") or {}, existing["properties"]
        image_keys = ("id", "publisher", "offer", "sku", "version")

        def image(props: dict) -> dict | None:
            ref = (props.get("storageProfile") or {}).get("imageReference")
            return None if ref is None else {k: str(ref.get(k) or "").lower() for k in image_keys}

        custom = (p.get("osProfile") or {}).get("customData")
        try:
            custom = None if custom is None else base64.b64decode(custom).decode()
        except (ValueError, TypeError):
            raise ArmError(400, "InvalidParameter", "customData must be base64-encoded.", "customData") from None
        os_new, os_was = p.get("osProfile") or {}, was.get("osProfile") or {}
        for name, new, old in (
                ("zones", body.get("zones"), existing.get("zones")),
                ("imageReference", image(p), image(was)),
                ("computerName", os_new.get("computerName"), os_was.get("computerName")),
                ("adminUsername", os_new.get("adminUsername"), os_was.get("adminUsername")),
                ("customData", custom, self.custom_data.get(key)),
                ("adminPassword", os_new.get("adminPassword"), self.admin_passwords.get(key)),
                ("priority", p.get("priority"), was.get("priority", "Regular")),
                ("evictionPolicy", p.get("evictionPolicy"), was.get("evictionPolicy"))):
            if new is not None and new != old:
                raise ArmError(409, "PropertyChangeNotAllowed", f"Changing property '{name}' is not allowed.", name)

    def _accepted(self, base: str, sub: str, op: Operation, api_version: str, *, location: bool = False) -> dict:
        """The headers of a write ARM accepted and runs asynchronously."""
        url = self._op_url(base, sub, op, api_version)
        headers = {"Azure-AsyncOperation": url, **({"Location": url + "&monitor=true"} if location else {})}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers

    def _settle(self) -> None:
        """End every operation whose time has come (in the order they end), polled or not, as ARM's do."""
        now = self.clock.now()
        for op in sorted(self.ops.values(), key=lambda o: o.ends_at):
            if not op.done and not op.held and op.ends_at <= now:
                op.done = True
                self._finish(op)

    def _preempt(self, key: tuple[str, str, str]) -> Operation | None:
        """A write to a VM whose create is under way preempts that create's operation (PREEMPTED); the one preempted."""
        vm = self.vms.get(key)
        if vm is None or vm["properties"].get("provisioningState") != "Creating":
            return None
        running = next((op for op in self.ops.values() if op.kind == "create" and op.key == key and not op.done), None)
        if running is not None:
            running.preempted = running.done = True
        return running

    def delete_vm(self, sub: str, rg: str, name: str, base: str, api_version: str) -> tuple[int, dict | None, dict]:
        self._settle()
        self._check_scope(sub, rg)
        key = (sub.lower(), rg.lower(), name.lower())
        vm = self.vms.get(key)
        if vm is None:
            return 204, None, {}
        self._preempt(key)
        self.deleted_vms.append(copy.deepcopy(vm))
        vm["properties"]["provisioningState"] = "Deleting"
        op = Operation(str(uuid.uuid4()), "delete", key, vm["location"], self.clock.now() + self.latency)
        self.ops[op.id] = op
        return 202, None, self._accepted(base, sub, op, api_version, location=True)

    def _op_url(self, base: str, sub: str, op: Operation, api_version: str) -> str:
        return f"{base}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{op.location}/operations/{op.id}?api-version={api_version}"

    def poll(self, op_id: str, monitor: bool) -> tuple[int, dict | None, dict]:
        """An operation's status (Azure-AsyncOperation) or its Location monitor: InProgress until it has ended."""
        self._settle()
        op = self.ops.get(op_id)
        if op is None:
            raise ArmError(404, "NotFound", f"The operation '{op_id}' was not found.")
        op.polls += 1
        if op.preempted:
            ended = {"startTime": op.start, "endTime": _now(), "name": op.id, "status": "Canceled", "error": PREEMPTED}
            return (200, {"error": PREEMPTED}, {}) if monitor else (200, ended, {})
        if not op.done:
            later = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}
            if monitor:
                return 202, None, later
            return 200, {"startTime": op.start, "status": "InProgress", "name": op.id}, later
        if monitor:
            return (204, None, {}) if op.error is None else (200, {"error": op.error}, {})
        done = {"startTime": op.start, "endTime": _now(), "name": op.id}
        if op.error is not None:
            return 200, {**done, "status": "Failed", "error": op.error}, {}
        return 200, {**done, "status": "Succeeded"}, {}

    def _finish(self, op: Operation) -> None:
        vm = self.vms.get(op.key)
        if vm is None:
            return
        if op.kind == "delete":
            if vm["properties"].get("provisioningState") == "Deleting":
                del self.vms[op.key]
        elif vm["properties"].get("provisioningState") == "Creating":
            vm["properties"]["provisioningState"] = "Failed" if op.error else "Succeeded"
            if op.error:
                self.failures[op.key] = op.error

    def instance_view(self, vm: dict) -> dict:
        state = vm["properties"].get("provisioningState", "Succeeded")
        statuses = [{"code": f"ProvisioningState/{state.lower()}", "level": "Info" if state != "Failed" else "Error",
                     "displayStatus": f"Provisioning {state.lower()}"}]
        key = tuple(vm["id"].lower().split("/")[i] for i in (2, 4, 8))
        failure = self.failures.get(key) if state == "Failed" else None  # type: ignore[call-overload]
        if failure is not None:  # Compute suffixes the failure's code, and says its message (states-billing)
            statuses[0].update(code=f"ProvisioningState/failed/{failure['code']}", message=failure["message"])
        if state == "Succeeded":
            sub, rg = vm["id"].split("/")[2], vm["id"].split("/")[4]
            power = self.power.get((sub.lower(), rg.lower(), vm["name"].lower()), "running")
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"})
        return {"statuses": statuses}

    def list_vms(self, sub: str, rg: str, skip: int, base: str, path: str, api_version: str) -> dict:
        self._check_scope(sub, rg)
        mine = sorted((vm for k, vm in self.vms.items() if k[:2] == (sub.lower(), rg.lower())), key=lambda v: v["name"].lower())
        page = []
        for vm in mine[skip:skip + self.page_size]:
            shown = copy.deepcopy(vm)
            shown["id"] = self._vm_id(sub, rg.upper(), vm["name"])  # Compute often upper-cases the group in ids
            page.append(shown)
        out: dict = {"value": page}
        if skip + self.page_size < len(mine):
            out["nextLink"] = f"{base}{path}?api-version={api_version}&%24skiptoken={skip + self.page_size}"
        return out

    def list_all_vms(self, sub: str, status_only: bool, skip: int, base: str, path: str, api_version: str) -> dict:
        """GET /subscriptions/{sub}/providers/Microsoft.Compute/virtualMachines: every VM of the subscription, paged
        like the group list; with statusOnly=true each carries its instanceView (run time status)."""
        if sub.lower() != self.subscription.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        every = [vm for _, vm in sorted(self.vms.items())]
        page = []
        for vm in every[skip:skip + self.page_size]:
            shown = copy.deepcopy(vm)
            if status_only:
                shown["properties"] = {"instanceView": self.instance_view(vm)}
            page.append(shown)
        out: dict = {"value": page}
        if skip + self.page_size < len(every):
            flag = "&statusOnly=true" if status_only else ""
            out["nextLink"] = f"{base}{path}?api-version={api_version}{flag}&%24skiptoken={skip + self.page_size}"
        return out

    def take_injected(self, method: str, path: str = "") -> ArmError | None:
        for inj in self._inject:
            if inj.remaining > 0 and (inj.method is None or inj.method == method) and (
                    inj.path_contains is None or inj.path_contains.lower() in path.lower()):
                if inj.skip > 0:
                    inj.skip -= 1
                    continue
                inj.remaining -= 1
                return ArmError(inj.status, inj.code, inj.message, headers=inj.headers)
        return None


class _Handler(BaseHTTPRequestHandler):
    arm: ArmFake
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - quiet: the fake keeps its own request log
        pass

    def _send(self, status: int, body: dict | None, headers: dict | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _handle(self, method: str) -> None:
        arm = self.arm
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        query = {k.lower(): v[-1] for k, v in parse_qs(parts.query).items()}
        base = f"https://{self.headers.get('Host')}"
        with arm.lock:
            stall = next((st for st in arm._stalls if st[2] > 0 and st[1] in (None, method)), None)
            if stall is not None:
                stall[2] -= 1
        if stall is not None:
            time.sleep(stall[0])  # (outside the lock: other requests are answered meanwhile)
        try:
            with arm.lock:
                arm._settle()  # (operations end by time: what this request sees is what ARM would show now)
                arm.log.append((method, self.path))
                if self.headers.get("Authorization") != f"Bearer {arm.token}":
                    raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.",
                                   headers={"WWW-Authenticate": 'Bearer authorization_uri="https://login.invalid", error="invalid_token"'})
                injected = arm.take_injected(method, parts.path)
                if injected is not None:
                    raise injected
                api_version = query.get("api-version")
                if not api_version:
                    raise ArmError(400, "MissingApiVersionParameter", "The api-version query parameter (?api-version=) is required "
                                                                      "for all requests.")
                if _PERMISSIONS.match(parts.path):
                    if method != "GET":
                        raise ArmError(405, "MethodNotAllowed", f"{method} is not supported here.")
                    return self._send(200, {"value": arm.permissions(parts.path.rsplit("/providers/", 1)[0])})
                arm.authorize(method, parts.path, raw)
                if m := _OP.match(parts.path):
                    if method != "GET":
                        raise ArmError(405, "MethodNotAllowed", f"{method} is not supported here.")
                    status, body, headers = arm.poll(m.group(3), monitor=query.get("monitor") == "true")
                    return self._send(status, body, headers)
                if m := _IMAGE_VERSIONS.match(parts.path):
                    sub, location, publisher, offer, sku, version = m.groups()
                    top = int(query.get("$top", "0") or 0)
                    found = arm.image_versions(sub, location, publisher, offer, sku, version)
                    return self._send(200, found[:top] if top and isinstance(found, list) else found)
                if m := _USAGES.match(parts.path):
                    return self._send(200, arm.usages(m.group(1), m.group(2)))
                if m := _NETWORK.match(parts.path):
                    if method != "GET":
                        raise ArmError(405, "MethodNotAllowed", f"{method} is not supported on networks here.")
                    return self._send(200, arm.get_network(*m.groups()))
                if m := _SKUS.match(parts.path):
                    return self._send(200, arm.list_skus(m.group(1), query.get("$filter")))
                if m := _ALL_VMS.match(parts.path):
                    if method != "GET":
                        raise ArmError(405, "MethodNotAllowed", f"{method} is not supported on the collection.")
                    return self._send(200, arm.list_all_vms(m.group(1), query.get("statusonly") == "true",
                                                            int(query.get("$skiptoken", "0")), base, parts.path, api_version))
                m = _VM.match(parts.path)
                if m is None:
                    raise ArmError(404, "InvalidResourceType", f"The resource type could not be found for path {parts.path}.")
                sub, rg, name = m.groups()
                if name is None:
                    if method != "GET":
                        raise ArmError(405, "MethodNotAllowed", f"{method} is not supported on the collection.")
                    skip = int(query.get("$skiptoken", "0"))
                    return self._send(200, arm.list_vms(sub, rg, skip, base, parts.path, api_version))
                if method == "GET":
                    arm._check_scope(sub, rg)
                    vm = arm.vms.get((sub.lower(), rg.lower(), name.lower()))
                    if vm is None:
                        raise arm._not_found(rg, name)
                    shown = copy.deepcopy(vm)
                    if query.get("$expand") == "instanceView":
                        shown["properties"]["instanceView"] = arm.instance_view(vm)
                    return self._send(200, shown)
                if method == "PUT":
                    try:
                        body = json.loads(raw or b"{}")
                    except json.JSONDecodeError:
                        raise ArmError(400, "InvalidRequestContent", "The request content was invalid and could not be deserialized.")
                    arm.put_bodies.append(copy.deepcopy(body))
                    status, out, headers = arm.put_vm(sub, rg, name, body, base, api_version)
                    return self._send(status, out, headers)
                if method == "DELETE":
                    status, out, headers = arm.delete_vm(sub, rg, name, base, api_version)
                    return self._send(status, out, headers)
                raise ArmError(405, "MethodNotAllowed", f"{method} is not supported.")
        except ArmError as e:
            self._send(e.status, e.body(), e.headers)

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self):  # noqa: N802
        self._handle("DELETE")
