"""Interruption notices, from where each cloud publishes them (and from a file on the sim).

Each source answers `check()` with a short description when the instance is about to be
reclaimed, else None; the metadata endpoints are link-local and answer within milliseconds,
so a short timeout keeps a misconfigured source from stalling the agent's loop."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

TIMEOUT_S = 1.0


class NoticeSource(Protocol):
    def check(self) -> str | None: ...


def _get(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0, ""


class NoNotice:
    def check(self) -> str | None:
        return None


class FileNotice:
    """The sim: `reconcile sim interrupt` writes this file before it reclaims the instance."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def check(self) -> str | None:
        try:
            body = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None if not self.path.exists() else "interruption notice"
        return f"{body.get('reason', 'spot-interruption')} notice at {body.get('time', '?')}"


class AwsNotice:
    """IMDSv2 `spot/instance-action` (the two-minute warning) and the rebalance recommendation."""

    def __init__(self, base: str = "http://169.254.169.254"):
        self.base = base.rstrip("/")

    def _token(self) -> str:
        status, body = _get(f"{self.base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, "PUT")
        return body if status == 200 else ""

    def check(self) -> str | None:
        h = {"X-aws-ec2-metadata-token": self._token()}
        status, body = _get(f"{self.base}/latest/meta-data/spot/instance-action", h)
        if status == 200 and body:
            try:
                a = json.loads(body)
                return f"AWS spot {a.get('action', 'terminate')} at {a.get('time', '?')}"
            except ValueError:
                return "AWS spot instance-action"
        status, body = _get(f"{self.base}/latest/meta-data/events/recommendations/rebalance", h)
        if status == 200 and body:
            return "AWS rebalance recommendation"
        return None


class GceNotice:
    """GCE metadata `instance/preempted` turns TRUE when a spot/preemptible VM is being stopped."""

    def __init__(self, base: str = "http://metadata.google.internal"):
        self.base = base.rstrip("/")

    def check(self) -> str | None:
        status, body = _get(f"{self.base}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
        return "GCE preemption" if status == 200 and body.strip().upper() == "TRUE" else None


class AzureNotice:
    """Azure Scheduled Events: a `Preempt` event naming this VM (Spot eviction, about 30 s ahead).

    An event's `Resources` are VM names ("FrontEnd_IN_0" in Microsoft's reference), while the bootstrap names the
    instance by its ARM id (`/subscriptions/.../virtualMachines/NAME`): the name is its last segment. Azure resource
    names are case-insensitive."""

    def __init__(self, vm: str, base: str = "http://169.254.169.254"):
        self.vm_name = vm.rstrip("/").rsplit("/", 1)[-1]
        self.base = base.rstrip("/")

    def check(self) -> str | None:
        status, body = _get(f"{self.base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
        if status != 200:
            return None
        try:
            events = json.loads(body).get("Events", [])
        except ValueError:
            return None
        for e in events:
            names = {str(r).lower() for r in e.get("Resources") or []}
            if e.get("EventType") == "Preempt" and (not names or self.vm_name.lower() in names):
                return f"Azure Preempt at {e.get('NotBefore', '?')}"
        return None


def notice_source(kind: str, instance: str, sim_path: Path | None = None) -> NoticeSource:
    """`none`, `sim`, `aws`, `gcp` or `azure`."""
    if kind == "sim":
        return FileNotice(sim_path) if sim_path else NoNotice()
    if kind == "aws":
        return AwsNotice()
    if kind == "gcp":
        return GceNotice()
    if kind == "azure":
        return AzureNotice(instance)
    return NoNotice()
