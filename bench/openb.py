"""A fleet config converted from Alibaba's cluster-trace-gpu-v2023 ("openb"): its heterogeneous cluster as fixed pools,
its pods as jobs, GPU types and GPU-type constraints included.

Source: github.com/alibaba/clusterdata, cluster-trace-gpu-v2023 (commit 50a91c7c, 2023-06-05; Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23). The repository
gives no licence for this trace; its README lets anyone use the traces "for research or study purpose". Excerpts in
bench/data/openb/ (read 2026-12-03):

  openb_node_types.csv     csv/openb_node_list_all_node.csv counted by (model, GPUs, cpu_milli, memory_mib): 1,523
                           nodes in 27 shapes, 310 of them CPU-only
  openb_pods_every5th.csv  every 5th of the 5,072 pods of csv/openb_pod_list_gpuspec33.csv (the default pod list with
                           the gpu_spec constraints of 33% of GPU pods) this converter keeps: 1,015 pods

Conversion:
- each node shape is a catalog type of that shape (GPUs, vCPU, GiB) in a test catalog pinned beside the config
  (catalog.json: the shipped catalog plus these types, nominal prices $1/GPU + $0.04/vCPU an hour, not a cloud's), in
  gcp us-central1-a, one fixed pool of it (min = max = its nodes / `node_scale`, at least 1);
- GPU models to the nearest catalog GPU type: T4, A10 as they are; V100M16, V100M32 and P100 (not in the catalog) to
  V100; G2 and G3 (undisclosed internal codes) by node shape: G2 (8 GPUs, 96 vCPU) to A100, G3 (8 GPUs, 128 vCPU,
  768 GiB) to A100-80GB;
- pods asking for whole GPUs, and CPU-only pods, are jobs of one tenant; qos LS is high, Burstable and Guaranteed
  normal, BE low; spot never;
- left out: the 3,078 GPU-sharing pods (num_gpu 1, gpu_milli < 1000: time-shared fractions of any model, which no MIG
  layout of a pool fixed at launch reproduces), the one pod asking for no memory, and the one that fits no node of its
  allowed GPU types;
- a job names one gpu_type, the trace's pods any of several (gpu_spec `P100|V100M16|V100M32`) or none: each gets one of
  the allowed types that has a node it fits, drawn with weights of that type's GPUs in the cluster, seeded by the
  pod's name (2,576 of the 3,984 GPU jobs narrowed so). That is stricter than the trace: an exact packing of the
  trace's own constraints may place more.

    python -m bench.openb OUT [--pods FULL.csv --nodes-scale 1]   # default: the excerpt on a cluster of 1/5 the nodes
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from collections import Counter
from pathlib import Path

import yaml

from bench.generate import _doc
from providers.catalog import shipped_catalog_text

DATA = Path(__file__).parent / "data" / "openb"
NODES = DATA / "openb_node_types.csv"
PODS = DATA / "openb_pods_every5th.csv"
GPU_TYPES = {"T4": "T4", "A10": "A10", "V100M16": "V100", "V100M32": "V100", "P100": "V100", "G2": "A100", "G3": "A100-80GB"}
PRIORITIES = {"LS": "high", "Burstable": "normal", "Guaranteed": "normal", "BE": "low"}
CLOUD, REGION, ZONE = "gcp", "us-central1", "us-central1-a"
TENANT = "openb"
PRICE_SOURCE = "openb-test"


def node_shapes(path: Path = NODES, node_scale: int = 5) -> dict[tuple[str, int, float, float], int]:
    """(trace model, GPUs, vCPU, GiB) -> nodes (divided by node_scale, at least 1)."""
    out: Counter = Counter()
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out[(r["model"], int(r["gpu"]), int(r["cpu_milli"]) // 1000, int(r["memory_mib"]) / 1024)] += int(r["nodes"])
    return {k: max(1, round(n / node_scale)) for k, n in sorted(out.items())}


def type_name(model: str, gpus: int, cpu: int, mem: float) -> str:
    return f"openb-{(model or 'cpu').lower()}-{gpus}g-{cpu}c-{int(mem)}m"


def jobs(pods: Path, shapes: dict[tuple[str, int, float, float], int]) -> tuple[list[dict], Counter]:
    """Job docs from pod rows, and what was left out or narrowed, counted."""
    gpus_of = Counter()
    for (model, g, _, _), n in shapes.items():
        if g:
            gpus_of[GPU_TYPES[model]] += g * n
    nodes = [(GPU_TYPES[m], g, c, mem) for (m, g, c, mem) in shapes if g]
    seen, out = Counter(), []
    with open(pods, newline="") as f:
        for r in csv.DictReader(f):
            g, cpu, mem = int(r["num_gpu"]), int(r["cpu_milli"]) / 1000, int(r["memory_mib"]) / 1024
            if g == 1 and 0 < int(r["gpu_milli"]) < 1000:
                seen["GPU-sharing, left out"] += 1
                continue
            if mem == 0:
                seen["no memory asked, left out"] += 1
                continue
            res: dict = {"gpus": g, "cpu": cpu, "memory_gib": mem}
            if g:
                allowed = {GPU_TYPES[s] for s in r["gpu_spec"].split("|")} if r["gpu_spec"] else set(gpus_of)
                fits = sorted(t for t in allowed if any(nt == t and ng >= g and nc >= cpu and nm >= mem for nt, ng, nc, nm in nodes))
                if not fits:
                    seen["fits no node of its GPU types, left out"] += 1
                    continue
                res["gpu_type"] = random.Random(r["name"]).choices(fits, weights=[gpus_of[t] for t in fits])[0]
                seen["GPU, one of several types" if len(allowed) > 1 else "GPU, one type"] += 1
            else:
                seen["CPU-only"] += 1
            out.append(_doc("Job", r["name"], {"tenant": TENANT, "priority": PRIORITIES[r["qos"]], "resources": res, "spot": "never"}))
    return out, seen


def catalog(shapes: dict) -> dict:
    """The shipped catalog plus a type of each node shape (test types: nominal prices)."""
    cat = json.loads(shipped_catalog_text())
    cat["sources"][PRICE_SOURCE] = {"date": "2023-06-05", "what": "test types of the node shapes of alibaba/clusterdata "
                                    "cluster-trace-gpu-v2023 (openb_node_list_all_node.csv); nominal prices, not a cloud's"}
    types = cat["clouds"][CLOUD]["instance_types"]
    for model, g, c, m in shapes:
        t = {"gpus": g, "cpu": c, "memory_gib": m, "prices": {REGION: {"on_demand": round(1.0 * g + 0.04 * c, 4), "source": PRICE_SOURCE}}}
        if g:
            t.update(gpu_type=GPU_TYPES[model], nvlink_domain=1)
        types[type_name(model, g, c, m)] = t
    return cat


def generate(out: Path, pods: Path = PODS, nodes: Path = NODES, node_scale: int = 5) -> tuple[Path, Counter]:
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; generate into an empty directory")
    shapes = node_shapes(nodes, node_scale)
    body, seen = jobs(pods, shapes)
    pools = [_doc("Pool", type_name(*k), {"cloud": CLOUD, "region": REGION, "zones": [ZONE], "instance_types": [type_name(*k)],
                                         "market": "on-demand", "min_instances": n, "max_instances": n}) for k, n in shapes.items()]
    write_config(out, pools, body, shapes)
    return out, seen


def write_config(out: Path, pools: list[dict], body: list[dict], shapes: dict, per_file: int | None = 500) -> None:
    """The config of a converted openb trace (one cloud, region, zone and tenant): topology, policy, tenant, `pools`,
    the jobs `body` in files of `per_file` (None: all in jobs/jobs.yaml, which bench.openb_share's day 2 rewrites), and
    the catalog of the node `shapes`."""
    (out / "jobs").mkdir(parents=True, exist_ok=True)

    def dump(path: Path, items: list[dict]) -> None:
        path.write_text(yaml.safe_dump_all(items, sort_keys=False, default_flow_style=None))

    dump(out / "topology.yaml", [_doc("Topology", TENANT, {"clouds": {CLOUD: {"regions": {REGION: {"zones": [ZONE]}}}}})])
    dump(out / "policies.yaml", [_doc("GuardrailPolicy", "default", {"allowed_regions": [f"{CLOUD}/{REGION}"]})])
    dump(out / "tenants.yaml", [_doc("Tenant", TENANT, {"weight": 1.0})])
    dump(out / "pools.yaml", pools)
    if per_file is None:
        dump(out / "jobs" / "jobs.yaml", body)
    else:
        for k in range(0, len(body), per_file):
            dump(out / "jobs" / f"jobs-{k // per_file:03d}.yaml", body[k:k + per_file])
    (out / "catalog.json").write_text(json.dumps(catalog(shapes), indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.openb", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pods", type=Path, default=PODS, help="a pod list in the trace's CSV form (default: the excerpt)")
    ap.add_argument("--nodes-scale", type=int, default=5, help="pools hold 1/N of each node shape's nodes (default 5)")
    a = ap.parse_args(argv)
    out, seen = generate(a.out, a.pods, NODES, a.nodes_scale)
    print(f"{out}: {dict(seen)}")


if __name__ == "__main__":
    main()
