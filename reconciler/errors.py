"""One small error hierarchy. Every error carries a message a user can act on;
the CLI maps any ReconcileError to exit code 1 and prints only its message."""

from __future__ import annotations

from dataclasses import dataclass


class ReconcileError(Exception):
    """Base of every error the reconciler raises on purpose. Its message never carries a URL's
    credentials (`-o endpoint_url=http://user:PASS@host` came back in AWS's connection error)."""

    exit_code = 1

    def __init__(self, *args):
        from reconciler.redact import redact

        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


@dataclass(frozen=True)
class Diagnostic:
    """One problem in the desired state, pinned to a file and line."""

    file: str
    line: int
    kind: str
    name: str
    field: str
    message: str

    def __str__(self) -> str:
        """file:line: Kind/name: field: message, leaving out what a problem has none of (a YAML syntax error has
        no kind and no field: `jobs.yaml:4: invalid YAML: ...`, not `jobs.yaml:4: -: <yaml>: ...`)."""
        parts = [f"{self.file}:{self.line}"]
        if self.kind:
            parts.append(f"{self.kind}/{self.name}")
        if self.field and not self.field.startswith("<"):
            parts.append(self.field)
        return ": ".join([*parts, self.message])


class ConfigError(ReconcileError):
    """The desired state is invalid; carries every diagnostic, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.file, d.line, d.field))
        n = len(self.diagnostics)
        lines = "\n".join(str(d) for d in self.diagnostics)
        super().__init__(f"{n} error{'s' if n != 1 else ''} in desired state:\n{lines}")


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


class TransientProviderError(ProviderError):
    """Throttling, timeouts: safe to retry with the same idempotency key."""


class KeySpentError(ProviderError):
    """The cloud has already used this create key for a launch whose instance is gone (or for a
    request with other parameters: EC2's IdempotentParameterMismatch). Retrying the same key can
    never launch anything; the caller must try the next attempt's key."""


class OwnershipError(ProviderError):
    """Refused to touch a resource this fleet does not own."""


class IncompleteObservationError(ProviderError):
    """The cloud answered a list only in part (a zone it could not reach): what is missing is unknown, not gone,
    so no plan may be made from it."""


class PluginError(ReconcileError):
    """A provider plugin could not be found or loaded."""


class StalePlanError(ReconcileError):
    """A saved plan no longer matches the desired or observed state."""


class LockError(ReconcileError):
    """Another apply holds the lock."""


class GuardrailError(ReconcileError):
    """The plan breaks a GuardrailPolicy; nothing was changed."""


class SolverError(ReconcileError):
    """The solver found no answer at all (not even 'place nothing')."""


class ApplyError(ReconcileError):
    """Some plan actions failed; the message lists what succeeded and what did not."""
