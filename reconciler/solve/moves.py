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


def add_when_empty(model: Model) -> None:
    p = model.p
    if p.placement.consolidation != "WhenEmpty":
        return
    forced = forced_moves(p)
    for dk, mv in model.moved.items():
        d = model.demands[dk]
        # (a job whose resources changed restarts anyway: it may restart elsewhere)
        model.m.add(mv <= forced.get(dk, 0) + sum(len(h) // d.bundle for j, h in d.running if j in d.reshaped))


__all__ = ["add_when_empty", "moved_items"]
