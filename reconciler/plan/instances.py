"""Phase 3 of a plan: the instances it creates (named, with idempotency keys) and deletes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.ledger import pool_min_ok
from reconciler.plan.packing import Packing
from reconciler.plan.types import CreateAction, DeleteAction
from reconciler.problem import Capacity, Host, Problem
from reconciler.site import Site

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools, pandas and numpy (~0.5 s of CPU)
    from reconciler.solve import Solution


def name_instances(pid: str, problem: Problem, packing: Packing, caps: dict[str, Capacity]) -> list[CreateAction]:
    """A create for every new bin with items (and every empty one a rule may have bought), keyed
    `<plan id>-<n>` so the same plan never creates one twice; the items' `where` and `gpu_of`
    in `packing` then name the instance (`+n`) or host they are on."""
    creates: list[CreateAction] = []
    refs: dict[str, str] = {}  # bin ref -> "+n"
    for ok in sorted(k for k in packing.bins_of if not isinstance(caps[k], Host)):
        for b in packing.bins_of[ok]:
            if not b.items and (b.ref.split("#")[1].startswith("r") or spare(b.cap, problem, packing.pool_count, packing.fleet, packing.prim)):
                # A repair instance left empty after a gang was taken out, or one the packer did not
                # need (it packs an offer's items tighter than the solver's count of them): buying it
                # would launch an idle instance that the next plan deletes.
                packing.pool_count[b.cap.pool] -= 1
                continue
            n = len(creates) + 1
            c = b.cap
            creates.append(CreateAction(
                ref=f"+{n}", key=f"{pid}-{n:04d}", site=Site.of(c), price=c.price,
                max_price=c.on_demand_price if c.market == "spot" else None, placement_group=b.group, reservation=c.reservation,
                price_source=c.price_source,
            ))
            refs[b.ref] = packing.named[b.ref] = f"+{n}"
    for bins in packing.bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                packing.where[(job, r)] = refs.get(b.ref, b.ref)
                packing.gpu_of[(job, r)] = tuple(b.gpu_of.get((job, r), ((),)))
    return creates


def delete_actions(problem: Problem, solution: Solution, jobs=()) -> list[DeleteAction]:
    """Every existing instance the plan does not keep, with why. `jobs`: the plan's job changes (an instance whose
    every job stops is emptied by those stops, not consolidated: fleet52's gang, grown past what the pool holds)."""
    action = {j.job: j.action for j in jobs}
    deletes = []
    for c in problem.hosts():
        if c.instance_id not in solution.keep:
            stops = bool(action) and all(action.get(job) in ("evict", "pending") for _, job, _ in c.residents)
            # (under WhenEmpty nothing moves to save money: a host goes because its jobs move or stop for the rules)
            emptied = ("emptied: every job on it stops in this plan (their reasons say why)" if stops else
                       "emptied: every job on it moves or stops in this plan (their reasons say why)"
                       if problem.placement.consolidation == "WhenEmpty" else "consolidated: its replicas fit more cheaply elsewhere")
            why = c.keep_blocker or (emptied if c.residents else "no longer needed")
            deletes.append(DeleteAction(c.instance_id, Site.of(c), c.price, why))
    return deletes


def spare(cap: Capacity, problem: Problem, pool_count: dict[str, int], fleet: dict[str, float], prim) -> bool:
    """Can an empty new instance be left out without breaking a rule that may have bought it: its
    pool's minimum, or the spot rules (an on-demand instance counts in the spot share and the
    on-demand buffer; a spot one in the spot diversity)?"""
    if not pool_min_ok(pool_count.get(cap.pool, 0) - 1, problem.pool_bounds.get(cap.pool, (0, 0))[0]):
        return False
    sp = problem.spot
    if cap.market == "spot":
        return sp.min_instance_types <= 1 and sp.min_zones <= 1
    return fleet["spot"] == 0 or prim(cap) == 0  # (a CPU instance counts nothing in a GPU fleet's spot rules)
