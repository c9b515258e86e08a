"""A small Compute Engine v1 fake: the instances and zone-operations subset, over HTTP.

It speaks the REST wire protocol google.cloud.compute_v1 uses, so tests drive the
real InstancesClient and ZoneOperationsClient unmodified:

* POST   /compute/v1/projects/{p}/zones/{z}/instances             insert (requestId dedup, 409 on a taken name)
* GET    /compute/v1/projects/{p}/zones/{z}/instances/{name}      get (404 notFound)
* DELETE /compute/v1/projects/{p}/zones/{z}/instances/{name}      delete (404 notFound)
* GET    /compute/v1/projects/{p}/aggregated/instances            aggregatedList: `filter` (the documented flat chain
                                                                  of parenthesised comparisons; nesting is a 400),
                                                                  maxResults/pageToken, NO_RESULTS_ON_PAGE warnings
* GET    /compute/v1/projects/{p}/aggregated/machineTypes|acceleratorTypes  what each zone offers
* GET    /compute/v1/projects/{p}/global/images/{name}            get (404 notFound for an image it does not hold)
* GET    /compute/v1/projects/{p}/global/images/family/{family}   getFromFamily (404 notFound, likewise)
* GET    /compute/v1/projects/{p}/regions/{r}                     regions.get, with the region's `quotas`
* GET    /compute/v1/projects/{p}                                 projects.get, with the project's global `quotas`
* GET    /compute/v1/projects/{p}/zones/{z}/operations/{op}       get
* GET    /compute/v1/projects/{p}/zones/{z}/operations            list: `filter` (same grammar), maxResults/pageToken
* POST   /compute/v1/projects/{p}/zones/{z}/operations/{op}/wait  wait

Resources have the real JSON shapes: Operation (kind compute#operation, id, name,
operationType, status PENDING/RUNNING/DONE, progress, targetLink, targetId, zone,
selfLink, error.errors[] plus httpErrorStatusCode on failure) and Instance (kind
compute#instance, string id, zone and machineType URLs, status, labels,
labelFingerprint, scheduling, disks, networkInterfaces). HTTP errors use the
Google JSON error body {"error": {"code", "message", "errors": [{"message",
"domain", "reason"}]}}.

An operation progresses by time, polled or not, as GCE's do: PENDING for the first third of `op_latency` seconds of
the fake's clock (tests/fakeclock.py: a test may freeze or advance it), RUNNING until op_latency has passed, then DONE.
An inserted instance exists while its operation runs, PROVISIONING then STAGING (from half-way), and is RUNNING once
it is DONE, as the instance life cycle documents ("When you create a compute instance, it starts in the PROVISIONING
state, moves to STAGING, and then enters the RUNNING state", cloud.google.com/compute/docs/instances/instance-lifecycle);
a deleted one is STOPPING until its operation is DONE, then gone. A preemption is an operation too, as GCE records it
(operationType compute.instances.preempted, by the system, DONE, its targetLink and targetId the VM's: "Determine if a
VM was preempted" in cloud.google.com/compute/docs/instances/create-use-spot, and Google's preemption_history sample,
which lists a zone's operations filtered on operationType and targetLink): zoneOperations.list tells a Spot VM
preempted apart from one someone deleted (a `delete` operation by that principal). A preemption is not instant: GCE
sends the VM an ACPI soft off and gives it up to 30 seconds before it powers it off ("Preemption process", Spot VMs
documentation), so the VM is STOPPING for `preempt_grace` seconds of the fake's clock, the preemption's operation
RUNNING, and only then stopped (TERMINATED) or deleted as its instanceTerminationAction says. zoneOperations.wait blocks until the operation is
DONE or `wait_cap` seconds have passed (GCE: about 2 minutes) and answers the operation as it then stands; "In uncommon
cases ... the request might return before the default deadline is reached, or might return after zero seconds"
(zoneOperations.wait reference): early_waits() makes the next waits return at once, so a client must loop. A delete of
an instance whose insert is still under way is refused 400 resourceNotReady ("The resource '...' is not ready", as
GCE answers it in the wild: googleapis/google-api-python-client#485; GoogleCloudPlatform/compute-image-tools#542 has
a delete before the create finished fail, and retry): the delete must be tried again once it is made.

Insert bodies are validated the way GCE rejects them (RFC 1035 names, label
formats, machine type paths and zones, a boot disk with an image, a network
interface, a boot image that exists (the public images in PUBLIC_IMAGES and those add_image()
registered; any other is 404 notFound, as GCE answers), Spot scheduling, GPU machine families needing onHostMaintenance
TERMINATE, guestAccelerators only on N1 types in supported counts and vCPU sizes,
requestId a UUID, metadata keys and sizes as the `Items` reference limits them), so a provider bug shows up as a 400 and not as a silently
accepted instance. Instances report their GPUs as guestAccelerators with full
acceleratorType URLs, accelerator-optimized types (a2, a3, g2) their built-in ones.

Quotas as GCE keeps them: each region lists its metrics (a machine family's CPUs, each GPU model's GPUs and their
PREEMPTIBLE_ twins, INSTANCES) and the project the global ones (GPUS_ALL_REGIONS, CPUS_ALL_REGIONS), each with its
limit (set_quota; an unset one DEFAULT_QUOTA, PREEMPTIBLE_ ones 0) and its usage, counted from the project's live
instances; a Spot VM counts against the PREEMPTIBLE_ metric where its limit is above 0, else the standard one. An
insert past a limit is accepted and its operation fails with QUOTA_EXCEEDED ("Quota 'NVIDIA_A100_GPUS' exceeded.
Limit: 16.0 in region us-central1."), as GCE's does.

Realistic latency: op_latency (seconds before an operation is DONE; small by default; wait blocks until then), with
running_ops / max_running_ops to see how many ran at once. op_latency = 0: an insert is answered with its operation
already DONE (a failure GCE finds at once, a stockout or an exhausted quota, is answered so too). age(seconds): time
passes for the operations held (the clock advances and their insertTime, on this host's wall clock as GCE's stamps are,
moves back), so a requestId answered again reads as the old insert it is. clock_skew: GCE's wall clock (its timestamps and
the Date header of its answers) runs ahead of this host's (behind, if negative), as it does for a host whose clock is off.
Test-side fault injection: exhaust(zone), cut_off(zone) (UNREACHABLE in aggregatedList), reclaim_spot(zone), withhold(zone, type), fail_next(status),
plant(...), preempt(...), delete_instance(...) and delete_at_start(zone) (someone else's instances.delete), and
stop_instance(...) (a preempted Spot VM is deleted or kept TERMINATED as its
instanceTerminationAction says, GCE's default STOP; a stopped one is TERMINATED), forget_request_ids(), conflicts = "operation" (a taken name fails the
operation with RESOURCE_ALREADY_EXISTS instead of a synchronous 409); inspection:
instances(), requests(), log, insert_bodies.
Reservations (add_reservation; reservation_in_use): zonal reservations of one machine type, consumed as GCE documents
(ReservationAffinity, Reservation.specificReservationRequired in the Compute v1 reference): an insert with the default
affinity (ANY_RESERVATION) takes a slot of a matching reservation that does not require targeting, never of one that
does ("only VMs that target the reservation by name can consume from this reservation"); SPECIFIC_RESERVATION names one
(key compute.googleapis.com/reservation-name, values [NAME] or [projects/P/reservations/NAME] for a shared one) and is
refused (400 invalid) when it does not exist in the zone, does not require targeting ("can not be targeted as
specificReservationRequired is not set", GCE's answer), is of another machine type, or is full. Only the first and the
third sentence of those refusals are GCE's wording as seen in the wild; the others are the fake's.
IAM (deny(); nothing withheld by default): a permission withheld from the caller refuses every request that needs it
(tests/cloud_iam.py names what each needs, an insert's body included) with GCE's 403, reason "forbidden", "Required
'compute.instances.delete' permission for 'projects/P/zones/Z/instances/N'". instances.testIamPermissions (POST
.../instances/{name}/testIamPermissions, {"permissions": [...]}) answers the subset the caller holds on that instance,
the field left out when it holds none (proto3 JSON), 404 notFound for an instance that does not exist; it needs no
permission of its own.
Networks: networks.get and subnetworks.get (add_network, add_subnetwork; every project has the auto-mode "default"
network with a "default" subnetwork per region); an insert whose NIC names a network or subnetwork that does not exist,
or a subnetwork of another region or network, is 400 invalid, as GCE answers.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import email.utils
import json
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from tests.fakeclock import FakeClock

API = "https://www.googleapis.com/compute/v1"  # GCE writes its own URLs into resources, whatever host was called
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f",
         "europe-west4-a", "europe-west4-b", "europe-west4-c")
GPU_FAMILIES = ("a2-", "a3-", "g2-")  # accelerator-optimized: their GPUs come with the machine type
# GPUs attachable to N1 machine types: accelerator type -> {GPUs per VM: most vCPUs with that many}.
ATTACHABLE = {
    "nvidia-tesla-t4": {1: 48, 2: 48, 4: 96},
    "nvidia-tesla-v100": {1: 12, 2: 24, 4: 48, 8: 96},
    "nvidia-tesla-p100": {1: 16, 2: 32, 4: 64},
    "nvidia-tesla-p4": {1: 24, 2: 48, 4: 96},
}
# The GPUs accelerator-optimized machine types come with, which GCE reports as their guestAccelerators.
BUILT_IN = {"a2-highgpu": "nvidia-tesla-a100", "a2-megagpu": "nvidia-tesla-a100", "a2-ultragpu": "nvidia-a100-80gb",
            "a3-highgpu": "nvidia-h100-80gb", "a3-megagpu": "nvidia-h100-mega-80gb", "a3-ultragpu": "nvidia-h200-141gb",
            "g2-standard": "nvidia-l4"}
G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
ACCELERATOR_TYPE_RE = re.compile(r"^(?:(?:https?://[^/]+)?/?compute/v1/)?(?:projects/([^/]+)/)?zones/([^/]+)/acceleratorTypes/([a-z0-9-]+)$")
N1_RE = re.compile(r"^n1-(?:standard|highmem|highcpu)-([0-9]+)$")
NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
METADATA_KEY_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
METADATA_VALUE_BYTES = 262144  # 256 KiB, a value at most
METADATA_TOTAL_BYTES = 512 * 1024  # every key and value together, under
RESERVATION_KEY = "compute.googleapis.com/reservation-name"  # ReservationAffinity.key that names a reservation
_RESERVATION_VALUE = re.compile(r"^(?:projects/([^/]+)/reservations/)?([a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)$")
MACHINE_TYPE_RE = re.compile(r"^(?:(?:https?://[^/]+)?/?compute/v1/)?(?:projects/[^/]+/)?zones/([^/]+)/machineTypes/([a-z0-9-]+)$")
CAPACITY_MESSAGES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": "The zone 'projects/{p}/zones/{z}' does not have enough resources available to fulfill "
                                    "the request.  Try a different zone, or try again later.",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": "The zone 'projects/{p}/zones/{z}' does not have enough resources available "
                                                 "to fulfill the request.  '(resource type:compute)'.",
    "QUOTA_EXCEEDED": "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
}

_REGION = re.compile(r"^/compute/v1/projects/([^/]+)/regions/([^/]+)/?$")
_PROJECT = re.compile(r"^/compute/v1/projects/([^/]+)/?$")
DEFAULT_QUOTA = 10000.0  # a limit no test fleet reaches unless a test sets one
CPU_METRICS = {"n1": "CPUS", "n2": "N2_CPUS", "e2": "E2_CPUS", "a2": "A2_CPUS", "g2": "G2_CPUS"}  # (a3: none)
GPU_METRICS = {"nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-tesla-v100": "NVIDIA_V100_GPUS", "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
               "nvidia-tesla-p4": "NVIDIA_P4_GPUS", "nvidia-tesla-a100": "NVIDIA_A100_GPUS", "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
               "nvidia-h100-80gb": "NVIDIA_H100_GPUS", "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
               "nvidia-h200-141gb": "NVIDIA_H200_GPUS", "nvidia-l4": "NVIDIA_L4_GPUS"}
REGIONAL_METRICS = tuple(sorted({*CPU_METRICS.values(), *GPU_METRICS.values(), "INSTANCES", "PREEMPTIBLE_CPUS",
                                 *(f"PREEMPTIBLE_{m}" for m in GPU_METRICS.values())}))
GLOBAL_METRICS = ("CPUS_ALL_REGIONS", "GPUS_ALL_REGIONS")
_TEST_PERMISSIONS = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/testIamPermissions/?$")
_INSTANCES = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?/?$")
_OPERATIONS = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/?$")
_OPERATION = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+?)(/wait)?/?$")
_AGGREGATED = re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances/?$")
_IMAGE = re.compile(r"^/compute/v1/projects/([^/]+)/global/images/(family/)?([^/]+)/?$")
_IMAGE_REF = re.compile(r"^(?:.*/)?projects/([^/]+)/global/images/(family/)?([^/]+)$")
# (project, "family/" or "", name): the public images the providers and examples boot from.
PUBLIC_IMAGES = frozenset({
    ("debian-cloud", "family/", "debian-12"),
    ("deeplearning-platform-release", "family/", "common-cu128-ubuntu-2204-nvidia-570"),
    ("deeplearning-platform-release", "family/", "common-cu124-debian-11-py310"),
})
_NETWORK = re.compile(r"^/compute/v1/projects/([^/]+)/global/networks/([^/]+)/?$")
_SUBNETWORK = re.compile(r"^/compute/v1/projects/([^/]+)/regions/([^/]+)/subnetworks/([^/]+)/?$")
# A NIC's network / subnetwork: a full or partial URL, or (as the API allows) relative to the instance's project.
_NETWORK_REF = re.compile(r"^(?:(?:.*/)?projects/([^/]+)/)?global/networks/([^/]+)$")
_SUBNETWORK_REF = re.compile(r"^(?:(?:.*/)?projects/([^/]+)/)?regions/([^/]+)/subnetworks/([^/]+)$")
_AGGREGATED_TYPES = re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/(machineTypes|acceleratorTypes)/?$")
# The machine types the fake's zones offer (unless withheld): the families the fleet uses, in their real sizes.
MACHINE_TYPES = tuple(
    [f"n1-{k}-{n}" for k in ("standard", "highmem", "highcpu") for n in (1, 2, 4, 8, 16, 32, 64, 96)]
    + [f"n2-standard-{n}" for n in (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)]
    + [f"e2-standard-{n}" for n in (2, 4, 8, 16, 32)]
    + [f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)] + ["a2-megagpu-16g"] + [f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)]
    + [f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)] + ["a3-megagpu-8g", "a3-ultragpu-8g"]
    + [f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)])


class GceError(Exception):
    """An HTTP error in Google's JSON error format."""

    def __init__(self, status: int, reason: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.reason, self.message, self.headers = status, reason, message, headers or {}

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global", "reason": self.reason}]}}


def _invalid(field_name: str, value: Any, why: str) -> GceError:
    return GceError(400, "invalid", f"Invalid value for field '{field_name}': '{value}'. {why}")


def _now(at: float) -> str:
    # GCE timestamps are RFC 3339 with the Pacific offset; any offset parses the same.
    return dt.datetime.fromtimestamp(at,
                                     dt.timezone(dt.timedelta(hours=-7))).isoformat(timespec="milliseconds")


def _fingerprint() -> str:
    return base64.b64encode(random.randbytes(8)).decode()


@dataclass
class Operation:
    project: str
    zone: str
    name: str
    op_type: str  # insert | delete
    target: str  # instance name
    target_id: str
    clock: FakeClock = field(repr=False)
    running_at: float  # the clock's time at which it is RUNNING ...
    staging_at: float  # ... its instance STAGING (an insert's) ...
    ready_at: float  # ... and it is DONE (the fake's op_latency after it started)
    error: dict | None = None  # {"code", "message"} the operation ends with
    http_error: tuple[int, str] | None = None
    polls: int = 0  # gets and waits of it, for inspection
    done: bool = False  # set when it is settled: its effect (on_done) is made
    on_done: Callable[[], None] | None = None
    on_staging: Callable[[], None] | None = None
    inserted_at: float = 0.0  # GCE's wall clock (GceFake.wall), as insertTime (and startTime) say it
    user: str = "fleetops-test@example.iam.gserviceaccount.com"  # the principal that started it ("system": GCE itself)
    counted: bool = True  # in running_ops (a request's operation; GCE's own, a preemption, is not)
    done_at: float | None = None  # GCE's wall clock when it was settled DONE (endTime)
    id: str = field(default_factory=lambda: str(random.randrange(10**18, 10**19)))

    @property
    def status(self) -> str:
        if self.done:
            return "DONE"
        return "RUNNING" if self.clock.now() >= self.running_at else "PENDING"

    def json(self) -> dict:
        base = f"{API}/projects/{self.project}/zones/{self.zone}"
        body = {
            "kind": "compute#operation", "id": self.id, "name": self.name, "zone": base, "operationType": self.op_type,
            "targetLink": f"{base}/instances/{self.target}", "targetId": self.target_id, "status": self.status,
            "user": self.user, "progress": 100 if self.status == "DONE" else 0,
            "insertTime": _now(self.inserted_at), "selfLink": f"{base}/operations/{self.name}",
        }
        if self.status != "PENDING":
            body["startTime"] = _now(self.inserted_at)
        if self.status == "DONE":
            body["endTime"] = _now(self.done_at)
            if self.error is not None:
                body["error"] = {"errors": [{**self.error, "errorDetails": [{"help": {"links": [{
                    "description": "Troubleshooting documentation",
                    "url": "https://cloud.google.com/compute/docs/resource-error"}]}}]}]}
                if self.http_error:
                    body["httpErrorStatusCode"], body["httpErrorMessage"] = self.http_error
        return body


@dataclass
class Injected:
    status: int
    reason: str
    message: str
    method: str | None
    path_contains: str | None
    remaining: int
    headers: dict = field(default_factory=dict)


# ------------------------------------------------------------------ filters (AIP-160 subset)

_TOKEN = re.compile(r'\s*(?:(\()|(\))|(!=|<=|>=|=|<|>|:)|"((?:[^"\\]|\\.)*)"|([^\s()=!<>:"]+))')


def _tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"unexpected character at {pos}")
        pos = m.end()
        lp, rp, op, quoted, word = m.groups()
        if lp:
            out.append(("(", lp))
        elif rp:
            out.append((")", rp))
        elif op:
            out.append(("op", op))
        elif quoted is not None:
            out.append(("str", quoted.replace('\\"', '"')))
        elif word in ("AND", "OR", "NOT"):
            out.append((word, word))
        else:
            out.append(("word", word))
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _lookup(resource: dict, path: str) -> Any:
    cur: Any = resource
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _compare(actual: Any, op: str, want: str) -> bool:
    if op == ":" and want == "*":
        return actual is not None
    if actual is None:
        return op == "!="
    if isinstance(actual, bool):
        actual = "true" if actual else "false"
    text = str(actual)
    if op == "=":
        return text == want
    if op == "!=":
        return text != want
    if op == ":":
        return want in text
    try:
        a, b = float(text), float(want)
    except ValueError:
        a, b = text, want  # type: ignore[assignment]
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def parse_filter(text: str) -> Callable[[dict], bool]:
    """Compile a filter in the grammar the Compute Engine v1 reference documents for `filter`: one comparison
    (`name != example-instance`), or several, "each separate expression within parentheses", joined by AND
    (the default when nothing is written) or OR. That is a flat chain: a parenthesis inside a parenthesis is
    not part of it, and GCE rejects such filters (400 "Invalid list filter expression"), as this does. In a
    chain mixing both, OR binds tighter than AND, as in AIP-160."""
    tokens = _tokenize(text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos][0] if pos < len(tokens) else None

    def take(kind: str) -> str:
        nonlocal pos
        if peek() != kind:
            raise ValueError(f"expected {kind} at token {pos}")
        pos += 1
        return tokens[pos - 1][1]

    def comparison() -> Callable[[dict], bool]:
        path = take("word")
        op = take("op")
        value = take("str") if peek() == "str" else take("word")
        return lambda r: _compare(_lookup(r, path), op, value)

    def term() -> Callable[[dict], bool]:
        if peek() == "NOT":
            take("NOT")
            inner = term()
            return lambda r: not inner(r)
        take("(")
        if peek() == "(":
            raise ValueError(f"nested parentheses at token {pos}")
        inner = comparison()
        take(")")
        return inner

    if not tokens:
        return lambda r: True
    if peek() == "word":  # a single comparison needs no parentheses
        pred = comparison()
    else:
        factors = [[term()]]
        while pos < len(tokens):
            if peek() == "OR":
                take("OR")
                factors[-1].append(term())
                continue
            if peek() == "AND":
                take("AND")
            factors.append([term()])
        pred = lambda r: all(any(t(r) for t in f) for f in factors)  # noqa: E731
    if pos != len(tokens):
        raise ValueError(f"unexpected token {tokens[pos][1]!r}")
    return pred


# ------------------------------------------------------------------ the fake


class GceFake:
    """The in-memory Compute Engine. start() binds 127.0.0.1 on a free port and sets `url`."""

    def __init__(self, *, zones: tuple[str, ...] = ZONES, page_limit: int = 500):
        self.zones = set(zones)
        self.page_limit = page_limit  # the server's own cap on a page, below the client's maxResults if set low
        self.clock = FakeClock()  # what operations progress by (freeze/advance it to hold or end them)
        self.op_latency = 0.05  # seconds (of self.clock) an operation runs (a real insert: tens of seconds)
        self.preempt_grace = 30.0  # seconds (of self.clock) a preempted VM is STOPPING before it is stopped or deleted
        self.wait_cap = 120.0  # seconds a zoneOperations.wait blocks at most (GCE: "no more than the 2 minutes")
        self.clock_skew = 0.0  # seconds GCE's wall clock is ahead of this host's (negative: behind); see wall()
        self._early_waits = 0  # early_waits(): waits left that answer at once, DONE or not
        self.running_ops = 0  # operations accepted and not yet DONE, now ...
        self.max_running_ops = 0  # ... and at most, so far
        self.machine_types: set[str] | None = None  # None: any well-formed name exists in every zone
        self.honour_filters = True  # False: list `filter`s are parsed but ignored (a lax GCE-compatible endpoint)
        self.conflicts = "http"  # a taken name: "http" answers 409 at once; "operation" fails the operation instead
        self.lock = threading.RLock()
        self.instances_by_key: dict[tuple[str, str, str], dict] = {}  # (project, zone, name) -> Instance JSON
        self.operations: dict[tuple[str, str, str], Operation] = {}
        self.request_ids: dict[tuple[str, str], tuple[str, str, str]] = {}  # (project, requestId) -> operation key
        self.exhausted: dict[str, str] = {}  # zone -> error code every insert's operation there ends with
        self.reclaiming: set[str] = set()  # zones whose Spot VMs are preempted the moment they start (instanceTerminationAction)
        self.deleting_at_start: dict[str, str] = {}  # zone -> the principal that deletes each instance there as it starts
        self.withheld: set[tuple[str, str]] = set()  # (zone, machine type) that does not exist there
        self.unreachable: set[str] = set()  # zones aggregatedList cannot reach: a warning instead of their instances
        self.insert_bodies: list[tuple[str, str, dict]] = []  # (project, zone, body) of every accepted insert
        self.images: set[tuple[str, str, str]] = set(PUBLIC_IMAGES)  # (project, "family/" or "", name)
        # VPC networks (project, name) and subnetworks (project, region, name) -> network name. Every project has the
        # auto-mode "default" network with a "default" subnetwork in each region (projects without one: remove them).
        self.networks: set[tuple[str, str]] = set()
        self.subnetworks: dict[tuple[str, str, str], str] = {}
        self.default_network = True
        self.log: list[tuple[str, str, dict[str, list[str]]]] = []  # (method, path, query) of every request
        self.withheld: set[str] = set()  # deny(): permissions the caller lacks
        self.quota_limits: dict[tuple[str, str], float] = {}  # (region, or "" for the project's, metric) -> limit
        # (project, zone, name) -> {"machine_type", "count", "specific"}; and which reservation each instance took a
        # slot of: instance id -> (project, zone, name). A slot is held while the instance is not stopped.
        self.reservations: dict[tuple[str, str, str], dict] = {}
        self.consumed: dict[str, tuple[str, str, str]] = {}
        self._inject: list[Injected] = []
        self._ips = 2
        self.url = ""
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> "GceFake":
        fake = self

        class Handler(_Handler):
            gce = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="gce-fake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)  # type: ignore[union-attr]
            self._server = None

    def __enter__(self) -> "GceFake":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- fault injection and inspection (test side) --------------------------------
    def exhaust(self, zone: str, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED") -> None:
        """Every later insert in `zone` is accepted, then its operation ends with `code` and no instance."""
        if code not in CAPACITY_MESSAGES:
            raise ValueError(f"unknown capacity code {code}")
        with self.lock:
            self.exhausted[zone] = code

    def replenish(self, zone: str) -> None:
        with self.lock:
            self.exhausted.pop(zone, None)

    def reclaim_spot(self, zone: str) -> None:
        """Spot VMs inserted in `zone` are preempted as they start: the insert succeeds, then the instance is gone
        (instanceTerminationAction DELETE) or TERMINATED (STOP, GCE's default)."""
        with self.lock:
            self.reclaiming.add(zone)

    def delete_at_start(self, zone: str, user: str = "someone@example.com") -> None:
        """Instances inserted in `zone` are deleted by `user` (another principal: a person, a clean-up job) the moment
        their insert is DONE, as a `delete` operation of theirs records."""
        with self.lock:
            self.deleting_at_start[zone] = user

    def delete_instance(self, project: str, zone: str, name: str, user: str = "someone@example.com") -> None:
        """`user`'s instances.delete of the instance, done at once (its `delete` operation in the zone's history)."""
        with self.lock:
            self._record((project, zone, name), "delete", user)
            del self.instances_by_key[(project, zone, name)]

    def cut_off(self, zone: str, reachable: bool = False) -> None:
        """aggregatedList cannot reach `zone`: as GCE does, it still answers 200, leaves the zone's instances out and
        puts an UNREACHABLE warning in its scope (and the zone in the list's `unreachables`)."""
        with self.lock:
            (self.unreachable.discard if reachable else self.unreachable.add)(zone)

    def withhold(self, zone: str, machine_type: str) -> None:
        """`machine_type` (or an accelerator type) does not exist in `zone`: the zone's machineTypes/acceleratorTypes
        lists leave it out and inserts are rejected with 400, as GCE does."""
        with self.lock:
            self.withheld.add((zone, machine_type))

    def fail_next(self, status: int, reason: str, message: str = "", *, method: str | None = None,
                  path_contains: str | None = None, count: int = 1, headers: dict | None = None) -> None:
        """The next `count` matching requests fail synchronously with this HTTP error (and these headers, e.g.
        Retry-After). An instance's testIamPermissions (apply's check) matches only a `path_contains` naming it: a
        fault aimed at inserts or deletes is theirs."""
        with self.lock:
            self._inject.append(Injected(status, reason, message or f"injected {reason}", method, path_contains, count,
                                         dict(headers or {})))

    def add_network(self, project: str, name: str) -> None:
        with self.lock:
            self.networks.add((project, name))

    def add_subnetwork(self, project: str, region: str, name: str, network: str) -> None:
        with self.lock:
            self.subnetworks[(project, region, name)] = network

    def _network(self, project: str, name: str) -> dict:
        if (project, name) not in self.networks and not (self.default_network and name == "default"):
            raise GceError(404, "notFound", f"The resource 'projects/{project}/global/networks/{name}' was not found")
        return {"kind": "compute#network", "name": name, "selfLink": f"{API}/projects/{project}/global/networks/{name}",
                "autoCreateSubnetworks": name == "default"}

    def _subnetwork(self, project: str, region: str, name: str) -> dict:
        network = self.subnetworks.get((project, region, name))
        if network is None and self.default_network and name == "default":
            network = "default"
        if network is None:
            raise GceError(404, "notFound", f"The resource 'projects/{project}/regions/{region}/subnetworks/{name}' was not found")
        return {"kind": "compute#subnetwork", "name": name, "region": f"{API}/projects/{project}/regions/{region}",
                "network": f"{API}/projects/{project}/global/networks/{network}",
                "selfLink": f"{API}/projects/{project}/regions/{region}/subnetworks/{name}"}

    def _check_nic(self, project: str, zone: str, nic: dict) -> None:
        """An insert's NIC names a network and/or subnetwork that exist, the subnetwork in the instance's region and
        of that network, as GCE checks (it answers 400 invalid, "The referenced ... resource cannot be found")."""
        net = None
        if nic.get("network"):
            m = _NETWORK_REF.match(nic["network"])
            if m is None:
                raise _invalid("resource.networkInterfaces[0].network", nic["network"], "Must be a URL to a valid Compute "
                               "resource of the correct type.")
            try:
                self._network(m.group(1) or project, m.group(2))
            except GceError:
                raise _invalid("resource.networkInterfaces[0].network", nic["network"], "The referenced network resource "
                               "cannot be found.") from None
            net = (m.group(1) or project, m.group(2))
        if nic.get("subnetwork"):
            m = _SUBNETWORK_REF.match(nic["subnetwork"])
            region = zone.rsplit("-", 1)[0]
            if m is None or m.group(2) != region:
                raise _invalid("resource.networkInterfaces[0].subnetwork", nic["subnetwork"], "Must be a subnetwork of the "
                               f"instance's region ({region}).")
            try:
                sub = self._subnetwork(m.group(1) or project, region, m.group(3))
            except GceError:
                raise _invalid("resource.networkInterfaces[0].subnetwork", nic["subnetwork"], "The referenced subnetwork "
                               "resource cannot be found.") from None
            if net is not None and not sub["network"].endswith(f"projects/{net[0]}/global/networks/{net[1]}"):
                raise _invalid("resource.networkInterfaces[0].subnetwork", nic["subnetwork"], "Subnetwork should belong to "
                               "the network.")

    def add_image(self, project: str, name: str, family: str | None = None) -> None:
        """An image (of a family, if given) in `project`, which inserts may boot from."""
        with self.lock:
            self.images.add((project, "", name))
            if family:
                self.images.add((project, "family/", family))

    def early_waits(self, count: int) -> None:
        """The next `count` zoneOperations.wait calls return at once with the operation as it stands (DONE or not),
        as GCE's may when it is overloaded."""
        with self.lock:
            self._early_waits = count

    def age(self, seconds: float) -> None:
        """`seconds` pass for the operations GCE holds: the clock advances (one still running ends) and their
        insertTime, startTime and endTime move back by that much against GCE's wall clock (the Date of its answers),
        so a requestId answered again reads as the earlier insert it is (GCE remembers one >= 60 minutes)."""
        with self.lock:
            self.clock.advance(seconds)
            self._settle()
            for op in self.operations.values():
                op.inserted_at -= seconds
                if op.done_at is not None:
                    op.done_at -= seconds

    def wall(self) -> float:
        """GCE's wall clock, which stamps every time it writes (an operation's insertTime, startTime and endTime, an
        instance's creationTimestamp) and every answer's Date header: this host's, off by clock_skew, as a host whose
        clock is off sees GCE's."""
        return time.time() + self.clock_skew

    def forget_request_ids(self) -> None:
        """GCE remembers a requestId for a limited time; forget them all, as if it had passed."""
        with self.lock:
            self.request_ids.clear()

    def plant(self, project: str, zone: str, name: str, *, machine_type: str = "g2-standard-4",
              labels: dict[str, str] | None = None, status: str = "RUNNING", spot: bool = False) -> dict:
        """An instance someone else created, straight into the state (no operation)."""
        body = {"name": name, "machineType": f"zones/{zone}/machineTypes/{machine_type}", "labels": labels or {},
                "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False, "onHostMaintenance": "TERMINATE",
                               "instanceTerminationAction": "STOP"} if spot else {"onHostMaintenance": "TERMINATE"},
                "disks": [{"boot": True, "autoDelete": True,
                           "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
                "networkInterfaces": [{"network": "global/networks/default"}]}
        with self.lock:
            inst = self._materialize(project, zone, body)
            inst["status"] = status
            self.instances_by_key[(project, zone, name)] = inst
            return copy.deepcopy(inst)

    def preempt(self, project: str, zone: str, name: str) -> None:
        """GCE reclaims a Spot VM: what its scheduling.instanceTerminationAction says (GCE's default STOP keeps it,
        TERMINATED, its disks still billed; DELETE deletes it)."""
        with self.lock:
            if self.instances_by_key[(project, zone, name)]["scheduling"].get("provisioningModel") != "SPOT":
                raise ValueError(f"{name} is not a Spot VM: GCE preempts only Spot (and preemptible) VMs")
            self._preempted((project, zone, name))

    def _preempted(self, key: tuple[str, str, str]) -> None:
        """The system's compute.instances.preempted operation: the VM STOPPING for preempt_grace, then stopped or gone."""
        inst = self.instances_by_key[key]
        inst["status"] = "STOPPING"

        def ended(iid=inst["id"]) -> None:
            cur = self.instances_by_key.get(key)
            if cur is None or cur["id"] != iid:
                return
            if cur["scheduling"].get("instanceTerminationAction", "STOP") == "DELETE":
                del self.instances_by_key[key]
            else:
                cur["status"] = "TERMINATED"

        self._new_op(key[0], key[1], "compute.instances.preempted", key[2], inst["id"], latency=self.preempt_grace, user="system", counted=False,
                     on_done=ended)

    def stop_instance(self, project: str, zone: str, name: str) -> None:
        """`gcloud compute instances stop`, done: the instance stays, TERMINATED (GCE's stopped)."""
        with self.lock:
            self.instances_by_key[(project, zone, name)]["status"] = "TERMINATED"

    def add_reservation(self, project: str, zone: str, name: str, machine_type: str, count: int, *,
                        specific: bool = True) -> None:
        """A zonal reservation of `count` VMs of `machine_type`; `specific`: specificReservationRequired (only an
        insert that names it consumes it), else any matching insert with the default affinity does."""
        with self.lock:
            self.reservations[(project, zone, name)] = {"machine_type": machine_type, "count": count, "specific": specific}

    def reservation_in_use(self, project: str, zone: str, name: str) -> int:
        """The reservation's inUseCount: instances holding one of its slots."""
        with self.lock:
            return self._in_use((project, zone, name))

    def _in_use(self, key: tuple[str, str, str]) -> int:
        return sum(1 for inst in self.instances_by_key.values()
                   if self.consumed.get(inst["id"]) == key and inst["status"] not in ("TERMINATED", "SUSPENDED"))

    def _reservation_for(self, project: str, zone: str, body: dict) -> tuple[str, str, str] | None:
        """The reservation an insert consumes a slot of (None: none), or the 400 GCE answers its affinity with."""
        aff = body.get("reservationAffinity") or {}
        kind = aff.get("consumeReservationType", "ANY_RESERVATION")
        mt = MACHINE_TYPE_RE.fullmatch(body["machineType"]).group(2)  # type: ignore[union-attr]
        if kind in ("NO_RESERVATION", "UNSPECIFIED"):
            return None
        if kind == "ANY_RESERVATION":
            return next((k for k, r in sorted(self.reservations.items()) if k[:2] == (project, zone) and not r["specific"]
                         and r["machine_type"] == mt and self._in_use(k) < r["count"]), None)
        if kind != "SPECIFIC_RESERVATION":
            raise _invalid("resource.reservationAffinity.consumeReservationType", kind, "Unknown reservation affinity.")
        values = aff.get("values") or []
        m = _RESERVATION_VALUE.fullmatch(values[0]) if len(values) == 1 else None
        if aff.get("key") != RESERVATION_KEY or m is None:
            raise _invalid("resource.reservationAffinity", json.dumps(aff), f"SPECIFIC_RESERVATION needs key {RESERVATION_KEY} "
                           "and one value: a reservation name or projects/PROJECT/reservations/NAME.")
        key = (m.group(1) or project, zone, m.group(2))
        r = self.reservations.get(key)
        ref = f"projects/{key[0]}/reservations/{key[2]}"
        if r is None:
            raise _invalid("resource.reservationAffinity", json.dumps(aff), f"Could not find the given reservation with "
                           f"the following name: {ref} in zone {zone}.")
        if not r["specific"]:
            raise _invalid("resource.reservationAffinity", json.dumps(aff), f"Specified reservations [{ref}] can not be "
                           "targeted as specificReservationRequired is not set")
        if r["machine_type"] != mt:
            raise _invalid("resource.reservationAffinity", json.dumps(aff), f"Specified reservation {ref} is for machine "
                           f"type {r['machine_type']}, not {mt}.")
        if self._in_use(key) >= r["count"]:
            raise _invalid("resource.reservationAffinity", json.dumps(aff), f"Specified reservation {ref} does not have "
                           "available resources for the request.")
        return key

    def set_quota(self, metric: str, limit: float, region: str = "") -> None:
        """The limit of a quota metric in `region` ("" : a global, project-wide one)."""
        with self.lock:
            self.quota_limits[(region, metric)] = float(limit)

    def _limit(self, region: str, metric: str) -> float:
        return self.quota_limits.get((region, metric), 0.0 if metric.startswith("PREEMPTIBLE_") else DEFAULT_QUOTA)

    def _charges(self, region: str, inst: dict) -> list[tuple[str, str, float]]:
        """(region or "", metric, units) of every quota a VM counts against."""
        mt = inst["machineType"].rsplit("/", 1)[1]
        spot = inst.get("scheduling", {}).get("provisioningModel") == "SPOT"
        gpus = [(a["acceleratorType"].rsplit("/", 1)[1], a["acceleratorCount"]) for a in inst.get("guestAccelerators", [])]

        def metric(m: str) -> str:
            return f"PREEMPTIBLE_{m}" if spot and self._limit(region, f"PREEMPTIBLE_{m}") > 0 else m
        out = [(region, "INSTANCES", 1.0)]
        cpu = CPU_METRICS.get(mt.split("-", 1)[0])
        if cpu:
            out.append((region, metric(cpu), float(_vcpus(mt))))
        for t, n in gpus:
            if t in GPU_METRICS:
                out.append((region, metric(GPU_METRICS[t]), float(n)))
            out.append(("", "GPUS_ALL_REGIONS", float(n)))
        out.append(("", "CPUS_ALL_REGIONS", float(_vcpus(mt))))
        return out

    def _usage(self, project: str) -> dict[tuple[str, str], float]:
        used: dict[tuple[str, str], float] = {}
        for (p, z, _), inst in self.instances_by_key.items():
            if p == project and inst["status"] != "TERMINATED":
                for k in self._charges(z.rsplit("-", 1)[0], inst):
                    used[k[:2]] = used.get(k[:2], 0.0) + k[2]
        return used

    def _quotas(self, project: str, region: str) -> list[dict]:
        used = self._usage(project)
        return [{"metric": m, "limit": self._limit(region, m), "usage": used.get((region, m), 0.0)}
                for m in (REGIONAL_METRICS if region else GLOBAL_METRICS)]

    def _over_quota(self, project: str, zone: str, inst: dict) -> dict | None:
        """The QUOTA_EXCEEDED error an insert of `inst` gets, if it takes a metric past its limit."""
        used = self._usage(project)
        for region, metric, units in self._charges(zone.rsplit("-", 1)[0], inst):
            limit = self._limit(region, metric)
            if used.get((region, metric), 0.0) + units > limit:
                where = f"in region {region}" if region else "globally"
                return {"code": "QUOTA_EXCEEDED", "message": f"Quota '{metric}' exceeded.  Limit: {limit} {where}."}
        return None

    def instances(self, project: str | None = None) -> list[dict]:
        """A copy of every instance (any status), sorted by zone and name."""
        with self.lock:
            self._settle()
            return [copy.deepcopy(v) for (p, z, n), v in sorted(self.instances_by_key.items())
                    if project is None or p == project]

    def requests(self, method: str, path_contains: str = "") -> list[tuple[str, str, dict[str, list[str]]]]:
        with self.lock:
            return [r for r in self.log if r[0] == method and path_contains in r[1]]

    def deny(self, *permissions: str) -> None:
        """The caller lacks these permissions from now on (IAM, above)."""
        with self.lock:
            self.withheld.update(permissions)

    def _authorize(self, method: str, path: str, body: dict | None) -> None:
        from tests.cloud_iam import gce_insert_permissions, gce_permissions

        if not self.withheld:
            return
        try:
            needed = [gce_permissions(method, path)]
        except LookupError:
            return
        m = _INSTANCES.match(path)
        resource = path.split("/compute/v1/", 1)[1]
        if m and method == "POST" and m.group(3) is None:
            needed += sorted(gce_insert_permissions(body or {}))
            resource += f"/{(body or {}).get('name', '')}"
        for perm in needed:
            if perm in self.withheld:
                raise GceError(403, "forbidden", f"Required '{perm}' permission for '{resource}'")

    # -- request handling ----------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, list[str]], body: dict | None) -> tuple[int, dict]:
        with self.lock:
            self._settle()  # (operations progress by time: what this request sees is what GCE would show now)
            q = {k: v[-1] for k, v in query.items()}
            if (m := _TEST_PERMISSIONS.match(path)) and method == "POST":
                self._instance(*m.groups())  # (404 notFound when there is none)
                held = [p for p in (body or {}).get("permissions") or [] if p not in self.withheld]
                return 200, ({"permissions": held} if held else {})
            self._authorize(method, path, body)
            if m := _INSTANCES.match(path):
                project, zone, name = m.groups()
                self._check_zone(zone)
                if name is None and method == "POST":
                    return 200, self._insert(project, zone, body or {}, q.get("requestId"))
                if name is not None and method == "GET":
                    return 200, copy.deepcopy(self._instance(project, zone, name))
                if name is not None and method == "DELETE":
                    return 200, self._delete(project, zone, name)
            elif m := _IMAGE.match(path):
                if method == "GET":
                    return 200, self._image(m.group(1), m.group(2) or "", m.group(3))
            elif m := _NETWORK.match(path):
                if method == "GET":
                    return 200, self._network(m.group(1), m.group(2))
            elif m := _SUBNETWORK.match(path):
                if method == "GET":
                    return 200, self._subnetwork(*m.groups())
            elif m := _AGGREGATED_TYPES.match(path):
                if method == "GET":
                    return 200, self._aggregated_types(m.group(1), m.group(2), q)
            elif m := _AGGREGATED.match(path):
                if method == "GET":
                    return 200, self._aggregated(m.group(1), q)
            elif m := _REGION.match(path):
                regions = {z.rsplit("-", 1)[0] for z in self.zones}
                if method == "GET" and m.group(2) in regions:
                    return 200, {"kind": "compute#region", "name": m.group(2), "status": "UP",
                                 "zones": [f"{API}/projects/{m.group(1)}/zones/{z}" for z in sorted(self.zones) if z.startswith(m.group(2) + "-")],
                                 "quotas": self._quotas(m.group(1), m.group(2)),
                                 "selfLink": f"{API}/projects/{m.group(1)}/regions/{m.group(2)}"}
            elif m := _PROJECT.match(path):
                if method == "GET":
                    return 200, {"kind": "compute#project", "name": m.group(1), "id": str(abs(hash(m.group(1))) % 10**18),
                                 "quotas": self._quotas(m.group(1), ""), "selfLink": f"{API}/projects/{m.group(1)}"}
            elif m := _OPERATIONS.match(path):
                if method == "GET":
                    return 200, self._list_operations(m.group(1), m.group(2), q)
            elif m := _OPERATION.match(path):
                project, zone, name, wait = m.groups()
                if (method, bool(wait)) in (("GET", False), ("POST", True)):
                    return 200, self._poll(project, zone, name)
            raise GceError(404, "notFound", f"The requested URL {path} was not found on this server.")

    def admit(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        """Log a request and answer it with an injected fault (fail_next), if one matches, before anything else (a
        throttled wait is refused at once, not after blocking)."""
        with self.lock:
            self.log.append((method, path, query))
            for inj in self._inject:
                checking = path.rstrip("/").endswith("/testIamPermissions") and "testIamPermissions" not in (inj.path_contains or "")
                if inj.remaining > 0 and not checking and (inj.method in (None, method)) and (
                        inj.path_contains is None or inj.path_contains in path):
                    inj.remaining -= 1
                    raise GceError(inj.status, inj.reason, inj.message, inj.headers)

    def block_until_ready(self, path: str) -> None:
        """zoneOperations.wait blocks until the operation is DONE (or wait_cap seconds, about 2 minutes at GCE): wait,
        outside the lock, for the clock to reach the operation's end; an early wait (early_waits) does not."""
        m = _OPERATION.match(path)
        if not m or not m.group(4):
            return
        with self.lock:
            op = self.operations.get(m.groups()[:3])
            if op is None or op.done:
                return
            if self._early_waits > 0:
                self._early_waits -= 1
                return
        self.clock.sleep_until(op.ready_at, at_most=self.wait_cap)

    def _settle(self) -> None:
        """Move every operation on to where the clock says it is, polled or not: its instance STAGING half-way, and
        the operation's effect made (instance RUNNING, or gone) once it is DONE, in the order they end."""
        now = self.clock.now()
        for op in sorted(self.operations.values(), key=lambda o: o.ready_at):
            if op.done:
                continue
            if now >= op.staging_at and op.on_staging is not None:
                op.on_staging()
                op.on_staging = None
            if now >= op.ready_at:
                op.done, op.done_at = True, self.wall()
                self.running_ops -= op.counted
                if op.on_done is not None:
                    op.on_done()

    def _check_zone(self, zone: str) -> None:
        if zone not in self.zones:
            raise _invalid("zone", zone, "Unknown zone.")

    def _instance(self, project: str, zone: str, name: str) -> dict:
        inst = self.instances_by_key.get((project, zone, name))
        if inst is None:
            raise GceError(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        return inst

    def _record(self, key: tuple[str, str, str], op_type: str, user: str) -> None:
        """An operation on an instance that is over as it starts (a preemption by the system, someone else's delete):
        DONE, in the zone's history for zoneOperations.list."""
        project, zone, name = key
        now, wall = self.clock.now(), self.wall()
        op = Operation(project, zone, _operation_name(), op_type, name, self.instances_by_key[key]["id"], clock=self.clock,
                       running_at=now, staging_at=now, ready_at=now, inserted_at=wall, user=user, done=True, done_at=wall)
        self.operations[(project, zone, op.name)] = op

    def _new_op(self, project: str, zone: str, op_type: str, target: str, target_id: str, *, latency: float | None = None,
                **kw) -> Operation:
        name = _operation_name()
        now = self.clock.now()
        latency = self.op_latency if latency is None else latency
        op = Operation(project, zone, name, op_type, target, target_id, clock=self.clock,
                       running_at=now + latency / 3, staging_at=now + latency / 2,
                       ready_at=now + latency, inserted_at=self.wall(), **kw)
        self.operations[(project, zone, name)] = op
        self.running_ops += op.counted
        self.max_running_ops = max(self.max_running_ops, self.running_ops)
        self._settle()  # (with no latency it is DONE at once)
        return op

    def _image(self, project: str, family: str, name: str) -> dict:
        if (project, family, name) not in self.images:
            raise GceError(404, "notFound", f"The resource 'projects/{project}/global/images/{family}{name}' was not found")
        return {"kind": "compute#image", "id": str(abs(hash((project, name))) % 10**18), "name": name if not family else
                f"{name}-v20250101", "family": name if family else "", "status": "READY",
                "selfLink": f"{API}/projects/{project}/global/images/{name if not family else name + '-v20250101'}"}

    def _poll(self, project: str, zone: str, name: str) -> dict:
        op = self.operations.get((project, zone, name))
        if op is None:
            raise GceError(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found")
        op.polls += 1
        return op.json()

    def _validate(self, project: str, zone: str, body: dict) -> None:
        name = body.get("name", "")
        if not NAME_RE.fullmatch(name or ""):
            raise _invalid("resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        mt = body.get("machineType", "")
        m = MACHINE_TYPE_RE.fullmatch(mt)
        if not m:
            raise _invalid("resource.machineType", mt, "Must be a URL to a valid Compute resource of the correct type.")
        mt_zone, mt_name = m.groups()
        if mt_zone != zone:
            raise _invalid("resource.machineType", mt, f"Machine type must be in zone '{zone}'.")
        if (zone, mt_name) in self.withheld or (self.machine_types is not None and mt_name not in self.machine_types):
            raise _invalid("resource.machineType", mt, f"Machine type with name '{mt_name}' does not exist in zone '{zone}'.")
        labels = body.get("labels") or {}
        if len(labels) > 64:
            raise _invalid("resource.labels", "", "Resources can have at most 64 labels.")
        for k, v in labels.items():
            if not LABEL_KEY_RE.fullmatch(k):
                raise _invalid("resource.labels", "", f"Label key '{k}' violates format constraints. The key must start "
                               "with a lowercase character, can only contain lowercase letters, numeric characters, "
                               "underscores and dashes. The key can be at most 63 characters long.")
            if not LABEL_VALUE_RE.fullmatch(v):
                raise _invalid("resource.labels", "", f"Label value '{v}' violates format constraints. The value can only "
                               "contain lowercase letters, numeric characters, underscores and dashes. The value can be "
                               "at most 63 characters long.")
        self._validate_metadata((body.get("metadata") or {}).get("items") or [])
        disks = body.get("disks") or []
        boot = [d for d in disks if d.get("boot")]
        if len(boot) != 1:
            raise _invalid("resource.disks", "", "Exactly one boot disk must be specified.")
        params = boot[0].get("initializeParams") or {}
        if not boot[0].get("source") and not params.get("sourceImage"):
            raise GceError(400, "required", "Required field 'resource.disks[0].initializeParams.sourceImage' not specified")
        if params.get("sourceImage"):
            ref = _IMAGE_REF.match(params["sourceImage"])
            if ref is None:
                raise _invalid("resource.disks[0].initializeParams.sourceImage", params["sourceImage"],
                               "Must be a URL to a valid Compute resource of the correct type.")
            self._image(*ref.groups(default=""))
        if params.get("diskType") and f"zones/{zone}/diskTypes/" not in params["diskType"]:
            raise _invalid("resource.disks[0].initializeParams.diskType", params["diskType"], "Disk type must be in the "
                           "instance's zone.")
        nics = body.get("networkInterfaces") or []
        if not nics or not (nics[0].get("network") or nics[0].get("subnetwork")):
            raise GceError(400, "required", "Required field 'resource.networkInterfaces' not specified")
        self._check_nic(project, zone, nics[0])
        sched = body.get("scheduling") or {}
        model = sched.get("provisioningModel", "STANDARD")
        if model not in ("STANDARD", "SPOT"):
            raise _invalid("resource.scheduling.provisioningModel", model, "Unknown provisioning model.")
        self._validate_accelerators(zone, mt_name, body.get("guestAccelerators") or [])
        gpus = mt_name.startswith(GPU_FAMILIES) or bool(body.get("guestAccelerators"))
        if model == "SPOT":
            if sched.get("automaticRestart", True):
                raise _invalid("resource.scheduling.automaticRestart", "true", "Spot instances cannot be automatically "
                               "restarted.")
            if sched.get("onHostMaintenance", "TERMINATE") != "TERMINATE":
                raise _invalid("resource.scheduling.onHostMaintenance", sched["onHostMaintenance"], "Spot instances "
                               "cannot be live migrated.")
            if sched.get("instanceTerminationAction", "STOP") not in ("STOP", "DELETE"):
                raise _invalid("resource.scheduling.instanceTerminationAction", sched["instanceTerminationAction"],
                               "Unknown termination action.")
        if gpus and sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
            raise _invalid("resource.scheduling.onHostMaintenance", sched.get("onHostMaintenance", "MIGRATE"),
                           "Instances with guest accelerators do not support live migration.")

    @staticmethod
    def _validate_metadata(items: list[dict]) -> None:
        """Metadata items as the API reference's `Items` and `Metadata` say: keys of [a-zA-Z0-9-_], under 128 bytes,
        each once; a value at most 262144 bytes (256 KiB); all keys and values together under 512 KB."""
        seen: set[str] = set()
        total = 0
        for i, item in enumerate(items):
            key, value = str(item.get("key") or ""), str(item.get("value") or "")
            if not METADATA_KEY_RE.fullmatch(key) or len(key.encode()) >= 128:
                raise _invalid(f"resource.metadata.items[{i}].key", key, "Must be a match of regex '[a-zA-Z0-9-_]{1,128}'")
            if key in seen:
                raise _invalid("resource.metadata", "", f"Metadata has duplicate key '{key}'.")
            seen.add(key)
            if len(value.encode()) > METADATA_VALUE_BYTES:
                raise _invalid(f"resource.metadata.items[{i}].value", "", f"Metadata value for key '{key}' is "
                               f"{len(value.encode())} bytes, over the limit of {METADATA_VALUE_BYTES} bytes.")
            total += len(key.encode()) + len(value.encode())
        if total >= METADATA_TOTAL_BYTES:
            raise _invalid("resource.metadata", "", f"Metadata is {total} bytes in all, over the limit of "
                           f"{METADATA_TOTAL_BYTES} bytes.")

    def _validate_accelerators(self, zone: str, mt_name: str, accelerators: list[dict]) -> None:
        """GPUs attach to N1 machine types only, in supported counts and vCPU sizes; accelerator-optimized types come
        with theirs (asking for exactly those is allowed, anything else is not)."""
        for i, acc in enumerate(accelerators):
            field_name = f"resource.guestAccelerators[{i}].acceleratorType"
            ref = acc.get("acceleratorType") or ""
            m = ACCELERATOR_TYPE_RE.fullmatch(ref)
            if not m:
                raise _invalid(field_name, ref, "Must be a URL to a valid Compute resource of the correct type.")
            if m.group(2) != zone:
                raise _invalid(field_name, ref, f"Accelerator type must be in zone '{zone}'.")
            name, count = m.group(3), acc.get("acceleratorCount")
            if not isinstance(count, int) or count < 1:
                raise _invalid(f"resource.guestAccelerators[{i}].acceleratorCount", count, "Must be a positive integer.")
            if mt_name.startswith(GPU_FAMILIES):
                if (name, count) not in _built_in(mt_name):
                    raise GceError(400, "invalid", f"[{mt_name}, {name}] features are not compatible for creating instance.")
                continue
            n1 = N1_RE.fullmatch(mt_name)
            if name not in ATTACHABLE or (zone, name) in self.withheld:
                raise _invalid(field_name, ref, f"Accelerator type '{name}' does not exist in zone '{zone}'.")
            if n1 is None:
                raise GceError(400, "invalid", f"[{mt_name}, {name}] features are not compatible for creating instance.")
            if count not in ATTACHABLE[name]:
                raise _invalid(f"resource.guestAccelerators[{i}].acceleratorCount", count,
                               f"Accelerator type '{name}' can be attached in counts of {sorted(ATTACHABLE[name])}.")
            if int(n1.group(1)) > ATTACHABLE[name][count]:
                raise GceError(400, "invalid", f"Number of vCPUs of machine type '{mt_name}' exceeds the maximum of "
                               f"{ATTACHABLE[name][count]} for {count} accelerator(s) of type '{name}'.")

    def _materialize(self, project: str, zone: str, body: dict) -> dict:
        """The Instance resource GCE stores for an insert body: URLs expanded, defaults filled."""
        name = body["name"]
        mt = MACHINE_TYPE_RE.fullmatch(body["machineType"]).group(2)  # type: ignore[union-attr]
        base = f"{API}/projects/{project}/zones/{zone}"
        sched = dict(body.get("scheduling") or {})
        spot = sched.get("provisioningModel") == "SPOT"
        sched.setdefault("provisioningModel", "STANDARD")
        sched.setdefault("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
        sched.setdefault("automaticRestart", not spot)
        sched["preemptible"] = spot
        if spot:
            sched.setdefault("instanceTerminationAction", "STOP")
        boot = next(d for d in body["disks"] if d.get("boot"))
        self._ips += 1
        nic = body["networkInterfaces"][0]
        inst = {
            "kind": "compute#instance", "id": str(random.randrange(10**18, 10**19)), "creationTimestamp": _now(self.wall()),
            "name": name, "machineType": f"{base}/machineTypes/{mt}", "status": "PROVISIONING", "zone": base,
            "networkInterfaces": [{
                "kind": "compute#networkInterface", "name": "nic0", "networkIP": f"10.128.{self._ips // 250}.{self._ips % 250}",
                "network": _expand(project, nic.get("network") or "global/networks/default"),
                **({"subnetwork": _expand(project, nic["subnetwork"])} if nic.get("subnetwork") else {}),
                "fingerprint": _fingerprint(), "stackType": "IPV4_ONLY",
            }],
            "disks": [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE", "index": 0,
                       "source": f"{base}/disks/{boot.get('deviceName') or name}", "deviceName": boot.get("deviceName") or name,
                       "boot": True, "autoDelete": bool(boot.get("autoDelete", False)), "interface": "SCSI",
                       "diskSizeGb": str((boot.get("initializeParams") or {}).get("diskSizeGb") or 10)}],
            "metadata": {"kind": "compute#metadata", "fingerprint": _fingerprint(), **({"items": body["metadata"]["items"]}
                                                                                         if (body.get("metadata") or {}).get("items") else {})},
            "serviceAccounts": body.get("serviceAccounts") or [],
            "selfLink": f"{base}/instances/{name}", "scheduling": sched, "cpuPlatform": "Unknown CPU Platform",
            "labels": dict(body.get("labels") or {}), "labelFingerprint": _fingerprint(), "startRestricted": False,
            "deletionProtection": False, "fingerprint": _fingerprint(), "lastStartTimestamp": _now(self.wall()),
            "reservationAffinity": dict(body.get("reservationAffinity") or {"consumeReservationType": "ANY_RESERVATION"}),
        }
        attached = [(ACCELERATOR_TYPE_RE.fullmatch(a["acceleratorType"]).group(3), a["acceleratorCount"])  # type: ignore[union-attr]
                    for a in body.get("guestAccelerators") or []]
        accelerators = _built_in(mt) or attached
        if accelerators:
            inst["guestAccelerators"] = [{"acceleratorType": f"{base}/acceleratorTypes/{t}", "acceleratorCount": n}
                                         for t, n in accelerators]
        return inst

    def _insert(self, project: str, zone: str, body: dict, request_id: str | None) -> dict:
        if request_id is not None:
            try:
                if uuid.UUID(request_id).int == 0:
                    raise ValueError
            except ValueError:
                raise _invalid("requestId", request_id, "Must be a valid UUID other than all zeros.") from None
            if (project, request_id) in self.request_ids:  # a retry: the original operation, whatever became of it
                return self.operations[self.request_ids[(project, request_id)]].json()
        self._validate(project, zone, body)
        name = body["name"]
        taken = (project, zone, name) in self.instances_by_key
        exists = f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
        if taken and self.conflicts == "http":
            raise GceError(409, "alreadyExists", exists)
        reservation = None if taken else self._reservation_for(project, zone, body)
        self.insert_bodies.append((project, zone, copy.deepcopy(body)))
        if taken:
            op = self._new_op(project, zone, "insert", name, self.instances_by_key[(project, zone, name)]["id"],
                              error={"code": "RESOURCE_ALREADY_EXISTS", "message": exists}, http_error=(409, "CONFLICT"))
        elif zone in self.exhausted:
            code = self.exhausted[zone]
            op = self._new_op(project, zone, "insert", name, str(random.randrange(10**18, 10**19)),
                              error={"code": code, "message": CAPACITY_MESSAGES[code].format(p=project, z=zone)},
                              http_error=(503, "SERVICE UNAVAILABLE") if code.startswith("ZONE_") else (403, "FORBIDDEN"))
        elif (over := self._over_quota(project, zone, self._materialize(project, zone, body))) is not None:
            op = self._new_op(project, zone, "insert", name, str(random.randrange(10**18, 10**19)), error=over,
                              http_error=(403, "FORBIDDEN"))
        else:
            inst = self._materialize(project, zone, body)
            self.instances_by_key[(project, zone, name)] = inst
            if reservation is not None:
                self.consumed[inst["id"]] = reservation

            def staging(key=(project, zone, name), iid=inst["id"]) -> None:
                cur = self.instances_by_key.get(key)
                if cur is not None and cur["id"] == iid and cur["status"] == "PROVISIONING":
                    cur["status"] = "STAGING"

            def running(key=(project, zone, name), iid=inst["id"]) -> None:
                cur = self.instances_by_key.get(key)
                if cur is not None and cur["id"] == iid and cur["status"] in ("PROVISIONING", "STAGING"):
                    cur["status"] = "RUNNING"
                    if zone in self.reclaiming and cur["scheduling"]["provisioningModel"] == "SPOT":
                        self._preempted(key)
                    elif zone in self.deleting_at_start:
                        self._record(key, "delete", self.deleting_at_start[zone])
                        del self.instances_by_key[key]

            op = self._new_op(project, zone, "insert", name, inst["id"], on_done=running, on_staging=staging)
        if request_id is not None:
            self.request_ids[(project, request_id)] = (project, zone, op.name)
        return op.json()

    def _delete(self, project: str, zone: str, name: str) -> dict:
        inst = self._instance(project, zone, name)
        if any(op.op_type == "insert" and op.error is None and op.target_id == inst["id"] and not op.done
               for op in self.operations.values()):
            raise GceError(400, "resourceNotReady", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready")
        inst["status"] = "STOPPING"

        def gone(key=(project, zone, name), iid=inst["id"]) -> None:
            cur = self.instances_by_key.get(key)
            if cur is not None and cur["id"] == iid:
                del self.instances_by_key[key]

        return self._new_op(project, zone, "delete", name, inst["id"], on_done=gone).json()

    def _aggregated_types(self, project: str, kind: str, q: dict[str, str]) -> dict:
        """machineTypes / acceleratorTypes aggregatedList: per zone scope, what the zone offers (one page; `filter`
        in the same grammar as instances)."""
        try:
            pred = parse_filter(q.get("filter", ""))
        except ValueError as e:
            raise _invalid("filter", q.get("filter", ""), f"Invalid list filter expression: {e}.") from None
        if kind == "machineTypes":
            names = sorted(set(MACHINE_TYPES) | (self.machine_types or set()))
        else:
            names = sorted(set(ATTACHABLE) | set(BUILT_IN.values()))
        items: dict[str, dict] = {}
        for z in sorted(self.zones):
            base = f"{API}/projects/{project}/zones/{z}"
            found = []
            for n in names:
                if (z, n) in self.withheld:
                    continue
                r = {"kind": f"compute#{kind[:-1]}", "name": n, "zone": z, "selfLink": f"{base}/{kind}/{n}"}
                if kind == "acceleratorTypes":
                    r["maximumCardsPerInstance"] = max(ATTACHABLE.get(n, {8: 0}))
                if pred(r):
                    found.append(r)
            items[f"zones/{z}"] = {kind: found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{z}' on this page.",
                "data": [{"key": "scope", "value": f"zones/{z}"}]}}
        return {"kind": f"compute#{kind[:-1]}AggregatedList", "id": f"projects/{project}/aggregated/{kind}", "items": items,
                "selfLink": f"{API}/projects/{project}/aggregated/{kind}"}

    def _aggregated(self, project: str, q: dict[str, str]) -> dict:
        try:
            pred = parse_filter(q.get("filter", ""))
        except ValueError as e:
            raise _invalid("filter", q.get("filter", ""), f"Invalid list filter expression: {e}.") from None
        limit, offset = self._paging(q)
        matching = [(z, inst) for (p, z, n), inst in sorted(self.instances_by_key.items())
                    if p == project and z not in self.unreachable and (pred(inst) or not self.honour_filters)]
        page = matching[offset:offset + limit] if limit else []
        items: dict[str, dict] = {}
        for z, inst in page:
            items.setdefault(f"zones/{z}", {"instances": []})["instances"].append(copy.deepcopy(inst))
        for z in sorted(self.unreachable):
            items[f"zones/{z}"] = {"warning": {
                "code": "UNREACHABLE", "message": f"Scope 'zones/{z}' is unreachable.",
                "data": [{"key": "scope", "value": f"zones/{z}"}]}}
        for z in sorted(self.zones):
            items.setdefault(f"zones/{z}", {"warning": {
                "code": "NO_RESULTS_ON_PAGE", "message": f"There are no results for scope 'zones/{z}' on this page.",
                "data": [{"key": "scope", "value": f"zones/{z}"}]}})
        out = {"kind": "compute#instanceAggregatedList", "id": f"projects/{project}/aggregated/instances",
               "items": dict(sorted(items.items())), "selfLink": f"{API}/projects/{project}/aggregated/instances"}
        if self.unreachable:
            out["unreachables"] = [f"zones/{z}" for z in sorted(self.unreachable)]
        if offset + len(page) < len(matching):
            out["nextPageToken"] = _page_token(offset + len(page))
        return out

    def _paging(self, q: dict[str, str]) -> tuple[int, int]:
        """(page size, offset) of a list call: maxResults (at most 500, GCE's cap, or the fake's page_limit) and the
        pageToken of the page before."""
        try:
            limit = min(int(q.get("maxResults", "500")), 500, self.page_limit)
            if limit < 0:
                raise ValueError
        except ValueError:
            raise _invalid("maxResults", q.get("maxResults"), "Must be between 0 and 500.") from None
        try:
            offset = int(base64.urlsafe_b64decode(q["pageToken"]).decode().split(":")[1]) if q.get("pageToken") else 0
        except (ValueError, IndexError, UnicodeDecodeError):
            raise _invalid("pageToken", q.get("pageToken"), "Invalid page token.") from None
        return limit, offset

    def _list_operations(self, project: str, zone: str, q: dict[str, str]) -> dict:
        """zoneOperations.list: the zone's operations, oldest first, that `filter` selects, a page at a time."""
        self._check_zone(zone)
        try:
            pred = parse_filter(q.get("filter", ""))
        except ValueError as e:
            raise _invalid("filter", q.get("filter", ""), f"Invalid list filter expression: {e}.") from None
        limit, offset = self._paging(q)
        ops = sorted((op for (p, z, _), op in self.operations.items() if (p, z) == (project, zone)),
                     key=lambda op: (op.inserted_at, op.name))
        matching = [body for op in ops if pred(body := op.json()) or not self.honour_filters]
        page = matching[offset:offset + limit] if limit else []
        out = {"kind": "compute#operationList", "id": f"projects/{project}/zones/{zone}/operations", "items": page,
               "selfLink": f"{API}/projects/{project}/zones/{zone}/operations"}
        if offset + len(page) < len(matching):
            out["nextPageToken"] = _page_token(offset + len(page))
        return out


def _page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"{uuid.uuid4().hex[:8]}:{offset}".encode()).decode()


def _operation_name() -> str:
    return f"operation-{int(dt.datetime.now().timestamp() * 1000)}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}"


def _vcpus(machine_type: str) -> int:
    """vCPUs of a machine type, as GCE sizes the families the fake offers."""
    family, _, size = machine_type.rpartition("-")
    if size.endswith("g") and size[:-1].isdigit():
        n = int(size[:-1])
        return {"a2-megagpu": 96, "a3-megagpu": 208, "a3-ultragpu": 224}.get(family, (26 if family.startswith("a3") else 12) * n)
    return int(size) if size.isdigit() else 1


def _built_in(machine_type: str) -> list[tuple[str, int]]:
    """The GPUs an accelerator-optimized machine type comes with (none for any other type)."""
    family, _, size = machine_type.rpartition("-")
    if family == "g2-standard" and size.isdigit():
        count = G2_GPUS.get(int(size))
    elif family in BUILT_IN and size[:-1].isdigit() and size.endswith("g"):
        count = int(size[:-1])
    else:
        count = None
    return [(BUILT_IN[family], count)] if count else []


def _expand(project: str, ref: str) -> str:
    if ref.startswith("http"):
        return ref
    if ref.startswith("projects/"):
        return f"{API}/{ref}"
    return f"{API}/projects/{project}/{ref}"


class _Handler(BaseHTTPRequestHandler):
    gce: GceFake
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header, on GCE's clock (Google's front ends send one on every answer, to the second)."""
        return email.utils.formatdate(self.gce.wall() if timestamp is None else timestamp, usegmt=True)

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                raise GceError(400, "parseError", "Parse Error") from None
            self.gce.admit(method, parts.path, query)
            if method == "POST":
                self.gce.block_until_ready(parts.path)
            status, payload = self.gce.handle(method, parts.path, query, body)
            headers: dict = {}
        except GceError as e:
            status, payload, headers = e.status, e.body(), e.headers
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")
