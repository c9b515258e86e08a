"""What each instance must run: the assignments apply publishes on the bus (a pure function of
the desired state, the recorded placements and the previous assignments)."""

from __future__ import annotations

import hashlib
import json
from typing import Mapping

from reconciler.model import DesiredState, Job

CLOUD_MASTER_PORT = 29500  # torch.distributed's default: each replica has its own instance address


def spec_hash(job: Job) -> str:
    """The job's spec as agents and the reconciler compare it: a finished job runs again only when it changes."""
    return hashlib.sha256(json.dumps(job.spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def master_port(fleet: str, job: str, epoch: int, shared_host: bool) -> int:
    """On the sim every instance is 127.0.0.1, so each gang gets its own port (stable per epoch)."""
    if not shared_host:
        return CLOUD_MASTER_PORT
    return 20000 + int(hashlib.sha256(f"{fleet}/{job}/{epoch}".encode()).hexdigest(), 16) % 20000


def previous_placements(previous: Mapping[str, dict]) -> dict[str, tuple[int, dict[int, str]]]:
    """job -> (epoch, replica -> instance) as the last published assignments had them."""
    out: dict[str, tuple[int, dict[int, str]]] = {}
    for iid, doc in previous.items():
        for e in doc.get("replicas", []):
            epoch, where = out.setdefault(e["job"], (e.get("epoch", 0), {}))
            where[e["replica"]] = iid
    return out


def build_assignments(desired: DesiredState, placements: Mapping[str, list[str]], gpus: Mapping[str, list[list[int]]],
                      providers: Mapping[str, str], serial: int, previous: Mapping[str, dict]) -> dict[str, dict]:
    """instance id -> its assignment document, for every instance that hosts a replica of a job
    with `run`. A job's epoch is the serial at which its placement last changed: when one replica
    moves, the whole gang restarts (from its checkpoint) at the new epoch."""
    before = previous_placements(previous)
    out: dict[str, dict] = {}
    for name, ids in sorted(placements.items()):
        job = desired.jobs.get(name)
        if job is None or job.spec.run is None or not ids:
            continue
        s = job.spec
        prev = before.get(name)
        where = dict(enumerate(ids))
        epoch = prev[0] if prev is not None and prev[1] == where else serial
        shared = all(providers.get(i) == "sim" for i in ids)
        g = gpus.get(name) or []
        seen: dict[str, int] = {}
        for r, iid in enumerate(ids):
            local_rank = seen.get(iid, 0)
            seen[iid] = local_rank + 1
            doc = out.setdefault(iid, {"instance": iid, "fleet": desired.fleet, "serial": serial, "replicas": []})
            doc["replicas"].append({
                "job": name, "replica": r, "world_size": len(ids), "local_rank": local_rank, "epoch": epoch,
                "spec_hash": spec_hash(job), "run": s.run.model_dump(mode="json"), "mode": s.run_mode,
                "restart": s.restart_policy.model_dump(mode="json"), "time_limit_hours": s.time_limit_hours,
                "checkpoint": s.checkpoint.model_dump(mode="json") if s.checkpoint else None,
                "gpus": [str(x) for x in (g[r] if r < len(g) else [])],
                "master_instance": ids[0], "master_port": master_port(desired.fleet, name, epoch, shared),
            })
    return out
