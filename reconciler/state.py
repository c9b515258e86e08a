"""The reconciler's own state (.reconcile/state.json) and the apply lock.

The cloud is the truth for which instances exist; this file records which job
replica runs on which instance (with its GPU indices), and which zones recently
ran out of capacity (so the next run does not retry them at once). Providers that
can (sim, AWS) also tag each instance with its replicas; `serial` tells which of
the two records is newer when they disagree (reconciler/placements.py)."""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from reconciler.errors import LockError

CAPACITY_COOL_OFF = timedelta(minutes=30)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


@dataclass
class State:
    placements: dict[str, list[str]] = field(default_factory=dict)  # job -> instance id per replica
    gpus: dict[str, list[list[int]]] = field(default_factory=dict)  # job -> GPU indices per replica on its instance
    short: list[dict] = field(default_factory=list)  # {cloud, zone, instance_type, market, until}
    serial: int = 0  # one more each apply, and above every placement tag's serial seen
    shapes: dict[str, dict] = field(default_factory=dict)  # job -> the resources it was placed with (problem.shape_of)

    def short_now(self, now: datetime | None = None) -> frozenset[tuple[str, str, str, str]]:
        now = now or utcnow()
        return frozenset(
            (s["cloud"], s["zone"], s["instance_type"], s["market"]) for s in self.short
            if datetime.fromisoformat(s["until"]) > now
        )

    def mark_short(self, cloud: str, zone: str, instance_type: str, market: str, now: datetime | None = None) -> None:
        until = ((now or utcnow()) + CAPACITY_COOL_OFF).isoformat()
        self.short = [s for s in self.short if (s["cloud"], s["zone"], s["instance_type"], s["market"]) != (cloud, zone, instance_type, market)]
        self.short.append(dict(cloud=cloud, zone=zone, instance_type=instance_type, market=market, until=until))


def state_dir(config_dir: Path) -> Path:
    return Path(config_dir) / ".reconcile"


def state_to_json(state: State) -> str:
    return json.dumps({"serial": state.serial, "placements": dict(sorted(state.placements.items())),
                       "gpus": dict(sorted(state.gpus.items())), "shapes": dict(sorted(state.shapes.items())),
                       "short": state.short}, indent=1)


def state_from_json(text: str) -> State:
    raw = json.loads(text)
    now = utcnow()
    short = [s for s in raw.get("short", []) if datetime.fromisoformat(s["until"]) > now]
    return State(placements=raw.get("placements", {}), gpus=raw.get("gpus", {}), short=short, serial=raw.get("serial", 0),
                 shapes=raw.get("shapes", {}))


def load_state(config_dir: Path) -> State:
    path = state_dir(config_dir) / "state.json"
    return state_from_json(path.read_text()) if path.exists() else State()


def save_state(config_dir: Path, state: State) -> None:
    d = state_dir(config_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "state.json.tmp"
    tmp.write_text(state_to_json(state))
    os.replace(tmp, d / "state.json")


class ApplyLock:
    """An exclusive lock file (O_CREAT|O_EXCL) naming its holder.

    A lock whose process is gone on this host is stale and taken over; one held
    elsewhere can be broken by hand with `reconcile unlock ID`."""

    def __init__(self, config_dir: Path):
        self.path = state_dir(config_dir) / "apply.lock"
        self.id = uuid.uuid4().hex[:12]

    def holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def __enter__(self) -> "ApplyLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"id": self.id, "pid": os.getpid(), "host": socket.gethostname(), "since": utcnow().isoformat()})
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                h = self.holder()
                if h and h.get("host") == socket.gethostname() and not _pid_alive(h.get("pid", -1)):
                    self.path.unlink(missing_ok=True)  # the holder died (crash, SIGKILL): take over
                    continue
                who = f"{h['id']} (pid {h['pid']} on {h['host']} since {h['since']})" if h else "unknown"
                raise LockError(f"another apply holds the lock: {who}; if it is dead, run `reconcile unlock {h['id'] if h else 'ID'}`")
            with os.fdopen(fd, "w") as f:
                f.write(body)
            return self
        raise LockError(f"could not take the lock at {self.path}")

    def __exit__(self, *exc) -> None:
        h = self.holder()
        if h and h.get("id") == self.id:
            self.path.unlink(missing_ok=True)


def break_lock(config_dir: Path, lock_id: str) -> None:
    lock = ApplyLock(config_dir)
    h = lock.holder()
    if h is None:
        raise LockError("no lock is held")
    if h.get("id") != lock_id:
        raise LockError(f"the lock is held by {h.get('id')}, not {lock_id}; refusing to break it")
    lock.path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed but not yet reaped) still answers kill(0); it holds nothing.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


__all__ = ["State", "load_state", "save_state", "state_to_json", "state_from_json", "ApplyLock", "break_lock", "state_dir", "utcnow"]
