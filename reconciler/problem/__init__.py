"""Turn desired + observed state into the solver's problem: demands, capacity, rules.

Pure. Equivalence classes keep the model small: identical single-replica jobs are
one Demand with a count; new instances of one (pool, zone, type, market) are one
offer with a count; demands that no rule tells apart share placement variables
(a `group`). Existing instances are individual hosts with their residents. On a
large fleet, hosts that no decision can change are frozen (freeze.py): the
solver treats them as constants, so a drift plan over 10k instances solves only
the part of the fleet that moved.

types (the frozen data), rules (what may go where, who may take whose capacity), demands, capacity,
tenants, freeze, build (build_problem) and decompose (components). Every name other modules use is
re-exported here: `from reconciler.problem import X`.
"""

from reconciler.problem.build import build_problem, parse_time
from reconciler.problem.capacity import active_reservations, price_label
from reconciler.problem.decompose import components
from reconciler.problem.demands import SHAPE_FIELDS, as_utc, effective_priority, shape_changes, shape_of
from reconciler.problem.freeze import FREEZE_ABOVE
from reconciler.problem.rules import (OfferFits, Rival, borrowing_tenants, borrows, cannot_stay, fit, fit_shape, forced_moves, gang_split, has_room, may_preempt,
                                      outside_group, over_cap_tenants, placement_refusal, pools_over_max, quota_shedding, refuses, rules_allow, runs_settled, settled_jobs, stuck_gangs, wants_room)
from reconciler.problem.tenants import held_once_applied
from reconciler.problem.types import DIMS, Capacity, Demand, Host, Offer, Problem, TenantRules, priority_band, priority_class, share, spot_measure, type_class

__all__ = ["build_problem", "parse_time", "active_reservations", "price_label", "components", "SHAPE_FIELDS", "as_utc", "effective_priority", "shape_changes", "shape_of",
           "FREEZE_ABOVE", "OfferFits", "Rival", "borrowing_tenants", "borrows", "cannot_stay", "fit", "fit_shape", "forced_moves", "gang_split", "has_room",
           "may_preempt", "outside_group", "over_cap_tenants", "placement_refusal", "pools_over_max", "quota_shedding", "refuses", "rules_allow", "runs_settled", "settled_jobs", "stuck_gangs", "wants_room", "DIMS", "Capacity", "Demand", "Host", "Offer", "Problem",
           "TenantRules", "held_once_applied", "priority_band", "priority_class", "share", "spot_measure", "type_class"]
