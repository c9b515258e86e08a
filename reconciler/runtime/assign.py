"""What each instance must run: the assignments apply publishes on the bus (a pure function of
the desired state, the recorded placements and the previous assignments)."""

from __future__ import annotations

import hashlib
import json
from typing import Mapping, Sequence

from reconciler.model import DesiredState, Job

CLOUD_MASTER_PORT = 29500  # torch.distributed's default: each replica has its own instance address


def spec_hash(job: Job) -> str:
    """What the job's agents run, as agents and the reconciler compare it: a running replica restarts, and a
    finished job runs again, only when it changes. Only the fields that change the process or what it is given
    count; the scheduling-only ones (tenant, priority, spot, data, allowlists, expected_hours, submitted,
    deadline, licenses, gang, nvlink, cpu, memory_gib) do not: editing a job's priority restarted it from its
    last checkpoint, and ran a Succeeded batch job again (audit). A scheduling edit that moves the job
    restarts it through its placement (a new epoch) all the same."""
    s = job.spec
    body = {
        "run": s.run.model_dump(mode="json") if s.run else None,  # command, env, image: the process itself
        "mode": s.run_mode, "restart": s.restart_policy.model_dump(mode="json"),  # what the agent does when it ends
        "time_limit_hours": s.time_limit_hours,  # when the agent stops it
        "checkpoint": s.checkpoint.model_dump(mode="json") if s.checkpoint else None,  # its dir (env) and stop signal
        "replicas": s.replicas,  # WORLD_SIZE
        # The devices it is given (NVIDIA/CUDA_VISIBLE_DEVICES): they can change on the same instances (same epoch).
        # cpu and memory_gib are not given to the process (no runtime limits them): placement only.
        "gpus": s.resources.gpus, "gpu_type": s.resources.gpu_type,
        "mig": s.resources.mig.model_dump(mode="json") if s.resources.mig else None,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def legacy_spec_hash(job: Job) -> str:
    """The hash versions before spec_hash's narrowing published: the whole spec. A run record or an assignment
    carrying it is current while the spec is unchanged since, so an upgrade restarts and re-runs nothing."""
    return hashlib.sha256(json.dumps(job.spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def current_hashes(job: Job) -> tuple[str, str]:
    """The spec hashes a record of this job's current spec may carry (the narrow one, or an older version's)."""
    return spec_hash(job), legacy_spec_hash(job)


def hash_to_publish(job: Job, published: str | None) -> str:
    """The spec hash apply publishes for the job, `published` being the one it published last: that one again
    while it is an older version's whole-spec hash of the spec as it is (a new hash would restart what runs),
    else spec_hash. The first edit after an upgrade, of any field, then restarts the job once (as before)."""
    if published is not None and published == legacy_spec_hash(job):
        return published
    return spec_hash(job)


def published_hashes(assignments: Mapping[str, dict]) -> dict[str, str]:
    """job -> the spec hash the published assignments give it (its lowest replica's)."""
    out: dict[str, tuple[int, str]] = {}
    for doc in assignments.values():
        for e in doc.get("replicas", []):
            if e["job"] not in out or e["replica"] < out[e["job"]][0]:
                out[e["job"]] = (e["replica"], e["spec_hash"])
    return {j: h for j, (_, h) in sorted(out.items())}


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


def mig_devices(layout: Sequence[str], gpus: int) -> list[tuple[str, str]]:
    """Every MIG device of an instance whose `gpus` GPUs are each partitioned with `layout`, as
    (device, profile): device `G:M` is GPU G's M-th device in the layout's order (the one the instance was
    launched with: publish.mig_hosts)."""
    return [(f"{g}:{m}", p) for g in range(gpus) for m, p in enumerate(layout)]


def _assign_mig(out: dict[str, dict], desired: DesiredState, mig_hosts: Mapping[str, tuple[Sequence[str], int]],
                previous: Mapping[str, dict]) -> None:
    """Give each replica of a MIG job its devices on its instance (the plan counts them; this names
    them): the devices it had in the previous assignment while they are still its profile's, then the
    lowest free ones, so a running replica's devices never change under it and no device is given twice."""
    before = {(e["job"], e["replica"], iid): e.get("gpus", []) for iid, doc in previous.items() for e in doc.get("replicas", [])}
    for iid, doc in out.items():
        if iid not in mig_hosts:
            continue
        profile_of = dict(mig_devices(*mig_hosts[iid]))
        taken: set[str] = set()
        wanting = []
        for e in doc["replicas"]:
            mig = desired.jobs[e["job"]].spec.resources.mig
            if mig is None:
                continue
            e["mig_profile"], e["mig_layout"] = mig.profile, list(mig_hosts[iid][0])
            kept = before.get((e["job"], e["replica"], iid), [])
            if len(kept) == mig.count and all(profile_of.get(x) == mig.profile and x not in taken for x in kept):
                e["gpus"] = list(kept)
                taken.update(kept)
            else:
                wanting.append((e, mig))
        for e, mig in wanting:
            free = [x for x, p in profile_of.items() if p == mig.profile and x not in taken][:mig.count]
            e["gpus"] = free if len(free) == mig.count else []  # the plan never overcommits: [] would be a bug upstream
            taken.update(e["gpus"])


def build_assignments(desired: DesiredState, placements: Mapping[str, list[str]], gpus: Mapping[str, list[list[int]]],
                      providers: Mapping[str, str], serial: int, previous: Mapping[str, dict],
                      mig_hosts: Mapping[str, tuple[Sequence[str], int]] | None = None) -> dict[str, dict]:
    """instance id -> its assignment document, for every instance that hosts a replica of a job
    with `run`. A job's epoch is the serial at which its placement last changed: when one replica
    moves, the whole gang restarts (from its checkpoint) at the new epoch. `mig_hosts`: instance ->
    (its MIG layout, its GPU count), for the instances whose GPUs are MIG-partitioned."""
    before = previous_placements(previous)
    hashes = published_hashes(previous)
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
        h = hash_to_publish(job, hashes.get(name))
        seen: dict[str, int] = {}
        for r, iid in enumerate(ids):
            local_rank = seen.get(iid, 0)
            seen[iid] = local_rank + 1
            doc = out.setdefault(iid, {"instance": iid, "fleet": desired.fleet, "serial": serial, "replicas": []})
            doc["replicas"].append({
                "job": name, "replica": r, "world_size": len(ids), "local_rank": local_rank, "epoch": epoch,
                "spec_hash": h, "run": s.run.model_dump(mode="json"), "mode": s.run_mode,
                "restart": s.restart_policy.model_dump(mode="json"), "time_limit_hours": s.time_limit_hours,
                "checkpoint": s.checkpoint.model_dump(mode="json") if s.checkpoint else None,
                "gpus": [str(x) for x in (g[r] if r < len(g) else [])],
                "master_instance": ids[0], "master_port": master_port(desired.fleet, name, epoch, shared),
                # (a gang's: where each rank runs, so a rank sees a peer whose agent is lost before it wrote a record of
                # this round: agent.unstarted_peers)
                **({"peers": list(ids)} if len(ids) > 1 else {}),
            })
    _assign_mig(out, desired, mig_hosts or {}, previous)
    return out
