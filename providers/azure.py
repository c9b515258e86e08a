"""Azure virtual machines through azure-mgmt-compute.

Scope: a pool launches into one subscription and resource group (its `azure:`
section, else the run's `-o subscription_id=... -o resource_group=...`). Observe
lists the VMs of every such resource group (the SDK follows nextLink) and keeps
those whose fleet tag is ours.

Ownership is the fleet tag. Azure tag names may not contain < > % & \\ ? /, so the
logical tags are stored with '/' replaced by '_' (`fleetops.io/fleet` becomes
`fleetops.io_fleet`) and mapped back when observing. Delete reads the VM first and
refuses anything whose fleet tag is not ctx.fleet.

Creates are idempotent by name: the VM name is derived from the fleet and the
plan's key, and an existing VM of that name carrying our tags is returned instead
of being written again. The NIC is created by Compute itself
(networkInterfaceConfigurations in the pool's subnet) and, like the OS disk, is
deleted with the VM, so the provider needs nothing beyond azure-mgmt-compute.
Long-running operations are polled to the end (bounded by `lro_timeout`; a create not seen done by then is read once,
as ARM's Retry-After may have put its next poll past the deadline: allocated, it is the create's VM; Failed, it is the
create's failed allocation (its error, a stockout a CapacityError, the VM removed); else it fails, its VM left to the
next run, the error saying whether it was still allocating or ARM refused its status polls, and its polls stop: azure-core's poller thread would poll it for the rest of the process). A create
whose status polls failed (the SDK's retries of a throttled poll run out) is retried by apply; the retry finds the VM
Creating and polls the same operation again (its continuation token) for what is left of that create's `lro_timeout`,
ending as the first try would have: never a VM still allocating answered as created. A create whose operation
another write to its VM preempted (Canceled, OperationPreempted) waits on the VM itself (_after_preemption).

Retries: one layer owns each call's. The calls a create or delete makes inside apply's retry window (the GET that
starts it, the PUT, the DELETE, and the GETs within: the power state of the VM an earlier try made, the Failed VM read
before it is removed) are sent once, with the SDK's retries off: apply retries them for `retry_window`
(ARM's write limits are per minute and per hour), waiting at least the Retry-After ARM answers. Before, azure-core's
RetryPolicy (1 + max_retries tries, honouring Retry-After) ran inside apply's window: 4 PUTs per apply try; with ARM
answering 429 to every PUT, examples/azure-only's 4 creates made 224 PUTs in the 300 s window (68 now), 64 with no
window at all (16 now); under ARM read throttling (its read limits are apart from its write limits) a create's power
state read was 4 GETs and 3 Retry-After sleeps per apply try (1 now). Everything else (observe's lists, quotas, SKUs,
images, subnets, and the polls of a long-running operation, which azure-core's poller expects retried) is retried by
the SDK alone, `max_retries` times; a create or delete waits on its polls for at most `lro_timeout` in all, however
long they are retried: the operations one create waits on (a delete of the Failed VM an earlier try left, its PUT's, a
delete of the VM whose allocation failed) share it, so a create takes its single requests plus at most `lro_timeout`. A launch
into a Reservation with a target names its capacity reservation group
(properties.capacityReservation): a VM takes reserved capacity only from a group it
names.

Credentials: azure.identity.DefaultAzureCredential (imported lazily). Tokens are
never printed or logged; errors carry only ARM's error code and message.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Sequence
from urllib.parse import urlsplit

from providers.base import TAG_CREATE_KEY, TAG_FLEET, TAG_POOL, CreateRequest, Instance, Offering, PoolTarget, ProviderContext, Quota
from providers.catalog import load_catalog
from providers.offercache import DEFAULT_TTL_S, cached
from providers.livespot import DEFAULT_SPOT_TTL_S
from providers.options import Option, ProviderOptions, count, seconds, switch, text, url
from providers.errors import (AccessDeniedError, CapacityError, OwnershipError, ProviderError, QuotaError, TransientProviderError,
                             retry_after_seconds)

log = logging.getLogger(__name__)

CAPACITY_CODES = {
    "SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest", "NotAvailableForSubscription",
}
# OperationNotAllowed is also what a max price below the current spot price looks like (capacity: try elsewhere),
# and what a quota (regional cores, a VM family's cores, spot "LowPriorityCores") looks like: a QuotaError;
# other OperationNotAllowed errors are configuration errors.
CAPACITY_HINTS = ("maxprice", "max price", "spot price")
QUOTA_CODES = {"QuotaExceeded"}
_QUOTA_NAME = re.compile(r"approved (\S+?)(?: Cores)? quota|Quota exceeded for (\S+?)\.?(?:\s|$)", re.I)
QUOTA_PAGE = "https://portal.azure.com/#view/Microsoft_Azure_Capacity/QuotaMenuBlade/~/myQuotas"
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
# AnotherOperationInProgress / OperationPreempted: the VM (or its NIC) is busy with another operation, or a
# platform operation preempted ours; the same PUT or DELETE succeeds later, so they are retried with backoff.
TRANSIENT_CODES = {"TooManyRequests", "RetryableError", "ServerTimeout", "InternalServerError", "ServiceUnavailable",
                   "AnotherOperationInProgress", "OperationPreempted"}
DEFAULT_PARALLELISM = 100
STATES = {"creating": "pending", "updating": "running", "migrating": "running", "succeeded": "running",
          "deleting": "stopping"}
# unknown: Azure cannot reach the VM's host; the VM is not gone. Counted as running: the node agent's heartbeat says
# whether its work is healthy (a silent agent gets it replaced), as for any running VM.
POWER_STATES = {"running": "running", "starting": "pending", "stopping": "stopping", "stopped": "stopping",
                "deallocating": "stopping", "deallocated": "stopping", "unknown": "running"}
TAG_NAME_FORBIDDEN = set('<>%&\\?/')
LOGICAL_PREFIX, AZURE_PREFIX = "fleetops.io/", "fleetops.io_"
DEFAULT_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"  # CPU sizes; Gen2
# GPU sizes: the Ubuntu HPC image (Gen2, as the GPU sizes require) ships the NVIDIA driver, CUDA and the InfiniBand
# stack; plain Ubuntu has no driver, so the fleet's work could not use a GPU. Pin a version with azure.image.
DEFAULT_GPU_IMAGE = "microsoft-dsvm:ubuntu-hpc:2204:latest"
NETWORK_API_VERSION = "2020-11-01"  # lets Compute create the NIC itself
PERMISSIONS_API_VERSION = "2022-04-01"  # Microsoft.Authorization Permissions - List For Resource Group / For Resource
ARM_HOST = "management.azure.com"  # where a real credential's token may go (the SDK's scope: its .default)
TEST_CREDENTIAL = "fake-for-tests"  # TEST ONLY: a static bearer token, refused without a custom endpoint

_VM_ID = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/virtualMachines/([^/]+)$", re.I)


# -- names and tags -------------------------------------------------------------------------------
def azure_tag_name(name: str) -> str:
    """A logical tag name as Azure allows it: fleetops.io/fleet -> fleetops.io_fleet."""
    return "".join("_" if c in TAG_NAME_FORBIDDEN else c for c in name)


def azure_tags(tags: dict[str, str] | Any) -> dict[str, str]:
    return {azure_tag_name(k): str(v) for k, v in dict(tags).items()}


def logical_tags(tags: dict[str, str] | None) -> dict[str, str]:
    """Back from Azure: our own tags regain their '/'; anyone else's tags are left alone."""
    return {(LOGICAL_PREFIX + k[len(AZURE_PREFIX):] if k.startswith(AZURE_PREFIX) else k): v for k, v in (tags or {}).items()}


def _slug(s: str) -> str:
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", s.lower())).strip("-")


def vm_name(fleet: str, key: str) -> str:
    """The VM (and Linux computer) name for a create key: deterministic, <= 64 of [a-z0-9-].

    Readable (`<fleet>-<key>`) when that is lossless; otherwise shortened and made
    unique with a hash of the exact fleet and key, so distinct keys never share a name."""
    f, k = _slug(fleet), _slug(key)
    name = f"{f}-{k}"
    if f == fleet and k == key and len(name) <= 64 and f and k:
        return name
    digest = hashlib.sha256(f"{fleet}\0{key}".encode()).hexdigest()[:12]
    head = "-".join(p for p in (f[:20].strip("-"), k[:28].strip("-")) if p)
    return f"{head}-{digest}" if head else f"vm-{digest}"


def capacity_group_id(scope: "Scope", target: str) -> str:
    """A Reservation target's capacity reservation group id: the target as Azure's guide writes the id
    (`subscriptions/.../capacityReservationGroups/NAME`, the leading '/' optional), or a group name in the pool's
    resource group."""
    if "/" in target:
        return "/" + target.lstrip("/")
    return (f"/subscriptions/{scope.subscription}/resourceGroups/{scope.resource_group}/providers/Microsoft.Compute/"
            f"capacityReservationGroups/{target}")


def image_for(settings: dict, gpus: bool) -> str:
    """The image of a pool's VM: its azure.image, else a driver image for GPU sizes."""
    return settings.get("image") or (DEFAULT_GPU_IMAGE if gpus else DEFAULT_IMAGE)


def parse_image(image: str | None) -> dict[str, str]:
    """An image reference: a resource id (custom or gallery image) or a publisher:offer:sku:version URN."""
    image = image or DEFAULT_IMAGE
    if image.startswith("/"):
        return {"id": image}
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise ProviderError(f"azure: image {image!r} is neither an image resource id nor a publisher:offer:sku:version URN")
    return dict(zip(("publisher", "offer", "sku", "version"), parts))


def zone_number(region: str, zone: str) -> str:
    """Topology zones are '<region>-<n>' (eastus-1); ARM wants the bare '1'."""
    prefix = f"{region}-"
    n = zone[len(prefix):] if zone.startswith(prefix) else ""
    if not n.isdigit():
        raise ProviderError(f"azure: zone {zone!r} is not of the form {region}-<number> (e.g. {region}-1)")
    return n


@dataclass(frozen=True)
class Scope:
    """One subscription and resource group: what Azure lists and addresses VMs by."""

    subscription: str
    resource_group: str

    @property
    def key(self) -> tuple[str, str]:
        return self.subscription.lower(), self.resource_group.lower()

    def vm_id(self, name: str) -> str:
        # Built here, not taken from ARM, which may spell the group in another case: ids must be stable.
        return f"/subscriptions/{self.subscription.lower()}/resourceGroups/{self.resource_group.lower()}/providers/Microsoft.Compute/virtualMachines/{name}"


@dataclass(frozen=True)
class _Allocation:
    """A VM allocation a create started and has not seen end (its status polls failed and apply retries the create):
    what the retry waits on instead of answering the VM, still Creating, as a pending instance."""

    deadline: float  # time.monotonic() at which the create's lro_timeout ends
    token: str  # the operation's continuation token (LROPoller.continuation_token()): the retry polls it again


class _Polls:
    """How the status polls of one long-running operation (each try of them, the SDK's retries included) were last
    answered: an azure-core raw_response_hook. `refused`: the refusals (HTTP >= 400) since the last answer."""

    def __init__(self) -> None:
        self.refused, self.status, self.code = 0, 0, ""

    def __call__(self, response) -> None:
        http = response.http_response
        if http.status_code < 400:
            self.refused = 0
            return
        self.refused, self.status = self.refused + 1, http.status_code
        try:
            body = http.json()
        except Exception:  # noqa: BLE001 - a body that is not JSON (or not read): the status alone
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        self.code = str(error.get("code") or "") if isinstance(error, dict) else ""


class _Preempted(TransientProviderError):
    """A VM operation ended Canceled, OperationPreempted: a later write to the VM took over from it. Transient for a
    DELETE (sent again, it deletes); a create's is waited out on the VM itself (AzureProvider._after_preemption)."""


class _GaveUp(Exception):
    """Ends the polling of an operation whose wait gave up (raised in its LROPoller's thread, which keeps it)."""


@functools.cache
def _stoppable_polling() -> type:
    """ARMPolling that polls no more once stop() is called. azure-core's LROPoller polls an operation in a thread of
    its own until the operation ends; LROPoller.wait(timeout) only stops waiting on that thread: after a wait gave up
    (lro_timeout), a held allocation was still polled every polling_interval, for as long as the process ran. Stopped,
    the thread ends at its next poll (update_status) or at once if it is waiting between polls; a poll in flight (with
    the SDK's retries of it) is answered first."""
    from azure.mgmt.core.polling.arm_polling import ARMPolling

    class StoppablePolling(ARMPolling):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._stopped = threading.Event()

        def stop(self) -> None:
            self._stopped.set()

        def update_status(self) -> None:
            if self._stopped.is_set():
                raise _GaveUp("polling stopped: the wait on this operation gave up")
            super().update_status()

        def _sleep(self, delay: float) -> None:  # LROBasePolling's wait between polls (transport.sleep): woken by stop()
            if self._stopped.wait(delay):
                raise _GaveUp("polling stopped: the wait on this operation gave up")

    return StoppablePolling


class StaticTokenCredential:
    """TEST ONLY: a TokenCredential that hands out a fixed bearer token, for a local ARM fake."""

    def __init__(self, token: str):
        self._token = token

    def get_token(self, *scopes: str, claims: str | None = None, tenant_id: str | None = None, **kwargs: Any):
        from azure.core.credentials import AccessToken

        return AccessToken(self._token, int(time.time()) + 3600)

    def __repr__(self) -> str:
        return "StaticTokenCredential(<redacted>)"


# -- the provider ---------------------------------------------------------------------------------
class AzureProvider:
    name = "azure"
    # The `-o` options it takes (README, Azure), each checked when the provider is made.
    OPTIONS: ClassVar[dict[str, Option]] = {
        "subscription_id": text(), "resource_group": text(), "resource_groups": text(), "credential": text(),
        "endpoint": url(), "ca_bundle": text(), "prices_endpoint": url(), "live_spot": switch(),
        "timeout": seconds(60.0, zero=False), "polling_interval": seconds(5.0), "lro_timeout": seconds(1800.0),
        "max_retries": count(3, least=0),
        "parallelism": count(DEFAULT_PARALLELISM), "retry_window": seconds(300.0),
        "offerings_ttl": seconds(DEFAULT_TTL_S), "spot_price_ttl": seconds(DEFAULT_SPOT_TTL_S),
    }

    def __init__(self, ctx: ProviderContext):
        import azure.mgmt.compute  # noqa: F401 - fail at load time (registry: "install the extra") if missing
        import importlib.util

        if importlib.util.find_spec("azure.identity") is None:  # imported only when a credential is first needed
            raise ModuleNotFoundError("No module named 'azure.identity'", name="azure.identity")

        self.ctx = ctx
        self.options = ProviderOptions("azure", ctx.options, self.OPTIONS)
        self.catalog = load_catalog()
        self.endpoint = self.options.url("endpoint")
        if self.endpoint and not self.endpoint.startswith("https://"):
            raise ProviderError(f"azure: endpoint {self.endpoint!r} must be https:// (bearer tokens are only sent over TLS)")
        mode = self.options.text("credential") or "default"
        if mode not in (TEST_CREDENTIAL, "default"):  # its value is never shown: a client secret typed here was echoed
            raise ProviderError(f"azure: option credential takes only {TEST_CREDENTIAL} (a local ARM fake's; the value given "
                                "is not shown): leave it unset for DefaultAzureCredential, which reads AZURE_CLIENT_ID/"
                                "AZURE_TENANT_ID/AZURE_CLIENT_SECRET, workload or managed identity, and `az login`")
        if self.endpoint and mode != TEST_CREDENTIAL and (urlsplit(self.endpoint).hostname or "").lower() != ARM_HOST:
            # The SDK asks the credential for a token scoped to https://management.azure.com whatever base_url is, so
            # a live management token would go to whoever answers there (a typo, or a hostile -o in a CI config).
            raise ProviderError(f"azure: endpoint {self.endpoint!r} is not Azure Resource Manager ({ARM_HOST}): a real "
                                f"credential's token is only sent there; a local ARM fake takes credential={TEST_CREDENTIAL}")
        self.ca_bundle = self.options.text("ca_bundle")
        # One HTTP request's connect and read timeouts (azure-core's default is 300 s each, so an ARM connection that
        # went silent held an apply 300 s a try, and each of the SDK's retries 300 s more: 20 minutes at max_retries 3).
        self.timeout = self.options.seconds("timeout")
        self.polling_interval = self.options.seconds("polling_interval")
        self.lro_timeout = self.options.seconds("lro_timeout")
        self.max_retries = self.options.count("max_retries")  # the SDK's retries of reads and polls (not of writes)
        self._credential: Any = None
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.RLock()
        # Creates (or deletes) apply runs at once per region, and how long it retries throttling and busy VMs:
        # ARM's write limits are per minute (and per hour), so retries span minutes.
        self.parallelism = self.options.count("parallelism")
        self.retry_window_s = self.options.seconds("retry_window")
        # VM id -> the allocation a create started and whose end it has not seen (apply retries that create).
        self._allocations: dict[str, _Allocation] = {}
        self._allocations_lock = threading.Lock()

    # -- plumbing ------------------------------------------------------------------
    def credential(self):
        if self._credential is None:
            mode = self.options.text("credential") or "default"
            if mode == TEST_CREDENTIAL:
                if not self.endpoint:
                    raise ProviderError(f"azure: credential={TEST_CREDENTIAL} is for a local ARM fake; it needs endpoint=https://...")
                self._credential = StaticTokenCredential(TEST_CREDENTIAL)
            else:  # "default": anything else was refused when the provider was made
                from azure.identity import DefaultAzureCredential

                self._credential = DefaultAzureCredential()
        return self._credential

    def compute(self, subscription: str):
        with self._clients_lock:  # apply calls in from worker threads
            return self._compute(subscription)

    def _compute(self, subscription: str):
        key = subscription.lower()
        if key not in self._clients:
            from azure.mgmt.compute import ComputeManagementClient

            kwargs: dict[str, Any] = {"polling_interval": self.polling_interval, "retry_total": self.max_retries,
                                      "user_agent": "fleetops-reconciler", "connection_timeout": self.timeout,
                                      "read_timeout": self.timeout}
            if self.endpoint:
                kwargs["base_url"] = self.endpoint
            if self.ca_bundle:
                kwargs["connection_verify"] = self.ca_bundle
            self._clients[key] = ComputeManagementClient(self.credential(), subscription, **kwargs)
        return self._clients[key]

    def _default_subscription(self) -> str | None:
        return self.options.text("subscription_id") or os.environ.get("AZURE_SUBSCRIPTION_ID") or None

    def _scope(self, settings: dict | Any) -> Scope:
        s = dict(settings or {})
        sub = s.get("subscription_id") or self._default_subscription()
        rg = s.get("resource_group") or self.options.text("resource_group")
        if not sub or not rg:
            raise ProviderError("azure: no subscription/resource group: set azure.subscription_id and azure.resource_group on "
                                "the pool, or pass -o subscription_id=... -o resource_group=... (or set AZURE_SUBSCRIPTION_ID)")
        return Scope(str(sub), str(rg))

    def _scopes(self, pools: Sequence[PoolTarget]) -> list[Scope]:
        """Every resource group to look in: the pools', the run's default, and `resource_groups`
        (comma-separated `group` or `subscription/group`), so instances of removed pools are still found."""
        found: dict[tuple[str, str], Scope] = {}
        for p in pools:
            sc = self._scope(p.settings)
            found.setdefault(sc.key, sc)
        default_sub, default_rg = self._default_subscription(), self.options.text("resource_group")
        if default_sub and default_rg:
            found.setdefault(Scope(default_sub, default_rg).key, Scope(default_sub, default_rg))
        for item in (self.options.text("resource_groups") or "").split(","):
            item = item.strip()
            if not item:
                continue
            sub, _, rg = item.rpartition("/")
            sub = sub or default_sub
            if not sub:
                raise ProviderError(f"azure: resource_groups entry {item!r} needs a subscription (subscription/group)")
            found.setdefault(Scope(sub, rg).key, Scope(sub, rg))
        return sorted(found.values(), key=lambda s: s.key)

    def _sent_once(self, polls: _Polls | None = None) -> dict[str, Any]:
        """Keyword arguments for a create's PUT or a delete's DELETE (begin_create_or_update, begin_delete): the request
        sent once, with the SDK's retries off (apply's _retry owns them, for retry_window, waiting at least ARM's
        Retry-After), and polled with the client's own retries. The polling method is given explicitly because the
        SDK hands an operation's keyword arguments to its default one too: retry_total=0 would reach every poll."""
        return {"retry_total": 0, "polling": self._polling(polls)}

    def _polling(self, polls: _Polls | None = None):
        """The polling method of an operation: the client's retries; `polls` sees how each poll was answered. One that
        _wait stops when it gives up on the operation (_stoppable_polling)."""
        hook: dict[str, Any] = {"raw_response_hook": polls} if polls is not None else {}
        return _stoppable_polling()(self.polling_interval, path_format_arguments={"endpoint": self.endpoint or f"https://{ARM_HOST}"},
                                    **hook)

    def _call(self, what: str, fn: Callable[[], Any], *, capacity: tuple[str, str, str] | None = None) -> Any:
        """One ARM call with our error mapping (reads and polls: the SDK already retried throttling; writes are sent
        once, see _sent_once)."""
        from azure.core.exceptions import AzureError

        try:
            return fn()
        except AzureError as e:
            raise self._map_error(what, e, capacity) from None

    def _map_error(self, what: str, e: Exception, capacity: tuple[str, str, str] | None) -> ProviderError:
        from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError, ServiceResponseError

        if isinstance(e, ClientAuthenticationError):  # includes azure.identity's CredentialUnavailableError
            return ProviderError(f"azure: {what}: not authenticated ({type(e).__name__}); DefaultAzureCredential looks at "
                                 "AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, workload or managed identity, and `az login`")
        if isinstance(e, (ServiceRequestError, ServiceResponseError)):
            return TransientProviderError(f"azure: {what}: {type(e).__name__}: {e}")
        if not isinstance(e, HttpResponseError):
            return ProviderError(f"azure: {what}: {type(e).__name__}: {e}")
        code, message = _error_code(e)
        return self._classified(what, code, message, capacity, status=e.status_code, response=getattr(e, "response", None))

    def _classified(self, what: str, code: str, message: str, capacity: tuple[str, str, str] | None, *,
                    status: int | None = None, response: Any = None) -> ProviderError:
        """The error ARM's `code` and `message` mean: a quota, no capacity (when `capacity` says where), transient."""
        text = f"azure: {what}: {code or status or 'Failed'}: {message}"
        if capacity is not None and (code in QUOTA_CODES or (code == "OperationNotAllowed" and "quota" in message.lower())):
            m = _QUOTA_NAME.search(message)
            quota = (m.group(1) or m.group(2)) if m else "unknown (see the message)"
            region = capacity[0].rsplit("-", 1)[0] if capacity[0][-1:].isdigit() else capacity[0]
            return QuotaError(text, cloud="azure", quota=quota, region=region, how_to_raise=(
                f"{QUOTA_PAGE} (Compute, {region}), or `az quota update` / a support request; see usage with "
                f"`az vm list-usage --location {region}`"))
        capacity_like = code in CAPACITY_CODES or (
            code == "OperationNotAllowed" and any(h in message.lower() for h in CAPACITY_HINTS))
        if capacity_like and capacity is not None:
            zone, itype, market = capacity
            return CapacityError(text, cloud="azure", zone=zone, instance_type=itype, market=market)
        if status in TRANSIENT_STATUS or code in TRANSIENT_CODES:
            kind = _Preempted if code == "OperationPreempted" else TransientProviderError
            return kind(text, retry_after=retry_after_seconds(getattr(response, "headers", None)))
        return ProviderError(text)

    def _get(self, scope: Scope, name: str, *, expand: str | None = None, once: bool = False):
        """The VM, or None if there is none of that name. `once`: sent once, no SDK retries: every GET a create or
        delete makes (apply retries the whole create or delete, waiting ARM's Retry-After) but its operations' polls."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        client = self.compute(scope.subscription)
        kw: dict[str, Any] = {"expand": expand} if expand else {}
        if once:
            kw["retry_total"] = 0
        try:
            return client.virtual_machines.get(scope.resource_group, name, **kw)
        except ResourceNotFoundError:
            return None
        except AzureError as e:
            raise self._map_error(f"get VM {name}", e, None) from None

    def _wait(self, what: str, poller, capacity: tuple[str, str, str] | None = None,
              deadline: float | None = None) -> tuple[bool, Any]:
        """Poll a long-running operation to its end, or for lro_timeout (until `deadline`, a time.monotonic(), if
        given): (finished, its result). The polls keep the SDK's retries, however long those take: the wait ends at
        the timeout all the same. An operation that ended Failed raises, mapped like any other ARM error."""
        timeout = self.lro_timeout if deadline is None else max(0.0, deadline - time.monotonic())
        self._call(what, lambda: poller.wait(timeout=timeout), capacity=capacity)
        if not poller.done():
            # Given up on: its poller's thread would poll ARM until the operation ends, for the rest of the process
            # (the controller's). Stopped; the operation goes on in Azure and the next run sees how it ended.
            method = poller.polling_method()
            if isinstance(method, _stoppable_polling()):
                method.stop()
            return False, None
        return True, self._call(what, poller.result, capacity=capacity)

    # -- observe -------------------------------------------------------------------
    def _state(self, scope: Scope, vm, power: bool = False, once: bool = False) -> str:
        """Our state from provisioningState; from the instance view's power state when that cannot tell (Failed), or
        when `power` asks for it (the raw power state, e.g. "deallocated", is returned then). A Failed VM with no power
        state exists (and may be billed for its disk) but does not run: `stopping`, reported and left alone. `once`: the
        instance view's GET is sent once (a create's, which apply retries)."""
        prov = str(getattr(vm, "provisioning_state", None) or "succeeded").lower()
        if prov in STATES and not power:
            return STATES[prov]
        # Failed: an allocation that never happened, or a running VM whose last update failed.
        # Only the instance view's power state tells them apart.
        view = getattr(vm, "instance_view", None)
        if view is None:
            full = self._get(scope, vm.name, expand="instanceView", once=once)
            view = getattr(full, "instance_view", None) if full is not None else None
        for status in getattr(view, "statuses", None) or []:
            code = str(getattr(status, "code", "") or "")
            if code.startswith("PowerState/"):
                raw = code.split("/", 1)[1].lower()
                return raw if power else POWER_STATES.get(raw, "terminated")
        return "running" if power else "stopping"

    def _to_instance(self, scope: Scope, vm, state: str | None = None, once: bool = False) -> Instance:
        tags = logical_tags(vm.tags)
        location = str(vm.location).lower()
        zones = list(getattr(vm, "zones", None) or [])
        priority = str(getattr(getattr(vm, "priority", None), "value", getattr(vm, "priority", None)) or "Regular").lower()
        created = getattr(vm, "time_created", None)
        hardware = getattr(vm, "hardware_profile", None)
        return Instance(
            id=scope.vm_id(vm.name), provider=self.name, cloud="azure", region=location,
            zone=f"{location}-{zones[0]}" if zones else location,
            instance_type=str(getattr(hardware, "vm_size", "") or ""),
            market="spot" if priority in ("spot", "low") else "on-demand",
            state=state or self._state(scope, vm, once=once),  # type: ignore[arg-type]
            pool=tags.get(TAG_POOL, ""), tags=tags,
            launched_at=created.isoformat() if hasattr(created, "isoformat") else str(created or ""),
        )

    def _power_states(self, subscription: str) -> dict[str, str]:
        """VM id (lower case) -> its power state (running, deallocated ...), for every VM of the subscription, in one
        paged call (List All with statusOnly=true returns each VM's instance view). The plain list has no power state:
        a stopped or deallocated VM is provisioningState Succeeded like a running one."""
        client = self.compute(subscription)
        vms = self._call(f"list VM power states in subscription {subscription}",
                         lambda: list(client.virtual_machines.list_all(status_only="true")))
        out = {}
        for vm in vms:
            for status in getattr(getattr(vm, "instance_view", None), "statuses", None) or []:
                code = str(getattr(status, "code", "") or "")
                if code.startswith("PowerState/") and vm.id:
                    out[str(vm.id).lower()] = code.split("/", 1)[1].lower()
        return out

    def observe(self, pools: Sequence[PoolTarget]) -> list[Instance]:
        """The fleet's VMs with their real state: a stopped or deallocated VM is reported `stopping` (not alive), so it
        is neither counted as capacity nor deleted; the plan replaces what it held and notes it (reconciler/observe.py)."""
        fleet_tag = azure_tag_name(TAG_FLEET)
        out: list[Instance] = []
        power: dict[str, dict[str, str]] = {}  # subscription -> VM id -> power state
        for scope in self._scopes(pools):
            client = self.compute(scope.subscription)
            vms = self._call(f"list VMs in {scope.resource_group}",
                             lambda: list(client.virtual_machines.list(scope.resource_group)))
            if scope.subscription.lower() not in power:
                # Read whether or not the fleet has a VM yet: it is read at subscription scope, and a caller that may
                # not (a role on the resource group alone) is stopped at the first plan, before anything is launched,
                # not at the plan after, with a fleet running that it can then neither observe nor tear down.
                power[scope.subscription.lower()] = self._power_states(scope.subscription)
            for vm in vms:
                if (vm.tags or {}).get(fleet_tag) != self.ctx.fleet:
                    continue  # not ours: never reported, so never planned against
                inst = self._to_instance(scope, vm)
                if inst.state == "running":
                    state = power[scope.subscription.lower()].get(inst.id.lower())
                    if state is None:  # created after the status list was read: ask for this one
                        full = self._get(scope, vm.name, expand="instanceView")
                        state = "deleted" if full is None else self._state(scope, full, power=True)
                    if POWER_STATES.get(state, state) != "running":
                        inst = replace(inst, state=POWER_STATES.get(state, "terminated"))  # type: ignore[arg-type]
                if inst.state != "terminated":
                    out.append(inst)
        return sorted(out, key=lambda i: i.id)

    # -- offerings -----------------------------------------------------------------
    def offerings(self, pools: Sequence[PoolTarget]) -> list[Offering]:
        """Shapes and list prices (on-demand and spot) from the catalog, with its date, for the sizes each zone offers
        this subscription: the resource SKU list's locationInfo zones minus its Location and Zone restrictions
        (cached, providers/offercache.py)."""
        seen: dict[tuple[str, str], Offering] = {}
        for p in pools:
            self._check_images(p)
            self._check_subnet(p)
            offered = self._zone_offers(self._scope(p.settings).subscription, p.region)
            for z in p.zones:
                for t in p.instance_types:
                    if (z, t.lower()) not in offered:
                        continue
                    o = self.catalog.offering("azure", p.region, z, t)
                    if o is not None:
                        seen.setdefault((z, t), o)
        return self._live_spot([seen[k] for k in sorted(seen)])

    def _live_spot(self, offers: list[Offering]) -> list[Offering]:
        """Spot prices from the public Retail Prices API, cached `spot_price_ttl` seconds (providers/livespot.py).
        Read for the public cloud only: with a custom ARM `endpoint` (a test, a sovereign cloud) only when
        `prices_endpoint` names the price API too; `live_spot=off` keeps the catalog's."""
        from providers.livespot import azure_spot, read_spot, unread, with_live_spot
        from providers.pricesources import PriceSourceError

        prices_endpoint = self.options.url("prices_endpoint")
        if not offers or (self.endpoint and not prices_endpoint) or self.options.off("live_spot"):
            return offers
        sizes: dict[str, set[str]] = {}
        for o in offers:
            sizes.setdefault(o.region, set()).add(o.instance_type)
        api = "Azure Retail Prices API"
        try:
            prices, read_at = read_spot(
                self.ctx.state_dir, "azure", [prices_endpoint or ""] + [f"{r}/{t}" for r, ts in sizes.items() for t in ts],
                self.options.seconds("spot_price_ttl"),
                lambda: {r: azure_spot(r, sorted(ts), prices_endpoint) for r, ts in sorted(sizes.items())})
        except PriceSourceError as e:
            log.warning("azure: %s unreadable, planning with the catalog's spot prices: %s", api, e)
            return unread(offers, api, e)
        return with_live_spot(offers, prices, api, read_at)

    def _gpus(self, size: str) -> bool:
        shape = self.catalog.shape("azure", size)
        return bool(shape and shape.gpus)

    def _check_images(self, pool: PoolTarget) -> None:
        """Plan time: every marketplace image the pool's VMs would use exists in its region (VirtualMachineImages:
        list the versions of publisher/offer/sku, or get the one version named), so a mistyped or retired image is an
        error naming the pool before anything is launched. Image resource ids (custom, gallery) are left to the create."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        seen = self.__dict__.setdefault("_images_seen", set())
        for image in sorted({image_for(pool.settings, self._gpus(t)) for t in pool.instance_types}):
            ref = parse_image(image)
            if "id" in ref or (pool.region, image) in seen:
                continue
            client = self.compute(self._scope(pool.settings).subscription).virtual_machine_images
            args = (pool.region, ref["publisher"], ref["offer"], ref["sku"])
            try:
                latest = ref["version"].lower() == "latest"
                found = list(client.list(*args, top=1)) if latest else [client.get(*args, ref["version"])]
            except ResourceNotFoundError:
                found = []
            except AzureError as e:
                raise self._map_error(f"read image {image}", e, None) from None
            if not found:
                raise ProviderError(f"azure: pool {pool.name}: image {image} does not exist in {pool.region}; set azure.image "
                                    f"to one that does (GPU sizes default to {DEFAULT_GPU_IMAGE})")
            seen.add((pool.region, image))

    def _check_subnet(self, pool: PoolTarget) -> None:
        """Plan time: the pool's azure.subnet_id is set, exists, is in the pool's subscription and its VNet in the pool's
        region (providers/azure_network.py), so a mistyped or other-region subnet is an error naming the pool before any
        create (each would fail with ARM's 400 InvalidResourceReference). Read once per subnet, subscription and region
        a run; an unreadable ARM (5xx, timeout) is a transient error, not a verdict."""
        from providers.azure_network import check_subnet

        subnet_id = str(pool.settings.get("subnet_id") or "")
        if not subnet_id:
            raise ProviderError(f"azure: pool {pool.name} needs azure.subnet_id (the subnet the VMs' NICs go in)")
        subscription = self._scope(pool.settings).subscription
        seen = self.__dict__.setdefault("_subnets_seen", {})  # (subnet id, subscription, region) -> problem or None
        key = (subnet_id.lower(), subscription.lower(), pool.region.lower())
        if key not in seen:
            seen[key] = check_subnet(
                subnet_id, subscription, pool.region, lambda path, version: self._arm_get(subscription, path, version),
                lambda message: log.warning("azure: pool %s: azure.subnet_id %s: %s", pool.name, subnet_id, message))
        if seen[key] is not None:
            raise ProviderError(f"azure: pool {pool.name}: azure.subnet_id {subnet_id} {seen[key]}; set azure.subnet_id to "
                                f"a subnet of a virtual network in {pool.region}")

    def _arm_get(self, subscription: str, path: str, api_version: str) -> dict | None:
        """GET one ARM resource through the Compute client's pipeline (its credential, endpoint, TLS settings and
        retries): its JSON, None if it does not exist (404). A 403 raises azure_network.NotReadable; other errors are
        mapped as every ARM call's are (5xx and connection errors: transient)."""
        from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError
        from azure.core.rest import HttpRequest
        from azure.mgmt.core.exceptions import ARMErrorFormat

        from providers.azure_network import NotReadable

        client = self.compute(subscription)
        try:
            response = client.send_request(HttpRequest("GET", path, params={"api-version": api_version}))
            if response.status_code == 404:
                return None
            if response.status_code == 401:
                raise ClientAuthenticationError(response=response, error_format=ARMErrorFormat)
            if response.status_code != 200:
                error = HttpResponseError(response=response, error_format=ARMErrorFormat)
                if response.status_code == 403:
                    raise NotReadable(path, f"HTTP 403 {_error_code(error)[0] or 'Forbidden'}")
                raise error
            return response.json()
        except AzureError as e:
            raise self._map_error(f"read {path.rsplit('/providers/', 1)[-1]}", e, None) from None

    # -- apply-time permission check -------------------------------------------------
    def preflight(self, creates: Sequence[CreateRequest], deletes: Sequence[Instance], instances: Sequence[Instance],
                  retag: Sequence[Instance] = ()) -> None:
        """Apply time, before anything is created (base.Preflight). ARM has no dry run of a write; it lists what the caller
        may do at a scope (Permissions - List For Resource Group / For Resource: the actions and notActions of every role
        assigned there or above, read with the caller's own token, no permission needed). Asked where the apply acts: on
        each resource group it creates in, Microsoft.Compute/virtualMachines/write, and .../delete too (a failed gang is
        rolled back, and later plans delete what this one launches); on each it deletes in, .../delete; on a pool's
        subnet, Microsoft.Network/virtualNetworks/subnets/join/action; on a named capacity reservation group, its
        deploy/action; on an image or gallery image version id, its read. Without one, an apply launched and then could
        not delete what it replaced (both billed), or failed each create with LinkedAuthorizationFailed. Refused, naming
        every action and its scope. Not seen by the list: deny assignments and role-assignment conditions (a condition
        is read as granting: never a refusal on a guess), nor the actions ARM checks for the NIC and OS disk Compute
        makes; those still fail at the call. A scope whose list cannot be read (403, 404) is not checked."""
        needed: dict[tuple[str, str], set[str]] = {}  # (subscription, scope id) -> actions
        vm = "Microsoft.Compute/virtualMachines/"
        for request in creates:
            s = dict(request.pool.settings)
            try:
                scope = self._scope(s)
            except ProviderError:
                continue  # the create says so
            group = f"/subscriptions/{scope.subscription}/resourceGroups/{scope.resource_group}"
            needed.setdefault((scope.subscription, group), set()).update({vm + "write", vm + "delete"})
            if s.get("subnet_id"):
                needed.setdefault((scope.subscription, str(s["subnet_id"])), set()).add(
                    "Microsoft.Network/virtualNetworks/subnets/join/action")
            if request.capacity_reservation:
                needed.setdefault((scope.subscription, capacity_group_id(scope, request.capacity_reservation)), set()).add(
                    "Microsoft.Compute/capacityReservationGroups/deploy/action")
            image = parse_image(image_for(s, self._gpus(request.instance_type))).get("id")
            if image:
                needed.setdefault((scope.subscription, image), set()).add(
                    "Microsoft.Compute/galleries/images/versions/read" if "/galleries/" in image.lower()
                    else "Microsoft.Compute/images/read")
        for inst in deletes:
            m = _VM_ID.match(inst.id)
            if m is not None:
                needed.setdefault((m.group(1), f"/subscriptions/{m.group(1)}/resourceGroups/{m.group(2)}"), set()).add(vm + "delete")
        missing: dict[str, str] = {}  # action -> scope
        for (subscription, scope_id), actions in sorted(needed.items(), key=lambda kv: kv[0][1].lower()):
            granted = self._permissions(subscription, scope_id)
            if granted is None:
                continue
            for action in sorted(actions):
                if not permitted(granted, action):
                    missing.setdefault(action, scope_id)
        if missing:
            raise AccessDeniedError(
                "azure: the credentials may not " + ", ".join(missing) + ", which this apply needs (the roles assigned to "
                "the caller, as ARM lists them: " + "; ".join(f"{a} over {sc}" for a, sc in missing.items())
                + "); assign a role holding them there (README, Azure: Permissions) and apply again", actions=tuple(missing))

    def _permissions(self, subscription: str, scope_id: str) -> list[dict] | None:
        """The caller's permissions at a scope (each {"actions", "notActions", ...}, nextLink followed), or None when
        ARM will not say (403, 404): then nothing is refused on it. Other errors are mapped as every ARM call's are."""
        from providers.azure_network import NotReadable

        path, out = f"{scope_id.rstrip('/')}/providers/Microsoft.Authorization/permissions", []
        for _ in range(100):  # (pages: one in practice)
            try:
                page = self._arm_get(subscription, path, PERMISSIONS_API_VERSION)
            except NotReadable:
                return None
            if page is None:
                return None
            out.extend(page.get("value") or [])
            link = page.get("nextLink")
            if not link:
                return out
            split = urlsplit(link)  # (its api-version is sent again by _arm_get)
            query = "&".join(q for q in split.query.split("&") if q and not q.lower().startswith("api-version="))
            path = split.path + (f"?{query}" if query else "")
        return out

    def _zone_offers(self, subscription: str, region: str) -> set[tuple[str, str]]:
        """{(zone `<region>-<n>`, VM size lower case)} offered to the subscription in the region."""
        return {(z, n) for z, n in self._skus(subscription, region)["zones"]}

    def _skus(self, subscription: str, region: str) -> dict:
        """The resource SKU list of a region, read once an hour (`offerings_ttl`): {"zones": [[zone, size]] offered to
        the subscription, "sizes": {size lower case: [its quota family, vCPUs]}}."""
        def read() -> dict:
            client = self.compute(subscription)
            skus = self._call(f"list resource SKUs in {region}",
                              lambda: list(client.resource_skus.list(filter=f"location eq '{region}'")))
            out, sizes = [], {}
            for sku in skus:
                if str(sku.resource_type or "").lower() != "virtualmachines":
                    continue
                vcpus = next((c.value for c in sku.capabilities or [] if str(c.name) == "vCPUs"), None)
                sizes[str(sku.name).lower()] = [str(sku.family or ""), float(vcpus) if vcpus else None]
                zones: set[str] = set()
                for info in sku.location_info or []:
                    if str(info.location or "").lower() == region.lower():
                        zones.update(info.zones or [])
                for r in sku.restrictions or []:
                    kind = str(getattr(r.type, "value", r.type) or "").lower()
                    if kind == "location" and region.lower() in [str(v).lower() for v in r.values or []]:
                        zones.clear()
                    elif kind == "zone" and r.restriction_info is not None:
                        zones -= set(r.restriction_info.zones or [])
                out += [[f"{region}-{z}", str(sku.name).lower()] for z in sorted(zones)]
            return {"zones": out, "sizes": sizes}

        key = "azure-skus-" + hashlib.sha256(f"{subscription}\n{region}".encode()).hexdigest()[:16]
        return cached(self.ctx.state_dir, key, self.options.seconds("offerings_ttl"), read)

    # -- quotas --------------------------------------------------------------------
    def quotas(self, pools: Sequence[PoolTarget]) -> list[Quota]:
        """The subscription's compute quotas the pools' sizes count against, from the usages list of each region
        (Microsoft.Compute/locations/{region}/usages: name.value, currentValue, limit), read every run: a Regular VM
        counts its vCPUs against `cores` (Total Regional vCPUs) and its size's family (the resource SKU's `family`,
        e.g. standardNDASv4Family), a Spot VM against `lowPriorityCores`."""
        by_scope: dict[tuple[str, str], list[PoolTarget]] = {}
        for p in pools:
            by_scope.setdefault((self._scope(p.settings).subscription, p.region), []).append(p)
        out: list[Quota] = []
        for (subscription, region), ps in sorted(by_scope.items()):
            client = self.compute(subscription)
            usages = {str(u.name.value).lower(): u for u in self._call(
                f"list compute usages in {region}", lambda: list(client.usage.list(region)))}
            sizes = self._skus(subscription, region)["sizes"]
            counts: dict[str, set[tuple[str, str, float]]] = {}
            for p in ps:
                for t in p.instance_types:
                    family, vcpus = sizes.get(t.lower(), ["", None])
                    shape = self.catalog.shape("azure", t)
                    vcpus = vcpus or (shape.cpu if shape else None)
                    if not vcpus:
                        continue
                    for name, market in (("cores", "on-demand"), (family.lower(), "on-demand"), ("lowprioritycores", "spot")):
                        if name in usages:
                            counts.setdefault(name, set()).add((t, market, float(vcpus)))
            how = (f"{QUOTA_PAGE} (Compute, {region}), or `az quota update` / a support request; see usage with "
                   f"`az vm list-usage --location {region}`")
            for name, cs in sorted(counts.items()):
                u = usages[name]
                out.append(Quota(cloud="azure", region=region, name=str(u.name.value), unit="vCPUs", limit=float(u.limit),
                                 used=float(u.current_value), counts=tuple(sorted(cs)), how_to_raise=how))
        return out

    # -- create --------------------------------------------------------------------
    def _vm_body(self, request: CreateRequest, name: str, zone: str) -> dict:
        p = request.pool
        s = dict(p.settings)
        subnet = s.get("subnet_id")
        if not subnet:
            raise ProviderError(f"azure: pool {p.name} needs azure.subnet_id (the subnet the VMs' NICs go in)")
        key = s.get("ssh_public_key")
        if not key:
            raise ProviderError(f"azure: pool {p.name} needs azure.ssh_public_key (password login is disabled)")
        user = s.get("admin_username") or "fleetops"
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": request.instance_type},
            "storageProfile": {
                "imageReference": parse_image(image_for(s, self._gpus(request.instance_type))),
                "osDisk": {"createOption": "FromImage", "deleteOption": "Delete"},
            },
            "osProfile": {
                "computerName": name, "adminUsername": user,
                "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [
                    {"path": f"/home/{user}/.ssh/authorized_keys", "keyData": key}]}},
            },
            "networkProfile": {
                "networkApiVersion": NETWORK_API_VERSION,
                "networkInterfaceConfigurations": [{"name": f"{name}-nic", "properties": {
                    "primary": True, "deleteOption": "Delete",
                    "ipConfigurations": [{"name": "ipconfig1", "properties": {"primary": True, "subnet": {"id": subnet}}}],
                }}],
            },
        }
        if request.agent_state_url:  # cloud-init runs customData at first boot: it installs and starts the node agent
            import base64

            from providers.bootstrap import bootstrap_script

            script = bootstrap_script("azure", request.agent_state_url, self._scope(p.settings).vm_id(name), mig=p.mig)
            props["osProfile"]["customData"] = base64.b64encode(script.encode()).decode()
        if request.capacity_reservation:  # a Reservation's target: a VM takes a (targeted) capacity reservation group's
            # capacity only when its create names the group, so unnamed it would run (billed) outside the reservation
            props["capacityReservation"] = {"capacityReservationGroup": {
                "id": capacity_group_id(self._scope(s), request.capacity_reservation)}}
        if request.market == "spot":
            props["priority"] = "Spot"
            props["evictionPolicy"] = "Delete"  # an evicted VM is gone, disks and NIC with it: nothing to clean up
            props["billingProfile"] = {"maxPrice": request.max_price if request.max_price is not None else -1}
        else:
            props["priority"] = "Regular"
        return {"location": p.region, "zones": [zone], "tags": azure_tags(request.tags), "properties": props}

    def create(self, request: CreateRequest) -> Instance:
        p = request.pool
        scope = self._scope(p.settings)
        name = vm_name(self.ctx.fleet, request.key)
        zone = zone_number(p.region, request.zone)
        body = self._vm_body(request, name, zone)
        try:
            inst = self._create(request, scope, name, body)
        except TransientProviderError:
            raise  # apply retries this create: an allocation it started and has not seen end is waited on then
        except BaseException:
            self._forget_allocation(scope.vm_id(name))
            raise
        self._forget_allocation(scope.vm_id(name))
        return inst

    def _forget_allocation(self, vm_id: str) -> None:
        with self._allocations_lock:
            self._allocations.pop(vm_id, None)

    def _create(self, request: CreateRequest, scope: Scope, name: str, body: dict) -> Instance:
        client = self.compute(scope.subscription)
        what = f"create VM {name} ({request.instance_type} in {request.zone})"
        capacity = (request.zone, request.instance_type, request.market)
        # lro_timeout bounds the create, start to end: every operation it waits on (a Failed VM's delete before the PUT,
        # the PUT's, a failed allocation's delete after it) gets what is left of it, not an lro_timeout of its own.
        deadline = time.monotonic() + self.lro_timeout

        existing = self._get(scope, name, once=True)
        if existing is not None:
            tags = logical_tags(existing.tags)
            if tags.get(TAG_FLEET) != self.ctx.fleet:
                raise OwnershipError(f"azure: VM {name} exists in {scope.resource_group} and is not ours (its {TAG_FLEET} tag "
                                     f"is {tags.get(TAG_FLEET)!r}, not {self.ctx.fleet!r}); refusing to overwrite it")
            if tags.get(TAG_CREATE_KEY) != request.key:
                raise ProviderError(f"azure: VM {name} belongs to create key {tags.get(TAG_CREATE_KEY)!r}, not {request.key!r}")
            state = str(existing.provisioning_state or "").lower()
            if state == "deleting":
                raise TransientProviderError(f"azure: VM {name} is still being deleted; retry")
            if state == "creating":
                # Still allocating: answered as a pending instance it was reported created and given replicas, though
                # its allocation may still fail (audit: an earlier try's status polls throttled past the SDK's retries,
                # apply retried the create and got the VM back Creating). Its end is waited on as the first try would.
                return self._resume(request, scope, name, body, what, capacity)
            if state != "failed":  # created by an earlier attempt with this key: as it is now, stopped or not
                inst = self._to_instance(scope, existing, once=True)
                if inst.state != "running":
                    return inst
                power = self._state(scope, existing, power=True, once=True)  # Succeeded says nothing of it: its power state does
                return replace(inst, state=POWER_STATES.get(power, "stopping"))  # type: ignore[arg-type]
            self._delete(scope, name, deadline)  # a failed earlier allocation: clear it and try again

        polls = _Polls()
        poller = self._call(what, lambda: client.virtual_machines.begin_create_or_update(scope.resource_group, name, body,
                                                                                         **self._sent_once(polls)),
                            capacity=capacity)
        with self._allocations_lock:  # apply's retry of this create, after a failed poll, waits on this operation
            self._allocations[scope.vm_id(name)] = _Allocation(deadline, poller.continuation_token())
        return self._allocated(scope, name, what, poller, polls, capacity, deadline)

    def _resume(self, request: CreateRequest, scope: Scope, name: str, body: dict, what: str,
                capacity: tuple[str, str, str]) -> Instance:
        """The key's VM is still allocating. The allocation this create started (an earlier try's, whose status polls
        failed) is polled again, for what is left of the create's lro_timeout, and ends as it would have in that try."""
        with self._allocations_lock:
            started = self._allocations.get(scope.vm_id(name))
        if started is None:
            raise ProviderError(f"azure: {what}: VM {name}, of this create key, is still allocating (provisioningState "
                                "Creating) and this run did not start it; nothing was placed on it; the next run sees how "
                                "it ended and uses it, launching nothing twice, or replaces it if it failed")
        if time.monotonic() >= started.deadline:
            raise self._unfinished(what, None)
        client = self.compute(scope.subscription)
        polls = _Polls()
        poller = self._call(what, lambda: client.virtual_machines.begin_create_or_update(
            scope.resource_group, name, body, continuation_token=started.token, polling=self._polling(polls)),
            capacity=capacity)
        return self._allocated(scope, name, what, poller, polls, capacity, started.deadline)

    def _allocated(self, scope: Scope, name: str, what: str, poller, polls: _Polls, capacity: tuple[str, str, str],
                   deadline: float) -> Instance:
        """Wait on a create's operation until `deadline`: the VM it made, or the error it ended with."""
        try:
            done, vm = self._wait(what, poller, capacity, deadline)
        except (CapacityError, QuotaError):
            self._discard_failed(scope, name, deadline)
            raise
        except _Preempted as e:
            return self._after_preemption(scope, name, what, str(e), deadline)
        if not done:
            return self._as_it_stands(scope, name, what, polls, capacity, deadline)
        if str(getattr(vm, "provisioning_state", "") or "").lower() == "failed":
            raise self._failed_at_once(scope, name, what, capacity, deadline)
        return self._to_instance(scope, vm, once=True)

    def _as_it_stands(self, scope: Scope, name: str, what: str, polls: _Polls, capacity: tuple[str, str, str],
                      deadline: float) -> Instance:
        """The wait on a create's operation gave up at lro_timeout; its last status poll may be long past (ARM's
        Retry-After sets when the next is due, and may be longer than what was left of the wait): the VM is read once
        before the create is failed as still allocating. Allocated (Succeeded), it is the create's VM: a create failed
        then said "still allocating" of a VM that ran (the next run found it and used it, one run late). Failed, it is
        the create's failed allocation, ended as one answered Failed at once (_failed_at_once: its error, a stockout a
        CapacityError, the VM removed): it was said to be still allocating, no zone marked short. Anything else (still
        Creating, unreadable, not ours) fails the create as before: nothing placed on it."""
        try:
            vm = self._get(scope, name, once=True)
        except ProviderError:
            vm = None
        if vm is None or logical_tags(vm.tags).get(TAG_FLEET) != self.ctx.fleet:
            raise self._unfinished(what, polls)
        state = str(vm.provisioning_state or "").lower()
        if state == "failed":
            raise self._failed_at_once(scope, name, what, capacity, deadline)
        if state == "succeeded":
            try:
                return self._to_instance(scope, vm, once=True)
            except ProviderError:
                pass
        raise self._unfinished(what, polls)

    def _failed_at_once(self, scope: Scope, name: str, what: str, capacity: tuple[str, str, str],
                        deadline: float) -> ProviderError:
        """The create's VM is Failed, and its operation did not say why (read at lro_timeout, _as_it_stands; or this:)
        the create's PUT was answered with the VM already Failed (200, no operation to poll): azure-core's LROPoller
        runs no polling (so no check of the status) for a first answer that is terminal, and hands the Failed VM back as
        its result, raising nothing; it was answered as a `stopping` instance the user was told to delete.
        It is this create's failed allocation (an earlier one's Failed VM is deleted before the PUT): why is in the
        instance view, `ProvisioningState/failed/<code>` ("optionally postfixed" with the error code, learn.microsoft.com
        azure/virtual-machines/states-billing; hail-is/hail#11393 met ProvisioningState/failed/AllocationFailed). Mapped
        as the operation's error would be (a stockout a CapacityError, a quota a QuotaError); the VM is removed."""
        code, message = "", "its allocation ended Failed, and Azure said no more"
        try:
            full = self._get(scope, name, expand="instanceView", once=True)
        except ProviderError as e:  # the reason unread: said as such, the VM still removed
            full, message = None, f"{message} (its instance view could not be read: {e})"
        for status in getattr(getattr(full, "instance_view", None), "statuses", None) or []:
            parts = str(getattr(status, "code", "") or "").split("/")
            if [p.lower() for p in parts[:2]] == ["provisioningstate", "failed"] and len(parts) > 2:
                code = parts[2]
                message = str(getattr(status, "message", "") or getattr(status, "display_status", "") or message)
        error = self._classified(what, code, message.splitlines()[0], capacity)
        removed = self._discard_failed(scope, name, deadline)
        return error if isinstance(error, (CapacityError, QuotaError)) else ProviderError(
            f"{error}; VM {name} was {'removed' if removed else 'left to the next create with this key, which removes it'} "
            "and nothing was placed on it")

    def _after_preemption(self, scope: Scope, name: str, what: str, error: str, deadline: float) -> Instance:
        """The create's operation was preempted: someone wrote the VM while it was being made (tagged it in the portal,
        deleted it), and Compute goes on with their operation. The VM is what that makes of it, so it is read (not the
        dead operation polled again, which a retry of the create did until apply's retry window ran out, however well
        the allocation went) every polling_interval until it is made, for what is left of the create's lro_timeout.
        Deleted or being deleted, or Failed, the create fails and nothing is sent again: the next plan decides whether
        a VM is still needed."""
        while True:
            vm = self._get(scope, name, once=True)  # (sent once, as every GET of a create: a throttled one is apply's to retry)
            state = str(vm.provisioning_state or "").lower() if vm is not None else "gone"
            if state in ("gone", "deleting"):
                raise ProviderError(f"{error}; VM {name} was deleted while it was being created (the write that preempted "
                                    "its create); nothing was placed on it and it is not created again by this run")
            tags = logical_tags(vm.tags)
            if tags.get(TAG_FLEET) != self.ctx.fleet:
                raise OwnershipError(f"{error}; VM {name} was rewritten while it was being created and is not ours any "
                                     f"more (its {TAG_FLEET} tag is {tags.get(TAG_FLEET)!r}); nothing was placed on it")
            if state == "failed":
                self._discard_failed(scope, name, deadline)
                raise ProviderError(f"{error}; VM {name}'s allocation, carried on by the write that preempted its create, "
                                    "ended Failed; it was removed, nothing was placed on it, and the next run tries again")
            if state not in ("creating", "updating"):
                return self._to_instance(scope, vm, once=True)
            if time.monotonic() + self.polling_interval > deadline:
                raise self._unfinished(what, None)
            time.sleep(self.polling_interval)

    def _unfinished(self, what: str, polls: _Polls | None) -> ProviderError:
        """A create whose allocation was not seen to end within lro_timeout. Answered as a pending instance it was
        reported created and given replicas, though an allocation may still fail (audit: exit 0, then a Failed VM the
        next run only noted). Not transient, as GCE's operation wait: a retry would only wait again. The next run sees
        how it ended: running, it is this key's VM; Failed, a create with this key deletes it and allocates again. What
        is known is said: still allocating when last seen, or its status unread since ARM refused the polls."""
        if polls is not None and polls.refused:
            refused = f"HTTP {polls.status}{' ' + polls.code if polls.code else ''}"
            last = "the last status poll" if polls.refused == 1 else f"the last {polls.refused} status polls"
            known = (f"its allocation was not seen to end within {self.lro_timeout:g} s (lro_timeout): ARM refused {last} "
                     f"of its operation ({refused}), so how it stands is not known")
        else:
            known = f"still allocating after {self.lro_timeout:g} s (lro_timeout)"
        return ProviderError(f"azure: {what}: {known}; nothing was placed on it; the next run sees how it ended and uses "
                             "it, launching nothing twice, or replaces it if it failed (-o lro_timeout=SECONDS waits longer)")

    def _discard_failed(self, scope: Scope, name: str, deadline: float) -> bool:
        """Azure keeps a VM whose allocation failed, in provisioningState Failed: remove ours (whether it is gone). Its
        GET is sent once: a throttled one leaves the VM to the next create with this key, which clears it. Past the
        create's deadline (lro_timeout) its DELETE is sent and not waited on."""
        try:
            vm = self._get(scope, name, once=True)
            if vm is None:
                return True
            if str(vm.provisioning_state or "").lower() == "failed" and logical_tags(vm.tags).get(TAG_FLEET) == self.ctx.fleet:
                self._delete(scope, name, deadline)
                return True
            return False
        except ProviderError as e:  # the next create with this key clears it instead
            log.warning("azure: could not remove failed VM %s: %s", name, e)
            return False

    # -- delete --------------------------------------------------------------------
    def _delete(self, scope: Scope, name: str, deadline: float | None = None) -> None:
        client = self.compute(scope.subscription)
        poller = self._call(f"delete VM {name}", lambda: client.virtual_machines.begin_delete(scope.resource_group, name,
                                                                                               **self._sent_once()))
        if not self._wait(f"delete VM {name}", poller, deadline=deadline)[0]:
            raise TransientProviderError(f"azure: deleting VM {name} did not finish within {self.lro_timeout:g} s (lro_timeout)")

    def delete(self, instance: Instance) -> None:
        m = _VM_ID.match(instance.id)
        if m is None:
            raise ProviderError(f"azure: {instance.id!r} is not a virtual machine resource id")
        scope, name = Scope(m.group(1), m.group(2)), m.group(3)
        vm = self._get(scope, name, once=True)
        if vm is None:
            return  # already gone
        tags = logical_tags(vm.tags)
        if tags.get(TAG_FLEET) != self.ctx.fleet:
            raise OwnershipError(f"azure: refusing to delete VM {name}: its {TAG_FLEET} tag is {tags.get(TAG_FLEET)!r}, "
                                 f"not {self.ctx.fleet!r}")
        if str(vm.provisioning_state or "").lower() == "deleting":
            return
        self._delete(scope, name)


def permitted(permissions: Sequence[dict], action: str) -> bool:
    """Whether a list of role permissions (ARM's Permission: actions and notActions, `*` a wildcard, case-insensitive)
    grants `action`: one entry matches it in its actions and not in its notActions (RBAC: "Allowed = Actions -
    NotActions", per role, the roles' grants added up)."""
    def matches(patterns) -> bool:
        return any(re.fullmatch(".*".join(re.escape(part) for part in str(p).split("*")), action, re.I) for p in patterns or ())
    return any(matches(p.get("actions")) and not matches(p.get("notActions")) for p in permissions)


def _error_code(e) -> tuple[str, str]:
    """ARM's error code and message; a capacity code nested in details wins (ARM wraps them)."""
    err = getattr(e, "error", None)
    code = str(getattr(err, "code", "") or "")
    message = str(getattr(err, "message", "") or getattr(e, "message", "") or e)
    for detail in getattr(err, "details", None) or []:
        dcode = str(getattr(detail, "code", "") or "")
        if dcode in CAPACITY_CODES or dcode in QUOTA_CODES:
            return dcode, str(getattr(detail, "message", "") or message)
    return code, message.splitlines()[0] if message else ""
