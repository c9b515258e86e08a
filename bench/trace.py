"""Fleet configs shaped like a public GPU cluster trace: a fixed cluster, and a fleet that buys.

The job shapes are the whole-GPU tasks of Alibaba's cluster-trace-gpu-v2023
(github.com/alibaba/clusterdata, cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv,
from Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23): of its 8,152 tasks, the 3,986 that ask for
whole GPUs (gpu_milli = 1000, or more than one GPU), counted by (GPUs, vCPU rounded up, GiB
rounded up) in TRACE below. They are 98.1% 1-GPU, 0.4% 2-GPU, 0.4% 4-GPU and 1.1% 8-GPU tasks
at a median of 11.3 vCPU per GPU. The 5 tasks that fit no 96-vCPU, 8-GPU node (120 vCPU) and the
one that asks for no memory are left out. Jobs are drawn from this table with random.Random(seed).

Its cluster (openb_node_list_gpu_node.csv) is mostly 8-GPU, 96-vCPU nodes (549 of its 1,213
GPU nodes): here the nodes are the catalog's 8 x A100, 96-vCPU types (gcp a2-highgpu-8g, aws
p4d.24xlarge, azure Standard_ND96asr_v4).

  fixed  one pool of a2-highgpu-8g with min_instances = max_instances (an on-prem or reserved
         cluster) holding FIXED_SHARE of the GPUs the jobs ask for: the plan chooses what runs,
         and packing decides how much of the cluster is used.
  mixed  a fixed cluster of the trace cluster's node sizes: its 1,213 GPU nodes are 617 of 8 GPUs,
         54 of 4, 518 of 2 and 24 of 1 (79.5% / 3.5% / 16.7% / 0.4% of its 6,212 GPUs). Here
         they are a2-highgpu-8g / -4g / -2g / -1g (12 vCPU per GPU each), one fixed pool per
         type holding that share of FIXED_SHARE of the GPUs asked for: packing across node
         sizes, where a CPU-heavy job on a large node can strand its GPUs.
  buy    pools of the three types in one US region per cloud, on-demand, nothing running: the
         plan chooses what to buy, and every job fits.

    python -m bench.trace OUT --mode fixed --jobs 1000 --seed 1
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import yaml

from bench.generate import API, _doc

FLEET = "trace"
# (GPUs, vCPU, memory GiB) -> tasks in openb_pod_list_default.csv (whole-GPU tasks only; see above).
TRACE: dict[tuple[int, int, int], int] = {
    (1, 12, 48): 861, (1, 12, 47): 534, (1, 4, 6): 470, (1, 19, 63): 255, (1, 10, 41): 195, (1, 12, 46): 161,
    (1, 12, 24): 158, (1, 16, 57): 158, (1, 12, 76): 116, (1, 16, 32): 108, (1, 8, 16): 105, (1, 4, 24): 104,
    (1, 12, 16): 101, (1, 15, 57): 93, (1, 25, 91): 84, (1, 8, 32): 55, (1, 12, 15): 44, (1, 9, 33): 41,
    (1, 4, 31): 40, (1, 16, 79): 36, (1, 16, 64): 33, (1, 17, 123): 27, (8, 88, 320): 18, (8, 65, 257): 18,
    (1, 12, 37): 16, (1, 1, 6): 15, (1, 7, 30): 11, (1, 16, 88): 10, (4, 33, 129): 9, (1, 4, 16): 8, (1, 12, 32): 8,
    (1, 15, 72): 8, (2, 17, 65): 7, (1, 6, 32): 6, (1, 10, 51): 6, (1, 4, 32): 5, (1, 2, 16): 5, (1, 12, 42): 4,
    (1, 16, 48): 3, (1, 12, 23): 3, (1, 16, 31): 3, (2, 6, 64): 3, (8, 64, 256): 3, (1, 2, 8): 3, (4, 32, 128): 3,
    (2, 31, 157): 3, (4, 61, 313): 3, (1, 8, 64): 2, (2, 18, 42): 2, (1, 16, 16): 2, (1, 17, 83): 2, (1, 6, 8): 1,
    (1, 8, 24): 1, (1, 9, 41): 1, (1, 6, 16): 1, (1, 12, 12): 1, (1, 4, 8): 1,
}
# Job mixes other than the trace's, in TRACE's form, that bind memory or vCPU on an 8-GPU, 96-vCPU, 680-GiB node
# (a2-highgpu-8g; every shape fits one): the probe of bench/README.md (sixteenth session), bench/explore_large.py and
# the solver's tests put one in TRACE's place.
MIXES: dict[str, dict[tuple[int, int, int], int]] = {
    "memory-heavy": {(1, 8, 120): 40, (1, 12, 150): 20, (2, 16, 200): 10, (4, 32, 400): 15, (8, 64, 640): 15},
    "10-and-16-vcpu": {(1, 10, 50): 40, (1, 16, 60): 30, (2, 20, 100): 10, (4, 40, 200): 12, (8, 80, 400): 8},
    "cpu-heavy": {(1, 20, 80): 30, (1, 22, 90): 25, (1, 24, 100): 20, (2, 24, 160): 10, (4, 48, 320): 8, (8, 96, 640): 7},
    "14-to-18-vcpu": {(1, 14, 60): 30, (1, 16, 70): 25, (1, 18, 80): 15, (2, 24, 160): 10, (4, 48, 320): 12, (8, 96, 640): 8},
}
FIXED_SHARE = 0.85  # the fixed cluster's GPUs / the GPUs the jobs ask for: not everything runs
BUY_POOLS = [("gcp", "us-central1", "a2-highgpu-8g"), ("aws", "us-east-1", "p4d.24xlarge"), ("azure", "eastus", "Standard_ND96asr_v4")]
PRIORITIES = {"low": 3, "normal": 5, "high": 2}
# openb_node_list_gpu_node.csv: GPUs per node -> the GPUs its nodes of that size hold (617 x 8, 54 x 4, 518 x 2, 24 x 1)
NODE_GPUS = {8: 4936, 4: 216, 2: 1036, 1: 24}
MIXED_TYPES = {8: "a2-highgpu-8g", 4: "a2-highgpu-4g", 2: "a2-highgpu-2g", 1: "a2-highgpu-1g"}


def jobs(n: int, seed: int) -> list[dict]:
    """n job specs drawn from the trace's whole-GPU task shapes (priority and tenant drawn too)."""
    rng = random.Random(seed)
    shapes, counts = list(TRACE), list(TRACE.values())
    out = []
    for _ in range(n):
        g, cpu, mem = rng.choices(shapes, weights=counts)[0]
        out.append({"tenant": f"team-{rng.randrange(4)}", "priority": rng.choices(list(PRIORITIES), weights=list(PRIORITIES.values()))[0],
                    "resources": {"gpus": g, "gpu_type": "A100", "cpu": cpu, "memory_gib": mem}, "spot": "never"})
    return out


def fleet_docs(n: int, seed: int = 1, mode: str = "fixed", nodes: dict[int, int] | None = None) -> list[dict]:
    """`nodes` (mode mixed): GPUs per node -> nodes of that size, instead of the trace cluster's shares."""
    if mode not in ("fixed", "mixed", "buy"):
        raise ValueError("mode is fixed, mixed or buy")
    specs = jobs(n, seed)
    gpus = sum(s["resources"]["gpus"] for s in specs)
    if mode == "fixed":
        nodes = max(1, round(gpus * FIXED_SHARE / 8))
        pools = [_doc("Pool", "cluster", {"cloud": "gcp", "region": "us-central1", "zones": ["us-central1-a"],
                                          "instance_types": ["a2-highgpu-8g"], "market": "on-demand",
                                          "min_instances": nodes, "max_instances": nodes})]
    elif mode == "mixed":
        total = sum(NODE_GPUS.values())
        pools = []
        counts = nodes or {size: max(1, round(gpus * FIXED_SHARE * held / total / size)) for size, held in NODE_GPUS.items()}
        for size, count in counts.items():
            pools.append(_doc("Pool", f"cluster-{size}g", {"cloud": "gcp", "region": "us-central1", "zones": ["us-central1-a"],
                                                          "instance_types": [MIXED_TYPES[size]], "market": "on-demand",
                                                          "min_instances": count, "max_instances": count}))
    else:
        pools = [_doc("Pool", f"{cloud}-a100", {"cloud": cloud, "region": region, "zones": [z], "instance_types": [t],
                                                "market": "on-demand", "max_instances": max(10, math.ceil(gpus / 4))})
                 for (cloud, region, t), z in zip(BUY_POOLS, ["us-central1-a", "us-east-1a", "eastus-1"])]
    clouds: dict = {}
    for p in pools:
        spec = p["spec"]
        clouds.setdefault(spec["cloud"], {"regions": {}})["regions"][spec["region"]] = {"zones": spec["zones"]}
    regions = sorted(f"{p['spec']['cloud']}/{p['spec']['region']}" for p in pools)
    return [
        _doc("Topology", FLEET, {"clouds": clouds}),
        _doc("GuardrailPolicy", "default", {"allowed_regions": regions}),
        *(_doc("Tenant", f"team-{i}", {"weight": 1.0}) for i in range(4)),
        *pools,
        *(_doc("Job", f"job-{i:05d}", s) for i, s in enumerate(specs)),
    ]


def generate(out_dir: Path, n: int, seed: int = 1, mode: str = "fixed", nodes: dict[int, int] | None = None) -> Path:
    out = Path(out_dir)
    if out.exists() and any(out.glob("**/*.yaml")):
        raise FileExistsError(f"{out} already holds YAML files; generate into an empty directory")
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    by_kind: dict[str, list[dict]] = {}
    for d in fleet_docs(n, seed, mode, nodes):
        by_kind.setdefault(d["kind"], []).append(d)

    def dump(path: Path, items: list[dict]) -> None:
        path.write_text(yaml.safe_dump_all(items, sort_keys=False, default_flow_style=None))

    dump(out / "topology.yaml", by_kind["Topology"])
    dump(out / "policies.yaml", by_kind["GuardrailPolicy"])
    dump(out / "tenants.yaml", by_kind["Tenant"])
    dump(out / "pools.yaml", by_kind["Pool"])
    body = by_kind.get("Job", [])
    for k in range(0, len(body), 500):
        dump(out / "jobs" / f"jobs-{k // 500:03d}.yaml", body[k:k + 500])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--mode", choices=["fixed", "mixed", "buy"], default="fixed")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    print(generate(a.out, a.jobs, a.seed, a.mode))


if __name__ == "__main__":
    main()


__all__ = ["API", "TRACE", "fleet_docs", "generate", "jobs"]
