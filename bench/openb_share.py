"""A fleet config of the GPU-sharing pods of Alibaba's cluster-trace-gpu-v2023 ("openb"), the 3,078 pods bench/openb.py
leaves out: each asks for a fraction of one GPU of any model (gpu_milli 50-950). What the project has for a fraction of
a GPU is MIG (README "Capacity and GPU topology": a pool partitions every GPU with one layout fixed at launch; no
time-sharing), so a pod becomes a MIG device where one covers its fraction and a whole GPU where none does.

Why this trace: the brief asked for cluster-trace-gpu-v2020 (PAI), whose pai_job_table and pai_task_table are Git LFS
objects over quota in github.com/alibaba/clusterdata and in every stored copy (qzweng/clusterdata-cluster-trace-gpu-
v2020-data: every part but the 2.7 MB tail of the instance table absent; geniezi/clusterdata, MyGodItsFull0fStars/
alibaba_clusterdata: LFS pointers), AcmeTrace's job CSVs are absent from its snapshot (9 and 99 MB) and Helios's are
a zip LFS object. The sharing pods are the one real fractional-GPU workload to hand.

Source: github.com/alibaba/clusterdata, cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv (commit 50a91c7c,
2023-06-05; Weng et al., USENIX ATC '23; research or study use, no licence file: bench/data/openb_share/README.md).
Excerpt bench/data/openb_share/openb_sharing_pods.csv: the sharing pods (num_gpu 1, 0 < gpu_milli < 1000) in file
order, stripes 0 and 1 of every 5th (616 each).

Conversion:
- the cluster: bench/openb's node shapes (bench/data/openb/openb_node_types.csv) as catalog types at nominal prices
  ($1/GPU + $0.04/vCPU an hour), each an elastic pool (min 0) whose max is its nodes / `node_scale`; the A100 (G2) and
  A100-80GB (G3) shapes also as two MIG pools each, [4g, 3g] and [2g, 2g, 2g, 1g] per GPU, whose max is
  `mig_share` of the instances the demand for their profiles would fill (so the plan must choose);
- a pod: the smallest A100 MIG profile whose compute slices (of 7) cover gpu_milli / 1000 (1g: up to 142, 2g: 285,
  3g: 428, 4g: 571); past 571 (7g is the whole GPU) a whole GPU. The model: A100 or A100-80GB for a MIG device, any
  whose node holds the pod for a whole GPU, drawn with weights of the model's GPUs in the trace, seeded by the pod's
  name (the trace lets the pod run on any); profile names the model's (2g.10gb on A100, 2g.20gb on A100-80GB);
- qos LS high, BE low; one tenant (the trace names no users or groups); spot never;
- day 2 (`--day 2`): stripe 0 less the quarter of it the trace deletes first, plus stripe 1's pods created after
  stripe 0's median creation: the job set a day on, for a replan against the fleet day 1's apply left.

    python -m bench.openb_share OUT [--check] [--then-day2] [--time-limit S]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
from collections import Counter
from pathlib import Path

import yaml

from bench.generate import _doc
from bench.openb import CLOUD, GPU_TYPES, NODES, REGION, ZONE, node_shapes, type_name, write_config

DATA = Path(__file__).parent / "data" / "openb_share"
PODS = DATA / "openb_sharing_pods.csv"
TENANT = "openb"
PRIORITIES = {"LS": "high", "BE": "low"}
MIG_MODELS = ("A100", "A100-80GB")
# compute slices -> the profile of that many slices with the least memory, per MIG model
PROFILES = {"A100": {1: "1g.5gb", 2: "2g.10gb", 3: "3g.20gb", 4: "4g.20gb"},
            "A100-80GB": {1: "1g.10gb", 2: "2g.20gb", 3: "3g.40gb", 4: "4g.40gb"}}
LAYOUTS = {"mig43": (4, 3), "mig2221": (2, 2, 2, 1)}  # compute slices of each device of one GPU


def slices(gpu_milli: int) -> int | None:
    """The fewest compute slices (of 7) covering the fraction, or None where only a whole GPU does (7g is one)."""
    c = math.ceil(gpu_milli * 7 / 1000)
    return c if c <= 4 else None


def read_pods(path: Path = PODS, day: int = 1) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    first = [r for r in rows if r["stripe"] == "0"]
    if day == 1:
        return first
    done = {r["name"] for r in sorted(first, key=lambda r: int(r["deletion_time"] or 10**12))[: len(first) // 4]}
    median = sorted(int(r["creation_time"]) for r in first)[len(first) // 2]
    return [r for r in first if r["name"] not in done] + [r for r in rows if r["stripe"] == "1" and int(r["creation_time"]) > median]


def jobs(pods: list[dict], shapes: dict) -> tuple[list[dict], Counter]:
    gpus_of: Counter = Counter()
    for (model, g, _, _), n in shapes.items():
        if g:
            gpus_of[GPU_TYPES[model]] += g * n
    nodes = [(GPU_TYPES[m], c, mem) for (m, g, c, mem) in shapes if g]
    out, seen = [], Counter()
    for r in pods:
        cpu, mem = int(r["cpu_milli"]) / 1000, int(r["memory_mib"]) / 1024
        pick = random.Random(r["name"])
        res: dict = {"cpu": cpu, "memory_gib": mem}
        if (c := slices(int(r["gpu_milli"]))) is not None:
            model = pick.choices(MIG_MODELS, weights=[gpus_of[m] for m in MIG_MODELS])[0]
            res.update(gpu_type=model, mig={"profile": PROFILES[model][c], "count": 1})
            seen[f"MIG {c}g"] += 1
        else:
            fits = sorted(t for t in gpus_of if any(nt == t and nc >= cpu and nm >= mem for nt, nc, nm in nodes))
            res.update(gpus=1, gpu_type=pick.choices(fits, weights=[gpus_of[t] for t in fits])[0])
            seen["whole GPU (over 4/7)"] += 1
        out.append(_doc("Job", r["name"], {"tenant": TENANT, "priority": PRIORITIES[r["qos"]], "resources": res, "spot": "never"}))
    return out, seen


def mig_layout(model: str, layout: str) -> list[str]:
    return [PROFILES[model][c] for c in LAYOUTS[layout]]


def pools(shapes: dict, body: list[dict], mig_share: float) -> list[dict]:
    """Elastic pools of every shape, and on the MIG models' shapes two MIG pools sized to mig_share of their demand."""
    want: Counter = Counter()  # (model, profile) -> devices asked
    for d in body:
        if m := d["spec"]["resources"].get("mig"):
            want[(d["spec"]["resources"]["gpu_type"], m["profile"])] += 1
    out = []
    for key, n in shapes.items():
        model, g, _, _ = key
        name = type_name(*key)
        base = {"cloud": CLOUD, "region": REGION, "zones": [ZONE], "instance_types": [name], "market": "on-demand", "min_instances": 0}
        out.append(_doc("Pool", name, {**base, "max_instances": n}))
        gt = GPU_TYPES.get(model)
        if gt in MIG_MODELS and g:
            for lay in LAYOUTS:
                profiles = mig_layout(gt, lay)
                # instances the asks for this layout's profiles would fill (the two layouts share no profile)
                need = max(want[(gt, p)] / (profiles.count(p) * g) for p in set(profiles))
                if need:
                    out.append(_doc("Pool", f"{name}-{lay}", {**base, "max_instances": max(1, math.floor(need * mig_share)),
                                                              "mig": profiles}))
    return out


def generate(out: Path, pods: Path = PODS, node_scale: int = 25, mig_share: float = 0.8, day: int = 1) -> tuple[Path, Counter]:
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; generate into an empty directory")
    shapes = {k: n for k, n in node_shapes(NODES, node_scale).items() if k[1]}  # GPU shapes: no CPU-only pod here
    body, seen = jobs(read_pods(pods, day), shapes)
    write_config(out, pools(shapes, body, mig_share), body, shapes, per_file=None)
    return out, seen


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.openb_share", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--node-scale", type=int, default=25, help="whole-GPU pools hold 1/N of each node shape (default 25)")
    ap.add_argument("--mig-share", type=float, default=0.8, help="MIG pools hold this share of their demand (default 0.8)")
    ap.add_argument("--check", action="store_true", help="then plan, check from outside, apply, plan again")
    ap.add_argument("--then-day2", action="store_true", help="with --check: then replan with day 2's jobs")
    ap.add_argument("--time-limit", type=float, default=20)
    a = ap.parse_args(argv)
    out, seen = generate(a.out, PODS, a.node_scale, a.mig_share)
    print(f"{out}: {dict(seen)}")
    if a.check:
        from bench import openb_share_check as chk

        print(json.dumps(chk.run(out, a.time_limit), indent=1))
        if a.then_day2:
            body, _ = jobs(read_pods(PODS, 2), {k: n for k, n in node_shapes(NODES, a.node_scale).items() if k[1]})
            (out / "jobs" / "jobs.yaml").write_text(yaml.safe_dump_all(body, sort_keys=False, default_flow_style=None))
            print(json.dumps(chk.run(out, a.time_limit, warm=True), indent=1))


if __name__ == "__main__":
    main()
