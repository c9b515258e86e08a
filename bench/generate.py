"""A seeded generator of large, valid fleet configs for the plan-time benchmark.

The fleet spans the 3 clouds and 6 regions of the shipped catalog
(providers/data/catalog.json). Pools come from the catalog's types named in
BENCH_TYPES (its types as of 2026-11-26, so the fleets stay fixed): in every region, one
pool per GPU family offered there plus one CPU pool, on the first
`zones_per_region` catalog zones, spot or on-demand, with a high max_instances.
A GPU pool takes the family's types of at least `min_gpus` GPUs (default 4, e.g.
g5.12xlarge + g5.48xlarge for A10G): node pools of large machines that 1-GPU jobs
are bin-packed onto. With 1-GPU types in the pools, the cheapest answer gives every
1-GPU job its own instance (1,000 jobs -> ~750 instances); with the default, the
1k tier ends at ~500-540 instances with ~76% of the jobs placed.

Jobs (random.Random(seed), so a seed always gives the same config):
  ~55% 1-GPU jobs (A100, A10G, L4, T4, H100), ~15% 2/4-GPU jobs, ~15% gangs of
  2-4 replicas of 8 GPUs, ~15% CPU-only jobs; priorities low..critical; spot
  eligible / never / required; ~30% read a data set at a topology location;
  ~5% are pinned to the EU regions (only those whose GPU family is offered there).
  Every job's replica fits at least one instance type of a pool it may use, so
  nothing is pending for a static reason.
Tenants (8 by default) get a GPU quota of `quota_fraction` of the GPUs their own
jobs ask for: most work fits, the rest is pending on quota, as in a real fleet.

    python -m bench.generate OUT --jobs 1000 --seed 1
"""

from __future__ import annotations

import argparse
import math
import dataclasses
import random
import re
from pathlib import Path

import yaml

from providers.catalog import Catalog, InstanceShape, load_catalog

API = "fleetops.io/v1alpha1"
FLEET = "bench"

# The job mix (fractions of all jobs; the rest is CPU-only).
SINGLE_GPU, MULTI_GPU, GANG = 0.55, 0.15, 0.15
# GPU types jobs ask for, with their weights, per job kind. Each must be offered by a pool
# with an instance type large enough (checked by fleet_docs, so a catalog change cannot
# silently make jobs unplaceable).
SINGLE_TYPES = {"A100": 3, "A10G": 2, "L4": 2, "T4": 2, "H100": 1}
MULTI_TYPES = {"A100": 3, "A10G": 2, "L4": 1, "T4": 1, "H100": 1}
GANG_TYPES = {"A100": 3, "H100": 2, "A10G": 1}
PRIORITIES = {"low": 3, "normal": 5, "high": 2, "critical": 1}
EU_REGIONS = ["gcp/europe-west4", "azure/westeurope"]
# The catalog types the generated fleets are built from: the shipped catalog's 44 as of 2026-11-26. The catalog has
# since learned more types (g5.2xlarge, a2-highgpu-2g, ...); pinning the set keeps every generated fleet, and so the
# benchmark's digests, what it was. A catalog that drops one of these fails here, not silently.
BENCH_TYPES = {
    "aws": ("c6i.8xlarge", "g4dn.12xlarge", "g4dn.xlarge", "g5.12xlarge", "g5.48xlarge", "g5.xlarge", "g6.24xlarge",
            "g6.2xlarge", "g6.48xlarge", "g6e.48xlarge", "g6e.xlarge", "m6i.4xlarge", "p3.16xlarge", "p3.2xlarge",
            "p3.8xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5.4xlarge", "p5en.48xlarge",
            "p6-b200.48xlarge"),
    "gcp": ("a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g", "a2-ultragpu-8g", "a3-highgpu-8g", "a3-ultragpu-8g",
            "g2-standard-4", "g2-standard-48", "n1-standard-32+4xnvidia-tesla-v100", "n1-standard-8+1xnvidia-tesla-t4",
            "n1-standard-8+1xnvidia-tesla-v100", "n2-standard-16"),
    "azure": ("Standard_D16s_v5", "Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5", "Standard_NC4as_T4_v3",
              "Standard_NC64as_T4_v3", "Standard_NC96ads_A100_v4", "Standard_ND96amsr_A100_v4", "Standard_ND96asr_v4",
              "Standard_ND96isr_H100_v5", "Standard_NV36ads_A10_v5", "Standard_NV72ads_A10_v5"),
}


def _doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": spec}


def _name(*parts: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def bench_catalog(catalog: Catalog) -> Catalog:
    """The catalog restricted to BENCH_TYPES (ValueError naming any it lacks)."""
    missing = [f"{c} {t}" for c, ts in BENCH_TYPES.items() for t in ts if catalog.shape(c, t) is None]
    if missing:
        raise ValueError(f"the catalog lacks the benchmark's types: {', '.join(missing)}")
    return dataclasses.replace(catalog, shapes={k: s for k, s in catalog.shapes.items() if k[1] in BENCH_TYPES.get(k[0], ())})


def _offered(catalog: Catalog, cloud: str, region: str, zones: list[str]) -> list[InstanceShape]:
    """The types offered in one of `zones` of the region (with --zones-per-region 1, a3-highgpu-8g, offered in
    europe-west4-b and -c only, went into a pool of europe-west4-a, and the loader refused the config)."""
    return [s for (c, _), s in sorted(catalog.shapes.items())
            if c == cloud and region in s.prices and any(s.prices[region].offered_in(z) for z in zones)]


def pool_docs(catalog: Catalog, zones_per_region: int, max_instances: int, min_gpus: int = 1,
              market: str = "either", reserve: int = 0) -> list[dict]:
    """Per catalog region: one pool per GPU family offered there, plus one CPU pool.

    A GPU pool takes the family's types with at least `min_gpus` GPUs (all of them if
    none is that large): node pools of large GPU machines that the scheduler bin-packs.
    `reserve` instances are spread over the pools as min_instances: a fleet kept warm."""
    docs = []
    for cloud, regions in sorted(catalog.regions.items()):
        for region, info in sorted(regions.items()):
            zones = info["zones"][:zones_per_region]
            families: dict[str, list[str]] = {}
            for s in _offered(catalog, cloud, region, zones):
                families.setdefault(s.gpu_type or "cpu", []).append(s)
            for family, shapes in sorted(families.items()):
                large = [s for s in shapes if s.gpus >= min_gpus]
                types = [s.name for s in (large or shapes)]
                docs.append(_doc("Pool", _name(cloud, region, family), {
                    "cloud": cloud, "region": region, "zones": zones, "instance_types": sorted(types),
                    "market": market, "max_instances": max_instances,
                }))
    for i, d in enumerate(docs):
        least = reserve // len(docs) + (1 if i < reserve % len(docs) else 0)
        if least:
            d["spec"]["min_instances"] = least
            d["spec"]["max_instances"] = max_instances + least
    return docs


def _largest(catalog: Catalog, gpu_type: str | None) -> dict[str, float]:
    """The smallest per-dimension ceiling over the family's types with the most GPUs:
    what one replica may ask for and still fit on every cloud that offers the family."""
    shapes = [s for s in catalog.shapes.values() if s.gpu_type == gpu_type]
    top = max(s.gpus for s in shapes)
    big = [s for s in shapes if s.gpus == top]
    return {"gpus": top, "cpu": min(s.cpu for s in big), "memory_gib": min(s.memory_gib for s in big)}


def _job(rng: random.Random, kind: str, tenants: int, locations: list[str], eu_families: set[str | None]) -> dict:
    spec: dict = {"tenant": f"team-{rng.randrange(tenants)}", "priority": _pick(rng, PRIORITIES)}
    if kind == "single":
        spec["resources"] = {"gpus": 1, "gpu_type": _pick(rng, SINGLE_TYPES), "cpu": rng.choice([2, 4]),
                             "memory_gib": rng.choice([8, 12, 16])}
        spec["spot"] = rng.choices(["eligible", "never", "required"], weights=[6, 2, 2])[0]
    elif kind == "multi":
        g = rng.choice([2, 4])
        spec["resources"] = {"gpus": g, "gpu_type": _pick(rng, MULTI_TYPES), "cpu": rng.choice([8, 10]) * g,
                             "memory_gib": rng.choice([32, 48]) * g}
        spec["spot"] = rng.choices(["eligible", "never", "required"], weights=[5, 4, 1])[0]
    elif kind == "gang":
        spec["resources"] = {"gpus": 8, "gpu_type": _pick(rng, GANG_TYPES), "cpu": rng.choice([64, 90]),
                             "memory_gib": rng.choice([400, 600])}
        spec["replicas"] = rng.choices([2, 3, 4], weights=[3, 2, 1])[0]
        spec["spot"] = rng.choices(["eligible", "never"], weights=[1, 4])[0]
    else:
        spec["resources"] = {"cpu": rng.choice([1, 2, 4, 8]), "memory_gib": rng.choice([2, 4, 8, 16, 32])}
        spec["spot"] = rng.choices(["eligible", "never", "required"], weights=[5, 4, 1])[0]
    if rng.random() < 0.3:
        spec["data"] = {"location": rng.choice(locations), "size_gib": rng.choice([20, 100, 500, 2000, 5000])}
        spec["expected_hours"] = rng.choice([4, 24, 72])
    if kind != "gang" and rng.random() < 0.05 and spec["resources"].get("gpu_type") in eu_families:
        spec["regions"] = list(EU_REGIONS)  # data residency
    return spec


def fleet_docs(jobs: int, seed: int = 1, *, tenants: int = 8, quota_fraction: float = 0.8,
               zones_per_region: int = 3, max_instances: int | None = None, min_gpus: int = 4,
               reserve: int = 0, rules: bool = False) -> list[dict]:
    """Every document of a generated fleet: Topology, SpotPolicy, GuardrailPolicy, Tenants, Pools, Jobs.
    `reserve`: instances kept as pool minimums (the 10k-instance tier), spread over the pools.
    `rules`: also the issue-17 scheduling rules (`rule_docs`): floating licenses, reservations, deadlines."""
    if jobs < 0 or tenants < 1 or not 0 < quota_fraction or zones_per_region < 1:
        raise ValueError("jobs >= 0, tenants >= 1, quota_fraction > 0 and zones_per_region >= 1 are required")
    catalog = bench_catalog(load_catalog())
    rng = random.Random(seed)
    max_instances = max_instances or max(100, jobs)

    clouds: dict = {}
    locations: list[str] = []
    for cloud, regions in sorted(catalog.regions.items()):
        clouds[cloud] = {"regions": {}}
        locations.append(cloud)
        for region, info in sorted(regions.items()):
            zones = info["zones"][:zones_per_region]
            clouds[cloud]["regions"][region] = {"zones": zones}
            locations += [f"{cloud}/{region}", f"{cloud}/{region}/{zones[0]}"]
    links = [  # dedicated interconnects between the US regions of the three clouds
        {"from": "aws/us-east-1", "to": "gcp/us-central1", "latency_ms": 22, "egress_per_gb": 0.02},
        {"from": "aws/us-east-1", "to": "azure/eastus", "latency_ms": 4, "egress_per_gb": 0.02},
        {"from": "gcp/europe-west4", "to": "azure/westeurope", "latency_ms": 8, "egress_per_gb": 0.03},
    ]
    pools = pool_docs(catalog, zones_per_region, max_instances, min_gpus, reserve=reserve)
    regions = [f"{c}/{r}" for c, rs in sorted(catalog.regions.items()) for r in sorted(rs)]

    eu_families: set[str | None] = set()
    for r in EU_REGIONS:
        cloud, region = r.split("/")
        eu_families |= {s.gpu_type for s in _offered(catalog, cloud, region, clouds[cloud]["regions"][region]["zones"])}
    specs = []
    for _ in range(jobs):
        r = rng.random()
        kind = ("single" if r < SINGLE_GPU else "multi" if r < SINGLE_GPU + MULTI_GPU
                else "gang" if r < SINGLE_GPU + MULTI_GPU + GANG else "cpu")
        specs.append(_job(rng, kind, tenants, locations, eu_families))
    for s in specs:  # every replica must fit some instance type of its family (see the type tables)
        res = s["resources"]
        top = _largest(catalog, res.get("gpu_type"))
        if any(res.get(dim, 0) > top[dim] for dim in ("gpus", "cpu", "memory_gib")):
            raise AssertionError(f"generator bug: {res} fits no catalog type (largest {top})")

    asked: dict[str, int] = {}
    for s in specs:
        asked[s["tenant"]] = asked.get(s["tenant"], 0) + s["resources"].get("gpus", 0) * s.get("replicas", 1)
    tenant_docs = [
        _doc("Tenant", f"team-{i}", {"weight": float(1 + i % 3), "quota": {"gpus": math.ceil(asked.get(f"team-{i}", 0) * quota_fraction)}})
        for i in range(tenants)
    ]
    extra = rule_docs(specs, pools, tenants, seed) if rules else []
    return [
        *extra,
        _doc("Topology", FLEET, {"clouds": clouds, "links": links}),
        _doc("SpotPolicy", "default", {"max_spot_fraction": 0.6, "max_price_fraction": 0.8, "min_instance_types": 1}),
        # No budget and no destroy limit: the benchmark must never be stopped by a guardrail.
        _doc("GuardrailPolicy", "default", {"allowed_regions": regions}),
        *tenant_docs,
        *pools,
        *(_doc("Job", f"job-{i:05d}", s) for i, s in enumerate(specs)),
    ]


# The rules' mix (with --rules): a share of the GPU jobs holds a license, of the jobs has a deadline.
LICENSED, DEADLINED = 0.2, 0.15
DEADLINE_BASE = "2026-12-01T00:00:00Z"  # deadlines are spread over the two weeks after it


def rule_docs(specs: list[dict], pools: list[dict], tenants: int, seed: int) -> list[dict]:
    """Floating licenses (a simulator and a MATLAB pool, a tenant quota on one) held by ~20% of the GPU jobs,
    a reservation of on-demand capacity in the first zone of the first few on-demand GPU pools, and deadlines on
    ~15% of the jobs (its own random stream, so the rest of the fleet is the one without --rules). Edits `specs`."""
    from datetime import datetime, timedelta

    rng = random.Random(seed * 7919 + 17)
    gpu_jobs = [s for s in specs if s["resources"].get("gpus")]
    for s in gpu_jobs:
        if rng.random() < LICENSED:
            s["licenses"] = {rng.choice(["sim-seat", "matlab"]): 1}
    held = {n: sum(s["licenses"].get(n, 0) * s.get("replicas", 1) for s in specs if "licenses" in s) for n in ("sim-seat", "matlab")}
    base = datetime.fromisoformat(DEADLINE_BASE.replace("Z", "+00:00"))
    for s in specs:
        if rng.random() < DEADLINED:
            s["deadline"] = base + timedelta(hours=rng.randrange(0, 14 * 24))
    docs = [_doc("License", "sim-seat", {"count": max(1, held["sim-seat"] * 2 // 3), "cost_per_hour": 0.9}),
            _doc("License", "matlab", {"count": max(1, held["matlab"] // 2), "cost_per_hour": 1.2,
                                       "tenant_quotas": {"team-0": max(0, held["matlab"] // 6)}})]
    reserved = [p for p in pools if p["spec"]["market"] != "spot" and any(_gpu_shape(p, t) for t in p["spec"]["instance_types"])][:3]
    for i, p in enumerate(reserved):
        s = p["spec"]
        itype = next(t for t in s["instance_types"] if _gpu_shape(p, t))
        docs.append(_doc("Reservation", _name("rsv", p["metadata"]["name"]), {
            "cloud": s["cloud"], "region": s["region"], "zone": s["zones"][0], "instance_type": itype, "count": 2 + 2 * i,
            "hourly_cost": round(0.6 * _on_demand(s["cloud"], s["region"], s["zones"][0], itype), 4), "pool": p["metadata"]["name"]}))
    return docs


def _gpu_shape(pool: dict, itype: str) -> bool:
    shape = load_catalog().shape(pool["spec"]["cloud"], itype)
    return bool(shape and shape.gpus)


def _on_demand(cloud: str, region: str, zone: str, itype: str) -> float:
    o = load_catalog().offering(cloud, region, zone, itype)
    return o.on_demand_price if o else 1.0


def generate(out_dir: Path, jobs: int, seed: int = 1, **options) -> Path:
    """Write the fleet as a config directory (the layout of examples/quickstart) and return it.

    `options` go to fleet_docs: tenants, quota_fraction, zones_per_region, max_instances, reserve."""
    out = Path(out_dir)
    docs = fleet_docs(jobs, seed, **options)
    if out.exists() and any(out.glob("**/*.yaml")):
        raise FileExistsError(f"{out} already holds YAML files; generate into an empty directory")
    (out / "jobs").mkdir(parents=True, exist_ok=True)

    def dump(path: Path, items: list[dict]) -> None:
        path.write_text(yaml.safe_dump_all(items, sort_keys=False, default_flow_style=None))

    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    dump(out / "topology.yaml", by_kind["Topology"])
    dump(out / "policies.yaml", by_kind["SpotPolicy"] + by_kind["GuardrailPolicy"])
    dump(out / "tenants.yaml", by_kind["Tenant"])
    dump(out / "pools.yaml", by_kind["Pool"])
    if by_kind.get("License") or by_kind.get("Reservation"):
        dump(out / "rules.yaml", by_kind.get("License", []) + by_kind.get("Reservation", []))
    body = by_kind.get("Job", [])
    for k in range(0, len(body), 500):  # several files, as a real config repository has
        dump(out / "jobs" / f"jobs-{k // 500:03d}.yaml", body[k:k + 500])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="an empty or new directory")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--quota-fraction", type=float, default=0.8, help="tenant GPU quota / GPUs its jobs ask for")
    ap.add_argument("--zones-per-region", type=int, default=3)
    ap.add_argument("--min-gpus", type=int, default=4, help="smallest GPU count of a GPU pool's instance types")
    ap.add_argument("--reserve", type=int, default=0, help="instances kept as pool minimums, spread over the pools")
    ap.add_argument("--rules", action="store_true", help="add floating licenses, reservations and deadlines (issue 17)")
    a = ap.parse_args(argv)
    try:
        out = generate(a.out, a.jobs, a.seed, tenants=a.tenants, quota_fraction=a.quota_fraction,
                       zones_per_region=a.zones_per_region, min_gpus=a.min_gpus, reserve=a.reserve, rules=a.rules)
    except (FileExistsError, ValueError) as e:
        ap.error(str(e))
    print(out)


if __name__ == "__main__":
    main()
