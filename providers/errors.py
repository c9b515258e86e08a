"""The errors providers raise, and the base of every error raised on purpose.

They live here, in the bottom layer, so providers depend on nothing above them; reconciler/errors.py re-exports
them beside the errors only the reconciler raises (bad config, stale plans, locks...). The base keeps its name,
ReconcileError: the CLI maps any ReconcileError, a provider's included, to exit code 1 and prints only its message."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from providers.redact import redact

_RETRY_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("fleetops_retry_deadline", default=None)


class ReconcileError(Exception):
    """Base of every error the reconciler raises on purpose. Its message never carries a URL's
    credentials (`-o endpoint_url=http://user:PASS@host` came back in AWS's connection error)."""

    exit_code = 1

    def __init__(self, *args):
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ProviderError(ReconcileError):
    """A provider call failed in a way the next run may not fix by itself."""


class CapacityError(ProviderError):
    """The cloud has no capacity for this request in this zone right now.

    Not fatal for the fleet: the zone is remembered as short and the next solve
    places the work elsewhere."""

    def __init__(self, message: str, *, cloud: str, zone: str, instance_type: str, market: str):
        super().__init__(message)
        self.cloud, self.zone, self.instance_type, self.market = cloud, zone, instance_type, market


class QuotaError(ProviderError):
    """An account quota (regional vCPUs, global GPUs, spot cores) is used up: not a zone's capacity, so no zone is
    cooled off; another zone of the same quota would fail alike, and only a quota increase helps. The message names
    the quota and how to raise it."""

    def __init__(self, message: str, *, cloud: str, quota: str, region: str, how_to_raise: str):
        super().__init__(f"{message}\n  quota {quota!r} ({cloud}, {region}) is used up: raise it: {how_to_raise}")
        self.cloud, self.quota, self.region, self.how_to_raise = cloud, quota, region, how_to_raise


class AccessDeniedError(ProviderError):
    """The credentials may not make a call (IAM's UnauthorizedOperation, AccessDenied): no retry, zone or key helps,
    only a permission added. `actions`: the permissions the message names as missing."""

    def __init__(self, message: str, *, actions: tuple[str, ...] = ()):
        super().__init__(message)
        self.actions = actions


class TransientProviderError(ProviderError):
    """Throttling, timeouts: safe to retry with the same idempotency key. `retried`: the cloud's SDK has already
    retried the call with backoff (botocore's retry mode), so the caller does not retry it again: one layer owns a
    call's retries (audit: botocore's 9 tries inside apply's 4 made 144 RunInstances for 4 creates, 262 s).
    `retry_after`: the seconds the cloud asked to wait before the next try (its Retry-After header), when it said;
    the caller that owns the retries (apply's _retry, for calls the SDK sent once) waits at least that long."""

    def __init__(self, *args, retried: bool = False, retry_after: float | None = None):
        super().__init__(*args)
        self.retried = retried
        self.retry_after = retry_after


def retry_after_seconds(headers) -> float | None:
    """A Retry-After header's wait in seconds (RFC 9110: delay-seconds or an HTTP-date), None when there is none or
    it cannot be read. `headers`: any case-insensitive mapping with .get (requests', azure-core's). Azure's
    `retry-after-ms` and `x-ms-retry-after-ms` (milliseconds) come first where present, as azure-core reads them:
    an ARM answer with only those was read as no wait at all."""
    import datetime as dt
    import email.utils
    import math
    import time

    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        ms = (headers or {}).get(name) if headers is not None else None
        try:
            seconds = float(str(ms).strip()) / 1000 if ms else math.nan
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = (headers or {}).get("Retry-After") if headers is not None else None
    if not value:
        return None
    value = str(value).strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # "-0000": HTTP-dates are GMT
            when = when.replace(tzinfo=dt.timezone.utc)
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def retry_deadline() -> float | None:
    """When the caller that owns this call's retries stops retrying (a time.monotonic()): the end of apply's
    retry_window around a create or delete, None outside one. A provider's own retries of a read inside a create or
    delete (GCE's read retries of its operation wait and gets) end there: a try apply starts near the end of its
    window otherwise ran a whole read retry (30 s) past it."""
    return _RETRY_DEADLINE.get()


@contextlib.contextmanager
def retrying_until(deadline: float | None) -> Iterator[None]:
    """Calls made inside see `deadline` as retry_deadline() (in this thread: apply runs each create in a worker)."""
    token = _RETRY_DEADLINE.set(deadline)
    try:
        yield
    finally:
        _RETRY_DEADLINE.reset(token)


class KeySpentError(ProviderError):
    """The cloud has already used this create key for a launch whose instance is gone (EC2: an
    IdempotentParameterMismatch whose token's instances are all terminated). Retrying the same key
    can never launch anything; the caller must try the next attempt's key."""


class OwnershipError(ProviderError):
    """Refused to touch a resource this fleet does not own."""


class IncompleteObservationError(ProviderError):
    """The cloud answered a list only in part (a zone it could not reach): what is missing is unknown, not gone,
    so no plan may be made from it."""


class PluginError(ReconcileError):
    """A provider plugin could not be found or loaded."""


__all__ = ["ReconcileError", "ProviderError", "CapacityError", "QuotaError", "TransientProviderError", "KeySpentError",
           "OwnershipError", "IncompleteObservationError", "PluginError"]
