"""Extraction: a Solution from a solution vector of the model (idle classes unfolded onto their
hosts, each group's items shared among its demands), or from greedy's assignment."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from reconciler.greedy import Assignment
from reconciler.ledger import MILLI
from reconciler.pack import Bin, pack_items
from reconciler.problem import Host, Problem
from reconciler.solve.slots import slot_contents
from reconciler.solve.solution import Solution, TierReport
from reconciler.solve.variables import solved

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def extract(problem: Problem, model: Model, values: list[int], tiers: list[TierReport], status: str, optimal: bool,
             gap: float, t0: float) -> Solution:
    val = lambda v: solved(v, values)  # noqa: E731
    placed, stay, x, keep = placements(problem, model, values)
    x = unfold_idle(model, x, keep, val)[0]
    new = {c.key: val(model.use[c.key]) for c in model.offers if val(model.use[c.key]) > 0}
    hosts = len(model.hosts)
    frozen = sum(1 for h in model.hosts if h.frozen)
    return Solution(
        status=status, optimal=optimal, gap=gap, seconds=time.monotonic() - t0, keep=keep, new=new, stay=stay, x=x,
        placed=placed, tiers=tuple(tiers),
        work=sum(d.weight * placed[d.key] for d in problem.demands),
        cost_milli=sum(round(c.price * MILLI) * (1 if c.instance_id in keep else 0) for c in model.hosts)
        + sum(round(model.caps[k].price * MILLI) * n for k, n in new.items()),
        capacities=model.caps, scope=(hosts - frozen, frozen), variables=len(model.m.proto.variables),
        constraints=len(model.m.proto.constraints), slots=slot_contents(model, val), narrowed=model.narrowed,
    )


def placements(problem: Problem, model: Model, values: list[int]) -> tuple[dict, dict, dict, frozenset[str]]:
    """An answer's jobs placed, stays, new items per demand and capacity (an idle class's not yet unfolded onto
    its hosts) and the instances it keeps."""
    val = lambda v: solved(v, values)  # noqa: E731
    placed = {dk: val(v) for dk, v in model.placed.items()}
    stay = {k: val(v) for k, v in model.stay.items() if val(v) > 0}
    xg = {k: val(v) for k, v in model.x.items() if val(v) > 0}
    keep = frozenset([c.instance_id for c in model.hosts if c.key in model.use and val(model.use[c.key])]
                     + [h.instance_id for ik, hs in model.idle_members.items() for h in hs[:val(model.use[ik])]])
    shares = {}
    for gk, ck, dks, v in model.stand_in_shares:
        if val(v) > 0:
            shares.setdefault((gk, ck), []).append((dks, val(v)))
    return placed, stay, split_groups(problem, xg, placed, stay, shares), keep


def unfold_idle(model: Model, x: dict[tuple[str, str], int], keep: frozenset[str], val=None) -> tuple[dict[tuple[str, str], int], dict[str, list[str]]]:
    """Items placed on a class of idle hosts, packed onto its kept hosts as the planner will
    pack them (largest first), or, where the repair stage gave the class per-instance rows
    (slots.extend_idle_slots; `val` reads the answer), as those rows hold them. The class's
    capacity rows and cuts make a misfit rare; an item that does not fit is left on the first
    host, where the planner leaves its job pending rather than overcommit. Returns the items
    per (demand, host) and, per class where items did not fit, their demands, one per item, left on its first host
    (what the repair stage reads)."""
    out = {k: n for k, n in x.items() if k[1] not in model.idle}
    short: dict[str, list[str]] = {}
    for ik, hosts in model.idle_members.items():
        items = [(model.demands[dk], f"{dk}#{i}", 0, None) for (dk, ck), n in sorted(x.items()) if ck == ik for i in range(n)]
        if not items:
            continue
        if val is not None and ik in model.slots_of:
            _unfold_slots(model, ik, hosts, x, val, out)
            continue
        bins = [Bin.empty(h, h.key) for h in hosts if h.instance_id in keep] or [Bin.empty(hosts[0], hosts[0].key)]
        left = pack_items(bins, items)
        for b in bins:
            for dk, _, _ in b.items:
                out[(dk, b.ref)] = out.get((dk, b.ref), 0) + 1
        for d, *_ in left:
            out[(d.key, bins[0].ref)] = out.get((d.key, bins[0].ref), 0) + 1
        if left:
            short[ik] = [d.key for d, *_ in left]
    return out, short


def _unfold_slots(model: Model, ik: str, hosts: list[Host], x: dict[tuple[str, str], int], val, out: dict) -> None:
    """An idle class with slots: slot i is its i-th host in keep order (both are kept first to last), and takes
    the items of each group its row holds, from that group's demands in order."""
    queue: dict[str, list[str]] = {}
    for (dk, ck), n in sorted(x.items()):
        if ck == ik:
            queue.setdefault(model.group_of[dk], []).extend([dk] * n)
    for (gk, ck, ok, i), v in sorted(model.z.items()):
        if ok != ik or ck != ik or not (n := val(v)):
            continue
        q = queue.get(gk, [])
        for dk in q[:n]:
            out[(dk, hosts[i].key)] = out.get((dk, hosts[i].key), 0) + 1
        del q[:n]


def split_groups(problem: Problem, xg: dict[tuple[str, str], int], placed: dict[str, int], stay: dict[tuple[str, str], int],
                 shares: dict[tuple[str, str], list[tuple[tuple[str, ...], int]]] | None = None) -> dict[tuple[str, str], int]:
    """Share each group's new items per capacity among its demands: each demand gets what it
    placed minus what stays. First the items the model counted as a tenant's higher work taking its lower work's room
    (`shares`: (group, host) -> (those demands, items): objective.stand_in_room), to those demands, the highest class
    first: in member order alone, t2's high job landed where t3's normal job was evicted and t3's where t2's was, each
    tenant's guaranteed room taken by the other, and the plan gave way (bench's kept fixed cluster)."""
    staying: dict[str, int] = {}
    for (dk, _), n in stay.items():
        staying[dk] = staying.get(dk, 0) + n
    need = {d.key: placed.get(d.key, 0) * d.replicas - staying.get(d.key, 0) for d in problem.demands}
    out: dict[tuple[str, str], int] = {}
    left = dict(xg)
    for (gk, ck), owed in sorted((shares or {}).items()):
        for dks, n in owed:
            for dk in sorted(dks, key=lambda k: -problem.demand(k).klass):
                take = min(need[dk], n, left.get((gk, ck), 0))
                if take > 0:
                    out[(dk, ck)] = out.get((dk, ck), 0) + take
                    need[dk] -= take
                    n -= take
                    left[(gk, ck)] -= take
    cells_of: dict[str, list[tuple[str, int]]] = {}
    for (gk, ck), n in sorted(left.items()):
        cells_of.setdefault(gk, []).append((ck, n))
    for gk, members in problem.groups.items():
        for ck, n in cells_of.get(gk, []):
            for dk in members:
                take = min(need[dk], n)
                if take > 0:
                    out[(dk, ck)] = out.get((dk, ck), 0) + take
                    need[dk] -= take
                    n -= take
    return out


def from_assignment(problem: Problem, a: Assignment, status: str, t0: float, note: str = "") -> Solution:
    caps = {c.key: c for c in problem.capacities}
    keep = frozenset(h.instance_id for h in problem.hosts() if a.use.get(h.key, 0))
    new = {k: n for k, n in a.use.items() if n and not isinstance(caps[k], Host)}
    return Solution(
        status=status, optimal=False, gap=1.0, seconds=time.monotonic() - t0, keep=keep, new=new,
        stay={k: n for k, n in a.stay.items() if n}, x={k: n for k, n in a.x.items() if n}, placed=dict(a.placed),
        work=sum(d.weight * a.placed.get(d.key, 0) for d in problem.demands),
        cost_milli=round(a.cost * MILLI), capacities=caps,
        scope=(sum(1 for h in problem.hosts() if not h.frozen), sum(1 for h in problem.hosts() if h.frozen)),
        note=note,
    )


__all__ = ["extract", "from_assignment", "placements", "split_groups", "unfold_idle"]
