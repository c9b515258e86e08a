"""Independent parts' solutions as one: placements and instances joined, tiers summed (proven
where every part's is), the cost and its bound summed, the gap the worst part's. Greedy best-fit's answer
(GREEDY_FALLBACK) only where every part fell back to it; where some did, CP-SAT's answer of the others,
FEASIBLE, with no tiers (a part that fell back measured none: a sum without it is no claim about the plan)."""

from __future__ import annotations

import time

from reconciler.ledger import MILLI
from reconciler.problem import Host
from reconciler.solve.solution import Solution, TierReport


def merge_parts(sols: list[Solution], t0: float, with_lp_bound: bool) -> Solution:
    """`t0`: when solving the parts began (the merged answer's seconds count from it)."""
    tiers: dict[str, TierReport] = {}
    fell = [s for s in sols if s.status == "GREEDY_FALLBACK"]
    for s in sols if not fell else ():
        for t in s.tiers:
            prev = tiers.get(t.name)
            if prev is None or prev.status == t.status:
                status = t.status
            elif prev.proven and t.proven:
                status = "OPTIMAL"  # each part's best: so is their sum
            elif "BELOW_GREEDY" in (prev.status, t.status):
                status = "BELOW_GREEDY"  # (a part's value below its warm start's: the sum is not claimed at least greedy's)
            else:
                status = "UNKNOWN" if "UNKNOWN" in (prev.status, t.status) else "FEASIBLE"
            bound = None if t.bound is None or (prev is not None and prev.bound is None) else t.bound + (prev.bound if prev else 0)
            tiers[t.name] = TierReport(t.name, t.sense, t.value + (prev.value if prev else 0), bound, status, t.seconds + (prev.seconds if prev else 0))
    statuses = {s.status for s in sols}
    status = "GREEDY_FALLBACK" if statuses == {"GREEDY_FALLBACK"} else ("OPTIMAL" if statuses == {"OPTIMAL"} else "FEASIBLE")
    note = f"solved as {len(sols)} independent parts"
    if fell:
        why = "; ".join(sorted({s.note for s in fell if s.note}))
        note += f", {len(fell)} of them greedy best-fit's" + (f" ({why})" if why else "")
    cost = sum(s.cost_milli for s in sols)
    phases: dict[str, float] = {}
    for s in sols:
        for k, v in s.phases.items():
            phases[k] = round(phases.get(k, 0.0) + v, 3)
    return Solution(
        status=status, optimal=all(s.optimal for s in sols), gap=max(s.gap for s in sols), seconds=time.monotonic() - t0,
        keep=frozenset().union(*(s.keep for s in sols)), new={k: v for s in sols for k, v in s.new.items()},
        stay={k: v for s in sols for k, v in s.stay.items()}, x={k: v for s in sols for k, v in s.x.items()},
        placed={k: v for s in sols for k, v in s.placed.items()},
        tiers=tuple(tiers.values()), work=sum(s.work for s in sols), cost_milli=cost,
        capacities={k: v for s in sols for k, v in s.capacities.items()},
        scope=(sum(s.scope[0] for s in sols), sum(s.scope[1] for s in sols)), variables=sum(s.variables for s in sols),
        constraints=sum(s.constraints for s in sols), note=note,
        lp_bound=sum(s.lp_bound for s in sols) if with_lp_bound and all(s.lp_bound is not None for s in sols) else None,
        int_bound=sum(s.int_bound for s in sols) if with_lp_bound and all(s.int_bound is not None for s in sols) else None,
        phases=phases, work_spent=round(sum(s.work_spent for s in sols), 3),
        cost_value=_cost_value(sols, lambda s: s.cost_value),
        cost_bound=None if any(s.cost_bound is None for s in sols) else sum(s.cost_bound for s in sols),
        stay_value=_stay_value(sols), consolidated=any(s.consolidated for s in sols), room_jobs=sum(s.room_jobs for s in sols),
        moves_measured=frozenset(k for s in sols if s.status != "GREEDY_FALLBACK" for k in _demands(s)) if fell else None,
        slots={k: v for s in sols for k, v in s.slots.items()},
        narrowed=sum(s.narrowed for s in sols), greedy_parts=len(fell) if len(fell) < len(sols) else 0,
    )


def _stay_value(sols: list[Solution]) -> float | None:
    """The parts' cost had only what must move moved: a part that moves no more than that counts as it is."""
    if all(s.stay_value is None for s in sols):
        return None
    return _cost_value(sols, lambda s: s.stay_value if s.stay_value is not None else s.cost_value)


def _cost_value(sols: list[Solution], of) -> float | None:
    """The parts' cost objective (`of` a part: its cost_value or stay_value). A part greedy best-fit answered measured
    none; it counts its instances at their price in both (`_priced`), which its moves, no consolidation's (Solution.
    moves_measured), leave alike: their difference, what the consolidation saves (plan.quality.consolidation), is the
    other parts'. (It was none: a consolidation in a CP-SAT part said "the saving was not measured".)"""
    if all(s.status == "GREEDY_FALLBACK" for s in sols):
        return None  # (greedy best-fit's whole answer: no cost measured, as where it was solved in one)
    values = [_priced(s) if s.status == "GREEDY_FALLBACK" else of(s) for s in sols]
    return None if any(v is None for v in values) else sum(values)


def _priced(s: Solution) -> float:
    """An answer's instances at their price, as the cost objective counts them (plan.quality.emitted_cost)."""
    hosts = {c.instance_id: c for c in s.capacities.values() if isinstance(c, Host)}
    return sum(round(hosts[h].price * MILLI) for h in s.keep if h in hosts) + \
        sum((round(s.capacities[k].price * MILLI) + 1) * n for k, n in s.new.items() if k in s.capacities)


def _demands(s: Solution) -> set[str]:
    return set(s.placed) | {k for k, _ in s.stay} | {k for k, _ in s.x}


__all__ = ["merge_parts"]
