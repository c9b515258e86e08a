"""A seeded fleet generator: 3 clouds, 6 regions, real catalog instance types.

Job mix: ~55% 1-GPU jobs (A100, A10G, L4, T4), ~15% 2/4-GPU A100 jobs, ~15% 8-GPU A100
gangs of 2-4 replicas, ~15% CPU-only jobs; 8 tenants; mixed priorities and spot rules;
some jobs carry a data location and size. `python -m bench.generate OUT --jobs 1000 --seed 1`.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import yaml

API = "fleetops.io/v1alpha1"
CLOUDS = {
    "aws": {"us-east-1": ["us-east-1a", "us-east-1b", "us-east-1c"], "us-west-2": ["us-west-2a", "us-west-2b"]},
    "gcp": {"us-central1": ["us-central1-a", "us-central1-b"], "europe-west4": ["europe-west4-a", "europe-west4-b"]},
    "azure": {"eastus": ["eastus-1", "eastus-2"], "westeurope": ["westeurope-1", "westeurope-2"]},
}
POOLS = [  # name, cloud, region, types, market
    ("aws-e-a100", "aws", "us-east-1", ["p4d.24xlarge"], "either"),
    ("aws-e-a10g", "aws", "us-east-1", ["g5.xlarge", "g5.12xlarge", "g5.48xlarge"], "either"),
    ("aws-w-t4", "aws", "us-west-2", ["g4dn.xlarge", "g4dn.12xlarge"], "either"),
    ("aws-e-cpu", "aws", "us-east-1", ["m6i.4xlarge", "c6i.8xlarge"], "on-demand"),
    ("gcp-c-a100", "gcp", "us-central1", ["a2-highgpu-1g", "a2-highgpu-4g", "a2-highgpu-8g"], "either"),
    ("gcp-w-l4", "gcp", "europe-west4", ["g2-standard-4", "g2-standard-48"], "either"),
    ("gcp-c-cpu", "gcp", "us-central1", ["n2-standard-16"], "either"),
    ("az-e-a100", "azure", "eastus", ["Standard_ND96asr_v4"], "either"),
    ("az-w-t4", "azure", "westeurope", ["Standard_NC4as_T4_v3", "Standard_NC64as_T4_v3"], "either"),
]
DATA = ["aws/us-east-1", "gcp/us-central1", "azure/westeurope", "gcp/europe-west4"]


def _doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": spec}


def fleet_docs(jobs: int, seed: int = 1, tenants: int = 8, pool_max: int | None = None) -> list[dict]:
    rng = random.Random(seed)
    pool_max = pool_max or max(50, jobs // 2)
    docs = [_doc("Topology", "bench", {
        "clouds": {c: {"regions": {r: {"zones": z} for r, z in regs.items()}} for c, regs in CLOUDS.items()},
        "links": [{"from": "aws/us-east-1", "to": "gcp/us-central1", "latency_ms": 22, "egress_per_gb": 0.02}],
    })]
    quota = max(16, int(jobs * 3.2 / tenants))  # GPUs per tenant: most, not all, work fits
    docs += [_doc("Tenant", f"team-{i}", {"weight": 1 + i % 3, "quota": {"gpus": quota}}) for i in range(tenants)]
    for name, cloud, region, types, market in POOLS:
        docs.append(_doc("Pool", name, {"cloud": cloud, "region": region, "zones": CLOUDS[cloud][region],
                                        "instance_types": types, "market": market, "max_instances": pool_max}))
    docs.append(_doc("SpotPolicy", "default", {"max_spot_fraction": 0.6, "max_price_fraction": 0.8}))
    for i in range(jobs):
        r = rng.random()
        spec: dict = {"tenant": f"team-{rng.randrange(tenants)}",
                      "priority": rng.choice(["low", "normal", "normal", "high"]),
                      "spot": rng.choice(["eligible", "eligible", "never", "required"])}
        if r < 0.55:
            gt = rng.choice(["A100", "A10G", "L4", "T4"])
            spec["resources"] = {"gpus": 1, "gpu_type": gt, "cpu": rng.choice([2, 4]), "memory_gib": rng.choice([8, 16])}
        elif r < 0.70:
            g = rng.choice([2, 4])
            spec["resources"] = {"gpus": g, "gpu_type": "A100", "cpu": 8 * g, "memory_gib": 60 * g}
        elif r < 0.85:
            spec["resources"] = {"gpus": 8, "gpu_type": "A100", "cpu": 90, "memory_gib": 600}
            spec["replicas"] = rng.choice([2, 3, 4])
            spec["spot"] = "never"
        else:
            spec["resources"] = {"cpu": rng.choice([2, 4, 8]), "memory_gib": rng.choice([4, 16, 32])}
        if rng.random() < 0.3:
            spec["data"] = {"location": rng.choice(DATA), "size_gib": rng.choice([50, 500, 2000])}
        docs.append(_doc("Job", f"job-{i:05d}", spec))
    return docs


def generate(out: Path, jobs: int, seed: int = 1, **kw) -> Path:
    out = Path(out)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    docs = fleet_docs(jobs, seed, **kw)
    head = [d for d in docs if d["kind"] != "Job"]
    body = [d for d in docs if d["kind"] == "Job"]
    (out / "fleet.yaml").write_text(yaml.safe_dump_all(head, sort_keys=False))
    for k in range(0, len(body), 500):  # several files, as a real config repo has
        (out / "jobs" / f"jobs-{k // 500:03d}.yaml").write_text(yaml.safe_dump_all(body[k:k + 500], sort_keys=False))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print(generate(a.out, a.jobs, a.seed))
