"""Items: every placed job's items either stay where they run or are placed anew, and only the
running jobs kept leave items where they are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.solve.variables import wsum

if TYPE_CHECKING:
    from reconciler.solve.model import Model


def add_item_balance(model: Model) -> None:
    m, p = model.m, model.p
    # Items of a group: every placed item either stays where it runs or is placed anew.
    for gk, members in p.groups.items():
        new = [v for _, v in model.x_of_group[gk]]
        lhs = []
        for dk in members:
            d = model.demands[dk]
            lhs.append((d.replicas, model.placed[dk]))
            for _, v in model.stay_of.get(dk, []):
                lhs.append((-1, v))
        m.add(wsum(lhs) == sum(new))
    # Staying items belong to kept running jobs.
    for d in p.demands:
        stays = [v for _, v in model.stay_of.get(d.key, [])]
        if stays and d.running_jobs:
            m.add(sum(stays) <= model.kept_items(d))


__all__ = ["add_item_balance"]
