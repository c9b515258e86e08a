"""One small error hierarchy. Every error carries a message a user can act on;
the CLI maps any ReconcileError to exit code 1 and prints only its message.

The base and the errors providers raise are defined in providers/errors.py (providers import nothing of the
reconciler) and re-exported here: the same classes, so `except ReconcileError` catches a provider's errors too."""

from __future__ import annotations

import errno
from dataclasses import dataclass

from providers.errors import (
    AccessDeniedError, CapacityError, IncompleteObservationError, KeySpentError, OwnershipError, PluginError, ProviderError, QuotaError,
    ReconcileError, TransientProviderError,
)


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
        parts = [f"{shown(self.file, 4096)}:{self.line}"]  # (a file's name is input too: a newline in it forged a line)
        if self.kind:
            parts.append(f"{shown(self.kind)}/{shown(self.name)}")
        if self.field and not self.field.startswith("<"):
            parts.append(shown(self.field, 200))
        return ": ".join([*parts, printable(self.message)])  # (one line, whatever the message quotes)


def printable(text: str) -> str:
    """`text` with each character that is not printable written as its escape (`\\x1b`, `\\r`, `\\n`, `\\u202e`), the
    rest as it is: text the program did not write itself (a name read back from a file, a provider's or a process's
    words) printed raw rewrote the terminal (an escape sequence, a `\\r`, a right-to-left override), or ended a line;
    and the `#` or `:` that makes such text a CI workflow command written `\\x23` or `\\x3a`."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    # A CI runner's workflow command, which GitHub's reads in a step's output and acts on (set-output, add-mask,
    # stop-commands, an error annotation): `##[command]` anywhere in a line, `::command::` where a line starts.
    if "##[" in text:
        text = text.replace("##[", "#\\x23[")
    if text.lstrip().startswith("::"):
        at = text.index("::")
        text = text[:at] + "\\x3a" + text[at + 1:]
    return text


def json_printed(text: str) -> str:
    """A JSON document as it is printed: `##[` written `#\\u0023[`, the same JSON to any reader, and no workflow command
    to a CI runner reading the step's output (printable)."""
    return text.replace("##[", "#\\u0023[") if "##[" in text else text


def shown(text: str, limit: int = 80) -> str:
    """Text of the input as a diagnostic shows it: control characters escaped (printable), and at most `limit`
    characters (a 2 MB metadata.name was printed whole in each of its document's errors: 20,000 of them took 40 GB)."""
    text = str(text)
    head = printable(text[:limit])
    return head if len(text) <= limit else head + f"... ({len(text):,} characters)"


class ConfigError(ReconcileError):
    """The desired state is invalid; carries every diagnostic, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.file, d.line, d.field))
        n = len(self.diagnostics)
        lines = "\n".join(str(d) for d in self.diagnostics)
        super().__init__(f"{n} error{'s' if n != 1 else ''} in desired state:\n{lines}")


class StalePlanError(ReconcileError):
    """A saved plan no longer matches the desired or observed state."""


class LockError(ReconcileError):
    """Another apply holds the lock."""


class GuardrailError(ReconcileError):
    """The plan breaks a GuardrailPolicy; nothing was changed."""


class SolverError(ReconcileError):
    """The solver found no answer at all (not even 'place nothing')."""


class WallCap(Exception):
    """Internal, never shown: the solver's wall-clock safety cap was hit (by a CP-SAT search or an LP solve), so its
    result would depend on the machine's load; solve.strategy.solve catches it and the plan is greedy's."""


class ApplyError(ReconcileError):
    """Some plan actions failed; the message lists what succeeded and what did not."""


# A local file not written for want of room: a full disk, a quota, a file-size limit.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from (an SDK wraps the OSError of the file it writes), is DISK_FULL."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in DISK_FULL:
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


class DiskFullError(ReconcileError):
    """A download (StateBackend.read_file) whose local file could not be written for want of room: the disk's fault,
    not the object's (a checkpoint restore then fails as one without room, not as a broken upload)."""


class CorruptBusObjectError(ReconcileError):
    """A bus object that is not what its writer writes (garbled JSON, a wrong type): its key and why.
    Readers of the agents' reports skip such an object (one agent's bad report must not stop the fleet)."""

    def __init__(self, key: str, why: str):
        self.key, self.why = key, why
        super().__init__(f"bus object {key} {why}; delete it and its writer rewrites it")


__all__ = ["AccessDeniedError", "ReconcileError", "Diagnostic", "json_printed", "printable", "shown", "ConfigError", "ProviderError", "CapacityError", "QuotaError",
           "TransientProviderError", "KeySpentError", "OwnershipError", "IncompleteObservationError", "PluginError",
           "StalePlanError", "LockError", "GuardrailError", "SolverError", "WallCap", "ApplyError", "CorruptBusObjectError"]
