"""Moves: the items of running jobs kept that do not stay where they run, and (consolidation
WhenEmpty) the rule that nothing moves unless it must."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.problem import runs_settled

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def moved_items(model: Model) -> dict[str, object]:
    """Demand key -> its moved items (an expression: kept items less those that stay), for running demands."""
    moved: dict[str, object] = {}
    for d in model.p.demands:
        if not d.running_jobs:
            continue
        stays = [v for _, v in model.stay_of.get(d.key, [])]
        moved[d.key] = model.kept_items(d) - sum(stays)
    return moved


def must_move(model: Model) -> dict[str, int]:
    """Demand key -> the items that move whatever is decided: forced off their instance, or restarted
    anyway because the job's resources changed or a gang runs other replicas than it asks (grown, or short of a
    reclaimed one: rules.runs_settled), so it may restart elsewhere. (A grown gang's move counted as one for other
    work held it where it could not grow, and it was stopped where greedy moved it.)"""
    out = {}
    for dk in model.moved:
        d = model.demands[dk]
        out[dk] = model.forced.get(dk, 0) + sum(len(h) // d.bundle for j, h in d.running if not runs_settled(d, j, h))
    return out


def licensed(model: Model) -> dict[str, int | None]:
    """Demand key -> the items a rule moves (must_move), or None where any may move: the fleet as it runs (or without
    what must go) breaks a fleet-wide rule, or the demand's tenant breaks one of its own (ceiling, budget, spot
    share), so something must give and the tiers say what (as they say what is evicted: tests/invariants.py
    check_stability). (A tenant over its spot share on a spot host: its CPU job moving onto on-demand room is what
    keeps it running; counted as a move for other work, the job stayed, another job took the share's room and a
    low gang went pending: a plan below greedy's.)"""
    from reconciler.ledger import licensed_by, rules_broken_now

    limit: dict[str, int | None] = dict(must_move(model))
    if not limit:
        return limit
    tenants = licensed_by(rules_broken_now(model.p))
    if tenants is None:
        return dict.fromkeys(limit)
    for dk in limit:
        if model.demands[dk].tenant in tenants:
            limit[dk] = None
    return limit


def add_only_forced_moves(model: Model, m) -> None:
    """In CP-SAT model m (the model's own, or a copy of it): nothing moves unless it must."""
    limit = must_move(model)
    for dk, mv in model.moved.items():
        m.add(mv <= limit[dk])


def add_when_empty(model: Model) -> None:
    """Consolidation WhenEmpty: nothing moves but what must (`must_move`), unless a rule the fleet breaks now licenses
    it (`licensed`: a fleet-wide rule, or the demand's tenant's own), as it licenses an eviction: something must give,
    and a move is kinder. Held to the forced moves, a pool over its max_instances could only lose an instance with its
    jobs: CP-SAT evicted a running normal job greedy moved beside the low ones, "OPTIMAL" (fleet48)."""
    if model.p.placement.consolidation == "WhenEmpty":
        limit = model.licensed
        for dk, mv in model.moved.items():
            if limit.get(dk, 0) is not None:
                model.m.add(mv <= limit[dk])


__all__ = ["add_only_forced_moves", "add_when_empty", "licensed", "moved_items", "must_move"]
