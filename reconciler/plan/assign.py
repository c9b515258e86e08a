"""Phase 1 of a plan: which jobs run, and which of their items stay where they are.

The solver counts per class of identical jobs and per instance or offer; this names the jobs
(those staying first) and sends every item that does not stay to a host or an offer, to be packed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass

from reconciler.errors import SolverError
from reconciler.observe import Observed
from reconciler.problem import Capacity, Demand, Host, Problem
from reconciler.problem.rules import runs_settled

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
    from reconciler.solve import Solution

Item = tuple[Demand, str, int]  # (its class, job, replica or bundle index)


@dataclass(frozen=True)
class Assignment:
    slots: dict[str, list[str | None]]  # job -> instance id per item (None: to be packed)
    to_host: dict[str, list[Item]]  # existing instance id -> new items
    to_offer: dict[str, list[Item]]  # offer (or zone class) key -> new items


def choose_jobs(d: Demand, n: int, stay_left: dict[str, int], problem: Problem, observed: Observed) -> list[str]:
    """Which of a class's identical jobs run: those staying where they are first, then the other
    running ones (most time left first: the victims are those nearly done), then the rest in
    submission order. Of the running ones, those that may run on as they run (rules.runs_settled) before those that
    restart (a changed job): the solver counts only the settled ones as running work kept, so a changed job given
    the stay stopped the running job the count kept (j4 resized to j5's shape restarted in place, in j5's room, and
    j5 was evicted for its own tenant's new work of its class: the slow lifecycle machine, fleet110). And of those,
    its tenant's protected jobs first, then those that must move (TenantRules), on a host's stays and among the moved:
    the solver counts a protected job kept only so (objective.protected_kept). In submission order, of t1's identical
    jobs the unprotected j0 took the one move the answer kept and the guaranteed j1 was stopped (the h5 sweep)."""
    if n <= 0:
        return []
    if d.gang:
        return list(d.jobs)
    running = dict(d.running)
    settled = {j for j, ids in d.running if runs_settled(d, j, ids)}
    protected, must_move = _guaranteed(problem)

    def rank(j: str) -> tuple[bool, bool, bool]:
        return j not in settled, j not in protected, j not in must_move

    staying, moving = [], []
    left = dict(stay_left)  # (each staying job takes its host's count, as assign_items does: counted only as > 0, a
    # host whose count is 3 of the 4 jobs on it had all 4 called staying, and the 11 of 12 placed left one with no
    # room, "internal: ... no room left": the stable-run exploration, a critical job taking a low job's room)
    for j in sorted(d.jobs, key=rank):  # (stable: submission order within each)
        if j in running:
            hosts = running[j][: d.replicas] if d.bundle == 1 else running[j][:1]
            stays = 0
            for h in hosts:
                if left.get(h, 0) > 0:
                    left[h] -= 1
                    stays += 1
            (staying if stays else moving).append(j)
    moving.sort(key=lambda j: (*rank(j), -problem.job_end.get(j, 0.0), j))  # most time left first (the same order at any hour)
    rest = [j for j in d.jobs if j not in running]
    return (staying + moving + rest)[:n]


def _guaranteed(problem: Problem) -> tuple[frozenset[str], frozenset[str]]:
    """Every tenant's protected jobs and its running jobs that must move (TenantRules), made once a problem (asked per
    demand: a set per call was the tenant's every job per demand)."""
    memo = problem.__dict__.get("_guaranteed")
    if memo is None:
        memo = (frozenset(j for r in problem.tenants.values() for j in r.protected_jobs),
                frozenset(j for r in problem.tenants.values() for j in r.moving_jobs))
        object.__setattr__(problem, "_guaranteed", memo)
    return memo


def assign_items(problem: Problem, observed: Observed, solution: Solution, caps: dict[str, Capacity]) -> Assignment:
    """The solver's stay and new counts, item by item: a running item stays on its host while the
    count for that host lasts; the others go to an existing host first, then to an offer."""
    stay_left = {}
    for (dk, hk), n in solution.stay.items():
        stay_left.setdefault(dk, {})[hk] = n
    new_left = {}
    for (dk, ck), n in solution.x.items():
        new_left.setdefault(dk, {})[ck] = n
    slots: dict[str, list[str | None]] = {}
    to_host: dict[str, list[Item]] = {}
    to_offer: dict[str, list[Item]] = {}
    for d in problem.demands:
        sl = stay_left.get(d.key, {})
        jobs = choose_jobs(d, solution.placed.get(d.key, 0), sl, problem, observed)
        running = dict(d.running)
        for job in jobs:
            items: list[str | None] = [None] * d.replicas
            ran = running.get(job, ())
            for r, hk in enumerate(ran[: d.replicas] if d.bundle == 1 else ran[:1]):
                if sl.get(hk, 0) > 0:
                    sl[hk] -= 1
                    items[r] = hk
            # A gang shrunk since it was placed runs more replicas than it asks: the solver may keep those past the
            # count (its stay on their hosts), in the items left free. (Read by position alone, its stays on the third
            # host were never used and the plan stopped with "no room left": audit21 finding 3.)
            for hk in ran[d.replicas:] if d.bundle == 1 else ():
                free = next((r for r, at in enumerate(items) if at is None), None)
                if free is None:
                    break
                if sl.get(hk, 0) > 0:
                    sl[hk] -= 1
                    items[free] = hk
            for r in range(d.replicas):
                if items[r] is not None:
                    continue
                nl = new_left.get(d.key, {})
                ck = next((k for k in sorted(nl, key=lambda k: (not isinstance(caps[k], Host), k)) if nl[k] > 0), None)
                if ck is None:
                    raise SolverError(f"internal: demand {d.key} placed {len(jobs)} jobs but has no room left for {job}")
                nl[ck] -= 1
                (to_host if isinstance(caps[ck], Host) else to_offer).setdefault(ck, []).append((d, job, r))
            slots[job] = items
    return Assignment(slots, to_host, to_offer)
