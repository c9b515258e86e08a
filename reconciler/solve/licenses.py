"""Floating licenses in the CP-SAT model: never more held than a License's count, nor more
than a tenant's quota of it. A job holds (licenses per replica x replicas) while placed, so
the rows read the `placed` counts only; which holder goes when a higher class needs the
license is the tiers' choice (running work of a higher class is held first, the victims
tier takes the least time left), as for any capacity that binds."""

from __future__ import annotations

from reconciler.cpsat import cp_model

from reconciler.ledger import license_need
from reconciler.solve.variables import wsum


def add_license_constraints(m: cp_model.CpModel, problem, placed: dict[str, object]) -> None:
    """`placed`: demand key -> jobs placed (a variable or an int)."""
    for name, lic in sorted(problem.licenses.items()):
        holders = [(d, license_need(d).get(name, 0)) for d in problem.demands]
        holders = [(d, n) for d, n in holders if n]
        if not holders:
            continue
        m.add(wsum([(n, placed[d.key]) for d, n in holders]) <= lic.count)
        for tenant, quota in sorted(lic.tenant_quotas.items()):
            mine = [(n, placed[d.key]) for d, n in holders if d.tenant == tenant]
            if mine:
                m.add(wsum(mine) <= quota)


__all__ = ["add_license_constraints"]
