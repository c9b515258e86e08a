"""Placement and provisioning in one OR-Tools CP-SAT model, solved lexicographically.

One model decides which existing instances to keep, how many new instances of each
offer to buy, which running replicas stay where they are, and how many items of each
demand group land on each capacity. Capacity is per dimension (GPUs, MIG devices,
vCPU, memory): exact on an existing instance and on each new instance of an offer whose
count is small (`slots`), aggregate on the identical instances of a large offer (the
planner packs them and adds an instance where fragmentation needs one; `pack.py`).

The package, one concern a module: `index` (aggregation: idle and zone classes, the host
index), `variables` (a value that is a CP-SAT variable or a frozen int behind one interface),
`model` (the variables, and the constraint families in order), one module per family
(`capacity` with its cuts, `slots` (per-instance rows where counts are small), `items`, `gangs`, `tenants`, `licenses`, `quotas`, `fleet_rules`,
`moves`), `objective` (the tiers and the cost), `strategy` (warm start, tiers, LP guidance,
the cost search, polish, the repair stage, the deterministic work budget), `extract` (the Solution), `parts`
(independent parts' solutions joined).

Pure: a function of the Problem.
"""

from __future__ import annotations

from reconciler.ledger import MILLI
from reconciler.problem import DIMS, rules_allow
from reconciler.solve.solution import Solution, TierReport
from reconciler.solve.strategy import GAP_LIMIT, solve
from reconciler.solve.variables import scale

__all__ = ["GAP_LIMIT", "DIMS", "MILLI", "Solution", "TierReport", "rules_allow", "scale", "solve"]
