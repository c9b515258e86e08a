"""Independent parts of a problem (problem.components) solved in parallel worker processes.

Each part's work budget is fixed before any part starts (by its size), and CP-SAT's search is
bounded by deterministic work, so a part's answer is the same in a worker as in this process:
the merged plan does not depend on how many workers ran or how fast. Workers are forked from a
forkserver that has imported the solver once (a fork of this process could inherit a lock held
by another thread); a part's wall-clock safety cap is the caller's deadline.

The same split runs on a cluster with any task engine (bench/README.md: one task per part).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

# A part smaller than this (demands + capacities) is solved in this process: starting a worker
# (a fork of the forkserver, the problem pickled both ways) costs more than it would save.
MIN_PART = 1_000
ENV_PROCESSES = "FLEETOPS_SOLVE_PROCESSES"  # at most this many workers; 0 or 1: all parts in this process


def processes_for(sizes: list[int]) -> int:
    """How many worker processes to use for parts of these sizes (<= 1: none)."""
    from providers.settings import count

    cap = count(ENV_PROCESSES)
    if cap is None:
        cap = len(os.sched_getaffinity(0))
    big = sum(1 for s in sizes if s >= MIN_PART)
    return min(cap, big) if big > 1 else 1


def _solve_part(args: tuple):
    from reconciler.solve import strategy as s

    part, share, workers, seed, with_lp_bound, gap_limit, deadline = args
    clock = s.Work(deadline)
    try:
        return s.solve_one(part, share, workers, seed, with_lp_bound, gap_limit, clock), clock.used
    except s.WallCap:
        return None, clock.used


def solve_in_workers(parts: list, shares: list[float], processes: int, workers, seed: int, with_lp_bound: bool,
                     gap_limit: float, clock) -> list:
    """The parts' solutions, in the parts' order, solved by `processes` workers; raises the
    solver's wall-cap exception if any part hit it (as the in-process loop would)."""
    import multiprocessing

    from reconciler.solve import strategy as s

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["reconciler.solve"])
    jobs = [(q, shares[i], workers, seed, with_lp_bound, gap_limit, clock.deadline) for i, q in enumerate(parts)]
    with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
        results = list(pool.map(_solve_part, jobs))
    clock.used += sum(used for _, used in results)
    if any(sol is None for sol, _ in results):
        raise s.WallCap
    return [sol for sol, _ in results]
