"""What the solver answers: the placements and instances of a plan, and how good they are
(each objective tier's value, its bound and whether it is proven; the cost's gap)."""

from __future__ import annotations

from dataclasses import dataclass, field

from reconciler.problem import Capacity


@dataclass(frozen=True)
class TierReport:
    name: str
    sense: str  # max | min
    value: int
    bound: float | None  # the best value possible (None: not computed)
    # HELD (the warm start already reached its bound) | OPTIMAL | FEASIBLE | UNKNOWN | BELOW_GREEDY (below the warm
    # start's value: the repair stage's answer gave it up for a tier ranked above, strategy.searched_again); in a plan, also
    # KEPT_SHORT (the plan keeps less than the solver counted: plan.quality.as_kept)
    status: str
    seconds: float

    @property
    def proven(self) -> bool:
        """Its value is the best possible (held at a bound, or searched to optimality); a
        FEASIBLE or UNKNOWN tier holds at least the warm start's value, which may not be the best."""
        return self.status in ("HELD", "OPTIMAL")


@dataclass(frozen=True)
class Solution:
    status: str  # OPTIMAL | FEASIBLE | GREEDY_FALLBACK
    optimal: bool
    gap: float  # relative gap of the cost stage (0 when optimal)
    seconds: float
    keep: frozenset[str]  # existing instance ids kept
    new: dict[str, int]  # offer key -> instances to create
    stay: dict[tuple[str, str], int]  # (demand key, instance id) -> items that stay where they run
    x: dict[tuple[str, str], int]  # (demand key, capacity key) -> items newly placed there
    placed: dict[str, int]  # demand key -> jobs placed
    tiers: tuple[TierReport, ...] = ()
    work: int = 0
    cost_milli: int = 0
    capacities: dict[str, Capacity] = field(default_factory=dict)
    scope: tuple[int, int] = (0, 0)  # hosts solved, hosts frozen
    variables: int = 0
    constraints: int = 0
    note: str = ""
    lp_bound: float | None = None  # USD/h: the LP relaxation's least instance cost at the same tiers (if asked)
    int_bound: float | None = None  # USD/h: a proven bound on it with whole instances per offer (CP-SAT; if asked)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per solver phase, for the benchmark
    work_spent: float = 0.0  # CP-SAT deterministic seconds spent (the limit is --time-limit of them)
    # The cost objective (milli-dollars: instances, egress, latency, moves) of this answer, and a
    # proven lower bound on it at the tiers reached (the LP's or CP-SAT's): the plan re-measures
    # its gap against the bound after packing (make_plan), since repairs add to the cost.
    cost_value: float | None = None  # (parts some of which greedy answered: those at their instances' prices, merge_parts)
    cost_bound: float | None = None
    # The cost (same units) of the best answer found that moves only the running work that must move,
    # when this answer moves more (strategy.stay_put): what the moves save is stay_value - cost_value.
    stay_value: float | None = None
    # The cost stage moved running work for cost alone (strategy.consolidate adopted its answer): with stay_value, what
    # lets the plan call a move a consolidation; else a move names its rule, or says it cannot (plan/jobs.move_note).
    consolidated: bool = False
    # The jobs a consolidation places in the room it frees that the answer stay_value prices leaves pending (strategy.consolidate)
    room_jobs: int = 0
    # Offers modelled instance by instance (solve/slots.py): offer key -> its new instances, each as
    # (x's capacity key, group, items): a packing the model proved, which the packer follows.
    slots: dict[str, tuple[tuple[tuple[str, str, int], ...], ...]] = field(default_factory=dict)
    # The new instances as the plan's packer filled them from this answer (plan/packing.OfferPacking, made by the
    # repair stage): make_plan uses it instead of packing again while it is this answer's (None: it packs).
    packed: object = field(default=None, compare=False, repr=False)
    # An idle class was searched again with the tiers' floors let go (strategy.idle_repair): greedy's value, every
    # other answer's floor, no longer holds for this one, so the API compares the plan with greedy's (api._plan).
    below_floors: bool = False
    # (group, host) choices the model left out where offering every one would make it too large (Model.narrowed): its
    # bounds are of the choices offered, so its answer is not called optimal and the plan says so.
    narrowed: int = 0
    # Independent parts (solve.parts) answered by greedy best-fit where the others are CP-SAT's: the answer is no
    # greedy's plan, so the API checks it as CP-SAT's and compares it with greedy's whole plan (api.emitted).
    greedy_parts: int = 0
    # The demands whose moves `consolidated` and stay_value speak for (None: every one): where some parts are greedy
    # best-fit's, the other parts' (merge_parts). Greedy measured no saving: its moves are no consolidation's.
    moves_measured: frozenset[str] | None = None


__all__ = ["Solution", "TierReport"]
