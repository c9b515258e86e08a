"""Phase 3 of a plan: the instances it creates (named, with idempotency keys) and deletes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.ledger import pool_min_ok, rules_broken_now, spot_share_ok
from reconciler.pack import Bin
from reconciler.plan.packing import Packing
from reconciler.plan.types import CreateAction, DeleteAction
from reconciler.problem import Capacity, Host, Problem
from reconciler.site import Site

if TYPE_CHECKING:  # annotations only: importing the solver pulls ortools and numpy (~0.2 s of CPU; pandas no more: reconciler/cpsat.py)
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
                packing.fleet["all"] -= packing.prim(b.cap)  # (the spot rules of the next one read the fleet without it)
                if b.cap.market == "spot":
                    packing.fleet["spot"] -= packing.prim(b.cap)
                continue
            creates.append(create_action(pid, len(creates) + 1, b))
            refs[b.ref] = packing.named[b.ref] = creates[-1].ref
    for bins in packing.bins_of.values():
        for b in bins:
            for _, job, r in b.items:
                packing.where[(job, r)] = refs.get(b.ref, b.ref)
                packing.gpu_of[(job, r)] = tuple(b.gpu_of.get((job, r), ((),)))
    return creates


def create_action(pid: str, n: int, b: Bin) -> CreateAction:
    """The plan's n-th create, for new bin b: keyed `<plan id>-<n>` so the same plan never creates it twice."""
    c = b.cap
    return CreateAction(
        ref=f"+{n}", key=f"{pid}-{n:04d}", site=Site.of(c), price=c.price,
        max_price=c.on_demand_price if c.market == "spot" else None, placement_group=b.group, reservation=c.reservation,
        price_source=c.price_source,
    )


def delete_actions(problem: Problem, solution: Solution, jobs=()) -> list[DeleteAction]:
    """Every existing instance the plan does not keep, with why: the rule that makes it go (its own, or its pool past
    max_instances), else what its jobs do. `jobs`: the plan's job changes (an instance whose every job stops is
    emptied by those stops, not consolidated: fleet52's gang, grown past what the pool holds); it is "consolidated"
    only where every job leaving it moves for a consolidation (their reasons: plan/jobs.move_note). (Instances of a
    pool past its max_instances, or emptied for a higher class's room, read "consolidated" at $/h more: audit.)"""
    change = {j.job: j for j in jobs}
    broken = rules_broken_now(problem) if any(c.instance_id not in solution.keep for c in problem.hosts()) else {}
    deletes = []
    for c in problem.hosts():
        if c.instance_id not in solution.keep:
            mine = [change[job] for _, job, _ in c.residents if job in change]
            stops = bool(change) and all(j.action in ("evict", "pending") for j in mine)
            over = broken.get(f"pool:{c.pool}")
            if not c.residents:
                emptied = "no longer needed"
            elif stops:
                emptied = "emptied: every job on it stops in this plan (their reasons say why)"
            elif over:
                emptied = f"{over} {problem.pool_bounds[c.pool][1]}"
            elif mine and all(j.reason.startswith("consolidation") for j in mine if j.action not in ("evict", "pending")):
                emptied = "consolidated: its replicas fit more cheaply elsewhere"
            else:
                emptied = "emptied: every job on it moves or stops in this plan (their reasons say why)"
            deletes.append(DeleteAction(c.instance_id, Site.of(c), c.price, c.keep_blocker or emptied))
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
    if fleet["spot"] == 0 or prim(cap) == 0:  # (a CPU instance counts nothing in a GPU fleet's spot rules)
        return True
    # An idle on-demand instance the spot share holds without: kept, it was launched and the next plan deleted it as
    # "no longer needed" (a 142-job fleet: 24 spot GPUs of 100 with it, 99 without, under max_spot_fraction 0.25). The
    # on-demand buffer counts idle on-demand capacity, so under one it stays.
    return sp.on_demand_buffer_percent <= 0 and spot_share_ok(fleet["spot"], fleet["all"] - prim(cap), sp.max_spot_fraction)
