"""GCP Compute Engine through google-cloud-compute (the REST transport).

Ownership is the `fleetops-fleet` label. GCE label keys and values allow only
lowercase letters, digits, `_` and `-` (at most 63 characters, keys start with a
letter), so the logical tags map onto labels: `fleetops.io/X` becomes the key
`fleetops-X`, and a value becomes itself with `.` spelled `_` (exact and
reversible for every name the config allows: names have no `_`). Any other value
is lowercased, cleaned and suffixed with a hash of the original, so two different
values never share a label. observe filters on the fleet label server-side and
checks it again client-side; delete reads the instance first and refuses anything
whose label is not this fleet's.

Creates are idempotent twice over: the instance name is derived from the plan's
key (a second insert of that name is a 409, and an existing instance carrying our
fleet label and the key's label is returned as is), and the insert's requestId is
a UUID derived from the key, so GCE itself answers a retried insert with the
original operation. When that operation succeeded but its instance is gone (the
same plan made again after its instances were deleted), or failed (GCE remembers a
failed insert too: the same key back after a stockout's cool-off or a raised quota),
the create inserts once more under a requestId derived from that operation. What
tells a remembered operation is its insertTime, from before the insert was sent, by
GCE's clock (the answer's Date header), never this host's: an insert may be answered
with its own operation already DONE, and that failure (or its Spot VM, preempted as it
started and gone) is this insert's. Every insert and delete waits on its zone
operation; the operation's errors are what report a stockout or an exhausted quota.

GPUs: accelerator-optimized machine types (a2, a3, g2) come with theirs; N1 types
get theirs attached as guestAccelerators, and their instance type names say so:
`n1-standard-8+1xnvidia-tesla-t4` is machine type n1-standard-8 with one T4
(split_type). observe reads such a name back from the instance's accelerators.

A launch into a Reservation with a target names that reservation (reservationAffinity SPECIFIC_RESERVATION): the
default affinity never consumes a reservation created to be targeted (specificReservationRequired), and one that any
VM may take needs no target.

Spot instances use provisioningModel SPOT with instanceTerminationAction DELETE:
a preempted instance disappears and the next run replaces it. GCE has no bid
price for Spot VMs, so request.max_price is enforced by the planner (catalog
prices), not by the cloud.

google.cloud.compute_v1 is imported lazily. Credentials are Application Default
Credentials (google.auth.default) and are never printed; with the `endpoint`
option (a local fake or emulator) the client sends no credentials at all.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
import uuid
from typing import Any, Callable, ClassVar, Sequence

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, CreateRequest, Instance, Offering, PoolTarget, ProviderContext, Quota
from providers.catalog import load_catalog
from providers.offercache import DEFAULT_TTL_S, cached
from providers.livespot import DEFAULT_SPOT_TTL_S
from providers.options import Option, ProviderOptions, count, seconds, switch, text, url
from providers.redact import redact
from providers.errors import (
    AccessDeniedError, CapacityError, IncompleteObservationError, KeySpentError, OwnershipError, ProviderError, QuotaError,
    TransientProviderError, retry_after_seconds, retry_deadline,
)

log = logging.getLogger(__name__)
_NETWORK_REF = re.compile(r"^(?:(?:.*/)?projects/([^/]+)/)?global/networks/([^/]+)$")
_SUBNETWORK_REF = re.compile(r"^(?:(?:.*/)?projects/([^/]+)/)?regions/([^/]+)/subnetworks/([^/]+)$")
LABEL_PREFIX = "fleetops-"
LABEL_FLEET = "fleetops-fleet"
LABEL_CREATE_KEY = "fleetops-create-key"
LIVE_STATUSES = ("PROVISIONING", "STAGING", "RUNNING", "REPAIRING")  # REPAIRING: back to RUNNING after a host failure
# Stopped, suspended or on the way there: the instance exists (its disks and static IPs are billed) but does not run.
# TERMINATED is GCE's "stopped", not deleted (a deleted instance is gone from the API). Observed as `stopping`: not
# capacity, left alone, noted (reconciler/observe.py).
STOPPED_STATUSES = ("PENDING_STOP", "STOPPING", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED", "DEPROVISIONING")
STATES = {"PROVISIONING": "pending", "STAGING": "pending", "RUNNING": "running", "REPAIRING": "running",
          **{s: "stopping" for s in STOPPED_STATUSES}}
# Operation error codes (and HTTP error texts) that mean "no capacity here now": the zone is marked short.
CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "REGION_RESOURCE_POOL_EXHAUSTED", "RESOURCE_POOL_EXHAUSTED", "STOCKOUT",
})
# A type the zone does not offer (offerings leave such types out; this is for a catalog ahead of the zone) is a
# capacity error too: the zone is cooled off for that type and the next plan goes elsewhere, not the same create again.
CAPACITY_TEXT = re.compile(r"does not have enough resources available|Machine type with name '[^']+' does not exist in zone"
                           r"|Accelerator type '?[^' ]+'? does not exist in zone|state:STOCKOUT|is currently unavailable in the",
                           re.I)
# Project quotas (regional CPUs and GPUs, global GPUS_ALL_REGIONS): a QuotaError, not a zone cool-off.
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
_QUOTA_NAME = re.compile(r"Quota '([A-Z0-9_]+)' exceeded(?:\.\s+Limit: ([0-9.]+) (?:in region ([a-z0-9-]+)|globally))?")
# The quota metrics a VM counts against (regions.get / projects.get `quotas`): its vCPUs against its machine family's
# CPU metric, its GPUs against their accelerator's metric, itself against INSTANCES, and every GPU against the
# project's global GPUS_ALL_REGIONS. A Spot VM counts against PREEMPTIBLE_<metric> where the region grants that
# quota (a limit above 0), else against the standard one, as GCE counts them.
CPU_QUOTAS = {"n1": "CPUS", "n2": "N2_CPUS", "n2d": "N2D_CPUS", "e2": "E2_CPUS", "c2": "C2_CPUS", "c2d": "C2D_CPUS",
              "c3": "C3_CPUS", "a2": "A2_CPUS", "g2": "G2_CPUS", "m1": "M1_CPUS", "m2": "M2_CPUS"}
GPU_QUOTAS = {"nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-tesla-v100": "NVIDIA_V100_GPUS", "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
              "nvidia-tesla-p4": "NVIDIA_P4_GPUS", "nvidia-tesla-a100": "NVIDIA_A100_GPUS", "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
              "nvidia-h100-80gb": "NVIDIA_H100_GPUS", "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
              "nvidia-h200-141gb": "NVIDIA_H200_GPUS", "nvidia-l4": "NVIDIA_L4_GPUS"}
BUILT_IN_GPUS = {"a2-highgpu": "nvidia-tesla-a100", "a2-megagpu": "nvidia-tesla-a100", "a2-ultragpu": "nvidia-a100-80gb",
                 "a3-highgpu": "nvidia-h100-80gb", "a3-megagpu": "nvidia-h100-mega-80gb", "a3-ultragpu": "nvidia-h200-141gb",
                 "g2-standard": "nvidia-l4"}
# Retrying later helps: throttling, and "the resource is busy with another operation".
TRANSIENT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "resourceNotReady"})
TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})
GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-")  # accelerator-optimized: GPUs come with the machine type, no live migration
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"  # CPU machine types
# GPU machine types: a Deep Learning VM image, with the NVIDIA driver and CUDA installed (Debian 12 has neither, so
# the fleet's work could not use a GPU). Families are per CUDA and driver release; pin yours with gcp.image.
DEFAULT_GPU_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"
_IMAGE_REF = re.compile(r"^(?:.*/)?projects/(?P<project>[^/]+)/global/images/(?P<family>family/)?(?P<name>[^/]+)$")
DEFAULT_NETWORK = "global/networks/default"
DEFAULT_DISK_TYPE = "pd-balanced"  # the one persistent disk type the a2, a3-highgpu, g2 and n2 families all accept
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
PREEMPTED = "compute.instances.preempted"  # the operationType GCE records a preemption under
MAX_INSERTS = 4  # remembered operations followed for one key before it counts as spent (KeySpentError)
# How much earlier than GCE's own clock says an insert was sent (its answer's Date, less the time the answer took) GCE
# may stamp that insert's own operation: Date is to the second, and the server that stamps insertTime is not the one
# that answers. An operation begun longer before is an earlier insert's, answered for its requestId.
ANSWER_SLACK_S = 5.0
# The same, dated by this host's clock when an answer has no Date header (an endpoint that sends none): the two clocks
# may be this far apart.
CLOCK_SKEW_S = 30.0
# ReservationAffinity.key naming a reservation (Compute v1 reference): values [NAME], or [projects/P/reservations/NAME]
# for one shared from project P.
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
REQUEST_ID_NAMESPACE = uuid.UUID("6f1c2d4e-9a57-5b1e-8c3f-2a7e0f6d9b41")  # fixed: the same key always gives the same requestId
DEFAULT_PARALLELISM = 100
MAX_PAGE = 500  # GCE's largest page
WAIT_CALL_S = 150.0  # zoneOperations.wait returns by itself after at most ~120 s

_VALUE_OK = re.compile(r"^[a-z0-9.-]{0,63}$")
_INSTANCE_ID = re.compile(r"^projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$")
_ATTACHED = re.compile(r"^(?P<machine>[a-z][-a-z0-9]*)\+(?P<count>[1-9][0-9]?)x(?P<accelerator>[a-z][-a-z0-9]*)$")


# ---------------------------------------------------------------- naming


def image_for(settings: dict, gpus: bool) -> str:
    """The boot image of a pool's instance: its gcp.image, else a driver image for GPU machine types."""
    return settings.get("image") or (DEFAULT_GPU_IMAGE if gpus else DEFAULT_IMAGE)


def _digest(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def label_value(value: str) -> str:
    """A GCE label value for a tag value: exact (`.` as `_`) when that is possible, else cleaned plus a hash."""
    if _VALUE_OK.fullmatch(value):
        return value.replace(".", "_")
    cleaned = re.sub(r"[^a-z0-9-]+", "-", value.lower())[:52].strip("-")  # no `_`, so it never reads back as a `.`
    return f"{cleaned}-{_digest(value)}" if cleaned else _digest(value)


def tag_value(label: str) -> str:
    """The inverse of label_value for the exact case (hashed values read back as they are)."""
    return label.replace("_", ".")


def label_key(tag: str) -> str:
    """`fleetops.io/X` -> `fleetops-X`; any other key cleaned into GCE's key format."""
    key = LABEL_PREFIX + tag.split("/", 1)[1] if tag.startswith("fleetops.io/") else tag
    key = re.sub(r"[^a-z0-9_-]", "-", key.lower())
    if not key[:1].isalpha():
        key = "t-" + key
    return key[:63]


def tag_key(label: str) -> str:
    return "fleetops.io/" + label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else label


def instance_name(key: str) -> str:
    """A deterministic RFC 1035 instance name for a create key: `fo-<key>`, hashed when the key does not fit as is."""
    base = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")
    name = f"fo-{base}"
    if base == key and len(name) <= 63 and not name.endswith("-"):
        return name
    return f"fo-{base[:49]}".rstrip("-") + f"-{_digest(key)}"


def split_type(instance_type: str) -> tuple[str, str | None, int]:
    """`n1-standard-8+1xnvidia-tesla-t4` -> ("n1-standard-8", "nvidia-tesla-t4", 1). N1 GPUs are attached to a VM,
    not part of its machine type, yet one instance type name must say what the solver gets; any other name is a
    machine type as it is (accelerator-optimized types, a2/a3/g2, come with their GPUs)."""
    m = _ATTACHED.fullmatch(instance_type)
    if m is None:
        return instance_type, None, 0
    return m["machine"], m["accelerator"], int(m["count"])


def join_type(machine_type: str, accelerator: str | None, count: int) -> str:
    """The inverse of split_type."""
    return f"{machine_type}+{count}x{accelerator}" if accelerator and count else machine_type


def request_id(fleet: str, key: str) -> str:
    """The insert's requestId: GCE answers a repeated requestId with the original operation."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, f"{fleet}\n{key}"))


def observe_filter(fleet_label: str) -> str:
    """The aggregatedList filter for a fleet's instances, live and stopped (observe keeps the statuses it knows), in
    the form the API documents: a flat chain of parenthesised comparisons (implicitly ANDed). Nested parentheses are
    not part of that grammar, and AND/OR mixed in one chain has no documented precedence, so the chain only ANDs;
    observe checks status and label again."""
    return f'(labels.{LABEL_FLEET} = "{fleet_label}")'


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


# ---------------------------------------------------------------- the provider


def _answer_dates():
    """An InstancesRestInterceptor that keeps the Date header of each insert's answer (GCE's clock), per thread: the
    SDK hands a response's headers to an interceptor only (post_insert_with_metadata), and inserts run on apply's
    threads, one at a time on each."""
    import threading

    from google.cloud.compute_v1.services.instances.transports.rest import InstancesRestInterceptor

    class AnswerDates(InstancesRestInterceptor):
        def __init__(self) -> None:
            self._local = threading.local()

        def post_insert_with_metadata(self, response, metadata):
            self._local.date = next((str(v) for k, v in metadata if k.lower() == "date"), None)
            return response, metadata

        def take(self) -> str | None:
            """The Date of this thread's last insert answer (None if it had none), forgotten as it is read."""
            date, self._local.date = getattr(self._local, "date", None), None
            return date

    return AnswerDates()



def adc_problem(e: Exception) -> str:
    """Why Application Default Credentials could not be had: a GOOGLE_APPLICATION_CREDENTIALS file that is there but
    not credentials (truncated JSON, a wrong kind) is said as such, not as "none found", which sent people looking for
    a login they had. google-auth's message names the file and what is wrong, never a key; redacted and cut anyway."""
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path and os.path.exists(path):
        why = redact(str(e).splitlines()[0][:200]) if str(e) else type(e).__name__
        return (f"GOOGLE_APPLICATION_CREDENTIALS names {path}, which could not be read as credentials ({why}): fix or "
                "replace that file, or unset it to use `gcloud auth application-default login` or the attached service account")
    return ("no Application Default Credentials found: run `gcloud auth application-default login`, attach a service "
            "account, or set GOOGLE_APPLICATION_CREDENTIALS")


DELETE_PERMISSION = "compute.instances.delete"
PERMISSION_ASKS = 50  # instances asked one by one before an apply; past that, one per zone


class GcpProvider:
    name = "gcp"
    # The `-o` options it takes (README, GCP), each checked when the provider is made.
    OPTIONS: ClassVar[dict[str, Option]] = {
        "project": text(), "endpoint": url(), "prices_endpoint": url(), "live_spot": switch(),
        "timeout": seconds(60, zero=False), "operation_timeout": seconds(900, zero=False), "retry_timeout": seconds(30, zero=False),
        "parallelism": count(DEFAULT_PARALLELISM), "retry_window": seconds(300),
        "offerings_ttl": seconds(DEFAULT_TTL_S), "spot_price_ttl": seconds(DEFAULT_SPOT_TTL_S),
    }

    def __init__(self, ctx: ProviderContext):
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        self.ctx = ctx
        self.options = ProviderOptions("gcp", ctx.options, self.OPTIONS)
        self.compute = compute_v1
        self.catalog = load_catalog()
        self.timeout = self.options.seconds("timeout")  # one HTTP call
        self.operation_timeout = self.options.seconds("operation_timeout")  # one insert or delete, start to DONE
        self.retry_timeout = self.options.seconds("retry_timeout")
        self.read_retry = self._read_retry(self.retry_timeout)  # a read's retries, all told
        # Creates (or deletes) apply runs at once per region, and how long it retries a throttled or failed insert
        # (the requestId makes that safe): GCE's rate limits are per minute, so retries span minutes.
        self.parallelism = self.options.count("parallelism")
        self.retry_window_s = self.options.seconds("retry_window")
        self.fleet_label = label_value(ctx.fleet)
        endpoint = self.options.url("endpoint")
        self.default_project: str | None = self.options.text("project")
        if endpoint:
            # A local fake or emulator. The REST transport keeps an explicit http:// scheme
            # from api_endpoint (it only prepends its url_scheme, https, when none is given).
            from google.auth.credentials import AnonymousCredentials

            credentials, options = AnonymousCredentials(), ClientOptions(api_endpoint=endpoint)
        else:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                credentials, adc_project = google.auth.default(scopes=list(SCOPES))
            except DefaultCredentialsError as e:
                raise ProviderError(f"gcp: {adc_problem(e)}") from None
            self.default_project = self.default_project or adc_project
            options = ClientOptions()
        from functools import partial

        from google.cloud.compute_v1.services.instances.transports.rest import InstancesRestTransport

        self._answer_dates = _answer_dates()
        self.instances = compute_v1.InstancesClient(credentials=credentials, client_options=options,
                                                    transport=partial(InstancesRestTransport, interceptor=self._answer_dates))
        self.machine_types = compute_v1.MachineTypesClient(credentials=credentials, client_options=options, transport="rest")
        self.accelerator_types = compute_v1.AcceleratorTypesClient(credentials=credentials, client_options=options,
                                                                   transport="rest")
        self.operations = compute_v1.ZoneOperationsClient(credentials=credentials, client_options=options, transport="rest")
        self.images = compute_v1.ImagesClient(credentials=credentials, client_options=options, transport="rest")
        self.networks = compute_v1.NetworksClient(credentials=credentials, client_options=options, transport="rest")
        self.subnetworks = compute_v1.SubnetworksClient(credentials=credentials, client_options=options, transport="rest")
        self.regions = compute_v1.RegionsClient(credentials=credentials, client_options=options, transport="rest")
        self.projects = compute_v1.ProjectsClient(credentials=credentials, client_options=options, transport="rest")
        self._images_seen: set[str] = set()
        self._networks_seen: set[tuple] = set()

    # -- plumbing ------------------------------------------------------------------
    @staticmethod
    def _read_retry(budget: float):
        """Reads (get, list, operation wait) retry throttling and outages for at most `budget` seconds; the
        client's own default would keep at it for 10 minutes. Inserts are retried by apply, with the same
        requestId, so GCE never runs one twice."""
        import requests
        from google.api_core import exceptions as gexc
        from google.api_core.retry import Retry, if_exception_type

        return Retry(initial=0.25, maximum=4.0, multiplier=2.0, timeout=budget, predicate=if_exception_type(
            gexc.ServiceUnavailable, gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway,
            gexc.GatewayTimeout, gexc.DeadlineExceeded, requests.ConnectionError))

    def _reads(self, left: float | None = None):
        """The retry of a read inside a create or delete (its operation wait, its gets): read_retry, cut to `left`
        seconds (what is left of the operation's timeout) and to what is left of the retry window of the caller that
        retries the create or delete (apply's, providers.errors.retry_deadline()); None, sent once, when nothing is.
        Before, a try apply started near the end of its window retried its reads for retry_timeout (30 s) past it."""
        budget = self._read_budget() if left is None else min(self._read_budget(), left)
        if budget >= self.retry_timeout:
            return self.read_retry
        return self.read_retry.with_timeout(budget) if budget > 0 else None

    def _read_budget(self) -> float:
        """How long a read inside a create or delete may retry: retry_timeout, or what is left of apply's window."""
        deadline = retry_deadline()
        return self.retry_timeout if deadline is None else min(self.retry_timeout, deadline - time.monotonic())

    def _project(self, pool: PoolTarget) -> str:
        project = pool.settings.get("project") or self.default_project
        if not project:
            raise ProviderError(f"gcp: pool {pool.name} has no project: set gcp.project in the Pool or pass -o project=ID")
        return str(project)

    def _call(self, what: str, fn: Callable[[], Any], *, where: tuple[str, str, str] | None = None,
              passthrough: tuple[type[BaseException], ...] = ()) -> Any:
        """One API call with our error mapping. `where` = (zone, type, market) makes capacity errors CapacityErrors;
        exceptions in `passthrough` (NotFound, Conflict) reach the caller unmapped."""
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as aexc
        import requests

        try:
            return fn()
        except passthrough:
            raise
        except gexc.GoogleAPICallError as e:
            reasons = {str(d.get("reason", "")) for d in (e.errors or []) if isinstance(d, dict)}
            text = f"gcp: {what}: HTTP {e.code}: {e.message}"
            if where is not None and (reasons & QUOTA_CODES or "QUOTA_EXCEEDED" in e.message):
                raise self._quota_error(text, e.message, where[0]) from None
            if where is not None and (reasons & CAPACITY_CODES or any(c in e.message for c in CAPACITY_CODES)
                                      or CAPACITY_TEXT.search(e.message)):
                raise CapacityError(text, cloud="gcp", zone=where[0], instance_type=where[1], market=where[2]) from None
            if e.code in TRANSIENT_HTTP or reasons & TRANSIENT_REASONS:
                headers = getattr(getattr(e, "response", None), "headers", None)
                raise TransientProviderError(text, retry_after=retry_after_seconds(headers)) from None
            raise ProviderError(text) from None
        except gexc.RetryError as e:  # the client's own retries of a read ran out
            raise TransientProviderError(f"gcp: {what}: {e.message}; last error: {e.cause}") from None
        except (requests.ConnectionError, requests.Timeout, aexc.TransportError) as e:
            raise TransientProviderError(f"gcp: {what}: {type(e).__name__}") from None
        except aexc.GoogleAuthError as e:  # refresh failures: the message names the problem, never the secret
            raise ProviderError(f"gcp: {what}: credentials: {type(e).__name__}: {e}") from None

    def _quota_error(self, text: str, message: str, zone: str, project: str | None = None) -> QuotaError:
        """The quota GCE names ("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."), where it applies, and the
        console page that raises it."""
        m = _QUOTA_NAME.search(message)
        quota = m.group(1) if m else "unknown (see the message)"
        region = (m.group(3) if m and m.group(3) else "global" if m and m.group(2) else zone.rsplit("-", 1)[0])
        page = "https://console.cloud.google.com/iam-admin/quotas" + (f"?project={project}" if project else "")
        how = (f"{page} (filter on {quota}), or see it with `gcloud compute "
               + ("project-info describe" if region == "global" else f"regions describe {region}") + "`")
        return QuotaError(text, cloud="gcp", quota=quota, region=region, how_to_raise=how)

    def _wait(self, what: str, project: str, zone: str, op) -> Any:
        """Wait for a zone operation to be DONE. zoneOperations.wait may return early (best effort), so loop. One not
        DONE after operation_timeout fails the call, not as a transient error: a retry would only wait for it again
        (an insert's requestId answers with this same operation), operation_timeout more each time. Each wait call gets
        what is left of operation_timeout, its read retries too (and no more than what is left of apply's window,
        _reads): the deadline was checked only between calls, and a call blocked on a slow operation (150 s) or
        retrying throttled reads (retry_timeout) ran past it."""
        deadline = time.monotonic() + self.operation_timeout
        pause = 0.05
        while op.status != self.compute.Operation.Status.DONE:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._not_done(what, op)
            started = time.monotonic()
            name = op.name
            cut = left < self._read_budget()  # the operation's deadline, not a read budget, ends this call's retries
            try:
                op = self._call(f"{what}: wait for {name}", lambda: self.operations.wait(
                    project=project, zone=zone, operation=name, timeout=min(WAIT_CALL_S, left), retry=self._reads(left)))
            except TransientProviderError as e:
                if not cut and time.monotonic() < deadline:
                    raise
                raise self._not_done(what, op, e) from None
            if op.status != self.compute.Operation.Status.DONE and time.monotonic() - started < 1.0:
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))  # the wait came back at once: do not spin
                pause = min(pause * 2, 2.0)
        return op

    def _not_done(self, what: str, op, last: Exception | None = None) -> ProviderError:
        made = " and uses the instance it made, launching nothing twice" if op.operation_type == "insert" else ""
        why = f"its last read failed: {last}" if last is not None else "GCE is still working on it"
        return ProviderError(f"gcp: {what}: operation {op.name} is not done after {self.operation_timeout:g} s ({why}); "
                             f"the next run sees how it ended{made} (-o operation_timeout=SECONDS waits longer)")

    @staticmethod
    def _op_errors(op) -> list[tuple[str, str]]:
        return [(e.code, e.message) for e in op.error.errors] if "error" in op else []

    def _get(self, project: str, zone: str, name: str):
        from google.api_core.exceptions import NotFound

        try:
            return self._call(f"get {name} in {zone}", lambda: self.instances.get(
                project=project, zone=zone, instance=name, timeout=self.timeout, retry=self._reads()), passthrough=(NotFound,))
        except NotFound:
            return None

    def _to_instance(self, project: str, d) -> Instance:
        zone = _last(d.zone)
        labels = dict(d.labels)
        tags = {tag_key(k): (tag_value(v) if k.startswith(LABEL_PREFIX) else v) for k, v in labels.items()}
        if labels.get(LABEL_FLEET) == self.fleet_label:
            tags[TAG_FLEET] = self.ctx.fleet  # exact, even where the label had to be hashed
        sched = d.scheduling
        spot = sched.provisioning_model == "SPOT" or bool(sched.preemptible)
        machine = _last(d.machine_type)
        itype = machine
        if not machine.startswith(GPU_FAMILIES) and len(d.guest_accelerators) == 1:  # an N1 with its GPUs attached
            acc = d.guest_accelerators[0]
            itype = join_type(machine, _last(acc.accelerator_type), acc.accelerator_count)
        return Instance(
            id=f"projects/{project}/zones/{zone}/instances/{d.name}", provider=self.name, cloud="gcp",
            region=zone.rsplit("-", 1)[0], zone=zone, instance_type=itype,
            market="spot" if spot else "on-demand", state=STATES.get(d.status, "terminated"),  # type: ignore[arg-type]
            pool=tags.get(TAG_POOL, ""), tags=tags, launched_at=d.creation_timestamp,
        )

    def _locate(self, instance: Instance) -> tuple[str, str, str]:
        m = _INSTANCE_ID.fullmatch(instance.id)
        if m:
            return m.group(1), m.group(2), m.group(3)
        if not self.default_project:
            raise ProviderError(f"gcp: cannot tell the project of instance {instance.id}; pass -o project=ID")
        return self.default_project, instance.zone, instance.id

    # -- apply-time permission check -------------------------------------------------
    def preflight(self, creates: Sequence[CreateRequest], deletes: Sequence[Instance], instances: Sequence[Instance],
                  retag: Sequence[Instance] = ()) -> None:
        """Apply time, before anything is created (base.Preflight). GCE has no dry run; instances.testIamPermissions
        answers which of the permissions asked the caller holds on an instance (its own IAM policy and every one above
        it, conditions evaluated on it; no permission needed to ask). Asked compute.instances.delete on each instance
        the plan deletes, and where the apply only creates in a project, on one of the fleet's instances there (a failed
        gang is rolled back, and later plans delete what this one launches); past PERMISSION_ASKS instances, one per
        zone. Without it an apply created the replacements and then failed every delete (403 forbidden): old and new
        both ran, billed. Refused, naming it.
        Not asked: what a create needs (compute.instances.create, disks.create, subnetworks.use, setLabels, setMetadata,
        iam.serviceAccounts.actAs): they are project permissions (or the service account's, the subnet's), which
        Compute's testIamPermissions cannot answer for an instance not made yet; Cloud Resource Manager's
        projects.testIamPermissions could (README, GCP: Permissions). A refused create changes nothing: it fails as
        before. Nor in a project where the fleet has no instance yet: as on AWS, nothing of its own to ask on."""
        from google.api_core.exceptions import NotFound

        targets = {i.id: i for i in deletes}
        asked = set()
        for i in deletes:
            try:
                asked.add(self._locate(i)[0])
            except ProviderError:
                continue
        for project in sorted({p for r in creates if (p := r.pool.settings.get("project") or self.default_project)} - asked):
            mine = sorted((i for i in instances if i.alive and _INSTANCE_ID.fullmatch(i.id) and self._locate(i)[0] == project),
                          key=lambda i: i.id)
            if mine:
                targets[mine[0].id] = mine[0]
        if len(targets) > PERMISSION_ASKS:  # (a teardown of thousands: one read each would take minutes of GCE's
            # per-project read rate) one per zone, whose answer is the project's policy; an instance's own policy
            # refusing a delete the others may make is then met at the call
            by_zone: dict[tuple[str, str], Instance] = {}
            for iid, inst in sorted(targets.items()):
                m = _INSTANCE_ID.fullmatch(iid)
                by_zone.setdefault((m.group(1), m.group(2)) if m else ("", inst.zone), inst)
            targets = {i.id: i for i in by_zone.values()}
        refused: list[str] = []
        for iid, inst in sorted(targets.items()):
            try:
                project, zone, name = self._locate(inst)
            except ProviderError:
                continue
            request = self.compute.TestPermissionsRequest(permissions=[DELETE_PERMISSION])
            try:
                held = self._call(f"test permissions on {name} in {zone}", lambda: self.instances.test_iam_permissions(
                    project=project, zone=zone, resource=name, test_permissions_request_resource=request,
                    timeout=self.timeout, retry=self.read_retry), passthrough=(NotFound,))
            except NotFound:
                continue  # gone: its delete has nothing to do
            if DELETE_PERMISSION not in list(held.permissions):
                refused.append(f"projects/{project}/zones/{zone}/instances/{name}")
        if refused:
            raise AccessDeniedError(
                f"gcp: the credentials may not {DELETE_PERMISSION}, which this apply needs (instances.testIamPermissions "
                f"on {', '.join(refused[:3])}{f' and {len(refused) - 3} more' if len(refused) > 3 else ''}); grant a role "
                "holding it (README, GCP: Permissions) and apply again", actions=(DELETE_PERMISSION,))

    # -- observe -------------------------------------------------------------------
    def observe(self, pools: Sequence[PoolTarget]) -> list[Instance]:
        """Every instance of the fleet, live or stopped (`stopping`: TERMINATED and SUSPENDED ones are billed for
        their disks and IPs, so they are reported, not dropped), or an IncompleteObservationError: aggregatedList does not fail when a zone
        cannot be reached, it leaves that zone's instances out and says so in a warning (UNREACHABLE, or the list's
        `unreachables`). Instances it could not see are not gone, and a plan made without them would replace them."""
        projects = {self._project(p) for p in pools}
        if self.default_project:
            projects.add(self.default_project)  # instances of removed pools stay visible, so they can be cleaned up
        found: list[Instance] = []
        for project in sorted(projects):
            request = self.compute.AggregatedListInstancesRequest(project=project, filter=observe_filter(self.fleet_label),
                                                                  max_results=MAX_PAGE)
            pages = self._call(f"list instances in {project}", lambda: list(
                self.instances.aggregated_list(request=request, timeout=self.timeout, retry=self.read_retry).pages))
            unreachable: set[str] = set()
            for page in pages:
                unreachable.update(page.unreachables)
                for scope, scoped in page.items.items():
                    if "warning" in scoped and scoped.warning.code == self.compute.Warning.Code.UNREACHABLE:
                        unreachable.add(scope)
                    for d in scoped.instances:
                        if d.labels.get(LABEL_FLEET) == self.fleet_label and d.status in STATES:
                            found.append(self._to_instance(project, d))
            if unreachable:
                raise IncompleteObservationError(
                    f"gcp: listing instances in project {project} could not reach {', '.join(sorted(unreachable))}: the "
                    "fleet's instances there are unknown, so no plan is made (one would replace them); retry later")
        return found

    # -- offerings -----------------------------------------------------------------
    def offerings(self, pools: Sequence[PoolTarget]) -> list[Offering]:
        """Shapes and list prices from the catalog, dated by it (Offering.prices_as_of), for the types each zone
        really offers: machineTypes and acceleratorTypes aggregatedList (cached, providers/offercache.py). Types the
        catalog does not price in a pool's region, or a zone does not offer, are left out."""
        seen: dict[tuple[str, str], Offering] = {}
        for p in pools:
            self._check_images(p)
            self._check_network(p)
            offered = self._zone_offers(self._project(p), p.instance_types)
            for z in p.zones:
                for t in p.instance_types:
                    machine, accelerator, _ = split_type(t)
                    if (z, machine) not in offered or (accelerator and (z, accelerator) not in offered):
                        continue
                    o = self.catalog.offering("gcp", p.region, z, t)
                    if o is not None:
                        seen.setdefault((z, t), o)
        return self._live_spot(list(seen.values()))

    def _live_spot(self, offers: list[Offering]) -> list[Offering]:
        """Spot prices from the Cloud Billing Catalog API (Preemptible SKUs), cached `spot_price_ttl` seconds
        (providers/livespot.py). The API needs an API key (GOOGLE_API_KEY or FLEETOPS_GCP_API_KEY): without one the
        catalog's dated prices. With a custom compute `endpoint` (a test) only when `prices_endpoint` is given too;
        `live_spot=off` keeps the catalog's."""
        from providers.livespot import gcp_spot, read_spot, unread, with_live_spot
        from providers.pricesources import PriceSourceError, gcp_api_key

        prices_endpoint = self.options.url("prices_endpoint")
        if (not offers or not gcp_api_key() or (self.options.text("endpoint") and not prices_endpoint)
                or self.options.off("live_spot")):
            return offers
        types = sorted({o.instance_type for o in offers})
        regions = sorted({o.region for o in offers})
        ttl = self.options.seconds("spot_price_ttl")
        api = "Cloud Billing Catalog API"
        try:
            prices, read_at = read_spot(self.ctx.state_dir, "gcp", [prices_endpoint or ""] + types + regions, ttl,
                                        lambda: gcp_spot(self.catalog, types, regions, prices_endpoint))
        except PriceSourceError as e:
            log.warning("gcp: %s unreadable, planning with the catalog's spot prices: %s", api, e)
            return unread(offers, api, e)
        return with_live_spot(offers, prices, api, read_at)

    def _check_network(self, pool: PoolTarget) -> None:
        """Plan time: the pool's `network` and `subnetwork` exist (networks.get, subnetworks.get; a Shared VPC's are
        read in the host project their reference names), the subnetwork is in the pool's region and belongs to the
        network, so a mistyped name is an error naming the pool before anything is inserted (GCE would refuse every
        insert: "The referenced network resource cannot be found")."""
        from google.api_core.exceptions import Forbidden, NotFound

        s, project = pool.settings, self._project(pool)
        network, subnetwork = s.get("network"), s.get("subnetwork")
        key = (project, pool.region, network, subnetwork)
        if (not network and not subnetwork) or key in self._networks_seen:
            return
        net_ref = None
        if network:
            m = _NETWORK_REF.match(network if "/" in network else f"global/networks/{network}")
            if m is None:
                raise ProviderError(f"gcp: pool {pool.name}: network {network!r} is not a network name or global/networks/NAME")
            net_ref = (m.group(1) or project, m.group(2))
            try:
                self._call(f"get network {network}", lambda: self.networks.get(
                    project=net_ref[0], network=net_ref[1], timeout=self.timeout, retry=self.read_retry), passthrough=(NotFound, Forbidden))
            except (NotFound, Forbidden) as e:
                raise ProviderError(f"gcp: pool {pool.name}: network {network} does not exist in project {net_ref[0]} (or "
                                    f"this account may not read it: HTTP {e.code}); set gcp.network to one that does") from None
        if subnetwork:
            m = _SUBNETWORK_REF.match(subnetwork if "/" in subnetwork else f"regions/{pool.region}/subnetworks/{subnetwork}")
            if m is None or m.group(2) != pool.region:
                raise ProviderError(f"gcp: pool {pool.name}: subnetwork {subnetwork!r} is not a subnetwork of the pool's "
                                    f"region {pool.region}")
            sub_project = m.group(1) or project
            try:
                sub = self._call(f"get subnetwork {subnetwork}", lambda: self.subnetworks.get(
                    project=sub_project, region=pool.region, subnetwork=m.group(3), timeout=self.timeout, retry=self.read_retry),
                    passthrough=(NotFound, Forbidden))
            except (NotFound, Forbidden) as e:
                raise ProviderError(f"gcp: pool {pool.name}: subnetwork {subnetwork} does not exist in {pool.region} of project "
                                    f"{sub_project} (or this account may not read it: HTTP {e.code}); set gcp.subnetwork to "
                                    "one that does") from None
            if net_ref is not None and not str(sub.network).endswith(f"projects/{net_ref[0]}/global/networks/{net_ref[1]}"):
                raise ProviderError(f"gcp: pool {pool.name}: subnetwork {subnetwork} belongs to {sub.network.rsplit('/', 1)[-1]}, "
                                    f"not network {network}")
        self._networks_seen.add(key)

    # -- quotas --------------------------------------------------------------------
    def quotas(self, pools: Sequence[PoolTarget]) -> list[Quota]:
        """The project quotas the pools' types count against, with limit and usage as GCE reports them now:
        regions.get for the regional metrics, projects.get for GPUS_ALL_REGIONS. Read every run (one call per region
        and project): usage moves with every launch, the fleet's own last apply included."""
        by_project: dict[str, list[PoolTarget]] = {}
        for p in pools:
            by_project.setdefault(self._project(p), []).append(p)
        out: list[Quota] = []
        for project, ps in sorted(by_project.items()):
            counts: dict[tuple[str, str], set[tuple[str, str, float]]] = {}  # (region or "", metric) -> counts
            metrics: dict[str, dict[str, Any]] = {}  # region or "" -> metric -> Quota proto
            glob = self._call(f"get project {project}", lambda: self.projects.get(
                project=project, timeout=self.timeout, retry=self.read_retry))
            metrics[""] = {q.metric: q for q in glob.quotas}
            for region in sorted({p.region for p in ps}):
                r = self._call(f"get region {region} in {project}", lambda: self.regions.get(
                    project=project, region=region, timeout=self.timeout, retry=self.read_retry))
                metrics[region] = {q.metric: q for q in r.quotas}
            for p in ps:
                for t in p.instance_types:
                    for market in ("on-demand", "spot"):
                        for region, metric, units in self._counted(t, market, p.region, metrics):
                            counts.setdefault((region, metric), set()).add((t, market, units))
            page = f"https://console.cloud.google.com/iam-admin/quotas?project={project}"
            for (region, metric), cs in sorted(counts.items()):
                q = metrics[region][metric]
                how = f"{page} (filter on {metric}), or see it with `gcloud compute " + (
                    f"regions describe {region} --project {project}`" if region else f"project-info describe --project {project}`")
                out.append(Quota(cloud="gcp", region=region, name=metric, unit="GPUs" if "GPUS" in metric.split("_") else
                                 "instances" if metric == "INSTANCES" else "vCPUs", limit=float(q.limit), used=float(q.usage),
                                 counts=tuple(sorted(cs)), how_to_raise=how))
        return out

    def _counted(self, itype: str, market: str, region: str, metrics: dict[str, dict[str, Any]]):
        """(region or "", metric, units) of each quota one `market` VM of `itype` in `region` counts against, among
        those the project lists."""
        shape = self.catalog.shape("gcp", itype)
        if shape is None:
            return
        machine, accelerator, _ = split_type(itype)
        here = metrics.get(region, {})

        def pick(metric: str | None) -> str | None:
            spot = f"PREEMPTIBLE_{metric}"
            if metric and market == "spot" and spot in here and here[spot].limit > 0:
                return spot
            return metric if metric in here else None

        accelerator = accelerator or BUILT_IN_GPUS.get(machine.rsplit("-", 1)[0])
        for metric, units in ((pick(CPU_QUOTAS.get(machine.split("-", 1)[0])), float(shape.cpu)),
                              (pick(GPU_QUOTAS.get(accelerator or "")), float(shape.gpus)), (pick("INSTANCES"), 1.0)):
            if metric and units:
                yield region, metric, units
        if shape.gpus and "GPUS_ALL_REGIONS" in metrics.get("", {}):
            yield "", "GPUS_ALL_REGIONS", float(shape.gpus)

    def _gpus(self, itype: str) -> bool:
        machine, accelerator, _ = split_type(itype)
        shape = self.catalog.shape("gcp", itype)
        return machine.startswith(GPU_FAMILIES) or accelerator is not None or bool(shape and shape.gpus)

    def _check_images(self, pool: PoolTarget) -> None:
        """Plan time: every image the pool's instances would boot exists and this project may read it (images.get, or
        getFromFamily for a family), so a mistyped or retired image is an error naming the pool before anything is
        launched, not a failed insert in the middle of an apply. A reference of another form is left to the insert."""
        from google.api_core.exceptions import Forbidden, NotFound

        for image in sorted({image_for(pool.settings, self._gpus(t)) for t in pool.instance_types}):
            m = _IMAGE_REF.match(image)
            if image in self._images_seen or m is None:
                continue
            project, name = m.group("project"), m.group("name")
            try:
                if m.group("family"):
                    self._call(f"get image family {name}", lambda: self.images.get_from_family(
                        project=project, family=name, timeout=self.timeout, retry=self.read_retry), passthrough=(NotFound, Forbidden))
                else:
                    self._call(f"get image {name}", lambda: self.images.get(
                        project=project, image=name, timeout=self.timeout, retry=self.read_retry), passthrough=(NotFound, Forbidden))
            except (NotFound, Forbidden) as e:
                raise ProviderError(f"gcp: pool {pool.name}: image {image} does not exist or project {self._project(pool)} "
                                    f"cannot read it ({getattr(e, 'message', e)}); set gcp.image to one that does "
                                    f"(GPU types default to {DEFAULT_GPU_IMAGE})") from None
            self._images_seen.add(image)

    def _zone_offers(self, project: str, instance_types: Sequence[str]) -> set[tuple[str, str]]:
        """{(zone, machine type or accelerator type)} the project can use, for these types' names."""
        machines = sorted({split_type(t)[0] for t in instance_types})
        accelerators = sorted({a for t in instance_types if (a := split_type(t)[1])})
        key = "gcp-" + _digest(f"{project}\n{machines}\n{accelerators}", 16)

        def read() -> list[list[str]]:
            out: list[list[str]] = []
            for kind, names in (("machine", machines), ("accelerator", accelerators)):
                for i in range(0, len(names), 20):  # a flat `(name = a) OR (name = b)` chain, 20 names a call
                    flt = " OR ".join(f"(name = {n})" for n in names[i:i + 20])
                    out += [[_last(scope), item.name] for scope, item in self._list_types(kind, project, flt)]
            return out

        return {(z, n) for z, n in cached(self.ctx.state_dir, key, self.options.seconds("offerings_ttl"), read)}

    def _list_types(self, kind: str, project: str, flt: str):
        c = self.compute
        client = self.machine_types if kind == "machine" else self.accelerator_types
        request = (c.AggregatedListMachineTypesRequest if kind == "machine" else c.AggregatedListAcceleratorTypesRequest)(
            project=project, filter=flt, max_results=MAX_PAGE)
        pages = self._call(f"list {kind} types in {project}", lambda: list(
            client.aggregated_list(request=request, timeout=self.timeout, retry=self.read_retry).pages))
        for page in pages:
            for scope, scoped in page.items.items():
                for item in (scoped.machine_types if kind == "machine" else scoped.accelerator_types):
                    yield scope, item

    # -- create / delete -----------------------------------------------------------
    def _resource(self, request: CreateRequest, project: str, name: str):
        c = self.compute
        p, zone, itype = request.pool, request.zone, request.instance_type
        machine, accelerator, count = split_type(itype)
        s = dict(p.settings)
        tags = {**request.tags, TAG_FLEET: self.ctx.fleet, TAG_POOL: p.name, TAG_CREATE_KEY: request.key}
        labels = {label_key(k): label_value(str(v)) for k, v in tags.items()}
        gpus = self._gpus(itype)
        if request.market == "spot":
            scheduling = c.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                      on_host_maintenance="TERMINATE", automatic_restart=False)
        else:
            scheduling = c.Scheduling(provisioning_model="STANDARD", automatic_restart=True,
                                      on_host_maintenance="TERMINATE" if gpus else "MIGRATE")
        network = s.get("network")
        subnetwork = s.get("subnetwork")
        nic = c.NetworkInterface()
        if network:
            nic.network = network if "/" in network else f"global/networks/{network}"
        if subnetwork:
            nic.subnetwork = subnetwork if "/" in subnetwork else f"regions/{p.region}/subnetworks/{subnetwork}"
        if not network and not subnetwork:
            nic.network = DEFAULT_NETWORK
        resource = c.Instance(
            name=name, machine_type=f"zones/{zone}/machineTypes/{machine}", labels=labels, scheduling=scheduling,
            network_interfaces=[nic],
            disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
                source_image=image_for(s, gpus), disk_type=f"zones/{zone}/diskTypes/{DEFAULT_DISK_TYPE}"))],
        )
        if request.capacity_reservation:  # a Reservation's target: GCE's default affinity (ANY_RESERVATION) never takes
            # a slot of a reservation only named instances may consume, so unnamed the VM would run (billed) outside it
            resource.reservation_affinity = c.ReservationAffinity(consume_reservation_type="SPECIFIC_RESERVATION",
                                                                  key=RESERVATION_KEY, values=[request.capacity_reservation])
        if accelerator is not None:
            resource.guest_accelerators = [c.AcceleratorConfig(
                accelerator_count=count, accelerator_type=f"projects/{project}/zones/{zone}/acceleratorTypes/{accelerator}")]
        if s.get("service_account"):
            resource.service_accounts = [c.ServiceAccount(email=s["service_account"], scopes=list(SCOPES))]
        if request.agent_state_url:  # GCE runs startup-script at every boot; it installs and starts the node agent
            from providers.bootstrap import bootstrap_script

            script = bootstrap_script("gcp", request.agent_state_url, f"projects/{project}/zones/{zone}/instances/{name}",
                                      mig=request.pool.mig)
            resource.metadata = c.Metadata(items=[c.Items(key="startup-script", value=script)])
        return resource

    def create(self, request: CreateRequest) -> Instance:
        project, zone = self._project(request.pool), request.zone
        name = instance_name(request.key)
        what = f"insert {request.market} {request.instance_type} in {zone}"
        resource = self._resource(request, project, name)
        rid = request_id(self.ctx.fleet, request.key)
        fresh_gone = 0
        for _ in range(MAX_INSERTS):
            op, d, replayed = self._insert(project, zone, name, request, resource, rid, what)
            if d is not None:
                # A Spot VM preempted as it started is STOPPING for up to 30 s (GCE's soft off) before it is deleted:
                # not a stopped VM to start again, a preemption.
                if (not replayed and op is not None and d.status in STOPPED_STATUSES and d.scheduling.provisioning_model == "SPOT"
                        and self._preempted(self._ended_by(project, zone, name, op, what))):
                    raise self._preemption(what, name, request)
                return self._to_instance(project, d)
            # The operation succeeded but its instance is gone. Either GCE answered our requestId with the operation
            # of an earlier create of this key whose instance was deleted since (the same plan made again: a config
            # reverted while GCE still remembers the requestId), or this insert's VM went as it started (a Spot VM
            # preempted, or deleted by someone else). Insert once more, under a requestId derived from that operation,
            # so a retry of the new insert is still deduplicated; a chain of remembered operations (the plan came back
            # more than once) is followed the same way. So is a remembered operation that failed (the same key back
            # after a stockout's cool-off or a quota raised). An operation answered DONE within ANSWER_SLACK_S of the
            # insert may be either (_began_before), so the first fresh one gone is inserted again too.
            fresh_gone += not replayed
            if fresh_gone == 2:  # gone twice before we could look: preempted (no spot capacity there), or deleted
                by = self._ended_by(project, zone, name, op, what)
                if self._preempted(by):
                    raise self._preemption(what, name, request)
                if by is not None:
                    raise ProviderError(f"gcp: {what}: {name} was deleted by {by.user or 'someone'} (operation {by.name}) "
                                        "as soon as it was made, twice; not launched again by this run")
                raise ProviderError(f"gcp: {what}: {name} was made and is gone, twice, and GCE records neither a "
                                    "preemption nor a delete of it; not launched again by this run")
            rid = request_id(self.ctx.fleet, f"{request.key}\n{op.id}")
        raise KeySpentError(f"gcp: {what}: GCE answered {MAX_INSERTS} requestIds of key {request.key} with operations "
                            "whose instances are gone, or which failed earlier")

    def _ended_by(self, project: str, zone: str, name: str, insert, what: str):
        """GCE's record of what ended the VM `insert` made: its compute.instances.preempted operation if GCE preempted
        it, else the last `delete` of it (by whom: its user), else None. A preemption is an operation of its own, whose
        targetLink and targetId are the VM's ("Determine if a VM was preempted", Spot VMs guide; Google's
        preemption_history sample lists a zone's operations filtered on them). Without it, a VM a person or a clean-up
        job deleted read as a Spot VM preempted: a capacity error that cooled the zone off for spot."""
        request = self.compute.ListZoneOperationsRequest(project=project, zone=zone, max_results=MAX_PAGE,
                                                         filter=f'(targetLink = "{insert.target_link}")')
        history = self._call(f"{what}: list the operations on {name}", lambda: list(self.operations.list(
            request=request, timeout=self.timeout, retry=self._reads())))
        ended = [o for o in history if o.target_id == insert.target_id and o.operation_type in (PREEMPTED, "delete")]
        return next((o for o in ended if o.operation_type == PREEMPTED), ended[-1] if ended else None)

    @staticmethod
    def _preempted(by) -> bool:
        return by is not None and by.operation_type == PREEMPTED

    @staticmethod
    def _preemption(what: str, name: str, request: CreateRequest) -> CapacityError:
        return CapacityError(f"gcp: {what}: {name} was preempted right after it started", cloud="gcp", zone=request.zone,
                             instance_type=request.instance_type, market=request.market)

    def _insert(self, project: str, zone: str, name: str, request: CreateRequest, resource, rid: str, what: str):
        """One insert, waited on: (its operation, the instance it made or None if that instance is gone, whether
        GCE answered with an operation already DONE). A failure GCE remembered (it keeps a requestId's operation for at
        least 60 minutes, failed ones too) is an earlier try's, not this one's, and reads as None (insert again), never
        as a stockout or an exhausted quota now; this insert's own failure, answered DONE or not, is that error."""
        from google.api_core.exceptions import Conflict

        insert = self.compute.InsertInstanceRequest(project=project, zone=zone, instance_resource=resource, request_id=rid)
        self._answer_dates.take()
        started = time.monotonic()
        try:
            op = self._call(what, lambda: self.instances.insert_unary(request=insert, timeout=self.timeout),
                            where=(zone, request.instance_type, request.market), passthrough=(Conflict,))
        except Conflict:  # the name is taken: ours from an earlier try, or someone else's
            return None, self._adopt(project, zone, name, request), False
        # Answered DONE and begun before this insert was sent: an earlier insert's operation. Its failure (a stockout, a
        # quota since raised) says nothing of now, and its instance, gone, was an earlier create's: either way the
        # create inserts again under a requestId of its own. This insert's own operation (answered DONE at once, a
        # stockout found at once or a Spot VM preempted as it started) is what happened now.
        remembered = (op.status == self.compute.Operation.Status.DONE
                      and self._began_before(op, self._answer_dates.take(), time.monotonic() - started))
        op = self._wait(what, project, zone, op)
        errors = self._op_errors(op)
        if errors:
            codes = {code for code, _ in errors}
            if "RESOURCE_ALREADY_EXISTS" in codes:
                return op, self._adopt(project, zone, name, request), remembered
            if remembered:
                return op, None, True
            text = f"gcp: {what}: " + "; ".join(f"{code}: {msg}" for code, msg in errors)
            if codes & QUOTA_CODES:
                raise self._quota_error(text, " ".join(msg for _, msg in errors), zone, project)
            if codes & CAPACITY_CODES or any(CAPACITY_TEXT.search(msg) for _, msg in errors):
                raise CapacityError(text, cloud="gcp", zone=zone, instance_type=request.instance_type, market=request.market)
            raise ProviderError(text)  # a retry with this key would get this same operation back: not transient
        return op, self._get(project, zone, name), remembered

    @staticmethod
    def _began_before(op, answered: str | None, took: float) -> bool:
        """Whether a DONE operation GCE answered an insert with is an earlier insert's, its requestId seen before ("the
        server can check if original operation with the same request ID was received, and if so, will ignore the second
        request": InsertInstanceRequest.request_id, Compute v1). DONE alone does not say so: GCE may answer an insert
        with its own operation already DONE, a stockout or an exhausted quota in its error (google-api-core's
        ExtendedOperation handles a first answer "in case the operation came back already complete"; Google's sample
        compute/.../WaitForOperation.java checks "if the operation hasn't been completed already" before it waits).
        Its insertTime does: an earlier insert's began before this one was sent. Both dated by GCE's clock: the answer's
        Date header (`answered`) less the `took` seconds the answer took, so this host's clock, which may be off by
        minutes, plays no part (it compared insertTime with it, 30 s allowed: a host 90 s fast read every stockout as
        remembered and inserted again until the key was spent). With no Date, this host's clock, CLOCK_SKEW_S allowed.
        One without a readable insertTime cannot be dated and is taken as this insert's."""
        from datetime import datetime
        from email.utils import parsedate_to_datetime

        try:
            began = datetime.fromisoformat(op.insert_time).timestamp()
        except ValueError:
            return False
        try:
            now, slack = parsedate_to_datetime(answered).timestamp(), ANSWER_SLACK_S  # type: ignore[arg-type]
        except (TypeError, ValueError):
            now, slack = time.time(), CLOCK_SKEW_S
        return began < now - took - slack

    def _adopt(self, project: str, zone: str, name: str, request: CreateRequest):
        """The instance holding our name, if it is this fleet's and this key's; never someone else's. A stopped one
        (TERMINATED: GCE keeps it) is returned as it is, `stopping`: the key's instance exists, so apply launches no
        second one for the key (reconciler/apply.py) and the name stays taken until it is started or deleted."""
        d = self._get(project, zone, name)
        if d is None:
            raise TransientProviderError(f"gcp: {name} in {zone} was reported to exist but is gone; retry")
        owner = d.labels.get(LABEL_FLEET)
        if owner != self.fleet_label:
            raise OwnershipError(f"gcp: an instance named {name} already exists in {project}/{zone} and is not fleet "
                                 f"{self.ctx.fleet!r}'s (its {LABEL_FLEET} label is {owner!r}); refusing to adopt it")
        if d.labels.get(LABEL_CREATE_KEY) != label_value(request.key):
            raise ProviderError(f"gcp: {name} in {zone} belongs to this fleet but was created with another key "
                                f"({d.labels.get(LABEL_CREATE_KEY)!r}, not {request.key!r})")
        return d

    def delete(self, instance: Instance) -> None:
        from google.api_core.exceptions import NotFound

        project, zone, name = self._locate(instance)
        d = self._get(project, zone, name)
        if d is None:
            return  # already gone
        owner = d.labels.get(LABEL_FLEET)
        if owner != self.fleet_label:
            raise OwnershipError(f"gcp: refusing to delete {instance.id}: its {LABEL_FLEET} label is {owner!r}, "
                                 f"not {self.fleet_label!r}")
        what = f"delete {name} in {zone}"
        try:
            op = self._call(what, lambda: self.instances.delete_unary(project=project, zone=zone, instance=name,
                                                                      timeout=self.timeout), passthrough=(NotFound,))
        except NotFound:
            return
        op = self._wait(what, project, zone, op)
        errors = [(code, msg) for code, msg in self._op_errors(op) if code != "RESOURCE_NOT_FOUND"]
        if errors:
            raise ProviderError(f"gcp: {what}: " + "; ".join(f"{code}: {msg}" for code, msg in errors))
