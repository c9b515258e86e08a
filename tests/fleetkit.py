"""Build config directories and observed fleets from plain data, for tests."""

from __future__ import annotations

import contextlib

import shutil
import time
from dataclasses import replace
from pathlib import Path

import yaml

from providers.base import Instance
from providers.catalog import load_catalog
from reconciler.observe import Observed, PoolOffering

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"

TOPOLOGY = {
    "aws": {"us-east-1": ["us-east-1a", "us-east-1b"], "us-west-2": ["us-west-2a"]},
    "gcp": {"us-central1": ["us-central1-a", "us-central1-b"]},
    "azure": {"eastus": ["eastus-1", "eastus-2"]},
}


def doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "fleetops.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def topology(name: str = "test", clouds: dict | None = None, links: list | None = None) -> dict:
    clouds = clouds or TOPOLOGY
    spec = {"clouds": {c: {"regions": {r: {"zones": z} for r, z in regs.items()}} for c, regs in clouds.items()}}
    if links:
        spec["links"] = links
    return doc("Topology", name, spec)


def tenant(name: str, **quota) -> dict:
    return doc("Tenant", name, {"quota": quota} if quota else {})


def pool(name: str, cloud: str, region: str, zones: list[str], types: list[str], market: str = "on-demand", lo: int = 0, hi: int = 20) -> dict:
    return doc("Pool", name, {"cloud": cloud, "region": region, "zones": zones, "instance_types": types, "market": market, "min_instances": lo, "max_instances": hi})


def job(name: str, tenant: str = "t", gpus: int = 0, gpu_type: str | None = None, cpu: float = 1, mem: float = 1, replicas: int = 1, **spec) -> dict:
    res = {"gpus": gpus, "cpu": cpu, "memory_gib": mem}
    if gpu_type:
        res["gpu_type"] = gpu_type
    return doc("Job", name, {"tenant": tenant, "resources": res, "replicas": replicas, **spec})


def write_config(path: Path, docs: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "fleet.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def copy_example(tmp: Path, name: str) -> Path:
    """A private copy of examples/<name>, without any state or status a local run left there."""
    dst = tmp / name
    shutil.copytree(ROOT / "examples" / name, dst, ignore=shutil.ignore_patterns(".reconcile", "status"))
    return dst


def copy_quickstart(tmp: Path) -> Path:
    return copy_example(tmp, "quickstart")


def catalog_observed(desired, instances: list[Instance] = (), placements: dict | None = None, short=frozenset()) -> Observed:
    """The fleet as the sim provider would report it, without touching any file."""
    cat = load_catalog()
    offerings = []
    for p in desired.pools.values():
        s = p.spec
        for z in s.zones:
            for t in s.instance_types:
                o = cat.offering(s.cloud, s.region, z, t)
                if o is not None:
                    offerings.append(PoolOffering(p.name, o))
    return Observed(
        instances=tuple(instances), offerings=tuple(offerings), placements=placements or {}, short=frozenset(short),
        providers={p: "sim" for p in desired.pools},
    )


def plan_for(path: Path, docs: list[dict], instances=(), placements: dict | None = None, short=frozenset(), now=None,
             time_limit: float = 10, workers: int | None = None, gpu_indices: dict | None = None):
    """Plan `docs` against a simulated fleet (these instances, these jobs running on them), check
    every rule on the answer (tests/invariants.py) and return the plan. `now` drives aging;
    `time_limit=0` gives greedy best-fit's plan (the fallback); `workers=1` a deterministic one;
    `gpu_indices`: the running replicas' GPUs, as apply records them."""
    from reconciler.load import load
    from reconciler.plan import make_plan
    from reconciler.problem import build_problem
    from reconciler.solve import solve
    from tests.invariants import check_plan

    desired = load(write_config(path, docs))
    observed = replace(catalog_observed(desired, list(instances), placements, short), gpu_indices=gpu_indices or {})
    problem = build_problem(desired, observed, now=now)
    plan = make_plan(desired, observed, problem, solve(problem, time_limit=time_limit, workers=workers))
    check_plan(desired, observed, plan, now=now)
    return plan


def instance(iid: str, pool: str, cloud: str, region: str, zone: str, itype: str, market: str = "on-demand", fleet: str = "test") -> Instance:
    return Instance(id=iid, provider="sim", cloud=cloud, region=region, zone=zone, instance_type=itype, market=market,
                    state="running", pool=pool, tags={"fleetops.io/fleet": fleet, "fleetops.io/pool": pool})



def reduced_fleet12() -> tuple[list[dict], list[Instance]]:
    """fleet12 of the slow tier (issue 18), reduced: t1's two 3 x 2-GPU zone gangs (gang0 runs on i0) and t2's
    4-GPU NVLink job `big` and CPU job `small`, a p4d pool of two zones at max 2 and a CPU pool whose running
    instance i1 is spot, each tenant at a 0.5 spot share. The docs and the running instances; which jobs run where
    is the test's."""
    docs = [topology(), tenant("t1"), tenant("t2"),
            pool("gpu", "aws", "us-east-1", ["us-east-1a", "us-east-1b"], ["p4d.24xlarge"], market="either", hi=2),
            pool("cpu", "gcp", "us-central1", ["us-central1-a"], ["n2-standard-16"], market="either", hi=2),
            doc("SpotPolicy", "sp", {"max_spot_fraction": 0.5, "max_price_fraction": 0.3,  # (no spot p4d)
                                     "tenant_max_spot_fraction": {"t1": 0.5, "t2": 0.5}}),
            doc("PlacementPolicy", "pp", {"consolidation": "WhenUnderutilized", "preemption": "LowerPriority"})]
    gangs = [job(f"gang{i}", tenant="t1", priority="low", gpus=2, gpu_type="A100", cpu=16, mem=120, replicas=3, gang="zone")
             for i in range(2)]
    gangs[1]["spec"]["resources"]["nvlink"] = True
    # Each gang's data pins it to a zone (gang0 us-east-1a, gang1 us-east-1b), so the solver counts one new p4d each,
    # whose 2 + 2 free GPUs it takes for room for big. Unpinned, gang1 now shares a p4d with gang0 (NVLink beside
    # running work in one NVLink domain, fleet21) and every job packs.
    for g, zone in zip(gangs, ("us-east-1a", "us-east-1b")):
        g["spec"]["data"] = {"location": f"aws/us-east-1/{zone}", "size_gib": 0, "max_latency_ms": 0.5}
    big = job("big", tenant="t2", priority="low", gpus=4, gpu_type="A100", cpu=40, mem=300)
    big["spec"]["resources"]["nvlink"] = True
    docs += gangs + [big, job("small", tenant="t2", priority="low", cpu=4, mem=16)]
    running = [instance("i0", "gpu", "aws", "us-east-1", "us-east-1a", "p4d.24xlarge"),
               instance("i1", "cpu", "gcp", "us-central1", "us-central1-a", "n2-standard-16", "spot")]
    return docs, running

@contextlib.contextmanager
def pinned_catalog(path: Path, edit):
    """Plan with a copy of the shipped price catalog that `edit(raw)` changed, pinned as a config repo pins
    one (providers/catalog.py); the shipped one again afterwards."""
    import json

    from providers.catalog import pin_catalog, shipped_catalog_text

    raw = json.loads(shipped_catalog_text())
    edit(raw)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    pin_catalog(path)
    try:
        yield path
    finally:
        pin_catalog(None)


def poll_until(cond, what: str, timeout: float, every: float = 0.2):
    """cond()'s first true value, polled every `every` s; AssertionError naming `what` after `timeout` s. Tests
    wait for conditions this way, never for fixed times: the machine may be loaded."""
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        out = cond()
        if out:
            return out
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s")


def assert_converges(cfg: Path, time_limit: float = 0) -> None:
    """Apply the config's plan, then plan again: a no-op (nothing changed), the plan right after an apply."""
    from reconciler import api

    first = api.apply(cfg, time_limit=time_limit)
    assert first.report.ok, first.report.failures
    again = api.plan(cfg, time_limit=time_limit).plan
    assert not again.has_changes, [(j.job, j.action, j.reason) for j in again.jobs if j.action != "keep"]


def launched_later(sim, copy: str, original: dict) -> None:
    """The copy's launch a minute after its original's (the sim's clock counts seconds: a copy planted in the same one
    has the same launch time, which tells neither apart)."""
    from datetime import datetime, timedelta

    with sim.world() as w:
        w["instances"][copy]["launched_at"] = (datetime.fromisoformat(original["launched_at"]) + timedelta(minutes=1)).isoformat()


def report_written_ago(config_dir, instance: str, ago: float) -> None:
    """An agent's report on the local bus last written `ago` seconds ago as the store records it (its file's mtime):
    how a silent agent looks, whatever heartbeat_at its host's clock wrote (bus.beat_time)."""
    import os

    from reconciler.runtime.bus import instance_key

    t = time.time() - ago
    os.utime(Path(config_dir) / ".reconcile" / "agents" / f"{instance_key(instance)}.json", (t, t))
