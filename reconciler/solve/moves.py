"""Moves: the items of running jobs kept that do not stay where they run, and (consolidation
WhenEmpty) the rule that nothing moves unless it must."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.problem import forced_moves

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
    anyway because the job's resources changed (it may restart elsewhere)."""
    forced = forced_moves(model.p)
    out = {}
    for dk in model.moved:
        d = model.demands[dk]
        out[dk] = forced.get(dk, 0) + sum(len(h) // d.bundle for j, h in d.running if j in d.reshaped)
    return out


def add_only_forced_moves(model: Model, m) -> None:
    """In CP-SAT model m (the model's own, or a copy of it): nothing moves unless it must."""
    limit = must_move(model)
    for dk, mv in model.moved.items():
        m.add(mv <= limit[dk])


def add_when_empty(model: Model) -> None:
    if model.p.placement.consolidation == "WhenEmpty":
        add_only_forced_moves(model, model.m)


__all__ = ["add_only_forced_moves", "add_when_empty", "moved_items", "must_move"]
