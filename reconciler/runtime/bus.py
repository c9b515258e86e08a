"""The bus: JSON objects on the state backend that apply and the node agents exchange.

    assignments/<instance>.json    written by apply: what the instance runs, with the state serial
    runs/<job>/<replica>.json      written by the agent the replica is assigned to
    agents/<instance>.json         written by that instance's agent: heartbeat, address, notice

Agents never write assignments/ and apply never writes runs/ or agents/, so the least-privilege
policy for an agent is: read assignments/ (and runs/, agents/ for its gang peers), write its own
runs/ and agents/ keys."""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import quote, unquote

from reconciler.backend import StateBackend
from reconciler.errors import ReconcileError

ASSIGNMENTS, RUNS, AGENTS = "assignments", "runs", "agents"


def setting(name: str, default: float) -> float:
    """A runtime period or threshold in seconds: FLEETOPS_<NAME> from the environment (tests and
    the sim shorten them), else the default."""
    raw = os.environ.get(f"FLEETOPS_{name}")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ReconcileError(f"FLEETOPS_{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ReconcileError(f"FLEETOPS_{name}={raw!r} must be above 0")
    return value


def poll_seconds() -> float:
    return setting("AGENT_POLL_SECONDS", 2.0)


def heartbeat_seconds() -> float:
    return setting("AGENT_HEARTBEAT_SECONDS", 5.0)


def stale_seconds() -> float:
    """A heartbeat older than this is a lost node: a few missed beats, not one slow write."""
    return setting("HEARTBEAT_STALE_SECONDS", 60.0)


def boot_seconds() -> float:
    """How long a new instance's agent may take to report first (boot, install, start)."""
    return setting("AGENT_BOOT_SECONDS", 600.0)


def backoff_seconds() -> float:
    return setting("RESTART_BACKOFF_SECONDS", 10.0)


def now_unix() -> float:
    return time.time()


def instance_key(instance: str) -> str:
    """An instance id as one key segment: GCE (projects/p/zones/z/instances/n) and Azure
    (/subscriptions/...) ids hold slashes, so they are percent-encoded; EC2 and sim ids are unchanged."""
    return quote(instance, safe="-_.~")


def _instance_of(key: str, prefix: str) -> str | None:
    name = key[len(prefix) + 1:]
    return unquote(name[:-5]) if key.startswith(prefix + "/") and name.endswith(".json") and "/" not in name else None


class Bus:
    """Typed access to the bus keys of one state backend."""

    def __init__(self, store: StateBackend):
        self.store = store

    def _read(self, key: str) -> dict | None:
        raw = self.store.read_key(key)
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ReconcileError(f"bus object {key} is not valid JSON; delete it and its writer rewrites it") from None
        if not isinstance(doc, dict):
            raise ReconcileError(f"bus object {key} is not a JSON object; delete it and its writer rewrites it")
        return doc

    def _write(self, key: str, doc: dict[str, Any]) -> None:
        self.store.write_key(key, json.dumps(doc, indent=1, sort_keys=True).encode())

    # assignments/ (apply)
    def assignment(self, instance: str) -> dict | None:
        return self._read(f"{ASSIGNMENTS}/{instance_key(instance)}.json")

    def put_assignment(self, instance: str, doc: dict) -> None:
        self._write(f"{ASSIGNMENTS}/{instance_key(instance)}.json", doc)

    def delete_assignment(self, instance: str) -> None:
        self.store.delete_key(f"{ASSIGNMENTS}/{instance_key(instance)}.json")

    def assigned_instances(self) -> list[str]:
        return [i for k in self.store.list_keys(ASSIGNMENTS) if (i := _instance_of(k, ASSIGNMENTS)) is not None]

    def assignments(self) -> dict[str, dict]:
        out = {}
        for iid in self.assigned_instances():
            doc = self.assignment(iid)
            if doc is not None:
                out[iid] = doc
        return out

    # runs/ (agents)
    def run(self, job: str, replica: int) -> dict | None:
        return self._read(f"{RUNS}/{job}/{replica}.json")

    def put_run(self, job: str, replica: int, doc: dict) -> None:
        self._write(f"{RUNS}/{job}/{replica}.json", doc)

    def runs(self, job: str | None = None) -> dict[tuple[str, int], dict]:
        out = {}
        for key in self.store.list_keys(f"{RUNS}/{job}" if job else RUNS):
            parts = key.split("/")
            if len(parts) != 3 or not parts[2].endswith(".json") or not parts[2][:-5].isdigit():
                continue
            doc = self._read(key)
            if doc is not None:
                out[(parts[1], int(parts[2][:-5]))] = doc
        return out

    # agents/ (agents)
    def agent(self, instance: str) -> dict | None:
        return self._read(f"{AGENTS}/{instance_key(instance)}.json")

    def put_agent(self, instance: str, doc: dict) -> None:
        self._write(f"{AGENTS}/{instance_key(instance)}.json", doc)

    def agent_instances(self) -> list[str]:
        return [i for k in self.store.list_keys(AGENTS) if (i := _instance_of(k, AGENTS)) is not None]

    def delete_agent(self, instance: str) -> None:
        """The reconciler's cleanup once the instance is gone (an agent never deletes)."""
        self.store.delete_key(f"{AGENTS}/{instance_key(instance)}.json")

    def agents(self) -> dict[str, dict]:
        out = {}
        for key in self.store.list_keys(AGENTS):
            iid = _instance_of(key, AGENTS)
            if iid is not None and (doc := self._read(key)) is not None:
                out[iid] = doc
        return out
