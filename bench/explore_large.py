"""An exploration, not a benchmark: large fixed clusters (one pool, or the trace cluster's node sizes with an 8-GPU
pool of at least 130 nodes: past the 128 modelled one by one, so counted by pattern, reconciler/solve/patterns.py)
of 800-1,600 jobs of the job mixes that bound memory or vCPU (the probe of bench/README.md, sixteenth session). As
bench/explore_mixed.py: each planned, checked against every rule and apply's re-check, applied and planned again (a
no-op expected); then one edit and the same again. One line per fleet; fleet i is seeded by i. --keep DIR keeps each
edited fleet for bench.replan.

    python -m bench.explore_large N [START] [--keep DIR]
"""
from __future__ import annotations

import os
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("FLEETOPS_SIM_AGENTS", "0")  # (before the sim is imported: no node agents)

import bench.trace  # noqa: E402
from bench.explore_mixed import explore, options  # noqa: E402

MIXES = bench.trace.MIXES


def fleet(i: int) -> tuple[str, str, int, dict[int, int] | None, random.Random]:
    """Fleet i's mix, mode, job count, node counts per GPU size (mixed; None: one fixed pool) and the generator its
    edit draws from."""
    rng = random.Random(1000 + i)
    name = rng.choice(sorted(MIXES))
    jobs = rng.randrange(800, 1600)
    mode = rng.choice(["fixed", "mixed"])
    nodes = None
    if mode == "mixed":
        gpus = jobs * 1.6 * rng.uniform(0.5, 1.0)
        nodes = {8: max(130, round(gpus * rng.uniform(0.5, 0.8) / 8)), 4: rng.randrange(0, 20), 2: rng.randrange(0, 150),
                 1: rng.randrange(0, 40)}
        nodes = {k: v for k, v in nodes.items() if v}
    return name, mode, jobs, nodes, rng


def generated(d: Path, name: str, mode: str, jobs: int, i: int, nodes: dict[int, int] | None) -> Path:
    """The config of fleet i: bench.trace's generator with the mix's shapes in place of the trace's."""
    trace = bench.trace.TRACE
    bench.trace.TRACE = MIXES[name]
    try:
        return bench.trace.generate(d / "c", jobs, i, mode, **({"nodes": nodes} if nodes else {}))
    finally:
        bench.trace.TRACE = trace


def main(argv: list[str]) -> None:
    n, start, keep = options(argv)
    for i in range(start, start + n):
        name, mode, jobs, nodes, rng = fleet(i)
        with tempfile.TemporaryDirectory() as d:
            explore(i, f"{name} {mode} {jobs} jobs", lambda: generated(Path(d), name, mode, jobs, i, nodes), rng, keep)


if __name__ == "__main__":
    main(sys.argv[1:])
